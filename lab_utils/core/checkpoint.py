"""What a run saves of its model, and how it is loaded: the boundary chapter 08 (checkpoints) builds on.

Rules, each a DDP lesson (article §5.2): only rank 0 writes; the state dict is the `.module`'s (no `module.`
prefix), so one device can load it; tensors go to CPU first, so `map_location` is never needed to *read* it;
the write is atomic (temporary name + rename), so a crash mid-write leaves the previous file intact;
loading uses `weights_only=True` (no pickle code runs).
"""

from __future__ import annotations

from pathlib import Path

import torch

from lab_utils.core import fsdp2, runfiles, sharded_checkpoint
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
    return {**resume_position(step, cfg, rank_buffers), "model": cpu_state(model),
            "optimizer": optimizer_state(model, optimizer)}


def resume_position(step: int, cfg: dict, rank_buffers: list | None = None) -> dict:
    """What a lab checkpoint holds besides the weights and the optimizer (see training_state): the step (= the
    data position), the keys that say which samples it means, the emulated ranks' buffers. The one place this
    is built: the full checkpoint embeds it, the sharded one (core/sharded_checkpoint.py) stores it beside
    its shards."""
    return {"format": CKPT_FORMAT, "step": step, "samples": step * cfg["global_batch_size"],
            "global_batch_size": cfg["global_batch_size"], "data_seed": cfg["data_seed"],
            "sampler": cfg["sampler"],
            "rank_buffers": cpu_copy(rank_buffers) if rank_buffers and len(rank_buffers) > 1 else []}


def save_training_checkpoint(model, optimizer, out_dir, step: int, cfg: dict, rank_buffers: list,
                             is_main: bool) -> None:
    """checkpoint_format=sharded (wrap=fsdp2): every rank calls it. The correct port writes every rank's shards
    through DCP; fsdp2_bug=rank0_saves_sharded has rank 0 alone torch.save its own shards (the bug)."""
    position = resume_position(step, cfg, rank_buffers)
    if cfg["fsdp2_bug"] == "rank0_saves_sharded":
        if is_main:  # BUG: DDP's "only rank 0 saves", but rank 0 holds 1/W of the state
            sharded_checkpoint.save_rank0_only(model, optimizer, position, checkpoint_path(out_dir, step))
        return
    sharded_checkpoint.save(model, optimizer, position, sharded_checkpoint.folder(Path(out_dir) / CHECKPOINTS, step),
                            is_main)


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
    CPU box or on cuda:1), with weights_only=True: only tensors and plain containers are unpickled.
    A sharded checkpoint (a DCP folder): its resume position only, and SHARDED naming the folder; the weights
    and the optimizer are loaded after the wrap (restore_after_wrap)."""
    if sharded_checkpoint.is_sharded(path):
        return {**sharded_checkpoint.load_position(path), SHARDED: str(path)}
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except Exception as e:  # a truncated file: say which file, and why it can happen
        raise RuntimeError(f"cannot load checkpoint {path}: {type(e).__name__}: {e} (a write cut short? "
                           f"checkpoint_write=naive leaves half a file when the writer dies)") from e



SHARDED = "sharded_folder"  # in a loaded state: the DCP folder the weights and optimizer come from


def load_model_state(model: torch.nn.Module, state: dict, path: str | Path, sharded_run: bool) -> None:
    """Before the wrap: a full checkpoint's weights into the plain model (DDP then broadcasts them, fully_shard
    shards them). A sharded one loads after the wrap, and only into a sharded run (wrap=fsdp2 on several ranks;
    any other run is told how to convert it). Shapes are checked first, on every rank alike (the same file, the
    same model), so a wrong file stops every rank here, before any collective, with a message that says what
    the file holds."""
    if SHARDED in state:
        if not sharded_run:
            raise RuntimeError(f"resume={path}: a sharded (torch.distributed.checkpoint) checkpoint loads into "
                               f"wrap=fsdp2 runs of several ranks; for this run convert it first: python -m "
                               f"torch.distributed.checkpoint.format_utils dcp_to_torch {path} OUT.pt")
        return
    check_model_shapes(model, state["model"], path)
    model.load_state_dict(state["model"])


def check_model_shapes(model: torch.nn.Module, weights: dict, path: str | Path) -> None:
    """Refuse a checkpoint whose tensors do not have the model's shapes, naming them. When every tensor is
    what rank 0 of W ranks holds under FSDP2 (fully_shard splits dim 0 as torch.chunk: rank 0 keeps the first
    ceil(n / W) rows), the file is one rank's shards, and the message says so."""
    own = {k: tuple(v.shape) for k, v in model.state_dict().items() if k in weights}
    got = {k: tuple(weights[k].shape) for k in own}
    wrong = [k for k in own if got[k] != own[k]]
    if not wrong:
        return

    def rank0_shard(w: int) -> bool:
        return all(g[1:] == o[1:] and len(g) == len(o) and g[0] == -(-o[0] // w) for g, o in
                   ((got[k], own[k]) for k in own if own[k]))

    world = next((w for w in range(2, 1 + max(o[0] for o in own.values() if o)) if rank0_shard(w)), None)
    k = wrong[0]
    raise RuntimeError(
        f"resume={path}: {len(wrong)} of {len(own)} tensors do not have the model's shape (first: {k} is {got[k]} "
        f"in the checkpoint, {own[k]} in the model)" + (
            f": every tensor is the first 1/{world} of its rows, what rank 0 of {world} FSDP2 ranks holds. The file "
            f"holds rank 0's shards, not the full state: a sharded state dict saved by rank 0 alone (DDP's rule "
            f"kept under FSDP2: fsdp2_bug=rank0_saves_sharded). Save with every rank: checkpoint_format=sharded "
            f"(dcp.save of every rank's shards) or full (the state gathered first)" if world else ""))


def restore_after_wrap(model: torch.nn.Module, optimizer, state: dict) -> None:
    """After the wrap and the optimizer: a sharded checkpoint's weights and optimizer (dcp.load, every rank),
    or a full checkpoint's optimizer state (its weights were loaded before the wrap)."""
    if SHARDED in state:
        sharded_checkpoint.load(model, optimizer, state[SHARDED])
    else:
        load_optimizer_state(model, optimizer, state["optimizer"])
