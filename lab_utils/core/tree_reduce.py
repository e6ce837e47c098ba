"""A gradient reduction whose bits do not depend on the world size: the chunk tree (chapter 13).

Taught in notebooks/13_any_world_size.ipynb. Chapter 12's `ordered` hook fixes the order of the W per-rank
sums, but each rank's own sum already depends on W (rank r adds C/W micro-batches, a different partition of
the global batch at every W). `grad_reduction=tree` removes W from the arithmetic altogether:

- the global batch is C = global_batch_size / micro_batch_size *chunks* (micro-batches), C a power of two;
- each chunk's gradient is kept apart (its own backward into fresh grads);
- the step's gradient is a balanced binary tree over the C chunk gradients, leaves in global chunk order,
  each node `left + right`, then divided by C (a power of two: exact);
- rank r owns the contiguous chunks [rC/W, (r+1)C/W) (the global sampler's contiguous layout gives them to
  it), so its local sum is exactly the subtree whose leaves those are; the W subtree roots are the tree's
  nodes at level log2(C/W), and the ranks finish the top levels over the all-gathered roots in rank order.

The tree's shape is the same at any W, W = 1 included; W only decides which of its nodes are computed on
which rank. A rank holds log2(C/W)+1 gradient buffers (`BinaryCounter`: a binary counter over the leaves, a
node merged as soon as its sibling is complete), not C/W.

What is W-invariant besides the gradient: the logged loss (the same tree over the chunks' losses); keyed
dropout and keyed augmentation (keyed by sample); each chunk's BatchNorm statistics (one chunk is one
micro-batch, the same samples at any W). What is not, by itself: BatchNorm's *running* statistics. Torch
updates them after every micro-batch on the rank that ran it, so at W ranks each rank's buffers have seen
C/W chunks and `broadcast_buffers` copies rank 0's (its C/W chunks only). `TreeAccumulator` therefore
freezes torch's update during the chunks (momentum 0), records each chunk's batch mean and variance,
all-gathers them and applies the C updates in chunk order on every rank: the W = 1 sequence, at any W.

The cross-rank part (`tree_comm`): `allgather` gathers the W subtree roots ((W-1)·N bytes received per rank,
`tree_hook`); `halving` computes the same top levels by recursive halving, ranks pairing at distance 1, 2, 4,
then all-gathers the pieces (the ring all-reduce's 2(W-1)/W·N, `tree_halving_hook`). `ddp-lab bench hook`
measures both against the stock all-reduce.

Outside scripts/train.py (a few lines; tests/outside/tree_outside_example.py):

    model = DDP(model)                                  # or the plain model at W = 1
    tree = TreeAccumulator(model, chunks=C)             # registers the comm hook under DDP
    loss = tree.accumulate(my_micro_batches, lambda mb: loss_fn(model, mb))   # grads in p.grad
    optimizer.step()

This module is core (the training side imports it): it imports torch only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.parallel import DistributedDataParallel as DDP

# How the ranks finish the tree's top levels: all-gather the W subtree roots ((W-1)·N bytes per rank), or
# recursive halving then an all-gather of the pieces (2(W-1)/W·N, the ring all-reduce's bytes). Same bits.
COMMS = ("allgather", "halving")


def is_power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def chunk_problem(chunks: int, world_size: int) -> str | None:
    """Why C chunks cannot form the tree at this world size, or None. (config.py words it with the keys.)"""
    if not is_power_of_two(chunks):
        return f"C={chunks} chunks is not a power of two"
    if chunks % world_size:
        return f"C={chunks} chunks is not a multiple of the world size {world_size}"
    return None


def _merge(left: list[torch.Tensor], right: list[torch.Tensor]) -> list[torch.Tensor]:
    """One tree node: left + right, element by element (the only addition the tree does), in place on left."""
    for a, b in zip(left, right, strict=True):
        a.add_(b)
    return left


class BinaryCounter:
    """A balanced binary tree over leaves pushed in order, with at most log2(n)+1 nodes held at once.

    Each stack entry is (level, tensors): a complete subtree of 2**level leaves. Pushing a leaf merges the top
    entries while they have the leaf's level, like carrying in binary addition; after 2**k pushes one entry
    remains, the root. `finish(indices, leaf)` is a push of the *last* leaf restricted to some of the tensors
    (one DDP bucket's parameters): the same additions, in the same order, for those elements only."""

    def __init__(self):
        self.stack: list[tuple[int, list[torch.Tensor]]] = []
        self.pushed = 0

    def push(self, leaf: list[torch.Tensor]) -> None:
        level, node = 0, leaf
        while self.stack and self.stack[-1][0] == level:
            _, left = self.stack.pop()
            node, level = _merge(left, node), level + 1
        self.stack.append((level, node))
        self.pushed += 1

    def root(self) -> list[torch.Tensor]:
        if len(self.stack) != 1:
            raise RuntimeError(f"{self.pushed} leaves do not make one complete tree (not a power of two)")
        return self.stack[0][1]

    def finish(self, indices: list[int], leaf: torch.Tensor) -> torch.Tensor:
        """The root over the pushed leaves plus `leaf` (flat: the tensors at `indices`, concatenated), flat.
        Needs pushed + 1 to be a power of two; leaves the counter as it was (every bucket calls it)."""
        if not is_power_of_two(self.pushed + 1):
            raise RuntimeError(f"{self.pushed} + 1 leaves do not make one complete tree")
        node = leaf.clone()
        for level, (lvl, tensors) in enumerate(reversed(self.stack)):
            assert lvl == level, (lvl, level)  # a counter at 2**k - 1 holds levels k-1 ... 1, 0
            left = torch.cat([tensors[i].reshape(-1) for i in indices]) if indices else node.new_empty(0)
            node = left.add_(node)  # left (earlier chunks) + right: the order push uses
        return node


def tree_sum(values: list[torch.Tensor]) -> torch.Tensor:
    """The balanced tree over `values` (a power-of-two count) in order: ((v0+v1)+(v2+v3))+... ."""
    counter = BinaryCounter()
    for v in values:
        counter.push([v.clone()])
    return counter.root()[0]


def _gather(value: torch.Tensor, world: int, group=None) -> list[torch.Tensor]:
    gathered = [torch.empty_like(value) for _ in range(world)]
    dist.all_gather(gathered, value.contiguous(), group=group)
    return gathered


class TreeHookState:
    """What the comm hook needs: the rank's counter (its chunks but the last), the parameters' positions in
    it, and C (the divisor)."""

    def __init__(self, params: list[torch.Tensor], chunks: int, group=None):
        self.index = {id(p): i for i, p in enumerate(params)}
        self.chunks = chunks
        self.group = group
        self.counter = BinaryCounter()


def tree_hook(state: TreeHookState, bucket):  # no annotations: DDP checks them (see ordered_reduce)
    """DDP communication hook for `grad_reduction=tree`. Runs in the backward of the rank's last chunk: the
    bucket holds that chunk's gradient (the others are in `state.counter`). Finishes the rank's subtree,
    all-gathers the W subtree roots and completes the tree in rank order, then divides by C."""
    group = state.group if state.group is not None else dist.group.WORLD
    world = dist.get_world_size(group)
    buffer = bucket.buffer()
    indices = [state.index[id(p)] for p in bucket.parameters()]
    partial = state.counter.finish(indices, buffer)
    gathered = [torch.empty_like(partial) for _ in range(world)]
    fut = dist.all_gather(gathered, partial, group=group, async_op=True).get_future()

    def top_levels(_fut) -> torch.Tensor:
        return buffer.copy_(tree_sum(gathered).div_(state.chunks))  # DDP copies it into the grads

    return fut.then(top_levels)


def _halving_top_levels(partial: torch.Tensor, group, world: int, rank: int) -> torch.Tensor:
    """The tree's top log2(W) levels over the W subtree roots, as a recursive-halving reduce-scatter then an
    all-gather: ranks pair at distance 1, 2, 4, ...; at distance d a pair splits its current segment in two,
    each keeps one half and sends the other, and the one whose bit d is 0 is the left operand. So every element
    is added as the tree adds it (left subtree + right subtree, level by level), and each rank sends
    N/2 + N/4 + ... = (W-1)/W·N in each phase: the ring's 2(W-1)/W·N in all."""
    if partial.is_cuda and dist.get_backend(group) == "gloo":
        # gloo's send/recv take host memory; an elementwise fp32 add gives the same bits on the host
        return _halving_top_levels(partial.cpu(), group, world, rank).to(partial.device)
    n = partial.numel()
    padded = -(-n // world) * world  # W equal segments (a power of two W halves them exactly)
    work = torch.zeros(padded, dtype=partial.dtype, device=partial.device)
    work[:n] = partial
    lo, length, d = 0, padded, 1
    while d < world:
        half = length // 2
        partner = rank ^ d
        left = rank & d == 0  # this rank's group is the left subtree at this level
        keep, give = (lo, lo + half) if left else (lo + half, lo)
        received = torch.empty(half, dtype=work.dtype, device=work.device)
        ops = [dist.P2POp(dist.isend, work[give:give + half].contiguous(), partner, group),
               dist.P2POp(dist.irecv, received, partner, group)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        mine = work[keep:keep + half]
        work[keep:keep + half] = mine + received if left else received + mine
        lo, length, d = keep, half, d * 2
    pieces = [torch.empty(length, dtype=work.dtype, device=work.device) for _ in range(world)]
    dist.all_gather(pieces, work[lo:lo + length].contiguous(), group=group)
    out = torch.empty_like(work)
    for r, piece in enumerate(pieces):  # rank r's segment: where its halving steps led (from its bits)
        start, size, bit = 0, padded, 1
        while bit < world:
            size //= 2
            start += 0 if r & bit == 0 else size
            bit *= 2
        out[start:start + size] = piece
    return out[:n]


def tree_halving_hook(state: TreeHookState, bucket):  # no annotations: DDP checks them
    """`tree_hook` with the ring's bytes: the same subtree root per rank, then the top levels by recursive
    halving (`_halving_top_levels`) instead of an all-gather of whole roots. Blocking inside the hook (the
    point-to-point rounds depend on each other); returns a completed Future."""
    group = state.group if state.group is not None else dist.group.WORLD
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    buffer = bucket.buffer()
    partial = state.counter.finish([state.index[id(p)] for p in bucket.parameters()], buffer)
    buffer.copy_(_halving_top_levels(partial, group, world, rank).div_(state.chunks))
    fut = torch.futures.Future()
    fut.set_result(buffer)
    return fut


class _ChunkBatchNormStats:
    """BatchNorm running statistics updated in chunk order at any W (see the module docstring).

    During the chunks torch's own update is frozen (momentum 0: running = 0*batch + 1*running, unchanged) and a
    forward pre-hook records each chunk's batch mean and unbiased variance per layer. `apply` gathers every
    rank's records and performs the C updates `running = running*(1-m) + batch*m` in chunk order."""

    def __init__(self, model: torch.nn.Module):
        self.layers = [m for m in model.modules() if isinstance(m, _BatchNorm) and m.track_running_stats]
        for m in self.layers:
            if m.momentum is None:
                raise ValueError("grad_reduction=tree: BatchNorm with momentum=None (a cumulative average) "
                                 "is not supported")
        self.records: list[list[torch.Tensor]] = []  # per chunk: [mean, var] of each layer, in order
        self._current: list[torch.Tensor] | None = None
        for m in self.layers:
            m.register_forward_pre_hook(self._record)

    def _record(self, module, args):
        if self._current is None or not module.training:
            return
        with torch.no_grad():
            x = args[0].detach().float()
            dims = [d for d in range(x.dim()) if d != 1]
            self._current += [x.mean(dims), x.var(dims, unbiased=True)]

    def begin_chunk(self) -> None:
        self._current = []
        self._momenta = [m.momentum for m in self.layers]
        self._tracked = [m.num_batches_tracked.clone() for m in self.layers]
        for m in self.layers:
            m.momentum = 0.0

    def end_chunk(self) -> None:
        for m, momentum, tracked in zip(self.layers, self._momenta, self._tracked, strict=True):
            m.momentum = momentum
            m.num_batches_tracked.copy_(tracked)  # counted once per chunk in apply, the same at any W
        self.records.append(self._current)
        self._current = None

    def apply(self, world: int, distributed: bool) -> None:
        if not self.layers or not self.records:
            self.records = []
            return
        flat = torch.stack([torch.cat(r) for r in self.records])  # [chunks on this rank, features]
        rows = torch.cat(_gather(flat, world)) if distributed else flat  # rank order = chunk order
        sizes = [t.numel() for t in self.records[0]]
        with torch.no_grad():
            for row in rows:
                parts = iter(row.split(sizes))
                for m in self.layers:
                    mean, var = next(parts), next(parts)
                    m.running_mean.mul_(1 - m.momentum).add_(mean.to(m.running_mean.dtype), alpha=m.momentum)
                    m.running_var.mul_(1 - m.momentum).add_(var.to(m.running_var.dtype), alpha=m.momentum)
                    m.num_batches_tracked.add_(1)
        self.records = []


class TreeAccumulator:
    """The chunked step for any model, DDP-wrapped or not: `accumulate` runs this rank's chunks, each
    gradient kept apart, and leaves the tree's mean gradient in every `p.grad`; it returns the tree's mean
    loss (the same bits on every rank and at every W).

    `chunks` is C, the chunk count of the *global* batch; this rank must be given its C/W contiguous chunks
    (rank r: chunks r*C/W ... (r+1)*C/W - 1). Under DDP it registers `tree_hook` on the model (so register no
    other hook) and the model must not use gradient_as_bucket_view (the kept gradients would be views of one
    bucket). Under FSDP2 (`fully_shard`) the tree is formed by fsdp2.TreeReduceScatter, which fsdp2.wrap
    installs: every chunk's backward reduce-scatters, and only the last chunk's output is kept."""

    def __init__(self, model: torch.nn.Module, chunks: int, group=None, comm: str = "allgather"):
        self.model = model
        self.sharded = any(isinstance(m, FSDPModule) for m in model.modules())
        self.distributed = isinstance(model, DDP) or self.sharded
        self.world = dist.get_world_size(group) if self.distributed else 1
        problem = chunk_problem(chunks, self.world)
        if problem:
            raise ValueError(f"grad_reduction=tree: {problem}")
        self.chunks, self.group = chunks, group
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.state = TreeHookState(self.params, chunks, group)
        if self.distributed and not self.sharded:
            if model.gradient_as_bucket_view:
                raise ValueError("grad_reduction=tree needs gradient_as_bucket_view=false")
            if comm not in COMMS:
                raise ValueError(f"tree_comm={comm!r} is not one of {', '.join(COMMS)}")
            model.register_comm_hook(self.state, tree_hook if comm == "allgather" else tree_halving_hook)
        self.bn = _ChunkBatchNormStats(model)

    def _take_grads(self) -> list[torch.Tensor]:
        leaf = []
        for p in self.params:
            leaf.append(p.grad if p.grad is not None else torch.zeros_like(p))
            p.grad = None
        return leaf

    def accumulate(self, micro_batches: Iterable, loss_of: Callable[[object], torch.Tensor]) -> torch.Tensor:
        """Forward + backward of each of this rank's C/W chunks (`loss_of(mb)`: the chunk's mean loss); the
        step's gradient (the tree over all C chunks / C) ends in p.grad. Returns the tree's mean loss."""
        per_rank = self.chunks // self.world
        counter = self.state.counter = BinaryCounter()
        losses = []
        for p in self.params:
            p.grad = None
        batches = iter(micro_batches)
        for c in range(per_rank):
            mb = next(batches)
            last = c == per_rank - 1
            self.bn.begin_chunk()
            if self.sharded:  # FSDP2: each chunk reduce-scattered alone; the earlier chunks' zeros dropped
                for p in self.params:
                    p.grad = None
                loss = loss_of(mb)
                loss.backward()
            elif self.distributed and not last:
                with self.model.no_sync():  # DDP: no communication until the rank's last chunk
                    loss = loss_of(mb)
                    loss.backward()
            else:  # the last chunk's backward runs tree_hook under DDP (the counter holds the others)
                loss = loss_of(mb)
                loss.backward()
            self.bn.end_chunk()
            losses.append(loss.detach().float().reshape(1))
            if not self.distributed or not (self.sharded or last):  # DDP's hook adds the last chunk's
                counter.push(self._take_grads())                       # (TreeReduceScatter keeps its own)
        if not self.distributed:
            for p, g in zip(self.params, counter.root(), strict=True):
                p.grad = g.div_(self.chunks)
        self.bn.apply(self.world, self.distributed)
        return self.mean_loss(losses)

    def mean_loss(self, losses: list[torch.Tensor]) -> torch.Tensor:
        """The tree's mean over the C chunks' losses: this rank's subtree, then the W roots in rank order."""
        partial = tree_sum(losses)
        roots = _gather(partial, self.world, self.group) if self.distributed else [partial]
        return (tree_sum(roots) / self.chunks).reshape(())


def bytes_per_rank(n_elements: int, element_size: int, world_size: int, comm: str = "allgather") -> float:
    """Bytes one rank receives for one bucket of n elements: the all-gather of subtree roots (W-1)·N (as
    `ordered`), recursive halving + all-gather 2(W-1)/W·N (as the stock ring all-reduce)."""
    if comm not in COMMS:
        raise ValueError(f"comm={comm!r} is not one of {', '.join(COMMS)}")
    n = n_elements * element_size
    return (world_size - 1) * n if comm == "allgather" else 2 * (world_size - 1) / world_size * n
