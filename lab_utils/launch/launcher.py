"""Launch `scripts/train.py` as one process or on N ranks, and always come back with a verdict.

Taught in notebooks/00_preflight.ipynb (and used by every chapter, the CLI and the tests).

N ranks run under torch's own launcher API (lab_utils/launch/elastic_driver.py: `elastic_launch`, what torchrun
runs); `RunResult.command_line` is the equivalent `torchrun ...` line, to copy. What it guarantees:
- bad keys/values fail *before* anything starts (the LaunchRequest checks its own values when it is made;
  then config.resolve + distenv.check_launchable);
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

This module is the public face (RunResult, launch, launch_many, and launch_request's LaunchRequest, request,
requests_from_specs); the parts, one job each: launch_request.py (what one launch needs, checked),
run_result.py (RunResult, RunFailed), launch_commands.py (the command lines and the ranks' environment),
process_tree.py (every process started, to stop them all), supervise.py (stop signals, the poll loop,
progress), launch_diagnose.py (hang naming, stack dumps, failures and the root cause).
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Hashable
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
from lab_utils.launch.launch_request import LaunchRequest, request, requests_from_specs
from lab_utils.launch.process_tree import ProcessTree
from lab_utils.launch.run_result import RunFailed, RunResult
from lab_utils.launch.supervise import PEER_GRACE, popen, progress_bar, redeliver, supervise

# The launcher's public face: the names chapters, the CLI, drivers, tests and notebooks use as `launcher.X`.
# The command lines live in launch_commands, supervision in supervise, diagnosis in launch_diagnose.
__all__ = ["DUMP_WAIT", "REPO", "TORCHRUN", "TRAIN", "LaunchRequest", "ProcessTree", "RunFailed", "RunResult",
           "build_command", "bytecode_cache", "dump_stacks", "free_port", "launch", "launch_many",
           "master_port_command", "node_command", "request", "requests_from_specs"]


# --- the jobs of launch(), in order: validate (the request did, when it was made), resolve the keys, prepare the
# folder, build the commands, supervise, diagnose


def _resolve(request: LaunchRequest) -> tuple[dict, dict, Path]:
    """(given keys, resolved config, run folder), or ConfigError before anything is written or started."""
    nproc, nnodes = request.nproc, request.topology.nnodes
    given = config_mod.parse_overrides(request.overrides or [])
    if "out_dir" in given:
        raise config_mod.ConfigError("out_dir is set by the launcher (runs/NAME); do not pass it")
    run_dir = Path(request.environment.runs_dir or runfiles.runs_dir()) / request.name
    given["out_dir"] = str(run_dir)
    cfg = config_mod.resolve(given, request.world_size)
    distenv.check_launchable(cfg, nproc)
    if nnodes > 1:
        node_gpus(cfg, nproc, nnodes)  # raises when simulated nodes would share a GPU under NCCL
    return given, cfg, run_dir


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


def launch(request: LaunchRequest) -> RunResult:
    """Run what `request` asks (launch_request.py: the script as its name, nproc processes per node, its keys,
    topology, supervision, environment and output) and return a RunResult (never hangs). The request checked its
    own values when it was made; the keys are resolved here, before anything is written or started.

    Topology: nnodes > 1 simulates that many nodes on this box (or runs them on netns hosts), master_port uses the
    article's fixed port instead of `--standalone`. Environment: runner="torchrun" starts the equivalent `torchrun
    ...` line itself instead of the elastic driver (chapter 09 shows torchrun's own output; failures then come from
    the output, not failures.json). Supervision: stall_timeout calls a hang that long after the last heartbeat,
    however slow the start-up was; hold delays that call until an event is set; peer_grace bounds how long the
    other nodes run once one has failed (a rank stuck in its own connect never notices the peer).

    If this process gets SIGTERM or SIGHUP meanwhile, the run is stopped, launch.json written, a line
    printed, and then the signal does what it would have done without us (by default: end this process)."""
    if not isinstance(request, LaunchRequest):
        raise TypeError(f"launch() takes a LaunchRequest, not {type(request).__name__}: "
                        "launch(request(name, nproc, keys, timeout=..., ...))")
    name, nproc, timeout = request.name, request.nproc, request.timeout
    # the groups' fields as the local names the steps below use (not dataclasses.astuple: it deep-copies, and
    # `hold` must stay the caller's Event, `hosts` the caller's namespaces)
    topology, supervision, started_with = request.topology, request.supervision, request.environment
    nnodes, hosts, endpoints = topology.nnodes, topology.hosts, topology.endpoints
    rdzv_conf, master_port = topology.rdzv_conf, topology.master_port
    stall_timeout, peer_grace, hold = supervision.stall_timeout, supervision.peer_grace, supervision.hold
    script, runner = started_with.script, started_with.runner
    extra_env, max_restarts = started_with.extra_env, started_with.max_restarts
    progress, echo = request.output.progress, request.output.echo
    given, cfg, run_dir = _resolve(request)  # raises before any start
    log_dir = _prepare_folder(run_dir, request.world_size)
    env = environment(cfg, log_dir, request.world_size, extra_env, max_restarts)
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


def launch_many(requests: dict[Hashable, LaunchRequest], *, max_workers: int, raise_on_failure: bool = False,
                print_commands: bool = False, on_done=None) -> dict[Hashable, RunResult]:
    """Several independent launches at once: `requests` = {key: LaunchRequest}; returns {key: RunResult} in the
    order of `requests`. Each runs without its progress bar (overlapping bars would garble each other); all else,
    ports, events and hosts included, is as its request says. Tuples of (run name, nproc, keys[, options]) become
    requests through requests_from_specs.

    max_workers: how many run at once (the caller sizes it for the box: chapter.workers on 2 cores). Each
    training process uses one thread and a fixed reduction order, so overlapping runs changes their wall time,
    never their numbers. Every run finishes (or is stopped) before this returns; then raise_on_failure raises
    RunFailed with the first failed run's report (in `requests` order), and print_commands prints each run's
    command line and status. on_done(key, RunResult), if given, is called as each run ends (a long batch's
    progress lines; from the pool's threads, one at a time per run)."""
    if not isinstance(max_workers, int) or max_workers < 1:
        raise config_mod.ConfigError(f"max_workers={max_workers!r} must be a positive integer")
    for key, req in requests.items():
        if not isinstance(req, LaunchRequest):
            raise TypeError(f"launch_many: {key!r} is a {type(req).__name__}, not a LaunchRequest "
                            "(requests_from_specs makes them from (name, nproc, keys[, options]) tuples)")
    with ThreadPoolExecutor(max_workers=min(max_workers, max(1, len(requests)))) as pool:
        futures = {key: pool.submit(launch, req.quiet()) for key, req in requests.items()}
        for key, future in futures.items() if on_done else ():
            future.add_done_callback(lambda f, key=key: f.exception() or on_done(key, f.result()))
    results = {key: f.result() for key, f in futures.items()}
    if print_commands:
        for r in results.values():
            print(f"$ {r.command_line}   # {r.status}")
    if raise_on_failure:
        for r in results.values():
            r.raise_for_status()
    return results

