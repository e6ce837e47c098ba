"""Which models hold BatchNorm, for chapter 07's rule (rules/batchnorm.py): the script's own layers, the project
classes a wrapped model is built from (through callers, held sub-networks, `globals()` names, modules named at run
time), project factories by name or by a string (a registry, a dict table, a config's `type:`), and models a vision
library makes by name (torchvision's resnet has BatchNorm; NO_BN_ARCH lists the families that do not)."""

from __future__ import annotations

import ast
import re

from .batchnorm_layers import PLAIN_BN, bn_in
from .facts import Facts
from .files import project_files
from .handed_models import handed_builder_batchnorm, handed_module_batchnorm, handed_to_unseen_batchnorm
from .model_names import NO_BN_ARCH, arch_default, unseen_package_bn_model, vision_get_model, vision_lib
from .project import Module
from .syntax import callee, const_str, dotted, kw, root, walk


def wrapped_batchnorm(f: Facts, m: Module):
    """(the DDP wrap, (module, BatchNorm call)) when the model a script wraps has BatchNorm in its own class or in
    the project classes it builds, in whatever file they live (`self.model = TSCNet(...)` whose conformer blocks
    hold BatchNorm1d in models/conformer.py); (None, None) otherwise."""
    for w in sorted((c for c in m.calls if f.is_ddp_call(m, c) and c.args), key=lambda c: c.lineno):
        arg = w.args[0]
        if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute) and arg.func.attr in ("to", "cuda"):
            arg = arg.func.value  # DDP(model.to(rank))
        if isinstance(arg, ast.Call):
            found = [(tm, tm.classes[tm.class_of(tf)]) for tm, tf in f.p.resolve(m, arg) if tm.class_of(tf)][:1]
        else:
            found = [f.any_class(m, dotted(arg))] if isinstance(arg, (ast.Name, ast.Attribute)) else []
        for cls in (x for x in found if x is not None):
            cm, cdef = cls
            keys = set()
            for meth in (d for d in cdef.body if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))):
                keys |= f.p.reach(cm, meth)
            bn = bn_in(f, keys) or _dynamic_batchnorm(f, cm, cdef) or _held_batchnorm(f, cm, cdef)
            if bn is not None:
                return w, bn
        if isinstance(arg, ast.Name):
            for bm, built in [(m, b) for b in _built_from(m, w, arg.id)] + _built_by_callers(f, m, w, arg.id):
                cls = [(tm, tm.classes[tm.class_of(tf)]) for tm, tf in f.p.resolve(bm, built) if tm.class_of(tf)]
                bn = _class_batchnorm(f, *cls[0]) if cls else _factory_batchnorm(f, bm, built) or \
                    handed_to_unseen_batchnorm(f, bm, built, _factory_batchnorm)
                if bn is not None:
                    return w, bn
    return None, None


def _class_batchnorm(f: Facts, cm: Module, cdef: ast.ClassDef):
    """(module, BatchNorm call) reached from any method of a project class, or None."""
    keys = set()
    for meth in (d for d in cdef.body if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))):
        keys |= f.p.reach(cm, meth)
    return bn_in(f, keys) or _dynamic_batchnorm(f, cm, cdef) or _globals_batchnorm(f, cm, cdef) or \
        handed_builder_batchnorm(f, cm, cdef, _factory_batchnorm) or handed_module_batchnorm(
            f, cm, cdef, _factory_batchnorm)


def _globals_batchnorm(f: Facts, cm: Module, cdef: ast.ClassDef):
    """A class that builds its backbone by a name made at run time from the module's globals
    (`globals()['dla{}'.format(num_layers)](...)`, CenterNet-style DLASeg in PermaTrack): BatchNorm when every
    function of the module whose name starts with that prefix reaches it."""
    for n in ast.walk(cdef):
        if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Subscript) and isinstance(n.func.value, ast.Call)
                and callee(n.func.value) == "globals"):
            continue
        key = n.func.slice
        head = key.func.value if isinstance(key, ast.Call) and callee(key) == "format" else \
            key.left if isinstance(key, ast.BinOp) else key.values[0] if isinstance(key, ast.JoinedStr) else None
        prefix = (const_str(head) or "").split("{")[0]
        names = [k for k in cm.functions if prefix and k.startswith(prefix) and "." not in k]
        found = [bn_in(f, f.p.reach(cm, cm.functions[k])) for k in names]
        if found and all(found):
            return found[0]
    return None


def _held_batchnorm(f: Facts, cm: Module, cdef: ast.ClassDef):
    """A wrapper class that holds the network it is handed (`class ModleWithLoss(nn.Module): def __init__(self,
    model, loss): self.model = model`, PermaTrack and CenterNet): the BatchNorm of what its callers hand in
    (`ModleWithLoss(model, self.loss)` where `model = create_model(...)`, one or two helpers up)."""
    init = cm.functions.get(f"{cdef.name}.__init__")
    if init is None:
        return None
    params = [a.arg for a in init.args.args][1:]
    held = [i for i, p in enumerate(params) if any(isinstance(a, ast.Assign) and isinstance(a.value, ast.Name)
                                                   and a.value.id == p for a in walk(init))]
    for sm, site in f.p.callers(cm, init):
        for i in held:
            given = site.args[i] if i < len(site.args) else None
            if not isinstance(given, ast.Name):
                continue
            for bm, built in [(sm, b) for b in _built_from(sm, site, given.id)] + \
                    _built_by_callers(f, sm, site, given.id):
                cls = [(tm, tm.classes[tm.class_of(tf)]) for tm, tf in f.p.resolve(bm, built) if tm.class_of(tf)]
                bn = _class_batchnorm(f, *cls[0]) if cls else _factory_batchnorm(f, bm, built) or \
                    handed_to_unseen_batchnorm(f, bm, built, _factory_batchnorm)
                if bn is not None:
                    return bn
    return None


def _dynamic_batchnorm(f: Facts, cm: Module, cdef: ast.ClassDef):
    """A class that builds its network from a module named at run time (`importlib.import_module("models." +
    model).__getattribute__("MainModel")`, voxceleb_trainer's SpeakerNet): BatchNorm when every project module in
    that package that defines the name reaches it."""
    for n in ast.walk(cdef):
        if not (isinstance(n, ast.Call) and (callee(n) == "__getattribute__" and isinstance(n.func, ast.Attribute)
                                             and isinstance(n.func.value, ast.Call) or callee(n) == "getattr")):
            continue
        imp, name = (n.func.value, n.args[0] if n.args else None) if callee(n) != "getattr" else (
            n.args[0] if n.args else None, n.args[1] if len(n.args) > 1 else None)
        if not (isinstance(imp, ast.Call) and callee(imp) == "import_module" and imp.args
                and isinstance(imp.args[0], ast.BinOp) and const_str(imp.args[0].left) and const_str(name)):
            continue
        package = const_str(imp.args[0].left).strip(".").replace(".", "/") + "/"
        found = [_defined_batchnorm(f, mm, const_str(name)) for mm in f.p.modules.values()
                 if mm.rel.startswith(package) or f"/{package}" in mm.rel]
        found = [x for x in found if x != "absent"]
        if found and all(found):
            return found[0]
    return None


def _defined_batchnorm(f: Facts, mm: Module, name: str):
    """'absent' when the module defines no `name`; else the BatchNorm its function or class reaches (or None)."""
    if name in mm.classes:
        return _class_batchnorm(f, mm, mm.classes[name])
    if name in mm.functions:
        return bn_in(f, f.p.reach(mm, mm.functions[name]))
    return "absent"


def _built_by_callers(f: Facts, m: Module, w: ast.Call, name: str) -> list[tuple[Module, ast.Call]]:
    """The model a function wraps is its parameter (`def do_train(cfg, model, ...): model = DDP(model)`): the
    calls that built the argument its callers hand in (`model = make_model(cfg)` in train.py)."""
    fn = m.enclosing(w)
    if fn is None or isinstance(fn, ast.ClassDef) or name not in [a.arg for a in fn.args.args]:
        return []
    if any(isinstance(a, ast.Assign) and a.lineno < w.lineno and any(
            isinstance(t, ast.Name) and t.id == name for t in a.targets) for a in walk(fn)):
        return []  # rebound in the function before the wrap: _built_from looked there
    i = [a.arg for a in fn.args.args].index(name)
    out = []
    for cm, c in f.p.callers(m, fn):
        j = i - 1 if fn.args.args[0].arg in ("self", "cls") else i  # a method: self is not in the call's args
        given = next((k.value for k in c.keywords if k.arg == name), c.args[j] if 0 <= j < len(c.args) else None)
        if isinstance(given, ast.Name):
            out += [(cm, b) for b in _built_from(cm, c, given.id)]
    return out


def _built_from(m: Module, w: ast.Call, name: str) -> list[ast.Call]:
    """The calls that built `name` before the wrap `w`, in the wrap's function (`model = factory(...)`, latest
    first), through `.to()/.cuda()` chains."""
    scope = m.enclosing(w) or m.tree
    out = []
    for a in walk(scope):
        if isinstance(a, ast.Assign) and a.lineno < w.lineno and any(
                isinstance(t, ast.Name) and t.id == name or isinstance(t, (ast.Tuple, ast.List)) and t.elts
                and isinstance(t.elts[0], ast.Name) and t.elts[0].id == name for t in a.targets):  # (`model, c = ...`)
            v = a.value
            while isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr in (
                    "to", "cuda", "float", "half", "train") and isinstance(v.func.value, ast.Call):
                v = v.func.value
            if isinstance(v, ast.Call):
                out.append(v)
    return sorted(out, key=lambda c: -c.lineno)


def _factory_batchnorm(f: Facts, m: Module, c: ast.Call):
    """(module, node) when the model `c` builds has BatchNorm though no project class is called by name: a
    torchvision factory (`models.__dict__[arch]()`, `models.resnet50()`, `getattr(models, arch)()`) of a BN family,
    a project factory function that reaches BatchNorm, or one named by a string (`eval('models.' + name +
    '.get_net')(cfg)`: every project function of that name)."""
    fn = c.func
    arch = None
    lib = None
    if isinstance(fn, ast.Subscript) and isinstance(fn.value, ast.Attribute) and fn.value.attr == "__dict__":
        lib, arch = fn.value.value, fn.slice
    elif isinstance(fn, ast.Call) and callee(fn) == "getattr" and len(fn.args) == 2:
        lib, arch = fn.args
    elif isinstance(fn, ast.Attribute):
        lib, arch = fn.value, ast.Constant(fn.attr)
    if vision_get_model(m, fn):  # torchvision.models.get_model(args.arch): the family is its first argument
        lib, arch = "torchvision.models", (c.args[0] if c.args else kw(c, "name"))
    if lib is not None and (lib == "torchvision.models" or vision_lib(m, lib)):
        name = const_str(arch)
        if name is None and isinstance(arch, ast.Attribute):
            name = arch_default(f, arch.attr)
        if name is None or not NO_BN_ARCH.match(name):
            return m, c
        return None
    if unseen_package_bn_model(f, m, c):
        return m, c
    if callee(c) == "create_model" and not f.p.resolve(m, c):
        bn = _timm_registered_batchnorm(f, c)
        if bn is not None:
            return bn
    for tm, tf in f.p.resolve(m, c):
        if tm.class_of(tf) is None:  # a project factory function (classes were looked at already)
            keys = f.p.reach(tm, tf)
            bn = bn_in(f, keys) or next((x for x in (
                _registered_batchnorm(f, callee(rc)) or _named_from_a_table(f, rm, rc)
                or (unseen_package_bn_model(f, rm, rc) and (rm, rc))
                for rm, rc in f.p.calls_in(keys) if not f.p.resolve(rm, rc)) if x), None)
            if bn is not None:
                return bn
    bn = _named_from_a_table(f, m, c)
    if bn is not None:
        return bn
    if not f.p.resolve(m, c):
        bn = _registered_batchnorm(f, callee(c))
        if bn is not None:
            return bn
    if isinstance(fn, ast.Call) and not f.p.resolve(m, fn):  # get_model(cfg.MODEL.NAME)(**kwargs), ResNeSt
        bn = _registered_batchnorm(f, callee(fn))
        if bn is not None:
            return bn
    if isinstance(fn, ast.Attribute) and not f.p.resolve(m, c):  # `self.exp.get_model()`, exp loaded at run time:
        for tm in f.p.modules.values():  # a project method of that name that tunes the BatchNorm layers of the
            for tf in (d for k, d in tm.functions.items() if k.split(".")[-1] == fn.attr):  # model (YOLOX)
                bn = next((x for x in walk(tf) if isinstance(x, ast.Call) and callee(x) == "isinstance"
                           and len(x.args) == 2 and PLAIN_BN.search(ast.unparse(x.args[1]))), None)
                if bn is not None:
                    return tm, bn
    if isinstance(fn, ast.Call) and callee(fn) == "eval" and fn.args and isinstance(fn.args[0], ast.BinOp):
        tail = fn.args[0]
        while isinstance(tail, ast.BinOp):
            tail = tail.right
        name = (const_str(tail) or "").split(".")[-1]
        for tm in f.p.modules.values():
            if name and name in tm.functions:
                bn = bn_in(f, f.p.reach(tm, tm.functions[name]))
                if bn is not None:
                    return bn
    return None


def _timm_registered_batchnorm(f: Facts, c: ast.Call):
    """timm's `create_model(args.model, ...)` with --model defaulting to a name the project registers with timm's
    `@register_model` (RepViT's `def repvit_m1_1(...)`, its package __init__ not among the copies): that
    builder's BatchNorm."""
    arch = c.args[0] if c.args else kw(c, "model_name")
    name = const_str(arch) or (arch_default(f, arch.attr) if isinstance(arch, ast.Attribute) else None)
    for mm in f.p.modules.values():
        fn = mm.functions.get(name or "")
        if fn is not None and any(dotted(d.func if isinstance(d, ast.Call) else d).endswith("register_model")
                                  for d in fn.decorator_list):
            return bn_in(f, f.p.reach(mm, fn))
    return None


def _named_from_a_table(f: Facts, m: Module, c: ast.Call):
    """`BACKBONE_DICT[name](size)`, or `model_class = _network_factory[arch]` then `model_class(...)` (PermaTrack's
    create_model): the BatchNorm of the table's builders (_dict_registry_batchnorm)."""
    fn = c.func
    if isinstance(fn, ast.Name):
        fn = next((a.value for a in ast.walk(m.enclosing(c) or m.tree) if isinstance(a, ast.Assign)
                   and isinstance(a.value, ast.Subscript) and any(dotted(t) == fn.id for t in a.targets)), fn)
    if isinstance(fn, ast.Subscript) and isinstance(fn.value, ast.Name):
        found = _dict_registry_batchnorm(f, m, fn.value.id)
        if found is None and isinstance(fn.slice, ast.Attribute) and (name := arch_default(f, fn.slice.attr)):
            # `__models__[args.model](maxdisp)` from a table these files lack, --model defaulting to 'PSMNet', a
            # class the project defines (ADL-Stereo): the default run builds that class
            found = next((bn for mm in f.p.modules.values() if name in mm.classes
                          for bn in [_class_batchnorm(f, mm, mm.classes[name])] if bn is not None), None)
        return found
    return None


def _dict_registry_batchnorm(f: Facts, m: Module, table: str):
    """`BACKBONE_DICT = {'IR_50': IR_50, ...}` then `BACKBONE_DICT[name](size)` (CurricularFace): BatchNorm when
    every entry the project defines reaches it (entries in files these copies lack are unknown); the table in the
    script, else where the project defines it (CavaFace's star-imported backbone/__init__.py)."""
    for tm0, a in ((mm, a) for mm in [m, *(x for x in f.p.modules.values() if x is not m)] for a in mm.nodes):
        if isinstance(a, ast.Assign) and isinstance(a.value, ast.Dict) and any(dotted(t) == table for t in a.targets):
            found = []
            for v in a.value.values:
                if isinstance(v, (ast.Name, ast.Attribute)):
                    call = ast.Call(func=v, args=[], keywords=[])
                    targets = f.p.resolve(tm0, call, exact=True)
                    for tm, tf in targets[:1]:
                        cls = tm.class_of(tf)
                        found.append(_class_batchnorm(f, tm, tm.classes[cls]) if cls and tf.name == "__init__"
                                     else bn_in(f, f.p.reach(tm, tf)))
            if found and all(found):
                return found[0]
    return None


def _registered_batchnorm(f: Facts, name: str):
    """`builder.build_sppe(cfg.MODEL)` or `get_model(name)(...)` whose builder these files lack, in a project whose
    model classes or builder functions register themselves (`@SPPE.register_module` in HybrIK,
    `@BACKBONES.register_module()` in mmcv-style code, `@RESNEST_MODELS_REGISTRY.register()` on ResNeSt's
    `def resnet50(...)`): BatchNorm when everything registered under the matching registry reaches it."""
    wanted = re.fullmatch(r"(?:build|get|create|make)_(\w+?)s?", name)
    if wanted is None:
        return None
    found = []
    for mm in f.p.modules.values():
        defs = list(mm.classes.values()) + [d for d in mm.tree.body if isinstance(d, ast.FunctionDef)]
        for d in defs:
            if not any(_registers_under(x, wanted.group(1).lower()) for x in d.decorator_list):
                continue
            found.append(_class_batchnorm(f, mm, d) if isinstance(d, ast.ClassDef)
                         else bn_in(f, f.p.reach(mm, d)))
    return found[0] if found and all(found) else None


def _registers_under(decorator: ast.expr, kind: str) -> bool:
    """`@SPPE.register_module` for kind 'sppe'; `@RESNEST_MODELS_REGISTRY.register()` for 'model' (a word of the
    registry's name)."""
    head, _, tail = dotted(decorator.func if isinstance(decorator, ast.Call) else decorator).rpartition(".")
    words = [w.rstrip("s") for w in head.lower().split("_")]
    return tail.startswith("register") and (head.lower().rstrip("s") == kind or kind in words)


BN_DEFAULT = re.compile(r"^(batch_?norm|bn)(1d|2d)?$", re.I)


def _batchnorm_by_default(f: Facts):
    """(module, class, default) for a project nn.Module whose __init__ picks its normalisation by a string that
    defaults to BatchNorm (`norm: str = "batch_norm"`, then a registry of norm classes)."""
    for mm in f.p.modules.values():
        for cls in mm.classes.values():
            init = mm.functions.get(f"{cls.name}.__init__")
            if init is None or not any(dotted(b).split(".")[-1] == "Module" for b in cls.bases):
                continue
            for d in init.args.defaults + [x for x in init.args.kw_defaults if x is not None]:
                if const_str(d) and BN_DEFAULT.match(const_str(d)):
                    return mm, cls, d
    return None


def handed_to_a_wrap_helper(f: Facts, m: Module):
    """(the call, the factory's name, _batchnorm_by_default) when the script hands a model to a project helper
    that wraps that parameter in DDP, the model comes from a project factory whose file these files lack
    (`model = init_model(args)` from a project package module that is not here), and the project has a module
    that is BatchNorm by default: the likely case, reported for a check by hand."""
    default = _batchnorm_by_default(f)
    if default is None:
        return None
    packages = {mm.rel.split("/")[0] for mm in f.p.modules.values()}
    for c in sorted(m.calls, key=lambda x: x.lineno):
        for tm, tf in f.p.resolve(m, c, exact=True):
            if not isinstance(tf, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            params = [a.arg for a in tf.args.args]
            wraps = {root(w.args[0]): w for w in walk(tf) if isinstance(w, ast.Call) and f.is_ddp_call(tm, w)
                     and w.args}  # DDP(model), DDP(model.cuda())
            for i, a in enumerate(c.args):
                if i < len(params) and params[i] in wraps and isinstance(a, ast.Name):
                    factory = _unseen_factory(f, m, c, a.id, packages)
                    if factory:
                        return c, factory, default, (tm, wraps[params[i]])
    return None


def _unseen_factory(f: Facts, m: Module, c: ast.Call, name: str, packages: set[str]) -> str | None:
    scope = m.enclosing(c) or m.tree
    for a in walk(scope):
        if not (isinstance(a, ast.Assign) and a.lineno < c.lineno and isinstance(a.value, ast.Call)
                and isinstance(a.value.func, ast.Name)):
            continue
        targets = [x for t in a.targets for x in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t])]
        fn = a.value.func.id
        imp = m.imports.get(fn)
        if any(isinstance(t, ast.Name) and t.id == name for t in targets) and imp and \
                f.p.module_for(m, fn) is None and (imp[2] > 0 or imp[0].split(".")[0] in packages):
            return fn
    return None


def wrapped_from_unseen_factories(f: Facts, m: Module):
    """(the DDP wrap, the factory's name, (module, BatchNorm)) when the model the script wraps comes only from
    project factories whose files are not here (WeSpeaker's `get_speaker_model(configs['model'])(**args)`;
    3D-Speaker's `nn.Sequential(build('embedding_model', config), build('classifier', config))`) and every model
    class these files define that no other project class builds reaches BatchNorm: the likely model has it."""
    packages = {part for mm in f.p.modules.values() for part in mm.rel.split("/")[:-1]}  # (any folder: xorcist's)
    for w in sorted((c for c in m.calls if f.is_ddp_call(m, c) and c.args), key=lambda c: c.lineno):
        arg = w.args[0]
        if isinstance(arg, ast.Name):  # (not its rebindings: `model = model.to(device)`, HiSup)
            made = [c for c in _built_from(m, w, arg.id) if not any(
                isinstance(n, ast.Name) and n.id == arg.id for n in ast.walk(c))]
        elif isinstance(arg, ast.Attribute):  # self.backbone = self.build_module(args['backbone']).to(rank)
            made = [_unchained(a.value) for a in m.nodes if isinstance(a, ast.Assign) and a.lineno < w.lineno
                    and any(dotted(t) == dotted(arg) for t in a.targets)]
        else:
            continue
        parts = [p for c in made for p in (c.args if isinstance(c, ast.Call) and callee(c) == "Sequential" else [c])]
        names = [_unseen_maker(f, m, p, packages) for p in parts]
        held = _unseen_held(f, m, parts) if parts and not all(names) else None
        if held is not None:
            names = [held[0]]
        if parts and any(names) and not all(names):  # (one part from an unseen factory beside project parts:
            # VoiceprintRecognition's `nn.Sequential(build_model(...), SpeakerIdentification(...))`, the config
            # naming CAMPPlus)
            named = _config_named_batchnorm(f)
            if named is not None:
                return w, next(n for n in names if n), named[1], f"the project's config names {named[0]}, which " \
                    "has BatchNorm"
        if not parts or not all(names):
            continue
        roots = [r for r in _top_model_classes(f) if held is None or r[1] is not held[1]]
        found = [_class_batchnorm(f, cm, cd) for cm, cd in roots]
        if roots and all(found):
            return w, names[0], found[0], "every model class these files define has BatchNorm"
        named = _config_named_batchnorm(f)
        if named is not None:
            return w, names[0], named[1], f"the project's config names {named[0]}, which has BatchNorm"
        builder = _uncalled_builder_batchnorm(f)
        if builder is not None:
            return w, names[0], builder[1], (f"the project's builder {builder[0]}(), which the factory's absent "
                                             "file would call, builds a model with BatchNorm")
        alias = _norm_alias(f)
        if alias is not None:
            return w, names[0], alias[1], f"the project's norm helper binds {alias[0]} to plain BatchNorm"
    return None


def _norm_alias(f: Facts):
    """(name, (module, node)) for a module-level name the project binds to torch's BatchNorm class for its layers
    to use (HiSup's backbones/bn_helper.py: `BatchNorm2d_class = BatchNorm2d = torch.nn.BatchNorm2d`)."""
    for mm in f.p.modules.values():
        for a in mm.nodes:
            if isinstance(a, ast.Assign) and isinstance(a.value, (ast.Name, ast.Attribute)) and re.fullmatch(
                    r"BatchNorm[123]d", dotted(a.value).split(".")[-1]) and mm.enclosing(a) is None and \
                    not isinstance(mm.parent.get(id(a)), ast.ClassDef):
                return dotted(a.targets[0]), (mm, a.value)
    return None


def _uncalled_builder_batchnorm(f: Facts):
    """(name, (module, BatchNorm)) for a model builder function (`build`, `build_model`, `get_model`...) that no
    call in these files reaches and that builds a project model with BatchNorm (PointTAD's models/pointtad.py
    build(args), which models/__init__.py's build_model calls: its I3D backbone has BatchNorm3d)."""
    calls = [(cm, c) for cm in f.p.modules.values() for c in cm.calls if not (
        isinstance(c.func, ast.Attribute) and dotted(c.func.value).split(".")[0] == "self")]
    for mm in f.p.modules.values():
        for name, fn in mm.functions.items():
            if "." in name or not re.fullmatch(r"(build|make|create|get)(_\w*)?(model|net\w*)?", name) or any(
                    callee(c) == name and _may_call(f, cm, c, mm, fn) for cm, c in calls):
                continue
            bn = bn_in(f, f.p.reach(mm, fn))
            if bn is not None and any(isinstance(r, ast.Return) and r.value is not None for r in walk(fn)):
                return name, bn
    return None


def _may_call(f: Facts, cm: Module, c: ast.Call, mm: Module, fn: ast.AST) -> bool:
    """Whether `c` may run `fn` of `mm`: it resolves to it, or it resolves nowhere and names no other module
    (PROB's `datasets.coco.build("val", args)` is not models/prob_deformable_detr.py's build)."""
    targets = f.p.resolve(cm, c)
    if targets:
        return any(tf is fn for _, tf in targets)
    if not isinstance(c.func, ast.Attribute):
        return True
    base = dotted(c.func.value).split(".")[-1]
    return base in (mm.path.stem, mm.path.parent.name) or base in cm.imports and cm.imports[base][1] in (
        mm.path.stem, None)


def _unchained(v: ast.AST) -> ast.AST:
    while isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr in (
            "to", "cuda", "float", "half", "train") and isinstance(v.func.value, ast.Call):
        v = v.func.value
    return v


CONFIG_NAMES = re.compile(r"^\s*-?\s*(?:type|obj|arch|model|backbone|name)\s*:\s*['\"]?([\w.]+)")


def _config_named_batchnorm(f: Facts):
    """(name, (module, BatchNorm)) for a project class or builder function that the project's YAML configs name
    as the thing to build (`type: iresnet100`, OpenSphere; `obj: speakerlab.models.campplus.DTDNN.CAMPPlus`)
    and that reaches BatchNorm; None when no named one does."""
    if not f.p.on_disk:
        return None
    named = set()
    for path in [*project_files(f.p.root, ".yaml"), *project_files(f.p.root, ".yml")]:
        try:
            text = path.read_text(encoding="utf-8", errors="replace") if path.stat().st_size < 1_000_000 else ""
        except OSError:
            continue
        named |= {hit.group(1).split(".")[-1] for line in text.splitlines() if (hit := CONFIG_NAMES.match(line))}
    for mm in f.p.modules.values():
        lowered = {k.lower(): k for k in mm.classes}  # (`name: gtcrn` for class GTCRN, noise-xorcist's registry)
        for name in sorted(named):
            cls = name if name in mm.classes else lowered.get(name.lower())
            if cls and (bn := _class_batchnorm(f, mm, mm.classes[cls])) is not None:
                return name, bn
            if name in mm.functions and (bn := bn_in(f, f.p.reach(mm, mm.functions[name]))) is not None:
                return name, bn
    return None


def _unseen_maker(f: Facts, m: Module, v: ast.AST, packages: set[str]) -> str | None:
    """The name of the project factory that builds `v` from a class these files do not name: one imported from a
    package module these files lack, or one that imports the class by a name at run time; called as
    `factory(...)` or `factory(name)(...)`, or a name assigned from such a call."""
    if isinstance(v, ast.Name):
        made = [a.value for a in m.nodes if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call) and any(
            isinstance(t, ast.Name) and t.id == v.id or isinstance(t, (ast.Tuple, ast.List)) and t.elts and isinstance(
                t.elts[0], ast.Name) and t.elts[0].id == v.id for t in a.targets)]
        # (`model, criterion, postprocessors = build_model(args)`, DETR-style: the model is the first slot; not the
        # rebindings of the model itself, `model = DistributedDataParallel(model, ...)`, `model = model.cuda()`)
        made = [c for c in made if not any(isinstance(n, ast.Name) and n.id == v.id for n in ast.walk(c))]
        return _unseen_maker(f, m, made[0], packages) if len(made) == 1 else None
    while isinstance(v, ast.Call) and isinstance(v.func, ast.Call):
        v = v.func  # get_speaker_model(name)(**args)
    if not (isinstance(v, ast.Call) and isinstance(v.func, (ast.Name, ast.Attribute))):
        return None
    found = f.p.resolve(m, v)
    if found:  # a project factory that imports the class its config names (3D-Speaker's build -> dynamic_import)
        return callee(v) if all(f.p.function_does(tm, tf, lambda mm, cc: callee(cc) == "import_module", depth=3)
                                for tm, tf in found) else None
    if not isinstance(v.func, ast.Name):
        return None
    imp = m.imports.get(v.func.id)
    return v.func.id if imp and f.p.module_for(m, v.func.id) is None and (
        imp[2] > 0 or imp[0].split(".")[0] in packages) else None


def _unseen_held(f: Facts, m: Module, parts: list):
    """(the factory call, the holder class) for a project class without BatchNorm holding a network an unseen
    factory object builds (FaceX-Zoo's FaceModel: `self.backbone = backbone_factory.get_backbone()`)."""
    cls = [(tm, tm.classes[tm.class_of(tf)]) for p in parts[:1] if isinstance(p, ast.Call)
           for tm, tf in f.p.resolve(m, p) if tm.class_of(tf)] if len(parts) == 1 else []
    if not cls or _class_batchnorm(f, *cls[0]) is not None:
        return None
    cm, cd = cls[0]
    init = cm.functions.get(f"{cd.name}.__init__")
    for a in walk(init) if init is not None else ():
        if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call) and isinstance(a.value.func, ast.Attribute) \
                and any(re.search(r"backbone|model|net|encoder|trunk", dotted(t).split(".")[-1], re.I)
                        and dotted(t).startswith("self.") for t in a.targets) and not f.p.resolve(cm, a.value) \
                and not f.one_method(a.value) and dotted(a.value.func.value) in {x.arg for x in init.args.args}:
            return ast.unparse(a.value.func), cd
    return None


def _top_model_classes(f: Facts) -> list[tuple[Module, ast.ClassDef]]:
    """The torch Module classes of the project that no project class or function builds by name (ResNet34's
    ResNet, CAM++'s CAMPPlus), not losses."""
    built = {callee(c) for mm in f.p.modules.values() for c in mm.calls}
    # (a class built only by a builder function nothing here calls, MMN's build_proposal_conv, which the absent
    # model file calls, is as much a top class as one nothing builds)
    called = {callee(c) for mm in f.p.modules.values() for c in mm.calls if not (  # (not `self._model.build()`)
        isinstance(c.func, ast.Attribute) and dotted(c.func.value).split(".")[0] == "self")}
    built = {callee(c) for mm in f.p.modules.values() for c in mm.calls if not (
        (fn := mm.enclosing(c)) is not None and isinstance(fn, ast.FunctionDef) and not mm.class_of(fn)
        and fn.name not in called)}
    return [(mm, cd) for mm in f.p.modules.values() for cd in mm.classes.values()
            if any(dotted(b).split(".")[-1] == "Module" for b in cd.bases) and cd.name not in built
            and not re.search(r"loss|criterion|margin|postprocess|matcher|^tta$|transform|augment", cd.name, re.I)
            and not re.search(r"(^|/)(data|datasets?|dataloaders?|transforms?)/", mm.rel)]
    # (nor a data module's test-time augmentation wrapper: InternImage's dataset/build.py TTA(nn.Module))


def arm_off_by_default(f: Facts, m: Module, node: ast.AST) -> bool:
    """`node` sits in an arm of `if opts.norm_act == 'iabn_sync': ...` the option's default does not take (PLOP)."""
    child, n = node, m.parent.get(id(node))
    while n is not None and not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        t = n.test if isinstance(n, ast.If) else None
        if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], (ast.Eq, ast.NotEq)) and \
                isinstance(t.left, ast.Attribute) and const_str(t.comparators[0]) is not None:
            d = arch_default(f, t.left.attr)
            if d is not None and ((d == const_str(t.comparators[0])) == isinstance(t.ops[0], ast.Eq)) != any(
                    child is b for b in n.body):
                return True
        child, n = n, m.parent.get(id(n))
    return False
