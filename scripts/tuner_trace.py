"""Probe: what the tuner measures for each candidate, several tunings in a row (fresh
tuning cache each time), so its pick can be set against perf_probe's one-process times.
A development tool, not a test.

    EVTFUSE_CACHE_DIR=$(mktemp -d) PYTHONPATH=src python3 scripts/tuner_trace.py [--shape 2048x2048x2048] [--repeat 3] \
        [--workload identity|bias_relu|gelu_bias|alpha_beta|relu_aux]
"""

from __future__ import annotations

import argparse
import logging

from probe_common import epilogue_args

import evtfuse
from evtfuse.runtime import tuner

SRC = {"identity": "def epi(accum): D = accum; return D",
       "bias_relu": "def epi(accum, bias): D = relu(accum + bias); return D",
       "gelu_bias": "def epi(accum, bias): D = gelu_tanh(accum + bias); return D",
       "alpha_beta": "def epi(accum, C, alpha, beta): D = alpha * accum + beta * C; return D",
       "relu_aux": "def epi(accum, C, alpha): F = alpha * accum + C * 2.0; D = relu(F); return D, F"}


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
    args = epilogue_args(SRC[a.workload], M, N, K)
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
