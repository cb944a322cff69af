"""The fused MLP block's two evtfuse GEMMs against cuBLAS at the same shapes (GPU): what the
epilogue costs, what the concatenated gate|up layout costs, what the GEMM core costs.

    PYTHONPATH=src python3 scripts/mlp_gemm_probe.py [--tokens 8192 --hidden 4096 --inter 14336]
        [--rounds 5] [--tune fast|exhaustive|none] [--guarded]

`benchmarks/mlp.py` found evtfuse's two kernels of `GatedMLP` (the up projection storing
act(gate) * up, gate and up; the down projection's dA with the derived backward epilogue) at
5.10 ms where cuBLAS's GEMMs of the same run would take about 3.75 for those FLOPs. Each row
here is one call, timed in interleaved rounds against cuBLAS's `x @ W.T` of that shape
("mm"):

- up projection, T x 2I x H: `identity` (the GEMM core alone, D = accum, 2I wide);
  `gated_concat_D` (act(gate) * up over concatenated pairs, D alone: I wide);
  `gated_interleaved_D` (the same over interleaved pairs); `mlp_up` (GatedMLP's epilogue:
  D, G and U, concatenated);
- down projection's dA, T x I x H: `identity`; `mlp_down_grad` (the derived backward:
  reads G and U, writes dG, dU and A).
"""

from __future__ import annotations

import argparse

import torch

import evtfuse
from evtfuse import library
from evtfuse.runtime import mlp as mlp_ops
from probe_common import report_rounds

IDENTITY = "def identity(accum):\n    D = accum\n    return D\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--inter", type=int, default=14336)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tune", default="fast", choices=["none", "fast", "exhaustive"])
    ap.add_argument("--guarded", action="store_true")
    args = ap.parse_args()
    T, H, I = args.tokens, args.hidden, args.inter
    bf = torch.bfloat16
    x = torch.randn(T, H, device="cuda", dtype=bf)
    w1 = torch.randn(2 * I, H, device="cuda", dtype=bf) * H ** -0.5
    w1i = evtfuse.interleave_gate_up(w1[:I], w1[I:])
    w2 = torch.randn(H, I, device="cuda", dtype=bf) * I ** -0.5
    dy = torch.randn(T, H, device="cuda", dtype=bf)
    a = torch.empty(T, I, device="cuda", dtype=bf)
    full = torch.empty(T, 2 * I, device="cuda", dtype=bf)
    p = torch.randn(T, 2 * I, device="cuda", dtype=bf)
    dp = torch.empty_like(p)
    tune = args.tune

    up = {
        "mm": lambda: torch.mm(x, w1.t()),
        "identity": lambda: evtfuse.gemm(x, w1.t(), IDENTITY, D=full, tune=tune),
        "gated_concat_D": lambda: evtfuse.gemm(
            x, w1.t(), library.gated("swiglu", layout="concatenated"), D=a, tune=tune),
        "gated_interleaved_D": lambda: evtfuse.gemm(x, w1i.t(), library.gated("swiglu"), D=a,
                                                    tune=tune),
        "mlp_up": lambda: evtfuse.gemm(x, w1.t(), mlp_ops.up_source("silu", True, False, bf),
                                       D=a, G=full[:, :I], U=full[:, I:], tune=tune),
    }
    source, outputs = mlp_ops.down_grad("silu", True)
    grads = dict(outputs)
    down = {
        "mm": lambda: torch.mm(dy, w2),
        "identity": lambda: evtfuse.gemm(dy, w2, IDENTITY, D=a, tune=tune),
        "mlp_down_grad": lambda: evtfuse.gemm(dy, w2, source, D=a, G=p[:, :I], U=p[:, I:],
                                              **{grads["G"]: dp[:, :I], grads["U"]: dp[:, I:]},
                                              tune=tune),
    }
    for systems in (up, down):
        for fn in systems.values():  # compile and tune outside the timing
            fn()
    torch.cuda.synchronize()
    flop_up, flop_down = 2 * T * 2 * I * H, 2 * T * I * H
    print(f"up: {flop_up / 1e12:.2f} TFLOP, down: {flop_down / 1e12:.2f} TFLOP; tune={tune}")
    report_rounds(f"up projection {T}x{2 * I}x{H}", up, args.rounds, args.guarded, 200)
    report_rounds(f"down projection's dA {T}x{I}x{H}", down, args.rounds, args.guarded, 200)


if __name__ == "__main__":
    main()
