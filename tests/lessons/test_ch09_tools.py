"""Chapter 09's hang and launch-layout tools (lab_utils/lessons/ch09_launching.py), on real processes and a real
2-node launch (simulated on 127.0.0.1)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab_utils.launch import launcher
from lab_utils.lessons import ch09_launching as ch09


def test_prefixed_lines_reads_role_and_local_rank(tmp_path):
    log = tmp_path / "output.log"
    log.write_text("[W socket.cpp] no prefix\n[default_role0]:[train] step 1\n[gpu-b:1]:hello\n")
    assert ch09.prefixed_lines(log) == [("default_role", "0", "[train] step 1"), ("gpu-b:", "1", "hello")]


@pytest.mark.slow
@pytest.mark.skipif(not Path(ch09.PY_SPY).exists(), reason="py-spy not installed")
def test_py_spy_dump_names_the_waiting_function(tmp_path):
    script = tmp_path / "waiter.py"
    script.write_text("import time\n\ndef wait_here():\n    time.sleep(60)\n\nwait_here()\n")
    proc = subprocess.Popen([sys.executable, str(script)])
    try:
        time.sleep(1.0)
        cmd, text = ch09.py_spy_dump(proc.pid)
        assert cmd[1:] == ["dump", "--pid", str(proc.pid)]
        frames = ch09.spy_frames(text)
        assert frames and frames[0].startswith("wait_here ("), text
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_py_spy_dump_of_a_dead_pid_says_why():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    _, text = ch09.py_spy_dump(proc.pid)
    assert "Thread" not in text and text  # an error, not an empty dump


@pytest.mark.slow
def test_launch_layout_reads_each_workers_torchrun_variables(tmp_path):
    r = launcher.launch(launcher.request("ch09t_layout", 1, {"steps": 2, "backend": "gloo", "n_samples": 64},
                                         timeout=180,
                                         progress=False, nnodes=2, runs_dir=tmp_path))
    r.raise_for_status()
    layout = ch09.launch_layout(r)
    ws = layout["workers"]
    assert sorted(w["RANK"] for w in ws) == [0, 1]
    assert {w["WORLD_SIZE"] for w in ws} == {2} and {w["LOCAL_RANK"] for w in ws} == {0}
    assert sorted(w["GROUP_RANK"] for w in ws) == [0, 1]
    assert all(w["RANK"] == w["GROUP_RANK"] * 1 + w["LOCAL_RANK"] for w in ws)  # torch's homogeneous ranks
    assert sorted(w["node"] for w in ws) == [0, 1]  # one worker per node agent
    assert layout["endpoint"].startswith("127.0.0.1:") and " " not in layout["endpoint"]
    fig = ch09.plot_launch_layout(layout)
    assert len(fig.axes[0].patches) == 1 + 2 + 2  # the store, two agents, two workers


@pytest.mark.slow
def test_launch_layout_refuses_a_run_without_the_variables(tmp_path):
    r = launcher.launch(launcher.request("ch09t_one", 1, {"steps": 1}, timeout=120, progress=False, runs_dir=tmp_path))
    beat = r.run_dir / "progress" / "rank0.json"
    text = beat.read_text().replace('"torchrun"', '"was_torchrun"')
    beat.write_text(text)
    with pytest.raises(ValueError, match="rank 0's heartbeat has no torchrun variables"):
        ch09.launch_layout(r)
