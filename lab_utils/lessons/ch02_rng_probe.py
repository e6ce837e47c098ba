"""Direct probes of where randomness comes from and what DDP copies at wrap time.

Taught in notebooks/02_seeds.ipynb. Three small instruments, each answering one question exactly
(by comparing generator states and tensor bytes, never by eyeballing curves):

- :func:`count_global_draws` -- how many draws did a call take from torch's *global* CPU generator?
  (Creating a DataLoader iterator takes one int64 even with ``num_workers=0``: its workers' base seed.)
- :func:`worker_seeds` -- which seed does each DataLoader worker get? (``base_seed + worker_id``, the
  base seed drawn from ``generator=`` if given, else from the global generator.)
- what DDP copies at wrap time is measured by a rank-side probe (scripts/probes/wrap_probe.py, launched
  by :func:`lab_utils.launch.probes.launch_wrap_probe`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.data import DataLoader, Dataset

__all__ = ["int64_draw", "count_global_draws", "worker_seeds"]


# ------------------------------------------------------------------ draws from the global generator
def int64_draw() -> int:
    """One int64 from the global generator: exactly what DataLoader does for its workers' base seed."""
    return int(torch.empty((), dtype=torch.int64).random_().item())


def count_global_draws(fn: Callable[[], object], draw: Callable[[], object] = int64_draw, seed: int = 0,
                       max_draws: int = 64) -> int | None:
    """How many `draw()`s from the global CPU generator `fn()` consumed.

    Seeds the global generator with `seed`, runs `fn`, keeps the generator state; re-seeds and calls `draw`
    until the state is the same. 0: `fn` left the global generator alone. None: the state after `fn` is not
    that of 0..max_draws whole draws (it drew something else, or more). The caller's global RNG state is
    restored afterwards, so probing never shifts the caller's own later draws.
    """
    saved = torch.get_rng_state()
    try:
        torch.manual_seed(seed)
        fn()
        after = torch.get_rng_state()
        torch.manual_seed(seed)
        for k in range(max_draws + 1):
            if torch.equal(torch.get_rng_state(), after):
                return k
            draw()
        return None
    finally:
        torch.set_rng_state(saved)


# ------------------------------------------------------------------ DataLoader worker seeds
class _SeedOfWorker(Dataset):
    """Item i: (worker id, torch.initial_seed()) of the process that fetched it (-1: the main process)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, int]:
        info = torch.utils.data.get_worker_info()
        return (info.id if info is not None else -1), torch.initial_seed()


def worker_seeds(num_workers: int, generator: torch.Generator | None = None) -> dict:
    """Start a DataLoader with `num_workers` workers and report {"expected_base_seed", "workers": {id: seed}}.

    `expected_base_seed` is computed *independently* of DataLoader: one int64 drawn from a copy of
    `generator` (or of the global generator's state when `generator` is None) -- the draw DataLoader
    makes when an iterator is created. DataLoader seeds worker `w` with base_seed + w, so the reported
    seeds should be expected_base_seed + w. The global generator (and `generator`) advance exactly as
    they would by creating the iterator yourself.
    """
    twin = torch.Generator()  # a copy: predicting the draw must not make it
    twin.set_state(torch.get_rng_state() if generator is None else generator.get_state())
    expected = int(torch.empty((), dtype=torch.int64).random_(generator=twin).item())
    n = max(num_workers, 1) * 2
    loader = DataLoader(_SeedOfWorker(n), batch_size=1, num_workers=num_workers, generator=generator)
    seen = {}
    for wid, seed in loader:
        seen[int(wid)] = int(seed)
    return {"expected_base_seed": expected, "workers": dict(sorted(seen.items()))}
