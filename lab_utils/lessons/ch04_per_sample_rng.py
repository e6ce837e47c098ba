"""Chapter 04's lesson logic: augmentation keyed by index vs by visit, the same visit on any rank or worker,
dropout masks keyed by sample, and what the hashing costs. Pictures are drawn from the real dataset and the
real loaders train.py uses (`samplers.make_loader`), so a count made here is a statement about the runs.

Taught in notebooks/04_per_sample_rng.ipynb (the keyed generators themselves: lab_utils/core/keyed_rng.py).
"""

from __future__ import annotations

import time

import torch

from lab_utils.core import config, keyed_rng, samplers
from lab_utils.core.workloads import bn_net

EPOCHS = 3  # epochs shown and counted: visit ids idx, n + idx, 2n + idx


def datasets(n: int, seed: int, modes=("none", "article", "keyed")) -> dict[str, bn_net.DigitsDataset]:
    return {mode: bn_net.DigitsDataset(augment=mode, seed=seed, n=n) for mode in modes}


def count_repeats(ds: bn_net.DigitsDataset, epochs: int = EPOCHS) -> int:
    """How many samples get bit-identical pixels in every one of epochs 0..epochs-1 (visit ids e * n + idx)."""
    def same_every_epoch(idx):
        first = ds[idx]["x"]
        return all(torch.equal(first, ds[e * ds.n + idx]["x"]) for e in range(1, epochs))

    return sum(same_every_epoch(idx) for idx in range(ds.n))


def plot_epochs(data: dict[str, bn_net.DigitsDataset], idxs=(0, 1, 2), modes=("article", "keyed"),
                epochs: int = EPOCHS):
    """Rows: (sample, mode); columns: the original, then the sample's augmentation in each epoch."""
    import matplotlib.pyplot as plt

    n = data[modes[0]].n
    fig, axes = plt.subplots(len(idxs) * len(modes), epochs + 1, figsize=(1.7 * (epochs + 1), 1.75 * len(idxs)
                                                                            * len(modes)))
    for i, idx in enumerate(idxs):
        for j, mode in enumerate(modes):
            row = axes[len(modes) * i + j]
            cells = [("original", data["none"][idx]["x"])]
            cells += [(f"epoch {e}, visit {e * n + idx}", data[mode][e * n + idx]["x"]) for e in range(epochs)]
            for ax, (label, x) in zip(row, cells, strict=True):
                ax.imshow(x[0], cmap="gray_r", vmin=-1, vmax=4)
                ax.set_xticks([])
                ax.set_yticks([])
                ax.set_title(label, fontsize=8)
            row[0].set_ylabel(f"{mode}\nidx {idx}", fontsize=9)
    fig.suptitle("augment=article repeats every epoch; augment=keyed draws anew per visit", fontsize=10)
    fig.tight_layout()
    return fig


def visit_images(augment: str, world_size: int, n: int, global_batch_size: int, num_workers: int = 0,
                 steps: int = 6) -> dict[int, torch.Tensor]:
    """{visit id: augmented image} for the first `steps` steps of every rank's real loader.

    Each rank's process is seeded the article's way first (`seed + rank`, §2.2): only `augment=global` reads
    that generator, the keyed modes must not care."""
    cfg = config.resolve(dict(model="bn_net", augment=augment, n_samples=n, global_batch_size=global_batch_size,
                              num_workers=num_workers), world_size)
    ds = bn_net.DigitsDataset(augment=augment, seed=cfg["data_seed"], n=n)
    images = {}
    for rank in range(world_size):
        torch.manual_seed(cfg["seed"] + rank)
        it = iter(samplers.make_loader(ds, rank, world_size, cfg))
        for _ in range(steps * cfg["grad_accum_steps"]):
            batch = next(it)
            images.update(zip(batch["key"].tolist(), batch["x"], strict=True))
        del it  # shuts the worker processes down
    return images


def same_visit_counts(modes, n: int, global_batch_size: int, world_size: int = 2, num_workers: int = 2
                      ) -> dict[str, dict[str, int]]:
    """Per mode: visits handed out by one process, and how many of them got the same pixels on `world_size`
    ranks and in a one-process run with `num_workers` workers."""
    out = {}
    for mode in modes:
        single = visit_images(mode, 1, n, global_batch_size)
        ranks = visit_images(mode, world_size, n, global_batch_size)
        workers = visit_images(mode, 1, n, global_batch_size, num_workers=num_workers)
        if not single.keys() == ranks.keys() == workers.keys():  # the same visits (chapter 03): only pixels differ
            raise RuntimeError(f"augment={mode}: the loaders handed out different visit ids")
        out[mode] = {"total": len(single), "ranks": sum(torch.equal(single[v], ranks[v]) for v in single),
                     "workers": sum(torch.equal(single[v], workers[v]) for v in single)}
    return out


def dropout_masks(p: float, keys: torch.Tensor, width: int, seed: int, world_size: int = 2,
                  per_rank_seed: bool = True) -> dict[str, torch.Tensor]:
    """Keep-masks (True = kept) for `keys` x `width` units: computed as one batch, and split over `world_size`
    "ranks" -- by KeyedDropout, and by nn.Dropout seeded `seed + rank` (or `seed` on every rank)."""
    ones = torch.ones(len(keys), width)
    parts = torch.arange(len(keys)).chunk(world_size)
    keyed = keyed_rng.KeyedDropout(p, site=0).train()
    plain = torch.nn.Dropout(p).train()

    def keyed_mask(rows):
        with keyed_rng.dropout_keys(keys[rows], seed=seed):
            return keyed(ones[rows]) != 0

    def torch_mask(rows, rank):
        torch.manual_seed(seed + (rank if per_rank_seed else 0))
        return plain(ones[rows]) != 0

    return {"KeyedDropout, one batch": keyed_mask(torch.arange(len(keys))),
            f"KeyedDropout, {world_size} ranks": torch.cat([keyed_mask(r) for r in parts]),
            "nn.Dropout, one process": torch_mask(torch.arange(len(keys)), 0),
            f"nn.Dropout, {world_size} ranks ({'seed+rank' if per_rank_seed else 'same seed'})":
                torch.cat([torch_mask(r, rank) for rank, r in enumerate(parts)])}


def plot_masks(masks: dict[str, torch.Tensor], keys: torch.Tensor, world_size: int = 2):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(masks), figsize=(3.1 * len(masks), 2.6))
    per_rank = len(keys) // world_size
    for ax, (title, m) in zip(axes, masks.items(), strict=True):
        ax.imshow(m, cmap="Greys", vmin=0, vmax=1)
        for r in range(1, world_size):
            ax.axhline(r * per_rank - 0.5, color="tab:red", lw=1)
        ax.set_title(title, fontsize=9)
        ax.set(xlabel="unit (black = kept)", ylabel="visit id", yticks=range(len(keys)), yticklabels=keys.tolist())
    fig.tight_layout()
    return fig


def plot_one_per_class(ds: bn_net.DigitsDataset):
    import matplotlib.pyplot as plt

    first_of = {}
    for i in range(len(ds)):
        first_of.setdefault(int(ds[i]["y"]), i)
        if len(first_of) == bn_net.NUM_CLASSES:
            break
    fig, axes = plt.subplots(1, len(first_of), figsize=(11, 1.5))
    for ax, (label, i) in zip(axes, sorted(first_of.items()), strict=True):
        ax.imshow(ds[i]["x"][0], cmap="gray_r")
        ax.set(title=f"{label}", xticks=[], yticks=[])
    fig.tight_layout()
    return fig


def hashing_cost(rows: int = 32, width: int = 4096, repeats: int = 20) -> dict[str, float]:
    """Seconds per call (best of `repeats`) of a keyed uniform draw vs torch.rand of the same shape, on CPU.
    Timings: printed for orientation, never asserted."""
    keys = torch.arange(rows)

    def best(fn):
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    return {"keyed_uniform": best(lambda: keyed_rng.keyed_uniform(0, keys, 0, (width,))),
            "torch.rand": best(lambda: torch.rand(rows, width))}
