"""bench scaling's row selection: a row picked with --only must bring every row its tiers and speed-up are
measured against, or the table prints a ratio or a tier against nothing (or silently leaves it out)."""

import pytest

from lab_utils.drivers.bench_scaling import REFS, SINGLES, all_cases, pick, speedup_ref


def names(cases):
    return [name for name, _, _ in cases]


def test_exact_pick_brings_its_references_transitively():
    got = names(pick(all_cases(gpus=2), "=2 ranks tf32"))
    # tier 3 vs the emulated tf32 run, tier vs 1 rank tf32, whose own tier is against 1 rank fp32
    assert got == ["1 rank fp32", "1 rank tf32", "1 rank emulated 2 ranks tf32", "2 ranks tf32"]
    assert names(pick(all_cases(gpus=2), "=2 ranks fp32")) == ["1 rank fp32", "1 rank emulated 2 ranks",
                                                               "2 ranks fp32"]


def test_every_reference_is_a_case_that_runs_before_the_row():
    order = names(all_cases(gpus=2))
    for row, ref in {**REFS, **SINGLES}.items():
        assert order.index(ref) <= order.index(row), (row, ref)


def test_overhead_and_accumulation_rows_bring_their_one_rank_twins():
    got = names(pick(all_cases(gpus=2), "=2 ranks fp32, lab overhead off"))
    assert "1 rank fp32, lab overhead off" in got and "2 ranks fp32, lab overhead off" in got
    assert "1 rank accum 4" in names(pick(all_cases(gpus=2), "no_sync"))


def test_compile_rows_compare_with_the_compiled_single_run():
    assert names(pick(all_cases(gpus=2), "=2 ranks compile")) == ["1 rank fp32", "1 rank compile", "2 ranks compile"]
    assert speedup_ref("2 ranks compile") == "1 rank compile" and speedup_ref("2 ranks bucket view") == "1 rank fp32"


def test_no_gpu_only_rows_without_a_gpu_and_a_bad_pick_names_the_cases():
    assert not [n for n in names(all_cases(gpus=0)) if "tf32" in n or "compile" in n]
    with pytest.raises(ValueError, match="matches no case: 1 rank fp32"):
        pick(all_cases(gpus=0), "tf32")
