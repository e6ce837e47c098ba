"""The `gpt` workload: a tiny character-level GPT on text that ships with every CPython.

Taught in notebooks/01_unchanged.ipynb. The text is `pydoc_data.topics` (the help() topics, ~465 k
characters of English), so nothing is downloaded at run time. Sample `idx` is the `idx`-th
non-overlapping window of `block_size + 1` characters; the dataset takes *visit ids* (epoch * n + idx)
so that per-sample randomness can be keyed by the visit, not by the rank that happens to hold it.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from lab_utils.core.keyed_rng import KeyedDropout, dropout_keys


@functools.lru_cache(maxsize=1)
def corpus() -> tuple[torch.Tensor, tuple[str, ...]]:
    """(token ids as uint8, vocabulary). Sorted topics, so the text is the same on every machine."""
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[k] for k in sorted(topics))
    vocab = tuple(sorted(set(text)))
    lookup = {ch: i for i, ch in enumerate(vocab)}
    ids = torch.tensor([lookup[ch] for ch in text], dtype=torch.uint8)
    return ids, vocab


class CharWindows(torch.utils.data.Dataset):
    def __init__(self, block_size: int, n: int = 0):
        ids, self.vocab = corpus()
        available = (len(ids) - 1) // (block_size + 1)
        if n > available:
            raise ValueError(f"n_samples={n} but the text holds only {available} windows of {block_size + 1}")
        self.n = n or available
        self.block_size = block_size
        self.ids = ids[: self.n * (block_size + 1)].view(self.n, block_size + 1).long()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, visit_id: int) -> dict:
        row = self.ids[visit_id % self.n]
        return {"x": row[:-1], "y": row[1:], "key": torch.tensor(visit_id, dtype=torch.long)}


def make_dropout(p: float, mode: str, site: int) -> nn.Module:
    if p == 0:
        return nn.Identity()
    return KeyedDropout(p, site) if mode == "keyed" else nn.Dropout(p)


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, block_size: int, dropout: float, mode: str, site: int):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.drop = make_dropout(dropout, mode, site)
        self.register_buffer("mask", torch.tril(torch.ones(block_size, block_size, dtype=torch.bool)),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        # Written out rather than F.scaled_dot_product_attention: one fixed kernel on every device, so the
        # lesson is about DDP, not about which fused attention backend got picked.
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        att = att.masked_fill(~self.mask[:T, :T], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        return self.drop(self.proj(y))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, block_size, dropout, mode, site):
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size, dropout, mode, site)
        self.ln2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd),
                                 make_dropout(dropout, mode, site + 1))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab_size: int, block_size: int = 32, n_layer: int = 2, n_head: int = 2,
                 n_embd: int = 64, dropout: float = 0.0, dropout_mode: str = "keyed"):
        super().__init__()
        self.tok = nn.Embedding(vocab_size, n_embd)
        self.pos = nn.Embedding(block_size, n_embd)
        self.drop = make_dropout(dropout, dropout_mode, site=0)
        # Each dropout site gets its own number, so no two layers ever draw the same mask.
        self.blocks = nn.ModuleList(Block(n_embd, n_head, block_size, dropout, dropout_mode, site=1 + 2 * i)
                                    for i in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(x.size(1), device=x.device)
        h = self.drop(self.tok(x) + self.pos(pos))
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln_f(h))


def build(cfg: dict):
    """The `gpt` workload (registered in workloads.BUILDERS)."""
    from lab_utils.core.workloads import Workload

    data = CharWindows(cfg["block_size"], cfg["n_samples"])
    model = TinyGPT(len(data.vocab), cfg["block_size"], cfg["n_layer"], cfg["n_head"], cfg["n_embd"],
                    cfg["dropout"], cfg["dropout_mode"])
    return Workload(model, data, loss_fn)


def loss_fn(model: nn.Module, batch: dict, reduction: str = "mean", seed: int = 0) -> torch.Tensor:
    """Cross entropy over every token of the micro-batch. Keyed dropout reads the batch's visit ids."""
    with dropout_keys(batch["key"], seed):
        logits = model(batch["x"])
    return F.cross_entropy(logits.flatten(0, 1), batch["y"].flatten(), reduction=reduction)
