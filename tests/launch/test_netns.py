"""lab_utils/launch/netns.py for real: two namespaces with a data and a management interface each, torn down
whatever happens (an exception, a process left inside, a SIGKILLed owner), and a clear refusal where they cannot
be made. Skips, with the reason, on a box that cannot make namespaces (not root, no `ip`)."""
import os
import subprocess
import sys
import time

import psutil
import pytest

from lab_utils.launch import netns

REASON = netns.unavailable_reason()
needs_netns = pytest.mark.skipif(REASON is not None, reason=f"network namespaces unavailable: {REASON}")

CONNECT = """
import socket, sys, time
t = time.time()
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10).close()
    print("connected")
except OSError as e:
    print(f"{type(e).__name__}: {e.strerror}")
print(round(time.time() - t, 1))
"""
LISTEN = ("import socket\ns = socket.socket(); s.bind(('0.0.0.0', 29399)); s.listen(); print('up', flush=True)\n"
          "while True:\n    s.accept()\n")


def _listing() -> str:
    return "".join(subprocess.run(["ip", *a], capture_output=True, text=True).stdout
                   for a in (["netns", "list"], ["-br", "link"]))


def _connect(host: netns.Host, ip: str, port: int = 29399) -> str:
    return host.run(sys.executable, "-c", CONNECT, ip, str(port), timeout=60).stdout.splitlines()[0]


@pytest.mark.slow
@needs_netns
def test_two_hosts_data_reaches_the_peer_mgmt_does_not_and_all_goes_away():
    with netns.Hosts(2) as hosts:
        names = [h.name for h in hosts]
        for h in hosts:  # each host has lo, data and mgmt with its own addresses
            addr = h.run("ip", "-br", "addr").stdout
            assert f"{h.data_ip}/24" in addr and f"{h.mgmt_ip}/24" in addr, addr
            assert "data" in addr and "mgmt" in addr and "lo " in addr
        assert hosts[0].data_ip != hosts[1].data_ip and hosts[0].mgmt_ip.rsplit(".", 1)[0] == "10.213.2"
        listener = subprocess.Popen([*hosts[1].prefix, sys.executable, "-c", LISTEN], stdout=subprocess.PIPE,
                                    text=True)
        try:
            assert listener.stdout.readline().strip() == "up"
            assert _connect(hosts[0], hosts[1].data_ip) == "connected"  # over the bridge
            # the peer's management address: no host answers on that link
            assert _connect(hosts[0], hosts[1].mgmt_ip).startswith("OSError: No route to host")
            # the box's own namespace gets no address on their links (nothing of the box's network changes)
            root = subprocess.run(["ip", "-br", "addr"], capture_output=True, text=True).stdout
            assert netns.DATA_NET not in root and netns.MGMT_NET not in root, root
            assert route_dev(hosts[0], hosts[1].data_ip) == "data"
            assert route_dev(hosts[0], hosts[1].mgmt_ip) == "mgmt"
        finally:
            listener.kill()
            listener.wait()
        assert all(not pids for pids in hosts.pids().values()), hosts.pids()  # the listener was killed
    assert netns.gone(hosts), _listing()
    assert not any(n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout for n in names)


def route_dev(host: netns.Host, ip: str) -> str:
    line = host.run("ip", "route", "get", ip).stdout
    return line.split(" dev ")[1].split()[0]


@pytest.mark.slow
@needs_netns
def test_teardown_on_an_exception_kills_what_runs_inside():
    """A process left running in a namespace (one that ignores SIGTERM, in a session of its own) is killed, and
    the namespaces go, when the block raises."""
    holder = {}
    with pytest.raises(RuntimeError, match="boom"):
        with netns.Hosts(2) as hosts:
            holder["hosts"] = hosts
            stray = subprocess.Popen([*hosts[1].prefix, sys.executable, "-c",
                                      "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                      "time.sleep(600)"], start_new_session=True)
            deadline = time.time() + 30
            while stray.pid not in hosts[1].pids() and time.time() < deadline:
                time.sleep(0.1)
            assert stray.pid in hosts[1].pids()
            proc = psutil.Process(stray.pid)
            raise RuntimeError("boom")
    # (the teardown reaped it, a child of this process, so Popen.wait could only say 0: ask psutil)
    assert not proc.is_running()
    hosts = holder["hosts"]
    assert hosts.left_at_teardown[hosts[1].name] == [stray.pid]  # what was left, as the teardown found it
    assert netns.gone(hosts), _listing()


@pytest.mark.slow
@needs_netns
def test_a_sigkilled_owner_leaves_nothing_after_the_next_hosts():
    """An owner killed by SIGKILL runs no teardown; the next Hosts() removes what it left (its pid is gone)."""
    code = ("from lab_utils.launch import netns; import time, sys\n"
            "h = netns.Hosts(2).__enter__(); print(h.tag, flush=True); time.sleep(600)")
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    tag = owner.stdout.readline().strip()
    assert tag.startswith("l")
    assert tag in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    owner.kill()
    owner.wait()
    with netns.Hosts(2):
        assert tag not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert tag not in subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout


REFUSE = ("import os, sys\nfrom lab_utils.launch import netns\n"
          "if len(sys.argv) > 1:\n    os.setresuid(65534, 65534, 65534)  # imports done: drop root for good\n"
          "print(netns.unavailable_reason())\n"
          "try:\n    netns.Hosts(2).__enter__()\nexcept netns.NetnsUnavailable as e:\n    print('refused:', e)\n")


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to run the refusal as another user")
def test_refused_clearly_when_not_root():
    # the interpreter lives under /root here, so the child starts as root and drops it before asking
    out = subprocess.run([sys.executable, "-c", REFUSE, "drop"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["not root: `ip netns add` needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN)",
                                       "refused: not root: `ip netns add` needs root (CAP_SYS_ADMIN and "
                                       "CAP_NET_ADMIN)"], out.stdout


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="as non-root the not-root refusal comes first")
def test_refused_clearly_without_ip(tmp_path):
    before = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    out = subprocess.run([sys.executable, "-c", REFUSE], capture_output=True, text=True,
                         env=dict(os.environ, PATH=str(tmp_path)), timeout=120)
    assert out.returncode == 0, out.stderr
    assert "refused: no `ip` command on PATH" in out.stdout, out.stdout
    assert subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout == before


@pytest.mark.slow
def test_lab_netns_off_refuses_before_anything():
    before = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    out = subprocess.run([sys.executable, "-c", REFUSE], capture_output=True, text=True,
                         env=dict(os.environ, LAB_NETNS="off"), timeout=120)
    assert out.stdout.splitlines() == ["LAB_NETNS=off", "refused: LAB_NETNS=off"], out.stdout + out.stderr
    assert subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout == before


def test_bad_host_count_is_refused_before_anything():
    with pytest.raises(ValueError, match="n=1"):
        netns.Hosts(1)
