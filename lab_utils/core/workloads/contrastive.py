"""The `contrastive` workload: a loss with in-batch negatives (chapter 05, article §1.2).

Each sample is a window of the gpt workload's text; its first half is the query and its second half the
positive key. A tiny encoder (character + position embeddings, mean-pooled, a 2-layer MLP) embeds both,
and InfoNCE asks each query to pick its own key among all keys of the batch: the others are its
*negatives*. The loss of one sample depends on every other sample of the batch, so it is not a mean of
independent per-sample terms, and splitting the batch over ranks changes it (§1.2). `contrastive_gather`:

- `none`: each rank's negatives are its own micro-batch only: another loss (fewer negatives).
- `plain`: `dist.all_gather` of the keys (no autograd); the local keys are put back with their gradient.
  The loss *value* is the single run's, but the gradient through the other ranks' keys is lost.
- `autograd`: `torch.distributed.nn.functional.all_gather`: its backward sums (reduce-scatter) each rank's
  gradient with respect to the gathered keys back to their owners, so nothing is lost.

Why no extra factor with `autograd`: rank r's loss is the mean over its B/W own queries, L_r = W/B * sum
of its queries' terms, so sum_r L_r = W * L (L the single run's mean over B queries). The gather's backward
delivers to each rank its share of d(sum_r L_r); DDP then divides the sum over ranks by W: W * dL / W = dL.
(A rank that divided its query sum by the *global* B instead would need x world_size, as a sum loss does.)
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.nn.functional import all_gather as autograd_all_gather

from lab_utils.core.workloads.gpt import CharWindows

TEMPERATURE = 0.1
EMBED = 32


class PairText(CharWindows):
    """The gpt windows without targets: x is the window, y a placeholder (the pairs live inside x)."""

    def __getitem__(self, visit_id: int) -> dict:
        row = self.ids[visit_id % self.n]
        return {"x": row[:-1], "y": torch.zeros((), dtype=torch.long),
                "key": torch.tensor(visit_id, dtype=torch.long)}


class Encoder(nn.Module):
    def __init__(self, vocab_size: int, block_size: int, d: int = EMBED):
        super().__init__()
        self.tok = nn.Embedding(vocab_size, d)
        self.pos = nn.Embedding(block_size, d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok(x) + self.pos(torch.arange(x.size(1), device=x.device))
        return self.mlp(h.mean(dim=1))


def build(cfg: dict):
    """The `contrastive` workload (registered in workloads.BUILDERS)."""
    from lab_utils.core.workloads import Workload

    if cfg["block_size"] % 2:
        raise ValueError(f"model=contrastive splits each window in halves: block_size={cfg['block_size']} is odd")
    data = PairText(cfg["block_size"], cfg["n_samples"])
    model = Encoder(len(data.vocab), cfg["block_size"])
    return Workload(model, data, functools.partial(loss_fn, gather=cfg["contrastive_gather"]))


def gather_keys(keys: torch.Tensor, gather: str) -> tuple[torch.Tensor, int]:
    """(the keys every query is scored against, the offset of this rank's own keys among them)."""
    if gather == "none" or not (dist.is_available() and dist.is_initialized()):
        return keys, 0
    rank, world = dist.get_rank(), dist.get_world_size()
    if gather == "autograd":  # DDP: backward sends each rank the gradient w.r.t. its own keys from every rank
        parts = list(autograd_all_gather(keys))
    else:  # plain: values only; the other ranks' keys are constants here
        parts = [torch.empty_like(keys) for _ in range(world)]
        dist.all_gather(parts, keys.detach().contiguous())
        parts[rank] = keys  # the usual patch: the local keys keep their gradient, the rest do not
    return torch.cat(parts), rank * keys.size(0)


def loss_fn(model: nn.Module, batch: dict, reduction: str = "mean", seed: int = 0,
            gather: str = "none") -> torch.Tensor:
    """InfoNCE: query i (first half) against every key (second halves) of the batch this rank can see."""
    x = batch["x"]
    half = x.size(1) // 2
    z = F.normalize(model(torch.cat([x[:, :half], x[:, half:]])), dim=-1)  # one forward: DDP sees one call
    queries, keys = z[: len(x)], z[len(x):]
    keys, offset = gather_keys(keys, gather)
    logits = queries @ keys.T / TEMPERATURE
    labels = offset + torch.arange(len(x), device=x.device)
    return F.cross_entropy(logits, labels, reduction=reduction)
