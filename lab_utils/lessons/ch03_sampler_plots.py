"""Who holds which sample at each step: the per-rank streams of `lab_utils.core.samplers`, laid out and drawn.

Taught in notebooks/03_samplers.ipynb. Everything here reads the *same* streams train.py trains on
(`samplers.rank_stream`), so a picture or a check made here is a statement about the real runs.

- `step_visits`: the visit ids each rank holds at each step, shape (steps, world_size, per_rank).
- `same_batch_per_step`: at each step, do the ranks together hold exactly the single run's samples?
- `layout_on_single`: place each rank's samples under the column where the single run has them.
- `plot_rank_grid`: rows = steps, columns = positions of the single run's batch, colour = rank.
"""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np

from lab_utils.core import samplers

SINGLE = -1  # "rank" of a cell in the single-process panel


def step_visits(kind: str, n: int, world_size: int, cfg: dict, steps: int) -> np.ndarray:
    """(steps, world_size, per_rank) visit ids (epoch * n + idx) from `samplers.rank_stream`.

    per_rank = global_batch_size // world_size: one step's micro-batches of one rank, in the order the
    rank consumes them (grad_accum_steps micro-batches of micro_batch_size).
    """
    per_rank = cfg["global_batch_size"] // world_size
    out = np.empty((steps, world_size, per_rank), dtype=np.int64)
    for rank in range(world_size):
        stream = iter(samplers.rank_stream(kind, n, rank, world_size, cfg))
        out[:, rank, :] = np.fromiter(itertools.islice(stream, steps * per_rank), dtype=np.int64,
                                      count=steps * per_rank).reshape(steps, per_rank)
    return out


def same_batch_per_step(single: np.ndarray, ranks: np.ndarray, n: int) -> list[bool]:
    """Per step: is the multiset of dataset indices the ranks hold equal to the single run's?

    `single` is step_visits(..., world_size=1, ...). A multiset, not a set, so a padded duplicate counts.
    """
    return [Counter((s % n).ravel().tolist()) == Counter((r % n).ravel().tolist())
            for s, r in zip(single, ranks, strict=True)]


def repeated_visits(ranks: np.ndarray) -> list[tuple[int, int, int]]:
    """(step, rank, visit id) of every visit id already handed out earlier in the run (any rank).

    Visit ids are unique within an honest stream; a repeat is a sample trained on twice in one epoch —
    what DistributedSampler's padding of an uneven dataset does.
    """
    seen, out = set(), []
    for step, per_rank in enumerate(ranks):
        for rank, visits in enumerate(per_rank):
            for v in visits.tolist():
                if v in seen:
                    out.append((step, rank, v))
                seen.add(v)
    return out


def layout_on_single(single_step: np.ndarray, rank_step: np.ndarray, n: int):
    """Lay out one step of the ranks' samples on the single run's batch of that step.

    Returns (rank, idx, foreign) arrays of length global_batch_size: column j shows the sample the single
    run has at position j, and which rank holds it. Samples the single run does not have at this step
    ("foreign") fill the columns left over, in rank order, flagged True.
    """
    single_idx = (np.asarray(single_step).ravel() % n).tolist()
    size = len(single_idx)
    rank = np.full(size, SINGLE, dtype=np.int64)
    idx = np.full(size, -1, dtype=np.int64)
    foreign = np.zeros(size, dtype=bool)
    free = {}  # dataset index -> columns of the single batch not yet claimed
    for col, i in enumerate(single_idx):
        free.setdefault(i, []).append(col)
    leftovers = []
    for r, visits in enumerate(rank_step):
        for v in visits.tolist():
            cols = free.get(v % n)
            if cols:
                col = cols.pop(0)
                rank[col], idx[col] = r, v % n
            else:
                leftovers.append((r, v % n))
    empty = [c for c in range(size) if rank[c] == SINGLE]
    if len(leftovers) != len(empty):
        raise ValueError(f"the ranks hold {len(leftovers) + size - len(empty)} samples at this step, the "
                         f"single run {size}: compare runs with the same global_batch_size")
    for col, (r, i) in zip(empty, leftovers, strict=True):
        rank[col], idx[col], foreign[col] = r, i, True
    return rank, idx, foreign


def plot_rank_grid(single: np.ndarray, panels: dict[str, np.ndarray], n: int, title: str = "",
                   single_label: str = "1 process"):
    """One panel per sampler: rows = steps, columns = positions in the single run's global batch.

    Cell text = dataset index; colour = the rank that holds it (grey: the single process). A red frame marks
    a sample the single run does not have at that step; a trailing "*" a visit handed out twice (padding).
    Row labels give each step's epoch (of the single run's first sample in it).
    """
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch, Rectangle

    steps, _, size = single.shape
    world_size = max(p.shape[1] for p in panels.values())
    rank_colours = [plt.get_cmap("tab10")(r) for r in range(world_size)]
    cmap = ListedColormap(["#d9d9d9"] + rank_colours)  # value 0 = single, r + 1 = rank r
    # ~0.6 in per cell so a two-digit index in 12 pt fits; constrained layout keeps row labels, titles and the
    # legend inside the figure (no clipped "step 7 (ep 1)").
    n_panels = len(panels) + 1
    fig, axes = plt.subplots(1, n_panels, figsize=(1.6 + 0.62 * size * n_panels + 0.4 * n_panels,
                                                    0.5 * steps + 1.9),
                             sharey=True, squeeze=False, layout="constrained")
    axes = axes[0]
    epochs = (single[:, 0, 0] // n).tolist()
    grids = {single_label: (np.full((steps, size), SINGLE), single[:, 0, :] % n, np.zeros((steps, size), bool),
                            set())}
    for name, ranks in panels.items():
        laid = [layout_on_single(single[s], ranks[s], n) for s in range(steps)]
        dup_cells = set()
        for step, rank, v in repeated_visits(ranks):
            cols = [c for c in range(size) if laid[step][0][c] == rank and laid[step][1][c] == v % n]
            dup_cells.update((step, c) for c in cols[:1])
        grids[name] = (np.stack([x[0] for x in laid]), np.stack([x[1] for x in laid]),
                       np.stack([x[2] for x in laid]), dup_cells)
    for ax, (name, (rank, idx, foreign, dups)) in zip(axes, grids.items(), strict=True):
        ax.imshow(rank + 1, cmap=cmap, vmin=0, vmax=world_size, aspect="auto")
        for s in range(steps):
            for c in range(size):
                text = f"{idx[s, c]}" + ("*" if (s, c) in dups else "")
                ax.text(c, s, text, ha="center", va="center", fontsize=12, fontweight="bold",
                        color="white" if rank[s, c] != SINGLE else "black")
                if foreign[s, c]:
                    ax.add_patch(Rectangle((c - 0.5, s - 0.5), 1, 1, fill=False, edgecolor="red", lw=3))
            if s and epochs[s] != epochs[s - 1]:
                ax.axhline(s - 0.5, color="black", lw=2, ls="--")
        ax.set_title(name, fontsize=11, wrap=True)
        ax.set_xticks(range(size))
        ax.set_xticklabels(range(size), fontsize=10)
        ax.set_xlabel("position in the batch", fontsize=10)
    axes[0].set_yticks(range(steps))
    axes[0].set_yticklabels([f"step {s} (epoch {e})" for s, e in enumerate(epochs)], fontsize=11)
    handles = [Patch(color=rank_colours[r], label=f"rank {r}") for r in range(world_size)]
    handles.append(Patch(facecolor="white", edgecolor="red", lw=2, label="not in the single run's batch"))
    if any(grid[3] for grid in grids.values()):
        handles.append(Patch(facecolor="white", edgecolor="white", label="* = a padded duplicate"))
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize=11, frameon=False)
    if title:
        fig.suptitle(title, fontsize=13)
    return fig
