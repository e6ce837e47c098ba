"""What a launch starts, and with which environment: the driver and `torchrun` command lines (standalone, a
simulated node, a fixed master port), each simulated node's GPUs, and the ranks' environment (threads, bytecode
cache, error file). Pure builders: nothing here starts a process. Part of the launcher (lab_utils/launch/launcher.py).

Taught in notebooks/09_launching.ipynb (torchrun's arguments, fixed port vs standalone, two nodes on one box).
"""

from __future__ import annotations

import importlib.util
import os
import random
import socket
import sys
from pathlib import Path

from lab_utils.core import config as config_mod
from lab_utils.core import distenv
from lab_utils.core.runfiles import TRAIN
from lab_utils.launch import elastic_driver

TORCHRUN = Path(sys.executable).with_name("torchrun")  # the venv's own torchrun (runner="torchrun")


def build_command(nproc: int, argv: list[str], run_dir: Path, script: Path = TRAIN,
                  max_restarts: int = 0) -> tuple[list[str], list[str]]:
    """(what we start, the equivalent command a user would type). Both die with this process.
    max_restarts > 0: torchrun's elastic restart (every rank re-launched after a failure; chapter 12)."""
    parent = str(os.getpid())
    restarts = [f"--max-restarts={max_restarts}"] if max_restarts else []
    if nproc == 1 and not max_restarts:
        return ([sys.executable, "-m", "lab_utils.launch.elastic_driver", "--exec", parent, str(script), *argv],
                [sys.executable, str(script), *argv])
    started = [sys.executable, "-m", "lab_utils.launch.elastic_driver", f"--nproc-per-node={nproc}",
               f"--run-dir={run_dir}", f"--parent-pid={parent}", *restarts, str(script), *argv]
    torchrun = ["torchrun", "--standalone", f"--nproc-per-node={nproc}", *restarts, f"--log-dir={run_dir / 'logs'}",
                "--redirects=3", "--tee=3", str(script), *argv]
    return started, torchrun


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now, for the rendezvous of simulated nodes, which must all be told the
    same port before any of them starts. Taken below the kernel's ephemeral range where it can: a port the OS
    hands out for port 0 is also the one it hands the next outgoing connection (gloo opens many), which can take
    it in the second before torchrun binds it (seen once in CI: both agents failed to reach the store)."""
    low = _ephemeral_low()
    for _ in range(64):
        port = random.randrange(20000, low) if low > 21000 else 0
        if 29000 <= port < 30000:
            continue  # torch's defaults (29400 for c10d, 29500 for MASTER_PORT) live here: a test clashes on them
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux; 0 where it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def node_command(nnodes: int, node_rank: int, nproc: int, endpoint: str, rdzv_id: str, argv: list[str],
                 run_dir: Path, script: Path = TRAIN, max_restarts: int = 0, local_addr: str | None = None,
                 rdzv_conf: dict | None = None, prefix: list[str] | None = None) -> tuple[list[str], list[str]]:
    """(what we start, the equivalent torchrun line) for node `node_rank` of `nnodes`, c10d rendezvous at
    `endpoint` (HOST:PORT of the first node) with id `rdzv_id`. Every node runs the same line but for
    --node-rank; with c10d the ranks are handed out by the rendezvous, so --node-rank only names the node
    (it matters to the static rendezvous alone). docs/multinode.md shows this line (tests check it runs).

    On hosts whose name does not resolve to the address the others reach them on (a second NIC, or the
    network namespaces of chapter 09, where the name resolves to 127.0.0.1): `local_addr` (torchrun's
    --local-addr: the address this node's agent publishes, and MASTER_ADDR when it gets rank 0) and, on the
    first host, rdzv_conf={"is_host": 1} (torch's own check matches the endpoint against the hostname's
    addresses only, so without it no agent opens the store and all wait until read_timeout). `prefix`: put
    before what we start (`ip netns exec HOST`); the torchrun line is what that host itself would run."""
    restarts = [f"--max-restarts={max_restarts}"] if max_restarts else []
    log_dir, _ = elastic_driver.node_files(run_dir, nnodes, node_rank)
    rdzv = [f"--nnodes={nnodes}", f"--node-rank={node_rank}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint}", f"--rdzv-id={rdzv_id}"]
    if rdzv_conf:
        rdzv.append("--rdzv-conf=" + ",".join(f"{k}={v}" for k, v in rdzv_conf.items()))
    if local_addr:
        rdzv.append(f"--local-addr={local_addr}")
    started = [*(prefix or []), sys.executable, "-m", "lab_utils.launch.elastic_driver", f"--nproc-per-node={nproc}",
               *rdzv, f"--run-dir={run_dir}", f"--parent-pid={os.getpid()}", *restarts, str(script), *argv]
    torchrun = ["torchrun", f"--nproc-per-node={nproc}", *rdzv, *restarts, f"--log-dir={log_dir}",
                "--redirects=3", "--tee=3", str(script), *argv]
    return started, torchrun


def master_port_command(nproc: int, port: int, argv: list[str], run_dir: Path, script: Path = TRAIN
                        ) -> tuple[list[str], list[str]]:
    """The article's §6.1 form: a fixed `--master-addr 127.0.0.1 --master-port PORT` (torchrun's static
    rendezvous; node 0 listens on PORT). Two such jobs with one PORT on a box clash (chapter 09)."""
    rdzv = ["--nnodes=1", "--node-rank=0", "--master-addr=127.0.0.1", f"--master-port={port}"]
    started = [sys.executable, "-m", "lab_utils.launch.elastic_driver", f"--nproc-per-node={nproc}",
               "--rdzv-backend=static", f"--rdzv-endpoint=127.0.0.1:{port}", f"--run-dir={run_dir}",
               f"--parent-pid={os.getpid()}", str(script), *argv]
    torchrun = ["torchrun", f"--nproc-per-node={nproc}", *rdzv, f"--log-dir={run_dir / 'logs'}",
                "--redirects=3", "--tee=3", str(script), *argv]
    return started, torchrun


def as_torchrun(equivalent: list[str]) -> list[str]:
    """runner="torchrun": start the equivalent line itself, with this venv's torchrun."""
    return [str(TORCHRUN), *equivalent[1:]] if equivalent[:1] == ["torchrun"] else equivalent


def node_gpus(cfg: dict, nproc: int, nnodes: int) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES for each simulated node: node k sees GPUs k*nproc..(k+1)*nproc-1, as a host of its
    own would see its GPUs. None: leave it (CPU runs, or gloo ranks sharing GPUs). Raises ConfigError when
    the simulated nodes would share a GPU under NCCL."""
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


def environment(cfg: dict, log_dir: Path, nproc: int, extra_env: dict | None, max_restarts: int = 0) -> dict:
    """The environment every process of the run starts with (nproc: the world size; 1 means one plain
    process, whose error file we place, as the agent does for each rank)."""
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
        # fail with "connectFullMesh ... Connection refused" (pytorch#135712, pytorch#167288; seen once here, in a
        # trial that kept no log). A store per round avoids it.
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    if nproc == 1:
        env["TORCHELASTIC_ERROR_FILE"] = str(log_dir / "0" / "error.json")  # @record writes the traceback there
    else:
        env.pop("TORCHELASTIC_ERROR_FILE", None)  # the agent sets one per rank
    env.update(extra_env or {})
    for key in [k for k, v in env.items() if v is None]:  # extra_env={"X": None} unsets X (chapter 09: OMP)
        del env[key]
    return env
