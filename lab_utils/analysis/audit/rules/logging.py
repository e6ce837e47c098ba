"""Chapter 01 (unchanged): the logged loss. Rank 0 logging its own micro-batch's loss, or every rank printing its own,
differs from the single run's loss of the global batch."""

from __future__ import annotations

import ast

from ..consoles import (
    info_on_rank0_only,
    meter_print_calls,
    meter_prints,
    rank0_loggers,
    root_console_on_stdout,
)
from ..facts import Facts
from ..kv_loggers import kv_dump_hits
from ..loss_logs import loss_logs, on_the_path, outermost
from ..loss_places import handed_from, meter_feeds, rank0_guard, updates_of, value_lines
from ..losses import (
    origins,
)
from ..meters import feeds_handed_meter
from ..project import Module
from ..rank0_values import of_the_weights_alone
from ..registry import Hit, rule
from ..returned_losses import built_from
from ..syntax import (
    LOG_CALLS,
    LOSSISH,
    NOT_A_LOSS,
    callee,
    dotted,
    kw,
    root,
    walk,
)


def _fed_at(f: Facts, m: Module, c: ast.Call, lossy: set[str]) -> ast.Call | None:
    """Where the loss goes into a meter that prints it elsewhere: `metric_logger.log_every(loader, ...)` in the
    loop header prints what `metric_logger.update(loss=loss_value)` fed it in the body; that line is the one to
    change. None when the log call prints the loss itself."""
    if callee(c) in LOG_CALLS or not isinstance(c.func, ast.Attribute):
        return None
    meter = root(c.func.value)
    scope = m.enclosing(c) or m.tree
    feeds = []
    for x in sorted((x for x in walk(scope) if isinstance(x, ast.Call) and isinstance(x.func, ast.Attribute)
                     and root(x.func.value) == meter and x is not c), key=lambda x: x.lineno):
        if meter_print_calls(f, m, x):
            continue  # another log through the same object (WaveGrad's log_training beside log_test), not a feed
        fed = [*x.args, *[k.value for k in x.keywords]]
        if any(LOSSISH.search(k.arg or "") and not NOT_A_LOSS.search(k.arg or "") for k in x.keywords) or any(
                isinstance(n, (ast.Name, ast.Attribute)) and root(n) in lossy for v in fed for n in ast.walk(v)):
            feeds.append(x)
        # ... or a project helper handed the meter that feeds it a loss (TSP's `compute_accuracies_and_log_metrics(
        # metric_logger, loss, ...)`, whose body runs `metric_logger.update(loss=loss.item())`): the call is the line
    feeds += [x for x in walk(scope) if isinstance(x, ast.Call) and x is not c and feeds_handed_meter(f, m, x, meter)]
    feeds.sort(key=lambda x: x.lineno)
    # the feed every step runs before one under an option (WeakTr's `logger.update(loss=loss.item())` at the end
    # of the step, not the `mean_loss` fed only `if GradientClipping is not None:`)
    return next((x for x in feeds if on_the_path(m, scope, x, c)), feeds[0] if feeds else None)


def _guard_block(m: Module, c: ast.AST) -> int:
    n = m.parent.get(id(c))
    while n is not None and not isinstance(n, (ast.If, ast.FunctionDef, ast.Module)):
        n = m.parent.get(id(n))
    return getattr(n, "lineno", 0)


@rule("rank0-local-loss", "01_unchanged", "rank 0 logs the loss of its own micro-batch, which no reduction averaged: "
      "not the global batch's loss the single run logs")
def rank0_local_loss(f: Facts, m: Module):
    hits = list(_rank0_local_loss_hits(f, m))
    # one defect, one finding: a log of what a function with its own finding returns is its related place (docTR)
    merged = []
    for hit, scope, lossy in hits:
        source = next((i for i, (_, other, _) in enumerate(merged) if other is not None and other is not scope
                       and returned_into(f, m, scope, lossy, other)), None)
        into = next((i for i, (_, other, olossy) in enumerate(merged) if scope is not None and other is not scope
                     and returned_into(f, m, other, olossy, scope)), None) if source is None else None
        if into is not None:  # an earlier log of what this function returns (PICK's epoch line in train(), fed
            # by _train_epoch, logged first in the file): this log, where the loss is computed, leads
            first = merged[into]
            merged[into] = (hit._replace(related=(*hit.related, (m, first[0].node), *first[0].related[:2])), scope,
                            lossy)
        elif source is None:
            merged.append((hit, scope, lossy))
        else:
            first = merged[source]
            merged[source] = (first[0]._replace(related=(*first[0].related, (m, hit.node))), first[1], first[2])
    for hit, scope, lossy in merged:
        if not _logged_where_computed(f, m, scope, lossy):
            # (and where the scripts call a logging helper: BigColor's `if ... is_main_dev: make_log_scalar(...)`;
            # a helper handed the losses it logs, StudioGAN's log_train_statistics(gen_acml_loss=...): its callers)
            related = (*hit.related, *_logged_by_callers(f, m, scope), *(
                f.p.callers(m, scope)[:2] if _handed_the_loss(scope, lossy) else ()))
            related = tuple({(id(x[0]), id(x[1])): x for x in related}.values())  # (each place once)
            yield hit._replace(related=(*related, *(s for s in f.p.script_calls(m, hit.node) if s not in related)))
    yield from kv_dump_hits(f, m)  # (guided-diffusion's key-value logger, handed no communicator)


def _handed_the_loss(fn: ast.AST, lossy) -> bool:
    """What `fn` logs is built from a loss-named parameter of its own."""
    params = {a.arg for a in fn.args.args if LOSSISH.search(a.arg)} if isinstance(fn, ast.FunctionDef) else set()
    return bool(params) and bool(set().union(*built_from(fn, set(lossy)).values()) & params)


def _logged_by_callers(f: Facts, m: Module, fn: ast.AST) -> tuple:
    """The callers' rank-0 logs of what `fn` returns (voxceleb_trainer's score file): the defect's related places."""
    return tuple((cm, h.node) for cm, c in (f.p.callers(m, fn) if fn is not None else []) if cm is not m
                 for h, s, lossy in _rank0_local_loss_hits(f, cm) if s is cm.enclosing(c)
                 and returned_into(f, cm, s, lossy, fn))[:2]


def _logged_where_computed(f: Facts, m: Module, scope: ast.AST, lossy: set) -> bool:
    """The logged loss is what a function of another module returns, and that function logs it on rank 0 itself
    (ECAPA-TDNN's train_network prints its running loss and returns it for main's score file): one defect, found
    where the loss is computed."""
    called = {(tm.rel, id(tf)): (tm, tf) for a in ast.walk(scope or m.tree)
              if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call)
              for tm, tf in f.p.resolve(m, a.value) if tm is not m}
    return any(returned_into(f, m, scope, lossy, tf) and any(
        other is tf for _, other, _ in _rank0_local_loss_hits(f, tm)) for tm, tf in called.values())


def returned_into(f: Facts, m: Module, scope: ast.AST, lossy: frozenset, fn: ast.AST) -> bool:
    """Some logged name in `scope` is assigned from a call of `fn` (`train_loss = fit_one_epoch(...)`), or from
    such a name (`self.best_loss = epoch_loss`, SAM-Med3D)."""
    binds = [a for a in ast.walk(scope or m.tree) if isinstance(a, ast.Assign)]
    got = {dotted(t) for a in binds if isinstance(a.value, ast.Call) and any(
        tf is fn for _, tf in f.p.resolve(m, a.value)) for x in a.targets for t in ast.walk(x)
        if isinstance(t, (ast.Name, ast.Attribute))}
    for a in binds:
        if isinstance(a.value, ast.Name) and a.value.id in got:
            got |= {dotted(t) for t in a.targets}
    # ... or read off it (`epoch_result = train_epoch(...)`, then `epoch_result.loss`: PFNs)
    read = {n.attr for n in ast.walk(scope or m.tree) if isinstance(n, ast.Attribute) and root(n) in got - {""}}
    return bool({g for g in got if g} & lossy or {g.split(".")[-1] for g in got if g} & lossy or read & lossy)


def _rank0_local_loss_hits(f: Facts, m: Module):
    """One finding per guarded block, and per function (RoboFlamingo's wandb.log of divided_loss_calvin, then the
    print and the progress bar of loss_calvin with its parts): the later logs are the first one's related places,
    where the same fix (reduce before logging) goes."""
    out: list = []
    for hit, scope, lossy, where in _rank0_local_loss_logs(f, m):
        i = next((i for i, o in enumerate(out) if o[3][0] is where[0] and where[0] is not None), None)
        if i is None:
            out.append((hit, scope, lossy, where))
        elif len(out[i][0].related) < 4:
            out[i] = (out[i][0]._replace(related=(*out[i][0].related, (m, hit.node))), *out[i][1:])
    yield from ((hit, scope, lossy) for hit, scope, lossy, _ in out)


def _rank0_local_loss_logs(f: Facts, m: Module):
    per_block = set()
    # in source order, so a guarded block's finding is its first log of the loss
    for c, lossy, kind in sorted(loss_logs(f, m), key=lambda log: (log[0].lineno, log[0].col_offset)):
        if all(of_the_weights_alone(f, m, c, name) for name in lossy):
            continue
        forced = kw(c, "force")
        prints = callee(c) == "print" or meter_prints(f, m, c) == "print"
        console0 = kind is None and isinstance(c.func, ast.Attribute) and (
            dotted(c.func.value) in rank0_loggers(f, m) or root_console_on_stdout(f, m, c)
            or info_on_rank0_only(f, m, c))
        if not (kind == "rank0" or console0 or (prints and f.print_override and kind is None and not forced)):
            continue
        block, where = _guard_block(m, c), (outermost(m, c), frozenset(origins(m.enclosing(c) or m.tree, lossy)))
        if block in per_block or any(isinstance(w, tuple) and w[0] is where[0] and where[1] <= w[1]
                                     for w in per_block):
            per_block.add(block)  # one finding per guarded block, and per loss in a function: one defect, one
            continue  # finding
        per_block |= {block, where}
        how = "" if kind is not None else "through a logger whose console is rank 0's, " if console0 else \
            "through a print only rank 0's console shows (builtins.print replaced, or stdout silenced), "
        fed = _fed_at(f, m, c, lossy)
        at = f"{callee(c)}() (line {c.lineno}) prints what this line feeds it: " if fed is not None else ""
        yield Hit(fed or c, f"{at}rank 0 logs {', '.join(sorted(lossy))} {how}which no reduction averaged: its own "
                  "micro-batch's loss, not the global batch's — all_reduce(loss, SUM) / world_size before logging",
                  related=((m, c), *meter_print_calls(f, m, c)[:2]) + value_lines(m, fed, {
                      dotted(n) for n in ast.walk(fed) if LOSSISH.search(dotted(n))}) if fed is not None else
                  value_lines(m, c, lossy) + meter_feeds(f, c, m) + updates_of(m, c, lossy) + handed_from(
                      f, m, c, lossy) + rank0_guard(f, m, c)), \
            m.enclosing(c), frozenset(lossy), where  # (fed: the call that prints it, as the message says, and the
        # meter's own print lines, where it shows the loss)
