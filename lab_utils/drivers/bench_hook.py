"""What the order-fixed gradient reductions cost: time per step and bytes per rank, ordered and tree vs stock.

    ddp-lab bench hook                          # 2, 4, 8 ranks of the tiny GPT on this box
    ddp-lab bench hook --ranks 2 --preset workshop --json out.json   # e.g. on two GPUs (NCCL)

For each world size W: the emulated W-rank reference (one process), then W ranks with DDP's stock hook
(`grad_reduction=allreduce`) and with `grad_reduction=ordered` (lab_utils/core/ordered_reduce.py). Each row gives
ms per step after the warm-up, the bytes one rank receives per step for its gradient buckets (bandwidth-optimal
count: a ring all-reduce 2(W-1)/W·N, an all-gather (W-1)·N; N = 4 bytes x the gradient elements), and the
parity tier against the emulated reference with its max |Δloss|. `grad_reduction=tree` (chapter 13,
lab_utils/core/tree_reduce.py) is judged against the tree at one process instead (its promise: those bits at any W);
its bytes are the all-gather's (W-1)·N, `tree_halving` (`tree_comm=halving`) the ring's 2(W-1)/W·N.
`--micro-batch-size M` gives every run the same micro-batches (default: C = 8 chunks of global_batch_size/8 for
all, so the rows differ in the reduction only; stock and ordered then accumulate under no_sync). Backend `auto`:
NCCL where every rank has its own GPU, gloo otherwise (then ranks share the CPU cores, and time per step
measures that too).
"""

from __future__ import annotations

import json
import sys

import torch

from lab_utils.analysis import parity
from lab_utils.core import config, ordered_reduce, tree_reduce
from lab_utils.core.runfiles import ms_per_step
from lab_utils.drivers import bench_args
from lab_utils.launch import launcher

TREE_COMM = {"tree": "allgather", "tree_halving": "halving"}  # the bench's tree rows -> tree_comm


def main(argv: list[str] | None = None) -> int:
    ap = bench_args.parser("ddp-lab bench hook", __doc__, "2,4,8")
    ap.add_argument("--micro-batch-size", type=int, default=None,
                    help="samples per micro-batch in every run (default: global_batch_size / 8)")
    args, worlds = bench_args.parse(ap, argv)
    gbs = config.resolve([f"preset={args.preset}"], 1)["global_batch_size"]
    mbs = args.micro_batch_size or gbs // 8
    base = [f"preset={args.preset}", f"steps={args.steps}", "log_every=1000", "sampler=global",
            f"micro_batch_size={mbs}"]
    tree_ref = launcher.launch(launcher.request("bench_hook_tree_1", 1, base + ["grad_reduction=tree"],
                                                timeout=args.timeout, progress=False))
    tree_ref.raise_for_status()
    rows = []
    for w in worlds:
        ref = launcher.launch(launcher.request(f"bench_hook_emulated_{w}", 1, base + [f"emulate_ranks={w}"],
                                               timeout=args.timeout, progress=False))
        ref.raise_for_status()
        n = sum(t.numel() for t in torch.load(ref.run_dir / "model.pt", weights_only=True).values()
                if t.is_floating_point())
        for how in (*ordered_reduce.CHOICES, "tree", "tree_halving"):
            keys = ["grad_reduction=tree", "tree_comm=halving"] if how == "tree_halving" else [f"grad_reduction={how}"]
            r = launcher.launch(launcher.request(f"bench_hook_{how}_{w}", w, base + keys, timeout=args.timeout,
                                                 progress=False))
            if not r.ok:
                print(f"{how} at {w} ranks: FAILED\n{r}", file=sys.stderr)
                rows.append({"ranks": w, "reduction": how, "ms_per_step": None})
                continue
            rep = parity.compare(tree_ref.run_dir if how.startswith("tree") else ref.run_dir, r.run_dir)
            backend = json.loads((r.run_dir / "config.json").read_text())["backend"]
            rows.append({"ranks": w, "reduction": how, "backend": backend,
                         "ms_per_step": ms_per_step(r.run_dir, args.warmup),
                         "bytes_per_rank": (tree_reduce.bytes_per_rank(n, 4, w, TREE_COMM[how]) if how in TREE_COMM
                                            else ordered_reduce.bytes_per_rank(n, 4, w, how)),
                         "tier": rep.tier, "max_abs_loss_diff": rep.max_abs_loss_diff,
                         "max_abs_param_diff": rep.max_abs_param_diff})
            print(f"{how} at {w} ranks: {rows[-1]['ms_per_step']:.1f} ms/step, tier {rep.tier}", file=sys.stderr,
                  flush=True)
    print(f"\nbench_hook: preset={args.preset}, {args.steps} steps ({args.warmup} warm-up), "
          f"micro_batch_size={mbs}, {n:,} gradient elements, torch {torch.__version__}; tier and |Δ| against "
          f"emulate_ranks=W (tree: against the tree at 1 process)")
    print(f"{'ranks':>5} {'reduction':>12} {'backend':>8} {'ms/step':>9} {'vs stock':>9} {'MB/rank/step':>13} "
          f"{'tier':>5} {'max |Δloss|':>12} {'max |Δparam|':>13}")
    stock = {r["ranks"]: r["ms_per_step"] for r in rows if r["reduction"] == "allreduce"}
    for r in rows:
        if r["ms_per_step"] is None:
            print(f"{r['ranks']:>5} {r['reduction']:>12} FAILED")
            continue
        ratio = f"{r['ms_per_step'] / stock[r['ranks']]:.2f}x" if stock.get(r["ranks"]) else "-"
        print(f"{r['ranks']:>5} {r['reduction']:>12} {r['backend']:>8} {r['ms_per_step']:>9.1f} {ratio:>9} "
              f"{r['bytes_per_rank'] / 1e6:>13.2f} {r['tier']:>5} {r['max_abs_loss_diff']:>12.1e} "
              f"{r['max_abs_param_diff']:>13.1e}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
