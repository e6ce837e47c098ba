"""Chapter 01's every-rank-prints-loss: every rank prints (or logs to its own console, or appends to one shared
file) the unreduced loss of its own micro-batch. Which logs carry a loss, and which ranks run them, is
loss_logs.py (shared with rank0-local-loss)."""

from __future__ import annotations

import ast

from ..consoles import (
    bar_on_every_rank,
    forwarded_log,
    info_on_rank0_only,
    meter_print_calls,
    meter_prints,
    root_logger_on_every_rank,
    shared_file_write,
)
from ..facts import Facts
from ..loss_logs import loss_logs, outermost
from ..losses import loss_roots
from ..project import Module
from ..registry import Hit, rule
from ..switches import one_process_arm
from ..syntax import callee, dotted
from .logging import returned_into


@rule("every-rank-prints-loss", "01_unchanged", "every rank prints its own unreduced loss: world_size interleaved "
      "numbers, none of them the global batch's")
def every_rank_prints_loss(f: Facts, m: Module):
    # one defect, one finding: the logs of one loss in one function (WeSpeaker's per-interval and end-of-epoch
    # lines of loss_meter) are one finding at the first, naming the others
    firsts: dict = {}
    logged: dict = {}
    for hit, lossy in sorted(_every_rank_hits(f, m), key=lambda h: (h[0].node.lineno, h[0].node.col_offset)):
        fn = m.enclosing(hit.node)
        params = {a.arg for a in fn.args.args} if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) else set()
        key = (outermost(m, hit.node), frozenset(loss_roots(fn or m.tree, lossy)) if not lossy <= params else "")
        shown = meter_print_calls(f, m, hit.node) if f.trains(m, hit.node) else []
        if shown:  # the training loops' displays of one meter class (HAWQ's train and train_kd both call
            key = ("meter", id(shown[0][1]))  # ProgressMeter.display): one line logs, one defect, named there
            hit = hit._replace(related=(*hit.related, *(s for s in shown[:2] if s not in hit.related)))
        # (a helper writing the losses it is handed, VSCode's save_loss: one finding, naming where it is called)
        if key not in firsts and not key[1] and fn is not None:
            hit = hit._replace(related=(*hit.related, *f.p.callers(m, fn)[:2]))
        # (one loss, one finding: a log sharing a loss with an earlier one of the function, SegVol's step and
        # epoch lines, both sums of the loss the step backwards from, is its related place)
        key = next((k for k in firsts if k[0] == key[0] and isinstance(k[1], frozenset) and isinstance(
            key[1], frozenset) and k[1] & key[1]), key)
        if key in firsts:
            first = firsts[key]
            firsts[key] = first._replace(related=(*first.related, (m, hit.node)))
        else:
            firsts[key], logged[key] = hit, frozenset(lossy)
    # ... and a log of what such a function returns (SegVol's main_worker prints the epoch_loss train_epoch
    # returns, after train_epoch printed it on every rank): the same defect, named as a related place
    for key, hit in list(firsts.items()):
        scope = m.enclosing(hit.node)
        source = next((k for k, other in firsts.items() if other is not hit and m.enclosing(other.node) is not None
                       and returned_into(f, m, scope, logged[key], m.enclosing(other.node))), None)
        if source is not None:
            firsts[source] = firsts[source]._replace(related=(*firsts[source].related, (m, hit.node)))
            del firsts[key]
    yield from firsts.values()


def _every_rank_hits(f: Facts, m: Module):
    for c, lossy, kind in loss_logs(f, m):
        if one_process_arm(m, c):
            continue  # the else of `if args.distributed:` (VoCo's running-average print): one process prints
        written = shared_file_write(f, m, c) if kind is None else None
        if written is not None:
            wm, w = written
            where = f"line {w.lineno}" if wm is m else f"{wm.rel}:{w.lineno}"
            yield Hit(c, (f"every rank appends its own {', '.join(sorted(lossy))} to one log file ({where}: a file "
                          "write, which silencing print off rank 0 does not stop): world_size interleaved lines, "
                          "none of them the global batch's loss — all_reduce it, then write on rank 0"),
                      related=((wm, w),) if w is not c else ()), lossy
            continue
        inner = forwarded_log(m, c)  # (a printer of the file it calls: M3M's subprint)
        printed = callee(c) == "print" or meter_prints(f, m, c) == "print" or inner is not None and callee(
            inner) == "print" or dotted(c.func) in ("tqdm.write", "tqdm.tqdm.write")  # (Accel-RF's progress line)
        if kind is None and (printed and not f.print_override
                             or root_logger_on_every_rank(f, m, c) and not info_on_rank0_only(f, m, c)
                             or bar_on_every_rank(m, c) and not f.stderr_silenced):
            # (a child of a logger whose level is INFO on rank 0 alone, Simple-CCReID's 'reid.train' under
            # get_logger's 'reid': rank 0's line, rank0-local-loss's to judge)
            yield Hit(c, (f"every rank {'prints' if callee(c) == 'print' else 'logs'} its own "
                          f"{', '.join(sorted(lossy))}: world_size interleaved numbers, none of them the global "
                          "batch's loss — all_reduce it, then log on rank 0")), lossy
