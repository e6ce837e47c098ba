"""`ddp-lab doctor RUN_A RUN_B`: where two runs part, and why — the likely causes, ranked, with their evidence.

Taught in notebooks/10_workflow.ipynb (article §7.1-7.2, corrected). Built on the parity report
(lab_utils/parity.py): the tier, the first differing step and the cause `parity.diagnose` names come from
there unchanged, so `compare` and `doctor` never disagree. The doctor adds:

- **checked folders.** A path that is not a run folder (missing, no metrics.jsonl, an empty or corrupt one,
  a step without `loss`) is a `RunFolderError` that names the folder and the file, before anything is read;
- **where they part.** The first step whose loss, grad_norm or fingerprint is not identical, the first step
  over the tier-2 tolerances, and the tensors that moved most (model.pt);
- **every cause the files support, ranked.** `parity.diagnose` stops at its first match; the doctor runs every
  check and lists each cause with its evidence: the global batch (config.json, or the samples per step), the
  sample set of the first batch and the step where the sample sets part (metrics.jsonl `sample_ids`, written
  by lab_utils.record), the gradient-norm ratio, the epoch boundary, the initial weights (each rank's
  init fingerprint, from the heartbeats or record's config.json), per-rank randomness, BatchNorm buffers,
  and float order. The cause parity names ranks first; the others follow by the strength of their evidence.
- **a verdict.** Tier 3: "unchanged: bitwise". Tier 2: "no bug: float order" (with float twins: within their
  noise envelope, lab_utils/noise.py). Below: the top cause. Without twins, past the fixed tolerances with
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

from . import parity, runfiles
from .parity import CAUSES, Cause, ParityReport

# Evidence strength, for the ranking (the cause parity.diagnose names always comes first).
NAMED, STRONG, MEDIUM, WEAK = 100, 80, 50, 10


class RunFolderError(FileNotFoundError):
    """A path given to the doctor is not a readable run folder; the message names the folder and the file."""


@dataclass(frozen=True)
class Candidate:
    code: str       # a key of parity.CAUSES
    strength: int   # NAMED > STRONG > MEDIUM > WEAK
    evidence: str   # what in the two folders points to it, with numbers

    @property
    def meaning(self) -> str:
        return CAUSES[self.code]


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

    @property
    def ok(self) -> bool:
        return self.report.tier >= 2

    @property
    def top(self) -> Candidate | None:
        return self.causes[0] if self.causes else None

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 3 if self.report.needs_twin else 1

    def to_dict(self) -> dict:
        return {"run_a": self.run_a, "run_b": self.run_b, "tier": self.report.tier,
                "tier_name": self.report.tier_name, "verdict": self.verdict, "first_diff_step": self.first_diff_step,
                "first_diverging_step": self.first_diverging_step, "worst_tensors": self.worst_tensors,
                "causes": [{"code": c.code, "strength": c.strength, "evidence": c.evidence} for c in self.causes],
                "notes": self.notes}

    def format(self) -> str:
        step = lambda s: "none" if s is None else f"step {s}"  # noqa: E731
        r = self.report
        judged = "float twins: " + ", ".join(r.twins) if r.calibrated else "fixed tolerances"
        over = ("outside the float twins' envelope" if r.calibrated else
                f"|dloss| > {r.loss_tol:.0e} or rel |dgrad_norm| > {r.grad_rtol:.0e}")
        lines = [f"doctor {self.run_a} vs {self.run_b}: {self.verdict}",
                 f"  tier                {r.tier} ({r.tier_name}); {r.steps_compared} steps compared",
                 f"  judged by           {judged}",
                 f"  first differing     {step(self.first_diff_step)}   (loss, grad_norm or fingerprint not identical)",
                 f"  first diverging     {step(self.first_diverging_step)}   ({over})"]
        if self.worst_tensors:
            lines.append("  tensors that moved most: " + ", ".join(f"{n} {v:.2e}" for n, v in self.worst_tensors))
        if self.causes:
            lines.append("  likely causes, most likely first:")
            for i, c in enumerate(self.causes, 1):
                lines.append(f"   {i}. [{c.code}] {c.meaning}")
                lines.append(f"      evidence: {c.evidence}")
        lines += [f"  note: {n}" for n in self.notes]
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
                                 f"optimizer step with at least step and loss: lab_utils/runfiles.py)")
    cfg = run / runfiles.CONFIG
    if cfg.exists():
        try:
            json.loads(cfg.read_text())
        except ValueError:
            raise RunFolderError(f"{cfg}: not JSON") from None
    return run


# ------------------------------------------------------------------ the checks, each on its own
def _init_hashes(run: Path, config: dict) -> dict[int, str]:
    """{rank: fingerprint of the initial weights before the DDP wrap}: train.py's heartbeats, or record's
    config.json (`init_param_hash_by_rank`)."""
    by_rank = config.get("init_param_hash_by_rank")
    if by_rank:
        return {int(r): h for r, h in enumerate(by_rank)}
    return {r: b["init_param_hash"] for r, b in runfiles.read_heartbeats(run).items() if b.get("init_param_hash")}


def _sample_sets(metrics: list[dict]) -> list[frozenset] | None:
    if not metrics or any(m.get("sample_ids") is None for m in metrics):
        return None
    return [frozenset(m["sample_ids"]) for m in metrics]


def candidates(r: ParityReport, ma: list[dict], mb: list[dict], ca: dict, cb: dict, run_a: Path,
               run_b: Path) -> list[Candidate]:
    """Every cause the two folders give evidence for (unranked; parity's own cause included)."""
    ka, kb = ca.get("config", {}), cb.get("config", {})
    found: list[Candidate] = []
    add = lambda code, strength, text: found.append(Candidate(code, strength, text))  # noqa: E731

    # The global batch: config.json, or the samples counted per step (record writes them for any script).
    ga, gb = ka.get("global_batch_size"), kb.get("global_batch_size")
    if ga is not None and gb is not None and ga != gb:
        add("global_batch", STRONG, f"config.json: global_batch_size {ga} vs {gb}")
    elif ma[0].get("samples") and mb[0].get("samples") and ma[0]["samples"] != mb[0]["samples"]:
        add("global_batch", STRONG, f"metrics.jsonl: {ma[0]['samples']} vs {mb[0]['samples']} samples in step 0")

    # The sample sets (lab_utils.record's sample_ids): which step first sees other samples.
    sa, sb = _sample_sets(ma), _sample_sets(mb)
    if sa is not None and sb is not None:
        n = min(len(sa), len(sb))
        part = next((i for i in range(n) if sa[i] != sb[i]), None)
        if part == 0 and len(sa[0]) == len(sb[0]):
            add("data_or_init", STRONG, f"sample_ids: step 0 holds other samples ({len(sa[0] - sb[0])} of "
                                        f"{len(sa[0])} differ) — the sample set or the data order differs")
        elif part is not None and part > 0:
            add("sampler_epoch", STRONG, f"sample_ids: the same samples at steps 0-{part - 1}, other samples from "
                                         f"step {part} on — the data order changes there (an epoch boundary "
                                         f"reached without set_epoch, or a RandomSampler)")

    # The gradient scale.
    world = max(parity._ranks(ca) or 1, parity._ranks(cb) or 1)
    ratio0 = (mb[0].get("grad_norm") or 0) / ma[0]["grad_norm"] if ma[0].get("grad_norm") else None
    for w in ([world] if world > 1 else range(2, 65)):
        for target, word in ((1 / w, "1/world_size"), (w, "world_size")):
            if parity._near(ratio0, target) or parity._near(r.grad_norm_ratio_median, target):
                add("reduction_scale", STRONG, f"grad_norm B/A {parity._fmt(ratio0)} at step 0, "
                    f"{parity._fmt(r.grad_norm_ratio_median)} in the median = {word} ({w})")
                break
        else:
            continue
        break
    if ka.get("loss_reduction") and kb.get("loss_reduction") and ka["loss_reduction"] != kb["loss_reduction"]:
        add("reduction_scale", STRONG, f"config.json: loss_reduction {ka['loss_reduction']} vs {kb['loss_reduction']}")

    # The epoch boundary.
    starts = [s for s in (r.first_step_over_tol, r.first_step_over_grad_rtol) if s is not None]
    first = min(starts) if starts else None
    n_samples = ka.get("n_samples") or kb.get("n_samples")
    gbs = ga or gb
    if first and n_samples and gbs:
        boundary = parity.epoch_starts(n_samples, gbs, {parity._ranks(ca), parity._ranks(cb)}, r.steps_compared)
        if first in boundary:
            flag = [f"{nm} has set_epoch=false" for nm, k in (("A", ka), ("B", kb)) if k.get("set_epoch") is False]
            add("sampler_epoch", STRONG if flag else MEDIUM,
                f"first diverging step {first} = start of epoch {boundary[first]} (n_samples={n_samples}, "
                f"global_batch_size={gbs}: {n_samples / gbs:g} steps per epoch)"
                + (f"; {', '.join(flag)}" if flag else ""))

    # The initial weights: each run's rank-0 init fingerprint, and each rank's within a run.
    ha, hb = _init_hashes(run_a, ca), _init_hashes(run_b, cb)
    if ha.get(0) and hb.get(0) and ha[0] != hb[0]:
        add("data_or_init", STRONG, f"rank 0 built other initial weights (init fingerprints {ha[0]} vs {hb[0]}): "
                                    f"another init seed or model code")
    for nm, hashes in (("B", hb), ("A", ha)):
        if len(set(hashes.values())) > 1:
            add("per_rank_rng", MEDIUM, f"{nm}'s ranks built different initial weights before the wrap "
                f"({', '.join(f'rank {k} {v}' for k, v in sorted(hashes.items()))}): seeded per rank; the wrap "
                f"copies rank 0's weights, but every later draw (dropout, augmentation) still depends on the rank")
    for nm, c in (("B", cb), ("A", ca)):
        what = parity._randomness(c)
        if what:
            add("per_rank_rng", STRONG, f"{nm} draws {what} from the global RNG on {parity._ranks(c)} ranks")

    # BatchNorm: running statistics in model.pt and a different number of ranks.
    wa = runfiles.load_tensors(run_a)
    if wa and any(k.endswith("running_mean") for k in wa) and parity._ranks(ca) != parity._ranks(cb):
        synced = [nm for nm, k in (("A", ka), ("B", kb)) if k.get("sync_bn", "none") != "none"]
        if not synced:
            add("batch_norm", STRONG if r.loss_diffs and r.loss_diffs[0] > r.loss_bound(0) else MEDIUM,
                f"model.pt has BatchNorm running statistics and the runs use {parity._ranks(ca)} vs "
                f"{parity._ranks(cb)} ranks without sync_bn; step-0 |dloss| {r.loss_diffs[0]:.2e}")

    # Loss differs at step 0 with nothing above to say why.
    if r.loss_diffs and r.loss_diffs[0] > r.loss_bound(0) and not any(c.code == "data_or_init" for c in found):
        add("data_or_init", WEAK, f"step-0 |dloss| {r.loss_diffs[0]:.2e}: the first forward already differs")

    # Float order: the weakest unless nothing else fits; ruled out when B has left the float twins' envelope.
    if r.loss_diffs and not (r.calibrated and r.tier < 2):
        first_text = f"first diverging step {first}" if first is not None else "no step over the tolerances"
        add("float_order", WEAK, f"step-0 |dloss| {r.loss_diffs[0]:.1e}; {first_text}; max |dloss| "
                                 f"{r.max_abs_loss_diff:.1e}")
    return found


def rank_causes(named: Cause | None, found: list[Candidate]) -> list[Candidate]:
    """Parity's cause first (with every piece of evidence for it merged in), then the rest by strength."""
    merged: dict[str, Candidate] = {}
    for c in sorted(found, key=lambda c: -c.strength):
        if c.code in merged:
            old = merged[c.code]
            merged[c.code] = Candidate(c.code, old.strength, f"{old.evidence}; {c.evidence}")
        else:
            merged[c.code] = c
    if named is not None:
        extra = merged.pop(named.code, None)
        head = Candidate(named.code, NAMED, named.text + (f" [also: {extra.evidence}]" if extra else ""))
        return [head, *sorted(merged.values(), key=lambda c: -c.strength)]
    return sorted(merged.values(), key=lambda c: -c.strength)


def diagnose_runs(run_a: str | Path, run_b: str | Path, top: int = 3, noise_runs=None, **tolerances) -> Diagnosis:
    """The doctor's diagnosis of two run folders (run names or paths); RunFolderError on a bad folder.
    `noise_runs`: float twins of A (or "auto"), as for parity.compare; ValueError names a run that is no twin."""
    a, b = check_run_folder(run_a), check_run_folder(run_b)
    if noise_runs and noise_runs != "auto" and list(noise_runs) != ["auto"]:
        for t in noise_runs:
            check_run_folder(t)
    report = parity.compare(a, b, noise_runs=noise_runs, **tolerances)
    ma, mb = runfiles.read_metrics(a), runfiles.read_metrics(b)
    ca, cb = parity._read_config(a), parity._read_config(b)
    notes = [f"{nm}: no config.json — the causes read from the keys (batch, seeds, sampler) cannot be checked"
             for nm, path in (("A", a), ("B", b)) if not (path / runfiles.CONFIG).exists()]
    worst = sorted(report.per_tensor.items(), key=lambda kv: -kv[1])[:top]
    starts = [s for s in (report.first_step_over_tol, report.first_step_over_grad_rtol) if s is not None]
    first = min(starts) if starts else None
    if len(ma) != len(mb):
        first = min(len(ma), len(mb)) if first is None else first
    if report.tier == 3:
        verdict, causes = "unchanged: bitwise", []
    elif report.tier == 2:
        verdict = "no bug: float order"
        within = (f"within {report.margin:g}x the float-noise envelope of {', '.join(report.twins)} at every step"
                  if report.calibrated else "every step within the fixed tolerances")
        causes = [Candidate("float_order", NAMED,
                            f"tier 2: {within} (max |dloss| {report.max_abs_loss_diff:.1e}, max rel |dgrad_norm| "
                            f"{parity._fmt(report.max_rel_grad_norm_diff)}); only the float order of the sums differs")]
    elif report.needs_twin:
        causes = rank_causes(report.cause, candidates(report, ma, mb, ca, cb, a, b))
        verdict = ("not calibrated: past the fixed tolerances from step "
                   f"{first} with nothing but float order to blame — give a float twin of A (--noise) to tell "
                   f"amplified float noise from a bug")
    else:
        causes = rank_causes(report.cause, candidates(report, ma, mb, ca, cb, a, b))
        named = report.cause.code if report.cause else None
        if named is None and causes and causes[0].strength >= MEDIUM:  # parity named none; the evidence does
            named = causes[0].code
        verdict = f"bug: {named}" if named and named != "float_order" else (
            "diverged by float order only (no bug in the port)" if named == "float_order" else
            "the runs differ; no cause identified from the files")
    notes += report.notes
    return Diagnosis(a.name, b.name, report, verdict, report.first_diff_step, first,
                     [(n, v) for n, v in worst if math.isfinite(v)], causes, notes)
