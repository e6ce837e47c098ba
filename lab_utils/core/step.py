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

from lab_utils.core import fsdp2, token_norm


def to_device(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


# amp (chapter 11): the autocast dtype of the forward and the loss; fp16 also needs a GradScaler (train.py).
AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(cfg: dict, device: torch.device):
    """torch.autocast for cfg["amp"] (none: disabled, so fp32)."""
    dtype = AMP_DTYPES.get(cfg["amp"], torch.bfloat16)
    return torch.autocast(device.type, dtype=dtype, enabled=cfg["amp"] in AMP_DTYPES)


def backward(loss: torch.Tensor, scaler=None, loss_factor: float = 1.0) -> None:
    """loss.backward(), through GradScaler.scale under amp=fp16 (fp16 gradients would underflow to 0 unscaled);
    loss_factor != 1 only at overflow_step (the logged loss is not multiplied)."""
    if scaler is not None:
        loss = scaler.scale(loss)
    (loss * loss_factor if loss_factor != 1.0 else loss).backward()


def clip(model, max_norm: float, ordered: bool = False) -> torch.Tensor:
    """clip_grad_norm_ over the trainable parameters; returns the total norm before clipping."""
    return fsdp2.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], max_norm, ordered)


def micro_backward(wl, model, batch: dict, cfg: dict, world_size: int, token_count: int | None = None,
                   scaler=None, loss_factor: float = 1.0) -> torch.Tensor:
    """Forward + backward of one micro-batch; returns its detached per-element mean loss for the log.

    mean: each micro-batch's mean is divided by grad_accum_steps, and DDP averages over ranks, so the
    gradient is the mean over the global batch — as in the single run. sum: DDP still *averages* over ranks
    (it divides by world_size before its SUM all-reduce), so a sum loss needs x world_size (§3.2).
    token_count (loss_normalization=global_tokens): the step's real tokens over all ranks (token_norm.py).
    """
    reduction = cfg["loss_reduction"] if token_count is None else "sum"
    with autocast(cfg, batch["x"].device):
        loss = wl.loss_fn(model, batch, reduction=reduction, seed=cfg["seed"])
    if token_count is not None:  # DDP: token sum / global count, x world_size to undo DDP's averaging
        loss = loss * (world_size / token_count)
        backward(loss, scaler, loss_factor)
        logged = loss.detach() * cfg["grad_accum_steps"]  # a share of the step's sum; rank_step divides by acc
    elif cfg["loss_reduction"] == "mean":
        backward(loss / cfg["grad_accum_steps"], scaler, loss_factor)
        logged = loss.detach()
    else:
        scale = world_size if cfg["sum_loss_fix"] else 1  # DDP: undo DDP's division by world_size
        backward(loss * scale, scaler, loss_factor)
        logged = loss.detach() / batch["y"].numel()
    if cfg.get("clip_bug") == "micro_batch":  # BUG (chapter 11): clipped after every micro-batch, not once a step
        clip(model, cfg["grad_clip"])
    return logged


def rank_step(wl, model, loader_iter, cfg: dict, device: torch.device, world_size: int,
              before_forward=None, token_count: int | None = None, scaler=None, loss_factor: float = 1.0
              ) -> torch.Tensor:
    """One rank's share of a step: grad_accum_steps micro-batches, gradients accumulated locally.

    With no_sync, DDP's all-reduce runs only in the last micro-batch's backward (article §3.3 omits this:
    without it every micro-batch pays a full all-reduce, and the sum is formed in another float order).

    `before_forward(a, broadcast)` tells the emulation when DDP copies rank 0's buffers (broadcast_buffers):
    DDP's `_pre_forward` does it when the *previous* forward was grad-enabled and outside no_sync (its
    `require_forward_param_sync`, true after the wrap). Under no_sync that is before micro-batch 0 of each step
    (the one after the last step's synchronising forward), not before the synchronising micro-batch; without
    no_sync it is before every micro-batch. (A no_grad forward through DDP also clears the flag; this loop has
    none.) Chapter 05's probe measures that schedule on real ranks.

    scaler (amp=fp16): every micro-batch's loss goes through scaler.scale; train.py unscales and clips once,
    after the last micro-batch, when the gradients are all-reduced (chapter 11).
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
        if fsdp2.is_sharded(model):  # FSDP2's no_sync: reduce-scatter only in the last micro-batch's backward
            fsdp2.set_gradient_sync(model, not skip_sync, cfg)
        with model.no_sync() if ddp_skip else nullcontext():  # DDP: no all-reduce before the last one
            loss_sum += micro_backward(wl, model, batch, cfg, world_size, token_count, scaler, loss_factor) / acc
            if cfg.get("clip_bug") == "no_sync_window" and a == acc - 2:
                # BUG (chapter 11): clipped inside the no_sync window, so each rank clips its *local* sum of
                # micro-batches 0..acc-2 by its own norm, before the last micro-batch's all-reduce.
                clip(model, cfg["grad_clip"])
        previous_synced = not skip_sync
    return loss_sum


def tree_step(wl, model, loader_iter, cfg: dict, device: torch.device, tree) -> torch.Tensor:
    """grad_reduction=tree (chapter 13): this rank's grad_accum_steps micro-batches are its contiguous chunks
    of the global batch; `tree` (tree_reduce.TreeAccumulator) keeps each chunk's gradient apart and sums all C
    in one binary tree, the same at any world size. Returns the tree's mean loss (every rank, every W)."""
    def chunk_loss(batch: dict) -> torch.Tensor:  # a chunk's own mean: no /grad_accum_steps, no /W (W-free)
        with torch.autocast(batch["x"].device.type, dtype=torch.bfloat16, enabled=cfg["amp"] == "bf16"):
            return wl.loss_fn(model, batch, reduction="mean", seed=cfg["seed"])

    batches = (token_norm.mask_padding(to_device(next(loader_iter), device), cfg)
               for _ in range(cfg["grad_accum_steps"]))
    return tree.accumulate(batches, chunk_loss)
