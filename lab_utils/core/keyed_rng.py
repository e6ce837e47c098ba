"""Randomness keyed by sample: draws that are a pure function of (seed, visit id, site).

Taught in notebooks/04_per_sample_rng.ipynb.

A 2-rank DDP run matches the single-process run step for step only if every random draw tied to
a sample (augmentation, dropout masks) comes out the same whichever process makes it.  Drawing
from an RNG *stream* (torch's global generator, a per-rank ``seed + rank``, a DataLoader
worker's generator) breaks that: the value depends on which process draws, and on how many draws
that process made before.  So we derive each draw from its *key* instead:

* :func:`keyed_uniform` -- a counter-based generator: element ``[i, *j]`` is a hash of
  ``(seed, keys[i], site, j)``.  Pure integer arithmetic, so it is bit-identical on CPU and CUDA,
  and sample ``i``'s values do not depend on which other samples share its batch.
* :func:`sample_generator` -- a fresh CPU ``torch.Generator`` seeded from
  ``hash(seed, visit_id, site)``, for per-sample code (augmentation in ``__getitem__``) that
  wants torch's RNG API.
* :class:`KeyedDropout` + :class:`dropout_keys` -- ``nn.Dropout`` whose mask for sample ``i`` is
  ``keyed_uniform(seed, keys[i], site, ...) >= p``.  The keys are set around the forward with
  ``with dropout_keys(batch["key"], seed): loss = model(x)``.

Sites.  ``site`` separates the independent random "call sites" that share a key: each
``KeyedDropout`` instance in a model must get its own site (the model assigns them, e.g. layer
numbers), and augmentation uses other sites.  Two instances with the same site draw the *same*
mask for a sample.  One instance called twice within one forward also draws the same mask both
times: there is deliberately no hidden call counter, because a counter is exactly the kind of
history-dependent state this module removes -- it would make the mask depend on how many forwards
ran under the context, and activation checkpointing, which re-runs the forward to rebuild
activations, would then rebuild them with a different mask.  Keyed by (seed, key, site) alone, the
recomputed mask is the original one.  If a model needs two independent masks, give it two
instances.
"""

from __future__ import annotations

import contextvars
import math

import torch

# splitmix64's constants and its Python-int reference are shared with global_sampler (lab_utils/core/mix64.py).
from lab_utils.core.mix64 import GOLDEN as _GOLDEN
from lab_utils.core.mix64 import M1 as _M1
from lab_utils.core.mix64 import M2 as _M2
from lab_utils.core.mix64 import MASK64 as _MASK64
from lab_utils.core.mix64 import mix as _mix_int

__all__ = ["keyed_uniform", "sample_generator", "dropout_keys", "KeyedDropout"]

# --------------------------------------------------------------------------------------------
# splitmix64, twice: on Python ints (exact, for the scalar parts seed/site/visit id) and on torch
# int64 tensors (vectorised, for keys and element counters).  The two agree bit for bit.
#
# torch has no general-purpose uint64 arithmetic, so the tensor version works in int64, which is
# the same bits: + and * wrap modulo 2**64 (two's complement), and ^ is bitwise.  Only >> differs:
# on int64 it is an *arithmetic* shift (copies the sign bit in), so after ``z >> s`` we mask off
# the top ``s`` bits to get the logical shift that splitmix64 is defined with.
# --------------------------------------------------------------------------------------------
# Domain separators: keyed_uniform and sample_generator hash the same (seed, key, site) triples,
# and must not hand out correlated numbers when someone uses the same site for both.
_DOMAIN_UNIFORM = 0x6B657965645F756E  # "keyed_un"
_DOMAIN_GENERATOR = 0x67656E6572617472  # "generatr"


def _to_i64(u: int) -> int:
    """A value in [0, 2**64) as the int64 with the same bits (what a torch int64 scalar can hold)."""
    u &= _MASK64
    return u - (1 << 64) if u >> 63 else u


def _lsr(z: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 bits: arithmetic shift, then clear the sign-extended bits."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def _mix_tensor(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on an int64 tensor; same bits as :func:`_mix_int`."""
    z = (z ^ _lsr(z, 30)) * _to_i64(_M1)
    z = (z ^ _lsr(z, 27)) * _to_i64(_M2)
    return z ^ _lsr(z, 31)


def _scalar_base(domain: int, seed: int, site: int) -> int:
    """Hash of (domain, seed, site) as an unsigned 64-bit Python int.

    Chained rather than summed, so (seed, site) = (1, 2) and (2, 1) do not collide.
    """
    h = _mix_int(domain + _GOLDEN * (int(seed) & _MASK64))
    return _mix_int(h + _GOLDEN * ((int(site) & _MASK64) + 1))


def _as_keys(keys, who: str) -> torch.Tensor:
    """Check that ``keys`` is one integer per sample (the visit ids) and return it as a tensor."""
    keys = torch.as_tensor(keys)
    if keys.dim() != 1:
        raise ValueError(f"{who}: keys must be 1-D (one integer per sample), got shape {tuple(keys.shape)}")
    if keys.dtype.is_floating_point or keys.dtype.is_complex or keys.dtype == torch.bool:
        raise TypeError(f"{who}: keys must be an integer tensor (visit ids), got dtype {keys.dtype}")
    return keys


def keyed_uniform(seed: int, keys: torch.Tensor, site: int, shape: tuple[int, ...] = (),
                  device=None) -> torch.Tensor:
    """Uniform float32 in [0, 1), shape ``(len(keys), *shape)``, keyed by sample.

    Element ``[i, *j]`` is a pure function of ``(seed, keys[i], site, flat index of j)``: not of
    ``i``, of the other keys, of the device or of any RNG state.  That is what makes batch splits
    (ranks, micro-batches) invisible.

    How: row ``i`` gets a 64-bit state ``r_i = mix(base(seed, site) ^ mix(keys[i] + golden))``
    (``mix`` is a bijection, so distinct keys give distinct states), and element ``j`` of the row
    is ``mix(r_i + (j + 1) * golden)`` -- exactly the splitmix64 sequence started at ``r_i``.
    Its top 24 bits divided by 2**24 give a float32 that is exact (24 bits fit the mantissa), so
    CPU and CUDA agree bit for bit.  Cost: one int64 temporary per output element.
    """
    shape = tuple(int(d) for d in shape)
    keys = _as_keys(keys, "keyed_uniform")
    device = keys.device if device is None else torch.device(device)
    keys = keys.to(device=device, dtype=torch.int64)

    base = _to_i64(_scalar_base(_DOMAIN_UNIFORM, seed, site))
    rows = _mix_tensor(_mix_tensor(keys + _to_i64(_GOLDEN)) ^ base)  # (B,)
    numel = math.prod(shape)
    counters = (torch.arange(1, numel + 1, dtype=torch.int64, device=device) * _to_i64(_GOLDEN))
    bits = _mix_tensor(rows[:, None] + counters[None, :])  # (B, numel)
    top24 = _lsr(bits, 40)  # the best-mixed bits of splitmix64 are the high ones
    return (top24.to(torch.float32) * (1.0 / (1 << 24))).reshape(len(keys), *shape)


def sample_generator(seed: int, visit_id: int, site: int = 0) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded from ``hash(seed, visit_id, site)``.

    For per-sample code that wants torch's RNG API (``torch.randint(..., generator=g)``).  A fresh
    generator per (visit, site) means the draws are the same in any process, any DataLoader worker
    and in any call order; and since the visit id includes the epoch, they change every epoch.
    Use a different ``site`` for each independent consumer within one sample.
    """
    h = _mix_int(_scalar_base(_DOMAIN_GENERATOR, seed, site) ^ _mix_int(int(visit_id) + _GOLDEN))
    g = torch.Generator(device="cpu")
    g.manual_seed(h)  # manual_seed accepts the full unsigned 64-bit range
    return g


# --------------------------------------------------------------------------------------------
# Keys for KeyedDropout.  A ContextVar (not a module global, not a model attribute) so that the
# keys follow the code that set them: nested contexts restore the outer keys on exit, and threads
# or asyncio tasks each see their own.
# --------------------------------------------------------------------------------------------
_CURRENT_KEYS: contextvars.ContextVar[tuple[torch.Tensor, int] | None] = contextvars.ContextVar(
    "lab_utils_dropout_keys", default=None)


class dropout_keys:  # lower-case on purpose: it reads like a function, `with dropout_keys(...)`
    """Set the per-sample keys (and seed) that :class:`KeyedDropout` reads, for a ``with`` block.

    ``with dropout_keys(batch["key"], seed): loss = loss_fn(model(batch["x"]), ...)``

    ``keys`` is one integer per sample of the batch (the visit ids).  Re-entrant: nesting (also of
    the same instance) works, and leaving a block restores whatever keys were set before it.
    """

    def __init__(self, keys, seed: int = 0):
        self.keys = _as_keys(keys, "dropout_keys").to(torch.int64)
        self.seed = int(seed)
        self._tokens: list[contextvars.Token] = []  # a stack, so one instance can be nested

    def __enter__(self) -> dropout_keys:
        self._tokens.append(_CURRENT_KEYS.set((self.keys, self.seed)))
        return self

    def __exit__(self, *exc) -> None:
        _CURRENT_KEYS.reset(self._tokens.pop())


class KeyedDropout(torch.nn.Module):
    """``nn.Dropout`` with a mask keyed by sample: the same on any rank, device or batch split.

    ``site`` must be distinct for every KeyedDropout instance in a model (see the module
    docstring).  In training with ``p > 0`` the forward needs keys: wrap it in
    ``with dropout_keys(batch["key"], seed): ...``.  Like ``nn.Dropout``: kept values are scaled
    by ``1 / (1 - p)``; eval mode (or ``p == 0``) is the identity.
    """

    def __init__(self, p: float, site: int):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"KeyedDropout: p must be in [0, 1], got {p}")
        if int(site) != site or site < 0:
            raise ValueError(f"KeyedDropout: site must be a non-negative int, got {site!r}")
        self.p = float(p)
        self.site = int(site)

    def extra_repr(self) -> str:
        return f"p={self.p}, site={self.site}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        current = _CURRENT_KEYS.get()
        if current is None:
            raise RuntimeError(
                f"KeyedDropout(p={self.p}, site={self.site}) is training but no per-sample keys are set. "
                "Wrap the forward in `with dropout_keys(batch['key'], seed): ...` (keys = the batch's visit "
                "ids), or call model.eval() if you meant inference.")
        keys, seed = current
        if keys.shape[0] != x.shape[0]:
            raise ValueError(
                f"KeyedDropout(site={self.site}): got {keys.shape[0]} keys for a batch of {x.shape[0]} "
                "samples; dropout_keys(...) must get exactly one key per sample of the model's input.")
        if self.p == 1.0:
            return x * 0.0  # nn.Dropout(p=1) also returns zeros (and keeps the graph)
        keep = keyed_uniform(seed, keys, self.site, tuple(x.shape[1:]), device=x.device) >= self.p
        # Same arithmetic as ATen's dropout: x * (bernoulli(1 - p) / (1 - p)).
        return x * (keep.to(x.dtype) / (1.0 - self.p))
