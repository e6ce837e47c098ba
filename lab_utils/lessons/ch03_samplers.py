"""Chapter 03's lesson logic, one hop from the notebook: the streams behind each picture, the chapter's set of
runs, the checks on uneven datasets, and the global-batch sampler at scale (world-size independence, resume).

Taught in notebooks/03_samplers.ipynb. The streams come from `samplers.rank_stream`, the exact samplers
train.py trains on, so a statement about a stream here is a statement about the runs.
"""

from __future__ import annotations

import numpy as np

from lab_utils.core.config import resolve
from lab_utils.core.global_sampler import GlobalBatchSampler
from lab_utils.lessons import ch03_sampler_plots as sp


def streams(kind: str, n: int, world_size: int, steps: int, **keys) -> np.ndarray:
    """(steps, world_size, per_rank) visit ids of sampler `kind` for a dataset of n samples."""
    return sp.step_visits(kind, n, world_size, resolve(dict(keys), world_size), steps)


def first_step_off(single: np.ndarray, ranks: np.ndarray, n: int) -> int | None:
    """The first step at which the ranks together do not hold the single run's samples (None: never)."""
    same = sp.same_batch_per_step(single, ranks, n)
    return same.index(False) if False in same else None


def describe_steps(single: np.ndarray, panels: dict[str, np.ndarray], n: int) -> dict[str, dict]:
    """Per panel: the steps at which the ranks hold the single run's batch, and which rank holds each position
    of the single batch at step 0. Printed, and returned for the verdicts."""
    out = {}
    for kind, ranks in panels.items():
        same = sp.same_batch_per_step(single, ranks, n)
        layout = sp.layout_on_single(single[0], ranks[0], n)[0].tolist()
        out[kind] = {"same": same, "layout": layout}
        print(f"{kind:>11}: same samples as the single run at steps {[s for s, ok in enumerate(same) if ok]}; "
              f"rank per position at step 0: {layout}")
    return out


def layout_word(layout: list[int]) -> str:
    """'strided' (0, 1, 0, 1, ...), 'contiguous' (0, 0, ..., 1, 1, ...) or 'other'."""
    world_size = max(layout) + 1
    if layout == [i % world_size for i in range(len(layout))]:
        return "strided"
    if layout == sorted(layout):
        return "contiguous"
    return "other"


def chapter_runs(nproc: int, n: int, global_batch_size: int, steps: int) -> dict[str, tuple[str, int, dict]]:
    """The chapter's runs as `chapter.run_many` specs: {key: (run name, nproc, keys)}; 2-rank runs first (they
    take longest). n - 1 samples make the uneven dataset. BatchNorm: one 2-rank run against its emulation proves
    the emulation exact; the layouts are then compared on the (cheaper) emulations."""
    gpt = dict(n_samples=n, global_batch_size=global_batch_size, steps=steps)
    odd = dict(gpt, n_samples=n - 1)
    feistel = dict(odd, sampler="global", sampler_mode="feistel")
    bn = dict(model="bn_net", global_batch_size=32, steps=steps)
    specs = {
        "ddp_dist": (nproc, dict(gpt, sampler="distributed")),
        "ddp_noepoch": (nproc, dict(gpt, sampler="distributed", set_epoch=False)),
        "ddp_odd_pad": (nproc, dict(odd, sampler="distributed", drop_last=False)),
        "ddp_odd_feistel": (nproc, feistel),
        "bn_ddp_dist": (nproc, dict(bn, sampler="distributed")),
        "single": (1, dict(gpt, sampler="distributed")),
        "single_random": (1, dict(gpt, sampler="random")),
        "single_odd": (1, dict(odd, sampler="distributed")),
        "single_odd_feistel": (1, feistel),
        "bn_emu_dist": (1, dict(bn, sampler="distributed", emulate_ranks=nproc)),
        "bn_emu_global": (1, dict(bn, sampler="global", emulate_ranks=nproc)),
    }
    return {key: (f"ch03_{key}", procs, keys) for key, (procs, keys) in specs.items()}


def uneven(n: int, global_batch_size: int, world_size: int, steps: int) -> dict:
    """An uneven dataset (n not divisible by world_size) with the stock sampler: the padded visits, and the first
    step at which padding / drop_last leave the single run's batches."""
    single = streams("distributed", n, 1, steps, global_batch_size=global_batch_size)
    padded = streams("distributed", n, world_size, steps, global_batch_size=global_batch_size)
    dropped = streams("distributed", n, world_size, steps, global_batch_size=global_batch_size, drop_last=True)
    dups = sp.repeated_visits(padded)
    for step, r, v in dups:
        print(f"step {step}: rank {r} trains on index {v % n} of epoch {v // n} a second time")
    out = {"dups": dups, "padded_off": first_step_off(single, padded, n),
           "dropped_off": first_step_off(single, dropped, n), "dropped_dups": sp.repeated_visits(dropped)}
    print(f"padded: first step whose samples differ from the single run's: {out['padded_off']}; "
          f"drop_last=true: {out['dropped_off']}")
    return out


# ------------------------------------------------------------------ appendix: the global-batch sampler at scale
def global_batch(n: int, global_batch_size: int, world_size: int, step: int, seed: int = 1234) -> np.ndarray:
    """Step `step`'s global batch as the ranks hold it (contiguous layout: rank order = batch order), computed
    directly from the step number, not iterated to."""
    ranks = [GlobalBatchSampler(n, global_batch_size, rank=r, world_size=world_size, seed=seed, mode="feistel")
             for r in range(world_size)]
    return np.concatenate([s.step_visit_ids(step) for s in ranks])


def world_size_independent(n: int, global_batch_size: int, steps: list[int], worlds=(2, 4, 8)) -> dict[int, bool]:
    """{W: do W ranks together hold the W=1 global batch at every step in `steps`?}"""
    return {w: all(np.array_equal(global_batch(n, global_batch_size, w, s), global_batch(n, global_batch_size, 1, s))
                   for s in steps) for w in worlds}


def _take(sampler, k: int) -> list[int]:
    it = iter(sampler)
    return [next(it) for _ in range(k)]


def resume_checks(n: int, global_batch_size: int, seed: int = 1234) -> dict[str, bool]:
    """Mid-step resume on 2 ranks (stop after 2 steps and 11 ids, reload state_dict, continue), and an elastic
    restart: a state taken at the start of step 5 on 2 ranks, loaded on 4 ranks."""
    def make(rank, world_size):
        return GlobalBatchSampler(n, global_batch_size, rank=rank, world_size=world_size, seed=seed, mode="feistel")

    per_rank = global_batch_size // 2
    straight = _take(make(0, 2), 3 * per_rank + 50)
    interrupted = make(0, 2)
    first = _take(interrupted, 2 * per_rank + 11)
    state = interrupted.state_dict()
    resumed = make(0, 2)
    resumed.load_state_dict(state)
    mid_step = first + _take(resumed, len(straight) - len(first)) == straight
    elastic = [make(r, 4) for r in range(4)]
    for s in elastic:
        s.load_state_dict(dict(state, step=5, offset=0))
    at_boundary = sum((_take(s, global_batch_size // 4) for s in elastic), []) == \
        global_batch(n, global_batch_size, 1, 5, seed).tolist()
    print(f"state after {len(first)} ids: step {state['step']}, offset {state['offset']}; resumed stream == "
          f"uninterrupted stream: {mid_step}; 2 -> 4 ranks at a step boundary: {at_boundary}")
    return {"mid_step": mid_step, "elastic": at_boundary}
