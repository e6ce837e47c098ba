"""Rank 0's per-step record (metrics.jsonl), with the device-to-host copies batched.

Taught in notebooks/08_checkpoints.ipynb (article §5.1). `.item()` on a CUDA tensor waits for the GPU to
finish every kernel queued so far, so calling it for every logged number every step stalls the host's
kernel queue once per number. StepLog keeps each step's numbers as device tensors and copies them all to
the host in ONE transfer every `sync_every` steps: every step is still recorded (one metrics line per
step), the sync happens once per `sync_every` steps. On CPU there is nothing to wait for: the numbers are
already on the host, and the saving is nil (the notebook measures both).

Resuming: the records kept from before the checkpoint are written first, so metrics.jsonl ends up as the
full per-step record; `elapsed` continues from the last kept record's value (training time, restarts not
counted), and `attempt` says which start of the run wrote each record.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from lab_utils.core import runfiles


class StepLog:
    def __init__(self, path: Path, sync_every: int = 1, log_every: int = 10, total_steps: int = 0,
                 kept: list[dict] | None = None, attempt: int = 0):
        self.writer = runfiles.MetricsWriter(path)
        kept = kept or []
        for record in kept:
            self.writer.write(record)
        self.sync_every, self.log_every, self.total, self.attempt = sync_every, log_every, total_steps, attempt
        self.t0 = time.time() - (kept[-1]["elapsed"] if kept else 0.0)
        self.pending: list[tuple[int, dict, dict]] = []
        self.last: dict | None = kept[-1] if kept else None

    def add(self, step: int, tensors: dict[str, torch.Tensor | None], **values) -> None:
        """tensors: 0-d device tensors (loss, grad_norm, ...; None allowed), copied later; values: host data
        (param_hash may be a runfiles.PendingFingerprint: resolved in the same batched copy)."""
        # wall: the clock time, for timelines across restarts (chapter 12), which `elapsed` deliberately skips
        values.update(step=step, attempt=self.attempt, elapsed=round(time.time() - self.t0, 4),
                      wall=round(time.time(), 4))
        self.pending.append((step, tensors, values))
        if len(self.pending) >= self.sync_every:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        names = [(i, k) for i, (_, t, _) in enumerate(self.pending) for k, v in t.items() if v is not None]
        flat = [self.pending[i][1][k].detach().float().reshape(()) for i, k in names]
        # Parameter fingerprints (runfiles.PendingFingerprint) ride along: int64, so a second stack, same sync.
        prints = [i for i, (_, _, v) in enumerate(self.pending)
                  if isinstance(v.get("param_hash"), runfiles.PendingFingerprint)]
        host = torch.stack(flat).cpu().tolist() if flat else []  # the one device-to-host copy (and sync)
        totals = torch.stack([self.pending[i][2]["param_hash"].total for i in prints]).cpu().tolist() \
            if prints else []
        got = {ik: v for ik, v in zip(names, host, strict=True)}
        hashes = {i: self.pending[i][2]["param_hash"].hex(t) for i, t in zip(prints, totals, strict=True)}
        for i, (step, tensors, values) in enumerate(self.pending):
            record = {"step": step}
            record.update({k: got.get((i, k)) for k in tensors})
            record.update(values)
            if i in hashes:
                record["param_hash"] = hashes[i]
            self.writer.write(record)
            self.last = record
            if step % self.log_every == 0 or step == self.total - 1:
                print(f"[train] step {step + 1}/{self.total} loss {record['loss']:.6f}", flush=True)
        self.pending.clear()

    def close(self) -> None:
        self.flush()
        self.writer.close()
