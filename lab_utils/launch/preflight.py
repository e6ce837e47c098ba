"""`ddp-lab preflight`: can this box run the series? Taught in notebooks/00_preflight.ipynb."""

from __future__ import annotations

import json
import os
import platform

import torch
import torch.distributed as dist

from lab_utils.core import distenv, runfiles
from lab_utils.launch import launcher

ENV_PREFIXES = ("NCCL_", "TORCH_", "OMP_", "MASTER_", "CUDA_VISIBLE", "GLOO_")


def facts(nproc: int = 2) -> dict:
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    device = distenv.pick_device("auto")
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_build": torch.version.cuda,
        "gpus": [torch.cuda.get_device_name(i) for i in range(gpus)],
        "backends": {"gloo": dist.is_gloo_available(), "nccl": dist.is_nccl_available(),
                     "mpi": dist.is_mpi_available()},
        "cpu_cores": os.cpu_count(),
        "device": str(device),
        "backend_auto": distenv.pick_backend("auto", device, nproc),
        # A torch without compiled bytecode makes every rank compile it from source (~6 s a process on the
        # two-H200 box): launcher.bytecode_cache says where the ranks keep theirs then.
        "bytecode": (f"torch has none compiled; ranks cache theirs in {cache}" if (cache := launcher.bytecode_cache())
                     else "torch's own (or PYTHONPYCACHEPREFIX / LAB_BYTECODE_CACHE=off)"),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
    }


def run(nproc: int = 2, timeout: float = 120, progress: bool = False) -> tuple[bool, dict]:
    """Print the facts, then launch a real `nproc`-rank all-reduce through the launcher."""
    info = facts(nproc)
    for key, value in info.items():
        print(f"{key:>13}: {value}")
    result = launcher.launch("preflight", nproc, ["steps=1"], timeout=timeout, progress=progress,
                             script=launcher.REPO / "scripts" / "probes" / "preflight_worker.py")
    info["launch"] = {"status": result.status, "seconds": round(result.seconds, 2)}
    ok = result.ok
    if ok:
        report = json.loads((result.run_dir / "preflight.json").read_text())
        info["allreduce"] = report
        ok = report["ok"] and report["world_size"] == nproc
        pids = sorted({r["pid"] for r in report["ranks"]})
        print(f"    allreduce: {nproc} ranks, backend {report['backend']}, distinct pids {pids}, "
              f"{'OK' if report['ok'] else 'WRONG SUM'} ({result.seconds:.1f} s)")
    else:
        print(str(result))
    print("preflight:", "OK — this box can run the series" if ok else "FAILED")
    return ok, info


def gpu_processes_during(start_run, poll: float = 0.25) -> dict:
    """The article's second check (§6.3): which processes `nvidia-smi` lists while a run is going.

    `start_run()` launches the run (blocking; it is run in a thread while this polls). Returns
    {"checked": False} where there is no nvidia-smi, else {"checked": True, "result": RunResult,
    "seen": {pid: MiB}} with every compute process nvidia-smi listed at any poll. In a container nvidia-smi
    often shows host pids or none at all, so compare the *count* with the number of ranks, and say so."""
    import shutil
    import subprocess
    import threading

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {"checked": False}
    box: dict = {}
    thread = threading.Thread(target=lambda: box.setdefault("result", start_run()), daemon=True)
    seen: dict[int, int] = {}
    thread.start()
    while thread.is_alive():
        query = subprocess.run([smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True, timeout=30)
        for line in query.stdout.splitlines():
            pid, _, mem = line.partition(",")
            if pid.strip().isdigit():
                seen[int(pid)] = max(seen.get(int(pid), 0), int(mem.strip() or 0))
        thread.join(poll)
    return {"checked": True, "result": box.get("result"), "seen": seen}


NCCL_LOG = runfiles.REPO / "docs" / "measured" / "h200x2" / "nccl_debug_p2p.log"


def nccl_init_lines(text: str) -> list[str]:
    """The NCCL_DEBUG=INFO lines that prove a NCCL communicator formed: version and each rank's init."""
    keys = ("NCCL version", "Init COMPLETE")
    return [line.strip() for line in text.splitlines() if "NCCL INFO" in line and any(k in line for k in keys)]
