"""Meters that reduce over ranks themselves: a project class whose update() all-reduces what it is fed, or whose
read method gathers every rank's values. What they print is the global batch's, so the loss rules leave them be."""

from __future__ import annotations

import ast
import re

from .facts import Facts
from .project import Module
from .syntax import LOSSISH, callee, dotted, functools_reduce, root, walk


def reducing_meters(f: Facts, m: Module, scope: ast.AST) -> set[str]:
    """Meters of a project class whose update() all-reduces what it is fed (image_classification_sota's
    `loss_m = AverageMeter(dist=True)`, whose update calls _dist_reduce): what they print is the global batch's.
    When update() reduces only in one branch, the meter must be built with a keyword set True."""
    out = set()
    for a in walk(scope):
        if isinstance(a, ast.Assign) and len(a.targets) == 1 and read_reduced(f, m, a.value):
            out.add(dotted(a.targets[0]))  # `metrics_dict = {'lr': lr, **metrics.compute(dist)}` (TarFlow)
        # (or one taken out of a parameter typed so: MeanFlow's `meters: dict[str, MeanMetric]`, then `batch_loss =
        # meters['batch_loss']`)
        typed = isinstance(a, ast.Assign) and len(a.targets) == 1 and _typed_torchmetrics(m, scope, a.value)
        if not (isinstance(a, ast.Assign) and len(a.targets) == 1 and (isinstance(a.value, ast.Call) or typed)):
            continue
        name = dotted(a.targets[0])
        if name and (typed or _torchmetrics(m, a.value)):
            out.add(name)  # (and what its compute() returns: MineSegSAT's `ep_loss = epoch_loss.compute()`)
            out |= {dotted(b.targets[0]) for b in walk(scope) if isinstance(b, ast.Assign) and len(
                b.targets) == 1 and isinstance(v := _peeled(b.value), ast.Call) and callee(v) == "compute" and
                isinstance(v.func, ast.Attribute) and dotted(v.func.value) == name}
            continue
        found = f.any_class(m, name) if name else None
        update = found[0].functions.get(f"{found[1].name}.update") if found else None
        if update is None:
            continue
        reduces = [c for _, c in f.p.calls_in(f.p.reach(found[0], update))
                   if callee(c) in ("all_reduce", "all_gather", "reduce")]
        branches = any(isinstance(n, ast.If) for n in ast.walk(update))
        if reduces and (not branches or any(isinstance(k.value, ast.Constant) and k.value.value is True
                                            for k in a.value.keywords)):
            out.add(name)
    return out


def read_reduced(f: Facts, m: Module, v: ast.AST) -> bool:
    """`v` is, or unpacks, what a meter's method returns when that method gathers or reduces over ranks (TarFlow's
    Metrics.compute, which averages `dist.gather_concat(...)` of each rank's mean)."""
    parts = [v] + ([x for x in v.values] if isinstance(v, ast.Dict) else [])
    for c in parts:
        if not (isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)):
            continue
        found = f.any_class(m, dotted(c.func.value))
        meth = found[0].functions.get(f"{found[1].name}.{c.func.attr}") if found else None
        if meth is not None and any(re.search(r"gather|reduce", callee(x)) and not functools_reduce(found[0], x)
                                    for x in ast.walk(meth) if isinstance(x, ast.Call)):
            return True
    return False


def _torchmetrics(m: Module, v: ast.Call) -> bool:
    """A torchmetrics metric (`MeanMetric()`, `torchmetrics.MeanMetric()`): its compute() syncs every rank's state
    first (sync_on_compute defaults to True), so what it returns is the whole run's."""
    while isinstance(v.func, ast.Attribute) and v.func.attr in ("to", "cuda") and isinstance(v.func.value, ast.Call):
        v = v.func.value  # (`MeanMetric().to(device)`)
    head = dotted(v.func).split(".")[0]
    imp = m.imports.get(head)
    return bool(imp) and imp[0].split(".")[0] == "torchmetrics" and not any(
        k.arg == "sync_on_compute" and isinstance(k.value, ast.Constant) and k.value.value is False
        for k in v.keywords)


def _peeled(v: ast.AST) -> ast.AST:
    """`metric.compute().detach().cpu().numpy()` -> `metric.compute()` (MeanFlow's loss_ave)."""
    while isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr in (
            "detach", "cpu", "numpy", "item", "tolist", "float") and isinstance(v.func.value, ast.Call):
        v = v.func.value
    return v


def _typed_torchmetrics(m: Module, scope: ast.AST, v: ast.AST) -> bool:
    """`v` reads a parameter of `scope` whose annotation names a torchmetrics class (`meters: dict[str,
    MeanMetric]`, then `meters['batch_loss']`; `loss_metric: MeanMetric`)."""
    base = v.value if isinstance(v, ast.Subscript) else v
    if not isinstance(base, ast.Name) or not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    arg = next((a for a in scope.args.args + scope.args.kwonlyargs if a.arg == base.id), None)
    names = {n.id for n in ast.walk(arg.annotation) if isinstance(n, ast.Name)} if arg and arg.annotation else set()
    return any(m.imports.get(n, ("",))[0].split(".")[0] == "torchmetrics" for n in names)


def feeds_handed_meter(f: Facts, m: Module, x: ast.Call, meter: str) -> bool:
    """`x` hands `meter` to a project function whose body feeds that parameter a loss by keyword."""
    at = [i for i, a in enumerate(x.args) if isinstance(a, ast.Name) and a.id == meter]
    # (and handed the loss: X2-VLM's run_mixed_iter(model, batch, ..., metric_logger) computes its own loss and
    # feeds it inside, where the reduction goes; TSP's helper gets the step's `loss` to log)
    stepped = {root(c.func.value) for c in walk(m.enclosing(x) or m.tree) if isinstance(c, ast.Call)
               and isinstance(c.func, ast.Attribute) and c.func.attr == "backward"}  # (the step's own loss)
    handed = any(root(a) in stepped for a in [*x.args, *(k.value for k in x.keywords)])
    for _tm, tf in f.p.resolve(m, x, exact=True) if at and handed else []:
        params = [a.arg for a in getattr(tf, "args", ast.arguments(args=[])).args]
        params = params[1:] if params[:1] in (["self"], ["cls"]) else params
        names = {params[i] for i in at if i < len(params)}
        if any(isinstance(y, ast.Call) and isinstance(y.func, ast.Attribute) and root(y.func.value) in names
               and any(LOSSISH.search(k.arg or "") for k in y.keywords) for y in walk(tf)):
            return True
    return False
