"""What one launch needs, as one value: `LaunchRequest`, which launcher.launch(request) runs and
launcher.launch_many({key: request}) runs several of at once. Part of the launcher (lab_utils/launch/launcher.py).

Every run has a name, ranks per node, its key=value overrides and a timeout; the rarer options sit in four
groups so a reader sees what belongs together: `Topology` (where the ranks run and how they meet), `Supervision`
(when the launcher calls a hang or stops the other nodes), `Environment` (what is started, with which variables,
into which folder) and `Output` (what the caller sees while it runs).

A request checks its own values when it is made (`validate`, from __post_init__), so a bad one raises ConfigError
naming the key and value before anything is written or started. The training keys themselves are checked by the
launcher (config.resolve with the world size, the device), as before any start.

    launcher.launch(request("hang", 2, FAST + ["fault=hang"], timeout=300, progress=False, stall_timeout=20))
"""

from __future__ import annotations

import dataclasses
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab_utils.core import config as config_mod
from lab_utils.core.runfiles import TRAIN


@dataclass(frozen=True)
class Topology:
    """Where the ranks run and how they meet. nnodes > 1: that many nodes simulated on this box (a node agent each,
    c10d rendezvous on 127.0.0.1), or on `hosts` (a netns.Hosts: node k in hosts[k], chapter 09's two real hosts).
    endpoints (nnodes > 1): per node, a rendezvous HOST:PORT to give it instead of the right one (None: the right
    one), to show what a wrong address does. rdzv_conf: torchrun's --rdzv-conf for every node (join_timeout,
    read_timeout). master_port: the article's fixed `--master-addr 127.0.0.1 --master-port PORT` instead of
    `--standalone` (one node only)."""

    nnodes: int = 1
    hosts: Any = None
    endpoints: list[str | None] | None = None
    rdzv_conf: dict | None = None
    master_port: int | None = None


@dataclass(frozen=True)
class Supervision:
    """When the launcher calls a hang, and how long it lets the others run once one node failed.
    stall_timeout: also a hang when no rank has written a heartbeat for that many seconds (after the first one).
    peer_grace: seconds the other nodes get once one node has failed (None: supervise.PEER_GRACE).
    hold (a threading.Event): with stall_timeout, no hang is called before the event is set, and the stall counts
    from then (chapter 09's hang keeps its port until the clashing job has tried it); the timeout still applies."""

    stall_timeout: float | None = None
    peer_grace: float | None = None
    hold: threading.Event | None = None


@dataclass(frozen=True)
class Environment:
    """What is started, with which variables, into which folder. script: what the ranks run (scripts/train.py or a
    probe). runner="torchrun": the equivalent `torchrun ...` line itself instead of the elastic driver. extra_env:
    added to the ranks' environment (a value None removes that variable). runs_dir: where runs/NAME goes (None:
    runfiles.runs_dir()). max_restarts: torchrun's elastic restart of every rank after a failure (chapter 12)."""

    script: Path = TRAIN
    runner: str = "driver"
    extra_env: dict | None = None
    runs_dir: Path | None = None
    max_restarts: int = 0


@dataclass(frozen=True)
class Output:
    """What the caller sees while the run runs: a progress bar (one line per run in a log), and the run's own
    output echoed."""

    progress: bool = True
    echo: bool = False


GROUPS = {"topology": Topology, "supervision": Supervision, "environment": Environment, "output": Output}
# every option's group, by the option's name: what request() sorts keywords by
OPTION_GROUP = {f.name: group for group, cls in GROUPS.items() for f in dataclasses.fields(cls)}


@dataclass(frozen=True)
class LaunchRequest:
    """One launch: run `name` (runs/NAME) with `nproc` processes per node, the training keys `overrides`
    (["key=value", ...] or {key: value}), stopped and diagnosed after `timeout` seconds; the rarer options in
    their groups. Checked when made: a bad value raises ConfigError before anything starts."""

    name: str
    nproc: int = 1
    overrides: list[str] | dict | None = None
    timeout: float = 600
    topology: Topology = field(default_factory=Topology)
    supervision: Supervision = field(default_factory=Supervision)
    environment: Environment = field(default_factory=Environment)
    output: Output = field(default_factory=Output)

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """ConfigError naming the first bad value. The order is the launcher's of old, so a request with two bad
        values names the same one launch() named."""
        env, sup, topo = self.environment, self.supervision, self.topology
        if env.runner not in ("driver", "torchrun"):
            raise config_mod.ConfigError(f"runner={env.runner!r} must be 'driver' or 'torchrun'")
        if sup.peer_grace is not None and not sup.peer_grace >= 0:
            raise config_mod.ConfigError(f"peer_grace={sup.peer_grace!r} must be >= 0 seconds")
        if sup.stall_timeout is not None and not sup.stall_timeout > 0:
            raise config_mod.ConfigError(f"stall_timeout={sup.stall_timeout!r} must be > 0 seconds")
        if topo.master_port is not None and (topo.nnodes > 1 or not 0 < int(topo.master_port) < 65536):
            raise config_mod.ConfigError(f"master_port={topo.master_port!r}: one node only, a port in 1..65535")
        _check_hosts(topo.nnodes, topo.hosts, topo.endpoints, topo.rdzv_conf)
        if not isinstance(self.nproc, int) or self.nproc < 1:
            raise config_mod.ConfigError(f"nproc={self.nproc!r} must be a positive integer")
        if not isinstance(topo.nnodes, int) or topo.nnodes < 1:
            raise config_mod.ConfigError(f"nnodes={topo.nnodes!r} must be a positive integer")
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", self.name or ""):
            raise config_mod.ConfigError(f"--name {self.name!r}: use letters, digits, '.', '_' and '-'")
        if self.timeout is None or self.timeout <= 0:
            raise config_mod.ConfigError(f"timeout={self.timeout!r} must be > 0 seconds")

    @property
    def world_size(self) -> int:
        """nproc per node x nodes."""
        return self.nproc * self.topology.nnodes

    def quiet(self) -> LaunchRequest:
        """This request without a progress bar (launch_many's runs: overlapping bars would garble each other)."""
        return dataclasses.replace(self, output=dataclasses.replace(self.output, progress=False))


def _check_hosts(nnodes: int, hosts, endpoints, rdzv_conf) -> None:
    if (hosts is not None or endpoints is not None) and nnodes < 2:
        raise config_mod.ConfigError("hosts= and endpoints= are for nnodes >= 2")
    if hosts is not None and len(hosts) < nnodes:
        raise config_mod.ConfigError(f"hosts: {len(hosts)} host(s) for nnodes={nnodes}")
    if endpoints is not None and (len(endpoints) != nnodes or
                                  not all(e is None or re.fullmatch(r"[\w.:-]+:\d+", e) for e in endpoints)):
        raise config_mod.ConfigError(f"endpoints={endpoints!r}: one HOST:PORT (or None) per node, {nnodes} in all")
    if rdzv_conf is not None and not all(re.fullmatch(r"\w+", str(k)) and re.fullmatch(r"[\w.]+", str(v))
                                         for k, v in rdzv_conf.items()):
        raise config_mod.ConfigError(f"rdzv_conf={rdzv_conf!r}: KEY=VALUE pairs of words (join_timeout=20)")


def request(name: str, nproc: int = 1, overrides: list[str] | dict | None = None, timeout: float = 600,
            **options) -> LaunchRequest:
    """A LaunchRequest with its options given by name and sorted into their groups, so a call site stays one line:
    `request("x", 2, keys, timeout=300, progress=False, script=PROBE)`. An option no group has is a TypeError,
    as an unknown keyword argument is."""
    unknown = sorted(set(options) - set(OPTION_GROUP))
    if unknown:
        raise TypeError(f"request() got unknown launch option(s) {', '.join(unknown)} "
                        f"(the options: {', '.join(OPTION_GROUP)})")
    grouped: dict[str, dict] = {group: {} for group in GROUPS}
    for option, value in options.items():
        grouped[OPTION_GROUP[option]][option] = value
    return LaunchRequest(name, nproc, overrides, timeout,
                         **{group: GROUPS[group](**values) for group, values in grouped.items()})


def requests_from_specs(specs: dict, **common) -> dict[Any, LaunchRequest]:
    """{key: LaunchRequest} from the tuples chapters and benches describe their runs in: {key: (run name, nproc,
    keys[, {option: value}])}. `common`: options for every run (timeout among them); a spec's own options win."""
    out = {}
    for key, (name, nproc, keys, *own) in specs.items():
        options = {**common, **(own[0] if own else {})}
        out[key] = request(name, nproc, keys, **options)
    return out
