"""Which branches run under which world size: the distributed switch (`if ddp:`, `if args.distributed:`, `if
world_size > 1:`, `dist.is_initialized()`), true on every rank of a distributed run; the arm that runs only when
the run is one process; branches no run takes; and the tests that say a launcher started the run. ranks.py asks
these when it reads a rank-0 guard; the rules ask them to gate a finding on the run it can happen in."""

from __future__ import annotations

import ast
import re

from .project import Module, Project
from .syntax import (
    DIST_SWITCH,
    WORLDISH,
    always_raises,
    always_returns,
    callee,
    const_str,
    const_value,
    dotted,
    involves,
    is_switch_value,
    kw,
    walk,
)


def unlaunched(test: ast.AST, p: Project | None = None) -> bool:
    """`'RANK' not in os.environ`: true only in a run no launcher started, which is one process; or `not
    hasattr(args, "local_rank")`, the rank attribute the distributed setup sets (TiSASRec's is_main_process), or
    `rank is None`; with the project, `local_rank == -1` where that test decides the set-up (unset_rank_switch)."""
    return p is not None and unset_rank_switch(p, test) or \
        isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.NotIn) and \
        const_str(test.left) in LAUNCH_KEYS and "environ" in dotted(test.comparators[0]) or \
        isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and isinstance(test.operand, ast.Call) and \
        callee(test.operand) == "hasattr" and len(test.operand.args) == 2 and \
        re.fullmatch(r"(local_|global_)?rank", const_str(test.operand.args[1]) or "") is not None or \
        isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Is) and \
        isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value is None and \
        re.fullmatch(r"(local_|global_)?rank", dotted(test.left).split(".")[-1]) is not None or \
        _one_process(test)  # (`self.rank is None`: WaffleIron's trainer outside a launch)


def _one_process(test: ast.AST) -> bool:
    """`os.environ['WORLD_SIZE'] == '1'`, `world_size == 1`, `dist.get_world_size() < 2`: true only in a run of
    one process, whose one rank is rank 0 (slr_handshape's `is_main_process`: `'WORLD_SIZE' not in os.environ or
    os.environ['WORLD_SIZE'] == '1' or os.environ['LOCAL_RANK'] == '0'`)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return False
    left, op, right = test.left, test.ops[0], test.comparators[0]
    if isinstance(left, ast.Constant):
        left, right = right, left
        op = {ast.Lt: ast.Gt(), ast.LtE: ast.GtE()}.get(type(op), op)
    if isinstance(left, ast.Call) and callee(left) == "int" and left.args:
        left = left.args[0]
    named = const_str(left.slice) if isinstance(left, ast.Subscript) else callee(left) if isinstance(
        left, ast.Call) else dotted(left).split(".")[-1]
    if not re.fullmatch(r"(WORLD_SIZE|world_size|get_world_size|num_processes|nprocs)", named or ""):
        return False
    value = right.value if isinstance(right, ast.Constant) else None
    return isinstance(op, ast.Eq) and value in (1, "1") or isinstance(op, ast.Lt) and value == 2 or isinstance(
        op, ast.LtE) and value == 1


def conjuncts(test: ast.AST) -> set[str]:
    """The flags a test requires: `args.mp` in `if args.mp:` and in `if args.distributed and args.mp:` (ADL's
    spawn), by their last attribute."""
    values = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
    values = [v.left if isinstance(v, ast.Compare) and len(v.ops) == 1 and isinstance(v.ops[0], (ast.Eq, ast.Is))
              and isinstance(v.comparators[0], ast.Constant) and v.comparators[0].value in (1, True) else v
              for v in values]  # (AdCo's `if args.multiprocessing_distributed == 1:`)
    return {dotted(v).split(".")[-1] for v in values if isinstance(v, (ast.Name, ast.Attribute))}


def set_by_launch(m: Module, flag: ast.AST) -> bool:
    """A distributed switch computed from what the launcher sets (`is_distributed = num_gpus > 1`, `ddp =
    int(os.environ.get("RANK", -1)) != -1`, `dist.is_initialized()`), not an option the user passes."""
    if isinstance(flag, ast.Call):
        return group_check(flag)
    name = dotted(flag)
    values = [a.value for a in m.nodes if isinstance(a, ast.Assign) and any(dotted(t) == name for t in a.targets)]
    return bool(name) and bool(values) and all(
        is_switch_value(v) or group_check(v) or isinstance(v, ast.Compare) and involves(v, WORLDISH)
        for v in values)


def launch_switch_function(p: Project, m: Module, c: ast.AST) -> bool:
    """A project function that answers from what the launcher set (SynTBPR's is_using_distributed(): True when
    dist.is_initialized(), `int(os.environ["WORLD_SIZE"]) > 1` when RANK and WORLD_SIZE are set, True when
    LOCAL_RANK is, else False): every test and every returned value asks the group or the environment, so no
    option turns it off in a launched run."""
    if not isinstance(c, ast.Call):
        return False
    def launched(x):  # (asks the environment, or a name set from it: stereo_toolbox's `self.local_rank != -1`
        return "environ" in ast.unparse(x) and (involves(x, WORLDISH) or any(  # with `self.local_rank =
            const_str(k) in LAUNCH_KEYS for k in ast.walk(x)))  # int(os.environ.get('LOCAL_RANK', -1))`)
    for tm, tf in p.resolve(m, c, exact=True):
        asked = [r.value for r in walk(tf) if isinstance(r, ast.Return) and r.value is not None
                 and not isinstance(r.value, ast.Constant)] + [n.test for n in walk(tf) if isinstance(n, ast.If)]
        def from_launch(x, tm=tm):  # every binding reads the launcher's variable, or is the one process's `-1`
            sets = [a.value for a in tm.nodes if isinstance(a, ast.Assign) and dotted(x) in map(dotted, a.targets)]
            return any(launched(v) for v in sets) and all(launched(v) or isinstance(getattr(
                v, "operand", v), ast.Constant) for v in sets)
        if asked and all(group_check(x) or launched(x) or isinstance(x, ast.Compare) and from_launch(x.left)
                         for x in asked):
            return True
    return False


# `dist.is_initialized()`, a helper's `is_available()`, SparK's `dist.initialized()`
GROUP_CHECKS = re.compile(r"^(is_initialized|is_available|initialized|is_dist_avail_and_initialized)$")


def group_check(test: ast.AST) -> bool:
    """The test asks torch.distributed whether the group exists (`dist.is_initialized()`, a helper's
    `is_available()`), or how many ranks a group holds (Grendel-GS's `utils.DEFAULT_GROUP.size() > 1`); not
    `torch.cuda.is_available()`."""
    return any(isinstance(n, ast.Call) and (GROUP_CHECKS.match(callee(n)) and not re.search(
        r"cuda|mps|xpu|backends", dotted(n.func)) or callee(n) == "size" and isinstance(n.func, ast.Attribute)
        and re.search(r"group$", dotted(n.func.value), re.I)) for n in ast.walk(test))


def is_switch_test(test: ast.AST) -> bool:
    """A test of whether the run is distributed (`args.distributed`, `ddp`, `world_size > 1`,
    `dist.is_initialized()`), not of the rank."""
    if is_switch_value(test) or isinstance(test, ast.BoolOp) and any(is_switch_value(v) for v in test.values):
        return True  # `if args.local_rank == -1 or args.no_cuda:` (Oscar): one arm is the one-process run
    return involves(test, DIST_SWITCH) or involves(test, WORLDISH) or group_check(test) or _dist_option(test) or any(
        isinstance(n, ast.Compare) and len(n.ops) == 1 and isinstance(n.ops[0], (ast.In, ast.NotIn))
        and "environ" in dotted(n.comparators[0]) and const_str(n.left) in LAUNCH_KEYS for n in ast.walk(test))


def _dist_option(t: ast.AST) -> bool:
    """An option or setting named `dist` tested as it is (SoftGroup's `--dist`, `if args.dist: init_dist()`): the
    distributed switch. Only as an attribute: the bare name `dist` is torch.distributed."""
    if isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not):
        return _dist_option(t.operand)
    if isinstance(t, ast.BoolOp):
        return any(_dist_option(v) for v in t.values)
    return isinstance(t, ast.Attribute) and t.attr == "dist"  # (tested as it is: X-VLM's `args.dist == 'all'`
    # picks nodes, no switch)


# what a launcher (torchrun, SLURM) puts in the environment: `if 'RANK' in os.environ:` asks whether one started us
LAUNCH_KEYS = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS", "MASTER_ADDR", "MASTER_PORT"}


def distributed_switch(m: Module, node: ast.AST) -> ast.AST | None:
    """The `if args.distributed:`-like test that guards `node` in its function, if any: an enclosing if, or an
    earlier `if world_size == 1: return ...` in the same block."""
    child, n = node, m.parent.get(id(node))
    while n is not None and not isinstance(n, ast.Module):
        if isinstance(n, (ast.If, ast.IfExp)) and is_switch_test(n.test):
            return n.test
        if isinstance(n, ast.If) and any(s is child for s in n.body) and _sets_up_the_group(m, n) and any(
                re.search(r"gpu|world|nproc|device_count", dotted(x), re.I) for x in ast.walk(n.test)
                if isinstance(x, (ast.Name, ast.Attribute))):
            return n.test  # an arm that sets up the group under a count of GPUs is the distributed one (GET's
            # `if len(args.gpus) > 1:`); not a choice among engines that all set one up (WeNet's `if
            # args.train_engine in ['torch_ddp', 'torch_fsdp']:`, DeepSpeed's elsewhere)
        for s in n.body if isinstance(getattr(n, "body", None), list) else []:
            if s is child:
                break
            # `if num_gpus == 0: raise RuntimeError(...)` (LatentSync's init_dist) stops the run it tests for:
            # what follows runs in every run there is, so it is no switch
            if isinstance(s, ast.If) and is_switch_test(s.test) and always_returns(s.body) and \
                    not always_raises(s.body):
                return s.test
            if isinstance(s, ast.If) and _returns_unless_launched(s):
                return s.test
            if isinstance(s, ast.If) and (arm := _launch_arm_returns(s)) is not None:
                return arm
        if isinstance(n, ast.FunctionDef):
            break
        child, n = n, m.parent.get(id(n))
    return None


def _sets_up_the_group(m: Module, n: ast.If) -> bool:
    """init_process_group in the arm itself, under no other `if` of its own (not an `if __name__ == '__main__':`
    block that holds the real switch further in: DF-GAN's `if args.multi_gpus:`)."""
    for c in (c for s in n.body for c in ast.walk(s) if isinstance(c, ast.Call) and callee(c) == "init_process_group"):
        up = m.parent.get(id(c))
        while up is not None and not isinstance(up, (ast.If, ast.FunctionDef, ast.AsyncFunctionDef)):
            up = m.parent.get(id(up))
        if up is n:
            return True
    return False


def _returns_unless_launched(s: ast.If) -> bool:
    """`if "RANK" in os.environ: ... elif "SLURM_PROCID" in os.environ: ... else: args.distributed = False;
    return` (DeiT's init_distributed_mode): a chain of tests of the launcher's environment whose last arm returns.
    What follows runs only when a launcher started the job, as under `if args.distributed:`."""
    tests, n = [], s
    while True:
        tests.append((n.test, n.body))
        if len(n.orelse) == 1 and isinstance(n.orelse[0], ast.If):
            n = n.orelse[0]
            continue
        break
    # (or an arm that reads a launcher's rank from the environment: MAE's `if args.dist_on_itp: args.rank =
    # int(os.environ['OMPI_COMM_WORLD_RANK'])`, an MPI launcher's)
    return bool(n.orelse) and isinstance(n.orelse[-1], ast.Return) and all(
        is_switch_value(t) or is_switch_test(t) or _reads_a_launched_rank(body) for t, body in tests)


def _reads_a_launched_rank(body: list) -> bool:
    return any(isinstance(x, ast.Subscript) and "environ" in dotted(x.value) and re.search(
        r"RANK|PROCID", const_str(x.slice) or "") for st in body for x in ast.walk(st))


def _launch_arm_returns(s: ast.If) -> ast.AST | None:
    """`if not torch.cuda.is_available(): return` `elif "RANK" not in os.environ: ...; return`: a later arm of an
    if/elif chain that tests the launcher's environment and returns. What follows the chain runs only when a
    launcher started the job, as under `if args.distributed:`."""
    n = s
    while len(n.orelse) == 1 and isinstance(n.orelse[0], ast.If):
        n = n.orelse[0]
        if n.body and isinstance(n.body[-1], ast.Return) and is_switch_value(n.test):
            return n.test
    return None


def switched(p: Project, m: Module, node: ast.AST, depth: int = 2) -> ast.AST | None:
    """distributed_switch() through the callers: code in a helper that every caller calls under the switch
    (`samplers = create_sampler(...)` only inside `if args.distributed:`) runs only in a distributed run."""
    test = distributed_switch(m, node)
    if test is not None or depth == 0:
        return test
    fn = m.enclosing(node)
    sites = p.callers(m, fn) if fn is not None else []
    handed = _handed_switch(m, node, fn, sites)
    if handed is not None:
        return handed
    # (a caller in the switch's one-process arm, WAFT's `else: main(0, 1, args, False)`, runs it undistributed)
    tests = [None if one_process_arm(cm, c) else switched(p, cm, c, depth - 1) for cm, c in sites]
    return tests[0] if tests and all(t is not None for t in tests) else None


def _handed_switch(m: Module, node: ast.AST, fn: ast.AST | None, sites: list) -> ast.AST | None:
    """`node` under `if multinode:`, a parameter of its function that every caller hands a distributed switch
    (FastAutoAugment's `get_dataloaders(..., multinode=(local_rank >= 0))`): that switch."""
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or not sites:
        return None
    params = [a.arg for a in fn.args.args]
    n = m.parent.get(id(node))
    while n is not None and n is not fn:
        if isinstance(n, ast.If) and isinstance(n.test, ast.Name) and n.test.id in params:
            i = params.index(n.test.id) - (params[0] in ("self", "cls"))
            given = [kw(c, n.test.id) or (c.args[i] if 0 <= i < len(c.args) else None) for _, c in sites]
            if all(g is not None and is_switch_test(g) for g in given):
                return given[0]
        n = m.parent.get(id(n))
    return None


def one_process_arm(m: Module, node: ast.AST) -> bool:
    """`node` runs only where the run is not distributed (Lightweight GAN's `if self.syncbatchnorm and not
    self.is_ddp:` group of one process, or the else of `if args.distributed:` / `if cfg.MODEL.DIST_TRAIN:`): one
    process, so no ranks meet there (a port) and no other rank writes the same file (a save)."""
    child, n = node, m.parent.get(id(node))
    while n is not None and not isinstance(n, ast.Module):
        if isinstance(n, ast.If):
            tests = n.test.values if isinstance(n.test, ast.BoolOp) and isinstance(n.test.op, ast.And) else [n.test]
            negated = any(isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not) and switch_flag(t.operand)
                          for t in tests)
            if negated and any(child is s for s in n.body) or switch_flag(n.test) and any(
                    child is s for s in n.orelse):
                return True
            if any(child is s for s in n.body) and _arm_of_one_process(n.body):
                return True
            single = next((k for k in map(_single_process_test, tests) if k is not None), None)
            if single == "body" and any(child is s for s in n.body) or \
                    _single_process_test(n.test) == "orelse" and any(child is s for s in n.orelse):
                return True
        child, n = n, m.parent.get(id(n))
    return False


def _arm_of_one_process(body: list) -> bool:
    """An arm that declares the run one process: `args.rank, args.gpu, args.world_size = 0, 0, 1` (DINO's
    init_distributed_mode when no launcher set RANK: `elif torch.cuda.is_available(): ... MASTER_PORT = '29500'`).
    The launched run takes another arm."""
    for a in body:
        if not isinstance(a, ast.Assign):
            continue
        for t in a.targets:
            pairs = zip(t.elts, a.value.elts, strict=False) if isinstance(t, (ast.Tuple, ast.List)) and isinstance(
                a.value, ast.Tuple) else [(t, a.value)]
            if any(re.search(r"world_size$", dotted(x)) and isinstance(v, ast.Constant) and v.value == 1
                   and not _set_again(body, a, dotted(x)) for x, v in pairs):
                return True
    return False


def _set_again(body: list, first: ast.Assign, name: str) -> bool:
    """A later statement of the arm sets `name` again: ClearerVoice's `args.world_size = 1`, then `if 'WORLD_SIZE'
    in os.environ: args.world_size = int(os.environ['WORLD_SIZE'])`: a default the launch overrides."""
    return any(isinstance(a, ast.Assign) and a is not first and a.lineno > first.lineno and any(
        dotted(t) == name for t in a.targets) for s in body for a in ast.walk(s))


def dead_branch(m: Module, node: ast.AST) -> bool:
    """`node` sits under `if ... and not evaluate:` where `evaluate` names a function of the module, not a value
    (BERT-NER's copy of run_glue dropped the `evaluate` parameter): a function is always true, so the branch
    never runs."""
    child, n = node, m.parent.get(id(node))
    fn = m.enclosing(node)
    local = {a.arg for a in fn.args.args + fn.args.kwonlyargs} if isinstance(
        fn, (ast.FunctionDef, ast.AsyncFunctionDef)) else set()
    while n is not None and not isinstance(n, ast.Module):
        if isinstance(n, ast.If) and any(child is s for s in n.body):
            tests = n.test.values if isinstance(n.test, ast.BoolOp) and isinstance(n.test.op, ast.And) else [n.test]
            if any(isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not) and isinstance(t.operand, ast.Name)
                   and t.operand.id in m.functions and t.operand.id not in local for t in tests):
                return True
        child, n = n, m.parent.get(id(n))
    return False


def _single_process_test(t: ast.AST) -> str | None:
    """`args.local_rank == -1` (the launcher sets it to 0 or more) or `world_size == 1`: 'body' when the test
    holds only in a run of one process, 'orelse' for `local_rank != -1` / `world_size > 1`; None otherwise."""
    if not (isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.left, (ast.Name, ast.Attribute))):
        return None
    name, op, right = dotted(t.left).split(".")[-1], t.ops[0], t.comparators[0]
    try:
        v = ast.literal_eval(right)
    except ValueError:
        return None
    if re.fullmatch(r"(local_)?rank", name) and v == -1:
        return "body" if isinstance(op, (ast.Eq, ast.Is)) else "orelse" if isinstance(op, (ast.NotEq, ast.IsNot)) \
            else None
    if re.fullmatch(r"world_size|n_?gpus?|num_gpus|nprocs", name):
        return "body" if isinstance(op, ast.Eq) and v == 1 or isinstance(op, ast.Lt) and v == 2 else \
            "orelse" if isinstance(op, ast.Gt) and v == 1 or isinstance(op, ast.GtE) and v == 2 else None
    return None


def switch_flag(t: ast.AST) -> bool:
    """A bare distributed flag (`args.distributed`, `self.is_ddp`); not a comparison, whose else may be either."""
    return isinstance(t, (ast.Name, ast.Attribute)) and (involves(t, DIST_SWITCH) or _dist_option(t)) or \
        isinstance(t, ast.Subscript) \
        and DIST_SWITCH.search(const_str(t.slice) or "") is not None  # (`self.config['ddp']`, DeepfakeBench)


def _minus_one(t: ast.AST) -> tuple[str, bool] | None:
    """(the rank name, whether the test holds at -1) for `args.local_rank == -1` / `local_rank != -1`."""
    if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], (ast.Eq, ast.NotEq)) and isinstance(
            t.comparators[0], ast.UnaryOp) and isinstance(t.comparators[0].op, ast.USub) and const_value(
            t.comparators[0].operand) == 1 and re.search(r"rank", dotted(t.left).split(".")[-1]):
        return dotted(t.left).split(".")[-1], isinstance(t.ops[0], ast.Eq)
    return None


def unset_rank_switch(p: Project, t: ast.AST) -> bool:
    """`args.local_rank == -1` where the same test also decides whether the process group is set up (bertorch's `if
    args.local_rank == -1: device = ... else: init_process_group(...)`): true only in a run that is not
    distributed at all, one process, so `local_rank == -1 or local_rank == 0` passes rank 0 alone in every
    distributed run (under a launcher that leaves the option at -1 nothing is distributed, every process trains
    alone: a launch mistake, not the guard's)."""
    own = _minus_one(t)
    if own is None or not own[1]:
        return False
    kept = p.__dict__.setdefault("_unset_rank_switch", {})  # (per rank name: PL-Marker asked 1384 times, 30 s)
    if own[0] not in kept:
        kept[own[0]] = _unset_rank_switch(p, own)
    return kept[own[0]]


def _unset_rank_switch(p: Project, own: tuple) -> bool:
    for m in p.modules.values():
        for s in (n for n in m.nodes if isinstance(n, ast.If)):
            at = _minus_one(s.test)
            if at is not None and at[0] == own[0]:
                arm = s.orelse if at[1] else s.body  # the arm that runs when the rank is set
                if _sets_up_group(arm):
                    return True
            for arm, other in ((s.body, s.orelse), (s.orelse, s.body)):
                if _sets_up_group(arm) and any(isinstance(a, ast.Assign) and _is_minus_one(a.value) and any(
                        dotted(x).split(".")[-1] == own[0] for x in a.targets) for a in other):
                    return True  # `if len(args.gpus) > 1: ... init_process_group(...) else: args.local_rank = -1`
    return False                 # (dyMEAN): -1 is the rank of the run that sets up no group


def _is_minus_one(v: ast.AST) -> bool:
    return isinstance(v, ast.UnaryOp) and isinstance(v.op, ast.USub) and const_value(v.operand) == 1


def _sets_up_group(arm: list[ast.stmt]) -> bool:
    return any(isinstance(n, ast.Call) and callee(n) == "init_process_group" for b in arm for n in ast.walk(b))


def switch_constants(p: Project) -> set[tuple[str, object]]:
    """(name, value) for a name set to a constant in the arm that sets up the group or wraps the model in DDP
    (HyperFuture's `args.parallel = 'ddp'` beside `model = DDP(model, ...)`, `'dp'` and `'none'` in the other
    arms): a test `parallel == 'ddp'` asks whether the run is distributed."""
    kept = p.__dict__.get("_switch_constants")
    if kept is None:
        kept = p.__dict__["_switch_constants"] = set()
        for m in p.modules.values():
            for s in (n for n in m.nodes if isinstance(n, ast.If)):
                for arm in (s.body, s.orelse):
                    if any(isinstance(n, ast.Call) and callee(n) in ("init_process_group", "DistributedDataParallel",
                                                                     "DDP") for b in arm for n in ast.walk(b)):
                        kept |= {(dotted(t).split(".")[-1], b.value.value) for b in arm if isinstance(b, ast.Assign)
                                 and isinstance(b.value, ast.Constant) and isinstance(b.value.value, str)
                                 for t in b.targets if dotted(t)}
    return kept


def under_switch_constant(p: Project, m: Module, node: ast.AST) -> bool:
    """`node` sits in the body of `if args.parallel == 'ddp':` (switch_constants): it runs only distributed."""
    child, n = node, m.parent.get(id(node))
    while n is not None and not isinstance(n, ast.Module):
        t = n.test if isinstance(n, ast.If) and any(child is b for b in n.body) else None
        if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], ast.Eq) and isinstance(
                t.comparators[0], ast.Constant) and (dotted(t.left).split(".")[-1], t.comparators[0].value) in \
                switch_constants(p):
            return True
        child, n = n, m.parent.get(id(n))
    return False


def refuses_one_process(s: ast.AST, entry: bool = True) -> bool:
    """`if args.multiprocessing_distributed: mp.spawn(...) else: raise NotImplementedError('Currently only DDP
    training')` (Re-IQA's main): the distributed switch's other arm only raises, so no single-process run exists.
    Every arm of an elif chain counts (AdCo's `if args.distributed: ... DDP(model) elif args.gpu is not None: ...;
    raise ... else: raise ...`); outside an entry script, only where the switch's arm wraps or sets up the group."""
    if not (isinstance(s, ast.If) and is_switch_test(s.test)):
        return False
    if not entry and not any(isinstance(c, ast.Call) and callee(c) in ("DistributedDataParallel", "DDP",
                                                                       "init_process_group") for c in ast.walk(s)):
        return False
    return always_raises(s.body) or always_raises(s.orelse)

