"""BatchNorm layers as code builds them, for batchnorm_models.py: a call of nn.BatchNorm1d/2d/3d (under any alias,
or a class of the module built on one), a torchvision model of a BatchNorm family, or the class handed on as the
layer to build (`def __init__(self, norm_layer=nn.BatchNorm2d)`, used in the body)."""

from __future__ import annotations

import ast
import re

from .facts import Facts
from .model_names import NO_BN_ARCH, vision_lib
from .project import Module
from .syntax import callee, const_str, const_value, dotted, kw, walk


def is_batchnorm(m: Module, c: ast.Call) -> bool:
    """nn.BatchNorm1d/2d/3d, under any import alias (`from torch.nn import BatchNorm1d as BatchNorm`), or a class
    of the module built on one (CLIP-Driven's ContBatchNorm3d(_BatchNorm), batch statistics always)."""
    name = callee(c)
    alias = _module_alias(m, name) if isinstance(c.func, ast.Name) else None
    if alias is not None:  # `BatchNorm2d = functools.partial(InPlaceABNSync, activation='identity')` (CCNet)
        return bool(re.fullmatch(r"(nn\.|torch\.nn\.)?BatchNorm[123]d", alias))
    imp = m.imports.get(name) if isinstance(c.func, ast.Name) else None
    own = m.classes.get(name) if isinstance(c.func, ast.Name) else None  # `class ContBatchNorm3d(_BatchNorm)`
    # (MinkowskiEngine's MinkowskiBatchNorm, a BatchNorm1d over the sparse features: DSPv2's point-cloud encoder)
    # (mmcv's norm config, `norm_cfg = dict(type='BN', requires_grad=True)`, that ConvModule and build_norm_layer
    # turn into nn.BatchNorm2d: NeWCRFs' and IEBins' PSP decoder)
    if name == "dict" and re.fullmatch(r"BN[123]?d?|BatchNorm[123]?d?", const_str(kw(c, "type")) or ""):
        return True
    return bool(re.fullmatch(r"BatchNorm[123]d|MinkowskiBatchNorm", name)
                or imp and imp[1] and re.fullmatch(r"BatchNorm[123]d", imp[1])
                or own is not None and any(re.fullmatch(r"_BatchNorm|BatchNorm[123]d", dotted(b).split(".")[-1])
                                           for b in own.bases))


def _module_alias(m: Module, name: str) -> str | None:
    """What a module-level `name = X` or `name = functools.partial(X, ...)` makes `name` stand for (dotted X)."""
    for a in m.tree.body:
        if isinstance(a, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in a.targets):
            v = [*a.value.args, a][0] if isinstance(a.value, ast.Call) and callee(a.value) == "partial" else a.value
            return dotted(v) if isinstance(v, (ast.Name, ast.Attribute)) else None
    return None


def bn_in(f: Facts, keys) -> tuple[Module, ast.AST] | None:
    """(module, node) of a BatchNorm layer the reached functions build: `nn.BatchNorm2d(c)`, or the class handed
    on as the layer to build (`norm_layer = nn.BatchNorm2d`, `def __init__(self, norm_layer=nn.BatchNorm2d)`,
    `Block(norm=nn.BatchNorm2d)`), not an isinstance() or == test of one."""
    for mm, fn in f.p.nodes(keys):
        # (a default the body never reads builds nothing: MUSE's DWConv2d_BN(..., norm_layer=nn.BatchNorm2d))
        defaults = [d for a, d in _defaults(fn) if _reads(fn, a)]
        for n in walk(fn):
            if isinstance(n, ast.Call) and (is_batchnorm(mm, n) or _torchvision_bn_model(mm, n)) and not \
                    _sync_switched_on(f, mm, n) and not _under_a_parameter_left_off(f, mm, fn, n) and not \
                    f.off_in_default_run(mm, n):  # (DiG's projection MLP, built only `if self.use_feat_distill:`)
                return mm, n
            if not (isinstance(n, (ast.Name, ast.Attribute)) and BN_CLASS.fullmatch(dotted(n).split(".")[-1])):
                continue
            up = mm.parent.get(id(n))
            if any(n is d for d in defaults) or isinstance(up, ast.keyword) or isinstance(up, ast.Assign) and \
                    up.value is n:
                return mm, n
    return None


def _sync_switched_on(f: Facts, m: Module, c: ast.Call) -> bool:
    """The BatchNorm in the else arm of `if use_sync_bn: return nn.SyncBatchNorm(ch) else: return
    nn.BatchNorm2d(ch)` over a module flag that a function turns on (`global use_sync_bn; use_sync_bn = True`) and
    the model's own code calls by default (RepLKNet's __init__, `if use_sync_bn: enable_sync_bn()` with
    use_sync_bn=True): the layers built are SyncBatchNorm."""
    child, up = c, m.parent.get(id(c))
    while up is not None and not isinstance(up, ast.If):
        child, up = up, m.parent.get(id(up))
    if up is None or not isinstance(up.test, ast.Name) or not any(child is s for s in up.orelse) or not any(
            isinstance(x, ast.Call) and callee(x) == "SyncBatchNorm" for s in up.body for x in ast.walk(s)):
        return False
    flag = up.test.id
    setters = [fn for fn in m.functions.values() if any(isinstance(g, ast.Global) and flag in g.names
                                                        for g in ast.walk(fn)) and any(
        isinstance(a, ast.Assign) and const_value(a.value) is True and any(dotted(t) == flag for t in a.targets)
        for a in ast.walk(fn))]
    return any(_runs_by_default(cm, call) for fn in setters for cm, call in f.p.callers(m, fn))


def _under_a_parameter_left_off(f: Facts, m: Module, fn: ast.AST, c: ast.Call) -> bool:
    """`if norm: layers.append(nn.BatchNorm2d(c))` in a layer whose `norm=False` no call turns on (dualBR's
    BasicConv, every caller leaving norm out): no BatchNorm is built."""
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    defaults = dict(_defaults(fn))
    params = [a.arg for a in fn.args.args]
    up = m.parent.get(id(c))
    while up is not None and up is not fn:
        if isinstance(up, ast.If) and isinstance(up.test, ast.Name) and up.test.id in defaults and const_value(
                defaults[up.test.id]) in (False, None) and any(c is x for x in ast.walk(ast.Module(body=up.body))):
            name = up.test.id
            at = params.index(name) - (params[:1] in (["self"], ["cls"])) if name in params else None
            sites = f.p.callers(m, fn)  # (a class's __init__: its `BasicConv(...)` calls)
            return not any(any(k.arg == name and const_value(k.value) not in (False, None) for k in x.keywords)
                           or any(k.arg is None for k in x.keywords) or at is not None and len(x.args) > at
                           for _, x in sites)
        up = m.parent.get(id(up))
    return False


def _runs_by_default(m: Module, call: ast.Call) -> bool:
    """The call runs unless told otherwise: at its function's top level, or under `if p:` where p is a parameter of
    that function that defaults to True."""
    fn = m.enclosing(call)
    up = m.parent.get(id(call))
    defaults = dict(_defaults(fn)) if fn is not None else {}
    while up is not None and up is not fn:
        if isinstance(up, ast.If) and not (isinstance(up.test, ast.Name) and const_value(
                defaults.get(up.test.id)) is True):
            return False
        up = m.parent.get(id(up))
    return True


def _defaults(fn: ast.AST) -> list[tuple[str, ast.AST]]:
    """(parameter, its default) of a function."""
    a = fn.args
    pos = a.posonlyargs + a.args
    return [(p.arg, d) for p, d in zip(pos[len(pos) - len(a.defaults):], a.defaults, strict=True)] + [
        (p.arg, d) for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is not None]


def _reads(fn: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load) for n in walk(fn))


BN_CLASS = re.compile(r"BatchNorm[123]d")


def _torchvision_bn_model(m: Module, c: ast.Call) -> bool:
    """A torchvision model of a BatchNorm family built in project code (`self.imgnet = resnet18(pretrained=True)`
    with `from torchvision.models import resnet18`, EZ-VSL's two backbones; `models.resnet50()`): not VGG, ViT,
    Swin or ConvNeXt (NO_BN_ARCH), and not a model class (`ResNet(...)`, whose norm layer is an argument)."""
    if isinstance(c.func, ast.Name):
        imp = m.imports.get(c.func.id)
        name = imp[1] if imp and imp[1] else ""
        lib = imp is not None and imp[0].startswith("torchvision.models") and "detection" not in imp[0]  # (Frozen)
    else:
        name, lib = (c.func.attr, vision_lib(m, c.func.value)) if isinstance(c.func, ast.Attribute) else ("", False)
    return lib and name[:1].islower() and not NO_BN_ARCH.match(name) and not name.startswith("get_") and not (
        kw(c, "norm_layer") is not None and not PLAIN_BN.search(dotted(kw(c, "norm_layer"))))  # (MeMOTR's Frozen)


PLAIN_BN = re.compile(r"(?<!Frozen)(?<!Sync)BatchNorm")
