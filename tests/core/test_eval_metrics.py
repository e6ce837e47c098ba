"""lab_utils.core.eval_metrics: sharding and the aggregations of chapter 08 (pure; the 2-rank probe runs in the
notebook). Each test names the number a wrong aggregation would give."""

import pytest

from lab_utils.core import eval_metrics as em


def test_distributed_sampler_pads_with_the_first_ids():
    shards = [em.shard(101, r, 2) for r in range(2)]
    assert [len(s) for s in shards] == [51, 51] and em.padding(101, 2) == 1
    ids = shards[0] + shards[1]
    assert sorted(ids) == sorted(list(range(101)) + [0])  # sample 0 twice


def test_drop_last_and_strided():
    assert [len(em.shard(101, r, 2, "distributed_drop_last")) for r in range(2)] == [50, 50]
    assert [len(em.shard(101, r, 2, "strided")) for r in range(2)] == [51, 50]
    with pytest.raises(ValueError, match="sharding"):
        em.shard(10, 0, 2, "random")


def test_aggregations():
    # 3 samples, 2 ranks, padded: rank 0 has ids (0, 2), rank 1 has (1, 0); sample 0 correct, others wrong.
    ok = {0: 1, 1: 0, 2: 0}
    pairs = [(i, ok[i]) for i in (0, 2, 1, 0)]
    per_rank = [(1, 2), (1, 2)]
    assert em.simple_mean(per_rank) == em.summed(per_rank) == 0.5  # equal counts: the two means agree ...
    assert em.deduplicated(pairs, 3) == 1 / 3  # ... and both count the duplicate; the truth is 1/3
    assert em.simple_mean([(2, 2), (0, 1)]) == 0.5 and em.summed([(2, 2), (0, 1)]) == 2 / 3  # uneven counts
    with pytest.raises(ValueError, match="never evaluated"):
        em.deduplicated([(0, 1)], 3)
    with pytest.raises(ValueError, match="different results"):
        em.deduplicated([(0, 1), (0, 0)], 1)
