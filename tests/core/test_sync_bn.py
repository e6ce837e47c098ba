"""LabSyncBatchNorm (lab_utils/core/sync_bn.py, chapter 07): the maths of one BatchNorm over the whole batch, on real
gloo ranks, in the emulated reference's threads, and against nn.SyncBatchNorm where CUDA allows it."""

import copy

import pytest
import torch
from torch import nn

from lab_utils.analysis import parity
from lab_utils.core import config
from lab_utils.core.runfiles import REPO, read_heartbeats
from lab_utils.core.sync_bn import LabSyncBatchNorm, RankOrderedSum, _SyncBatchNormFn, convert
from lab_utils.launch import launcher, probes

PROBE = REPO / "scripts" / "probes" / "sync_bn_probe.py"


def _bn_pair(make, c, momentum=0.1):
    torch.manual_seed(0)
    ref = make(c, momentum=momentum).double()
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5)
        ref.bias.uniform_(-1, 1)
    return ref, LabSyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(ref))


def _fwd_bwd(bn, x, w):
    x = x.detach().clone().requires_grad_()
    y = bn(x)
    (y * w).sum().backward()
    return y.detach(), x.grad


@pytest.mark.parametrize("make,shape", [(nn.BatchNorm2d, (6, 3, 4, 4)), (nn.BatchNorm1d, (7, 5)),
                                        (nn.BatchNorm1d, (5, 4, 3))])
@pytest.mark.parametrize("momentum", [0.1, None])
def test_one_process_is_batchnorm_over_the_batch(make, shape, momentum):
    ref, lab = _bn_pair(make, shape[1], momentum)
    x = torch.randn(shape, dtype=torch.float64) * 3 + 1e3  # a large mean: E[x^2]-E[x]^2 would cancel here
    w = torch.randn(shape, dtype=torch.float64)
    for _ in range(2):  # twice: the running stats' second update and momentum=None's 1/n factor
        y_ref, dx_ref = _fwd_bwd(ref, x, w)
        y_lab, dx_lab = _fwd_bwd(lab, x, w)
    torch.testing.assert_close(y_lab, y_ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(dx_lab, dx_ref, rtol=0, atol=1e-12)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(lab, name), getattr(ref, name), rtol=1e-14, atol=0)
    ref.eval(), lab.eval()
    torch.testing.assert_close(lab(x), ref(x), rtol=0, atol=1e-12)  # eval: running stats, no sync


def test_gradcheck_through_the_autograd_function():
    """Input, weight and bias gradients of the Function itself (one process: the all-reduce is the identity)."""
    x = torch.randn(4, 3, 2, 2, dtype=torch.float64, requires_grad=True)
    w = (torch.rand(3, dtype=torch.float64) + 0.5).requires_grad_()
    b = torch.randn(3, dtype=torch.float64, requires_grad=True)
    fn = lambda x, w, b: _SyncBatchNormFn.apply(x, w, b, None, None, 1e-5, 0.1, lambda t: t)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, w, b))


def test_convert_swaps_every_batchnorm_and_shares_its_tensors():
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Sequential(nn.Flatten(), nn.BatchNorm1d(4 * 4)))
    before = {id(t) for t in list(model.parameters()) + list(model.buffers())}
    converted = convert(model, "lab")
    kinds = [type(m) for m in converted.modules()]
    assert kinds.count(LabSyncBatchNorm) == 2 and nn.BatchNorm2d not in kinds and nn.BatchNorm1d not in kinds
    assert {id(t) for t in list(converted.parameters()) + list(converted.buffers())} == before
    assert convert(model, "none") is model


def _split_in_threads(ref, lab_template, x, w, world):
    """`world` emulated ranks on threads, each with its own replica and slice, meeting in RankOrderedSum."""
    group = RankOrderedSum(world, timeout=30)
    reps = [LabSyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(lab_template), group.for_rank(r))
            for r in range(world)]
    n = x.shape[0] // world
    outs = group.run(lambda r: _fwd_bwd(reps[r], x[r * n:(r + 1) * n], w[r * n:(r + 1) * n]))
    return torch.cat([o[0] for o in outs]), torch.cat([o[1] for o in outs]), reps


# On CUDA the backward used to deadlock: the autograd engine ran every thread's backward on one per-device
# worker thread, so rank 0's backward waited at the barrier for rank 1's, queued behind it (chapter 07 on two
# H200s). The cuda case is that regression test; it runs wherever CUDA is.
@pytest.mark.parametrize("world,device", [(2, "cpu"), (3, "cpu"), pytest.param(
    2, "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="the deadlock needs CUDA"))])
def test_emulated_ranks_in_threads_equal_one_batchnorm_over_the_whole_batch(world, device):
    ref, lab = (m.to(device) for m in _bn_pair(nn.BatchNorm2d, 3))
    x = torch.randn(6, 3, 4, 4, dtype=torch.float64).to(device) + 2
    w = torch.randn(6, 3, 4, 4, dtype=torch.float64).to(device)
    y, dx, reps = _split_in_threads(ref, lab, x, w, world)
    y_ref, dx_ref = _fwd_bwd(ref, x, w)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(dx, dx_ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(sum(rep.weight.grad for rep in reps), ref.weight.grad, rtol=0, atol=1e-12)
    for rep in reps:  # every rank's running stats: the global ones, the same bits on each rank
        assert torch.equal(rep.running_var, reps[0].running_var)
        torch.testing.assert_close(rep.running_var, ref.running_var, rtol=1e-14, atol=0)
    # Without sync (each rank its own slice), the same check fails: the test can tell the difference.
    plain = _fwd_bwd(copy.deepcopy(ref), x[:2], w[:2])[0]
    assert (plain - y_ref[:2]).abs().max() > 1e-3


def test_a_failing_emulated_rank_raises_instead_of_hanging():
    group = RankOrderedSum(2, timeout=30)

    def fn(r):
        if r == 1:
            raise RuntimeError("rank 1 broke")
        return group.for_rank(0)(torch.ones(1))

    with pytest.raises(RuntimeError, match="rank 1 broke"):
        group.run(fn)


def test_sync_bn_keys_fail_before_launch():
    with pytest.raises(config.ConfigError, match="sync_bn=torch.*use sync_bn=lab"):
        config.resolve(["model=bn_net", "sync_bn=torch", "device=cpu"], 2)
    with pytest.raises(config.ConfigError, match="sync_bn=lab needs model=bn_net"):
        config.resolve(["sync_bn=lab"], 2)
    assert config.resolve(["model=bn_net", "sync_bn=torch", "device=cpu"], 1)["sync_bn"] == "torch"  # no DDP


def _probe(runs_dir, name, device="cpu", mode=""):
    return launcher.launch(launcher.request(name, 2, {"steps": 1, "device": device}, timeout=600, progress=False,
                                            runs_dir=runs_dir, script=PROBE, extra_env={"LAB_SYNC_BN_PROBE": mode}))


def _probe_records(run_dir):
    return list(probes.read_probe(run_dir).values())  # any probe's probe/rank*.json, in rank order


@pytest.mark.slow
def test_two_gloo_ranks_match_batchnorm_over_the_whole_batch_and_torch_refuses_cpu(runs_dir):
    """Real ranks (float64): forward, input gradient, summed affine gradients and running stats within 1e-12 of
    nn.BatchNorm on the full batch; plain BatchNorm per rank is far off; nn.SyncBatchNorm on CPU: ValueError."""
    result = _probe(runs_dir, "t_sync_bn_probe", mode="torch_cpu")
    records = _probe_records(result.run_dir)
    assert [r["rank"] for r in records] == [0, 1]
    for rec in records:
        for case in rec["cases"].values():
            assert max(case["lab"].values()) < 1e-12, case
            assert case["no_sync"]["y"] > 1e-2 and case["no_sync"]["dweight"] > 1e-2, case
    assert result.status == "crashed"
    assert "ValueError: SyncBatchNorm expected input tensor to be on GPU" in result.traceback


@pytest.mark.skipif(not torch.cuda.is_available(), reason="nn.SyncBatchNorm needs CUDA tensors (2 ranks may "
                    "share one GPU over gloo); this machine has no CUDA device")
@pytest.mark.slow
def test_lab_sync_bn_agrees_with_torch_sync_batchnorm_on_cuda(runs_dir):
    result = _probe(runs_dir, "t_sync_bn_cuda", device="cuda")
    result.raise_for_status()
    for rec in _probe_records(result.run_dir):
        for case in rec["cases"].values():
            assert max(case["torch"].values()) < 1e-10, case
            assert max(case["lab"].values()) < 1e-10, case


@pytest.mark.slow
def test_two_ranks_with_lab_sync_bn_are_bitwise_equal_to_the_emulated_reference(runs_dir):
    keys = {"model": "bn_net", "steps": 3, "sync_bn": "lab", "grad_accum_steps": 2}
    ddp = launcher.launch(launcher.request("t_sbn_ddp", 2, keys, timeout=600, progress=False, runs_dir=runs_dir))
    emu = launcher.launch(launcher.request("t_sbn_emu", 1, {**keys, "emulate_ranks": 2}, timeout=600, progress=False,
                                           runs_dir=runs_dir))
    ddp.raise_for_status(), emu.raise_for_status()
    report = parity.compare(emu.run_dir, ddp.run_dir)
    assert report.tier == 3, report.format()
    beats = read_heartbeats(ddp.run_dir)  # synced running stats: the same bits on both ranks
    assert beats[0]["buffer_hash"] == beats[1]["buffer_hash"]
