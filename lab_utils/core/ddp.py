"""Wrapping a model in DistributedDataParallel, with the lab's flags. Taught in notebooks/05 (flags).

This is the one place the lab constructs DDP, so every DDP option a chapter teaches is one key away:
find_unused_parameters, the buffer sync (the lab key `broadcast_buffers`, passed to torch as described in
`buffer_sync_kwargs`), gradient_as_bucket_view (chapter 05), and the order-fixed gradient reduction
`grad_reduction=ordered` (chapter 12, a communication hook). What DDP does at wrap time (broadcast rank 0's
parameters and buffers) is chapter 02's lesson.
"""

from __future__ import annotations

import inspect

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from lab_utils.core import ordered_reduce, speed, sync_bn


def wrap(model: torch.nn.Module, cfg: dict, device: torch.device) -> DDP:  # DDP:
    """DDP(model) on `device` with the flags from `cfg`. Wrapping broadcasts rank 0's parameters and buffers.

    sync_bn=lab|torch first swaps every BatchNorm for a synchronised one (chapter 07): same parameters and
    buffers, but training-mode statistics over all ranks' micro-batches instead of this rank's alone."""
    model = sync_bn.convert(model, cfg.get("sync_bn", "none"))  # DDP: BatchNorm over the global batch
    wrapped = DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
                  find_unused_parameters=cfg["find_unused_parameters"],
                  **buffer_sync_kwargs(cfg["broadcast_buffers"]),
                  gradient_as_bucket_view=cfg["gradient_as_bucket_view"],
                  bucket_cap_mb=cfg["bucket_cap_mb"])
    if cfg.get("grad_reduction") == "ordered":  # chapter 12: sum the ranks' buckets in rank order
        wrapped.register_comm_hook(None, ordered_reduce.ordered_allreduce_hook)
    elif cfg.get("overlap") == "none":  # chapter 15: each bucket's all-reduce blocks the backward
        wrapped.register_comm_hook(None, speed.no_overlap_hook)
    return wrapped


def has_forward_sync_buffers(ddp_cls=DDP) -> bool:
    """Whether this torch's DDP takes `forward_sync_buffers` (added in torch 2.13, pytorch/pytorch#178054, which
    deprecated `broadcast_buffers`). Feature-detected from the signature, not from a version number."""
    return "forward_sync_buffers" in inspect.signature(ddp_cls.__init__).parameters


def buffer_sync_kwargs(flag: bool, ddp_cls=DDP) -> dict:
    """The DDP argument for the lab key `broadcast_buffers` (rank 0's buffers before each synchronising forward).

    Where torch has it: `forward_sync_buffers=flag`, the current name; the deprecated `broadcast_buffers` would log
    a FutureWarning on every rank. The two differ at the wrap when false: `forward_sync_buffers=False` still
    copies rank 0's buffers at init, the old `broadcast_buffers=False` does not (chapter 02 measures both). For
    scripts/train.py that difference is moot: every rank builds or loads the same buffers before the wrap.
    On an older torch (the lab supports torch>=2.4): `broadcast_buffers=flag`, the only name it has."""
    return {"forward_sync_buffers" if has_forward_sync_buffers(ddp_cls) else "broadcast_buffers": bool(flag)}


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside DDP (`.module`): its state_dict has no `module.` prefix (article §5.2)."""
    return model.module if isinstance(model, DDP) else model
