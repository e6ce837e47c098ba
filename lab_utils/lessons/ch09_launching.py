"""Chapter 09's lesson logic: launching and the NCCL environment (article §6), from real launches.

Every function here starts real jobs through `launcher.launch` and returns what they did (RunResults and
the lines of their logs); notebooks/09_launching.ipynb calls them and shows the evidence. Launch side: it
may import the launcher, never be imported by the rank side.
"""

from __future__ import annotations

import re
import socket
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
    - `standalone`: the lab's launch (`--standalone`, the agent takes a free port) at the same moment.
    Returns {"port", "hang", "clash", "standalone": RunResult}."""
    port = launcher.free_port()
    out: dict = {"port": port}

    def holder():
        out["hang"] = launcher.launch(f"{prefix}_hang", 2, dict(keys, fault="hang", fault_rank=1, fault_step=2),
                                      timeout=timeout, progress=False, master_port=port,
                                      stall_timeout=stall_timeout)

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        if not wait_for_port(port, timeout):
            raise RuntimeError(f"the hang job never listened on port {port}")
        with ThreadPoolExecutor(max_workers=2) as pool:
            clash = pool.submit(launcher.launch, f"{prefix}_clash", 2, dict(keys, steps=2), timeout=timeout,
                                progress=False, master_port=port, runner="torchrun",
                                extra_env={"OMP_NUM_THREADS": None})  # unset: torchrun prints its notice
            standalone = pool.submit(launcher.launch, f"{prefix}_standalone", 2, keys, timeout=timeout,
                                     progress=False)
            out["clash"], out["standalone"] = clash.result(), standalone.result()
    finally:
        thread.join()
    return out


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

    def one(key, mode, debug, pg):
        return launcher.launch(f"{prefix}_{key}", 2, {"steps": 1, "backend": "gloo", "device": "cpu",
                                                      "pg_timeout": pg},
                               timeout=timeout, progress=False, script=MISMATCH_PROBE,
                               extra_env={"LAB_MISMATCH": mode, "TORCH_DISTRIBUTED_DEBUG": debug})

    with ThreadPoolExecutor(max_workers=len(specs)) as pool:
        futures = {k: pool.submit(one, k, *v) for k, v in specs.items()}
    out = {k: f.result() for k, f in futures.items()}
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
    return {t: launcher.launch(f"{prefix}_threads{t}", 1, dict(keys, threads=t), timeout=timeout,
                               progress=False).raise_for_status() for t in counts}


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
        reference = launcher.launch(f"{prefix}_standalone_gloo", 2, keys, timeout=timeout, progress=False)
    right_env = {"GLOO_SOCKET_IFNAME": netns.DATA_IF} if real else {}
    wrong = f"{hosts[0].mgmt_ip}:{netns.FIRST_PORT}" if real else f"127.0.0.1:{launcher.free_port()}"
    specs = {"two_node": (keys, right_env, None, None),
             "wrong_addr": (keys, right_env, [None, wrong], SHORT_RDZV)}
    if real:
        specs["wrong_if"] = (dict(keys, pg_timeout=WRONG_IF_PG_TIMEOUT), {"GLOO_SOCKET_IFNAME": netns.MGMT_IF},
                             None, None)

    def one(key, run_keys, env, endpoints, conf):
        return launcher.launch(f"{prefix}_{key}", 1, run_keys, timeout=timeout, progress=False, nnodes=2,
                               hosts=hosts, extra_env=env, endpoints=endpoints, rdzv_conf=conf,
                               peer_grace=WRONG_IF_PEER_GRACE if key == "wrong_if" else None)

    with ThreadPoolExecutor(max_workers=len(specs)) as pool:
        futures = {k: pool.submit(one, k, *v) for k, v in specs.items()}
    return {"reference": reference, **{k: f.result() for k, f in futures.items()}}


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
    with ThreadPoolExecutor(max_workers=1) as pool:  # one at a time: both want the same two GPUs
        p2p = pool.submit(launcher.launch, f"{prefix}_nccl_p2p", 2, dict(keys, backend="nccl"), timeout=timeout,
                          progress=False, extra_env=env)
        nop2p = pool.submit(launcher.launch, f"{prefix}_nccl_nop2p", 2, dict(keys, backend="nccl"),
                            timeout=timeout, progress=False, extra_env=dict(env, NCCL_P2P_DISABLE="1"))
        return {"p2p": p2p.result().raise_for_status(), "nop2p": nop2p.result().raise_for_status()}


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
