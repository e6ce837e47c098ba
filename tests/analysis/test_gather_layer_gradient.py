"""The real defects `ddp-lab audit` finds in Spijkervet/SimCLR (tests/outside/heldout_labels.json, batch 2) and
facebookresearch/DPR (batch 6): does a
GatherLayer whose backward returns only grads[rank] (no all_reduce) give the single run's gradient?
Lab-written reproduction of the mechanism (not SimCLR's code): 2 ranks on gloo, a linear encoder, an
NT-Xent-style loss over the gathered batch divided by the global count, DDP-averaged gradients, compared with
one process on the whole batch. DPR's form (batch 6): in-batch negatives exchanged as pickled, detached copies with
the rank's own slot put back live, every rank computing the loss over the global batch."""
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

pytestmark = pytest.mark.slow  # every test here starts processes (see tests/conftest.py)


class SliceOnly(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = [torch.zeros_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(out, x)
        return tuple(out)
    @staticmethod
    def backward(ctx, *grads):
        return grads[dist.get_rank()].clone()

class AllReduced(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = [torch.zeros_like(x) for _ in range(dist.get_world_size())]
        dist.all_gather(out, x)
        return tuple(out)
    @staticmethod
    def backward(ctx, *grads):
        g = torch.stack(grads)
        dist.all_reduce(g)
        return g[dist.get_rank()]

def loss_fn(zi, zj, tau=0.5):
    z = F.normalize(torch.cat([zi, zj]), dim=1)
    n = zi.shape[0]
    sim = z @ z.T / tau
    sim.fill_diagonal_(-1e9)
    labels = torch.cat([torch.arange(n, 2 * n), torch.arange(0, n)])
    return F.cross_entropy(sim, labels, reduction="sum") / (2 * n)

def data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(8, 5, generator=g), torch.randn(8, 5, generator=g), torch.randn(4, 5, generator=g)

def single():
    xi, xj, w0 = data()
    w = w0.clone().T.contiguous().requires_grad_(True)
    loss_fn(xi @ w, xj @ w).backward()
    return w.grad

def worker(rank, layer, out, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    xi, xj, w0 = data()
    w = w0.clone().T.contiguous().requires_grad_(True)
    sl = slice(rank * 4, rank * 4 + 4)
    G = {"slice": SliceOnly, "allreduce": AllReduced}[layer]
    zi = torch.cat(G.apply(xi[sl] @ w))
    zj = torch.cat(G.apply(xj[sl] @ w))
    loss_fn(zi, zj).backward()
    dist.all_reduce(w.grad)  # what DDP does to a parameter's gradient: the average over ranks
    w.grad /= 2
    if rank == 0:
        torch.save(w.grad, out)
    dist.destroy_process_group()


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def test_a_gather_layer_that_only_slices_its_gradient_halves_the_step(tmp_path):
    """2 ranks: the slice-only backward gives exactly half the single run's gradient; all-reducing the stacked
    gradients before slicing gives the single run's (to float rounding)."""
    ref = single()
    ratios = {}
    for layer in ("slice", "allreduce"):
        out = str(tmp_path / f"grad_{layer}.pt")
        mp.start_processes(worker, args=(layer, out, _free_port()), nprocs=2, start_method="spawn")
        g = torch.load(out)
        ratios[layer] = float((g * ref).sum() / (ref * ref).sum())
        assert torch.allclose(g, ref * ratios[layer], atol=1e-6), layer
    print(ratios)
    assert abs(ratios["slice"] - 0.5) < 1e-5 and abs(ratios["allreduce"] - 1.0) < 1e-5, ratios


def dpr_loss(q, ctx):
    """In-batch negatives: question i's positive is context i; the mean over every question of the batch given."""
    return F.nll_loss(F.log_softmax(q @ ctx.T, dim=1), torch.arange(q.shape[0]))

def single_dpr():
    xq, xc, w0 = data()
    w = w0.clone().T.contiguous().requires_grad_(True)
    dpr_loss(xq @ w, xc @ w).backward()
    return w.grad

def worker_objects(rank, scale, out, port):
    """DPR's exchange (train_dense_encoder._calc_loss at a31212d, lab-written): detached CPU copies through a
    pickling all-gather, this rank's own slot replaced by its live tensors, the global loss on every rank."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    xq, xc, w0 = data()
    w = w0.clone().T.contiguous().requires_grad_(True)
    sl = slice(rank * 4, rank * 4 + 4)
    q, ctx = xq[sl] @ w, xc[sl] @ w
    got = [None, None]
    dist.all_gather_object(got, [q.detach().clone(), ctx.detach().clone()])
    all_q = torch.cat([q if i == rank else rq for i, (rq, _) in enumerate(got)])
    all_ctx = torch.cat([ctx if i == rank else rc for i, (_, rc) in enumerate(got)])
    (dpr_loss(all_q, all_ctx) * (dist.get_world_size() if scale else 1)).backward()
    dist.all_reduce(w.grad)  # DDP's average over ranks
    w.grad /= 2
    if rank == 0:
        torch.save(w.grad, out)
    dist.destroy_process_group()


def test_detached_object_gather_with_the_own_slot_live_halves_the_step(tmp_path):
    """2 ranks, DPR's exchange: exactly half the single run's gradient; the same loss multiplied by world_size gives
    the single run's (to float rounding)."""
    ref = single_dpr()
    ratios = {}
    for scale in (False, True):
        out = str(tmp_path / f"grad_{scale}.pt")
        mp.start_processes(worker_objects, args=(scale, out, _free_port()), nprocs=2, start_method="spawn")
        g = torch.load(out)
        ratios[scale] = float((g * ref).sum() / (ref * ref).sum())
        assert torch.allclose(g, ref * ratios[scale], atol=1e-6), scale
    print(ratios)
    assert abs(ratios[False] - 0.5) < 1e-5 and abs(ratios[True] - 1.0) < 1e-5, ratios
