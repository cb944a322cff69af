"""Host time of ``evtfuse.gemm`` per call exactly as the benchmark suite calls it (its
input sets rotated, its operands and preallocated outputs), per workload, and where that
time goes (cProfile, top functions); a development probe. Host time is measured with the
GPU kept busy (a long ``torch.cuda._sleep`` first), so the calls only enqueue.

    PYTHONPATH=src python3 scripts/host_profile.py [--shape 2048x2048x2048] \
        [--workloads alpha_beta,bce_loss] [--calls 200] [--top 25]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import torch

import evtfuse
from evtfuse.bench import workloads as W


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="2048x2048x2048")
    p.add_argument("--workloads", default="alpha_beta,bce_loss")
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--top", type=int, default=25)
    a = p.parse_args()
    shape = W.parse_shape(a.shape)
    for w in W.select_workloads(a.workloads.split(",")):
        sets = [(W.make_inputs(w, shape, torch.bfloat16, "cuda", seed),
                 W.make_outputs(w, shape, torch.bfloat16, "cuda", poison=seed == 0))
                for seed in range(4)]

        def call(k: int) -> None:
            vals, outs = sets[k % len(sets)]
            evtfuse.gemm(vals["A"], vals["B"], epilogue=w.epilogue, tune="fast",
                         **w.epilogue_operands(vals), **outs)

        for k in range(8):  # tuning, compile, warm-up
            call(k)
        torch.cuda.synchronize()

        def timed() -> float:
            torch.cuda._sleep(2_000_000_000)  # ~1 s of GPU spin: the calls only enqueue
            t0 = time.perf_counter()
            for k in range(a.calls):
                call(k)
            dt = (time.perf_counter() - t0) / a.calls
            torch.cuda.synchronize()
            return dt

        best = min(timed() for _ in range(3))
        prof = cProfile.Profile()
        torch.cuda._sleep(2_000_000_000)
        prof.enable()
        for k in range(a.calls):
            call(k)
        prof.disable()
        torch.cuda.synchronize()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(a.top)
        print(f"== {w.name} {a.shape}: {best * 1e6:.1f} us host per evtfuse.gemm call")
        print("\n".join(s.getvalue().splitlines()[:a.top + 12]))


if __name__ == "__main__":
    main()
