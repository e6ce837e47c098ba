"""Launcher fault paths with real 2-rank gloo jobs: hang, crash, kill — and nothing left behind."""
import json
import time

import psutil
import pytest

from lab_utils import launcher
from lab_utils.config import ConfigError

FAST = ["steps=6", "n_samples=256", "log_every=1"]


def leftovers(run_dir):
    """Processes whose command line mentions this run: torchrun and its workers carry out_dir=run_dir."""
    mine = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(str(run_dir) in part for part in (p.info["cmdline"] or [])):
                mine.append(p)
        except psutil.Error:
            continue
    return mine


def test_ok_run_writes_its_files(runs_dir):
    r = launcher.launch("ok", 2, FAST, timeout=120, progress=False)
    assert r.ok, str(r)
    for f in ("config.json", "metrics.jsonl", "model.pt", "result.json", "output.log", "launch.json"):
        assert (r.run_dir / f).exists(), f
    assert not leftovers(r.run_dir)


def test_hang_is_named_and_stopped(runs_dir):
    start = time.time()
    r = launcher.launch("hang", 2, FAST + ["fault=hang", "fault_rank=1", "fault_step=3"], timeout=20,
                        progress=False)
    assert time.time() - start < 20 + 30
    assert r.status == "hang" and "hang" in r.message
    assert r.failing_rank == 1, r.message  # rank 1 is behind; rank 0 waits for it in the all-reduce
    assert not leftovers(r.run_dir)


def test_crash_shows_the_failing_ranks_traceback(runs_dir):
    r = launcher.launch("crash", 2, FAST + ["fault=crash", "fault_rank=1", "fault_step=2"], timeout=120,
                        progress=False)
    assert r.status == "crashed" and r.failing_rank == 1
    assert "injected fault: crash on rank 1 at step 2" in r.message
    assert "inject_fault" in r.traceback and "Traceback" in r.traceback
    assert not leftovers(r.run_dir)


def test_killed_rank_is_reported_by_signal(runs_dir):
    r = launcher.launch("kill", 2, FAST + ["fault=kill", "fault_rank=1", "fault_step=2"], timeout=120,
                        progress=False)
    assert r.status == "crashed" and r.failing_rank == 1
    assert "SIGKILL" in r.message
    assert not leftovers(r.run_dir)


def test_single_process_crash_and_hang(runs_dir):
    r = launcher.launch("crash1", 1, FAST + ["fault=crash", "fault_step=1"], timeout=60, progress=False)
    assert r.status == "crashed" and "injected fault" in r.message and "inject_fault" in r.traceback
    r = launcher.launch("hang1", 1, FAST + ["fault=hang", "fault_step=1"], timeout=8, progress=False)
    assert r.status == "hang" and not leftovers(r.run_dir)


@pytest.mark.parametrize("nproc, keys, fragment", [
    (0, [], "nproc=0"),
    (2, ["out_dir=/tmp/x"], "out_dir is set by the launcher"),
    (2, ["global_batch_size=15"], "global_batch_size=15"),
])
def test_bad_input_fails_before_launch(runs_dir, nproc, keys, fragment):
    with pytest.raises(ConfigError, match=fragment.replace("*", r"\*")):
        launcher.launch("bad", nproc, keys, timeout=10, progress=False)
    assert not (runs_dir / "bad").exists()  # nothing was launched, nothing written


def test_signal_outranks_a_peer_error_that_torchrun_saw_first(tmp_path):
    """torchrun may call rank 0's 'Connection reset' the root cause when rank 1 was SIGKILLed that second."""
    err = tmp_path / "logs" / "run" / "attempt_0" / "0"
    err.mkdir(parents=True)
    peer = "RuntimeError: [pair.cc:537] Read error: Connection reset by peer."
    (err / "error.json").write_text(json.dumps({"message": {"message": peer, "extraInfo": {"timestamp": "1"}}}))
    output = """Failures:
[1]:
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 31181)  (SIGKILL)
Root Cause (first observed failure):
[0]:
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 31180)
"""
    rank, reason, tb = launcher.read_failure(tmp_path / "logs", output)
    assert rank == 1 and "SIGKILL" in reason and tb == ""
