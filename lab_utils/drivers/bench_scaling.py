"""Tokens/s of the tiny GPT's workshop preset: 1 GPU vs 2 GPUs, and what no_sync and gradient_as_bucket_view buy.

    ddp-lab bench scaling                 # every case this box can run
    ddp-lab bench scaling --steps 60 --json out.json

Cases (each a real run through the lab's launcher, with fingerprinting off so hashing is not timed):
1 rank fp32 / bf16 autocast; with >= 2 GPUs, 2 ranks (backend auto -> NCCL) with grad_accum_steps 1 and 4,
no_sync on/off, gradient_as_bucket_view on/off. On a box with fewer GPUs than ranks the 2-rank cases run
over gloo on shared devices and are marked so: they say nothing about scaling. Target (issue 4): 2 GPUs
>= 1.9x the 1-GPU tokens/s. Throughput skips the first `--warmup` steps (allocator and kernel warm-up).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from .. import launcher
from ..runfiles import read_metrics


def tokens_per_s(run_dir: Path, warmup: int) -> float:
    rows = read_metrics(run_dir)
    cfg = json.loads((run_dir / "config.json").read_text())["config"]
    first, last = rows[warmup - 1], rows[-1]
    tokens = (last["samples"] - first["samples"]) * cfg["block_size"]
    return tokens / (last["elapsed"] - first["elapsed"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ddp-lab bench scaling", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--preset", default="workshop", choices=("workshop", "cpu"))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    base = [f"preset={args.preset}", f"steps={args.steps}", "fingerprint=false", "log_every=1000"]
    cases = [("1 rank fp32", 1, []), ("1 rank bf16", 1, ["amp=bf16"])]
    two = [("2 ranks fp32", []), ("2 ranks bf16", ["amp=bf16"]),
           ("2 ranks accum 4, no_sync", ["grad_accum_steps=4", "no_sync=true"]),
           ("2 ranks accum 4, sync every micro", ["grad_accum_steps=4", "no_sync=false"]),
           ("2 ranks bucket view", ["gradient_as_bucket_view=true"])]
    cases += [(name, 2, keys) for name, keys in two]
    cases.insert(2, ("1 rank accum 4", 1, ["grad_accum_steps=4"]))
    rows = []
    for name, nproc, keys in cases:
        r = launcher.launch(f"bench_scaling_{len(rows)}", nproc, base + keys, timeout=900, progress=False)
        if not r.ok:
            print(f"{name}: FAILED\n{r}", file=sys.stderr)
            rows.append({"case": name, "nproc": nproc, "tokens_per_s": None})
            continue
        c = json.loads((r.run_dir / "config.json").read_text())
        rows.append({"case": name, "nproc": nproc, "backend": c["backend"] or "-", "device": c["device"],
                     "tokens_per_s": tokens_per_s(r.run_dir, args.warmup)})
        print(f"{name}: {rows[-1]['tokens_per_s']:,.0f} tokens/s", file=sys.stderr, flush=True)
    ref = {"fp32": rows[0]["tokens_per_s"], "bf16": rows[1]["tokens_per_s"], "accum": rows[2]["tokens_per_s"]}
    shared = gpus < 2
    print(f"\nbench_scaling: preset={args.preset}, {args.steps} steps ({args.warmup} warm-up), GPUs: {gpus}, "
          f"torch {torch.__version__}")
    print(f"{'case':<36} {'ranks':>5} {'backend':>8} {'tokens/s':>12} {'vs 1 rank':>10}")
    for row in rows:
        tps = row["tokens_per_s"]
        key = "bf16" if "bf16" in row["case"] else "accum" if "accum" in row["case"] else "fp32"
        ratio = f"{tps / ref[key]:.2f}x" if tps and ref[key] else "-"
        note = " (shared device)" if shared and row["nproc"] > 1 else ""
        print(f"{row['case']:<36} {row['nproc']:>5} {row.get('backend', '-'):>8} "
              f"{(f'{tps:,.0f}' if tps else 'FAILED'):>12} {ratio:>10}{note}")
    if shared:
        print("fewer than 2 GPUs: the 2-rank rows share one device over gloo and measure no scaling")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
