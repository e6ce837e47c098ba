"""metrics.jsonl: one JSON object per optimizer step, written by rank 0; and the parameter fingerprint.

Taught in notebooks/01_unchanged.ipynb. Each line carries the loss averaged over all ranks and a
fingerprint of the parameters after the step, so two runs can be compared step by step, bit for bit,
without saving a checkpoint per step.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch


def fingerprint(model: torch.nn.Module) -> tuple[str, float]:
    """(sha256 of every parameter's bytes in name order, first 16 hex; float64 sum of all parameters)."""
    h = hashlib.sha256()
    total = 0.0
    for name, p in sorted(unwrap(model).named_parameters()):
        t = p.detach().to("cpu", copy=False).contiguous()
        h.update(name.encode())
        h.update(t.numpy().tobytes())
        total += float(t.double().sum())
    return h.hexdigest()[:16], total


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside DDP (`.module`): its state_dict has no `module.` prefix (article §5.2)."""
    return getattr(model, "module", model)


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


def read_metrics(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{run_dir}: no metrics.jsonl (is this a run folder? did the run start?)")
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def save_atomic(obj, path: str | Path) -> None:
    """torch.save to a temporary name, then rename: a crash mid-write never leaves a half file behind."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def write_json(obj, path: str | Path) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str))
    os.replace(tmp, path)
