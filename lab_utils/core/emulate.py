"""The tier-3 reference: one process that computes each global batch exactly as R DDP ranks would.

Taught in notebooks/01_unchanged.ipynb. `emulate_ranks=R` makes scripts/train.py call `emulated_step`
instead of a DDP step: each "rank" runs the real `step.rank_step` on its own micro-batches into fresh
gradients, then they are reduced exactly as DDP does — each divided by R, summed in rank order. For R=2 a
sum of two operands has one possible order, so this matches a real 2-rank run bit for bit. For R>2 the
backend's all-reduce may add in another order (gloo's ring does): then only tier 2 (chapter 12).
"""

from __future__ import annotations

import copy

import torch

from lab_utils.core import sync_bn, token_norm
from lab_utils.core.step import rank_step


def emulated_step(wl, model, loader_iters: list, cfg: dict, device: torch.device,
                  rank_buffers: list, scaler=None, loss_factors: list | None = None) -> torch.Tensor:
    """One optimizer step's gradients (left in `p.grad`) and the loss all ranks would log.

    Buffers (BatchNorm running stats) follow DDP's schedule too: each rank keeps its own (`rank_buffers[r]`),
    and with broadcast_buffers a rank takes rank 0's buffers, as they were at that point, before each forward
    that DDP broadcasts before: the forward after a synchronising one (`step.rank_step` says which). Under
    no_sync accumulation that is micro-batch 0, so rank r >= 1 ends the step with rank 0's buffers updated by
    its own micro-batches. tests/core/test_buffer_sync.py checks every emulated rank's final running stats against
    a real 2-rank run's, bit for bit.

    scaler / loss_factors (amp=fp16, chapter 11): each rank's micro-batch losses go through the same
    GradScaler.scale, and rank r's loss is multiplied by loss_factors[r] (overflow_step), as on real ranks.
    """
    R = len(loader_iters)
    factors = loss_factors or [1.0] * R
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.get("sync_bn", "none") != "none":
        grads, losses = _sync_bn_ranks(wl, model, loader_iters, cfg, device, rank_buffers, scaler, factors)
        return _reduce(params, grads, losses)
    buffers = list(model.buffers())
    rank0_at_sync: dict[int, list] = {}
    token_count = None
    if cfg.get("loss_normalization") == "global_tokens":  # what the DDP ranks all-reduce: all ranks' tokens
        rank_batches = [[next(it) for _ in range(cfg["grad_accum_steps"])] for it in loader_iters]
        loader_iters = [iter(b) for b in rank_batches]
        token_count = token_norm.step_token_count(rank_batches, cfg)

    def load(states):
        with torch.no_grad():
            for b, s in zip(buffers, states, strict=True):
                b.copy_(s)

    grads, losses = [], []
    for r, it in enumerate(loader_iters):
        def before_forward(a, broadcast, r=r):  # DDP's _sync_buffers: broadcast from rank 0 before the forward
            if broadcast and cfg["broadcast_buffers"]:
                if r == 0:
                    rank0_at_sync[a] = [b.clone() for b in buffers]
                else:
                    load(rank0_at_sync[a])

        for p in params:
            p.grad = None
        load(rank_buffers[r])
        losses.append(rank_step(wl, model, it, cfg, device, world_size=R, before_forward=before_forward,
                                token_count=token_count, scaler=scaler, loss_factor=factors[r]))
        rank_buffers[r] = [b.clone() for b in buffers]
        grads.append([p.grad if p.grad is not None else torch.zeros_like(p) for p in params])
    load(rank_buffers[0])  # the model this process saves is rank 0's, as in DDP
    return _reduce(params, grads, losses)


def _reduce(params: list, grads: list[list], losses: list) -> torch.Tensor:
    """DDP's gradient all-reduce (each rank's gradient / R, summed in rank order) into `p.grad`, and the
    loss all ranks log (all_reduce_mean: SUM over ranks, then / world_size)."""
    R = len(grads)
    for i, p in enumerate(params):
        total = grads[0][i] / R
        for r in range(1, R):
            total = total + grads[r][i] / R
        p.grad = total
    loss = losses[0]
    for r in range(1, R):
        loss = loss + losses[r]
    return loss / R  # what all_reduce_mean gives: SUM over ranks, then / world_size


def _sync_bn_ranks(wl, model, loader_iters: list, cfg: dict, device: torch.device, rank_buffers: list,
                   scaler=None, factors=None):
    """Each emulated rank's gradients and loss with synchronised BatchNorm (sync_bn=lab|torch; chapter 07).

    Synced statistics need every rank's activations at each BatchNorm layer, in the forward and again in the
    backward, so the ranks cannot run one after another. Each emulated rank gets its own replica of the model
    (as each DDP rank has its own) and runs the real `rank_step` on its own thread; at every BatchNorm the
    threads meet in `RankOrderedSum`, which adds their partial sums in rank order, as the all-reduce does.
    The synced running stats are the same bits on every rank, so broadcast_buffers has nothing to copy.
    """
    R, acc = len(loader_iters), cfg["grad_accum_steps"]
    # Fetch in rank order on this thread: a global-RNG augmentation must not depend on thread timing.
    batches = [[next(it) for _ in range(acc)] for it in loader_iters]
    group = sync_bn.RankOrderedSum(R)
    replicas = [sync_bn.LabSyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(model), group.for_rank(r))
                for r in range(R)]
    losses = group.run(lambda r: rank_step(wl, replicas[r], iter(batches[r]), cfg, device, world_size=R,
                                           scaler=scaler, loss_factor=factors[r]))
    grads = [[p.grad if p.grad is not None else torch.zeros_like(p)
              for p in replica.parameters() if p.requires_grad] for replica in replicas]
    for r, replica in enumerate(replicas):
        rank_buffers[r] = [b.detach().clone() for b in replica.buffers()]
    with torch.no_grad():  # the model this process saves is rank 0's, as in DDP
        for b, s in zip(model.buffers(), rank_buffers[0], strict=True):
            b.copy_(s)
    return grads, losses
