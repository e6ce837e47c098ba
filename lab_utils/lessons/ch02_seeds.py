"""Chapter 02's measurements, one hop from the notebook: the per-rank init table, rebuilding a rank's model
from its seed alone, the hidden DataLoader draw and the workers' seeds.

Taught in notebooks/02_seeds.ipynb. Everything here is measured (generator states, parameter bytes), never
asserted from documentation; the runs themselves are launched by the notebook (`chapter.run_many`).
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader

from lab_utils.core import config, runfiles, workloads
from lab_utils.lessons import ch02_rng_probe


def init_table(beats: dict[str, dict[int, dict]], seed: int, per_rank_seed: tuple[str, ...]) -> None:
    """Print, per run and rank: the seed it built its model with, and its parameter fingerprints before and
    after `DDP(model)`. `beats`: {run key: read_heartbeats(run)}; runs in `per_rank_seed` used seed + rank."""
    print(f"{'run':>9} {'rank':>4} {'seed used':>9}  {'init_param_hash':<17} {'param_hash_after_wrap':<17}")
    for key, per_rank in beats.items():
        for rank, b in sorted(per_rank.items()):
            used = seed + rank if key in per_rank_seed else seed
            print(f"{key:>9} {rank:>4} {used:>9}  {b['init_param_hash']:<17} "
                  f"{b.get('param_hash_after_wrap', '(no DDP)'):<17}")


def init_hash(torch_seed: int, **keys) -> str:
    """The fingerprint of the model train.py builds (with `keys`) after `torch.manual_seed(torch_seed)`, built here
    in this process (the caller's global RNG state is restored afterwards)."""
    saved = torch.get_rng_state()
    try:
        torch.manual_seed(torch_seed)
        return runfiles.fingerprint(workloads.build(config.resolve(dict(keys), 1)).model)
    finally:
        torch.set_rng_state(saved)


def hidden_draws() -> dict[str, int | None]:
    """How many int64s each way of touching a DataLoader takes from the global CPU generator."""
    return {
        "iter(DataLoader(data))": ch02_rng_probe.count_global_draws(lambda: iter(DataLoader(range(8)))),
        "iter(DataLoader(data, generator=g))": ch02_rng_probe.count_global_draws(
            lambda: iter(DataLoader(range(8), generator=torch.Generator().manual_seed(0)))),
        "DataLoader(data)  (no iterator)": ch02_rng_probe.count_global_draws(lambda: DataLoader(range(8))),
    }


def worker_seed_table(seeds: tuple[int, ...], num_workers: int = 2, loader_seed: int = 1234) -> dict:
    """For each process seed, the base seed and each worker's seed, without and with a dedicated generator.
    Returns {(generator kind, process seed): ch02_rng_probe.worker_seeds(...)} and prints worker seed - base seed."""
    out = {}
    for main_seed in seeds:
        for gen in ("global", "dedicated"):
            torch.manual_seed(main_seed)
            g = torch.Generator().manual_seed(loader_seed) if gen == "dedicated" else None
            out[gen, main_seed] = ch02_rng_probe.worker_seeds(num_workers, generator=g)
    for (gen, main_seed), s in out.items():
        offsets = {w: seed - s["expected_base_seed"] for w, seed in s["workers"].items()}
        print(f"generator={gen:<9} process seed {main_seed}: base_seed {s['expected_base_seed']:>20}  "
              f"worker seed - base_seed: {offsets}")
    return out
