"""`ddp-lab bench ops`: `doctor --ops` over the port-bug suite's 2-rank entries: the first op where each port parts.

    ddp-lab bench ops [--steps 4] [--json FILE]     # the toy size: ~1 min on 2 CPU cores

Each entry's single run and 2-rank port (lab_utils/analysis/portbugs.SUITE) run at the toy size with a window
state after every step (so a bug that starts at step 2 has B's own state to replay from); the doctor names the
first step outside float noise and `--ops` the first operation in it (lab_utils/analysis/ops.py). Printed per
entry: first_op (step, phase, module, op, |Δ| / bound) or null, and the worst |Δ| / bound of every phase: a
correct port's worst ratio is how far its float noise stays below the bound. tests/analysis/test_doctor_ops.py asserts
the rows the issue fixed (data, forward of the first BatchNorm, reduction, optimizer, null).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from lab_utils.analysis import doctor, portbugs
from lab_utils.core import op_trace, runfiles
from lab_utils.launch import launcher


def keys(given: tuple[str, ...], steps: int) -> tuple[str, ...]:
    return tuple(k for k in given if not k.startswith("steps=")) + (f"steps={steps}", "window_every=1")


def row(bug, a: Path, b: Path) -> dict:
    t = time.time()
    d = doctor.add_ops(doctor.diagnose_runs(a, b), op_trace.trace, op_trace.OpsUnsupported)
    return {"bug": bug.name, "expected": bug.expected, "doctor": d.verdict, "first_diverging_step":
            d.first_diverging_step, "first_op": d.ops.first_op if d.ops else None,
            "worst_ratio": {ph: w["ratio"] for ph, w in d.ops.to_dict()["worst"].items()} if d.ops else None,
            "not_judged": d.ops_not_judged, "seconds": round(time.time() - t, 2)}


def line(r: dict) -> str:
    f = r["first_op"]
    if r["not_judged"]:
        what = "not judged: " + r["not_judged"].split(": ", 1)[-1]
    elif f is None:
        worst = max(v for v in r["worst_ratio"].values() if v is not None) if r["worst_ratio"] else 0.0
        what = f"null (worst {worst:.2g} of a bound)" if r["worst_ratio"] else "null (bitwise)"
    else:
        ratio = "exact" if not f["bound"] else f"{f['max_abs_diff'] / f['bound']:.3g} x bound"
        what = f"step {f['step']} {f['phase']}: {f['module'] or '-'} {f['op']} ({ratio})"
    return f"{r['bug']:<36} {r['expected']:<8} {what}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ddp-lab bench ops", description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    bugs = [b for b in portbugs.SUITE if b.nproc == 2]
    specs = {}
    for bug in bugs:
        for n, ks in ((1, bug.single), (2, bug.ddp)):
            k = keys(ks, args.steps)
            specs[portbugs.run_name(n, k)] = (n, k)
    launcher.launch_many({name: launcher.request(name, n, list(k), timeout=900) for name, (n, k) in specs.items()},
                         max_workers=2, raise_on_failure=True)
    root = runfiles.runs_dir()
    rows = []
    for bug in bugs:
        a, b = (root / portbugs.run_name(n, keys(ks, args.steps)) for n, ks in ((1, bug.single), (2, bug.ddp)))
        rows.append(row(bug, a, b))
        print(line(rows[-1]), flush=True)
    if args.json:
        runfiles.write_json({"steps": args.steps, "torch": __import__("torch").__version__, "rows": rows},
                            args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
