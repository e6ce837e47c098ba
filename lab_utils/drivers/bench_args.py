"""The command line the world-size benches share (`ddp-lab bench hook`, `ddp-lab bench fsdp2`): which world sizes,
how many steps and warm-up steps, the preset, the timeout, a JSON file; bad values named before any launch."""

from __future__ import annotations

import argparse
from pathlib import Path


def parser(prog: str, doc: str, default_ranks: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default=default_ranks, help="comma-separated world sizes")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--preset", default="cpu", choices=("cpu", "workshop"))
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--json", type=Path)
    return ap


def parse(ap: argparse.ArgumentParser, argv: list[str] | None) -> tuple[argparse.Namespace, list[int]]:
    """(the arguments, the world sizes); ap.error (exit 2, one line) on a bad --ranks or --warmup."""
    args = ap.parse_args(argv)
    try:
        worlds = [int(w) for w in args.ranks.split(",")]
    except ValueError:
        ap.error(f"--ranks {args.ranks!r}: expected comma-separated integers, e.g. 2,4,8")
    if any(w < 2 for w in worlds):
        ap.error(f"--ranks {args.ranks!r}: every world size must be >= 2")
    if not 1 <= args.warmup < args.steps:
        ap.error(f"--warmup {args.warmup} must be >= 1 and < --steps {args.steps}")
    return args, worlds
