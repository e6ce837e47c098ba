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
- a hang is named as a hang after the timeout, with each rank's last heartbeat, so you see who stalled,
  and each rank's Python stack at that moment (SIGUSR1 -> faulthandler, registered by distenv.setup; the
  dump stays in the rank's log and in RunResult.stacks) before it is stopped;
- nnodes > 1 simulates that many nodes on this box (chapter 09): one node agent per node, each
  `--nnodes N --node-rank k` with a c10d rendezvous on 127.0.0.1 (a free port, the same rdzv id), exactly
  as on N hosts; the same timeout, clean-up and root-cause guarantees hold across all of them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import socket
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
TORCHRUN = Path(sys.executable).with_name("torchrun")  # the venv's own torchrun (runner="torchrun")
PEER_GRACE = 30  # seconds the other nodes get to notice a failed node (gloo: at once) before being stopped
DUMP_WAIT = 1.5  # seconds for a SIGUSR1 stack dump to reach the rank's log before the rank is stopped


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
    nnodes: int = 1
    node_commands: list[tuple[list[str], list[str]]] = field(default_factory=list)  # (started, torchrun) per node
    stacks: dict[int, str] = field(default_factory=dict)  # rank -> its Python stack at a hang (faulthandler)

    @staticmethod
    def _shell(words: list[str]) -> str:
        words = ["python" if c == sys.executable else c for c in words]
        return shlex.join(c.replace(str(REPO) + os.sep, "") for c in words)

    @property
    def command_line(self) -> str:
        """The run as a shell line a user can copy: `torchrun ...` (or `python ...`), paths relative to the repo.
        Several nodes: one line per node (each is what that node's host would run)."""
        if self.nnodes > 1:
            return "\n".join(self.command_lines)
        return self._shell(self.equivalent or self.command)

    @property
    def command_lines(self) -> list[str]:
        """One `torchrun ...` line per node."""
        if self.nnodes > 1:
            return [self._shell(eq or cmd) for cmd, eq in self.node_commands]
        return [self.command_line]

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def __str__(self) -> str:
        head = f"run {self.name!r}: {self.status} in {self.seconds:.1f} s (nproc={self.nproc})"
        parts = [head] + ([self.message] if self.message else [])
        if self.traceback:
            parts.append(f"--- rank {self.failing_rank} traceback ---\n{self.traceback.rstrip()}")
        if self.status == "hang" and self.stacks.get(self.failing_rank):
            parts.append(f"--- rank {self.failing_rank} stack at the timeout (faulthandler) ---\n"
                         f"{self.stacks[self.failing_rank].rstrip()}")
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


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the OS picks it: what port 0 means). Used for the rendezvous
    of simulated nodes, which must all be told the same port before any of them starts."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_command(nnodes: int, node_rank: int, nproc: int, endpoint: str, rdzv_id: str, argv: list[str],
                 run_dir: Path, script: Path = TRAIN, max_restarts: int = 0) -> tuple[list[str], list[str]]:
    """(what we start, the equivalent torchrun line) for node `node_rank` of `nnodes`, c10d rendezvous at
    `endpoint` (HOST:PORT of the first node) with id `rdzv_id`. Every node runs the same line but for
    --node-rank; with c10d the ranks are handed out by the rendezvous, so --node-rank only names the node
    (it matters to the static rendezvous alone). docs/multinode.md shows this line (tests check it runs)."""
    restarts = [f"--max-restarts={max_restarts}"] if max_restarts else []
    log_dir, _ = elastic_driver.node_files(run_dir, nnodes, node_rank)
    rdzv = [f"--nnodes={nnodes}", f"--node-rank={node_rank}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint}", f"--rdzv-id={rdzv_id}"]
    started = [sys.executable, "-m", "lab_utils.elastic_driver", f"--nproc-per-node={nproc}", *rdzv,
               f"--run-dir={run_dir}", f"--parent-pid={os.getpid()}", *restarts, str(script), *argv]
    torchrun = ["torchrun", f"--nproc-per-node={nproc}", *rdzv, *restarts, f"--log-dir={log_dir}",
                "--redirects=3", "--tee=3", str(script), *argv]
    return started, torchrun


def master_port_command(nproc: int, port: int, argv: list[str], run_dir: Path, script: Path = TRAIN
                        ) -> tuple[list[str], list[str]]:
    """The article's §6.1 form: a fixed `--master-addr 127.0.0.1 --master-port PORT` (torchrun's static
    rendezvous; node 0 listens on PORT). Two such jobs with one PORT on a box clash (chapter 09)."""
    rdzv = ["--nnodes=1", "--node-rank=0", "--master-addr=127.0.0.1", f"--master-port={port}"]
    started = [sys.executable, "-m", "lab_utils.elastic_driver", f"--nproc-per-node={nproc}",
               "--rdzv-backend=static", f"--rdzv-endpoint=127.0.0.1:{port}", f"--run-dir={run_dir}",
               f"--parent-pid={os.getpid()}", str(script), *argv]
    torchrun = ["torchrun", f"--nproc-per-node={nproc}", *rdzv, f"--log-dir={run_dir / 'logs'}",
                "--redirects=3", "--tee=3", str(script), *argv]
    return started, torchrun


def as_torchrun(equivalent: list[str]) -> list[str]:
    """runner="torchrun": start the equivalent line itself, with this venv's torchrun."""
    return [str(TORCHRUN), *equivalent[1:]] if equivalent[:1] == ["torchrun"] else equivalent


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
        _node_gpus(cfg, nproc, nnodes)  # raises when simulated nodes would share a GPU under NCCL
    return given, cfg, run_dir


def _node_gpus(cfg: dict, nproc: int, nnodes: int) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES for each simulated node: node k sees GPUs k*nproc..(k+1)*nproc-1, as a host of its
    own would see its GPUs. None: leave it (CPU runs, or gloo ranks sharing GPUs)."""
    device = distenv.pick_device(cfg["device"])
    if device.type != "cuda":
        return None
    import torch

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpus = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
    if len(gpus) >= nproc * nnodes:
        return [",".join(gpus[k * nproc:(k + 1) * nproc]) for k in range(nnodes)]
    if cfg["backend"] == "gloo":
        return None
    raise config_mod.ConfigError(
        f"nnodes={nnodes} x nproc={nproc} simulated on this box needs one GPU per rank for NCCL "
        f"({len(gpus)} visible): pass backend=gloo or device=cpu")


def _prepare_folder(run_dir: Path, nproc: int) -> Path:  # nproc: 1 means one plain process
    if run_dir.exists():
        shutil.rmtree(run_dir)  # a stale metrics.jsonl or failures.json must never be mistaken for this run's
    log_dir = run_dir / "logs"
    (log_dir / "0" if nproc == 1 else log_dir).mkdir(parents=True)  # the agent makes the per-rank folders
    return log_dir


def bytecode_cache(environ: dict | None = None) -> Path | None:
    """A folder for the ranks' compiled bytecode, when torch is installed without any (None otherwise).

    Python compiles a module's source on every import unless it finds its bytecode (.pyc). A torch installed
    with no __pycache__, on a box that also sets PYTHONDONTWRITEBYTECODE=1, makes every process compile ~1,600
    torch modules from source: on the two-H200 box (torch 2.11, docs/measured/h200x2/launch_cost.txt) that was
    5.95 s of a 1-step run's 11.9 s, and `import torch` + the first CUDA tensor took 5.4-8.9 s against 3.2 s
    with a cache. Each launch starts 1 + N such processes. The ranks then get PYTHONPYCACHEPREFIX=this folder
    (the source tree stays untouched, which is what PYTHONDONTWRITEBYTECODE protects) and may write there.
    LAB_BYTECODE_CACHE=off keeps the box's setting. Compiled bytecode runs the same code: no number changes.
    """
    environ = os.environ if environ is None else environ
    if environ.get("LAB_BYTECODE_CACHE", "auto") == "off" or environ.get("PYTHONPYCACHEPREFIX"):
        return None
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None or (Path(spec.origin).parent / "__pycache__").is_dir():
        return None  # torch's own bytecode is there: Python reads it (a prefix would make it compile again)
    base = Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "ddp-parity-lab" / "pycache"


def _environment(cfg: dict, log_dir: Path, nproc: int, extra_env: dict | None, max_restarts: int = 0) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               # Set explicitly: torchrun would force 1 thread (and print a notice) only when nproc > 1,
               # and a different thread count can change float results between the runs we compare.
               OMP_NUM_THREADS=str(cfg["threads"]))
    cache = bytecode_cache(env)
    if cache:
        env["PYTHONPYCACHEPREFIX"] = str(cache)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    if max_restarts:
        # torch 2.13's c10d rendezvous reuses one TCPStore across restart rounds with no per-round prefix for
        # the workers' keys, so a restarted gloo rank can read its peer's address from the attempt before and
        # fail with "connectFullMesh ... Connection refused" (measured 1 in 1 restarts here; pytorch#167288
        # reports it with NCCL). A store per round avoids it.
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    if nproc == 1:
        env["TORCHELASTIC_ERROR_FILE"] = str(log_dir / "0" / "error.json")  # @record writes the traceback there
    else:
        env.pop("TORCHELASTIC_ERROR_FILE", None)  # the agent sets one per rank
    env.update(extra_env or {})
    for key in [k for k, v in env.items() if v is None]:  # extra_env={"X": None} unsets X (chapter 09: OMP)
        del env[key]
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


def stalled(run_dir: Path, stall_timeout: float | None, now: float) -> bool:
    """True when some rank has written a heartbeat and no rank has written one for `stall_timeout` s: every rank
    is waiting (a hang), whatever the total run time. Before the first heartbeat (start-up on a busy box) only
    the overall timeout applies."""
    if not stall_timeout:
        return False
    beats = read_heartbeats(run_dir)
    latest = max((b.get("time", 0) for b in beats.values()), default=None)
    done = beats and all(b.get("phase") == "finished" for b in beats.values())
    return latest is not None and not done and now - latest > stall_timeout


def _supervise(cmds: list[tuple[list[str], dict]], run_dir: Path, timeout: float, bar, echo: bool,
               stall_timeout: float | None = None):
    """Start each (command, env) (one per node), follow them until all exit or the timeout; stop every process
    they started, always. A hang first gets each rank's stack dumped (faulthandler, SIGUSR1).
    Returns (status, returncode, pid, signum, previous handlers, stacks); status is ok | hang | interrupted |
    stopped; returncode is the first non-zero one (0 when all succeeded)."""
    out_path = run_dir / "output.log"
    start = time.time()
    status, signum, procs, trees, shown, stacks = "ok", None, [], [], 0, {}
    codes: list[int | None] = []
    # One file object for every node: its offset is shared, so the nodes' lines interleave, never overwrite.
    with open(out_path, "w") as out, _stop_signals_raise() as previous:
        try:
            for cmd, env in cmds:
                proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                                        start_new_session=True)
                procs.append(proc)
                trees.append(ProcessTree(proc))
            first_failure = None
            while None in (codes := [p.poll() for p in procs]):
                for tree in trees:
                    tree.snapshot()
                shown = _echo_new(out_path, shown) if echo else shown
                _update_bar(bar, run_dir)
                if any(c not in (None, 0) for c in codes) and first_failure is None:
                    first_failure = time.time()  # one node failed: the others should notice within PEER_GRACE
                if time.time() - start > timeout or stalled(run_dir, stall_timeout, time.time()):
                    status = "hang"
                    break
                if first_failure is not None and time.time() - first_failure > PEER_GRACE:
                    break  # a node failed and another never noticed: stop it, report the failure
                time.sleep(0.2)
            for tree in trees:
                tree.snapshot()
            if status == "hang":
                stacks = dump_stacks(run_dir, trees)
        except KeyboardInterrupt:
            status = "interrupted"
        except _Stopped as e:
            status, signum = "stopped", e.signum
        finally:
            for tree in trees:  # also on success: a worker must never outlive its job
                tree.stop()
            if bar is not None:
                bar.close()
            if echo:
                _echo_new(out_path, shown)
    # The last poll's codes; a process we stopped was reaped by psutil, so poll() again would wrongly say 0.
    codes = [p.returncode if c is None else c for p, c in zip(procs, codes + [None] * (len(procs) - len(codes)),
                                                              strict=True)]
    failed = [c for c in codes if c not in (None, 0)]
    returncode = failed[0] if failed else (codes[0] if codes else None)
    return status, returncode, procs[0].pid if procs else None, signum, previous, stacks


def _rank_log(pid: int, run_dir: Path) -> tuple[int, Path] | None:
    """(global rank, the file its stderr goes to) of a worker, from its own environment (torch's agent sets
    RANK and the error file inside the rank's log folder); None if it is not a rank."""
    try:
        environ = psutil.Process(pid).environ()
    except psutil.Error:
        return None
    if "RANK" not in environ and "TORCHELASTIC_ERROR_FILE" not in environ:
        return None
    rank = int(environ.get("RANK", "0"))
    error_file = environ.get("TORCHELASTIC_ERROR_FILE")
    stderr = Path(error_file).with_name("stderr.log") if error_file else None
    # One process (or a rank started without per-rank logs): its stderr is the run's output.log.
    return rank, stderr if stderr is not None and stderr.exists() else run_dir / "output.log"


def dump_stacks(run_dir: Path, trees: list[ProcessTree], wait: float = DUMP_WAIT) -> dict[int, str]:
    """SIGUSR1 to every rank of the run (each registered a faulthandler dump in distenv.setup), then read what
    each wrote to its log: {rank: its threads' Python stacks}. Ranks are the processes whose pid a heartbeat
    names, so a process that never registered the handler (SIGUSR1 would kill it) is never signalled."""
    beats = read_heartbeats(run_dir)
    ours = {p.pid for tree in trees for p in tree.alive()}
    targets = {}
    for b in beats.values():
        pid = b.get("pid")
        if pid in ours and (found := _rank_log(pid, run_dir)) is not None:
            rank, log = found
            targets[rank] = (pid, log, log.stat().st_size if log.exists() else 0)
    for pid, _, _ in targets.values():
        try:
            os.kill(pid, distenv.STACK_DUMP_SIGNAL)
        except ProcessLookupError:
            pass
    if targets:
        time.sleep(wait)
    stacks = {}
    for rank, (_, log, offset) in sorted(targets.items()):
        try:
            with open(log, "rb") as f:
                f.seek(offset)
                text = f.read().decode(errors="replace")
        except OSError:
            continue
        if log.name == "output.log":  # shared by every rank: keep only this rank's dump
            text = "\n".join(line for line in text.splitlines()
                             if "thread 0x" in line.lower() or line.startswith("  File") or not line.strip())
        stacks[rank] = text
    return stacks


def stack_lines(stack: str, path_part: str = "") -> list[str]:
    """The `File "...", line N in func` lines of a faulthandler dump (optionally only those whose file path
    contains `path_part`), innermost first, as faulthandler prints them."""
    return [line.strip() for line in stack.splitlines()
            if line.strip().startswith("File ") and path_part in line]


def _update_bar(bar, run_dir: Path) -> None:
    if bar is None:
        return
    done, loss = runfiles.count_metrics(run_dir)
    bar.n = done
    if loss is not None:
        bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
    bar.refresh()


def _classify(result: RunResult, pid: int, timeout: float, signum: int | None,
              stall_timeout: float | None = None) -> None:
    """Fill in the message (and failing rank, traceback) from the run's own files."""
    if result.status == "hang":
        text, result.failing_rank = describe_hang(result.heartbeats, result.nproc * result.nnodes)
        why = f"no exit after the {timeout:.0f} s timeout" if result.seconds > timeout or not stall_timeout \
            else f"no heartbeat from any rank for {stall_timeout:.0f} s"
        result.message = f"hang: {why}; every process was stopped.\n{text}"
    elif result.status == "interrupted":
        result.message = "interrupted; every process was stopped"
    elif result.status == "stopped":
        result.message = f"stopped by {signal.Signals(signum).name}; every process was stopped"
    elif result.returncode != 0:
        result.status = "crashed"
        doc = read_failures(result.run_dir)
        if doc is None and result.nproc * result.nnodes == 1:
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
                         "nproc": result.nproc, "nnodes": result.nnodes,
                         "node_cmds": [c for c, _ in result.node_commands], "timeout": timeout, "status": result.status,
                         "returncode": result.returncode, "seconds": round(result.seconds, 3),
                         "failing_rank": result.failing_rank, "message": result.message},
                        result.run_dir / "launch.json")


def launch(name: str, nproc: int = 1, overrides: list[str] | dict | None = None, timeout: float = 600,
           progress: bool = True, echo: bool = False, runs_dir: Path | None = None,
           extra_env: dict | None = None, script: Path = TRAIN, max_restarts: int = 0, nnodes: int = 1,
           runner: str = "driver", master_port: int | None = None, stall_timeout: float | None = None) -> RunResult:
    """Run the training script as `name` with `nproc` processes per node; return a RunResult (never hangs).

    nnodes > 1: that many nodes simulated on this box (a node agent each, c10d rendezvous on 127.0.0.1).
    runner="torchrun": start the equivalent `torchrun ...` line itself instead of the elastic driver (chapter 09
    shows torchrun's own output; failures then come from the output, not failures.json).
    master_port: the article's fixed `--master-addr 127.0.0.1 --master-port PORT` instead of `--standalone`.
    extra_env: added to the ranks' environment; a value None removes that variable.
    stall_timeout: also call it a hang when no rank has written a heartbeat for that many seconds (after the
    first one): a hang is caught that long after it starts, however slow the start-up was.

    If this process gets SIGTERM or SIGHUP meanwhile, the run is stopped, launch.json written, a line
    printed, and then the signal does what it would have done without us (by default: end this process)."""
    if runner not in ("driver", "torchrun"):
        raise config_mod.ConfigError(f"runner={runner!r} must be 'driver' or 'torchrun'")
    if stall_timeout is not None and not stall_timeout > 0:
        raise config_mod.ConfigError(f"stall_timeout={stall_timeout!r} must be > 0 seconds")
    if master_port is not None and (nnodes > 1 or not 0 < int(master_port) < 65536):
        raise config_mod.ConfigError(f"master_port={master_port!r}: one node only, a port in 1..65535")
    given, cfg, run_dir = _validate(name, nproc, overrides, timeout, runs_dir, nnodes)  # raises before any start
    log_dir = _prepare_folder(run_dir, nproc * nnodes)
    env = _environment(cfg, log_dir, nproc * nnodes, extra_env, max_restarts)
    argv = config_mod.to_argv(given)
    if nnodes > 1:
        endpoint, gpus = f"127.0.0.1:{free_port()}", _node_gpus(cfg, nproc, nnodes)
        pairs = [node_command(nnodes, k, nproc, endpoint, name, argv, run_dir, script, max_restarts)
                 for k in range(nnodes)]
        envs = [dict(env, **({"CUDA_VISIBLE_DEVICES": gpus[k]} if gpus else {})) for k in range(nnodes)]
    elif master_port is not None:
        pairs, envs = [master_port_command(nproc, int(master_port), argv, run_dir, script)], [env]
    else:
        pairs, envs = [build_command(nproc, argv, run_dir, script, max_restarts)], [env]
    if runner == "torchrun":
        pairs = [(as_torchrun(eq), eq) for _, eq in pairs]
    cmd, equivalent = pairs[0]
    result = RunResult(name, run_dir, "starting", None, 0.0, nproc, command=cmd, equivalent=equivalent,
                       nnodes=nnodes, node_commands=pairs if nnodes > 1 else [])
    _write_launch_json(result, timeout)

    start = time.time()
    result.status, result.returncode, pid, signum, previous, result.stacks = _supervise(
        [(c, e) for (c, _), e in zip(pairs, envs, strict=True)], run_dir, timeout,
        _progress_bar(cfg["steps"], name, progress), echo, stall_timeout)
    result.seconds = time.time() - start
    result.heartbeats = read_heartbeats(run_dir)
    if nnodes > 1:
        merge_node_failures(run_dir)
    _classify(result, pid, timeout, signum, stall_timeout)
    _write_launch_json(result, timeout)
    if signum is not None:
        print(f"run {name!r}: {result.message}", file=sys.stderr, flush=True)
        _redeliver(signum, previous)
    return result


def merge_node_failures(run_dir: Path) -> dict | None:
    """Every node's failures.node{k}.json into one failures.json, the root cause chosen across all nodes (the
    same rule as within one node: the rank whose own error started it, never a peer that lost its connection)."""
    records = []
    for path in sorted(Path(run_dir).glob("failures.node*.json")):
        try:
            records += json.loads(path.read_text())["failures"]
        except (OSError, ValueError, KeyError):
            continue
    if not records:
        return None
    doc = elastic_driver.failures_doc(records)
    runfiles.write_json(doc, Path(run_dir) / elastic_driver.FAILURES)
    return doc


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
