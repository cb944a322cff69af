"""Host overhead of a launch: Triton's own JIT launch of the compiled evtfuse kernel
("bare", ``fn[grid](...)``), the compiled launcher called directly (what launch plans do
after their first launch), ``Kernel.run(args)`` and ``evtfuse.gemm`` on a cached choice
(the same tensors each call, and eight rotating sets of tensors), on a tiny GEMM whose GPU
time is far below the host time, so that time per call is host time.

    PYTHONPATH=src python3 scripts/host_overhead.py
"""

from __future__ import annotations

import time

import torch

import evtfuse
from evtfuse import EpilogueArguments, GemmArguments, get_kernels

SRC = "def epi(accum, C, alpha, beta): D = alpha * accum + beta * C; return D"


def per_call_us(fn, n=3000) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def main() -> None:
    M = N = K = 64
    A = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    B = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    C = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    D = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(SRC, C=C, alpha=1.0, beta=0.5, D=D))
    rows = []
    for k in get_kernels(args)[:1] + [k for k in get_kernels(args) if k.family.name == "portable"][:1]:
        plan = k.plan(args)
        pos = plan.positional(A, B, args.epilogue.values)
        bare = per_call_us(lambda: plan.fn(*pos, **plan.consts))
        run = per_call_us(lambda: k.run(args))
        direct = per_call_us(lambda: plan.launch(pos)) if plan.launch else float("nan")
        rows.append((k.name, bare, run, direct))
    evtfuse.gemm(A, B, SRC, C=C, alpha=1.0, beta=0.5, D=D, tune="none")
    g = per_call_us(lambda: evtfuse.gemm(A, B, SRC, C=C, alpha=1.0, beta=0.5, D=D, tune="none"))
    sets = [[torch.randn_like(t) for t in (A, B, C, D)] for _ in range(8)]
    turn = [0]

    def rotating():
        a, b, c, d = sets[turn[0] % 8]
        turn[0] += 1
        evtfuse.gemm(a, b, SRC, C=c, alpha=1.0, beta=0.5, D=d, tune="none")

    g_rot = per_call_us(rotating)
    mm = per_call_us(lambda: torch.matmul(A, B, out=D))
    print(f"torch.matmul(out=) tiny: {mm:.1f} us/call")
    for name, bare, run, direct in rows:
        print(f"{name}: bare Triton launch {bare:.1f} us, compiled launcher direct {direct:.1f} us, "
              f"Kernel.run {run:.1f} us (+{run - bare:.1f} over bare)")
    bare0 = rows[0][1]
    print(f"evtfuse.gemm cached (kernel {rows[0][0]}): {g:.1f} us (+{g - bare0:.1f} over bare); "
          f"rotating 8 sets of tensors: {g_rot:.1f} us (+{g_rot - bare0:.1f})")


if __name__ == "__main__":
    main()
