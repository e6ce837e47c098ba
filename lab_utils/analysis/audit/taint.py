"""Which names hold a rank: assigned from an expression that involves one (flow-insensitive, to a fixpoint), a
project function's parameters that its callers hand a rank, less the results of project functions that are handed
the rank but return none (a logger, a checkpoint's numbers). The guards (ranks.py) ask whether a test involves
these names. `m` is a project.Module and `project` a project.Project, unnamed here: project.py calls this module
while it builds itself, so this one does not import it back."""

from __future__ import annotations

import ast
import re

from .syntax import DIST_SWITCH, RANKISH, WORLDISH, callee, dotted, involves_rank, is_switch_value, placement_only, walk


def module_taint(m, seed: frozenset = frozenset(), opaque: frozenset = frozenset()) -> set[str]:
    """Names assigned (anywhere) from an expression that involves a rank: flow-insensitive, to a fixpoint.
    `seed`: parameters that callers pass a rank (taint_parameters); `opaque`: ids of calls of
    project functions that are handed the rank but return no rank (untaint_opaque_calls)."""
    tainted: set[str] = set(seed)
    todo = _assignments(m)
    while todo:
        added = set()
        for rankish, names, value, targets in todo:
            if id(value) in opaque or not (rankish or names & tainted) or placement_only(value, tainted):
                continue
            for name in targets:
                if name not in tainted:
                    tainted.add(name)
                    added.add(name)
        # (only an assignment that reads a name just added can change its answer)
        todo = [a for a in todo if a[1] & added] if added else []
    return tainted


def _assignments(m) -> list[tuple[bool, set[str], ast.AST, list[str]]]:
    """(involves a rank by itself, the names it reads, its value, the names it may taint) for each assignment of
    the module that could pass a rank on; kept on the module, since taint_parameters re-taints it as it learns
    more parameters (YOLOv7's modules were walked 48 times)."""
    kept = m.__dict__.get("_taint_assignments")
    if kept is not None:
        return kept
    kept = []
    for a in m.nodes:
        if not isinstance(a, (ast.Assign, ast.AnnAssign, ast.AugAssign)) or a.value is None:
            continue
        if WORLDISH.search(dotted(a.value)) and not RANKISH.search(dotted(a.value)) or is_switch_value(a.value):
            continue
        targets = [name for t in (a.targets if isinstance(a, ast.Assign) else [a.target])
                   for name in ([dotted(e) for e in t.elts] if isinstance(t, (ast.Tuple, ast.List)) else [dotted(t)])
                   if name and not WORLDISH.search(name) and not DIST_SWITCH.search(name.split(".")[-1])
                   and "device" not in name.lower()]  # a placement, not a rank
        # (nor the GPUs a process may see: `os.environ['CUDA_VISIBLE_DEVICES'] = args.gpu`, TransBTS's test.py)
        targets = [] if any(isinstance(t, ast.Subscript) and "VISIBLE_DEVICES" in str(getattr(t.slice, "value", ""))
                            for t in (a.targets if isinstance(a, ast.Assign) else [a.target])) else targets
        for value, names_to in _paired(a, targets):
            if names_to and not _object_on_one_rank(value):
                names = {dotted(n) for n in ast.walk(value) if isinstance(n, (ast.Name, ast.Attribute))
                         and not WORLDISH.search(dotted(n).split(".")[-1])}  # (as is_rankish_node reads them)
                kept.append((involves_rank(value), names, value, names_to))
    m.__dict__["_taint_assignments"] = kept
    return kept


def _paired(a: ast.AST, targets: list[str]) -> list[tuple[ast.AST, list[str]]]:
    """(value, the names it may taint): `a, b = x, y` pairs each name with its own value (YOLOR's and YOLOv5's
    `save_dir, epochs, ..., rank = Path(opt.save_dir), opt.epochs, ..., opt.global_rank`: only `rank` holds the
    rank, not the run's folder); any other assignment taints all its names from its whole value."""
    t = a.targets[0] if isinstance(a, ast.Assign) and len(a.targets) == 1 else None
    if isinstance(t, (ast.Tuple, ast.List)) and isinstance(a.value, (ast.Tuple, ast.List)) and len(t.elts) == len(
            a.value.elts) and not any(isinstance(e, ast.Starred) for e in [*t.elts, *a.value.elts]):
        return [(v, [dotted(e)] if dotted(e) in targets else []) for e, v in zip(t.elts, a.value.elts, strict=True)]
    return [(a.value, targets)]


def _object_on_one_rank(v: ast.AST) -> bool:
    """`SummaryWriter(path) if args.rank == 0 else None`: an object rank 0 alone holds, no rank number (TransGAN
    puts the writer in writer_dict beside 'train_global_steps', which must not read as a rank)."""
    return isinstance(v, ast.IfExp) and any(isinstance(x, ast.Constant) and x.value is None for x in (
        v.body, v.orelse)) and not any(involves_rank(x) for x in (v.body, v.orelse))


def taint_parameters(project):
    """A rank handed to a project function or class (`Trainer(model, data, opt, rank, ...)`) makes the
    parameter that receives it rank-holding (`self.gpu_id = gpu_id` ... `if self.gpu_id == 0:`)."""
    seeds: dict[str, set[str]] = {rel: set() for rel in project.modules}
    spawned_index(project, seeds)
    _shared_option_ranks(project, seeds)
    for _ in range(3):  # a rank passed on through two helpers
        # (what a helper handed the rank returns is no rank: untainted before the rank is passed on, or LSGM's
        # `logging = utils.Logger(args.global_rank, ...)` handed every parameter of its training loop a rank)
        untaint_opaque_calls(project, seeds)
        changed = False
        for m in project.modules.values():
            for c in m.calls:
                # (`distributed=(args.local_rank != -1)`, OpenDCVC: a switch, true on every rank of a DDP run)
                ranked = [i for i, a in enumerate(c.args) if involves_rank(a, m.rank_tainted)
                          and not is_switch_value(a)]
                kws = {k.arg for k in c.keywords if k.arg and involves_rank(k.value, m.rank_tainted)
                       and not is_switch_value(k.value)}
                # `ECAPAModelDDP(**vars(args))` after `args.gpu_id = rank`: the keyword gpu_id gets the rank
                kws |= {t.split(".")[-1] for k in c.keywords if k.arg is None and isinstance(k.value, ast.Call)
                        and callee(k.value) == "vars" and len(k.value.args) == 1
                        for t in m.rank_tainted if t.startswith(dotted(k.value.args[0]) + ".")}
                if not ranked and not kws:
                    continue
                for tm, tf in resolved_past_super(project, m, c):
                    params = [a.arg for a in tf.args.args]
                    if params and params[0] in ("self", "cls") and tm.class_of(tf):
                        params = params[1:]
                    names = {params[i] for i in ranked if i < len(params)} | (kws & set(params))
                    names |= _kwargs_reads(tf, kws - set(params))
                    if names - seeds[tm.rel]:
                        seeds[tm.rel] |= names
                        tm.rank_tainted = tm._taint(frozenset(seeds[tm.rel]))
                        changed = True
        if not changed:
            break
    untaint_opaque_calls(project, seeds)


def _shared_option_ranks(project, seeds: dict[str, set[str]]) -> None:
    """A rank stored on the options object in one module (PersFormer's ddp.py: `args.proc_id = args.local_rank`) is
    a rank wherever another module reads that option (runner.py's `if args.proc_id == 0:`): one namespace, handed
    through the whole run."""
    held = {n for m in project.modules.values() for n in m.rank_tainted if OPTIONS.match(n)}
    for m in project.modules.values():
        read = {n for n in held if n not in m.rank_tainted and m.read_lines(n)}
        if read:
            seeds[m.rel] |= read
            m.rank_tainted = m._taint(frozenset(seeds[m.rel]))


OPTIONS = re.compile(r"^(args|opt|opts|cfg|config|hparams)\.\w+$")


def _kwargs_reads(tf: ast.AST, keys: set[str]) -> set[str]:
    """What a function stores from its **kwargs under rank keywords it is handed (MonoSDF's `self.GPU_INDEX =
    kwargs['gpu_index']`, the runner built with `gpu_index=opt.local_rank`): those names hold the rank."""
    kwarg = tf.args.kwarg.arg if keys and tf.args.kwarg is not None else None
    if kwarg is None:
        return set()
    out = set()
    for a in walk(tf):
        v = a.value if isinstance(a, ast.Assign) and len(a.targets) == 1 else None
        key = v.slice if isinstance(v, ast.Subscript) and dotted(v.value) == kwarg else v.args[0] if isinstance(
            v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr == "get" and dotted(
            v.func.value) == kwarg and v.args else None
        if isinstance(key, ast.Constant) and key.value in keys and dotted(a.targets[0]):
            out.add(dotted(a.targets[0]))
    return out


def resolved_past_super(project, m, c: ast.Call) -> list:
    """project.resolve(exact=True), less the calling class's own method for `super(Cls, self).__init__(...)`
    (maskrcnn-benchmark's DetectronCheckpointer hands its arguments to Checkpointer.__init__, not to itself: read
    against its own parameters, `save_to_disk` lands on `save_dir`)."""
    found = project.resolve(m, c, exact=True)
    if not (isinstance(c.func, ast.Attribute) and isinstance(c.func.value, ast.Call)
            and callee(c.func.value) == "super"):
        return found
    fn = m.enclosing(c)
    own = m.class_of(fn) if fn is not None else None
    return [(tm, tf) for tm, tf in found if not (tm is m and tm.class_of(tf) == own)]


def untaint_opaque_calls(project, seeds: dict[str, set[str]]):
    """`logger = setup_logger(out, distributed_rank=dist.get_rank())`, `step, best = load_checkpoint(...,
    rank=rank)`: a project function handed the rank returns a logger or a checkpoint's numbers, not a rank,
    when nothing it returns involves a rank or its parameters. Counting them as ranks made `if step %
    VALIDATION_INTERVAL == 0:` (Soft-HuBERT) and `if is_best:` (Text4Vis) rank tests."""
    for m in project.modules.values():
        opaque = set()
        for a in m.nodes:
            if not (isinstance(a, ast.Assign) and isinstance(a.value, ast.Call)) or involves_rank(
                    a.value.func, m.rank_tainted) or not involves_rank(a.value, m.rank_tainted):
                continue
            targets = project._resolve(m, a.value, True)
            if not targets and _unseen_config_maker(m, a.value):
                opaque.add(id(a.value))
            elif targets and all(isinstance(tf, (ast.FunctionDef, ast.AsyncFunctionDef)) and not tm.class_of(tf)
                               and not returns_rank(m, tf, a.value) for tm, tf in targets):
                opaque.add(id(a.value))
        if opaque or m.__dict__.get("_opaque"):
            m.__dict__["_opaque"] = frozenset(opaque)  # (kept: a later re-taint from new seeds keeps them out)
            m.rank_tainted = m._taint(frozenset(seeds[m.rel]), frozenset(opaque))


def _unseen_config_maker(m, c: ast.Call) -> bool:
    """A function these files lack, named for the options or the config it builds and handed the rank by keyword
    (Joey NMT's `args = parse_global_args(cfg, rank=rank, mode="train")`): it returns settings, not a rank; whole
    objects made from it (`self.args`) are no rank tests."""
    name = callee(c)
    return bool(re.search(r"(^|_)(parse|config|cfg|args|options|settings)(_|$)", name)) and not RANKISH.search(
        name) and not any(involves_rank(a, m.rank_tainted) for a in c.args)


def returns_rank(m, fn: ast.AST, call: ast.Call) -> bool:
    """Something `fn` returns involves the rank this call hands it (`def to_int(x): return int(x)`), or a rank of
    its own: its parameters that get a rank, then its own assignments, to a fixpoint. Local to `fn`: the
    module-wide taint mixes every function's `step` (Soft-HuBERT's save_checkpoint gets the step; its
    load_checkpoint returns another)."""
    params = [a.arg for a in [*fn.args.posonlyargs, *fn.args.args]]
    if params and params[0] in ("self", "cls"):
        params = params[1:]
    tainted = {params[i] for i, a in enumerate(call.args) if i < len(params) and involves_rank(a, m.rank_tainted)}
    tainted |= {k.arg for k in call.keywords if k.arg and involves_rank(k.value, m.rank_tainted)}
    assigns = [a for a in walk(fn) if isinstance(a, ast.Assign)]
    for _ in range(3):
        tainted |= {dotted(t) for a in assigns if involves_rank(a.value, tainted) and not placement_only(
            a.value, tainted) and not _read_from_a_file(a.value) for x in a.targets for t in ast.walk(x)
            if isinstance(t, (ast.Name, ast.Attribute))}
    return any(isinstance(r, ast.Return) and r.value is not None and involves_rank(r.value, tainted)
               for r in walk(fn))


def spawned_index(project, seeds: dict[str, set[str]]):
    """`mp.spawn(run, args=(...), nprocs=n)` calls `run(i, *args)`: the first parameter of the function it starts
    is the process index, the rank on one node (DGL's `def run(proc_id, ...)`, then `if proc_id == 0:`)."""
    for m in project.modules.values():
        for c in m.calls:
            if callee(c) != "spawn" or not c.args or not re.search(r"(^|\.)(mp|multiprocessing)$", dotted(
                    c.func.value) if isinstance(c.func, ast.Attribute) else ""):
                continue
            fake = ast.Call(func=c.args[0], args=[], keywords=[])
            for tm, tf in project._resolve(m, fake, True):
                params = [a.arg for a in tf.args.args]
                if params and not tm.class_of(tf) and params[0] not in seeds[tm.rel]:
                    seeds[tm.rel].add(params[0])
                    tm.rank_tainted = tm._taint(frozenset(seeds[tm.rel]))


def _read_from_a_file(v: ast.AST) -> bool:
    """`torch.load(optimizer_path, ...)` where the path names the rank (nanochat's per-rank optimizer shard): what
    a file holds is data, not a rank, whatever file is read."""
    return isinstance(v, ast.Call) and isinstance(v.func, (ast.Name, ast.Attribute)) and \
        dotted(v.func).split(".")[-1] in ("load", "loads", "load_file", "safe_load")
