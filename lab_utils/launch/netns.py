"""Real hosts on one box: Linux network namespaces, each with its own addresses and two interfaces.

    with netns.Hosts(2) as hosts:          # needs root and iproute2's `ip`
        hosts[0].data_ip, hosts[1].data_ip  # 10.213.1.1, 10.213.1.2
        launcher.launch(launcher.request("x", 1, keys, nnodes=2, hosts=hosts))   # a node agent in each namespace

Each host is a namespace `l<pid><k>h<i>` with
- `lo` (up), as on any host;
- `data` (10.213.1.i/24): a veth whose other end is a port of one bridge in the root namespace, so the hosts'
  data interfaces reach each other, as hosts on one switch;
- `mgmt` (10.213.2.i/24): a veth whose other end is alone in the root namespace (up, no address, no bridge):
  a management link that reaches no other host. A connection to a peer's mgmt address gets no ARP reply and
  fails with "No route to host" (measured: 3.1 s), the wrong-NIC case of chapter 09.
The root namespace gets no address and no route, so nothing here can reach or disturb the box's own network.

Teardown, whatever happens (an exception, Ctrl-C, SIGTERM/SIGHUP to this process): every process still in a
namespace is SIGKILLed, then the namespaces (and with them the veths) and the bridge are deleted. Names carry
this process's pid, so a later Hosts() also removes what a SIGKILLed one left (its pid is gone).
Where namespaces cannot be made (not Linux, not root, no `ip`, a kernel or sandbox without netns; or
LAB_NETNS=off, for a box where nothing should touch the network setup), Hosts()
raises NetnsUnavailable with the reason, before creating anything; `unavailable_reason()` says it without raising.
Chapter 09 and tests/launch/test_netns.py use it; scripts/two_hosts.sh is the same from a shell.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import psutil

DATA_IF, MGMT_IF = "data", "mgmt"  # the interface names inside every host, as eth0/eth1 on real hosts
DATA_NET, MGMT_NET = "10.213.1", "10.213.2"  # /24s; host i gets .i (only inside the namespaces)
FIRST_PORT = 29400  # a fresh namespace has nothing listening: each rendezvous of a Hosts gets the next port
_NAME = re.compile(r"^l(\d+)([a-z])(?:h\d+|d\d+|m\d+|br)$")  # every name a Hosts makes
_counter = itertools.count()
_lock = threading.Lock()


class NetnsUnavailable(RuntimeError):
    """Namespaces cannot be made on this box; the message says why."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed: {proc.stderr.strip() or proc.returncode}")
    return proc


def unavailable_reason() -> str | None:
    """Why network namespaces cannot be made here, or None when they can (a real probe: one is added and
    deleted, because root and `ip` are not enough in some containers)."""
    if os.environ.get("LAB_NETNS", "auto") == "off":  # a box where nothing should touch the network setup
        return "LAB_NETNS=off"
    if not sys.platform.startswith("linux"):
        return f"network namespaces are Linux only (this is {sys.platform})"
    if os.geteuid() != 0:
        return "not root: `ip netns add` needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN)"
    if shutil.which("ip") is None:
        return "no `ip` command on PATH (Debian/Ubuntu: apt-get install iproute2)"
    probe = f"l{os.getpid()}zprobe"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed here: {made.stderr.strip() or made.returncode}"
    _ip("netns", "del", probe, check=False)
    return None


def _pid_alive(pid: int) -> bool:
    return psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE


def netns_pids(name: str) -> list[int]:
    """The processes running in namespace `name` (`ip netns pids`); [] once it is gone."""
    out = _ip("netns", "pids", name, check=False)
    return [int(p) for p in out.stdout.split()] if out.returncode == 0 else []


def _kill_all(names: list[str], within: float = 10) -> None:
    """SIGKILL every process in these namespaces until none is left (a dying agent may still fork once)."""
    deadline = time.time() + within
    while True:
        pids = [p for n in names for p in netns_pids(n) if p != os.getpid()]
        if not pids or time.time() > deadline:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        psutil.wait_procs([psutil.Process(p) for p in pids if psutil.pid_exists(p)], timeout=2)


def remove_stale() -> list[str]:
    """Delete namespaces and links a Hosts made in a process that is gone (killed before its teardown)."""
    removed = []
    spaces = [line.split()[0] for line in _ip("netns", "list", check=False).stdout.splitlines() if line.strip()]
    links = [line.split()[0].split("@")[0] for line in _ip("-br", "link", check=False).stdout.splitlines()
             if line.strip()]
    for kind, names in (("netns", spaces), ("link", links)):
        for name in names:
            m = _NAME.match(name)
            if m and not _pid_alive(int(m.group(1))):
                if kind == "netns":
                    _kill_all([name])
                _ip(kind, "del", name, check=False)
                removed.append(name)
    return removed


@dataclass
class Host:
    """One host: its namespace, its two addresses, and how to run a command on it."""
    index: int  # 0-based; its addresses end in index + 1
    name: str  # the namespace
    data_ip: str
    mgmt_ip: str

    @property
    def prefix(self) -> list[str]:
        """Put before a command to run it on this host: `ip netns exec NAME`."""
        return ["ip", "netns", "exec", self.name]

    def run(self, *cmd: str, timeout: float = 30) -> subprocess.CompletedProcess:
        """Run a short command on this host and return it (text output)."""
        return subprocess.run([*self.prefix, *cmd], capture_output=True, text=True, timeout=timeout)

    def pids(self) -> list[int]:
        return netns_pids(self.name)


class Hosts:
    """`n` hosts (namespaces) joined by a data bridge, each also with a management link that reaches no peer.
    A context manager: made on enter (or NetnsUnavailable), torn down on exit whatever happened."""

    def __init__(self, n: int = 2):
        if not isinstance(n, int) or not 2 <= n <= 200:
            raise ValueError(f"n={n!r}: the number of hosts must be an integer in 2..200")
        with _lock:
            k = next(_counter)
        self.tag = f"l{os.getpid()}{chr(ord('a') + k % 25)}"  # 'z' is the probe's
        self.n = n
        self.bridge = f"{self.tag}br"
        self.hosts = [Host(i, f"{self.tag}h{i + 1}", f"{DATA_NET}.{i + 1}", f"{MGMT_NET}.{i + 1}") for i in range(n)]
        self._ports = itertools.count(FIRST_PORT)
        self._previous: dict[int, object] = {}
        self.up = False
        self.left_at_teardown: dict[str, list[int]] = {}

    def __getitem__(self, i: int) -> Host:
        return self.hosts[i]

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return iter(self.hosts)

    def next_port(self) -> int:
        """A port for the next rendezvous on host 0 (a fresh namespace: nothing else listens there)."""
        return next(self._ports)

    def pids(self) -> dict[str, list[int]]:
        """{namespace: the processes in it now}."""
        return {h.name: h.pids() for h in self.hosts}

    def _make(self) -> None:
        _ip("link", "add", "name", self.bridge, "type", "bridge")
        _ip("link", "set", self.bridge, "up")
        for h in self.hosts:
            i = h.index + 1
            _ip("netns", "add", h.name)
            _ip("-n", h.name, "link", "set", "lo", "up")
            for ifname, root_end, ip in ((DATA_IF, f"{self.tag}d{i}", h.data_ip),
                                         (MGMT_IF, f"{self.tag}m{i}", h.mgmt_ip)):
                _ip("link", "add", root_end, "type", "veth", "peer", "name", ifname, "netns", h.name)
                if ifname == DATA_IF:
                    _ip("link", "set", root_end, "master", self.bridge)
                _ip("link", "set", root_end, "up")
                _ip("-n", h.name, "addr", "add", f"{ip}/24", "dev", ifname)
                _ip("-n", h.name, "link", "set", ifname, "up")

    def teardown(self) -> dict[str, list[int]]:
        """Kill what runs in the namespaces, delete them and the bridge. Returns {namespace: pids found in it
        before the kill} (what a launcher's own clean-up left; [] each when it left nothing)."""
        names = [h.name for h in self.hosts]
        self.left_at_teardown = {n: netns_pids(n) for n in names}
        _kill_all(names)
        # The root ends first: deleting one end deletes its veth pair at once, while a deleted namespace lives on
        # (with its veths) until its last socket closes (a connection in TIME_WAIT keeps it for a while).
        for h in self.hosts:
            for end in (f"{self.tag}d{h.index + 1}", f"{self.tag}m{h.index + 1}"):
                _ip("link", "del", end, check=False)
        _ip("link", "del", self.bridge, check=False)
        for name in names:
            _ip("netns", "del", name, check=False)
        self.up = False
        return self.left_at_teardown

    def _raise_on_stop_signal(self, signum, frame):
        raise SystemExit(128 + signum)  # unwinds through __exit__, so the namespaces go too

    def __enter__(self) -> Hosts:
        reason = unavailable_reason()
        if reason:
            raise NetnsUnavailable(reason)
        remove_stale()
        try:
            self._make()
        except BaseException:
            self.teardown()
            raise
        self.up = True
        if threading.current_thread() is threading.main_thread():  # Python's rule for signal handlers
            for sig in (signal.SIGTERM, signal.SIGHUP):
                if signal.getsignal(sig) is signal.SIG_DFL:  # never replace someone else's handler
                    self._previous[sig] = signal.signal(sig, self._raise_on_stop_signal)
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.teardown()
        finally:
            for sig, old in self._previous.items():
                signal.signal(sig, old)
            self._previous.clear()


def gone(hosts: Hosts) -> bool:
    """True when none of the hosts' namespaces, veths or bridge exists any more."""
    spaces = [line.split()[0] for line in _ip("netns", "list", check=False).stdout.splitlines() if line.strip()]
    links = [line.split()[0].split("@")[0] for line in _ip("-br", "link", check=False).stdout.splitlines()
             if line.strip()]
    return not any((m := _NAME.match(name)) and f"l{m.group(1)}{m.group(2)}" == hosts.tag for name in spaces + links)


def owners() -> dict[int, list[str]]:
    """{pid of the process that made them: the namespaces it holds}, for every Hosts namespace on this box."""
    out: dict[int, list[str]] = {}
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        m = _NAME.match(line.split()[0]) if line.strip() else None
        if m:
            out.setdefault(int(m.group(1)), []).append(line.split()[0])
    return out


def main(argv: list[str] | None = None) -> int:
    """`python -m lab_utils.launch.netns up [N] | down | status` (scripts/two_hosts.sh)."""
    import argparse

    p = argparse.ArgumentParser(prog="scripts/two_hosts.sh", description="N hosts on this box (network namespaces)")
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="make the hosts and hold them until Ctrl-C or SIGTERM (then remove them)")
    up.add_argument("n", nargs="?", type=int, default=2)
    sub.add_parser("down", help="stop every `up` holder (SIGTERM) and remove what is left")
    sub.add_parser("status", help="list the lab hosts on this box and the processes in each")
    args = p.parse_args(argv)
    if args.cmd == "status":
        for pid, names in sorted(owners().items()):
            state = "alive" if _pid_alive(pid) else "gone (stale: `down` removes them)"
            print(f"holder pid {pid} ({state}): " + ", ".join(f"{n} [{len(netns_pids(n))} processes]" for n in names))
        return 0
    if args.cmd == "down":
        for pid in [p for p in owners() if p != os.getpid() and _pid_alive(p)]:
            cmdline = " ".join(psutil.Process(pid).cmdline())
            if "lab_utils.launch.netns" not in cmdline:  # a chapter or a test holds them: it removes its own
                print(f"pid {pid} holds hosts and is not `up` ({cmdline[:80]}): not touched")
                continue
            os.kill(pid, signal.SIGTERM)  # its own teardown runs (Hosts turns SIGTERM into an exit)
            try:
                psutil.Process(pid).wait(timeout=30)
            except (psutil.NoSuchProcess, psutil.TimeoutExpired):
                pass
        print("removed:", " ".join(remove_stale()) or "nothing left to remove")
        return 0
    try:
        with Hosts(args.n) as hosts:
            for h in hosts:
                print(f"{h.name}: {DATA_IF} {h.data_ip}/24, {MGMT_IF} {h.mgmt_ip}/24   run there: "
                      f"ip netns exec {h.name} COMMAND")
            print(f"holding them (pid {os.getpid()}); Ctrl-C, SIGTERM or `scripts/two_hosts.sh down` removes them",
                  flush=True)
            signal.signal(signal.SIGINT, hosts._raise_on_stop_signal)
            while True:
                time.sleep(3600)
    except NetnsUnavailable as e:
        print(f"cannot make hosts here: {e}", file=sys.stderr)
        return 2
    except SystemExit:
        print("hosts removed")
        return 0


if __name__ == "__main__":
    sys.exit(main())
