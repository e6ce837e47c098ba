"""Chapter 09's lesson logic: launching and the NCCL environment (article §6), from real launches.

Every function here starts real jobs through `launcher.launch` or `launcher.launch_many` and returns what they
did (RunResults and the lines of their logs); notebooks/09_launching.ipynb calls them and shows the evidence.
Launch side: it may import the launcher, never be imported by the rank side.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from lab_utils.core import runfiles
from lab_utils.launch import launcher, netns

PROBES = launcher.REPO / "scripts" / "probes"
MISMATCH_PROBE = PROBES / "mismatch_probe.py"
MEASURED = launcher.REPO / "docs" / "measured" / "h200x2"
OMP_NOTICE = "Setting OMP_NUM_THREADS environment variable for each process to be 1"
PORT_IN_USE = "EADDRINUSE"
MISMATCH_ERROR = "Detected mismatch between collectives on ranks"
# §6.3's log line. Plain torch (2.13, Python sources and libtorch) has no such log message; a framework may
# print its own (Lightning: "Initializing distributed: GLOBAL_RANK ..."). We grep live logs for it to show it.
ARTICLE_INIT_LINE = "Initializing process group"
# Two hosts: short waits, so the failures end in seconds (the chapter runs in CI): gloo's connect waits
# pg_timeout; a node agent waits join_timeout for the others and read_timeout for the store to answer.
WRONG_IF_PG_TIMEOUT = 10
SHORT_RDZV = {"join_timeout": 20, "read_timeout": 10}
# Once gloo's connect failed on one rank, the other (stuck in its own connect, measured: it did not end within the
# launcher's default 30 s) is stopped after this many seconds.
WRONG_IF_PEER_GRACE = 5
GLOO_TIMED_OUT = "Gloo connectFullMesh failed"
# py-spy (pip install py-spy, in the lab's dev extras): on PATH, or beside this interpreter (a venv not activated)
PY_SPY = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
# The variables torchrun's agent gives each worker that say where it sits; train.py records them in its heartbeat
PLACEMENT = ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def wait_for_port(port: int, within: float) -> bool:
    """True once something accepts connections on 127.0.0.1:port (a rendezvous store is up)."""
    deadline = time.time() + within
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            time.sleep(0.2)
    return False


def port_clash(prefix: str, keys: dict, timeout: float, stall_timeout: float = 20) -> dict:
    """Two jobs on one fixed `--master-port` (the article's §6.1 command) and the lab's way beside them.

    - `hang`: a 2-rank training run on a fixed port whose rank 1 hangs at step 2 (`fault=hang`), so rank 0
      waits for it in a collective; the launcher calls it a hang `stall_timeout` s after the last heartbeat,
      dumps every rank's stack and stops it (section 5 of the chapter). Until then it holds the port;
    - `clash`: the article's exact command (`torchrun --master-addr 127.0.0.1 --master-port PORT ...`, real
      torchrun, OMP_NUM_THREADS unset) started while `hang` listens on PORT: it must fail at once;
    - `standalone`: the lab's launch (`--standalone`, the agent takes a free port) at the same moment;
    - `spy`: spy_on_hang's py-spy dumps of `hang`'s ranks, taken while it hangs.
    Returns {"port", "hang", "clash", "standalone": RunResult, "spy": dict}."""
    port = launcher.free_port()
    out: dict = {"port": port}
    # The hang must hold the port until the clash has tried it: on a busy 2-core box torchrun's start-up alone
    # can outlast stall_timeout (the clash then found the port free and ran: CI, stop 41). The watchdog waits.
    clash_done = threading.Event()

    def holder():
        out["hang"] = launcher.launch(launcher.request(
            f"{prefix}_hang", 2, dict(keys, fault="hang", fault_rank=1, fault_step=2), timeout=timeout,
            progress=False, master_port=port, stall_timeout=stall_timeout, hold=clash_done))

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        if not wait_for_port(port, timeout):
            raise RuntimeError(f"the hang job never listened on port {port}")
        # Not launcher.launch_many: it returns only once every run has ended, and the hang must be released
        # (clash_done) as soon as the clash has ended, not after the standalone run too; and py-spy is no launch.
        with ThreadPoolExecutor(max_workers=3) as pool:
            # the folder was made afresh before the agent listened, so the heartbeats it reads are this run's
            spy = pool.submit(spy_on_hang, runfiles.runs_dir() / f"{prefix}_hang", 1, 2, timeout)
            clash = pool.submit(launcher.launch, launcher.request(
                f"{prefix}_clash", 2, dict(keys, steps=2), timeout=timeout, progress=False, master_port=port,
                runner="torchrun", extra_env={"OMP_NUM_THREADS": None}))  # unset: torchrun prints its notice
            standalone = pool.submit(launcher.launch, launcher.request(f"{prefix}_standalone", 2, keys,
                                                                       timeout=timeout, progress=False))
            out["clash"] = clash.result()
            clash_done.set()
            out["standalone"], out["spy"] = standalone.result(), spy.result()
    finally:
        clash_done.set()
        thread.join()
    return out


def shell(words: list[str]) -> str:
    """A command's words as the shell line a user types (`python` for this interpreter, paths relative to the
    repo), as the launcher prints its runs."""
    return launcher.RunResult._shell(words)


def grep(path: str | Path, pattern: str, limit: int | None = None) -> list[str]:
    """The lines of a log that match a regular expression (all, or the first `limit`)."""
    text = Path(path).read_text(errors="replace") if Path(path).exists() else ""
    lines = [line for line in text.splitlines() if re.search(pattern, line)]
    return lines[:limit] if limit else lines


def run_logs(run_dir: str | Path) -> list[Path]:
    """Every log a run wrote: output.log and each rank's stdout/stderr."""
    run_dir = Path(run_dir)
    return [run_dir / "output.log", *sorted((run_dir / "logs").rglob("*.log"))]


def grep_run(run_dir: str | Path, pattern: str) -> list[str]:
    """Matching lines in any of a run's logs."""
    return [line for log in run_logs(run_dir) for line in grep(log, pattern)]


def mismatch_runs(prefix: str, timeout: float, pg_timeout: float = 10) -> dict:
    """The mismatch probe, all at once: rank 1 with a wrong shape under TORCH_DISTRIBUTED_DEBUG=DETAIL
    (`shape_DETAIL`) and without it (`shape_OFF`), and rank 1 stuck before the all_reduce so that rank 0 waits in
    it until `pg_timeout` (`stuck`). Returns {key: RunResult}. Always gloo on CPU, so every box shows the same
    errors: NCCL does not check sizes itself (not measured here on GPUs), and its watchdog has its own timing."""
    specs = {"shape_DETAIL": ("shape", "DETAIL", 60), "shape_OFF": ("shape", "OFF", 60),
             "stuck": ("stuck", "OFF", pg_timeout)}
    requests = {key: launcher.request(f"{prefix}_{key}", 2,
                                      {"steps": 1, "backend": "gloo", "device": "cpu", "pg_timeout": pg},
                                      timeout=timeout, progress=False, script=MISMATCH_PROBE,
                                      extra_env={"LAB_MISMATCH": mode, "TORCH_DISTRIBUTED_DEBUG": debug})
                for key, (mode, debug, pg) in specs.items()}
    out = launcher.launch_many(requests, max_workers=len(specs))
    for k, r in out.items():
        print(f"$ LAB_MISMATCH={specs[k][0]} TORCH_DISTRIBUTED_DEBUG={specs[k][1]} {r.command_line}   # {r.status}")
    return out


def step_seconds(run_dir: str | Path, skip: int = 2) -> float:
    """Median seconds per optimizer step from metrics.jsonl's `elapsed` (the first `skip` steps are warm-up)."""
    elapsed = [m["elapsed"] for m in runfiles.read_metrics(run_dir)]
    gaps = sorted(b - a for a, b in zip(elapsed[skip:], elapsed[skip + 1:], strict=False))
    if not gaps:
        raise ValueError(f"{run_dir}: fewer than {skip + 2} steps in metrics.jsonl")
    return gaps[len(gaps) // 2]


def threads_runs(prefix: str, keys: dict, timeout: float, counts=(1, 2)) -> dict:
    """One process per thread count, one after another (a timing must not share the cores with another run):
    {threads: RunResult}. OMP_NUM_THREADS is set from the `threads` key by the launcher."""
    return {t: launcher.launch(launcher.request(f"{prefix}_threads{t}", 1, dict(keys, threads=t), timeout=timeout,
                                                progress=False)).raise_for_status() for t in counts}


def nccl_lines(log: str | Path) -> dict[str, list[str]]:
    """What NCCL_DEBUG=INFO says about transports, in one log: the version, the network plugin, the
    channel lines (`via P2P/...`, `via SHM/...`, `via NET/...`), and the variables it read from the environment."""
    return {"version": grep(log, r"NCCL INFO NCCL version", 2),
            "network": grep(log, r"NCCL INFO (NET/|Using network)"),
            "channels": grep(log, r"NCCL INFO Channel \d+.* via "),
            "env": grep(log, r"NCCL INFO NCCL_\w+ set by environment"),
            "init": grep(log, r"Init COMPLETE")}


def transports(lines: list[str]) -> dict[str, int]:
    """{transport: channel lines} from `Channel ... via X/...` lines: P2P, SHM or NET."""
    counts: dict[str, int] = {}
    for line in lines:
        m = re.search(r" via (\w+)", line)
        if m:
            counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return counts


def box_backend(requested: str, device: str, ranks: int, gpus: int) -> str:
    """The backend a run of `ranks` ranks can use on a box that reports `gpus` GPUs (pure: a function of what
    the box says). `auto` is NCCL only where every rank gets a GPU of its own; ranks that would share a GPU
    (two simulated nodes on a one-GPU box) get gloo, which the launcher accepts there (it refuses NCCL, rightly).
    An explicit backend is kept: the launcher then says why it cannot run."""
    if requested != "auto":
        return requested
    on_cuda = device == "cuda" or (device == "auto" and gpus > 0)
    return "nccl" if on_cuda and gpus >= ranks else "gloo"


def backend_here(requested: str, ranks: int, device: str = "auto") -> str:
    """box_backend for this box (its CUDA GPUs, and whether this torch has NCCL)."""
    import torch
    import torch.distributed as dist

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    backend = box_backend(requested, device, ranks, gpus)
    return "gloo" if backend == "nccl" and requested == "auto" and not dist.is_nccl_available() else backend


def _two_node_runs(prefix: str, keys: dict, timeout: float, hosts: netns.Hosts | None) -> dict:
    """The 2-node runs, all at once, on `hosts` (two namespaces) or simulated on 127.0.0.1 (hosts None):
    - `two_node`: the right run (on hosts: GLOO_SOCKET_IFNAME=data, the interface that reaches the peer);
    - `wrong_if` (hosts only): GLOO_SOCKET_IFNAME=mgmt, a link that reaches no other host;
    - `wrong_addr`: node 1 told a rendezvous address where no store listens (on hosts: host 0's management
      address, which host 1 cannot reach; simulated: a port nobody listens on), short rendezvous timeouts.
    Between namespaces the lesson is gloo's (GLOO_SOCKET_IFNAME): where `keys` ask another backend (NCCL on a
    box with a GPU per rank), the host runs use gloo and `reference` is a standalone 2-rank gloo run to compare
    them with (else the chapter compares with its `standalone`)."""
    real = hosts is not None
    reference = None
    if real and backend_here(keys.get("backend", "auto"), 2, keys.get("device", "auto")) != "gloo":
        keys = dict(keys, backend="gloo")
        reference = launcher.launch(launcher.request(f"{prefix}_standalone_gloo", 2, keys, timeout=timeout,
                                                     progress=False))
    right_env = {"GLOO_SOCKET_IFNAME": netns.DATA_IF} if real else {}
    wrong = f"{hosts[0].mgmt_ip}:{netns.FIRST_PORT}" if real else f"127.0.0.1:{launcher.free_port()}"
    specs = {"two_node": (keys, right_env, None, None),
             "wrong_addr": (keys, right_env, [None, wrong], SHORT_RDZV)}
    if real:
        specs["wrong_if"] = (dict(keys, pg_timeout=WRONG_IF_PG_TIMEOUT), {"GLOO_SOCKET_IFNAME": netns.MGMT_IF},
                             None, None)

    requests = {key: launcher.request(f"{prefix}_{key}", 1, run_keys, timeout=timeout, progress=False, nnodes=2,
                                      hosts=hosts, extra_env=env, endpoints=endpoints, rdzv_conf=conf,
                                      peer_grace=WRONG_IF_PEER_GRACE if key == "wrong_if" else None)
                for key, (run_keys, env, endpoints, conf) in specs.items()}
    return {"reference": reference, **launcher.launch_many(requests, max_workers=len(specs))}


def two_hosts(prefix: str, keys: dict, timeout: float) -> dict:
    """Chapter 09's multi-node runs on two real hosts (network namespaces, lab_utils/launch/netns.py) where this
    box can make them, else simulated on 127.0.0.1. Returns _two_node_runs' results plus
    - "real" (bool), "reason" (why not real, or ""), "hosts" (namespace names);
    - on real hosts: "left" ({namespace: processes in it after the launcher's own clean-up, before the teardown
      kills anything}), "addr" (`ip -br addr` on host 0), "routes" ({peer address: `ip route get` on host 0}),
      "gone" (namespaces and links all removed after the teardown)."""
    reason = netns.unavailable_reason()
    if reason:
        return {"real": False, "reason": reason, "hosts": [], **_two_node_runs(prefix, keys, timeout, None)}
    with netns.Hosts(2) as hosts:
        out = {"real": True, "reason": "", "hosts": [h.name for h in hosts],
               **_two_node_runs(prefix, keys, timeout, hosts)}
        out["left"] = hosts.pids()
        out["addr"] = hosts[0].run("ip", "-br", "addr").stdout
        out["routes"] = {ip: hosts[0].run("ip", "route", "get", ip).stdout.splitlines()[0]
                         for ip in (hosts[1].data_ip, hosts[1].mgmt_ip)}
    out["gone"] = netns.gone(hosts)
    return out


def rendezvous_errors(result: launcher.RunResult) -> str:
    """`node 0: ErrorName; node 1: ErrorName` from a run whose rendezvous never completed ("" when it did)."""
    from lab_utils.launch.launch_diagnose import read_rendezvous_failures

    docs = sorted(read_rendezvous_failures(result.run_dir), key=lambda d: d["node"])
    return "; ".join(f"node {d['node']}: {d['error']}" for d in docs)


def route_interface(route_line: str) -> str | None:
    """The interface of an `ip route get PEER` line (`PEER dev IFACE src ...`): what to set *_SOCKET_IFNAME to."""
    m = re.search(r"\bdev (\S+)", route_line)
    return m.group(1) if m else None


def first_wave(prefix: str, keys: dict, timeout: float, stall_timeout: float = 20, pg_timeout: float = 10) -> dict:
    """The chapter's launches but the timed ones, all at once (most of their time is waiting: the hang for its
    stall timeout, the stuck probe for its pg_timeout, the wrong 2-node runs for their connect and rendezvous
    timeouts): port_clash's three jobs, two_hosts (two nodes on real hosts or simulated, the same keys as
    `standalone`) and mismatch_runs (`mm`). Returns port_clash's dict plus "two_node" (the right 2-node run),
    "nodes" (two_hosts' dict) and "mm"."""
    # Not launcher.launch_many: what runs at once here are the lessons' own functions (a hang that holds its port
    # for a clash, namespaces made and torn down around their runs), each launching through it or launch().
    with ThreadPoolExecutor(max_workers=3) as pool:
        clash = pool.submit(port_clash, prefix, keys, timeout, stall_timeout)
        nodes = pool.submit(two_hosts, prefix, keys, timeout)
        mm = pool.submit(mismatch_runs, f"{prefix}_mm", timeout, pg_timeout)
        out = clash.result()
        out["nodes"], out["mm"] = nodes.result(), mm.result()
    out["two_node"] = out["nodes"]["two_node"]
    for key in ("hang", "clash", "standalone", "two_node"):
        print(f"$ {out[key].command_line}   # {key}: {out[key].status}".replace("\n", f"   # {key}\n$ ", 1))
    return out


def live_nccl_runs(prefix: str, keys: dict, timeout: float) -> dict | None:
    """On a box with >= 2 GPUs: the same 2-rank run with NCCL_DEBUG=INFO, P2P on and off ({"p2p", "nop2p"});
    None elsewhere (NCCL needs a GPU per rank)."""
    import torch

    if not (torch.cuda.is_available() and torch.cuda.device_count() >= 2):
        return None
    env = {"NCCL_DEBUG": "INFO"}
    requests = {"p2p": launcher.request(f"{prefix}_nccl_p2p", 2, dict(keys, backend="nccl"), timeout=timeout,
                                        progress=False, extra_env=env),
                "nop2p": launcher.request(f"{prefix}_nccl_nop2p", 2, dict(keys, backend="nccl"), timeout=timeout,
                                          progress=False, extra_env=dict(env, NCCL_P2P_DISABLE="1"))}
    # one at a time: both want the same two GPUs
    return launcher.launch_many(requests, max_workers=1, raise_on_failure=True)


def frames(stack: str) -> list[tuple[str, int, str, str]]:
    """(file, line, function, that line's source) for each frame of a faulthandler dump, innermost first, for
    the first thread listed (the dump lists the current thread; a training rank has one Python thread)."""
    import linecache

    out = []
    for line in stack.splitlines():
        m = re.match(r'\s*File "(.+)", line (\d+) in (\S+)', line)
        if m:
            path, number, func = m.group(1), int(m.group(2)), m.group(3)
            out.append((path, number, func, linecache.getline(path, number).strip()))
        elif out and not line.strip():
            break  # the end of the first thread's stack
    return out


def innermost(stack: str) -> str:
    """`function: source line` of a dump's innermost frame ("" when there is no dump)."""
    found = frames(stack)
    return f"{found[0][2]}: {found[0][3]}" if found else ""


def node_of_global_rank0(run_dir: str | Path) -> int | None:
    """Which simulated node ran global rank 0: the node whose rank logs hold train.py's rank-0-only
    `[train] world_size=` line (the c10d rendezvous, not --node-rank, hands out the ranks)."""
    for node_dir in sorted((Path(run_dir) / "logs").glob("node*")):
        if any(grep(log, r"^\[train\] world_size=") for log in node_dir.rglob("stdout.log")):
            return int(node_dir.name[4:])
    return None


# ------------------------------------------------------------------ hang tools a porter reaches for (section 5)

def py_spy_dump(pid: int) -> tuple[list[str], str]:
    """(`py-spy dump --pid PID`, what it printed): every thread's Python stack of a live process, read from outside
    (ptrace), no code in the process. The text says why when py-spy is missing or may not attach."""
    cmd = [PY_SPY, "dump", "--pid", str(pid)]
    if not Path(PY_SPY).exists():
        return cmd, "py-spy is not installed here (pip install py-spy)"
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    # py-spy colours its output when the environment asks for colour (a Jupyter kernel does): keep the text only
    return cmd, ANSI.sub("", done.stdout + done.stderr).strip()


def spy_on_hang(run_dir: str | Path, stuck_rank: int, step: int, within: float, settle: float = 2.0) -> dict:
    """While a run hangs: once `stuck_rank`'s heartbeat sits at the start of `step`, wait `settle` s (the other
    ranks reach the collective they will wait in), then `py-spy dump --pid` each rank. A rank's pid is the one
    in its heartbeat: the lab forks ranks from a zygote (lab_utils/launch/zygote.py), so `ps` shows them with
    the driver's command line. Returns {"pids": {rank: pid}, "dumps": {rank: text}, "command": a shell line,
    "error": "" or why there are no dumps}."""
    deadline = time.time() + within
    while True:
        beats = runfiles.read_heartbeats(run_dir)
        stuck = beats.get(stuck_rank, {})
        if len(beats) >= 2 and stuck.get("step") == step and stuck.get("phase") == "step start":
            break
        if time.time() > deadline:
            return {"pids": {}, "dumps": {}, "command": "", "error": f"rank {stuck_rank} never sat at step {step} "
                    f"within {within:.0f} s"}
        time.sleep(0.2)
    time.sleep(settle)
    pids = {r: b["pid"] for r, b in sorted(beats.items())}
    dumps = {rank: py_spy_dump(pid)[1] for rank, pid in pids.items()}
    ok = Path(PY_SPY).exists() and "Thread" in dumps.get(stuck_rank, "")
    return {"pids": pids, "dumps": dumps, "command": f"py-spy dump --pid {pids[stuck_rank]}",
            "error": "" if ok else dumps.get(stuck_rank, "no dump")}


def spy_frames(dump: str) -> list[str]:
    """`function (file:line)` of a py-spy dump's first thread, innermost first."""
    out = []
    for line in dump.splitlines():
        if line.startswith("Thread ") and out:
            break  # the next thread
        if line.startswith("    ") and "(" in line:
            out.append(line.strip().replace(str(launcher.REPO) + "/", ""))
    return out


LOG_PREFIX = re.compile(r"^\[([^\]]+?)(\d+)\]:")


def prefixed_lines(log: str | Path) -> list[tuple[str, str, str]]:
    """(role, local rank, the rest) of each line torchrun's --tee prefixed: `[ROLE LOCAL_RANK]:` (the default
    template is `[${role_name}${local_rank}]:`; the lab's driver names its role `default_role`, torchrun's
    `--role` default is `default`)."""
    text = Path(log).read_text(errors="replace") if Path(log).exists() else ""
    return [(m.group(1), m.group(2), line[m.end():]) for line in text.splitlines() if (m := LOG_PREFIX.match(line))]


# ------------------------------------------------------------------ the launch layout (section 2)

def _node_of(beat: dict, run_dir: Path, nnodes: int) -> int | None:
    """The node (`--node-rank`, the launcher's logs/nodeK) a rank ran on: from the rank's error file when the
    heartbeat names it (logs/nodeK/...), else rank 0's from its log line (node_of_global_rank0) and, with two
    nodes, the other one for the rest."""
    m = re.search(r"/logs/node(\d+)/", beat.get("error_file") or "")
    if m:
        return int(m.group(1))
    first = node_of_global_rank0(run_dir)
    if first is None:
        return None
    if int(beat["rank"]) == 0 or int((beat.get("torchrun") or {}).get("GROUP_RANK") or -1) == 0:
        return first
    return 1 - first if nnodes == 2 else None


def launch_layout(result: launcher.RunResult) -> dict:
    """The launch as its run recorded it: {"endpoint": the c10d rendezvous endpoint (one for every node, from the
    node command lines), "nodes": {k: {"addr": --local-addr or "127.0.0.1", "host": namespace or ""}},
    "workers": [{"node", "pid", "MASTER": MASTER_ADDR:PORT, and PLACEMENT's variables as ints}]}, each worker's
    variables read from its heartbeat (train.py records what torchrun's agent set). Raises ValueError naming the
    run when a heartbeat lacks them (a run from before train.py recorded them: re-run it)."""
    lines = result.command_lines
    endpoints = sorted({m.group(1) for c in lines if (m := re.search(r"--rdzv-endpoint=(\S+)", c))})
    nodes = {}
    for k, line in enumerate(lines):
        m = re.search(r"--local-addr=(\S+)", line)
        nodes[k] = {"addr": m.group(1) if m else "127.0.0.1", "host": result.hosts[k] if k < len(result.hosts) else ""}
    workers = []
    for rank, beat in sorted(runfiles.read_heartbeats(result.run_dir).items()):
        env = beat.get("torchrun") or {}
        if any(env.get(k) is None for k in PLACEMENT):
            raise ValueError(f"{result.run_dir}: rank {rank}'s heartbeat has no torchrun variables {PLACEMENT} "
                             f"(a run from before train.py recorded them: re-run it)")
        workers.append({"node": _node_of(beat, Path(result.run_dir), len(lines)), "pid": beat.get("pid"),
                        "MASTER": f"{env.get('MASTER_ADDR')}:{env.get('MASTER_PORT')}",
                        **{k: int(env[k]) for k in PLACEMENT}})
    return {"endpoint": " ".join(endpoints), "nodes": nodes, "workers": workers}


def plot_launch_layout(layout: dict, title: str = ""):
    """The launch drawn: the c10d store on top, one box per node agent (its address and GROUP_RANK), inside it
    each worker with the variables its agent gave it. Returns the matplotlib figure."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    nodes = layout["nodes"]
    fig, ax = plt.subplots(figsize=(4.2 * len(nodes), 4.6))
    ax.set_xlim(0, 4.2 * len(nodes))
    ax.set_ylim(0, 4.6)
    ax.axis("off")
    mid = 2.1 * len(nodes)
    ax.add_patch(FancyBboxPatch((mid - 2.0, 3.7), 4.0, 0.7, boxstyle="round,pad=0.05", fc="#fde8c8", ec="#b36b00"))
    ax.text(mid, 4.05, f"c10d rendezvous store\n--rdzv-endpoint={layout['endpoint']}", ha="center", va="center",
            fontsize=9)
    for k, node in sorted(nodes.items()):
        x0 = 0.2 + 4.2 * k
        mine = [w for w in layout["workers"] if w["node"] == k]
        groups = sorted({w["GROUP_RANK"] for w in mine})
        ax.add_patch(FancyBboxPatch((x0, 0.2), 3.8, 2.9, boxstyle="round,pad=0.05", fc="#e8eef8", ec="#33518f"))
        host = f" ({node['host']})" if node["host"] else ""
        group = " ".join(map(str, groups)) or "?"
        ax.text(x0 + 1.9, 2.8, f"node {k}: agent on {node['addr']}{host}\n--node-rank={k}, GROUP_RANK={group}",
                ha="center", va="center", fontsize=8.5)
        ax.annotate("", xy=(x0 + 1.9, 3.1), xytext=(mid, 3.7), arrowprops=dict(arrowstyle="<->", color="#b36b00"))
        width = 3.6 / max(1, len(mine))
        for i, w in enumerate(sorted(mine, key=lambda w: w["LOCAL_RANK"])):
            wx = x0 + 0.1 + i * width
            ax.add_patch(FancyBboxPatch((wx + 0.05, 0.35), width - 0.1, 1.9, boxstyle="round,pad=0.03", fc="white",
                                        ec="#33518f"))
            ax.text(wx + width / 2, 1.3, "worker (pid {pid})\nRANK={RANK}\nLOCAL_RANK={LOCAL_RANK}\n"
                    "GROUP_RANK={GROUP_RANK}\nWORLD_SIZE={WORLD_SIZE}".format(**w), ha="center", va="center",
                    fontsize=8.5, family="monospace")
    ax.set_title(title or "the launch, from the run's heartbeats and command lines", fontsize=10)
    return fig


def gpu_topology() -> str:
    """`nvidia-smi topo -m` on this box (how each GPU pair is linked: NV# = that many NVLinks, PIX/PXB/PHB/SYS =
    PCIe paths), or a line saying it was not run and why."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "nvidia-smi not found on this box: `nvidia-smi topo -m` was not run here"
    done = subprocess.run([smi, "topo", "-m"], capture_output=True, text=True, timeout=60)
    return (done.stdout + done.stderr).strip()
