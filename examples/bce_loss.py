"""Binary cross-entropy loss in the epilogue (the Colfax EVT article's example).

The logits are F = A @ B + bias (bias: one value per label, shape (N,)) and C holds the
0/1 labels. The article's numerically stable form of the summed log-likelihood is

    sum over i, j of  (C_ij - 1) * F_ij + log(clamp(sigmoid(F_ij), 0.001, 0.999))

which is minus torch's ``binary_cross_entropy_with_logits(F, C, reduction="sum")`` as long
as the clamp is inactive (|F| < 6.9). ``loss`` is a (1,) tensor: a reduction over the whole
output. ``D`` (the logits) is passed as None: computed, used, never stored.
"""

import torch

from _common import (EpilogueArguments, GemmArguments, banner, check, check_reference, empty,
                     finish, fused, matmul, randn, size)


def bce_loss(accum, C, bias):
    D = accum + bias
    T = (C - 1.0) * D + log(clamp(sigmoid(D), 0.001, 0.999))  # noqa: F821 (names of the op table)
    loss = sum(T)
    return D, loss


def main():
    banner("binary cross-entropy loss, reduced to one number")
    L, M, N, K = size((1, 4096, 1024, 1024), (1, 64, 48, 32))
    A, B = randn(M, K), randn(K, N, scale=0.5 * K ** -0.5)  # logits ~ N(0, 0.25): clamp inactive
    labels = (torch.rand(M, N, generator=torch.Generator().manual_seed(7)) < 0.3)
    C = labels.to(A.dtype).to(A.device)
    bias = randn(N, dtype=torch.float32, scale=0.5)
    loss = empty(1, dtype=torch.float32)

    epi = EpilogueArguments(bce_loss, C=C, bias=bias, D=None, loss=loss)
    args = GemmArguments(A=A, B=B, out=None, accumulator_type=torch.float32, epilogue=epi)

    logits = matmul(A, B) + bias
    assert logits.abs().max() < 6.9, "keep the clamp inactive so torch's BCE is the same number"
    want = -torch.nn.functional.binary_cross_entropy_with_logits(
        logits, C.float(), reduction="sum").reshape(1)
    check_reference(args, None, {"loss": want})
    if fused(args):
        check("loss", loss, want)
    finish()


if __name__ == "__main__":
    main()
