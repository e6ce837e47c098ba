"""Chapter 12's lesson logic: which runs are the same bits, what the order-fixed reduction costs, and the
timeline of a run killed and resumed. Taught in notebooks/12_bitwise.ipynb.

Analysis side: reads run folders (runfiles, parity) and draws; it launches nothing and imports no training
code. The mechanism it teaches lives in lab_utils/core/ordered_reduce.py (the hook) and lab_utils/core/resume.py.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from lab_utils.analysis import parity
from lab_utils.core import ordered_reduce, resume, runfiles

# The committed two-GPU measurement of the hook (`ddp-lab bench hook --ranks 2 --preset workshop`, NCCL).
H200 = Path(__file__).resolve().parents[2] / "docs" / "measured" / "h200x2" / "hook_2gpu.txt"


def matrix(runs: dict[str, Path]) -> tuple[list[str], list[list[int]]]:
    """Pairwise parity tiers of `runs` ({label: run folder}); the diagonal is 3 (a run is itself)."""
    labels = list(runs)
    tiers = [[3 if a == b else parity.compare(runs[a], runs[b]).tier for b in labels] for a in labels]
    return labels, tiers


def same_weights(a: Path, b: Path) -> bool:
    """Every tensor of the two runs' final model.pt `torch.equal` (the strictest check: not a tolerance)."""
    wa, wb = runfiles.load_tensors(a), runfiles.load_tensors(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def ulp_distance(a: Path, b: Path) -> dict[str, float]:
    """Per floating-point tensor of the two runs' final weights: the largest |Δ| in float32 ulps of A's value
    (the spacing between |a| and the next float up); 0 where the tensors are the same bits."""
    wa, wb = runfiles.load_tensors(a), runfiles.load_tensors(b)
    out = {}
    for k, x in wa.items():
        if x.is_floating_point():
            x, y = x.float(), wb[k].float()
            ulp = torch.nextafter(x.abs(), torch.tensor(float("inf"))) - x.abs()
            out[k] = float(((x - y).abs() / ulp).max())
    return out


def noise_words(report: parity.ParityReport, ulps: dict[str, float], lr: float) -> str:
    """Exercise 2's answer, worded from the measurement: how many tensors differ, by how many ulps, and how
    the worst |Δ| compares with one optimizer update of size lr."""
    moved = sorted(u for u in ulps.values() if u > 0)
    if not moved:
        return "No tensor differs: this pair is the same bits (nothing for the order of the additions to explain)."
    worst = max(report.per_tensor, key=report.per_tensor.get)
    d, u = report.per_tensor[worst], ulps[worst]
    size = "a few ulps" if u <= 4 else "tens of ulps" if u < 100 else f"about {u:.0e} ulps"
    typical = moved[len(moved) // 2]
    text = (f"{len(moved)} of {len(ulps)} tensors differ; the median of their largest differences is "
            f"{typical:.0f} ulp(s); the worst, {worst}, is off by {size} ({u:.0f} ulps, |Δ| {d:.1e} = "
            f"{d / lr:.2g} of one update of size lr={lr:g}). ")
    if d >= 0.01 * lr:
        text += ("Far more than the last-bit noise of one addition: Adam divides each update by √v, so where a "
                 "gradient is near zero a last-bit difference in it changes the update itself, step after step.")
    else:
        text += "Last-bit noise of the additions, carried by a few steps; far below one update."
    return text + " The order-fixed hook removes it: those runs are the same bits."


def answer(text: str):
    """A computed answer, shown collapsed under the solution's output (open it after predicting)."""
    import html

    from IPython.display import HTML

    return HTML(f"<details><summary><b>Answer</b> (computed from this run)</summary><p>{html.escape(text)}</p>"
                "</details>")


def cost_rows(runs: dict[tuple[int, str], Path]) -> list[dict]:
    """{(world_size, "allreduce"|"ordered"): run} -> rows of ms/step (measured), the MB one rank receives per
    step and the MB the all-gather holds on each rank (both computed from the parameter count)."""
    rows = []
    for (w, how), run in sorted(runs.items()):
        n = sum(t.numel() for t in runfiles.load_tensors(run).values() if t.is_floating_point())
        rows.append({"ranks": w, "reduction": how, "ms_per_step": runfiles.ms_per_step(run), "elements": n,
                     "mb_per_rank": ordered_reduce.bytes_per_rank(n, 4, w, how) / 1e6,
                     # the hook's `gathered` list: W fp32 copies of the bucket (at most all N elements) on every
                     # rank until they are added; the stock hook reduces the bucket in place
                     "held_mb": w * n * 4 / 1e6 if how == "ordered" else n * 4 / 1e6})
    return rows


def cores() -> int:
    """CPU cores this process may run on (a container's share, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS has no sched_getaffinity
        return os.cpu_count() or 1


def oversubscribed(worlds: list[int]) -> str:
    """What ms/step on this machine measures, from its core count: at W ranks > cores the processes take
    turns on the cores, so the time is mostly oversubscription, not the reduction."""
    c, over = cores(), [w for w in sorted(worlds) if w > cores()]
    if not over:
        return f"this machine gives every rank a core of its own ({c} cores): ms/step is the whole step"
    share = ", ".join(f"{w} ranks: {w / c:.3g} processes per core" for w in over)
    return (f"this machine has {c} CPU cores ({share}): there ms/step measures CPU oversubscription (ranks "
            "taking turns on the cores), not the cost of the hook")


def h200_measured(path: Path = H200) -> str:
    """The committed two-GPU figures of `ddp-lab bench hook` (its 'HOW at W ranks: X ms/step, tier T' lines)."""
    text = Path(path).read_text()
    found = re.findall(r"^(\w+) at (\d+) ranks: ([\d.]+) ms/step, tier (\d)$", text, re.M)
    if not found:
        raise ValueError(f"{path}: no 'HOW at W ranks: X ms/step, tier T' line (not a bench hook summary?)")
    head = next((line for line in text.splitlines() if line.startswith("bench_hook:")), "")
    word = {"ordered": "order-fixed hook", "allreduce": "stock all-reduce"}
    return (f"measured on two H200s over NCCL ({Path(path).name}): "
            + ", ".join(f"{word.get(h, h)} {ms} ms/step at {w} ranks (tier {t})" for h, w, ms, t in found)
            + (f" [{head.removeprefix('bench_hook: ')}]" if head else ""))


def timeline(run_dir: Path) -> list[dict]:
    """One row per step record, in wall-clock order: step, attempt (torchrun's restart count), the wall time
    it finished (seconds since the run's first step) and `redone`: True for a step an earlier attempt did past
    its last checkpoint (resume.REDONE), the work the kill lost and the restart did again."""
    rows = [dict(r, redone=False) for r in runfiles.read_metrics(run_dir)]
    rows += [dict(r, redone=True) for r in resume.redone_metrics(run_dir)]
    rows.sort(key=lambda r: r["wall"])
    t0 = rows[0]["wall"]
    return [{"step": r["step"], "attempt": r["attempt"], "t": r["wall"] - t0, "redone": r["redone"]} for r in rows]


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
    for ax, ylabel in ((ax1, "ms per step (this machine)"), (ax2, "MB one rank receives per step")):
        ax.set_xticks(range(len(worlds)), [f"{w} ranks" for w in worlds])
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8, frameon=False)
    ax1.set_title(f"time, measured on {cores()} CPU cores (more ranks: oversubscribed)")
    ax2.set_title("bytes, computed (the bytes_per_rank formula)")
    fig.tight_layout()
    _save(fig, path)
    return fig


def plot_timeline(runs: dict[str, Path], kills: dict[str, int], path=None):
    """Steps against wall time for each run ({label: folder}); colour = attempt; grey = steps attempt 0 did
    past its last checkpoint (lost, done again after the restart; gid "redone"); ✕ = the kill at the start of
    step k, after attempt 0's last step (gid "kill"); ◆ = checkpoints."""
    from lab_utils.analysis.plotting import LEGEND, _save, plt

    fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 3.8), squeeze=False)
    for ax, (label, run) in zip(axes[0], runs.items(), strict=True):
        rows = timeline(run)
        kept = [r for r in rows if not r["redone"]]
        for attempt in sorted({r["attempt"] for r in kept}):
            sel = [r for r in kept if r["attempt"] == attempt]
            ax.plot([r["t"] for r in sel], [r["step"] for r in sel], marker="o", ms=4, lw=1,
                    label=f"attempt {attempt}" + (" (after the restart)" if attempt else " (first start)"))
        lost = [r for r in rows if r["redone"]]
        if lost:  # joined to attempt 0's last kept step, so the greyed steps read as that attempt's lost tail
            tail = [r for r in kept if r["attempt"] == lost[0]["attempt"] and r["t"] <= lost[0]["t"]][-1:]
            ax.plot([r["t"] for r in tail + lost], [r["step"] for r in tail + lost], color="0.65", lw=1, ls="--")
            ax.plot([r["t"] for r in lost], [r["step"] for r in lost], marker="o", ms=5, ls="none", color="0.65",
                    gid="redone", label=f"lost: done by attempt {lost[0]['attempt']} after its last checkpoint, "
                    "redone")
        saved = [r for r in kept if r["step"] + 1 in checkpoint_steps(run)]
        ax.plot([r["t"] for r in saved], [r["step"] for r in saved], ls="none", marker="D", ms=8, mfc="none",
                color="black", label="checkpoint written after this step")
        if label in kills:
            first = [r for r in rows if r["attempt"] == 0]  # the kill comes right after its last step
            ax.plot([first[-1]["t"]], [kills[label]], marker="X", ms=11, color="red", ls="none", gid="kill",
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
