"""What FSDP2 costs and saves next to DDP: time per step, bytes received per rank, state held per rank, the tier.

    ddp-lab bench fsdp2                          # 2 and 4 ranks of the tiny GPT on this box (CPU, gloo)
    ddp-lab bench fsdp2 --ranks 2,4,8 --preset workshop --json out.json

For each world size W: the emulated W-rank reference (one process), then W ranks of DDP and of FSDP2
(`wrap=fsdp2`, lab_utils/core/fsdp2.py), each with the stock reduction and with `grad_reduction=ordered`; then
both with `grad_reduction=tree` against ONE process's tree run (the same bits at every W is its promise). The tree
fixes C = the largest W chunks per global batch (sampler=global), so at W ranks each rank runs C/W micro-batches
and, under FSDP2, gathers the weights and reduce-scatters C/W times a step. Each row:
- ms per step after the warm-up (on one box the ranks share its cores: time measures that too);
- MB one rank receives per step, counted for bandwidth-optimal algorithms (N = 4 bytes x the parameters): DDP
  stock a ring all-reduce 2(W-1)/W·N, DDP ordered an all-gather (W-1)·N; FSDP2 all-gathers the weights for the
  forward and again for the backward, 2(W-1)/W·N, plus its reduce-scatter, (W-1)/W·N (the ordered one as an
  all-to-all of the shards, the same bytes), plus, ordered, the full gradients gathered for the grad norm
  (logged every step, and clipped by), (W-1)/W·N; the tree: DDP all-gathers the W subtree roots, (W-1)·N,
  FSDP2 pays its gathers and its all-to-all once per micro-batch, then the norm's gather;
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
from lab_utils.core import config, distenv, runfiles
from lab_utils.drivers import bench_args
from lab_utils.launch import launcher

ROWS = (("ddp", "allreduce"), ("ddp", "ordered"), ("fsdp2", "allreduce"), ("fsdp2", "ordered"))
TREE_ROWS = (("ddp", "tree"), ("fsdp2", "tree"))


def bytes_received(n_bytes: float, world: int, wrap: str, reduction: str, micro_batches: int = 1) -> float:
    """Bytes one rank receives per step (bandwidth-optimal counts; see the module's docstring)."""
    share = (world - 1) / world * n_bytes
    if wrap == "ddp":
        return 2 * share if reduction == "allreduce" else (world - 1) * n_bytes
    gathers = 2 * share  # the weights, for the forward and for the backward (resharded after the forward)
    return micro_batches * (gathers + share) + (share if reduction in ("ordered", "tree") else 0.0)


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
    chunks = max(worlds)
    gbs = config.resolve({"preset": args.preset}, 1)["global_batch_size"]
    tree_keys = ["grad_reduction=tree", "sampler=global", f"micro_batch_size={gbs // chunks}"]
    tree_ref = None
    if chunks & (chunks - 1) == 0 and gbs % chunks == 0:  # the tree needs C a power of two (tree_reduce.py)
        tree_ref = launcher.launch(launcher.request("bench_fsdp2_tree_1", 1, base + tree_keys,
                                                    timeout=args.timeout, progress=False))
        tree_ref.raise_for_status()
    else:
        print(f"bench fsdp2: no tree rows: C = {chunks} (the largest world size) is not a power of two dividing "
              f"the global batch {gbs}", file=sys.stderr)
    for w in worlds:
        ref = launcher.launch(launcher.request(f"bench_fsdp2_emulated_{w}", 1, base + [f"emulate_ranks={w}"],
                                               timeout=args.timeout, progress=False))
        ref.raise_for_status()
        n_bytes = sum(t.numel() * 4 for t in torch.load(ref.run_dir / "model.pt", weights_only=True).values()
                      if t.is_floating_point())
        for wrap, how in ROWS + (TREE_ROWS if tree_ref else ()):
            keys = [f"wrap={wrap}", f"grad_reduction={how}"] + (tree_keys if how == "tree" else [])
            r = launcher.launch(launcher.request(f"bench_fsdp2_{wrap}_{how}_{w}", w, base + keys,
                                                 timeout=args.timeout, progress=False))
            if not r.ok:
                print(f"{wrap} {how} at {w} ranks: FAILED\n{r}", file=sys.stderr)
                rows.append({"ranks": w, "wrap": wrap, "reduction": how, "ms_per_step": None})
                continue
            rep = parity.compare((tree_ref if how == "tree" else ref).run_dir, r.run_dir)
            held = runfiles.read_heartbeats(r.run_dir)[0].get("state_bytes", {})
            rows.append({"ranks": w, "wrap": wrap, "reduction": how,
                         "backend": json.loads((r.run_dir / runfiles.CONFIG).read_text())["backend"],
                         "ms_per_step": runfiles.ms_per_step(r.run_dir, args.warmup),
                         "bytes_received": bytes_received(n_bytes, w, wrap, how,
                                                          chunks // w if how == "tree" else 1),
                         "state_bytes": sum(held.values()), "held": held,
                         "tier": rep.tier, "max_abs_param_diff": rep.max_abs_param_diff})
            print(f"{wrap} {how} at {w} ranks: {rows[-1]['ms_per_step']:.1f} ms/step, tier {rep.tier}",
                  file=sys.stderr, flush=True)
    print(f"\nbench_fsdp2: preset={args.preset}, {args.steps} steps ({args.warmup} warm-up), "
          f"{n_bytes / 4:,.0f} parameters, torch {torch.__version__}; tier and |Δparam| against emulate_ranks=W "
          f"(tree rows: against one process's tree run, C = {chunks} chunks)")
    print(f"{'ranks':>5} {'wrap':>6} {'reduction':>10} {'backend':>8} {'ms/step':>9} {'vs DDP':>7} "
          f"{'vs stock':>8} {'MB recv/step':>13} {'MB held':>8} {'tier':>5} {'max |Δparam|':>13}")
    # vs DDP: against stock DDP at the same W; vs stock: against the same wrap's stock reduction at the same W
    stock = {(r["ranks"], r["wrap"]): r["ms_per_step"] for r in rows if r["reduction"] == "allreduce"}
    ddp = {w: ms for (w, wrap), ms in stock.items() if wrap == "ddp"}
    for r in rows:
        if r["ms_per_step"] is None:
            print(f"{r['ranks']:>5} {r['wrap']:>6} {r['reduction']:>10} FAILED")
            continue
        ratio = f"{r['ms_per_step'] / ddp[r['ranks']]:.2f}x" if ddp.get(r["ranks"]) else "-"
        own = stock.get((r["ranks"], r["wrap"]))
        vs_stock = f"{r['ms_per_step'] / own:.2f}x" if own else "-"
        print(f"{r['ranks']:>5} {r['wrap']:>6} {r['reduction']:>10} {r['backend']:>8} {r['ms_per_step']:>9.1f} "
              f"{ratio:>7} {vs_stock:>8} {r['bytes_received'] / 1e6:>13.3f} {r['state_bytes'] / 1e6:>8.3f} "
              f"{r['tier']:>5} {r['max_abs_param_diff']:>13.1e}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
