"""lab_utils.core.record on a script the lab did not write: pytorch/examples' multigpu_torchrun.py, patched to run on
CPU/gloo and instrumented with the recorder (tests/outside/multigpu_torchrun_recorded.py). Real runs, one
process vs 2 ranks through the launcher (torchrun's elastic API), then compare and doctor on their folders."""

from pathlib import Path

import pytest
import torch

from lab_utils.analysis import doctor, parity
from lab_utils.core import record, runfiles
from lab_utils.launch import launcher

SCRIPT = Path(__file__).resolve().parents[1] / "outside" / "multigpu_torchrun_recorded.py"
KEYS = {"steps": 8, "n_samples": 64, "global_batch_size": 16}  # 4 steps per epoch: boundary at step 4


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    root = tmp_path_factory.mktemp("record") / "runs"
    runs = {"single": (1, KEYS, {}), "ddp": (2, KEYS, {}), "no_set_epoch": (2, {**KEYS, "set_epoch": False}, {}),
            # what record's docstring shows a user: the single run as 2 micro-batches (its float twin), and
            # dealt out as 2 DistributedSampler ranks would get them (the emulated reference)
            "single_twin": (1, KEYS, {"MICRO_BATCHES": "2"}),
            "single_as_2_ranks": (1, KEYS, {"MICRO_BATCHES": "2", "LAYOUT": "ranks"})}
    for name, (nproc, keys, env) in runs.items():
        launcher.launch(launcher.request(name, nproc, keys, timeout=300, progress=False, runs_dir=root, script=SCRIPT,
                                         extra_env=env)).raise_for_status()
    return root


@pytest.mark.slow
def test_a_float_twin_of_your_single_run_calibrates_the_verdict(recorded):
    report = parity.compare(recorded / "single", recorded / "ddp", noise_runs=[recorded / "single_twin"])
    assert report.calibrated and report.tier >= 2, report.format()
    twin = parity.compare(recorded / "single", recorded / "single_twin")
    assert not twin.bitwise, "the twin must be another float order, or it measures no noise"
    diagnosis = doctor.diagnose_runs(recorded / "single", recorded / "ddp", noise_runs=[recorded / "single_twin"])
    assert diagnosis.exit_code == 0, diagnosis.format()
    bug = doctor.diagnose_runs(recorded / "single", recorded / "no_set_epoch", noise_runs=[recorded / "single_twin"])
    assert bug.exit_code == 1 and bug.top.code == "sampler_epoch", bug.format()


@pytest.mark.slow
def test_the_single_run_dealt_out_like_ranks_is_bitwise_equal_to_ddp(recorded):
    report = parity.compare(recorded / "single_as_2_ranks", recorded / "ddp")
    assert report.tier == 3, report.format()
    plain = parity.compare(recorded / "single", recorded / "ddp")
    assert plain.tier < 3, "the plain single run sums in another order: only the dealt-out one is bitwise"


@pytest.mark.slow
def test_the_folder_follows_the_runfiles_contract(recorded):
    run = recorded / "ddp"
    for name in (runfiles.CONFIG, runfiles.METRICS, runfiles.MODEL, runfiles.RESULT):
        assert (run / name).exists(), name
    assert not (run / runfiles.PROBE).exists()  # optional: parity copes without it
    cfg = runfiles.read_config(run)
    assert cfg["world_size"] == 2 and cfg["backend"] == "gloo" and cfg["config"]["global_batch_size"] == 16
    assert len(cfg["init_param_hash_by_rank"]) == 2 and len(set(cfg["init_param_hash_by_rank"])) == 1
    weights = runfiles.load_tensors(run)
    assert set(weights) == {"weight", "bias"}  # no `module.` prefix
    metrics = runfiles.read_metrics(run)
    assert [m["step"] for m in metrics] == list(range(8))
    assert all(len(m["sample_ids"]) == 16 for m in metrics)  # both ranks' ids, gathered
    assert metrics[-1]["samples"] == 8 * 16


@pytest.mark.slow
def test_single_vs_two_ranks_is_unchanged_and_doctor_says_so(recorded):
    report = parity.compare(recorded / "single", recorded / "ddp")
    assert report.tier >= 2, report.format()
    # The logged loss is the mean over both ranks: rank 0's own loss alone would miss by far more than 1e-6.
    assert report.max_abs_loss_diff <= 1e-6
    d = doctor.diagnose_runs(recorded / "single", recorded / "ddp")
    assert d.exit_code == 0 and d.verdict in ("no bug: float order", "unchanged: bitwise"), d.format()
    sa = [m["sample_ids"] for m in runfiles.read_metrics(recorded / "single")]
    sb = [m["sample_ids"] for m in runfiles.read_metrics(recorded / "ddp")]
    assert sa == sb  # the same samples in every step: DistributedSampler(1 replica) vs 2 replicas, same seed


@pytest.mark.slow
def test_doctor_finds_the_forgotten_set_epoch_from_the_sample_ids(recorded):
    d = doctor.diagnose_runs(recorded / "single", recorded / "no_set_epoch")
    assert d.exit_code == 1 and d.top.code == "sampler_epoch", d.format()
    assert d.first_diverging_step == 4, d.format()
    assert "the same samples at steps 0-3, other samples from step 4 on" in d.top.evidence, d.format()


def _train(steps: int, rec_dir: Path | None) -> tuple[dict, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = record.Recorder(rec_dir, model, config={"lr": 0.1}, global_batch_size=6) if rec_dir else None
    for step in range(steps):
        x = torch.randn(6, 4)  # global RNG: a draw by the recorder would change the next batch
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        if rec:
            rec.step(step, loss, model, sample_ids=range(step * 6, step * 6 + 6), lr=0.1)
        opt.zero_grad()
    if rec:
        rec.close(model, probe_inputs=torch.ones(2, 4))
    return {k: v.clone() for k, v in model.state_dict().items()}, torch.get_rng_state()


def test_the_recorder_changes_nothing_in_the_training(tmp_path):
    """Same weights and the same global RNG state with and without it (dropout draws from that RNG)."""
    plain, rng_plain = _train(5, None)
    rec, rng_rec = _train(5, tmp_path / "run")
    assert all(torch.equal(plain[k], rec[k]) for k in plain)
    assert torch.equal(rng_plain, rng_rec)
    assert (tmp_path / "run" / runfiles.PROBE).exists()
    # And the folder is comparable with itself: a second identical run is bitwise.
    _train(5, tmp_path / "run2")
    assert parity.compare(tmp_path / "run", tmp_path / "run2").tier == 3


def test_bad_arguments_are_named(tmp_path):
    model = torch.nn.Linear(2, 1)
    with pytest.raises(ValueError, match="global_batch_size=0"):
        record.Recorder(tmp_path, model, global_batch_size=0)
    with pytest.raises(TypeError, match="config must be a dict"):
        record.Recorder(tmp_path, model, config=["lr", 1])
