"""Which values are averaged over ranks, for the project model (a mixin of facts.Facts, over options.DefaultOptions):
a collective on a name, a project helper that reduces (looked up through its body, not its name), a model whose
forward reduces, and the names bound from them in a scope, to a fixpoint. Asked for every log of a loss, so each
answer is kept per call and per scope for the audit (`self.cache`)."""

from __future__ import annotations

import ast
import re

from .helper_returns import reduced_in_place, returns_a_local_value, returns_own_slice
from .options import DefaultOptions
from .project import Module
from .syntax import (
    LOSSISH,
    MULTIGPU,
    REDUCING,
    callee,
    const_str,
    dotted,
    functools_reduce,
    layer_call,
    not_a_forward,
    rank_reducing_name,
    root,
    walk,
)


class Reductions(DefaultOptions):
    def collective_helper(self, m: Module, c: ast.Call) -> bool:
        """A project helper that reduces (a barrier or a broadcast averages nothing); asked once per call."""
        kept = self.cache.setdefault("collective_helper", {})
        if id(c) not in kept:
            kept[id(c)] = self._collective_helper(m, c)
        return kept[id(c)]

    def _collective_helper(self, m: Module, c: ast.Call) -> bool:
        if _function_apply(c):  # `AllReduce.apply(loss)`: an autograd Function whose forward all-reduces (I-JEPA)
            name = c.func.value.id
            held = m if name in m.classes else self.p.module_for(m, name) if name in m.imports else None
            cls = name if held is m else (m.imports[name][1] or name) if held is not None else ""
            fwd = held.functions.get(f"{cls}.forward") if held is not None else None
            return fwd is not None and any(isinstance(n, ast.Call) and callee(n) in ("all_reduce", "reduce")
                                           for n in ast.walk(fwd))
        def reduces(mm, cc):
            return (callee(cc) in REDUCING or _unseen_gather(self.p, mm, cc)) and not layer_call(mm.nodes, cc) \
                and not functools_reduce(mm, cc)
        return any(self.p.function_does(tm, tf, reduces, depth=3) and not returns_own_slice(tf)
                   and not returns_a_local_value(self, tm, tf)
                   for tm, tf in self.p.resolve(m, c, exact=True) or self.one_method(c))  # Meter(...): __init__ only
        # (one_method: OpenSTL's `self.method.vali_one_epoch(...)`, which gathers every rank's results)

    def reduced_names(self, m: Module, scope: ast.AST) -> set[str]:
        """Names in `scope` that hold a value averaged over ranks (flow-insensitive, to a fixpoint); kept per scope
        (a function with many logs asks it for each: PersFormer's runner)."""
        kept = self.cache.setdefault("reduced_names", {})
        if id(scope) not in kept:
            kept[id(scope)] = self._reduced_names(m, scope)
        return set(kept[id(scope)])

    def _reduced_names(self, m: Module, scope: ast.AST) -> set[str]:
        def collective_helper(c):
            return self.collective_helper(m, c)
        red: set[str] = set()
        for c in (n for n in walk(scope) if isinstance(n, ast.Call)):
            if callee(c) in ("all_reduce", "reduce", "all_gather") and c.args and not functools_reduce(m, c):
                red.add(root(c.args[0]))
                # `for v in logs.values(): dist.reduce(v.div_(world_size), 0)` (VICRegL): each value in place
                loop = next((x for x in walk(scope) if isinstance(x, ast.For) and isinstance(x.target, ast.Name)
                             and x.target.id == root(c.args[0]) and any(y is c for y in ast.walk(x))), None)
                if loop is not None and isinstance(loop.iter, ast.Call) and callee(loop.iter) == "values":
                    red.add(root(loop.iter.func.value))
            if callee(c) in MULTIGPU and c.args and isinstance(c.args[0], (ast.List, ast.Tuple)):
                red |= {root(e) for e in c.args[0].elts}  # `dist.all_reduce_multigpu([train_loss])` (LOCA)
            red |= {root(c.args[i]) for _, tf in self.p.resolve(m, c) for i in reduced_in_place(tf) if i < len(c.args)}
        # a model is no reduced value (DDP(model) makes no model(x) loss an average: forward_reduced judges that)
        models = self.model_names(m) | self._handed_wrapped_models(m, scope)
        nodes = list(walk(scope))
        local = self._local_names(m, nodes, models)
        # meters fed a loss by keyword (`metric_logger.update(loss=...)`): another keyword's reduced value (fewture's
        # `update(acc=acc)`, acc from gathered labels) does not make their loss reduced
        loss_fed = {root(a.func.value) for a in nodes if isinstance(a, ast.Call) and isinstance(
            a.func, ast.Attribute) and a.func.attr == "update" and any(k.arg and LOSSISH.search(k.arg)
                                                                       for k in a.keywords)}
        keys = {x.id for a in nodes if isinstance(a, ast.For) and isinstance(a.iter, ast.Call) and callee(
            a.iter) == "keys" for x in ast.walk(a.target) if isinstance(x, ast.Name)}  # (loop keys: no values)
        def own(ts): return {root(e) for t in ts for e in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t])}
        changed = True
        while changed:
            changed = False
            for a in nodes:
                targets, value = [], None
                if isinstance(a, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and a.value is not None:
                    targets = a.targets if isinstance(a, ast.Assign) else [a.target]
                    value = a.value
                elif isinstance(a, ast.For) and root(a.iter) in red and not (
                        isinstance(a.iter, ast.Call) and callee(a.iter) == "keys") and any(
                        isinstance(b, ast.Assign) and b.lineno < a.lineno and any(
                            isinstance(t, ast.Name) and t.id == root(a.iter) for t in b.targets)
                        and isinstance(b.value, ast.Call) and rank_reducing_name(b.value) for b in nodes):
                    # `for name, item in loss_dict_reduced.items():` (SSD): the items of a record a reduction
                    # returned whole before the loop (not RADTTS's loss_outputs, whose items are replaced one by one
                    # in the loop, nor P5's results, reduced only after it; its keys are no values, neither reduced
                    # nor local: FreeYOLO logs `loss_dict[k]` for k in loss_dict_reduced.keys())
                    targets, value = [a.target], a.iter
                elif isinstance(a, ast.Call) and isinstance(a.func, ast.Attribute) and a.func.attr in (
                        "update", "append", "add_") and (a.args or a.keywords):
                    # meter.update(v, n) or metric_logger.update(loss=v): the meter holds what it is fed (its loss
                    # keyword's value: EMCL's `meters.update(time=batch_time, loss=float(reduced_l))`)
                    lossy = [k.value for k in a.keywords if k.arg and LOSSISH.search(k.arg)]
                    if not lossy and a.keywords and not a.args and root(a.func.value) in loss_fed:
                        continue
                    # (a keyed record's value follows its key: `train_metrics.update('loss', reduced_loss, n)`)
                    keyed = len(a.args) > 1 and const_str(a.args[0]) is not None
                    targets, value = [a.func.value], a.args[int(keyed)] if a.args else (
                        lossy or [a.keywords[0].value])[0]
                if value is None:
                    continue
                # (not a comprehension's own variable: SSD's `sum(loss for loss in loss_dict_reduced.values())`)
                bound = {x.id for g in ast.walk(value) if isinstance(g, ast.comprehension) for x in ast.walk(g.target)
                         if isinstance(x, ast.Name)}
                read = {root(n) for n in ast.walk(value) if isinstance(n, (ast.Name, ast.Attribute))} - keys - bound
                hit = any(isinstance(n, ast.Call) and (rank_reducing_name(n) and "batchnorm" not in
                                                       callee(n).lower() and not layer_call(m.nodes, n)
                                                       and not functools_reduce(m, n)
                                                       or collective_helper(n)
                                                       or self.forward_reduced(m, n))
                          for n in ast.walk(value)) or (read & red and not read & (local - red - own(targets)))
                # (`train_loss = train_loss + reduced / world_size`: its own old value is no local one, LNO)
                if not hit:
                    continue
                for t in targets:
                    for e in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]):
                        r = root(e)
                        if r and r not in red and r not in models:
                            red.add(r)
                            changed = True
        return red

    def _handed_wrapped_models(self, m: Module, scope: ast.AST) -> set[str]:
        """The scope's parameters named as a DDP-wrapped model is somewhere in the project (CaCo's
        init_memory(train_loader, model, ...), handed the wrapper main_worker built): what their forward returns is
        this rank's own, whatever a gather later in the loop fills (its memory bank from concat_all_gather(k))."""
        wrapped = {n for names in self.ddp_wrapped.values() for n in names if "." not in n}
        args = getattr(scope, "args", None)
        handed = {a.arg for a in (args.args + args.kwonlyargs if args else [])} & wrapped
        # only where a gather fills a bank in place (`Memory_Bank.W.data[:, a:b] = output.T`, output gathered):
        # elsewhere what the model returns next to its loss (PET's weight_dict) may be no activation of this rank
        gathered = {t.id for a in walk(scope) if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call) and (
            callee(a.value) in REDUCING or self.collective_helper(m, a.value)) for t in a.targets
            if isinstance(t, ast.Name)} if handed else set()
        fills = any(isinstance(a, ast.Assign) and any(isinstance(t, ast.Subscript) for t in a.targets) and any(
            isinstance(n, ast.Name) and n.id in gathered for n in ast.walk(a.value)) for a in walk(scope))
        return handed if fills else set()

    def _local_names(self, m: Module, nodes: list, models: set[str]) -> set[str]:
        """Names holding this rank's own activations: what the model returns (unless its forward reduces) and
        what is computed from it. A value mixing one of them with a reduced value is still this rank's own:
        `subloss = -(q * log_softmax(x)).mean()` with q from a distributed Sinkhorn, x the local logits."""
        local: set[str] = set()
        for _ in range(4):
            for a in nodes:
                if not isinstance(a, (ast.Assign, ast.AugAssign)) or a.value is None:
                    continue
                calls = [n for n in ast.walk(a.value) if isinstance(n, ast.Call)]
                if any(rank_reducing_name(n) for n in calls):
                    continue
                if any(root(n.func) in models and not not_a_forward(n) and not self.forward_reduced(m, n)
                       for n in calls) or any(
                        root(n) in local for n in ast.walk(a.value) if isinstance(n, (ast.Name, ast.Attribute))):
                    for t in (a.targets if isinstance(a, ast.Assign) else [a.target]):
                        local |= {root(e) for e in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t])} - {""}
        return local - models


def _unseen_gather(p, m: Module, c: ast.Call) -> bool:
    """A helper the files lack, named for a gather or a reduction over ranks (OpenSTL's `gather_tensors_batch`),
    not for a device sync (`torch.cuda.synchronize`) or an average (`np.average`)."""
    return bool(re.search(r"gather|reduce", callee(c))) and rank_reducing_name(c) and not p.resolve(m, c) and \
        dotted(c.func).split(".")[0] not in ("np", "numpy", "torch", "functools", "math")


def _function_apply(c: ast.Call) -> bool:
    """`Name.apply(x)`: how an autograd.Function runs its forward."""
    return isinstance(c.func, ast.Attribute) and c.func.attr == "apply" and isinstance(c.func.value, ast.Name)
