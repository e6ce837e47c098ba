"""`ddp-lab preflight`: can this box run the series? Taught in notebooks/00_preflight.ipynb."""

from __future__ import annotations

import json
import os
import platform

import torch
import torch.distributed as dist

from . import distenv, launcher

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
