"""What FSDP2 costs and saves next to DDP: time per step, bytes received per rank, state held per rank, the tier.

    ddp-lab bench fsdp2                          # 2 and 4 ranks of the tiny GPT on this box (CPU, gloo)
    ddp-lab bench fsdp2 --ranks 2,4,8 --preset workshop --json out.json

For each world size W: the emulated W-rank reference (one process), then W ranks of DDP and of FSDP2
(`wrap=fsdp2`, lab_utils/core/fsdp2.py), each with the stock reduction and with `grad_reduction=ordered`. Each row:
- ms per step after the warm-up (on one box the ranks share its cores: time measures that too);
- MB one rank receives per step, counted for bandwidth-optimal algorithms (N = 4 bytes x the parameters): DDP
  stock a ring all-reduce 2(W-1)/W·N, DDP ordered an all-gather (W-1)·N; FSDP2 all-gathers the weights for the
  forward and again for the backward, 2(W-1)/W·N, plus its reduce-scatter, (W-1)/W·N (the ordered one as an
  all-to-all of the shards, the same bytes), plus, ordered, the full gradients gathered for the grad norm
  (logged every step, and clipped by), (W-1)/W·N;
- the bytes of parameters, gradients and optimizer state rank 0 holds after the last step (measured in the run:
  its heartbeat's state_bytes; a DTensor counts its shard);
- the tier against the emulated reference and max |Δparam|.
Backend `auto`: NCCL where every rank has its own GPU, gloo otherwise; where the ranks would share a GPU, the
CPU (FSDP2 over gloo on CUDA tensors crashes: core/distenv.check_sharded_device).
"""

from __future__ import annotations

import json
import sys

import torch

from lab_utils.analysis import parity
from lab_utils.core import distenv, runfiles
from lab_utils.drivers import bench_args
from lab_utils.launch import launcher

ROWS = (("ddp", "allreduce"), ("ddp", "ordered"), ("fsdp2", "allreduce"), ("fsdp2", "ordered"))


def bytes_received(n_bytes: float, world: int, wrap: str, reduction: str) -> float:
    """Bytes one rank receives per step (bandwidth-optimal counts; see the module's docstring)."""
    share = (world - 1) / world * n_bytes
    if wrap == "ddp":
        return 2 * share if reduction == "allreduce" else (world - 1) * n_bytes
    gathers = 2 * share  # the weights, for the forward and for the backward (resharded after the forward)
    return gathers + share + (share if reduction == "ordered" else 0.0)


def main(argv: list[str] | None = None) -> int:
    args, worlds = bench_args.parse(bench_args.parser("ddp-lab bench fsdp2", __doc__, "2,4"), argv)
    # Where FSDP2's ranks would share a GPU over gloo (which crashes), every row runs on the CPU, so each pair
    # compared and each time set side by side ran on one device.
    device = distenv.sharded_run_device(max(worlds))
    if device == "cpu" and torch.cuda.is_available():
        print(f"bench fsdp2: {max(worlds)} ranks would share {torch.cuda.device_count()} GPU(s) over gloo, which "
              "FSDP2 cannot: every row runs on the CPU", file=sys.stderr)
    base = [f"preset={args.preset}", f"steps={args.steps}", "log_every=1000", "window_every=0", f"device={device}"]
    rows = []
    for w in worlds:
        ref = launcher.launch(launcher.request(f"bench_fsdp2_emulated_{w}", 1, base + [f"emulate_ranks={w}"],
                                               timeout=args.timeout, progress=False))
        ref.raise_for_status()
        n_bytes = sum(t.numel() * 4 for t in torch.load(ref.run_dir / "model.pt", weights_only=True).values()
                      if t.is_floating_point())
        for wrap, how in ROWS:
            r = launcher.launch(launcher.request(f"bench_fsdp2_{wrap}_{how}_{w}", w,
                                                 base + [f"wrap={wrap}", f"grad_reduction={how}"],
                                                 timeout=args.timeout, progress=False))
            if not r.ok:
                print(f"{wrap} {how} at {w} ranks: FAILED\n{r}", file=sys.stderr)
                rows.append({"ranks": w, "wrap": wrap, "reduction": how, "ms_per_step": None})
                continue
            rep = parity.compare(ref.run_dir, r.run_dir)
            held = runfiles.read_heartbeats(r.run_dir)[0].get("state_bytes", {})
            rows.append({"ranks": w, "wrap": wrap, "reduction": how,
                         "backend": json.loads((r.run_dir / runfiles.CONFIG).read_text())["backend"],
                         "ms_per_step": runfiles.ms_per_step(r.run_dir, args.warmup),
                         "bytes_received": bytes_received(n_bytes, w, wrap, how),
                         "state_bytes": sum(held.values()), "held": held,
                         "tier": rep.tier, "max_abs_param_diff": rep.max_abs_param_diff})
            print(f"{wrap} {how} at {w} ranks: {rows[-1]['ms_per_step']:.1f} ms/step, tier {rep.tier}",
                  file=sys.stderr, flush=True)
    print(f"\nbench_fsdp2: preset={args.preset}, {args.steps} steps ({args.warmup} warm-up), "
          f"{n_bytes / 4:,.0f} parameters, torch {torch.__version__}; tier and |Δparam| against emulate_ranks=W")
    print(f"{'ranks':>5} {'wrap':>6} {'reduction':>10} {'backend':>8} {'ms/step':>9} {'vs DDP':>7} "
          f"{'MB recv/step':>13} {'MB held':>8} {'tier':>5} {'max |Δparam|':>13}")
    ddp = {r["ranks"]: r["ms_per_step"] for r in rows if (r["wrap"], r["reduction"]) == ("ddp", "allreduce")}
    for r in rows:
        if r["ms_per_step"] is None:
            print(f"{r['ranks']:>5} {r['wrap']:>6} {r['reduction']:>10} FAILED")
            continue
        ratio = f"{r['ms_per_step'] / ddp[r['ranks']]:.2f}x" if ddp.get(r["ranks"]) else "-"
        print(f"{r['ranks']:>5} {r['wrap']:>6} {r['reduction']:>10} {r['backend']:>8} {r['ms_per_step']:>9.1f} "
              f"{ratio:>7} {r['bytes_received'] / 1e6:>13.3f} {r['state_bytes'] / 1e6:>8.3f} {r['tier']:>5} "
              f"{r['max_abs_param_diff']:>13.1e}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
