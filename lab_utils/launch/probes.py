"""Launch a rank-side probe (scripts/probes/) through the launcher and read what it wrote.

The probes answer one question each with evidence from every rank: what DDP copies at wrap time
(`wrap_probe.py`, chapters 02 and 05), whether an all-reduce works (`preflight_worker.py`, chapter 00).
"""

from __future__ import annotations

import json
from pathlib import Path

from lab_utils.launch import launcher

PROBES = launcher.REPO / "scripts" / "probes"


def launch_wrap_probe(name: str, nproc: int = 2, seed: int = 42, backend: str = "auto", timeout: float = 300):
    """Run scripts/probes/wrap_probe.py as runs/NAME with `nproc` ranks; return {rank: record}. `timeout`: as a
    training run's (chapter.params' LAB_TIMEOUT default): on a loaded box the 2-rank start-up alone can pass 2 min."""
    result = launcher.launch(launcher.request(name, nproc, {"seed": seed, "backend": backend, "steps": 1},
                                              timeout=timeout, progress=False, script=PROBES / "wrap_probe.py"))
    result.raise_for_status()
    return read_probe(result.run_dir)


def read_probe(run_dir: str | Path) -> dict[int, dict]:
    """{rank: record} from what any probe wrote: RUN/probe/rank{r}.json (wrap, accumulation, sync BN ...)."""
    files = sorted(Path(run_dir, "probe").glob("rank*.json"))
    if not files:
        raise FileNotFoundError(f"{run_dir}: no probe/rank*.json (did the probe run?)")
    records = [json.loads(f.read_text()) for f in files]
    return {r["rank"]: r for r in sorted(records, key=lambda r: r["rank"])}


FLAGS_PROBE = PROBES / "flags_probe.py"


def launch_flags_probes(specs: dict[str, tuple[str, str, dict]], nproc: int = 2, backend: str = "auto",
                        timeout: float = 300) -> dict[str, tuple[launcher.RunResult, dict[int, dict] | None]]:
    """Chapter 05: scripts/probes/flags_probe.py, one launch per {key: (run name, LAB_FLAGS_PROBE mode, keys)},
    all at once; returns {key: (RunResult, {rank: record} or None)}. A failed probe is returned, not raised:
    the find_unused_parameters=false run is *meant* to fail (its RunResult carries the rank's traceback).
    Overlapping launches change the probes' seconds, not their conclusions: the timed copies alternate."""
    requests = {k: launcher.request(name, nproc, {"steps": 3, "backend": backend, **keys}, timeout=timeout,
                                    progress=False, script=FLAGS_PROBE,
                                    # a fixed mmap threshold: big blocks go back to the OS when freed, so RSS
                                    # deltas in the bucket_view probe count live tensors, not allocator history
                                    extra_env={"LAB_FLAGS_PROBE": mode, "MALLOC_MMAP_THRESHOLD_": "131072"})
                for k, (name, mode, keys) in specs.items()}
    results = launcher.launch_many(requests, max_workers=len(specs))
    out = {k: (result, read_probe(result.run_dir) if result.ok else None) for k, result in results.items()}
    for k, (result, _) in out.items():
        print(f"$ LAB_FLAGS_PROBE={specs[k][1]} {result.command_line}   # {result.status}")
    return out
