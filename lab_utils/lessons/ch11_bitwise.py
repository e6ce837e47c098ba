"""Chapter 11's lesson logic: which runs are the same bits, what the order-fixed reduction costs, and the
timeline of a run killed and resumed. Taught in notebooks/11_bitwise.ipynb.

Analysis side: reads run folders (runfiles, parity) and draws; it launches nothing and imports no training
code. The mechanism it teaches lives in lab_utils/core/ordered_reduce.py (the hook) and lab_utils/core/resume.py.
"""

from __future__ import annotations

from pathlib import Path

import torch

from lab_utils.analysis import parity
from lab_utils.core import ordered_reduce, runfiles


def matrix(runs: dict[str, Path]) -> tuple[list[str], list[list[int]]]:
    """Pairwise parity tiers of `runs` ({label: run folder}); the diagonal is 3 (a run is itself)."""
    labels = list(runs)
    tiers = [[3 if a == b else parity.compare(runs[a], runs[b]).tier for b in labels] for a in labels]
    return labels, tiers


def same_weights(a: Path, b: Path) -> bool:
    """Every tensor of the two runs' final model.pt `torch.equal` (the strictest check: not a tolerance)."""
    wa, wb = runfiles.load_tensors(a), runfiles.load_tensors(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def ms_per_step(run_dir: Path, skip: int = 1) -> float:
    """Mean wall time per step after the first `skip` steps (start-up and first-iteration costs)."""
    rows = runfiles.read_metrics(run_dir)
    first, last = rows[skip - 1], rows[-1]
    return 1000 * (last["elapsed"] - first["elapsed"]) / (last["step"] - first["step"])


def cost_rows(runs: dict[tuple[int, str], Path]) -> list[dict]:
    """{(world_size, "allreduce"|"ordered"): run} -> rows of ms/step and MB one rank receives per step."""
    rows = []
    for (w, how), run in sorted(runs.items()):
        n = sum(t.numel() for t in runfiles.load_tensors(run).values() if t.is_floating_point())
        rows.append({"ranks": w, "reduction": how, "ms_per_step": ms_per_step(run),
                     "mb_per_rank": ordered_reduce.bytes_per_rank(n, 4, w, how) / 1e6})
    return rows


def timeline(run_dir: Path) -> list[dict]:
    """One row per step of the run's final record: step, attempt (torchrun's restart count), and the wall
    time it finished, in seconds since the run's first step."""
    rows = runfiles.read_metrics(run_dir)
    t0 = rows[0]["wall"]
    return [{"step": r["step"], "attempt": r["attempt"], "t": r["wall"] - t0} for r in rows]


def checkpoint_steps(run_dir: Path) -> list[int]:
    """Steps at which checkpoints exist in the run folder (step_{k}.pt = after k optimizer steps)."""
    return sorted(int(p.stem.split("_")[1]) for p in (Path(run_dir) / "checkpoints").glob("step_*.pt"))


def plot_matrix(labels: list[str], tiers: list[list[int]], path=None, title: str = "parity tier of each pair"):
    from lab_utils.analysis.plotting import _save, plt

    colours = {0: "#d73027", 1: "#fc8d59", 2: "#91bfdb", 3: "#1a9850"}
    fig, ax = plt.subplots(figsize=(0.8 * len(labels) + 2, 0.6 * len(labels) + 1.4))
    for i, row in enumerate(tiers):
        for j, t in enumerate(row):
            ax.add_patch(plt.Rectangle((j, i), 1, 1, color=colours[t]))
            ax.text(j + 0.5, i + 0.5, str(t), ha="center", va="center", fontsize=11,
                    color="white" if t in (0, 3) else "black")
    ax.set(xlim=(0, len(labels)), ylim=(len(labels), 0), title=title + "  (3 = bitwise, 2 = step-wise)")
    ax.set_xticks([k + 0.5 for k in range(len(labels))], labels, rotation=35, ha="right")
    ax.set_yticks([k + 0.5 for k in range(len(labels))], labels)
    fig.tight_layout()
    _save(fig, path)
    return fig


def plot_cost(rows: list[dict], path=None):
    from lab_utils.analysis.plotting import _save, plt

    worlds = sorted({r["ranks"] for r in rows})
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    for k, how in enumerate(ordered_reduce.CHOICES):
        sel = {r["ranks"]: r for r in rows if r["reduction"] == how}
        xs = [i + (k - 0.5) * 0.38 for i in range(len(worlds))]
        word = {"ordered": "order-fixed hook", "allreduce": "stock all-reduce"}.get(how, how)
        ax1.bar(xs, [sel[w]["ms_per_step"] if w in sel else 0 for w in worlds], width=0.38, label=word)
        ax2.bar(xs, [sel[w]["mb_per_rank"] if w in sel else 0 for w in worlds], width=0.38, label=word)
    for ax, ylabel in ((ax1, "ms per step (this box)"), (ax2, "MB one rank receives per step")):
        ax.set_xticks(range(len(worlds)), [f"{w} ranks" for w in worlds])
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8, frameon=False)
    ax1.set_title("time, measured (ranks share this box's cores)")
    ax2.set_title("bytes, computed (bandwidth-optimal count)")
    fig.tight_layout()
    _save(fig, path)
    return fig


def plot_timeline(runs: dict[str, Path], kills: dict[str, int], path=None):
    """Steps against wall time for each run ({label: folder}); colour = attempt; ✕ = the injected kill at the
    start of step k; ◆ = checkpoints. A resumed run redoes the steps after its last checkpoint."""
    from lab_utils.analysis.plotting import LEGEND, _save, plt

    fig, axes = plt.subplots(1, len(runs), figsize=(5.5 * len(runs), 3.8), squeeze=False)
    for ax, (label, run) in zip(axes[0], runs.items(), strict=True):
        rows = timeline(run)
        for attempt in sorted({r["attempt"] for r in rows}):
            sel = [r for r in rows if r["attempt"] == attempt]
            ax.plot([r["t"] for r in sel], [r["step"] for r in sel], marker="o", ms=4, lw=1,
                    label=f"attempt {attempt}" + (" (after the restart)" if attempt else ""))
        saved = [r for r in rows if r["step"] + 1 in checkpoint_steps(run)]
        ax.plot([r["t"] for r in saved], [r["step"] for r in saved], ls="none", marker="D", ms=8, mfc="none",
                color="black", label="checkpoint written after this step")
        if label in kills:
            before = [r for r in rows if r["attempt"] == 0]
            ax.axhline(kills[label] - 0.5, color="red", ls=":", lw=1)
            ax.plot([before[-1]["t"]], [kills[label]], marker="X", ms=11, color="red", ls="none",
                    label=f"SIGKILL at the start of step {kills[label]}")
        ax.set(xlabel="seconds since step 0 finished", ylabel="step finished", title=label)
        ax.legend(**LEGEND)
    fig.tight_layout()
    _save(fig, path)
    return fig


def resumed_from(run_dir: Path) -> int | None:
    """The step the run's last start resumed from (result.json), None for a run that never resumed."""
    import json

    return json.loads((Path(run_dir) / runfiles.RESULT).read_text()).get("resumed_from")
