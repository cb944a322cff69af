"""FP8 output with amax (the scaled-output recipe of CUTLASS's ScaledLinCombPerRowBiasEltActAmaxAux).

    Z    = accum * scale_a * scale_b      # undo the input quantisation scales
    D    = Z * scale_d                    # quantise the output: D is float8_e4m3fn
    amax = max(abs(Z))                    # for the next step's scale_d

The source comes from ``evtfuse.library.fp8_scaled_output()``. The scales are 0-d tensors
(device scalars), as an FP8 training loop keeps them on the GPU. On a GPU, A and B are
fp8 e4m3 too (A row-major, B column-major: fp8 tensor cores read both K-contiguous); on
the CPU they are fp16 and the fused kernel is refused (Triton's interpreter converts fp8
wrongly), so only the reference's reading is checked there.
"""

import torch

from _common import (ON_GPU, GemmArguments, banner, check, check_reference, empty, finish, fused,
                     matmul, randn, size)
from evtfuse import library

FP8 = getattr(torch, "float8_e4m3fn", None)


def main():
    banner("FP8 scaled output with amax")
    if FP8 is None:
        print("this torch has no float8_e4m3fn; nothing to check")
        finish()
    L, M, N, K = size((1, 4096, 4096, 4096), (1, 64, 48, 32))
    A, B = randn(M, K), randn(N, K, scale=K ** -0.5).T  # B column-major, K contiguous
    if ON_GPU:
        A, B = A.to(FP8), B.to(FP8)
    dev = A.device
    scale_a, scale_b = torch.tensor(0.5, device=dev), torch.tensor(4.0, device=dev)
    Z = matmul(A, B) * 0.5 * 4.0
    # delayed scaling: scale_d comes from an earlier step's amax (here: this one's), so
    # that the largest |D| lands at 400, just under e4m3's largest finite value, 448
    scale_d = (400.0 / Z.abs().max()).reshape(())
    D = torch.empty(M, N, dtype=FP8, device=dev)
    amax = empty(1, dtype=torch.float32)

    print(library.fp8_scaled_output(), end="")
    epi = library.fp8_scaled_output_args(D, scale_a=scale_a, scale_b=scale_b, scale_d=scale_d,
                                         amax=amax)
    args = GemmArguments(A=A, B=B, out=D, accumulator_type=torch.float32, epilogue=epi)

    want_D = (Z * scale_d).to(FP8)
    want_amax = Z.abs().max().reshape(1)
    assert not want_D.float().isnan().any(), "every D must be finite in e4m3"
    check_reference(args, None, {"D": want_D, "amax": want_amax})
    if fused(args):
        check("D", D, Z * scale_d, dtype=FP8)
        # fp8 inputs: the tensor cores' fast fp8 accumulation keeps fewer bits than fp32
        # (about 2e-3 relative on this amax at K = 4096, measured on an H100)
        check("amax", amax, want_amax, tol=5e-3 if A.dtype == FP8 else None)
    finish()


if __name__ == "__main__":
    main()
