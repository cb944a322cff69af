"""Run the identity GEMM's candidate kernels (or those of another epilogue, ``--epilogue``:
row amax, alpha-beta, relu aux, bias+relu, gelu+bias, BCE),
cuBLAS's ``A @ B`` and, for bias+relu and gelu+bias, cuBLASLt's fused epilogue once each,
for Nsight Compute to compare their mainloops (tensor-pipe activity, L2 and DRAM traffic)
or stall reasons; a development probe. Each kernel runs once before the marked run
(compilation, warm-up), then once more.

    ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --kernel-name regex:'evtfuse|gemm|nvjet|sm90' \
        python3 scripts/ncu_mainloop.py --shape 8192x8192x1024 [--max-configs 6] [--groups 4,8,16]

``--groups``: each candidate at these tile orders (GROUP_M) instead of its own.
"""

from __future__ import annotations

import argparse

import torch
from probe_common import epilogue_args

from evtfuse import get_kernels

EPILOGUES = {"identity": "def epi(accum): D = accum; return D",
             "row_amax": "def epi(accum): D = accum; amax = max(abs(accum)); return D, amax",
             "alpha_beta": "def epi(accum, C, alpha, beta): D = alpha * accum + beta * C; return D",
             "relu_aux": "def epi(accum, C, alpha): F = alpha * accum + C * 2.0; D = relu(F); return D, F",
             "bias_relu": "def epi(accum, bias): D = relu(accum + bias); return D",
             "gelu_bias": "def epi(accum, bias): D = gelu_tanh(accum + bias); return D",
             "bce": ("def epi(accum, bias, C): f = accum + bias; "
                     "t = (1.0 - C) * (-f) + log(clamp(sigmoid(f), 1e-3, 0.999)); loss = sum(t); "
                     "D = f; return D, loss")}  # D not stored, as in the suite


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="8192x8192x1024")
    p.add_argument("--max-configs", type=int, default=6)
    p.add_argument("--only", default="", help="comma-separated kernel names (default: all)")
    p.add_argument("--epilogue", choices=sorted(EPILOGUES), default="identity")
    p.add_argument("--groups", default="", help="comma-separated GROUP_M values for every candidate")
    a = p.parse_args()
    M, N, K = (int(x) for x in a.shape.split("x"))
    args = epilogue_args(EPILOGUES[a.epilogue], M, N, K, labels=a.epilogue == "bce")
    A, B = args.A, args.B
    kernels = get_kernels(args)
    if a.only:
        kernels = [k for k in kernels if k.name in a.only.split(",")]
    kernels = kernels[: a.max_configs]
    if a.groups:
        kernels = [k.with_config(group_m=int(g)) for k in kernels for g in a.groups.split(",")]
    for k in kernels:
        k.run(args)
        torch.cuda.synchronize()
        print(f"kernel {k.name}", flush=True)
        k.run(args)
        torch.cuda.synchronize()
    A @ B
    torch.cuda.synchronize()
    print("kernel cuBLAS mm", flush=True)
    A @ B
    torch.cuda.synchronize()
    if a.epilogue in ("bias_relu", "gelu_bias"):  # cuBLASLt's fused epilogue, as the suite's
        bias = args.epilogue.values["bias"]
        lt = lambda: torch._addmm_activation(bias, A, B, use_gelu=a.epilogue == "gelu_bias")  # noqa: E731
        lt()
        torch.cuda.synchronize()
        print("kernel cuBLASLt", flush=True)
        lt()
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
