"""ReLU with an aux store (CUTLASS Python API notebook, "Auxiliary input and output tensors").

    F = (accum * alpha) + (C * 2.0)     # 2.0 is a compile-time constant; alpha a runtime scalar
    D = relu(F)                         # D and the pre-activation F are both stored
"""

import torch

from _common import (EpilogueArguments, GemmArguments, banner, check, check_reference, empty,
                     finish, fused, matmul, randn, size)
from evtfuse.ops import relu  # noqa: F401  (recognised by name; makes the function runnable eagerly)


def relu_aux_store(accum, alpha, C):
    F = (accum * alpha) + (C * 2.0)  # Constant beta
    D = relu(F)
    return D, F


def main():
    banner("ReLU with an aux store")
    L, M, N, K = size((1, 2048, 2048, 2048), (1, 64, 48, 32))
    A, B = randn(L, M, K), randn(L, K, N, scale=K ** -0.5)
    C = randn(L, M, N)
    alpha = 3.0
    D, F = empty(L, M, N), empty(L, M, N)

    epi = EpilogueArguments(relu_aux_store, alpha=alpha, C=C, D=D, F=F)
    args = GemmArguments(A=A, B=B, out=D, accumulator_type=torch.float32, epilogue=epi)

    # the same function, run eagerly on torch tensors, is the expected result
    D_ref, F_ref = relu_aux_store(matmul(A, B), alpha, C.float())
    assert (F_ref < 0).any() and (D_ref == 0).any(), "the data must exercise the ReLU"
    check_reference(args, None, {"D": D_ref.to(D.dtype), "F": F_ref.to(F.dtype)})
    if fused(args):
        check("D", D, D_ref)
        check("F", F, F_ref)
    finish()


if __name__ == "__main__":
    main()
