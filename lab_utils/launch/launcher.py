"""Launch `scripts/train.py` as one process or on N ranks, and always come back with a verdict.

Taught in notebooks/00_preflight.ipynb (and used by every chapter, the CLI and the tests).

N ranks run under torch's own launcher API (lab_utils/launch/elastic_driver.py: `elastic_launch`, what torchrun
runs); `RunResult.command_line` is the equivalent `torchrun ...` line, to copy. What it guarantees:
- bad keys/values fail *before* anything starts (config.resolve + distenv.check_launchable);
- progress: a bar driven by rank 0's metrics.jsonl (tqdm in a terminal, a widget in a notebook; in a log,
  such as CI's, one line per run instead of one per redraw);
- nothing is left behind. Workers run in sessions of their own, so killing a process group misses them:
  we record every descendant while the job runs and, on success, crash, timeout, Ctrl-C, or SIGTERM/SIGHUP
  to this process, stop each one we saw (SIGTERM, then SIGKILL after a grace, so a rank that ignores
  SIGTERM goes too). When this process dies without running any handler (SIGKILL, a Jupyter kernel
  restart), the parent-death signal (Linux) stops the driver, whose agent stops the workers, which also die
  with the driver;
- a crash names the root cause, not a victim: the driver writes every failed rank to failures.json
  (exit code, signal, the rank's own error file with its traceback) and picks the rank whose own error or
  signal started it, never a peer the agent SIGTERMed or one that only lost its connection;
- a hang is named as a hang after the timeout, with each rank's last heartbeat, so you see who stalled,
  and each rank's Python stack at that moment (SIGUSR1 -> faulthandler, registered by distenv.setup; the
  dump stays in the rank's log and in RunResult.stacks) before it is stopped;
- nnodes > 1 simulates that many nodes on this box (chapter 09): one node agent per node, each
  `--nnodes N --node-rank k` with a c10d rendezvous on 127.0.0.1 (a free port, the same rdzv id), exactly
  as on N hosts; the same timeout, clean-up and root-cause guarantees hold across all of them.

This module is the public face (RunResult, launch, launch_many); the parts, one job each:
run_result.py (RunResult, RunFailed), launch_commands.py (the command lines and the ranks' environment),
process_tree.py (every process started, to stop them all), supervise.py (stop signals, the poll loop,
progress), launch_diagnose.py (hang naming, stack dumps, failures and the root cause).
"""

from __future__ import annotations

import re
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from lab_utils.core import config as config_mod
from lab_utils.core import distenv, runfiles
from lab_utils.core.runfiles import REPO, read_heartbeats
from lab_utils.launch import launch_zygote, start_plan
from lab_utils.launch.launch_commands import (
    TORCHRUN,
    TRAIN,
    as_torchrun,
    build_command,
    bytecode_cache,
    environment,
    free_port,
    master_port_command,
    node_command,
    node_gpus,
)
from lab_utils.launch.launch_diagnose import DUMP_WAIT, classify, dump_stacks, merge_node_failures
from lab_utils.launch.process_tree import ProcessTree
from lab_utils.launch.run_result import RunFailed, RunResult
from lab_utils.launch.supervise import PEER_GRACE, popen, progress_bar, redeliver, supervise

# The launcher's public face: the names chapters, the CLI, drivers, tests and notebooks use as `launcher.X`.
# The command lines live in launch_commands, supervision in supervise, diagnosis in launch_diagnose.
__all__ = ["DUMP_WAIT", "REPO", "TORCHRUN", "TRAIN", "ProcessTree", "RunFailed", "RunResult", "build_command",
           "bytecode_cache", "dump_stacks", "free_port", "launch", "launch_many", "master_port_command",
           "node_command"]


# --- the jobs of launch(), in order: validate, prepare the folder, build the commands, supervise, diagnose


def _validate(name: str, nproc: int, overrides, timeout: float, runs_dir: Path | None, nnodes: int = 1
              ) -> tuple[dict, dict, Path]:
    """(given keys, resolved config, run folder), or ConfigError before anything is written or started."""
    if not isinstance(nproc, int) or nproc < 1:
        raise config_mod.ConfigError(f"nproc={nproc!r} must be a positive integer")
    if not isinstance(nnodes, int) or nnodes < 1:
        raise config_mod.ConfigError(f"nnodes={nnodes!r} must be a positive integer")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name or ""):
        raise config_mod.ConfigError(f"--name {name!r}: use letters, digits, '.', '_' and '-'")
    if timeout is None or timeout <= 0:
        raise config_mod.ConfigError(f"timeout={timeout!r} must be > 0 seconds")
    given = config_mod.parse_overrides(overrides or [])
    if "out_dir" in given:
        raise config_mod.ConfigError("out_dir is set by the launcher (runs/NAME); do not pass it")
    run_dir = Path(runs_dir or runfiles.runs_dir()) / name
    given["out_dir"] = str(run_dir)
    cfg = config_mod.resolve(given, nproc * nnodes)  # the world size is nproc per node x nodes
    distenv.check_launchable(cfg, nproc)
    if nnodes > 1:
        node_gpus(cfg, nproc, nnodes)  # raises when simulated nodes would share a GPU under NCCL
    return given, cfg, run_dir


def _check_hosts(nnodes: int, hosts, endpoints, rdzv_conf) -> None:
    if (hosts is not None or endpoints is not None) and nnodes < 2:
        raise config_mod.ConfigError("hosts= and endpoints= are for nnodes >= 2")
    if hosts is not None and len(hosts) < nnodes:
        raise config_mod.ConfigError(f"hosts: {len(hosts)} host(s) for nnodes={nnodes}")
    if endpoints is not None and (len(endpoints) != nnodes or
                                  not all(e is None or re.fullmatch(r"[\w.:-]+:\d+", e) for e in endpoints)):
        raise config_mod.ConfigError(f"endpoints={endpoints!r}: one HOST:PORT (or None) per node, {nnodes} in all")
    if rdzv_conf is not None and not all(re.fullmatch(r"\w+", str(k)) and re.fullmatch(r"[\w.]+", str(v))
                                         for k, v in rdzv_conf.items()):
        raise config_mod.ConfigError(f"rdzv_conf={rdzv_conf!r}: KEY=VALUE pairs of words (join_timeout=20)")


def _host_args(hosts, k: int, rdzv_conf: dict | None, overridden: bool = False) -> dict:
    """node_command's host arguments for node k: its namespace, its own data address, and on host 0 the
    store (torch cannot tell that host 0's data address is its own: see node_command). A node given a wrong
    endpoint joins it as a client (is_host=0), as a host does whose own address it is not: on 127.0.0.1 torch
    would otherwise open a store of its own there (every loopback address is this machine's)."""
    conf = dict(rdzv_conf or {})
    if overridden:
        conf["is_host"] = 0
    if hosts is None:
        return {"rdzv_conf": conf}
    if k == 0 and not overridden:
        conf["is_host"] = 1
    return {"rdzv_conf": conf, "local_addr": hosts[k].data_ip, "prefix": hosts[k].prefix}


def _prepare_folder(run_dir: Path, nproc: int) -> Path:  # nproc: 1 means one plain process
    if run_dir.exists():
        shutil.rmtree(run_dir)  # a stale metrics.jsonl or failures.json must never be mistaken for this run's
    log_dir = run_dir / "logs"
    (log_dir / "0" if nproc == 1 else log_dir).mkdir(parents=True)  # the agent makes the per-rank folders
    return log_dir


def _write_launch_json(result: RunResult, timeout: float) -> None:
    runfiles.write_json({"cmd": result.command, "equivalent": result.equivalent, "command_line": result.command_line,
                         "nproc": result.nproc, "nnodes": result.nnodes,
                         "node_cmds": [c for c, _ in result.node_commands], "timeout": timeout, "status": result.status,
                         "returncode": result.returncode, "seconds": round(result.seconds, 3),
                         "failing_rank": result.failing_rank, "failing_node": result.failing_node,
                         "message": result.message, "started": result.started},
                        result.run_dir / "launch.json")


def _starter(plans: list[start_plan.Plan], pairs: list[tuple[list[str], list[str]]]):
    """start(cmd, env, out) for supervise: node k's first process forked from this caller's launch zygote or
    exec'd, as plans[k] says; a zygote that declines at start time turns it into an exec (plans[k] updated).
    One plain process (no ranks planned) is forked as its equivalent `python SCRIPT ARGS`, a driver as itself."""
    nodes = iter(range(len(plans)))

    def start(cmd: list[str], env: dict, out):
        k = next(nodes)
        if plans[k].first.fork:
            script_argv = pairs[k][1][1:] if plans[k].ranks is None else None
            proc, why_not = launch_zygote.start(cmd, env, out, REPO, script_argv)
            if proc is not None:
                return proc
            plans[k] = plans[k].exec_instead(why_not)
        return popen(cmd, env, out)

    return start


def _started(plans: list[start_plan.Plan]) -> str:
    lines = [str(p) for p in plans]
    return lines[0] if len(set(lines)) <= 1 else "; ".join(f"node {k}: {line}" for k, line in enumerate(lines))


def launch(name: str, nproc: int = 1, overrides: list[str] | dict | None = None, timeout: float = 600,
           progress: bool = True, echo: bool = False, runs_dir: Path | None = None,
           extra_env: dict | None = None, script: Path = TRAIN, max_restarts: int = 0, nnodes: int = 1,
           runner: str = "driver", master_port: int | None = None, stall_timeout: float | None = None,
           hosts=None, endpoints: list[str | None] | None = None, rdzv_conf: dict | None = None,
           peer_grace: float | None = None, hold=None) -> RunResult:
    """Run the training script as `name` with `nproc` processes per node; return a RunResult (never hangs).

    nnodes > 1: that many nodes simulated on this box (a node agent each, c10d rendezvous on 127.0.0.1).
    runner="torchrun": start the equivalent `torchrun ...` line itself instead of the elastic driver (chapter 09
    shows torchrun's own output; failures then come from the output, not failures.json).
    master_port: the article's fixed `--master-addr 127.0.0.1 --master-port PORT` instead of `--standalone`.
    extra_env: added to the ranks' environment; a value None removes that variable.
    stall_timeout: also call it a hang when no rank has written a heartbeat for that many seconds (after the
    first one): a hang is caught that long after it starts, however slow the start-up was.
    hosts (nnodes > 1): a netns.Hosts; node k runs in hosts[k] (`ip netns exec`), the rendezvous on host 0's
    data address, each agent publishing its own data address (chapter 09's two real hosts).
    endpoints (nnodes > 1): per node, a rendezvous endpoint HOST:PORT to give that node instead of the right one
    (None: the right one), to show what a wrong address does. rdzv_conf: torchrun's --rdzv-conf for every node
    (join_timeout, read_timeout). peer_grace: seconds the other nodes get, once one node has failed, before the
    launcher stops them (default supervise.PEER_GRACE; a rank stuck in its own connect never notices the peer).
    hold (a threading.Event): with stall_timeout, the hang is not called before the event is set, and the stall
    counts from then (chapter 09's hang keeps its port until the clashing job has tried it, however slow that
    job's start on a busy box); the overall timeout still applies.

    If this process gets SIGTERM or SIGHUP meanwhile, the run is stopped, launch.json written, a line
    printed, and then the signal does what it would have done without us (by default: end this process)."""
    if runner not in ("driver", "torchrun"):
        raise config_mod.ConfigError(f"runner={runner!r} must be 'driver' or 'torchrun'")
    if peer_grace is not None and not peer_grace >= 0:
        raise config_mod.ConfigError(f"peer_grace={peer_grace!r} must be >= 0 seconds")
    if stall_timeout is not None and not stall_timeout > 0:
        raise config_mod.ConfigError(f"stall_timeout={stall_timeout!r} must be > 0 seconds")
    if master_port is not None and (nnodes > 1 or not 0 < int(master_port) < 65536):
        raise config_mod.ConfigError(f"master_port={master_port!r}: one node only, a port in 1..65535")
    _check_hosts(nnodes, hosts, endpoints, rdzv_conf)
    given, cfg, run_dir = _validate(name, nproc, overrides, timeout, runs_dir, nnodes)  # raises before any start
    log_dir = _prepare_folder(run_dir, nproc * nnodes)
    env = environment(cfg, log_dir, nproc * nnodes, extra_env, max_restarts)
    argv = config_mod.to_argv(given)
    if nnodes > 1:
        gpus = node_gpus(cfg, nproc, nnodes)
        right = f"{hosts[0].data_ip}:{hosts.next_port()}" if hosts is not None else f"127.0.0.1:{free_port()}"
        given_endpoints = [e or right for e in (endpoints or [None] * nnodes)]
        pairs = [node_command(nnodes, k, nproc, given_endpoints[k], name, argv, run_dir, script, max_restarts,
                              **_host_args(hosts, k, rdzv_conf, overridden=bool(endpoints and endpoints[k])))
                 for k in range(nnodes)]
        envs = [dict(env, **({"CUDA_VISIBLE_DEVICES": gpus[k]} if gpus else {})) for k in range(nnodes)]
    elif master_port is not None:
        pairs, envs = [master_port_command(nproc, int(master_port), argv, run_dir, script)], [env]
    else:
        pairs, envs = [build_command(nproc, argv, run_dir, script, max_restarts)], [env]
    if runner == "torchrun":
        pairs = [(as_torchrun(eq), eq) for _, eq in pairs]
    cmd, equivalent = pairs[0]
    # How each node's processes start (fork from a zygote, or exec), decided once here and recorded
    one_process = nnodes == 1 and master_port is None and nproc == 1 and not max_restarts  # build_command's
    plans = [start_plan.plan(c, e, str(script), runner, one_process) for (c, _), e in zip(pairs, envs, strict=True)]
    result = RunResult(name, run_dir, "starting", None, 0.0, nproc, command=cmd, equivalent=equivalent,
                       nnodes=nnodes, node_commands=pairs if nnodes > 1 else [],
                       hosts=[h.name for h in hosts][:nnodes] if hosts is not None else [],
                       started=_started(plans))
    _write_launch_json(result, timeout)

    start = time.time()
    result.status, result.returncode, pid, signum, previous, result.stacks = supervise(
        [(c, e) for (c, _), e in zip(pairs, envs, strict=True)], run_dir, timeout,
        progress_bar(cfg["steps"], name, progress), echo, stall_timeout,
        PEER_GRACE if peer_grace is None else peer_grace, hold, _starter(plans, pairs))
    result.seconds = time.time() - start
    result.started = _started(plans)  # a zygote that declined at start time made it an exec
    result.heartbeats = read_heartbeats(run_dir)
    if nnodes > 1:
        merge_node_failures(run_dir)
    classify(result, pid, timeout, signum, stall_timeout)
    _write_launch_json(result, timeout)
    if signum is not None:
        print(f"run {name!r}: {result.message}", file=sys.stderr, flush=True)
        redeliver(signum, previous)
    return result


def launch_many(specs: dict, *, max_workers: int, raise_on_failure: bool = False, print_commands: bool = False,
                **common) -> dict[str, RunResult]:
    """Several independent launches at once: `specs` = {key: (run name, nproc, keys[, launch kwargs])};
    returns {key: RunResult} in the order of `specs`. `common`: launch() kwargs for every run (a spec's own
    kwargs win); progress is off unless given (overlapping bars would garble each other).

    max_workers: how many run at once (the caller sizes it for the box: chapter.workers on 2 cores). Each
    training process uses one thread and a fixed reduction order, so overlapping runs changes their wall time,
    never their numbers. Every run finishes (or is stopped) before this returns; then raise_on_failure raises
    RunFailed with the first failed run's report (in `specs` order), and print_commands prints each run's
    command line and status."""
    if not isinstance(max_workers, int) or max_workers < 1:
        raise config_mod.ConfigError(f"max_workers={max_workers!r} must be a positive integer")
    common.setdefault("progress", False)

    def one(name: str, nproc: int, overrides, kwargs: dict | None = None) -> RunResult:
        return launch(name, nproc, overrides, **{**common, **(kwargs or {})})

    with ThreadPoolExecutor(max_workers=min(max_workers, max(1, len(specs)))) as pool:
        futures = {key: pool.submit(one, *spec) for key, spec in specs.items()}
    results = {key: f.result() for key, f in futures.items()}
    if print_commands:
        for r in results.values():
            print(f"$ {r.command_line}   # {r.status}")
    if raise_on_failure:
        for r in results.values():
            r.raise_for_status()
    return results
