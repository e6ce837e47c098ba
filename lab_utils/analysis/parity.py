"""The parity report: how "unchanged" is run B compared with run A? (article §1.1, made measurable)

Taught in notebooks/01_unchanged.ipynb. The tiers, exactly:

- **tier 3 — bitwise.** Same number of steps; every step's logged loss, grad_norm and parameter fingerprint
  (runfiles.fingerprint: a hash of every parameter's exact bits) is the same; every final tensor in model.pt
  is `torch.equal`. Nothing is within a tolerance. Runs logged with fingerprint=false cannot prove it (no
  per-step hashes).
- **tier 2 — step-wise.** Same number of steps, and B within float noise of A at *every* step:
  - **with float twins of A** (`noise_runs`; lab_utils/analysis/noise.py has the rule and the measurements behind its
    margin): |Δloss| and the relative |Δgrad_norm| within `noise.MARGIN` x the twins' running-max distance from
    A (at least `noise.FLOOR_ULPS` ulps); final weights per tensor, or the probe outputs, within MARGIN x the
    twins' (at least `param_tol` / `output_tol`). This is the rule that holds at a real width and length.
  - **without twins**, fixed tolerances (`TOLERANCES`): |Δloss| <= `loss_tol` (1e-6), relative |Δgrad_norm| <=
    `grad_rtol` (1e-4), every parameter within `param_tol` (1e-4) **or** the probe outputs within `output_tol`
    (1e-4). They hold for short runs of small models only (the tiny GPT for 40 steps: max |Δloss| 9.54e-7,
    `ddp-lab demo`); past them, with float order the only cause the files show, the report sets `needs_twin`
    ("not calibrated") instead of calling it a bug.
  Why the outputs route: Adam turns float noise in a parameter whose gradient is exactly or nearly zero
  into full-size steps. The tiny GPT's key bias (qkv.bias, k part) gets exactly zero gradient — softmax
  ignores a constant added to every score — and drifts between a single run and a 2-rank run whose losses
  agree to ulps, while the outputs do not move (chapter 01 prints it; a bias before BatchNorm does the same,
  chapter 07). The per-tensor list always names the worst tensor, so nothing is hidden.
  Why the gradient norm: Adam divides each update by the running RMS of the gradient, so a gradient scaled by
  a constant gives almost the same steps. The article's §3.2 bug (a sum loss without x world_size: every
  gradient x 1/2 on 2 ranks) keeps the loss within 4.8e-7 of the single run under AdamW (`ddp-lab bench
  portbugs --size toy`, sum_loss_unscaled_adamw); its grad_norm is exactly half, 1e6 envelopes away at step 0.
  Runs without grad_norm (older files) cannot reach tier 2: the loss alone cannot see this.
- **tier 1 — same convergence.** Both runs finite, and the mean loss of the last 10% of steps (at least 1)
  agrees within `conv_rtol` (default 5%, relative).
- **tier 0 — diverged.** Anything else (including a NaN/inf loss).

`first_diff_step` is the first step whose loss, grad_norm or fingerprint is not identical (None if none);
`first_step_over_tol` the first whose |Δloss| exceeds its bound (`loss_bounds`: fixed or calibrated);
`first_step_over_grad_rtol` the first whose relative |Δgrad_norm| exceeds its bound (`grad_bounds`);
`grad_norm_ratio_median` the median of
grad_norm_B / grad_norm_A over the steps.

**Cause.** Below tier 2 the report names the likely cause when the evidence points to one (`cause`: a
code of `CAUSES` and a sentence), from the two runs' files only: the first decisive finding of the cause
engine (lab_utils/analysis/causes.py, one rule per cause, shared with `ddp-lab doctor`), which starts at the first step
where B leaves what A's float noise allows. No cause fits: the report says so and lists the config.json
differences in a note.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from lab_utils.analysis import causes, noise
from lab_utils.analysis import windows as windows_mod
from lab_utils.analysis.causes import BOOKKEEPING, CAUSES, Cause, config_differences, epoch_starts  # noqa: F401 (the report's names)
from lab_utils.core import float_twin, runfiles
from lab_utils.core.runfiles import read_metrics

LOSS_TOL = 1e-6
PARAM_TOL = 1e-4
OUTPUT_TOL = 1e-4
GRAD_RTOL = 1e-4
CONV_RTOL = 0.05

# The fixed tier-2 tolerances (used without float twins): fp32 on CPU and the GPT on CUDA. No per-device table:
# where kernels differ by batch shape (cuDNN convolutions for bn_net on CUDA) or precision is coarser (bf16,
# tf32), the noise is measured with a float twin (`--noise`) instead of loosened by analogy, and past the fixed
# tolerances the report says "not calibrated" rather than "bug". `TOLERANCES` stays the one place a measured
# exception would go: {(workload, device type): {tolerance: value}}, each with its file.
DEFAULT_TOLERANCES = {"loss_tol": LOSS_TOL, "param_tol": PARAM_TOL, "output_tol": OUTPUT_TOL,
                      "grad_rtol": GRAD_RTOL}
TOLERANCES: dict[tuple[str, str], dict[str, float]] = {}


def tolerances_for(config_a: dict, config_b: dict) -> dict:
    """The tier-2 tolerances for two runs, from their config.json: per workload and device type."""
    key = lambda c: (c.get("config", {}).get("model"), str(c.get("device", "cpu")).split(":")[0])  # noqa: E731
    looser = [{**DEFAULT_TOLERANCES, **TOLERANCES.get(key(c), {})} for c in (config_a, config_b)]
    return {k: max(t[k] for t in looser) for k in DEFAULT_TOLERANCES}


TIER_NAMES = {3: "bitwise", 2: "step-wise", 1: "same convergence", 0: "diverged"}

@dataclass
class ParityReport:
    run_a: str
    run_b: str
    tier: int
    bitwise: bool
    steps_compared: int
    max_abs_loss_diff: float
    first_diff_step: int | None
    first_step_over_tol: int | None
    max_abs_param_diff: float | None
    worst_tensor: str | None
    max_abs_output_diff: float | None
    final_loss_a: float
    final_loss_b: float
    max_rel_grad_norm_diff: float | None = None  # None: a run logged no grad_norm
    first_step_over_grad_rtol: int | None = None
    grad_norm_ratio_median: float | None = None  # median of grad_norm_B / grad_norm_A
    cause: Cause | None = None
    per_tensor: dict[str, float] = field(default_factory=dict)
    loss_diffs: list[float] = field(default_factory=list)
    grad_rel_diffs: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    loss_tol: float = LOSS_TOL
    param_tol: float = PARAM_TOL
    output_tol: float = OUTPUT_TOL
    grad_rtol: float = GRAD_RTOL
    # The float-noise calibration (lab_utils/analysis/noise.py): with twins, tier 2 is judged against their envelope.
    calibrated: bool = False
    twins: list[str] = field(default_factory=list)
    margin: float = 1.0
    loss_bounds: list[float] = field(default_factory=list)  # per step: the largest |dloss| tier 2 accepts
    grad_bounds: list[float] = field(default_factory=list)  # per step: the largest rel |dgrad_norm|
    twin_loss: list[float] = field(default_factory=list)  # per step: the twins' running-max |dloss| against A
    twin_grad: list[float] = field(default_factory=list)
    blind_from_step: int | None = None  # calibrated: from here on the whole-run bound reaches a cap (noise.py)
    # Steps no check could judge: past the whole-run blind step and not covered by a window (analysis/windows.py).
    # Tier 2 with steps here is "tier 2 up to the first of them", never a certificate for the rest.
    not_judged: list[int] = field(default_factory=list)
    windows: windows_mod.WindowJudgement | None = None
    config_diffs: list[str] = field(default_factory=list)  # keys that change training: "key=A vs B"
    order_diffs: list[str] = field(default_factory=list)   # keys that change the float order or nothing
    # Not calibrated, past the fixed tolerances and nothing but float order to blame: not a verdict on the port.
    needs_twin: bool = False

    @property
    def tier_name(self) -> str:
        return TIER_NAMES[self.tier]

    @property
    def not_judged_from(self) -> int | None:
        return self.not_judged[0] if self.not_judged else None

    @property
    def certified(self) -> bool:
        """Tier 2 or 3 over every step: what "no bug" may be said of (a tier 2 with unjudged steps is not)."""
        return self.tier == 3 or (self.tier == 2 and not self.not_judged)

    def tier_text(self) -> str:
        if self.tier == 2 and self.not_judged:
            return (f"tier 2 ({self.tier_name}) up to step {self.not_judged[0] - 1}; steps {self.not_judged[0]}.."
                    f"{self.not_judged[-1]} not judged")
        return f"tier {self.tier} ({self.tier_name})"

    def loss_bound(self, step: int) -> float:
        return self.loss_bounds[step] if self.loss_bounds else self.loss_tol

    def to_dict(self, full: bool = False) -> dict:
        d = asdict(self)
        d["tier_name"] = self.tier_name
        if self.loss_bounds:
            d["envelope_first"] = {"loss": self.loss_bounds[0], "grad": self.grad_bounds[0]}
            d["envelope_last"] = {"loss": self.loss_bounds[-1], "grad": self.grad_bounds[-1]}
        d["not_judged_from"] = self.not_judged_from
        d["certified"] = self.certified
        if self.windows is not None:
            d["windows"] = self.windows.to_dict()
        if not full:
            for k in ("loss_diffs", "grad_rel_diffs", "loss_bounds", "grad_bounds", "twin_loss", "twin_grad"):
                d.pop(k)
            d["not_judged"] = len(self.not_judged)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def format(self, top: int = 5) -> str:
        step = lambda s: f"step {s}" if s is not None else "none"  # noqa: E731
        if self.calibrated:
            rule = (f"float-noise envelope of {len(self.twins)} twin(s): {', '.join(self.twins)}; "
                    f"tier 2 needs every step within {self.margin:g}x of it")
            loss_need = f"bound {self.loss_bounds[0]:.1e} at step 0 .. {self.loss_bounds[-1]:.1e} at the last"
            grad_need = f"bound {self.grad_bounds[0]:.1e} .. {self.grad_bounds[-1]:.1e}"
        else:
            rule = "fixed tolerances (not calibrated: `--noise TWIN` judges against measured float noise)"
            loss_need, grad_need = f"tier 2 needs <= {self.loss_tol:.0e}", f"tier 2 needs <= {self.grad_rtol:.0e}"
        lines = [
            f"parity {self.run_a} vs {self.run_b}: {self.tier_text()}",
            f"  rule                {rule}",
            f"  steps compared      {self.steps_compared}",
            f"  bitwise             {self.bitwise}",
            f"  max |dloss|         {self.max_abs_loss_diff:.3e}   ({loss_need})",
            f"  first differing     {step(self.first_diff_step)}",
            f"  first over bound    {step(self.first_step_over_tol)}",
        ]
        if self.max_rel_grad_norm_diff is not None:
            lines += [f"  max rel |dgrad_norm| {self.max_rel_grad_norm_diff:.3e}   ({grad_need})   first over: "
                      f"{step(self.first_step_over_grad_rtol)}",
                      f"  grad_norm B/A       {self.grad_norm_ratio_median:.4g}   (median over steps)"]
        if self.blind_from_step is not None:
            lines.append(f"  blind from          step {self.blind_from_step}   (the whole-run bound reaches "
                         f"{noise.LOSS_CAP:.0%} of the loss or {noise.GRAD_CAP:.0%} of the grad norm: a difference "
                         f"that starts later hides in the noise)")
        if self.windows is not None:
            w = self.windows
            lines.append(f"  windows             {len(w.windows)} window(s) of {w.every} steps, each judged against "
                         f"A's program replayed from B's state ({w.replay}) and its twin ({w.twin})")
            lines += [f"    {row}" for row in w.table().splitlines()]
        if self.not_judged:
            lines.append(f"  not judged          steps {self.not_judged[0]}..{self.not_judged[-1]} "
                         f"({len(self.not_judged)} steps): past the blind step and in no window — record window "
                         f"states (window_every=10, the default) and compare again")
        if self.config_diffs:
            lines.append(f"  config differs      {', '.join(self.config_diffs)}   (keys that change training)")
        if self.order_diffs:
            lines.append(f"  config differs      {', '.join(self.order_diffs)}   (keys that change the float order "
                         f"or nothing)")
        lines.append(f"  final loss          {self.final_loss_a:.6f} vs {self.final_loss_b:.6f}")
        if self.max_abs_param_diff is not None:
            need = (f"tier 2: each tensor within {self.margin:g}x the twins' (or {self.param_tol:.0e})"
                    if self.calibrated else f"tier 2 needs <= {self.param_tol:.0e}")
            lines.append(f"  max |dparam|        {self.max_abs_param_diff:.3e}   worst: {self.worst_tensor}   ({need})")
            worst = sorted(self.per_tensor.items(), key=lambda kv: -kv[1])[:top]
            lines += [f"    {v:.3e}  {k}" for k, v in worst]
        if self.max_abs_output_diff is not None:
            accepts = (f"{self.margin:g}x the twins' (or {self.output_tol:.0e})" if self.calibrated
                       else f"<= {self.output_tol:.0e}")
            lines.append(f"  max |doutput|       {self.max_abs_output_diff:.3e}   (probe batch, eval mode; "
                         f"tier 2 accepts {accepts} when params differ)")
        if self.cause is not None:
            lines.append(f"  likely cause        [{self.cause.code}] {self.cause.text}")
        elif self.tier < 2:
            lines.append("  likely cause        none identified from the files")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def divergence_table(self, every: int | None = None) -> str:
        """Per step, |dloss| of B against A beside the twins' and the bound, as text (log-scale numbers)."""
        every = every or max(1, self.steps_compared // 12)
        head = f"{'step':>5}  {'|dloss| B':>10}  {'twins':>10}  {'bound':>10}"
        rows = [head]
        for s in range(self.steps_compared):
            if s % every and s != self.steps_compared - 1 and s != self.first_step_over_tol:
                continue
            twin = f"{self.twin_loss[s]:10.1e}" if self.twin_loss else f"{'-':>10}"
            mark = "  <- leaves the envelope" if s == self.first_step_over_tol else ""
            rows.append(f"{s:5d}  {self.loss_diffs[s]:10.1e}  {twin}  {self.loss_bound(s):10.1e}{mark}")
        return "\n".join(rows)


def evidence(report: ParityReport, ma, mb, ca: dict, cb: dict, wa: dict | None,
             init_hashes: tuple[dict, dict] = ({}, {}), replicas: tuple[dict, dict] = ({}, {})) -> causes.Evidence:
    """What the cause engine reads about two runs (lab_utils/analysis/causes.py)."""
    return causes.Evidence(report, ma, mb, ca, cb, wa, *init_hashes, *replicas)


def compare_weights(a: dict, b: dict) -> tuple[dict[str, float], bool, list[str]]:
    """Per-tensor max |Δ| over the tensors both have; bitwise flag; notes on mismatched names/shapes."""
    notes, per, equal = [], {}, True
    only = sorted(set(a) ^ set(b))
    if only:
        notes.append(f"tensors in one run only: {', '.join(only[:5])}")
        equal = False
    for name in sorted(set(a) & set(b)):
        ta, tb = a[name], b[name]
        if ta.shape != tb.shape:
            notes.append(f"{name}: shape {tuple(ta.shape)} vs {tuple(tb.shape)}")
            equal = False
            continue
        if not ta.is_floating_point():
            equal &= torch.equal(ta, tb)
            continue
        per[name] = float((ta.double() - tb.double()).abs().max()) if ta.numel() else 0.0
        equal &= torch.equal(ta, tb)
    return per, equal, notes


def same_value(x, y) -> bool:
    """x == y, with NaN equal to NaN (a logged grad_norm of a step skipped for inf/NaN gradients)."""
    return x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))


def grad_norm_diffs(ma: list[dict], mb: list[dict], n: int) -> tuple[list[float], list[float]] | None:
    """Per step: relative |Δgrad_norm| (|b - a| / max(|a|, |b|)) and the ratio b / a; None if a run has none."""
    ga, gb = [r.get("grad_norm") for r in ma[:n]], [r.get("grad_norm") for r in mb[:n]]
    if any(g is None for g in ga + gb):
        return None
    rel, ratio = [], []
    for x, y in zip(ga, gb, strict=True):
        if not (math.isfinite(x) and math.isfinite(y)):
            # both non-finite alike: a step GradScaler skipped in both runs (amp=fp16, chapter 11) agrees
            rel.append(0.0 if same_value(x, y) else math.inf)
            continue
        rel.append(abs(y - x) / max(abs(x), abs(y)) if (x or y) else 0.0)
        if x:
            ratio.append(y / x)
    return rel, ratio


def classify(ma: list[dict], mb: list[dict], wa: dict | None, wb: dict | None, names=("A", "B"),
             loss_tol: float = LOSS_TOL, param_tol: float = PARAM_TOL, conv_rtol: float = CONV_RTOL,
             output_diff: float | None = None, output_tol: float = OUTPUT_TOL, grad_rtol: float = GRAD_RTOL,
             config_a: dict | None = None, config_b: dict | None = None,
             twins: list[noise.Twin] | None = None, margin: float = noise.MARGIN,
             init_hashes: tuple[dict, dict] = ({}, {}),
             windows: windows_mod.WindowJudgement | None = None,
             replicas: tuple[dict, dict] = ({}, {})) -> ParityReport:
    """The tier of two runs' metrics (+ final weights when both have them), and the likely cause below tier 2.

    Pure: tests feed it synthetic runs. `config_a`/`config_b`: the runs' config.json (for the cause only).
    `twins`: float twins of A (lab_utils/analysis/noise.py); with them tier 2 is judged against their envelope, without
    them against the fixed tolerances. `init_hashes`: each run's {rank: initial fingerprint}, for the cause;
    `replicas`: each run's {rank: final fingerprint of the weights that rank held whole}, for the cause.
    `windows`: B judged window by window against a replay from its own states (analysis/windows.py); a step out of
    its window bound counts as out (first_step_over_tol), and only steps that neither the whole-run bounds nor a
    window could judge are left "not judged".
    """
    notes = []
    n = min(len(ma), len(mb))
    if n == 0:
        raise ValueError("a run has no steps in metrics.jsonl")
    if len(ma) != len(mb):
        notes.append(f"different lengths: {len(ma)} vs {len(mb)} steps; compared the first {n}")
    la = [r["loss"] for r in ma[:n]]
    lb = [r["loss"] for r in mb[:n]]
    finite = all(math.isfinite(x) for x in la + lb)
    diffs = [abs(x - y) if finite else math.inf for x, y in zip(la, lb, strict=True)]
    first_diff = next((i for i in range(n) if la[i] != lb[i] or any(
        not same_value(ma[i].get(k), mb[i].get(k)) for k in ("param_hash", "grad_norm"))), None)
    bounds = (noise.envelope(ma, twins, n, param_tol, output_tol, margin) if twins
              else noise.fixed(n, loss_tol, grad_rtol, param_tol, output_tol))
    over = next((i for i, d in enumerate(diffs) if not d <= bounds.loss[i]), None)
    if windows is not None and windows.first_over is not None and (over is None or windows.first_over < over):
        over = windows.first_over  # out of its window's bound: B's step leaves A's program from the same state
    blind = noise.unjudged(bounds, la)
    not_judged = sorted(set(blind) & set(windows.unjudged)) if windows else blind
    grads = grad_norm_diffs(ma, mb, n)
    if grads is None:
        missing = " and ".join(nm for nm, m in zip(names, (ma, mb), strict=True)
                               if any(r.get("grad_norm") is None for r in m[:n]))
        notes.append(f"no grad_norm in {missing}'s metrics.jsonl (an older file): the gradient scale is not "
                     f"compared, so tier 2 is not reached on the loss alone (under AdamW a gradient x "
                     f"1/world_size keeps the loss within tolerance)")
        rel, ratios, max_rel, grad_over = [], [], None, None
    else:
        rel, ratios = grads
        max_rel = max(rel)
        grad_over = next((i for i, d in enumerate(rel) if not d <= bounds.grad[i]), None)
    hashed = all(r.get("param_hash") is not None for r in ma[:n] + mb[:n])
    if not hashed:
        notes.append("no per-step parameter fingerprints (fingerprint=false): bitwise cannot be proven")
    per, w_equal, wnotes = ({}, False, []) if wa is None or wb is None else compare_weights(wa, wb)
    notes += wnotes
    if wa is None or wb is None:
        notes.append("no model.pt in one run: weights not compared (tiers 3 and 2 need them)")
    max_param = max(per.values()) if per else None
    worst = max(per, key=per.get) if per else None
    same_len = len(ma) == len(mb)
    bitwise = same_len and first_diff is None and w_equal and wa is not None and hashed
    tier = 0
    tail = max(1, n // 10)
    if finite:
        ea, eb = sum(la[-tail:]) / tail, sum(lb[-tail:]) / tail
        if abs(ea - eb) <= conv_rtol * max(abs(ea), abs(eb)):
            tier = 1
    losses_ok = same_len and over is None
    grads_ok = max_rel is not None and grad_over is None
    params_ok = bool(per) and all(v <= bounds.param_bound(k) for k, v in per.items()) and not wnotes
    outputs_ok = output_diff is not None and output_diff <= bounds.output_bound() and not wnotes
    if tier == 1 and losses_ok and grads_ok and (params_ok or outputs_ok):
        tier = 2
    if tier >= 1 and bitwise:  # identical at every step: holds without grad_norm too
        tier = 3
    if losses_ok and grads_ok and max_param is not None and not params_ok and finite:
        same = "the outputs agree" if outputs_ok else "the outputs differ too"
        notes.append(f"loss matches step-wise but {worst} differs by {max_param:.2e} and {same}: a parameter "
                     f"with ~zero gradient (key bias, bias before BatchNorm) where Adam amplifies float noise")
    report = ParityReport(
        run_a=names[0], run_b=names[1], tier=tier, bitwise=bitwise, steps_compared=n,
        max_abs_loss_diff=max(diffs), first_diff_step=first_diff, first_step_over_tol=over,
        max_abs_param_diff=max_param, worst_tensor=worst, final_loss_a=la[-1], final_loss_b=lb[-1],
        max_abs_output_diff=output_diff, max_rel_grad_norm_diff=max_rel, first_step_over_grad_rtol=grad_over,
        grad_norm_ratio_median=statistics.median(ratios) if ratios else None, per_tensor=per,
        loss_diffs=diffs, grad_rel_diffs=rel, notes=notes, loss_tol=loss_tol, param_tol=param_tol,
        output_tol=output_tol, grad_rtol=grad_rtol, calibrated=bounds.calibrated, twins=bounds.twins,
        margin=bounds.margin, loss_bounds=bounds.loss, grad_bounds=bounds.grad, twin_loss=bounds.twin_loss,
        twin_grad=bounds.twin_grad, blind_from_step=blind[0] if blind else None, not_judged=not_judged,
        windows=windows, config_diffs=config_differences(config_a or {}, config_b or {}),
        order_diffs=causes.neutral_differences(config_a or {}, config_b or {}))
    if tier < 2:
        report.cause = causes.first(evidence(report, ma, mb, config_a or {}, config_b or {}, wa, init_hashes,
                                              replicas))
        if not bounds.calibrated and tier >= 1 and (report.cause is None or report.cause.code == "float_order"):
            # Past a fixed tolerance, float noise alone and a small bug look alike: only a twin can tell them apart.
            report.needs_twin = True
            notes.append("not calibrated: nothing in the files but the float order separates these runs, and a fixed "
                         "tolerance cannot tell amplified float noise from a bug — give a float twin of A "
                         "(`ddp-lab run ... --twin`, then `--noise A-twin-...`)")
    return report


# Keys that change what the probe batch is or what the model computes: outputs are compared only when equal.
STRUCTURE_KEYS = ("model", "block_size", "n_layer", "n_head", "n_embd", "norm", "n_samples")


def window_judgement(run_b: Path, mb: list[dict], replay: tuple[Path, Path], n: int) -> windows_mod.WindowJudgement:
    """B judged against a replay of A from B's window states and the replay's twin (launch/replay.py makes them:
    B/replays/A and B/replays/A-twin). ValueError when they do not fit B (another B, cut short)."""
    r, t = (Path(p) for p in replay)
    starts = [int(line["step"]) for line in _jsonl(r / runfiles.WINDOW_ENDS)]
    held = sorted(int(p.stem.split("_")[1]) for p in (run_b / runfiles.WINDOWS).glob("step_*.pt"))
    missing = [s for s in held if 0 < s < n and s not in starts]
    if missing:
        raise ValueError(f"{r}: the replay did not take B's state at step(s) {missing[:5]} (a replay of another "
                         f"run? delete {r.parent} and compare again)")
    ends = {int(line["step"]): line["max_abs_param_diff"] for line in _jsonl(r / runfiles.WINDOW_ENDS)}
    return windows_mod.judge(mb, read_metrics(r), read_metrics(t), starts, n, names=(r.name, t.name), ends=ends)


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


@dataclass
class Run:
    """A run folder read once: what the verdict engine needs of it (parity, noise, causes, the doctor)."""
    path: Path
    config: dict      # config.json (+ result.json's resumed_from), {} when missing or unreadable
    metrics: list[dict]
    tensors: dict | None  # model.pt
    probe: dict | None    # probe.pt
    init_hashes: dict[int, str]
    replica_hashes: dict[int, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.path.name


def load_run(run: str | Path | Run) -> Run:
    """A run by name or path (resolve_run), every file read once; a Run is returned as it is."""
    if isinstance(run, Run):
        return run
    path = resolve_run(run)
    config = _read_config(path)
    return Run(path, config, read_metrics(path), runfiles.load_tensors(path),
               runfiles.load_tensors(path, runfiles.PROBE), causes.init_hashes(path, config),
               causes.replica_hashes(path))


def compare(run_a: str | Path | Run, run_b: str | Path | Run, noise_runs=None,
            replay: tuple[Path, Path] | None = None, **tolerances) -> ParityReport:
    """Compare two run folders: a run name (under $LAB_RUNS_DIR or ./runs), any path to a run folder, or a Run.

    Reads files only (runfiles.py's contract): metrics.jsonl, model.pt, probe.pt, config.json, each once
    (load_run). Tolerances not given come from `tolerances_for` (per workload and device). `noise_runs`: float
    twins of A (names or paths, or "auto": the runs named A-twin-*); with them tier 2 means "within their
    float-noise envelope". `replay`: (replay, its twin) folders of A's program replayed from B's window states
    (launch/replay.py), so that every step is judged against noise that never grows (analysis/windows.py).
    """
    a, b = load_run(run_a), load_run(run_b)
    tolerances = {**tolerances_for(a.config, b.config), **tolerances}
    twins = load_twins(a, b, noise_runs) if noise_runs else None
    n = min(len(a.metrics), len(b.metrics))
    judged = window_judgement(b.path, b.metrics, replay, n) if replay else None
    return classify(a.metrics, b.metrics, a.tensors, b.tensors, names=(a.name, b.name),
                    output_diff=_output_diff(a, b), config_a=a.config, config_b=b.config, twins=twins,
                    init_hashes=(a.init_hashes, b.init_hashes), windows=judged,
                    replicas=(a.replica_hashes, b.replica_hashes), **tolerances)


def find_twins(a: Path) -> list[Path]:
    """The runs beside A named A-twin-* (what `ddp-lab run --twin` makes)."""
    return sorted(p for p in a.parent.glob(f"{a.name}{float_twin.SEPARATOR}*") if (p / runfiles.METRICS).exists())


def check_twin(a: Path, t: Path, ca: dict, ct: dict) -> None:
    """Refuse a run that is not a float twin of A: the same keys but for float_twin.KEYS and bookkeeping."""
    if not ca or not ct:
        return  # a recorded script's config.json holds what its author passed: nothing to check against
    ka, kt = ca.get("config", {}), ct.get("config", {})
    differ = [f"{k}={ka.get(k)} vs {kt.get(k)}" for k in sorted(set(ka) | set(kt))
              if ka.get(k) != kt.get(k) and k not in float_twin.KEYS and k not in BOOKKEEPING - {"steps"}]
    if differ:
        raise ValueError(f"{t.name} is not a float twin of {a.name}: it differs in {', '.join(differ)} (a twin may "
                         f"change only {', '.join(sorted(float_twin.KEYS))})")


def load_twins(a: Run, b: Run, noise_runs) -> list[noise.Twin]:
    """The float twins of A as the envelope needs them; errors name a run that is missing or not a twin."""
    if noise_runs == "auto" or list(noise_runs) == ["auto"]:
        paths = find_twins(a.path)
        if not paths:
            raise FileNotFoundError(f"--noise auto: no run named {a.name}{float_twin.SEPARATOR}* beside {a.path} "
                                    f"(make one with `ddp-lab run --name {a.name} ... --twin`)")
    else:
        paths = [resolve_run(t) for t in noise_runs]
    twins = []
    for path in paths:
        if path in (a.path, b.path):
            raise ValueError(f"{path.name} is {'A' if path == a.path else 'B'} itself: a float twin is another run "
                             f"of A")
        t = load_run(path)
        check_twin(a.path, t.path, a.config, t.config)
        per = compare_weights(a.tensors, t.tensors)[0] if a.tensors is not None and t.tensors is not None else {}
        twins.append(noise.Twin(t.name, t.metrics, per, _output_diff(a, t)))
    return twins


def _read_config(run: Path) -> dict:
    """config.json, with the step a resumed run continued from (result.json's resumed_from) when it has one."""
    try:
        found = runfiles.read_config(run)
    except (OSError, ValueError):
        return {}
    try:
        resumed = json.loads((run / runfiles.RESULT).read_text()).get("resumed_from")
    except (OSError, ValueError, AttributeError):
        resumed = None
    return {**found, "resumed_from": resumed} if resumed is not None else found


def _output_diff(a: Run, b: Run) -> float | None:
    """max |Δ| of the two final models' probe outputs (probe.pt), or None when they are not comparable."""
    pa, pb, ca, cb = a.probe, b.probe, a.config, b.config
    if pa is None or pb is None or not ca or not cb:
        return None
    if any(ca.get("config", {}).get(k) != cb.get("config", {}).get(k) for k in STRUCTURE_KEYS):
        return None
    if pa["outputs"].shape != pb["outputs"].shape:
        return None
    return float((pa["outputs"] - pb["outputs"]).abs().max())


def resolve_run(run: str | Path) -> Path:
    """A run folder from a name ("ch01_single") or any path (relative to the current directory or not)."""
    path = Path(run).expanduser()
    candidates = [path, runfiles.runs_dir() / path]
    if path.parts and path.parts[0] == "runs":  # the path `ddp-lab run` printed, used from another folder
        candidates.append(runfiles.runs_dir().joinpath(*path.parts[1:]))
    for c in candidates:
        if (c / runfiles.METRICS).exists():
            return c.resolve()
    looked = ", ".join(dict.fromkeys(str(c) for c in candidates))
    raise FileNotFoundError(f"run {str(run)!r}: no run folder with {runfiles.METRICS} (looked in {looked})")
