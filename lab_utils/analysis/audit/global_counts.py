"""A loss normalised by a count summed over ranks (for rules/gradients.py's sum-loss-unscaled): `num = target.sum();
dist.all_reduce(num)`, then `loss = criterion(out, target, num)` or `loss = l.sum() / num`. Each rank's loss is
then its own sum over the global count, 1/world_size of the single run's per-sample mean, and DDP's average of the
gradients divides by world_size once more; DETR divides the count by get_world_size() to undo it."""

from __future__ import annotations

import ast
import re

from .facts import Facts
from .project import Module
from .registry import Hit
from .syntax import LOSSISH, MULTIGPU, WORLDISH, callee, dotted, involves, kw, root, walk

LOSS_CLASS = re.compile(r"loss|criterion", re.I)


def global_count_hits(f: Facts, m: Module):
    told: dict[tuple[int, str], Hit] = {}  # one finding per function and count (LOCA sums it for training and
    # validation alike), the other reductions as related places
    for c in m.calls:
        count = _summed_count(c)
        scope = m.enclosing(c)
        if count is None or scope is None:
            continue
        after = [n for n in walk(scope) if getattr(n, "lineno", 0) > c.lineno]
        if any(_rescaled(n, count) for n in walk(scope)):
            continue  # `torch.clamp(num_boxes / get_world_size(), min=1)`, `num /= world_size` (DETR)
        use = _normalises_a_loss(m, scope, after, count)
        if use is not None and (id(scope), count) in told:
            hit = told[id(scope), count]
            told[id(scope), count] = hit._replace(related=(*hit.related, (m, c)))
        elif use is not None:
            told[id(scope), count] = Hit(
                c, f"{count} is summed over ranks here and then normalises the loss (line {use.lineno}): each rank's "
                "loss is its own sum over the global count, 1/world_size of the single run's, and DDP averages the "
                "gradients over ranks on top, so each step is 1/world_size of the single run's — divide "
                f"{count} by the world size after the all_reduce (DETR's `num_boxes / get_world_size()`)",
                related=((m, use),))
    yield from told.values()


def _summed_count(c: ast.Call) -> str | None:
    """The name an all_reduce sums in place: `dist.all_reduce(num)`, `dist.all_reduce_multigpu([num])`; not one
    with another op (`op=ReduceOp.AVG`, MAX)."""
    op = kw(c, "op") or (c.args[1] if len(c.args) > 1 and callee(c) == "all_reduce" else None)
    if op is not None and not dotted(op).endswith("SUM"):
        return None
    arg = c.args[0] if c.args else None
    if callee(c) in MULTIGPU and isinstance(arg, (ast.List, ast.Tuple)) and len(arg.elts) == 1:
        arg = arg.elts[0]
    elif callee(c) != "all_reduce":
        return None
    name = dotted(arg) if isinstance(arg, (ast.Name, ast.Attribute)) else ""
    return name if name and not LOSSISH.search(name) else None  # (a loss summed over ranks is its own story)


def _rescaled(n: ast.AST, count: str) -> bool:
    if isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Div, ast.FloorDiv)) and dotted(n.left) == count:
        return involves(n.right, WORLDISH)
    if isinstance(n, ast.AugAssign) and isinstance(n.op, (ast.Div, ast.FloorDiv)) and dotted(n.target) == count:
        return involves(n.value, WORLDISH)
    if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult):  # the loss (or the count's inverse) times the size
        return involves(n, WORLDISH)
    return False


def _normalises_a_loss(m: Module, scope: ast.AST, after: list, count: str) -> ast.AST | None:
    """Where the summed count normalises a loss: divides an assignment to a loss-named value, or is handed to a
    loss-named call (`criterion(out, target, num_objects)`), in a function that runs backward, or in a loss
    class's method (DETR's SetCriterion.forward, `self.get_loss(..., num_boxes)`)."""
    steps = any(isinstance(n, ast.Call) and callee(n) == "backward" for n in walk(scope))
    cls = m.class_of(scope)
    in_loss = cls is not None and LOSS_CLASS.search(cls) is not None
    if not (steps or in_loss):
        return None
    for n in after:
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div) and root(n.right) == root(count) and \
                dotted(n.right) == count:
            return n if in_loss or _into_a_loss(m, n) else None
        if isinstance(n, ast.Call) and any(dotted(a) == count for a in [*n.args, *(k.value for k in n.keywords)]):
            named = LOSSISH.search(callee(n)) or LOSS_CLASS.search(dotted(n.func))
            if named or in_loss and dotted(n.func).startswith("self.") or _into_a_loss(m, n) and steps:
                return n
    return None


def _into_a_loss(m: Module, n: ast.AST) -> bool:
    up = m.parent.get(id(n))
    while up is not None and not isinstance(up, (ast.Assign, ast.AugAssign, ast.stmt)):
        up = m.parent.get(id(up))
    targets = up.targets if isinstance(up, ast.Assign) else [up.target] if isinstance(up, ast.AugAssign) else []
    return any(LOSSISH.search(dotted(t) or "") for t in targets)
