"""Probe: how fast can one kernel read a 128 MiB bf16 matrix on this GPU (B of the
64x8192x8192 cells)? Times torch's sum/amax (pure reads), a copy (read + write) and the
M=64 GEMM itself, so the M=64 cells' ~2.3 TB/s can be set against the read ceiling.
A development tool, not a test.

    python3 scripts/read_bw.py
"""

from __future__ import annotations

import torch
import triton.testing


def main() -> None:
    n = 8192
    B = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    A = torch.randn(64, n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(B)
    nbytes = B.numel() * B.element_size()
    cases = {
        "sum(B) fp32": (lambda: B.sum(dtype=torch.float32), nbytes),
        "amax(B)": (lambda: B.amax(), nbytes),
        "copy B": (lambda: out.copy_(B), 2 * nbytes),
        "A @ B (M=64)": (lambda: A @ B, nbytes),
        "A @ B.T (M=64, B K-major)": (lambda: A @ B.T, nbytes),
    }
    for name, (fn, moved) in cases.items():
        ms = triton.testing.do_bench(fn, warmup=25, rep=200)
        print(f"{name:28s} {ms * 1e3:8.1f} us  {moved / ms / 1e9:6.2f} TB/s")


if __name__ == "__main__":
    main()
