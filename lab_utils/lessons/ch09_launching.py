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
from lab_utils.launch import launcher

PROBES = launcher.REPO / "scripts" / "probes"
MISMATCH_PROBE = PROBES / "mismatch_probe.py"
MEASURED = launcher.REPO / "docs" / "measured" / "h200x2"
OMP_NOTICE = "Setting OMP_NUM_THREADS environment variable for each process to be 1"
PORT_IN_USE = "EADDRINUSE"
MISMATCH_ERROR = "Detected mismatch between collectives on ranks"
# §6.3's log line. Plain torch (2.13, Python sources and libtorch) has no such log message; a framework may
# print its own (Lightning: "Initializing distributed: GLOBAL_RANK ..."). We grep live logs for it to show it.
ARTICLE_INIT_LINE = "Initializing process group"


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


def first_wave(prefix: str, keys: dict, timeout: float, stall_timeout: float = 20, pg_timeout: float = 10) -> dict:
    """The chapter's launches but the timed ones, all at once (most of their time is waiting: the hang for its
    stall timeout, the stuck probe for its pg_timeout): port_clash's three jobs, the two simulated nodes
    (`two_node`, the same keys as `standalone`) and mismatch_runs (`mm`). Returns port_clash's dict plus
    "two_node" and "mm"."""
    with ThreadPoolExecutor(max_workers=3) as pool:
        clash = pool.submit(port_clash, prefix, keys, timeout, stall_timeout)
        two_node = pool.submit(launcher.launch, f"{prefix}_two_node", 1, keys, timeout=timeout, progress=False,
                               nnodes=2)
        mm = pool.submit(mismatch_runs, f"{prefix}_mm", timeout, pg_timeout)
        out = clash.result()
        out["two_node"], out["mm"] = two_node.result(), mm.result()
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
