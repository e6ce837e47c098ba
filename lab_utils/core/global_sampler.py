"""Global-batch ("single-card order") sampling that gives the same batches at any world size.

Taught in notebooks/03_samplers.ipynb.

A training run consumes an infinite stream of *visit ids*.  Visit id ``v = epoch * n + idx``
means "dataset index ``idx`` during epoch ``epoch``" (see :func:`dataset_index`).  Position ``p``
of the global stream (p = 0, 1, 2, ...) holds ``epoch = p // n`` and
``idx = perm_epoch[p % n]``, i.e. one permutation of ``range(n)`` per epoch, epochs concatenated.

Global batch ``s`` is positions ``[s*B, (s+1)*B)``; it may straddle an epoch boundary, which is
fine: no sample is dropped or repeated and the stream never has to be padded.  With ``W`` ranks
each rank holds ``B / W`` positions of every global batch, so the *union* of the ranks' samples at
step ``s`` is exactly the single-process batch ``s``, whatever ``W`` is.  That is the property
that lets a DDP run reproduce the single-GPU run.

Two ways to make the per-epoch permutation:

* ``mode="randperm"``: ``torch.randperm(n, generator=manual_seed(seed + epoch))``, bit-identical
  to ``DistributedSampler(shuffle=True, seed=seed)`` after ``set_epoch(epoch)``.  Materialises
  ``n`` int64 values per epoch (8 GB at n = 1e9), so only for small n and for comparisons.
* ``mode="feistel"``: a keyed bijection of ``range(n)`` evaluated on the fly (Feistel network +
  cycle-walking, below).  O(1) memory in ``n``; any position can be computed directly, so the
  first index is available immediately and resuming at step 10**7 costs nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from lab_utils.core.mix64 import GOLDEN as _GOLDEN
from lab_utils.core.mix64 import M1, M2
from lab_utils.core.mix64 import MASK64 as _MASK64
from lab_utils.core.mix64 import splitmix64 as _splitmix64

__all__ = ["GlobalOrder", "GlobalBatchSampler", "dataset_index"]

MODES = ("feistel", "randperm")
LAYOUTS = ("contiguous", "strided")

_ROUNDS = 6  # Luby-Rackoff: 4 rounds already give a strong pseudo-random permutation; 6 for margin
_CHUNK = 1 << 16  # positions generated per numpy call inside __iter__
_MAX_N = 1 << 62  # keeps positions and visit ids comfortably inside int64


def dataset_index(visit_id, n: int):
    """Split a visit id (int or integer array) into ``(epoch, idx)``; ``dataset[idx]`` is the sample."""
    return visit_id // n, visit_id % n


# --------------------------------------------------------------------------------------------
# Integer hashing.  numpy uint64 arithmetic wraps modulo 2**64 *silently for arrays*, which is
# exactly the arithmetic splitmix64 is defined in, so the vectorised hash matches the Python one.
# (numpy *scalar* uint64 ops warn on overflow, so we only ever do wrapping ops on arrays.)
# --------------------------------------------------------------------------------------------
def _mix64(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on a uint64 array (a fast, well-avalanching bijection of 64-bit ints)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(M1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(M2)
    return z ^ (z >> np.uint64(31))


class GlobalOrder:
    """Global visit order: position p (0..inf) -> visit id epoch*n + perm_epoch[p % n]."""

    def __init__(self, n: int, seed: int, mode: str = "feistel"):
        n, seed = int(n), int(seed)
        if not 1 <= n <= _MAX_N:
            raise ValueError(f"n must be >= 1 (and <= 2**62), got {n}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.n, self.seed, self.mode = n, seed, mode
        # Feistel networks permute a domain of 2 * half_bits bits (an "even-bit" power of two):
        # the smallest such domain >= n is < 4n, so cycle-walking needs < 4 steps on average.
        self._half_bits = max(1, ((n - 1).bit_length() + 1) // 2)
        self._seed_key = _splitmix64(seed & _MASK64)
        self._cached_epoch: int | None = None  # randperm mode keeps only the current epoch's perm
        self._cached_perm: np.ndarray | None = None

    # ---- public API --------------------------------------------------------------------------
    def visit_ids(self, start: int, stop: int) -> np.ndarray:
        """int64 visit ids for global positions [start, stop)."""
        if not 0 <= start <= stop:
            raise ValueError(f"need 0 <= start <= stop, got start={start}, stop={stop}")
        return self.visit_ids_at(np.arange(start, stop, dtype=np.int64))

    def visit_ids_at(self, positions) -> np.ndarray:
        """int64 visit ids for an array of arbitrary (non-negative) global positions."""
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size and positions.min() < 0:
            raise ValueError("positions must be >= 0")
        epochs, offsets = positions // self.n, positions % self.n
        if self.mode == "feistel":
            idx = self._feistel_perm(offsets, epochs)
        else:
            # Ascending epochs, so the one-epoch cache serves the next call too.  A chunk spans
            # U <= len(positions)/n + 2 epochs, so the stacked table is small.
            uniq, inverse = np.unique(epochs, return_inverse=True)
            table = np.stack([self._randperm(e) for e in uniq.tolist()])
            idx = table[inverse, offsets]
        return epochs * self.n + idx

    def permutation(self, epoch: int, start: int = 0, stop: int | None = None) -> np.ndarray:
        """perm_epoch[start:stop] as int64 dataset indices."""
        stop = self.n if stop is None else stop
        if not 0 <= start <= stop <= self.n:
            raise ValueError(f"need 0 <= start <= stop <= n={self.n}, got start={start}, stop={stop}")
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if self.mode == "randperm":
            return self._randperm(epoch)[start:stop].copy()
        offsets = np.arange(start, stop, dtype=np.int64)
        return self._feistel_perm(offsets, np.full(1, epoch, dtype=np.int64))

    # ---- randperm mode -----------------------------------------------------------------------
    def _randperm(self, epoch: int) -> np.ndarray:
        if self._cached_epoch != epoch:
            # Exactly what DistributedSampler.__iter__ does for shuffle=True after set_epoch(epoch).
            g = torch.Generator()
            g.manual_seed(self.seed + epoch)
            self._cached_perm = torch.randperm(self.n, generator=g).numpy()
            self._cached_epoch = epoch
        return self._cached_perm

    # ---- feistel mode ------------------------------------------------------------------------
    def _round_keys(self, epochs: np.ndarray) -> np.ndarray:
        """(_ROUNDS, len(epochs)) uint64 round keys; column j belongs to epochs[j]."""
        epoch_key = _mix64(np.uint64(self._seed_key) ^ (epochs.astype(np.uint64) * np.uint64(_GOLDEN)))
        rounds = np.arange(1, _ROUNDS + 1, dtype=np.uint64)[:, None] * np.uint64(_GOLDEN)
        return _mix64(epoch_key[None, :] + rounds)

    def _feistel(self, x: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """One keyed bijection of [0, 4**half_bits).  keys: (_ROUNDS, len(x)) or (_ROUNDS, 1)."""
        h = np.uint64(self._half_bits)
        mask = np.uint64((1 << self._half_bits) - 1)
        left, right = x >> h, x & mask
        for k in keys:
            # (L, R) -> (R, L ^ F(R)) is invertible whatever F is (L = R' ^ F(L')), so every
            # round -- and hence the whole network -- is a bijection of the 2*half_bits-bit domain.
            left, right = right, left ^ (_mix64(right ^ k) & mask)
        return (left << h) | right

    def _feistel_perm(self, offsets: np.ndarray, epochs: np.ndarray) -> np.ndarray:
        """perm_epoch[offset] for each (offset, epoch) pair; epochs may be a single-element array."""
        if offsets.size == 0:
            return np.zeros(0, dtype=np.int64)
        if epochs.size == 1 or epochs.min() == epochs.max():
            keys = self._round_keys(epochs[:1])  # the common case: one epoch, broadcast its keys
        else:
            uniq, inverse = np.unique(epochs, return_inverse=True)
            keys = self._round_keys(uniq)[:, inverse]
        y = self._feistel(offsets.astype(np.uint64), keys)
        # Cycle-walking: the Feistel network permutes a domain D >= n.  Re-encrypt any value that
        # lands >= n until it falls in [0, n).  Following x's cycle inside D forward always
        # reaches an element < n again (at worst x itself), and walking back from that element
        # over the out-of-range ones leads only to x -- so "first in-range element after x" is a
        # bijection of [0, n).  Only the stragglers are re-encrypted, in shrinking batches.
        n = np.uint64(self.n)
        todo = np.flatnonzero(y >= n)
        while todo.size:
            y_todo = self._feistel(y[todo], keys if keys.shape[1] == 1 else keys[:, todo])
            y[todo] = y_todo
            todo = todo[y_todo >= n]
        return y.astype(np.int64)


class GlobalBatchSampler(torch.utils.data.Sampler[int]):
    """Infinite stream of visit ids for one rank. Taught in notebooks/03_samplers.ipynb.

    At step ``s`` this rank yields the ``B/W`` global positions of :meth:`rank_positions` (``B`` =
    ``global_batch_size``, ``W`` = ``world_size``), mapped through :class:`GlobalOrder`:

    * ``layout="contiguous"``: positions ``[s*B + r*B/W, s*B + (r+1)*B/W)`` -- rank 0 holds the
      first part of the single-process batch, in order.
    * ``layout="strided"``: positions ``s*B + r + W*j`` -- what ``DistributedSampler``'s
      ``perm[r::W]`` gives.

    With ``grad_accum_steps`` A the rank consumes each step's ids as A micro-batches of
    ``B // (W*A)``.  Items are *visit ids*; map them to samples with ``dataset[v % n]``
    (see :func:`dataset_index`).

    Resuming: the iterator advances the sampler's counters as it yields, so :meth:`state_dict`
    describes what the *caller has consumed* from the iterator.  A new ``__iter__`` continues from
    the current counters (start_step, a loaded state, or where a previous iterator stopped).
    Caveat: a ``DataLoader`` pulls indices ahead of the training loop (``prefetch_factor *
    num_workers`` batches are in flight), so ``sampler.state_dict()`` read from the training
    loop is ahead of what the model has seen.  Save the number of steps actually trained instead
    (e.g. ``{"step": trained_steps, "offset": 0, ...}``), or use ``num_workers=0`` and no prefetch.
    """

    def __init__(self, n: int, global_batch_size: int, rank: int = 0, world_size: int = 1,
                 seed: int = 0, mode: str = "feistel", layout: str = "contiguous", start_step: int = 0):
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if global_batch_size < 1:
            raise ValueError(f"global_batch_size must be >= 1, got {global_batch_size}")
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must satisfy 0 <= rank < world_size={world_size}, got {rank}")
        if global_batch_size % world_size:
            raise ValueError(f"global_batch_size ({global_batch_size}) must be divisible by "
                             f"world_size ({world_size})")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if start_step < 0:
            raise ValueError(f"start_step must be >= 0, got {start_step}")
        self.n, self.seed, self.mode, self.layout = int(n), int(seed), mode, layout
        self.global_batch_size, self.world_size, self.rank = global_batch_size, world_size, rank
        self.per_step = global_batch_size // world_size  # ids this rank yields per step
        self.order = GlobalOrder(self.n, self.seed, mode)
        # Counter of ids yielded so far on this rank, counted from step 0: step = _next // per_step.
        self._next = start_step * self.per_step

    def __iter__(self) -> Iterator[int]:
        # Start with one step so the first id comes at once, then double up to ~_CHUNK positions
        # per numpy call, which amortises numpy's per-call overhead.
        max_steps, steps = max(1, _CHUNK // self.per_step), 1
        while True:
            step, skip = divmod(self._next, self.per_step)
            ids = self.order.visit_ids_at(self._positions(step, step + steps))[skip:]
            steps = min(2 * steps, max_steps)
            for v in ids.tolist():
                self._next += 1  # count before yielding: once the caller has v, v is consumed
                yield v

    def state_dict(self) -> dict:
        step, offset = divmod(self._next, self.per_step)
        return {"step": step, "offset": offset, "n": self.n, "seed": self.seed, "mode": self.mode,
                "layout": self.layout, "global_batch_size": self.global_batch_size,
                "world_size": self.world_size, "rank": self.rank}

    def load_state_dict(self, state: dict) -> None:
        for key in ("step", "offset", "n", "seed", "mode", "layout", "global_batch_size", "world_size"):
            if key not in state:
                raise ValueError(f"state is missing key {key!r}")
        for key in ("n", "seed", "mode", "layout", "global_batch_size"):
            if state[key] != getattr(self, key):
                raise ValueError(f"state {key!r} is {state[key]!r} but this sampler has "
                                 f"{getattr(self, key)!r}")
        if state["world_size"] != self.world_size and state["offset"] != 0:
            # The global order does not depend on W, so a step boundary can be resumed at any
            # world size (elastic restart); a mid-step offset is only meaningful for the same W.
            raise ValueError(f"state 'world_size' is {state['world_size']} but this sampler has "
                             f"{self.world_size}; only step boundaries (offset 0) can change world_size")
        # 'rank' is informational: every rank may load rank 0's state (ranks run in lockstep).
        self._next = state["step"] * self.per_step + state["offset"]

    def rank_positions(self, step: int) -> np.ndarray:
        """The global positions this rank holds at `step`, in the order it yields them."""
        return self._positions(step, step + 1)

    def step_visit_ids(self, step: int) -> np.ndarray:
        """The visit ids this rank yields at `step`."""
        return self.order.visit_ids_at(self.rank_positions(step))

    def _positions(self, first_step: int, stop_step: int) -> np.ndarray:
        """Positions of steps [first_step, stop_step) for this rank, flattened in yield order."""
        starts = np.arange(first_step, stop_step, dtype=np.int64)[:, None] * self.global_batch_size
        j = np.arange(self.per_step, dtype=np.int64)[None, :]
        if self.layout == "contiguous":
            return (starts + self.rank * self.per_step + j).ravel()
        return (starts + self.rank + self.world_size * j).ravel()
