"""Probe: which read pattern gets the most bandwidth out of one 128 MiB bf16 matrix
(B of the 64x8192x8192 cells, K x N row-major)? Each kernel sums what it reads (so
nothing is optimised away) and writes one float per program. Patterns:

* ``flat``: each program streams contiguous blocks (grid-stride), the copy's pattern;
* ``strip``: program j reads the column strip ``[:, j*BN:(j+1)*BN]`` in ``BK``-row steps,
  as a GEMM's mainloop reads B (one strip per output tile), optionally split along K;
* ``tma-strip``: the same through a tensor descriptor (TMA), pipelined by ``num_stages``.

A development tool, not a test.    python3 scripts/read_patterns.py
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
import triton.testing
from triton.tools.tensor_descriptor import TensorDescriptor


@triton.jit
def flat_kernel(x, out, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    acc = tl.zeros((BLOCK,), tl.float32)
    for start in range(pid * BLOCK, n, nprog * BLOCK):
        acc += tl.load(x + start + tl.arange(0, BLOCK)).to(tl.float32)
    tl.store(out + pid, tl.sum(acc))


@triton.jit
def strip_kernel(x, out, K, N, BK: tl.constexpr, BN: tl.constexpr, SPLIT: tl.constexpr):
    pid = tl.program_id(0)
    strip = pid // SPLIT
    part = pid % SPLIT
    rows = K // SPLIT
    cols = strip * BN + tl.arange(0, BN)
    acc = tl.zeros((BK, BN), tl.float32)
    for k in range(part * rows, (part + 1) * rows, BK):
        r = k + tl.arange(0, BK)
        acc += tl.load(x + r[:, None].to(tl.int64) * N + cols[None, :]).to(tl.float32)
    tl.store(out + pid, tl.sum(acc))


@triton.jit
def tma_strip_kernel(desc, out, K, BK: tl.constexpr, BN: tl.constexpr, SPLIT: tl.constexpr):
    pid = tl.program_id(0)
    strip = pid // SPLIT
    part = pid % SPLIT
    rows = K // SPLIT
    acc = tl.zeros((BK, BN), tl.float32)
    for k in range(part * rows, (part + 1) * rows, BK):
        acc += desc.load([k, strip * BN]).to(tl.float32)
    tl.store(out + pid, tl.sum(acc))


def main() -> None:
    K = N = 8192
    B = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    nbytes = B.numel() * B.element_size()
    out = torch.empty(4096, device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cases = []
    for progs in (sms, 2 * sms, 4 * sms, 8 * sms):
        for block in (4096, 8192):
            cases.append((f"flat progs={progs} block={block}",
                          lambda p=progs, b=block: flat_kernel[(p,)](B, out, B.numel(), BLOCK=b)))
    for bn, bk, split, warps, stages in ((64, 128, 1, 4, 4), (64, 128, 2, 4, 4), (128, 64, 1, 4, 4),
                                         (128, 64, 2, 4, 4), (256, 32, 4, 8, 4), (32, 256, 1, 4, 4),
                                         (64, 256, 1, 8, 3)):
        grid = (N // bn * split,)
        cases.append((f"strip BN={bn} BK={bk} split={split} programs={grid[0]}",
                      lambda g=grid, bn=bn, bk=bk, s=split, w=warps, st=stages:
                      strip_kernel[g](B, out, K, N, BK=bk, BN=bn, SPLIT=s, num_warps=w, num_stages=st)))
        desc = TensorDescriptor(B, list(B.shape), list(B.stride()), [bk, bn])
        cases.append((f"tma-strip BN={bn} BK={bk} split={split} programs={grid[0]}",
                      lambda g=grid, d=desc, bn=bn, bk=bk, s=split, w=warps, st=stages:
                      tma_strip_kernel[g](d, out, K, BK=bk, BN=bn, SPLIT=s, num_warps=w, num_stages=st)))
    cases.append(("copy_ (read + write)", lambda: torch.empty_like(B).copy_(B)))
    for name, fn in cases:
        try:
            fn()
            ms = triton.testing.do_bench(fn, warmup=25, rep=200)
        except Exception as exc:  # noqa: BLE001 - a probe reports and goes on
            print(f"{name:48s} FAILED {str(exc).splitlines()[0][:100]}")
            continue
        moved = 2 * nbytes if name.startswith("copy") else nbytes
        print(f"{name:48s} {ms * 1e3:7.1f} us  {moved / ms / 1e9:5.2f} TB/s", flush=True)


if __name__ == "__main__":
    main()
