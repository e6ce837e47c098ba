"""`ddp-lab doctor RUN_A RUN_B`: where two runs part, and why — the likely causes, ranked, with their evidence.

Taught in notebooks/10_workflow.ipynb (article §7.1-7.2, corrected). Built on the parity report
(lab_utils/analysis/parity.py) and its cause engine (lab_utils/analysis/causes.py): the tier, the first
differing step and the cause the report names come from there unchanged, so `compare` and `doctor` never
disagree. The doctor adds:

- **checked folders.** A path that is not a run folder (missing, no metrics.jsonl, an empty or corrupt one,
  a step without `loss`) is a `RunFolderError` that names the folder and the file, before anything is read;
- **where they part.** The first step whose loss, grad_norm or fingerprint is not identical, the first step
  over the tier-2 tolerances, and the tensors that moved most (model.pt);
- **every cause the files support, ranked.** The report names the first decisive one (`causes.first`); the
  doctor lists every candidate of every check (`causes.ranked`) with its evidence: the global batch (config.json,
  or the samples per step), the sample set of the first batch and the step where the sample sets part
  (metrics.jsonl `sample_ids`, written by lab_utils.core.record), the gradient-norm ratio, the epoch boundary, the
  initial weights (each rank's init fingerprint, from the heartbeats or record's config.json), per-rank
  randomness, batch-wide losses, BatchNorm, and float order. The named cause ranks first; the others follow by
  the strength of their evidence.
- **a verdict.** Tier 3: "unchanged: bitwise". Tier 2: "no bug: float order" (with float twins: within their
  noise envelope, lab_utils/analysis/noise.py). Below: the top cause. Without twins, past the fixed tolerances with
  nothing but float order to blame: "not calibrated" — amplified float noise and a small bug look alike there,
  and only a float twin (`--noise`) can tell them apart, so the doctor says so instead of guessing.

Exit codes of the CLI verb: 0 no bug (tier 2 or 3), 1 the runs differ below tier 2 (the causes are listed),
2 bad input (a folder that is not a run folder, or a run that is not a float twin, named), 3 not calibrated.

Analysis side: reads run folders only (runfiles), never the training code or the launcher.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from lab_utils.analysis import causes, ops, parity
from lab_utils.analysis.causes import MEDIUM, NAMED, Candidate
from lab_utils.analysis.parity import ParityReport
from lab_utils.core import runfiles


class RunFolderError(FileNotFoundError):
    """A path given to the doctor is not a readable run folder; the message names the folder and the file."""


@dataclass
class Diagnosis:
    run_a: str
    run_b: str
    report: ParityReport
    verdict: str                       # "unchanged: bitwise" | "no bug: float order" | "bug: <code>" | ...
    first_diff_step: int | None        # first step not identical (loss, grad_norm or fingerprint)
    first_diverging_step: int | None   # first step over the tier-2 tolerances (loss or grad norm)
    worst_tensors: list[tuple[str, float]]
    causes: list[Candidate] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    paths: tuple[Path, Path] | None = None  # the two folders, for a replay (--ops)
    ops: ops.OpsReport | None = None      # --ops: the first operation where the runs part
    ops_asked: bool = False
    ops_not_judged: str | None = None     # --ops asked, but the step could not be replayed op by op: why

    @property
    def ok(self) -> bool:
        """No bug: bitwise, or tier 2 at every step with no key that changes training differing."""
        r = self.report
        return r.tier == 3 or (r.certified and not r.config_diffs)

    @property
    def not_judged(self) -> bool:
        """Tier 2 as far as any check could see, but steps past that were judged by none."""
        r = self.report
        return r.tier == 2 and not r.certified and not r.config_diffs

    @property
    def top(self) -> Candidate | None:
        return self.causes[0] if self.causes else None

    @property
    def exit_code(self) -> int:
        if self.ops_not_judged:  # --ops asked a question the folders cannot answer: not judged, as below
            return 3
        return 0 if self.ok else 3 if self.report.needs_twin or self.not_judged else 1

    def to_dict(self) -> dict:
        d = {"run_a": self.run_a, "run_b": self.run_b, "tier": self.report.tier,
                "tier_name": self.report.tier_name, "verdict": self.verdict, "first_diff_step": self.first_diff_step,
                "first_diverging_step": self.first_diverging_step, "worst_tensors": self.worst_tensors,
                "causes": [{"code": c.code, "strength": c.strength, "evidence": c.evidence} for c in self.causes],
                "notes": self.notes, "not_judged_from": self.report.not_judged_from,
                "blind_from_step": self.report.blind_from_step, "config_diffs": self.report.config_diffs,
                "windows": self.report.windows.to_dict() if self.report.windows else None}
        if self.ops_asked:
            d["first_op"] = self.ops.first_op if self.ops else None
            d["ops"] = self.ops.to_dict() if self.ops else None
            d["ops_not_judged"] = self.ops_not_judged
        return d

    def format(self) -> str:
        step = lambda s: "none" if s is None else f"step {s}"  # noqa: E731
        r = self.report
        judged = "float twins: " + ", ".join(r.twins) if r.calibrated else "fixed tolerances"
        over = ("outside the float twins' envelope" if r.calibrated else
                f"|dloss| > {r.loss_tol:.0e} or rel |dgrad_norm| > {r.grad_rtol:.0e}")
        lines = [f"doctor {self.run_a} vs {self.run_b}: {self.verdict}",
                 f"  tier                {r.tier_text()}; {r.steps_compared} steps compared",
                 f"  judged by           {judged}",
                 f"  first differing     {step(self.first_diff_step)}   (loss, grad_norm or fingerprint not identical)",
                 f"  first diverging     {step(self.first_diverging_step)}   ({over})"]
        if r.blind_from_step is not None:
            lines.append(f"  blind from          step {r.blind_from_step}   (the whole-run envelope's bound reaches "
                         f"its cap: later steps are judged by windows only)")
        if r.windows is not None:
            lines.append(f"  windows             {len(r.windows.windows)} of {r.windows.every} steps, each against A's "
                         f"program replayed from B's own state:")
            lines += [f"    {row}" for row in r.windows.table().splitlines()]
        if r.config_diffs:
            lines.append(f"  config differs      {', '.join(r.config_diffs)}   (keys that change training)")
        if self.worst_tensors:
            lines.append("  tensors that moved most: " + ", ".join(f"{n} {v:.2e}" for n, v in self.worst_tensors))
        if self.causes:
            lines.append("  likely causes, most likely first:")
            for i, c in enumerate(self.causes, 1):
                lines.append(f"   {i}. [{c.code}] {c.meaning}")
                lines.append(f"      evidence: {c.evidence}")
        if self.ops is not None:
            lines += self.ops.format().splitlines()
        elif self.ops_not_judged:
            lines.append(f"  first op            not judged: {self.ops_not_judged}")
        elif self.ops_asked:
            lines.append("  first op            none: the runs are bitwise, no step to replay")
        lines += [f"  note: {n}" for n in self.notes]
        if r.steps_compared > 1 and r.loss_diffs:
            lines.append("  per step: |dloss| of B vs A, the float twins' (running max) and the tier-2 bound")
            lines += [f"    {row}" for row in r.divergence_table().splitlines()]
        return "\n".join(lines)


# ------------------------------------------------------------------ the folders
def check_run_folder(path: str | Path) -> Path:
    """The run folder at `path` (a run name or a path), or RunFolderError naming what is missing or broken."""
    try:
        run = parity.resolve_run(path)
    except FileNotFoundError:
        p = Path(path).expanduser()
        if not p.exists() and not (runfiles.runs_dir() / p).exists():
            raise RunFolderError(f"{path}: no such run folder (not a path, nor a run name under "
                                 f"{runfiles.runs_dir()})") from None
        where = p if p.exists() else runfiles.runs_dir() / p
        if not where.is_dir():
            raise RunFolderError(f"{path}: not a folder (give the run folder, not a file in it)") from None
        raise RunFolderError(f"{where}: no {runfiles.METRICS} — not a run folder, or the run never finished a "
                             f"step (files there: {', '.join(sorted(f.name for f in where.iterdir())[:8]) or 'none'})"
                             ) from None
    lines = (run / runfiles.METRICS).read_text().splitlines()
    if not any(line.strip() for line in lines):
        raise RunFolderError(f"{run / runfiles.METRICS}: empty — the run never finished a step")
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            raise RunFolderError(f"{run / runfiles.METRICS} line {i}: not JSON ({line[:60]!r})") from None
        if not isinstance(rec, dict) or "loss" not in rec:
            raise RunFolderError(f"{run / runfiles.METRICS} line {i}: no 'loss' field (one JSON object per "
                                 f"optimizer step with at least step and loss: lab_utils/core/runfiles.py)")
    cfg = run / runfiles.CONFIG
    if cfg.exists():
        try:
            json.loads(cfg.read_text())
        except ValueError:
            raise RunFolderError(f"{cfg}: not JSON") from None
    return run


def diagnose_runs(run_a: str | Path, run_b: str | Path, top: int = 3, noise_runs=None, replay=None,
                  **tolerances) -> Diagnosis:
    """The doctor's diagnosis of two run folders (run names or paths); RunFolderError on a bad folder.
    `noise_runs`: float twins of A (or "auto"), as for parity.compare; ValueError names a run that is no twin."""
    a, b = check_run_folder(run_a), check_run_folder(run_b)
    if noise_runs and noise_runs != "auto" and list(noise_runs) != ["auto"]:
        for t in noise_runs:
            check_run_folder(t)
    ra, rb = parity.load_run(a), parity.load_run(b)  # each folder read once, for the report and the causes
    report = parity.compare(ra, rb, noise_runs=noise_runs, replay=replay, **tolerances)
    ma, mb, ca, cb = ra.metrics, rb.metrics, ra.config, rb.config
    evidence = parity.evidence(report, ma, mb, ca, cb, ra.tensors, (ra.init_hashes, rb.init_hashes),
                               (ra.replica_hashes, rb.replica_hashes))
    notes = [f"{nm}: no config.json — the causes read from the keys (batch, seeds, sampler) cannot be checked"
             for nm, path in (("A", a), ("B", b)) if not (path / runfiles.CONFIG).exists()]
    worst = sorted(report.per_tensor.items(), key=lambda kv: -kv[1])[:top]
    starts = [s for s in (report.first_step_over_tol, report.first_step_over_grad_rtol) if s is not None]
    first = min(starts) if starts else None
    if len(ma) != len(mb):
        first = min(len(ma), len(mb)) if first is None else first
    if report.tier == 3:
        verdict, found = "unchanged: bitwise", []
    elif report.tier == 2 and report.config_diffs:
        verdict = (f"configs differ in a key that changes training ({', '.join(report.config_diffs)}): within float "
                   f"noise over the steps compared, but not the same program")
        found = causes.ranked(evidence, report.cause)
    elif report.tier == 2 and report.not_judged:
        n0 = report.not_judged_from
        verdict = (f"not judged past step {n0 - 1}: tier 2 up to there; steps {n0}..{report.not_judged[-1]} lie past "
                   f"the float twins' blind step and in no window — run B with window_every=10 (the default of "
                   f"lab runs; `record.Recorder(..., window_every=10)` in your own script) and run the doctor again")
        found = []
    elif report.tier == 2:
        verdict = "no bug: float order"
        within = (f"within {report.margin:g}x the float-noise envelope of {', '.join(report.twins)} at every step"
                  if report.calibrated else "every step within the fixed tolerances")
        found = [Candidate("float_order", NAMED,
                            f"tier 2: {within} (max |dloss| {report.max_abs_loss_diff:.1e}, max rel |dgrad_norm| "
                            f"{causes.fmt(report.max_rel_grad_norm_diff)}); only the float order of the sums differs")]
    elif report.needs_twin:
        found = causes.ranked(evidence, report.cause)
        verdict = ("not calibrated: past the fixed tolerances from step "
                   f"{first} with nothing but float order to blame — give a float twin of A (--noise) to tell "
                   f"amplified float noise from a bug")
    else:
        found = causes.ranked(evidence, report.cause)
        named = report.cause.code if report.cause else None
        if named is None and found and found[0].strength >= MEDIUM:  # the report named none; the evidence does
            named = found[0].code
        verdict = f"bug: {named}" if named and named != "float_order" else (
            # Float order alone does not take two runs to tier 0 (their last losses >5% apart): no verdict of "no bug".
            "no cause identified: only the float order differs in the keys, yet the runs do not even converge "
            "alike" if named == "float_order" else
            "the runs differ; no cause identified from the files")
    notes += report.notes
    return Diagnosis(a.name, b.name, report, verdict, report.first_diff_step, first,
                     [(n, v) for n, v in worst if math.isfinite(v)], found, notes, paths=(a, b))


def add_ops(diagnosis: Diagnosis, trace, unsupported: type[Exception]) -> Diagnosis:
    """`--ops`: replay the first step outside float noise op by op and judge it (analysis/ops.py). `trace` is
    lab_utils.core.op_trace.trace, passed in by the CLI: the analysis side runs no model code of its own;
    `unsupported` is the exception by which it says a step cannot be traced (then: not judged, exit 3)."""
    diagnosis.ops_asked = True
    step = ops.step_to_trace(diagnosis.first_diverging_step, diagnosis.first_diff_step)
    if step is None:
        return diagnosis

    try:
        diagnosis.ops = ops.judge(trace(*diagnosis.paths, step))
    except unsupported as e:
        diagnosis.ops_not_judged = str(e)
    return diagnosis


TRACE_FILE = "ops_trace.pt"  # lab_utils/core/op_record.TRACE: what a recorded script's trace run writes


def add_recorded_ops(diagnosis: Diagnosis, trace_a: str | Path, trace_b: str | Path) -> Diagnosis:
    """`--ops-traces TA TB`: a recorded script's step traced by the script itself (lab_utils/core/op_record.py:
    A's program and B's from B's state), judged op by op. The traced step must be the one the doctor names (the
    first outside float noise, else the first not bitwise); another step is not judged, with the step to trace."""
    diagnosis.ops_asked = True
    want = ops.step_to_trace(diagnosis.first_diverging_step, diagnosis.first_diff_step)
    loaded = []
    for folder in (trace_a, trace_b):
        path = Path(folder) / TRACE_FILE
        if not path.exists():
            raise FileNotFoundError(f"{folder} holds no {TRACE_FILE}: run your script with replay_from=B "
                                    f"trace_step=S out_dir={folder} (lab_utils/core/op_record.py)")
        loaded.append(torch.load(path, map_location="cpu", weights_only=True))
    if want is None:
        return diagnosis
    if loaded[0]["step"] != want or loaded[1]["step"] != want:
        diagnosis.ops_not_judged = (f"the traces are of step {loaded[0]['step']} (A) and {loaded[1]['step']} (B); "
                                    f"the doctor names step {want}: trace that step (trace_step={want})")
        return diagnosis
    diagnosis.ops = ops.judge_recorded(*loaded)
    return diagnosis
