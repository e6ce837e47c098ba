"""Judging a port window by window: B's steps against A's program replayed from B's own state (no blind zone).

Taught in notebooks/01_unchanged.ipynb and 10_workflow.ipynb. The whole-run envelope (noise.py) compares B with A
from step 0; float order makes the two drift apart, the drift grows, and from some step on (`blind_from_step`)
a bug that starts there hides in it. Here every window starts from B's state (lab_utils/core/windows.py: A's
program set to B's window state at each window start, and a float twin of that replay set to the same state),
so each window's noise is measured afresh from the last bit, at any step of the run.

**The rule, per window [w, w + k).** With R the replay and T its twin, at each step s of the window:

    |loss_B(s) - loss_R(s)|  <=  MARGIN * max( max_{w<=t<=s} |loss_T(t) - loss_R(t)|,  FLOOR_ULPS * ulp32(loss_R(s)) )

and the same for the relative grad-norm difference (floor FLOOR_ULPS * 2**-23): noise.py's rule, restarted at
each window. Where one step's grad bound passes its cap (a jitter spike of the twin's grad norm, as in bf16),
the gradient scale is judged by the window's median relative difference against MARGIN x the twin's median: a
gradient-scale bug changes every step's norm. The logged learning rate is part of A's program: a step where
B's differs from the replay's is out. A step over its bound is out: B's step does not follow A's program from
the same state, by more than float order can explain. A step whose bound reaches the cap (noise.LOSS_CAP of the
loss, noise.GRAD_CAP relative) is "not judged": the window's twin itself went blind there, and the report says
so instead of certifying it. Window 0 starts from A's own initial weights, so it is the whole-run rule over its
first k steps.

Analysis side: pure functions of metrics lists; reads no files (parity.py reads the replay's folders).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field

from lab_utils.analysis import noise


@dataclass
class Window:
    start: int
    stop: int                      # exclusive
    max_loss_diff: float           # max |loss_B - loss_R| over the window
    max_twin_loss: float           # max |loss_T - loss_R|: the window's float noise
    max_rel_grad_diff: float | None
    worst_ratio: float             # max over steps of |Δ| / bound (loss or grad): > 1 is out
    first_over: int | None         # first step out of bound
    unjudged: list[int] = field(default_factory=list)  # steps whose bound reached the cap
    end_param_diff: float | None = None  # the replay's weights at the window's end vs B's state there

    @property
    def ok(self) -> bool:
        return self.first_over is None and not self.unjudged


@dataclass
class WindowJudgement:
    replay: str
    twin: str
    every: int
    windows: list[Window]
    loss_bounds: list[float]  # per step: the window bound (what tier 2 accepts there)
    grad_bounds: list[float]
    loss_diffs: list[float]   # per step: |loss_B - loss_R|
    twin_loss: list[float]    # per step: the window's running-max |loss_T - loss_R|
    first_over: int | None
    unjudged: list[int]

    @property
    def first_window_over(self) -> Window | None:
        return next((w for w in self.windows if w.first_over is not None), None)

    def to_dict(self) -> dict:
        d = asdict(self)
        for k in ("loss_bounds", "grad_bounds", "loss_diffs", "twin_loss"):
            d.pop(k)
        return d

    def table(self) -> str:
        """One line per window: its steps, B's largest |Δloss| against the replay, the noise, and the verdict."""
        rows = [f"{'window':>11}  {'max |dloss|':>11}  {'twin':>9}  {'max rel dgrad':>13}  {'x bound':>8}  verdict"]
        for w in self.windows:
            verdict = (f"OUT from step {w.first_over}" if w.first_over is not None else
                       f"not judged from step {w.unjudged[0]}" if w.unjudged else "within")
            grad = "-" if w.max_rel_grad_diff is None else f"{w.max_rel_grad_diff:.1e}"
            rows.append(f"{w.start:>5}-{w.stop - 1:<5}  {w.max_loss_diff:11.1e}  {w.max_twin_loss:9.1e}  "
                        f"{grad:>13}  {w.worst_ratio:8.2g}  {verdict}")
        return "\n".join(rows)


def _rel(x, y) -> float:
    return noise.rel_diff(x, y) if x is not None and y is not None else 0.0


def judge(mb: list[dict], mr: list[dict], mt: list[dict], starts: list[int], n: int, margin: float = noise.MARGIN,
          names: tuple[str, str] = ("replay", "replay twin"), ends: dict[int, float] | None = None
          ) -> WindowJudgement:
    """B's first `n` steps judged against the replay R and its twin T, window by window (`starts`: the steps at
    which R took B's state, 0 first). Raises ValueError when the replay or its twin lacks a step of the range."""
    for label, m in ((names[0], mr), (names[1], mt)):
        if len(m) < n or any(r["step"] != s for s, r in enumerate(m[:n])):
            raise ValueError(f"{label}: its metrics.jsonl does not hold steps 0..{n - 1} in order (a replay cut "
                             f"short?)")
    bounds = sorted({s for s in starts if 0 <= s < n} | {0}) + [n]
    windows, lb, gb, ld, tl, unjudged = [], [], [], [], [], []
    for w, stop in zip(bounds[:-1], bounds[1:], strict=True):
        e_loss = e_grad = 0.0
        row = Window(w, stop, 0.0, 0.0, None, 0.0, None, end_param_diff=(ends or {}).get(stop))
        steps = range(w, stop)
        dgs = [_rel(mr[s].get("grad_norm"), mb[s].get("grad_norm")) for s in steps]
        # A gradient-scale bug changes every step's norm: where one step's grad bound passes the cap (a jitter
        # spike of the twin, bf16), the window's median relative difference judges the gradient scale instead.
        med_bound = margin * max(statistics.median(_rel(mr[s].get("grad_norm"), mt[s].get("grad_norm"))
                                                   for s in steps), noise.GRAD_FLOOR)
        med_ok = statistics.median(dgs) <= med_bound
        for s, dg in zip(steps, dgs, strict=True):
            lr_, lb_, lt_ = mr[s]["loss"], mb[s]["loss"], mt[s]["loss"]
            e_loss = max(e_loss, abs(lt_ - lr_) if math.isfinite(lt_ - lr_) else math.inf)
            e_grad = max(e_grad, _rel(mr[s].get("grad_norm"), mt[s].get("grad_norm")))
            bl = margin * max(e_loss, noise.FLOOR_ULPS * noise.ulp32(lr_))
            bg = margin * max(e_grad, noise.GRAD_FLOOR)
            dl = abs(lb_ - lr_) if math.isfinite(lb_) and math.isfinite(lr_) else math.inf
            lb.append(bl)
            gb.append(bg)
            ld.append(dl)
            tl.append(e_loss)
            row.max_loss_diff = max(row.max_loss_diff, dl)
            row.max_twin_loss = max(row.max_twin_loss, e_loss)
            if mb[s].get("grad_norm") is not None:
                row.max_rel_grad_diff = max(row.max_rel_grad_diff or 0.0, dg)
            by_median = bg > noise.GRAD_CAP and med_bound <= noise.GRAD_CAP
            ratio = max(dl / bl if bl else math.inf, dg / med_bound if by_median and not med_ok else
                        0.0 if by_median else dg / bg)
            lr_b, lr_r = mb[s].get("lr"), mr[s].get("lr")
            if lr_b is not None and lr_r is not None and not math.isclose(lr_b, lr_r, rel_tol=1e-6):
                ratio = math.inf  # the learning rate is A's program, exactly: another one at this step is out
            row.worst_ratio = max(row.worst_ratio, ratio)
            if ratio > 1 and row.first_over is None:
                row.first_over = s
            elif ratio <= 1 and not noise.judgeable(bl, med_bound if by_median else bg, lr_):
                row.unjudged.append(s)
        unjudged += row.unjudged
        windows.append(row)
    first = next((w.first_over for w in windows if w.first_over is not None), None)
    return WindowJudgement(names[0], names[1], bounds[1] - bounds[0] if len(bounds) > 2 else n, windows, lb, gb, ld,
                           tl, first, unjudged)
