"""Chapter 12's timeline of a killed and resumed run: the steps lost to the kill are kept and drawn.

A real run of scripts/train.py, started twice in one folder as torchrun's elastic restart starts it: the first
start SIGKILLs itself at the start of step 5 (checkpoints every 3 steps, so steps 3 and 4 are lost), the second
runs with TORCHELASTIC_RESTART_COUNT=1 and resume=auto. One process, so the test is cheap; tests/core/test_checkpoint.py
does the same through torchrun at 2 ranks.

What wrong code would still pass: none of these. If kept_metrics stops keeping the dropped records, the REDONE
file is empty and the greyed series is missing; if plot_timeline draws the ✕ at the last kept step (2) or puts
the lost steps in another series, its data no longer equals attempt 0's steps 3 and 4; if keeping them changed
metrics.jsonl, the one-record-per-step check fails.
"""

import os
import signal
import subprocess
import sys

import pytest

from lab_utils.core import resume, runfiles
from lab_utils.launch import launcher
from lab_utils.lessons import ch12_bitwise as bl

KEYS = ["steps=6", "checkpoint_every=3", "resume=auto", "fault=kill", "fault_rank=0", "fault_step=5"]


def _start(out, attempt: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, TORCHELASTIC_RESTART_COUNT=str(attempt), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, str(launcher.TRAIN), f"out_dir={out}", *KEYS], env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    out = tmp_path_factory.mktemp("ch12") / "killed"
    first = _start(out, 0)
    assert first.returncode == -signal.SIGKILL, first.stderr[-2000:]
    second = _start(out, 1)
    assert second.returncode == 0, second.stderr[-2000:]
    return out


@pytest.mark.slow
def test_metrics_hold_each_step_once_and_the_lost_steps_are_kept_apart(killed):
    assert [(m["step"], m["attempt"]) for m in runfiles.read_metrics(killed)] == \
        [(0, 0), (1, 0), (2, 0), (3, 1), (4, 1), (5, 1)]
    assert [(m["step"], m["attempt"]) for m in resume.redone_metrics(killed)] == [(3, 0), (4, 0)]


@pytest.mark.slow
def test_the_timeline_draws_the_lost_steps_grey_and_the_kill_after_them(killed):
    fig = bl.plot_timeline({"run": killed}, {"run": 5})
    lines = {line.get_gid(): line for line in fig.axes[0].get_lines() if line.get_gid()}
    rows = bl.timeline(killed)
    lost = [r for r in rows if r["attempt"] == 0 and r["step"] >= 3]
    assert [r["redone"] for r in lost] == [True, True]
    assert list(lines["redone"].get_ydata()) == [3, 4]
    assert list(lines["redone"].get_xdata()) == [r["t"] for r in lost]
    assert lines["redone"].get_color() == "0.65"  # greyed, not an attempt's colour
    # the kill: at step 5, when attempt 0's last step (4, a lost one) had finished, not at the last kept step 2
    assert list(lines["kill"].get_ydata()) == [5]
    assert list(lines["kill"].get_xdata()) == [lost[-1]["t"]]


def test_a_checkpoint_of_another_run_writes_no_redone_file(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    (a / "checkpoints").mkdir(parents=True)
    b.mkdir()
    (a / runfiles.METRICS).write_text("".join(f'{{"step": {s}, "attempt": 0}}\n' for s in range(4)))
    ckpt = a / "checkpoints" / "step_000002.pt"
    assert [r["step"] for r in resume.kept_metrics(ckpt, 2, redone_to=b)] == [0, 1]
    assert not (a / resume.REDONE).exists() and not (b / resume.REDONE).exists()
    assert [r["step"] for r in resume.kept_metrics(ckpt, 2, redone_to=a)] == [0, 1]
    assert [r["step"] for r in resume.redone_metrics(a)] == [2, 3]
