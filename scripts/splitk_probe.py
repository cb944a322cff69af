"""Probe: does split-K (K split across programs, the last program of a tile sums the fp32
partials and runs the epilogue) beat cuBLAS on small-M problems (M=64, N=K=8192)?
A development tool (standalone kernel, bias + relu epilogue), not the library's kernel.

    python3 scripts/splitk_probe.py [--shape 64x8192x8192]
"""

from __future__ import annotations

import argparse
import itertools

import torch
import triton
import triton.language as tl
import triton.testing
from triton.tools.tensor_descriptor import TensorDescriptor


@triton.jit
def splitk_kernel(a_desc, b_desc, bias, D, ws, cnt, M, N, K,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  SPLIT_K: tl.constexpr):
    pid = tl.program_id(0)
    tile = pid // SPLIT_K
    split = pid % SPLIT_K
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m = tile // num_pid_n
    pid_n = tile % num_pid_n
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    k_tiles = tl.cdiv(K, BLOCK_K)
    per = tl.cdiv(k_tiles, SPLIT_K)
    k0 = split * per
    k1 = tl.minimum(k0 + per, k_tiles)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for ki in range(k0, k1):
        acc = tl.dot(a_desc.load([off_m, ki * BLOCK_K]), b_desc.load([ki * BLOCK_K, off_n]), acc)
    rm = off_m + tl.arange(0, BLOCK_M)
    rn = off_n + tl.arange(0, BLOCK_N)
    last = True
    if SPLIT_K > 1:
        lane = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        base = ws + tile.to(tl.int64) * (SPLIT_K * BLOCK_M * BLOCK_N)
        tl.store(base + split * (BLOCK_M * BLOCK_N) + lane, acc)
        tl.debug_barrier()
        tk = tl.atomic_add(cnt + tile, 1, sem="acq_rel", scope="gpu")
        last = tk == SPLIT_K - 1
        if last:
            tl.atomic_xchg(cnt + tile, 0)
            acc = tl.load(base + lane, cache_modifier=".cg")
            for s in tl.static_range(1, SPLIT_K):
                acc += tl.load(base + s * (BLOCK_M * BLOCK_N) + lane, cache_modifier=".cg")
    if last:
        b = tl.load(bias + rn, mask=rn < N, other=0.0).to(tl.float32)
        d = tl.maximum(acc + b[None, :], 0.0)
        tl.store(D + rm[:, None] * N + rn[None, :], d.to(D.dtype.element_ty),
                 mask=(rm[:, None] < M) & (rn[None, :] < N))


def run(A, B, bias, D, bm, bn, bk, s, stages, warps):
    M, K = A.shape
    N = B.shape[1]
    a_desc = TensorDescriptor(A, list(A.shape), list(A.stride()), [bm, bk])
    b_desc = TensorDescriptor(B, list(B.shape), list(B.stride()), [bk, bn])
    tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    ws = torch.empty(tiles * s * bm * bn, device=A.device, dtype=torch.float32)
    cnt = torch.zeros(tiles, device=A.device, dtype=torch.int32)

    def go():
        splitk_kernel[(tiles * s,)](a_desc, b_desc, bias, D, ws, cnt, M, N, K, bm, bn, bk, s,
                                    num_stages=stages, num_warps=warps)
    return go


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="64x8192x8192")
    args = p.parse_args()
    M, N, K = (int(x) for x in args.shape.split("x"))
    torch.manual_seed(0)
    A = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    B = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    ref = torch.relu(A.float() @ B.float() + bias.float())
    t_mm = triton.testing.do_bench(lambda: A @ B, warmup=50, rep=300)
    t_lt = triton.testing.do_bench(lambda: torch.relu(torch.addmm(bias, A, B)), warmup=50, rep=300)
    print(f"cuBLAS mm {t_mm:.4f} ms   addmm+relu {t_lt:.4f} ms")
    results = []
    for bm, bn, bk, s, stages, warps in itertools.product(
            [64], [64, 128, 256], [64, 128], [1, 2, 4, 8], [3, 4, 6], [4]):
        smem = stages * (bm * bk + bk * bn) * 2
        if smem > 220_000:
            continue
        D = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        try:
            go = run(A, B, bias, D, bm, bn, bk, s, stages, warps)
            go()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - a probe reports and goes on
            print(f"{bm}x{bn}x{bk} s{s} st{stages}: {type(e).__name__}: {str(e)[:80]}")
            continue
        err = (D.float() - ref).abs().max().item()
        t = triton.testing.do_bench(go, warmup=50, rep=300)
        results.append((t, f"{bm}x{bn}x{bk} split{s} st{stages} w{warps}", err))
    for t, name, err in sorted(results)[:25]:
        print(f"{name:32s} {t:.4f} ms  {t / t_mm:.3f}x mm  max err {err:.3g}")


if __name__ == "__main__":
    main()
