"""`make lab`'s headline demo: the tiny GPT trained single-process and with 2 ranks, compared.

Four real runs: single, the correct 2-rank port, the naive port (global batch doubled), and the
emulated-2-rank reference. Prints the parity table and writes runs/demo_parity.png.
"""

import sys
import time

from lab_utils.analysis import parity, plotting
from lab_utils.core import runfiles
from lab_utils.launch import launcher

STEPS = 40
RUNS = [  # (name, nproc, keys, what it is)
    ("demo_single", 1, [], "single process, global batch 16"),
    ("demo_correct", 2, [], "2 ranks, global batch 16 (8 per rank)"),
    ("demo_naive", 2, ["global_batch_size=32"], "2 ranks, 16 per rank: global batch doubled"),
    ("demo_emulated", 1, ["emulate_ranks=2"], "1 process laid out as 2 ranks"),
]


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="ddp-lab demo", description=__doc__)
    ap.add_argument("--steps", type=int, default=STEPS, help="optimizer steps per run")
    args = ap.parse_args(argv)
    start = time.time()
    for name, nproc, keys, what in RUNS:
        print(f"\n== {name}: {what}")
        result = launcher.launch(launcher.request(name, nproc, [f"steps={args.steps}", *keys], timeout=300))
        if not result.ok:
            print(result)
            return 1
    runs = runfiles.runs_dir()
    pairs = [("demo_single", "demo_correct", "correct port"), ("demo_single", "demo_naive", "naive port"),
             ("demo_emulated", "demo_correct", "2 ranks vs emulated")]
    print(f"\n{'comparison':<22} {'tier':<22} {'max |dloss|':>12} {'bitwise':>8} {'worst tensor':<26}")
    for a, b, label in pairs:
        r = parity.compare(runs / a, runs / b)
        print(f"{label:<22} {f'{r.tier} ({r.tier_name})':<22} {r.max_abs_loss_diff:>12.2e} {str(r.bitwise):>8} "
              f"{(r.worst_tensor if r.max_abs_param_diff else '-') or '-':<26}")  # no worst when all equal
    png = runs / "demo_parity.png"
    plotting.plot_parity(runs / "demo_single",
                         [runs / "demo_correct", runs / "demo_naive"], path=png,
                         pairs=[(runs / "demo_emulated", runs / "demo_correct")],
                         title=f"tiny GPT, {args.steps} AdamW steps")
    print(f"\nplot: {png}  (loss curves, and |Δloss| vs the single run on a log scale)")
    print("details: .venv/bin/ddp-lab compare demo_single demo_correct")
    print("notebooks: .venv/bin/jupyter lab notebooks/   (start with 00_preflight.ipynb)")
    print(f"demo took {time.time() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
