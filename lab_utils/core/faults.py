"""Faults a run injects on purpose, so the launcher, the checkpoints and mixed precision can be shown failing
for real: the `fault`, `fault_rank`, `fault_step` and `overflow_step`, `overflow_rank` keys (core/config.py).

scripts/train.py calls one function of this module per fault site and keeps nothing else of it: `inject_fault`
at the start of each step, `overflow_factors` for the step's loss, `kills_in_save` for a checkpoint write.
Taught in notebooks/00_preflight.ipynb and 09_launching.ipynb (crash, hang, kill, abort, ignore_term),
08_checkpoints.ipynb (kill_in_save) and 11_mixed_precision.ipynb (overflow_step). Chapter 09 reads the hung
rank's innermost frame, `inject_fault: time.sleep(3600)`: keep that function name and that line as they are.
"""

from __future__ import annotations

import os
import signal
import time

from lab_utils.core import resume

# overflow_step (chapter 11): the factor on one rank's loss that makes its fp16 gradients overflow to inf.
OVERFLOW_FACTOR = 2.0 ** 100


def inject_fault(cfg: dict, rank: int, step: int) -> None:
    """fault=crash|hang|kill|abort|ignore_term on `fault_rank` at the start of `fault_step`: the launcher
    tests' failures. abort dies by SIGABRT (as a C++ std::terminate does); ignore_term hangs deaf to SIGTERM,
    so only SIGKILL can stop it. First attempt only (chapter 08); fault=kill_in_save fires in the checkpoint
    write instead (kills_in_save)."""
    if cfg["fault"] in ("none", "kill_in_save") or step != cfg["fault_step"] or resume.attempt() > 0:
        return  # an elastic restart (attempt > 0) runs past the fault: it resumes from a checkpoint
    if rank != cfg["fault_rank"]:
        if cfg["fault"] == "abort":  # peers stay out of the collective, so they never see the lost connection
            time.sleep(60)           # and torchrun must SIGTERM them (as a rank blocked in NCCL never notices)
        return
    if cfg["fault"] == "crash":
        raise RuntimeError(f"injected fault: crash on rank {rank} at step {step}")
    if cfg["fault"] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if cfg["fault"] == "abort":
        os.abort()
    if cfg["fault"] == "ignore_term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:  # hang: the other ranks block in the next all-reduce, as with a real deadlock
        time.sleep(3600)


def overflow_factors(cfg: dict, step: int, ranks: int) -> list[float]:
    """Each of `ranks` ranks' loss factor at `step`: OVERFLOW_FACTOR for overflow_rank at overflow_step (its fp16
    gradients overflow before the all-reduce, chapter 11), 1.0 everywhere else."""
    return [OVERFLOW_FACTOR if step == cfg["overflow_step"] and r == cfg["overflow_rank"] else 1.0
            for r in range(ranks)]


def kills_in_save(cfg: dict, step: int) -> bool:
    """fault=kill_in_save: does the checkpoint written after `step` die halfway (checkpoint.write_checkpoint's
    die_midway)? First attempt only, as inject_fault: the restart resumes from the checkpoint before it."""
    return cfg["fault"] == "kill_in_save" and step == cfg["fault_step"] and resume.attempt() == 0
