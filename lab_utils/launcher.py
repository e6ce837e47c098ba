"""Launch `scripts/train.py` as one process or on N ranks, and always come back with a verdict.

Taught in notebooks/00_preflight.ipynb (and used by every chapter, the CLI and the tests).

N ranks run under torch's own launcher API (lab_utils/elastic_driver.py: `elastic_launch`, what torchrun
runs); `RunResult.command_line` is the equivalent `torchrun ...` line, to copy. What it guarantees:
- bad keys/values fail *before* anything starts (config.resolve + distenv.check_launchable);
- progress: a bar driven by rank 0's metrics.jsonl (tqdm in a terminal, a widget in a notebook);
- nothing is left behind. Workers run in sessions of their own, so killing a process group misses them:
  we record every descendant while the job runs and, on success, crash, timeout, Ctrl-C, or SIGTERM/SIGHUP
  to this process, stop each one we saw (SIGTERM, then SIGKILL after a grace, so a rank that ignores
  SIGTERM goes too). When this process dies without running any handler (SIGKILL, a Jupyter kernel
  restart), the parent-death signal (Linux) stops the driver, whose agent stops the workers, which also die
  with the driver;
- a crash names the root cause, not a victim: the driver writes every failed rank to failures.json
  (exit code, signal, the rank's own error file with its traceback) and picks the rank whose own error or
  signal started it, never a peer the agent SIGTERMed or one that only lost its connection;
- a hang is named as a hang after the timeout, with each rank's last heartbeat, so you see who stalled.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from . import config as config_mod
from . import distenv, elastic_driver, runfiles
from .runfiles import REPO, read_heartbeats

TRAIN = REPO / "scripts" / "train.py"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # what `timeout`, CI job limits and a closing terminal send


@dataclass
class RunResult:
    name: str
    run_dir: Path
    status: str  # ok | crashed | hang | interrupted | stopped
    returncode: int | None
    seconds: float
    nproc: int
    message: str = ""
    failing_rank: int | None = None
    traceback: str = ""
    heartbeats: dict = field(default_factory=dict)
    command: list[str] = field(default_factory=list)  # exactly what was started (python or the driver)
    equivalent: list[str] = field(default_factory=list)  # the same run as `python ...` or `torchrun ...`

    @property
    def command_line(self) -> str:
        """The run as a shell line a user can copy: `torchrun ...` (or `python ...`), paths relative to the repo."""
        words = ["python" if c == sys.executable else c for c in (self.equivalent or self.command)]
        return shlex.join(c.replace(str(REPO) + os.sep, "") for c in words)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def __str__(self) -> str:
        head = f"run {self.name!r}: {self.status} in {self.seconds:.1f} s (nproc={self.nproc})"
        parts = [head] + ([self.message] if self.message else [])
        if self.traceback:
            parts.append(f"--- rank {self.failing_rank} traceback ---\n{self.traceback.rstrip()}")
        return "\n".join(parts)

    def raise_for_status(self) -> RunResult:
        if not self.ok:
            raise RunFailed(str(self))
        return self


class RunFailed(RuntimeError):
    pass


def build_command(nproc: int, argv: list[str], run_dir: Path, script: Path = TRAIN,
                  max_restarts: int = 0) -> tuple[list[str], list[str]]:
    """(what we start, the equivalent command a user would type). Both die with this process.
    max_restarts > 0: torchrun's elastic restart (every rank re-launched after a failure; chapter 11)."""
    parent = str(os.getpid())
    restarts = [f"--max-restarts={max_restarts}"] if max_restarts else []
    if nproc == 1 and not max_restarts:
        return ([sys.executable, "-m", "lab_utils.elastic_driver", "--exec", parent, str(script), *argv],
                [sys.executable, str(script), *argv])
    started = [sys.executable, "-m", "lab_utils.elastic_driver", f"--nproc-per-node={nproc}",
               f"--run-dir={run_dir}", f"--parent-pid={parent}", *restarts, str(script), *argv]
    torchrun = ["torchrun", "--standalone", f"--nproc-per-node={nproc}", *restarts, f"--log-dir={run_dir / 'logs'}",
                "--redirects=3", "--tee=3", str(script), *argv]
    return started, torchrun


class ProcessTree:
    """Every process started under `root`, remembered as seen, so they can all be stopped later."""

    def __init__(self, root: subprocess.Popen):
        self.root = psutil.Process(root.pid)
        self.seen: dict[int, psutil.Process] = {root.pid: self.root}

    def snapshot(self) -> None:
        try:
            for child in self.root.children(recursive=True):
                self.seen.setdefault(child.pid, child)
        except psutil.NoSuchProcess:
            pass

    def alive(self) -> list[psutil.Process]:
        # psutil.Process remembers the creation time, so a recycled pid is never mistaken for ours.
        return [p for p in self.seen.values() if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]

    def stop(self, grace: float = elastic_driver.SHUTDOWN_GRACE) -> None:
        self.snapshot()
        procs = self.alive()
        for p in procs:
            try:
                p.terminate()
            except psutil.NoSuchProcess:
                pass
        _, still = psutil.wait_procs(procs, timeout=grace)
        for p in still:  # e.g. a rank that ignores SIGTERM
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(still, timeout=grace)


def _progress_bar(total: int, name: str, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=name, unit="step", leave=True, dynamic_ncols=True)


def describe_hang(beats: dict[int, dict], nproc: int) -> tuple[str, int | None]:
    """Name the rank that fell behind: the others are waiting for it in a collective."""
    if not beats:
        return "no rank reported any progress (stuck before set-up finished?)", None
    now = time.time()
    lines, order = [], []
    for r in range(nproc):
        b = beats.get(r)
        if b is None:
            lines.append(f"  rank {r}: no heartbeat")
            order.append((-2, -1, r))
            continue
        lines.append(f"  rank {r}: step {b.get('step')} {b.get('phase')} ({now - b['time']:.0f} s ago)")
        order.append((b.get("step", -1), runfiles.phase_index(b.get("phase")), r))
    behind = min(order)
    suspect = behind[2] if len({o[:2] for o in order}) > 1 or nproc == 1 else None
    who = f"rank {suspect} is behind; the others wait for it in a collective" if suspect is not None \
        else "all ranks are at the same step (a collective mismatch, or a hang inside the step)"
    return who + "\n" + "\n".join(lines), suspect


def read_failures(run_dir: Path) -> dict | None:
    """failures.json (written by the driver, or by us for one process): every failed rank and the root cause."""
    try:
        return json.loads((Path(run_dir) / elastic_driver.FAILURES).read_text())
    except (OSError, ValueError):
        return None


def _single_process_failures(run_dir: Path, pid: int, returncode: int) -> dict:
    """One process has no agent to report it: describe it the same way, from its error file and exit code."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    error_file = run_dir / "logs" / "0" / "error.json"
    return elastic_driver.write_failures(run_dir, {0: ProcessFailure(0, pid, returncode, str(error_file))})


# --- the jobs of launch(), in order


def _validate(name: str, nproc: int, overrides, timeout: float, runs_dir: Path | None) -> tuple[dict, dict, Path]:
    """(given keys, resolved config, run folder), or ConfigError before anything is written or started."""
    if not isinstance(nproc, int) or nproc < 1:
        raise config_mod.ConfigError(f"nproc={nproc!r} must be a positive integer")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name or ""):
        raise config_mod.ConfigError(f"--name {name!r}: use letters, digits, '.', '_' and '-'")
    if timeout is None or timeout <= 0:
        raise config_mod.ConfigError(f"timeout={timeout!r} must be > 0 seconds")
    given = config_mod.parse_overrides(overrides or [])
    if "out_dir" in given:
        raise config_mod.ConfigError("out_dir is set by the launcher (runs/NAME); do not pass it")
    run_dir = Path(runs_dir or runfiles.runs_dir()) / name
    given["out_dir"] = str(run_dir)
    cfg = config_mod.resolve(given, nproc)
    distenv.check_launchable(cfg, nproc)
    return given, cfg, run_dir


def _prepare_folder(run_dir: Path, nproc: int) -> Path:
    if run_dir.exists():
        shutil.rmtree(run_dir)  # a stale metrics.jsonl or failures.json must never be mistaken for this run's
    log_dir = run_dir / "logs"
    (log_dir / "0" if nproc == 1 else log_dir).mkdir(parents=True)  # the agent makes the per-rank folders
    return log_dir


def _environment(cfg: dict, log_dir: Path, nproc: int, extra_env: dict | None) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               # Set explicitly: torchrun would force 1 thread (and print a notice) only when nproc > 1,
               # and a different thread count can change float results between the runs we compare.
               OMP_NUM_THREADS=str(cfg["threads"]))
    if nproc == 1:
        env["TORCHELASTIC_ERROR_FILE"] = str(log_dir / "0" / "error.json")  # @record writes the traceback there
    else:
        env.pop("TORCHELASTIC_ERROR_FILE", None)  # the agent sets one per rank
    env.update(extra_env or {})
    return env


class _Stopped(Exception):
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def _stop_signals_raise():
    """While a run is in flight, SIGTERM/SIGHUP raise _Stopped here (so the tree gets stopped) instead of
    ending this process and orphaning the run. Main thread only (Python's rule for handlers); a signal
    this process ignores (nohup) stays ignored. Yields the previous handlers, restored on exit."""
    previous: dict[int, object] = {}
    if threading.current_thread() is not threading.main_thread():
        yield previous
        return
    seen: list[int] = []

    def handler(signum, frame):
        if not seen:  # once: a second SIGTERM must not interrupt the stopping of the tree
            seen.append(signum)
            raise _Stopped(signum)

    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            previous[sig] = signal.signal(sig, handler)
    try:
        yield previous
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _redeliver(signum: int, previous: dict) -> None:
    """After cleaning up, let the signal do what it would have done without us (by default: end the process)."""
    old = previous.get(signum, signal.SIG_DFL)
    if callable(old):
        old(signum, None)
        return
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _supervise(cmd: list[str], env: dict, run_dir: Path, timeout: float, bar, echo: bool):
    """Start `cmd`, follow it until it exits or the timeout; stop every process it started, always.
    Returns (status, returncode, pid, signum, previous handlers); status is ok | hang | interrupted | stopped."""
    out_path = run_dir / "output.log"
    start = time.time()
    status, returncode, signum, proc, tree, shown = "ok", None, None, None, None, 0
    with open(out_path, "w") as out, _stop_signals_raise() as previous:
        try:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                                    start_new_session=True)
            tree = ProcessTree(proc)
            while (returncode := proc.poll()) is None:
                tree.snapshot()
                shown = _echo_new(out_path, shown) if echo else shown
                _update_bar(bar, run_dir)
                if time.time() - start > timeout:
                    status = "hang"
                    break
                time.sleep(0.2)
            tree.snapshot()
        except KeyboardInterrupt:
            status = "interrupted"
        except _Stopped as e:
            status, signum = "stopped", e.signum
        finally:
            if proc is not None:  # also on success: a worker must never outlive its job
                (tree or ProcessTree(proc)).stop()
            if bar is not None:
                bar.close()
            if echo:
                _echo_new(out_path, shown)
    return status, proc.returncode if returncode is None else returncode, proc.pid, signum, previous


def _update_bar(bar, run_dir: Path) -> None:
    if bar is None:
        return
    done, loss = runfiles.count_metrics(run_dir)
    bar.n = done
    if loss is not None:
        bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
    bar.refresh()


def _classify(result: RunResult, pid: int, timeout: float, signum: int | None) -> None:
    """Fill in the message (and failing rank, traceback) from the run's own files."""
    if result.status == "hang":
        text, result.failing_rank = describe_hang(result.heartbeats, result.nproc)
        result.message = f"hang: no exit after the {timeout:.0f} s timeout; every process was stopped.\n{text}"
    elif result.status == "interrupted":
        result.message = "interrupted; every process was stopped"
    elif result.status == "stopped":
        result.message = f"stopped by {signal.Signals(signum).name}; every process was stopped"
    elif result.returncode != 0:
        result.status = "crashed"
        doc = read_failures(result.run_dir)
        if doc is None and result.nproc == 1:
            doc = _single_process_failures(result.run_dir, pid, result.returncode)
        cause = next((f for f in (doc or {}).get("failures", []) if f["rank"] == doc.get("root_cause")), None)
        if cause is not None:
            result.failing_rank, result.message, result.traceback = cause["rank"], doc["reason"], cause["traceback"]
        if cause is None or not (cause["error_file"] or cause["signal"]):
            # No traceback, no signal (or the driver itself failed: bad arguments, rendezvous): the output says why
            output = (result.run_dir / "output.log").read_text(errors="replace")
            tail = "\n".join(output.strip().splitlines()[-15:])
            result.message = f"{result.message or f'exit code {result.returncode}'}; last output:\n{tail}"


def _write_launch_json(result: RunResult, timeout: float) -> None:
    runfiles.write_json({"cmd": result.command, "equivalent": result.equivalent, "command_line": result.command_line,
                         "nproc": result.nproc, "timeout": timeout, "status": result.status,
                         "returncode": result.returncode, "seconds": round(result.seconds, 3),
                         "failing_rank": result.failing_rank, "message": result.message},
                        result.run_dir / "launch.json")


def launch(name: str, nproc: int = 1, overrides: list[str] | dict | None = None, timeout: float = 600,
           progress: bool = True, echo: bool = False, runs_dir: Path | None = None,
           extra_env: dict | None = None, script: Path = TRAIN, max_restarts: int = 0) -> RunResult:
    """Run the training script as `name` with `nproc` processes; return a RunResult (never hangs).

    If this process gets SIGTERM or SIGHUP meanwhile, the run is stopped, launch.json written, a line
    printed, and then the signal does what it would have done without us (by default: end this process)."""
    given, cfg, run_dir = _validate(name, nproc, overrides, timeout, runs_dir)  # raises before anything starts
    log_dir = _prepare_folder(run_dir, nproc)
    env = _environment(cfg, log_dir, nproc, extra_env)
    cmd, equivalent = build_command(nproc, config_mod.to_argv(given), run_dir, script,
                                   max_restarts)
    result = RunResult(name, run_dir, "starting", None, 0.0, nproc, command=cmd, equivalent=equivalent)
    _write_launch_json(result, timeout)

    start = time.time()
    result.status, result.returncode, pid, signum, previous = _supervise(
        cmd, env, run_dir, timeout, _progress_bar(cfg["steps"], name, progress), echo)
    result.seconds = time.time() - start
    result.heartbeats = read_heartbeats(run_dir)
    _classify(result, pid, timeout, signum)
    _write_launch_json(result, timeout)
    if signum is not None:
        print(f"run {name!r}: {result.message}", file=sys.stderr, flush=True)
        _redeliver(signum, previous)
    return result


def _echo_new(path: Path, shown: int) -> int:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return shown
    end = text.rfind("\n") + 1
    if end > shown:
        sys.stdout.write(text[shown:end])
        sys.stdout.flush()
    return max(end, shown)
