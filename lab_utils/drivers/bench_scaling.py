"""Tokens/s of the tiny GPT's workshop preset: 1 GPU vs 2 GPUs, and what no_sync and gradient_as_bucket_view buy.

    ddp-lab bench scaling                 # every case this box can run
    ddp-lab bench scaling --steps 60 --json out.json

Cases (each a real run through the lab's launcher; the fingerprint stays on, so every row carries its tier):
1 rank fp32 / bf16 autocast; with >= 2 GPUs, 2 ranks (backend auto -> NCCL) with grad_accum_steps 1 and 4,
no_sync on/off, gradient_as_bucket_view on/off, bucket_cap_mb, the lab's per-step work off, a sync every step;
with a GPU, TF32 (1 rank, emulated 2 ranks, 2 ranks) and compile (1 rank, 2 ranks), each with its tiers.
On a box with fewer GPUs than ranks the 2-rank cases run over gloo on shared devices and are marked so: they
say nothing about scaling. Target (issue 12): 2 GPUs >= 1.9x the 1-GPU tokens/s. Throughput skips the first
`--warmup` steps (allocator and kernel warm-up).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from lab_utils.analysis import parity
from lab_utils.core.runfiles import read_config, synced_span
from lab_utils.launch import launcher


def tokens_per_s(run_dir: Path, warmup: int) -> float:
    cfg = read_config(run_dir)["config"]
    first, last = synced_span(run_dir, warmup)
    tokens = (last["samples"] - first["samples"]) * cfg["block_size"]
    return tokens / (last["elapsed"] - first["elapsed"])


# The H200's measured bf16 dense matmul peak (device tool notes): every row's MFU is against it, so rows compare.
PEAK_FLOPS = 790e12


def flops_per_token(cfg: dict, n_params: int) -> float:
    """Training FLOPs per token: 6 per parameter (forward + backward) plus attention's score and value
    matmuls, 12 * n_layer * block_size * n_embd (the full T x T matrix: the causal mask is applied after)."""
    return 6 * n_params + 12 * cfg["n_layer"] * cfg["block_size"] * cfg["n_embd"]


# The host work the lab adds to every step, switched off: the per-step parameter fingerprint (a few kernels; its
# 8 bytes ride in StepLog's batched copy), the copy of the logged numbers (one per 10 steps, the workshop
# preset's own setting) and the 4 heartbeat file writes a step (LAB_STEP_HEARTBEATS=off; the hang diagnosis
# needs them, so only a benchmark turns them off). The "lab overhead off" rows against their plain rows give
# what that work costs (target: < 5% of a step); the "log_sync_every=1" rows what a `.item()`-style sync every
# step costs.
LAB_OFF = ["fingerprint=false", "log_sync_every=10"]
LAB_OFF_ENV = {"LAB_STEP_HEARTBEATS": "off"}


def all_cases(gpus: int) -> list[tuple[str, int, list[str]]]:
    """(name, ranks, keys) of every row, in the order they run."""
    cases = [("1 rank fp32", 1, []), ("1 rank bf16", 1, ["amp=bf16"]), ("1 rank accum 4", 1, ["grad_accum_steps=4"]),
             ("1 rank emulated 2 ranks", 1, ["emulate_ranks=2"]), ("1 rank fp32, lab overhead off", 1, LAB_OFF),
             ("1 rank fp32, log_sync_every=1", 1, ["log_sync_every=1"])]
    two = [("2 ranks fp32", []), ("2 ranks bf16", ["amp=bf16"]),
           ("2 ranks accum 4, no_sync", ["grad_accum_steps=4", "no_sync=true"]),
           ("2 ranks accum 4, sync every micro", ["grad_accum_steps=4", "no_sync=false"]),
           ("2 ranks bucket view", ["gradient_as_bucket_view=true"]),
           ("2 ranks bucket_cap_mb=1", ["bucket_cap_mb=1"]),
           ("2 ranks fp32, lab overhead off", LAB_OFF), ("2 ranks fp32, log_sync_every=1", ["log_sync_every=1"])]
    cases += [(name, 2, keys) for name, keys in two]
    if gpus:  # TF32 and the lab's torch.compile are GPU-only keys (refused on other devices)
        cases += [("1 rank tf32", 1, ["tf32=true"]),
                  ("1 rank emulated 2 ranks tf32", 1, ["tf32=true", "emulate_ranks=2"]),
                  ("2 ranks tf32", 2, ["tf32=true"]),
                  ("1 rank compile", 1, ["compile=true"]), ("2 ranks compile", 2, ["compile=true"])]
    return cases


# The row each row's tier is measured against (the others: "1 rank fp32", accumulation rows "1 rank accum 4").
REFS = {"1 rank fp32": "1 rank fp32", "1 rank bf16": "1 rank fp32", "1 rank accum 4": "1 rank fp32",
        "1 rank emulated 2 ranks": "1 rank fp32", "2 ranks bf16": "1 rank bf16",
        "2 ranks fp32": "1 rank emulated 2 ranks", "1 rank tf32": "1 rank fp32",
        "1 rank emulated 2 ranks tf32": "1 rank tf32", "2 ranks tf32": "1 rank emulated 2 ranks tf32",
        "1 rank compile": "1 rank fp32", "2 ranks compile": "1 rank compile"}
# The workshop's second comparison for a 2-GPU row: tier against the plain single-GPU run of its arithmetic.
SINGLES = {"2 ranks fp32": "1 rank fp32", "2 ranks tf32": "1 rank tf32"}


def tier_ref(name: str) -> str:
    """The row `name`'s tier is measured against."""
    return REFS.get(name, "1 rank accum 4" if "accum" in name else "1 rank fp32")


def speedup_ref(name: str) -> str:
    """The 1-rank row a 2-rank row's speed-up is against: the same arithmetic and the same lab work, one GPU."""
    for part, ref in (("bf16", "1 rank bf16"), ("tf32", "1 rank tf32"), ("compile", "1 rank compile"),
                      ("accum", "1 rank accum 4"), ("overhead", "1 rank fp32, lab overhead off"),
                      ("every=1", "1 rank fp32, log_sync_every=1")):
        if part in name:
            return ref
    return "1 rank fp32"


def pick(cases: list[tuple[str, int, list[str]]], only: str) -> list[tuple[str, int, list[str]]]:
    """The cases `--only` names (comma-separated substrings; '=NAME' is exact) plus every row their tiers and
    speed-ups are measured against, transitively, in run order."""
    picks = [w.strip() for w in only.split(",")]
    wanted = {name for name, _, _ in cases if any(name == w[1:] if w.startswith("=") else w in name for w in picks)}
    if not wanted:
        raise ValueError(f"--only {only!r} matches no case: {', '.join(name for name, _, _ in cases)}")
    wanted.add("1 rank fp32")
    while True:  # the rows each wanted row is compared against, and theirs
        more = {tier_ref(n) for n in wanted} | {speedup_ref(n) for n in wanted} \
            | {SINGLES[n] for n in wanted if n in SINGLES}
        if more <= wanted:
            break
        wanted |= more
    return [c for c in cases if c[0] in wanted]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ddp-lab bench scaling", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--preset", default="workshop", choices=("workshop", "cpu"))
    ap.add_argument("--global-batch-size", type=int, help="default: the preset's")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--keys", default="", help="extra key=value pairs for every case, space-separated "
                    "(e.g. 'fused_optimizer=true')")
    ap.add_argument("--only", help="comma-separated substrings: run only the cases whose name contains one "
                    "('=NAME': exactly that case; the rows a tier is measured against are added)")
    args = ap.parse_args(argv)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    # The fingerprint stays on: computed on the device and copied in StepLog's batched copy, it cost 0.9% of a
    # 2-GPU step (the "lab overhead off" rows) and lets every row carry its parity tier (tier 3 needs the
    # per-step hashes).
    base = [f"preset={args.preset}", f"steps={args.steps}", "log_every=1000"]
    if args.global_batch_size:
        base.append(f"global_batch_size={args.global_batch_size}")
    base += args.keys.split()
    cases = all_cases(gpus)
    if args.only:
        try:
            cases = pick(cases, args.only)
        except ValueError as e:
            ap.error(str(e))
    rows, dirs = [], {}
    for name, nproc, keys in cases:
        r = launcher.launch(launcher.request(f"bench_scaling_{len(rows)}", nproc, base + keys, timeout=900,
                                             progress=False, extra_env=LAB_OFF_ENV if keys is LAB_OFF else None))
        if not r.ok:
            print(f"{name}: FAILED\n{r}", file=sys.stderr)
            rows.append({"case": name, "nproc": nproc, "tokens_per_s": None})
            continue
        dirs[name] = r.run_dir
        c = json.loads((r.run_dir / "config.json").read_text())
        n_params = sum(t.numel() for t in torch.load(r.run_dir / "model.pt", weights_only=True).values()
                       if t.is_floating_point())
        tps = tokens_per_s(r.run_dir, args.warmup)
        ref = tier_ref(name)
        report = parity.compare(dirs[ref], r.run_dir) if ref in dirs and ref != name else None
        # The workshop's two promises for the 2-GPU run: bitwise with the emulated reference (above) *and*
        # tier 2 against the plain single-GPU run, which this second comparison states.
        single = parity.compare(dirs[SINGLES[name]], r.run_dir) if SINGLES.get(name) in dirs else None
        rows.append({"case": name, "nproc": nproc, "backend": c["backend"] or "-", "device": c["device"],
                     "tokens_per_s": tps, "mfu": tps * flops_per_token(c["config"], n_params) / PEAK_FLOPS,
                     "vs": ref if report else None, "tier": report.tier if report else None,
                     "vs_single": SINGLES[name] if single else None,
                     "tier_vs_single": single.tier if single else None,
                     "max_abs_loss_diff_vs_single": single.max_abs_loss_diff if single else None})
        print(f"{name}: {tps:,.0f} tokens/s", file=sys.stderr, flush=True)
    ref_tps = {name: row["tokens_per_s"] for name, row in zip([c[0] for c in cases], rows, strict=True)}
    shared = gpus < 2
    print(f"\nbench_scaling: preset={args.preset}, {args.steps} steps ({args.warmup} warm-up), GPUs: {gpus}, "
          f"torch {torch.__version__}; MFU against {PEAK_FLOPS / 1e12:.0f} TFLOP/s (H200 bf16 dense peak)")
    print(f"{'case':<36} {'ranks':>5} {'backend':>8} {'tokens/s':>12} {'vs 1 rank':>10} {'MFU':>6}  tier (vs)")
    for row in rows:
        tps = row["tokens_per_s"]
        single = speedup_ref(row["case"])
        ratio = f"{tps / ref_tps[single]:.2f}x" if tps and ref_tps.get(single) and row["nproc"] > 1 else "-"
        note = " (shared device: no scaling)" if shared and row["nproc"] > 1 else ""
        mfu = f"{row['mfu']:.1%}" if tps else "-"
        tier = f"{row['tier']} (vs {row['vs']})" if row.get("tier") is not None else "-"
        if row.get("tier_vs_single") is not None:
            tier += (f"; {row['tier_vs_single']} (vs {row['vs_single']}, max |dloss| "
                     f"{row['max_abs_loss_diff_vs_single']:.1e})")
        print(f"{row['case']:<36} {row['nproc']:>5} {row.get('backend', '-'):>8} "
              f"{(f'{tps:,.0f}' if tps else 'FAILED'):>12} {ratio:>10} {mfu:>6}  {tier}{note}")
    for ranks in ("1 rank", "2 ranks"):  # what the lab's own per-step host work costs: the same run on and off
        on, off = ref_tps.get(f"{ranks} fp32"), ref_tps.get(f"{ranks} fp32, lab overhead off")
        if on and off:
            off_keys = " ".join(LAB_OFF)
            what = (f"{off_keys} vs on; step heartbeats off in every row"  # the caller set LAB_STEP_HEARTBEATS=off
                    if os.environ.get("LAB_STEP_HEARTBEATS") == "off" else f"{off_keys}, step heartbeats off vs on")
            print(f"lab overhead ({what}), {ranks}: {1 - on / off:.1%} of a step")
        every_step = ref_tps.get(f"{ranks} fp32, log_sync_every=1")
        if on and every_step:
            print(f"a host sync every step (log_sync_every=1 vs the run's own), {ranks}: "
                  f"{1 - every_step / on:+.1%} of a step")
    if shared:
        print("fewer than 2 GPUs: the 2-rank rows share one device over gloo and measure no scaling")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
