"""What a project helper that runs a collective hands back: only its own rank's rows of what it gathered (MoCo's
batch unshuffle), or a value of this rank's own that no reduction in it reached (Si-Blurry's online_step, which
gathers labels for its memory yet returns the loss of this rank's batch). Either way its result is no value
averaged over ranks, which facts.collective_helper asks before the loss rules call a name reduced."""

from __future__ import annotations

import ast

from .syntax import REDUCEISH, REDUCING, callee, dotted, rank_reducing_name, root, walk


def returns_own_slice(fn: ast.AST) -> bool:
    """The helper gathers, then hands back only its rank's rows (MoCo's _batch_unshuffle_ddp: `x_gather =
    concat_all_gather(x)` ... `return x_gather[idx_this]`; _batch_shuffle_ddp also returns its index): no value
    averaged over ranks."""
    rets = [r.value for r in walk(fn) if isinstance(r, ast.Return) and r.value is not None]
    gathered = {dotted(t) for a in walk(fn) if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call)
                and "gather" in callee(a.value) for t in a.targets}
    parts = [e for r in rets for e in (r.elts if isinstance(r, ast.Tuple) else [r])]  # (`return x[idx], idx`)
    return bool(gathered) and bool(parts) and all(
        isinstance(e, ast.Subscript) and dotted(e.value) in gathered or not any(
            isinstance(n, (ast.Name, ast.Attribute)) and dotted(n) in gathered for n in ast.walk(e)) for e in parts)


def returns_a_local_value(f, m, fn: ast.AST) -> bool:
    """`fn` returns values, and none of them is (or is built from) what a reduction in it averaged: not the
    result of a collective or of a helper named for one, nor a name fn's own reductions reached."""
    rets = [r.value for r in walk(fn) if isinstance(r, ast.Return) and r.value is not None]
    busy = f.cache.setdefault("returns_local_busy", set())
    if not rets or id(fn) in busy or not all(_plain_numbers(fn, v) for v in rets):
        return False  # (what a meter or a record hands back is not judged here: `loss_m.avg`, `results['loss']`)
    busy.add(id(fn))
    try:  # (with what a call named for a reduction syncs: ConvNeXt's metric_logger.synchronize_between_processes())
        red = f.reduced_names(m, fn) | {root(c.func.value) for c in walk(fn) if isinstance(c, ast.Call)
                                        and isinstance(c.func, ast.Attribute) and REDUCEISH.search(c.func.attr)}
    finally:
        busy.discard(id(fn))
    return not any(isinstance(n, ast.Call) and (callee(n) in REDUCING or rank_reducing_name(n)) or isinstance(
        n, (ast.Name, ast.Attribute)) and (root(n) in red or dotted(n) in red) for v in rets for n in ast.walk(v))


def _plain_numbers(fn: ast.AST, v: ast.AST) -> bool:
    """`v` is arithmetic over names the function binds itself (`_loss / _iter, _acc / _iter`, `loss.item()`),
    none of them an object whose other methods the function calls (a meter it feeds)."""
    own = {t.id for a in walk(fn) if isinstance(a, (ast.Assign, ast.AugAssign))
           for t in ast.walk(a.targets[0] if isinstance(a, ast.Assign) else a.target) if isinstance(t, ast.Name)}
    fed = {root(c.func.value) for c in walk(fn) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
           and c.func.attr not in ("item", "detach", "mean", "cpu", "float", "sum")}
    for n in ast.walk(v):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and (n.id not in own or n.id in fed):
            return False
        if isinstance(n, ast.Call) and not (isinstance(n.func, ast.Attribute) and n.func.attr in (
                "item", "detach", "mean", "cpu", "float", "sum")) or isinstance(n, (ast.Subscript, ast.Dict,
                                                                                     ast.DictComp, ast.ListComp)):
            return False
        if isinstance(n, ast.Attribute) and n.attr not in ("item", "detach", "mean", "cpu", "float", "sum"):
            return False
    return True


def reduced_in_place(fn: ast.AST) -> set[int]:
    """The positions of the parameters a helper all-reduces in place (VirTex's average_across_processes(t):
    `for k in t: dist.all_reduce(t[k])`, then `t[k] /= world_size`): its caller's argument there is averaged."""
    params = [a.arg for a in fn.args.args]
    done = {root(c.args[0]) for c in walk(fn) if isinstance(c, ast.Call) and callee(c) == "all_reduce" and c.args}
    return {i - (params[0] in ("self", "cls")) for i, p in enumerate(params) if p in done}
