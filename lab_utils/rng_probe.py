"""Direct probes of where randomness comes from and what DDP copies at wrap time.

Taught in notebooks/02_seeds.ipynb. Three small instruments, each answering one question exactly
(by comparing generator states and tensor bytes, never by eyeballing curves):

- :func:`count_global_draws` -- how many draws did a call take from torch's *global* CPU generator?
  (Creating a DataLoader iterator takes one int64 even with ``num_workers=0``: its workers' base seed.)
- :func:`worker_seeds` -- which seed does each DataLoader worker get? (``base_seed + worker_id``, the
  base seed drawn from ``generator=`` if given, else from the global generator.)
- the wrap probe (:func:`launch_wrap_probe`, run under torchrun as a file) -- rank ``r`` seeds
  ``seed + r`` as the article's §2.2 does, builds a BNNet, runs one train-mode forward on its own batch
  (so its BatchNorm running statistics are its own), then wraps one copy in DDP with
  ``broadcast_buffers=True`` and another with ``False``. Each rank writes the parameter and buffer
  fingerprints before and after each wrap to ``runs/NAME/probe/rank{r}.json``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

if __name__ == "__main__":  # started by torchrun as a file: make `lab_utils` importable from a clone
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

__all__ = ["int64_draw", "count_global_draws", "worker_seeds", "buffer_fingerprint", "launch_wrap_probe",
           "read_wrap_probe"]


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


# ------------------------------------------------------------------ what DDP copies at wrap time
def buffer_fingerprint(model: torch.nn.Module) -> str:
    """sha256 (first 16 hex) of every buffer's bytes in name order: metrics.fingerprint covers parameters."""
    h = hashlib.sha256()
    for name, b in sorted(getattr(model, "module", model).named_buffers()):
        h.update(name.encode())
        h.update(b.detach().to("cpu").contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def launch_wrap_probe(name: str, nproc: int = 2, seed: int = 42, backend: str = "auto", timeout: float = 120):
    """Run this file under torchrun as runs/NAME with `nproc` ranks; return {rank: record} (raises on failure)."""
    from . import launcher

    result = launcher.launch(name, nproc, {"seed": seed, "backend": backend, "steps": 1}, timeout=timeout,
                             progress=False, script=Path(__file__).resolve())
    result.raise_for_status()
    return read_wrap_probe(result.run_dir)


def read_wrap_probe(run_dir: str | Path) -> dict[int, dict]:
    files = sorted(Path(run_dir, "probe").glob("rank*.json"))
    if not files:
        raise FileNotFoundError(f"{run_dir}: no probe/rank*.json (did the wrap probe run?)")
    records = [json.loads(f.read_text()) for f in files]
    return {r["rank"]: r for r in sorted(records, key=lambda r: r["rank"])}


def _wrap_probe(cfg: dict, env) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP

    from lab_utils import metrics
    from lab_utils.bn_net import IMAGE_SIZE, BNNet

    torch.manual_seed(cfg["seed"] + env.rank)  # the article's set_seed(42 + rank), §2.2
    model = BNNet().to(env.device)
    model.train()
    with torch.no_grad():  # one forward on this rank's own batch: its BN running stats become its own
        model(torch.randn(8, 1, IMAGE_SIZE, IMAGE_SIZE).to(env.device))
    record = {"rank": env.rank, "seed": cfg["seed"] + env.rank,
              "before": {"params": metrics.fingerprint(model)[0], "buffers": buffer_fingerprint(model)}}
    device_ids = [env.device.index] if env.device.type == "cuda" else None
    for flag in (True, False):
        wrapped = DDP(copy.deepcopy(model), device_ids=device_ids, broadcast_buffers=flag)
        record[f"broadcast_buffers={flag}"] = {"params": metrics.fingerprint(wrapped)[0],
                                               "buffers": buffer_fingerprint(wrapped)}
    return record


def _main(argv: list[str]) -> None:
    from lab_utils import config, distenv, metrics

    cfg = config.resolve(argv, int(os.environ.get("WORLD_SIZE", "1")))
    env = distenv.setup(cfg)
    try:
        if not env.distributed:
            raise SystemExit("the wrap probe needs torchrun with nproc >= 2")
        record = _wrap_probe(cfg, env)
        out = Path(cfg["out_dir"]) / "probe"
        out.mkdir(parents=True, exist_ok=True)
        metrics.write_json(record, out / f"rank{env.rank}.json")
    finally:
        distenv.teardown(env)


if __name__ == "__main__":
    _main(sys.argv[1:])
    from lab_utils import distenv

    distenv.exit_process(0)  # skip interpreter finalization (the gloo exit race; see distenv.exit_process)
