"""Tier classification on synthetic runs with known differences (no training needed)."""
import math

import torch

from lab_utils.parity import classify


def metrics(losses, hashes=None):
    return [{"step": i, "loss": x, "param_hash": (hashes or ["h"] * len(losses))[i]} for i, x in enumerate(losses)]


BASE = [4.0 - 0.05 * i for i in range(40)]
W = {"w": torch.ones(3, 3), "b": torch.zeros(3)}


def shifted(d):
    return [x + d for x in BASE]


def test_tier3_bitwise():
    r = classify(metrics(BASE), metrics(BASE), W, {k: v.clone() for k, v in W.items()})
    assert (r.tier, r.bitwise, r.first_diff_step, r.max_abs_loss_diff) == (3, True, None, 0.0)


def test_tier2_within_tolerance():
    w2 = {"w": W["w"] + 1e-6, "b": W["b"]}
    r = classify(metrics(BASE), metrics(shifted(5e-7)), W, w2)
    assert (r.tier, r.bitwise, r.first_diff_step, r.first_step_over_tol) == (2, False, 0, None)
    assert r.worst_tensor == "w"


def test_param_hash_difference_is_not_bitwise():
    hashes = ["h"] * 39 + ["x"]
    r = classify(metrics(BASE), metrics(BASE, hashes), W, W)
    assert r.tier == 2 and r.first_diff_step == 39


def test_loss_over_tolerance_at_one_step_is_tier1():
    losses = list(BASE)
    losses[17] += 2e-6
    r = classify(metrics(BASE), metrics(losses), W, W)
    assert (r.tier, r.first_step_over_tol) == (1, 17)


def test_weights_over_tolerance_need_matching_outputs():
    w2 = {"w": W["w"], "b": W["b"] + 1e-3}
    assert classify(metrics(BASE), metrics(BASE), W, w2).tier == 1
    assert classify(metrics(BASE), metrics(BASE), W, w2, output_diff=1e-6).tier == 2
    assert classify(metrics(BASE), metrics(BASE), W, w2, output_diff=1e-2).tier == 1


def test_tier0_diverged_and_nan():
    assert classify(metrics(BASE), metrics(shifted(1.0)), W, W).tier == 0
    nan = list(BASE)
    nan[5] = math.nan
    assert classify(metrics(BASE), metrics(nan), W, W).tier == 0


def test_different_lengths_cap_at_tier1():
    r = classify(metrics(BASE), metrics(BASE[:30]), W, W)
    assert r.tier == 1 and r.steps_compared == 30 and "different lengths" in r.notes[0]


def test_missing_weights_cap_at_tier1():
    r = classify(metrics(BASE), metrics(BASE), W, None)
    assert r.tier == 1 and not r.bitwise
