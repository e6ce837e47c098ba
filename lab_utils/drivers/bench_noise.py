"""Where noise.MARGIN comes from: every correct pair and every bug in the committed float-noise measurements,
judged with one float twin at a time, in envelopes (B's distance from A over the twin's running-max distance).

    ddp-lab bench noise            # the files under docs/measured/ named in SETS; prints the table, ~1 s

A correct pair's worst step must sit well below the margin, a bug's first step outside far above it. The files:
docs/measured/cpu2/noise_envelope_4x256/ (GPT 4x256, 150 steps, 2-core CPU, gloo) and
docs/measured/h200/noise_growth/ (the workshop preset, 150 steps, one H200, fp32 and bf16); each folder's README
says how each run was made. tests/analysis/test_noise.py asserts the margin against this table. Below it, per scale, the
windows' side from the committed `ddp-lab bench late` rows (docs/measured/**/late_*.json): the correct ports'
worst window and the bugs' first window out, in envelopes; then the floor and the caps.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

from lab_utils.analysis import noise, parity
from lab_utils.core.runfiles import REPO

MEASURED = REPO / "docs" / "measured"


@dataclass(frozen=True)
class Pair:
    folder: str  # under docs/measured
    a: str
    twin: str
    b: str
    what: str  # "correct" or the bug's cause code


SETS = [
    *(Pair("cpu2/noise_envelope_4x256", "A", t, b, "correct") for t in ("C", "C2") for b in ("B", "B4", "C", "C2")
      if b != t),
    *(Pair("cpu2/noise_envelope_4x256", "A", t, b, cause) for t in ("C", "C2")
      for b, cause in (("B2", "global_batch"), ("B3", "sampler_epoch"))),
    *(Pair("h200/noise_growth", f"s_{p}", f"{t}_{p}", f"{b}_{p}", "correct") for p in ("none", "bf16")
      for t in ("a", "e") for b in ("a", "e", "d") if b != t),
]


def judge(pair: Pair, margin: float = noise.MARGIN) -> dict:
    """The pair's report against its one twin, and its distance in envelopes (worst step, or first step out)."""
    root = MEASURED / pair.folder
    ma, mt, mb = ([json.loads(line) for line in (root / f"{x}.jsonl").read_text().splitlines() if line.strip()]
                  for x in (pair.a, pair.twin, pair.b))  # each file is one run's metrics.jsonl
    r = parity.classify(ma, mb, None, None, names=(pair.a, pair.b), twins=[noise.Twin(pair.twin, mt)], margin=margin)
    env = noise.in_envelopes(r.loss_diffs, r.grad_rel_diffs, r.loss_bounds, r.grad_bounds, r.margin)
    outside = [s for s in (r.first_step_over_tol, r.first_step_over_grad_rtol) if s is not None]
    step = min(outside) if pair.what != "correct" and outside else max(range(len(env)), key=env.__getitem__)
    return {"pair": pair, "envelopes": env[step], "step": step, "inside": not outside, "report": r}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ddp-lab bench noise", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.parse_args(argv)
    rows = [judge(p) for p in SETS]
    print(f"{'measurement':28} {'A':7} {'twin':7} {'B':7} {'what':14} {'x envelope':>10} {'at step':>7}  verdict")
    for r in rows:
        p = r["pair"]
        verdict = "inside (tier 2)" if r["inside"] else "outside"
        print(f"{p.folder:28} {p.a:7} {p.twin:7} {p.b:7} {p.what:14} {r['envelopes']:10.3g} {r['step']:7d}  {verdict}")
    correct = [r["envelopes"] for r in rows if r["pair"].what == "correct"]
    bugs = [r["envelopes"] for r in rows if r["pair"].what != "correct"]
    print(f"\nworst correct pair: {max(correct):.3g} envelopes; smallest bug at its onset: {min(bugs):.3g}; "
          f"MARGIN = {noise.MARGIN:g} ({noise.MARGIN / max(correct):.1f}x the worst correct pair, "
          f"{min(bugs) / noise.MARGIN:.0f}x below the smallest bug)")
    print(windows_table())
    print(f"floor: {noise.FLOOR_ULPS} fp32 ulps, inside the margin (a bound is never below MARGIN x "
          f"{noise.FLOOR_ULPS} ulps = {noise.MARGIN * noise.FLOOR_ULPS:g} ulps); caps: {noise.LOSS_CAP:.0%} of the "
          f"loss, {noise.GRAD_CAP:g} relative grad norm (past them a step is 'not judged')")
    return 0


def windows_table() -> str:
    """Per scale, from the committed `ddp-lab bench late` rows (docs/measured/*/late_*.json): the correct ports'
    worst window and the bugs' first window out, in envelopes (|Δ| / (bound / MARGIN)) — the margin's other
    side, measured where the windows judge: from B's own state, at any step."""
    out = [f"\n{'windows (bench late)':34} {'worst correct window':>21} {'smallest bug window':>19}  right"]
    for path in sorted(MEASURED.rglob("late_*.json")):
        rows = json.loads(path.read_text())
        ok = [r["worst_correct_window"] * noise.MARGIN for r in rows if r["expected"] == "no bug"
              and r["worst_correct_window"] is not None]
        bad = [r["bug_window"] * noise.MARGIN for r in rows if r["expected"] != "no bug" and r["bug_window"]]
        out.append(f"{str(path.relative_to(MEASURED)):34} {max(ok, default=float('nan')):21.3g} "
                   f"{min(bad, default=float('nan')):19.3g}  {sum(r['right'] for r in rows)}/{len(rows)}")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
