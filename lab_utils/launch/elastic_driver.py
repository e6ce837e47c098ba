"""torchrun, as a small program on torch's own launcher API, that reports failures as data.

    python -m lab_utils.launch.elastic_driver --nproc-per-node 2 --run-dir runs/NAME scripts/train.py key=value ...

does what `torchrun --standalone --nproc-per-node 2 --log-dir runs/NAME/logs --redirects 3 --tee 3
scripts/train.py key=value ...` does: the same LocalElasticAgent (`elastic_launch` + `LaunchConfig`), a c10d
rendezvous on 127.0.0.1 (a free port unless --rdzv-endpoint names one), per-rank logs and error files under
RUN/logs/. The launcher starts this instead of torchrun for two reasons:

- failures as data: when a rank fails, torch raises ChildFailedError with every failure (rank, exit code,
  error file). We write them all to RUN/failures.json with the root cause chosen by `root_cause`, instead of
  parsing the summary torchrun prints (which lists the peers torchrun itself SIGTERMed first);
- nothing outlives its parent. This driver asks Linux for a parent-death signal (SIGTERM) on start, so it
  stops when the launcher dies, even by SIGKILL (a Jupyter kernel restart). On SIGTERM/SIGHUP/SIGINT the agent
  stops its workers: SIGTERM to each worker's session, SIGKILL after --shutdown-grace seconds. Each worker
  starts through `--exec` (below), which sets a parent-death SIGKILL and then execs the script, so a worker
  cannot outlive this driver either, even when the driver itself is SIGKILLed.

`--exec PARENT_PID ARGS...` (internal): set the parent-death signal, then exec `python ARGS...` in place.
The running process is then exactly `python -u scripts/train.py ...`, as torchrun would have started it.

Module level imports nothing heavy: `--exec` runs once per rank before the script's own imports.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from lab_utils.launch.parent_death import die_with_parent

FAILURES = "failures.json"
SHUTDOWN_GRACE = 3  # seconds a SIGTERMed worker gets before SIGKILL (the launcher's grace too)

# Errors a rank raises because a *peer* went away: consequences, never the root cause.
PEER_LOST = ("Connection reset by peer", "Connection closed by peer", "remote worker", "Broken pipe",
             "Socket Timeout", "NCCL communicator was aborted")
# Signals the agent itself sends to the surviving ranks once one has failed: never the root cause.
STOP_SIGNALS = ("SIGTERM", "SIGINT")

def exec_with_parent_death(parent_pid: int, python_args: list[str]) -> None:
    """Become `python *python_args`, killed (SIGKILL) when the parent dies. The signal survives exec.
    Under a driver that started a zygote (LAB_ZYGOTE names its socket), have the zygote fork the rank instead
    and stand in for it (lab_utils/launch/zygote.py); exec only if the zygote cannot be reached."""
    die_with_parent(signal.SIGKILL, parent_pid)
    name = os.environ.get("LAB_ZYGOTE", "off")
    if name != "off":
        from lab_utils.launch import zygote

        zygote.run_client(name, python_args)  # returns only if nothing was started
    os.execv(sys.executable, [sys.executable, *python_args])


def signal_name(exitcode: int | None) -> str | None:
    """The name of the signal a negative exit code (Popen's convention) stands for."""
    if exitcode is None or exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


def failure_record(rank: int, failure, order: int) -> dict:
    """One torch ProcessFailure as plain data: who, how (exit code / signal), and the rank's own error."""
    has_file = bool(failure.error_file) and failure.error_file != "<N/A>"  # torch's mark for "no error file"
    msg = (failure.error_file_data or {}).get("message", "") if has_file else ""
    if isinstance(msg, str):  # the older error-file format: a bare message
        msg = {"message": msg, "extraInfo": {}}
    text = (msg.get("message") or "").strip()
    return {"rank": int(rank), "local_rank": failure.local_rank, "pid": failure.pid, "exitcode": failure.exitcode,
            "signal": signal_name(failure.exitcode), "error_file": failure.error_file if has_file else None,
            "message": text, "traceback": msg.get("extraInfo", {}).get("py_callstack", ""),
            "timestamp": failure.timestamp, "peer_lost": any(p in text for p in PEER_LOST), "order": order}


def root_cause(failures: list[dict]) -> dict | None:
    """The failure that caused the others, by evidence:

    1. a rank's own Python error (an error file written by @record) that is not a lost-peer error;
    2. else a rank killed by a signal other than SIGTERM/SIGINT (those the agent sends to the survivors);
    3. else any error file (a lost-peer error is still better evidence than nothing);
    4. else the first failure the agent saw.
    Within a rule, the earliest (timestamp, then the order the agent saw them) wins.
    """
    rules = (lambda f: f["error_file"] and f["message"] and not f["peer_lost"],
             lambda f: f["signal"] is not None and f["signal"] not in STOP_SIGNALS,
             lambda f: f["error_file"],
             lambda f: True)
    for rule in rules:
        matching = [f for f in failures if rule(f)]
        if matching:
            return min(matching, key=lambda f: (f["timestamp"], f["order"]))
    return None


def reason(failure: dict) -> str:
    """One line naming what happened to the root-cause rank."""
    if failure["error_file"] and failure["message"]:
        return failure["message"].splitlines()[-1]
    if failure["signal"]:
        return f"rank {failure['rank']} died: {failure['signal']} (no Python traceback: killed by a signal)"
    return f"rank {failure['rank']} exited with code {failure['exitcode']}"


def node_files(run_dir: Path, nnodes_max: int, node_rank: int) -> tuple[Path, Path]:
    """(log folder, failures file) of one node agent. One node: RUN/logs and RUN/failures.json (as always).
    Several nodes sharing one run folder (the launcher's simulated nodes): RUN/logs/node{k} and
    RUN/failures.node{k}.json, so no agent overwrites another's; the launcher merges them into failures.json."""
    run_dir = Path(run_dir)
    if nnodes_max <= 1:
        return run_dir / "logs", run_dir / FAILURES
    return run_dir / "logs" / f"node{node_rank}", run_dir / f"failures.node{node_rank}.json"


def write_failures(run_dir: Path, failures: dict, path: Path | None = None) -> dict:
    """RUN/failures.json (or `path`) from torch's {rank: ProcessFailure}; returns what it wrote."""
    from lab_utils.core.runfiles import write_json

    records = [failure_record(rank, f, i) for i, (rank, f) in enumerate(failures.items())]
    doc = failures_doc(records)
    write_json(doc, path or Path(run_dir) / FAILURES)
    return doc


def rendezvous_file(run_dir: Path, nnodes_max: int, node_rank: int) -> Path:
    """Where a node agent records a rendezvous that never completed: RUN/rendezvous.json, or
    RUN/rendezvous.node{k}.json when several nodes share the run folder."""
    _, failures = node_files(run_dir, nnodes_max, node_rank)
    return failures.with_name(failures.name.replace("failures", "rendezvous"))


def write_rendezvous_failure(run_dir: Path, nnodes_max: int, node_rank: int, endpoint: str, error: Exception) -> dict:
    """One node's failed rendezvous as data: which node, which endpoint, the error and its inner cause (a
    RendezvousConnectionError wraps the socket error that says why: timed out, no route, refused)."""
    import re

    from lab_utils.core.runfiles import write_json

    cause = error.__cause__ or error.__context__
    inner = str(cause).strip().splitlines()[0] if cause is not None and str(cause).strip() else ""
    if inner:  # torch's socket error: its first sentence (which address) and the errno (why), not the C++ frames
        errno = re.search(r"\(errno: [^)]*\)", inner)
        inner = inner.split(". ")[0].rstrip(".") + (f" {errno.group(0)}" if errno else "")
    kind = type(error).__name__
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    if not text and kind == "RendezvousTimeoutError":  # torch raises it with no message
        text = "not every node joined within the join timeout (--rdzv-conf join_timeout=...)"
    reason = f"rendezvous at {endpoint} did not complete: {kind}: {text}" + (f" (cause: {inner})" if inner else "")
    doc = {"node": node_rank, "endpoint": endpoint, "error": kind, "message": text, "cause": inner,
           "reason": reason}
    write_json(doc, rendezvous_file(run_dir, nnodes_max, node_rank))
    return doc


def failures_doc(records: list[dict]) -> dict:
    """{failures, root_cause, reason} from failure records (one node's, or every node's merged)."""
    cause = root_cause(records)
    return {"failures": records, "root_cause": cause["rank"] if cause else None,
            "reason": reason(cause) if cause else ""}


def tolerate_half_written_error_files() -> None:
    """Work around a torch race: a rank's error file is written in place (open "w", then write), and the agent
    SIGTERMs the surviving ranks the moment one fails. A survivor caught writing its own error file (a lost-peer
    error, typically) leaves half a JSON, and ProcessFailure's json.load then raises inside the agent: the
    agent (torchrun too) dies with a JSONDecodeError and every failure is lost. We read such a file as no file:
    that rank was stopped by the agent, which is what its exit code says."""
    from torch.distributed.elastic.multiprocessing import api
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    class HalfWrittenTolerant(ProcessFailure):
        def __post_init__(self):
            try:
                super().__post_init__()
            except ValueError:  # json.JSONDecodeError
                self._set_no_reply_file()
                self.message = f"exit code {self.exitcode}; its error file was cut short"

    api.ProcessFailure = HalfWrittenTolerant  # the name SubprocessContext builds each failure with


def cap_shutdown_grace(grace: int) -> None:
    """On a torch whose LaunchConfig has no shutdown_timeout (2.11; 2.13 has it), the agent gives SIGTERMed
    workers its own default of 30 s before SIGKILL. A rank deaf to SIGTERM then outlived the stopped launcher by
    30 s (measured on the H200 box: test_launcher's SIGKILL and kernel-restart cases found it left over), so
    cap every close at `grace`, what the field would have set."""
    from torch.distributed.elastic.multiprocessing import api

    original = api.PContext.close

    def close(self, death_sig=None, timeout: int = grace) -> None:
        return original(self, death_sig, min(timeout, grace))

    api.PContext.close = close


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m lab_utils.launch.elastic_driver", description=__doc__.split("\n")[0])
    p.add_argument("--nproc-per-node", type=int, required=True)
    p.add_argument("--run-dir", type=Path, required=True, help="failures.json goes here, logs under logs/")
    p.add_argument("--nnodes", default="1", help="N or MIN:MAX, as torchrun")
    p.add_argument("--node-rank", type=int, default=0,
                   help="the static rendezvous's node rank, as torchrun (c10d assigns ranks itself); with "
                        "several nodes it also names this node's log folder and failures file")
    p.add_argument("--rdzv-backend", default="c10d")
    p.add_argument("--rdzv-endpoint", default="127.0.0.1:0", help="port 0: the agent picks a free one")
    p.add_argument("--rdzv-id", default=None, help="default: the run folder's name")
    p.add_argument("--rdzv-conf", default="", help="KEY=VALUE,... as torchrun (join_timeout, read_timeout, is_host)")
    p.add_argument("--local-addr", default=None, help="this node's address for the others, as torchrun")
    p.add_argument("--max-restarts", type=int, default=0, help="as torchrun, 0 by default")
    p.add_argument("--shutdown-grace", type=int, default=SHUTDOWN_GRACE,
                   help="seconds between SIGTERM and SIGKILL when workers are stopped")
    p.add_argument("--parent-pid", type=int, default=None, help="die with this process (the launcher)")
    p.add_argument("script")
    p.add_argument("script_args", nargs=argparse.REMAINDER)
    return p.parse_args(argv)


def launch_config(args: argparse.Namespace):
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.launcher.api import LaunchConfig

    lo, _, hi = args.nnodes.partition(":")
    log_dir, _ = node_files(args.run_dir, int(hi or lo), args.node_rank)
    rdzv_configs = {"rank": args.node_rank} if args.rdzv_backend == "static" else {}
    for item in filter(None, args.rdzv_conf.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--rdzv-conf {args.rdzv_conf!r}: each item must be KEY=VALUE (got {item!r})")
        rdzv_configs[key] = value
    # shutdown_timeout is a LaunchConfig field only in newer torch (2.13 has it, 2.11 does not): pass it where
    # it exists; elsewhere main() caps the agent's own default (cap_shutdown_grace).
    import dataclasses

    optional = {"shutdown_timeout": args.shutdown_grace}
    known = {f.name for f in dataclasses.fields(LaunchConfig)}
    return LaunchConfig(
        min_nodes=int(lo), max_nodes=int(hi or lo), nproc_per_node=args.nproc_per_node,
        run_id=args.rdzv_id or args.run_dir.name, rdzv_backend=args.rdzv_backend,
        rdzv_endpoint=args.rdzv_endpoint, rdzv_configs=rdzv_configs, max_restarts=args.max_restarts,
        local_addr=args.local_addr,
        # torchrun --log-dir RUN/logs --redirects 3 --tee 3: per-rank files, and every line on our stdout too
        logs_specs=DefaultLogsSpecs(log_dir=str(log_dir), redirects=Std.ALL, tee=Std.ALL),
        **{k: v for k, v in optional.items() if k in known})


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--exec"]:
        exec_with_parent_death(int(argv[1]), argv[2:])  # does not return
    args = parse_args(argv)
    if args.parent_pid is not None:
        # SIGTERM, not SIGKILL: the agent's handler turns it into an orderly stop of the workers.
        die_with_parent(signal.SIGTERM, args.parent_pid)
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import RendezvousError
    from torch.distributed.launcher.api import elastic_launch

    tolerate_half_written_error_files()
    import dataclasses

    from torch.distributed.launcher.api import LaunchConfig

    if "shutdown_timeout" not in {f.name for f in dataclasses.fields(LaunchConfig)}:
        cap_shutdown_grace(args.shutdown_grace)
    from lab_utils.launch import start_plan, zygote

    # The ranks' start, as start_plan decided it for launch.json (the same function of the same environment);
    # before elastic_launch: the agent starts threads, and a fork must not happen after that
    if start_plan.ranks(args.script, os.environ).fork:
        os.environ[zygote.ENV] = zygote.start(args.script)
    worker = ["-u", "-m", "lab_utils.launch.elastic_driver", "--exec", str(os.getpid()), "-u", args.script,
              *args.script_args]
    try:
        elastic_launch(launch_config(args), sys.executable)(*worker)
    except ChildFailedError as e:
        lo, _, hi = args.nnodes.partition(":")
        doc = write_failures(args.run_dir, e.failures, node_files(args.run_dir, int(hi or lo), args.node_rank)[1])
        for f in doc["failures"]:
            how = f["signal"] or f"exit code {f['exitcode']}"
            tag = "root cause" if f["rank"] == doc["root_cause"] else "stopped or failed after it"
            print(f"[driver] rank {f['rank']}: {how} ({tag})", flush=True)
        print(f"[driver] {doc['reason']}", flush=True)
        return 1
    except RendezvousError as e:  # the agents never met: no rank started, so no failures.json
        lo, _, hi = args.nnodes.partition(":")
        doc = write_rendezvous_failure(args.run_dir, int(hi or lo), args.node_rank, args.rdzv_endpoint, e)
        print(f"[driver] node {args.node_rank}: {doc['reason']}", flush=True)
        return 1
    except SignalException as e:  # the agent has already stopped the workers
        print(f"[driver] stopped by {e.sigval.name}; workers stopped", flush=True)
        return 128 + int(e.sigval)
    return 0


if __name__ == "__main__":
    code = main()
    # The workers are stopped and every file is written. Skip interpreter finalization: after a signal the
    # agent leaves its rendezvous open (on purpose, for restarts), and finalizing it took 2-20 s (measured,
    # stuck in garbage collection), long enough to look like a leftover process.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
