"""A complex expression (the CuTe DSL EFC example): bias, scale, C, tanh of an aux tensor, GELU.

    result = gelu((accum + bias) * scale + C + tanh(X))

``bias`` has shape (N,): one value per output column, broadcast down the rows. ``scale``
is a 0-d tensor: a scalar read from device memory (change it without recompiling).
"""

import torch

from _common import (EpilogueArguments, GemmArguments, banner, check, check_reference, empty,
                     finish, fused, matmul, randn, size)


def epilogue_complex(accum, C, X, bias, scale):
    result = (accum + bias) * scale
    result2 = result + C
    result3 = result2 + tanh(X)  # noqa: F821 (recognised by name)
    D = gelu(result3)  # noqa: F821
    return D


def main():
    banner("complex expression: bias, scale, tanh(X), GELU")
    L, M, N, K = size((1, 2048, 2048, 2048), (1, 64, 48, 32))
    A, B = randn(M, K), randn(K, N, scale=K ** -0.5)
    C, X = randn(M, N), randn(M, N, scale=2.0)
    bias = randn(N, dtype=torch.float32)
    scale = torch.tensor(0.75, device=A.device)
    D = empty(M, N)

    epi = EpilogueArguments(epilogue_complex, C=C, X=X, bias=bias, scale=scale, D=D)
    args = GemmArguments(A=A, B=B, out=D, accumulator_type=torch.float32, epilogue=epi)

    want = torch.nn.functional.gelu((matmul(A, B) + bias) * 0.75 + C.float() + torch.tanh(X.float()))
    check_reference(args, None, {"D": want.to(D.dtype)})
    if fused(args):
        check("D", D, want)
    finish()


if __name__ == "__main__":
    main()
