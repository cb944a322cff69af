"""Probe: what the tuner measures for each candidate, several tunings in a row (fresh
tuning cache each time), so its pick can be set against perf_probe's one-process times.
A development tool, not a test.

    EVTFUSE_CACHE_DIR=$(mktemp -d) PYTHONPATH=src python3 scripts/tuner_trace.py [--shape 2048x2048x2048] [--repeat 3]
"""

from __future__ import annotations

import argparse
import logging

import torch

import evtfuse
from evtfuse import EpilogueArguments, GemmArguments
from evtfuse.runtime import tuner

SRC = {"bias_relu": "def epi(accum, bias): D = relu(accum + bias); return D"}


class _Trace(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines = []

    def emit(self, record):
        msg = record.getMessage()
        if msg.startswith("candidate "):
            self.lines.append(msg)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="2048x2048x2048")
    p.add_argument("--workload", default="bias_relu", choices=sorted(SRC))
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    M, N, K = (int(x) for x in a.shape.split("x"))
    A = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    B = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    D = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(SRC[a.workload], bias=bias, D=D))
    log = logging.getLogger("evtfuse")
    log.setLevel(logging.DEBUG)
    for r in range(a.repeat):
        trace = _Trace()
        log.addHandler(trace)
        tuner._memory.clear()
        chosen = tuner._search(args, evtfuse.get_kernels(args), "fast")
        log.removeHandler(trace)
        print(f"== tuning {r}: chose {chosen.name}")
        for line in trace.lines:
            print("  ", line)


if __name__ == "__main__":
    main()
