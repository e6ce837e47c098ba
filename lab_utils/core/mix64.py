"""splitmix64: the one 64-bit integer hash behind the lab's keyed randomness and its global sampler.

Both `keyed_rng` (per-sample masks and augmentation) and `global_sampler` (the Feistel permutation) need a
fast, well-avalanching bijection of 64-bit integers. They vectorise it differently (torch int64 tensors vs
numpy uint64 arrays), but the constants and the exact Python-int reference live here, once.
"""

from __future__ import annotations

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's increment: 2**64 / golden ratio, odd
M1 = 0xBF58476D1CE4E5B9
M2 = 0x94D049BB133111EB


def mix(z: int) -> int:
    """splitmix64's finaliser on a Python int (mod 2**64): a well-avalanching bijection."""
    z &= MASK64
    z = ((z ^ (z >> 30)) * M1) & MASK64
    z = ((z ^ (z >> 27)) * M2) & MASK64
    return z ^ (z >> 31)


def splitmix64(x: int) -> int:
    """One splitmix64 output for state `x`: add the golden increment, then mix."""
    return mix(x + GOLDEN)
