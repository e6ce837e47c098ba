"""Models a project class is handed rather than builds by name, for batchnorm_models.py: a builder it calls in its
__init__ (MoCo's `base_encoder(num_classes=dim)`), or a network built by its caller and kept as a sub-module
(FastMETRO's `FastMETRO_Network(args, backbone, ...)` after `backbone = get_cls_net(hrnet_config, ...)`). Each asks
`factory_bn` (batchnorm_models._factory_batchnorm) whether what was handed reaches BatchNorm."""

from __future__ import annotations

import ast

from .project import Module
from .syntax import dotted, kw, walk


def handed_builder_batchnorm(f, cm: Module, cdef: ast.ClassDef, factory_bn):
    """A class that builds its networks with a builder it is handed (MoCo's `self.encoder_q =
    base_encoder(num_classes=dim)`), where a caller hands a torchvision factory of a BatchNorm family
    (`AdCo(models.__dict__[args.arch], ...)` with --arch resnet50) or a project builder that reaches BatchNorm."""
    init = cm.functions.get(f"{cdef.name}.__init__")
    if init is None:
        return None
    params = [a.arg for a in init.args.args][1:]
    called = {i for i, p in enumerate(params) if any(isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
                                                     and c.func.id == p for c in walk(init))}
    for sm, site in f.p.callers(cm, init):
        for i in called:
            given = site.args[i] if i < len(site.args) else kw(site, params[i])
            if isinstance(given, (ast.Name, ast.Attribute, ast.Subscript, ast.Call)):
                bn = factory_bn(f, sm, ast.Call(func=given, args=[], keywords=[]))
                if bn is not None:
                    return bn if hasattr(bn[1], "lineno") else (sm, site)  # (a torchvision name: the site)
    return None


def handed_to_unseen_batchnorm(f, m: Module, built: ast.Call, factory_bn):
    """`METRO_Network(args, config, backbone, ...)`, a class these files do not hold, handed a network a project
    builder makes with BatchNorm (`backbone = get_cls_net(hrnet_config, ...)`): the model it builds holds it."""
    if f.p.resolve(m, built):
        return None
    scope = m.enclosing(built) or m.tree
    names = {a.id for a in [*built.args, *(k.value for k in built.keywords)] if isinstance(a, ast.Name)}
    for a in walk(scope):
        if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call) and a.lineno < built.lineno and any(
                isinstance(t, ast.Name) and t.id in names for t in a.targets) and f.p.resolve(m, a.value):
            bn = factory_bn(f, m, a.value)
            if bn is not None:
                return bn
    return None


def handed_module_batchnorm(f, cm: Module, cdef: ast.ClassDef, factory_bn):
    """A class whose __init__ keeps a network it is handed (`self.backbone = backbone`), where a caller hands one
    that a project builder makes with BatchNorm (METRO/FastMETRO/MeshGraphormer: `backbone =
    get_cls_net(hrnet_yaml, ...)`, HRNet's BatchNorm2d, then `FastMETRO_Network(args, backbone, mesh_sampler)`)."""
    init = cm.functions.get(f"{cdef.name}.__init__")
    if init is None:
        return None
    params = [a.arg for a in init.args.args][1:]
    kept = {i for i, p in enumerate(params) if any(isinstance(a, ast.Assign) and isinstance(a.value, ast.Name)
                                                   and a.value.id == p and any(dotted(t).startswith("self.")
                                                                               for t in a.targets) for a in walk(init))}
    for sm, site in f.p.callers(cm, init):
        scope = sm.enclosing(site) or sm.tree
        for i in kept:
            given = site.args[i] if i < len(site.args) else kw(site, params[i])
            if not isinstance(given, ast.Name):
                continue
            for a in walk(scope):
                if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call) and a.lineno < site.lineno and any(
                        isinstance(t, ast.Name) and t.id == given.id for t in a.targets):
                    bn = factory_bn(f, sm, a.value)
                    if bn is not None:
                        return bn
    return None
