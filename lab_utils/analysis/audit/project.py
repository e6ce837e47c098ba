"""The project the audit reads: every parsed file (a `Module`, module.py) and the files its imports reach inside the
audited folder (`Project`: calls resolved to project functions, helpers and methods followed, instances of project
classes, callers, reachability)."""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

from .entries import demote_self_tests
from .factory_instances import factory_classes
from .instances import Instances
from .module import AuditError, Module
from .syntax import callee, calls_of, dotted, mentions_ddp, walk
from .taint import taint_parameters


@lru_cache(maxsize=1 << 16)
def _real(p: Path) -> Path:
    """p.resolve(), remembered: imports ask for the same few paths ~10^5 times (2/3 of YOLOv5's 76-s audit)."""
    return p.resolve()

class Project(Instances):
    """The audited files plus the modules their imports reach inside the root folder."""

    def __init__(self, paths: list[Path], root: Path, named: frozenset[Path] = frozenset()):
        """A named file that is not Python is an AuditError; any other (in a folder, or imported: SPOS's
        train_imagenet.py, missing a comma) is left out, its reason in `skipped`, and the rest audited."""
        self.root = root
        self.on_disk = True  # the folder holds the project's other files too (its JSON configs)
        self.modules: dict[str, Module] = {}
        self.skipped: list[str] = []
        for p in paths:
            self._load_or_skip(p, p in named)
        queue = list(self.modules.values())
        while queue:  # follow imports that resolve inside root
            m = queue.pop()
            for mod, attr, level in [*m.imports.values(), *((mod, None, level) for mod, level in m.stars)]:
                for target in self._candidates(m, mod, attr, level):
                    if target.exists() and str(self._rel(target)) not in self.modules and not any(
                            s.startswith(f"{target}:") for s in self.skipped) and self._load_or_skip(target, False):
                        queue.append(self.modules[self._rel(target)])
        self._expand_stars()
        # every module is loaded: module_for's answer for (module, name) can no longer change
        self._module_for_cache: dict[tuple[str, str], Module | None] = {}
        self.ddp = any(mentions_ddp(m) for m in self.modules.values())
        demote_self_tests(self)
        self._reach_cache: dict[tuple[str, str], set] = {}
        self._instance_cache: dict[tuple[str, str], tuple[Module, ast.ClassDef] | None] = {}
        self._imports_cache: dict[str, set[str]] = {}
        self._taint_parameters()
        self._resolve_cache: dict[tuple[str, int, bool], list] = {}  # every module's taint is known now

    def _expand_stars(self):
        """`from utils import *` (CasMVSNet): each public name of the module becomes an import (two rounds, for a
        package whose __init__.py star-imports its modules)."""
        for _ in range(2):
            for m in self.modules.values():
                for mod, level in m.stars:
                    m.imports["*"] = (mod, None, level)
                    target = self._module_for(m, "*")
                    del m.imports["*"]
                    if target is None:
                        # (a package whose __init__.py these copies lack, MVSTER's models/: what its modules define)
                        names = [n for d in {_real(c.parent if c.name == "__init__.py" else c.with_suffix(""))
                                             for c in self._candidates(m, mod, None, level)}
                                 for mm in self.modules.values() if _real(mm.path).parent == d
                                 for n in [*mm.functions, *mm.classes] if "." not in n and not n.startswith("_")]
                    else:
                        names = [n for n in [*target.functions, *target.classes, *target.imports]
                                 if "." not in n and not n.startswith("_")]
                    for name in names:
                        if name not in m.functions and name not in m.classes and name not in m.imports:
                            m.imports[name] = (mod, name, level)

    @classmethod
    def single(cls, module: Module) -> Project:
        """A project of one module given as text: no imports are followed."""
        project = cls.__new__(cls)
        project.root, project.modules = Path("."), {module.rel: module}
        project.on_disk = False
        project.ddp = mentions_ddp(module)
        project._reach_cache, project._imports_cache, project._instance_cache = {}, {}, {}
        project._folders = []  # no folder on disk to look for source roots in
        project._taint_parameters()
        project._resolve_cache = {}
        return project

    def _taint_parameters(self):
        taint_parameters(self)

    def _rel(self, p: Path) -> str:
        try:
            return str(_real(p).relative_to(_real(self.root)))
        except ValueError:
            return str(p)

    def _load_or_skip(self, p: Path, named: bool) -> Module | None:
        try:
            return self._load(p)
        except AuditError as e:
            if named:
                raise
            self.skipped.append(str(e))

    def _load(self, p: Path) -> Module:
        rel = self._rel(p)
        if rel not in self.modules:
            try:
                # utf-8-sig: a file saved with a byte-order mark is valid Python (the interpreter skips the
                # BOM), but ast.parse of the decoded text rejects U+FEFF
                text = p.read_text(encoding="utf-8-sig")
            except UnicodeDecodeError:
                raise AuditError(f"{p}: not a text file") from None
            self.modules[rel] = Module(p, rel, text)
        return self.modules[rel]

    def _candidates(self, m: Module, mod: str, attr: str | None, level: int) -> list[Path]:
        parts = mod.split(".") if mod else []
        if level:  # `from .. import x`: the folder `level` steps up
            bases = [m.path.parents[min(level, len(m.path.parents)) - 1]]
        else:  # absolute: from the importing file's folder up to the root (scripts add the root to sys.path)
            bases, b = [], _real(m.path.parent)
            root = _real(self.root)
            while True:
                bases.append(b)
                if b == root or root not in b.parents:
                    break
                b = b.parent
        def under(bs):
            found = []
            for b in bs:
                d = b.joinpath(*parts) if parts else b
                found += [d.with_suffix(".py") if parts else d / "__init__.py", d / "__init__.py"]
                if attr:
                    found.append(d / f"{attr}.py")
            return found
        out = under(bases)
        if not level and parts and not any(p.exists() for p in out) and not (bases[0] / parts[0]).exists():
            # a source folder the script puts on sys.path (`import _init_paths` adding lib/), not another program's
            # folder with scripts of its own (MedCoSS's Dim_2/.../main.py imports its own engine.py, not Dim_3's)
            out += under([d for d in self._source_roots(parts[0]) if not self._has_scripts(d)
                          or d in _real(m.path).parents])
        root = _real(self.root)
        if not level and len(parts) > 1 and not any(p.exists() for p in out) and re.search(
                rf"(^|_){re.escape(parts[0].lower())}$", root.name.lower().replace("-", "_")):
            parts = parts[1:]  # the repository is the package: MAE-ST's `import mae_st.util.misc` at its root
            out += under([root])
        return [p for p in out if root in _real(p).parents or _real(p).parent == root]

    def _has_scripts(self, d: Path) -> bool:
        kept = self.__dict__.setdefault("_scripts_in", {})
        if d not in kept:
            kept[d] = any("__main__" in p.read_text(errors="replace") for p in d.glob("*.py"))
        return kept[d]

    def _source_roots(self, first: str) -> list[Path]:
        """Folders under the root that hold a package or module named `first`, nearest the root first."""
        if getattr(self, "_folders", None) is None:
            skip = {".git", ".venv", "venv", "node_modules", "__pycache__", "build", "dist"}
            self._folders = sorted((d for d in _real(self.root).rglob("*") if d.is_dir() and not
                                    skip & set(d.relative_to(_real(self.root)).parts)),
                                   key=lambda d: (len(d.parts), str(d)))
            self._folders.insert(0, _real(self.root))
        return [d for d in self._folders if (d / first).is_dir() or (d / f"{first}.py").is_file()][:3]

    def module_for(self, m: Module, local: str) -> Module | None:
        """The project module a local import name refers to (`dist_util`, `utils`, `distrib`)."""
        if local not in m.imports:
            return None
        cache = getattr(self, "_module_for_cache", None)  # absent while __init__ still loads modules
        key = (m.rel, local)
        if cache is not None and key in cache:
            return cache[key]
        busy = self.__dict__.setdefault("_module_for_busy", set())
        if key in busy:
            return None  # two modules re-exporting one name from each other (SparK): a cycle, no definition
        busy.add(key)
        try:
            found = self._module_for(m, local)
        finally:
            busy.discard(key)
        if cache is not None:
            cache[key] = found
        return found

    def _submodule(self, m: Module, local: str, name: str) -> Module | None:
        """The project module `local.name` is when `local` is an imported package (`import pfns.train`)."""
        mod, attr, level = m.imports[local]
        return None if attr is not None else next((self.modules[self._rel(c)] for c in self._candidates(
            m, f"{mod}.{name}", None, level) if self._rel(c) in self.modules), None)

    def _module_for(self, m: Module, local: str) -> Module | None:
        mod, attr, level = m.imports[local]
        for c in self._candidates(m, mod, attr, level):
            rel = self._rel(c)
            if rel in self.modules and (attr is None or c.stem == attr or c.name == "__init__.py"
                                        and c.parent.name == (attr or "")):
                return self.modules[rel]
        if attr is None:
            return None
        found = [self.modules[self._rel(c)] for c in self._candidates(m, mod, None, level)
                 if self._rel(c) in self.modules]  # `from pkg.mod import name` → the module pkg/mod.py
        for mm in found:  # (the one that has the name: rtseg's `from utils import get_optimizer` is no name of
            if attr in mm.functions or attr in mm.classes or attr in mm.imports or mm.stars:  # utils/utils.py)
                return self._reexported(mm, attr)
        for c in self._candidates(m, mod, None, level):  # `from data import build_loader`, data/ without its
            d = _real(c.parent if c.name == "__init__.py" else c.with_suffix(""))  # __init__.py here
            defs = [mm for mm in self.modules.values() if _real(mm.path).parent == d
                    and (attr in mm.functions or attr in mm.classes)]
            if not defs:  # (or one module below it: hysts' `from pytorch_image_classification import
                # create_dataloader`, defined in pytorch_image_classification/datasets/dataloader.py, the
                # package's __init__.py that re-exports it not copied)
                defs = [mm for mm in self.modules.values() if d in _real(mm.path).parents
                        and (attr in mm.functions or attr in mm.classes)]
            if len(defs) == 1:
                return defs[0]
        return self._reexported(found[0], attr) if found else None

    def package_member(self, m: Module, local: str, name: str) -> Module | None:
        """The module that defines `name` for `local.name(...)`: the imported module, the module its package's
        __init__.py re-exports it from (timm's `utils.reduce_tensor(...)`, `from .distributed import *`), or, with
        no __init__.py in the copy, the one module of that folder that defines the name."""
        target = self.module_for(m, local)
        if target is not None and (name in target.functions or name in target.classes):
            return target
        if target is not None and name in target.imports:
            return self._reexported(target, name)
        if target is not None and target.path.name != "__init__.py":
            return target
        mod, attr, level = m.imports[local]
        folders = {_real(c.with_suffix("")) if c.name != "__init__.py" else _real(c.parent)
                   for c in self._candidates(m, f"{mod}.{attr}" if attr and mod else mod or attr or "", None, level)}
        if target is not None:
            folders.add(_real(target.path.parent))
        defs = [mm for mm in self.modules.values() if _real(mm.path).parent in folders
                and (name in mm.functions or name in mm.classes)]
        return defs[0] if len(defs) == 1 else target

    def _reexported(self, mod: Module, attr: str, depth: int = 2) -> Module:
        """The module defining `attr` when `mod` only re-exports it (`from .build import build_loader`), else mod."""
        if depth and attr not in mod.functions and attr not in mod.classes and attr in mod.imports:
            target = self.module_for(mod, attr)
            if target is not None and target is not mod:
                return self._reexported(target, attr, depth - 1)
        return mod

    def imports_of(self, m: Module) -> set[str]:
        """The project modules `m` reaches through its imports, transitively (m excluded)."""
        if m.rel not in self._imports_cache:
            seen, todo = set(), [m]
            while todo:
                mm = todo.pop()
                for local in mm.imports:
                    t = self.module_for(mm, local)
                    if t is not None and t.rel not in seen and t is not m:
                        seen.add(t.rel)
                        todo.append(t)
            self._imports_cache[m.rel] = seen
        return self._imports_cache[m.rel]

    def related(self, m: Module) -> list[Module]:
        """The modules that run with `m`: m, what it imports, the scripts that import it and what they import.
        Two independent scripts in one folder are not related, though they share a helper."""
        users = [u for u in self.modules.values() if m.rel in self.imports_of(u)]
        rels = {m.rel} | self.imports_of(m) | {u.rel for u in users}
        for u in users:
            rels |= self.imports_of(u)
        return [self.modules[r] for r in sorted(rels)]

    # --- calls between functions
    def resolve(self, m: Module, call: ast.Call, exact: bool = False) -> list[tuple[Module, ast.AST]]:
        """The project functions a call may run: local defs, imported defs, `module.f`, `self.f`, `Class(...)`
        (every method of the class; with `exact`, only its __init__). Cached once the project is built: the
        rules ask about the same calls many times (callers() asks about every call)."""
        cache = getattr(self, "_resolve_cache", None)
        if cache is None:
            return self._resolve(m, call, exact)
        key = (m.rel, id(call), exact)
        if key not in cache:  # the call is kept with its answer: a rule's throwaway ast.Call cannot reuse its id
            cache[key] = (call, self._resolve(m, call, exact))
        return cache[key][1]

    def _resolve(self, m: Module, call: ast.Call, exact: bool) -> list[tuple[Module, ast.AST]]:
        f = call.func
        out: list[tuple[Module, ast.AST]] = []

        def in_module(mod: Module, name: str):
            if name in mod.functions:
                out.append((mod, mod.functions[name]))
            elif name in mod.classes:
                n = len(out)
                out.extend((mod, mod.functions[k]) for k in mod.functions if k.startswith(name + ".")
                           and (not exact or k == f"{name}.__init__"))
                if len(out) == n:  # a subclass of no methods of its own (DSPv2's ResNet14): its bases' __init__
                    out.extend(self.methods(mod, name, "__init__"))

        if isinstance(f, ast.Name):
            # (a local binding shadows the module's def: IC-GAN's `train = train_fns.GAN_training_function(...)`
            # inside the module's own train())
            local = self._returned_closures(m, call, f.id) if m.enclosing(call) is not None else []
            if local:
                out.extend(local)
            elif f.id in m.functions or f.id in m.classes:
                in_module(m, f.id)
            elif f.id == "cls" and (own := self.own_class(m, call)):  # `trainer = cls(gpu=gpu)` in a classmethod:
                out.extend(self.methods(m, own, "__init__"))  # its __init__ (the methods called later resolve)
            elif f.id in m.imports:
                target = self.module_for(m, f.id)
                if target is not None:
                    in_module(target, m.imports[f.id][1] or f.id)
            elif (found := self.instance_class(m, f.id)) is not None:  # `early_stopping(loss, model, path)`
                out.extend(self.methods(found[0], found[1].name, "__call__"))
            elif m.enclosing(call) is None:
                out.extend(self._returned_closures(m, call, f.id))
        elif isinstance(f, ast.Attribute):
            base = f.value
            if isinstance(base, ast.Name) and base.id in ("self", "cls") or isinstance(base, ast.Call) and callee(
                    base) == "super":  # (`cls.exec(0)` in a classmethod: ffcv-imagenet's launch_from_args)
                fn = m.enclosing(call)  # self.f(), or super().__init__(...): a base class's (GeoTransformer's)
                cls = m.class_of(fn) if fn is not None else None
                for bm, b in ([(m, cls)] if isinstance(base, ast.Name) else self.bases_of(m, cls)) if cls else []:
                    out.extend(self.methods(bm, b, f.attr))
            elif isinstance(base, ast.Name) and base.id in m.imports:
                target = self.package_member(m, base.id, f.attr)
                if target is not None:
                    in_module(target, f.attr)
                if not out:  # `CkptLoader.load_head(...)`, an imported class (re-exported by a package __init__ these
                    # files lack: the one project class of that name)
                    cls = m.imports[base.id][1] or base.id
                    home = self.module_for(m, base.id)
                    self.methods(m, "", "__init__")  # (builds the class index)
                    homes = [home] if home is not None and cls in home.classes else [
                        cm for cm, _ in self._class_index.get(cls, [])]
                    if len(homes) == 1:
                        out.extend(self.methods(homes[0], cls, f.attr))
            elif isinstance(base, ast.Name) and base.id in m.classes:
                out.extend(self.methods(m, base.id, f.attr))  # `Trainer.build_loader(cfg)` in its own module
            elif isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name) and base.value.id in m.imports:
                target = self.module_for(m, base.value.id)  # pkg.utils.f() with `import pkg`
                if target is not None:
                    in_module(target, f.attr)
                if not out:  # ... or with `import pfns.train`: the submodule pfns/train.py (PFNs' CLI)
                    sub = self._submodule(m, base.value.id, base.attr)
                    if sub is not None:
                        in_module(sub, f.attr)
            elif isinstance(base, ast.Name) or isinstance(base, ast.Attribute) and dotted(base).startswith("self."):
                found = self.instance_class(m, dotted(base))  # `model = Trainer(...)` ... `model.save(n)`
                if found is None and isinstance(base, ast.Name):
                    found = self.parameter_instance(m, call, base.id)
                if found is not None:
                    out.extend(self.methods(found[0], found[1].name, f.attr))
                elif isinstance(base, ast.Name):  # `trainer = build_trainer(...)`, then `trainer.train(model)`
                    for cm, cd in factory_classes(self, m, base.id):
                        out.extend(self.methods(cm, cd.name, f.attr))
        return out

    def _returned_closures(self, m: Module, call: ast.Call, name: str) -> list[tuple[Module, ast.AST]]:
        """`train = train_fns.GAN_training_function(G, D, ...)`, then `metrics = train(x, y)`: the nested def the
        project factory returns (BigGAN's training step), bound in the call's own function."""
        scope = m.enclosing(call) or m.tree
        bound = self.__dict__.setdefault("_call_bound", {})
        if id(scope) not in bound:  # (once per function: name -> the calls assigned to it)
            bound[id(scope)] = {}
            for a in walk(scope):
                if isinstance(a, ast.Assign) and len(a.targets) == 1 and isinstance(a.targets[0], ast.Name) and \
                        isinstance(a.value, ast.Call):
                    bound[id(scope)].setdefault(a.targets[0].id, []).append(a.value)
        made = [v for v in bound[id(scope)].get(name, []) if v is not call and name not in {
            n.id for n in ast.walk(v) if isinstance(n, ast.Name)}]
        out = []
        for c in made[:1]:
            for tm, tf in self.resolve(m, c):
                nested = {d.name: d for d in ast.walk(tf) if isinstance(d, ast.FunctionDef) and d is not tf}
                out += [(tm, nested[r.value.id]) for r in ast.walk(tf) if isinstance(r, ast.Return)
                        and isinstance(r.value, ast.Name) and r.value.id in nested]
        return out

    def methods(self, m: Module, cls: str, attr: str) -> list[tuple[Module, ast.AST]]:
        """What `self.attr(...)` inside class `cls` may run: the class's own method, else the nearest project base
        class's; and every project subclass's override, since a base class's loop (`losses =
        self.train_on_batch(batch)` in a Trainer that leaves it to its subclasses) runs the subclass's."""
        if getattr(self, "_class_index", None) is None:
            self._class_index: dict[str, list[tuple[Module, ast.ClassDef]]] = {}
            self._methods_cache: dict[tuple[str, str, str], list[tuple[Module, ast.AST]]] = {}
            for mod in self.modules.values():
                for name, cd in mod.classes.items():
                    self._class_index.setdefault(name, []).append((mod, cd))
        key = (m.rel, cls, attr)
        if key not in self._methods_cache:
            self._methods_cache[key] = self._find_methods(m, cls, attr)
        return self._methods_cache[key]

    def class_index(self) -> dict[str, list[tuple[Module, ast.ClassDef]]]:
        """Every project class by name: [(module, ClassDef), ...]."""
        self.methods(next(iter(self.modules.values())), "", "__init__")  # (builds the index)
        return self._class_index

    def overridden(self, m: Module, fn: ast.AST) -> bool:
        """`fn` is a method every project subclass that runs redefines without calling it (YOLOX's
        Exp.get_eval_loader, which the experiment file's Exp(MyExp) replaces): the run builds the subclass, so
        the base's body is not what runs. A base with no subclass here is not overridden."""
        cls = m.class_of(fn)
        if cls is None:
            return False
        others = [(om, of) for om, of in self.methods(m, cls, fn.name) if of is not fn]
        return bool(others) and all(om.class_of(of) != cls and not any(
            isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr == fn.name
            and isinstance(c.func.value, ast.Call) and callee(c.func.value) == "super" for c in ast.walk(of))
            for om, of in others)

    def bases_of(self, m: Module, cls: str) -> list[tuple[Module, str]]:
        self.methods(m, cls, "__init__")  # (builds the class index)
        if cls not in m.classes:
            return []  # a class defined inside a function (RecBole's TracingAdapter): not in the module's index
        return [(bm, bd.name) for b in m.classes[cls].bases
                for bm, bd in self._class_index.get(dotted(b).split(".")[-1], [])]

    def _find_methods(self, m: Module, cls: str, attr: str) -> list[tuple[Module, ast.AST]]:
        def bases(cd):
            return [dotted(b).split(".")[-1] for b in cd.bases]
        out, seen, todo = [], set(), [(m, m.classes[cls])] if cls in m.classes else []
        while todo:  # the class, then up its bases until one defines attr
            mod, cd = todo.pop(0)
            if id(cd) in seen:
                continue
            seen.add(id(cd))
            if f"{cd.name}.{attr}" in mod.functions:
                out.append((mod, mod.functions[f"{cd.name}.{attr}"]))
                break
            todo += [x for b in bases(cd) for x in self._class_index.get(b, [])]
        names, grew = {cls}, True
        while grew:  # subclasses, at any depth
            grew = False
            for entries in self._class_index.values():
                for mod, cd in entries:
                    if cd.name not in names and set(bases(cd)) & names:
                        names.add(cd.name)
                        grew = True
                        if f"{cd.name}.{attr}" in mod.functions:
                            out.append((mod, mod.functions[f"{cd.name}.{attr}"]))
        return out

    def reach(self, m: Module, fn: ast.AST) -> set[tuple[str, int]]:
        """(module rel, id(function)) of every project function `fn` may run, fn included (breadth-first)."""
        key = (m.rel, id(fn))
        if key in self._reach_cache:
            return self._reach_cache[key]
        seen = {key}
        queue = [(m, fn)]
        self._reach_cache[key] = seen
        while queue:
            mod, f = queue.pop()
            for c in (n for n in ast.walk(f) if isinstance(n, ast.Call)):
                for tm, tf in self.resolve(mod, c):
                    k = (tm.rel, id(tf))
                    if k not in seen:
                        seen.add(k)
                        queue.append((tm, tf))
        return seen

    def nodes(self, keys: set[tuple[str, int]]):
        """The (module, function) pairs behind reach() keys."""
        for m in self.modules.values():
            for f in m.functions.values():
                if (m.rel, id(f)) in keys:
                    yield m, f

    def calls_in(self, keys) -> list[tuple[Module, ast.Call]]:
        return [(m, c) for m, f in self.nodes(keys) for c in calls_of(f)]

    def callers(self, m: Module, fn: ast.AST) -> list[tuple[Module, ast.Call]]:
        """The project calls that may run `fn` (every module's calls, resolved once into an index)."""
        index = getattr(self, "_callers_index", None)
        if index is None:
            index = {}
            for cm in self.modules.values():
                for c in cm.calls:
                    for _, tf in self.resolve(cm, c, exact=True):
                        sites = index.setdefault(id(tf), [])
                        if not sites or sites[-1][1] is not c:
                            sites.append((cm, c))
            if getattr(self, "_resolve_cache", None) is None:
                return list(index.get(id(fn), []))  # still building: do not keep a partial answer
            self._callers_index = index
        return list(index.get(id(fn), []))

    def script_calls(self, m: Module, node: ast.AST) -> tuple:
        """Where the entry scripts call the library function around `node` (PermaTrack's `trainer.set_device(...)`),
        through up to three library calls between (DROID-SLAM's Logger.push): a finding's related places."""
        fn = m.enclosing(node)
        if m.entry or fn is None:
            return ()
        todo, seen, out = [(m, fn)], {id(fn)}, []
        for _ in range(3):
            nxt = []
            for tm, tf in todo:
                for cm, c in self.callers(tm, tf):
                    up = cm.enclosing(c)
                    if cm.entry:
                        out.append((cm, c))
                    elif up is not None and id(up) not in seen:
                        seen.add(id(up))
                        nxt.append((cm, up))
            if out or not nxt:
                break
            todo = nxt
        return tuple(out[:2])

    def function_does(self, m: Module, fn: ast.AST, pred, depth: int = 4, exact: bool = False) -> bool:
        """Whether fn, or a project function it calls (to `depth`), has a call satisfying pred(module, call)."""
        todo, seen = [(m, fn, 0)], set()
        while todo:
            mod, f, d = todo.pop()
            if id(f) in seen:
                continue
            seen.add(id(f))
            for c in calls_of(f):
                if pred(mod, c):
                    return True
                if d < depth:
                    todo += [(tm, tf, d + 1) for tm, tf in self.resolve(mod, c, exact)]
        return False

