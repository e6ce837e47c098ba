"""Launch `scripts/train.py` as one process or under torchrun, and always come back with a verdict.

Taught in notebooks/00_preflight.ipynb (and used by every chapter, the CLI and the tests).

What it guarantees:
- bad keys/values fail *before* anything starts (config.resolve + distenv.check_launchable);
- progress: a bar driven by rank 0's metrics.jsonl (tqdm in a terminal, a widget in a notebook);
- nothing is left behind: torchrun starts each worker in a session of its own, so killing torchrun's
  process group misses them. We record every descendant while the job runs and, on timeout, interrupt,
  or exit, stop each one we saw (SIGTERM, then SIGKILL);
- a crash shows the failing rank's own traceback (torchrun's per-rank error file, written by @record);
- a hang is named as a hang after the timeout, with each rank's last heartbeat, so you see who stalled.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from . import config as config_mod
from . import distenv, runfiles
from .runfiles import REPO, read_heartbeats

TRAIN = REPO / "scripts" / "train.py"


@dataclass
class RunResult:
    name: str
    run_dir: Path
    status: str  # ok | crashed | hang | interrupted
    returncode: int | None
    seconds: float
    nproc: int
    message: str = ""
    failing_rank: int | None = None
    traceback: str = ""
    heartbeats: dict = field(default_factory=dict)
    command: list[str] = field(default_factory=list)  # exactly what was started (python or torchrun)

    @property
    def command_line(self) -> str:
        """The command as a shell line a user can copy (paths relative to the repository where possible)."""
        import shlex

        rel = [c.replace(str(REPO) + os.sep, "") for c in self.command]
        if rel and rel[0] == sys.executable:
            rel[0] = "python"
        if rel[1:3] == ["-m", "torch.distributed.run"]:
            rel = ["torchrun", *rel[3:]]
        return shlex.join(rel)

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


def build_command(nproc: int, argv: list[str], log_dir: Path, script: Path = TRAIN) -> list[str]:
    if nproc == 1:
        return [sys.executable, str(script), *argv]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            f"--log-dir={log_dir}", "--redirects=3", "--tee=3", str(script), *argv]


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

    def stop(self, grace: float = 3.0) -> None:
        self.snapshot()
        procs = self.alive()
        for p in procs:
            try:
                p.terminate()
            except psutil.NoSuchProcess:
                pass
        _, still = psutil.wait_procs(procs, timeout=grace)
        for p in still:
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


# Errors a rank raises because a *peer* went away: consequences, never the root cause.
PEER_LOST = ("Connection reset by peer", "Connection closed by peer", "remote worker", "Broken pipe",
             "Socket Timeout", "NCCL communicator was aborted")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def read_failure(log_dir: Path, output: str) -> tuple[int | None, str, str]:
    """(rank, one-line reason, traceback) of the root cause of a failed job.

    Evidence, in order: a rank's own Python error (torchrun's per-rank error.json, written by @record) that
    is not a lost-peer error; else a rank torchrun's summary lists as killed by a signal (no Python
    traceback exists then); else any error file; else the first exit code listed.
    """
    errors = []
    for path in glob.glob(str(log_dir / "**" / "error.json"), recursive=True):
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            continue
        msg = data.get("message", {})
        if isinstance(msg, str):  # older format
            msg = {"message": msg, "extraInfo": {}}
        info = msg.get("extraInfo", {})
        rank_dir = Path(path).parent.name
        text = msg.get("message", "").strip()
        errors.append((any(p in text for p in PEER_LOST), float(info.get("timestamp", 0) or 0),
                       int(rank_dir) if rank_dir.isdigit() else 0, text, info.get("py_callstack", "")))
    errors.sort()
    if errors and not errors[0][0]:
        _, _, rank, text, tb = errors[0]
        return rank, text.splitlines()[-1] if text else "", tb
    # torchrun's summary lists every failed rank ("Failures:" and "Root Cause"). Its "root cause" is just the
    # failure it noticed first, which can be a peer's "Connection reset" logged in the same second as the
    # SIGKILL that caused it; so a rank killed by a signal outranks a lost-peer error, wherever it is listed.
    summary = output[output.index("Failures:"):] if "Failures:" in output else output
    listed = [(int(r), int(code)) for r, code in
              re.findall(r"rank\s*:\s*(\d+).*?\n\s*exitcode\s*:\s*(-?\d+)", summary, re.S)]
    killed = [(rank, code) for rank, code in listed if code < 0]
    if killed:
        rank, code = killed[0]
        return rank, f"rank {rank} died: {_signal_name(-code)} (no Python traceback: killed by a signal)", ""
    if errors:
        _, _, rank, text, tb = errors[0]
        return rank, text.splitlines()[-1] if text else "", tb
    if listed:
        rank, code = listed[0]
        return rank, f"rank {rank} exited with code {code}", ""
    return None, "", ""


def launch(name: str, nproc: int = 1, overrides: list[str] | dict | None = None, timeout: float = 600,
           progress: bool = True, echo: bool = False, runs_dir: Path | None = None,
           extra_env: dict | None = None, script: Path = TRAIN) -> RunResult:
    """Run the training script as `name` with `nproc` processes; return a RunResult (never hangs)."""
    if not isinstance(nproc, int) or nproc < 1:
        raise config_mod.ConfigError(f"nproc={nproc!r} must be a positive integer")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name or ""):
        raise config_mod.ConfigError(f"--name {name!r}: use letters, digits, '.', '_' and '-'")
    if timeout is None or timeout <= 0:
        raise config_mod.ConfigError(f"timeout={timeout!r} must be > 0 seconds")
    overrides = overrides or []
    given = config_mod.parse_overrides(overrides)
    if "out_dir" in given:
        raise config_mod.ConfigError("out_dir is set by the launcher (runs/NAME); do not pass it")
    run_dir = Path(runs_dir or runfiles.runs_dir()) / name
    given["out_dir"] = str(run_dir)
    cfg = config_mod.resolve(given, nproc)  # raises ConfigError before anything launches
    distenv.check_launchable(cfg, nproc)

    if run_dir.exists():
        shutil.rmtree(run_dir)  # a stale metrics.jsonl must never be mistaken for this run's
    log_dir = run_dir / "logs"
    log_dir.mkdir(parents=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               # Set explicitly: torchrun would force 1 thread (and print a notice) only when nproc > 1,
               # and a different thread count can change float results between the runs we compare.
               OMP_NUM_THREADS=str(cfg["threads"]),
               TORCHELASTIC_ERROR_FILE=str(log_dir / "0" / "error.json"))
    env.update(extra_env or {})
    if nproc > 1:
        env.pop("TORCHELASTIC_ERROR_FILE")  # torchrun sets one per rank
    else:
        (log_dir / "0").mkdir()
    argv = config_mod.to_argv(given)
    cmd = build_command(nproc, argv, log_dir, script)
    (run_dir / "launch.json").write_text(json.dumps({"cmd": cmd, "nproc": nproc, "timeout": timeout}, indent=2))

    out_path = run_dir / "output.log"
    bar = _progress_bar(cfg["steps"], name, progress)
    start = time.time()
    status, returncode = "ok", None
    with open(out_path, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                                start_new_session=True)
        tree = ProcessTree(proc)
        shown = 0
        try:
            while True:
                returncode = proc.poll()
                tree.snapshot()
                if echo:
                    shown = _echo_new(out_path, shown)
                if bar is not None:
                    done, loss = runfiles.count_metrics(run_dir)
                    bar.n = done
                    if loss is not None:
                        bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
                    bar.refresh()
                if returncode is not None:
                    break
                if time.time() - start > timeout:
                    status = "hang"
                    break
                time.sleep(0.2)
        except KeyboardInterrupt:
            status = "interrupted"
        finally:
            tree.stop()  # also on success: a worker must never outlive its job
            if bar is not None:
                bar.close()
    if echo:
        _echo_new(out_path, shown)
    seconds = time.time() - start
    output = out_path.read_text(errors="replace")
    result = RunResult(name, run_dir, status, returncode, seconds, nproc, heartbeats=read_heartbeats(run_dir),
                       command=cmd)
    if status == "hang":
        text, result.failing_rank = describe_hang(result.heartbeats, nproc)
        result.message = f"hang: no exit after the {timeout:.0f} s timeout; every process was stopped.\n{text}"
    elif status == "interrupted":
        result.message = "interrupted; every process was stopped"
    elif returncode != 0:
        result.status = "crashed"
        result.failing_rank, reason, result.traceback = read_failure(log_dir, output)
        tail = "\n".join(output.strip().splitlines()[-15:])
        result.message = reason or f"exit code {returncode}; last output:\n{tail}"
        if not result.traceback and not reason:
            result.traceback = ""
    (run_dir / "launch.json").write_text(json.dumps(
        {"cmd": cmd, "nproc": nproc, "timeout": timeout, "status": result.status,
         "returncode": returncode, "seconds": round(seconds, 3), "failing_rank": result.failing_rank,
         "message": result.message}, indent=2))
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
