"""A gradient reduction whose result does not depend on the backend: every rank's bucket, summed in rank order.

Taught in notebooks/12_bitwise.ipynb. DDP's stock communication hook divides each bucket by world_size and
all-reduces it; the backend decides in which order the W operands are added (gloo's ring, NCCL's ring or tree,
chunked differently per message size). Float addition is not associative, so at W > 2 the result can differ
in the last bits from the emulated reference (chapter 01 measured 2.4e-7 at 4 ranks on gloo). With
`grad_reduction=ordered` the lab registers `ordered_allreduce_hook` instead: all-gather every rank's
(divided) bucket, then add them as `((g0 + g1) + g2) + ...` on every rank — exactly what the single-process
reference (`emulate._reduce`) computes. The price: an all-gather moves (W-1)·N elements into every rank
where a ring all-reduce moves ~2(W-1)/W·N, and each rank does the W-1 additions itself
(`ddp-lab bench hook` measures it).

What it promises: the same bits as the emulated reference with the *same* W, on any backend and any W.
What it cannot promise: equality across world sizes. The per-rank gradients themselves are sums over
different micro-batches at different W, so 2 and 4 ranks still differ in the last bits (tier 2).

This module is core (the training side imports it): it imports torch only.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

CHOICES = ("allreduce", "ordered")


def rank_order_sum(tensors: list[torch.Tensor]) -> torch.Tensor:
    """t0 + t1 + ... added left to right: one order, whatever the backend. (torch.stack(...).sum(0) would
    let the kernel pick a pairwise or vectorised order.)"""
    total = tensors[0].clone()
    for t in tensors[1:]:
        total.add_(t)
    return total


def ordered_allreduce_hook(process_group, bucket):  # no annotations: DDP checks them, and this module's
    # `from __future__ import annotations` would turn them into strings it rejects
    """DDP communication hook (`model.register_comm_hook(None, ordered_allreduce_hook)`): the mean of the
    bucket over ranks, as DDP's default hook computes it (divide by W, then sum), but summed in rank order.
    Returns a Future of the reduced bucket."""
    group = process_group if process_group is not None else dist.group.WORLD
    world = dist.get_world_size(group)
    buffer = bucket.buffer().div_(world)
    gathered = [torch.empty_like(buffer) for _ in range(world)]
    fut = dist.all_gather(gathered, buffer, group=group, async_op=True).get_future()

    def add_in_rank_order(_fut) -> torch.Tensor:
        return buffer.copy_(rank_order_sum(gathered))  # DDP copies the returned tensor into the grads

    return fut.then(add_in_rank_order)


def ordered_mean(value: torch.Tensor, world_size: int, group=None) -> torch.Tensor:
    """Mean of a tensor over ranks, summed in rank order (for the logged loss: the same bits as the emulated
    reference's `(l0 + l1 + ...) / W` at any W)."""
    gathered = [torch.empty_like(value) for _ in range(world_size)]
    dist.all_gather(gathered, value.contiguous(), group=group)
    return rank_order_sum(gathered) / world_size


def bytes_per_rank(n_elements: int, element_size: int, world_size: int, how: str) -> float:
    """Bytes one rank receives for one bucket of n elements (bandwidth-optimal algorithms): a ring
    all-reduce 2(W-1)/W·N, an all-gather (W-1)·N. Used by the cost bench; the algorithms NCCL and gloo pick
    may move more, never less."""
    n = n_elements * element_size
    if how == "allreduce":
        return 2 * (world_size - 1) / world_size * n
    if how == "ordered":
        return (world_size - 1) * n
    raise ValueError(f"how={how!r} is not one of {CHOICES}")
