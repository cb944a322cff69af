"""The step after the kernel that combines reduction partials the kernel leaves (the TMA
families' per-row/per-column sums, every logsumexp, batched whole-output reductions): one Triton launch per output.

Layer: backends/triton. The kernel writes one partial per tile into a float32 workspace
(logsumexp: the tile's max and its sum of exp(x - max) in a second one). Viewed as
``(B, T, EXT)`` (B: batches the output keeps, T: partials per result, EXT: results per
batch), ``combine_partials`` reads ``PARTS`` partials of ``BLOCK`` results per step (loads in
flight together) and combines them in a fixed order, so results are deterministic run to
run. It replaced a
chain of torch operations (about nine launches for logsumexp) after the kernel.
"""

from __future__ import annotations

import triton
import triton.language as tl

BLOCK = 64  # results per program (8192 rows: 128 programs)
PARTS = 16  # partials loaded per step (in flight together)


@triton.jit
def _nan_max(a, b):
    return tl.where((a != a) | (a > b), a, b)  # NaN wins, as torch.amax


@triton.jit
def _nan_min(a, b):
    return tl.where((a != a) | (a < b), a, b)


@triton.jit
def _parts(ptr, base, t0, T, EXT, idx, lanes, parts, other):
    """Partials t0 .. t0 + PARTS - 1 of this program's results, ``other`` past the end."""
    mask = ((t0 + parts)[:, None] < T) & lanes[None, :]
    return tl.load(ptr + base + (t0 + parts)[:, None] * EXT + idx[None, :], mask=mask,
                   other=other)


@triton.jit
def combine_partials(ws, ws2, out, T, EXT, osl, os, OP: tl.constexpr, BLOCK: tl.constexpr,
                     PARTS: tl.constexpr):
    """``OP``: "sum", "max", "min" or "logsumexp" (``ws2``: the sums of exp)."""
    b = tl.program_id(1).to(tl.int64)
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    lanes = idx < EXT
    parts = tl.arange(0, PARTS)
    base = b * T * EXT
    if OP == "logsumexp":
        # the largest per-tile max (NaN wins), then the sum of the tiles' sums rescaled to it
        m = tl.full((BLOCK,), float("-inf"), tl.float32)
        for t0 in range(0, T, PARTS):
            x = _parts(ws, base, t0, T, EXT, idx, lanes, parts, float("-inf"))
            m = _nan_max(m, tl.reduce(x, 0, _nan_max))
        safe = tl.where(m == float("-inf"), 0.0, m)
        s = tl.zeros((BLOCK,), tl.float32)
        for t0 in range(0, T, PARTS):  # ws and ws2 at the same offsets, computed once
            mask = ((t0 + parts)[:, None] < T) & lanes[None, :]
            offs = base + (t0 + parts)[:, None] * EXT + idx[None, :]
            x = tl.load(ws + offs, mask=mask, other=float("-inf"))
            s += tl.sum(tl.load(ws2 + offs, mask=mask, other=0.0) * tl.exp(x - safe[None, :]),
                        axis=0)
        r = safe + tl.log(s)
    elif OP == "sum":
        r = tl.full((BLOCK,), -0.0, tl.float32)  # x + -0.0 is x, signed zeros included
        for t0 in range(0, T, PARTS):
            r += tl.sum(_parts(ws, base, t0, T, EXT, idx, lanes, parts, -0.0), axis=0)
    elif OP == "max":
        r = tl.full((BLOCK,), float("-inf"), tl.float32)
        for t0 in range(0, T, PARTS):
            x = _parts(ws, base, t0, T, EXT, idx, lanes, parts, float("-inf"))
            r = _nan_max(r, tl.reduce(x, 0, _nan_max))
    else:
        r = tl.full((BLOCK,), float("inf"), tl.float32)
        for t0 in range(0, T, PARTS):
            x = _parts(ws, base, t0, T, EXT, idx, lanes, parts, float("inf"))
            r = _nan_min(r, tl.reduce(x, 0, _nan_min))
    tl.store(out + b * osl + idx * os, r.to(out.dtype.element_ty), mask=lanes)
