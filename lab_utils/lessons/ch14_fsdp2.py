"""Chapter 14's lesson logic: what each rank holds under DDP and FSDP2 (read from the runs' heartbeats), FSDP2's
port bugs side by side, and the chapter's picture of the state per rank. Taught in notebooks/14_fsdp2.ipynb.

Analysis side: reads run folders (runfiles, parity) and draws; it launches nothing and imports no training
code. The mechanism lives in lab_utils/core/fsdp2.py (the wrap, the ordered reduce-scatter, the collectives that
read the full weights, the fsdp2_bug port bugs) and scripts/train.py (`wrap=fsdp2`).
"""

from __future__ import annotations

from pathlib import Path

from lab_utils.analysis import parity
from lab_utils.core import runfiles

PARTS = ("params", "grads", "optimizer")


def held(run_dir: Path) -> dict[int, dict[str, int]]:
    """{rank: {"params", "grads", "optimizer": bytes}} that each rank held after its last step (its own
    heartbeat's state_bytes, written by core/fsdp2.local_state_bytes: a DTensor counts its shard)."""
    return {r: b["state_bytes"] for r, b in sorted(runfiles.read_heartbeats(run_dir).items()) if "state_bytes" in b}


def total(parts: dict[str, int]) -> int:
    return sum(parts[k] for k in PARTS)


def bug_rows(reports: dict[str, parity.ParityReport], causes: dict[str, list[str]]) -> list[dict]:
    """{label: report}, {label: the doctor's cause codes, strongest first} -> one row each: tier, first step
    out of the float-noise envelope, the first cause."""
    rows = []
    for label, r in reports.items():
        outs = [s for s in (r.first_step_over_tol, r.first_step_over_grad_rtol) if s is not None]
        rows.append({"port": label, "tier": r.tier, "first_out": min(outs) if outs else None,
                     "cause": (causes.get(label) or ["-"])[0]})
    return rows


def plot_held(runs: dict[str, Path], path=None, title: str = "what one rank holds between steps"):
    """Stacked bars: parameters, gradients and optimizer state of rank 0, per run ({label: run folder}), in MB."""
    from lab_utils.analysis.plotting import _save, plt

    labels = list(runs)
    rank0 = [held(runs[k])[0] for k in labels]
    fig, ax = plt.subplots(figsize=(1.6 * len(labels) + 2.5, 3.6))
    bottom = [0.0] * len(labels)
    for part, colour in zip(PARTS, ("#4575b4", "#91bfdb", "#fc8d59"), strict=True):
        mb = [h[part] / 1e6 for h in rank0]
        ax.bar(labels, mb, bottom=bottom, color=colour, label=part)
        bottom = [b + m for b, m in zip(bottom, mb, strict=True)]
    for x, b in enumerate(bottom):
        ax.text(x, b, f"{b:.2f} MB", ha="center", va="bottom", fontsize=9)
    ax.set_ylabel("MB on rank 0")
    ax.set_title(title)
    ax.set_ylim(0, max(bottom) * 1.18)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3, frameon=False)
    fig.tight_layout()
    _save(fig, path)
    return fig
