"""Tests for lab_utils.lessons.ch03_sampler_plots (taught in notebooks/03_samplers.ipynb)."""

import itertools

import numpy as np
import pytest

from lab_utils.core.config import resolve
from lab_utils.core.samplers import rank_stream
from lab_utils.lessons import ch03_sampler_plots as sp
from lab_utils.lessons import ch03_samplers as sl


def visits(kind, n, world_size, steps, gbs=8, **keys):
    cfg = resolve(dict(global_batch_size=gbs, sampler=kind, **keys), world_size)
    return sp.step_visits(kind, n, world_size, cfg, steps), cfg


def test_step_visits_is_the_rank_stream_cut_into_steps():
    got, cfg = visits("distributed", 32, 2, 6)
    assert got.shape == (6, 2, 4)
    for rank in range(2):
        stream = list(itertools.islice(iter(rank_stream("distributed", 32, rank, 2, cfg)), 24))
        assert got[:, rank, :].ravel().tolist() == stream


@pytest.mark.parametrize("kind", ["distributed", "global"])
def test_ranks_hold_the_single_batch_every_step(kind):
    single, _ = visits(kind, 32, 1, 8)
    ranks, _ = visits(kind, 32, 2, 8)
    assert all(sp.same_batch_per_step(single, ranks, 32))


def test_random_sampler_breaks_at_the_epoch_boundary():
    single, _ = visits("distributed", 32, 1, 8)
    ranks, _ = visits("random", 32, 2, 8)
    assert sp.same_batch_per_step(single, ranks, 32) == [True] * 4 + [False] * 4  # 32 / 8 = 4 steps per epoch


def test_same_batch_counts_duplicates():
    single = np.array([[[0, 1, 2, 3]]])
    assert sp.same_batch_per_step(single, np.array([[[0, 1], [2, 2]]]), 4) == [False]
    assert sp.same_batch_per_step(single, np.array([[[3, 1], [2, 4]]]), 4) == [True]  # visit 4: epoch 1, idx 0


def test_repeated_visits_finds_padding_only():
    padded, _ = visits("distributed", 31, 2, 8)
    reps = sp.repeated_visits(padded)
    assert [(s, r) for s, r, _ in reps] == [(3, 1), (7, 1)]  # the 32nd slot of each 31-sample epoch
    assert reps[0][2] == padded[0, 0, 0]  # DistributedSampler pads with the epoch's first index
    dropped, _ = visits("distributed", 31, 2, 8, drop_last=True)
    assert sp.repeated_visits(dropped) == []


def test_layout_puts_strided_and_contiguous_ranks_where_the_single_run_has_them():
    single, _ = visits("distributed", 32, 1, 1)
    for kind, expected in [("distributed", [0, 1] * 4), ("global", [0] * 4 + [1] * 4)]:
        ranks, _ = visits(kind, 32, 2, 1)
        rank, idx, foreign = sp.layout_on_single(single[0], ranks[0], 32)
        assert rank.tolist() == expected
        assert idx.tolist() == (single[0, 0] % 32).tolist() and not foreign.any()


def test_layout_flags_foreign_samples_and_rejects_other_batch_sizes():
    rank, idx, foreign = sp.layout_on_single(np.array([[0, 1, 2, 3]]), np.array([[1, 9], [0, 8]]), 16)
    assert rank.tolist() == [1, 0, 0, 1] and idx.tolist() == [0, 1, 9, 8]
    assert foreign.tolist() == [False, False, True, True]
    with pytest.raises(ValueError, match="global_batch_size"):
        sp.layout_on_single(np.array([[0, 1, 2, 3]]), np.array([[0], [1]]), 16)


def test_plot_rank_grid_draws_one_panel_per_sampler():
    single, _ = visits("distributed", 32, 1, 8)
    panels = {k: visits(k, 32, 2, 8)[0] for k in ("distributed", "global", "random")}
    fig = sp.plot_rank_grid(single, panels, 32, title="t")
    assert len(fig.axes) == 4
    # red frames: exactly the random panel's samples that the single run does not have at that step
    foreign = sum(int((~np.isin(panels["random"][s] % 32, single[s] % 32)).sum()) for s in range(8))
    assert foreign > 0
    for ax, expected in zip(fig.axes, [0, 0, 0, foreign], strict=True):
        assert sum(p.get_edgecolor()[:3] == (1.0, 0.0, 0.0) for p in ax.patches) == expected


# ------------------------------------------------------------------ sampler_lessons (chapter 03's lesson logic)
def test_layout_word_names_the_two_layouts_and_nothing_else():
    assert sl.layout_word([0, 1, 0, 1]) == "strided"
    assert sl.layout_word([0, 0, 1, 1]) == "contiguous"
    assert sl.layout_word([1, 0, 0, 1]) == "other"


def test_first_step_off_is_the_epoch_boundary_for_random_and_none_for_global():
    single = sl.streams("distributed", 32, 1, 8, global_batch_size=8)
    assert sl.first_step_off(single, sl.streams("random", 32, 2, 8, global_batch_size=8), 32) == 4
    assert sl.first_step_off(single, sl.streams("global", 32, 2, 8, global_batch_size=8), 32) is None


def test_uneven_finds_padding_and_the_shifted_epoch():
    odd = sl.uneven(31, 8, 2, 8)
    assert [(s, r) for s, r, _ in odd["dups"]] == [(3, 1), (7, 1)] and odd["dropped_dups"] == []
    assert odd["padded_off"] == 3 and odd["dropped_off"] == 3  # the step that holds position 31 / the cut tail


def test_global_sampler_at_scale_is_world_size_independent_and_resumable():
    assert sl.world_size_independent(10**9, 16, [0, 3, 10**6], worlds=(2, 4)) == {2: True, 4: True}
    assert sl.resume_checks(10**9, 16) == {"mid_step": True, "elastic": True}
    # a different seed gives another global batch: the check compares real content, not two empty arrays
    assert not np.array_equal(sl.global_batch(10**9, 16, 1, 0), sl.global_batch(10**9, 16, 1, 0, seed=7))
