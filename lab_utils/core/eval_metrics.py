"""Evaluation metrics across ranks (article §5.3): who evaluates which sample, and how the counts combine.

Taught in notebooks/08_checkpoints.ipynb; run on every rank by scripts/probes/eval_probe.py. Pure functions
of sample ids and per-sample correctness, so the notebook and the tests can check them without a launch.

The article: "a simple average of per-rank accuracies is wrong when ranks hold different numbers of samples;
all_reduce the numerator and the denominator". With DistributedSampler every rank holds the SAME number of
samples (it pads), so simple and weighted means coincide — and the real bias is the padding itself: on an
eval set of 101 samples and 2 ranks, one sample is evaluated twice, and `all_reduce(correct, total)` counts
it twice (102 evaluations). The fix gathers (sample id, correct) from every rank and counts each id once,
as accelerate's `gather_for_metrics` drops the padded tail.
"""

from __future__ import annotations

import math

from torch.utils.data import DistributedSampler

from lab_utils.core.samplers import Sized

SHARDINGS = ("distributed", "distributed_drop_last", "strided")


def shard(n: int, rank: int, world_size: int, how: str = "distributed") -> list[int]:
    """The eval-set indices rank `rank` evaluates (no shuffling, as for evaluation).

    distributed: DistributedSampler(shuffle=False): pads to a multiple of world_size by repeating the first
    indices, so every rank has ceil(n / W). distributed_drop_last: drops the tail instead (floor(n / W) each,
    some samples never evaluated). strided: indices rank::W, no padding (ranks differ by at most one)."""
    if how not in SHARDINGS:
        raise ValueError(f"sharding {how!r} is not one of {', '.join(SHARDINGS)}")
    if how == "strided":
        return list(range(rank, n, world_size))
    return list(DistributedSampler(Sized(n), num_replicas=world_size, rank=rank, shuffle=False,
                                   drop_last=how == "distributed_drop_last"))


def simple_mean(per_rank: list[tuple[int, int]]) -> float:
    """Mean of each rank's own accuracy: (correct, total) per rank."""
    return sum(c / t for c, t in per_rank) / len(per_rank)


def summed(per_rank: list[tuple[int, int]]) -> float:
    """The article's fix: all_reduce(correct) / all_reduce(total)."""
    return sum(c for c, _ in per_rank) / sum(t for _, t in per_rank)


def deduplicated(pairs: list[tuple[int, int]], n: int) -> float:
    """(sample id, correct) from every rank: each id counted once. Raises if some sample was never evaluated
    (drop_last), since then no aggregation can give the single-process number."""
    seen: dict[int, int] = {}
    for i, ok in pairs:
        if i in seen and seen[i] != ok:
            raise ValueError(f"sample {i} evaluated twice with different results: the ranks' models differ")
        seen[i] = ok
    missing = n - len(seen)
    if missing:
        raise ValueError(f"{missing} of {n} samples were never evaluated (a sampler that drops the tail)")
    return sum(seen.values()) / n


def padding(n: int, world_size: int) -> int:
    """How many duplicate evaluations DistributedSampler adds: W * ceil(n / W) - n."""
    return world_size * math.ceil(n / world_size) - n
