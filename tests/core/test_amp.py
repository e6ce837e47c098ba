"""amp=fp16 / bf16 under DDP (chapter 11), with real 2-rank gloo runs against the emulated reference.

GradScaler's inf/NaN check runs on the all-reduced gradients: rank 1's loss is made to overflow at one step
(overflow_step), and *both* ranks skip that step (each rank's heartbeat lists the steps its scaler skipped)
and halve the scale, bit for bit like the emulated 2-rank run. If the check read each rank's local gradients,
rank 0 (finite) would step and rank 1 would not: their weights would part, and the run would leave tier 3.
The clipping bugs are in the port-bug suite (tests/analysis/test_port_bugs.py)."""
import math
from types import SimpleNamespace

import pytest

from lab_utils.analysis import causes, parity
from lab_utils.core import config, runfiles
from lab_utils.launch import launcher

STEPS, OVERFLOW = 4, 1
FP16 = ["amp=fp16", f"steps={STEPS}", f"overflow_step={OVERFLOW}", "overflow_rank=1"]
BF16 = ["amp=bf16", f"steps={STEPS}"]


@pytest.fixture(scope="module")
def amp_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("amp_runs")
    specs = {"fp16_emul": ("fp16_emul", 1, FP16 + ["emulate_ranks=2"]), "fp16_ddp": ("fp16_ddp", 2, FP16),
             "bf16_emul": ("bf16_emul", 1, BF16 + ["emulate_ranks=2"]), "bf16_ddp": ("bf16_ddp", 2, BF16)}
    results = launcher.launch_many(launcher.requests_from_specs(specs, timeout=600, progress=False, runs_dir=root),
                                   max_workers=2, raise_on_failure=True)
    return {k: r.run_dir for k, r in results.items()}


@pytest.mark.slow
def test_fp16_overflow_on_one_rank_is_skipped_by_every_rank(amp_runs):
    rows = runfiles.read_metrics(amp_runs["fp16_ddp"])
    assert [r["step"] for r in rows if r["skipped"]] == [OVERFLOW]
    assert math.isnan(rows[OVERFLOW]["grad_norm"]) or math.isinf(rows[OVERFLOW]["grad_norm"])
    scales = [r["loss_scale"] for r in rows]  # the scale before each step: halved after the skipped one
    assert scales[OVERFLOW + 1] == scales[OVERFLOW] / 2 == 2.0 ** 15, scales
    beats = runfiles.read_heartbeats(amp_runs["fp16_ddp"])
    # only rank 1's loss overflowed; rank 0 skipped too because its scaler read the all-reduced gradients
    assert {r: b["skipped_steps"] for r, b in beats.items()} == {0: [OVERFLOW], 1: [OVERFLOW]}
    report = parity.compare(amp_runs["fp16_emul"], amp_runs["fp16_ddp"])
    assert report.tier == 3, report.format()


@pytest.mark.slow
def test_bf16_on_cpu_is_bitwise_against_the_emulated_reference(amp_runs):
    report = parity.compare(amp_runs["bf16_emul"], amp_runs["bf16_ddp"])
    assert report.tier == 3, report.format()
    assert "skipped" not in runfiles.read_metrics(amp_runs["bf16_ddp"])[0]  # no GradScaler without fp16


@pytest.mark.parametrize("keys, message", [
    (["clip_bug=scaled", "grad_clip=1"], "clip_bug=scaled needs amp=fp16"),
    (["clip_bug=micro_batch"], "clip_bug=micro_batch needs grad_clip > 0"),
    (["clip_bug=no_sync_window", "grad_clip=1"], "needs grad_accum_steps >= 2"),
    (["overflow_step=2"], "overflow_step needs amp=fp16"),
    (["amp=fp16", "overflow_step=2", "overflow_rank=2"], "overflow_rank=2 but the run has 2 rank"),
    (["amp=fp16", "checkpoint_every=2"], "GradScaler's scale is not checkpointed"),
    (["amp=fp32"], "amp='fp32' is not one of: none, bf16, fp16"),
])
def test_bad_amp_keys_are_refused_naming_the_key(keys, message):
    with pytest.raises(config.ConfigError, match=message):
        config.resolve(keys, 2)


def test_a_scaled_grad_norm_is_named_without_the_key():
    """An outside script logs clip_grad_norm_'s return: a step-0 ratio of 2^16 (GradScaler's initial scale)
    names grad_clip from the metrics alone; a ratio of 3 is a gradient changed after the backward (clipping before
    the all-reduce) only where the loss agrees, and never the scaled-gradient bug."""
    def evidence(ratio, dloss=0.0, replicas=None, clip=0.25):
        ma = [{"step": 0, "loss": 4.0, "grad_norm": 0.9876}]
        mb = [{"step": 0, "loss": 4.0 + dloss, "grad_norm": 0.9876 * ratio}]
        report = SimpleNamespace(run_a="A", run_b="B", first_step_over_grad_rtol=0, loss_diffs=[dloss],
                                 first_step_over_tol=0 if dloss else None, loss_bound=lambda step: 1e-5)
        keys = {"config": {"grad_clip": clip}} if clip is not None else {}
        return causes.Evidence(report=report, ma=ma, mb=mb, ca=keys, cb=keys, replica_b=replicas or {})

    found = causes.grad_clipping(evidence(65535.69))  # measured at step 0 (clip_scaled_gradients)
    assert [c.code for c in found] == ["grad_clip"] and "2^16" in found[0].evidence
    found = causes.grad_clipping(evidence(3.0))
    assert [c.code for c in found] == ["grad_clip"] and "2^" not in found[0].evidence
    assert "loss agrees" in found[0].evidence
    assert causes.grad_clipping(evidence(3.0, dloss=0.1)) == []  # the forward moved: other data or weights
    assert causes.grad_clipping(evidence(3.0, replicas={0: "a", 1: "b"})) == []  # an unreduced parameter
    assert causes.grad_clipping(evidence(3.0, clip=0.0)) == []  # A does not clip
    assert causes.grad_clipping(evidence(3.0, clip=None)) == []  # one step, no key: a factor can't be told apart
