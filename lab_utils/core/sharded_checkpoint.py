"""checkpoint_format=sharded (wrap=fsdp2): training checkpoints written by every rank through
torch.distributed.checkpoint (DCP), each rank its own shards, and resharded by DCP on load at any world size.

checkpoint_format=full (the default) gathers the full state to every rank and rank 0 writes one file
(core/checkpoint.py): simple, readable by one process, but every rank briefly holds the whole model and
optimizer, which is what FSDP2 exists to avoid. Here no rank ever holds more than its shards:

- out_dir/checkpoints/step_{k:06d}/ is one DCP folder per checkpoint: `.metadata` and one `__r_0.distcp` file
  per rank (torch's FileSystemWriter), written by `dcp.save({"model", "optimizer"})` on the state dicts of
  torch.distributed.checkpoint.state_dict.get_state_dict (DTensor shards, optimizer state keyed by name), plus
  META, the resume position (checkpoint.resume_position: step, samples, data keys), written by rank 0;
- atomic as a folder: everything is written into step_{k:06d}.tmp/, and rank 0 renames it once dcp.save has
  returned. dcp.save ends in a collective in which rank 0 writes `.metadata` after every rank has reported
  its shards written, so on return the folder is complete. A crash mid-write leaves a `.tmp` folder, which
  resume's search skips: the previous checkpoint is the newest and is whole;
- resume (checkpoint.load_checkpoint, then restore_after_wrap) reads META before the wrap and `dcp.load`s the
  shards after it, into this run's own state dicts: DCP reads each rank's slice whatever world size wrote it.

One process reads the weights from model.pt as before, or converts a DCP folder to one torch.save file with
torch's own converter (`to_torch_save` below, or `python -m torch.distributed.checkpoint.format_utils
dcp_to_torch FOLDER OUT.pt`): {"model": {...}, "optimizer": {...}} with full tensors.

The port bug (fsdp2_bug=rank0_saves_sharded): DDP's rule "only rank 0 saves", kept under FSDP2. Rank 0 alone
torch.saves its model and optimizer state dicts, whose values are its own shards (DTensor.to_local(): what a
rank holds), to the DDP-style file step_{k:06d}.pt. Nothing collective runs on rank 0 alone (state_dict() and
to_local() read local memory), so nothing hangs; the checkpoint silently holds 1/W of the weights, and a
resume from it stops at checkpoint.check_model_shapes with the shapes that show it, on every rank alike.

This module is core (the training side imports it): it imports torch and runfiles only.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.tensor import DTensor

from lab_utils.core import runfiles

CHOICES = ("full", "sharded")
META = "lab_position.pt"  # inside a DCP folder: the resume position, rank 0, torch.save (weights_only-loadable)


def folder(checkpoints: Path, step: int) -> Path:
    """Where the sharded checkpoint taken after `step` optimizer steps lives (a folder)."""
    return Path(checkpoints) / f"step_{step:06d}"


def is_sharded(path: str | Path) -> bool:
    """Whether `path` is a complete sharded checkpoint: a DCP folder (its .metadata) with the lab's META."""
    path = Path(path)
    return path.is_dir() and (path / ".metadata").is_file() and (path / META).is_file()


def save(model: torch.nn.Module, optimizer: torch.optim.Optimizer, position: dict, path: Path,
         is_main: bool) -> None:
    """Every rank calls it (dcp.save is a collective). `position`: what resume needs besides the weights and
    the optimizer (checkpoint.resume_position); rank 0 writes it beside the shards."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    if is_main:  # a .tmp left by a crashed attempt must not mix its old shards with these
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        torch.save(position, tmp / META)
    dist.barrier()  # the folder exists, emptied, before any rank writes into it
    model_state, optim_state = get_state_dict(model, optimizer)  # this rank's shards (DTensors), no gather
    dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=tmp)
    if is_main:  # dcp.save has returned: .metadata is written, so is every rank's shard file
        if path.exists():  # the same step written again (a run resumed in its own folder before this step)
            shutil.rmtree(path)
        os.replace(tmp, path)


def load_position(path: str | Path) -> dict:
    """The resume position stored beside the shards (step, samples, data keys): what resume checks first."""
    return torch.load(Path(path) / META, map_location="cpu", weights_only=True)


def load(model: torch.nn.Module, optimizer: torch.optim.Optimizer, path: str | Path) -> None:
    """Every rank calls it, after the wrap and the optimizer: dcp.load fills this run's own (sharded) state dicts
    from the folder, resharding when another world size wrote it; set_state_dict puts them in place."""
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optim_state}
    dcp.load(state, checkpoint_id=Path(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def to_torch_save(path: str | Path, out: str | Path) -> dict:
    """A sharded checkpoint as one torch.save file for a single process: torch's own converter
    (format_utils.dcp_to_torch_save), no process group needed. Returns the loaded {"model", "optimizer"}."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(Path(path), Path(out))
    return torch.load(out, map_location="cpu", weights_only=True)


def save_rank0_only(model: torch.nn.Module, optimizer: torch.optim.Optimizer, position: dict, path: Path) -> None:
    """BUG (fsdp2_bug=rank0_saves_sharded): called by rank 0 alone, DDP's rule. Its state dicts hold its own
    shards, so the file holds 1/W of every weight and of the optimizer's moments. Local reads only: no
    collective runs on one rank, the others go on to the barrier after the checkpoint and nothing waits."""
    def local(v):
        if isinstance(v, DTensor):
            v = v.to_local()
        return v.detach().cpu().clone() if torch.is_tensor(v) else v

    optim = optimizer.state_dict()
    state = {**position, "model": {k: local(v) for k, v in model.state_dict().items()},
             "optimizer": {"state": {i: {n: local(v) for n, v in s.items()} for i, s in optim["state"].items()},
                           "param_groups": optim["param_groups"]}}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    runfiles.save_atomic(state, path)
