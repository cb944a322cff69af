"""fp16 accumulation (``accumulator_type=torch.float16``) through the CPU interpreter: the
portable and hopper kernels keep the accumulator in fp16 (``tl.dot(..., out_dtype=
tl.float16)``), the epilogue computes in fp32 from it; the reference evaluator's
accumulator is the product rounded to fp16, and ``Kernel.verify`` allows the summation
error of fp16 partial sums, growing as sqrt(K) (``runtime.verify.FP16_ACC_NOISE``), no
more. Refusals: bf16 and fp32 inputs, fp8 with promotion, the gluon family; fp8 stays
refused under the interpreter. Offline sm_90 compiles of each new kernel variant."""

from __future__ import annotations

import pytest
import torch

from evtfuse import EpilogueArguments, GemmArguments, explain, get_kernels
from evtfuse.reference import accumulator, evaluate
from evtfuse.runtime.verify import FP16_ACC_NOISE, accumulation_slack, compare
from offline_run import run_offline

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-interpreter tier")

GEN = torch.Generator().manual_seed(1635)
H = torch.float16


def rand(*shape, dtype=H):
    return torch.randn(*shape, generator=GEN).to(dtype)


def _kernel(args, family):
    ks = [k for k in get_kernels(args, cc=90 if family == "hopper" else None)
          if k.family.name == family]
    assert ks, explain(args, cc=90)
    return ks[0]


@pytest.mark.parametrize("family", ["portable", "hopper"])
@pytest.mark.parametrize("M,N,K", [(40, 48, 64), (33, 24, 200), (1, 8, 8)])
def test_fp16_accumulator_is_fp16(family, M, N, K):
    """``accum`` stored into fp32 holds fp16 values only (an fp32 accumulator would not),
    within the fp16 summation bound of the exact product, and verify passes."""
    A, B = rand(M, K), rand(N, K).T  # B K-contiguous, rows 16-byte aligned for TMA
    D = torch.empty(M, N)
    args = GemmArguments(A, B, D, torch.float16)
    k = _kernel(args, family)
    result = k.verify(args)
    assert result, result.report()
    assert torch.equal(D.half().float(), D)  # every element an fp16 number
    exact = A.double() @ B.double()
    rms = float(exact.pow(2).mean().sqrt())
    assert float((D.double() - exact).abs().max()) <= 2 * FP16_ACC_NOISE * K ** 0.5 * max(
        rms, float(exact.abs().max())) + 2 ** -10 * float(exact.abs().max())
    if K >= 64:  # not the fp32 product: the fp16 accumulator's rounding shows
        assert float((D.double() - (A.float() @ B.float()).double()).abs().max()) > 1e-5 * rms


def test_fp16_accumulator_epilogue_in_fp32():
    """The epilogue reads the fp16 accumulator and computes in fp32: C added and scaled
    in fp32 (an fp16 epilogue would round 1 + 2^-12 to 1), stored to fp16 and fp32."""
    M, N, K = 24, 40, 96
    A, B = rand(M, K), rand(N, K).T
    C = torch.full((M, N), 2.0 ** -12)
    D, F = torch.empty(M, N, dtype=H), torch.empty(M, N)
    src = "def epi(accum, C, alpha): F = accum * 0.0 + 1.0 + C; D = alpha * accum + F; return D, F"
    args = GemmArguments(A, B, D, torch.float16,
                         EpilogueArguments(src, C=C, alpha=0.5, D=D, F=F))
    result = _kernel(args, "portable").verify(args)
    assert result, result.report()
    assert (F == 1.0 + 2.0 ** -12).all()  # fp32 arithmetic, not fp16


@pytest.mark.filterwarnings("ignore:overflow encountered in add:RuntimeWarning")
def test_fp16_accumulator_overflow_is_inf_as_the_reference():
    """Past 65504 the fp16 accumulator is infinite: the reference's too."""
    M, N, K = 16, 16, 300
    A = torch.ones(M, K, dtype=H)
    B = torch.full((K, N), 256.0, dtype=H)
    B[:, 1] = 1.0  # column 1: 300, finite
    D = torch.empty(M, N)
    args = GemmArguments(A, B, D, torch.float16)
    assert torch.isinf(accumulator(args)[:, 0]).all()
    result = _kernel(args, "portable").verify(args)
    assert result, result.report()
    assert torch.isinf(D[:, 0]).all() and (D[:, 1] == 300).all()


def _rounded_every(A, B, chunk):
    """A @ B accumulated in fp16, rounded after every ``chunk`` products (each chunk's sum
    exact in float64): 1 is the finest rounding a kernel could have, 16 a tensor-core
    MMA's (an instruction's k: 16 for fp16, 32 for fp8); the interpreter rounds once per
    BLOCK_K."""
    acc = torch.zeros(A.shape[0], B.shape[1], dtype=H)
    for k in range(0, A.shape[1], chunk):
        acc = (acc.double() + A[:, k:k + chunk].double() @ B[k:k + chunk].double()).to(H)
    return acc.float()


@pytest.mark.parametrize("K,sign,chunk,passes", [
    (128, "any", 1, True), (4096, "any", 1, True), (4096, "positive", 16, True),
    (4096, "positive", 1, False)])
def test_verify_tolerance_is_fp16_summation_not_looser(K, sign, chunk, passes):
    """The fp16 slack (``FP16_ACC_NOISE``) covers an fp16 accumulator rounded after every
    product for zero-mean products, and after every 16 (a tensor-core MMA) for one-sign
    ones; the fp32 accumulator's slack (ACC_NOISE) refuses both, and one wrong element
    (10% of the accumulator's RMS) fails. One-sign products rounded one by one stagnate
    (a product below half an ulp of the sum is lost: 8% low at K = 4096), far past
    sqrt(K): the bound does not hide that; no kernel rounds so often."""
    M, N = 32, 32
    A, B = rand(M, K), rand(K, N)
    if sign == "positive":
        A, B = A.abs(), B.abs()
    D = torch.empty(M, N)
    args = GemmArguments(A, B, D, torch.float16)
    acc = accumulator(args)
    ref = evaluate(args, acc, cast=False)
    ev = lambda a: evaluate(args, a, cast=False)  # noqa: E731
    slack16 = accumulation_slack(ev, acc, ref, K, ["D"], noise=FP16_ACC_NOISE, own_scale=True)
    slack32 = accumulation_slack(ev, acc, ref, K, ["D"])
    got = _rounded_every(A, B, chunk)
    assert compare("D", got, ref["D"], torch.float32, input_dtype=H,
                   slack=slack16["D"]).ok == passes
    assert not compare("D", got, ref["D"], torch.float32, input_dtype=H,
                       slack=slack32["D"]).ok
    rms = float(acc.pow(2).mean().sqrt())
    wrong = got.clone()
    wrong[3, 5] += 0.1 * rms
    assert not compare("D", wrong, ref["D"], torch.float32, input_dtype=H,
                       slack=slack16["D"]).ok


def test_fp16_accumulation_refusals():
    M, N, K = 16, 16, 32
    D = torch.empty(M, N)
    bf = GemmArguments(rand(M, K, dtype=torch.bfloat16), rand(K, N, dtype=torch.bfloat16),
                       D, torch.float16)
    assert get_kernels(bf) == []
    assert "accumulator_type torch.float16 takes fp16 and fp8 inputs, not torch.bfloat16" in \
        explain(bf)
    f32 = GemmArguments(rand(M, K, dtype=torch.float32), rand(K, N, dtype=torch.float32), D,
                        torch.float16)
    assert "not torch.float32" in explain(f32)
    f64 = GemmArguments(rand(M, K), rand(K, N), D, torch.float64)
    assert "float inputs accumulate in torch.float32 (or torch.float16 for fp16 and fp8" in \
        explain(f64)
    e4 = torch.float8_e4m3fn
    a8, b8 = torch.zeros(M, K, dtype=e4), torch.zeros(N, K, dtype=e4).T
    promoted = GemmArguments(a8, b8, D, torch.float16, fp8_fast_accum=False)
    assert "fp8_fast_accum=False promotes each k-step's sum to an fp32" in explain(promoted)
    fast = GemmArguments(a8, b8, D, torch.float16)
    assert get_kernels(fast) == [] and "fp8 needs a GPU" in explain(fast)  # interpreter


def test_gluon_refuses_fp16_accumulation():
    from evtfuse.backends.triton.families import GluonFamily, Target

    M, N, K = 256, 256, 128
    A, B = torch.empty(M, K, dtype=H), torch.empty(N, K, dtype=H).T
    D = torch.empty(M, N, dtype=H)
    gpu = Target("cuda", 90, torch.device("cpu"), 132, offline=True)
    assert GluonFamily().supports(GemmArguments(A, B, D), gpu)  # fp32: taken
    st = GluonFamily().supports(GemmArguments(A, B, D, torch.float16), gpu)
    assert not st and "the gluon kernels' warpgroup MMAs accumulate in fp32" in str(st.reason)


_OFFLINE_SCRIPT = """
import json, torch
from evtfuse import EpilogueArguments, GemmArguments
from evtfuse.backends.triton.families import HopperFamily, PortableFamily, TileConfig
from evtfuse.runtime.offline import compile_for
M, N, K = 4096, 4096, 4096
out = {}
for name, dt in (("fp16", torch.float16), ("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)):
    A, B = torch.empty(M, K).to(dt), torch.empty(N, K).to(dt).T
    D, C = torch.empty(M, N, dtype=torch.bfloat16), torch.empty(M, N, dtype=torch.bfloat16)
    epi = EpilogueArguments("def e(accum, C, s): D = accum * s + C; return D", C=C, s=0.5, D=D)
    args = GemmArguments(A, B, D, torch.float16, epi)
    bk = 64 if dt == torch.float16 else 128
    for fam, cfg in ((PortableFamily(), TileConfig(128, 128, bk, 8, 8, 3)),
                     (HopperFamily(), TileConfig(128, 256, bk, 8, 8, 3, epi_split=2))):
        c = compile_for(fam, cfg, args)
        out[name + "-" + fam.name] = {"shared": c.shared_bytes, "spills": c.spills,
                                      "f16_acc": ".f16." in c.ptx and "wgmma" in c.ptx}
print("RESULT" + json.dumps(out))
"""


@pytest.mark.slow
def test_fp16_accumulation_kernels_compile_for_sm90():
    """fp16 accumulation compiles offline to sm_90 in the portable and hopper families,
    for fp16 and both fp8 inputs, as wgmma with an fp16 accumulator."""
    got = run_offline(_OFFLINE_SCRIPT, timeout=900)
    assert len(got) == 6, got
    for name, c in got.items():
        assert c["shared"] > 0 and c["f16_acc"], (name, got)


def test_gemm_takes_accumulator_type():
    """``evtfuse.gemm(..., accumulator_type=torch.float16)``: the fp16 accumulator (its
    values are fp16 numbers), and the same call without it right after gets fp32
    accumulation again (the two do not share a plan or a tuning choice)."""
    import evtfuse

    M, N, K = 32, 24, 256
    A, B = rand(M, K), rand(N, K).T
    src = "def epi(accum): D = accum; return D"
    d16 = evtfuse.gemm(A, B, src, accumulator_type=torch.float16, D_dtype=torch.float32)
    d32 = evtfuse.gemm(A, B, src, D_dtype=torch.float32)
    assert torch.equal(d16.half().float(), d16)
    exact = A.double() @ B.double()
    assert not torch.equal(d16, d32)
    assert float((d32.double() - exact).abs().max()) < float((d16.double() - exact).abs().max())
    again = evtfuse.gemm(A, B, src, accumulator_type=torch.float16, D_dtype=torch.float32)
    assert torch.equal(again, d16)


def test_gemm_accumulator_type_errors():
    import evtfuse

    A, B = rand(16, 32), rand(32, 16)
    with pytest.raises(ValueError, match="accumulator_type must be None"):
        evtfuse.gemm(A, B, accumulator_type=torch.bfloat16)
    with pytest.raises(Exception, match="accumulator_type|float16|fp16"):
        evtfuse.gemm(A.float(), B.float(), accumulator_type=torch.float16)
    A.requires_grad_(True)
    with pytest.raises(NotImplementedError, match="forward-only"):
        evtfuse.gemm(A, B, accumulator_type=torch.float16)
    # the inputs' own accumulator, named, is the default
    out = evtfuse.gemm(A.detach(), B, accumulator_type=torch.float32)
    assert out.dtype == torch.float16
