"""Following a run's processes from start to exit, and stopping every one of them, always (through
process_tree.ProcessTree): this process's stop signals (SIGTERM/SIGHUP), the poll loop with its timeouts, the
progress display and the echo of the run's output. Part of the launcher (lab_utils/launch/launcher.py, whose
docstring lists the guarantees).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from lab_utils.core import runfiles
from lab_utils.core.runfiles import REPO
from lab_utils.launch.launch_diagnose import dump_stacks, stalled
from lab_utils.launch.process_tree import ProcessTree

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # what `timeout`, CI job limits and a closing terminal send
PEER_GRACE = 30  # seconds the other nodes get to notice a failed node (gloo: at once) before being stopped
LOG_EVERY = 30.0  # seconds between progress lines when the progress goes to a log, not a terminal


class Stopped(Exception):
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def stop_signals_raise():
    """While a run is in flight, SIGTERM/SIGHUP raise Stopped here (so the tree gets stopped) instead of
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
            raise Stopped(signum)

    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            previous[sig] = signal.signal(sig, handler)
    try:
        yield previous
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def redeliver(signum: int, previous: dict) -> None:
    """After cleaning up, let the signal do what it would have done without us (by default: end the process)."""
    old = previous.get(signum, signal.SIG_DFL)
    if callable(old):
        old(signum, None)
        return
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


# --- progress: rank 0's metrics.jsonl, shown as a bar where a bar can be redrawn, as lines in a log


class Bar:
    """A live bar: tqdm in a terminal, an ipywidgets bar in a notebook (tqdm.auto picks)."""

    def __init__(self, total: int, name: str):
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, desc=name, unit="step", leave=True, dynamic_ncols=True)

    def show(self, done: int, loss: float | None) -> None:
        self.bar.n = done
        if loss is not None:
            self.bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


class LogLines:
    """Progress where it goes to a log (CI, `make lab > log 2>&1`), not a terminal: a log keeps every redraw of
    a bar (the poll loop redraws 5 times a second: ~20 identical "0/40" lines while the ranks start), so this
    writes one line when the run ends, and one per LOG_EVERY seconds of a long run before that."""

    def __init__(self, total: int, name: str, file=None):
        self.total, self.name, self.file = total, name, file or sys.stderr
        self.start = self.last = time.time()
        self.done, self.loss, self.written = 0, None, -1

    def _write(self) -> None:
        loss = f", loss {self.loss:.4f}" if self.loss is not None else ""
        print(f"{self.name}: {self.done}/{self.total} steps{loss} ({time.time() - self.start:.1f} s)",
              file=self.file, flush=True)
        self.written, self.last = self.done, time.time()

    def show(self, done: int, loss: float | None) -> None:
        self.done, self.loss = done, loss
        if done > self.written and time.time() - self.last >= LOG_EVERY:
            self._write()

    def close(self) -> None:
        if self.done != self.written:
            self._write()


def live_display(stream=None) -> bool:
    """Can `stream` (default: stderr, where tqdm writes) redraw a bar in place? A terminal can, and so can a
    Jupyter kernel's output (a widget, or the text bar's carriage returns); a file or a CI log cannot."""
    stream = sys.stderr if stream is None else stream
    if stream.isatty():
        return True
    ipython = sys.modules.get("IPython")  # imported by every Jupyter kernel; never imported here
    shell = ipython.get_ipython() if ipython is not None else None
    return getattr(shell, "kernel", None) is not None


def progress_bar(total: int, name: str, enabled: bool) -> Bar | LogLines | None:
    if not enabled:
        return None
    return Bar(total, name) if live_display() else LogLines(total, name)


def _update_bar(bar: Bar | LogLines | None, run_dir: Path) -> None:
    if bar is not None:
        bar.show(*runfiles.count_metrics(run_dir))


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


def popen(cmd: list[str], env: dict, out):
    """Start `cmd` as a process of its own (exec), in a session of its own, its output to `out`."""
    return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True)


def supervise(cmds: list[tuple[list[str], dict]], run_dir: Path, timeout: float, bar, echo: bool,
              stall_timeout: float | None = None, peer_grace: float = PEER_GRACE, hold=None, start_one=popen):
    """Start each (command, env) (one per node) with `start_one(cmd, env, out)` (the launcher's: fork or exec, as
    start_plan decided; default: exec), follow them until all exit or the timeout; stop every process
    they started, always. A hang first gets each rank's stack dumped (faulthandler, SIGUSR1). When one node has
    failed, the others are stopped `peer_grace` s later if they have not ended by then. hold (a threading.Event
    or None): no stall is called before it is set; the stall timeout then counts from the moment it was seen set.
    Returns (status, returncode, pid, signum, previous handlers, stacks); status is ok | hang | interrupted |
    stopped; returncode is the first non-zero one (0 when all succeeded)."""
    out_path = run_dir / "output.log"
    start = time.time()
    status, signum, procs, trees, shown, stacks = "ok", None, [], [], 0, {}
    codes: list[int | None] = []
    # One file object for every node: its offset is shared, so the nodes' lines interleave, never overwrite.
    with open(out_path, "w") as out, stop_signals_raise() as previous:
        try:
            for cmd, env in cmds:
                proc = start_one(cmd, env, out)
                procs.append(proc)
                trees.append(ProcessTree(proc))
            first_failure, held_until = None, (0.0 if hold is None else None)
            while None in (codes := [p.poll() for p in procs]):
                if held_until is None and hold.is_set():
                    held_until = time.time()
                for tree in trees:
                    tree.snapshot()
                shown = _echo_new(out_path, shown) if echo else shown
                _update_bar(bar, run_dir)
                if any(c not in (None, 0) for c in codes) and first_failure is None:
                    first_failure = time.time()  # one node failed: the others should notice within PEER_GRACE
                if time.time() - start > timeout or stalled(run_dir, stall_timeout, time.time(), held_until):
                    status = "hang"
                    break
                if first_failure is not None and time.time() - first_failure > peer_grace:
                    break  # a node failed and another never noticed: stop it, report the failure
                time.sleep(0.2)
            for tree in trees:
                tree.snapshot()
            if status == "hang":
                stacks = dump_stacks(run_dir, trees)
        except KeyboardInterrupt:
            status = "interrupted"
        except Stopped as e:
            status, signum = "stopped", e.signum
        finally:
            for tree in trees:  # also on success: a worker must never outlive its job
                tree.stop()
            if bar is not None:
                _update_bar(bar, run_dir)  # the last steps, written after the last poll
                bar.close()
            if echo:
                _echo_new(out_path, shown)
    # The last poll's codes; a process we stopped was reaped by psutil, so poll() again would wrongly say 0.
    codes = [p.returncode if c is None else c for p, c in zip(procs, codes + [None] * (len(procs) - len(codes)),
                                                              strict=True)]
    failed = [c for c in codes if c not in (None, 0)]
    returncode = failed[0] if failed else (codes[0] if codes else None)
    return status, returncode, procs[0].pid if procs else None, signum, previous, stacks
