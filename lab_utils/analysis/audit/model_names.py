"""Models made by name, for chapter 07's BatchNorm rule (batchnorm_models.py): which names mean torchvision.models,
its factory by name (`get_model(args.arch)`), the families without BatchNorm, and a project model package these
files lack indexed by a BatchNorm family's name."""

from __future__ import annotations

import ast
import re

from .facts import Facts
from .project import Module
from .syntax import callee, const_str, dotted, kw, walk

# torchvision's classification families: BatchNorm in resnet/resnext/wide_resnet/densenet/mobilenet/efficientnet/
# regnet/shufflenet/mnasnet/googlenet/inception/vgg*_bn/maxvit; none in alexnet, plain vgg, squeezenet, vit, swin,
# convnext (LayerNorm)
NO_BN_ARCH = re.compile(r"^(alexnet|vgg\d*|squeezenet.*|vit_.*|swin_.*|convnext.*|deit.*|beit.*|mlp_mixer.*|"
                        r"visiontransformer|swintransformer)$", re.I)
# the convolutional families built with BatchNorm, by the names projects give their own copies (ResNet18, resnet50)
BN_FAMILY = re.compile(r"^(pre_?act_?)?(resnet|resnext|wide_?resnet|wrn|densenet|mobilenet|efficientnet|regnet|"
                       r"shufflenet|mnasnet|vgg\d+_?bn|inception|googlenet|hrnet|res2net|resnest|se_?resnet|darknet)",
                       re.I)


def arch_default(f: Facts, dest: str) -> str | None:
    """The argparse default of --dest (`default='resnet50'`), when a constant."""
    for mm in f.p.modules.values():
        for c in mm.calls:
            if callee(c) == "add_argument" and any(const_str(a) in (f"--{dest}", f"--{dest.replace('_', '-')}")
                                                   for a in c.args):
                return const_str(kw(c, "default"))
    return None


def vision_lib(m: Module, n: ast.AST) -> bool:
    """`n` names torchvision.models (`import torchvision.models as models`, `from torchvision import models`,
    `torchvision.models`)."""
    d = dotted(n)
    head = d.split(".")[0]
    imp = m.imports.get(head)
    if imp is None:
        return False
    full = ".".join(x for x in (imp[0], imp[1]) if x) if imp[1] else imp[0]
    full = ".".join([full] + d.split(".")[1:])
    return full == "torchvision.models"


def vision_get_model(m: Module, fn: ast.AST) -> bool:
    """`fn` is torchvision's factory by name (`from torchvision.models import get_model`, `models.get_model`)."""
    if isinstance(fn, ast.Attribute):
        return fn.attr == "get_model" and vision_lib(m, fn.value)
    imp = m.imports.get(fn.id) if isinstance(fn, ast.Name) else None
    return imp is not None and imp[0] == "torchvision.models" and imp[1] == "get_model"


def unseen_package_bn_model(f: Facts, m: Module, c: ast.Call) -> bool:
    """A project model package these files lack, indexed by a BatchNorm family's name (CLD's
    `models.__dict__['ResNet18'](...)`, `ResNet.__dict__[args.arch]` with --arch resnet50), or picked from it by
    getattr, perhaps through a name (HSAKD's `model = getattr(models, args.arch)`, then `net = model(...)`)."""
    fn = c.func
    if isinstance(fn, ast.Name):  # the name's one binding in the call's function
        scope = m.enclosing(c) or m.tree
        binds = [a.value for a in walk(scope) if isinstance(a, ast.Assign) and len(a.targets) == 1
                 and isinstance(a.targets[0], ast.Name) and a.targets[0].id == fn.id]
        fn = binds[0] if len(binds) == 1 else fn
    if isinstance(fn, ast.Call) and callee(fn) == "getattr" and len(fn.args) == 2 and isinstance(fn.args[0], ast.Name):
        lib, arch = fn.args[0].id, fn.args[1]
    elif isinstance(fn, ast.Subscript) and isinstance(fn.value, ast.Attribute) and fn.value.attr == "__dict__" \
            and isinstance(fn.value.value, ast.Name):
        lib, arch = fn.value.value.id, fn.slice
    else:
        return False
    if lib not in m.imports or f.p.module_for(m, lib) is not None or m.imports[lib][0].startswith(("timm", "torch")):
        return False
    name = const_str(arch) or (arch_default(f, arch.attr) if isinstance(arch, ast.Attribute) else None)
    return bool(name and BN_FAMILY.match(name))
