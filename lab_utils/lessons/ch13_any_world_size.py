"""Chapter 13's lesson logic: the tree's tier matrix across world sizes, a run resized 4 -> 2 ranks and its
timeline, the cost table, and the tree drawn. Taught in notebooks/13_any_world_size.ipynb.

Reads run folders (runfiles, parity) and a committed bench table, and draws; it launches nothing. The mechanism
lives in lab_utils/core/tree_reduce.py (the chunk tree, its comm hook, TreeAccumulator) and config.py (the
refusals); the tier matrix and same_weights are chapter 12's (lab_utils/lessons/ch12_bitwise.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from lab_utils.core import runfiles
from lab_utils.lessons.ch12_bitwise import matrix, plot_matrix, resumed_from, same_weights

__all__ = ["matrix", "plot_matrix", "same_weights", "resumed_from", "resize_rows", "plot_resize", "tree_levels",
           "plot_tree", "bench_rows", "bench_note", "BENCH"]

# `ddp-lab bench hook --ranks 2,4,8 --json ...` on the 2-core CPU box: stock, ordered and tree at 2/4/8 gloo
# ranks with the same micro-batches (a measurement committed as a file: shown, never a verdict row).
BENCH = Path(__file__).resolve().parents[2] / "docs" / "measured" / "cpu2" / "bench_hook_tree.json"


def resize_rows(run_dir: Path, first_world: int, then_world: int) -> list[dict]:
    """One row per step of a resized run (a checkpoint of a `first_world`-rank run resumed at `then_world`
    ranks): step, loss, the world size that computed it, and its wall time in seconds since step 0 finished.
    The steps before the resume are the checkpointed run's records, kept in the resumed run's metrics."""
    rows = runfiles.read_metrics(run_dir)
    start = resumed_from(run_dir)
    if start is None:
        raise ValueError(f"{run_dir}: not a resumed run (result.json has no resumed_from)")
    t0 = rows[0]["wall"]
    return [{"step": r["step"], "loss": r["loss"], "ranks": first_world if r["step"] < start else then_world,
             "t": r["wall"] - t0} for r in rows]


def plot_resize(resized: Path, reference: Path, first_world: int, then_world: int, path=None):
    """Left: the resized run's steps against wall time, coloured by the world size that computed them (the gap:
    from the checkpoint to the 2-rank run's first step, its launch and resume included, plus however long the
    new run waited to be started). Right: its loss per step on the uninterrupted 1-process run's."""
    from lab_utils.analysis.plotting import LEGEND, _save, plt

    rows = resize_rows(resized, first_world, then_world)
    ref = runfiles.read_metrics(reference)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
    for w, colour in ((first_world, "#4575b4"), (then_world, "#d73027")):
        sel = [r for r in rows if r["ranks"] == w]
        ax1.plot([r["t"] for r in sel], [r["step"] for r in sel], marker="o", ms=4, lw=1, color=colour,
                 label=f"{w} ranks")
        ax2.plot([r["step"] for r in sel], [r["loss"] for r in sel], marker="o", ms=7, mfc="none", ls="none",
                 color=colour, label=f"resized run: {w} ranks")
    ax2.plot([r["step"] for r in ref], [r["loss"] for r in ref], marker=".", color="black", lw=1,
             label="1 process, uninterrupted")
    ax1.set(xlabel="seconds since step 0 finished", ylabel="step finished",
            title=f"{first_world} ranks, checkpoint, resumed at {then_world} ranks")
    ax2.set(xlabel="step", ylabel="loss (logged through the tree)", title="the same losses, every step")
    ax1.legend(**LEGEND)
    ax2.legend(**LEGEND)
    fig.tight_layout()
    _save(fig, path)
    return fig


def tree_levels(chunks: int, world: int) -> list[list[str]]:
    """The tree as text, leaves first: each level's nodes, named after the chunks they sum, and where they are
    computed at this world size ("r0".., or "all" for the top levels every rank finishes after the gather)."""
    per = chunks // world
    levels, width = [], 1
    while width <= chunks:
        nodes = []
        for start in range(0, chunks, width):
            span = f"{start}" if width == 1 else f"{start}-{start + width - 1}"
            nodes.append(f"{span}@{'r' + str(start // per) if width <= per else 'all'}")
        levels.append(nodes)
        width *= 2
    return levels


def plot_tree(chunks: int, worlds: list[int], path=None):
    """One panel per world size: the same tree; a node's colour says which rank computes it (grey: every
    rank, after the all-gather of the subtree roots)."""
    from lab_utils.analysis.plotting import _save, plt

    # one colour per rank, none grey (grey is "every rank")
    palette = ["#4575b4", "#d73027", "#1a9850", "#984ea3", "#ff7f00", "#a65628", "#f781bf", "#17becf"]
    fig, axes = plt.subplots(1, len(worlds), figsize=(4.2 * len(worlds), 3.0), squeeze=False)
    for ax, w in zip(axes[0], worlds, strict=True):
        levels = tree_levels(chunks, w)
        for depth, nodes in enumerate(levels):
            for k, node in enumerate(nodes):
                owner = node.split("@")[1]
                x = (k + 0.5) * chunks / len(nodes)
                colour = "#bbbbbb" if owner == "all" else palette[int(owner[1:]) % len(palette)]
                ax.scatter([x], [depth], s=220, color=colour, zorder=3)
                if depth:
                    for child in (2 * k, 2 * k + 1):
                        cx = (child + 0.5) * chunks / len(levels[depth - 1])
                        ax.plot([x, cx], [depth, depth - 1], color="#666666", lw=0.8, zorder=1)
        per = chunks // w
        ax.set(title=f"W = {w}: {per} chunk{'s' if per > 1 else ''} per rank", xticks=[k + 0.5 for k in range(chunks)],
               xticklabels=[str(k) for k in range(chunks)], yticks=range(len(levels)),
               xlabel="chunk (global order)", ylabel="tree level")
    fig.suptitle("one tree at every W; colour = the rank that computes the node, grey = every rank", fontsize=10)
    fig.tight_layout()
    _save(fig, path)
    return fig


def bench_rows(path: Path = BENCH) -> list[dict]:
    """The committed `ddp-lab bench hook` rows: ranks, reduction, backend, ms_per_step, bytes_per_rank, tier."""
    return json.loads(Path(path).read_text())


def bench_note(path: Path = BENCH) -> str:
    """How the committed table was measured: the first line of the .txt beside the .json (command, commit, box)."""
    return Path(path).with_suffix(".txt").read_text().splitlines()[0].lstrip("# ")
