"""FSDP2 (`wrap=fsdp2`): torch's `fully_shard` instead of DDP, with the same results where DDP has them.

DDP keeps a full copy of the weights on every rank and all-reduces the gradients; FSDP2 keeps 1/W of each
parameter (a DTensor shard) on each rank, all-gathers a block's weights before its forward and backward, and
reduce-scatters its gradients, so each rank's optimizer updates its own shard. The arithmetic a port must keep
is the same as DDP's: the mean of the ranks' gradients.

- grad_reduction=allreduce: stock FSDP2. The backend's reduce-scatter picks the order in which the W
  gradients are added, as DDP's all-reduce does: the same bits as DDP at 2 ranks, other last bits at 4
  (a prototype measured 6e-8 on CPU gloo: shared/reviews/fsdp2_ordered_proto.out). Judged by the float twins.
- grad_reduction=ordered: `OrderedReduceScatter` divides by W, all-gathers every rank's gradient and adds
  them as ((g0 + g1) + g2) + ..., exactly as chapter 12's DDP hook and the emulated reference do, so the run
  has the same bits as `emulate_ranks=W` and as ordered DDP.
- grad_reduction=tree: `TreeReduceScatter` sums nothing in the backward. Every chunk (micro-batch) is reduce-
  scattered on its own; each rank receives its shard of every rank's chunk gradient and keeps them apart, in
  one binary counter per source rank (rank r's contiguous chunks); at the last chunk it finishes the W subtrees
  and the top levels in rank order: chapter 13's one tree over all C chunks, the bits of one process at any W.
  The price: C/W reduce-scatters a step instead of one (no no_sync window), and W·log2(C/W)+W shard buffers.

- fsdp2_mp=bf16: FSDP2's MixedPrecisionPolicy (param_dtype=bf16, reduce_dtype=fp32): other arithmetic than
  the fp32 single run, judged (tier 1 against the fp32 emulation on the toy), not promised.

What differs from DDP and matters here: fully_shard does NOT broadcast rank 0's weights (every rank must
build the same initial model: seed_mode=lab does; the article's seed + rank would shard four different
models into one), and the full weights exist on no rank, so reading them (fingerprints, model.pt, window
states, the probe's forward) is a collective every rank joins: `full_state` and friends below.

This module is core (the training side imports it): it imports torch only.
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from lab_utils.core.ordered_reduce import rank_order_sum
from lab_utils.core.tree_reduce import BinaryCounter, tree_sum

# torch's interface for a custom reduce-scatter (FSDPModule.set_custom_reduce_scatter takes an instance). It is
# not exported under a public name in torch 2.13; the method that takes it is public.
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter  # noqa: E402  isort: skip

CHOICES = ("ddp", "fsdp2")


class OrderedReduceScatter(ReduceScatter):
    """A reduce-scatter whose sum does not depend on the backend: every rank's (divided) shard for this rank
    arrives by all-to-all and is summed in rank order. The same bytes as a ring reduce-scatter; the W-1
    additions run here instead of in the backend."""

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        world = dist.get_world_size(group)
        # FSDP2 asks for AVG in fp32/bf16 (divide, then sum: DDP's default hook divides first too)
        if op == dist.ReduceOp.AVG:
            input_tensor = input_tensor / world
        elif op != dist.ReduceOp.SUM:
            raise ValueError(f"grad_reduction=ordered: FSDP2 asked for reduce op {op}; only AVG and SUM are "
                             f"ordered here (amp=fp16 is refused for wrap=fsdp2)")
        # Each rank needs only its own shard of every rank's gradient: an all-to-all sends shard j to rank j,
        # (W-1)/W of the gradient bytes, as a ring reduce-scatter moves; the sum is then formed here, in rank order.
        received = torch.empty_like(input_tensor)
        dist.all_to_all_single(received, input_tensor.contiguous(), group=group)
        n = output_tensor.numel()
        output_tensor.view(-1).copy_(rank_order_sum(list(received.view(-1)[: world * n].view(world, n))))
        return None


class TreeReduceScatter(ReduceScatter):
    """grad_reduction=tree under FSDP2 (one instance per fully_shard module). Called once per chunk's backward
    with this rank's unsharded gradient of that chunk: an all-to-all hands every rank its shard of every rank's
    chunk gradient, pushed into the counter of the rank it came from. Rank r's chunks are the contiguous
    r·C/W ... (r+1)·C/W - 1 (the global sampler), so after C/W calls counter r holds the subtree over exactly
    those chunks, and the tree over the W roots is the whole tree, leaves in global chunk order (tree_reduce's
    `BinaryCounter`, as one process and DDP's `tree_hook` form it), divided by C. Earlier calls output zeros;
    TreeAccumulator drops those gradients before the last chunk's backward."""

    def __init__(self, chunks: int):
        self.chunks = chunks
        self.counters: list[BinaryCounter] = []

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        world = dist.get_world_size(group)
        # fp32 and bf16 reduce dtypes ask for AVG; the tree divides once, by C, at the end (AVG's /W would be
        # another rounding per chunk at W = 2, 4, ... and none at W = 1)
        if op not in (dist.ReduceOp.AVG, dist.ReduceOp.SUM):
            raise ValueError(f"grad_reduction=tree: FSDP2 asked for reduce op {op}; only AVG and SUM are summed "
                             f"as a tree here")
        received = torch.empty_like(input_tensor)
        dist.all_to_all_single(received, input_tensor.contiguous(), group=group)
        n = output_tensor.numel()
        if not self.counters:
            self.counters = [BinaryCounter() for _ in range(world)]
        for counter, leaf in zip(self.counters, received.view(-1)[: world * n].view(world, n), strict=True):
            counter.push([leaf.clone()])  # its own buffer: the counter adds into it in place
        if self.counters[0].pushed < self.chunks // world:
            output_tensor.zero_()
            return None
        roots = [counter.root()[0] for counter in self.counters]
        self.counters = []  # the next step starts a new tree
        output_tensor.view(-1).copy_(tree_sum(roots).div_(self.chunks))
        return None


def wrap(model: torch.nn.Module, cfg: dict, device: torch.device) -> torch.nn.Module:  # FSDP2:
    """fully_shard each transformer block, then the root (torchtitan's layout: a block's weights are gathered
    just before it runs and freed after). In place: the model becomes an FSDPModule with DTensor parameters.
    Build the optimizer after this (it must hold the sharded parameters)."""
    # The mesh on the run's own device. fully_shard's default mesh takes CUDA whenever it exists and calls
    # set_device(LOCAL_RANK): a device=cpu run on a one-GPU box died there ("invalid device ordinal", rank 1).
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    # The GPT's logits come out of nn.Linear on a 3-D input, a view, and FSDP2 warns on every forward that an
    # in-place op on it would skip its hook. No code here writes to the logits in place (loss_fn reads them
    # into cross_entropy), so the warning says nothing about these runs: it is silenced for this message only.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module \(FSDPTinyGPT\) returned a view tensor")
    # fsdp2_mp=bf16: each all-gather casts the fp32 shards to bf16 (the forward and backward run on bf16 weights),
    # the gradients go back to fp32 before the reduce-scatter, and the optimizer updates the fp32 shards
    mp = {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)} \
        if cfg.get("fsdp2_mp") == "bf16" else {}
    for block in model.blocks:
        fully_shard(block, mesh=mesh, **mp)
    if cfg.get("fsdp2_bug") != "root_not_wrapped":  # BUG when skipped: the embeddings, final norm and head stay
        fully_shard(model, mesh=mesh, **mp)         # plain tensors, their gradients never reduced over ranks
    if cfg["grad_reduction"] in ("ordered", "tree"):
        chunks = cfg["global_batch_size"] // cfg["micro_batch_size"] if cfg["grad_reduction"] == "tree" else 0
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_custom_reduce_scatter(TreeReduceScatter(chunks) if chunks else OrderedReduceScatter())
    return model


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether fully_shard holds any part of the model (the root, or only its blocks)."""
    return isinstance(model, FSDPModule) or any(isinstance(m, FSDPModule) for m in model.modules())


def set_gradient_sync(model: torch.nn.Module, sync: bool, cfg: dict) -> None:
    """FSDP2's no_sync: with sync=False the backward keeps this rank's full gradient and reduce-scatters
    nothing; the next backward with sync=True reduce-scatters the accumulated sum (as DDP's no_sync).
    fsdp2_bug=sync_left_off: turned off and never back on."""
    if sync and cfg.get("fsdp2_bug") == "sync_left_off":
        return  # BUG: the last micro-batch's backward reduce-scatters nothing either
    for module in model.modules():  # every sharded module (the root too, unless fsdp2_bug=root_not_wrapped)
        if isinstance(module, FSDPModule):
            module.set_requires_gradient_sync(sync, recurse=False)


def local_state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes this rank holds between steps: {"params", "grads", "optimizer"} (a DTensor counts its local shard).
    DDP keeps all of each on every rank; FSDP2 about 1/W (ddp-lab bench fsdp2 prints both)."""
    def size(t):
        t = t.to_local() if isinstance(t, DTensor) else t
        return t.numel() * t.element_size()

    params = list(model.parameters())
    moments = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0]
    return {"params": sum(size(p) for p in params),
            "grads": sum(size(p.grad) for p in params if p.grad is not None),
            "optimizer": sum(size(v) for v in moments)}


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (an all-gather: every rank must call it); any other tensor as it is."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def clip_grad_norm_(params: list[torch.Tensor], max_norm: float, ordered: bool, local_bug: bool = False
                    ) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_; returns the total norm as a plain tensor.

    local_bug (clip_bug=local_shards, an FSDP2 port bug): the norm of this rank's own shards only, and those
    shards clipped by it, as a script does that clips `p.grad.to_local()` (or `p._local_tensor`) by hand:
    every rank scales its part of the gradient by another factor.

    On FSDP2 shards torch computes each rank's partial norm and all-reduces them: the right norm, in another
    float order than the single run (3e-7 apart at 4 ranks on the toy). ordered=True (grad_reduction=ordered,
    which promises the single run's bits): the full gradients are gathered and the norm and the clipping
    computed as one process computes them (get_total_norm, then x min(1, max_norm / (norm + 1e-6)))."""
    if local_bug:  # BUG: no reduction over ranks, so the norm is this rank's shards' alone
        local = [p.grad.to_local() for p in params if p.grad is not None]  # views of the shards: scaled in place
        return _clip(local, torch.nn.utils.get_total_norm(local), max_norm)
    kinds = {isinstance(p, DTensor) for p in params}
    # torch refuses a mix of DTensor and plain parameters (fsdp2_bug=root_not_wrapped): gathered below, it measures
    if not ordered and kinds != {True, False} or kinds == {False}:
        return full_tensor(torch.nn.utils.clip_grad_norm_(params, max_norm))
    grads = [p.grad for p in params if p.grad is not None]
    return _clip(grads, torch.nn.utils.get_total_norm([full_tensor(g) for g in grads]), max_norm)


def _clip(grads: list[torch.Tensor], total: torch.Tensor, max_norm: float) -> torch.Tensor:
    """Scale `grads` by min(1, max_norm / (total + 1e-6)), torch's clipping factor; returns `total`."""
    if not math.isinf(max_norm):
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for g in grads:
            g.mul_(coef.item())  # a DTensor times the same fp32 value: each shard scaled as the full tensor is
    return total


def full_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's state dict on the CPU, the same keys as the single run's (no prefix). A collective:
    every rank calls it; every rank gets the full dict (the toy and workshop models are small)."""
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    # torch gathers what a sharded root holds; with the root left plain (fsdp2_bug=root_not_wrapped) the blocks
    # come back as DTensors, so every value is gathered here too (same order on every rank: a collective)
    return {k: full_tensor(v).detach().cpu() for k, v in state.items()}


def load_full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """The inverse of full_optimizer_state: a plain optimizer's state (keys = indices into model.parameters(),
    as a single run, a DDP run or this module writes it) sharded into this rank's optimizer. Every rank calls
    it with the same full state; torch keeps each rank's slice (set_optimizer_state_dict)."""
    names = [name for name, _ in model.named_parameters()]
    full = {"state": {names[i]: s for i, s in state["state"].items()},
            "param_groups": [dict(g, params=[names[i] for i in g["params"]]) for g in state["param_groups"]]}
    set_optimizer_state_dict(model, optimizer, full, options=StateDictOptions(full_state_dict=True))


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer's state as a plain (unsharded) optimizer over model.parameters() would hold it: keys are
    parameter indices, not names, so the single run's program loads it (window replays). A collective.
    An optimizer over other parameters than the model's (fsdp2_bug=optimizer_before_wrap: built before
    fully_shard replaced them) has no sharded state to gather: its own state dict is what it holds."""
    mine = {id(p) for p in model.parameters()}
    if any(id(p) not in mine for group in optimizer.param_groups for p in group["params"]):
        return {"state": {k: {n: (v.detach().cpu() if torch.is_tensor(v) else v) for n, v in s.items()}
                          for k, s in optimizer.state_dict()["state"].items()},
                "param_groups": optimizer.state_dict()["param_groups"]}
    full = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))
    index: dict[str, int] = {}
    groups = []
    for group in full["param_groups"]:
        ids = [index.setdefault(name, len(index)) for name in group["params"]]
        groups.append(dict(group, params=ids))
    state = {index[name]: {k: (full_tensor(v).detach().cpu() if torch.is_tensor(v) else v) for k, v in s.items()}
             for name, s in full["state"].items()}
    return {"state": state, "param_groups": groups}
