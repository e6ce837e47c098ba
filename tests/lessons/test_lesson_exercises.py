"""The lesson functions behind chapters 05, 06, 08, 10 and 12's exercises and plots (issue 25): which losses
need a global count, where DDP reads `no_sync`, the rank-0-only evaluation trap, and the plots' conventions.
The two multi-rank ones start real gloo ranks (forked, a few seconds each)."""

import json

import matplotlib
import pytest
from processes import stray_children

matplotlib.use("Agg")

from lab_utils.analysis import plotting  # noqa: E402
from lab_utils.core import runfiles  # noqa: E402
from lab_utils.core.runfiles import REPO  # noqa: E402
from lab_utils.lessons import ch05_ddp_flags, ch06_accumulation, ch08_checkpoints, ch10_workflow  # noqa: E402


def test_split_losses_tells_per_sample_means_from_batch_wide_denominators():
    rows = {r["loss"]: r for r in ch05_ddp_flags.split_losses(world_size=2)}
    need = {name for name, r in rows.items() if r["needs_global_count"]}
    # a mean over samples (equal counts per rank) is what DDP's average reproduces; a count that varies by
    # rank (weights, real tokens, positives) is not: a lesson that called every loss fine would fail here
    assert need == {"per-sample weighted loss, divided by the sum of the weights",
                    "token-mean LM loss with padding/packing (ignore_index)",
                    "focal loss, divided by the number of positives (RetinaNet)"}
    assert all(rows[n]["abs_diff"] > 1e-3 for n in need)
    assert all(r["abs_diff"] < 1e-12 for n, r in rows.items() if n not in need)


def test_no_sync_is_read_at_the_forward():
    rule = ch06_accumulation.no_sync_forward_rule(accum_steps=3, world_size=2)
    assert rule == {"forward and backward inside no_sync": [1, 1],
                    "only backward inside no_sync": [3, 3],  # the reducer was armed by the forward outside
                    "no no_sync": [3, 3]}


@pytest.mark.slow
def test_rank0_eval_through_the_wrapper_hangs_and_through_module_does_not():
    # rank 0 starts 3 s late: only the trap's collectives have the 2 s timeout (CI saw DDP's construction time out)
    trap = ch08_checkpoints.rank0_eval_trap(timeout_s=2, late_s=3)
    assert [r["status"] for r in trap["module"]] == ["ok", "ok"]
    assert [r["all_reduce"] for r in trap["module"]] == [3.0, 3.0]
    assert [r["status"] for r in trap["wrapper"]] == ["timed out", "timed out"]
    assert all(r["seconds"] >= 1.5 for r in trap["wrapper"])  # they waited for the timeout, not a quick error


def _stuck_rank(rank, *args):
    import time

    time.sleep(600)


@pytest.mark.slow
def test_rank0_eval_trap_kills_stuck_ranks_and_names_them(monkeypatch):
    monkeypatch.setattr(ch08_checkpoints, "_eval_trap_rank", _stuck_rank)
    monkeypatch.setattr(ch08_checkpoints, "TRAP_GRACE_S", 1.0)
    with pytest.raises(TimeoutError, match=r"\(module\): rank\(s\) \[0, 1\] still running 2 s after the start"):
        ch08_checkpoints.rank0_eval_trap(timeout_s=1)
    assert stray_children() == []


def _metrics(d, losses, grad_norms):
    d.mkdir(parents=True)
    with open(d / runfiles.METRICS, "w") as f:
        for s, (loss, g) in enumerate(zip(losses, grad_norms, strict=True)):
            f.write(json.dumps({"step": s, "loss": loss, "grad_norm": g}) + "\n")
    return d


def test_plots_draw_exact_zeros_as_markers_and_the_grad_panel(tmp_path):
    a = _metrics(tmp_path / "a", [1.0, 0.9, 0.8], [2.0, 2.0, 2.0])
    b = _metrics(tmp_path / "b", [1.0, 0.9 + 1e-5, 0.8], [1.0, 1.0, 1.0])  # exact at steps 0 and 2; grad halved
    fig = plotting.plot_delta({"b vs a": (a, b)})
    ax = fig.axes[0]
    line, markers = ax.lines[0], ax.lines[1]
    assert list(markers.get_xdata()) == [0, 2]  # ▼ at the exact zeros, on the bottom edge
    assert [x == x for x in line.get_ydata()] == [False, True, False]  # no line through a zero (NaN there)
    assert "2 of 3 steps exact 0" in ax.get_legend().get_texts()[0].get_text()
    fig = ch10_workflow.plot_divergence({"b vs a": (a, b)}, {"b vs a": 1}, grad_panel=True)
    assert len(fig.axes) == 2
    assert list(fig.axes[1].lines[0].get_ydata()) == [0.5, 0.5, 0.5]


def test_allreduce_traffic_plot_draws_the_rule_and_the_counted_calls():
    summaries = {2: {"no_sync=true": {"buckets": 2, "calls_per_step": [2]},
                     "no_sync=false": {"buckets": 2, "calls_per_step": [8]}}}
    fig = ch06_accumulation.plot_allreduce_traffic(summaries, grad_bytes=4_000_000, measured_accum=4, title="t")
    calls, bytes_ = fig.axes
    assert list(calls.lines[1].get_ydata()) == [2 * a for a in range(1, 9)]  # B x grad_accum_steps
    assert list(bytes_.lines[0].get_ydata()) == pytest.approx([4.0] * 8)  # B calls x (4 MB / B) with no_sync


def test_recorder_lines_include_the_dataset_index_patch():
    text = ch10_workflow.recorder_lines(REPO / "tests" / "outside" / "multigpu_torchrun_recorded.py",
                                        patches=("the index",))
    assert "return (*self.data[index], index)" in text
    assert "rec.close(trainer.model)" in text
    plain = ch10_workflow.recorder_lines(REPO / "tests" / "outside" / "multigpu_torchrun_recorded.py")
    assert "return (*self.data[index], index)" not in plain
