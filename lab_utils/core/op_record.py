"""One step of YOUR program traced op by op, for `ddp-lab doctor A B --ops-traces TA TB` on a script the lab did not
write (lab runs need none of this: core/op_trace.py replays scripts/train.py itself; the judgement of both is
lab_utils/analysis/ops.py).

Your script already has what `record.replay` needs (a `train_step(step, micro)` that draws step `step`'s batch,
runs forward, backward and optimizer.step(), and returns the loss and the sample ids; tests/outside/
multigpu_torchrun_recorded.py). `trace` runs that program in one process up to the step the doctor named, as
`record.replay` does (B's window states loaded where B holds one), and records step `step` with torch's hooks:

- data: the step's sample ids (what train_step returns);
- forward: every module's output row by row (`register_forward_hook`), each row keyed by the bytes of the input
  row it came from (the root module's first tensor argument), so B's micro-batches, dealt like ranks, line up with
  A's one batch whatever order they ran in; and the step's loss;
- reduction: every parameter's `.grad` after the step (your program's reduction: the single run's one backward,
  or the emulated ranks' accumulation);
- optimizer: every parameter's update (weights after the step minus before).

Make two traces from the same B, B's first:

    LAYOUT=ranks python your_script.py replay_from=B trace_step=S micro_batches=W out_dir=TB   # B's program
    python your_script.py replay_from=B trace_step=S trace_state=TB out_dir=TA               # A's, from B's state

B's trace saves its state at the step (ops_state.pt); A's loads it there, so both programs run step S from the
same weights and optimizer state. Then `ddp-lab doctor A B --ops-traces TA TB`.

Not traced here (op_trace does it for lab runs): each micro-batch's own gradient (it needs A's loss on B's
micro-batches, so A's model code), the clipping inside a step. Core side: imports core/ only.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from lab_utils.core import checkpoint, runfiles, windows

TRACE = "ops_trace.pt"
STATE = "ops_state.pt"


def _first_tensor(value):
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)):
        return next((t for t in map(_first_tensor, value) if t is not None), None)
    if isinstance(value, dict):
        return next((t for t in map(_first_tensor, value.values()) if t is not None), None)
    return None


def _row_key(row: torch.Tensor) -> str:
    return hashlib.sha1(row.detach().to("cpu").contiguous().numpy().tobytes()).hexdigest()[:20]


class _Hooks:
    """Forward outputs by module and input row, while attached."""

    def __init__(self, model: torch.nn.Module):
        self.keys: list[str] = []
        self.forward: dict[str, dict[str, torch.Tensor]] = {}
        self.handles = [model.register_forward_pre_hook(self._inputs)]
        for name, module in model.named_modules():
            self.handles.append(module.register_forward_hook(self._output(name or "model")))

    def _inputs(self, _module, args):
        x = _first_tensor(args)
        self.keys = [_row_key(r) for r in x] if x is not None and x.dim() > 0 else []

    def _output(self, name: str):
        def hook(_module, _args, output):
            y = _first_tensor(output)
            if y is None or not y.is_floating_point() or y.dim() == 0 or len(y) != len(self.keys):
                return
            rows = self.forward.setdefault(name, {})
            for k, row in zip(self.keys, y.detach().to("cpu", torch.float64), strict=True):
                rows.setdefault(k, row)
        return hook

    def close(self):
        for h in self.handles:
            h.remove()


def trace(source_run: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, train_step,
          out_dir: str | Path, step: int, *, micro: int = 1, state_from: str | Path | None = None,
          extra_load=None) -> Path:
    """Run your program (`train_step`, as for record.replay) from `source_run`'s window states up to `step`,
    then record step `step` op by op into out_dir/ops_trace.pt. Without `state_from` (B's side) the state before
    the step is saved to out_dir/ops_state.pt; with it (A's side) that saved state is loaded first."""
    source, out = Path(source_run), Path(out_dir)
    if not isinstance(step, int) or step < 0:
        raise ValueError(f"trace_step={step!r} must be a step number >= 0 (the doctor's first differing step)")
    out.mkdir(parents=True, exist_ok=True)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    held = [s for s in windows.steps(source) if 0 < s <= step]
    start = 0
    for s in range(step):  # the data position: your program's own steps, B's states loaded where held
        if s in held:
            start = s
            windows.take(source, s, out / windows.ENDS, model, optimizer, device)
            if extra_load is not None:
                extra_load(checkpoint.load_checkpoint(windows.state_path(source, s)).get("extra_state") or {})
        train_step(s, micro)
        optimizer.zero_grad(set_to_none=True)
    if step in held:
        start = step
        windows.take(source, step, out / windows.ENDS, model, optimizer, device)
    if state_from is None:
        runfiles.save_atomic({"model": checkpoint.cpu_state(model),
                                "optimizer": checkpoint.cpu_copy(optimizer.state_dict())}, out / STATE)
    else:
        state = checkpoint.load_checkpoint(Path(state_from) / STATE, device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    params = dict(model.named_parameters())
    before = {n: p.detach().clone() for n, p in params.items()}
    hooks = _Hooks(model)
    try:
        result = train_step(step, micro)
    finally:
        hooks.close()
    loss, ids = result if isinstance(result, tuple) else (result, None)
    runfiles.save_atomic({
        "step": step, "start": start, "micro": micro, "optimizer": type(optimizer).__name__,
        "ids": [] if ids is None else [int(i) for i in torch.as_tensor(ids).reshape(-1).tolist()],
        "loss": float(loss.detach() if isinstance(loss, torch.Tensor) else loss), "forward": hooks.forward,
        "grads": {n: p.grad.detach().to("cpu", torch.float64).clone() for n, p in params.items()
                  if p.grad is not None},
        "update": {n: (p.detach() - before[n]).to("cpu", torch.float64) for n, p in params.items()},
    }, out / TRACE)
    return out
