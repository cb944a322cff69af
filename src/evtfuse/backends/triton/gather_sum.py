"""Rows gathered by index and summed in groups of k: a mixture of experts' way back from
expert order to token order (``runtime.moe``: each token's k rows, one per expert it was
routed to, added together).

Layer: backends/triton. ``gather_sum(src, index, k)``: ``out[t] = sum_j src[index[t * k +
j]]`` for j = 0 .. k-1 in that order, in fp32, rounded once to ``src``'s dtype; one
program per ``ROWS`` output rows and ``BLOCK`` columns, each loading its rows' k source
rows (the loads of the k rows in flight together) and storing once. Deterministic (a fixed
order, no atomics), one launch, every byte read and written once: what ``embedding_bag``'s
sum also computes, at one thread per output element. Runs under Triton's CPU interpreter
too (``runtime.device.use_interpreter`` set before this module is imported; bf16 rows
through fp32 copies there, as ``runtime.kernel.Bf16AsFp32Plan`` runs kernels).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 512  # columns per program (bf16: 1 KB of each source row)
ROWS = 4  # output rows per program


@triton.jit
def _gather_sum(src, index, out, rows, width, s_src, s_out, K: tl.constexpr,
                ROWS: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    keep = (r[:, None] < rows) & (c[None, :] < width)
    acc = tl.zeros((ROWS, BLOCK), tl.float32)
    for j in tl.static_range(K):
        at = tl.load(index + r.to(tl.int64) * K + j, mask=r < rows, other=0)
        acc += tl.load(src + at[:, None] * s_src + c[None, :], mask=keep, other=0.0).to(tl.float32)
    tl.store(out + r.to(tl.int64)[:, None] * s_out + c[None, :], acc.to(out.dtype.element_ty),
             mask=keep)


def gather_sum(src: torch.Tensor, index: torch.Tensor, k: int) -> torch.Tensor:
    """(index.numel() // k, src.shape[1]): row t the fp32 sum of ``src``'s rows
    ``index[t*k : t*k + k]`` in that order, rounded once to ``src.dtype``. ``src`` has
    unit column stride; ``index`` holds int64 row numbers of ``src``."""
    assert src.dim() == 2 and src.stride(1) == 1 and index.dtype == torch.int64, \
        (src.shape, src.stride(), index.dtype)
    rows, width = index.numel() // k, src.shape[1]
    if src.device.type == "cpu" and src.dtype == torch.bfloat16:
        # Triton's CPU interpreter reads and writes bf16 memory wrongly (numpy has none):
        # the rows as fp32 (exact), the sums rounded once to bf16 by torch (nearest even)
        return gather_sum(src.float(), index, k).bfloat16()
    out = src.new_empty((rows, width))
    if rows == 0 or width == 0:
        return out
    block = min(BLOCK, triton.next_power_of_2(width))
    grid = (triton.cdiv(rows, ROWS), triton.cdiv(width, block))
    _gather_sum[grid](src, index.contiguous(), out, rows, width, src.stride(0), out.stride(0),
                      K=k, ROWS=ROWS, BLOCK=block, num_warps=4)
    return out


__all__ = ["gather_sum"]
