"""The step after the kernel that combines reduction partials the kernel leaves (the TMA
families' per-row/per-column sums, every logsumexp and shifted_sumexp, batched whole-output
reductions): one Triton launch per output.

Layer: backends/triton. The kernel writes one partial per tile into a float32 workspace
(float64 for a float64 kernel: the combine computes in the workspace's dtype)
(logsumexp, shifted_sumexp: the tile's max and its sum of exp(x - max) in a second one). Viewed as
``(B, T, EXT)`` (B: batches the output keeps, T: partials per result, EXT: results per
batch), ``combine_partials`` reads ``PARTS`` partials of ``BLOCK`` results per step (loads in
flight together) and combines them in a fixed order, so results are deterministic run to
run; logsumexp in one pass (the running sum rescaled to each step's new max). It replaced a
chain of torch operations (about nine launches for logsumexp) after the kernel.
``launch_shape`` sizes the steps and programs: each step is a round trip to memory, so
few results (64 rows of an M=64 problem) take many partials per step, and many results
spread over many programs.

On a Hopper GPU the combine is launched as a programmatic dependent launch (``PDL``): the
kernel before it lets its programs start early (``gdc_launch_dependents``, emitted by
``codegen``) and each waits for the kernel's memory (``gdc_wait``) before its first load,
so the launch's latency passes under the kernel's tail instead of after it.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

BLOCK = 64  # results per program at most (8192 rows: 128 programs)
STEP_ELEMENTS = 4096  # partials x results loaded per step (in flight together)
PROGRAMS = 256  # programs a launch with enough results spreads them over (two per SM)


def launch_shape(T: int, EXT: int) -> tuple[int, int, int]:
    """(BLOCK, PARTS, num_warps) for ``T`` partials of ``EXT`` results. Each step of a
    program is a round trip to memory it waits for, so the launch is latency-bound: 16 to
    ``BLOCK`` results per program, fewer (more programs) where that lets one step take
    every partial or spreads the results over ``PROGRAMS`` programs; as many partials per
    step as keep a step within ``STEP_ELEMENTS`` loads (16 at least, fewer only where
    ``T`` is smaller); eight warps where the launch has fewer than 16 programs, so more
    loads are in flight. Measured on an H100 (``combine_shape_probe.py``, partials
    read from DRAM, launch included; benchmarks/HISTORY.md, fifteenth session), against the
    earlier shapes: 64 rows of 128 partials 8.3 -> 5.8-6.5 us, 2048 rows of 16 partials
    6.2 -> 5.1-5.7 us, 8192 rows of 64 partials 8.8 -> 7.5-8.3 us."""
    block = min(BLOCK, max(16, triton.next_power_of_2(EXT)))
    while block > 16 and (T > STEP_ELEMENTS // block or triton.cdiv(EXT, block) < PROGRAMS):
        block //= 2
    parts = min(triton.next_power_of_2(max(T, 2)), max(16, STEP_ELEMENTS // block))
    warps = 8 if triton.cdiv(EXT, block) < 16 else 4
    return block, parts, warps


def pdl_enabled(capability_major: int) -> bool:
    """Whether the combine after a kernel is a programmatic dependent launch: Hopper and
    later (``griddepcontrol``), unless ``EVTFUSE_PDL=0``."""
    return capability_major >= 9 and os.environ.get("EVTFUSE_PDL", "1") != "0"


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
    return tl.load(ptr + base + (t0 + parts)[:, None].to(tl.int64) * EXT + idx[None, :], mask=mask,
                   other=other)


@triton.jit
def combine_partials(ws, ws2, out, T, EXT, osl, os, OP: tl.constexpr, BLOCK: tl.constexpr,
                     PARTS: tl.constexpr, PDL: tl.constexpr = False):
    """``OP``: "sum", "max", "min", "logsumexp" or "shifted_sumexp" (these two: ``ws2``
    holds the sums of exp). ``PDL``: launched as a programmatic dependent launch, so wait
    for the kernel before it first."""
    if PDL:
        gdc_wait()
    b = tl.program_id(1).to(tl.int64)
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    lanes = idx < EXT
    parts = tl.arange(0, PARTS)
    base = b * T * EXT
    if OP == "logsumexp" or OP == "shifted_sumexp":
        # one pass: the running max (NaN wins) and the tiles' sums of exp rescaled to it,
        # the running sum rescaled whenever the max grows
        m = tl.full((BLOCK,), float("-inf"), ws.dtype.element_ty)  # float32, or float64
        s = tl.zeros((BLOCK,), ws.dtype.element_ty)
        for t0 in range(0, T, PARTS):  # ws and ws2 at the same offsets, computed once
            mask = ((t0 + parts)[:, None] < T) & lanes[None, :]
            offs = base + (t0 + parts)[:, None].to(tl.int64) * EXT + idx[None, :]
            x = tl.load(ws + offs, mask=mask, other=float("-inf"))
            w = tl.load(ws2 + offs, mask=mask, other=0.0)
            mx = _nan_max(m, tl.reduce(x, 0, _nan_max))
            # shifted by 0 where the max is infinite: -inf (nothing yet), or +inf (inf - inf
            # would be NaN; the sums are then +inf, and so is the result)
            safe = tl.where(tl.abs(mx) == float("inf"), 0.0, mx)
            s = s * tl.exp(m - safe) + tl.sum(w * tl.exp(x - safe[None, :]), axis=0)
            m = mx
        if OP == "logsumexp":  # as optable.finish_exp_partials
            r = tl.where(m == float("-inf"), float("-inf"),
                         m + tl.log(tl.where(m == float("-inf"), 1.0, s)))
        else:  # the sum alone (no max added back to round it away); NaN for an infinite max
            r = tl.where(tl.abs(m) == float("inf"), float("nan"), s)
    elif OP == "sum":
        r = tl.full((BLOCK,), -0.0, ws.dtype.element_ty)  # x + -0.0 is x, signed zeros included
        for t0 in range(0, T, PARTS):
            r += tl.sum(_parts(ws, base, t0, T, EXT, idx, lanes, parts, -0.0), axis=0)
    elif OP == "max":
        r = tl.full((BLOCK,), float("-inf"), ws.dtype.element_ty)
        for t0 in range(0, T, PARTS):
            x = _parts(ws, base, t0, T, EXT, idx, lanes, parts, float("-inf"))
            r = _nan_max(r, tl.reduce(x, 0, _nan_max))
    else:
        r = tl.full((BLOCK,), float("inf"), ws.dtype.element_ty)
        for t0 in range(0, T, PARTS):
            x = _parts(ws, base, t0, T, EXT, idx, lanes, parts, float("inf"))
            r = _nan_min(r, tl.reduce(x, 0, _nan_min))
    # offsets in 64 bits: a strided output (a column of a wide tensor) may reach past 2^31
    tl.store(out + b * osl + idx.to(tl.int64) * os, r.to(out.dtype.element_ty), mask=lanes)
