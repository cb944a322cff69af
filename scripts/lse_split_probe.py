"""Where row logsumexp's time goes at small M (GPU, development tool): the kernel and the
combine launch after it (``combine.py``) as CUDA kernels, from torch.profiler, against
cuBLAS's ``A @ B`` and the identity epilogue, over 50 calls each.

    PYTHONPATH=src python3 scripts/lse_split_probe.py [--shape 64x8192x8192]
"""

from __future__ import annotations

import argparse
import collections

import torch

import evtfuse
from evtfuse.bench import epilogues as E


def _identity(accum):
    D = accum
    return D


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="64x8192x8192")
    a = p.parse_args()
    M, N, K = (int(x) for x in a.shape.split("x"))
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
    for name, fn in calls.items():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(50):
                flush.zero_()
                fn()
            torch.cuda.synchronize()
        per = collections.defaultdict(list)
        for ev in prof.events():
            if ev.device_type == torch.autograd.DeviceType.CUDA and "elementwise" not in ev.name \
                    and "fill" not in ev.name.lower():
                per[ev.name[:60]].append(ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total)
        print(f"== {name}")
        for k, v in per.items():
            v = sorted(v)
            print(f"   {k:60s} n={len(v):3d} median {v[len(v) // 2]:.2f} us")


if __name__ == "__main__":
    main()
