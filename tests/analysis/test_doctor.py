"""`ddp-lab doctor`: bad folders are named (exit 2); the causes are ranked with their evidence (synthetic
folders, so each check is isolated); and the article's §7.1 check, corrected, with real runs: 100 samples at
the article's global batch of 32 cross an epoch boundary at step 3, and a forgotten set_epoch parts there.
The suite's bugs: tests/analysis/test_port_bugs.py checks the doctor's top cause on the same runs."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lab_utils.analysis import doctor
from lab_utils.core import runfiles
from lab_utils.launch import launcher

REPO = Path(__file__).resolve().parents[2]


def write_run(path: Path, losses, grad_norms, config=None, world_size=1, hashes=None, extra=None, init=None):
    path.mkdir(parents=True)
    hashes = hashes or [f"h{i}" for i in range(len(losses))]
    with open(path / runfiles.METRICS, "w") as f:
        for i, (loss, g) in enumerate(zip(losses, grad_norms, strict=True)):
            f.write(json.dumps({"step": i, "loss": loss, "grad_norm": g, "param_hash": hashes[i],
                                **((extra or {}).get(i, {}))}) + "\n")
    cfg = {"config": config or {}, "world_size": world_size, "device": "cpu"}
    if init:
        cfg["init_param_hash_by_rank"] = init
    (path / runfiles.CONFIG).write_text(json.dumps(cfg))
    return path


def test_bad_folders_are_named(tmp_path):
    good = write_run(tmp_path / "good", [1.0, 0.9], [1.0, 1.0])
    with pytest.raises(doctor.RunFolderError, match="no such run folder"):
        doctor.diagnose_runs(good, tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(doctor.RunFolderError, match="not a folder"):
        doctor.diagnose_runs(good, tmp_path / "file")
    (tmp_path / "nometrics").mkdir()
    (tmp_path / "nometrics" / "config.json").write_text("{}")
    with pytest.raises(doctor.RunFolderError, match=r"nometrics: no metrics.jsonl .*config.json"):
        doctor.diagnose_runs(good, tmp_path / "nometrics")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / runfiles.METRICS).write_text("\n")
    with pytest.raises(doctor.RunFolderError, match="empty"):
        doctor.diagnose_runs(empty, good)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / runfiles.METRICS).write_text('{"step": 0, "loss": 1.0}\n{"step": 1, "lo\n')
    with pytest.raises(doctor.RunFolderError, match="broken/metrics.jsonl line 2: not JSON"):
        doctor.diagnose_runs(good, broken)
    noloss = tmp_path / "noloss"
    noloss.mkdir()
    (noloss / runfiles.METRICS).write_text('{"step": 0, "value": 1.0}\n')
    with pytest.raises(doctor.RunFolderError, match="line 1: no 'loss' field"):
        doctor.diagnose_runs(good, noloss)


def test_missing_config_and_model_are_notes_not_errors(tmp_path):
    a = write_run(tmp_path / "a", [1.0, 0.9], [1.0, 1.0])
    b = write_run(tmp_path / "b", [1.0, 0.9], [1.0, 1.0])
    (b / runfiles.CONFIG).unlink()
    d = doctor.diagnose_runs(a, b)
    assert any("B: no config.json" in n for n in d.notes) and any("no model.pt" in n for n in d.notes)


def test_causes_are_ranked_with_evidence(tmp_path):
    """A global batch that differs and a grad-norm ratio of 1/2: parity names the batch (first), the gradient
    scale follows with its numbers, float order last."""
    a = write_run(tmp_path / "a", [2.0, 1.5, 1.2], [1.0, 1.0, 1.0], {"global_batch_size": 16})
    b = write_run(tmp_path / "b", [2.5, 1.9, 1.7], [0.5, 0.5, 0.5], {"global_batch_size": 32}, world_size=2)
    d = doctor.diagnose_runs(a, b)
    codes = [c.code for c in d.causes]
    assert codes[0] == "global_batch" and codes[-1] == "float_order", d.format()
    scale = next(c for c in d.causes if c.code == "reduction_scale")
    assert "grad_norm B/A is 0.5 at step 0" in scale.evidence and "1/world_size (2)" in scale.evidence
    assert d.exit_code == 1 and d.first_diverging_step == 0


def test_per_rank_init_is_evidence_for_per_rank_randomness(tmp_path):
    a = write_run(tmp_path / "a", [2.0, 1.5], [1.0, 1.0], init=["aaaa"])
    b = write_run(tmp_path / "b", [2.0, 1.6], [1.0, 1.1], world_size=2, init=["aaaa", "bbbb"],
                  hashes=["h0x", "h1x"])
    d = doctor.diagnose_runs(a, b)
    rng = next(c for c in d.causes if c.code == "per_rank_rng")
    assert "rank 0 aaaa, rank 1 bbbb" in rng.evidence, d.format()


def test_sample_ids_locate_the_data_divergence(tmp_path):
    ids = {i: {"sample_ids": [2 * i, 2 * i + 1], "samples": 2 * (i + 1)} for i in range(4)}
    later = {**ids, 2: {"sample_ids": [0, 1], "samples": 6}, 3: {"sample_ids": [2, 3], "samples": 8}}
    a = write_run(tmp_path / "a", [2.0, 1.8, 1.6, 1.4], [1.0] * 4, extra=ids)
    b = write_run(tmp_path / "b", [2.0, 1.8, 1.7, 1.5], [1.0, 1.0, 1.2, 1.3], extra=later,
                  hashes=["h0", "h1", "x2", "x3"])
    d = doctor.diagnose_runs(a, b)
    ev = " ".join(c.evidence for c in d.causes if c.code == "sampler_epoch")
    assert "the same samples at steps 0-1, other samples from step 2 on" in ev, d.format()


@pytest.mark.slow
def test_cli_exit_codes_and_json(tmp_path):
    a = write_run(tmp_path / "a", [1.0, 0.9], [1.0, 1.0], {"global_batch_size": 16})
    b = write_run(tmp_path / "b", [1.3, 1.2], [1.0, 1.0], {"global_batch_size": 32})
    run = lambda *args: subprocess.run([sys.executable, "-m", "lab_utils", "doctor", *map(str, args)],  # noqa: E731
                                       capture_output=True, text=True, cwd=REPO)
    r = run(a, b, "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["causes"][0]["code"] == "global_batch"
    r = run(a, tmp_path / "nope")
    assert r.returncode == 2 and "nope: no such run folder" in r.stderr


@pytest.mark.slow
def test_article_7_1_check_corrected_epoch_boundary_at_step_3(runs_dir):
    """§7.1: 100 samples, "diverges in the first 10 steps = seeds or data split; later = float noise". At the
    article's global batch of 32 an epoch is 3.125 steps: a forgotten set_epoch parts at step 3, not 'noise'."""
    keys = {"steps": 6, "n_samples": 100, "global_batch_size": 32}
    launcher.launch(launcher.request("s", 1, keys, timeout=300, progress=False)).raise_for_status()
    launcher.launch(launcher.request("p", 2, {**keys, "set_epoch": False}, timeout=300,
                                     progress=False)).raise_for_status()
    d = doctor.diagnose_runs(runs_dir / "s", runs_dir / "p")
    assert d.top.code == "sampler_epoch" and d.first_diverging_step == 3, d.format()
    assert d.report.loss_diffs[2] <= d.report.loss_tol < d.report.loss_diffs[3], d.format()
