"""`ddp-lab doctor A B --ops`: the first operation where two runs part, not only the step.

The doctor names the first step outside float noise; lab_utils/core/op_trace.py replays that step for A's program
and for B's (B's ranks emulated) from B's own state before it, recording with torch's hooks what each did. This
module judges those traces in the order a step runs, and names the first place outside float noise:

1. data      — the visit ids the step draws (as a multiset over all ranks: the global batch), then each sample's
               inputs (exact for integer inputs);
2. forward   — every module's output, row by row: B's row of a sample against A's row of the same sample (each
               rank's micro-batch against the same samples of the single or emulated run), in execution order;
3. forward   — the loss the step logs (module "loss");
4. backward  — every parameter's gradient as each of B's micro-batches produces it, against A's loss on that
               micro-batch from the same state (core/op_trace.chunk_grads), in backward order (last layer first);
5. optimizer — B's own `.grad` between its backward passes and into the reduction (`edit_ops`): a write to the
               gradients that is neither backward's accumulation nor the reduction is an optimizer-side op run
               inside the step (clip_grad_norm_ inside the no_sync window or per micro-batch);
   reduction — every parameter's gradient after the reduction, against A's step gradient;
6. optimizer — the clipped gradient the optimizer applies, then the update against A's optimizer applied to B's
               clipped gradients (Adam makes a near-zero gradient's float-noise sign flip a full-size update, so
               the update is judged on equal inputs).

**The bound.** A float result computed in another but equivalent order differs by a few units in the last place
of the partial sums it is made of; the largest magnitude in the reference tensor stands in for them (a sum with
cancellation has partial sums larger than its result, rarely larger than the tensor's largest element). So
|Δ| <= REL[dtype] x max|reference tensor|, with REL = 2**-11 in fp32 (4096 ulps, 4.9e-4 of the largest
element: the toy suite's correct fp32 ports reach at most 9.9e-4 of this bound, about 4 ulps; its bugs 42x it
and more; docs/results.md)
and 16 ulps of the autocast dtype under amp. It is per tensor, it fails on any change of scale, sample or
normalisation, and it is no float twin: an op whose own noise is amplified past 4096 ulps would be named.
A tensor of exact zeros in A must be exact zeros in B.

Analysis side: judges plain dicts of tensors (the trace); imports no model code.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field

import torch

REL = {"none": 2.0 ** -11, "fp16": 16 * 2.0 ** -10, "bf16": 16 * 2.0 ** -7}
PHASES = ("data", "forward", "backward", "reduction", "optimizer")


@dataclass
class OpDiff:
    phase: str
    module: str | None
    op: str
    max_abs_diff: float
    bound: float

    @property
    def ratio(self) -> float:
        return self.max_abs_diff / self.bound if self.bound else (0.0 if self.max_abs_diff == 0 else math.inf)

    @property
    def out(self) -> bool:
        return self.max_abs_diff > self.bound


@dataclass
class OpsReport:
    step: int
    start: int                 # the recorded state of B the replay started from
    first_op: dict | None      # {step, phase, module, op, max_abs_diff, bound}; None: nothing beyond float noise
    worst: dict[str, dict]     # per phase: the op closest to (or furthest past) its bound
    checked: int               # comparisons made
    diffs: list[OpDiff] = field(default_factory=list)  # every comparison, in the order the step runs them

    def to_dict(self) -> dict:
        """Strict JSON: a ratio past an exact check (bound 0) or over a shape change is null, with its |d| and bound."""
        d = asdict(self)
        d["diffs"] = [{**asdict(o), "ratio": o.ratio} for o in self.diffs]
        for w in (*d["worst"].values(), *d["diffs"]):
            w["ratio"] = w["ratio"] if math.isfinite(w["ratio"]) else None
        return d

    def format(self) -> str:
        f = self.first_op
        head = (f"  first op            none beyond float noise in step {self.step}" if f is None else
                f"  first op            step {f['step']} {f['phase']}: {f['module'] or '-'} {f['op']}  "
                f"max |d| {f['max_abs_diff']:.3g} > bound {f['bound']:.3g}")
        start = f"B's state at step {self.start}" if self.start else "B's initial weights"
        rows = [head, f"  ops replayed        step {self.step} from {start}; {self.checked} comparisons; worst per "
                      f"phase (|d| / bound):"]
        for ph in PHASES:
            w = self.worst.get(ph)
            if w:
                rows.append(f"    {ph:<10} {w['ratio']:9.3g}  {w['module'] or '-'} {w['op']}")
        return "\n".join(rows)


def _bound(ref: torch.Tensor, amp: str) -> float:
    return REL.get(amp, REL["none"]) * float(ref.abs().max()) if ref.numel() else 0.0


def _diff(phase, module, op, a: torch.Tensor, b: torch.Tensor, amp: str, exact: bool = False) -> OpDiff:
    if a.shape != b.shape:
        return OpDiff(phase, module, f"{op} (shape {tuple(b.shape)} vs {tuple(a.shape)})", math.inf, 0.0)
    d = float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
    return OpDiff(phase, module, op, d, 0.0 if exact else _bound(a, amp))


def _keys(t: dict) -> list[int]:
    return [int(k) for d in t["draws"] for k in d["key"].reshape(-1)]


def data_ops(ta: dict, tb: dict, amp: str) -> list[OpDiff]:
    ka, kb = _keys(ta), _keys(tb)
    ca, cb = Counter(ka), Counter(kb)  # visit ids as multisets: a padded duplicate counts twice
    unmatched = sum((cb - ca).values()) + sum((ca - cb).values())  # draws of one step that the other lacks
    found = [OpDiff("data", None, "sample ids", float(unmatched), 0.0)]
    if found[0].out:
        return found
    rows_a = _rows(ta, lambda d: d["x"])
    xb = torch.cat([d["x"] for d in tb["draws"]])
    xa = torch.stack([rows_a[k] for k in kb])
    exact = not xa.is_floating_point()
    return found + [_diff("data", None, "inputs x", xa, xb, amp, exact)]


def _rows(t: dict, pick) -> dict[int, torch.Tensor]:
    """Visit id -> that sample's row of pick(draw) (its first occurrence in the step)."""
    out: dict[int, torch.Tensor] = {}
    for d in t["draws"]:
        for j, k in enumerate(d["key"].reshape(-1).tolist()):
            out.setdefault(k, pick(d)[j])
    return out


def forward_ops(ta: dict, tb: dict, amp: str) -> list[OpDiff]:
    """Each module's output, B's rows against A's rows of the same samples, in A's execution order."""
    found = []
    order = list(dict.fromkeys(m for slot in ta["outputs"] for m in slot))
    for mod in order:
        if not all(mod in slot for slot in ta["outputs"] + tb["outputs"]):
            continue  # a module whose output is not per-sample on one side: not comparable row by row
        index = {}
        for i, d in enumerate(ta["draws"]):
            for j, k in enumerate(d["key"].reshape(-1).tolist()):
                index.setdefault(k, (i, j))
        a_rows, b_rows = [], []
        for d, slot in zip(tb["draws"], tb["outputs"], strict=True):
            for j, k in enumerate(d["key"].reshape(-1).tolist()):
                i, ja = index[k]
                a_rows.append(ta["outputs"][i][mod][ja])
                b_rows.append(slot[mod][j])
        name, call = mod
        label = name if call == 0 else f"{name} (call {call})"
        found.append(_diff("forward", label, "output", torch.stack(a_rows), torch.stack(b_rows), amp))
    la, lb = torch.tensor(ta["loss"]), torch.tensor(tb["loss"])
    found.append(_diff("forward", "loss", "step loss", la, lb, amp))
    return found


def _module(param: str) -> str:
    return param.rsplit(".", 1)[0] if "." in param else "model"


def grad_ops(tr: dict, amp: str) -> list[OpDiff]:
    ta, tb = tr["a"], tr["b"]
    names = list(reversed(tb["param_order"]))  # backward order: the last layer's gradients come first
    found = []
    for n in names:
        a = torch.stack([c[n] for c in tr["a_chunks"]])
        b = torch.stack([g.get(n, torch.zeros_like(c[n])) for g, c in zip(tb["grads"], tr["a_chunks"], strict=True)])
        found.append(_diff("backward", _module(n), f"grad {n} (per micro-batch, before the reduction)", a, b, amp))
    found += edit_ops(tb, names, amp)
    for n in names:
        found.append(_diff("reduction", _module(n), f"grad {n} (after the reduction)", ta["reduced"][n],
                           tb["reduced"][n], amp))
    for n in names:
        found.append(_diff("optimizer", _module(n), f"clipped grad {n}", ta["clipped"][n], tb["clipped"][n], amp))
    for n in names:
        found.append(_diff("optimizer", _module(n), f"update {n} (vs A's optimizer on B's gradients)",
                           tr["a_update"][n], tb["update"][n], amp))
    return found


def _ranks(t: dict) -> list[list[int]]:
    """Draw indices per rank, in order (a rank's micro-batches)."""
    out: dict[int, list[int]] = {}
    for i, d in enumerate(t["draws"]):
        out.setdefault(d["rank"], []).append(i)
    return [out[r] for r in sorted(out)]


def _edit(label: str, n: str, expected: torch.Tensor, seen: torch.Tensor, scale_of: torch.Tensor,
          amp: str) -> OpDiff:
    d = float((expected.double() - seen.double()).abs().max()) if seen.numel() else 0.0
    return OpDiff("optimizer", _module(n), f"grad {n} {label}", d, _bound(scale_of, amp))


def edit_ops(t: dict, names: list[str], amp: str) -> list[OpDiff]:
    """B's own `.grad` between its backward passes and into its reduction. Backward adds each micro-batch's
    gradient into `.grad` and the reduction averages the ranks' `.grad`; anything else that writes `.grad` in
    between is an optimizer-side op run inside the step (in the lab's step only clip_grad_norm_ does that:
    chapter 11's clip_bug). Phase `optimizer`: the op is clipping, placed before the reduction."""
    found, ranks = [], _ranks(t)
    for n in names:
        # (.grad just before micro-batch j's backward = after it minus what it added, .grad after micro-batch i)
        pairs = [(i, j) for idx in ranks for i, j in zip(idx, idx[1:], strict=False)
                 if n in t["after"][i] and n in t["after"][j]]
        between = [(t["after"][j][n] - t["grads"][j][n] * t["factor"], t["after"][i][n]) for i, j in pairs]
        if between:
            worst = max((_edit("edited between two backward passes of a rank (before the reduction)", n, seen, prev,
                               torch.maximum(prev.abs(), seen.abs()), amp) for seen, prev in between),
                        key=lambda o: o.ratio)
            found.append(worst)
        last = [t["after"][idx[-1]].get(n) for idx in ranks]
        if all(x is not None for x in last):
            total = last[0] / len(last)
            for x in last[1:]:  # the ranks' .grad averaged in rank order, as core/emulate._reduce does
                total = total + x / len(last)
            found.append(_edit("edited after the last backward, before the reduction", n, total / t["scale"],
                               t["reduced"][n], total / t["scale"], amp))
    return found


def judge(tr: dict) -> OpsReport:
    """The traced step's ops in order; the first outside its bound is `first_op`."""
    amp = tr["b"]["amp"] if tr["b"]["amp"] != "none" else tr["a"]["amp"]
    ops = data_ops(tr["a"], tr["b"], amp)
    if not any(o.out for o in ops):
        ops += forward_ops(tr["a"], tr["b"], amp) + grad_ops(tr, amp)
    return _report(tr["step"], tr["start"], ops)


def _report(step: int, start: int, ops: list[OpDiff]) -> OpsReport:
    first = next((o for o in ops if o.out), None)
    worst: dict[str, dict] = {}
    for o in ops:
        if o.phase not in worst or o.ratio > worst[o.phase]["ratio"]:
            worst[o.phase] = {"module": o.module, "op": o.op, "ratio": o.ratio, "max_abs_diff": o.max_abs_diff,
                              "bound": o.bound}
    first_op = None if first is None else {"step": step, "phase": first.phase, "module": first.module,
                                           "op": first.op, "max_abs_diff": first.max_abs_diff, "bound": first.bound}
    return OpsReport(step, start, first_op, worst, len(ops), ops)


# An adaptive optimizer turns a float-noise sign flip of a near-zero gradient into a full-size update; judging
# updates needs A's optimizer on B's gradients (op_trace's a_update), which a recorded trace cannot run.
ADAPTIVE = ("Adam", "AdamW", "Adamax", "NAdam", "RAdam", "Adagrad", "Adadelta", "RMSprop", "Adafactor")


def judge_recorded(ta: dict, tb: dict) -> OpsReport:
    """Two traces of a recorded script's step (lab_utils/core/op_record.py: A's program and B's, from B's state):
    the sample ids; each module's output, B's rows against A's rows of the same input; the loss; every gradient
    after the step's reduction; the update (plain optimizers only: ADAPTIVE). fp32 bounds (REL["none"])."""
    if ta["step"] != tb["step"]:
        raise ValueError(f"the traces are of other steps (A {ta['step']}, B {tb['step']}): trace both at one step")
    ca, cb = Counter(ta["ids"]), Counter(tb["ids"])
    ops = [OpDiff("data", None, "sample ids", float(sum((ca - cb).values()) + sum((cb - ca).values())), 0.0)]
    if not ops[0].out:
        for module, rows_a in ta["forward"].items():
            rows_b = tb["forward"].get(module, {})
            shared = [k for k in rows_a if k in rows_b]
            if shared:
                ops.append(_diff("forward", module, "output", torch.stack([rows_a[k] for k in shared]),
                                 torch.stack([rows_b[k] for k in shared]), "none"))
        ops.append(_diff("forward", "loss", "step loss", torch.tensor([ta["loss"]]), torch.tensor([tb["loss"]]),
                         "none"))
        ops += [_diff("reduction", _module(n), f"grad {n} (after the reduction)", g, tb["grads"][n], "none")
                for n, g in ta["grads"].items() if n in tb["grads"]]
        if tb["optimizer"] not in ADAPTIVE:
            ops += [_diff("optimizer", _module(n), f"update {n}", u, tb["update"][n], "none")
                    for n, u in ta["update"].items() if n in tb["update"]]
    return _report(tb["step"], tb["start"], ops)


def step_to_trace(first_diverging: int | None, first_diff: int | None) -> int | None:
    """The step to replay op by op: the first outside float noise, else the first not bitwise (a correct port's
    step 0: its null is then a measurement, not a default), None when the runs are bitwise."""
    return first_diverging if first_diverging is not None else first_diff
