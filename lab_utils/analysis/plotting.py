"""Plots drawn from the runs' own files: loss curves, and |Δloss| against a reference on a log scale.

Taught in notebooks/00_preflight.ipynb (`plot_losses`) and 01_unchanged.ipynb (`plot_parity`). A
bitwise-equal step has |Δloss| = 0, which a log axis cannot show: such steps are drawn as markers on the
bottom edge ("exact 0"), and the line is never drawn through them, so exact agreement never looks like noise.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

if not matplotlib.get_backend().lower().startswith(("module://", "nbagg", "ipympl", "widget")):
    matplotlib.use("Agg")  # headless (CI, make lab); notebooks keep their inline backend
import matplotlib.pyplot as plt  # noqa: E402

from lab_utils.analysis.ops import PHASES  # noqa: E402
from lab_utils.analysis.parity import LOSS_TOL  # noqa: E402
from lab_utils.core.runfiles import read_metrics  # noqa: E402

LEGEND = {"fontsize": 8, "loc": "upper center", "bbox_to_anchor": (0.5, -0.2), "ncol": 2, "frameon": False}


def _save(fig, path) -> None:
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110, bbox_inches="tight")


def _label(run, labels: dict) -> str:
    return labels.get(str(run), Path(run).name)


def plot_losses(runs: list[str | Path], path: str | Path | None = None, labels: dict | None = None,
                title: str = "loss per optimizer step"):
    """Every run's logged loss (metrics.jsonl: the mean over all ranks) per step."""
    labels = labels or {}
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for run in runs:
        rows = read_metrics(run)
        ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], marker=".", lw=1.2, label=_label(run, labels))
    ax.set(xlabel="step", ylabel="loss (mean over all ranks)", title=title)
    ax.legend(**LEGEND)
    fig.tight_layout()
    _save(fig, path)
    return fig


def plot_parity(reference: str | Path, others: list[str | Path], path: str | Path | None = None,
                labels: dict | None = None, title: str = "", loss_tol: float = LOSS_TOL,
                pairs: list[tuple[str | Path, str | Path]] = ()):
    """Left: every run's loss per step. Right: |loss - reference loss| per step, log scale; `pairs` adds
    |Δloss| series between two other runs (e.g. 2 ranks vs the emulated reference). Legends sit below the
    axes, never over the data or the tolerance line."""
    labels = labels or {}
    ref = read_metrics(reference)
    name = _label(reference, labels)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.6))
    ax1.plot([r["step"] for r in ref], [r["loss"] for r in ref], lw=2.5, color="black", label=name)
    series = []
    for run in others:
        rows = read_metrics(run)
        label = _label(run, labels)
        line, = ax1.plot([r["step"] for r in rows], [r["loss"] for r in rows], lw=1.2, label=label)
        series.append((label, _diffs(ref, rows), line.get_color()))
    for i, (a, b) in enumerate(pairs):  # colours after the runs' own, so no two series share one
        series.append((f"{_label(b, labels)} vs {_label(a, labels)}", _diffs(read_metrics(a), read_metrics(b)),
                       f"C{len(others) + i}"))
    _diff_panel(ax2, series, loss_tol)
    ax1.set(xlabel="step", ylabel="loss (mean over all ranks)", title=title or "loss curves")
    ax2.set(ylabel=f"|Δloss| vs {name}" if not pairs else "|Δloss|", title="|Δloss| per step (log scale)")
    ax1.legend(**LEGEND)
    ax2.legend(**LEGEND)
    fig.tight_layout()
    _save(fig, path)
    return fig


def plot_delta(pairs: dict[str, tuple[str | Path, str | Path]], path: str | Path | None = None, title: str = "",
               loss_tol: float = LOSS_TOL):
    """One panel: |Δloss| per step of each pair {label: (run A, run B)}, log scale, with the exact-zero
    convention of `plot_parity` (▼ on the bottom edge, no line through zeros) and the tier-2 tolerance. For
    comparisons whose loss curves would lie on top of each other, where a loss panel shows nothing."""
    fig, ax = plt.subplots(figsize=(8, 4.2))
    series = [(label, _diffs(read_metrics(a), read_metrics(b)), f"C{i}") for i, (label, (a, b)) in
              enumerate(pairs.items())]
    _diff_panel(ax, series, loss_tol)
    ax.set(ylabel="|Δloss| (log scale)", title=title or "|Δloss| per step")
    ax.legend(**LEGEND)
    fig.tight_layout()
    _save(fig, path)
    return fig


def _diffs(ref: list[dict], rows: list[dict]) -> list[float]:
    n = min(len(rows), len(ref))
    return [abs(rows[i]["loss"] - ref[i]["loss"]) for i in range(n)]


def _diff_panel(ax, series: list[tuple[str, list[float], str]], loss_tol: float) -> None:
    """Non-zero |Δloss| as lines broken at every exact zero; exact zeros as markers on the bottom edge."""
    nonzero = [d for _, diffs, _ in series for d in diffs if d > 0]
    low = min(nonzero + [loss_tol]) / 100
    high = max(nonzero + [loss_tol]) * 30  # headroom: the tolerance label never reaches the title
    ax.set_yscale("log")
    ax.set_ylim(low, high)
    rows_of_zeros = 0
    for label, diffs, colour in series:
        zeros = [i for i, d in enumerate(diffs) if d == 0]
        zero_y = low * 1.6 * 2.2 ** rows_of_zeros  # one row of markers per series, so none hides another
        rows_of_zeros += bool(zeros)
        shown = f"{label} ({len(zeros)} of {len(diffs)} steps exact 0)" if zeros else label
        line, = ax.plot(range(len(diffs)), [d if d > 0 else float("nan") for d in diffs], marker=".", lw=1,
                        color=colour, label=shown)
        if zeros:
            ax.plot(zeros, [zero_y] * len(zeros), ls="none", marker="v", ms=6, color=line.get_color(),
                    clip_on=False)
    ax.axhline(loss_tol, ls="--", color="gray", lw=1)
    ax.text(0.99, loss_tol * 1.3, f"tier-2 tolerance {loss_tol:g}", transform=ax.get_yaxis_transform(),
            ha="right", va="bottom", color="gray", fontsize=8)
    ax.set_xlabel("step      (▼ on the bottom edge: |Δloss| exactly 0 at that step)")


def plot_envelope(reports: dict, path: str | Path | None = None, title: str = ""):
    """Divergence curves against one reference run A, on a log axis: each report's |Δloss| (B vs A), the float
    twins' envelope (the running max of |twin - A|) and the tier-2 bound (margin x envelope), with the step
    where a run leaves the envelope marked. `reports`: {label: ParityReport calibrated with the same twins}.
    Left: the loss; right: the relative grad-norm difference."""
    first = next(iter(reports.values()))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    for ax, what, twin, bound in ((axes[0], "loss_diffs", first.twin_loss, first.loss_bounds),
                                  (axes[1], "grad_rel_diffs", first.twin_grad, first.grad_bounds)):
        steps = range(len(twin))
        ax.set_yscale("log")
        ax.fill_between(steps, [1e-12] * len(twin), bound, color="#dfe8f5", label=f"tier 2: within "
                        f"{first.margin:g}x the twins' envelope")
        ax.plot(steps, [t if t > 0 else float("nan") for t in twin], color="gray", lw=1.5, ls="--",
                label=f"float twin{'s' if len(first.twins) > 1 else ''} vs A (running max)")
        for i, (label, rep) in enumerate(reports.items()):
            diffs = getattr(rep, what)
            line, = ax.plot(range(len(diffs)), [d if d > 0 else float("nan") for d in diffs], lw=1.2,
                            color=f"C{i}", label=f"{label}: tier {rep.tier}")
            out = rep.first_step_over_tol if what == "loss_diffs" else rep.first_step_over_grad_rtol
            if out is not None:
                ax.plot([out], [diffs[out]], marker="o", ms=9, mfc="none", color=line.get_color())
        fixed = first.loss_tol if what == "loss_diffs" else first.grad_rtol
        ax.axhline(fixed, ls=":", color="black", lw=1, label=f"fixed tolerance {fixed:g} (no twin)")
        positive = [d for rep in reports.values() for d in getattr(rep, what) if d > 0] + [b for b in bound if b > 0]
        ax.set_ylim(min(positive) / 10, max(positive) * 10)
        ax.set_xlabel("step      (○: where a run leaves the envelope; a gap: exactly 0)")
    axes[0].set(ylabel="|Δloss| vs A", title="loss: distance from the single run (log scale)")
    axes[1].set(ylabel="relative |Δgrad_norm| vs A", title="gradient norm: relative distance (log scale)")
    return _finish(fig, axes, title, path)


def _finish(fig, axes, title: str, path):
    """Legends under each panel, the title, and the file when a path is given."""
    for ax in axes:
        ax.legend(**LEGEND)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    _save(fig, path)
    return fig


def plot_windows(reports: dict, path: str | Path | None = None, title: str = ""):
    """Two ways to judge the same ports, on a log axis. Left: the whole-run envelope (|Δloss| of B vs A, the
    bound from the float twins' running max), its blind zone shaded from `blind_from_step` (the bound past its
    cap: "not judged"). Right: each window judged from B's own state (|Δloss| of B vs A's program replayed from
    it, and the window's bound, which starts again from the last bit at every window; grey lines: window starts).
    `reports`: {label: ParityReport with windows (analysis/windows.py)}; a window out of bound is circled."""
    first = next(iter(reports.values()))
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6), sharey=True)
    n = first.steps_compared
    for ax in (left, right):
        ax.set_yscale("log")
    left.plot(range(n), first.loss_bounds, color="gray", ls="--", lw=1.2, label="tier-2 bound (whole run)")
    if first.blind_from_step is not None:
        left.axvspan(first.blind_from_step, n - 1, color="#f6d5d5", label=f"blind from step {first.blind_from_step}:"
                     f" bound past its cap (not judged)")
    judged = first.windows
    if judged is not None:
        right.plot(range(n), judged.loss_bounds, color="gray", ls="--", lw=1.2, label="tier-2 bound (per window)")
        for w in judged.windows[1:]:
            right.axvline(w.start, color="#cccccc", lw=0.8)
    for i, (label, rep) in enumerate(reports.items()):
        left.plot(range(n), [d if d > 0 else float("nan") for d in rep.loss_diffs], lw=1.2, color=f"C{i}",
                  label=f"{label}: B vs A")
        if rep.windows is None:
            continue
        diffs = rep.windows.loss_diffs
        right.plot(range(n), [d if d > 0 else float("nan") for d in diffs], lw=1.2, color=f"C{i}",
                   label=f"{label}: " + ("out from step " + str(rep.windows.first_over)
                                         if rep.windows.first_over is not None else "every window within"))
        if rep.windows.first_over is not None:
            s = rep.windows.first_over
            right.plot([s], [diffs[s]], marker="o", ms=10, mfc="none", color=f"C{i}")
    left.set(title="whole run: B vs A from step 0", xlabel="step", ylabel="|Δloss|")
    right.set(title="windows: B vs A's program from B's own state", xlabel="step   (grey: window starts)")
    return _finish(fig, (left, right), title, path)


PHASE_COLOURS = {"data": "#762a83", "forward": "#1b7837", "backward": "#2166ac", "reduction": "#b2182b",
                 "optimizer": "#e08214"}


def plot_ops(reports: dict, path: str | Path | None = None, title: str = ""):
    """`doctor --ops`, drawn: one panel per pair ({label: OpsReport}), every comparison of the replayed step in the
    order the step runs it (x), its |Δ| / bound on a log axis (y), coloured by phase; the bound is the line at 1,
    the first op past it is circled and named. An exact check that fails (sample ids, integer inputs: bound 0) is
    drawn on the top edge, an exact agreement (Δ = 0) on the bottom edge."""
    fig, axes = plt.subplots(1, len(reports), figsize=(5.2 * len(reports), 4.2), squeeze=False, sharey=True)
    finite = [o.ratio for r in reports.values() for o in r.diffs if 0 < o.ratio < float("inf")] or [1.0]
    low, high = min(min(finite), 1e-3) / 10, max(max(finite), 10.0) * 10
    for ax, (label, rep) in zip(axes[0], reports.items(), strict=True):
        ax.set_yscale("log")
        ax.set_ylim(low, high)
        for ph in PHASES:
            xs = [k for k, o in enumerate(rep.diffs) if o.phase == ph]
            if not xs:
                continue
            ys = [min(max(rep.diffs[k].ratio, low * 1.5), high / 1.5) for k in xs]
            ax.scatter(xs, ys, s=12, color=PHASE_COLOURS[ph], label=ph, clip_on=False)
        ax.axhline(1.0, color="grey", lw=1, ls="--", label="bound (float noise)")
        f = rep.first_op
        if f is not None:
            k = next(k for k, o in enumerate(rep.diffs) if o.out)
            y = min(max(rep.diffs[k].ratio, low * 1.5), high / 1.5)
            ax.plot([k], [y], "o", ms=12, mfc="none", color="black")
            right = k > len(rep.diffs) / 2
            ax.annotate(f"{f['phase']}: {f['op']}", (k, y), textcoords="offset points", fontsize=8,
                        xytext=(-8 if right else 8, -16), ha="right" if right else "left")
        ax.set(title=f"{label}\nstep {rep.step}: " + ("first op " + rep.first_op["phase"] if f else
                                                       "none beyond float noise"),
               xlabel="comparison, in the order the step runs", xlim=(-1, max(len(rep.diffs), 10)))
        ax.legend(**LEGEND)
    axes[0][0].set_ylabel("|Δ| / bound (log)\ntop edge: exact check failed; bottom: Δ = 0")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    _save(fig, path)
    return fig
