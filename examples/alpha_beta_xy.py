"""Alpha-beta with extra X and Y outputs (the CuTe DSL EFC custom-epilogue example).

    Y = A x B
    D = (A x B) * alpha + C * beta + X * x_factor

One fused kernel computes both outputs; Y stores the accumulator itself.
"""

import torch

from _common import (DTYPE, EpilogueArguments, GemmArguments, banner, check, check_reference,
                     empty, finish, fused, matmul, randn, size)


def alpha_beta_xy(accum, C, X, alpha, beta, x_factor):
    Y = accum
    D = accum * alpha + C * beta + X * x_factor
    return D, Y


def main():
    banner("alpha-beta with extra X and Y outputs")
    L, M, N, K = size((1, 2048, 2048, 1024), (2, 64, 48, 32))
    A, B = randn(L, M, K), randn(L, K, N, scale=K ** -0.5)
    C, X = randn(L, M, N), randn(L, M, N)
    alpha, beta, x_factor = 1.5, 0.5, -2.0
    D, Y = empty(L, M, N), empty(L, M, N)

    epi = EpilogueArguments(alpha_beta_xy, C=C, X=X, alpha=alpha, beta=beta, x_factor=x_factor,
                            D=D, Y=Y)
    args = GemmArguments(A=A, B=B, out=D, accumulator_type=torch.float32,
                         epilogue=epi)

    acc = matmul(A, B)
    want = {"D": acc * alpha + C.float() * beta + X.float() * x_factor, "Y": acc}
    check_reference(args, None, {k: v.to(DTYPE) for k, v in want.items()})
    if fused(args):
        check("D", D, want["D"])
        check("Y", Y, want["Y"])
    finish()


if __name__ == "__main__":
    main()
