"""The two workloads behind `model=`: what to build, and how a micro-batch becomes a loss.

`gpt` (lab_utils/gpt.py) for the early chapters; `bn_net` (lab_utils/bn_net.py) for seeding, augmentation
and BatchNorm. Both datasets take visit ids and return {"x", "y", "key"}.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class Workload:
    model: torch.nn.Module
    dataset: torch.utils.data.Dataset
    loss_fn: Callable  # (model, batch, reduction, seed) -> loss tensor


def build(cfg: dict) -> Workload:
    """Build on the current global RNG state: the caller seeds first (that is the lesson of chapter 02)."""
    if cfg["model"] == "gpt":
        from . import gpt

        model, data = gpt.build(cfg)
        return Workload(model, data, gpt.loss_fn)
    from . import bn_net

    data = bn_net.DigitsDataset(augment=cfg["augment"], seed=cfg["data_seed"], n=cfg["n_samples"] or None)
    model = bn_net.BNNet(dropout=cfg["dropout"], dropout_mode=cfg["dropout_mode"], norm=cfg["norm"])
    return Workload(model, data, bn_net.loss_fn)


STRUCTURE_KEYS = ("model", "block_size", "n_layer", "n_head", "n_embd", "norm", "n_samples")


def probe_outputs(cfg: dict, state: dict, n: int = 16) -> torch.Tensor:
    """The model's eval-mode outputs on the dataset's first `n` samples, with weights `state` (on CPU).

    The parity report uses this to tell a weight difference that changes the function from one that does
    not (a parameter with exactly zero gradient, like the key bias inside softmax attention).
    """
    wl = build(cfg)
    wl.model.load_state_dict(state)
    wl.model.eval()
    batch = torch.utils.data.default_collate([wl.dataset[i] for i in range(min(n, len(wl.dataset)))])
    with torch.no_grad():
        return wl.model(batch["x"]).double()
