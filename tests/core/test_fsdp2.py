"""wrap=fsdp2 (lab_utils/core/fsdp2.py): torch's fully_shard in place of DDP, with real 2- and 4-rank gloo runs of
scripts/train.py at the toy size (chapter 14's verdicts hold the 2-rank rows and two of the port bugs).
grad_reduction=ordered must give the emulated reference's bits (tier 3, every logged step and the final weights) at
4 ranks and after a resume from 4 ranks to 2, with gradient accumulation and clipping on; stock FSDP2 at 4 ranks
must differ in the last bits and still pass as tier 2 against the single run's float twin, window by window, with
the doctor saying "no bug" (FSDP2's port bugs and correct ports, judged like DDP's, are
lab_utils/analysis/portbugs.FSDP2_SUITE, run by tests/analysis/test_port_bugs.py). checkpoint_format=sharded
(torch.distributed.checkpoint) must resume to the same bits at 4 -> 4 and 4 -> 2 ranks and convert to the full
checkpoint's bits; a checkpoint of rank 0's shards alone (fsdp2_bug=rank0_saves_sharded) must fail its resume on
every rank, naming it. Bad combinations are refused before anything launches, naming the key. fsdp2_mp=bf16
(MixedPrecisionPolicy) is measured at tier 1 against the fp32 emulation. grad_reduction=tree must give one process's
bits at 2 and 4 ranks and across a 4 -> 2 resize through a sharded checkpoint."""

import json

import pytest
import torch

from lab_utils.analysis import doctor, parity
from lab_utils.core import config as config_mod
from lab_utils.core import runfiles, sharded_checkpoint
from lab_utils.launch import launcher, replay

pytestmark = pytest.mark.timeout(600)

# 12 steps of 16 samples over 128: an epoch boundary at step 8 (set_epoch matters), window states every 4 steps;
# two micro-batches a step (FSDP2's no_sync) and clipping on
KEYS = {"steps": 12, "n_samples": 128, "log_every": 4, "window_every": 4, "grad_accum_steps": 2, "grad_clip": 0.25}

MP_SHORT = {"steps": 4, "window_every": 0}

# grad_reduction=tree (chapter 13's chunk tree): C = 16 / 2 = 8 chunks, 4 a rank at 2 ranks, 2 at 4
TREE = {**{k: v for k, v in KEYS.items() if k != "grad_accum_steps"},
        "grad_reduction": "tree", "sampler": "global", "micro_batch_size": 2}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp2")
    specs = {
        "emul4": ("emul4", 1, {**KEYS, "emulate_ranks": 4}),
        "ordered4": ("ordered4", 4, {**KEYS, "wrap": "fsdp2", "grad_reduction": "ordered"}),
        "single": ("single", 1, KEYS),
        "twin": ("single-twin-accum2", 1, {**KEYS, "grad_accum_steps": 4}),  # float_twin.twin_of's twin
        "stock4": ("stock4", 4, {**KEYS, "wrap": "fsdp2"}),
        # bf16 autocast (chapter 11's amp=bf16) under FSDP2, ordered, against its emulation
        "bf16_emul2": ("bf16_emul2", 1, {**KEYS, "amp": "bf16", "emulate_ranks": 2}),
        "bf16_ordered2": ("bf16_ordered2", 2, {**KEYS, "amp": "bf16", "wrap": "fsdp2", "grad_reduction": "ordered"}),
        # FSDP2's MixedPrecisionPolicy (bf16 weights in the forward/backward, fp32 reduce-scatter), ordered, and
        # the fp32 emulated reference it is measured against: 4 steps (bf16 matmuls are slow on CPU)
        "mp_ordered2": ("mp_ordered2", 2, {**KEYS, **MP_SHORT, "fsdp2_mp": "bf16", "wrap": "fsdp2",
                                           "grad_reduction": "ordered"}),
        "emul2": ("emul2", 1, {**KEYS, **MP_SHORT, "emulate_ranks": 2}),
        # the tree: one process (no FSDP2 at all) and FSDP2 at 2 ranks
        "tree1": ("tree1", 1, TREE),
        "tree2": ("tree2", 2, {**TREE, "wrap": "fsdp2"}),
    }
    launcher.launch_many(launcher.requests_from_specs(specs, runs_dir=root, timeout=300), max_workers=2,
                         raise_on_failure=True)
    return root


@pytest.mark.parametrize("world", [4])  # 2 ranks: chapter 14's verdict table
def test_ordered_fsdp2_is_bitwise_the_emulated_reference(runs, world):
    report = parity.compare(runs / f"emul{world}", runs / f"ordered{world}")
    assert report.tier == 3 and report.bitwise, report.format()
    a = torch.load(runs / f"emul{world}" / "model.pt")
    b = torch.load(runs / f"ordered{world}" / "model.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # full weights, no prefix


def test_bf16_autocast_under_ordered_fsdp2_is_bitwise_its_emulation(runs):
    report = parity.compare(runs / "bf16_emul2", runs / "bf16_ordered2")
    assert report.tier == 3 and report.bitwise, report.format()


def test_bf16_mixed_precision_policy_is_tier_1_against_the_fp32_emulation(runs):
    """fsdp2_mp=bf16 changes the arithmetic (bf16 weights in every matmul): not bitwise and far outside fp32
    float noise from the first step, yet the same convergence (tier 1). Measured on the toy at 2 ranks over 12
    steps: max |dloss| 9.8e-3 from step 0, tier 1 against the fp32 emulation and against the single run's float
    twin; this test runs 4 steps. Were the policy not applied, ordered FSDP2 would be the emulation's bits
    (tier 3) and this fails."""
    report = parity.compare(runs / "emul2", runs / "mp_ordered2")
    assert report.tier == 1 and report.loss_diffs[0] > 1e-3, report.format()
    weights = torch.load(runs / "mp_ordered2" / "model.pt")
    assert {v.dtype for v in weights.values()} == {torch.float32}  # the sharded weights stay fp32


def test_stock_fsdp2_differs_in_the_last_bits_and_is_tier_2_window_by_window(runs):
    emulated = torch.load(runs / "emul4" / "model.pt")
    stock = torch.load(runs / "stock4" / "model.pt")
    assert not all(torch.equal(emulated[k], stock[k]) for k in emulated)  # the backend's sum order, at 4 ranks
    report = parity.compare(runs / "single", runs / "stock4", noise_runs="auto")
    assert report.tier == 2 and report.certified and not report.bitwise, report.format()
    # its window states were gathered from the shards; A's program replayed from them judges every window
    assert len(list((runs / "stock4" / "windows").glob("step_*.pt"))) == 3
    replayed = replay.ensure(runs / "single", runs / "stock4", progress=False)
    d = doctor.diagnose_runs(runs / "single", runs / "stock4", noise_runs="auto", replay=replayed)
    assert d.exit_code == 0 and d.report.windows is not None and d.report.certified, d.verdict


# The resumed fixture's launches, by key (the rank0_saves_sharded resume is expected to fail: its test reads it)
RESUMES: dict[str, launcher.RunResult] = {}


@pytest.fixture(scope="module")
def resumed(runs):
    """Stopped at step 6 (a checkpoint: the full state gathered from the shards) and resumed to 12 at another
    world size, 4 ranks to 2 (its reference: the emulated 4 ranks resumed as emulated 2).
    checkpoint_format=sharded (core/sharded_checkpoint.py): the same 4-rank half, its checkpoint written by every
    rank through torch.distributed.checkpoint, resumed at 4 ranks and at 2 (DCP reshards); and the port bug
    rank0_saves_sharded (2 steps, 2 ranks) resumed at 2 ranks, which must fail. One pair of batches for all
    (two at a time on the 2-core box), so the sharded runs add the least wall time."""
    ordered = {**KEYS, "wrap": "fsdp2", "grad_reduction": "ordered"}
    sharded = {**ordered, "checkpoint_format": "sharded"}
    half = {"steps": 6, "checkpoint_every": 6}
    launcher.launch_many(launcher.requests_from_specs({
        "half4": ("half4", 4, {**ordered, **half}),
        "shalf4": ("shalf4", 4, {**sharded, **half}),
        "ehalf4": ("ehalf4", 1, {**KEYS, **half, "emulate_ranks": 4, "grad_reduction": "ordered"}),
        "bughalf2": ("bughalf2", 2, {**sharded, "steps": 2, "checkpoint_every": 2,
                                     "fsdp2_bug": "rank0_saves_sharded"}),
        "thalf4": ("thalf4", 4, {**TREE, **half, "wrap": "fsdp2", "checkpoint_format": "sharded"}),
    }, runs_dir=runs, timeout=300), max_workers=2, raise_on_failure=True)
    ckpt, folder = "checkpoints/step_000006.pt", str(runs / "shalf4" / "checkpoints" / "step_000006")
    RESUMES.update(launcher.launch_many(launcher.requests_from_specs({
        "sres4to4": ("sres4to4", 4, {**sharded, "resume": folder}),
        "sres4to2": ("sres4to2", 2, {**sharded, "resume": folder}),
        "res4to2": ("res4to2", 2, {**ordered, "resume": str(runs / "half4" / ckpt)}),
        "eres4to2": ("eres4to2", 1, {**KEYS, "emulate_ranks": 2, "grad_reduction": "ordered",
                                     "resume": str(runs / "ehalf4" / ckpt)}),
        "bugres2": ("bugres2", 2, {**ordered, "resume": str(runs / "bughalf2" / "checkpoints/step_000002.pt")}),
        "tres4to2": ("tres4to2", 2, {**TREE, "wrap": "fsdp2", "checkpoint_format": "sharded",
                                     "resume": str(runs / "thalf4" / "checkpoints" / "step_000006")}),
    }, runs_dir=runs, timeout=300), max_workers=2))
    for key, r in RESUMES.items():
        if key != "bugres2":
            r.raise_for_status()
    return runs


@pytest.mark.parametrize("a, b", [("eres4to2", "res4to2")])
def test_resume_is_bitwise_at_another_world_size(resumed, a, b):
    wa, wb = torch.load(resumed / a / "model.pt"), torch.load(resumed / b / "model.pt")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert parity.compare(resumed / a, resumed / b).tier == 3


def _equal_weights(a, b) -> bool:
    wa, wb = torch.load(a / "model.pt"), torch.load(b / "model.pt")
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize("a, b", [("ordered4", "sres4to4"),   # the uninterrupted run, same world size
                                  ("eres4to2", "sres4to2"),   # its emulated reference, 4 -> 2 ranks
                                  ("res4to2", "sres4to2")])   # the same resume through the full checkpoint
def test_sharded_resume_is_bitwise(resumed, a, b):
    assert _equal_weights(resumed / a, resumed / b)
    assert parity.compare(resumed / a, resumed / b).tier == 3


def test_tree_fsdp2_is_one_processes_bits_at_2_and_4_ranks_and_across_a_4_to_2_sharded_resize(resumed):
    """grad_reduction=tree under FSDP2 (fsdp2.TreeReduceScatter): every chunk's gradient reduce-scattered apart
    and summed in chapter 13's one tree, so 2 ranks, 4 ranks (steps 0-5) and 4 -> 2 through a DCP checkpoint
    (steps 6-11) give one process's bits: losses, per-step fingerprints and the final weights. Ordered FSDP2 at
    4 ranks sums other partitions of the batch: not these bits (the comparison can fail)."""
    def steps(run):
        return [(r["step"], r["loss"], r["param_hash"]) for r in runfiles.read_metrics(resumed / run)]

    one = steps("tree1")
    assert len(one) >= 3 and steps("tree2") == one
    assert steps("thalf4") == [s for s in one if s[0] < 6] and steps("tres4to2") == one
    for run in ("tree2", "tres4to2"):
        assert _equal_weights(resumed / "tree1", resumed / run)
        assert parity.compare(resumed / "tree1", resumed / run).tier == 3
    assert not _equal_weights(resumed / "tree1", resumed / "ordered4")


def test_a_sharded_checkpoint_is_one_dcp_folder_that_converts_to_the_full_state(resumed, tmp_path):
    """One folder per checkpoint, one shard file per rank (no rank wrote the full state); torch's converter
    (dcp_to_torch_save) turns it into one file with the same bits as the full checkpoint of the same run."""
    folder = resumed / "shalf4" / "checkpoints" / "step_000006"
    assert sorted(p.name for p in folder.glob("*.distcp")) == [f"__{r}_0.distcp" for r in range(4)]
    assert not list(folder.parent.glob("*.tmp"))  # renamed once complete
    converted = sharded_checkpoint.to_torch_save(folder, tmp_path / "full.pt")
    full = torch.load(resumed / "half4" / "checkpoints" / "step_000006.pt", weights_only=True)
    assert converted["model"].keys() == full["model"].keys()
    assert all(torch.equal(converted["model"][k], full["model"][k]) for k in full["model"])
    names = list(full["model"])  # the GPT's parameters are its state dict (no buffers): index i = name i
    moments = [(converted["optimizer"]["state"][names[i]][m], s[m]) for i, s in full["optimizer"]["state"].items()
               for m in ("exp_avg", "exp_avg_sq", "step")]
    assert moments and all(torch.equal(x, y) for x, y in moments)


def test_rank0_saving_its_shards_fails_the_resume_on_every_rank_naming_it(resumed):
    """fsdp2_bug=rank0_saves_sharded: the run itself ends fine (the bug is silent until a resume); the resume
    stops at the load, before the wrap and any collective, fast (no timeout, no hang), saying the file is rank
    0's shards. Which rank's error torchrun reports first is a race (it stops the others), so each rank's
    heartbeat is read instead: none got past the load."""
    ckpt = resumed / "bughalf2" / "checkpoints" / "step_000002.pt"
    assert ckpt.is_file() and not (ckpt.parent / "step_000002").exists()
    r = RESUMES["bugres2"]
    assert r.status == "crashed" and r.seconds < 60, (r.status, r.seconds)
    log = (resumed / "bugres2" / "output.log").read_text()
    assert "what rank 0 of 2 FSDP2 ranks holds" in log and "fsdp2_bug=rank0_saves_sharded" in log
    for rank in (0, 1):  # init_param_hash is the first beat after the load, the wrap's comes after it
        path = resumed / "bugres2" / runfiles.PROGRESS / f"rank{rank}.json"  # none: stopped before its first beat
        beat = json.loads(path.read_text()) if path.exists() else {"phase": "setup"}
        assert beat["phase"] == "setup" and "init_param_hash" not in beat, beat


@pytest.mark.parametrize("keys, named", [
    ({"model": "bn_net"}, "model"),
    ({"grad_reduction": "tree", "micro_batch_size": 8, "sampler": "global", "fsdp2_mp": "bf16"}, "grad_reduction"),
    ({"seed_mode": "article"}, "seed_mode"),
    ({"amp": "fp16"}, "amp"),
    ({"fsdp2_bug": "sync_left_off", "grad_accum_steps": 1}, "fsdp2_bug"),
    ({"fsdp2_mp": "bf16", "amp": "bf16"}, "fsdp2_mp"),
])
def test_unsupported_combinations_are_refused_before_launch(keys, named):
    with pytest.raises(config_mod.ConfigError, match=f"wrap=fsdp2 with {named}="):
        config_mod.resolve({"wrap": "fsdp2", **keys}, 2)


def test_fsdp2_keys_without_fsdp2_are_refused():
    for key, value in (("fsdp2_mp", "bf16"), ("fsdp2_bug", "root_not_wrapped")):
        with pytest.raises(config_mod.ConfigError, match=f"{key}={value} needs wrap=fsdp2"):
            config_mod.resolve({key: value}, 2)
