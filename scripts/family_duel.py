"""Two kernels of one benchmark cell timed in alternation for several rounds, after a
warm-up that heats the GPU (``--heat-s``): which family is faster under sustained load.
A development probe (BENCHMARKS.md, fifth session: at 8192^3 the gluon family's time
rose from 1.54 to 1.98 ms over three rounds while cuBLAS's stayed at 1.58-1.62 ms).

    PYTHONPATH=src python3 scripts/family_duel.py row_logsumexp@8192 --a gluon --b hopper_128x256
"""

from __future__ import annotations

import argparse
import time

import torch
import triton.testing

from evtfuse import get_kernels
from evtfuse.bench import workloads as W


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("cells", nargs="+", help="workload@shape")
    p.add_argument("--a", default="gluon", help="first kernel whose name contains this")
    p.add_argument("--b", default="hopper_128x256", help="second kernel whose name contains this")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--heat-s", type=float, default=5.0)
    a = p.parse_args()
    for cell in a.cells:
        w, shape = W.parse_cell(cell)
        v, o = W.probe_set(w, shape)
        args = w.gemm_arguments(v["A"], v["B"], v, o)
        ks = get_kernels(args)
        pick = [next(k for k in ks if key in k.name) for key in (a.a, a.b)]
        for k in pick:
            assert k.verify(args), k.name
        A, B = v["A"], v["B"]
        if A.element_size() == 1:  # fp8: cuBLAS's scaled GEMM (bf16 out) as the plain GEMM
            one = torch.ones((), device=A.device)
            def mm_fn():
                return torch._scaled_mm(A, B, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        else:
            def mm_fn():
                return A @ B
        t_end = time.perf_counter() + a.heat_s
        while time.perf_counter() < t_end:
            mm_fn()
        for r in range(a.rounds):
            ms = [triton.testing.do_bench(lambda: k.run(args), warmup=25, rep=200, return_mode="median")
                  for k in pick]
            mm = triton.testing.do_bench(mm_fn, warmup=25, rep=200, return_mode="median")
            print(f"{cell} round {r}: " + ", ".join(f"{k.name} {t:.4f}" for k, t in zip(pick, ms))
                  + f", mm {mm:.4f} ms", flush=True)


if __name__ == "__main__":
    main()
