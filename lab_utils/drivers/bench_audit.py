"""Benchmark: how long `ddp-lab audit` takes on real projects (the committed corpus, tests/outside/corpus, and the
held-out copies under tests/outside/heldout when present). A user points the audit at a whole repository; the
target is a few seconds for one, since the answer is wanted before the next launch.

    ddp-lab bench audit                     # every project folder, slowest first
    ddp-lab bench audit --top 5 --json rows.jsonl
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = [REPO / "tests" / "outside" / "corpus", REPO / "tests" / "outside" / "heldout"]
TARGET_S = 10.0  # per project folder, on the 2-core CPU box


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ddp-lab bench audit", description=__doc__.splitlines()[0])
    ap.add_argument("--top", type=int, default=15, help="rows to print, slowest first (default 15)")
    ap.add_argument("--json", type=Path, help="also write one JSON row per project here")
    args = ap.parse_args(argv)

    from lab_utils.analysis import audit

    folders = [p for root in ROOTS if root.is_dir() for p in sorted(root.iterdir()) if p.is_dir()]
    if not folders:
        print("no project folders found under tests/outside/corpus or tests/outside/heldout")
        return 1
    rows = []
    for i, folder in enumerate(folders, 1):
        start = time.perf_counter()
        found = audit.audit_paths([folder])
        seconds = time.perf_counter() - start
        files = sum(1 for _ in folder.rglob("*.py"))
        rows.append({"project": f"{folder.parent.name}/{folder.name}", "files": files, "seconds": round(seconds, 2),
                     "findings": len(found)})
        print(f"\r[{i}/{len(folders)}] {folder.name:<28}", end="", flush=True)
    print()
    rows.sort(key=lambda r: -r["seconds"])
    print(f"{'project':<36} {'files':>5} {'seconds':>8} {'findings':>8}")
    for r in rows[:args.top]:
        print(f"{r['project']:<36} {r['files']:>5} {r['seconds']:>8.2f} {r['findings']:>8}")
    total = sum(r["seconds"] for r in rows)
    worst = rows[0]["seconds"]
    print(f"{len(rows)} projects, {total:.1f} s in all; slowest {worst:.2f} s "
          f"(target <= {TARGET_S:.0f} s per project: {'met' if worst <= TARGET_S else 'NOT met'})")
    if args.json:
        args.json.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return 0
