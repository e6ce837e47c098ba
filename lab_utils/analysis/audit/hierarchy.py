"""Which functions a run executes: a base class's method that every subclass the project builds replaces never
runs (torch_distillation's Distiller.distill, which SanhDistiller, the only distiller the script builds,
redefines), nor does a function that nothing names (never_named, never_called). The rules ask this before
reporting a defect inside a function."""

from __future__ import annotations

import ast

from .files import project_files
from .project import Module, Project
from .syntax import callee, const_str, dotted, walk


def replaced_where_built(p: Project, m: Module, fn: ast.AST) -> bool:
    """`fn` is a method of a class the project never builds itself, and every subclass it builds (by name, in
    any module) defines a method of the same name: the run executes the subclass's, not this one. False when
    the project builds the class itself, builds none of its subclasses, or a subclass calls super().<name>."""
    cls = m.class_of(fn) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) else None
    if cls is None:
        return False
    built = p.__dict__.get("_built_names")
    if built is None:  # (asked for every finding: the project's called names, once, and the names they import:
        # `from trainer import TrainerDistillDifIR as TrainerDistill` ... `TrainerDistill(configs)`, SinSR)
        built = p.__dict__["_built_names"] = {n for mm in p.modules.values() for c in mm.calls
                                              for n in _built_by(mm, c) if n}
    if cls in built and not _built_for_one_process(p, cls):
        return False
    # every built descendant, a grandchild too (SinSR: TrainerBase <- TrainerDifIR <- TrainerDistillDifIR, the one
    # built), runs the nearest definition on its way up to cls
    subs = [chain for mm in p.modules.values() for cd in mm.classes.values() if cd.name in built
            for chain in [_chain_up(p, cd, cls)] if chain]
    return bool(subs) and all(any(any(isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef)) and d.name == fn.name
                                      and not _calls_super(d, fn.name) for d in cd.body) for cd in chain)
                              for chain in subs)


def _built_for_one_process(p: Project, cls: str) -> bool:
    """Every call that builds `cls` runs only in the one-process run: in the arm of a distributed switch that is
    not distributed, or in a function called only from there (AdvSecureNet's `Trainer(train_config)` in
    `_execute_training`, the else of `if self.config.device.use_ddp:`; the DDP run builds DDPTrainer)."""
    from .switches import one_process_arm  # (switches imports nothing of this module's layer)
    sites = [(mm, c) for mm in p.modules.values() for c in mm.calls if cls in _built_by(mm, c)]

    def undistributed(mm: Module, c: ast.AST, depth: int = 2) -> bool:
        if one_process_arm(mm, c):
            return True
        fn = mm.enclosing(c)
        callers = p.callers(mm, fn) if fn is not None and depth else []
        return bool(callers) and all(undistributed(cm, cc, depth - 1) for cm, cc in callers)
    return bool(sites) and all(undistributed(mm, c) for mm, c in sites)


def _built_by(m: Module, c: ast.Call) -> list[str]:
    """The class names a call may build: its own name, the name it imports (`from trainer import X as Y`), or the
    classes bound to it (GET's `Trainer = trainers.AffinityTrainer` ... `Trainer(model, ...)`, a name that is also
    the base class's)."""
    name = callee(c)
    if isinstance(c.func, ast.Name):
        bound = [a.value for a in m.single_assignments(name) if isinstance(a.value, (ast.Name, ast.Attribute))]
        if bound and len(bound) == len(m.single_assignments(name)):
            return [dotted(v).split(".")[-1] for v in bound]
    return [name, (m.imports.get(name) or ("", None, 0))[1]]


def _chain_up(p: Project, cd: ast.ClassDef, cls: str, depth: int = 4) -> list[ast.ClassDef] | None:
    """The project classes from `cd` up to (not including) its ancestor named `cls`, or None when it has none."""
    for b in (dotted(x).split(".")[-1] for x in cd.bases):
        if b == cls:
            return [cd]
        if depth and b != cd.name:
            for _, bd in p.class_index().get(b, []):
                up = _chain_up(p, bd, cls, depth - 1)
                if up:
                    return [cd, *up]
    return None


def off_the_run(p: Project, m: Module, node: ast.AST) -> bool:
    """`node` sits in a method every subclass the project builds replaces, or in a function or class nothing
    names: the run never executes it."""
    cache = p.__dict__.setdefault("_off_the_run", {})  # (asked for every caller of every guarded call: once per
    key = (m.rel, id(m.enclosing(node)))  # function, which decides the answer)
    if key not in cache:
        cache[key] = replaced_where_built(p, m, m.enclosing(node)) or never_called(p, m, node)
    return cache[key]


def _calls_super(d: ast.AST, name: str) -> bool:
    return any(isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr == name
               and isinstance(c.func.value, ast.Call) and callee(c.func.value) == "super" for c in ast.walk(d))


PLAIN_DECORATORS = ("no_grad", "inference_mode", "torch.jit", "lru_cache", "cache", "wraps")


def plain_function(fn: ast.AST) -> bool:
    """A function whose decorators do not register it anywhere (`@torch.no_grad()` only): if nothing names it,
    nothing runs it. A registered one (`@MODELS.register_module()`, `@app.command()`) runs by its registry."""
    return all(any(k in ast.unparse(d) for k in PLAIN_DECORATORS) for d in getattr(fn, "decorator_list", []))


def never_called(p: Project, m: Module, node: ast.AST) -> bool:
    """`node` sits in a module-level function of a module the project imports, and nothing in the project calls or
    names that function, nor does a decorator register it (IELT's ScaleLr, whose one call in setup.py is commented
    out): the run never executes it."""
    fn = m.enclosing(node)
    while fn is not None and m.enclosing(fn) is not None:  # (a closure: the function around it decides)
        fn = m.enclosing(fn)
    cls = m.parent.get(id(fn)) if fn is not None else None
    if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and isinstance(cls, ast.ClassDef) and \
            fn.name.startswith("_") and not fn.name.startswith("__") and plain_function(fn) and \
            fn.name not in _leaf_names(p) and not _named_in_text(p, fn.name):
        return True  # a private method nothing names (MVSFormer's _resume_checkpoint, its one call commented out)
    if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and isinstance(cls, ast.ClassDef):
        # a method of a module-level class nothing here names: not built, not subclassed, not registered (ECAPA-TDNN's
        # single-GPU ECAPAModel beside the ECAPAModelDDP its DDP script builds, imported by name but never called)
        return m.parent.get(id(cls)) is m.tree and plain_function(cls) and _picked_by_name(p, m) and \
            never_named(p, m, cls) and not _named_in_text(p, cls.name)
    return isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
        plain_function(fn) and not p.callers(m, fn) and _imported_here(p, m) and never_named(p, m, fn)


def _picked_by_name(p: Project, m: Module) -> bool:
    """Some module imports `m`, and every importer picks names from it (`from ECAPAModel import ECAPAModel,
    ECAPAModelDDP`): a class none of them names is not used. A module imported whole or by a star (MiniGPT-4's
    `import minigpt4.tasks as tasks`, whose registry builds a task class by its config's name) may be."""
    importers = [o for o in p.modules.values() if o is not m and m.rel in p.imports_of(o)]
    for o in importers:
        for mod, level in o.stars:  # (the star's module itself, or a module of the package it names)
            if any(m.path.resolve() == c.resolve() or m.path.resolve().parent == (
                    c.parent if c.name == "__init__.py" else c.with_suffix("")).resolve()
                   for c in p._candidates(o, mod, None, level)):
                return False
        if any((attr is None or attr == m.path.stem) and p.module_for(o, local) is m
               for local, (_, attr, _) in o.imports.items()):  # (`import mod`, `from utils import misc`)
            return False
    return bool(importers)


def _leaf_names(p: Project) -> set[str]:
    """Every name and attribute leaf the project's code reads or writes (once per audit)."""
    names = p.__dict__.get("_leaf_names")
    if names is None:
        names = p.__dict__["_leaf_names"] = {dotted(n).split(".")[-1] for mm in p.modules.values() for n in mm.nodes
                                             if isinstance(n, (ast.Name, ast.Attribute))}
    return names


def _named_in_text(p: Project, name: str) -> bool:
    """A string of the project's code, or one of its YAML/JSON configs, holds `name`: a class a config picks by name
    (`_target_: models.Net`, `getattr(models, cfg.arch)` with arch 'Net') is built though no code names it."""
    texts = p.__dict__.get("_texts")
    if texts is None:  # (the project's strings and configs, read once per audit)
        listed = {id(x) for mm in p.modules.values() for a in mm.nodes if isinstance(a, (ast.Assign, ast.AugAssign))
                  and "__all__" in {dotted(t) for t in getattr(a, "targets", [getattr(a, "target", None)])}
                  for x in ast.walk(a.value)}  # (`__all__ = ["Trainer", "DartsTrainer"]` exports, builds nothing)
        listed |= {id(d.value) for mm in p.modules.values() for d in mm.nodes if isinstance(d, ast.Expr)}  # (a
        # docstring, or a bare string between statements, builds nothing: Mellotron's distributed.py says "This
        # version of DistributedDataParallel is designed ..." above the class no code builds)
        texts = [n.value for mm in p.modules.values() for n in mm.nodes
                 if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in listed]
        if p.on_disk:
            texts += [path.read_text(encoding="utf-8", errors="replace")
                      for suffix in (".yaml", ".yml", ".json") for path in project_files(p.root, suffix)]
        texts = p.__dict__["_texts"] = "\n".join(texts)
    return name in texts


def _imported_here(p: Project, m: Module) -> bool:
    """Some other module of these files imports `m`: its importers are here to name what they use. A module
    nothing here imports is called from files these copies lack (ColBERT's training.py, Point-MAE's runner)."""
    return any(m.rel in p.imports_of(o) for o in p.modules.values() if o is not m)


def never_named(p: Project, m: Module, fn: ast.AST) -> bool:
    """`fn` is named nowhere: not in its own module outside its body (a call, `mp.spawn(fn)`, `fire.Fire(fn)`),
    and no other module imports it by name (a star import brings every name): dead code in these files."""
    name = getattr(fn, "name", "")
    inside = {id(n) for n in walk(fn)}
    # (a module-level function is named in its own module as a bare name: DF-GAN's `def eval(...)` is not the
    # `model.eval()` beside it)
    kinds = ast.Name if m.parent.get(id(fn)) is m.tree else (ast.Name, ast.Attribute)
    if any(isinstance(n, kinds) and id(n) not in inside and dotted(n).split(".")[-1] == name for n in m.nodes):
        return False
    if any(callee(c) == "getattr" and len(c.args) > 1 and const_str(c.args[1]) == name for mm in p.modules.values()
           for c in mm.calls):
        return False  # taken by its name from a module the config picks (DeepAVFusion's `getattr(importlib.
        # import_module(args.worker), 'main_worker')`)
    # (imported under another name, `from exp.exp_sup import Exp_All_Task as Exp_All_Task_SUP` (UniTS): the alias)
    # (a whole-module import names the function only as `local.name`: VAEBM's `import utils` uses utils.save, never
    # utils.load)
    # (the module itself imported by name too: Multi-Singer's `from encoder import inference as encoder`)
    stem = m.rel.rsplit("/", 1)[-1].removesuffix(".py")
    return not any(attr in (name, None, stem) and p.module_for(mm, local) is m and (
        _uses(p, mm, local) if attr == name else any(isinstance(n, ast.Attribute) and dotted(n) == f"{local}.{name}"
                                                     for n in mm.nodes) or _star_user(p, mm, local))
                   for mm in p.modules.values() if mm is not m for local, (_, attr, _) in mm.imports.items())


def _star_user(p, mm, local: str) -> bool:
    """The module hands the imported module on (`from . import utils` re-exported, `getattr(utils, name)`)."""
    return any(isinstance(n, ast.Name) and n.id == local and not isinstance(mm.parent.get(id(n)), ast.Attribute)
               for n in mm.nodes)


def _uses(p: Project, mm: Module, name: str) -> bool:
    """A module that imports `name` names it (IELT's setup.py star-imports ScaleLr and only a comment names it:
    no use), or hands it on to modules that import it from there."""
    return any(isinstance(n, (ast.Name, ast.Attribute)) and dotted(n).split(".")[-1] == name for n in mm.nodes) \
        or any(attr in (name, None) and p.module_for(o, local) is mm for o in p.modules.values()
               if o is not mm for local, (_, attr, _) in o.imports.items())


def method_never_called(p: Project, m: Module, fn: ast.AST) -> bool:
    """`fn` is a method no code of the project calls or hands on (`exp.inference()` nowhere, though
    `self.args.inference` is read: OpenSTL's BaseExperiment.inference), nor names as a string (`getattr(obj,
    'inference')`): the run never reaches its body. Dunder methods are called by Python itself."""
    name = getattr(fn, "name", "")
    if not m.class_of(fn) or name.startswith("__"):
        return False
    inside = {id(n) for n in walk(fn)}
    for mm in p.modules.values():
        for n in mm.nodes:
            if id(n) in inside:
                continue
            if isinstance(n, ast.Constant) and n.value == name:
                return False
            if isinstance(n, ast.Attribute) and n.attr == name and not isinstance(n.ctx, ast.Store) and (
                    isinstance(mm.parent.get(id(n)), ast.Call) and mm.parent[id(n)].func is n
                    or dotted(n.value).split(".")[-1] not in ("args", "opt", "cfg", "config", "hparams")):
                return False  # (called, or handed on as `obj.inference`; not an option read off `args`)
    return True


def method_calling_wrapped_attribute(p: Project, c: ast.Call, wrapped: dict) -> list:
    """`trainer.val(...)` on an object from a factory these files lack, whose attribute the script wrapped
    (`trainer.network = DDP(trainer.network, ...)`, E2EC; `wrapped`: the script's wrapped names): the one project
    method of that name that calls `self.network(...)`, as [(module, method)]; [] when not exactly one."""
    if not isinstance(c.func, ast.Attribute):
        return []
    owner = dotted(c.func.value) + "."
    attrs = {"self." + k[len(owner):] for k in wrapped if owner != "self." and k.startswith(owner)}
    found = [(mm, d) for mm in p.modules.values() for cd in mm.classes.values() for d in cd.body
             if isinstance(d, ast.FunctionDef) and d.name == c.func.attr and any(
                 isinstance(x, ast.Call) and dotted(x.func) in attrs for x in ast.walk(d))]
    return found if attrs and len(found) == 1 else []
