"""Tests for lab_utils/core/keyed_rng.py: draws keyed by (seed, visit id, site), not by RNG streams."""

import pytest
import torch

from lab_utils.core import keyed_rng
from lab_utils.core.keyed_rng import KeyedDropout, dropout_keys, keyed_uniform, sample_generator

M64 = (1 << 64) - 1


def _reference(seed: int, key: int, site: int, j: int) -> float:
    """Element j of key's row, in plain Python integers mod 2**64 (no torch int64 tricks)."""
    base = keyed_rng._scalar_base(keyed_rng._DOMAIN_UNIFORM, seed, site)
    row = keyed_rng._mix_int(keyed_rng._mix_int((key + keyed_rng._GOLDEN) & M64) ^ base)
    return (keyed_rng._mix_int(row + (j + 1) * keyed_rng._GOLDEN) >> 40) / 2**24


# ------------------------------------------------------------------ keyed_uniform
def test_matches_python_reference_including_extreme_keys():
    # Checks that int64 wrap-around and the masked (logical) shifts reproduce unsigned splitmix64.
    keys = [0, 1, -1, 12345, 2**62 + 3, 2**63 - 1, -(2**63)]
    u = keyed_uniform(7, torch.tensor(keys), 3, (5,))
    for i, k in enumerate(keys):
        assert u[i].tolist() == [_reference(7, k, 3, j) for j in range(5)]


def test_deterministic_shape_dtype_range():
    keys = torch.arange(10)
    a = keyed_uniform(0, keys, 0, (3, 4))
    b = keyed_uniform(0, keys, 0, (3, 4))
    assert a.shape == (10, 3, 4) and a.dtype == torch.float32
    assert torch.equal(a, b)
    assert keyed_uniform(0, keys, 0, ()).shape == (10,)
    big = keyed_uniform(1, torch.arange(1000), 2, (100,))
    assert big.min() >= 0.0 and big.max() < 1.0


def test_roughly_uniform():
    u = keyed_uniform(0, torch.arange(1000), 0, (100,)).flatten()  # 1e5 values
    assert abs(u.mean().item() - 0.5) < 0.005  # sd of the mean ~ 0.0009
    assert abs(u.var().item() - 1 / 12) < 0.002
    hist = torch.histc(u, bins=10, min=0.0, max=1.0)
    assert (hist - 1e4).abs().max() < 500  # each bin ~ 1e4 +- 95
    # Neighbouring keys and neighbouring elements are not correlated.
    rows = keyed_uniform(0, torch.arange(20000), 0, (2,))
    assert abs(torch.corrcoef(rows.T)[0, 1].item()) < 0.03
    assert abs(torch.corrcoef(torch.stack([rows[:-1, 0], rows[1:, 0]]))[0, 1].item()) < 0.03


def test_independent_of_batch_composition():
    keys = torch.tensor([5, 900, 3, 5, 77, 10**12])
    whole = keyed_uniform(3, keys, 1, (2, 3))
    for i, k in enumerate(keys.tolist()):
        alone = keyed_uniform(3, torch.tensor([k]), 1, (2, 3))
        assert torch.equal(whole[i], alone[0])
    perm = torch.tensor([4, 2, 0, 5, 1, 3])
    assert torch.equal(keyed_uniform(3, keys[perm], 1, (2, 3)), whole[perm])
    assert torch.equal(whole[0], whole[3])  # same key -> same row, wherever it sits


def test_differs_for_seed_site_key():
    keys = torch.arange(4)
    base = keyed_uniform(0, keys, 0, (64,))
    assert not torch.equal(base, keyed_uniform(1, keys, 0, (64,)))
    assert not torch.equal(base, keyed_uniform(0, keys, 1, (64,)))
    assert not torch.equal(base, keyed_uniform(0, keys + 4, 0, (64,)))
    # (seed, site) are hashed in order, not added: swapping them changes the stream.
    assert not torch.equal(keyed_uniform(1, keys, 2, (64,)), keyed_uniform(2, keys, 1, (64,)))
    # Rows of different keys differ from each other.
    assert len({tuple(r) for r in base.tolist()}) == 4


def test_rejects_bad_keys():
    with pytest.raises(ValueError, match="1-D"):
        keyed_uniform(0, torch.zeros(2, 2, dtype=torch.long), 0, (1,))
    with pytest.raises(TypeError, match="integer"):
        keyed_uniform(0, torch.zeros(3), 0, (1,))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device to compare CPU and CUDA bits")
def test_cpu_and_cuda_bit_identical():
    keys = torch.cat([torch.arange(500), torch.tensor([-1, 2**63 - 1, -(2**63)])])
    cpu = keyed_uniform(11, keys, 4, (7, 9))
    cuda = keyed_uniform(11, keys, 4, (7, 9), device="cuda")
    assert cuda.device.type == "cuda"
    assert torch.equal(cpu, cuda.cpu())
    # Keys on CPU, input on CUDA (the KeyedDropout case) gives the same mask too.
    drop = KeyedDropout(0.3, site=2).train()
    x = torch.ones(len(keys), 7, 9)
    with dropout_keys(keys, seed=11):
        assert torch.equal(drop(x), drop(x.cuda()).cpu())


# ------------------------------------------------------------------ sample_generator
def test_sample_generator_pure_function():
    a = torch.rand(5, generator=sample_generator(1, 100, 2))
    torch.rand(1000)  # global RNG activity must not matter
    b = torch.rand(5, generator=sample_generator(1, 100, 2))
    assert torch.equal(a, b)
    assert sample_generator(1, 100).device.type == "cpu"
    for other in [(2, 100, 2), (1, 101, 2), (1, 100, 3)]:
        assert not torch.equal(a, torch.rand(5, generator=sample_generator(*other)))


# ------------------------------------------------------------------ KeyedDropout
def test_dropout_split_batch_is_bitwise_identical():
    torch.manual_seed(0)
    drop = KeyedDropout(0.5, site=0).train()
    x = torch.randn(8, 3, 5)
    keys = torch.arange(100, 108)
    with dropout_keys(keys, seed=42):
        whole = drop(x)
    halves = []
    for sl in (slice(0, 3), slice(3, 8)):  # uneven split, like unequal ranks / micro-batches
        with dropout_keys(keys[sl], seed=42):
            halves.append(drop(x[sl]))
    assert torch.equal(torch.cat(halves), whole)
    assert (whole == 0).any() and (whole != 0).any()


def test_dropout_eval_and_p0_are_identity():
    x = torch.randn(4, 6)
    assert torch.equal(KeyedDropout(0.5, site=0).eval()(x), x)  # no keys needed in eval
    assert torch.equal(KeyedDropout(0.0, site=0).train()(x), x)


def test_dropout_without_keys_raises_helpfully():
    drop = KeyedDropout(0.1, site=3).train()
    with pytest.raises(RuntimeError, match=r"dropout_keys\("):
        drop(torch.ones(2, 4))


def test_dropout_key_count_must_match_batch():
    drop = KeyedDropout(0.1, site=0).train()
    with dropout_keys(torch.arange(3)), pytest.raises(ValueError, match="3 keys for a batch of 4"):
        drop(torch.ones(4, 2))


def test_dropout_scale_preserved_in_expectation():
    p = 0.3
    drop = KeyedDropout(p, site=1).train()
    x = torch.ones(2000, 50)
    with dropout_keys(torch.arange(2000), seed=5):
        y = drop(x)
    kept = y != 0
    assert abs(kept.float().mean().item() - (1 - p)) < 0.01
    assert torch.allclose(y[kept], torch.full_like(y[kept], 1 / (1 - p)))
    assert abs(y.mean().item() - 1.0) < 0.015


def test_dropout_sites_give_independent_masks_and_grad_flows():
    x = torch.ones(64, 32, requires_grad=True)
    with dropout_keys(torch.arange(64)):
        a = KeyedDropout(0.5, site=0).train()(x)
        b = KeyedDropout(0.5, site=1).train()(x)
        a2 = KeyedDropout(0.5, site=0).train()(x)  # another instance with the same site: same mask
    assert not torch.equal(a != 0, b != 0)
    assert torch.equal(a, a2)
    a.sum().backward()
    assert torch.equal(x.grad, a.detach())  # d(sum)/dx = mask / (1 - p) = a when x is ones


def test_dropout_keys_nesting_restores_outer():
    drop = KeyedDropout(0.5, site=0).train()
    x = torch.ones(4, 16)
    outer = dropout_keys(torch.arange(4), seed=1)
    with outer:
        first = drop(x)
        with dropout_keys(torch.arange(10, 14), seed=1):
            inner = drop(x)
        with outer:  # the same instance, re-entered
            again = drop(x)
        after = drop(x)
    assert not torch.equal(first, inner)
    assert torch.equal(first, again) and torch.equal(first, after)
    with pytest.raises(RuntimeError):
        drop(x)  # keys are gone after the outermost block


def test_invalid_dropout_args():
    with pytest.raises(ValueError, match="p must"):
        KeyedDropout(1.5, site=0)
    with pytest.raises(ValueError, match="site must"):
        KeyedDropout(0.1, site=-1)
