"""Values every rank computes over the whole of a set, not its shard: a loss meter fed in a loop over a loader
with no sampler, or what an evaluation function returns when it is handed such a loader (built here, or returned
by the project's data builder). Every rank's number is then the single run's, so a log of it, on rank 0 or on
every rank, shows no shard's loss. The logging rules subtract these (loss_logs.py)."""

from __future__ import annotations

import ast
import re

from .facts import Facts
from .project import Module
from .syntax import LOSSISH, callee, dotted, walk


def _unsharded(v: ast.AST, m: Module | None = None) -> bool:
    """`DataLoader(dataset, batch_size=..., shuffle=False)`: no sampler (nor batch sampler) hands it a shard; its
    `**vkwargs` a dict the module writes without one (Side-output U2's `vkwargs = {'batch_size': ..., ...}`)."""
    return isinstance(v, ast.Call) and callee(v) == "DataLoader" and len(v.args) < 4 and not any(
        k.arg in ("sampler", "batch_sampler") or k.arg is None and not _dict_without_sampler(m, k.value)
        for k in v.keywords)


def _dict_without_sampler(m: Module | None, v: ast.AST) -> bool:
    made = [a.value for a in (m.nodes if m is not None and isinstance(v, ast.Name) else []) if isinstance(
        a, ast.Assign) and any(isinstance(t, ast.Name) and t.id == v.id for t in a.targets)]
    return bool(made) and all(isinstance(d, ast.Dict) and None not in d.keys and not any(
        const in ("sampler", "batch_sampler") for const in (getattr(k, "value", None) for k in d.keys)) for d in made)


def whole_set_values(f: Facts, m: Module, scope: ast.AST) -> set[str]:
    return whole_set_meters(m, scope) | _evaluated_over_whole_sets(f, m, scope)


def whole_set_meters(m: Module, scope: ast.AST) -> set[str]:
    """Meters and sums fed only inside loops over a loader with no sampler, where nothing runs backward
    (Soft-HuBERT's `validation_loss.update(loss.item())` in `for wavs, codes in validation_loader:`, a
    `DataLoader(validation_dataset, batch_size=1, shuffle=False)`): every rank goes over the whole set, so rank
    0's number is the single run's, not a shard's."""
    whole = {dotted(t) for a in m.nodes if isinstance(a, ast.Assign) and _unsharded(a.value, m)
             for t in a.targets}
    # (not a name another line binds to a loader with a sampler: OpenCOOD's `val_loader`, built with the
    # DistributedSampler in the distributed arm and without one in the single run's)
    whole -= {dotted(t) for a in m.nodes if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call) and callee(
        a.value) == "DataLoader" and not _unsharded(a.value, m) for t in a.targets}
    feeds: dict[str, list[bool]] = {}
    for n in walk(scope):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("update", "append") \
                and n.args:
            name, fed = dotted(n.func.value), n.args
        elif isinstance(n, ast.AugAssign):
            name, fed = dotted(n.target), [n.value]
        else:
            continue
        if not name or not any(isinstance(x, (ast.Name, ast.Attribute)) and LOSSISH.search(dotted(x)) for v in fed
                               for x in ast.walk(v)):
            continue
        loop = m.parent.get(id(n))
        while loop is not None and not isinstance(loop, (ast.For, ast.FunctionDef, ast.Module)):
            loop = m.parent.get(id(loop))
        it = loop.iter if isinstance(loop, ast.For) else None
        while isinstance(it, ast.Call) and it.args and callee(it) in ("enumerate", "tqdm", "iter"):
            it = it.args[0]
        feeds.setdefault(name, []).append(it is not None and dotted(it) in whole and not any(
            isinstance(c, ast.Call) and callee(c) == "backward" for c in walk(loop)))
    return {name for name, whole_loops in feeds.items() if all(whole_loops)}


def _returns_unsharded(f: Facts, m: Module, fn: ast.AST, i: int | None, depth: int = 3) -> bool:
    """Every return of `fn` hands back an unsharded loader (at position i of a returned tuple): built there, held in
    a name built so, or returned by another project function that does (Densecap's get_dataset returns
    `train_loader, valid_loader, ...`; the cloud-phase project's preProcessing returns prepare_data(...)'s)."""
    rets = [r.value for r in walk(fn) if isinstance(r, ast.Return) and r.value is not None]
    if not rets or depth == 0:
        return False
    for v in rets:
        if i is not None:
            if not isinstance(v, ast.Tuple) or i >= len(v.elts):
                return False
            v = v.elts[i]
        if not _whole_value(f, m, fn, v, depth):
            return False
    return True


def _whole_value(f: Facts, m: Module, scope: ast.AST, v: ast.AST, depth: int, seen: frozenset = frozenset()) -> bool:
    if _unsharded(v, m):
        return True
    if isinstance(v, ast.Name) and v.id not in seen:  # (a name bound from itself, `x = wrap(x)`: no loader)
        binds = [a for a in walk(scope) if isinstance(a, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == v.id for t in a.targets)]
        return bool(binds) and all(_whole_value(f, m, scope, a.value, depth, seen | {v.id}) for a in binds)
    if isinstance(v, ast.Call):
        found = f.p.resolve(m, v, exact=True)
        return bool(found) and all(_returns_unsharded(f, tm, tf, None, depth - 1) for tm, tf in found)
    return False


def _whole_loaders(f: Facts, m: Module, scope: ast.AST, depth: int = 2) -> set[str]:
    """Names in `scope` that hold an unsharded loader: bound from one (unpacked by position from a builder's
    tuple), or parameters every caller hands one."""
    kept = f.cache.setdefault("whole_loaders", {})
    key = (m.rel, id(scope), depth)
    if key in kept:
        return kept[key]
    kept[key] = out = set()
    for a in walk(scope):
        if not isinstance(a, ast.Assign) or len(a.targets) != 1:
            continue
        t, v = a.targets[0], a.value
        if isinstance(t, ast.Name) and _whole_value(f, m, scope, v, 3):
            out.add(t.id)
        elif isinstance(t, (ast.Tuple, ast.List)) and isinstance(v, ast.Call) and (found := f.p.resolve(m, v)):
            out |= {e.id for i, e in enumerate(t.elts) if isinstance(e, ast.Name) and all(
                _returns_unsharded(f, tm, tf, i) for tm, tf in found)}
    params = [x.arg for x in scope.args.args] if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) else []
    sites = f.p.callers(m, scope) if params and depth else []
    for i, name in enumerate(params):
        given = [next((k.value for k in c.keywords if k.arg == name), c.args[i] if i < len(c.args) else None)
                 for _, c in sites]
        if sites and all(isinstance(g, ast.Name) and g.id in _whole_loaders(f, cm, cm.enclosing(c) or cm.tree,
                                                                               depth - 1)
                         for g, (cm, c) in zip(given, sites, strict=True)):
            out.add(name)
    return out


def _evaluated_over_whole_sets(f: Facts, m: Module, scope: ast.AST) -> set[str]:
    """Names bound from a project function handed an unsharded loader that runs no backward and no collective
    (`valid_loss, ... = valid(model, valid_loader)`): every rank evaluates the whole set with the same weights."""
    loaders = _whole_loaders(f, m, scope)
    out = _evaluated_over_own_loaders(f, m, scope)
    for a in walk(scope) if loaders else []:
        if not isinstance(a, ast.Assign) or not isinstance(a.value, ast.Call):
            continue
        c = a.value
        if not any(isinstance(x, ast.Name) and x.id in loaders for x in [*c.args, *(k.value for k in c.keywords)]):
            continue
        found = f.p.resolve(m, c)
        if found and not f.collective_helper(m, c) and not any(f.p.function_does(
                tm, tf, lambda mm, cc: callee(cc) in ("backward", "step"), 1) for tm, tf in found):
            out |= {dotted(e) for t in a.targets for e in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t])}
    return out - {""}


def _evaluated_over_own_loaders(f: Facts, m: Module, scope: ast.AST) -> set[str]:
    """`self.eval_loss, self.eval_acc = self.evaluate()` where evaluate() loops over `self.test_loader`, which the
    class only ever builds as a DataLoader with no sampler or batch sampler given (its `**data_loader_args` come
    from a YAML config, which holds no sampler object: AudioClassification-Pytorch): the whole set's values."""
    out = set()
    for a in walk(scope):
        if not (isinstance(a, ast.Assign) and isinstance(a.value, ast.Call) and not a.value.args
                and isinstance(a.value.func, ast.Attribute) and dotted(a.value.func.value) == "self"):
            continue
        for tm, tf in f.p.resolve(m, a.value):
            loops = [_looped_loader(tm, tf, x.iter) for x in walk(tf) if isinstance(x, ast.For)]
            own = [x for x in loops if x.startswith("self.")]
            built = [b.value for b in tm.nodes if isinstance(b, ast.Assign) and any(dotted(t) in own for t in b.targets)
                     and not (isinstance(b.value, ast.Constant) and b.value.value is None)]  # (`= None` in __init__)
            if own and built and all(isinstance(v, ast.Call) and callee(v) == "DataLoader" and not any(
                    k.arg in ("sampler", "batch_sampler") for k in v.keywords) for v in built) and not any(
                    isinstance(c, ast.Call) and callee(c) in ("backward", "step") for c in walk(tf)) \
                    and not f.collective_helper(m, a.value):
                held = {dotted(e) for t in a.targets for e in (t.elts if isinstance(t, (ast.Tuple, ast.List))
                                                               else [t])}
                out |= held | {h.split(".")[-1] for h in held}  # (a log reads `self.eval_loss` by its leaf too)
    return out - {""}


def _looped_loader(m: Module, scope: ast.AST, it: ast.AST) -> str:
    """The loader a loop runs over: `enumerate(tqdm(val_loader))`, or `tbar = tqdm(self.val_loader)` then `for ...
    in enumerate(tbar)`; named as one (`loader`, `val_dl`)."""
    for _ in range(3):
        while isinstance(it, ast.Call) and it.args and callee(it) in ("enumerate", "tqdm", "iter", "zip"):
            it = it.args[0]
        made = [a.value for a in walk(scope) if isinstance(a, ast.Assign) and len(a.targets) == 1
                and dotted(a.targets[0]) == dotted(it) and isinstance(a.value, ast.Call)
                and callee(a.value) in ("tqdm", "enumerate", "iter")]
        if not made:
            break
        it = made[0]
    name = dotted(it) if isinstance(it, (ast.Name, ast.Attribute)) else ""
    return name if re.search(r"loader|_dl$|^dl_|dataloader", name.split(".")[-1], re.I) else ""
