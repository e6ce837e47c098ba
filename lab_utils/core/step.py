"""One rank's share of an optimizer step: micro-batches, the loss reduction, and where DDP syncs.

Taught in notebooks/01_unchanged.ipynb (the step), 05 (loss reduction) and 06 (accumulation, no_sync).
scripts/train.py calls `rank_step` on every rank; `lab_utils/core/emulate.py` calls the same function once per
emulated rank, so the tier-3 reference runs *this* code, not a copy of it. Lines that exist only because of
DDP are marked `# DDP:`.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from lab_utils.core import token_norm


def to_device(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def micro_backward(wl, model, batch: dict, cfg: dict, world_size: int, token_count: int | None = None
                   ) -> torch.Tensor:
    """Forward + backward of one micro-batch; returns its detached per-element mean loss for the log.

    mean: each micro-batch's mean is divided by grad_accum_steps, and DDP averages over ranks, so the
    gradient is the mean over the global batch — as in the single run. sum: DDP still *averages* over ranks
    (it divides by world_size before its SUM all-reduce), so a sum loss needs x world_size (§3.2).
    token_count (loss_normalization=global_tokens): the step's real tokens over all ranks (token_norm.py).
    """
    reduction = cfg["loss_reduction"] if token_count is None else "sum"
    with torch.autocast(batch["x"].device.type, dtype=torch.bfloat16, enabled=cfg["amp"] == "bf16"):
        loss = wl.loss_fn(model, batch, reduction=reduction, seed=cfg["seed"])
    if token_count is not None:  # DDP: token sum / global count, x world_size to undo DDP's averaging
        loss = loss * (world_size / token_count)
        loss.backward()
        return loss.detach() * cfg["grad_accum_steps"]  # a share of the step's sum; rank_step divides by acc
    if cfg["loss_reduction"] == "mean":
        (loss / cfg["grad_accum_steps"]).backward()
        return loss.detach()
    scale = world_size if cfg["sum_loss_fix"] else 1  # DDP: undo DDP's division by world_size
    (loss * scale).backward()
    return loss.detach() / batch["y"].numel()


def rank_step(wl, model, loader_iter, cfg: dict, device: torch.device, world_size: int,
              before_forward=None, token_count: int | None = None) -> torch.Tensor:
    """One rank's share of a step: grad_accum_steps micro-batches, gradients accumulated locally.

    With no_sync, DDP's all-reduce runs only in the last micro-batch's backward (article §3.3 omits this:
    without it every micro-batch pays a full all-reduce, and the sum is formed in another float order).

    `before_forward(a, broadcast)` tells the emulation when DDP copies rank 0's buffers (broadcast_buffers):
    DDP's `_pre_forward` does it when the *previous* forward was grad-enabled and outside no_sync (its
    `require_forward_param_sync`, true after the wrap). Under no_sync that is before micro-batch 0 of each step
    (the one after the last step's synchronising forward), not before the synchronising micro-batch; without
    no_sync it is before every micro-batch. (A no_grad forward through DDP also clears the flag; this loop has
    none.) Chapter 05's probe measures that schedule on real ranks.
    """
    acc = cfg["grad_accum_steps"]
    if cfg.get("loss_normalization") == "global_tokens":  # count the step's tokens on all ranks first (ch. 05)
        loader_iter, token_count = token_norm.prefetch(loader_iter, cfg, device, token_count)
    loss_sum = torch.zeros((), device=device)
    previous_synced = True  # the last step ended with a synchronising forward (or DDP was just wrapped)
    for a in range(acc):
        batch = token_norm.mask_padding(to_device(next(loader_iter), device), cfg)
        skip_sync = cfg["no_sync"] and a < acc - 1
        if before_forward is not None:
            before_forward(a, broadcast=previous_synced)
        ddp_skip = skip_sync and isinstance(model, DDP)  # the emulation only needs skip_sync's buffer schedule
        with model.no_sync() if ddp_skip else nullcontext():  # DDP: no all-reduce before the last one
            loss_sum += micro_backward(wl, model, batch, cfg, world_size, token_count) / acc
        previous_synced = not skip_sync
    return loss_sum


def tree_step(wl, model, loader_iter, cfg: dict, device: torch.device, tree) -> torch.Tensor:
    """grad_reduction=tree (chapter 12): this rank's grad_accum_steps micro-batches are its contiguous chunks
    of the global batch; `tree` (tree_reduce.TreeAccumulator) keeps each chunk's gradient apart and sums all C
    in one binary tree, the same at any world size. Returns the tree's mean loss (every rank, every W)."""
    def chunk_loss(batch: dict) -> torch.Tensor:  # a chunk's own mean: no /grad_accum_steps, no /W (W-free)
        with torch.autocast(batch["x"].device.type, dtype=torch.bfloat16, enabled=cfg["amp"] == "bf16"):
            return wl.loss_fn(model, batch, reduction="mean", seed=cfg["seed"])

    batches = (token_norm.mask_padding(to_device(next(loader_iter), device), cfg)
               for _ in range(cfg["grad_accum_steps"]))
    return tree.accumulate(batches, chunk_loss)
