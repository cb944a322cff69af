"""int8 GEMMs with int32 accumulation through the CPU interpreter: the exact int32
accumulator as an output, saturating int8 outputs (round half to even, as CUTLASS's
converters), float scales in the epilogue, and the refusals ``explain`` gives."""

from __future__ import annotations

import pytest
import torch

import evtfuse
from evtfuse import EpilogueArguments, GemmArguments, explain, get_kernels
from evtfuse.reference import evaluate

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-interpreter tier")

GEN = torch.Generator().manual_seed(8)


def ints(*shape, dtype=torch.int8):
    lo, hi = (-128, 128) if dtype == torch.int8 else (0, 256)
    return torch.randint(lo, hi, shape, generator=GEN, dtype=dtype)


@pytest.mark.parametrize("family", ["portable", "hopper"])
@pytest.mark.parametrize("dtype", [torch.int8])
def test_int8_accumulator_scales_and_saturation(family, dtype):
    M, N, K = 40, 48, 64
    A, B = ints(M, K, dtype=dtype), ints(N, K, dtype=dtype).T  # B K-contiguous (wgmma)
    src = ("def epi(accum, scale, bias): Y = accum; D = accum * scale + bias; "
           "H = accum * 0.001; return D, Y, H")
    D, Y = torch.empty(M, N, dtype=torch.int8), torch.empty(M, N, dtype=torch.int32)
    H = torch.empty(M, N, dtype=torch.float16)
    bias = torch.randn(N, generator=GEN) * 3
    args = GemmArguments(A, B, D, torch.int32,
                         EpilogueArguments(src, scale=0.002, bias=bias, D=D, Y=Y, H=H))
    cc = 90 if family == "hopper" else None
    k = [k for k in get_kernels(args, cc=cc) if k.family.name == family][0]
    result = k.verify(args)
    assert result, result.report()
    exact = A.long() @ B.long()
    assert torch.equal(Y.long(), exact)  # the int32 accumulator, not a float copy
    want = torch.round(exact.double() * torch.tensor(0.002, dtype=torch.float32).double()
                       + bias.double()).clamp(-128, 127)
    assert (D.long() - want.long()).abs().max() <= 1
    assert D.min() == -128 and D.max() == 127  # saturated at both ends


def test_int_outputs_round_half_to_even():
    M, N, K = 16, 16, 16
    A, B = ints(M, K), ints(N, K).T
    D = torch.empty(M, N, dtype=torch.int32)
    src = "def epi(accum): D = accum * 0.0 + 2.5; return D"  # every element is exactly 2.5
    args = GemmArguments(A, B, D, torch.int32, EpilogueArguments(src, D=D))
    get_kernels(args)[0].run(args)
    assert (D == 2).all()
    assert (evaluate(args)["D"] == 2).all()


def test_int8_refusals_say_why():
    M, N, K = 16, 16, 16
    A, B = ints(M, K), ints(K, N)
    D = torch.empty(M, N, dtype=torch.int32)
    args = GemmArguments(A, B, D)  # float32 accumulation asked for int8 inputs
    assert get_kernels(args) == [] and "int32" in explain(args)
    row_major_b = GemmArguments(A, B, D, torch.int32)
    assert "hopper: refused" in explain(row_major_b, cc=90)
    assert "K-contiguous" in explain(row_major_b, cc=90)
    k = get_kernels(row_major_b, cc=90)[0]
    assert k.family.name == "portable" and k.verify(row_major_b)
    # uint8 runs in the portable family only (tests/test_uint8_cpu.py)
    u8 = GemmArguments(ints(M, K, dtype=torch.uint8), ints(N, K, dtype=torch.uint8).T, D,
                       torch.int32)
    assert "hopper: refused: uint8 inputs run in the portable family only" in explain(u8, cc=90)


def test_int8_through_gemm():
    M, N, K = 24, 32, 32
    A, B = ints(M, K), ints(N, K).T
    Y = evtfuse.gemm(A, B, "def epi(accum): D = accum; return D", D=torch.empty(M, N, dtype=torch.int32))
    assert torch.equal(Y.long(), A.long() @ B.long())


def test_allocated_outputs_default_to_int32_for_int8_and_bf16_for_fp8():
    """An output gemm allocates takes A's dtype but for int8 inputs (int32, as
    torch._int_mm: no silent rounding of the product to int8) and fp8 ones (bf16, as
    torch._scaled_mm is commonly called); ``<name>_dtype`` still picks another."""
    from evtfuse.runtime.api import default_output_dtype

    A, B = ints(24, 32), ints(32, 16)
    D = evtfuse.gemm(A, B)
    assert D.dtype == torch.int32 and torch.equal(D.long(), A.long() @ B.long())
    D8 = evtfuse.gemm(A, B, "def e(accum): D = accum * 0.01; return D", D_dtype=torch.int8)
    assert D8.dtype == torch.int8
    for fp8 in (torch.float8_e4m3fn, torch.float8_e5m2):
        assert default_output_dtype(fp8) == torch.bfloat16
    assert default_output_dtype(torch.uint8) == torch.int32
    for same in (torch.float16, torch.bfloat16, torch.float32):
        assert default_output_dtype(same) == same
