"""Launcher fault paths with real 2-rank gloo jobs: hang, crash, kill, abort, a rank deaf to SIGTERM, and the
launcher itself stopped (SIGTERM, SIGHUP, SIGKILL, a Jupyter kernel restart) — and nothing left behind."""
import json
import signal
import subprocess
import sys
import time

import pytest
from processes import leftovers, nothing_left_within

from lab_utils.core.config import ConfigError
from lab_utils.core.runfiles import REPO, read_heartbeats
from lab_utils.launch import elastic_driver, launch_commands, launcher
from lab_utils.lessons import ch09_launching

FAST = ["steps=6", "n_samples=256", "log_every=1"]
# A run that is still training when we stop it; rank 1 ignores SIGTERM from step 2 on (rank 0 then waits for
# it in the all-reduce), so only a SIGKILL after the grace gets it: a plain SIGTERM to the tree is not enough.
DEAF = ["steps=100000", "n_samples=256", "fault=ignore_term", "fault_rank=1", "fault_step=2"]


def wait_until_rank1_is_deaf(run_dir, proc=None, within: float = 300) -> None:
    """Both ranks have started training and rank 1 has reached its ignore_term fault (step 2)."""
    deadline = time.time() + within
    while time.time() < deadline:
        beats = read_heartbeats(run_dir)
        if len(beats) == 2 and beats[1].get("step", -1) >= 2:
            time.sleep(1.0)  # the heartbeat comes just before inject_fault installs SIG_IGN
            return
        assert proc is None or proc.poll() is None, "the launcher exited before the run got going"
        time.sleep(0.2)
    raise AssertionError(f"rank 1 never reached step 2 within {within} s: {read_heartbeats(run_dir)}")


@pytest.mark.slow
def test_ok_run_writes_its_files(shared_run):
    r = shared_run(2, FAST)  # the same run is test_multinode's standalone reference: launched once
    assert r.ok, str(r)
    for f in ("config.json", "metrics.jsonl", "model.pt", "result.json", "output.log", "launch.json"):
        assert (r.run_dir / f).exists(), f
    assert not (r.run_dir / "failures.json").exists()
    assert not leftovers(r.run_dir)
    # What a learner copies is torchrun's own command line for the same run (the driver is what ran).
    assert r.command_line.startswith("torchrun --standalone --nproc-per-node=2 ") and "scripts/train.py" in \
        r.command_line and f"out_dir={r.run_dir}" in r.command_line
    launched = json.loads((r.run_dir / "launch.json").read_text())
    assert launched["command_line"] == r.command_line and "lab_utils.launch.elastic_driver" in launched["cmd"]


@pytest.mark.slow
def test_hang_is_named_and_stopped(runs_dir):
    """Caught by the stall timeout (no heartbeat from any rank for 8 s), long before the overall timeout (the
    backstop); then the same stop path as at that timeout: the rank named, its stack dumped, the tree stopped."""
    start = time.time()
    r = launcher.launch(launcher.request("hang", 2, FAST + ["fault=hang", "fault_rank=1", "fault_step=3"], timeout=300,
                                         progress=False, stall_timeout=8))
    assert time.time() - start < 150
    assert r.status == "hang" and "hang: no heartbeat from any rank for 8 s" in r.message, str(r)
    assert r.failing_rank == 1, r.message  # rank 1 is behind; rank 0 waits for it in the all-reduce
    assert "rank 1 is behind" in r.message
    assert ch09_launching.innermost(r.stacks[1]) == "inject_fault: time.sleep(3600)", r.stacks
    assert not leftovers(r.run_dir)


def test_a_held_stall_counts_from_the_release(tmp_path):
    """chapter 09's hang holds its port until the clash has tried it: while the hold is on no stall is called,
    however old the last heartbeat; after the release the stall counts from the later of the two."""
    from lab_utils.core.runfiles import PROGRESS
    from lab_utils.launch.launch_diagnose import stalled

    (tmp_path / PROGRESS).mkdir(parents=True)
    (tmp_path / PROGRESS / "rank0.json").write_text(json.dumps({"rank": 0, "step": 2, "phase": "step start",
                                                                "time": 100.0}))
    assert stalled(tmp_path, 10, now=200.0)                      # no hold: 100 s without a heartbeat
    assert not stalled(tmp_path, 10, now=200.0, held_until=None)  # held
    assert not stalled(tmp_path, 10, now=195.0, held_until=190.0)  # released 5 s ago
    assert stalled(tmp_path, 10, now=201.0, held_until=190.0)
    assert not stalled(tmp_path, None, now=1e9)


@pytest.mark.slow
def test_crash_shows_the_failing_ranks_traceback(runs_dir):
    r = launcher.launch(launcher.request("crash", 2, FAST + ["fault=crash", "fault_rank=1", "fault_step=2"],
                                         timeout=300, progress=False))
    assert r.status == "crashed" and r.failing_rank == 1
    assert "injected fault: crash on rank 1 at step 2" in r.message
    assert "inject_fault" in r.traceback and "Traceback" in r.traceback
    assert not leftovers(r.run_dir)


@pytest.mark.slow
def test_killed_rank_is_reported_by_signal(runs_dir):
    r = launcher.launch(launcher.request("kill", 2, FAST + ["fault=kill", "fault_rank=1", "fault_step=2"], timeout=300,
                                         progress=False))
    assert r.status == "crashed" and r.failing_rank == 1
    assert "SIGKILL" in r.message
    assert not leftovers(r.run_dir)


@pytest.mark.slow
def test_single_process_crash_and_hang(runs_dir):
    """Also launch_many: failures come back as results, in the order given, unless raise_on_failure."""
    specs = {"crash": ("crash1", 1, FAST + ["fault=crash", "fault_step=1"]),
             "abort": ("abort1", 1, FAST + ["fault=abort", "fault_step=1"])}
    out = launcher.launch_many(launcher.requests_from_specs(specs, timeout=300), max_workers=2)
    assert list(out) == ["crash", "abort"] and [r.name for r in out.values()] == ["crash1", "abort1"]
    r = out["crash"]
    assert r.status == "crashed" and "injected fault" in r.message and "inject_fault" in r.traceback
    r = out["abort"]
    assert r.status == "crashed" and r.failing_rank == 0 and "SIGABRT" in r.message, str(r)
    assert r.command_line.startswith("python scripts/train.py ")  # what ran after the exec, to copy
    # the overall timeout (one process, no stall timeout): a hang, reported by raise_on_failure after the stop
    hang = launcher.request("hang1", 1, FAST + ["fault=hang", "fault_step=1"], timeout=8)
    with pytest.raises(launcher.RunFailed, match=r"(?s)run 'hang1': hang .*no exit after the 8 s timeout"):
        launcher.launch_many({"hang": hang}, max_workers=1, raise_on_failure=True)
    assert not leftovers(runs_dir / "hang1")


@pytest.mark.parametrize("nproc, keys, fragment", [
    (0, [], "nproc=0"),
    (2, ["out_dir=/tmp/x"], "out_dir is set by the launcher"),
    (2, ["global_batch_size=15"], "global_batch_size=15"),
    (1, ["tf32=true", "device=cpu"], "tf32=true needs a CUDA device"),
    (1, ["compile=true", "device=cpu"], "compile=true needs a CUDA device"),
    (1, ["compile=true", "emulate_ranks=2"], "compile=true is not supported with emulate_ranks=2"),
])
def test_bad_input_fails_before_launch(runs_dir, nproc, keys, fragment):
    with pytest.raises(ConfigError, match=fragment.replace("*", r"\*")):
        launcher.launch(launcher.request("bad", nproc, keys, timeout=10, progress=False))
    assert not (runs_dir / "bad").exists()  # nothing was launched, nothing written


@pytest.mark.slow
def test_abort_is_blamed_on_the_aborting_rank_not_its_sigtermed_peer(runs_dir):
    """Rank 1 dies by SIGABRT while rank 0 is outside any collective, so the agent SIGTERMs rank 0 (as a rank
    blocked in NCCL is). torchrun's summary lists rank 0 first; the root cause is still rank 1."""
    r = launcher.launch(launcher.request("abort", 2, FAST + ["fault=abort", "fault_rank=1", "fault_step=2"],
                                         timeout=300, progress=False))
    assert r.status == "crashed" and r.failing_rank == 1, str(r)
    assert "SIGABRT" in r.message and "SIGTERM" not in r.message
    doc = json.loads((r.run_dir / "failures.json").read_text())
    by_rank = {f["rank"]: f for f in doc["failures"]}
    assert by_rank[0]["signal"] == "SIGTERM", doc  # the scenario really happened: the peer was SIGTERMed
    assert by_rank[1]["signal"] == "SIGABRT" and by_rank[1]["exitcode"] == -6
    assert doc["root_cause"] == 1
    assert not leftovers(r.run_dir)


@pytest.mark.slow
def test_rank_ignoring_sigterm_is_killed_when_the_run_stalls(runs_dir):
    """The stall timeout (10 s without a heartbeat) stops the run long before the overall timeout (the
    backstop); rank 1 survives the SIGTERM, so only the SIGKILL after the grace ends it."""
    start = time.time()
    r = launcher.launch(launcher.request("deaf", 2, FAST + ["fault=ignore_term", "fault_rank=1", "fault_step=2"],
                                         timeout=300, progress=False, stall_timeout=10))
    assert r.status == "hang" and r.failing_rank == 1, str(r)
    assert "hang: no heartbeat from any rank for 10 s" in r.message, str(r)
    assert r.heartbeats[1]["step"] == 2  # rank 1 reached the fault, so it was ignoring SIGTERM when stopped
    # after the last heartbeat: the stall, the stack dump, then the whole grace, since the deaf rank outlived
    # its SIGTERM (one that died of it would end the wait early); only the SIGKILL after it ended rank 1
    since_last_beat = time.time() - max(b["time"] for b in r.heartbeats.values())
    assert since_last_beat >= 10 + launcher.DUMP_WAIT + elastic_driver.SHUTDOWN_GRACE, since_last_beat
    assert time.time() - start < 150
    assert not leftovers(r.run_dir)  # right away: launch() returns only once the tree is gone


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL], ids=lambda s: s.name)
def test_launcher_stopped_by_a_signal_leaves_nothing(runs_dir, sig):
    """`ddp-lab run` stopped as `timeout`, a CI job limit or a closing terminal stops it (SIGTERM, SIGHUP), or
    killed outright (SIGKILL: no handler runs, the parent-death signals must do it)."""
    name = f"stopped_{sig.name}"
    # SIGHUP as a terminal delivers it: a test runner started under `nohup` (or a CI agent ignoring SIGHUP)
    # would pass SIG_IGN on, and the launcher rightly never overrides an ignored signal.
    proc = subprocess.Popen([sys.executable, "-m", "lab_utils", "run", "--name", name, "--nproc", "2", "--quiet",
                             *DEAF], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    try:
        wait_until_rank1_is_deaf(runs_dir / name, proc)
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    left = nothing_left_within(runs_dir / name, 15)
    assert not left, left
    assert proc.returncode != 0
    if sig != signal.SIGKILL:
        assert f"stopped by {sig.name}; every process was stopped" in out, out[-2000:]
        assert json.loads((runs_dir / name / "launch.json").read_text())["status"] == "stopped"


@pytest.mark.slow
def test_kernel_restart_mid_run_leaves_nothing(runs_dir):
    """A notebook's kernel restarted (SIGKILL to its process group) while a cell runs a launch: the driver is
    in a session of its own, so only the parent-death signal chain stops the run."""
    from jupyter_client import KernelManager

    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(REPO))
    kc = km.client()
    try:
        kc.start_channels()
        kc.wait_for_ready(timeout=120)
        kc.execute(f"from lab_utils.launch import launcher\nlauncher.launch(launcher.request('kernel', 2, {DEAF!r}, "
                   "timeout=900, progress=False))")
        wait_until_rank1_is_deaf(runs_dir / "kernel")
        km.restart_kernel(now=True)
        left = nothing_left_within(runs_dir / "kernel", 15)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert not left, left


def _error_file(path, message: str, ts: int) -> str:
    """An error file as @record writes it."""
    path.write_text(json.dumps({"message": {"message": message, "extraInfo": {
        "py_callstack": f"Traceback (most recent call last):\n{message}\n", "timestamp": str(ts)}}}))
    return str(path)


@pytest.mark.parametrize("case, expected, in_reason", [
    # the peer the agent SIGTERMed is listed first (as torchrun prints it); the SIGABRT is the cause
    ([("sig", 15), ("sig", 6)], 1, "SIGABRT"),
    # a peer's "Connection reset" seen first (even earlier) does not outrank the rank SIGKILLed
    ([("peer", 100), ("sig", 9)], 1, "SIGKILL"),
    # a rank's own Python error outranks a signal and a lost-peer error, whatever the order
    ([("peer", 100), ("sig", 6), ("own", 200)], 2, "RuntimeError: boom"),
    # two own errors: the earlier one
    ([("own", 300), ("own", 200)], 1, "RuntimeError: boom"),
    # only lost-peer errors and SIGTERMs: an error file is still the best evidence
    ([("sig", 15), ("peer", 100)], 1, "Connection reset by peer"),
    # nothing but an exit code and a SIGTERM: the first failure
    ([("code", 3), ("sig", 15)], 0, "rank 0 exited with code 3"),
])
def test_root_cause_rule(tmp_path, case, expected, in_reason):
    """The rule on real torch ProcessFailure objects (error files on disk), keyed by rank in the agent's order."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    failures = {}
    for rank, (kind, value) in enumerate(case):
        path = tmp_path / f"error{rank}.json"
        if kind == "own":
            failures[rank] = ProcessFailure(rank, 1000 + rank, 1, _error_file(path, "RuntimeError: boom", value))
        elif kind == "peer":
            text = "RuntimeError: [pair.cc:537] Read error: Connection reset by peer."
            failures[rank] = ProcessFailure(rank, 1000 + rank, 1, _error_file(path, text, value))
        else:
            failures[rank] = ProcessFailure(rank, 1000 + rank, -value if kind == "sig" else value, str(path))
    doc = elastic_driver.write_failures(tmp_path, failures)
    assert doc["root_cause"] == expected and in_reason in doc["reason"], doc
    assert json.loads((tmp_path / elastic_driver.FAILURES).read_text()) == doc
    assert len(doc["failures"]) == len(case)  # every failure is kept, not only the cause


def test_half_written_error_file_is_read_as_no_file(tmp_path):
    """A survivor SIGTERMed while writing its error file leaves half a JSON; the agent must not die on it."""
    elastic_driver.tolerate_half_written_error_files()
    from torch.distributed.elastic.multiprocessing import api

    half = tmp_path / "error0.json"
    half.write_text('{"message": {"message": "RuntimeError: [pair.cc:537] Read error: Connec')
    failures = {0: api.ProcessFailure(0, 1000, -15, str(half)), 1: api.ProcessFailure(1, 1001, -9, str(half))}
    doc = elastic_driver.write_failures(tmp_path, failures)
    assert doc["root_cause"] == 1 and "SIGKILL" in doc["reason"]
    assert doc["failures"][0]["error_file"] is None and doc["failures"][0]["signal"] == "SIGTERM"


def test_ranks_get_a_bytecode_cache_only_when_torch_ships_without_one(tmp_path, monkeypatch):
    """launch_commands.bytecode_cache: the two-H200 box had torch with no __pycache__ and
    PYTHONDONTWRITEBYTECODE=1, so every rank compiled torch from source. The ranks then get a cache folder;
    otherwise nothing changes."""
    import importlib.util
    from types import SimpleNamespace

    bare = tmp_path / "site" / "torch"  # a torch folder with no bytecode next to its source
    bare.mkdir(parents=True)
    (bare / "__init__.py").write_text("")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: SimpleNamespace(origin=str(bare / "__init__.py"))
                        if name == "torch" else real_find_spec(name, *a))
    box = {"PYTHONDONTWRITEBYTECODE": "1", "XDG_CACHE_HOME": str(tmp_path / "cache")}
    assert launch_commands.bytecode_cache(box) == tmp_path / "cache" / "ddp-parity-lab" / "pycache"
    assert launch_commands.bytecode_cache({**box, "LAB_BYTECODE_CACHE": "off"}) is None
    assert launch_commands.bytecode_cache({**box, "PYTHONPYCACHEPREFIX": "/elsewhere"}) is None  # the user's own wins
    monkeypatch.setattr(launch_commands.os, "environ", box)
    env = launch_commands.environment({"threads": 1}, tmp_path / "logs", 2, None)
    assert env["PYTHONPYCACHEPREFIX"] == str(tmp_path / "cache" / "ddp-parity-lab" / "pycache")
    assert "PYTHONDONTWRITEBYTECODE" not in env
    (bare / "__pycache__").mkdir()  # bytecode next to the source: Python reads it, a prefix would hide it
    assert launch_commands.bytecode_cache(box) is None
    assert "PYTHONPYCACHEPREFIX" not in launch_commands.environment({"threads": 1}, tmp_path / "logs", 2, None)


def test_progress_in_a_log_is_one_line_per_run(monkeypatch):
    """Where stderr is a file (CI, `make lab > log 2>&1`), the poll loop's 5 redraws a second must not each leave
    a "0/40" line: one line when the run ends. A terminal (or a Jupyter kernel) keeps the live bar."""
    import io

    from lab_utils.launch import supervise

    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    assert not supervise.live_display()
    bar = supervise.progress_bar(40, "demo", True)
    for _ in range(20):  # the ranks are starting: nothing written yet
        bar.show(0, None)
    bar.show(40, 1.23456)
    bar.close()
    lines = log.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("demo: 40/40 steps, loss 1.2346 ("), lines
    monkeypatch.setattr(supervise, "LOG_EVERY", 0.0)  # a long run: a line per LOG_EVERY s, none repeated
    bar = supervise.progress_bar(40, "long", True)
    for done in (0, 0, 10, 10, 20):
        bar.show(done, 1.0)
    bar.close()
    assert [ln.split(" (")[0] for ln in log.getvalue().splitlines()[1:]] == \
        ["long: 0/40 steps, loss 1.0000", "long: 10/40 steps, loss 1.0000", "long: 20/40 steps, loss 1.0000"]
    assert supervise.progress_bar(40, "off", False) is None


EXIT_HANG = '''"""Every rank does its work and reports it finished; rank 1 then never exits (a deadlock at exit)."""
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, {repo!r})
from lab_utils.core import config, distenv, runfiles  # noqa: E402

cfg = config.resolve(sys.argv[1:], int(os.environ["WORLD_SIZE"]))
env = distenv.setup(cfg)
heart = runfiles.Heartbeat(Path(cfg["out_dir"]), env.rank)
heart.beat(step=-1, phase="setup")
heart.beat(phase="finished")
distenv.teardown(env)
if env.rank == 1:
    time.sleep(3600)  # the hang at exit
distenv.exit_process(0)
'''


@pytest.mark.slow
def test_a_hang_at_exit_after_every_rank_finished_names_the_rank_still_running(runs_dir, tmp_path):
    """CI's chapter 06 probe hung at exit with its work done, and the report said 'no rank reported any progress'.
    With heartbeats, the report names the rank whose process did not exit and shows its stack."""
    script = tmp_path / "exit_hang.py"
    script.write_text(EXIT_HANG.format(repo=str(REPO)))
    r = launcher.launch(launcher.request("exit_hang", 2, ["steps=1"], timeout=60, progress=False, script=script))
    assert r.status == "hang" and r.failing_rank == 1, str(r)
    assert "every rank reported finished, but rank 1 did not exit" in r.message, r.message
    assert "exit_hang.py" in str(r), str(r)  # its stack, in the report a user reads
    assert "time.sleep(3600)" in ch09_launching.innermost(r.stacks[1]), r.stacks
    assert not leftovers(r.run_dir)
