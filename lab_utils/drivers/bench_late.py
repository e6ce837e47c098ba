"""Bugs that start late: what the whole-run envelope says of them, and what the windows say (no blind zone).

    ddp-lab bench late --size toy          # make test's size: ~2 min on 2 CPU cores
    ddp-lab bench late --size 4x256        # GPT 4x256, 150 steps, 2 ranks on CPU
    ddp-lab bench late --size workshop     # the workshop preset, 160 steps (a GPU box; add --amp bf16)

Each case is a 2-rank port of the single run A (with its float twin), judged by `doctor` twice: on the whole-run
envelope alone (`--windows off`) and with B's window states replayed (the default). The late bugs start after
the whole-run envelope has gone blind (its bound past noise.LOSS_CAP of the loss):
- late_set_epoch: `set_epoch=false`, the first epoch boundary placed past the blind step (toy: step 80);
- lossy_resume: rank 1 killed after an article-style checkpoint, the elastic restart resumes from it (the epoch
  restarts from its first sample: a real bug from the resumed step);
- lr_restart: killed and resumed from a lab checkpoint, but the learning-rate schedule restarts its warm-up at
  the resume (its state was not saved: `lr_bug=restart_on_resume`);
- correct and exact_resume: the correct port, and the same killed and resumed from a lab checkpoint (exact).
A row is right when the windows give exit 0 to a correct port and exit 1 with the expected cause to a bug. The
table also prints the cost: the single run's time, the replay's (replay + twin), and the window states' disk.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from lab_utils.analysis import doctor
from lab_utils.core import runfiles
from lab_utils.launch import launcher, replay, twins

# Per size: the keys of every run, and where the resume cases checkpoint and die (the fault step, after the
# checkpoint step; the restart resumes from the checkpoint). The toy's lr=0.03 makes the tiny GPT's float twins
# go blind by step ~26 (0.003, the default, keeps them at ulp level for hundreds of steps).
SCHEDULE = ("lr_schedule=warmup_cosine", "warmup_steps=10")  # as people train: every run of the suite has one
SIZES = {
    "toy": (("lr=0.03", "dropout=0", "steps=100", "n_samples=1280", *SCHEDULE), 90, 95),
    "4x256": (("n_layer=4", "n_embd=256", "n_head=4", "dropout=0", "steps=150", "n_samples=1920", *SCHEDULE),
              130, 135),
    "workshop": (("preset=workshop", "steps=160", *SCHEDULE), 150, 155),
}


@dataclass(frozen=True)
class Case:
    name: str
    keys: tuple[str, ...]
    resume: str | None  # None, or the checkpoint_style of a killed-and-restarted run
    cause: str | None   # the cause the doctor must name (None: a correct port, exit 0)
    sizes: tuple[str, ...] = tuple(SIZES)


CASES = (
    Case("correct", (), None, None),
    Case("late_set_epoch", ("set_epoch=false",), None, "sampler_epoch", ("toy", "4x256")),  # workshop: step 7
    Case("exact_resume", (), "lab", None),
    Case("lossy_resume", (), "article", "resume"),
    Case("lr_restart", ("lr_bug=restart_on_resume",), "lab", "resume"),
)


def specs(size: str, amp: str = "none", constant_lr: bool = False) -> dict:
    """Every run a size needs as specs (launcher.requests_from_specs makes them requests): A, its twin, one port
    per case. constant_lr: no warm-up and cosine (the float twins then drift faster and the whole run goes blind
    sooner; no lr_restart case)."""
    common, ckpt, fault = SIZES[size]
    common = (*(k for k in common if not (constant_lr and k in SCHEDULE)), f"amp={amp}")
    suffix, twin_keys = twins.twin_keys(list(common), 1)
    out = {"A": ("A", 1, list(common)), "twin": (f"A-twin-{suffix}", 1, twin_keys)}
    for c in cases(size, constant_lr):
        keys = [*common, *c.keys]
        kwargs = {}
        if c.resume:
            keys += [f"checkpoint_every={ckpt}", f"checkpoint_style={c.resume}", "fault=kill", "fault_rank=1",
                     f"fault_step={fault}", "resume=auto"]
            kwargs = {"max_restarts": 1}
        out[c.name] = (c.name, 2, keys, kwargs)
    return out


def cases(size: str, constant_lr: bool = False) -> list[Case]:
    return [c for c in CASES if size in c.sizes and not (constant_lr and c.name == "lr_restart")]


def judge(root: Path, size: str, progress: bool = False, constant_lr: bool = False) -> list[dict]:
    """One row per case: the doctor without and with windows, the cost of the replay."""
    rows = []
    a, twin = root / "A", next(p for p in root.glob("A-twin-*") if (p / runfiles.METRICS).exists())
    single_s = json.loads((a / runfiles.RESULT).read_text())["seconds"]
    for c in cases(size, constant_lr):
        b = root / c.name
        whole = doctor.diagnose_runs(a, b, noise_runs=[twin])
        t0 = time.time()
        pair = replay.ensure(a, b, progress=progress)
        replay_s = time.time() - t0
        win = doctor.diagnose_runs(a, b, noise_runs=[twin], replay=pair)
        top = win.top.code if win.top else None
        right = win.exit_code == 0 if c.cause is None else (win.exit_code == 1 and top == c.cause)
        report = win.report
        rows.append({"case": c.name, "expected": c.cause or "no bug", "whole_run": whole.report.tier_text(),
                     "whole_exit": whole.exit_code, "blind_from": report.blind_from_step,
                     "windows": report.tier_text(), "first_out": report.first_step_over_tol, "cause": top,
                     "exit": win.exit_code, "right": right,
                     "worst_correct_window": max((w.worst_ratio for w in report.windows.windows
                                                  if w.first_over is None), default=None),
                     "bug_window": max((w.worst_ratio for w in report.windows.windows
                                        if w.first_over is not None), default=None),
                     "single_s": single_s, "replay_s": replay_s,
                     "window_mb": sum(p.stat().st_size for p in (b / runfiles.WINDOWS).glob("*.pt")) / 2**20})
    return rows


def table(rows: list[dict]) -> str:
    head = (f"{'case':<15} {'expected':<14} {'whole run (windows off)':<44} {'exit':>4}  {'with windows':<26} "
            f"{'out at':>6} {'cause':<14} {'exit':>4} {'right':>5} {'x bound':>8} {'replay s':>8} {'MB':>6}")
    out = [head]
    for r in rows:
        ratio = r["bug_window"] if r["bug_window"] is not None else r["worst_correct_window"]
        out.append(f"{r['case']:<15} {r['expected']:<14} {r['whole_run']:<44} {r['whole_exit']:>4}  "
                   f"{r['windows']:<26} {str(r['first_out']):>6} {str(r['cause']):<14} {r['exit']:>4} "
                   f"{str(r['right']):>5} {ratio:8.2g} {r['replay_s']:8.1f} {r['window_mb']:6.1f}")
    single = rows[0]["single_s"] if rows else 0
    out.append(f"single run A: {single:.1f} s; 'x bound': a bug's window |Δ|/bound (>1 is out), or a correct port's "
               f"worst window (<1); replay s: replay + twin, launched two at a time")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ddp-lab bench late", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="toy", choices=sorted(SIZES))
    ap.add_argument("--amp", default="none", choices=("none", "bf16"))
    ap.add_argument("--constant-lr", action="store_true", help="no warm-up and cosine: the learning rate of "
                    "main at fc2f780's measurements (the whole run goes blind sooner)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    ap.add_argument("--json", type=Path, help="write the rows here")
    args = ap.parse_args(argv)
    root = runfiles.runs_dir()
    todo = {k: s for k, s in specs(args.size, args.amp, args.constant_lr).items()
            if not (root / s[0] / runfiles.RESULT).exists()}
    if todo:
        print(f"launching {len(todo)} run(s) into {root}/: {', '.join(s[0] for s in todo.values())}", flush=True)
        launcher.launch_many(launcher.requests_from_specs(todo, timeout=args.timeout), max_workers=2,
                             raise_on_failure=True)
    rows = judge(root, args.size, progress=True, constant_lr=args.constant_lr)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0 if all(r["right"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
