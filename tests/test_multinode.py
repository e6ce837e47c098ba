"""Chapter 09 with real launches: two nodes simulated on one box (bitwise equal to the standalone run; a crash or
hang on either node named and stopped, nothing left), the documented multi-host commands, the fixed-port clash,
mismatched collectives under TORCH_DISTRIBUTED_DEBUG=DETAIL, and a hung rank's stack dump."""
import os
import re
import shlex
import subprocess
import sys
import time

import pytest
from processes import nothing_left_within

from lab_utils.analysis import parity
from lab_utils.core.config import ConfigError
from lab_utils.core.runfiles import REPO, read_metrics
from lab_utils.launch import launcher
from lab_utils.lessons import ch09_launching

FAST = ["steps=6", "n_samples=256", "log_every=1"]


def assert_nothing_left(run_dir, within: float = 10):
    names = nothing_left_within(run_dir, within)
    assert not names, names


def test_two_simulated_nodes_are_bitwise_the_standalone_run(runs_dir, shared_run):
    two = launcher.launch("two", 1, FAST, timeout=300, progress=False, nnodes=2)
    one = shared_run(2, FAST)  # the plain 2-rank run (test_launcher reads the same one): another launch than two
    assert two.ok and one.ok, f"{two}\n{one}"
    assert parity.compare(one.run_dir, two.run_dir).tier == 3
    lines = two.command_lines
    assert len(lines) == 2 and all(line.startswith("torchrun --nproc-per-node=1 --nnodes=2 ") for line in lines)
    assert "--node-rank=0" in lines[0] and "--node-rank=1" in lines[1]
    endpoints = {re.search(r"--rdzv-endpoint=(\S+)", line).group(1) for line in lines}
    assert len(endpoints) == 1 and endpoints.pop().startswith("127.0.0.1:")  # one rendezvous for both nodes
    assert (two.run_dir / "logs" / "node0").is_dir() and (two.run_dir / "logs" / "node1").is_dir()
    assert_nothing_left(two.run_dir)


@pytest.mark.parametrize("bad_rank", [0, 1])
def test_crash_on_either_node_names_the_rank(runs_dir, bad_rank):
    start = time.time()
    r = launcher.launch(f"crash{bad_rank}", 1, FAST + ["fault=crash", f"fault_rank={bad_rank}", "fault_step=3"],
                        timeout=300, progress=False, nnodes=2)
    assert r.status == "crashed" and r.failing_rank == bad_rank, str(r)
    assert f"injected fault: crash on rank {bad_rank}" in r.traceback
    assert time.time() - start < 300 + 10
    assert (r.run_dir / "failures.json").exists()  # the nodes' failures merged, root cause across nodes
    assert_nothing_left(r.run_dir)


def test_hang_on_a_node_is_stopped_named_and_its_stack_dumped(runs_dir):
    """Caught by the stall timeout (8 s without a heartbeat), long before the overall timeout (the backstop);
    then the same stop path as at that timeout, across both nodes."""
    start = time.time()
    r = launcher.launch("hang", 1, FAST + ["fault=hang", "fault_rank=1", "fault_step=2"], timeout=300,
                        progress=False, nnodes=2, stall_timeout=8)
    assert r.status == "hang" and r.failing_rank == 1, str(r)
    assert "hang: no heartbeat from any rank for 8 s" in r.message and "rank 1 is behind" in r.message, str(r)
    assert time.time() - start < 150
    frames = ch09_launching.frames(r.stacks[1])
    assert frames and frames[0][2] == "inject_fault" and frames[0][3] == "time.sleep(3600)", r.stacks[1]
    # rank 0 waits inside a collective of torch.distributed (DDP's buffer broadcast or the gradient all-reduce)
    assert "torch/distributed" in r.stacks[0] or "torch/nn/parallel" in r.stacks[0], r.stacks[0]
    logs = "".join(p.read_text(errors="replace") for p in (r.run_dir / "logs" / "node0").rglob("stderr.log")) + \
        "".join(p.read_text(errors="replace") for p in (r.run_dir / "logs" / "node1").rglob("stderr.log"))
    assert "in inject_fault" in logs  # the dump stays in the rank's own log
    assert "stack at the timeout" in str(r)
    assert_nothing_left(r.run_dir)


def test_bad_nnodes_fails_before_launch(runs_dir):
    with pytest.raises(ConfigError, match="nnodes"):
        launcher.launch("bad", 1, FAST, nnodes=0)
    with pytest.raises(ConfigError, match="master_port"):
        launcher.launch("bad", 1, FAST, nnodes=2, master_port=29500)
    assert not (runs_dir / "bad").exists()


def _documented(text: str, name: str, port: int, node_rank: int, run_dir) -> list[str]:
    """A documented torchrun line with the host -> 127.0.0.1, a free port, one rank per node, a short run."""
    subs = {"$HEAD": "127.0.0.1", "29400": str(port), "$NODE_RANK": str(node_rank), "$SLURM_NODEID": str(node_rank),
            "$JOB_ID": name, "$SLURM_JOB_ID": name, "$SLURM_NNODES": "2", "$GPUS_PER_NODE": "1",
            "--nproc-per-node=2": "--nproc-per-node=1", ' "$@"': ""}
    for a, b in subs.items():
        text = text.replace(a, b)
    text = re.sub(r"out_dir=\S+", f"out_dir={run_dir}", text)
    words = shlex.split(text)
    assert words[0] == "torchrun" and "$" not in text, text
    return [str(launcher.TORCHRUN), *words[1:], *FAST, "backend=gloo"]


def _run_nodes(cmds, timeout=180):
    procs = [subprocess.Popen(c, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True) for c in cmds]
    try:
        return [p.communicate(timeout=timeout)[0] for p in procs], [p.returncode for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)


@pytest.mark.parametrize("source", ["docs/multinode.md", "scripts/slurm/ddp_lab.sbatch"])
def test_documented_multinode_command_runs_as_two_simulated_nodes(runs_dir, source):
    text = (REPO / source).read_text()
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("torchrun --nproc-per-node"))
    run_dir = runs_dir / "documented"
    port = launcher.free_port()
    cmds = [_documented(line, "documented", port, k, run_dir) for k in (0, 1)]
    outputs, codes = _run_nodes(cmds)
    assert codes == [0, 0], "\n".join(o[-2000:] for o in outputs)
    assert (run_dir / "metrics.jsonl").exists(), "\n".join(o[-3000:] for o in outputs)
    assert len(read_metrics(run_dir)) == 6
    # ... and it is the line the launcher builds for a simulated node (minus the lab's logging flags)
    lab = launcher.node_command(2, 0, 1, f"127.0.0.1:{port}", "documented", [], run_dir)[1]
    lab_flags = {w for w in lab if w.startswith("--") and not w.startswith(("--log-dir", "--redirects", "--tee"))}
    assert lab_flags == {w for w in cmds[0] if w.startswith("--")}
    assert_nothing_left(run_dir)


def test_sbatch_script_is_valid_bash():
    assert subprocess.run(["bash", "-n", str(REPO / "scripts/slurm/ddp_lab.sbatch")]).returncode == 0


def test_fixed_master_port_clashes_and_standalone_does_not(runs_dir):
    start = time.time()
    out = ch09_launching.port_clash("pc", {"steps": 6, "backend": "gloo", "n_samples": 256}, timeout=300,
                                    stall_timeout=12)
    clash, hang, standalone = out["clash"], out["hang"], out["standalone"]
    assert clash.status == "crashed" and ch09_launching.PORT_IN_USE in clash.message, str(clash)
    assert clash.seconds < 60
    assert f"--master-port={out['port']}" in clash.command_line and f"--master-port={out['port']}" in hang.command_line
    assert standalone.ok, str(standalone)
    # torchrun's own notice, from the clash (started with OMP_NUM_THREADS unset)
    assert ch09_launching.grep(clash.run_dir / "output.log", ch09_launching.OMP_NOTICE)
    # the port's holder hung (rank 1 at step 2): caught by the stall timeout long before the 300 s timeout
    assert hang.status == "hang" and hang.failing_rank == 1 and "no heartbeat" in hang.message, str(hang)
    assert ch09_launching.innermost(hang.stacks[1]) == "inject_fault: time.sleep(3600)", hang.stacks
    assert time.time() - start < 200
    for r in (clash, hang, standalone):
        assert_nothing_left(r.run_dir)


def test_detail_names_mismatched_collectives_and_pg_timeout_blames_the_waiter(runs_dir):
    out = ch09_launching.mismatch_runs("mm", timeout=300, pg_timeout=8)
    shape = out["shape_DETAIL"]
    assert shape.status == "crashed" and ch09_launching.MISMATCH_ERROR in shape.message, str(shape)
    assert "TensorShape=[4]" in shape.message and "TensorShape=[5]" in shape.message
    assert ch09_launching.MISMATCH_ERROR not in str(out["shape_OFF"])  # without DETAIL: no such check
    assert out["shape_OFF"].status == "crashed"
    # rank 1 never reached the all_reduce; rank 0 waited in it until pg_timeout and is the one named
    stuck = out["stuck"]
    assert stuck.status == "crashed" and stuck.failing_rank == 0 and "Timed out" in stuck.message, str(stuck)
    for r in out.values():
        assert_nothing_left(r.run_dir)


def test_rank_without_heartbeat_is_never_signalled(tmp_path):
    """dump_stacks signals only processes named by a heartbeat (SIGUSR1 would kill one without the handler)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        tree = launcher.ProcessTree(proc)
        assert launcher.dump_stacks(tmp_path, [tree], wait=0.1) == {}
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


def test_single_process_hang_caught_by_stall_timeout_with_its_stack(runs_dir):
    """One process (no agent, no per-rank logs): the stall timeout still catches the hang long before the overall
    timeout, and the dump is read back from output.log."""
    r = launcher.launch("one_hang", 1, FAST + ["fault=hang", "fault_step=2"], timeout=280, progress=False,
                        stall_timeout=6)
    assert r.status == "hang" and r.failing_rank == 0 and "no heartbeat from any rank for 6 s" in r.message, str(r)
    assert r.seconds < 200
    assert ch09_launching.innermost(r.stacks[0]) == "inject_fault: time.sleep(3600)", r.stacks
    with pytest.raises(ConfigError, match="stall_timeout"):
        launcher.launch("bad", 1, FAST, stall_timeout=0)
    assert_nothing_left(r.run_dir)
