"""Ranks forked from the driver's zygote (lab_utils/launch/zygote.py) against ranks exec'd as before
(LAB_ZYGOTE=off): the same numbers, really forked, and a client that dies takes its rank with it.
The fault paths (crash, kill, abort, a rank deaf to SIGTERM, hangs and their stack dumps) run through the
zygote in tests/launch/test_launcher.py."""

import json
import os
import signal
import sys
import threading
import time

import psutil
import pytest
from processes import leftovers, words

from lab_utils.core.runfiles import TRAIN, read_heartbeats
from lab_utils.launch import launcher, start_plan

KEYS = ["steps=4", "n_samples=256", "log_every=1", "dropout=0.1"]
TIMING = ("elapsed", "wall")  # the only fields allowed to differ between two runs of the same keys


def _records(run_dir):
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("zygote")
    return launcher.launch_many(launcher.requests_from_specs({
        "forked": ("forked", 2, KEYS),
        "execd": ("execd", 2, KEYS, {"extra_env": {"LAB_ZYGOTE": "off"}}),
    }, runs_dir=root, timeout=300), max_workers=2, raise_on_failure=True)


@pytest.mark.slow
def test_forked_ranks_give_the_exec_paths_numbers_bitwise(pair):
    assert _records(pair["forked"].run_dir) == _records(pair["execd"].run_dir)
    a, b = (read_heartbeats(pair[k].run_dir) for k in ("forked", "execd"))
    wrapped = {run: {r: h["param_hash_after_wrap"] for r, h in beats.items()} for run, beats in (("a", a), ("b", b))}
    assert wrapped["a"] == wrapped["b"]


def _while_hanging(tmp_path, extra_env=None):
    """Start a 2-rank run whose rank 1 hangs at step 1; yield (driver pid, {rank: pid}) while it hangs."""
    out = {}
    keys = ["steps=50", "n_samples=256", "fault=hang", "fault_rank=1", "fault_step=1"]
    thread = threading.Thread(target=lambda: out.setdefault("r", launcher.launch(launcher.request(
        "hang", 2, keys, timeout=120, progress=False, runs_dir=tmp_path, extra_env=extra_env))))
    thread.start()
    run_dir = tmp_path / "hang"
    deadline = time.time() + 120
    while time.time() < deadline:
        beats = read_heartbeats(run_dir) if run_dir.exists() else {}
        if len(beats) == 2 and all(b.get("step", -1) >= 0 for b in beats.values()):
            break
        time.sleep(0.2)
    launch = json.loads((run_dir / "launch.json").read_text())
    driver = next(p for p in psutil.process_iter(["cmdline"])
                  if words(p.info["cmdline"])[:len(launch["cmd"])] == launch["cmd"]
                  and p.parent() is not None and "elastic_driver" not in " ".join(p.parent().cmdline()))
    return thread, out, run_dir, driver, {r: b["pid"] for r, b in beats.items()}


@pytest.mark.slow
def test_ranks_are_forked_from_the_zygote_and_exec_d_when_it_is_off(tmp_path):
    for extra_env, forked in ((None, True), ({"LAB_ZYGOTE": "off"}, False)):
        folder = tmp_path / ("on" if forked else "off")
        folder.mkdir()
        thread, out, run_dir, driver, pids = _while_hanging(folder, extra_env)
        try:
            # driver <- launch zygote <- this process (the zygote started once per caller and environment);
            # with the zygote off, driver <- this process. Either way `ps` shows the command the launcher started.
            launch = json.loads((run_dir / "launch.json").read_text())
            assert words(driver.cmdline()) == launch["cmd"]
            assert launch["started"] == (
                "forked: launch zygote of this process; ranks forked: rank zygote of the driver" if forked
                else "exec: LAB_ZYGOTE=off; ranks exec: LAB_ZYGOTE=off")
            via = driver.parent()
            if forked:
                assert via.pid != os.getpid() and via.parent().pid == os.getpid()
                assert "lab_utils.launch.launch_zygote" in via.cmdline()
            else:
                assert via.pid == os.getpid()
            for pid in pids.values():
                parent = psutil.Process(pid).parent()
                if forked:  # rank <- zygote <- driver; the zygote is a fork of the driver (its command line)
                    assert parent.pid != driver.pid and parent.parent().pid == driver.pid
                    assert parent.cmdline() == driver.cmdline()
                else:  # rank <- driver: exec'd, with the script's own command line
                    assert parent.pid == driver.pid and str(TRAIN) in " ".join(psutil.Process(pid).cmdline())
        finally:
            driver.terminate()
            thread.join(60)
        assert not leftovers(run_dir)


HARNESS = """
import json, os, subprocess, sys
from lab_utils.launch import zygote
name = zygote.start(sys.argv[1])
client = subprocess.Popen([sys.executable, "-m", "lab_utils.launch.elastic_driver", "--exec", str(os.getpid()),
                           "-u", *sys.argv[1:]], env=dict(os.environ, LAB_ZYGOTE=name))
print(json.dumps({"client": client.pid}), flush=True)
client.wait()
sys.stdin.read()  # keep the zygote's parent (this process) alive until the test is done
"""


@pytest.mark.slow
def test_a_sigkilled_client_takes_its_rank_with_it(tmp_path):
    """torch's agent SIGKILLs a worker that outlives its SIGTERM: with the zygote that worker is the client,
    which cannot pass a SIGKILL on, so the zygote must end the rank itself, while it (and its driver) live on:
    no parent-death signal can be what ends the rank here."""
    import subprocess
    import sys

    out = tmp_path / "run"
    harness = subprocess.Popen([sys.executable, "-c", HARNESS, str(TRAIN), "steps=50", "n_samples=256",
                                "fault=hang", "fault_rank=0", "fault_step=1", f"out_dir={out}"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        client = psutil.Process(json.loads(harness.stdout.readline())["client"])
        deadline = time.time() + 120
        while (beat := read_heartbeats(out).get(0, {})).get("step", -1) < 1 and time.time() < deadline:
            time.sleep(0.2)
        rank = psutil.Process(beat["pid"])
        zygote_proc = rank.parent()
        assert zygote_proc.parent().pid == harness.pid and rank.pid != client.pid  # rank <- zygote <- harness
        client.send_signal(signal.SIGKILL)
        gone, alive = psutil.wait_procs([rank], timeout=5)
        assert not alive, "the rank ran on 5 s after its client was SIGKILLed"
        assert zygote_proc.is_running() and harness.poll() is None  # so it was the zygote that ended it
    finally:
        harness.kill()
        harness.wait()


@pytest.mark.parametrize("script, env, reason", [
    (TRAIN, {}, "forked: rank zygote of the driver"),
    (TRAIN, {"LAB_ZYGOTE": "off"}, "exec: LAB_ZYGOTE=off"),
    (TRAIN, {"LAB_EXIT": "finalize"}, "exec: LAB_EXIT=finalize"),  # an ordinary exit cannot be had in a fork
    (TRAIN.parent / "probes" / "preflight_worker.py", {}, "exec: not scripts/train.py"),  # only its top level
])
def test_which_launches_use_it(script, env, reason):
    start = start_plan.ranks(str(script), env)
    assert start.reason.startswith(reason) and start.fork is reason.startswith("forked")


@pytest.mark.slow
def test_a_single_process_is_forked_from_the_launch_zygote_with_its_own_command_and_environment(tmp_path):
    """One plain process (nproc=1): forked from the caller's launch zygote, showing `python scripts/train.py ...`,
    with the run's environment (the heartbeat records the error file the launcher set for it), and bitwise
    the numbers of the exec'd process."""
    runs = launcher.launch_many(launcher.requests_from_specs({
        "forked": ("forked1", 1, KEYS),
        "execd": ("execd1", 1, KEYS, {"extra_env": {"LAB_ZYGOTE": "off"}}),
    }, runs_dir=tmp_path, timeout=300), max_workers=2, raise_on_failure=True)
    assert _records(runs["forked"].run_dir) == _records(runs["execd"].run_dir)
    beat = read_heartbeats(runs["forked"].run_dir)[0]
    assert beat["error_file"] == str(runs["forked"].run_dir / "logs" / "0" / "error.json")
    out, run_dir = {}, tmp_path / "hang1"
    keys = ["steps=50", "n_samples=256", "fault=hang", "fault_rank=0", "fault_step=1"]
    thread = threading.Thread(target=lambda: out.setdefault("r", launcher.launch(launcher.request(
        "hang1", 1, keys, timeout=15, progress=False, runs_dir=tmp_path))))  # its timeout ends it
    thread.start()
    try:
        deadline = time.time() + 15
        while (beat := read_heartbeats(run_dir).get(0, {}) if run_dir.exists() else {}).get("step", -1) < 1:
            assert time.time() < deadline, "the hanging run never reached step 1"
            time.sleep(0.2)
        proc = psutil.Process(beat["pid"])
        launch = json.loads((run_dir / "launch.json").read_text())
        assert words(proc.cmdline()) == launch["cmd"]  # what the launcher asked for, not the zygote's line
        assert "lab_utils.launch.launch_zygote" in proc.parent().cmdline()
        assert proc.parent().parent().pid == os.getpid()
    finally:
        thread.join(180)
    assert out["r"].status == "hang" and not leftovers(run_dir)


def test_a_launch_zygote_serves_only_its_own_environment():
    """A variable read at import or at process start (TORCH_DISTRIBUTED_DEBUG, a malloc tunable) must reach the
    process as if it had been exec'd: each environment gets a zygote of its own; only PER_RUN variables may differ."""
    from lab_utils.launch import launch_zygote

    base = {"PATH": "/bin", "OMP_NUM_THREADS": "1"}
    assert launch_zygote._key(base) == launch_zygote._key(dict(base, TORCHELASTIC_ERROR_FILE="/x/error.json",
                                                                LAB_RUNS_DIR="/y", PYTEST_CURRENT_TEST="t"))
    assert launch_zygote._key(base) != launch_zygote._key(dict(base, TORCH_DISTRIBUTED_DEBUG="DETAIL"))
    assert launch_zygote._key(base) != launch_zygote._key(dict(base, MALLOC_MMAP_THRESHOLD_="131072"))


def test_the_start_plan_says_fork_or_exec_and_why(monkeypatch):
    """The first process's start, decided once (start_plan.plan) and recorded in launch.json: forked from the
    caller's launch zygote, or exec'd with the reason."""
    base = {"PATH": "/bin", "OMP_NUM_THREADS": "1"}
    train = [sys.executable, "-m", "lab_utils.launch.elastic_driver", "--exec", "1", str(TRAIN), "steps=1"]

    def first(cmd=train, env=base, script=TRAIN, **kw):
        return str(start_plan.plan(cmd, env, str(script), one_process=True, **kw))

    assert first() == "forked: launch zygote of this process"
    assert first(env=dict(base, LAB_ZYGOTE="off")) == "exec: LAB_ZYGOTE=off"
    assert first(["ip", "netns", "exec", "h0", *train]).startswith("exec: a command prefix (ip netns exec")
    other = TRAIN.parent / "probes" / "preflight_worker.py"
    assert first([*train[:5], str(other)], script=other).startswith("exec: not scripts/train.py")
    assert first(env=dict(base, OMP_NUM_THREADS="2")).startswith("exec: OMP_NUM_THREADS is not 1")
    assert first(runner="torchrun").startswith("exec: runner=torchrun")
    two = start_plan.plan(train, base, str(TRAIN))  # a driver: its ranks are planned too
    assert str(two) == "forked: launch zygote of this process; ranks forked: rank zygote of the driver"
    monkeypatch.setattr(start_plan, "_launch_zygote_here", False)  # what launches_once() sets (ddp-lab run)
    once = "exec: no launch zygote in this process (it launches once: ddp-lab run)"
    assert str(start_plan.plan(train, base, str(TRAIN))) == f"{once}; ranks forked: rank zygote of the driver"


CALLER = """
import json, sys
from lab_utils.launch import launch_zygote, launcher
launcher.launch(launcher.request("one", 1, ["steps=1"], progress=False, runs_dir=sys.argv[1])).raise_for_status()
print(json.dumps([z.proc.pid for z in launch_zygote._zygotes.values()]), flush=True)
sys.stdin.read()  # alive until the test kills it
"""


@pytest.mark.slow
def test_the_launch_zygote_ends_with_its_caller(tmp_path):
    """A caller SIGKILLed (a kernel restart) runs no clean-up: its launch zygote must end by itself, since
    no leftover check looks for it (its command line names no run)."""
    import subprocess

    caller = subprocess.Popen([sys.executable, "-c", CALLER, str(tmp_path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        zygotes = [psutil.Process(pid) for pid in json.loads(caller.stdout.readline())]
        assert zygotes, "the run was not forked from a launch zygote"
        assert all(z.parent().pid == caller.pid for z in zygotes)
    finally:
        caller.kill()
        caller.wait()
    gone, alive = psutil.wait_procs(zygotes, timeout=10)
    assert not alive, f"launch zygote(s) {[p.pid for p in alive]} outlived their SIGKILLed caller by 10 s"
