"""An epilogue passed as a string (CUTLASS notebook, "Passing a string representation").

The string is parsed with ``ast`` and never executed; one line with ``;`` is fine.
"""

import torch

from _common import (EpilogueArguments, GemmArguments, banner, check, check_reference, empty,
                     finish, fused, matmul, randn, size)

epi_str = "def epi(accum, alpha, beta, C): F = (accum * alpha) + (C * beta); D = relu(F); return D, F"


def main():
    banner("epilogue given as a string")
    L, M, N, K = size((1, 2048, 2048, 2048), (1, 64, 48, 32))
    A, B = randn(L, M, K), randn(L, K, N, scale=K ** -0.5)
    C = randn(L, M, N)
    alpha, beta = 1.0, 0.5
    D, F = empty(L, M, N), empty(L, M, N)

    epi_args = EpilogueArguments(epi_str, alpha=alpha, beta=beta, C=C, D=D, F=F)
    args = GemmArguments(A=A, B=B, out=D, accumulator_type=torch.float32, epilogue=epi_args)

    F_ref = matmul(A, B) * alpha + (C.float() * beta)
    D_ref = torch.relu(F_ref)
    check_reference(args, None, {"D": D_ref.to(D.dtype), "F": F_ref.to(F.dtype)})
    if fused(args):
        check("D", D, D_ref)
        check("F", F, F_ref)
    finish()


if __name__ == "__main__":
    main()
