"""Tests for lab_utils/lessons/ch02_rng_probe.py: counting global-RNG draws, DataLoader worker seeds, the DDP wrap
probe."""

import pytest
import torch
from torch.utils.data import DataLoader

from lab_utils.core import runfiles
from lab_utils.launch import probes
from lab_utils.lessons import ch02_rng_probe, ch02_seeds


# ------------------------------------------------------------------ count_global_draws
def test_dataloader_iterator_draws_one_int64_even_without_workers():
    assert ch02_rng_probe.count_global_draws(lambda: iter(DataLoader(range(8), num_workers=0))) == 1


def test_dedicated_generator_leaves_the_global_rng_alone():
    g = torch.Generator().manual_seed(0)
    assert ch02_rng_probe.count_global_draws(lambda: iter(DataLoader(range(8), generator=g))) == 0
    assert ch02_rng_probe.count_global_draws(lambda: DataLoader(range(8))) == 0  # constructing draws nothing


def test_counts_several_draws_and_gives_up_on_other_kinds():
    assert ch02_rng_probe.count_global_draws(lambda: [ch02_rng_probe.int64_draw() for _ in range(3)]) == 3
    # 3 floats are not a whole number of int64 draws: must not be mistaken for 0 or any k
    assert ch02_rng_probe.count_global_draws(lambda: torch.rand(3)) is None
    five = lambda: [ch02_rng_probe.int64_draw() for _ in range(5)]  # noqa: E731
    assert ch02_rng_probe.count_global_draws(five, max_draws=4) is None


def test_probing_restores_the_callers_rng_state():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    ch02_rng_probe.count_global_draws(lambda: torch.rand(100))
    assert torch.equal(torch.get_rng_state(), before)


def test_int64_draw_is_the_dataloader_base_seed():
    torch.manual_seed(7)
    expected = ch02_rng_probe.int64_draw()
    torch.manual_seed(7)
    it = iter(DataLoader(range(4)))
    assert it._base_seed == expected  # private, but it is exactly the fact the notebook teaches


# ------------------------------------------------------------------ worker_seeds
@pytest.mark.slow  # DataLoader worker processes
@pytest.mark.parametrize("with_generator", [False, True])
def test_worker_seed_is_base_seed_plus_worker_id(with_generator):
    torch.manual_seed(42)
    g = torch.Generator().manual_seed(5) if with_generator else None
    s = ch02_rng_probe.worker_seeds(2, generator=g)
    assert sorted(s["workers"]) == [0, 1]
    assert all(seed == s["expected_base_seed"] + w for w, seed in s["workers"].items())


@pytest.mark.slow  # DataLoader worker processes
def test_worker_seeds_follow_the_process_seed_only_without_a_generator():
    out = {}
    for main_seed in (42, 43):
        torch.manual_seed(main_seed)
        out["global", main_seed] = ch02_rng_probe.worker_seeds(2)["workers"]
        torch.manual_seed(main_seed)
        out["dedicated", main_seed] = ch02_rng_probe.worker_seeds(2, torch.Generator().manual_seed(1))["workers"]
    assert out["global", 42] != out["global", 43]
    assert out["dedicated", 42] == out["dedicated", 43]


def test_worker_seeds_without_workers_reports_the_main_process():
    torch.manual_seed(9)
    s = ch02_rng_probe.worker_seeds(0)
    assert s["workers"] == {-1: 9}


# ------------------------------------------------------------------ buffer_fingerprint
def test_buffer_fingerprint_sees_buffers_not_parameters():
    m = torch.nn.BatchNorm1d(4)
    h0 = runfiles.buffer_fingerprint(m)
    with torch.no_grad():
        m.weight.add_(1.0)
    assert runfiles.buffer_fingerprint(m) == h0
    m.running_mean += 1e-7
    assert runfiles.buffer_fingerprint(m) != h0


def test_read_probe_without_a_run_names_the_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="probe"):
        probes.read_probe(tmp_path)


# ------------------------------------------------------------------ the 2-rank wrap probe (real torchrun)
@pytest.mark.slow
def test_wrap_probe_two_ranks(runs_dir):
    probe = probes.launch_wrap_probe("wrap", 2, seed=42, backend="auto")
    assert sorted(probe) == [0, 1] and [probe[r]["seed"] for r in (0, 1)] == [42, 43]
    before = {r: probe[r]["before"] for r in (0, 1)}
    assert before[0]["params"] != before[1]["params"] and before[0]["buffers"] != before[1]["buffers"]
    on, off = "broadcast_buffers=True", "broadcast_buffers=False"
    for r in (0, 1):  # rank 0's parameters everywhere, with either flag
        assert probe[r][on]["params"] == probe[r][off]["params"] == before[0]["params"]
    assert probe[1][on]["buffers"] == before[0]["buffers"]  # copied from rank 0
    assert probe[1][off]["buffers"] == before[1]["buffers"]  # left as rank 1 had them


# ------------------------------------------------------------------ seed_lessons (chapter 02's lesson logic)
def test_hidden_draws_counts_one_per_iterator_without_a_generator():
    assert list(ch02_seeds.hidden_draws().values()) == [1, 0, 0]


def test_init_hash_depends_on_the_seed_only_and_leaves_the_global_rng_alone():
    torch.manual_seed(5)
    before = torch.get_rng_state()
    a, b = ch02_seeds.init_hash(42, seed=42), ch02_seeds.init_hash(43, seed=42)
    assert a != b and a == ch02_seeds.init_hash(42, seed=42)
    assert torch.equal(torch.get_rng_state(), before)
