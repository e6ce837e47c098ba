"""Process-group set-up and teardown: backend `auto`, device placement, threads and determinism.

Taught in notebooks/00_preflight.ipynb. `auto` picks NCCL only when every rank on this node can have a GPU
of its own (NCCL refuses two ranks on one GPU); otherwise gloo, which also carries CUDA tensors, so two
ranks can share one GPU for the CUDA code paths.
"""

from __future__ import annotations

import datetime
import faulthandler
import os
import signal
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

from lab_utils.core import ordered_reduce, speed
from lab_utils.core.config import ConfigError


@dataclass(frozen=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    backend: str | None  # None: a single process, no process group
    device: torch.device
    ordered: bool = False  # grad_reduction=ordered: means over ranks are summed in rank order (chapter 12)
    # wrap=fsdp2 on several ranks: the full weights live on no rank, so reading them is a collective (core/fsdp2.py)
    sharded: bool = False

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def pick_device(requested: str, local_rank: int = 0) -> torch.device:
    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError("device=cuda but torch.cuda.is_available() is False on this machine")
    # More ranks than GPUs: ranks share GPUs round-robin (valid with gloo only; pick_backend checks).
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def pick_backend(requested: str, device: torch.device, local_world_size: int) -> str:
    """`auto` -> nccl iff the ranks run on CUDA and each has its own GPU; else gloo."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    own_gpu_each = device.type == "cuda" and gpus >= local_world_size
    if requested == "auto":
        return "nccl" if own_gpu_each and dist.is_nccl_available() else "gloo"
    if requested == "nccl":
        if device.type != "cuda" or not own_gpu_each:
            raise ConfigError(f"backend=nccl needs one CUDA GPU per rank: {local_world_size} ranks, "
                              f"{gpus} GPU(s) visible, device={device.type}")
        if not dist.is_nccl_available():
            raise ConfigError("backend=nccl but this torch build has no NCCL")
    return requested


def check_launchable(cfg: dict, nproc: int) -> None:
    """The checks the launcher can make before starting anything (so a bad backend fails in ms, not after
    torchrun's start-up)."""
    device = pick_device(cfg["device"])
    check_cuda_keys(cfg, device)
    speed.check(cfg)  # keys that cannot go together (chapter 15's overlap=none)
    if nproc > 1:
        check_sharded_device(cfg, device, pick_backend(cfg["backend"], device, nproc), nproc)


def check_sharded_device(cfg: dict, device: torch.device, backend: str, local_world_size: int) -> None:
    """wrap=fsdp2 with ranks sharing a GPU over gloo: refused. FSDP2's collectives (all-gather, reduce-scatter
    into CUDA tensors) crashed gloo: every rank died of SIGSEGV within 2 s, no Python traceback (one H200,
    torch 2.11, chapter 14 and `bench fsdp2` at 2, 4 and 8 ranks). A named refusal beats a segfault."""
    if cfg.get("wrap") == "fsdp2" and device.type == "cuda" and backend == "gloo":
        gpus = torch.cuda.device_count()
        raise ConfigError(f"wrap=fsdp2 with {local_world_size} ranks sharing {gpus} GPU(s) over gloo: FSDP2's "
                          "collectives on CUDA tensors crash gloo (SIGSEGV, measured on one H200): pass device=cpu, "
                          "or give every rank its own GPU (backend nccl)")


def sharded_run_device(world_size: int) -> str:
    """The `device` key under which wrap=fsdp2 runs at up to `world_size` ranks on this box: cpu where the
    ranks would share a GPU (check_sharded_device), else auto. Every run a comparison pairs must use it, so
    the single run and the emulated references run on the same device as the shards."""
    if torch.cuda.is_available() and torch.cuda.device_count() < world_size:
        return "cpu"
    return "auto"


def check_cuda_keys(cfg: dict, device: torch.device) -> None:
    """Keys that only mean something on a GPU: refused elsewhere, before anything launches."""
    if cfg["tf32"] and device.type != "cuda":
        raise ConfigError(f"tf32=true needs a CUDA device (TF32 is a tensor-core format); device={device.type}")
    if cfg["compile"] and device.type != "cuda":  # on CPU inductor needs a C++ toolchain and minutes of 2 cores
        raise ConfigError(f"compile=true needs a CUDA device (the lab compiles for GPUs only); device={device.type}")


def configure_determinism(cfg: dict, device: torch.device) -> None:
    # The same thread count in every run: a GEMM split over a different number of threads may sum in
    # another order, and then bitwise (tier 3) comparisons fail for reasons that have nothing to do with DDP.
    torch.set_num_threads(cfg["threads"])
    check_cuda_keys(cfg, device)
    speed.check(cfg)
    if device.type == "cuda":
        # TF32 rounds fp32 matmul/conv inputs to a 10-bit mantissa on the tensor cores: repeatable, but other
        # numbers than fp32, so it is a key (off: torch's own default turns it on for cuDNN convolutions).
        speed.set_tf32(cfg["tf32"])  # both of torch's APIs agreeing (core/speed.py)
    if cfg["deterministic"]:
        if device.type == "cuda":
            # cuBLAS needs a fixed workspace to be deterministic; must be set before the first cuBLAS call.
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.backends.cudnn.benchmark = False
        torch.use_deterministic_algorithms(True)


STACK_DUMP_SIGNAL = signal.SIGUSR1  # what the launcher sends a hung rank before stopping it (chapter 09)


def register_stack_dump() -> None:
    """On SIGUSR1, print every thread's Python stack to stderr (the rank's log) and carry on running.

    faulthandler writes from the signal handler itself, in C, without waiting for the GIL: it works while the
    main thread is blocked inside a collective (gloo or NCCL), which is exactly when a stack is wanted. The
    launcher sends the signal to each rank of a hung run just before stopping it (chapter 09); by hand:
    `kill -USR1 PID` (the pid is in runs/NAME/progress/rank{r}.json)."""
    if hasattr(faulthandler, "register"):  # not on Windows
        faulthandler.register(STACK_DUMP_SIGNAL, file=sys.stderr, all_threads=True, chain=False)


def setup(cfg: dict) -> DistEnv:
    """Read torchrun's environment (or its absence), pick device and backend, init the process group."""
    register_stack_dump()  # first: a rank stuck anywhere after this line can show where it waits
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size)))
    device = pick_device(cfg["device"], local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    configure_determinism(cfg, device)
    backend = None
    if world_size > 1:  # DDP: torchrun started world_size processes; join their process group
        backend = pick_backend(cfg["backend"], device, local_world_size)
        check_sharded_device(cfg, device, backend, local_world_size)  # also when torchrun starts train.py
        dist.init_process_group(
            backend=backend,
            timeout=datetime.timedelta(seconds=cfg["pg_timeout"]),
            # NCCL: bind the group to this rank's GPU up front (eager init, no guessing the device later).
            device_id=device if backend == "nccl" else None,
        )
    return DistEnv(rank, local_rank, world_size, local_world_size, backend, device,
                   ordered=cfg.get("grad_reduction") == "ordered",
                   sharded=world_size > 1 and cfg.get("wrap") == "fsdp2")


def teardown(env: DistEnv) -> None:  # DDP:
    """Leave the process group cleanly: every rank reaches a barrier, then the group is destroyed.

    Destroying the group *here*, while the interpreter is intact, matters: a group left for interpreter
    shutdown is torn down by C++ static destructors in an order nobody controls.
    """
    if env.distributed and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def finish(env: DistEnv) -> None:
    """teardown, then end a distributed process right here, before the caller returns; a single process
    returns as usual.

    Why here and not after the caller returns (measured, torch 2.13 CPU gloo, 4 ranks on the 2-core box, 1
    rank in ~45 launches; py-spy stacks): returning frees the caller's DDP models. A DDP model's Reducer can
    hold the last reference to the gloo process group (destroy_process_group drops only the registry's), so
    the group's C++ destructor runs on the main thread, inside Python's deallocation, with the GIL held, and
    joins gloo's worker threads. One of them was still destroying the finished barrier's work, whose captured
    thread-local state holds a Python object; its decref waits for the GIL. Each waits for the other: the rank
    hangs with every file written, until the launcher's timeout. Ending the process while the models are
    still referenced runs no destructor at all (exit_process: nothing is left to write)."""
    teardown(env)
    if env.distributed:
        exit_process(0)


def all_reduce_mean(value: torch.Tensor, env: DistEnv) -> torch.Tensor:  # DDP:
    """Mean over ranks (SUM then divide, as DDP reduces gradients); identity for one process."""
    if not env.distributed:
        return value
    if env.ordered:  # the same bits as the emulated reference at any world size (ordered_reduce.py)
        return ordered_reduce.ordered_mean(value, env.world_size)
    value = value.clone()
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value / env.world_size


def exit_process(code: int = 0) -> None:
    """End the process without running interpreter finalization, once everything is written and closed.

    Why (measured, torch 2.13 CPU gloo): a 2-rank DDP script aborted at exit in ~1 of 10 launches with
    "terminate called without an active exception" (SIGABRT). The core dump shows a gloo worker thread
    (ProcessGroupGloo::runLoop) destroying a finished AsyncAllreduceWork *after* the main thread entered
    Py_FinalizeEx: the work's captured at::ThreadLocalState holds a Python object, its decref takes the
    GIL, and a thread that takes the GIL during finalization is ended with pthread_exit — a forced unwind
    through a noexcept destructor, hence std::terminate. destroy_process_group does not join those
    threads (they stay alive, measured), so a barrier cannot close the window. Skipping finalization
    can: by the time we get here every collective has completed (teardown's barrier) and every file is
    closed, so there is nothing left for finalization to do but race the gloo threads.
    Set LAB_EXIT=finalize to get the ordinary exit back (and the crash, for the reliability chapter).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    if os.environ.get("LAB_EXIT", "fast") == "finalize":
        sys.exit(code)
    os._exit(code)
