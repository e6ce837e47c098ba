"""The port-bug suite at a real size, judged against float twins: does every verdict hold where noise has grown?

    ddp-lab bench portbugs                       # GPT 4x256, 150 steps (SIZES["4x256"]): ~45 runs, ~40 min on 2 cores
    ddp-lab bench portbugs --size toy            # the make-test size (8 steps of the tiny GPT), ~3 min
    ddp-lab bench portbugs --only plain_port,set_epoch_forgotten --json out.json
    ddp-lab bench portbugs --suite fsdp2         # FSDP2's suite (chapter 14), 4x256 too
    ddp-lab bench portbugs --parallel 3          # three launches at a time (a box with cores to spare)

Every entry of lab_utils/portbugs.SUITE (--suite fsdp2: FSDP2_SUITE; all: both): its single run, that run's float
twin (portbugs.twin) and the port, compared with `parity.compare(single, port, noise_runs=[twin])`, then by the
doctor on the same folders. A row gives the tier, the cause, and how far the port sits from the envelope in
envelopes (the largest |dloss| / E_loss or rel |dgrad| / E_grad over the steps, E without the margin): a correct
port's worst step, a bug's first step outside. The last lines count false accepts (a bug at tier >= 2) and false
rejects (a correct port below 2): both must be 0. Why a benchmark and not a test: at 4x256 the suite is ~40 minutes
on the CI box.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from lab_utils.analysis import doctor, noise, parity, portbugs
from lab_utils.core import runfiles
from lab_utils.launch import launcher, replay


def envelopes(report: parity.ParityReport, bug: portbugs.PortBug) -> float | None:
    """How many float-noise envelopes (bound / margin) the port is from A: worst step, or the first step out."""
    if not report.calibrated:
        return None
    per_step = noise.in_envelopes(report.loss_diffs, report.grad_rel_diffs, report.loss_bounds, report.grad_bounds,
                                  report.margin)
    outside = [s for s in (report.first_step_over_tol, report.first_step_over_grad_rtol) if s is not None]
    if bug.expected == "catch" and outside:
        return per_step[min(outside)]
    return max(per_step)


def replay_where_blind(suite, folders: dict, timeout: float, parallel: int) -> dict:
    """{entry: (replay, twin) folders} for each entry whose whole-run verdict goes blind (the float twins part
    past a step: long runs) and is not bitwise: A's program replayed from B's window states, so the doctor
    judges every window, as `ddp-lab doctor --replay` does. Without it a correct port past the blind step is
    "not judged" (exit 3), which is honest but no verdict. Entries run `parallel` at a time."""
    todo = {}
    for bug in suite:
        a, b, twin = folders[bug.name]
        report = parity.compare(a, b, noise_runs=[twin])
        if report.blind_from_step is not None and not report.bitwise:
            todo[bug.name] = (a, b)

    def one(name):
        try:
            return replay.ensure(*todo[name], timeout=timeout, progress=False)
        except replay.NoReplay as e:  # B holds no window states: the doctor says "not judged", by name
            print(f"{name}: no replay ({e})", flush=True)
            return None

    if todo:
        print(f"replaying {len(todo)} blind entries from their window states: {', '.join(todo)}", flush=True)
    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(todo) or 1))) as pool:
        done = dict(zip(todo, pool.map(one, todo), strict=True))
    return {k: v for k, v in done.items() if v is not None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ddp-lab bench portbugs", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="4x256", choices=sorted(portbugs.SIZES))
    ap.add_argument("--suite", default="ddp", choices=(*portbugs.SUITES, "all"))
    ap.add_argument("--only", default="", help="comma-separated suite entry names")
    ap.add_argument("--parallel", type=int, default=1, help="launches at a time (each rank one thread)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    ap.add_argument("--json", type=Path, help="write the rows here")
    args = ap.parse_args(argv)
    whole = [b for name, entries in portbugs.SUITES.items() if args.suite in (name, "all") for b in entries]
    suite = [b for b in whole if not args.only or b.name in args.only.split(",")]
    unknown = set(filter(None, args.only.split(","))) - {b.name for b in whole}
    if unknown:
        ap.error(f"--only: no entry of the {args.suite} suite named {', '.join(sorted(unknown))}")
    if args.parallel < 1:
        ap.error(f"--parallel {args.parallel}: must be >= 1")
    runs = portbugs.runs_needed(suite, args.size)
    root = runfiles.runs_dir()
    t0 = time.time()
    todo = {}
    for name, (nproc, keys) in runs.items():
        if (root / name / runfiles.RESULT).exists():
            print(f"{name}: already there", flush=True)
        else:
            todo[name] = launcher.request(name, nproc, list(keys), timeout=args.timeout, progress=False)
    done = 0

    def report(name, result):  # launch_many calls it as each run ends: progress on a ~40-minute job
        nonlocal done
        done += 1
        print(f"[{done}/{len(todo)}] {name} ({result.status} in {result.seconds:.0f} s, {time.time() - t0:.0f} s "
              f"so far)", flush=True)

    launcher.launch_many(todo, max_workers=args.parallel, raise_on_failure=True, on_done=report)
    rows, false_accepts, false_rejects = [], 0, 0
    folders = {}
    for bug in suite:
        single, port = portbugs.sized(bug.single, args.size), portbugs.sized(bug.ddp, args.size)
        a, b = root / portbugs.run_name(1, single), root / portbugs.run_name(bug.nproc, port)
        folders[bug.name] = (a, b, root / portbugs.twin(single)[0])
    replays = replay_where_blind(suite, folders, args.timeout, args.parallel)
    for bug in suite:
        a, b, twin = folders[bug.name]
        report = parity.compare(a, b, noise_runs=[twin])
        diagnosis = doctor.diagnose_runs(a, b, noise_runs=[twin], replay=replays.get(bug.name))
        problems = portbugs.problems(bug, report) + portbugs.doctor_problems(bug, diagnosis)
        false_accepts += bug.expected == "catch" and report.tier >= 2
        false_rejects += bug.expected != "catch" and report.tier < 2
        rows.append({"case": bug.name, "expected": bug.expected + (f" {bug.cause}" if bug.cause else ""),
                     "tier": report.tier, "cause": report.cause.code if report.cause else "-",
                     "envelopes": envelopes(report, bug),
                     "first_outside": min((x for x in (report.first_step_over_tol, report.first_step_over_grad_rtol)
                                           if x is not None), default=None),
                     "blind_from": report.blind_from_step, "doctor_exit": diagnosis.exit_code,
                     "bound_first": report.loss_bounds[0], "bound_last": report.loss_bounds[-1],
                     "max_dloss": report.max_abs_loss_diff, "ok": not problems, "problems": problems})
    head = (f"{'case':36} {'expected':32} {'tier':>4} {'cause':18} {'x envelope':>10} {'first out':>9} "
            f"{'blind from':>10} {'doctor':>6} {'max|dloss|':>10}  ok")
    print(f"\nport-bug suite at size {args.size} ({', '.join(portbugs.SIZES[args.size]) or 'the make-test keys'}), "
          f"judged against each single run's float twin (margin {noise.MARGIN:g}x)")
    print(head)
    print("-" * len(head))
    for r in rows:
        env = f"{r['envelopes']:.3g}" if r["envelopes"] is not None else "-"
        print(f"{r['case']:36} {r['expected']:32} {r['tier']:>4} {r['cause']:18} {env:>10} "
              f"{str(r['first_outside']) if r['first_outside'] is not None else '-':>9} "
              f"{str(r['blind_from']) if r['blind_from'] is not None else '-':>10} {r['doctor_exit']:>6} "
              f"{r['max_dloss']:10.2e}  {'ok' if r['ok'] else 'NO: ' + '; '.join(r['problems'])}")
    print(f"\nfalse accepts (a bug at tier >= 2): {false_accepts}; false rejects (a correct port below tier 2): "
          f"{false_rejects}; {len(runs)} runs, {time.time() - t0:.0f} s")
    if args.json:
        args.json.write_text(json.dumps({"size": args.size, "rows": rows, "false_accepts": false_accepts,
                                         "false_rejects": false_rejects}, indent=1))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
