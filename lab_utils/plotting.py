"""Plots drawn from the runs' own files: loss curves, and |Δloss| against a reference on a log scale.

Taught in notebooks/01_unchanged.ipynb. A bitwise-equal step has |Δloss| = 0, which a log axis cannot
show; those steps are drawn on a floor line labelled "bitwise equal" rather than silently dropped.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

if not matplotlib.get_backend().lower().startswith(("module://", "nbagg", "ipympl", "widget")):
    matplotlib.use("Agg")  # headless (CI, make lab); notebooks keep their inline backend
import matplotlib.pyplot as plt  # noqa: E402

from .metrics import read_metrics  # noqa: E402
from .parity import LOSS_TOL  # noqa: E402

FLOOR = 1e-12


def plot_parity(reference: str | Path, others: list[str | Path], path: str | Path | None = None,
                labels: dict | None = None, title: str = "", loss_tol: float = LOSS_TOL,
                pairs: list[tuple[str | Path, str | Path]] = ()):
    """Left: every run's loss per step. Right: |loss - reference loss| per step, log scale; `pairs` adds
    |Δloss| lines between two other runs (e.g. 2 ranks vs the emulated reference)."""
    labels = labels or {}
    ref = read_metrics(reference)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    name = labels.get(str(reference), Path(reference).name)
    ax1.plot([r["step"] for r in ref], [r["loss"] for r in ref], lw=2.5, color="black", label=name)
    for run in others:
        rows = read_metrics(run)
        label = labels.get(str(run), Path(run).name)
        ax1.plot([r["step"] for r in rows], [r["loss"] for r in rows], lw=1.2, label=label)
        _diff_line(ax2, ref, rows, label)
    for a, b in pairs:
        _diff_line(ax2, read_metrics(a), read_metrics(b), f"{Path(b).name} vs {Path(a).name}")
    ax2.axhline(loss_tol, ls="--", color="gray", lw=1)
    ax2.annotate(f"tier 2 tolerance {loss_tol:g}", (0, loss_tol * 1.5), color="gray")
    ax2.set_ylim(FLOOR / 3, None)
    ax1.set(xlabel="step", ylabel="loss (mean over all ranks)", title=title or "loss curves")
    ax2.set(xlabel="step", ylabel=f"|Δloss| vs {name}", title="|Δloss| (log); floor = bitwise equal")
    ax1.legend(fontsize=8)
    ax2.legend(fontsize=8, loc="center right")
    fig.tight_layout()
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
    return fig


def _diff_line(ax, ref: list[dict], rows: list[dict], label: str) -> None:
    n = min(len(rows), len(ref))
    diffs = [abs(rows[i]["loss"] - ref[i]["loss"]) for i in range(n)]
    line, = ax.semilogy(range(n), [max(d, FLOOR) for d in diffs], marker=".", lw=1, label=label)
    if all(d == 0 for d in diffs):
        ax.annotate(f"{label}: bitwise equal", (n * 0.5, FLOOR * 3), color=line.get_color(), ha="center")
