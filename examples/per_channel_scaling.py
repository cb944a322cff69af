"""Per-channel scaling: one alpha and one beta per output column, then a bias and ReLU
(CUTLASS's PerColLinCombPerColBiasEltAct), and the per-row variant (alpha shaped (M, 1)).

The tensor's shape decides: (N,) is per column ("row broadcast"), (M, 1) per row.
The sources come from ``evtfuse.library``.
"""

import torch

from _common import (GemmArguments, banner, check, check_reference, empty, finish, fused, matmul,
                     randn, size)
from evtfuse import library


def main():
    banner("per-channel alpha and beta")
    L, M, N, K = size((1, 2048, 2048, 2048), (1, 64, 48, 32))
    A, B = randn(M, K), randn(K, N, scale=K ** -0.5)
    C = randn(M, N)
    alpha, beta = randn(N, dtype=torch.float32), randn(N, dtype=torch.float32)
    bias = randn(N, dtype=torch.float32, scale=0.1)
    acc = matmul(A, B)

    print("per column:", library.per_channel_scaling("default", "relu", bias=True), sep="\n")
    D = empty(M, N)
    epi = library.per_channel_args(D, alpha=alpha, C=C, beta=beta, bias=bias, activation="relu")
    args = GemmArguments(A=A, B=B, out=D, accumulator_type=torch.float32, epilogue=epi)
    want = torch.relu(alpha * acc + beta * C.float() + bias)
    check_reference(args, None, {"D": want.to(D.dtype)})
    if fused(args):
        check("D (per column)", D, want)

    alpha_rows = randn(M, 1, dtype=torch.float32)
    D2 = empty(M, N)
    epi2 = library.per_channel_args(D2, alpha=alpha_rows)  # CUTLASS OnlyAlphaPerChannelScaling
    args2 = GemmArguments(A=A, B=B, out=D2, accumulator_type=torch.float32, epilogue=epi2)
    want2 = alpha_rows * acc
    check_reference(args2, None, {"D": want2.to(D2.dtype)})
    if fused(args2):
        check("D (per row)", D2, want2)
    finish()


if __name__ == "__main__":
    main()
