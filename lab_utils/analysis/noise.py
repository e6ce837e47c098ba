"""Float-noise envelopes: how far run B may drift from run A by float order alone, measured with float twins.

Taught in notebooks/01_unchanged.ipynb. A **float twin** of run A is a run that differs from A only in the float
order of its sums: the same samples at every step, the same randomness, the same keys otherwise (for the lab's
runs: `grad_accum_steps=2`, `emulate_ranks=W`, or `nudge_init=1`, which moves every initial weight by one ulp;
`ddp-lab run --twin` makes one). Training amplifies last-bit differences exponentially (measured: ~1e-7 for ~80
steps, then about x10 every 18 steps at the workshop preset on an H200; from step ~50 for a 4x256 GPT on CPU), so
any fixed tolerance is crossed by a correct port once the model is big or the run is long. A twin measures that
growth for this very model, data and precision.

**The rule (tier 2 "within float noise").** With twins T1..Tk of A, at every step s:

    |loss_B(s) - loss_A(s)|  <=  MARGIN * max( E_loss(s), FLOOR_ULPS * ulp32(loss_A(s)) )
    rel |dgrad_norm(B, A)|(s) <= MARGIN * max( E_grad(s), FLOOR_ULPS * 2**-23 )

where E(s) is the running maximum over steps t <= s of the largest twin distance max_i |X_Ti(t) - X_A(t)| (the
loss, or the relative grad-norm difference as `parity` computes it). Final state: every tensor of B within
max(param_tol, MARGIN * the largest twin's |dparam| of that tensor), or the probe outputs within
max(output_tol, MARGIN * the largest twin's |doutput|).

Why these numbers (measured; the files are in docs/measured/, named in docs/results.md):
- **running maximum**: a twin's distance from A jitters by up to ~100x from one step to the next in the growth
  phase (4x256 GPT on CPU: |C-A| at step 146 is 28x below a correct port's), while its running maximum tracks
  the growth. Pointwise, one twin needs a margin of 100-400; with the running maximum the worst correct pair seen
  is 25x (bf16, workshop preset, one H200, twin grad_accum_steps=2 against 2 ranks, step 82), 7.2x (fp32 4x256
  GPT on CPU, twin grad_accum_steps=2, grad norm, step 44) and 3.3x (fp32 workshop preset on an H200).
- **MARGIN = 100**: 4x the worst correct pair measured. The bugs measured sit far outside it at their onset:
  global batch doubled 6e5x the envelope at step 0, set_epoch forgotten 1.9e5x at the first epoch boundary
  (4x256 GPT, CPU); the port-bug suite's own minimum is printed by `ddp-lab bench portbugs`.
- **FLOOR_ULPS = 4**: before training amplifies anything a twin can be bitwise equal to A at a step where the
  port is 1-2 ulps off (the mean of two half-batch means rounds differently); 4 ulps of the loss (relative 4 *
  2**-23 for the grad norm) covers that and is still ~1e-6 at a loss of 4.

The floor is inside the margin: at a step where every twin is bitwise equal to A the bound is MARGIN x 4 ulps
(400 ulps, 1.9e-4 at a loss of 4.8), not 4 ulps. Measured port bugs sit 7e3 envelopes or more above it at their
onset (`ddp-lab bench portbugs`); `ddp-lab bench noise` prints the largest correct pair and the smallest bug.

What it cannot see: a bug whose effect starts late, once the envelope has grown, hides in it. So every bound has
a cap (LOSS_CAP of the loss, GRAD_CAP relative): a step whose bound reaches it is **not judged** (from
`blind_from_step` on), never certified. The remedy is lab_utils/analysis/windows.py: B judged window by window
against A's program replayed from B's own state, where the noise starts again from the last bit at any step.

Analysis side: pure functions of metrics lists; reads no files.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

MARGIN = 100.0
FLOOR_ULPS = 4
GRAD_FLOOR = FLOOR_ULPS * 2.0 ** -23
# Past these a bound no longer separates a bug from noise: the step is "not judged". A loss bound of 5% of the
# loss is as loose as tier 1's convergence test (parity.CONV_RTOL): past it tier 2 would say no more than tier 1.
# A relative grad-norm difference is at most 1, so a bound of 0.5 can still fail. (1% and 5% were tried first:
# in bf16 on an H200 at the workshop preset the float twin of a window's first step is already 100 x 1e-4 of
# the loss away, so every bf16 window read "not judged"; docs/results.md.)
LOSS_CAP = 0.05
GRAD_CAP = 0.5

# The tier-2 rule in words: the one text README.md, docs/design.md and chapter 01 show (tests/analysis/test_noise.py
# keeps them equal).
RULE = (f"tier 2 (step-wise): at every step, |Δloss| and the relative |Δgrad_norm| of B against A stay within "
        f"{MARGIN:g}x the float-noise envelope of A's float twins (the running maximum of each twin's distance "
        f"from A; at least {FLOOR_ULPS} fp32 ulps), and the final weights (per tensor) or the probe-batch outputs "
        f"within {MARGIN:g}x the twins' too. A step whose bound reaches {LOSS_CAP:.0%} of the loss or {GRAD_CAP:.0%} "
        f"of the grad norm is not judged by it; when B holds window states, every window of B is judged the same "
        f"way against A's program replayed from B's own state, and a step that no check could judge is reported "
        f"\"not judged\", never certified. Without a twin: fixed tolerances (|Δloss| <= 1e-6, relative "
        f"|Δgrad_norm| <= 1e-4, weights or outputs <= 1e-4), which hold for short runs of small models only; past "
        f"them with nothing but float order to blame the report says \"not calibrated: give a float twin\".")


def ulp32(x: float) -> float:
    """The spacing of float32 numbers at |x|: what one last-bit difference of a logged fp32 loss is worth."""
    return float(np.spacing(np.float32(abs(x)))) if math.isfinite(x) else math.inf


def rel_diff(x: float, y: float) -> float:
    """|y - x| / max(|x|, |y|): the relative difference parity uses for the grad norm (0 when both are 0)."""
    if not (math.isfinite(x) and math.isfinite(y)):
        return math.inf
    return abs(y - x) / max(abs(x), abs(y)) if (x or y) else 0.0


@dataclass
class Twin:
    """One float twin of run A, as the envelope needs it: its metrics and its final distance from A."""
    name: str
    metrics: list[dict]
    per_tensor: dict[str, float] = field(default_factory=dict)  # max |dparam| of each tensor against A
    output_diff: float | None = None  # max |doutput| on the probe batch against A


@dataclass
class Bounds:
    """Per step, the largest difference tier 2 accepts; fixed tolerances, or calibrated by float twins."""
    loss: list[float]
    grad: list[float]
    param_tol: float
    output_tol: float
    calibrated: bool = False
    twins: list[str] = field(default_factory=list)
    margin: float = 1.0
    twin_loss: list[float] = field(default_factory=list)  # E_loss(s): the twins' running-max distance
    twin_grad: list[float] = field(default_factory=list)
    twin_per_tensor: dict[str, float] = field(default_factory=dict)
    twin_output: float | None = None

    def param_bound(self, name: str) -> float:
        return max(self.param_tol, self.margin * self.twin_per_tensor.get(name, 0.0))

    def output_bound(self) -> float:
        return max(self.output_tol, self.margin * (self.twin_output or 0.0))

    def describe(self) -> str:
        if not self.calibrated:
            return "fixed tolerances (not calibrated: give a float twin with --noise)"
        return (f"within {self.margin:g}x the float-noise envelope of {len(self.twins)} twin(s) "
                f"({', '.join(self.twins)}), at least {FLOOR_ULPS} ulps")


def fixed(n: int, loss_tol: float, grad_rtol: float, param_tol: float, output_tol: float) -> Bounds:
    """The uncalibrated rule: the same tolerance at every step (holds for short runs of small models only)."""
    return Bounds([loss_tol] * n, [grad_rtol] * n, param_tol, output_tol)


def envelope(ma: list[dict], twins: list[Twin], n: int, param_tol: float, output_tol: float,
             margin: float = MARGIN) -> Bounds:
    """The calibrated bounds for comparing any run B with A over its first `n` steps, from A's twins."""
    if not twins:
        raise ValueError("an envelope needs at least one float twin")
    short = [f"{t.name} ({len(t.metrics)} steps)" for t in twins if len(t.metrics) < n]
    if short:
        raise ValueError(f"a float twin must run at least as many steps as the runs it judges ({n}): "
                         f"{', '.join(short)}")
    if any(r.get("grad_norm") is None for t in twins for r in t.metrics[:n]):
        raise ValueError("a float twin without grad_norm in its metrics.jsonl cannot calibrate the grad-norm bound")
    la = [r["loss"] for r in ma[:n]]
    ga = [r.get("grad_norm") for r in ma[:n]]
    e_loss = np.maximum.accumulate([max(abs(t.metrics[s]["loss"] - la[s]) for t in twins) for s in range(n)])
    e_grad = np.maximum.accumulate([max(rel_diff(ga[s], t.metrics[s]["grad_norm"]) if ga[s] is not None else 0.0
                                        for t in twins) for s in range(n)])
    loss = [margin * max(float(e), FLOOR_ULPS * ulp32(x)) for e, x in zip(e_loss, la, strict=True)]
    grad = [margin * max(float(e), GRAD_FLOOR) for e in e_grad]
    per: dict[str, float] = {}
    for t in twins:
        for k, v in t.per_tensor.items():
            per[k] = max(per.get(k, 0.0), v)
    outputs = [t.output_diff for t in twins if t.output_diff is not None]
    return Bounds(loss, grad, param_tol, output_tol, calibrated=True, twins=[t.name for t in twins], margin=margin,
                  twin_loss=[float(e) for e in e_loss], twin_grad=[float(e) for e in e_grad], twin_per_tensor=per,
                  twin_output=max(outputs) if outputs else None)


def judgeable(loss_bound: float, grad_bound: float, loss: float) -> bool:
    """Whether a step's bounds are tight enough to certify it (below the caps): past them, "not judged"."""
    return loss_bound <= LOSS_CAP * abs(loss) and grad_bound <= GRAD_CAP


def unjudged(bounds: Bounds, losses: list[float]) -> list[int]:
    """The steps whose bounds reached a cap (calibrated bounds only: the fixed tolerances sit far below)."""
    if not bounds.calibrated:
        return []
    return [s for s, (bl, bg, x) in enumerate(zip(bounds.loss, bounds.grad, losses, strict=False))
            if not judgeable(bl, bg, x)]


def blind_from(bounds: Bounds, losses: list[float]) -> int | None:
    """The first step whose bound reaches a cap: from there on the whole-run envelope certifies nothing (a bug
    that starts there hides in the noise). None when it never does, or without calibration."""
    return next(iter(unjudged(bounds, losses)), None)


def in_envelopes(loss_diffs: list[float], grad_diffs: list[float], loss_bounds: list[float],
                 grad_bounds: list[float], margin: float) -> list[float]:
    """Per step, how many envelopes (bound / margin) B is from A: the larger of the loss and grad-norm ratios.
    A correct port's worst step must stay under `margin`; a bug's first step outside is far above it."""
    out = []
    for s, (d, b) in enumerate(zip(loss_diffs, loss_bounds, strict=True)):
        g = grad_diffs[s] / (grad_bounds[s] / margin) if grad_diffs else 0.0
        out.append(max(d / (b / margin), g))
    return out
