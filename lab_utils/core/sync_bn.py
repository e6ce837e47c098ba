"""A synchronised BatchNorm that runs on CPU with gloo (and anywhere else). Taught in notebooks/07_batchnorm.ipynb.

Why it exists: in training mode BatchNorm normalises with the mean and variance of the batch it sees. Under
DDP each rank sees only its micro-batch, so a 2-rank port normalises over 8 samples where the single run
normalised over 16 — a different forward from step 0. `nn.SyncBatchNorm` fixes that, but only for CUDA
(and XPU/HPU) tensors: on CPU it raises `ValueError` even with gloo (chapter 07 runs it). CI runs on CPU.

`LabSyncBatchNorm` is the same maths as torch's SyncBatchNorm, built from `all_reduce` only:

- forward: each rank sums its input per channel and counts its elements; one all-reduce of (sum, count)
  gives the global mean; each rank then sums its squared deviations *from the global mean*; a second
  all-reduce gives the global (biased) variance. Two passes instead of E[x^2] - E[x]^2, which cancels
  catastrophically when the mean is large compared with the spread. Running stats are updated with the
  global mean and the *unbiased* global variance (q / (n - 1)), as torch does — so every rank's buffers
  are the same bits, whatever `broadcast_buffers` says.
- backward: each rank sums dy and dy * x_hat per channel; one all-reduce of both gives the global sums, and
  dx = w / std * (dy - sum(dy) / n - x_hat * sum(dy * x_hat) / n) is the gradient of the *sum* of all
  ranks' losses w.r.t. this rank's input, exactly as for one BatchNorm over the whole batch. The weight and
  bias gradients returned are the rank's local sums: DDP averages them with every other gradient (torch's
  SyncBatchNorm does the same).

`all_reduce` is pluggable, so the emulated reference (lab_utils/core/emulate.py) runs the *same* function: there
the R emulated ranks are R threads, each with its own model replica, and `RankOrderedSum` adds their
partial sums in rank order — what an all-reduce of two operands does bit for bit (a + b == b + a in IEEE
arithmetic; for more ranks the backend's order may differ, as for gradients).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

AllReduce = Callable[[torch.Tensor], torch.Tensor]  # returns the SUM over ranks of its argument


def process_group_sum(group=None) -> AllReduce | None:
    """A SUM all-reduce over `group` (default: the whole world), or None when there is nothing to sync."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return None

    def all_reduce(t: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)  # DDP: the statistics of every rank
        return t

    return all_reduce


def _local(t: torch.Tensor) -> torch.Tensor:
    return t


class _SyncBatchNormFn(torch.autograd.Function):
    """Training-mode batch norm whose statistics and gradient sums are all-reduced over the ranks."""

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, all_reduce):
        c = x.size(1)
        dims = [0, *range(2, x.dim())]
        shape = [1, c] + [1] * (x.dim() - 2)
        # (sum, count) in one message; the count travels as a float of x's dtype (exact up to 2**24 in fp32).
        summed = all_reduce(torch.cat([x.sum(dims), x.new_full((1,), x.numel() // c)]))
        total = summed[c]
        if total <= 1:
            raise ValueError(f"Expected more than 1 value per channel when training, got {int(total)} in all")
        mean = summed[:c] / total
        xc = x - mean.view(shape)
        sq = all_reduce((xc * xc).sum(dims))  # squared deviations from the *global* mean: no cancellation
        invstd = torch.rsqrt(sq / total + eps)
        x_hat = xc * invstd.view(shape)
        y = x_hat * weight.view(shape) + bias.view(shape) if weight is not None else x_hat
        if running_mean is not None:  # the unbiased global variance, as torch's BatchNorm and SyncBatchNorm
            with torch.no_grad():
                running_mean.mul_(1 - momentum).add_(mean, alpha=momentum)
                running_var.mul_(1 - momentum).add_(sq / (total - 1), alpha=momentum)
        ctx.save_for_backward(x_hat, weight, invstd, total)
        ctx.all_reduce = all_reduce
        return y

    @staticmethod
    def backward(ctx, dy):
        x_hat, weight, invstd, total = ctx.saved_tensors
        c = dy.size(1)
        dims = [0, *range(2, dy.dim())]
        shape = [1, c] + [1] * (dy.dim() - 2)
        sum_dy, sum_dy_xhat = dy.sum(dims), (dy * x_hat).sum(dims)
        # Local sums for the affine parameters: DDP averages these over ranks like any other gradient.
        grad_weight = sum_dy_xhat.clone() if weight is not None and ctx.needs_input_grad[1] else None
        grad_bias = sum_dy.clone() if weight is not None and ctx.needs_input_grad[2] else None
        grad_x = None
        if ctx.needs_input_grad[0]:
            both = ctx.all_reduce(torch.cat([sum_dy, sum_dy_xhat]))  # DDP: every rank's samples shape dx
            mean_dy, mean_dy_xhat = (both[:c] / total).view(shape), (both[c:] / total).view(shape)
            scale = invstd * weight if weight is not None else invstd
            grad_x = (dy - mean_dy - x_hat * mean_dy_xhat) * scale.view(shape)
        return grad_x, grad_weight, grad_bias, None, None, None, None, None


class LabSyncBatchNorm(_BatchNorm):
    """BatchNorm over the union of all ranks' batches, for any device and backend (gloo on CPU included).

    `all_reduce`: a SUM over ranks (None: the default process group when one is initialised, else this
    process alone — then it is plain BatchNorm over the local batch). Eval mode uses the running stats
    and never communicates, as torch's SyncBatchNorm.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, all_reduce: AllReduce | None = None, device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype)
        self.all_reduce = all_reduce

    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {x.dim()}D input)")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(x)
        momentum = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative moving average, as _BatchNorm
                momentum = 1.0 / float(self.num_batches_tracked)
        use_batch_stats = self.training or self.running_mean is None
        if not use_batch_stats:
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0,
                                self.eps)
        all_reduce = self.all_reduce or process_group_sum() or _local
        track = self.training and self.track_running_stats
        return _SyncBatchNormFn.apply(x, self.weight, self.bias, self.running_mean if track else None,
                                      self.running_var if track else None, self.eps, momentum, all_reduce)

    @classmethod
    def convert_sync_batchnorm(cls, module: nn.Module, all_reduce: AllReduce | None = None) -> nn.Module:
        """Every BatchNorm1d/2d/3d in `module` replaced by a LabSyncBatchNorm that shares its parameters and
        buffers (the same tensors: an optimizer built before or after sees the same parameters), like
        `nn.SyncBatchNorm.convert_sync_batchnorm`. Returns the converted module."""
        out = module
        if isinstance(module, cls) and all_reduce is not None:  # already synced: give it this group
            module.all_reduce = all_reduce
        elif isinstance(module, _BatchNorm):
            out = cls(module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats,
                      all_reduce=all_reduce)
            if module.affine:
                with torch.no_grad():
                    out.weight, out.bias = module.weight, module.bias
            out.running_mean, out.running_var = module.running_mean, module.running_var
            out.num_batches_tracked = module.num_batches_tracked
            out.training = module.training
        for name, child in module.named_children():
            out.add_module(name, cls.convert_sync_batchnorm(child, all_reduce))
        return out


def convert(model: nn.Module, sync_bn: str) -> nn.Module:
    """The model with its BatchNorm layers converted as key `sync_bn` says: none | lab | torch."""
    if sync_bn == "lab":
        return LabSyncBatchNorm.convert_sync_batchnorm(model)
    if sync_bn == "torch":  # CUDA only: config.resolve refuses it on CPU before anything launches
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return model


# ------------------------------------------------------------------ the emulated ranks (lab_utils/core/emulate.py)
class RankOrderedSum:
    """The emulation's all-reduce among R threads: each deposits its tensor, all wait, each adds the R tensors
    in rank order. A timeout turns a thread that never arrives (a bug) into an error instead of a hang."""

    def __init__(self, world_size: int, timeout: float = 120.0):
        self.world_size = world_size
        self.slots: list[torch.Tensor | None] = [None] * world_size
        self.barrier = threading.Barrier(world_size, timeout=timeout)

    def for_rank(self, rank: int) -> AllReduce:
        def all_reduce(t: torch.Tensor) -> torch.Tensor:
            self.slots[rank] = t.detach().clone()
            self.barrier.wait()  # every rank has deposited
            total = self.slots[0]
            for r in range(1, self.world_size):
                total = total + self.slots[r]
            self.barrier.wait()  # every rank has read: the slots may be reused by the next call
            return total

        return all_reduce

    def run(self, fn: Callable[[int], object]) -> list:
        """fn(rank) on one thread per rank; their results in rank order. The first exception is re-raised
        (the barrier is broken so the other threads stop waiting)."""
        results: list = [None] * self.world_size
        errors: list[BaseException] = []

        def target(r: int) -> None:
            try:
                # On CUDA the autograd engine runs every backward on ONE worker thread per device, whatever
                # thread called it: rank 0's sync-BN backward would wait at the barrier for rank 1's backward,
                # queued behind it on that same thread (a deadlock, measured on an H200: BrokenBarrierError
                # after the timeout). Off (thread-local), each rank's backward runs on its own thread, as on CPU.
                with torch.autograd.set_multithreading_enabled(False):
                    results[r] = fn(r)
            except BaseException as e:  # noqa: BLE001 - re-raised below on the calling thread
                errors.append(e)
                self.barrier.abort()

        threads = [threading.Thread(target=target, args=(r,), name=f"emulated-rank-{r}") for r in
                   range(self.world_size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        real = [e for e in errors if not isinstance(e, threading.BrokenBarrierError)]
        if errors:
            raise (real or errors)[0]
        return results


# ------------------------------------------------------------------ what chapter 07 reads back
def running_stats(model: nn.Module) -> dict[str, list[float]]:
    """Every BatchNorm running_mean/running_var as a list of floats (exact: float32 -> Python float), for a
    rank's heartbeat, so the per-rank buffers can be compared after a run (only rank 0 writes model.pt)."""
    inner = getattr(model, "module", model)
    return {name: b.detach().double().cpu().tolist() for name, b in inner.named_buffers()
            if name.endswith(("running_mean", "running_var"))}


def rank_buffer_gaps(run_dir) -> dict[str, float]:
    """max over ranks r > 0 of max |rank r's - rank 0's| running stat, per buffer, from the heartbeats."""
    from lab_utils.core.runfiles import read_heartbeats

    beats = read_heartbeats(run_dir)
    ref = beats[0]["running_stats"]
    return {name: max(max(abs(a - b) for a, b in zip(beats[r]["running_stats"][name], ref[name], strict=True))
                      for r in beats if r != 0) for name in ref}


def eval_with_each_rank_buffers(run_dir, n: int = 512) -> dict[int, float]:
    """{rank: eval-mode accuracy on the dataset's first `n` samples} of the saved model (rank 0's weights) with
    that rank's running stats: what an evaluation on every rank would measure."""
    from lab_utils.core import runfiles, workloads

    cfg = runfiles.read_config(run_dir)["config"]
    wl = workloads.build(cfg)
    state = runfiles.load_tensors(run_dir)
    batch = torch.utils.data.default_collate([wl.dataset[i] for i in range(min(n, len(wl.dataset)))])
    out = {}
    for rank, beat in sorted(runfiles.read_heartbeats(run_dir).items()):
        state.update({k: torch.tensor(v, dtype=state[k].dtype) for k, v in beat["running_stats"].items()})
        wl.model.load_state_dict(state)
        wl.model.eval()
        with torch.no_grad():
            out[rank] = float((wl.model(batch["x"]).argmax(1) == batch["y"]).double().mean())
    return out
