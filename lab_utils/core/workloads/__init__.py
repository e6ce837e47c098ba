"""The workloads behind `model=`: a registry of what to build and how a micro-batch becomes a loss.

- `gpt` (workloads/gpt.py): a tiny character-level GPT, for the early chapters.
- `bn_net` (workloads/bn_net.py): a small BatchNorm CNN on 8x8 digits, for seeding, augmentation and
  BatchNorm (introduced in notebooks/02_seeds.ipynb, taught in 04 and 07).

Every dataset takes *visit ids* (epoch * n + index, see samplers.py) and returns {"x", "y", "key"}. A new
workload is a module with `build(cfg) -> Workload` registered in BUILDERS; nothing else changes.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class Workload:
    model: torch.nn.Module
    dataset: torch.utils.data.Dataset
    loss_fn: Callable  # (model, batch, reduction, seed) -> loss tensor


# model= value -> module whose build(cfg) returns a Workload (imported on use: sklearn alone takes ~1 s).
BUILDERS = {"gpt": "lab_utils.core.workloads.gpt", "bn_net": "lab_utils.core.workloads.bn_net",
            "contrastive": "lab_utils.core.workloads.contrastive"}

PROBE_SAMPLES = 16  # the parity report's probe batch: the dataset's first 16 samples


def build(cfg: dict) -> Workload:
    """Build on the current global RNG state: the caller seeds first (that is the lesson of chapter 02)."""
    return importlib.import_module(BUILDERS[cfg["model"]]).build(cfg)


def probe_outputs(model: torch.nn.Module, dataset, device: torch.device, n: int = PROBE_SAMPLES) -> torch.Tensor:
    """The model's eval-mode outputs on the dataset's first `n` samples (float64, on CPU).

    Each run writes these next to its weights (probe.pt), so the parity report can tell a weight difference
    that changes the function from one that does not (a parameter with exactly zero gradient, like the key
    bias inside softmax attention) by reading files only — never by rebuilding a model from today's code.
    """
    batch = torch.utils.data.default_collate([dataset[i] for i in range(min(n, len(dataset)))])
    was_training = model.training
    model.eval()
    with torch.no_grad():
        out = model(batch["x"].to(device)).double().cpu()
    model.train(was_training)
    return out


def nudge(model: torch.nn.Module, ulps: int) -> None:
    """Move every floating parameter `ulps` float steps up (torch.nextafter): a float twin's start (`nudge_init`).

    A perturbation the size of one rounding, applied once, the same on every rank: the run then sees the same
    samples and the same randomness as the un-nudged one, and only the last bits of its weights differ, which
    training amplifies as it amplifies another summation order. It works for any model (BatchNorm and
    cross-sample losses included), where another micro-batch split would change what is computed.
    """
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point():
                for _ in range(ulps):
                    p.copy_(torch.nextafter(p, torch.full_like(p, float("inf"))))
