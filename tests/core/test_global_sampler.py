"""Tests for lab_utils.core.global_sampler (taught in notebooks/03_samplers.ipynb)."""

import itertools
from collections import Counter

import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler

from lab_utils.core.global_sampler import GlobalBatchSampler, GlobalOrder, dataset_index


class _LenOnly:
    """DistributedSampler only needs len(dataset)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


def _take(sampler, k):
    return list(itertools.islice(iter(sampler), k))


# ---- Feistel permutation -------------------------------------------------------------------
SMALL_NS = sorted({*range(1, 70), 97, 101, 127, 128, 129, 255, 256, 257, 1000, 1023, 1024, 1025,
                   4093, 4095, 4096, 4097, 5000})


@pytest.mark.parametrize("seed", [0, 7, -3])
def test_feistel_is_bijection_for_many_n(seed):
    for n in SMALL_NS:
        order = GlobalOrder(n, seed)
        for epoch in (0, 5):
            perm = order.permutation(epoch)
            assert perm.dtype == np.int64
            assert np.array_equal(np.sort(perm), np.arange(n)), (n, epoch)


def test_feistel_slices_agree_with_full_permutation():
    order = GlobalOrder(1001, seed=3)
    full = order.permutation(2)
    assert np.array_equal(order.permutation(2, 100, 357), full[100:357])
    assert np.array_equal(order.visit_ids(2 * 1001 + 5, 2 * 1001 + 9), 2 * 1001 + full[5:9])


def test_feistel_differs_between_epochs_and_seeds():
    n = 4096
    base = GlobalOrder(n, seed=0).permutation(0)
    assert not np.array_equal(base, GlobalOrder(n, seed=0).permutation(1))
    assert not np.array_equal(base, GlobalOrder(n, seed=1).permutation(0))
    # ... and looks shuffled: no strong correlation between position and index
    assert abs(np.corrcoef(np.arange(n), base)[0, 1]) < 0.1


def test_feistel_large_n_is_lazy_and_in_range():
    n = 10**9 + 7
    ids = GlobalOrder(n, seed=1).visit_ids(n - 5, n + 5)  # straddles epochs 0 -> 1
    epoch, idx = dataset_index(ids, n)
    assert epoch.tolist() == [0] * 5 + [1] * 5
    assert ((idx >= 0) & (idx < n)).all() and len(set(idx[:5].tolist())) == 5


# ---- randperm mode vs. the stock sampler ----------------------------------------------------
@pytest.mark.parametrize("n", [1, 10, 97])
def test_randperm_matches_distributed_sampler(n):
    stock = DistributedSampler(_LenOnly(n), num_replicas=1, rank=0, shuffle=True, seed=42)
    order = GlobalOrder(n, seed=42, mode="randperm")
    for epoch in range(3):
        stock.set_epoch(epoch)
        assert order.permutation(epoch).tolist() == list(stock)
        assert order.visit_ids(epoch * n, (epoch + 1) * n).tolist() == [epoch * n + i for i in stock]


def test_strided_randperm_matches_stock_ranks_within_epoch0():
    n, W = 98, 2  # n % W == 0, n % B != 0
    for rank in range(W):
        stock = list(DistributedSampler(_LenOnly(n), num_replicas=W, rank=rank, shuffle=True, seed=5))
        ours = GlobalBatchSampler(n, 16, rank, W, seed=5, mode="randperm", layout="strided")
        assert _take(ours, n // W) == stock


# ---- world-size independence ----------------------------------------------------------------
@pytest.mark.parametrize("mode", ["feistel", "randperm"])
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_union_of_ranks_is_the_single_process_batch(mode, layout):
    n, B, seed = 53, 16, 11  # n not divisible by B: batches straddle epochs
    steps = -(-3 * n // B)  # three epochs' worth of steps
    single = GlobalBatchSampler(n, B, seed=seed, mode=mode, layout=layout)
    reference = [single.step_visit_ids(s).tolist() for s in range(steps)]
    assert sum(reference, []) == _take(single, steps * B)
    for W in (1, 2, 4, 8):
        ranks = [GlobalBatchSampler(n, B, r, W, seed=seed, mode=mode, layout=layout) for r in range(W)]
        streams = [_take(s, steps * B // W) for s in ranks]
        for s in range(steps):
            parts = [st[s * B // W:(s + 1) * B // W] for st in streams]
            assert parts == [rk.step_visit_ids(s).tolist() for rk in ranks]
            joined = sum(parts, [])
            if layout == "contiguous":
                assert joined == reference[s], (W, s)
            else:
                assert Counter(joined) == Counter(reference[s]), (W, s)
    # every sample is visited exactly once per epoch in the global stream
    epochs = Counter(dataset_index(v, n)[0] for v in sum(reference, [])[: 3 * n])
    assert epochs == {0: n, 1: n, 2: n}


def test_rank_positions_layouts():
    c = GlobalBatchSampler(100, 8, rank=1, world_size=2, layout="contiguous")
    s = GlobalBatchSampler(100, 8, rank=1, world_size=2, layout="strided")
    assert c.rank_positions(3).tolist() == [28, 29, 30, 31]
    assert s.rank_positions(3).tolist() == [25, 27, 29, 31]


# ---- resume ---------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["feistel", "randperm"])
def test_resume_mid_epoch_continues_the_stream(mode):
    kwargs = dict(n=37, global_batch_size=12, rank=1, world_size=2, seed=9, mode=mode)
    full = _take(GlobalBatchSampler(**kwargs), 200)
    k = 45  # not a multiple of the 6 ids per step, mid-epoch
    first = GlobalBatchSampler(**kwargs)
    it = iter(first)
    head = [next(it) for _ in range(k)]
    state = first.state_dict()
    assert (state["step"], state["offset"]) == divmod(k, 6)
    resumed = GlobalBatchSampler(**kwargs)
    resumed.load_state_dict(state)
    assert head + _take(resumed, 200 - k) == full


def test_start_step_and_elastic_resume_at_step_boundary():
    full = _take(GlobalBatchSampler(50, 8, seed=1), 80)
    assert _take(GlobalBatchSampler(50, 8, seed=1, start_step=3), 16) == full[24:40]
    two = GlobalBatchSampler(50, 8, rank=0, world_size=2, seed=1)
    _take(two, 12)  # 3 full steps of 4 ids
    one = GlobalBatchSampler(50, 8, seed=1)
    one.load_state_dict(two.state_dict())  # world_size 2 -> 1 at a step boundary is allowed
    assert _take(one, 8) == full[24:32]


def test_load_state_dict_rejects_mismatches():
    state = GlobalBatchSampler(50, 8, seed=1).state_dict()
    with pytest.raises(ValueError, match="seed"):
        GlobalBatchSampler(50, 8, seed=2).load_state_dict(state)
    for key, value in [("n", 51), ("mode", "randperm"), ("layout", "strided"), ("global_batch_size", 16)]:
        other = GlobalBatchSampler(**{"n": 50, "global_batch_size": 8, "seed": 1, key: value})
        with pytest.raises(ValueError, match=f"'{key}'"):
            other.load_state_dict(state)
    two = GlobalBatchSampler(50, 8, world_size=2, seed=1)
    _take(two, 3)
    with pytest.raises(ValueError, match="world_size"):
        GlobalBatchSampler(50, 8, seed=1).load_state_dict(two.state_dict())


# ---- argument validation --------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, name", [
    (dict(n=0), "^n must"),
    (dict(global_batch_size=0), "^global_batch_size"),
    (dict(world_size=0), "^world_size"),
    (dict(rank=2, world_size=2), "rank"),
    (dict(rank=-1, world_size=2), "rank"),
    (dict(global_batch_size=10, world_size=4), "divisible by world_size"),
    (dict(mode="xor"), "mode"),
    (dict(layout="diagonal"), "layout"),
    (dict(start_step=-1), "start_step"),
])
def test_argument_validation_names_the_argument(kwargs, name):
    args = dict(n=10, global_batch_size=8) | kwargs
    with pytest.raises(ValueError, match=name):
        GlobalBatchSampler(**args)


def test_global_order_validation():
    with pytest.raises(ValueError, match="^n must"):
        GlobalOrder(0, 0)
    with pytest.raises(ValueError, match="mode"):
        GlobalOrder(5, 0, mode="shuffle")


class _ByVisitId(torch.utils.data.Dataset):
    """The intended use: the dataset maps a visit id to its sample with v % n."""

    def __init__(self, data):
        self.data = data

    def __getitem__(self, visit_id):
        return self.data[dataset_index(visit_id, len(self.data))[1]]


def test_is_a_torch_sampler_usable_by_dataloader():
    sampler = GlobalBatchSampler(20, 4, seed=0)
    assert isinstance(sampler, torch.utils.data.Sampler)
    data = torch.arange(100, 120)
    loader = torch.utils.data.DataLoader(_ByVisitId(data), batch_size=4, sampler=sampler)
    batches = list(itertools.islice(loader, 6))  # 24 ids: crosses into epoch 1
    expected = np.concatenate([sampler.step_visit_ids(s) for s in range(6)]) % 20 + 100
    assert torch.cat(batches).tolist() == expected.tolist()
