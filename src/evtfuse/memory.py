"""Which memory a tensor's elements occupy: the facts behind the aliasing rules.

Layer: base (imports nothing of evtfuse; read by ``arguments`` when it validates, and by
the runtime's cached paths, which must re-check what validation checked whenever tensors
move). Invariants: two tensors overlap when the byte ranges their elements span intersect
(by address, whatever storage objects hold them); a tensor overlaps itself when two of its
elements are one memory location, decided exactly from its shape and strides; and
``tensor_state`` changes whenever anything that decides either changes in place
(``A.t_()``, ``D.set_(...)``, a storage resized under a tensor), so a cache keyed on it
never serves a tensor that has moved or changed shape since it was checked.
"""

from __future__ import annotations

import itertools
from typing import Any, Iterable, Sequence

import torch


def tensor_state(t: torch.Tensor) -> tuple:
    """What a validated tensor's memory checks depend on and an in-place change can alter:
    its address, shape, strides and the size of its storage (torch's version counter
    counts writes to the data, not changes of this metadata)."""
    return (t.data_ptr(), t.shape, t.stride(), t.untyped_storage().nbytes())


def state_of(values: Iterable[Any]) -> list:
    """``tensor_state`` of each tensor among ``values``; None or "scalar" for the others."""
    return [tensor_state(v) if isinstance(v, torch.Tensor) else
            (None if v is None else "scalar") for v in values]


def byte_span(t: torch.Tensor) -> int:
    """Bytes from ``t``'s first element to the end of its last (0 when it is empty)."""
    if t.numel() == 0:
        return 0
    return (sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1) * t.element_size()


def ranges_meet(a0: int, a_span: int, b0: int, b_span: int) -> bool:
    """Whether bytes [a0, a0 + a_span) and [b0, b0 + b_span) intersect (empty ones never do)."""
    return a_span > 0 and b_span > 0 and a0 < b0 + b_span and b0 < a0 + a_span


def overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` may share a memory location: their spans intersect, except
    where two views of one layout (shape, strides and element size) with at most two
    dimensions of more than one element provably interleave without meeting (the two
    column halves ``p[:, :n]`` and ``p[:, n:]`` of one (M, 2n) tensor: an element of one
    meets one of the other when sum(d_k * stride_k) is their distance for some |d_k| <
    size_k)."""
    if not ranges_meet(a.data_ptr(), byte_span(a), b.data_ptr(), byte_span(b)):
        return False
    size = a.element_size()
    dist = b.data_ptr() - a.data_ptr()
    if a.shape != b.shape or a.stride() != b.stride() or size != b.element_size() \
            or dist % size:
        return True
    dims = [(n, st) for n, st in zip(a.shape, a.stride()) if n > 1]
    if len(dims) > 2 or any(st <= 0 for _, st in dims):
        return True
    dims += [(1, 1)] * (2 - len(dims))
    (n1, s1), (n2, s2) = dims
    return _two_terms(s1, n1, s2, n2, dist // size, nonzero=False)


def has_internal_overlap(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether two elements of a tensor of this shape and these strides are one memory
    location (``expand``, a stride of 0, strides smaller than a dimension's extent).

    Exact, unlike torch's own check, which answers "too hard" for layouts other than
    contiguous ones and stride 0: two elements meet when some nonzero index difference d
    (|d_k| < size_k) has sum(d_k * stride_k) == 0."""
    if any(n == 0 for n in shape):
        return False
    dims = sorted(((n, abs(s)) for n, s in zip(shape, strides) if n > 1), key=lambda d: d[1])
    if any(s == 0 for _, s in dims):
        return True
    reach = 0  # the largest offset the dimensions of smaller strides reach
    for n, s in dims:
        if s <= reach:
            break
        reach += (n - 1) * s
    else:
        return False  # each stride steps past everything the smaller ones reach
    # enumerate the index differences of all but the two largest dimensions; for each,
    # ask whether the two left can make up the rest (a bounded two-term equation)
    *rest, (n1, s1), (n2, s2) = sorted(dims, key=lambda d: d[0])
    for ds in itertools.product(*(range(-(n - 1), n) for n, _ in rest)):
        target = -sum(d * s for d, (_, s) in zip(ds, rest))
        if _two_terms(s1, n1, s2, n2, target, nonzero=not any(ds)):
            return True
    return False


def _two_terms(s1: int, n1: int, s2: int, n2: int, t: int, nonzero: bool) -> bool:
    """Whether x * s1 + y * s2 == t for some |x| < n1, |y| < n2 ((x, y) != (0, 0) when
    ``nonzero``; then t is 0)."""
    g, u, v = _egcd(s1, s2)
    if t % g:
        return False
    x0, y0 = u * (t // g), v * (t // g)
    a, b = s2 // g, s1 // g  # every solution: x = x0 + k a, y = y0 - k b
    lo = max(-((n1 - 1 + x0) // a), -((n2 - 1 - y0) // b))  # ceil divisions
    hi = min((n1 - 1 - x0) // a, (y0 + n2 - 1) // b)
    if lo > hi:
        return False
    return hi > lo or not nonzero or lo != 0  # with t == 0, k == 0 is the zero solution


def _egcd(a: int, b: int) -> tuple[int, int, int]:
    """(g, u, v) with u * a + v * b == g == gcd(a, b), for a, b > 0."""
    u0, v0, u1, v1 = 1, 0, 0, 1
    while b:
        q, a, b = a // b, b, a % b
        u0, u1 = u1, u0 - q * u1
        v0, v1 = v1, v0 - q * v1
    return a, u0, v0
