"""The run folder: the one contract between the rank side (scripts/) and everything that reads a run.

Taught in notebooks/01_unchanged.ipynb (metrics, fingerprint) and notebooks/00_preflight.ipynb (heartbeats).
train.py writes a run folder; the launcher, the parity report, the doctor, plots and notebooks read it.
Both sides import *this* module, so a file name or a heartbeat phase is defined once:

    runs/NAME/
      config.json          resolved keys, world size, backend, device, versions, FORMAT_VERSION
      metrics.jsonl        one JSON object per optimizer step (rank 0): loss averaged over ALL ranks, lr,
                           grad_norm, samples, param_hash (the fingerprint), elapsed, local_loss (rank 0's
                           own), attempt (TORCHELASTIC_RESTART_COUNT)
      model.pt             final weights, no `module.` prefix (torch.load(weights_only=True))
      probe.pt             final model's eval-mode outputs on the probe batch (the parity report's outputs route)
      result.json          steps, final loss, seconds, resumed_from (step or null), attempt
      checkpoints/step_{k:06d}.pt  training checkpoints (checkpoint_every; lab_utils/core/checkpoint.py, chapter 08)
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
# Window states (core/windows.py) and what a replay of them writes (analysis/windows.py reads both).
WINDOWS, WINDOW_ENDS, REPLAYS = "windows", "window_ends.jsonl", "replays"
PROGRESS = "progress"
REPO = Path(__file__).resolve().parents[2]  # lab_utils/core/runfiles.py
TRAIN = REPO / "scripts" / "train.py"  # the one training script: what a launch runs by default, and the only
# script whose top level the rank zygote runs ahead (lab_utils/launch/zygote.py)


def runs_dir() -> Path:
    """Where run names live: $LAB_RUNS_DIR if set, else runs/ in the repository (read at call time)."""
    return Path(os.environ.get("LAB_RUNS_DIR") or REPO / "runs")

# The phases a rank's heartbeat goes through in one step, in order. The launcher sorts hung ranks by
# (step, phase index): a rank at an earlier phase is the one the others wait for.
PHASES = ("setup", "step start", "forward/backward", "all-reduce loss", "step done", "finished")
STEP_PHASES = PHASES[1:5]  # the beats of every training step (4 file writes a step)


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

    def __init__(self, out_dir: Path, rank: int, step_beats: bool = True):
        self.path = Path(out_dir) / PROGRESS / f"rank{rank}.json"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # The error file names the rank's log folder. It is written here because a rank forked from the zygote
        # (lab_utils/launch/zygote.py) shows the zygote's environment in /proc, not its own.
        self.state = {"rank": rank, "pid": os.getpid(), "error_file": os.environ.get("TORCHELASTIC_ERROR_FILE")}
        # step_beats=False (LAB_STEP_HEARTBEATS=off, set only by `ddp-lab bench scaling`'s "lab overhead off"
        # rows) skips the file writes of the in-step phases, so a benchmark can time what they cost; a hang is
        # then reported at the last beat written. Beats that carry anything else (hashes, stats) still write.
        self.step_beats = step_beats

    def beat(self, **fields) -> None:
        phase = fields.get("phase")
        if phase is not None and phase not in PHASES:
            raise ValueError(f"heartbeat phase {phase!r} is not one of runfiles.PHASES")
        self.state.update(fields, time=time.time())
        if self.step_beats or phase not in STEP_PHASES or set(fields) - {"step", "phase"}:
            write_json(self.state, self.path)


def synced_span(run_dir: Path, warmup: int) -> tuple[dict, dict]:
    """The first and last metrics records, after `warmup` steps, whose `elapsed` was taken right after the
    GPU caught up: benchmarks time the steps between them (ddp-lab bench scaling / hook).
    The host waits for the GPU only when StepLog copies the logged numbers (and the batched parameter
    fingerprints) to the host, every log_sync_every steps; in between a record's clock can run ahead of the
    GPU by up to the kernel queue. The records of the steps right after a copy (step % log_sync_every == 0)
    are the ones taken after a sync. On CPU every record is (there is no queue), and these are a subset."""
    every = read_config(run_dir)["config"]["log_sync_every"]
    synced = [r for r in read_metrics(run_dir) if r["step"] % every == 0 and r["step"] >= warmup - 1]
    if len(synced) < 2:
        raise ValueError(f"{run_dir}: fewer than 2 synced records after {warmup} warm-up steps "
                         f"(log_sync_every={every}): run more steps")
    return synced[0], synced[-1]


def ms_per_step(run_dir: Path, warmup: int = 1) -> float:
    """Mean wall milliseconds per step between the synced records of `synced_span` (the first `warmup` steps,
    start-up and first iterations, left out): chapter 12's cost table and `ddp-lab bench hook`."""
    first, last = synced_span(run_dir, warmup)
    return 1000 * (last["elapsed"] - first["elapsed"]) / (last["step"] - first["step"])


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


_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_MULTIPLIERS: dict[tuple[str, int], torch.Tensor] = {}


def _multipliers(n: int, device: torch.device) -> torch.Tensor:
    """Odd, position-dependent int64 multipliers (cached: the same for every step of a run)."""
    key = (str(device), n)
    if key not in _MULTIPLIERS:
        from lab_utils.core.mix64 import GOLDEN, M1

        signed = lambda u: u - (1 << 64) if u >> 63 else u  # noqa: E731  (the int64 with these 64 bits)
        z = torch.arange(1, n + 1, dtype=torch.int64, device=device) * signed(GOLDEN)
        z = (z ^ (z >> 29)) * signed(M1)
        _MULTIPLIERS.clear()  # one model per process: keep only the current size
        _MULTIPLIERS[key] = z | 1  # odd: a change of any single bit changes the sum
    return _MULTIPLIERS[key]


class PendingFingerprint:
    """A fingerprint whose one device-to-host copy has not happened yet: `total` is the 0-d int64 device sum,
    `structure` the names, shapes and dtypes. StepLog copies many of these to the host in its one batched
    transfer, so fingerprinting every step costs a handful of kernels and no sync of its own."""

    def __init__(self, total: torch.Tensor, structure: str):
        self.total, self.structure = total, structure

    def hex(self, total: int | None = None) -> str:
        """The 16-hex fingerprint; `total`: the sum already copied to the host (else copied here: a sync)."""
        value = int(self.total.cpu()) if total is None else int(total)
        h = hashlib.sha256(value.to_bytes(8, "little", signed=True))
        h.update(self.structure.encode())
        return h.hexdigest()[:16]


def pending_fingerprint(model: torch.nn.Module, whole_only: bool = False) -> PendingFingerprint | None:
    """`fingerprint`'s device half: the position-weighted int64 sum of every parameter's bits, left on the
    device (None for a model without parameters). whole_only: only the parameters this rank holds whole (not
    FSDP2's DTensor shards): what every rank's copy must agree on (`replica_fingerprint`)."""
    named = sorted((getattr(model, "module", model)).named_parameters())
    if whole_only:
        named = [(n, p) for n, p in named if not hasattr(p, "full_tensor")]
    if not named:
        return None
    # An FSDP2 parameter is a DTensor shard: its full value is an all-gather (every rank must call this then)
    full = [(n, p.full_tensor() if hasattr(p, "full_tensor") else p) for n, p in named]
    bits = torch.cat([p.detach().reshape(-1).view(_INT_OF_SIZE[p.element_size()]).to(torch.int64)
                      for _, p in full])
    total = (bits * _multipliers(bits.numel(), bits.device)).sum()
    return PendingFingerprint(total, "".join(f"{name}:{tuple(p.shape)}:{p.dtype};" for name, p in named))


def fingerprint(model: torch.nn.Module) -> str:
    """A 64-bit (16 hex) fingerprint of every parameter's exact bits, in name order, computed on the device.

    Each parameter's bits are read as integers and summed with position-dependent odd multipliers in int64.
    Integer addition is exact and associative, so the result does not depend on the device or on the order
    the device sums in: the same bits give the same fingerprint on CPU and GPU, and any single changed bit
    changes it (several changed bits cancel only by a 1-in-2**64 accident). Why not sha256 of the bytes: that
    copies every parameter to the host each step, which cost 81 ms of a 41 ms workshop step on an H200
    (docs/measured/h200/overhead_sha256_fingerprint.txt). This costs a handful of kernels and one 8-byte
    device-to-host copy (which train.py's StepLog batches with the logged numbers: `pending_fingerprint`).
    """
    pending = pending_fingerprint(model)
    return pending.hex() if pending else hashlib.sha256(b"").hexdigest()[:16]


def replica_fingerprint(model: torch.nn.Module) -> str | None:
    """The fingerprint of the parameters this rank holds whole, with no collective (None when it holds none).
    Every rank's must be equal at the end of a correct run: DDP's ranks hold the same copy; under FSDP2 only a
    parameter outside every fully_shard is whole, and it is updated from this rank's own gradient."""
    pending = pending_fingerprint(model, whole_only=True)
    return pending.hex() if pending else None


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
