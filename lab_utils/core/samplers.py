"""Per-rank sample streams for the three `sampler` choices, and the DataLoader around them.

Taught in notebooks/03_samplers.ipynb. Every stream is infinite and yields *visit ids*
(epoch * n + idx), so a run of any length crosses epoch boundaries exactly as a real one does and
per-sample randomness can be keyed by the visit.

- `distributed`: the stock `torch.utils.data.DistributedSampler`, `set_epoch(e)` every epoch. Rank r gets
  `perm[r::W]` of `randperm(n, seed + epoch)`: together the ranks hold the single run's batch at each step.
- `global`: the lab's `GlobalBatchSampler` (contiguous layout): rank r holds the r-th slice of the single
  run's batch, the article's §4.1 "single-card order".
- `random`: `RandomSampler(generator=seeded)`, the common single-GPU default; rank r takes every W-th
  position. Its epoch-1 order is not `randperm(n, seed + 1)`, so it agrees with the others in epoch 0 only.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, Sampler

from lab_utils.core.global_sampler import GlobalBatchSampler


class Sized:
    """A stand-in dataset that has only a length: torch's samplers need nothing but len(dataset)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n


class DistributedStream(Sampler[int]):
    def __init__(self, n: int, rank: int, world_size: int, seed: int, set_epoch: bool = True,
                 drop_last: bool = False):
        self.n, self.rank, self.world_size, self.seed = n, rank, world_size, seed
        self.set_epoch, self.drop_last = set_epoch, drop_last

    def __iter__(self) -> Iterator[int]:
        # drop_last=False pads an uneven dataset with repeated samples so every rank gets the same count.
        sampler = DistributedSampler(Sized(self.n), num_replicas=self.world_size, rank=self.rank,
                                     shuffle=True, seed=self.seed, drop_last=self.drop_last)
        for epoch in itertools.count():
            if self.set_epoch:  # forgetting this repeats epoch 0's order forever
                sampler.set_epoch(epoch)
            for idx in sampler:
                yield epoch * self.n + idx


class RandomStream(Sampler[int]):
    def __init__(self, n: int, rank: int, world_size: int, seed: int):
        self.n, self.rank, self.world_size, self.seed = n, rank, world_size, seed

    def __iter__(self) -> Iterator[int]:
        sampler = RandomSampler(Sized(self.n), generator=torch.Generator().manual_seed(self.seed))
        position = 0
        for epoch in itertools.count():
            for idx in sampler:  # the generator carries on: epoch 1 is the *next* draw, not seed + 1
                if position % self.world_size == self.rank:
                    yield epoch * self.n + idx
                position += 1


def rank_stream(kind: str, n: int, rank: int, world_size: int, cfg: dict) -> Sampler[int]:
    seed = cfg["data_seed"]
    if kind == "distributed":
        return DistributedStream(n, rank, world_size, seed, cfg["set_epoch"], cfg["drop_last"])
    if kind == "random":
        return RandomStream(n, rank, world_size, seed)
    if kind == "global":
        return GlobalBatchSampler(n, cfg["global_batch_size"], rank=rank, world_size=world_size, seed=seed,
                                  mode=cfg["sampler_mode"], layout="contiguous")
    raise ValueError(f"sampler={kind!r}")


def make_loader(dataset, rank: int, world_size: int, cfg: dict) -> DataLoader:
    """One rank's loader: micro-batches of `micro_batch_size` from its stream.

    `loader_generator=dedicated` hands the DataLoader its own generator: creating an iterator draws a base
    seed from it (even with num_workers=0). Without one, that draw comes from the *global* RNG and shifts
    every later global draw (torch dropout, global augmentation) — chapter 02's hidden RNG use.
    """
    generator = None
    if cfg["loader_generator"] == "dedicated":
        generator = torch.Generator().manual_seed(cfg["data_seed"] + 1_000_003 * rank)
    return DataLoader(dataset, batch_size=cfg["micro_batch_size"],
                      sampler=rank_stream(cfg["sampler"], len(dataset), rank, world_size, cfg),
                      num_workers=cfg["num_workers"], generator=generator,
                      persistent_workers=cfg["num_workers"] > 0)
