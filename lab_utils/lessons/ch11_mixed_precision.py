"""Chapter 11's lesson logic: what GradScaler skipped on each rank, the loss scale over a run, the clipping
bugs' reports side by side, each precision's float-noise scale, and the linear-scaling rule of exercise 3. Taught in
notebooks/11_mixed_precision.ipynb.

Analysis side: reads run folders (runfiles, parity) and draws; it launches nothing and imports no training
code. The mechanism lives in scripts/train.py (GradScaler, unscale_ then clip once) and lab_utils/core/step.py
(scaler.scale per micro-batch, and the clip_bug placements).
"""

from __future__ import annotations

import math
from pathlib import Path

from lab_utils.analysis import parity
from lab_utils.core import runfiles


def skipped_by_rank(run_dir: Path) -> dict[int, list[int]]:
    """{rank: the steps its GradScaler skipped}, from each rank's own heartbeat (not rank 0's log)."""
    return {r: b.get("skipped_steps") for r, b in sorted(runfiles.read_heartbeats(run_dir).items())}


def scale_rows(run_dir: Path) -> list[dict]:
    """Per step: the loss scale the step ran with, whether it was skipped, its (unscaled) grad norm."""
    return [{"step": m["step"], "loss_scale": m.get("loss_scale"), "skipped": m.get("skipped"),
             "grad_norm": m["grad_norm"]} for m in runfiles.read_metrics(run_dir)]


def precision_rows(reports: dict[str, parity.ParityReport]) -> list[dict]:
    """{precision: port vs single report, judged against that precision's float twin} -> how far the twin moved
    (the envelope's scale: precision alone), how far the port moved, and the tier."""
    return [{"precision": p, "twin": max(r.twin_loss) if r.twin_loss else math.nan, "port": r.max_abs_loss_diff,
             "tier": r.tier} for p, r in reports.items()]


def linear_scaling_lr(lr: float, batch: int, new_batch: int) -> float:
    """The linear-scaling rule (Goyal et al. 2017, for SGD): the learning rate grows with the global batch.
    A heuristic for a *new* experiment, not a parity fix: the lab keeps the global batch, so the rate stays."""
    return lr * new_batch / batch


def clip_rows(reports: dict[str, parity.ParityReport]) -> list[dict]:
    """{label: report} -> rows: tier, first step out of the float-noise envelope, median grad-norm ratio, cause."""
    rows = []
    for label, r in reports.items():
        outs = [s for s in (r.first_step_over_tol, r.first_step_over_grad_rtol) if s is not None]
        rows.append({"port": label, "tier": r.tier, "first_out": min(outs) if outs else None,
                     "grad_norm_ratio": r.grad_norm_ratio_median, "cause": r.cause.code if r.cause else None})
    return rows


def plot_scale(run_dir: Path, label: str = "", path=None):
    """Left: the loss per step, skipped steps marked. Right: GradScaler's scale (log2) per step."""
    from lab_utils.analysis.plotting import _save, plt

    rows = scale_rows(run_dir)
    loss = {m["step"]: m["loss"] for m in runfiles.read_metrics(run_dir)}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.6))
    steps = [r["step"] for r in rows]
    ax1.plot(steps, [loss[s] for s in steps], marker="o", ms=4, color="black")
    skipped = [r["step"] for r in rows if r["skipped"]]
    ax1.plot(skipped, [loss[s] for s in skipped], ls="none", marker="x", ms=12, color="red",
             label="skipped by GradScaler (inf/NaN in the all-reduced gradients)")
    ax1.set_xlabel("step")
    ax1.set_ylabel("loss (all ranks)")
    ax1.legend(fontsize=8, frameon=False)
    ax1.set_title(label or "loss")
    ax2.step(steps, [math.log2(r["loss_scale"]) for r in rows], where="post", color="tab:blue")
    ax2.set_xlabel("step")
    ax2.set_ylabel("log2 loss scale (before the step)")
    ax2.set_title("the scale halves after a skipped step")
    fig.tight_layout()
    _save(fig, path)
    return fig
