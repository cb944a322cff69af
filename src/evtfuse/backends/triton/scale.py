"""``x *= g`` in place for a large contiguous tensor ``x`` and a one-element tensor ``g``
on its device, skipped on the GPU where ``g`` is 1: one Triton launch, no host sync.

Layer: backends/triton. ``linear_cross_entropy``'s forward computes d_hidden and d_weight
before the loss's upstream gradient exists, and its backward multiplies them by it. torch's
``x.mul_(g)`` broadcasts the 0-dim ``g`` with stride 0, which takes torch's unvectorized
elementwise kernel: 2.4 ms per step for a bf16 d_weight of 128256x4096 and its d_hidden on
an H200 (~0.9 TB/s; benchmarks/linear_cross_entropy.py's profile). This kernel reads ``g``
in float32 (as ``mul_`` does), multiplies each element in float32 and rounds once to
``x``'s dtype; a persistent grid (``PROGRAMS_PER_SM`` programs per SM, each striding over
the tensor) whose programs return at once where ``g`` is exactly 1 (a plain
``loss.backward()``), so the usual step does not read d_weight at all (one program per
block of 4096 elements took 0.04 ms a launch to return: 128K programs for d_weight).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

BLOCK = 4096  # elements per step of a program
PROGRAMS_PER_SM = 8  # a persistent grid: where g is 1, a few hundred programs return at once
DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # computed in float32 exactly


@triton.jit
def _scale_kernel(X, G, n, BLOCK: tl.constexpr):
    g = tl.load(G).to(tl.float32)
    if g != 1.0:  # NaN too
        step = tl.num_programs(0).to(tl.int64) * BLOCK
        for start in range(tl.program_id(0).to(tl.int64) * BLOCK, n, step):
            offs = start + tl.arange(0, BLOCK)
            mask = offs < n
            x = tl.load(X + offs, mask=mask)
            tl.store(X + offs, (x.to(tl.float32) * g).to(X.dtype.element_ty), mask=mask)


@functools.lru_cache(maxsize=None)
def _programs(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # Triton's interpreter on the CPU
    return torch.cuda.get_device_properties(device).multi_processor_count * PROGRAMS_PER_SM


def applies(x: torch.Tensor, g: torch.Tensor) -> bool:
    """Whether ``scale_`` runs the kernel for ``x`` and ``g`` (else ``x.mul_(g)`` does)."""
    return (x.dtype in DTYPES and x.is_contiguous() and x.numel() > 0 and g.numel() == 1
            and g.device == x.device)


def scale_(x: torch.Tensor, g: torch.Tensor) -> None:
    """``x *= g`` (``applies(x, g)`` must hold)."""
    n = x.numel()
    grid = (min(triton.cdiv(n, BLOCK), _programs(x.device)),)
    _scale_kernel[grid](x, g.reshape(1), n, BLOCK=BLOCK, num_warps=4)
