"""Row amax through the gluon family with the per-row combine inside the kernel (forced)
or after it (the default): timings, and ``--once`` for Nsight Compute. A development probe
for the in-kernel combine's cost at many tiles per row (BENCHMARKS.md, runs N-O).

    PYTHONPATH=src python3 scripts/combine_probe.py [--once] [--shape 8192x8192x1024]
"""

from __future__ import annotations

import argparse

import torch
import triton.testing

import evtfuse.backends.triton.codegen as cg
import evtfuse.backends.triton.families as fm
from evtfuse import EpilogueArguments, GemmArguments, get_kernels

_DEFAULT = cg.combined_in_kernel
_VERSION = cg.GENERATOR_VERSION


def _forced(o, family):
    if family == "gluon":
        return o.node.kind is cg.NodeKind.REDUCE and o.node.op != "logsumexp"
    return _DEFAULT(o, family)


def kernel_and_args(shape, in_kernel: bool):
    cg.combined_in_kernel = fm.combined_in_kernel = _forced if in_kernel else _DEFAULT
    cg.GENERATOR_VERSION = _VERSION + ("-in-kernel" if in_kernel else "")  # its own cache key
    M, N, K = shape
    A = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    B = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    D = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    src = "def epi(accum): D = accum; amax = max(abs(accum)); return D, amax"
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(src, D=D, amax=torch.empty(M, 1, device="cuda")))
    k = [k for k in get_kernels(args) if k.family.name == "gluon"][0]
    return k, args


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="8192x8192x1024")
    p.add_argument("--once", action="store_true", help="run the forced in-kernel variant 3 times")
    a = p.parse_args()
    shape = tuple(int(x) for x in a.shape.split("x"))
    if a.once:
        k, args = kernel_and_args(shape, True)
        for _ in range(3):
            k.run(args)
        torch.cuda.synchronize()
        return
    for in_kernel in (False, True):
        k, args = kernel_and_args(shape, in_kernel)
        ok = k.verify(args)
        ms = triton.testing.do_bench(lambda: k.run(args), warmup=30, rep=200, return_mode="median")
        print(f"{a.shape} {'in-kernel' if in_kernel else 'after   '} {k.name} {ms:.4f} ms "
              f"post steps {len(k.plan(args).post)} verify={'ok' if ok else 'FAIL'}", flush=True)


if __name__ == "__main__":
    main()
