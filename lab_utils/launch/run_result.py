"""What a launch comes back with: `RunResult` (status, the failing rank and its traceback, heartbeats, stacks at a
hang, the commands started and the equivalent `torchrun ...` line) and `RunFailed`. Filled in by the launcher
(lab_utils/launch/launcher.py) and its diagnosis (launch_diagnose.classify); used as `launcher.RunResult`.
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from lab_utils.core.runfiles import REPO


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
    failing_node: int | None = None  # a rendezvous that never completed: the node that caused it
    hosts: list[str] = field(default_factory=list)  # the network namespace each node ran in (netns.Hosts)
    # how its processes started, as start_plan decided (and why): "forked: launch zygote of this process; ranks
    # forked: rank zygote of the driver", or "exec: ..." (several nodes that differ: one entry per node)
    started: str = ""

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
