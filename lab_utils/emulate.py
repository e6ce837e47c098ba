"""The tier-3 reference: one process that computes each global batch exactly as R DDP ranks would.

Taught in notebooks/01_unchanged.ipynb. `emulate_ranks=R` makes scripts/train.py call `emulated_step`
instead of a DDP step: each "rank" runs the real `step.rank_step` on its own micro-batches into fresh
gradients, then they are reduced exactly as DDP does — each divided by R, summed in rank order. For R=2 a
sum of two operands has one possible order, so this matches a real 2-rank run bit for bit. For R>2 the
backend's all-reduce may add in another order (gloo's ring does): then only tier 2 (chapter 11).
"""

from __future__ import annotations

import torch

from .step import rank_step


def emulated_step(wl, model, loader_iters: list, cfg: dict, device: torch.device,
                  rank_buffers: list) -> torch.Tensor:
    """One optimizer step's gradients (left in `p.grad`) and the loss all ranks would log.

    Buffers (BatchNorm running stats) follow DDP too: each rank keeps its own (`rank_buffers[r]`), and with
    broadcast_buffers every synchronising forward first takes rank 0's buffers as they were at that point.
    """
    R = len(loader_iters)
    params = [p for p in model.parameters() if p.requires_grad]
    buffers = list(model.buffers())
    rank0_at_sync: dict[int, list] = {}

    def load(states):
        with torch.no_grad():
            for b, s in zip(buffers, states, strict=True):
                b.copy_(s)

    grads, losses = [], []
    for r, it in enumerate(loader_iters):
        def before_forward(a, sync, r=r):  # DDP's _sync_buffers: broadcast from rank 0 before the forward
            if sync and cfg["broadcast_buffers"]:
                if r == 0:
                    rank0_at_sync[a] = [b.clone() for b in buffers]
                else:
                    load(rank0_at_sync[a])

        for p in params:
            p.grad = None
        load(rank_buffers[r])
        losses.append(rank_step(wl, model, it, cfg, device, world_size=R, before_forward=before_forward))
        rank_buffers[r] = [b.clone() for b in buffers]
        grads.append([p.grad if p.grad is not None else torch.zeros_like(p) for p in params])
    load(rank_buffers[0])  # the model this process saves is rank 0's, as in DDP
    for i, p in enumerate(params):
        total = grads[0][i] / R
        for r in range(1, R):
            total = total + grads[r][i] / R
        p.grad = total
    loss = losses[0]
    for r in range(1, R):
        loss = loss + losses[r]
    return loss / R  # what all_reduce_mean gives: SUM over ranks, then / world_size
