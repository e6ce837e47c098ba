"""Which calls log a loss (loss_logs): the prints, loggers, meters and writers that show a loss value, with the
names of its losses and whether a reduction over ranks reached it first. Shared by chapter 01's rules
(rules/logging.py, rules/every_rank_logs.py). A print reporting an abort (`sys.exit(1)`) is no loss log."""

from __future__ import annotations

import ast
import re

from .consoles import (
    forwarded_log,
    meter_print_calls,
    meter_prints,
)
from .facts import Facts
from .gathers import global_model_losses
from .hierarchy import replaced_where_built
from .loss_carriers import instance_carriers, loss_carriers, still_fed
from .loss_places import rebound
from .losses import (
    backwarded,
    every_loss_over_gathered_labels,
    handed_global,
    holds_a_loss_module,
    instance_losses,
    keys_or_tags,
    loaded_from_a_checkpoint,
    looped_losses,
    loss_terms,
    packed_losses,
    returned_reduced,
    walked_from,
)
from .meters import reducing_meters
from .project import Module
from .rank0_values import own_walk, rank0_own
from .returned_losses import returned_losses, texts_of_losses
from .syntax import (
    LOG_CALLS,
    LOSSISH,
    NOT_A_LOSS,
    REDUCEISH,
    callee,
    const_str,
    dotted,
    rank_reducing_name,
    root,
    walk,
)
from .whole_sets import whole_set_values

ABORTS = {"exit", "_exit", "abort", "stop", "set_trace", "breakpoint"}  # (a debugger stop: EvoDiff's pdb)
NONFINITE = {"isfinite", "isnan", "isinf"}


def _class_steps(m: Module, scope: ast.AST) -> bool:
    """The method's class runs backward or an optimizer step in some method: its records of the loss are the
    training loss's, whichever hook prints them."""
    name = m.class_of(scope) if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) else None
    if name not in m.classes:
        return False  # (a module function's meters fed by a helper: its own loop decides, `f.trains`)
    cls = m.classes[name]  # (`backwards(disc_loss, self.GAN.D_opt)`: stylegan2's partial of a helper)
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
                                                        s.lineno > a.lineno for s in walk(fn))
            for mm, a in sets)
    return cache[attr]


def _keyed_not_loss(values: list, name: str) -> bool:
    """Every read of `name` in the logged values takes a key that is no loss: `info_dict['accum_grad']` of a
    dict that also carries the losses logs a setting."""
    reads = [n for v in values for n in ast.walk(v) if isinstance(n, ast.Name) and n.id == name]
    keys = [const_str(n.slice) for v in values for n in ast.walk(v) if isinstance(n, ast.Subscript)
            and isinstance(n.value, ast.Name) and n.value.id == name]
    # (or its key set alone, Sparse DETR's `set(loss_dict.keys()) - set(weight_dict.keys())`: names, no values)
    names = [n for v in values for n in ast.walk(v) if isinstance(n, ast.Attribute) and n.attr == "keys"
             and isinstance(n.value, ast.Name) and n.value.id == name]
    # ... unless the record is itself named a loss (RALF's `train_loss_dict["G/total"]`): there a key is a setting
    # only when it says so
    return bool(reads) and len(keys) + len(names) == len(reads) and all(k and not LOSSISH.search(k) and (
        not LOSSISH.search(name) or re.search(r"lr|learning|accum|grad|epoch|step|iter|time|acc|top|scale|norm|"
                                              r"batch|num|count|size", k, re.I)) for k in keys)


def _handed_to_a_writer(f: Facts, m: Module, c: ast.Call) -> bool:
    """`loss_info.write_summary(tb_writer, "train/", step)`: a record's own method handed a logger object (one that
    only rank 0 holds): the record writes itself into that log, as `tb_writer.add_scalar(...)` would."""
    # (a checkpoint save handed what rank 0 holds writes a checkpoint, not a log: 3D Diffuser Actor's
    # `best_loss = self.save_checkpoint(model, optimizer, step_id, new_loss, best_loss)` under rank 0)
    return isinstance(c.func, ast.Attribute) and isinstance(c.func.value, (ast.Name, ast.Attribute)) and not \
        re.search(r"save|checkpoint|ckpt", c.func.attr, re.I) and any(
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
            tests_nonfinite = _needs_nonfinite(n.test) or _loss_out_of_range(n.test)
            ends = any(isinstance(s, ast.Raise) or isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)
                       and callee(s.value) in ABORTS for s in n.body)
            if tests_nonfinite or ends:
                return True
        n = m.parent.get(id(n))
    return False


def _needs_nonfinite(t: ast.AST) -> bool:
    """The test holds only when a loss is NaN/inf: `if not math.isfinite(loss)`, `if rank == 0 and isnan(loss)`;
    `if itr % log_freq == 0 or np.isnan(loss):` (MSN) also logs on a schedule."""
    if isinstance(t, ast.BoolOp):
        return (all if isinstance(t.op, ast.Or) else any)(_needs_nonfinite(v) for v in t.values)
    return any(isinstance(x, ast.Call) and callee(x) in NONFINITE for x in ast.walk(t))


def _loss_out_of_range(t: ast.AST) -> bool:
    """The test holds only when the loss leaves a sane range: `if loss <= 0 or loss >= 1000000:` (EvoDiff), each
    part a comparison of a loss with a number."""
    if isinstance(t, ast.BoolOp) and isinstance(t.op, ast.Or):
        return all(_loss_out_of_range(v) for v in t.values)
    return isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], (
        ast.Lt, ast.LtE, ast.Gt, ast.GtE)) and any(
        isinstance(x, (ast.Name, ast.Attribute)) and LOSSISH.search(root(x)) and not NOT_A_LOSS.search(root(x))
        for x in (t.left, t.comparators[0])) and any(
        isinstance(x, ast.Constant) and isinstance(x.value, (int, float)) for x in (t.left, t.comparators[0]))


def _fed_reduced_only(f: Facts, m: Module, scope: ast.AST, name: str) -> bool:
    """`self.metrics` whose every loss feed in the class is a value its method reduced (X-Temporal's
    reduce_update_metrics: `all_reduce(reduced_loss)`, then `self.metrics['losses'].update(reduced_loss.item())`;
    train() logs `self.metrics['losses'].avg`)."""
    name = name if name.startswith("self.") else f"self.{name}"  # (the log may read the record's leaf name)
    cls = m.class_of(scope) if isinstance(scope, ast.FunctionDef) else None
    # (its own class's methods and its subclasses': KAN-TTS's `self.total_train_loss[k] += loss.item()`)
    owners = {cls} | {k for k, c in m.classes.items() if any(dotted(b).split(".")[-1] == cls for b in c.bases)}
    feeds = [(fn, c.args[0] if isinstance(c, ast.Call) else c.value) for k, fn in m.functions.items()
             if cls and k.split(".")[0] in owners for c in walk(fn)
             if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr in ("update", "append")
             and dotted(c.func.value).split("[")[0] == name and c.args and (
                 LOSSISH.search(ast.unparse(c.func.value)) or LOSSISH.search(ast.unparse(c.args[0])))
             or isinstance(c, ast.AugAssign) and dotted(c.target).split("[")[0] == name and LOSSISH.search(
                 ast.unparse(c))]
    return bool(feeds) and all({root(x) for x in ast.walk(v) if isinstance(x, (ast.Name, ast.Attribute))}
                               <= f.reduced_names(m, fn) for fn, v in feeds)


def _fed_by_helpers(f: Facts, m: Module, scope: ast.AST) -> frozenset:
    """Meters a function hands to a project function that feeds them a loss it does not reduce (AdCo's train()
    hands `losses` to update_network(), whose `losses.update(loss.item(), n)` fills it; train() prints it)."""
    cache = f.cache.setdefault("fed_by_helpers", {})
    if (m.rel, id(scope)) not in cache:
        out = set()
        for c in (c for c in walk(scope) if isinstance(c, ast.Call) and c.args):
            for _, tf in f.p.resolve(m, c):
                params = [a.arg for a in tf.args.args]
                params = params[1:] if params[:1] in (["self"], ["cls"]) else params
                # (a helper that reduces a loss is left alone; a gather of the keys, or an all_reduce of a
                # memory bank's gradient, makes no loss global)
                if any(isinstance(x, ast.Call) and rank_reducing_name(x) and "gather" not in callee(x) and any(
                        LOSSISH.search(root(a)) for a in x.args) for x in walk(tf)):
                    continue
                fed = loss_carriers(tf)
                out |= {a.id for a, p in zip(c.args, params, strict=False) if isinstance(a, ast.Name) and p in fed}
        cache[(m.rel, id(scope))] = frozenset(out)
    return cache[(m.rel, id(scope))]


def loss_logs(f: Facts, m: Module) -> list[tuple[ast.Call, set[str], str | None]]:
    """(log call, the unreduced loss names it logs, which ranks run it) for each log of a training loss that no
    reduction averaged over ranks; cached per module."""
    cache = f.cache.setdefault("loss_logs", {})
    if m.rel in cache:
        return cache[m.rel]
    out, carried, per_scope = [], {}, {}
    for c in m.calls:
        name = callee(c)
        handed = _handed_to_a_writer(f, m, c)
        forwarded = forwarded_log(m, c) if name not in LOG_CALLS else None
        if name not in LOG_CALLS and not handed and not _writer_writes(f, m, c) and not meter_prints(f, m, c) \
                and not _unseen_print_helper(f, m, c) and forwarded is None:
            continue
        values = [*c.args, *[k.value for k in c.keywords if k.arg not in ("force", "file", "flush")]]
        values += [c.func.value] if handed else []
        names = {root(n) for v in values for n in ast.walk(v) if isinstance(n, (ast.Name, ast.Attribute))} - {""}
        names |= {dotted(n).split(".")[-1] for v in values for n in ast.walk(v) if isinstance(n, ast.Attribute)}
        scope = m.enclosing(c) or m.tree
        sc = _scope_facts(f, m, scope, per_scope)
        lossy = {n for n in names if n and LOSSISH.search(n) and not NOT_A_LOSS.search(n)} | (
            names & sc["backwarded"]) | (names & sc["terms"])
        held = instance_carriers(m, scope) | _fed_by_helpers(f, m, scope)
        key = (id(scope), frozenset(held))  # (one function's logs share its carriers: DLRM has 89 logs)
        carriers = carried.get(key)
        if carriers is None:
            carriers = carried[key] = loss_carriers(scope, held)
        valued, rest = names - keys_or_tags(values, c), names - lossy
        lossy |= packed_losses(scope, rest) | still_fed(scope, c, names & carriers) | looped_losses(m, c, valued) \
            | returned_losses(f, m, scope, rest) | texts_of_losses(scope, rest, carriers)
        if name not in LOG_CALLS and isinstance(c.func, ast.Attribute):  # metric_logger.log_every(...): the
            lossy |= {root(c.func.value)} & carriers  # meter prints what it was fed
        synced = {r for line, r in sc["reduce_calls"] if line < c.lineno and not rebound(scope, r, line, c.lineno)}
        # ... and what is read off it after (`running_val_loss.synchronize_between_processes(device)`, then
        # `epoch_val_loss = running_val_loss.global_avg`: Birder)
        synced |= {dotted(t) for a in walk(scope) if isinstance(a, ast.Assign) and a.lineno < c.lineno and any(
            isinstance(x, ast.Attribute) and any(r == dotted(x.value) and r not in m.imports and line < a.lineno
                                                 for line, r in sc["reduce_calls"])  # (an object, not torch.*)
            for x in ast.walk(a.value)) for t in a.targets if dotted(t)} - {""}
        # ... with what is read off it (`meters.sync()`, then `meters.avg_loss`: gtn_applications)
        lossy -= synced | {n.attr for v in values for n in ast.walk(v) if isinstance(n, ast.Attribute)
                           and root(n) in synced - {""}}
        lossy -= sc["rank0_own"]
        lossy -= sc["global"] | sc["whole_set"] | sc["reducing"]
        if sc["over_gathered"]:
            continue  # MagFace: the model-parallel loss covers every rank's labels; its meters hold the global one
        lossy = {n for n in lossy if not handed_global(f, m, scope, n) and not _fed_reduced_only(f, m, scope, n)
                 and not loaded_from_a_checkpoint(f, m, scope, c, n) and not returned_reduced(f, m, scope, n)}
        # (a field of what a reducing function returned: X-Temporal's `metric = self.evaluate()`, then
        # `add_scalar('loss_val', metric.loss)`; `loss` here is the field, not the step's own `loss`)
        lossy -= {n.attr for v in values for n in ast.walk(v) if isinstance(n, ast.Attribute) and isinstance(
            n.value, ast.Name) and returned_reduced(f, m, scope, n.value.id)} - {
            n.id for v in values for n in ast.walk(v) if isinstance(n, ast.Name)}
        lossy = {n for n in lossy if not _keyed_not_loss(values, n) and not holds_a_loss_module(m, scope, c, n)
                 and not _set_before_without_loss(f, m, scope, c, n, carriers | sc["backwarded"] | sc["terms"])}
        # a loss function handed on (`val.run(..., compute_loss=self.compute_loss)`); not a bare name the log reads,
        # a value of its own scope (revisitSR's `loss.item()` in log_train, beside the criterion `self.loss`)
        lossy -= m.called_attributes() - {n.id for v in values for n in ast.walk(v) if isinstance(n, ast.Name)}
        own = {dotted(n) for n in walk(scope) if isinstance(n, ast.Attribute)} & instance_losses(f, m, scope) \
            if lossy and isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) and m.class_of(scope) else set()
        if not lossy or not (f.trains(m, c) or lossy & carriers and (held or own) and _class_steps(m, scope)
                             and not (isinstance(scope, ast.FunctionDef) and f.evaluates(m, scope))) or \
                _reports_an_abort(m, c) or f.off_in_default_run(m, c) or replaced_where_built(f.p, m, scope):
            continue  # (an option unset unless given, DLRM's print of a loaded model's loss; a base's replaced step)
        outer = outermost(m, c)  # a closure's loss may be reduced in its sibling (I-JEPA's AllReduce in train_step)
        red = f.reduced_names(m, scope) | (f.reduced_names(m, outer) if outer not in (None, scope) else set())
        red0 = set(red)
        while True:  # a name reduced only through another that is not reduced here is not either
            now = {r for r in red if not _not_reduced_at(f, m, scope, c, r, red, red0)}
            if now == red:
                break
            red = now
        red |= walked_from(scope, red)  # (`{k: v for k, v in track_losses.items()}` after track_losses is synced)
        if isinstance(c.func, ast.Attribute) and c.func.attr in ("update", "append") and lossy - {root(c.func.value)}:
            lossy = lossy - {root(c.func.value)}  # a meter fed here holds what it is fed (open_lm's losses_m fed the
            # all-reduced global_loss_tensor): the values fed decide, not what the fresh meter held before
        if all(n in red or any(r and (n.startswith(r) or r.endswith("." + n)) for r in red) for n in lossy):
            continue
        kind = f.g.effective(m, c) or (f.g.effective(m, forwarded) if forwarded is not None else None)
        inner = meter_print_calls(f, m, c) if kind is None else None
        # (its console lines decide: a TensorBoard writer handed in through helpers and parameters, DepthContrast's
        # ProgressMeter tb_writter, is no console line, whichever ranks hold one; with none, its writes: dyMEAN's log)
        console = [(mm, x) for mm, x in inner or [] if callee(x) not in ("add_scalar", "add_scalars")] or inner
        if console and all(f.g.effective(mm, x) == "rank0" for mm, x in console) or kind is None and \
                _guarded_inside(f, m, c):
            kind = "rank0"  # `logger.log_training(it, stats)` whose method returns unless self.rank == 0 (WaveGrad)
        out.append((c, lossy, None if kind == "rank0" and _parent_only_rank(f, m, c) else kind))
    cache[m.rel] = out
    return out


def _guarded_inside(f: Facts, m: Module, c: ast.Call) -> bool:
    """The project function the log calls does all its logging under a rank-0 guard (SurroundDepth's
    `self.log_time(batch_idx, duration, loss)`, whose body is `if self.local_rank == 0: ... self.log_print(...)`):
    its log lines, and the helpers it prints through, run on rank 0 alone, whoever else calls those helpers."""
    targets = f.p.resolve(m, c)
    inner = [(tm, x) for tm, tf in targets for x in walk(tf) if isinstance(x, ast.Call) and (
        callee(x) in LOG_CALLS or f.p.resolve(tm, x))]
    return bool(targets) and bool(inner) and all(f.g.kind(tm, x) == "rank0" for tm, x in inner)


def _set_before_without_loss(f: Facts, m: Module, scope: ast.AST, c: ast.Call, name: str, lossy: set[str]) -> bool:
    """The value `c` logs under `name` was last set, in the straight-line code before it, from no loss (SimpleAICV's
    `log_info = f'{key}: {value}'` over the config, then `logger.info(log_info)`; the name holds a loss text only in
    other lines), or from one read off a checkpoint (its resume message's `test_loss`)."""
    child = c
    while not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        parent = m.parent.get(id(child))
        if parent is None:
            return False
        for body in (getattr(parent, k, None) for k in ("body", "orelse", "finalbody")):
            if not isinstance(body, list) or not any(s is child for s in body):
                continue
            for s in reversed(body[:next(i for i, s in enumerate(body) if s is child)]):
                if isinstance(s, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in s.targets):
                    if not _a_text(s.value) or any(isinstance(n, ast.Call) and n is not s.value and callee(n) not in (
                            "len", "str", "int", "float", "round", "abs") for n in ast.walk(s.value)):  # (GluonCV's
                        # `'Epoch: [{0}][{1}/{2}]'.format(epoch, step + 1, len(dataloader))`)
                        return False  # an object (a meter fed after it is built) changes after it is set; a text
                        # that calls something (`f'{crit(model(x0), y0).item():.4f}'`) may compute a loss
                    read = {root(n) for n in ast.walk(s.value) if isinstance(n, (ast.Name, ast.Attribute))} | {
                        n.attr for n in ast.walk(s.value) if isinstance(n, ast.Attribute)} | {
                        const_str(n.slice) for n in ast.walk(s.value) if isinstance(n, ast.Subscript)}  # (UniPhy's
                    # `metrics['loss']`)
                    return not any((LOSSISH.search(r) or r in lossy) and not loaded_from_a_checkpoint(
                        f, m, scope, c, r) for r in read if r)
                if any(isinstance(t, ast.Name) and t.id == name and not isinstance(t.ctx, ast.Load) for t in walk(s)):
                    return False  # set in a block before (a read, rfpp's `print(log)`, changes no text)
        child = parent
    return False


def _a_text(v: ast.AST) -> bool:
    """An f-string, a string, `'...'.format(...)` or `'...' % (...)`."""
    return isinstance(v, ast.JoinedStr) or isinstance(v, ast.Constant) and isinstance(v.value, str) or isinstance(
        v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr == "format" and _a_text(
        v.func.value) or isinstance(v, ast.BinOp) and isinstance(v.op, ast.Mod) and _a_text(v.left)


def _scope_facts(f: Facts, m: Module, scope: ast.AST, per_scope: dict) -> dict:
    """What loss_logs asks of a log's function that does not depend on the log: asked once per function (YOLOv7's
    train() holds dozens of logs, and each question walks the whole function)."""
    sc = per_scope.get(id(scope))
    if sc is None:
        bw = backwarded(scope)
        sc = per_scope[id(scope)] = {
            "backwarded": bw, "terms": loss_terms(scope, bw), "rank0_own": rank0_own(f, m, scope),
            "global": global_model_losses(f, m, scope), "whole_set": whole_set_values(f, m, scope),
            "reducing": reducing_meters(f, m, scope), "over_gathered": every_loss_over_gathered_labels(m, scope),
            "reduce_calls": [(x.lineno, root(x.func.value)) for x in walk(scope) if isinstance(x, ast.Call)
                             and isinstance(x.func, ast.Attribute) and REDUCEISH.search(x.func.attr)]}
    return sc


UNSEEN_PRINTER = re.compile(r"^(print|log)_(\w+_)?(message|msg|info|metrics?|stats?|progress|loss|losses)$")


def _unseen_print_helper(f: Facts, m: Module, c: ast.Call) -> bool:
    """`print_message(batch_idx, train_loss)` from a utility module these files lack (ColBERT's colbert.utils):
    a helper named as a printer prints what it is handed."""
    return bool(UNSEEN_PRINTER.match(callee(c))) and not f.p.resolve(m, c) and (
        isinstance(c.func, ast.Name) and callee(c) in m.imports or isinstance(c.func, ast.Attribute)
        and root(c.func.value) in m.imports)


def _not_reduced_at(f: Facts, m: Module, scope: ast.AST, c: ast.Call, name: str, red: set[str], red0: set[str]) -> bool:
    """`name` does not hold an average over ranks where the log `c` reads it, though reduced_names (flow-
    insensitive) says it does somewhere. The write that reaches `c` decides: the nearest one before it, or, with
    none before it, one later in a loop around `c` (the next iteration's). 3D-ResNets: the epoch average of the
    meter `losses` is all-reduced after the batch loop, so the per-batch print reads this rank's; P5: `results =
    train_step(batch)` in the loop, `results = reduce_dict(epoch_results)` after it, and the meter fed from
    `results` in the loop is this rank's too. `red`: the names still reduced here; `red0`: reduced_names' answer,
    which a name keeps when none of its writes seen reduces by it (the reduction is one this reading misses)."""
    loops = []
    n = m.parent.get(id(c))
    while n is not None and n is not scope:
        if isinstance(n, (ast.For, ast.While)):
            loops.append(n)
        n = m.parent.get(id(n))
    writes = []  # (statement, reduces)
    for a in own_walk(scope):  # (a method defined here has its own `loss`)
        if isinstance(a, (ast.Assign, ast.AugAssign)):
            targets, value = (a.targets if isinstance(a, ast.Assign) else [a.target]), a.value
        elif isinstance(a, ast.Call) and isinstance(a.func, ast.Attribute) and a.func.attr in ("update", "append") \
                and a.args:
            targets, value = [a.func.value], a.args[0]  # a meter fed a value holds what it is fed
        elif isinstance(a, ast.Call) and callee(a) in ("all_reduce", "reduce") and a.args and root(a.args[0]) == name:
            writes.append((a, True, True))
            continue
        else:
            continue
        if any(root(e) == name for t in targets for e in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t])):
            reads = {root(x) for x in ast.walk(value) if isinstance(x, (ast.Name, ast.Attribute))}
            partial = isinstance(a, ast.Assign) and not any(
                isinstance(e, ast.Name) and e.id == name for t in targets
                for e in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]))
            called = any(isinstance(x, ast.Call) and rank_reducing_name(x) for x in ast.walk(value))
            # ... or a project helper that reduces (MACE's take_step_lbfgs, in the LBFGS arm only)
            called |= isinstance(value, ast.Call) and f.collective_helper(m, value)
            if (isinstance(a, (ast.AugAssign, ast.Call)) or partial or name in reads) and not (
                    (reads - {name}) & red0 or called):
                continue  # `loss /= world_size`, `avg = avg.item() / world_size`, `text += '\n'`, `stats['epoch'] =
                # epoch`, `meter.update(n=1)`: keeps what it held
            reads -= {name}
            writes.append((a, bool(reads & red) or called, bool(reads & red0) or called))
    if not any(reduced0 for _, _, reduced0 in writes):
        return False
    writes = [(w, reduces) for w, reduces, _ in writes]
    inside = [{id(x) for x in ast.walk(lp)} for lp in loops]
    before = [w for w in writes if w[0].lineno < c.lineno and not (
        isinstance(w[0], ast.Assign) and isinstance(w[0].value, ast.Constant) and any(
            id(w[0]) not in ids and any(id(x) in ids and x.lineno > c.lineno for x, _ in writes) for ids in inside))]
    # (`ema_loss = 0` before the loop whose later write, reduced, is what the next iteration's log reads: Grendel-GS)
    definite = [w for w in before if on_the_path(m, scope, w[0], c)]
    last = max(definite, key=lambda w: w[0].lineno) if definite else None
    # a write in a branch `c` is not in may or may not have run (msst's `if ddp:` arm reduces, its `else:` does not)
    if any(reduces for w, reduces in before if last is None or w.lineno > last[0].lineno):
        return False
    if before:  # the nearest write on the path, or writes in branches, none reducing
        return not (last is not None and last[1])
    return not any(reduces and any(x is w for lp in loops for x in ast.walk(lp)) for w, reduces in writes)


def on_the_path(m: Module, scope: ast.AST, w: ast.AST, c: ast.AST) -> bool:
    """`w` runs whenever `c` does: every branch or loop around `w` (in `scope`) is around `c` too, in the same arm."""
    around_c, n = {}, c
    while n is not None and n is not scope:
        up = m.parent.get(id(n))
        around_c[id(up)] = n
        n = up
    child, n = w, m.parent.get(id(w))
    while n is not None and n is not scope:
        if isinstance(n, (ast.If, ast.For, ast.While, ast.ExceptHandler, ast.IfExp)):
            if id(n) not in around_c:
                return False
            if isinstance(n, ast.If) and (any(child is x for x in n.body) != any(around_c[id(n)] is x
                                                                                  for x in n.body)):
                return False
        child, n = n, m.parent.get(id(n))
    return True


def outermost(m: Module, c: ast.AST):
    """The function around `c`, or the function around that when it is a closure (MSN's `def log_stats():` in its
    training loop): one loss logged from both is one defect."""
    fn = m.enclosing(c)
    while fn is not None and isinstance(m.enclosing(fn), (ast.FunctionDef, ast.AsyncFunctionDef)):
        fn = m.enclosing(fn)
    return fn
