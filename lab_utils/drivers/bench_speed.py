"""After parity: is each speed-up faster, and what does it cost in bits? (chapter 15)

    ddp-lab bench speed                                    # this box: the variants it can run, 1 and 2 ranks
    ddp-lab bench speed --preset workshop --ranks 1,2 --json out.json
    ddp-lab bench speed --variants fused,no_overlap --ranks 2 --steps 8 --warmup 2

For each world size W: the eager fp32 run (every speed key at its default) is the reference, and its float twin
(`ddp-lab run --twin`: the same run with its sums in another order) certifies tier 2. Then one run per variant,
the reference's keys plus the variant's. Each row:
- ms per step after the warm-up (`--warmup` steps: start-up, compilation and the allocator left out; on one box
  the ranks share its cores or its GPU: time measures that too);
- the speed-up: the reference's ms/step over the variant's;
- the tier against the eager fp32 run (3 the same bits, 2 within the float noise its twin measures, below that
  a real difference) and max |Δparam| after the last step.
`eager_again` repeats the reference later on: its tier must be 3, and its "speed-up" is how far two identical runs'
timings part on this box; a speed-up inside that is not a measurement.
Variants that need CUDA (tf32, compile) are skipped on a box without it; those that change DDP's buckets
(bucket_*, no_overlap) need W >= 2. Backend `auto`: NCCL where every rank has its own GPU, gloo otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from lab_utils.analysis import parity
from lab_utils.core import runfiles
from lab_utils.launch import launcher, twins

# name -> (keys, needs CUDA, needs DDP buckets (W >= 2), what it is)
VARIANTS = {  # in the order they run: the slow compiles last, so a time limit cuts them first
    "tf32": (["tf32=true"], True, False, "TF32 matmuls and convolutions"),
    "fused": (["fused_optimizer=true"], False, False, "AdamW(fused=True)"),
    "small_buckets": (["bucket_cap_mb=SMALL"], False, True, "DDP bucket_cap_mb=1 (workshop) or 0.02 (cpu): "
                      "many small buckets"),
    "one_bucket": (["bucket_cap_mb=1024"], False, True, "DDP bucket_cap_mb=1024 (one bucket after the first)"),
    "no_overlap": (["overlap=none"], False, True, "each bucket's all-reduce blocks the backward"),
    "eager_again": ([], False, False, "the reference's keys, run again: its speed-up is this box's timing noise"),
    "compile": (["compile=true"], True, False, "model.compile() before the DDP wrap"),
    "all_fast": (["tf32=true", "compile=true", "fused_optimizer=true"], True, False, "tf32 + compile + fused"),
}
REFERENCE = "eager"
SMALL_BUCKET_MB = {"workshop": 1, "cpu": 0.02}  # ~76 buckets of the workshop GPT's 76 MB, ~22 of the toy's 0.44 MB


def keys_of(name: str, preset: str) -> list[str]:
    """The keys variant `name` adds to the reference's at `preset`."""
    return [k.replace("SMALL", str(SMALL_BUCKET_MB[preset])) for k in VARIANTS[name][0]]


def judge(ref_dir: Path, twin_dir: Path, run_dir: Path, warmup: int) -> dict:
    """One variant's run against the eager fp32 reference (and its float twin): ms/step after `warmup` steps, the
    speed-up over the reference, the tier and max |Δparam|."""
    rep = parity.compare(ref_dir, run_dir, noise_runs=[twin_dir])
    ms = runfiles.ms_per_step(run_dir, warmup)
    cfg = runfiles.read_config(run_dir)
    return {"backend": cfg["backend"], "device": cfg["device"], "ms_per_step": ms,
            "speedup": runfiles.ms_per_step(ref_dir, warmup) / ms, "tier": rep.tier, "certified": rep.certified,
            "max_abs_param_diff": rep.max_abs_param_diff, "run": str(run_dir)}


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, list[int], list[str]]:
    """(the arguments, the world sizes, the variants); ap.error (exit 2, one line) names a bad value."""
    ap = argparse.ArgumentParser(prog="ddp-lab bench speed", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="1,2", help="comma-separated world sizes (1 = one process, no DDP)")
    ap.add_argument("--variants", default="all",
                    help=f"comma-separated, from {', '.join(VARIANTS)}; 'all' = every one this box can run")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--preset", default="cpu", choices=("cpu", "workshop"))
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    try:
        worlds = [int(w) for w in args.ranks.split(",")]
    except ValueError:
        ap.error(f"--ranks {args.ranks!r}: expected comma-separated integers, e.g. 1,2")
    if any(w < 1 for w in worlds):
        ap.error(f"--ranks {args.ranks!r}: every world size must be >= 1")
    names = list(VARIANTS) if args.variants == "all" else args.variants.split(",")
    bad = [v for v in names if v not in VARIANTS]
    if bad:
        ap.error(f"--variants: unknown {', '.join(map(repr, bad))} (known: {', '.join(VARIANTS)}, or all)")
    if not 1 <= args.warmup < args.steps - 1:
        ap.error(f"--warmup {args.warmup} must be >= 1 and < --steps {args.steps} - 1")
    return args, worlds, names


def runnable(name: str, world: int, cuda: bool) -> str | None:
    """None when `name` can run at `world` ranks on this box, else why not (a table cell)."""
    _, needs_cuda, needs_ddp, _ = VARIANTS[name]
    if needs_cuda and not cuda:
        return "needs CUDA"
    if needs_ddp and world < 2:
        return "needs >= 2 ranks"
    return None


def base_keys(args: argparse.Namespace) -> list[str]:
    """The reference's keys: the preset's, no window states (every variant adds its own keys to these)."""
    keys = [f"preset={args.preset}", f"steps={args.steps}", "log_every=1000", "window_every=0"]
    return keys + (["log_sync_every=5"] if args.preset == "workshop" else [])  # GPU: a synced record every 5 steps


def run_world(args, world: int, names: list[str], cuda: bool, prefix: str = "bench_speed",
              save=lambda rows: None) -> list[dict]:
    """The reference, its twin and every variant at `world` ranks: one row each (the reference first);
    `save(rows)` after each row, so a bench stopped half-way keeps what it measured."""
    base = base_keys(args)
    ref_name = f"{prefix}_{REFERENCE}_{world}"
    ref_request = launcher.request(ref_name, world, base, timeout=args.timeout, progress=False)
    ref = launcher.launch(ref_request)
    ref.raise_for_status()
    twin = twins.launch_twin(ref_request)
    twin.raise_for_status()
    rows = [{"ranks": world, "variant": REFERENCE, "keys": [],
             **judge(ref.run_dir, twin.run_dir, ref.run_dir, args.warmup), "twin": str(twin.run_dir)}]
    save(rows)
    for name in names:
        keys = keys_of(name, args.preset)
        why = runnable(name, world, cuda)
        if why:
            rows.append({"ranks": world, "variant": name, "keys": keys, "skipped": why, "ms_per_step": None})
            continue
        r = launcher.launch(launcher.request(f"{prefix}_{name}_{world}", world, base + keys, timeout=args.timeout,
                                             progress=False))
        if not r.ok:
            print(f"{name} at {world} ranks: FAILED\n{r}", file=sys.stderr)
            rows.append({"ranks": world, "variant": name, "keys": keys, "skipped": "FAILED", "ms_per_step": None})
            continue
        rows.append({"ranks": world, "variant": name, "keys": keys, **judge(ref.run_dir, twin.run_dir, r.run_dir,
                                                                             args.warmup)})
        print(f"{name} at {world} ranks: {rows[-1]['ms_per_step']:.1f} ms/step, tier {rows[-1]['tier']}",
              file=sys.stderr, flush=True)
        save(rows)
    return rows


def table(rows: list[dict]) -> str:
    lines = [f"{'ranks':>5} {'variant':>13} {'backend':>7} {'ms/step':>9} {'speed-up':>9} {'tier':>5} "
             f"{'max |Δparam|':>13}"]
    for r in rows:
        if r["ms_per_step"] is None:
            lines.append(f"{r['ranks']:>5} {r['variant']:>13} {'-':>7} {r['skipped']:>9}")
            continue
        diff = r["max_abs_param_diff"]
        lines.append(f"{r['ranks']:>5} {r['variant']:>13} {r['backend'] or '-':>7} {r['ms_per_step']:>9.1f} "
                     f"{r['speedup']:>8.2f}x {r['tier']:>5} {'-' if diff is None else format(diff, '.1e'):>13}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args, worlds, names = parse(argv)
    cuda = torch.cuda.is_available()
    meta = {"preset": args.preset, "steps": args.steps, "warmup": args.warmup, "torch": torch.__version__,
            "device": torch.cuda.get_device_name(0) if cuda else "cpu"}
    rows: list[dict] = []

    def save(more: list[dict]) -> None:
        if args.json:
            args.json.write_text(json.dumps({"meta": meta, "rows": rows + more}, indent=1))

    for w in worlds:
        rows += run_world(args, w, names, cuda, save=save)
    print(f"\nbench_speed: preset={args.preset}, {args.steps} steps ({args.warmup} warm-up), torch "
          f"{torch.__version__}, {torch.cuda.get_device_name(0) if cuda else 'CPU'}; speed-up and tier against "
          f"eager fp32 at the same world size (tier 2 certified by its float twin)")
    save([])
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
