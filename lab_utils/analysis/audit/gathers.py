"""Gathers over ranks that the rules follow: where an autograd Function (a hand-written all_gather with its own
backward) is applied, and which models compute their loss over every rank's gathered features, so that every rank's
loss is the global batch's."""

from __future__ import annotations

import ast
import re

from .facts import Facts
from .project import Module
from .syntax import LOSSISH, callee, dotted, root

GATHERS = {"all_gather", "all_gather_into_tensor"}


def applications(f: Facts, name: str) -> list[tuple[Module, ast.Call]]:
    """Where the project applies an autograd.Function: `Name.apply(x)`, or through an alias (`allgather =
    AllGather.apply` ... `allgather(x)`, CLIP4Clip)."""
    out = []
    for cm in f.p.modules.values():
        aliases = {dotted(t) for a in cm.nodes if isinstance(a, ast.Assign) and dotted(a.value) == f"{name}.apply"
                   for t in a.targets}
        out += [(cm, c) for c in cm.calls if isinstance(c.func, ast.Attribute) and c.func.attr == "apply"
                and dotted(c.func.value) == name or isinstance(c.func, ast.Name) and c.func.id in aliases]
    return out


def global_model_losses(f: Facts, m: Module, scope: ast.AST) -> set[str]:
    """Names that hold what `model(...)` returns (a callable no project def names: the wrapped model), and what is
    computed from them, in a project whose loss-returning model gathers every rank's features in its forward
    (CLIP4Clip's loss over the all-gathered similarity matrix): every rank's loss is the global batch's, the number
    the single run logs."""
    if not gathering_loss_models(f):
        return set()
    out: set[str] = set()
    for a in ast.walk(scope):
        if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call) and isinstance(
                a.value.func, (ast.Name, ast.Attribute)) and re.search(r"model|net", dotted(a.value.func).split(
                    ".")[-1], re.I) and not f.p.resolve(m, a.value):
            out |= {root(t) for t in a.targets if isinstance(t, (ast.Name, ast.Attribute))}
    for _ in range(3):  # loss = loss.mean(); total_loss += float(loss)
        for a in ast.walk(scope):
            if isinstance(a, (ast.Assign, ast.AugAssign)):
                reads = {root(n) for n in ast.walk(a.value) if isinstance(n, (ast.Name, ast.Attribute))}
                lossy = {r for r in reads if r and LOSSISH.search(r)}
                if lossy and lossy <= out | {root(t) for t in (a.targets if isinstance(a, ast.Assign)
                                                                 else [a.target])}:
                    out |= {root(t) for t in (a.targets if isinstance(a, ast.Assign) else [a.target])}
    return out


def gathering_loss_models(f: Facts) -> list[str]:
    """Project classes whose forward returns a loss and reaches an all_gather (directly, through a helper, or
    through an autograd Function applied by alias: `allgather = AllGather.apply`)."""
    if "gathering_models" not in f.cache:
        gathering_fns = {cls.name for mm in f.p.modules.values() for cls in mm.classes.values()
                         if any(isinstance(n, ast.Call) and callee(n) in GATHERS for n in ast.walk(cls))}
        out = []
        for mm in f.p.modules.values():
            for cls in mm.classes.values():
                fwd = mm.functions.get(f"{cls.name}.forward")
                if fwd is None or not any(isinstance(r, ast.Return) and r.value is not None and any(
                        isinstance(n, ast.Name) and LOSSISH.search(n.id) for n in ast.walk(r.value))
                        for r in ast.walk(fwd)):
                    continue
                for rm, c in f.p.calls_in(f.p.reach(mm, fwd)):
                    applied = dotted(c.func).removesuffix(".apply") if dotted(c.func).endswith(".apply") else next(
                        (dotted(a.value).removesuffix(".apply") for a in rm.nodes if isinstance(a, ast.Assign)
                         and dotted(a.value).endswith(".apply") and isinstance(c.func, ast.Name)
                         and c.func.id in {dotted(t) for t in a.targets}), None)
                    if callee(c) in GATHERS or applied in gathering_fns:
                        out.append(cls.name)
                        break
        f.cache["gathering_models"] = out
    return f.cache["gathering_models"]

