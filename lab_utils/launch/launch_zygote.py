"""Each launch's first process forked from a process that has already imported torch: the launch zygote.

Why: zygote.py spares the ranks their imports, but every launch still started its first process from nothing:
the driver (`python -m lab_utils.launch.elastic_driver`, which imports torch and torch's elastic agent) or
the one plain process of a single run (`python scripts/train.py`, which imports torch and torch._dynamo).
That cost 5.3-6 busy CPU-s per 1-step launch on the 2-core CI box (measured: docs/results.md), and the
chapters and the tests launch some 400 times. Now the launcher of each calling process that launches
repeatedly (a notebook's kernel, a pytest worker, a bench; `ddp-lab run` launches once and execs, see
start_plan.launches_once) keeps a launch zygote: a process started once with the run's environment, which
imports all that and then forks the launch's first process on request, with the run's stdio, environment,
folder and command. The launcher follows the forked process as it followed the one it started before.

What stays as it was:
- The process tree under the first process (the driver's agent, the rank zygote, the ranks), and so the
  launcher's stop of every process it saw, its timeouts, stack dumps and root cause.
- `ps` and /proc/PID/cmdline show the command the launcher asked for (setproctitle), so a run's processes are
  found by their command line as before (the tests' "nothing left behind" check does).
- Dying with the caller: the zygote ends when its caller's end of a socket pair closes (the caller died,
  even by SIGKILL) and each forked process has the parent-death signal the started one had: SIGTERM for the
  driver (its agent then stops the ranks with their grace), SIGKILL for the one plain process.
- Import-time settings: a zygote serves only launches whose environment equals the one it was started with
  (but for the variables in PER_RUN, which nothing reads before main()); a launch with other settings (say
  TORCH_DISTRIBUTED_DEBUG or a malloc tunable, read at import or at process start) gets a zygote of its own.

Which launches are forked from it, and which are exec'd and why, is decided in start_plan.py (and recorded in
launch.json); a zygote that would fork with a second thread running (OpenMP's pool, when OMP_NUM_THREADS is not
1 at import) declines, and then the launch is exec'd: slower, never wrong.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import weakref
from collections import OrderedDict

from lab_utils.launch import zygote

# Variables that differ between the launches of one caller and are read only after the forked process's
# main() starts: a zygote's environment is compared without them.
PER_RUN = ("TORCHELASTIC_ERROR_FILE", "PYTEST_CURRENT_TEST", "LAB_RUNS_DIR")
MAX_ZYGOTES = 3  # per caller; each holds torch in memory (~300 MB resident): the least recently used goes
TITLE_ROOM = 4096  # bytes of padding on the zygote's own command line, the room setproctitle writes into

_zygotes: OrderedDict[tuple, _Zygote] = OrderedDict()
_declined: set[tuple] = set()  # environments whose zygote ended: their launches are started as before
_lock = threading.Lock()


class Forked:
    """What subprocess.Popen gives the launcher, for a process a launch zygote forked: pid, poll(),
    returncode (negative: killed by that signal)."""

    def __init__(self, conn: socket.socket, pid: int):
        self.conn, self.pid, self.returncode = conn, pid, None
        conn.setblocking(False)
        conn.set_inheritable(False)

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                message = self.conn.recv(4096)
            except BlockingIOError:
                return None
            except OSError:
                message = b""
            # No message: the zygote itself is gone (killed), and the process with it (its parent-death signal)
            self.returncode = json.loads(message).get("exit", 1) if message else -signal.SIGKILL
            self.conn.close()
        return self.returncode


class _Zygote:
    def __init__(self, env: dict, cwd: str):
        self.name = f"ddp-lab-launch-zygote-{os.getpid()}-{os.urandom(4).hex()}"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener.bind("\0" + self.name)  # listening before the zygote starts: the first request just waits
        listener.listen(64)
        self.control, theirs = socket.socketpair()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", __name__, str(listener.fileno()), str(theirs.fileno()), " " * TITLE_ROOM],
            env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(listener.fileno(), theirs.fileno()), start_new_session=True)
        listener.close()
        theirs.close()
        self.forked: weakref.WeakSet[Forked] = weakref.WeakSet()

    def busy(self) -> bool:
        return any(f.returncode is None for f in self.forked)

    def fork(self, request: dict, stdout) -> Forked | None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.connect("\0" + self.name)
            socket.send_fds(sock, [json.dumps(request).encode()], [0, stdout.fileno(), stdout.fileno()])
            reply = json.loads(sock.recv(4096) or b"{}")
        except (OSError, ValueError):
            reply = {}
        if "pid" not in reply:  # declined, or gone
            sock.close()
            return None
        forked = Forked(sock, reply["pid"])
        self.forked.add(forked)
        return forked

    def close(self) -> None:
        self.control.close()  # the zygote ends when its end of the pair reads EOF
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _key(env: dict) -> tuple:
    return tuple(sorted((k, v) for k, v in env.items() if k not in PER_RUN))


def start(cmd: list[str], env: dict, stdout, cwd, script_argv: list[str] | None = None) -> tuple[Forked | None, str]:
    """Fork `cmd` (a launch's first process, which start_plan.plan said may be forked) from this caller's launch
    zygote for `env`, started if need be. The request says what to run explicitly: script_argv (SCRIPT ARGS)
    for one plain process, else None for the driver (`cmd` is `python -m MODULE ARGS`); `cmd` is the title `ps`
    shows. (None, why) when it cannot be forked at start time (the zygote for this environment declined or
    ended): the caller then execs it and records why."""
    key = _key(env)
    with _lock:
        if key in _declined:
            return None, "launch zygote for this environment declined earlier (a second thread) or ended"
        z = _zygotes.pop(key, None)
        if z is not None and z.proc.poll() is not None:  # it declined (a second thread) or died
            _declined.add(key)
            return None, "launch zygote for this environment declined (a second thread) or ended"
        if z is None:
            z = _Zygote(env, str(cwd))
        _zygotes[key] = z  # most recently used last
        idle = [k for k, other in _zygotes.items() if other is not z and not other.busy()]
        for old in idle[:max(0, len(_zygotes) - MAX_ZYGOTES)]:  # never one with a process still running
            _zygotes.pop(old).close()
    request = {"kind": "driver" if script_argv is None else "process", "title": cmd,
               "args": cmd[3:] if script_argv is None else script_argv, "env": env, "cwd": str(cwd)}
    forked = z.fork(request, stdout)
    return forked, "" if forked else "launch zygote did not fork it (declined, or could not be reached)"


def _become(conn: socket.socket, fds: list[int], request: dict, server: int) -> None:
    """The forked child: set the title to the command asked for, then run the driver or the plain process."""
    import setproctitle

    setproctitle.setproctitle(" ".join(request["title"]))
    if request["kind"] == "process":  # one plain process: `python SCRIPT ARGS`
        zygote.become(conn, fds, request, server, _death_signal(request), lambda: zygote.run_script(request["args"]))
    from lab_utils.launch import elastic_driver

    # The driver (`python -m elastic_driver ARGS`): it asks for its own death signal (--parent-pid, now this zygote)
    rest = [f"--parent-pid={server}" if a.startswith("--parent-pid=") else a for a in request["args"]]
    sys.argv = [elastic_driver.__file__, *rest]
    zygote.become(conn, fds, request, server, _death_signal(request), lambda: elastic_driver.main(rest))


def _death_signal(request: dict) -> int:
    """SIGTERM for the driver (its agent then stops the ranks with their grace), SIGKILL for one plain process."""
    return signal.SIGKILL if request["kind"] == "process" else signal.SIGTERM


def _serve(listener_fd: int, control_fd: int) -> None:
    listener = socket.socket(fileno=listener_fd)
    control = socket.socket(fileno=control_fd)
    import setproctitle  # noqa: F401  (imported before the fork: its set-up reads this process's argv area)
    import torch  # noqa: F401
    from torch.distributed.launcher import api  # noqa: F401  (what the driver imports: the agent, rendezvous)

    from lab_utils.core.runfiles import TRAIN
    from lab_utils.launch import elastic_driver  # noqa: F401

    zygote.preload(str(TRAIN))
    if len(os.listdir("/proc/self/task")) != 1:  # a fork copies one thread: another's locks would stay held
        return
    serve(listener, control)


def serve(listener: socket.socket, control: socket.socket) -> None:
    zygote.serve(listener, _become, _death_signal, control)


if __name__ == "__main__":
    try:
        _serve(int(sys.argv[1]), int(sys.argv[2]))
    finally:
        os._exit(0)
