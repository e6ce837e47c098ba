"""What a logged name holds: the loss function rather than a loss value, the name a loss was copied from, or a value
that is already the global batch's because every caller of the logging function hands it one. The logging rules
ask this before they call a log rank 0's own loss."""

from __future__ import annotations

import ast

from .facts import Facts
from .gathers import global_model_losses
from .project import Module
from .syntax import LOSSISH, callee, dotted, root


def handed_global(f: Facts, m: Module, scope: ast.AST, name: str) -> bool:
    """`name` is a parameter of the logging function (arcface's CallBackLogging.__call__(step, loss, ...)) and
    every project caller hands it a value that is already the global batch's there: reduced over ranks, or the
    loss of a model that gathers every rank's features."""
    if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    params = [a.arg for a in scope.args.args]
    if name not in params:  # a text built from such parameters (`msg = "Loss %.4f" % loss.avg`)
        built = [a.value for a in ast.walk(scope) if isinstance(a, ast.Assign)
                 and name in {dotted(t) for t in a.targets}]
        reads = {root(n) for v in built for n in ast.walk(v) if isinstance(n, (ast.Name, ast.Attribute))}
        lossy = {r for r in reads if r in params and LOSSISH.search(r)}
        return bool(built) and bool(lossy) and all(handed_global(f, m, scope, r) for r in lossy)
    i = params.index(name) - (1 if params[0] in ("self", "cls") else 0)
    sites = f.p.callers(m, scope)
    for cm, c in sites:
        given = next((k.value for k in c.keywords if k.arg == name), c.args[i] if 0 <= i < len(c.args) else None)
        cs = cm.enclosing(c) or cm.tree
        if given is None or root(given) not in global_model_losses(f, cm, cs) | f.reduced_names(cm, cs):
            return False
    return bool(sites)


def holds_a_loss_module(m: Module, scope: ast.AST, c: ast.Call, name: str) -> bool:
    """At the log `c`, `name` still holds the loss function its last binding built (`loss =
    LOSS_DICT[name].cuda(gpu)`, then `print("{} Loss Generated".format(loss))`, CurricularFace): no loss value.
    A rebinding inside a loop around the log (`loss = criterion(out, y)`) would reach it."""
    binds = [a for a in ast.walk(scope) if isinstance(a, ast.Assign) and a.lineno < c.lineno
             and any(isinstance(t, ast.Name) and t.id == name for t in a.targets)]
    if not binds:
        return False
    v = max(binds, key=lambda a: a.lineno).value
    while isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr in ("cuda", "to"):
        v = v.func.value
    if isinstance(v, ast.Subscript) and isinstance(v.value, ast.Name):  # LOSS_DICT[cfg['LOSS_NAME']]
        table = v.value.id
        v = next((d.value.values[0] for d in ast.walk(scope) if isinstance(d, ast.Assign) and isinstance(
            d.value, ast.Dict) and d.value.values and any(dotted(t) == table for t in d.targets)), v)
    n = m.parent.get(id(c))
    while n is not None and n is not scope:
        if isinstance(n, (ast.For, ast.While)) and any(isinstance(a, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in a.targets) for a in ast.walk(n)):
            return False
        n = m.parent.get(id(n))
    return loss_module(v)



def origins(scope: ast.AST, lossy) -> set[str]:
    """Each logged name, or the name it was copied from (`epoch_loss = losses.avg`): one loss, one finding."""
    copied = {dotted(a.targets[0]): root(a.value) for a in ast.walk(scope) if isinstance(a, ast.Assign)
              and len(a.targets) == 1 and isinstance(a.targets[0], ast.Name)
              and isinstance(a.value, (ast.Name, ast.Attribute))}
    return {copied.get(n) or n for n in lossy}


def loss_module(v: ast.AST) -> bool:
    """A loss function being built (`criterion["stft"] = MultiResolutionSTFTLoss(...)`): no loss value."""
    return isinstance(v, ast.Call) and callee(v)[:1].isupper() and LOSSISH.search(callee(v)) is not None


def loaded_from_a_checkpoint(f: Facts, m: Module, scope: ast.AST, c: ast.Call, name: str) -> bool:
    """Before the log `c`, `name` is only assigned what a project function that torch.loads a checkpoint returns
    (`ep_start, performance_desc = misc.load_checkpoint(...)`, SparK's "PT already done" print): a value this run
    read back, not a loss it computed."""
    binds = [a for a in ast.walk(scope) if isinstance(a, ast.Assign) and a.lineno < c.lineno and name in {
        dotted(x) for t in a.targets for x in (t.elts if isinstance(t, ast.Tuple) else [t])}]
    return bool(binds) and all(isinstance(a.value, ast.Call) and any(
        f.p.function_does(tm, tf, lambda mm, cc: callee(cc) == "load" and "torch" in dotted(cc.func), 1)
        for tm, tf in f.p.resolve(m, a.value)) for a in binds)


LABELISH = ("target", "label", "labels", "targets", "y", "gt")


def over_gathered_labels(m: Module, scope: ast.AST) -> set[str]:
    """Losses computed over every rank's labels: `target = ts.distributed.gather(target, dim=0)` then `loss_id,
    loss_g, one_hot = criterion(output, target, x_norm)` (MagFace's model-parallel classifier): the loss covers the
    global batch on every rank, so rank 0's value is the run's. Names assigned from a call handed the gathered
    labels, and sums of them (`loss = loss_id + lam * loss_g`)."""
    gathered = {dotted(t) for a in ast.walk(scope) if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call)
                and "gather" in callee(a.value) and "dist" in dotted(a.value.func) and a.value.args
                and dotted(a.value.args[0]).split(".")[-1] in LABELISH for t in a.targets}
    if not gathered:
        return set()
    out: set[str] = set()
    for _ in range(2):
        for a in ast.walk(scope):
            if not isinstance(a, ast.Assign):
                continue
            reads = {dotted(n) for n in ast.walk(a.value) if isinstance(n, (ast.Name, ast.Attribute))}
            handed = isinstance(a.value, ast.Call) and reads & gathered
            summed = isinstance(a.value, ast.BinOp) and any(LOSSISH.search(r) for r in reads) and all(
                r in out for r in reads if LOSSISH.search(r))
            if handed or summed:
                out |= {dotted(x) for t in a.targets for x in (t.elts if isinstance(t, ast.Tuple) else [t])}
    return out


def every_loss_over_gathered_labels(m: Module, scope: ast.AST) -> bool:
    """Every loss the function computes (a loss-named result of a call, or a sum of such) is over every rank's
    labels (over_gathered_labels): so is each meter or record fed from them."""
    over = over_gathered_labels(m, scope)
    computed = {dotted(x) for a in ast.walk(scope) if isinstance(a, ast.Assign) and isinstance(
        a.value, (ast.Call, ast.BinOp)) for t in a.targets for x in (t.elts if isinstance(t, ast.Tuple) else [t])
        if LOSSISH.search(dotted(x)) and not (isinstance(a.value, ast.Call) and (
            callee(a.value) in ("item", "float") or callee(a.value)[:1].isupper()))}  # (a meter: AverageMeter(...))
    return bool(over) and bool(computed) and computed <= over
