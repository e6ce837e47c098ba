"""The per-rank streams train.py uses: together the ranks hold the single run's batch (facts 2 and 3)."""
import itertools

from lab_utils.core.config import resolve
from lab_utils.core.samplers import rank_stream


def take(stream, k):
    return list(itertools.islice(iter(stream), k))


def steps(kind, n, world_size, n_steps, gbs=8, **keys):
    cfg = resolve([f"global_batch_size={gbs}", f"sampler={kind}"] + [f"{k}={v}" for k, v in keys.items()], 1)
    per = gbs // world_size
    streams = [take(rank_stream(kind, n, r, world_size, cfg), per * n_steps) for r in range(world_size)]
    return [[s[i * per:(i + 1) * per] for s in streams] for i in range(n_steps)]


def test_distributed_ranks_together_hold_the_single_batch():
    single = steps("distributed", 32, 1, 8)
    double = steps("distributed", 32, 2, 8)
    for (one,), two in zip(single, double, strict=True):
        assert sorted(one) == sorted(two[0] + two[1])
        assert two[0] == one[0::2] and two[1] == one[1::2]  # strided: perm[r::W]


def test_global_sampler_is_contiguous():
    single = steps("global", 32, 1, 8)
    double = steps("global", 32, 2, 8)
    for (one,), two in zip(single, double, strict=True):
        assert two[0] + two[1] == one


def test_random_sampler_matches_distributed_only_in_epoch_0():
    rnd, dist = steps("random", 32, 1, 8), steps("distributed", 32, 1, 8)
    assert rnd[:4] == dist[:4]  # epoch 0: randperm(n, seed) in both
    assert rnd[4:] != dist[4:]  # epoch 1: RandomSampler's generator carries on; DistributedSampler reseeds


def test_visit_ids_carry_the_epoch():
    (ids,) = zip(*steps("distributed", 16, 1, 4), strict=True)
    flat = [v for batch in ids for v in batch]
    assert sorted(v % 16 for v in flat[:16]) == list(range(16)) and all(v >= 16 for v in flat[16:])


def test_set_epoch_false_repeats_the_order():
    ids = [v for (b,) in steps("distributed", 16, 1, 4, set_epoch="false") for v in b]
    assert [v % 16 for v in ids[:16]] == [v % 16 for v in ids[16:]]


def test_uneven_dataset_padding_and_drop_last():
    padded = take(rank_stream("distributed", 15, 1, 2, resolve([], 2)), 8)
    assert len(padded) == 8 and len({v % 15 for v in padded}) == 8
    both = take(rank_stream("distributed", 15, 0, 2, resolve([], 2)), 8) + padded
    assert len({v % 15 for v in both}) == 15  # 16 slots, 15 samples: one repeated
    cfg = resolve(["drop_last=true"], 2)
    dropped = take(rank_stream("distributed", 15, 0, 2, cfg), 7) + take(rank_stream("distributed", 15, 1, 2, cfg), 7)
    assert len({v % 15 for v in dropped}) == 14
