"""Returning the accumulator (CUTLASS notebook, "Keyword functions and returning accumulator").

    F = relu((accum * alpha) + (C * beta))
    D = F * scale
    return D, F, accum                   # accum is stored too, here in fp32

Batched: L = 2, each batch with its own A, B and C.
"""

import torch

from _common import (EpilogueArguments, GemmArguments, banner, check, check_reference, empty,
                     finish, fused, matmul, randn, size)
from evtfuse.ops import relu  # noqa: F401


def relu_scale_return_acc(accum, alpha, beta, C, scale):
    F = relu((accum * alpha) + (C * beta))
    D = F * scale
    return D, F, accum


def main():
    banner("ReLU, scale, and the accumulator returned")
    L, M, N, K = size((2, 1024, 1024, 1024), (2, 48, 64, 32))
    A, B = randn(L, M, K), randn(L, K, N, scale=K ** -0.5)
    C = randn(L, M, N)
    alpha, beta, scale = 1.0, 2.0, 0.5
    D, F = empty(L, M, N), empty(L, M, N)
    accum = empty(L, M, N, dtype=torch.float32)

    epi = EpilogueArguments(relu_scale_return_acc, alpha=alpha, beta=beta, C=C, scale=scale,
                            D=D, F=F, accum=accum)
    args = GemmArguments(A=A, B=B, out=D, accumulator_type=torch.float32, epilogue=epi)

    D_ref, F_ref, accum_ref = relu_scale_return_acc(matmul(A, B), alpha, beta, C.float(), scale)
    check_reference(args, None, {"D": D_ref.to(D.dtype), "F": F_ref.to(F.dtype),
                                 "accum": accum_ref})
    if fused(args):
        check("D", D, D_ref)
        check("F", F, F_ref)
        check("accum", accum, accum_ref)  # fp32: only the summation order differs
    finish()


if __name__ == "__main__":
    main()
