"""Where row logsumexp's time goes (GPU, development tool): the kernel and the combine
launch after it (``combine.py``) as CUDA kernels, from torch.profiler, against cuBLAS's
``A @ B`` and the identity epilogue, over 50 calls each; the idle gap between the kernel's
end and the combine's start; and each call's do_bench median (what the suite measures).

    PYTHONPATH=src python3 scripts/lse_split_probe.py [--shapes 64x8192x8192,2048x2048x2048]
"""

from __future__ import annotations

import argparse
import collections
import statistics

import torch
import triton.testing

import evtfuse
from evtfuse.bench import epilogues as E


def _identity(accum):
    D = accum
    return D


def _kernels(prof) -> list[tuple[str, float, float]]:
    """(name, start us, end us) of every CUDA kernel but the L2 flush, in time order."""
    out = []
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        if "elementwise" in ev.name or "fill" in ev.name.lower():
            continue
        out.append((ev.name[:60], ev.time_range.start, ev.time_range.end))
    return sorted(out, key=lambda k: k[1])


def probe(shape: str, calls_n: int) -> None:
    M, N, K = (int(x) for x in shape.split("x"))
    A = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    B = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    D = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(M, 1, device="cuda", dtype=torch.float32)
    calls = {"mm": lambda: A @ B,
             "identity": lambda: evtfuse.gemm(A, B, _identity, D=D),
             "row_logsumexp": lambda: evtfuse.gemm(A, B, E.row_logsumexp, D=D, lse=lse)}
    for fn in calls.values():
        fn()
    torch.cuda.synchronize()
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    print(f"==== {shape}")
    for name, fn in calls.items():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(calls_n):
                flush.zero_()
                fn()
            torch.cuda.synchronize()
        ks = _kernels(prof)
        per = collections.defaultdict(list)
        for k, s, e in ks:
            per[k].append(e - s)
        gaps = [b[1] - a[2] for a, b in zip(ks, ks[1:]) if "combine" in b[0] and "combine" not in a[0]]
        bench = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3
        print(f"== {name}: do_bench median {bench:.2f} us")
        for k, v in per.items():
            print(f"   {k:60s} n={len(v):3d} median {statistics.median(v):.2f} us")
        if gaps:
            print(f"   gap kernel -> combine: median {statistics.median(gaps):.2f} us "
                  f"(min {min(gaps):.2f}, max {max(gaps):.2f})")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="64x8192x8192")
    p.add_argument("--calls", type=int, default=50)
    a = p.parse_args()
    for shape in a.shapes.split(","):
        probe(shape, a.calls)


if __name__ == "__main__":
    main()
