"""Window states: a run's full training state every `window_every` steps, so a port can be judged window by window.

Why (lab_utils/analysis/windows.py has the rule): two correct runs drift apart by float order alone, and that
drift grows with the run (its float twins' distance). Judged over the whole run, a bug that starts late hides in
the grown drift ("blind from step N"). Judged from a *shared state*, the drift starts again at the last bit:
`compare` and `doctor` replay run A's program (its keys, one process) from each of run B's window states for
one window, with a float twin of that replay started from the same state, and judge B's steps in that window
against the replay. Every window starts from B's own weights, so its noise stays at the first steps' level and
a bug is caught in the first window it touches, whatever its step.

- A run with `window_every=k` (rank 0) writes `windows/step_{s:06d}.pt` after every step s that is a multiple
  of k: checkpoint.training_state in the lab's style (weights, optimizer, step = data position) plus the
  GradScaler's state under amp=fp16. The data position is the step: the replay reads its own data there.
- A replay (`replay_from=B`) is A's program whose weights, optimizer (and scaler) are set to B's window state
  at the start of every window but the first (window 0 starts from A's own initial weights, so a different
  initialisation still shows). Before it takes B's state it appends how far its own weights came from B's to
  `window_ends.jsonl` (per window: the largest |Δ| and its tensor), for the report.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from lab_utils.core import checkpoint, runfiles, workloads
from lab_utils.core.ddp import unwrap

WINDOWS, ENDS = runfiles.WINDOWS, runfiles.WINDOW_ENDS  # out_dir/windows/step_{s:06d}.pt; a replay's notes
_NAME = re.compile(r"step_(\d{6,})\.pt")


def state_path(out_dir: str | Path, step: int) -> Path:
    return Path(out_dir) / WINDOWS / f"step_{step:06d}.pt"


# At most this many window states per run: past MAX_STATES x window_every steps the windows grow instead (a
# state of the workshop preset is 219 MB: 64 of them are 14 GB). A window that grows past its twin's blind
# step reports the steps it cannot judge as "not judged" (analysis/windows.py), so a longer window is never a
# silent loss of judgement, only of reach.
MAX_STATES = 64


def period(cfg: dict) -> int:
    """Steps per window: window_every, or longer so that a run keeps at most MAX_STATES states (0: off)."""
    if not cfg["window_every"]:
        return 0
    return max(cfg["window_every"], -(-cfg["steps"] // MAX_STATES))


def due(cfg: dict, steps_done: int) -> bool:
    """Whether the state after `steps_done` optimizer steps is a window state."""
    k = period(cfg)
    return bool(k) and steps_done % k == 0


def save(out_dir, steps_done: int, model, optimizer, cfg: dict, n_data: int, rank_buffers=None, scaler=None,
         writer: bool = True) -> None:
    """Write the window state after `steps_done` steps (CPU copies, atomic). Called by rank 0 only, except
    under FSDP2, where gathering the full state is a collective: every rank calls, only the writer writes."""
    state = checkpoint.training_state(model, optimizer, steps_done, cfg, n_data, rank_buffers, style="lab")
    if scaler is not None:
        state["scaler"] = scaler.state_dict()
    if writer:
        write(out_dir, steps_done, state)


def write(out_dir, steps_done: int, state: dict) -> None:
    """Save a window state (CPU tensors and plain containers) atomically where `steps`/`take` find it."""
    path = state_path(out_dir, steps_done)
    path.parent.mkdir(parents=True, exist_ok=True)
    runfiles.save_atomic(state, path)


def steps(run_dir: str | Path) -> list[int]:
    """The steps at which `run_dir` holds a window state, ascending ([] when it has none)."""
    folder = Path(run_dir) / WINDOWS
    found = [int(m.group(1)) for p in folder.glob("step_*.pt") if (m := _NAME.fullmatch(p.name))]
    return sorted(found)


def take(source: str | Path, step: int, ends: str | Path, model, optimizer, device) -> dict:
    """Append to `ends` how far `model`'s weights came from `source`'s window state at `step` (the largest |Δ|
    and its tensor: a replay's window end), then load that state's weights and optimizer; returns the state."""
    state = checkpoint.load_checkpoint(state_path(source, step), device)
    own = unwrap(model).state_dict()
    diffs = {k: float((own[k].double() - v.double()).abs().max()) for k, v in state["model"].items()
             if v.is_floating_point() and v.numel()}
    worst = max(diffs, key=diffs.get) if diffs else None
    with open(ends, "a") as f:
        f.write(json.dumps({"step": step, "max_abs_param_diff": diffs.get(worst, 0.0), "worst": worst}) + "\n")
    unwrap(model).load_state_dict(state["model"])
    own_lr = [g["lr"] for g in optimizer.param_groups]  # the learning rate is the replay's program, not B's state
    optimizer.load_state_dict(state["optimizer"])
    for g, lr in zip(optimizer.param_groups, own_lr, strict=True):
        g["lr"] = lr
    return state


class Replay:
    """A's program set to B's window state at every window start but step 0 (`replay_from=B`)."""

    def __init__(self, source: str | Path, out_dir: str | Path, device: torch.device, nudge: int = 0):
        self.source, self.device, self.nudge = Path(source), device, nudge  # nudge: a nudge_init twin's ulps
        self.steps = set(steps(source)) - {0}
        self.ends = Path(out_dir) / ENDS
        self.ends.unlink(missing_ok=True)

    def snap(self, step: int, model, optimizer, scaler=None, rank_buffers: list | None = None) -> bool:
        """At a window start: note how far this replay's weights came from B's, then take B's state."""
        if step not in self.steps:
            return False
        state = take(self.source, step, self.ends, model, optimizer, self.device)
        if self.nudge:  # a float twin by nudged weights: nudged again at every window start, as at step 0
            workloads.nudge(unwrap(model), self.nudge)
        if scaler is not None and state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
        if rank_buffers is not None and state.get("rank_buffers") and len(state["rank_buffers"]) == len(rank_buffers):
            rank_buffers[:] = state["rank_buffers"]
        return True
