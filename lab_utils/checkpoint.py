"""What a run saves of its model, and how it is loaded: the boundary chapter 08 (checkpoints) builds on.

Rules, each a DDP lesson (article §5.2): only rank 0 writes; the state dict is the `.module`'s (no `module.`
prefix), so one device can load it; tensors go to CPU first, so `map_location` is never needed to *read* it;
the write is atomic (temporary name + rename), so a crash mid-write leaves the previous file intact;
loading uses `weights_only=True` (no pickle code runs).
"""

from __future__ import annotations

from pathlib import Path

import torch

from . import runfiles
from .ddp import unwrap


def cpu_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu() for k, v in unwrap(model).state_dict().items()}


def save_final(model: torch.nn.Module, out_dir: str | Path, probe_outputs: torch.Tensor) -> None:
    """model.pt (final weights) and probe.pt (eval outputs on the probe batch), each written atomically."""
    out = Path(out_dir)
    runfiles.save_atomic(cpu_state(model), out / runfiles.MODEL)
    runfiles.save_atomic({"outputs": probe_outputs.detach().cpu().double()}, out / runfiles.PROBE)


def load_weights(path: str | Path, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    return torch.load(path, map_location=device, weights_only=True)
