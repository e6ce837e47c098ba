"""`ddp-lab doctor A B --ops`: the first operation where two runs part (lab_utils/analysis/ops.py on the traces of
lab_utils/core/op_trace.py), on the port-bug suite's bugs that are config keys, at the toy size: a sampler bug
parts in `data`, unsynchronised BatchNorm in the forward of the first BatchNorm, an unscaled sum loss at the
`reduction`, clipping (before unscale_, or inside the no_sync window) in the `optimizer`; correct ports give null.
Real 2-rank gloo runs (4 steps, window states every step so that the step-2 sampler bug has a state to replay
from), launched once per module."""

import json
import math
import subprocess
import sys

import pytest
import torch

from lab_utils.analysis import doctor, ops, portbugs
from lab_utils.core import config, op_trace, workloads
from lab_utils.launch import launcher

TOY = ("steps=4", "window_every=1")
BUGS = {b.name: b for b in portbugs.SUITE}
# suite entry -> the phase where its first op must be (None: nothing beyond float noise)
EXPECTED = {"set_epoch_forgotten": "data", "bn_without_sync": "forward", "sum_loss_unscaled_sgd": "reduction",
            "clip_scaled_gradients": "optimizer", "padding_per_rank_token_mean": "reduction",
            "clip_inside_no_sync_window": "optimizer",
            "plain_port": None, "sum_loss_fixed": None,
            "clip_after_unscale_fp16": None}


def _keys(keys):
    return portbugs.sized(tuple(keys), "toy")[1:] + TOY  # the suite's steps=8 replaced by TOY's steps=4


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("doctor_ops") / "runs"
    specs = {}
    for name in EXPECTED:
        bug = BUGS[name]
        specs[portbugs.run_name(1, _keys(bug.single))] = (1, _keys(bug.single))
        specs[portbugs.run_name(2, _keys(bug.ddp))] = (2, _keys(bug.ddp))
    no_windows = _keys(BUGS["set_epoch_forgotten"].ddp)[:-1] + ("window_every=0",)
    specs["no_windows"] = (2, no_windows)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LAB_RUNS_DIR", str(root))
        launcher.launch_many(launcher.requests_from_specs({n: (n, p, list(k)) for n, (p, k) in specs.items()},
                                                          timeout=600), max_workers=2, raise_on_failure=True)
        yield lambda name: (root / portbugs.run_name(1, _keys(BUGS[name].single)),
                            root / portbugs.run_name(2, _keys(BUGS[name].ddp)))


def first_bn() -> str:
    torch.manual_seed(0)
    model = workloads.build(config.resolve({"model": "bn_net"}, 1)).model
    return next(n for n, m in model.named_modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(EXPECTED))
def test_first_op_on_the_suite(name, runs):
    a, b = runs(name)
    d = doctor.add_ops(doctor.diagnose_runs(a, b), op_trace.trace, op_trace.OpsUnsupported)
    assert d.ops is not None, d.format()
    first = d.ops.first_op
    if EXPECTED[name] is None:
        assert first is None, d.format()
        assert all(w["ratio"] <= 1 for w in d.ops.worst.values()), d.format()
        return
    assert first is not None and first["phase"] == EXPECTED[name], d.format()
    assert first["max_abs_diff"] > first["bound"] and first["step"] == d.first_diverging_step, d.format()
    if name == "bn_without_sync":
        assert first["module"] == first_bn(), d.format()
    if name == "set_epoch_forgotten":
        assert first["op"] == "sample ids" and first["step"] == 2, d.format()


@pytest.mark.slow
def test_cli_json_and_not_judged(runs, tmp_path):
    a, b = runs("set_epoch_forgotten")
    cli = lambda *args: subprocess.run([sys.executable, "-m", "lab_utils", "doctor", *map(str, args)],  # noqa: E731
                                       capture_output=True, text=True, timeout=300)
    p = cli(a, b, "--ops", "--json", "--windows", "off")
    assert p.returncode == 1, p.stderr
    out = json.loads(p.stdout, parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))
    assert set(out["first_op"]) == {"step", "phase", "module", "op", "max_abs_diff", "bound"}
    assert out["first_op"]["phase"] == "data" and out["ops_not_judged"] is None
    diffs = out["ops"]["diffs"]  # every comparison, in order (what plot_ops draws): the first one out is first_op
    assert len(diffs) == out["ops"]["checked"] and diffs[0]["op"] == "sample ids" and diffs[0]["ratio"] is None
    # the same bug without window states: step 2 cannot be replayed from B's own state -> not judged, exit 3
    p = cli(a, b.parent / "no_windows", "--ops", "--windows", "off")
    assert p.returncode == 3, p.stdout + p.stderr
    assert "not judged" in p.stdout and "window_every" in p.stdout


def test_plot_ops_draws_each_comparison_and_circles_the_first_out():
    a = [ops.OpDiff("data", None, "sample ids", 0.0, 0.0), ops.OpDiff("forward", "lin", "output", 1e-6, 1e-3),
         ops.OpDiff("reduction", "lin", "grad lin.weight", 5.0, 1e-3)]
    rep = ops.OpsReport(0, 0, {"step": 0, "phase": "reduction", "module": "lin", "op": "grad lin.weight",
                               "max_abs_diff": 5.0, "bound": 1e-3}, {}, 3, a)
    from lab_utils.analysis.plotting import plot_ops

    fig = plot_ops({"bug": rep, "correct": ops.OpsReport(0, 0, None, {}, 2, a[:2])})
    bug, correct = fig.axes[:2]
    assert sum(len(c.get_offsets()) for c in bug.collections) == 3 and "first op reduction" in bug.get_title()
    assert "none beyond float noise" in correct.get_title() and len(correct.lines) == 1  # the bound, no circle
    assert len(bug.lines) == 2  # the bound and the circle on the first op out


def _recorded(grad_scale=1.0, ids=(1, 2, 3, 4), optimizer="SGD", row=0.0):
    """A trace as lab_utils/core/op_record.py writes it: two samples' rows of one module, a loss, a gradient."""
    g = torch.tensor([[0.5, -0.25], [1.0, 2.0]], dtype=torch.float64)
    return {"step": 3, "start": 0, "micro": 1, "optimizer": optimizer, "ids": list(ids), "loss": 0.75,
            "forward": {"lin": {"k1": torch.tensor([1.0, 2.0], dtype=torch.float64) + row,
                                "k2": torch.tensor([3.0, -1.0], dtype=torch.float64)}},
            "grads": {"lin.weight": g * grad_scale}, "update": {"lin.weight": -0.1 * g * grad_scale}}


def test_recorded_traces_are_judged_in_the_order_a_step_runs():
    a = _recorded()
    assert ops.judge_recorded(a, _recorded()).first_op is None  # the same program: nothing out
    assert ops.judge_recorded(a, _recorded(ids=(1, 2, 3, 3))).first_op["phase"] == "data"  # another sample drawn
    assert ops.judge_recorded(a, _recorded(row=1e-2)).first_op["module"] == "lin"  # a forward op, before the rest
    out = ops.judge_recorded(a, _recorded(grad_scale=2.0))  # DDP averaged a sum: the gradient doubled
    assert out.first_op["phase"] == "reduction" and out.first_op["op"].startswith("grad lin.weight")
    adam = ops.judge_recorded(_recorded(optimizer="AdamW"), _recorded(optimizer="AdamW"))
    assert "optimizer" not in {o.phase for o in adam.diffs}  # no update judged without A's optimizer on B's grads
    with pytest.raises(ValueError, match="other steps"):
        ops.judge_recorded(a, {**_recorded(), "step": 4})


def test_the_bound_can_fail():
    z = torch.zeros(3)
    assert ops._diff("reduction", "m", "g", z, z + 1e-30, "none").out  # exact zeros must stay exact
    big = torch.tensor([1.0, -2.0, 4.0])
    assert not ops._diff("forward", "m", "o", big, big + 4 * 2 ** -23 * 4, "none").out  # a few ulps: noise
    assert ops._diff("forward", "m", "o", big, big * (1 + 1e-3), "none").out  # 0.1%: past 4096 ulps
    assert math.isinf(ops._diff("forward", "m", "o", big, big[:2], "none").ratio)  # another shape: out
