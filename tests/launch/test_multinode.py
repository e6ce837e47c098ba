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
from lab_utils.launch import launcher, netns
from lab_utils.lessons import ch09_launching

FAST = ["steps=6", "n_samples=256", "log_every=1"]


def assert_nothing_left(run_dir, within: float = 10):
    names = nothing_left_within(run_dir, within)
    assert not names, names


@pytest.mark.slow
def test_two_simulated_nodes_are_bitwise_the_standalone_run(runs_dir, shared_run):
    two = launcher.launch(launcher.request("two", 1, FAST, timeout=300, progress=False, nnodes=2))
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


@pytest.mark.slow
@pytest.mark.parametrize("bad_rank", [0, 1])
def test_crash_on_either_node_names_the_rank(runs_dir, bad_rank):
    start = time.time()
    keys = FAST + ["fault=crash", f"fault_rank={bad_rank}", "fault_step=3"]
    r = launcher.launch(launcher.request(f"crash{bad_rank}", 1, keys, timeout=300, progress=False, nnodes=2))
    assert r.status == "crashed" and r.failing_rank == bad_rank, str(r)
    assert f"injected fault: crash on rank {bad_rank}" in r.traceback
    assert time.time() - start < 300 + 10
    assert (r.run_dir / "failures.json").exists()  # the nodes' failures merged, root cause across nodes
    assert_nothing_left(r.run_dir)


@pytest.mark.slow
def test_hang_on_a_node_is_stopped_named_and_its_stack_dumped(runs_dir):
    """Caught by the stall timeout (8 s without a heartbeat), long before the overall timeout (the backstop);
    then the same stop path as at that timeout, across both nodes."""
    start = time.time()
    r = launcher.launch(launcher.request("hang", 1, FAST + ["fault=hang", "fault_rank=1", "fault_step=2"], timeout=300,
                                         progress=False, nnodes=2, stall_timeout=8))
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
        launcher.launch(launcher.request("bad", 1, FAST, nnodes=0))
    with pytest.raises(ConfigError, match="master_port"):
        launcher.launch(launcher.request("bad", 1, FAST, nnodes=2, master_port=29500))
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_single_process_hang_caught_by_stall_timeout_with_its_stack(runs_dir):
    """One process (no agent, no per-rank logs): the stall timeout still catches the hang long before the overall
    timeout, and the dump is read back from output.log."""
    r = launcher.launch(launcher.request("one_hang", 1, FAST + ["fault=hang", "fault_step=2"], timeout=280,
                                         progress=False, stall_timeout=6))
    assert r.status == "hang" and r.failing_rank == 0 and "no heartbeat from any rank for 6 s" in r.message, str(r)
    assert r.seconds < 200
    assert ch09_launching.innermost(r.stacks[0]) == "inject_fault: time.sleep(3600)", r.stacks
    with pytest.raises(ConfigError, match="stall_timeout"):
        launcher.launch(launcher.request("bad", 1, FAST, stall_timeout=0))
    assert_nothing_left(r.run_dir)


# --- two real hosts (network namespaces, lab_utils/launch/netns.py); skipped where they cannot be made

NETNS_REASON = netns.unavailable_reason()
needs_netns = pytest.mark.skipif(NETNS_REASON is not None, reason=f"network namespaces unavailable: {NETNS_REASON}")


@pytest.mark.slow
@needs_netns
def test_two_real_hosts_bitwise_and_wrong_interface_and_address_named_nothing_left(runs_dir, shared_run):
    """One rank per namespace, c10d on host 0's data address, gloo: bitwise the standalone 2-rank run. Beside it,
    GLOO_SOCKET_IFNAME naming the link that reaches no peer, and node 1 told a wrong rendezvous address: each
    stopped within its timeout, the cause named (the rank whose connect failed; the node that could not reach
    the rendezvous), and no process left in either namespace."""
    one = shared_run(2, FAST)
    start = time.time()
    out = ch09_launching.two_hosts("hosts", {"steps": 6, "n_samples": 256, "log_every": 1}, timeout=240)
    assert time.time() - start < 240 + 60
    assert out["real"] and out["reference"] is None and len(out["hosts"]) == 2
    two, wrong_if, wrong_addr = out["two_node"], out["wrong_if"], out["wrong_addr"]
    assert two.ok and one.ok, f"{two}\n{one}"
    assert parity.compare(one.run_dir, two.run_dir).tier == 3
    lines = two.command_lines
    assert all("--rdzv-endpoint=10.213.1.1:" in line for line in lines), lines
    assert "--local-addr=10.213.1.1" in lines[0] and "--local-addr=10.213.1.2" in lines[1]
    assert "is_host=1" in lines[0] and "is_host" not in lines[1]
    assert "is_host=0" in wrong_addr.command_lines[1]  # told a wrong address: a client there, never its host
    assert [c[:4] for c, _ in two.node_commands] == [["ip", "netns", "exec", h] for h in out["hosts"]]
    # the wrong interface: the rendezvous completed, gloo's connect to the peer's mgmt address did not
    assert wrong_if.status == "crashed" and wrong_if.failing_rank in (0, 1), str(wrong_if)
    assert ch09_launching.GLOO_TIMED_OUT in wrong_if.message and "No route to host" in wrong_if.message
    assert "remote=[10.213.2." in wrong_if.message, wrong_if.message
    assert wrong_if.seconds < 240
    # the wrong address: node 1 could not connect, node 0 waited until its join timeout
    assert wrong_addr.status == "crashed" and wrong_addr.failing_node == 1, str(wrong_addr)
    assert ch09_launching.rendezvous_errors(wrong_addr) == \
        "node 0: RendezvousTimeoutError; node 1: RendezvousConnectionError"
    assert "node 1 (the cause)" in wrong_addr.message and "No route to host" in wrong_addr.message
    assert wrong_addr.seconds < 240
    assert out["left"] == {h: [] for h in out["hosts"]}  # the launcher's own clean-up, before the teardown's
    assert out["gone"]
    for r in (two, wrong_if, wrong_addr):
        assert_nothing_left(r.run_dir)


@pytest.mark.slow
def test_wrong_rendezvous_address_named_on_simulated_nodes(runs_dir):
    """The same wrong address on the loopback simulation (every box): node 1 told a port where no store listens."""
    r = launcher.launch(launcher.request("wrong_addr", 1, FAST, timeout=240, progress=False, nnodes=2,
                                         endpoints=[None, f"127.0.0.1:{launcher.free_port()}"],
                                         rdzv_conf=ch09_launching.SHORT_RDZV))
    assert r.status == "crashed" and r.failing_node == 1, str(r)
    assert ch09_launching.rendezvous_errors(r) == "node 0: RendezvousTimeoutError; node 1: RendezvousConnectionError"
    assert "--rdzv-conf=join_timeout=20,read_timeout=10,is_host=0" in r.command_lines[1]
    assert r.seconds < 240
    assert_nothing_left(r.run_dir)


def test_bad_host_arguments_fail_before_launch(runs_dir):
    with pytest.raises(ConfigError, match="endpoints"):
        launcher.launch(launcher.request("bad", 1, FAST, nnodes=2, endpoints=["127.0.0.1:1"]))
    with pytest.raises(ConfigError, match="nnodes >= 2"):
        launcher.launch(launcher.request("bad", 1, FAST, endpoints=[None]))
    with pytest.raises(ConfigError, match="rdzv_conf"):
        launcher.launch(launcher.request("bad", 1, FAST, nnodes=2, rdzv_conf={"join_timeout": "1,is_host=1"}))
    assert not (runs_dir / "bad").exists()


def test_chapter_backend_on_a_one_gpu_box_is_gloo_for_ranks_that_share_it():
    """Issue 24, point 3: on one GPU the chapter asked backend=auto for its 2 nodes, which the launcher refuses
    (NCCL needs a GPU per rank). The chapter's keys now come from box_backend: a function of what the box reports,
    so this runs without a GPU."""
    b = ch09_launching.box_backend
    assert b("auto", "auto", ranks=2, gpus=1) == "gloo"  # the one-GPU box (was: auto, refused there)
    assert b("auto", "cuda", ranks=2, gpus=1) == "gloo"
    assert b("auto", "auto", ranks=2, gpus=2) == "nccl"  # a GPU per rank: NCCL, as before
    assert b("auto", "auto", ranks=2, gpus=0) == "gloo" and b("auto", "cpu", ranks=2, gpus=8) == "gloo"
    assert b("nccl", "auto", ranks=2, gpus=1) == "nccl"  # asked for explicitly: kept, and the launcher says why not
    import nbformat

    nb = nbformat.read(REPO / "notebooks/09_launching.ipynb", 4)
    keys_cell = next(c.source for c in nb.cells if "first_wave(" in c.source)
    assert "backend=ch09_launching.backend_here(P.backend, ranks=2)" in keys_cell, keys_cell
