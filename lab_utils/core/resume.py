"""Resuming a run: which checkpoint, where the data stream continues, and the metrics kept from before.

Taught in notebooks/08_checkpoints.ipynb (what a checkpoint holds: lab_utils/core/checkpoint.py). `resume=`:
- unset (None): start fresh;
- "auto": the newest checkpoint in out_dir/checkpoints, or fresh when there is none. An elastic restart
  (torchrun --max-restarts) starts every rank again in the same out_dir, so "auto" continues the run;
- a checkpoint file, or a run folder (its newest checkpoint): continue another run's checkpoint here.

Atomic writes (checkpoint.write_checkpoint) leave only complete files under the step_*.pt names (a write cut
short leaves step_*.pt.tmp, which the search skips), so "newest by step" is "newest complete". A sharded
checkpoint (checkpoint_format=sharded, core/sharded_checkpoint.py) is a folder step_NNNNNN/, renamed from
step_NNNNNN.tmp/ once complete: the same rule.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from lab_utils.core import runfiles, sharded_checkpoint
from lab_utils.core.checkpoint import CHECKPOINTS

_NAME = re.compile(r"step_(\d{6,})(\.pt)?")  # a file step_NNNNNN.pt, or a sharded checkpoint's folder


def attempt() -> int:
    """Which start of this run this is: torchrun sets TORCHELASTIC_RESTART_COUNT (0 the first time)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))


def newest(folder: str | Path) -> Path | None:
    """The checkpoint with the highest step in `folder` (a checkpoints/ folder or a run folder), or None. When a
    step has both a file and a sharded folder (two formats in one folder), either is that step's state."""
    folder = Path(folder)
    if (folder / CHECKPOINTS).is_dir():
        folder = folder / CHECKPOINTS
    found = [(int(m.group(1)), p) for p in folder.glob("step_*") if (m := _NAME.fullmatch(p.name))
             and (p.is_file() if m.group(2) else sharded_checkpoint.is_sharded(p))]
    return max(found)[1] if found else None


def find(spec: str | None, out_dir: str | Path) -> Path | None:
    """The checkpoint `resume=spec` names (see the module docstring), or None to start fresh."""
    if not spec:
        return None
    if spec == "auto":
        return newest(Path(out_dir) / CHECKPOINTS)
    path = Path(spec)
    if sharded_checkpoint.is_sharded(path):  # a folder that is itself a checkpoint
        return path
    if path.is_dir():
        found = newest(path)
        if found is None:
            raise FileNotFoundError(f"resume={spec}: no step_* checkpoint in that folder")
        return found
    if not path.is_file():
        raise FileNotFoundError(f"resume={spec}: no such checkpoint file or folder")
    return path


def step_of(path: Path, state: dict) -> int:
    """Optimizer steps done at the checkpoint. The article's checkpoint has no step (only the epoch), so for
    it the file name's step says where the loop continues — its data restarts at the epoch's start anyway."""
    if "step" in state:
        return int(state["step"])
    m = _NAME.fullmatch(Path(path).name)
    if m is None:
        raise ValueError(f"{path}: an article-style checkpoint needs a step_NNNNNN.pt name to resume")
    return int(m.group(1))


def check(state: dict, cfg: dict, path: Path) -> None:
    """Refuse a resume whose data position would not mean the same samples."""
    for key in ("global_batch_size", "data_seed", "sampler"):
        if key in state and state[key] != cfg[key]:
            raise ValueError(f"resume={path}: the checkpoint was written with {key}={state[key]}, this run has "
                             f"{key}={cfg[key]}; the data position would point at other samples")


def skip_micro_batches(state: dict, step: int, cfg: dict, n_data: int, layout_world: int) -> int:
    """How many micro-batches each rank's loader must skip to continue where the checkpoint stopped.

    Lab checkpoint: step x grad_accum_steps (see checkpoint.training_state: the step IS the data position, at
    any world size). Article checkpoint: only the epoch is known, so the loader restarts at that epoch's first
    sample, as `for epoch in range(start_epoch, E): sampler.set_epoch(epoch); for batch in loader:` does."""
    if "step" in state:
        return step * cfg["grad_accum_steps"]
    per_rank_epoch = -(-n_data // layout_world)  # DistributedSampler pads each rank to ceil(n / W)
    if cfg["sampler"] != "distributed" or per_rank_epoch % cfg["micro_batch_size"]:
        if state["epoch"] == 0:
            return 0
        raise ValueError("an article-style resume past epoch 0 needs sampler=distributed and an epoch that holds "
                         "whole micro-batches")
    return state["epoch"] * per_rank_epoch // cfg["micro_batch_size"]


def fast_forward(loader_iters: list, n: int) -> None:
    """Draw and drop `n` micro-batches from each loader. The samplers are deterministic streams, so this lands
    exactly where the interrupted run was. It reads the samples it skips: cheap for the lab's datasets; a big
    one would skip in the sampler instead (GlobalBatchSampler(start_step=...) computes any position directly)."""
    for it in loader_iters:
        for _ in range(n):
            next(it)


# The records an interrupted attempt wrote past its last checkpoint: the steps the resumed start does again.
# Kept apart from metrics.jsonl (which holds each step once) so that a timeline can show the lost work.
REDONE = "metrics_redone.jsonl"


def _records(path: Path) -> list[dict]:
    records = []
    for line in path.read_text().splitlines():
        if line.strip() and line.endswith("}"):
            try:
                records.append(json.loads(line))
            except ValueError:  # a line cut short by the crash
                continue
    return records


def kept_metrics(checkpoint: Path, step: int, redone_to: Path | None = None) -> list[dict]:
    """The metrics records before `step` of the run that wrote `checkpoint` (its folder's metrics.jsonl), so
    the resumed run's metrics.jsonl is the full per-step record. Records after the checkpoint (steps the
    interrupted attempt did but did not checkpoint) are dropped: the resumed run does them again.

    redone_to (this run's folder): when the checkpoint is this run's own (an elastic restart, resume=auto),
    the dropped records are appended to its REDONE file first, so they survive the rewrite of metrics.jsonl
    (chapter 12 draws them). A checkpoint of another run leaves that file alone: its steps are not redone here."""
    run = Path(checkpoint).resolve().parent.parent
    path = run / runfiles.METRICS
    if not path.exists():
        return []
    records = _records(path)
    if redone_to is not None and run == Path(redone_to).resolve():
        dropped = [r for r in records if r["step"] >= step]
        with open(run / REDONE, "a") as f:  # append: every restart adds the steps it redoes
            f.writelines(json.dumps(r) + "\n" for r in dropped)
    return [r for r in records if r["step"] < step]


def redone_metrics(run_dir: Path) -> list[dict]:
    """The records of steps an earlier attempt did past its last checkpoint (REDONE), [] when none were."""
    path = Path(run_dir) / REDONE
    return _records(path) if path.exists() else []
