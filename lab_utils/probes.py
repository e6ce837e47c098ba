"""Launch a rank-side probe (scripts/probes/) through the launcher and read what it wrote.

The probes answer one question each with evidence from every rank: what DDP copies at wrap time
(`wrap_probe.py`, chapters 02 and 05), whether an all-reduce works (`preflight_worker.py`, chapter 00).
"""

from __future__ import annotations

import json
from pathlib import Path

from . import launcher

PROBES = launcher.REPO / "scripts" / "probes"


def launch_wrap_probe(name: str, nproc: int = 2, seed: int = 42, backend: str = "auto", timeout: float = 120):
    """Run scripts/probes/wrap_probe.py as runs/NAME with `nproc` ranks; return {rank: record}."""
    result = launcher.launch(name, nproc, {"seed": seed, "backend": backend, "steps": 1}, timeout=timeout,
                             progress=False, script=PROBES / "wrap_probe.py")
    result.raise_for_status()
    return read_wrap_probe(result.run_dir)


def read_wrap_probe(run_dir: str | Path) -> dict[int, dict]:
    files = sorted(Path(run_dir, "probe").glob("rank*.json"))
    if not files:
        raise FileNotFoundError(f"{run_dir}: no probe/rank*.json (did the wrap probe run?)")
    records = [json.loads(f.read_text()) for f in files]
    return {r["rank"]: r for r in sorted(records, key=lambda r: r["rank"])}
