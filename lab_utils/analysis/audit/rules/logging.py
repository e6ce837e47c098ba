"""Chapter 01 (unchanged): the logged loss. Rank 0 logging its own micro-batch's loss, or every rank printing its
own: both differ from the single run's loss of the global batch. A print that reports an abort (`if not
math.isfinite(loss): print(...); sys.exit(1)`) is no loss log."""

from __future__ import annotations

import ast
import re

from ..consoles import (
    meter_print_calls,
    meter_prints,
    rank0_loggers,
    root_console_on_stdout,
    root_logger_on_every_rank,
    shared_file_write,
)
from ..facts import Facts
from ..gathers import global_model_losses
from ..losses import (
    every_loss_over_gathered_labels,
    handed_global,
    holds_a_loss_module,
    loaded_from_a_checkpoint,
    loss_module,
    origins,
)
from ..project import Module
from ..registry import Hit, rule
from ..syntax import LOG_CALLS, LOSSISH, NOT_A_LOSS, REDUCEISH, branches, callee, const_str, dotted, kw, root

ABORTS = {"exit", "_exit", "abort", "stop"}
NONFINITE = {"isfinite", "isnan", "isinf"}


def _packed_losses(scope: ast.AST, names: set[str]) -> set[str]:
    """Losses packed into a record that is then logged: `stats = dict(epoch=epoch, loss=loss.item())` ...
    `print(json.dumps(stats))`; the loss values' own names."""
    out = set()
    for a in ast.walk(scope):
        if not (isinstance(a, ast.Assign) and any(dotted(t) in names for t in a.targets)
                and isinstance(a.value, (ast.Call, ast.Dict))):
            continue
        v = a.value
        if isinstance(v, ast.Dict):  # {"loss": loss.item(), ...}; a **spread has no key
            pairs = [(const_str(k), val) for k, val in zip(v.keys, v.values, strict=True)]
        else:  # dict(loss=loss.item(), ...)
            pairs = [(k.arg, k.value) for k in v.keywords] if callee(v) == "dict" else []
        for key, val in pairs:
            if key and LOSSISH.search(key) and not NOT_A_LOSS.search(key):
                out |= {root(n) for n in ast.walk(val) if isinstance(n, (ast.Name, ast.Attribute))
                        and LOSSISH.search(root(n))}
    return out


def _returned_losses(f: Facts, m: Module, scope: ast.AST, names: set[str]) -> set[str]:
    """Names holding what a project function returns when that is its own running loss: `train_mae =
    train(model, loader, opt)` whose body ends `return loss_accum / (step + 1)` with `loss_accum += loss.item()`
    and no reduction over ranks; the name says nothing, the function's return does."""
    out = set()
    for a in ast.walk(scope):
        if not (isinstance(a, ast.Assign) and isinstance(a.value, ast.Call) and _targets(a) & names):
            continue
        for tm, tf in f.p.resolve(m, a.value, exact=True):
            rets = [r.value for r in ast.walk(tf) if isinstance(r, ast.Return) and r.value is not None]
            holding = _holding_a_loss(tf)
            lossy = [r for r in rets if any(isinstance(n, (ast.Name, ast.Attribute)) and root(n) in holding
                                            for n in ast.walk(r)) and not any(
                isinstance(n, ast.Call) and REDUCEISH.search(callee(n)) for n in ast.walk(r))]  # reduced on return
            if lossy and len(lossy) == len(rets) and not f.reduced_names(tm, tf) & {
                    root(n) for r in rets for n in ast.walk(r) if isinstance(n, (ast.Name, ast.Attribute))}:
                out |= _targets(a) & names
    return out


def _holding_a_loss(fn: ast.AST) -> set[str]:
    """Names in fn that hold a loss: named so, or fed from one (`acc += loss.item()`), to a fixpoint."""
    held = {root(n) for n in ast.walk(fn) if isinstance(n, (ast.Name, ast.Attribute))
            and LOSSISH.search(root(n)) and not NOT_A_LOSS.search(root(n))}
    assigns = [a for a in ast.walk(fn) if isinstance(a, (ast.Assign, ast.AugAssign)) and a.value is not None]
    for _ in range(3):
        for a in assigns:
            if any(isinstance(n, (ast.Name, ast.Attribute)) and root(n) in held for n in ast.walk(a.value)):
                held |= {root(t) for t in (a.targets if isinstance(a, ast.Assign) else [a.target])} - {""}
    return held


def _looped_losses(m: Module, c: ast.Call, names: set[str]) -> set[str]:
    """Losses logged one by one from their container: `for k, v in loss_meter.items(): writer.add_scalar(k,
    v.latest)`; the container's name stands for the logged values (so a reduced container still counts as
    reduced). Only a loop around the log or a comprehension inside it: elsewhere the same name (`name`) is
    another variable."""
    out = set()
    loops, n = [x for x in ast.walk(c) if isinstance(x, ast.comprehension)], m.parent.get(id(c))
    while n is not None and not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        loops += [n] if isinstance(n, ast.For) else []
        n = m.parent.get(id(n))
    for loop in loops:
        if not (isinstance(loop, (ast.For, ast.comprehension))
                and {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)} & names):
            continue
        out |= {root(n) for n in ast.walk(loop.iter) if isinstance(n, (ast.Name, ast.Attribute))
                and LOSSISH.search(root(n)) and not NOT_A_LOSS.search(root(n))}
    return out


def _loss_carriers(scope: ast.AST, seed: frozenset = frozenset()) -> set[str]:
    """Meters and records a loss is fed into, whatever their names: `meter.update(loss.item(), n)`,
    `metric_logger.update(loss=loss_value)`, `history.append(loss.item())`; logging them logs the loss. `seed`:
    the instance's records that other methods feed (`self.stats[k].append(loss.item())`)."""
    out = set(seed)
    out |= _fed_records(scope, out)
    # a record filled by key: `scalars_to_log['level_0/loss'] = rgb_loss.item()` (NeRF++), logged key by key
    for a in ast.walk(scope):
        if isinstance(a, ast.Assign) and any(isinstance(t, ast.Subscript) for t in a.targets) and any(
                LOSSISH.search(root(n)) and not NOT_A_LOSS.search(root(n)) for n in ast.walk(a.value)
                if isinstance(n, (ast.Name, ast.Attribute))) and not loss_module(a.value):
            out |= {root(t.value) for t in a.targets if isinstance(t, ast.Subscript)
                    and not NOT_A_LOSS.search(root(t.value))}
    out |= _texts_of_losses(scope, out)
    # a holder built from a meter prints what the meter holds: `progress = ProgressMeter(n, [batch_time,
    # losses, top1])` ... `progress.display(i)`; so does a list of the losses (`data = [('G', self.g_loss), ...]`),
    # the statistics returned beside the loss (`loss, stats = self.actor(data)`, OSTrack), and the values a loop
    # takes out of a record (`for name, val in self.stats[split].items():`)
    for _ in range(2):
        for a in ast.walk(scope):
            if isinstance(a, ast.Assign) and isinstance(a.targets[0], ast.Tuple):
                names = [e.id for e in a.targets[0].elts if isinstance(e, ast.Name)]
                if any(LOSSISH.search(n) and not NOT_A_LOSS.search(n) for n in names):
                    out |= {n for n in names if STATISH.search(n)}
            if isinstance(a, (ast.For, ast.comprehension)) and root(a.iter) in out - {""}:
                out |= _values_taken(a)
            if isinstance(a, ast.Assign) and isinstance(a.value, (ast.List, ast.Tuple)) and any(
                    isinstance(n, (ast.Name, ast.Attribute)) and (root(n) in out or LOSSISH.search(root(n)) and
                                                                  not NOT_A_LOSS.search(root(n)))
                    for n in ast.walk(a.value)):
                out |= {dotted(t) for t in a.targets} - {""}
            if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call) and any(
                    isinstance(n, ast.Name) and n.id in out for arg in [*a.value.args, *[k.value for k in
                                                                                         a.value.keywords]]
                    for n in ast.walk(arg)):
                out |= {dotted(t) for t in a.targets} - {""}
        out |= _fed_records(scope, out)
    return (out | _texts_of_losses(scope, out)) - {""}


def _values_taken(loop: ast.AST) -> set[str]:
    """The loop names that hold a record's values: `v` in `for k, v in rec.items()` or `for v in rec.values()`;
    not a key (`for k in rec:`), which names an entry and holds no loss."""
    it = loop.iter
    if not (isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute)):
        return set()
    if it.func.attr == "values":
        return {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
    if it.func.attr == "items" and isinstance(loop.target, ast.Tuple) and len(loop.target.elts) == 2:
        return {n.id for n in ast.walk(loop.target.elts[1]) if isinstance(n, ast.Name)}
    return set()


def _fed_records(scope: ast.AST, out: set[str]) -> set[str]:
    """Records fed a loss, or a value taken out of a loss record: `meter.update(loss.item(), n)`,
    `metric_logger.update(loss=loss_value)`, `self.stats[name].update(val)` in `for name, val in
    new_stats.items()`."""
    fed_to = set()
    for c in ast.walk(scope):
        if not (isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr in (
                "update", "append", "add_", "add", "put", "extend")):
            continue
        fed = [*c.args, *[k.value for k in c.keywords]]
        keys = {k.arg or "" for k in c.keywords}
        if any(LOSSISH.search(k) and not NOT_A_LOSS.search(k) for k in keys) or any(
                LOSSISH.search(root(n)) and not NOT_A_LOSS.search(root(n)) or isinstance(n, ast.Name) and n.id in out
                for v in fed for n in ast.walk(v) if isinstance(n, (ast.Name, ast.Attribute))):
            fed_to.add(root(c.func.value))
    return fed_to


def _texts_of_losses(scope: ast.AST, out: set[str]) -> set[str]:
    """A line of text built from a loss prints it: `log_str += 'loss {:.6f} '.format(loss_dict['loss'])`, or
    from a value a loop took out of a loss record (`print_str += '%s: %.5f' % (name, val.avg)`)."""
    return {dotted(t) for a in ast.walk(scope) if isinstance(a, (ast.Assign, ast.AugAssign)) and _text_of(a.value)
            and any(LOSSISH.search(root(n)) and not NOT_A_LOSS.search(root(n)) or root(n) in out
                    for n in ast.walk(a.value) if isinstance(n, (ast.Name, ast.Attribute)))
            for t in (a.targets if isinstance(a, ast.Assign) else [a.target])} - {""}


STATISH = re.compile(r"stat|log|info|metric|summar", re.I)


def _instance_carriers(m: Module, scope: ast.AST) -> frozenset:
    """The `self.` records a method's class feeds a loss into anywhere (`self.stats[k].append(loss.item())` in the
    step, printed by print_stats), also through another method it hands a loss record to
    (`self._update_stats(stats, n)`, whose parameter fills `self.stats`)."""
    cls = m.class_of(scope) if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) else None
    if cls is None:
        return frozenset()
    methods = {k.split(".", 1)[1]: fn for k, fn in m.functions.items() if k.startswith(cls + ".")}
    seeds: dict[str, set[str]] = {name: set() for name in methods}
    found: set[str] = set()
    for _ in range(2):
        for name, fn in methods.items():
            held = _loss_carriers(fn, frozenset(seeds[name]) | frozenset(found))
            found |= {n.split("[")[0] for n in held if n.startswith("self.")}  # self.stats[] is self.stats
            for c in ast.walk(fn):  # self.meth(record, ...): the parameter that receives it holds the record
                if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and dotted(c.func.value) == "self" \
                        and c.func.attr in methods:
                    params = [x.arg for x in methods[c.func.attr].args.args][1:]
                    seeds[c.func.attr] |= {params[i] for i, a in enumerate(c.args)
                                           if i < len(params) and root(a) in held}
    return frozenset(found)


def _instance_losses(f: Facts, m: Module, scope: ast.AST) -> set[str]:
    """`self.` attributes the method's class sets from its own unreduced loss in some method (`self.d_loss =
    float(total_disc_loss.item() / n)` in the step, printed by print_log): the step's loss, held on the
    instance."""
    cls = m.class_of(scope) if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) else None
    out: set[str] = set()
    for fn in (m.functions[k] for k in m.functions if cls and k.startswith(cls + ".")):
        held, red = _holding_a_loss(fn), f.reduced_names(m, fn)
        for a in ast.walk(fn):
            if isinstance(a, ast.Assign) and any(dotted(t).startswith("self.") for t in a.targets) and any(
                    isinstance(n, (ast.Name, ast.Attribute)) and root(n) in held and root(n) not in red
                    for n in ast.walk(a.value)) and not any(
                    isinstance(n, ast.Call) and REDUCEISH.search(callee(n)) for n in ast.walk(a.value)):
                out |= {dotted(t) for t in a.targets if dotted(t).startswith("self.")}
    return out


def _class_steps(m: Module, scope: ast.AST) -> bool:
    """The method's class runs backward or an optimizer step in some method: its records of the loss are the
    training loss's, whichever hook prints them."""
    cls = m.classes[m.class_of(scope)]  # (`backwards(disc_loss, self.GAN.D_opt)`: stylegan2's partial of a helper)
    return any(isinstance(n, ast.Call) and ("backward" in callee(n) or callee(n) == "step" and re.search(
        r"opt", dotted(n.func), re.I)) for n in ast.walk(cls))


def _parent_only_rank(f: Facts, m: Module, c: ast.Call) -> bool:
    """The log's rank-0 guard reads a config attribute (`cfg.RANK == 0`) that only the launching parent sets,
    before mp.spawn: spawned workers re-import the config with its default, so every worker of the node passes."""
    n = m.parent.get(id(c))
    while n is not None and not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        if isinstance(n, ast.If):
            for x in ast.walk(n.test):
                if isinstance(x, ast.Compare) and isinstance(x.left, ast.Attribute) and "rank" in x.left.attr.lower() \
                        and _set_only_before_spawn(f, x.left.attr):
                    return True
        n = m.parent.get(id(n))
    return False


def _set_only_before_spawn(f: Facts, attr: str) -> bool:
    cache = f.cache.setdefault("parent_only_rank", {})
    if attr not in cache:
        sets = [(mm, a) for mm in f.p.modules.values() for a in mm.nodes if isinstance(a, ast.Assign) and any(
            isinstance(t, ast.Attribute) and t.attr == attr and isinstance(t.value, ast.Name) for t in a.targets)]
        cache[attr] = bool(sets) and all(
            (fn := mm.enclosing(a)) is not None and any(isinstance(s, ast.Call) and callee(s) == "spawn" and
                                                        s.lineno > a.lineno for s in ast.walk(fn))
            for mm, a in sets)
    return cache[attr]


def _text_of(v: ast.AST) -> bool:
    """A string built from values: an f-string, `'...'.format(...)`, `'...' % (...)`."""
    return isinstance(v, ast.JoinedStr) or isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and \
        v.func.attr in ("format", "join") and isinstance(v.func.value, ast.Constant) or isinstance(v, ast.BinOp) and \
        isinstance(v.op, ast.Mod) and isinstance(v.left, ast.Constant) and isinstance(v.left.value, str)


def _keyed_not_loss(values: list, name: str) -> bool:
    """Every read of `name` in the logged values takes a key that is no loss: `info_dict['accum_grad']` of a
    dict that also carries the losses logs a setting."""
    reads = [n for v in values for n in ast.walk(v) if isinstance(n, ast.Name) and n.id == name]
    keys = [const_str(n.slice) for v in values for n in ast.walk(v) if isinstance(n, ast.Subscript)
            and isinstance(n.value, ast.Name) and n.value.id == name]
    return bool(reads) and len(keys) == len(reads) and all(k and not LOSSISH.search(k) for k in keys)


def _handed_to_a_writer(f: Facts, m: Module, c: ast.Call) -> bool:
    """`loss_info.write_summary(tb_writer, "train/", step)`: a record's own method handed a logger object (one that
    only rank 0 holds): the record writes itself into that log, as `tb_writer.add_scalar(...)` would."""
    return isinstance(c.func, ast.Attribute) and isinstance(c.func.value, (ast.Name, ast.Attribute)) and any(
        dotted(a) in f.g.objects.get(m.rel, ()) for a in [*c.args, *[k.value for k in c.keywords]])


def _writer_writes(f: Facts, m: Module, c: ast.Call) -> bool:
    """`self.tensorboard_writer.write_epoch(self.stats, epoch)`: a write/log method of a logger object only rank
    0 holds (a project writer class's own method): it logs what it is handed."""
    return isinstance(c.func, ast.Attribute) and dotted(c.func.value) in f.g.objects.get(m.rel, ()) and \
        WRITES.match(c.func.attr) is not None


WRITES = re.compile(r"^(write|log|add_|record|track)")


def _reports_an_abort(m: Module, c: ast.Call) -> bool:
    """The log sits in a branch that tests the loss for NaN/inf, or that ends the run (raise, sys.exit): it
    reports why the run stops, not the training curve."""
    n = m.parent.get(id(c))
    while n is not None and not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        if isinstance(n, ast.If):
            tests_nonfinite = any(isinstance(x, ast.Call) and callee(x) in NONFINITE for x in ast.walk(n.test))
            ends = any(isinstance(s, ast.Raise) or isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)
                       and callee(s.value) in ABORTS for s in n.body)
            if tests_nonfinite or ends:
                return True
        n = m.parent.get(id(n))
    return False


CONSTISH = {"np", "numpy", "math", "float", "inf", "torch"}


def _targets(a: ast.Assign) -> set[str]:
    return {root(e) for t in a.targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])} - {""}


def _sharded(f: Facts, m: Module, call: ast.Call) -> bool:
    """Whether a call is handed this rank's shard: a batch of an enclosing loop, or a loader built with a
    DistributedSampler (`DataLoader(ds, sampler=sampler)` with `sampler = DistributedSampler(ds)`)."""
    names = {root(n) for a in [*call.args, *[k.value for k in call.keywords]] for n in ast.walk(a)
             if isinstance(n, (ast.Name, ast.Attribute))}
    n = m.parent.get(id(call))
    while n is not None:
        if isinstance(n, ast.For) and names & {x.id for x in ast.walk(n.target) if isinstance(x, ast.Name)}:
            return True
        n = m.parent.get(id(n))
    classes = f.sampler_classes()
    samplers = {dotted(t) for a in m.nodes if isinstance(a, ast.Assign) for t in a.targets
                if any(isinstance(v, ast.Call) and callee(v) in classes for v in branches(a.value))}
    for a in m.nodes:
        if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call) and _targets(a) & names:
            s = kw(a.value, "sampler") or kw(a.value, "batch_sampler")
            if s is not None and any(isinstance(v, ast.Call) and callee(v) in classes or dotted(v) in samplers
                                     for v in branches(s)):
                return True
    return False


def _rank0_own(f: Facts, m: Module, scope: ast.AST) -> set[str]:
    """Values rank 0 computes by itself, not a share of a global batch: what a project function called under the
    rank-0 guard returns (`val_loss = evaluate(model, val_loader)`, rank 0 alone over a whole, unsharded set) and
    copies of it (`min_loss = val_loss`). Rank 0's number there is the single run's; a call handed this rank's
    batch or a DistributedSampler's loader stays local."""
    cache = f.cache.setdefault("rank0_own", {})
    if (m.rel, id(scope)) in cache:
        return cache[(m.rel, id(scope))]

    def source(v, own):
        return isinstance(v, ast.Call) and f.g.kind(m, v) == "rank0" and bool(f.p.resolve(m, v)) and \
            not _sharded(f, m, v) or isinstance(v, (ast.Name, ast.Attribute)) and dotted(v) in own
    assigns = [a for a in _own_walk(scope) if isinstance(a, (ast.Assign, ast.AugAssign))]
    own: set[str] = set()
    for _ in range(3):
        own |= {t for a in assigns if isinstance(a, ast.Assign) and source(a.value, own) for t in _targets(a)}
    for a in assigns:  # a name also fed from elsewhere (not a starting constant like np.inf) is not rank 0's own
        if isinstance(a, ast.AugAssign) or not source(a.value, own) and any(
                isinstance(n, ast.Name) and n.id not in CONSTISH for n in ast.walk(a.value)):
            own -= _targets(a) if isinstance(a, ast.Assign) else {root(a.target)}
    cache[(m.rel, id(scope))] = own
    return own


def _own_walk(scope: ast.AST):
    """The nodes of a scope without the bodies of the functions and classes defined in it: a helper's local
    `losses = torch.zeros(n)` is another variable than the script's `losses = estimate_loss()`."""
    todo = [scope]
    while todo:
        n = todo.pop()
        yield n
        todo += [c for c in ast.iter_child_nodes(n)
                 if not isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda))]


def _fed_at(m: Module, c: ast.Call, lossy: set[str]) -> ast.Call | None:
    """Where the loss goes into a meter that prints it elsewhere: `metric_logger.log_every(loader, ...)` in the
    loop header prints what `metric_logger.update(loss=loss_value)` fed it in the body; that line is the one to
    change. None when the log call prints the loss itself."""
    if callee(c) in LOG_CALLS or not isinstance(c.func, ast.Attribute):
        return None
    meter = root(c.func.value)
    scope = m.enclosing(c) or m.tree
    for x in sorted((x for x in ast.walk(scope) if isinstance(x, ast.Call) and isinstance(x.func, ast.Attribute)
                     and root(x.func.value) == meter and x is not c), key=lambda x: x.lineno):
        fed = [*x.args, *[k.value for k in x.keywords]]
        if any(LOSSISH.search(k.arg or "") and not NOT_A_LOSS.search(k.arg or "") for k in x.keywords) or any(
                isinstance(n, (ast.Name, ast.Attribute)) and root(n) in lossy for v in fed for n in ast.walk(v)):
            return x
    return None


def _guard_block(m: Module, c: ast.AST) -> int:
    n = m.parent.get(id(c))
    while n is not None and not isinstance(n, (ast.If, ast.FunctionDef, ast.Module)):
        n = m.parent.get(id(n))
    return getattr(n, "lineno", 0)


def loss_logs(f: Facts, m: Module) -> list[tuple[ast.Call, set[str], str | None]]:
    """(log call, the unreduced loss names it logs, which ranks run it) for each log of a training loss that no
    reduction averaged over ranks; cached per module."""
    cache = f.cache.setdefault("loss_logs", {})
    if m.rel in cache:
        return cache[m.rel]
    out = []
    for c in m.calls:
        name = callee(c)
        handed = _handed_to_a_writer(f, m, c)
        if name not in LOG_CALLS and not handed and not _writer_writes(f, m, c) and not meter_prints(f, m, c):
            continue
        values = [*c.args, *[k.value for k in c.keywords if k.arg not in ("force", "file", "flush")]]
        values += [c.func.value] if handed else []
        names = {root(n) for v in values for n in ast.walk(v) if isinstance(n, (ast.Name, ast.Attribute))}
        names |= {dotted(n).split(".")[-1] for v in values for n in ast.walk(v) if isinstance(n, ast.Attribute)}
        lossy = {n for n in names if n and LOSSISH.search(n) and not NOT_A_LOSS.search(n)}
        scope = m.enclosing(c) or m.tree
        held = _instance_carriers(m, scope)
        carriers = _loss_carriers(scope, held)
        lossy |= _packed_losses(scope, names - lossy) | (names & carriers) | _looped_losses(m, c, names)
        lossy |= _returned_losses(f, m, scope, names - lossy)
        if name not in LOG_CALLS and isinstance(c.func, ast.Attribute):  # metric_logger.log_every(...): the
            lossy |= {root(c.func.value)} & carriers  # meter prints what it was fed
        lossy -= {root(x.func.value) for x in ast.walk(scope) if isinstance(x, ast.Call) and isinstance(
            x.func, ast.Attribute) and REDUCEISH.search(x.func.attr) and x.lineno < c.lineno}  # synced before
        lossy -= _rank0_own(f, m, scope)
        lossy -= global_model_losses(f, m, scope)
        if every_loss_over_gathered_labels(m, scope):
            continue  # MagFace: the model-parallel loss covers every rank's labels; its meters hold the global one
        lossy = {n for n in lossy if not handed_global(f, m, scope, n)
                 and not loaded_from_a_checkpoint(f, m, scope, c, n)}
        lossy = {n for n in lossy if not _keyed_not_loss(values, n) and not holds_a_loss_module(m, scope, c, n)}
        own = {dotted(n) for n in ast.walk(scope) if isinstance(n, ast.Attribute)} & _instance_losses(f, m, scope) \
            if lossy and isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) and m.class_of(scope) else set()
        if not lossy or not (f.trains(m, c) or lossy & carriers and (held or own) and _class_steps(m, scope)) or \
                _reports_an_abort(m, c) or f.off_by_default(m, c):
            continue  # (last: a log under an option unset unless given, DLRM's print of a loaded model's loss)
        red = f.reduced_names(m, scope)
        red = {r for r in red if not _reduced_only_later(m, scope, c, r, red)}
        if all(n in red or any(r and (n.startswith(r) or r.endswith("." + n)) for r in red) for n in lossy):
            continue
        kind = f.g.effective(m, c)
        out.append((c, lossy, None if kind == "rank0" and _parent_only_rank(f, m, c) else kind))
    cache[m.rel] = out
    return out


def _reduced_only_later(m: Module, scope: ast.AST, c: ast.Call, name: str, red: set[str]) -> bool:
    """Every write that makes `name` an average over ranks comes after the log `c`, outside the loops around it
    (3D-ResNets: the per-batch print of the meter `losses`, whose epoch average is all-reduced after the loop):
    what the log prints was not reduced yet. reduced_names is flow-insensitive; this is the order it ignores."""
    loops = []
    n = m.parent.get(id(c))
    while n is not None and n is not scope:
        if isinstance(n, (ast.For, ast.While)):
            loops.append(n)
        n = m.parent.get(id(n))

    def inside(node, loop):
        return any(x is node for x in ast.walk(loop))
    writes = []
    for a in ast.walk(scope):
        if isinstance(a, (ast.Assign, ast.AugAssign)):
            targets = a.targets if isinstance(a, ast.Assign) else [a.target]
            reads = {root(x) for x in ast.walk(a.value) if isinstance(x, (ast.Name, ast.Attribute))}
            if any(root(t) == name for t in targets) and (reads - {name}) & red:
                writes.append(a)
        elif isinstance(a, ast.Call) and callee(a) in ("all_reduce", "reduce") and a.args and root(a.args[0]) == name:
            writes.append(a)
    return bool(writes) and all(w.lineno > c.lineno and not any(inside(w, lp) for lp in loops) for w in writes)


@rule("rank0-local-loss", "01_unchanged", "rank 0 logs the loss of its own micro-batch, which no reduction averaged: "
      "not the global batch's loss the single run logs")
def rank0_local_loss(f: Facts, m: Module):
    hits = list(_rank0_local_loss_hits(f, m))
    # one defect, one finding: a log of what a function with its own finding returns (`train_loss =
    # fit_one_epoch(...)`, then `print(train_loss)` in main) is that finding's related place (docTR)
    merged = []
    for hit, scope, lossy in hits:
        source = next((i for i, (_, other, _) in enumerate(merged) if other is not None and other is not scope
                       and _returned_into(f, m, scope, lossy, other)), None)
        if source is None:
            merged.append((hit, scope, lossy))
        else:
            first = merged[source]
            merged[source] = (first[0]._replace(related=(*first[0].related, (m, hit.node))), first[1], first[2])
    yield from (hit for hit, _, _ in merged)


def _returned_into(f: Facts, m: Module, scope: ast.AST, lossy: frozenset, fn: ast.AST) -> bool:
    """Some logged name in `scope` is assigned from a call of `fn` (`train_loss = fit_one_epoch(...)`)."""
    return any(isinstance(a, ast.Assign) and isinstance(a.value, ast.Call) and any(
        isinstance(t, ast.Name) and t.id in lossy for x in a.targets for t in ast.walk(x)) and any(
        tf is fn for _, tf in f.p.resolve(m, a.value)) for a in ast.walk(scope or m.tree))


def _bar_on_every_rank(m: Module, c: ast.Call) -> bool:
    """`pbar = tqdm(enumerate(train_loader))` with no `disable=`, then `pbar.set_description(f"Loss {...}")`
    (PointNeXt): every rank draws its own bar with its own loss."""
    if not (isinstance(c.func, ast.Attribute) and c.func.attr in ("set_description", "set_postfix")):
        return False
    name, scope = dotted(c.func.value), m.enclosing(c) or m.tree
    made = [a.value for a in ast.walk(scope) if isinstance(a, ast.Assign) and any(
        dotted(t) == name for t in a.targets)]
    return bool(made) and all(isinstance(v, ast.Call) and callee(v) == "tqdm" and kw(v, "disable") is None
                              for v in made)


def _rank0_local_loss_hits(f: Facts, m: Module):
    per_block = set()
    # in source order, so a guarded block's finding is its first log of the loss
    for c, lossy, kind in sorted(loss_logs(f, m), key=lambda log: (log[0].lineno, log[0].col_offset)):
        forced = kw(c, "force")
        prints = callee(c) == "print" or meter_prints(f, m, c) == "print"
        console0 = kind is None and isinstance(c.func, ast.Attribute) and (
            dotted(c.func.value) in rank0_loggers(f, m) or root_console_on_stdout(f, m, c))
        if not (kind == "rank0" or console0 or (prints and f.print_override and kind is None and not forced)):
            continue
        block, where = _guard_block(m, c), (m.enclosing(c), frozenset(origins(m.enclosing(c) or m.tree, lossy)))
        if block in per_block or any(isinstance(w, tuple) and w[0] is where[0] and where[1] <= w[1]
                                     for w in per_block):
            per_block.add(block)  # one finding per guarded block, and per loss in a function: one defect, one
            continue  # finding
        per_block |= {block, where}
        how = "" if kind is not None else "through a logger whose console is rank 0's, " if console0 else \
            "through a print only rank 0's console shows (builtins.print replaced, or stdout silenced), "
        fed = _fed_at(m, c, lossy)
        at = f"{callee(c)}() (line {c.lineno}) prints what this line feeds it: " if fed is not None else ""
        yield Hit(fed or c, f"{at}rank 0 logs {', '.join(sorted(lossy))} {how}which no reduction averaged: its own "
                  "micro-batch's loss, not the global batch's — all_reduce(loss, SUM) / world_size before logging",
                  related=tuple(meter_print_calls(f, m, c)[:2]) if fed is not None else
                  _value_lines(m, c, lossy) + _meter_feeds(f, c)), \
            m.enclosing(c), frozenset(lossy)  # (fed: the meter's own print lines, where it shows the loss)


def _meter_feeds(f: Facts, c: ast.Call) -> tuple:
    """`self.train_progress.display(i)`: the `self.train_progress.update(meters)` calls that feed the meter its
    loss, in any project class (OpenUnReID's SpCL runner overrides train_step, where it feeds the loss), as
    related places: where the unreduced loss goes in."""
    if not (isinstance(c.func, ast.Attribute) and isinstance(c.func.value, ast.Attribute)):
        return ()
    held = dotted(c.func.value)
    feeds = [(mm, u) for mm in f.p.modules.values() for u in mm.calls if isinstance(u.func, ast.Attribute)
             and u.func.attr == "update" and dotted(u.func.value) == held and u.args
             and isinstance(u.args[0], ast.Name)]
    return tuple(sorted(feeds, key=lambda x: not x[0].entry)[:3])  # the script's own subclass first


def _value_lines(m: Module, c: ast.Call, lossy) -> tuple:
    """A log call over several lines (`print(f"Epoch {epoch}, "\n f"Train MAE: {train_mae:.4f}")`): the line
    that holds the loss value, as the finding's related place."""
    names = {n.lineno: n for n in ast.walk(c) if isinstance(n, (ast.Name, ast.Attribute))
             and dotted(n) in lossy and n.lineno != c.lineno}
    if names:
        return tuple((m, names[line]) for line in sorted(names)[:1])
    # a text that carries the loss (`desc_str += f' | Loss {loss_meter.val:4f}'`, then pbar.set_description(
    # desc_str), VL-T5): the line that put the loss into it
    scope = m.enclosing(c) or m.tree
    built = [a for a in ast.walk(scope) if isinstance(a, (ast.Assign, ast.AugAssign)) and a.lineno < c.lineno
             and any(dotted(t) in lossy for t in (a.targets if isinstance(a, ast.Assign) else [a.target]))
             and any(isinstance(x, (ast.Name, ast.Attribute)) and LOSSISH.search(dotted(x).split(".")[-1] or "")
                     for x in ast.walk(a.value))]
    return ((m, max(built, key=lambda a: a.lineno)),) if built else ()


@rule("every-rank-prints-loss", "01_unchanged", "every rank prints its own unreduced loss: world_size interleaved "
      "numbers, none of them the global batch's")
def every_rank_prints_loss(f: Facts, m: Module):
    for c, lossy, kind in loss_logs(f, m):
        written = shared_file_write(f, m, c) if kind is None else None
        if written is not None:
            wm, w = written
            where = f"line {w.lineno}" if wm is m else f"{wm.rel}:{w.lineno}"
            yield Hit(c, (f"every rank appends its own {', '.join(sorted(lossy))} to one log file ({where}: a file "
                          "write, which silencing print off rank 0 does not stop): world_size interleaved lines, "
                          "none of them the global batch's loss — all_reduce it, then write on rank 0"),
                      related=((wm, w),) if w is not c else ())
            continue
        if kind is None and ((callee(c) == "print" or meter_prints(f, m, c) == "print") and not f.print_override
                             or root_logger_on_every_rank(f, m, c)
                             or _bar_on_every_rank(m, c)):
            yield c, (f"every rank {'prints' if callee(c) == 'print' else 'logs'} its own "
                      f"{', '.join(sorted(lossy))}: world_size interleaved numbers, none of them the global batch's "
                      "loss — all_reduce it, then log on rank 0")
