"""Chapters 00 and 08: collectives that only some ranks reach (a hang), and the DDP-wrapped model run by rank 0
alone."""

from __future__ import annotations

import ast

from ..facts import Facts
from ..project import Module
from ..ranks import distributed_switch
from ..registry import rule
from ..syntax import callee, dotted


@rule("collective-under-rank0", "00_preflight", "a collective only rank 0 (or only the others) reaches: the "
      "ranks that call it wait forever for the ones that skip it (a hang)")
def collective_under_rank0(f: Facts, m: Module):
    for c in m.calls:
        kind = f.g.kind(m, c)
        if kind not in ("rank0", "not0") or not f.collective(m, c):
            continue
        fn = m.enclosing(c) or m.tree
        other = "not0" if kind == "rank0" else "rank0"
        if any(isinstance(o, ast.Call) and callee(o) == callee(c) and o is not c and f.g.kind(m, o) in (other, None)
               for o in ast.walk(fn)):
            continue  # `if rank != 0: barrier()` ... `if rank == 0: barrier()`: every rank meets once
        who = "rank 0 only" if kind == "rank0" else "every rank but 0"
        yield c, (f"{ast.unparse(c.func)}(...) runs on {who} (its guard, or an early return of the others): the "
                  "ranks that skip it never join, so the ones that call it wait forever (a hang) — move it outside "
                  "the rank branch")


@rule("ddp-forward-under-rank0", "08_checkpoints", "the DDP-wrapped model called by rank 0 alone: its buffer "
      "broadcast waits for the other ranks if the module has buffers")
def ddp_forward_under_rank0(f: Facts, m: Module):
    wrapped = f.ddp_wrapped.get(m.rel, {})
    for c in m.calls:
        if f.g.kind(m, c) != "rank0" or f.collective(m, c):
            continue
        if isinstance(c.func, (ast.Name, ast.Attribute)) and dotted(c.func) in wrapped and \
                f.same_scope(m, c, dotted(c.func), wrapped[dotted(c.func)]):
            yield c, (f"{dotted(c.func)}(...) is the DDP-wrapped model, called by rank 0 alone: with "
                      "broadcast_buffers=True (the default) and a module that has buffers its forward broadcasts them "
                      "and waits for the other ranks (a hang), and with grad on the next backward does — call "
                      f"{dotted(c.func)}.module(...) for rank-0-only evaluation"), "check-by-hand"


@rule("collective-outside-switch", "00_preflight", "the process group is set up only under a distributed switch "
      "(`if args.distributed:`), but a collective runs outside it: the single-process run of the script raises "
      "'Default process group has not been initialized'")
def collective_outside_switch(f: Facts, m: Module):
    inits = [(mm, c) for mm in f.p.related(m) for c in mm.calls if callee(c) == "init_process_group"]
    if not inits or not all(distributed_switch(mm, c) is not None for mm, c in inits):
        return  # the group exists in every run the script can make
    for c in m.calls:
        if callee(c) not in ("barrier", "all_reduce", "broadcast", "all_gather") or "dist" not in dotted(c.func):
            continue
        if distributed_switch(m, c) is not None or f.g.kind(m, c) is not None or m.enclosing(c) is None and \
                not m.entry:
            continue
        fn = m.enclosing(c)
        if fn is not None and any(distributed_switch(cm, cc) is not None for cm, cc in f.p.callers(m, fn)):
            continue  # the helper is only called under the switch
        if fn is not None and any(isinstance(n, ast.Call) and callee(n) in ("is_initialized", "is_available")
                                  for n in ast.walk(fn)):
            continue  # the helper checks the group itself
        switch = ast.unparse(distributed_switch(*inits[0]))
        yield c, (f"{ast.unparse(c.func)}() runs whether or not `{switch}` set up the process group (line "
                  f"{inits[0][1].lineno}): at two ranks it synchronises, but the "
                  "single-process run of this script raises 'Default process group has not been initialized' — "
                  "put it under the same switch (or `if dist.is_initialized():`)")
