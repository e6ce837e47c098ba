"""Chapter 00: the process group is set up only under a distributed switch, but a collective runs outside it, so
the single-process run of the script raises 'Default process group has not been initialized'."""


from __future__ import annotations

import ast
import re

from ..facts import Facts
from ..hierarchy import never_named, plain_function
from ..project import Module
from ..registry import Hit, rule
from ..switches import distributed_switch, group_check, one_process_arm, switched, under_switch_constant
from ..syntax import (
    DIST_SWITCH,
    WORLDISH,
    always_returns,
    callee,
    dotted,
    involves,
    walk,
)


@rule("collective-outside-switch", "00_preflight", "the process group is set up only under a distributed switch "
      "(`if args.distributed:`), but a collective runs outside it: the single-process run of the script raises "
      "'Default process group has not been initialized'")
def collective_outside_switch(f: Facts, m: Module):
    """One defect per switch: every collective the switch leaves out (ANCE's barrier after each step, at the
    end of training and in its MRR evaluation) is fixed the same way, so the first (a script's before a
    helper's) is the finding and the others are its related places."""
    if "outside_switch" not in f.cache:
        hits = [(mm, h) for mm in f.p.modules.values() for h in _outside_switch_hits(f, mm)]
        hits.sort(key=lambda x: (not x[0].entry, x[0].rel, x[1].node.lineno))
        f.cache["outside_switch"] = (hits[0][0], hits[0][1]._replace(related=(*hits[0][1].related, *(
            (mm, h.node) for mm, h in hits[1:]))[:6])) if hits else None
    first = f.cache["outside_switch"]
    if first is not None and first[0] is m:
        yield first[1]


def _alias_calls(m: Module, fn: ast.AST) -> list:
    """The calls of a name a function is assigned to (`sync_func = sync_gradients_sparsely` in one arm of an
    if chain), in the function that assigns it: where the function runs."""
    out = []
    for a in m.nodes:
        if isinstance(a, ast.Assign) and isinstance(a.value, ast.Name) and a.value.id == fn.name and len(
                a.targets) == 1 and isinstance(a.targets[0], ast.Name):
            scope = m.enclosing(a) or m.tree
            out += [(m, x) for x in walk(scope) if isinstance(x, ast.Call) and isinstance(x.func, ast.Name)
                    and x.func.id == a.targets[0].id]
    return out


def _outside_switch_hits(f: Facts, m: Module):
    inits = [(mm, c) for mm in f.p.related(m) for c in mm.calls if callee(c) == "init_process_group"]
    if not inits or not all(_optional_group(f, mm, c) for mm, c in inits) or f.runs_only_distributed():
        return  # the group exists in every run the script can make (or a run without it stops at the sampler)
    flags, told = _group_flags(f), set()
    for c in sorted(m.calls, key=lambda x: (x.lineno, x.col_offset)):
        # a wrap outside the switch counts only where the project runs without the group (SEA-RAFT's `main(0, 1,
        # args, False)`): elsewhere the one-process run stops at the wrap, before any work
        wrap = f.is_ddp_call(m, c) and _runs_one_process(f)
        if not wrap and (callee(c) not in ("barrier", "all_reduce", "broadcast", "all_gather", "new_group")
                         or "dist" not in dotted(c.func) or not _torch_distributed(m, c)):
            continue
        if switched(f.p, m, c) is not None or f.g.kind(m, c) is not None or m.enclosing(c) is None and \
                not m.entry or _under_flag(m, c, flags) or _under_engine_arm(m, c):
            continue
        fn = m.enclosing(c)
        sites = f.p.callers(m, fn) + _apply_sites(f, m, fn) if fn is not None else []
        if fn is not None and not sites:  # a closure (SegmenTron's reduce_tensor): its outer body calls it
            outer = m.enclosing(fn)
            sites = [(m, x) for x in ast.walk(outer) if isinstance(x, ast.Call) and isinstance(x.func, ast.Name)
                     and x.func.id == fn.name] if outer is not None else []
            # ... or hands it on as a hook (WaveGlow's `queue_callback(allreduce_params)` in
            # apply_gradient_allreduce): it runs where the outer function's callers run it
            sites = sites or (f.p.callers(m, outer) if outer is not None else [])
        if fn is not None and not sites:  # picked into a name, called through it (Grendel-GS's `sync_func =
            sites = _alias_calls(m, fn)  # sync_gradients_sparsely`, then `sync_func(self, group)` under the switch)
        if wrap and fn is not None and not sites:
            continue  # a wrap helper nothing here calls (SparK's unused parallelize()): its callers decide
        if fn is not None and not sites and m.enclosing(fn) is None and m.class_of(fn) is None and \
                plain_function(fn) and never_named(f.p, m, fn):
            continue  # a module function named nowhere (semantic-segmentation's reduce_tensor): dead code here
        if any(switched(f.p, cm, cc) is not None or under_switch_constant(f.p, cm, cc) for cm, cc in sites) or \
                fn is not None and _called_under_switch(f, m, fn) or under_switch_constant(f.p, m, c):
            continue  # the helper is only called under the switch
        if sites and all(f.off_in_default_run(cm, cc) for cm, cc in sites):
            continue  # ... or under an option off unless given (HyperFuture's `if self.args.cross_gpu_score:`)
        if fn is not None and (_group_checked_before(m, fn, c) or _checked_first(f, m, fn)):
            continue  # the helper checks the group itself
        if fn is not None and fn in told:
            continue  # one finding per helper: its barrier and its all_reduce are one defect
        told.add(fn)
        sm, sc = _group_set_up_at(f, *inits[0])
        switch = ast.unparse(distributed_switch(sm, sc))
        where = f"line {sc.lineno}" if sm is m else f"{sm.rel}:{sc.lineno}"
        # the helper's calls from the scripts (VAR's train.py), where the switch could go instead, as related places
        yield Hit(c, (f"{ast.unparse(c.func)}() runs whether or not `{switch}` set up the process group ({where}): "
                      "at two ranks it synchronises, but the "
                      "single-process run of this script raises 'Default process group has not been initialized' — "
                      "put it under the same switch (or `if dist.is_initialized():`)"),
                  related=tuple(_entry_sites(f, m, fn))[:3] if fn is not None else ())


def _under_engine_arm(m: Module, c: ast.Call) -> bool:
    """`c` in the arm of a test that asks for a distributed engine (Sockeye's `if utils.using_deepspeed():`): DeepSpeed,
    FSDP and Horovod set up the process group themselves, so that arm never runs without one."""
    child, n = c, m.parent.get(id(c))
    while n is not None and not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        if isinstance(n, ast.If) and any(child is s for s in n.body) and ENGINE.search(ast.unparse(n.test)):
            return True
        child, n = n, m.parent.get(id(n))
    return False


ENGINE = re.compile(r"deepspeed|fsdp|horovod", re.I)


def _runs_one_process(f: Facts) -> bool:
    """A script of the project calls its own code with the distributed switch off (`main(0, 1, args, False)` for
    `def main(rank, world_size, args, use_ddp)`, SEA-RAFT's one-GPU path): the project has a one-process run."""
    if "one_process" not in f.cache:
        f.cache["one_process"] = False
        for m in (mm for mm in f.p.modules.values() if mm.entry):
            for c in m.calls:
                for _, tf in f.p.resolve(m, c, exact=True):
                    params = [a.arg for a in getattr(tf, "args", ast.arguments(args=[])).args]
                    params = params[1:] if params[:1] in (["self"], ["cls"]) else params
                    given = [*zip(params, c.args, strict=False), *((k.arg, k.value) for k in c.keywords)]
                    if any(p and DIST_SWITCH.search(p) and isinstance(a, ast.Constant) and a.value in (False, 0)
                           for p, a in given):
                        f.cache["one_process"] = True
    return f.cache["one_process"]


def _entry_sites(f: Facts, m: Module, fn: ast.AST, depth: int = 3) -> list[tuple[Module, ast.Call]]:
    """The scripts' calls that reach the helper `fn`, up to `depth` helpers up. A method called on an object the
    project cannot type (`for meter in self.meters.values(): meter.synchronize_between_processes()`, VAR's
    MetricLogger over its SmoothedValues) is reached by the calls of that method name on such objects."""
    out, frontier, seen = [], [(m, fn)], set()
    for _ in range(depth):
        nxt = []
        for mm, g in frontier:
            if id(g) in seen:
                continue
            seen.add(id(g))
            sites = f.p.callers(mm, g) or [
                (cm, c) for cm in f.p.modules.values() for c in cm.calls if isinstance(c.func, ast.Attribute)
                and c.func.attr == getattr(g, "name", None) and not f.p.resolve(cm, c)]
            for cm, c in sites:
                if cm.entry:
                    out.append((cm, c))
                elif cm.enclosing(c) is not None:
                    nxt.append((cm, cm.enclosing(c)))
        frontier = nxt
    return out


def _group_checked_before(m: Module, fn: ast.AST, c: ast.Call) -> bool:
    """The function asks whether the group exists around `c` or before it (`if not dist.is_initialized(): return`
    in a helper); a check elsewhere in a long main() (Oscar's, around another call) does not cover `c`."""
    checks = [n for n in walk(fn) if isinstance(n, ast.Call) and callee(n) in GROUP_CHECKS]
    small = sum(isinstance(n, ast.stmt) for n in walk(fn)) <= 15
    return bool(checks) and (small or any(n.lineno <= c.lineno and any(
        isinstance(up, ast.If) and any(x is n for x in ast.walk(up.test)) and (
            any(y is c for y in ast.walk(up)) or always_returns(up.body)) for up in m.nodes) for n in checks))


def _optional_group(f: Facts, m: Module, init: ast.Call) -> bool:
    """The process group is set up only under a distributed switch, there or around the call of the helper that
    sets it up (WAFT's `if use_ddp: setup_ddp(rank, world_size)`); `if dist.is_initialized(): return` (or `if not
    dist.is_initialized(): init_process_group(...)`) only keeps a second set-up from running: the group exists."""
    test = distributed_switch(m, init)
    if test is None:
        fn = m.enclosing(init)
        return fn is not None and m.class_of(fn) is None and _unconditional_in(m, init, fn) and \
            _called_under_switch(f, m, fn, depth=1)
    return not group_check(test) and not _always_true(test)


def _group_set_up_at(f: Facts, m: Module, init: ast.Call) -> tuple[Module, ast.Call]:
    """Where the switch sets up the group: the init_process_group call itself, or the call of the helper around it
    that sits under the switch (WAFT's `setup_ddp(rank, world_size)` under `if use_ddp:`)."""
    if distributed_switch(m, init) is not None:
        return m, init
    fn = m.enclosing(init)
    return next(((cm, cc) for cm, cc in f.p.callers(m, fn) if distributed_switch(cm, cc) is not None), (m, init))


def _unconditional_in(m: Module, node: ast.AST, fn: ast.AST) -> bool:
    """No branch around `node` inside `fn` (a set-up helper that always sets up when called)."""
    n = m.parent.get(id(node))
    while n is not None and n is not fn:
        if isinstance(n, (ast.If, ast.Try, ast.IfExp)):
            return False
        n = m.parent.get(id(n))
    return True


def _always_true(test: ast.AST) -> bool:
    """`if world_size >= 1:` (unicom's retrieval.py) holds for every run, a single one too: no switch."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.comparators[0], ast.Constant)
            and involves(test.left, WORLDISH)):
        return False
    op, k = test.ops[0], test.comparators[0].value
    return isinstance(op, ast.GtE) and k == 1 or isinstance(op, (ast.Gt, ast.NotEq)) and k == 0


def _called_under_switch(f: Facts, m: Module, fn: ast.AST, depth: int = 3) -> bool:
    """A helper called under a distributed switch, directly or through helpers (`all_reduce` called by
    `all_gather_list`, which the loss calls only `if world_size > 1:`)."""
    outer = m.enclosing(fn)  # a closure runs where its outer body calls it
    local = [(m, x) for x in ast.walk(outer) if isinstance(x, ast.Call) and isinstance(x.func, ast.Name)
             and x.func.id == fn.name] if outer is not None else []
    for cm, cc in f.p.callers(m, fn) or _calls_by_method_name(f, m, fn) or _alias_calls(m, fn) or local:
        if one_process_arm(cm, cc):
            continue  # (the switch's other arm, WAFT's `else: main(0, 1, args, False)`: run without the group)
        if distributed_switch(cm, cc) is not None:
            return True
        outer = cm.enclosing(cc)
        if depth and outer is not None and outer is not fn and _called_under_switch(f, cm, outer, depth - 1):
            return True
    return False


def _calls_by_method_name(f: Facts, m: Module, fn: ast.AST) -> list:
    """A reducing method no call resolves to (SevenNet's `metric.ddp_reduce(self.device)`, on an element of
    `recorder.metrics`): the project's calls of that method name, when the name says it reduces."""
    if m.class_of(fn) is None or not re.search(r"reduce|sync|gather|ddp|dist", fn.name, re.I):
        return []
    return [(mm, c) for mm in f.p.modules.values() for c in mm.calls
            if isinstance(c.func, ast.Attribute) and c.func.attr == fn.name]


GROUP_CHECKS = ("is_initialized", "is_available")


def _apply_sites(f: Facts, m: Module, fn: ast.AST) -> list:
    """The calls that run an autograd.Function's forward or backward: `GatherLayer.apply(x)`, in its own module
    or one that imports it (SynTBPR's AllGather, applied in the model after `if not is_using_distributed():
    return input`). Its forward runs wherever apply is called, never by its own name."""
    cls = m.class_of(fn)
    if cls is None or fn.name not in ("forward", "backward"):
        return []
    return [(mm, c) for mm in f.p.modules.values() for c in mm.calls if isinstance(c.func, ast.Attribute)
            and c.func.attr == "apply" and dotted(c.func.value) == cls and (mm is m or f.p.module_for(mm, cls) is m)]


def _checked_first(f: Facts, m: Module, fn: ast.AST) -> bool:
    """The function returns early unless a helper says the group exists: `if not is_dist_avail_and_initialized():
    return` (the helper calls dist.is_available() and dist.is_initialized())."""
    return any(isinstance(s, ast.If) and s.body and isinstance(s.body[-1], ast.Return) and any(
        isinstance(n, ast.Call) and any(f.p.function_does(tm, tf, lambda mm, cc: callee(cc) in GROUP_CHECKS, 1)
                                        for tm, tf in f.p.resolve(m, n)) for n in ast.walk(s.test))
        for s in fn.body)


def _torch_distributed(m: Module, c: ast.Call) -> bool:
    """`dist.barrier()` is torch.distributed's, not a project module's wrapper of the same name (`import dist`,
    whose barrier checks the group itself)."""
    head = dotted(c.func).split(".")[0]
    imp = m.imports.get(head)
    return imp is None or ".".join(x for x in imp[:2] if x).startswith("torch")


def _group_flags(f: Facts) -> set[str]:
    """Names set True by the function that creates the process group (`initialized = True` after
    init_process_group): a test of one is a test of whether the group exists."""
    if not hasattr(f, "_group_flags"):
        out = set()
        for mm in f.p.modules.values():
            for fn in mm.functions.values():
                if any(isinstance(n, ast.Call) and callee(n) == "init_process_group" for n in walk(fn)):
                    out |= {t.id for n in walk(fn) if isinstance(n, ast.Assign) and isinstance(
                        n.value, ast.Constant) and n.value.value is True for t in n.targets if isinstance(t, ast.Name)}
        f._group_flags = out
    return f._group_flags


def _under_flag(m: Module, c: ast.Call, flags: set[str]) -> bool:
    n = m.parent.get(id(c))
    while n is not None and not isinstance(n, ast.Module):
        if isinstance(n, ast.If) and any(isinstance(x, ast.Name) and x.id in flags for x in ast.walk(n.test)):
            return True
        n = m.parent.get(id(n))
    return False
