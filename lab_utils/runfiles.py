"""The run folder: the one contract between the rank side (scripts/) and everything that reads a run.

Taught in notebooks/01_unchanged.ipynb (metrics, fingerprint) and notebooks/00_preflight.ipynb (heartbeats).
train.py writes a run folder; the launcher, the parity report, the doctor, plots and notebooks read it.
Both sides import *this* module, so a file name or a heartbeat phase is defined once:

    runs/NAME/
      config.json          resolved keys, world size, backend, device, versions, FORMAT_VERSION
      metrics.jsonl        one JSON object per optimizer step (rank 0): loss averaged over ALL ranks, lr,
                           grad_norm, samples, param_hash/param_sum (the fingerprint), elapsed
      model.pt             final weights, no `module.` prefix (torch.load(weights_only=True))
      probe.pt             final model's eval-mode outputs on the probe batch (the parity report's outputs route)
      result.json          steps, final loss, seconds
      progress/rank{r}.json  each rank's heartbeat: step and phase (PHASES), pid, hashes
      launch.json, output.log, logs/   written by the launcher (torchrun's per-rank logs and error files)
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import torch

FORMAT_VERSION = 2  # 2: probe.pt added, grad_norm compared by the parity report

CONFIG, METRICS, MODEL, PROBE, RESULT = "config.json", "metrics.jsonl", "model.pt", "probe.pt", "result.json"
PROGRESS = "progress"
REPO = Path(__file__).resolve().parents[1]


def runs_dir() -> Path:
    """Where run names live: $LAB_RUNS_DIR if set, else runs/ in the repository (read at call time)."""
    return Path(os.environ.get("LAB_RUNS_DIR") or REPO / "runs")

# The phases a rank's heartbeat goes through in one step, in order. The launcher sorts hung ranks by
# (step, phase index): a rank at an earlier phase is the one the others wait for.
PHASES = ("setup", "step start", "forward/backward", "all-reduce loss", "step done", "finished")


# ------------------------------------------------------------------ writing (rank side)
def write_json(obj, path: str | Path) -> None:
    """Write by rename, so a reader never sees half a file."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str))
    os.replace(tmp, path)


def save_atomic(obj, path: str | Path) -> None:
    """torch.save to a temporary name, then rename: a crash mid-write never leaves a half file behind."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


class Heartbeat:
    """progress/rank{r}.json: the step and phase this rank is in. Written by rename, so never half-read."""

    def __init__(self, out_dir: Path, rank: int):
        self.path = Path(out_dir) / PROGRESS / f"rank{rank}.json"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.state = {"rank": rank, "pid": os.getpid()}

    def beat(self, **fields) -> None:
        phase = fields.get("phase")
        if phase is not None and phase not in PHASES:
            raise ValueError(f"heartbeat phase {phase!r} is not one of runfiles.PHASES")
        self.state.update(fields, time=time.time())
        write_json(self.state, self.path)


class MetricsWriter:
    """Appends one line per step and flushes it, so the launcher's progress bar and a reader of a crashed
    run see every step that finished."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "w")

    def write(self, record: dict) -> None:
        self._f.write(json.dumps(record) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def fingerprint(model: torch.nn.Module) -> tuple[str, float]:
    """(sha256 of every parameter's bytes in name order, first 16 hex; float64 sum of all parameters)."""
    h = hashlib.sha256()
    total = 0.0
    for name, p in sorted(getattr(model, "module", model).named_parameters()):
        t = p.detach().to("cpu", copy=False).contiguous()
        h.update(name.encode())
        h.update(t.numpy().tobytes())
        total += float(t.double().sum())
    return h.hexdigest()[:16], total


def buffer_fingerprint(model: torch.nn.Module) -> str:
    """sha256 (first 16 hex) of every buffer's bytes in name order: `fingerprint` covers parameters."""
    h = hashlib.sha256()
    for name, b in sorted(getattr(model, "module", model).named_buffers()):
        h.update(name.encode())
        h.update(b.detach().to("cpu").contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


# ------------------------------------------------------------------ reading (launcher, analysis, notebooks)
def read_metrics(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / METRICS
    if not path.exists():
        raise FileNotFoundError(f"{run_dir}: no {METRICS} (is this a run folder? did the run start?)")
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def count_metrics(run_dir: str | Path) -> tuple[int, float | None]:
    """(complete lines in metrics.jsonl, the last one's loss): what the progress bar shows."""
    try:
        with open(Path(run_dir) / METRICS) as f:
            lines = f.readlines()
    except FileNotFoundError:
        return 0, None
    complete = [ln for ln in lines if ln.endswith("\n")]
    return len(complete), (json.loads(complete[-1])["loss"] if complete else None)


def read_config(run_dir: str | Path) -> dict:
    """config.json as written by train.py: {"config": keys, "world_size", "backend", "device", ...}."""
    return json.loads((Path(run_dir) / CONFIG).read_text())


def read_heartbeats(run_dir: str | Path) -> dict[int, dict]:
    beats = {}
    for path in sorted((Path(run_dir) / PROGRESS).glob("rank*.json")):
        try:
            beat = json.loads(path.read_text())
            beats[beat["rank"]] = beat
        except (OSError, ValueError, KeyError):
            continue
    return beats


def phase_index(phase: str | None) -> int:
    return PHASES.index(phase) if phase in PHASES else -1


def load_tensors(run_dir: str | Path, name: str = MODEL):
    """model.pt or probe.pt of a run (CPU, weights_only), or None if the run has none."""
    path = Path(run_dir) / name
    if not path.exists():
        return None
    return torch.load(path, map_location="cpu", weights_only=True)
