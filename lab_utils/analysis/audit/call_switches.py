"""Arms a call switches off: code in a function under a test of the function's own parameters, which one call's
arguments decide. CTM's rank-0 `self.save(save_full=False)` never reaches the barrier under `if save_full:`;
ACNet's `Engine(local_rank=0, for_val_only=True)` never reaches the one under `if num_gpus > 1 and not
for_val_only:`; YOLOv5's rank-0 `val.run(..., model=ema.ema)` never reaches the `create_dataloader(...)` (and its
barrier) under `if not training:`, where `training = model is not None`."""

from __future__ import annotations

import ast

from .project import Module

UNKNOWN = object()


def _given(fn: ast.AST, call: ast.Call, name: str):
    """The argument `call` hands parameter `name` of `fn`: an expression, or None when it hands none."""
    params = [a.arg for a in getattr(fn, "args", ast.arguments(args=[])).args]
    params = params[1:] if params[:1] in (["self"], ["cls"]) else params
    if name not in params:
        return None
    i = params.index(name)
    given = [k.value for k in call.keywords if k.arg == name] + ([call.args[i]] if i < len(call.args) else [])
    return given[0] if given else None


def _default_of(caller: ast.AST | None, name: str):
    """The constant default of the caller's own parameter `name` (DNABERT's `def evaluate(..., evaluate=True)`
    handing `evaluate=evaluate` on), else None."""
    args = getattr(caller, "args", None)
    if args is None:
        return None
    pos = args.args[len(args.args) - len(args.defaults):]
    pairs = list(zip(pos, args.defaults, strict=True)) + [
        (a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None]
    return next((d for a, d in pairs if a.arg == name and isinstance(d, ast.Constant)), None)


def _value(fn: ast.AST, call: ast.Call, e: ast.AST, depth: int = 1, caller: ast.AST | None = None):
    """What test `e` is, given the call's arguments: True, False, or UNKNOWN. A parameter handed a constant is that
    constant's truth; a parameter handed any other expression is not None (an attribute, a call: `model=ema.ema`);
    a local bound once to such a test (`training = model is not None`) is that test's value."""
    if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.Not):
        v = _value(fn, call, e.operand, depth, caller)
        return UNKNOWN if v is UNKNOWN else not v
    if isinstance(e, ast.BoolOp):
        vs = [_value(fn, call, x, depth, caller) for x in e.values]
        stop = isinstance(e.op, ast.Or)  # (an `or` is True once a term is; an `and` False once one is)
        if stop in vs:
            return stop
        return UNKNOWN if UNKNOWN in vs else not stop
    if isinstance(e, ast.Compare) and len(e.ops) == 1 and isinstance(e.ops[0], (ast.Is, ast.IsNot)) and isinstance(
            e.left, ast.Name) and isinstance(e.comparators[0], ast.Constant) and e.comparators[0].value is None:
        g = _given(fn, call, e.left.id)
        if g is None or isinstance(g, ast.Name):
            return UNKNOWN  # (not handed, or a name that may hold None)
        is_none = isinstance(g, ast.Constant) and g.value is None
        return is_none if isinstance(e.ops[0], ast.Is) else not is_none
    if isinstance(e, ast.Name):
        g = _given(fn, call, e.id)
        if isinstance(g, ast.Name) and _default_of(caller, g.id) is not None:
            g = _default_of(caller, g.id)
        if isinstance(g, ast.Constant):
            return bool(g.value)
        bound = [a.value for a in ast.walk(fn) if isinstance(a, ast.Assign) and len(a.targets) == 1
                 and isinstance(a.targets[0], ast.Name) and a.targets[0].id == e.id]
        if g is None and depth and len(bound) == 1:
            return _value(fn, call, bound[0], depth - 1, caller)
    return UNKNOWN


def switched_off_by_the_call(m: Module, fn: ast.AST, node: ast.AST, call: ast.Call, caller: ast.AST | None = None
                             ) -> bool:
    """`node` sits in an arm of an `if` in `fn` that `call`'s arguments never take (`caller`: the function the call
    is made in, whose parameters' defaults a handed name may carry)."""
    child, up = node, m.parent.get(id(node))
    while up is not None and up is not fn:
        if isinstance(up, ast.If):
            v = _value(fn, call, up.test, caller=caller)
            if v is False and any(child is s for s in up.body) or v is True and any(child is s for s in up.orelse):
                return True
        child, up = up, m.parent.get(id(up))
    return False
