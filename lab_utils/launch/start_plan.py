"""How a launch starts its processes, decided once and recorded: forked from a zygote (a process that has
already imported torch) or exec'd, and why. Part of the launcher (lab_utils/launch/launcher.py); the process
picture is in docs/design.md ("Life of a run").

Two decisions, both made here and nowhere else:
- the launch's first process (the driver, or the one plain process): forked from this caller's launch zygote
  (launch_zygote.py) or exec'd by the launcher. `plan()`, called once per node by launch().
- its ranks: forked from the driver's rank zygote (zygote.py) or exec'd by torch's agent. `ranks()`, called by
  plan() for the record and by the driver (elastic_driver.main) to act on; both read the same environment.

The result is written to launch.json ("started") and RunResult.started, e.g.
"forked: launch zygote of this process; ranks forked: rank zygote of the driver".

Not decided ahead, because they depend on processes that are not started yet; each falls back to exec, never
to a wrong run, and the first one is recorded too:
- the launch zygote for this environment ended or refused to fork (a second thread at import, as OpenMP's pool):
  launch_zygote.start says so and the launcher execs ("exec: launch zygote ...");
- a worker client cannot reach the rank zygote: it execs the script itself (zygote.run_client).

Import nothing heavy at module level: the driver's worker clients import this module's caller, not torch.
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass

from lab_utils.launch.zygote import ENV as ZYGOTE_ENV  # LAB_ZYGOTE=off: every process exec'd

# A process that launches once (`ddp-lab run`) gains nothing from a launch zygote: its start costs what an exec
# costs, and the process ends before a second launch could use it. launches_once() turns it off for the process.
_launch_zygote_here = True


def launches_once() -> None:
    """This process launches once (the CLI's `run`): exec its launches' first processes, start no launch zygote.
    Kernels, pytest workers and benches launch many times and keep the default (fork from a launch zygote)."""
    global _launch_zygote_here
    _launch_zygote_here = False


@dataclass(frozen=True)
class Start:
    fork: bool
    reason: str  # "forked: ..." or "exec: ..."

    def __str__(self) -> str:
        return self.reason


@dataclass(frozen=True)
class Plan:
    first: Start  # the driver (or the one plain process)
    ranks: Start | None = None  # None: one plain process, no ranks of a driver

    def __str__(self) -> str:
        return str(self.first) + (f"; ranks {self.ranks}" if self.ranks is not None else "")

    def exec_instead(self, why: str) -> Plan:
        """The same plan with the first process exec'd: its zygote declined at start time (`why`)."""
        return Plan(Start(False, f"exec: {why}"), self.ranks)


def _no_fork(script: str, env: dict) -> str | None:
    """Why neither zygote may fork a process of this launch (None: they may): what both zygotes need."""
    from lab_utils.core.runfiles import TRAIN  # here, not at the top: a worker client never imports torch

    if not (sys.platform.startswith("linux") and hasattr(socket, "send_fds") and hasattr(os, "fork")):
        return "exec: not Linux (no fork with file descriptors passed over a socket)"
    if env.get(ZYGOTE_ENV) == "off":
        return "exec: LAB_ZYGOTE=off"
    if env.get("LAB_EXIT", "fast") == "finalize":
        return "exec: LAB_EXIT=finalize (an ordinary interpreter exit cannot be had in a fork)"
    if os.path.realpath(script) != os.path.realpath(TRAIN):
        return "exec: not scripts/train.py (only its top level is known safe to run ahead)"
    return None


def ranks(script: str, env: dict) -> Start:
    """How the driver starts its ranks: forked from its rank zygote, or exec'd by torch's agent."""
    why = _no_fork(script, env)
    return Start(False, why) if why else Start(True, "forked: rank zygote of the driver")


def _first(cmd: list[str], env: dict, script: str, runner: str) -> Start:
    if runner == "torchrun":
        return Start(False, "exec: runner=torchrun (torch's own launcher, as a user runs it)")
    if cmd[:1] != [sys.executable]:
        return Start(False, f"exec: a command prefix ({' '.join(cmd[:3])} ...)")
    why = _no_fork(script, env)
    if why:
        return Start(False, why)
    if not _launch_zygote_here:
        return Start(False, "exec: no launch zygote in this process (it launches once: ddp-lab run)")
    if env.get("OMP_NUM_THREADS") != "1":  # OpenMP would start its pool at import: the zygote would decline
        return Start(False, "exec: OMP_NUM_THREADS is not 1 (a launch zygote would hold a second thread)")
    try:
        import setproctitle  # noqa: F401
    except ImportError:
        return Start(False, "exec: no setproctitle (a forked process could not show its own command line)")
    return Start(True, "forked: launch zygote of this process")


def plan(cmd: list[str], env: dict, script: str, runner: str = "driver", one_process: bool = False) -> Plan:
    """The start decision for one node's command `cmd` (launch_commands builds it) with environment `env`.
    one_process: `cmd` is one plain process (launch_commands.build_command's nproc=1 form), no driver and no ranks."""
    first = _first(cmd, env, script, runner)
    if one_process:
        return Plan(first)
    if runner == "torchrun":
        return Plan(first, Start(False, "exec: torchrun's agent execs each rank"))
    return Plan(first, ranks(script, env))
