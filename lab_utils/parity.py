"""The parity report: how "unchanged" is run B compared with run A? (article §1.1, made measurable)

Taught in notebooks/01_unchanged.ipynb. The tiers, exactly:

- **tier 3 — bitwise.** Same number of steps; every step's logged loss is the same float; every step's
  parameter fingerprint (sha256 of all parameter bytes) is the same; every final tensor in model.pt is
  `torch.equal`. Nothing is within a tolerance.
- **tier 2 — step-wise.** Same number of steps; |loss_A - loss_B| <= `loss_tol` (default 1e-6, absolute,
  fp32 tiny GPT) at *every* step; and the final weights agree: every parameter within `param_tol`
  (default 1e-4, absolute) **or**, when both runs' config.json describe the same model, the final models'
  eval-mode outputs on a fixed probe batch (the dataset's first 16 samples) within `output_tol` (1e-4).
  Why the second route: Adam turns float noise in a parameter whose gradient is exactly or nearly zero
  into full-size steps. Measured here: the tiny GPT's key bias (qkv.bias, k part) gets exactly zero
  gradient — softmax ignores a constant added to every score — and moves 4e-4 between a single run and a
  2-rank run whose losses agree to 5e-7; the outputs do not move. A bias right before BatchNorm does the
  same (SERIES.md fact 10). The per-tensor list always names the worst tensor, so nothing is hidden.
- **tier 1 — same convergence.** Both runs finite, and the mean loss of the last 10% of steps (at least 1)
  agrees within `conv_rtol` (default 5%, relative).
- **tier 0 — diverged.** Anything else (including a NaN/inf loss).

`first_diff_step` is the first step whose loss or parameter fingerprint is not identical (None if none);
`first_step_over_tol` the first whose |Δloss| exceeds `loss_tol`.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from . import runfiles
from .runfiles import read_metrics

LOSS_TOL = 1e-6
PARAM_TOL = 1e-4
OUTPUT_TOL = 1e-4
CONV_RTOL = 0.05

# Tier-2 tolerances per (workload, device type): the one place they live. The defaults fit fp32 on CPU
# and the GPT on CUDA. bn_net on CUDA: cuDNN picks convolution kernels by batch shape, so a 2-rank run
# (half the batch per kernel call) sums in another order than the single run; measured on an H200:
# |Δloss| 5e-6 after 24 steps. Only there are they looser; on CPU the defaults hold (2.4e-7 measured).
DEFAULT_TOLERANCES = {"loss_tol": LOSS_TOL, "param_tol": PARAM_TOL, "output_tol": OUTPUT_TOL}
TOLERANCES = {("bn_net", "cuda"): {"loss_tol": 1e-4, "param_tol": 1e-2, "output_tol": 1e-3}}


def tolerances_for(config_a: dict, config_b: dict) -> dict:
    """The tier-2 tolerances for two runs, from their config.json: per workload and device type."""
    key = lambda c: (c.get("config", {}).get("model"), str(c.get("device", "cpu")).split(":")[0])  # noqa: E731
    looser = [TOLERANCES.get(key(c), DEFAULT_TOLERANCES) for c in (config_a, config_b)]
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
    per_tensor: dict[str, float] = field(default_factory=dict)
    loss_diffs: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    loss_tol: float = LOSS_TOL
    param_tol: float = PARAM_TOL
    output_tol: float = OUTPUT_TOL

    @property
    def tier_name(self) -> str:
        return TIER_NAMES[self.tier]

    def to_dict(self, full: bool = False) -> dict:
        d = asdict(self)
        d["tier_name"] = self.tier_name
        if not full:
            d.pop("loss_diffs")
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def format(self, top: int = 5) -> str:
        lines = [
            f"parity {self.run_a} vs {self.run_b}: tier {self.tier} ({self.tier_name})",
            f"  steps compared      {self.steps_compared}",
            f"  bitwise             {self.bitwise}",
            f"  max |dloss|         {self.max_abs_loss_diff:.3e}   (tier 2 needs <= {self.loss_tol:.0e})",
            f"  first differing     step {self.first_diff_step}" if self.first_diff_step is not None
            else "  first differing     none",
            f"  first over tol      step {self.first_step_over_tol}" if self.first_step_over_tol is not None
            else "  first over tol      none",
            f"  final loss          {self.final_loss_a:.6f} vs {self.final_loss_b:.6f}",
        ]
        if self.max_abs_param_diff is not None:
            lines.append(f"  max |dparam|        {self.max_abs_param_diff:.3e}   worst: {self.worst_tensor}"
                         f"   (tier 2 needs <= {self.param_tol:.0e})")
            worst = sorted(self.per_tensor.items(), key=lambda kv: -kv[1])[:top]
            lines += [f"    {v:.3e}  {k}" for k, v in worst]
        if self.max_abs_output_diff is not None:
            lines.append(f"  max |doutput|       {self.max_abs_output_diff:.3e}   (probe batch, eval mode; "
                         f"tier 2 accepts <= {self.output_tol:.0e} when params differ)")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


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


def classify(ma: list[dict], mb: list[dict], wa: dict | None, wb: dict | None, names=("A", "B"),
             loss_tol: float = LOSS_TOL, param_tol: float = PARAM_TOL, conv_rtol: float = CONV_RTOL,
             output_diff: float | None = None, output_tol: float = OUTPUT_TOL) -> ParityReport:
    """The tier of two runs' metrics (+ final weights when both have them). Pure: tests feed it synthetic runs."""
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
    first_diff = next((i for i in range(n) if la[i] != lb[i]
                       or ma[i].get("param_hash") != mb[i].get("param_hash")), None)
    over = next((i for i, d in enumerate(diffs) if not d <= loss_tol), None)
    per, w_equal, wnotes = ({}, False, []) if wa is None or wb is None else compare_weights(wa, wb)
    notes += wnotes
    if wa is None or wb is None:
        notes.append("no model.pt in one run: weights not compared (tiers 3 and 2 need them)")
    max_param = max(per.values()) if per else None
    worst = max(per, key=per.get) if per else None
    same_len = len(ma) == len(mb)
    bitwise = same_len and first_diff is None and w_equal and wa is not None
    tier = 0
    tail = max(1, n // 10)
    if finite:
        ea, eb = sum(la[-tail:]) / tail, sum(lb[-tail:]) / tail
        if abs(ea - eb) <= conv_rtol * max(abs(ea), abs(eb)):
            tier = 1
    losses_ok = same_len and over is None
    params_ok = max_param is not None and max_param <= param_tol and not wnotes
    outputs_ok = output_diff is not None and output_diff <= output_tol and not wnotes
    if tier == 1 and losses_ok and (params_ok or outputs_ok):
        tier = 2
    if tier == 2 and bitwise:
        tier = 3
    if losses_ok and max_param is not None and not params_ok and finite:
        same = "the outputs agree" if outputs_ok else "the outputs differ too"
        notes.append(f"loss matches step-wise but {worst} differs by {max_param:.2e} and {same}: a parameter "
                     f"with ~zero gradient (key bias, bias before BatchNorm) where Adam amplifies float noise")
    return ParityReport(
        run_a=names[0], run_b=names[1], tier=tier, bitwise=bitwise, steps_compared=n,
        max_abs_loss_diff=max(diffs), first_diff_step=first_diff, first_step_over_tol=over,
        max_abs_param_diff=max_param, worst_tensor=worst, final_loss_a=la[-1], final_loss_b=lb[-1],
        max_abs_output_diff=output_diff, per_tensor=per, loss_diffs=diffs, notes=notes, loss_tol=loss_tol,
        param_tol=param_tol, output_tol=output_tol)


# Keys that change what the probe batch is or what the model computes: outputs are compared only when equal.
STRUCTURE_KEYS = ("model", "block_size", "n_layer", "n_head", "n_embd", "norm", "n_samples")


def compare(run_a: str | Path, run_b: str | Path, **tolerances) -> ParityReport:
    """Compare two run folders: a run name (under $LAB_RUNS_DIR or ./runs) or any path to a run folder.

    Reads files only (runfiles.py's contract): metrics.jsonl, model.pt, probe.pt, config.json. Tolerances
    not given come from `tolerances_for` (per workload and device).
    """
    a, b = resolve_run(run_a), resolve_run(run_b)
    ca, cb = _read_config(a), _read_config(b)
    tolerances = {**tolerances_for(ca, cb), **tolerances}
    wa, wb = runfiles.load_tensors(a), runfiles.load_tensors(b)
    return classify(read_metrics(a), read_metrics(b), wa, wb, names=(a.name, b.name),
                    output_diff=_output_diff(a, b, ca, cb), **tolerances)


def _read_config(run: Path) -> dict:
    try:
        return runfiles.read_config(run)
    except (OSError, ValueError):
        return {}


def _output_diff(a: Path, b: Path, ca: dict, cb: dict) -> float | None:
    """max |Δ| of the two final models' probe outputs (probe.pt), or None when they are not comparable."""
    pa, pb = runfiles.load_tensors(a, runfiles.PROBE), runfiles.load_tensors(b, runfiles.PROBE)
    if pa is None or pb is None or not ca or not cb:
        return None
    if any(ca["config"].get(k) != cb["config"].get(k) for k in STRUCTURE_KEYS):
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
