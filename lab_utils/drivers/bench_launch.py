"""Launch reliability and overhead: N consecutive 2-rank launches through the lab's launcher.

    ddp-lab bench launch --launches 200            # the lab's exit (distenv.exit_process)
    ddp-lab bench launch --launches 50 --finalize  # train.py with the ordinary interpreter exit
    ddp-lab bench launch --launches 50 --probe naive  # scripts/probes/exit_race.py: naive|teardown|lab

Prints a table: launches, failures (with their kinds), median/p95 wall time per launch, median training
time inside the job, and overhead = wall - training (process start-up, imports, rendezvous, teardown).
Target (issue 2): 0 failures in >= 200 launches. Speed targets live here, never in tests.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

from lab_utils.launch import launcher


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ddp-lab bench launch", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--launches", type=int, default=200)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--finalize", action="store_true", help="LAB_EXIT=finalize: the exit the fix removes")
    ap.add_argument("--probe", choices=("naive", "teardown", "lab"),
                    help="launch scripts/probes/exit_race.py in this exit mode instead of train.py")
    ap.add_argument("--json", type=Path, help="write the summary and every launch as JSON here")
    args = ap.parse_args(argv)

    extra = {"LAB_EXIT": "finalize"} if args.finalize else {}
    script = launcher.TRAIN
    if args.probe:
        extra["LAB_PROBE_EXIT"] = args.probe
        script = launcher.REPO / "scripts" / "probes" / "exit_race.py"
    rows, failures = [], Counter()
    start = time.time()
    for i in range(args.launches):
        r = launcher.launch(launcher.request(f"bench_launch_{i % 2}", args.nproc,
                                             [f"steps={args.steps}", "n_samples=256"], timeout=120, progress=False,
                                             extra_env=extra, script=script))
        train_s = None
        if r.ok and not args.probe:
            train_s = json.loads((r.run_dir / "result.json").read_text())["seconds"]
        elif not r.ok:
            failures[r.message.splitlines()[0][:80] if r.message else r.status] += 1
        rows.append({"i": i, "status": r.status, "wall": r.seconds, "train": train_s, "message": r.message})
        bad = sum(failures.values())
        print(f"\r{i + 1}/{args.launches} launches, {bad} failed, {time.time() - start:.0f} s", end="",
              file=sys.stderr, flush=True)
    print(file=sys.stderr)

    walls = sorted(r["wall"] for r in rows)
    trains = [r["train"] for r in rows if r["train"] is not None]
    over = [r["wall"] - r["train"] for r in rows if r["train"] is not None]
    p95 = walls[min(len(walls) - 1, int(0.95 * len(walls)))]
    print(f"\nlaunch reliability: {args.nproc}-rank gloo jobs, steps={args.steps}, "
          + (f"probes/exit_race.py exit mode {args.probe}" if args.probe else
             f"train.py, exit={'finalize (ordinary)' if args.finalize else 'lab (exit_process)'}"))
    print(f"{'launches':>9} {'failures':>9} {'wall median s':>14} {'wall p95 s':>11} {'train median s':>15} "
          f"{'overhead median s':>18}")
    print(f"{len(rows):>9} {sum(failures.values()):>9} {statistics.median(walls):>14.2f} {p95:>11.2f} "
          f"{statistics.median(trains) if trains else float('nan'):>15.2f} "
          f"{statistics.median(over) if over else float('nan'):>18.2f}")
    for kind, count in failures.most_common():
        print(f"  {count} x {kind}")
    if args.json:
        args.json.write_text(json.dumps({"failures": dict(failures), "rows": rows}, indent=1))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
