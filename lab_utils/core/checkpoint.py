"""What a run saves of its model, and how it is loaded: the boundary chapter 08 (checkpoints) builds on.

Rules, each a DDP lesson (article §5.2): only rank 0 writes; the state dict is the `.module`'s (no `module.`
prefix), so one device can load it; tensors go to CPU first, so `map_location` is never needed to *read* it;
the write is atomic (temporary name + rename), so a crash mid-write leaves the previous file intact;
loading uses `weights_only=True` (no pickle code runs).
"""

from __future__ import annotations

from pathlib import Path

import torch

from lab_utils.core import fsdp2, runfiles
from lab_utils.core.ddp import unwrap


def cpu_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's full state dict on the CPU, no `module.` prefix. Under FSDP2 a collective (every rank)."""
    if fsdp2.is_sharded(model):
        return fsdp2.full_state(model)
    return {k: v.detach().cpu() for k, v in unwrap(model).state_dict().items()}


def load_optimizer_state(model: torch.nn.Module, optimizer, state: dict) -> None:
    """optimizer.load_state_dict(state); under FSDP2 the full (index-keyed) state is sharded into this rank's
    part, whichever world size or wrap wrote it."""
    if fsdp2.is_sharded(model):
        fsdp2.load_full_optimizer_state(model, optimizer, state)
    else:
        optimizer.load_state_dict(state)


def optimizer_state(model: torch.nn.Module, optimizer) -> dict:
    """The optimizer's state dict on the CPU, as a plain optimizer over model.parameters() holds it. Under
    FSDP2 a collective (every rank): the shards' moments gathered, keyed by parameter index."""
    if fsdp2.is_sharded(model):
        return fsdp2.full_optimizer_state(model, optimizer)
    return cpu_copy(optimizer.state_dict())


def save_final(model: torch.nn.Module, out_dir: str | Path, probe_outputs: torch.Tensor,
               state: dict | None = None) -> None:
    """model.pt (final weights; `state` when the caller gathered them already, as FSDP2 must on every rank)
    and probe.pt (eval outputs on the probe batch), each written atomically."""
    out = Path(out_dir)
    runfiles.save_atomic(state if state is not None else cpu_state(model), out / runfiles.MODEL)
    runfiles.save_atomic({"outputs": probe_outputs.detach().cpu().double()}, out / runfiles.PROBE)


def load_weights(path: str | Path, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    return torch.load(path, map_location=device, weights_only=True)


# ------------------------------------------------------------------ training checkpoints (exact resume)
CHECKPOINTS = "checkpoints"  # out_dir/checkpoints/step_{k:06d}.pt
CKPT_FORMAT = 1


def checkpoint_path(out_dir: str | Path, step: int) -> Path:
    """Where the checkpoint taken after `step` optimizer steps lives."""
    return Path(out_dir) / CHECKPOINTS / f"step_{step:06d}.pt"


def cpu_copy(obj):
    """Every tensor in a nest of dicts/lists/tuples copied to the CPU (plain containers only)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().clone()
    if isinstance(obj, dict):
        return {k: cpu_copy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(cpu_copy(v) for v in obj)
    return obj


def training_state(model, optimizer, step: int, cfg: dict, n_data: int, rank_buffers: list | None = None,
                   style: str = "lab") -> dict:
    """Everything exact resume needs, as plain tensors, ints, floats and lists (loadable with weights_only).

    - model: the `.module`'s state dict (parameters AND buffers: BatchNorm's running stats ride here);
    - optimizer: its state dict (AdamW's moments and step counts), CPU copies;
    - step: optimizer steps done. It is the data position too: every sampler here is a deterministic
      function of (data_seed, rank, world size) and each step consumes exactly grad_accum_steps
      micro-batches per rank, so "after step k" means "sample position k x global_batch_size of the global
      stream" at ANY world size (the union of the ranks' step-k micro-batches is the same global batch;
      chapter 03). Storing the step and the global batch size is storing the data position;
    - no RNG state: with seed_mode=lab nothing draws from a random stream during training. Dropout masks
      and augmentations are keyed by (seed, visit id, site) (chapter 04), so step k+1's randomness is a
      function of the samples step k+1 visits, not of a generator's history. (Learning-rate schedules: the
      lab's lr is constant; a script with a scheduler stores scheduler.state_dict() here too.)
    - rank_buffers: emulate_ranks=R keeps each emulated rank's own buffers; stored so the reference resumes too.

    style="article": only what the article's §5.2 code saves — model, optimizer, epoch.
    """
    if style == "article":
        epoch = step * cfg["global_batch_size"] // n_data  # the epoch it is in; where in it is lost
        return {"model": cpu_state(model), "optimizer": optimizer_state(model, optimizer), "epoch": epoch}
    return {"format": CKPT_FORMAT, "step": step, "samples": step * cfg["global_batch_size"],
            "global_batch_size": cfg["global_batch_size"], "data_seed": cfg["data_seed"],
            "sampler": cfg["sampler"], "model": cpu_state(model), "optimizer": optimizer_state(model, optimizer),
            "rank_buffers": cpu_copy(rank_buffers) if rank_buffers and len(rank_buffers) > 1 else []}


def write_checkpoint(state: dict, path: str | Path, how: str = "atomic", die_midway: bool = False) -> None:
    """atomic: torch.save to path.tmp, then os.replace — a reader (or a resume) never sees half a file, and
    a crash mid-write leaves the previous checkpoint as it was. naive: torch.save(state, path) in place.

    die_midway (fault=kill_in_save): write the first half of the bytes where this mode writes, then SIGKILL
    this process — a real crash in the middle of a checkpoint write, for the chapter's demonstration."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    target = path.with_name(path.name + ".tmp") if how == "atomic" else path
    if die_midway:
        import io
        import os
        import signal

        buf = io.BytesIO()
        torch.save(state, buf)
        with open(target, "wb") as f:
            f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
            f.flush()
            os.fsync(f.fileno())
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "atomic":
        runfiles.save_atomic(state, path)
    else:
        torch.save(state, path)


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu") -> dict:
    """Load a training checkpoint onto `device` (map_location: a checkpoint written from cuda:0 loads on a
    CPU box or on cuda:1), with weights_only=True: only tensors and plain containers are unpickled."""
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except Exception as e:  # a truncated file: say which file, and why it can happen
        raise RuntimeError(f"cannot load checkpoint {path}: {type(e).__name__}: {e} (a write cut short? "
                           f"checkpoint_write=naive leaves half a file when the writer dies)") from e

