"""fp8 on the CPU tier: what can be checked without a GPU.

The kernels themselves run fp8 only on a GPU (``tests/gpu/test_gpu_fp8.py``): Triton's CPU
interpreter converts fp32 to fp8 wrongly, so fp8 inputs, operands and outputs are refused
there with that reason. Here: the refusals, the saturating store the emitter writes for
fp8 outputs, the fp8 tolerances of ``verify.compare`` and the reference's fp8 rounding.
"""

from __future__ import annotations

import pytest
import torch

from evtfuse import EpilogueArguments, GemmArguments, explain, get_kernels
from evtfuse.backends.triton import codegen
from evtfuse.backends.triton.families import Target, _fp8_refusal
from evtfuse.reference import evaluate
from evtfuse.runtime.verify import compare

pytestmark = [pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-interpreter tier"),
              pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"), reason="torch without fp8")]

E4M3 = getattr(torch, "float8_e4m3fn", None)
E5M2 = getattr(torch, "float8_e5m2", None)
GEN = torch.Generator().manual_seed(88)
M, N, K = 24, 32, 16
COPY = "def e(accum): D = accum; return D"


def _args(in_dtype, out_dtype, src=COPY, **extra):
    A = torch.randn(M, K, generator=GEN).to(in_dtype)
    B = torch.randn(N, K, generator=GEN).to(in_dtype).T
    D = torch.empty(M, N, dtype=out_dtype)
    return GemmArguments(A, B, D, epilogue=EpilogueArguments(src, D=D, **extra))


@pytest.mark.parametrize("in_dtype,out_dtype", [(E4M3, torch.float16), (E5M2, torch.float32),
                                                (torch.float16, E4M3), (torch.float16, E5M2)])
def test_interpreter_refuses_fp8_with_the_reason(in_dtype, out_dtype):
    args = _args(in_dtype, out_dtype)
    assert get_kernels(args) == []
    text = explain(args)
    assert text.count("fp8 needs a GPU (Triton's CPU interpreter converts fp8 wrongly") == 2
    assert ("A and B: " if in_dtype in (E4M3, E5M2) else "D: ") in text


def test_interpreter_refuses_fp8_operands():
    C = torch.randn(M, N, generator=GEN).to(E4M3)
    args = _args(torch.float16, torch.float16, "def e(accum, C): D = accum + C; return D", C=C)
    assert get_kernels(args) == [] and "C: fp8 needs a GPU" in explain(args)


def test_fp8_inputs_need_cc_89():
    args = _args(E4M3, torch.bfloat16)
    why = _fp8_refusal(args, Target("cuda", 80, torch.device("cpu"), 108))
    assert why and "compute capability 8.9+" in why
    assert _fp8_refusal(args, Target("cuda", 90, torch.device("cpu"), 132)) is None
    assert _fp8_refusal(_args(torch.float16, torch.float16), Target("cuda", 80, None, 1)) is None


@pytest.mark.parametrize("family", ["hopper", "portable"])
@pytest.mark.parametrize("out_dtype,fmax", [(E4M3, "448.0"), (E5M2, "57344.0")])
def test_emitter_saturates_fp8_stores(family, out_dtype, fmax):
    args = _args(torch.float16, out_dtype, "def e(accum, s): D = accum * s; return D", s=2.0)
    spec = codegen.KernelSpec(family, args.optimized_dag, False, True, False, False, 2, True)
    src = codegen.generate(spec)
    assert "_ef_sat(" in src and f", {fmax})" in src
    assert "def _ef_sat(" in src  # the helper travels with the kernel


def test_compare_fp8_saturates_the_reference_and_allows_one_ulp():
    ref = torch.tensor([1.0, 2.0, 3.0, 100.0, 1e6, -1e6, 0.3, 7.0])
    out = ref.clamp(-448, 448).to(E4M3)
    assert compare("D", out, ref, E4M3).ok  # +-1e6 stored as +-448: saturation, not error
    flipped = out.float().clone()
    flipped[2] = 3.25  # one e4m3 ulp above 3.0: a value on a rounding boundary
    assert compare("D", flipped.to(E4M3), ref, E4M3).ok
    wrong = out.float().clone()
    wrong[3] = 64.0  # 100 stored as 64: two binades off
    assert not compare("D", wrong.to(E4M3), ref, E4M3).ok
    unwritten = out.float().clone()
    unwritten[4] = float("nan")
    check = compare("D", unwritten.to(E4M3), ref, E4M3)
    assert not check.ok and check.unwritten == 1


def test_reference_rounds_fp8_outputs_saturating():
    args = _args(torch.float16, E4M3, "def e(accum, s): D = accum * s; return D", s=1000.0)
    ref = evaluate(args)["D"]
    assert ref.dtype == E4M3
    assert ref.float().abs().max().item() == 448.0 and not ref.float().isnan().any()
