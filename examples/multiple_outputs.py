"""Multiple outputs (the CuTe DSL EFC multi-output example): ``d = accum + c`` and ``d * d``.

The EFC example also returns ``d / norm(d)``; a norm over the whole output is a reduction
whose result would be needed by every element of the same pass, which one epilogue pass
cannot do. Return the two elementwise outputs (and, where reductions are supported,
``sum(d * d)`` to normalise in a second step).
"""

import torch

from _common import (EpilogueArguments, GemmArguments, banner, check, check_reference, empty,
                     finish, fused, matmul, randn, size)


def epilogue_multi_output(accum, C):
    D = accum + C
    D_squared = D * D
    return D, D_squared


def main():
    banner("multiple outputs: d and d * d")
    L, M, N, K = size((1, 2048, 2048, 2048), (1, 64, 48, 32))
    A, B = randn(M, K), randn(K, N, scale=K ** -0.5)
    C = randn(M, N)
    D, D_squared = empty(M, N), empty(M, N, dtype=torch.float32)  # each output its own dtype

    epi = EpilogueArguments(epilogue_multi_output, C=C, D=D, D_squared=D_squared)
    args = GemmArguments(A=A, B=B, out=D, accumulator_type=torch.float32, epilogue=epi)

    d = matmul(A, B) + C.float()
    check_reference(args, None, {"D": d.to(D.dtype), "D_squared": d * d})
    if fused(args):
        check("D", D, d)
        check("D_squared", D_squared, d * d)
    finish()


if __name__ == "__main__":
    main()
