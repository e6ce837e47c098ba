"""Ranks forked from a process that has already imported torch, instead of each importing it again.

Why: on the 2-core CI box `import torch` costs 3.4-3.8 CPU-seconds (measured), and a 2-rank launch paid it
three times (the driver and each rank): most of what a short chapter run costs. The driver now imports torch
once, forks a *zygote* before the agent starts any thread, and the zygote imports the training script's
modules (the script's top level, not its `__main__` block). Each worker torch's agent starts is then a small
*client* (no torch import): it hands the zygote its stdin/stdout/stderr, argv, environment and working folder
over a Unix socket, and the zygote forks the real rank with those. Measured effect: docs/results.md.

What torch's agent sees is unchanged: one process per rank, with its own exit code, signal and error file.
- The client waits for the rank and ends the same way: the same exit code, or killed by the same signal.
- Signals the agent sends the client (SIGTERM at shutdown, SIGINT) are passed on to the rank.
- Nothing outlives its parent:
  - the zygote dies with the driver (parent-death SIGKILL);
  - each rank dies with the zygote (the same), and with its client: the zygote watches each client's socket
    and SIGKILLs the rank when its client is gone, since a SIGKILLed client cannot pass anything on.
- A hung rank's stack dump (SIGUSR1) goes straight to the rank: its heartbeat names its real pid.

What differs, and how it is handled:
- /proc/PID/environ of a rank shows the zygote's environment, not the rank's (Linux keeps the one a process
  was exec'd with). Heartbeats therefore carry the rank's error file (launch_diagnose reads it from there).
- `ps` shows a rank with the driver's command line (it is a fork of it).
- The OpenMP runtime read OMP_NUM_THREADS when torch was loaded: the rank sets its thread count again.
- Which ranks are forked and which exec'd (LAB_ZYGOTE=off, LAB_EXIT=finalize, any script but scripts/train.py)
  is decided in start_plan.ranks, which the driver calls and launch.json records.
- If the zygote cannot be reached, the client execs the script itself: slower, never wrong.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys

from lab_utils.launch.parent_death import die_with_parent

ENV = "LAB_ZYGOTE"  # the socket's name, set for the workers by the driver; "off" turns the zygote off
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
MAX_MESSAGE = 1 << 20  # argv + environment, as JSON: a few kB in practice


def start(script: str) -> str:
    """Fork the zygote (call before any thread exists) and return the socket name the workers are given.
    The socket listens before the fork, so a worker that connects while the zygote still imports just waits."""
    name = f"ddp-lab-zygote-{os.getpid()}-{os.urandom(4).hex()}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind("\0" + name)  # an abstract socket: no file to clean up; private to this network namespace
    listener.listen(64)
    parent = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    if os.fork() == 0:
        try:
            die_with_parent(signal.SIGKILL, parent)
            _serve(listener, script)
        finally:
            os._exit(0)
    listener.close()
    return name


def _serve(listener: socket.socket, script: str) -> None:
    """The zygote: import what the script imports, then fork one rank per request and report how it ended."""
    import torch  # noqa: F401  (already imported by the driver; named for the reader)

    preload(script)
    # Deaf to the stop signals: the launcher SIGTERMs every process of the run at once, and the ranks' grace
    # (to handle their own SIGTERM) must not be cut short by their zygote dying, which SIGKILLs them. The zygote
    # ends with the driver, or by the SIGKILL that follows the grace.
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    serve(listener, _become_rank, lambda request: signal.SIGKILL)


def preload(script: str) -> None:
    """Run the script's top level (its imports and definitions; main() runs under "__main__" only) and import
    what every rank imports later anyway."""
    import runpy

    sys.argv = [script]
    runpy.run_path(script, run_name="__lab_zygote__")
    # Imported lazily by what every rank does: torch.optim's first add_param_group imports torch._dynamo, and
    # torch.use_deterministic_algorithms imports torch._inductor.config (which imports it too): 2.3-3.2 CPU-s
    # per process on the CI box (measured with -X importtime), as much again as `import torch`.
    import torch._dynamo  # noqa: F401
    import torch._inductor.config  # noqa: F401


def serve(listener: socket.socket, become, on_gone, control: socket.socket | None = None) -> None:
    """Fork one child per request and report how it ended, until `control` (if given) closes.

    become(conn, fds, request, server_pid): run in the child, never returns. on_gone(request): the signal a
    child gets when its client goes away without a word (a SIGKILLed client cannot pass anything on)."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so SIGCHLD writes to the wake-up pipe
    clients: dict[int, socket.socket] = {}  # child pid -> its client's connection
    watched: dict[socket.socket, tuple[int, int]] = {}  # connections whose client is still there -> (pid, signal)
    extra = [control] if control is not None else []
    while True:
        ready, _, _ = select.select([listener, wake_r, *extra, *watched], [], [], 1.0)
        if wake_r in ready:
            os.read(wake_r, 4096)
        if control is not None and control in ready:
            try:
                if not control.recv(64):
                    return  # the caller is gone: so are we (each child has its parent-death signal)
            except OSError:
                return
        for conn in [c for c in ready if c in watched]:  # a client sends nothing more: readable means gone
            try:
                gone = not conn.recv(64)
            except OSError:
                gone = True
            if gone:
                _forward(*watched.pop(conn))
        if listener in ready:
            conn, _ = listener.accept()
            try:
                data, fds, _, _ = socket.recv_fds(conn, MAX_MESSAGE, 3)
                request = json.loads(data)
            except (OSError, ValueError):
                conn.close()
                continue
            server = os.getpid()
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                for other in clients.values():
                    other.close()
                for own in (listener, *extra):
                    own.close()
                os.close(wake_r)
                os.close(wake_w)
                become(conn, fds, request, server)  # never returns
            for fd in fds:
                os.close(fd)
            clients[pid] = conn
            watched[conn] = (pid, on_gone(request))
            conn.send(json.dumps({"pid": pid}).encode())
        while clients:  # reap every child that ended and tell its client how
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = clients.pop(pid, None)
            watched.pop(conn, None)
            if conn is not None:
                try:
                    conn.send(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode())
                except OSError:
                    pass
                conn.close()


def become(conn: socket.socket, fds: list[int], request: dict, parent: int, death_signal: int, run) -> None:
    """In a forked child: take the client's stdio, environment and folder, die with `parent` (by
    `death_signal`), then exit with what `run()` returns (a SystemExit's code; 1 and the traceback on an error)."""
    import io
    import traceback

    code = 1
    try:
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.setsid()
        die_with_parent(death_signal, parent)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        # -u: unbuffered, so a process's last line reaches its log even when it is killed
        sys.stdout = io.TextIOWrapper(open(1, "wb", buffering=0, closefd=False), write_through=True,
                                      encoding="utf-8", errors="backslashreplace")
        sys.stderr = io.TextIOWrapper(open(2, "wb", buffering=0, closefd=False), write_through=True,
                                      encoding="utf-8", errors="backslashreplace")
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        conn.close()  # the server keeps its copy: it watches the client and reports the exit
        if os.environ.get("OMP_NUM_THREADS", "").isdigit():
            import torch

            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        code = run()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def run_script(argv: list[str]) -> int:
    """Run `python -u SCRIPT ARGS` in this process: the script's `__main__` block, sys.path[0] its folder."""
    import runpy

    script, *args = argv
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")
    return 0


def _become_rank(conn: socket.socket, fds: list[int], request: dict, zygote: int) -> None:
    """A rank: as `python -u SCRIPT ARGS` would run, killed with the zygote."""
    become(conn, fds, request, zygote, signal.SIGKILL, lambda: run_script(request["argv"]))


def run_client(name: str, python_args: list[str]) -> bool:
    """In a worker the agent started: have the zygote fork the rank, pass on signals, end as it ended.
    False (nothing started) if the zygote is not there; the caller then execs the script itself."""
    args = python_args[1:] if python_args[:1] == ["-u"] else python_args  # python's flag: the rank is unbuffered
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.connect("\0" + name)
        request = {"argv": args, "env": dict(os.environ), "cwd": os.getcwd()}
        socket.send_fds(sock, [json.dumps(request).encode()], [0, 1, 2])
    except OSError:
        sock.close()
        return False
    reply = json.loads(sock.recv(4096) or b"{}")
    pid = reply.get("pid")
    if pid is None:
        return False
    for sig in FORWARDED:
        signal.signal(sig, lambda signum, _frame: _forward(pid, signum))
    while True:
        try:
            message = sock.recv(4096)
        except InterruptedError:
            continue
        break
    sock.close()
    code = json.loads(message).get("exit", 1) if message else 1
    sys.stdout.flush()
    if code < 0:  # killed by a signal: be killed by the same one, so the agent reports that signal
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # those two cannot be caught, nor need resetting
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code if code >= 0 else 128 - code)


def _forward(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass
