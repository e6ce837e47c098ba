"""Variable-length sequences and what "the mean loss" means across ranks (chapter 05, article §3.2).

`padding=K` masks a keyed number (0..K) of trailing target tokens in every gpt sample (target -100, which
cross entropy ignores): a stand-in for padded variable-length sequences. The count is a pure function of the
sample's visit id (keyed_rng), so a sample is padded alike on any rank, at any world size.

Then a micro-batch's mean over its own tokens is not a share of the global batch's token mean: ranks hold
different numbers of real tokens, and DDP averages their means as if they had the same.
`loss_normalization=global_tokens` fixes it: before the step each rank counts its real tokens over all its
micro-batches, the counts are all-reduced, and every micro-batch's loss is its token *sum* divided by that
global count, x world_size to undo DDP's division. The emulated reference (emulate.py) passes the same
global count to each emulated rank, so it stays tier 3 with a real 2-rank run.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from lab_utils.core.keyed_rng import keyed_uniform

IGNORE = -100  # F.cross_entropy's default ignore_index
PAD_SITE = 705  # keyed_rng site of the padding draw; no other consumer uses it


def pad_lengths(keys: torch.Tensor, seed: int, padding: int) -> torch.Tensor:
    """Masked trailing targets per sample, in 0..padding, keyed by visit id (never by rank or position)."""
    u = keyed_uniform(seed, keys.cpu(), site=PAD_SITE)
    return (u * (padding + 1)).long().clamp_(max=padding)


def mask_padding(batch: dict, cfg: dict) -> dict:
    """The batch with each sample's last pad_lengths targets set to IGNORE (unchanged when padding=0)."""
    if not cfg.get("padding"):
        return batch
    y = batch["y"].clone()
    pad = pad_lengths(batch["key"], cfg["data_seed"], cfg["padding"]).to(y.device)
    positions = torch.arange(y.size(1), device=y.device)
    y[positions[None, :] >= (y.size(1) - pad)[:, None]] = IGNORE
    return {**batch, "y": y}


def real_tokens(batch: dict) -> int:
    return int((batch["y"] != IGNORE).sum())


def prefetch(loader_iter, cfg: dict, device: torch.device, token_count: int | None):
    """(an iterator over this step's micro-batches, the step's real-token count over ALL ranks).

    The step's micro-batches are drawn first so they can be counted. `token_count` given (the emulated
    reference knows every emulated rank's batches): used as is. Otherwise this rank's count, all-reduced
    (SUM) when a process group is up: every rank then divides by the same number.
    """
    batches = [next(loader_iter) for _ in range(cfg["grad_accum_steps"])]
    if token_count is None:
        local = sum(real_tokens(mask_padding(b, cfg)) for b in batches)
        count = torch.tensor(local, dtype=torch.int64, device=device)
        if dist.is_available() and dist.is_initialized():  # DDP: every rank needs the global count
            dist.all_reduce(count, op=dist.ReduceOp.SUM)
        token_count = int(count)
    return iter(batches), token_count


def step_token_count(rank_batches: list[list[dict]], cfg: dict) -> int:
    """The global count the emulated reference passes to each emulated rank: all ranks' micro-batches."""
    return sum(real_tokens(mask_padding(b, cfg)) for batches in rank_batches for b in batches)
