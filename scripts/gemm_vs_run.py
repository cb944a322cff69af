"""``evtfuse.gemm`` against ``Kernel.run`` of the same kernel on the same input sets,
timed alternately (several rounds, cuBLAS ``A @ B`` between them), as the benchmark
suite times them (``triton.testing.do_bench``, inputs rotated when one set fits in L2).
A development probe: the suite measures gemm and Kernel.run minutes apart, and some of
its cells show gemm 3-40% above Kernel.run (BENCHMARKS.md, fifth session).

    PYTHONPATH=src python3 scripts/gemm_vs_run.py alpha_beta@2048 row_logsumexp@8192 [--rounds 3]
"""

from __future__ import annotations

import argparse

import triton.testing

import evtfuse
from evtfuse.bench import workloads as W
from evtfuse.bench.timing import rotating
from evtfuse.runtime.tuner import choose_kernel


def bench(fn) -> float:
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("cells", nargs="+", help="workload@shape, e.g. alpha_beta@2048")
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    for cell in a.cells:
        w, shape = W.parse_cell(cell)
        first = W.probe_set(w, shape)
        n = W.rotation_count(W.set_bytes(*first))
        sets = [first] + [W.probe_set(w, shape, k) for k in range(1, n)]

        def gemm(s):
            v, o = s
            return evtfuse.gemm(v["A"], v["B"], epilogue=w.epilogue, **w.epilogue_operands(v), **o)

        gemm(sets[0])
        argsets = [w.gemm_arguments(v["A"], v["B"], v, o) for v, o in sets]
        kernel = choose_kernel(argsets[0])
        for r in range(a.rounds):
            g = bench(rotating(gemm, sets))
            k = bench(rotating(kernel.run, argsets))
            mm = bench(rotating(lambda s: s[0]["A"] @ s[0]["B"], sets))
            print(f"{cell} round {r}: gemm {g:.4f} ms, Kernel.run {k:.4f} ms, mm {mm:.4f} ms, "
                  f"{kernel.name}, {n} set(s)", flush=True)


if __name__ == "__main__":
    main()
