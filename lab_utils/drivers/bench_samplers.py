"""Benchmark: stock DistributedSampler vs. GlobalBatchSampler(mode="feistel") as n grows.

Taught in notebooks/03_samplers.ipynb.  Each (sampler, n) case runs in a fresh subprocess so
that its peak RSS (ru_maxrss, a high-water mark that never goes down) belongs to that case alone.

    ddp-lab bench samplers                      # n = 1e6, 1e7, 1e8, 1e9
    ddp-lab bench samplers --sizes 1e6 1e7 --json rows.jsonl
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The stock sampler holds randperm's int64 tensor (8 B/index), its .tolist() (8 B pointer + 32 B
# int object per index) and the rank's slice (4 B/index at 2 ranks) at the same time.
STOCK_BYTES_PER_INDEX = 52
TARGETS = {"first_ms": 100.0, "rss_mb": 100.0, "ids_per_s": 1e6}  # for the global sampler at n = 1e9


def child(sampler_name: str, n: int, k: int) -> dict:
    """Runs inside the subprocess: build the sampler, time the first index and the next k."""
    import itertools
    import operator
    import resource
    import time
    from collections import deque

    import torch
    from torch.utils.data import DistributedSampler

    sys.path.insert(0, str(REPO))
    from lab_utils.core.global_sampler import GlobalBatchSampler

    torch.set_num_threads(1)

    class LenOnly:  # DistributedSampler only calls len(dataset)
        def __len__(self):
            return n

    def peak_mb():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB

    baseline = peak_mb()
    t0 = time.perf_counter()
    if sampler_name == "DistributedSampler":
        sampler = DistributedSampler(LenOnly(), num_replicas=2, rank=0, shuffle=True, seed=0)
    else:
        sampler = GlobalBatchSampler(n, global_batch_size=64, rank=0, world_size=2, seed=0, mode="feistel")
    it = iter(sampler)
    next(it)  # the stock sampler does all its work (randperm + tolist) here
    t1 = time.perf_counter()
    # A rank of the stock sampler only has ceil(n/2) ids (a list iterator knows how many are
    # left); ours is infinite (length_hint falls back to k).
    timed = min(k, operator.length_hint(it, k))
    deque(itertools.islice(it, k), maxlen=0)  # consume the ids as fast as Python can take them
    t2 = time.perf_counter()
    return {"sampler": sampler_name, "n": n, "first_ms": (t1 - t0) * 1e3,
            "ids_per_s": timed / (t2 - t1), "rss_mb": peak_mb() - baseline, "timed": timed}


def run_case(sampler_name: str, n: int, k: int) -> dict:
    cmd = [sys.executable, "-m", "lab_utils.drivers.bench_samplers", "--child", sampler_name, str(n), str(k)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=REPO).stdout
    return json.loads(out.strip().splitlines()[-1])


def print_table(rows: list[dict], k: int) -> None:
    header = ["sampler", "n", "first index (ms)", "indices/s", "peak RSS delta (MB)"]
    cells = {id(r): [r["sampler"], f"{r['n']:.0e}"] for r in rows}
    for r in rows:
        if not r.get("skipped"):
            star = "*" if r["timed"] < k else ""
            rate = f"{r['ids_per_s'] / 1e6:.2f} M{star}"
            cells[id(r)] += [f"{r['first_ms']:.2f}", rate, f"{r['rss_mb']:.1f}"]
    widths = [max([len(header[i])] + [len(c[i]) for c in cells.values() if len(c) > i]) for i in range(5)]

    def line(c: list[str]) -> str:
        # first column left-aligned, numbers right-aligned; skipped rows have only two cells
        return "  ".join(x.ljust(w) if i == 0 else x.rjust(w)
                         for i, (x, w) in enumerate(zip(c, widths, strict=False)))

    print(line(header))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print(line(cells[id(r)]) + (f"  {r['skipped']}" if r.get("skipped") else ""))
    print(f"indices/s: over the next {k:,} indices after the first"
          + (" (* fewer: a stock rank only holds n/2)" if any(r.get("timed", k) < k for r in rows) else ""))


def check_targets(rows: list[dict]) -> None:
    row = next((r for r in rows if r["sampler"] == "GlobalBatchSampler" and r["n"] == 10**9), None)
    if row is None:
        print("targets at n=1e9: not measured (add 1e9 to --sizes)")
        return
    checks = [("first index", row["first_ms"] < TARGETS["first_ms"], f"{row['first_ms']:.2f} ms < 100 ms"),
              ("RSS", row["rss_mb"] < TARGETS["rss_mb"], f"{row['rss_mb']:.1f} MB < 100 MB"),
              ("throughput", row["ids_per_s"] >= TARGETS["ids_per_s"],
               f"{row['ids_per_s'] / 1e6:.2f} M/s >= 1 M/s")]
    print("targets at n=1e9 (GlobalBatchSampler): "
          + "; ".join(f"{name} {'PASS' if ok else 'FAIL'} ({text})" for name, ok, text in checks))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ddp-lab bench samplers", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", type=float, default=[1e6, 1e7, 1e8, 1e9])
    ap.add_argument("--k", type=int, default=2_000_000, help="indices timed after the first one")
    ap.add_argument("--max-stock-n", type=float, default=1e8, help="skip DistributedSampler above this n")
    ap.add_argument("--json", metavar="PATH", help="also write the rows as JSON lines to PATH")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        name, n, k = args.child
        print(json.dumps(child(name, int(n), int(k))))
        return 0

    rows = []
    for n in (int(s) for s in args.sizes):
        for name in ("DistributedSampler", "GlobalBatchSampler"):
            if name == "DistributedSampler" and n > args.max_stock_n:
                gb = n * STOCK_BYTES_PER_INDEX / 1e9
                rows.append({"sampler": name, "n": n, "skipped": f"skipped (needs ~{gb:.0f} GB)"})
            else:
                rows.append(run_case(name, n, args.k))
            print(f"  measured {name} n={n:.0e}", file=sys.stderr, flush=True)
    print_table(rows, args.k)
    check_targets(rows)
    if args.json:
        with open(args.json, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
