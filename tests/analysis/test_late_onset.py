"""Bugs that start late, with real runs at the toy size (`ddp-lab bench late --size toy`): the whole-run envelope
goes blind early, a forgotten set_epoch first acts at step 80, an article-style resume and a learning-rate schedule
that restarts at a resume at step 90. The windows (B's window states, A's program replayed from them with a float
twin) must catch each with the right cause and pass the correct port and an exact resume; the whole-run envelope
alone must never say "no bug"."""

import json
import shutil
import subprocess
import sys

import pytest

from lab_utils.analysis import doctor
from lab_utils.drivers import bench_late
from lab_utils.launch import launcher, replay

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]  # every test here reads real runs


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("late")
    launcher.launch_many(launcher.requests_from_specs(bench_late.specs("toy"), runs_dir=root, timeout=300),
                         max_workers=2, raise_on_failure=True)
    return root


@pytest.fixture(scope="module")
def rows(root):
    return {r["case"]: r for r in bench_late.judge(root, "toy")}


def test_windows_judge_every_case_right(rows):
    assert set(rows) == {"correct", "late_set_epoch", "exact_resume", "lossy_resume", "lr_restart"}
    wrong = {k: (r["windows"], r["cause"], r["exit"]) for k, r in rows.items() if not r["right"]}
    assert not wrong, bench_late.table(list(rows.values()))
    assert rows["late_set_epoch"]["first_out"] == 80
    assert rows["lossy_resume"]["first_out"] == 90 and rows["lr_restart"]["first_out"] == 90
    # a correct port sits well inside every window's bound, a bug far outside its first one
    assert rows["correct"]["worst_correct_window"] < 0.2 and rows["exact_resume"]["worst_correct_window"] < 0.2
    assert all(rows[k]["bug_window"] > 100 for k in ("late_set_epoch", "lossy_resume", "lr_restart"))


def test_the_blind_zone_is_real_at_this_size_and_never_certified(rows):
    for r in rows.values():
        assert r["blind_from"] is not None and r["blind_from"] < 80  # both bugs start inside the blind zone
        assert r["whole_exit"] != 0, r  # whole-run only: "not judged" (3) or a differing key (1), never "no bug"
    assert rows["correct"]["whole_exit"] == 3 and "not judged" in rows["correct"]["whole_run"]


def test_replays_are_cached_and_an_old_folder_is_not_judged(root, tmp_path):
    before = {p: p.stat().st_mtime_ns for p in (root / "correct" / "replays").rglob("metrics.jsonl")}
    replay.ensure(root / "A", root / "correct", progress=False)
    assert {p: p.stat().st_mtime_ns for p in before} == before  # nothing relaunched
    old = tmp_path / "old"
    shutil.copytree(root / "late_set_epoch", old, ignore=shutil.ignore_patterns("windows", "replays"))
    with pytest.raises(replay.NoReplay, match="no window states"):
        replay.ensure(root / "A", old, progress=False)
    d = doctor.diagnose_runs(root / "A", old, noise_runs=[next(root.glob("A-twin-*"))])
    assert d.exit_code == 1 and d.report.not_judged  # the set_epoch key differs; its steps past 25 not judged
    ok = tmp_path / "old_ok"
    shutil.copytree(root / "correct", ok, ignore=shutil.ignore_patterns("windows", "replays"))
    d = doctor.diagnose_runs(root / "A", ok, noise_runs=[next(root.glob("A-twin-*"))])
    assert d.exit_code == 3 and d.verdict.startswith("not judged past step")


def test_cli_doctor_replays_by_default(root):
    cmd = [sys.executable, "-m", "lab_utils", "doctor", str(root / "A"), str(root / "late_set_epoch"), "--noise",
           "auto", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stderr
    d = json.loads(out.stdout)
    assert d["windows"]["first_over"] == 80 and d["causes"][0]["code"] == "sampler_epoch"
    off = subprocess.run([*cmd, "--windows", "off"], capture_output=True, text=True, timeout=300)
    assert json.loads(off.stdout)["windows"] is None and json.loads(off.stdout)["not_judged_from"] is not None
