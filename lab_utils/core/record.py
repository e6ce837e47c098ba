"""A recorder for YOUR training script: a few lines make it write the lab's run folder, so `ddp-lab compare`
and `ddp-lab doctor` work on a script the lab did not write (taught in notebooks/10_workflow.ipynb).

    from lab_utils.core import record
    rec = record.Recorder("runs/mine_ddp", model, config={"lr": 1e-3},      # before DDP(model): records each
                          global_batch_size=32, n_samples=len(dataset))     # rank's initial weights
    model = DDP(model, ...)                                                 # (or not: one process)
    for step, (x, y, idx) in enumerate(loader):
        ...; loss.backward(); optimizer.step()
        rec.step(step, loss, model, sample_ids=idx, lr=optimizer.param_groups[0]["lr"])
        optimizer.zero_grad()
    rec.close(model)

What it writes is the contract of lab_utils/core/runfiles.py: config.json (your config + world size, backend,
device, versions, each rank's initial fingerprint), metrics.jsonl (rank 0, one line per optimizer step: the loss
averaged over ALL ranks, the global gradient norm, the samples so far, the parameter fingerprint, the step's
sample ids gathered from every rank), model.pt (rank 0, without `module.`), result.json; probe.pt only when
you pass `probe_inputs` to close (parity copes without it).

Judging your port (chapter 01, lab_utils/analysis/noise.py). Record three runs, not two:
- the single run, the DDP run, and a **float twin** of the single run: the same script, one process, with each
  batch summed as two micro-batches (`micro_batches(batch, 2)` below, `(loss_i / 2).backward()` each). Then
  `ddp-lab doctor runs/single runs/ddp --noise runs/single_twin` judges the port against the float noise the
  twin measured, which a fixed tolerance cannot do once a bigger model or a longer run has amplified it.
- for a **bitwise** proof where the split allows it (a per-sample mean loss, no BatchNorm, no global-RNG draws
  that depend on the batch shape): the single run accumulating W micro-batches laid out as the W ranks get them
  (`like_ranks(batch, W)`: DistributedSampler gives rank r the items r, r+W, r+2W, ... of each global batch),
  each `(loss_r / W).backward()`, logging `sum(loss_r) / W`. For W a power of two that is exactly DDP's
  arithmetic (x 1/W is exact; a sum of two has one order), so `ddp-lab compare` gives tier 3 against W = 2 ranks.
  tests/core/test_record.py proves both on tests/outside/multigpu_torchrun_recorded.py (`micro_batches=`, `layout=`).

Rules it keeps:
- **It does not change your training.** No random draws (the fingerprint is integer arithmetic; the
  gathers are collectives without randomness), no change to gradients, parameters or the model's mode
  except inside close's probe forward, which restores it. tests/core/test_record.py checks the RNG state and the
  final weights with and without it.
- **Make it after `init_process_group`** (it reads the rank and world size from torch.distributed) and before
  `DDP(model)` (so the initial fingerprints are each rank's own, before the wrap copies rank 0's).
- **Every rank calls it.** `step` and `close` are collectives under DDP (the loss all-reduce, the sample id
  all-gather): calling them on rank 0 only hangs the job (chapter 00). Only rank 0 writes.
- **Call `step` after optimizer.step() and before zero_grad():** the gradients are still there (global, after
  DDP's all-reduce) and the fingerprint is the updated weights', as train.py logs them.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from lab_utils.core import checkpoint, runfiles, windows


def micro_batches(batch, n: int) -> list:
    """Split a batch (a tensor, or a tuple/list of tensors sharing dim 0) into `n` contiguous micro-batches: the
    float twin of a single run (the same samples, summed in another order)."""
    parts = [t.tensor_split(n) for t in (batch if isinstance(batch, (tuple, list)) else [batch])]
    return [tuple(p[i] for p in parts) if isinstance(batch, (tuple, list)) else parts[0][i] for i in range(n)]


def like_ranks(batch, world_size: int) -> list:
    """Split a global batch into the micro-batches `world_size` DistributedSampler ranks get from it: rank r
    the items r, r + W, r + 2W, ... (the sampler deals the shuffled indices out round-robin). Accumulating them
    as `(loss_r / W).backward()` in rank order is the emulated W-rank reference of a single-process run."""
    def deal(t):
        return [t[r::world_size] for r in range(world_size)]
    parts = [deal(t) for t in (batch if isinstance(batch, (tuple, list)) else [batch])]
    return [tuple(p[r] for p in parts) if isinstance(batch, (tuple, list)) else parts[0][r]
            for r in range(world_size)]


def _dist() -> tuple[int, int, str | None]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), dist.get_backend()
    return 0, 1, None


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)


def _ids(sample_ids) -> list[int]:
    if sample_ids is None:
        return []
    if isinstance(sample_ids, torch.Tensor):
        return [int(i) for i in sample_ids.detach().reshape(-1).tolist()]
    return [int(i) for i in sample_ids]


class Recorder:
    """Writes a run folder from any training loop; see the module docstring for the three calls."""

    def __init__(self, out_dir: str | Path, model: torch.nn.Module, config: dict | None = None, *,
                 global_batch_size: int | None = None, n_samples: int | None = None, window_every: int = 0):
        if config is not None and not isinstance(config, dict):
            raise TypeError(f"config must be a dict of your settings, not {type(config).__name__}")
        for name, value in (("global_batch_size", global_batch_size), ("n_samples", n_samples)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name}={value!r} must be a positive integer (or None)")
        if not isinstance(window_every, int) or isinstance(window_every, bool) or window_every < 0:
            raise ValueError(f"window_every={window_every!r} must be an integer >= 0 (0: no window states)")
        self.out = Path(out_dir)
        self.window_every = window_every
        self.rank, self.world_size, backend = _dist()
        self.is_main = self.rank == 0
        self._t0 = time.time()
        self._samples = 0
        self._last_loss: float | None = None
        self._steps = 0
        self._grad_device = next((p.device for p in model.parameters()), torch.device("cpu"))  # a fallback
        # Each rank's initial weights (before the wrap, if the Recorder is made before DDP(model)): the doctor
        # reads per-rank seeding from them. One all_gather_object: a collective, no randomness.
        init = runfiles.fingerprint(model)
        by_rank = self._gather(init)
        keys = dict(config or {})
        if global_batch_size is not None:
            keys["global_batch_size"] = global_batch_size
        if n_samples is not None:
            keys["n_samples"] = n_samples
        if window_every:
            keys["window_every"] = window_every  # bookkeeping for the doctor: it changes no result
        self._writer = None
        self._config: dict = {}
        if self.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            for stale in windows.steps(self.out):  # an earlier recording's states: a replay would take them
                windows.state_path(self.out, stale).unlink()
            self._config = {
                "format_version": runfiles.FORMAT_VERSION, "config": keys, "world_size": self.world_size,
                "backend": backend, "device": str(self._grad_device), "torch": torch.__version__,
                "python": sys.version.split()[0], "recorder": "lab_utils.core.record",
                "init_param_hash_by_rank": by_rank,
                "env": {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "TORCH_", "OMP_"))}}
            runfiles.write_json(self._config, self.out / runfiles.CONFIG)
            self._writer = runfiles.MetricsWriter(self.out / runfiles.METRICS)

    def _gather(self, obj) -> list:
        if self.world_size == 1:
            return [obj]
        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def step(self, step: int, loss: torch.Tensor | float, model: torch.nn.Module, sample_ids=None,
             lr: float | None = None, optimizer: torch.optim.Optimizer | None = None,
             extra_state: dict | None = None) -> None:
        """Record one optimizer step. Every rank calls it, after optimizer.step() and before zero_grad().

        With `window_every=k`, rank 0 also saves the window state after every k-th step (`optimizer` is then
        required; `extra_state`: whatever else your step depends on, e.g. {"scheduler": sched.state_dict()})."""
        if self.window_every and optimizer is None:
            raise ValueError(f"Recorder(window_every={self.window_every}) saves the optimizer's state every "
                             f"{self.window_every} steps: pass rec.step(..., optimizer=optimizer)")
        value = loss.detach().float().reshape(()).clone() if isinstance(loss, torch.Tensor) else torch.tensor(
            float(loss))
        if self.world_size > 1:  # the loss of ALL ranks, not rank 0's (article §7.2's logging line, corrected)
            # On the parameters' device now (the Recorder may have been made before model.to(device)): NCCL
            # reduces CUDA tensors only.
            value = value.to(next((p.device for p in model.parameters()), self._grad_device))
            dist.all_reduce(value, op=dist.ReduceOp.SUM)
            value = value / self.world_size
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        # The global gradient norm: after DDP's all-reduce every rank holds the same averaged gradients.
        grad_norm = float(torch.nn.utils.get_total_norm(grads)) if grads else None
        ids = [i for rank_ids in self._gather(_ids(sample_ids)) for i in rank_ids]
        self._samples += len(ids)
        self._last_loss = float(value)
        self._steps = step + 1
        if self._writer is not None:
            device = str(next((p.device for p in model.parameters()), self._grad_device))
            if self._config.get("device") != device:  # made before model.to(device): the training device wins
                self._config["device"] = device
                runfiles.write_json(self._config, self.out / runfiles.CONFIG)
            self._writer.write({"step": int(step), "loss": self._last_loss, "lr": lr, "grad_norm": grad_norm,
                                "samples": self._samples if ids else None, "param_hash": runfiles.fingerprint(model),
                                "sample_ids": sorted(ids) if ids else None,
                                "elapsed": round(time.time() - self._t0, 4)})
            if self.window_every and self._steps % self.window_every == 0:
                self._save_window(model, optimizer, extra_state)

    def _save_window(self, model, optimizer, extra_state: dict | None) -> None:
        """The state after `self._steps` steps, as core/windows.py's replay reads it: the unwrapped model's state
        dict, the optimizer's, the step (your data position) and `extra_state`, CPU copies, written atomically."""
        windows.write(self.out, self._steps, {
            "step": self._steps, "model": checkpoint.cpu_state(model),
            "optimizer": checkpoint.cpu_copy(optimizer.state_dict()),
            "extra_state": checkpoint.cpu_copy(dict(extra_state or {}))})

    def close(self, model: torch.nn.Module, probe_inputs: torch.Tensor | None = None) -> None:
        """Rank 0 writes model.pt (no `module.` prefix), result.json and, given `probe_inputs`, probe.pt (the final
        model's eval-mode outputs on them). Every rank calls it (a barrier keeps the others until it is written).

        On gloo, end the process after `destroy_process_group()` while your DDP model is still alive (`os._exit(0)`
        at the end of main, as tests/outside/multigpu_torchrun_recorded.py's `exit_now`): returning from main first
        hung a rank at exit in 5 of 64 2-rank launches on a busy 2-core box."""
        if self.is_main:
            net = _unwrap(model)
            runfiles.save_atomic({k: v.detach().to("cpu").clone() for k, v in net.state_dict().items()},
                                 self.out / runfiles.MODEL)
            if probe_inputs is not None:
                was_training = net.training
                net.eval()
                with torch.no_grad():
                    outputs = net(probe_inputs.to(next((p.device for p in net.parameters()), self._grad_device)))
                net.train(was_training)
                runfiles.save_atomic({"outputs": outputs.detach().to("cpu").float()}, self.out / runfiles.PROBE)
            runfiles.write_json({"steps": self._steps, "final_loss": self._last_loss,
                                 "seconds": time.time() - self._t0}, self.out / runfiles.RESULT)
            self._writer.close()
        if self.world_size > 1:
            dist.barrier()


def replay(source_run: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, train_step,
           out_dir: str | Path, steps: int, *, extra_load=None, micro: int = 1, config: dict | None = None) -> Path:
    """Your single-process program replayed from a recorded run's window states: the folder that `ddp-lab
    compare/doctor A B --replay REPLAY TWIN` judges B against window by window (lab_utils/analysis/windows.py), so
    a bug that starts late is caught in its first window instead of hiding in the run's grown float noise.

    `train_step(step, micro)` is your single-GPU step. It draws step `step`'s batch itself (the helper calls it
    for steps 0, 1, ..., steps - 1 in order, so an iterator over your single run's batches is its data
    position), zeroes the gradients, runs forward and backward — with micro > 1 as `micro` micro-batches,
    `micro_batches(batch, micro)`, each `(loss_i / micro).backward()` — and optimizer.step(), and returns the
    step's loss (the mean over its micro-batches) or (loss, sample_ids). It leaves the gradients in place: the
    recorder logs their norm, then the helper zeroes them.

    Before each step s > 0 for which `source_run/windows/` holds a state (B recorded with
    `Recorder(..., window_every=k)` and `rec.step(..., optimizer=optimizer)`), it appends to
    out_dir/window_ends.jsonl how far the replay's own weights came from B's, then loads B's weights and optimizer
    state and calls `extra_load(extra_state)` with the dict B passed as rec.step's `extra_state` (a scheduler's
    or GradScaler's state_dict). Step 0 starts from `model`'s own initial weights. Every step is recorded, so
    out_dir becomes a run folder (metrics.jsonl, window_ends.jsonl, model.pt, result.json).

    Make two from the same B: the replay (`micro=1`) and its **float twin** (`micro=2`: the same samples summed
    as two micro-batches, another float order from the same states; its distance from the replay is each
    window's noise). Randomness: B's states hold no generator state, so a step that draws random numbers
    (dropout) must draw them keyed by its samples, or restore its generators through extra_state/extra_load.
    Run it as one process (no process group).
    """
    source, out = Path(source_run), Path(out_dir)
    if not isinstance(micro, int) or micro < 1:
        raise ValueError(f"micro={micro!r} must be a positive integer (2 for the float twin)")
    held = [s for s in windows.steps(source) if 0 < s < steps]
    if not held:
        raise ValueError(f"{source} holds no window states in steps 1..{steps - 1} ({windows.WINDOWS}/: record it "
                         f"with Recorder(..., window_every=k) and rec.step(..., optimizer=optimizer))")
    if _dist()[1] > 1:
        raise ValueError("record.replay runs your single-GPU step in one process: call it without DDP's ranks")
    extra = checkpoint.load_checkpoint(windows.state_path(source, held[0])).get("extra_state") or {}
    if extra and extra_load is None:
        raise ValueError(f"{source}'s window states hold extra_state ({', '.join(map(str, extra))}): pass "
                         f"extra_load=... to restore it at each window start")
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    rec = Recorder(out, model, config={**(config or {}), "replay_from": str(source.resolve()), "micro": micro})
    ends = out / windows.ENDS
    ends.unlink(missing_ok=True)
    for step in range(steps):
        if step in held:
            state = windows.take(source, step, ends, model, optimizer, device)
            if extra_load is not None:
                extra_load(state.get("extra_state") or {})
        out_step = train_step(step, micro)
        loss, ids = out_step if isinstance(out_step, tuple) else (out_step, None)
        rec.step(step, loss, model, sample_ids=ids, lr=optimizer.param_groups[0]["lr"])
        optimizer.zero_grad(set_to_none=True)
    rec.close(model)
    return out
