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
from evtfuse.backends.triton.families import Target
from evtfuse.backends.triton.family_base import _fp8_refusal
from evtfuse.backends.triton.spec import KernelSpec
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
    spec = KernelSpec(family, args.optimized_dag, False, True, False, False, 2, True)
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


@pytest.mark.parametrize("family", ["hopper", "portable"])
def test_promoted_fp8_accumulation_is_emitted_only_when_asked(family):
    """``fp8_fast_accum=False``: each k-step's dot sums in reduced precision and adds to
    the fp32 accumulator (Triton's ``max_num_imprecise_acc=BLOCK_K``); the default keeps
    the fast accumulation over all of K, and wider inputs never get the keyword. The two
    modes are different kernels, tunings and launch plans."""
    from evtfuse.backends.triton.families import FAMILIES, TileConfig
    from evtfuse.runtime.kernel import structure_key
    from evtfuse.runtime.tuner import tuning_key

    fam = next(f for f in FAMILIES if f.name == family)
    gpu = Target("cuda", 90, torch.device("cpu"), 132, offline=True)
    cfg = TileConfig(128, 128, 128, 8, 8, 3)

    def dot_lines(in_dtype, **options):
        args = _args(in_dtype, torch.bfloat16)
        args = GemmArguments(args.A, args.B, args.epilogue.values["D"],
                             epilogue=args.epilogue, **options)
        spec = fam.spec(args, cfg, gpu)
        return [ln for ln in codegen.generate(spec).splitlines() if "tl.dot(" in ln], spec, args

    fast, fast_spec, fast_args = dot_lines(E4M3)
    promoted, promoted_spec, promoted_args = dot_lines(E4M3, fp8_fast_accum=False)
    fp16, _, _ = dot_lines(torch.float16, fp8_fast_accum=False)
    assert fast and promoted and fp16
    assert all("max_num_imprecise_acc=BLOCK_K" in ln for ln in promoted)
    assert not any("max_num_imprecise_acc" in ln for ln in fast + fp16)
    assert fast_spec.key() != promoted_spec.key()
    assert tuning_key(fast_args, "fast", None) != tuning_key(promoted_args, "fast", None)
    assert structure_key(fast_args) != structure_key(promoted_args)


def test_compare_allows_fast_fp8_accumulation_error_growing_with_k():
    """The fast mode's error grows about as sqrt(K) (``verify.FP8_INPUT_TOLERANCE``): an
    error the size H100 measured at K = 16384 (3.1e-3 of the norm) passes for a fast
    accumulation over that K and fails for a promoted one, and at K <= 256 the bounds are
    the promoted ones."""
    g = torch.Generator().manual_seed(3)
    ref = torch.randn(64, 64, generator=g)
    noisy = ref + 3.1e-3 * torch.randn(64, 64, generator=g)
    assert compare("D", noisy, ref, torch.float32, input_dtype=E4M3, fp8_fast_k=16384).ok
    assert not compare("D", noisy, ref, torch.float32, input_dtype=E4M3).ok
    small = compare("D", noisy, ref, torch.float32, input_dtype=E4M3, fp8_fast_k=128)
    assert not small.ok and small.tolerance == 2e-3
    wrong = ref.clone()
    wrong[5, 7] += 0.5 * float(ref.pow(2).mean().sqrt())  # one element off by half the RMS
    assert not compare("D", wrong, ref, torch.float32, input_dtype=E4M3, fp8_fast_k=16384).ok


def test_promoted_fp8_offers_256x128_tiles_first():
    """With promotion each tile keeps a second accumulator; the hopper family then offers
    its 256x128 tiles first (measured fastest, benchmarks/HISTORY.md, nineteenth session), where
    the fast accumulation keeps 128x256 first. Problems too small to fill the GPU with
    256x128 tiles keep the tiles that do."""
    from evtfuse.runtime.offline import offered

    def first(M, N, K, fast):
        A = torch.empty(M, K).to(E4M3)
        B = torch.empty(N, K).to(E4M3).T
        D = torch.empty(M, N)
        args = GemmArguments(A, B, D, epilogue=EpilogueArguments(COPY, D=D),
                             fp8_fast_accum=fast)
        fam, cfg = offered(args)[0]
        return fam.name, cfg.block_m, cfg.block_n

    assert first(4096, 4096, 4096, True) == ("hopper", 128, 256)
    assert first(4096, 4096, 4096, False) == ("hopper", 256, 128)
    assert first(1024, 1024, 8192, False)[1:] != (256, 128)
