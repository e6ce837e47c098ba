"""A few gloo ranks started from the calling process (a notebook kernel, a test) for a lesson that is one
function, not a script: forked where that is safe, spawned on a box with a GPU; a file rendezvous in a
temporary folder; a deadline after which every rank still running is killed and named; a rank's own traceback
when it fails. Each rank hands back one JSON record through `finish`, which ends the process at once.

Why every rank ends with `finish` (os._exit) and never by returning: returning frees the rank's DDP reducer and
process group, and ~ProcessGroupGloo (run with the GIL) joins gloo's work thread while that thread waits for the
GIL to drop a finished work's Python state (the race distenv.exit_process describes). py-spy showed it: the
destructor in std::thread::join, the work thread in gil_scoped_acquire. Clean clones hung there twice on the
loaded 2-core CI box (chapter 08's eval trap at de6277e, chapter 06's no_sync rule at eae1b52), and the trap hung
in 2 of 13 looped runs under load, so a lesson's ranks never tear down.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path


def finish(out: str, rank: int, record: dict) -> None:
    """Write this rank's record and end the process without tearing down its process groups (module docstring)."""
    _write(Path(out, f"rank{rank}.json"), record)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _write(path: Path, obj: dict) -> None:
    # whole or absent: a peer may be killed mid-write once another rank has failed
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


def _rank_main(rank: int, fn: Callable, world_size: int, init: str, out: str, args: tuple) -> None:
    try:
        fn(rank, world_size, init, out, *args)
    except BaseException:  # noqa: BLE001 -- the parent shows this rank's own traceback
        _fail(out, rank, traceback.format_exc())
    _fail(out, rank, f"{getattr(fn, '__name__', fn)} returned without calling forked_ranks.finish (a returning "
                     "rank can deadlock in gloo's teardown)\n")


def _fail(out: str, rank: int, text: str) -> None:
    # when it failed, on the clock every process shares: a peer waiting in a collective fails right after
    # ("Connection reset by peer"), and the caller must see the rank that failed first, not the lowest one
    _write(Path(out, f"rank{rank}.error"), {"monotonic": time.monotonic(), "traceback": text})
    sys.stderr.flush()
    os._exit(1)


def start_method() -> str:
    """fork where it is safe: the children inherit the caller's imported torch instead of importing it again.
    Not on a box with a GPU: there the first backward in the caller (even a CPU one) starts autograd's
    per-device threads, which cannot cross a fork ("Unable to handle autograd's threading in combination with
    fork-based multiprocessing", measured on an H200 box). Then spawn."""
    import torch

    return "spawn" if torch.cuda.is_available() else "fork"


def run(fn: Callable, world_size: int, args: tuple = (), *, deadline_s: float, what: str) -> list[dict]:
    """Run fn(rank, world_size, init, out, *args) on `world_size` processes; each ends with
    finish(out, rank, record). Returns the records in rank order. Raises TimeoutError naming the ranks still
    running `deadline_s` after the start (they are killed first), and RuntimeError with a failed rank's traceback.
    `what` names the lesson in both."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="forked-ranks-") as out:
        ctx = mp.start_processes(_rank_main, args=(fn, world_size, f"file://{out}/rdzv", out, args),
                                 nprocs=world_size, start_method=start_method(), join=False)
        deadline = time.monotonic() + deadline_s
        try:
            while not all(p.exitcode is not None for p in ctx.processes):
                if time.monotonic() > deadline:
                    stuck = [r for r, p in enumerate(ctx.processes) if p.is_alive()]
                    raise TimeoutError(f"{what}: rank(s) {stuck} still running {deadline_s:g} s after the start; "
                                       "killed")
                failed = [r for r, p in enumerate(ctx.processes) if p.exitcode not in (None, 0)]
                if failed:  # the others may wait for it in a collective: stop them now, not at the deadline
                    break
                time.sleep(0.05)
        finally:
            for p in ctx.processes:  # nothing outlives the call: a stuck or waiting rank is killed and reaped
                if p.is_alive():
                    p.kill()
                p.join()
        errors = {r: json.loads(Path(out, f"rank{r}.error").read_text()) for r in range(world_size)
                  if Path(out, f"rank{r}.error").exists()}
        if errors:
            first = min(errors, key=lambda r: errors[r]["monotonic"])
            after = sorted(set(errors) - {first})
            also = f" (then rank(s) {after}, which were waiting for it)" if after else ""
            raise RuntimeError(f"{what}: rank {first} failed first{also}:\n{errors[first]['traceback']}")
        for r, p in enumerate(ctx.processes):
            if p.exitcode != 0:
                raise RuntimeError(f"{what}: rank {r} ended with exit code {p.exitcode} and no traceback")
        return [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(world_size)]
