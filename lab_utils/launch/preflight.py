"""`ddp-lab preflight`: can this box run the series? Taught in notebooks/00_preflight.ipynb; the GPU lines
(compute capability, native bf16, the link between GPUs, the P2P probe) in notebooks/11_mixed_precision.ipynb.

The decisions are pure functions of what the box reports (`bf16_line`, `gpu_link`, `p2p_skip_reason`), so
tests/launch/test_preflight_gating.py checks them for boxes this one is not (a T4, two T4s on PCIe, one GPU)."""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess

import torch
import torch.distributed as dist

from lab_utils.core import config, distenv, runfiles
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
        **gpu_facts(gpus),
    }


def capability_text(capability: tuple[int, int]) -> str:
    return f"{capability[0]}.{capability[1]}"


def bf16_line(capabilities: list[tuple[int, int]], torch_says: bool | None) -> str:
    """What amp=bf16 does on GPUs of these capabilities. `torch_says`: torch.cuda.is_bf16_supported(), which
    counts emulation (a T4, 7.5, says True), so it is reported beside the decision, never used for it."""
    if not capabilities:
        return "no GPU: bf16 autocast runs on the CPU (slow kernels, the lab's CPU tests use it)"
    refusal = config.bf16_refusal(capabilities)
    if refusal is None:
        return f"native (capability {', '.join(sorted({capability_text(c) for c in capabilities}))})"
    said = "" if torch_says is None else f"; torch.cuda.is_bf16_supported() says {torch_says}" + (
        " (emulation)" if torch_says else "")
    return f"not native{said}: amp=bf16 is refused, use amp=fp16 — {refusal}"


_LINKS = {"PIX": "PCIe, one switch", "PXB": "PCIe, several switches", "PHB": "PCIe through the CPU's host bridge",
          "NODE": "PCIe across host bridges in one NUMA node", "SYS": "PCIe across NUMA nodes (SMP interconnect)"}


def gpu_link(topo: str | None, gpus: int) -> str:
    """The link between the GPUs from `nvidia-smi topo -m`'s matrix (NV# = NVLink; PIX/PXB/PHB/NODE/SYS = PCIe)."""
    if gpus < 2:
        return f"{gpus} GPU(s): no link between GPUs to report"
    if not topo:
        return "unknown (no `nvidia-smi topo -m` on this box)"
    text = re.sub(r"\x1b\[[0-9;]*m", "", topo)
    lines = [ln.split() for ln in text.splitlines() if ln.strip()]
    header = next((ln for ln in lines if ln and ln[0].startswith("GPU")), None)
    cols = [c for c in (header or []) if re.fullmatch(r"GPU\d+", c)]
    pairs = {}
    for row in lines:
        if row and re.fullmatch(r"GPU\d+", row[0]) and len(row) > len(cols):
            for j, col in enumerate(cols):
                if int(col[3:]) > int(row[0][3:]):
                    pairs[f"{row[0]}-{col}"] = row[1 + j]
    if not pairs:
        return "unknown (could not read the `nvidia-smi topo -m` matrix)"
    kinds = sorted(set(pairs.values()))
    if all(k.startswith("NV") for k in kinds):
        return f"NVLink ({', '.join(kinds)}) between every pair"
    pcie = {p: k for p, k in pairs.items() if not k.startswith("NV")}
    return ("PCIe, no NVLink between " + ", ".join(f"{p} ({k}: {_LINKS.get(k, k)})" for p, k in pcie.items()))


def p2p_skip_reason(gpus: int, nccl: bool) -> str | None:
    """Why the P2P probe (two ranks, a NCCL send/recv between GPU 0 and GPU 1) cannot run here, or None."""
    if gpus < 2:
        return f"skipped: {gpus} GPU(s); a send/recv between two GPUs needs 2"
    if not nccl:
        return "skipped: this torch has no NCCL"
    return None


def gpu_facts(gpus: int) -> dict:
    caps = [torch.cuda.get_device_capability(i) for i in range(gpus)]
    says = torch.cuda.is_bf16_supported() if gpus else None
    topo = None
    smi = shutil.which("nvidia-smi")
    if smi and gpus >= 2:
        topo = subprocess.run([smi, "topo", "-m"], capture_output=True, text=True, timeout=30).stdout
    return {"capability": [capability_text(c) for c in caps], "bf16": bf16_line(caps, says),
            "gpu_link": gpu_link(topo, gpus)}


def p2p_probe(gpus: int, timeout: float = 60) -> str:
    """A real 2-rank NCCL send/recv (scripts/probes/p2p_probe.py) with a timeout, or why it is skipped."""
    skip = p2p_skip_reason(gpus, dist.is_nccl_available())
    if skip:
        return skip
    keys = ["steps=1", "backend=nccl", f"pg_timeout={timeout / 2:g}"]
    result = launcher.launch(launcher.request("preflight_p2p", 2, keys, timeout=timeout, progress=False,
                                              script=launcher.REPO / "scripts" / "probes" / "p2p_probe.py"))
    if not result.ok:
        return (f"FAILED ({result.status} after {result.seconds:.0f} s): set NCCL_P2P_DISABLE=1 "
                f"(docs/workshop.md)")
    report = json.loads((result.run_dir / "p2p.json").read_text())
    disabled = " with NCCL_P2P_DISABLE=1" if report.get("nccl_p2p_disable") == "1" else ""
    return (f"{'works' if report['ok'] else 'WRONG DATA'}{disabled}: 1 MiB GPU0 -> GPU1 -> GPU0 in "
            f"{report['seconds']} s")


def run(nproc: int = 2, timeout: float = 120, progress: bool = False) -> tuple[bool, dict]:
    """Print the facts, then launch a real `nproc`-rank all-reduce through the launcher."""
    info = facts(nproc)
    info["p2p"] = p2p_probe(len(info["gpus"]))
    for key, value in info.items():
        print(f"{key:>13}: {value}")
    result = launcher.launch(launcher.request("preflight", nproc, ["steps=1"], timeout=timeout, progress=progress,
                                              script=launcher.REPO / "scripts" / "probes" / "preflight_worker.py"))
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
