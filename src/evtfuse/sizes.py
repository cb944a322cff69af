"""Size classes of M: the tuner keys its choices on them (``runtime.tuner``), and the
kernels keep their compile-time constants the same across one (``backends.triton``), so
that a new M of a tuned class runs the class's compiled kernel.

Layer: base, below the backends and the runtime (imports nothing of evtfuse).
"""

from __future__ import annotations


def size_class(m: int) -> int:
    """The class of a problem's M: the class's largest M. Up to 64 rows, classes of 16, 32
    and 64 (the small-M tiles differ there); above, four classes per octave (M rounded up to
    2^k times 5/4, 6/4, 7/4 or 2): within a class the number of row tiles differs by at
    most a quarter, so the waves of a tile grid, which decide between candidates, differ
    little. Every power of two ends a class, so whether M fits one tile of a power-of-two
    height is the same for every M of a class."""
    m = int(m)
    if m <= 64:
        return 16 if m <= 16 else 32 if m <= 32 else 64
    octave = 1 << ((m - 1).bit_length() - 1)  # the power of two below m (m > octave)
    return next(octave * q // 4 for q in (5, 6, 7, 8) if m <= octave * q // 4)


__all__ = ["size_class"]
