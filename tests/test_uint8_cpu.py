"""uint8 GEMMs with int32 accumulation through the CPU interpreter. Triton's dot takes no
unsigned 8-bit operands, so the portable kernel runs them as int8 a - 128, b - 128 and adds
the offset terms from per-row sums of A and per-column sums of B (``codegen._u8_lines``):
the results must be exact (the int32 accumulator equal to ``A.long() @ B.long()``), at the
extremes too (all-255 inputs with K at the last one the int32 sum holds, padding of K past
the tile, edge M/N), and wrap modulo 2^32 past that as a true int32 accumulator does. The
TMA families refuse uint8 with a reason; ``gemm`` allocates int32 outputs for them."""

from __future__ import annotations

import pytest
import torch

import evtfuse
from evtfuse import EpilogueArguments, GemmArguments, explain, get_kernels
from evtfuse.reference import evaluate, evaluate_grouped
from offline_run import run_offline

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-interpreter tier")

GEN = torch.Generator().manual_seed(35)
U8 = torch.uint8


def u8(*shape):
    return torch.randint(0, 256, shape, generator=GEN, dtype=U8)


def exact(A, B):
    return A.long() @ B.long()


def wrapped(x: torch.Tensor) -> torch.Tensor:
    """int64 values as an int32 accumulator holds them: modulo 2^32, two's complement."""
    return ((x + 2 ** 31) % 2 ** 32) - 2 ** 31


def _portable(args):
    ks = [k for k in get_kernels(args) if k.family.name == "portable"]
    assert ks, explain(args)
    return ks


@pytest.mark.parametrize("M,N,K", [(40, 48, 64), (17, 33, 45), (1, 5, 1), (33, 1, 70)])
def test_uint8_accumulator_is_exact(M, N, K):
    """Random uint8 inputs, with K a multiple of the tile or not (the padding loads 128,
    zero once offset), M and N past the tile's edge, every configuration offered."""
    A, B = u8(M, K), u8(K, N)
    for k in _portable(GemmArguments(A, B, torch.empty(M, N, dtype=torch.int32), torch.int32)):
        D = torch.empty(M, N, dtype=torch.int32)
        args = GemmArguments(A, B, D, torch.int32)
        result = k.verify(args)
        assert result, result.report()
        assert torch.equal(D.long(), exact(A, B)), k.name


def test_uint8_extreme_values():
    """All-255, all-0 and all-128 inputs (a' = 127, -128 and 0), mixed in one product:
    rows of A and columns of B each hold one pattern."""
    M, N, K = 6, 6, 37
    rows = [torch.full((K,), v, dtype=U8) for v in (255, 0, 128)]
    A = torch.stack(rows + [u8(K), torch.where(torch.arange(K) % 2 == 0, 255, 0).to(U8),
                            u8(K)])
    B = A.T.clone()
    D = torch.empty(M, N, dtype=torch.int32)
    args = GemmArguments(A, B, D, torch.int32)
    result = _portable(args)[0].verify(args)
    assert result, result.report()
    assert torch.equal(D.long(), exact(A, B))
    assert D[0, 0] == 255 * 255 * K and D[1, 1] == 0 and D[2, 2] == 128 * 128 * K


@pytest.mark.slow
def test_uint8_int32_sum_uses_every_bit_and_wraps_past_it():
    """K = 33040, not a multiple of any tile: row 0 of A all 255 against B's all-255 column
    0 sums to 255 * 255 * 33040 > 2^31 - 1, which an int32 accumulator holds modulo 2^32
    (so does the kernel); row 1 is 255 on its first 33025 elements only: 2147450625, the
    largest such sum below 2^31, exact. Column 1 of B is 1, row 2 of A random."""
    K, full = 33040, 33025
    A = torch.zeros(3, K, dtype=U8)
    A[0] = 255
    A[1, :full] = 255
    A[2] = u8(K)
    B = torch.stack([torch.full((K,), 255, dtype=U8), torch.ones(K, dtype=U8)], dim=1)
    D = torch.empty(3, 2, dtype=torch.int32)
    args = GemmArguments(A, B, D, torch.int32)
    _portable(args)[0].run(args)
    want = exact(A, B)
    assert want[0, 0] >= 2 ** 31 and want[1, 0] == 255 * 255 * full < 2 ** 31
    assert torch.equal(D.long(), wrapped(want))
    assert D[1, 0] == 2147450625 and D[0, 0] < 0  # past 2^31 the int32 sum wraps


def test_uint8_epilogue_scales_saturation_and_layouts():
    """A float epilogue on the exact accumulator, a saturating uint8 output and an int8
    one; B column-major, A batched (the portable family takes any strides)."""
    L, M, N, K = 2, 19, 24, 50
    A, B = u8(L, M, K), u8(N, K).T
    src = ("def epi(accum, scale, zero): Y = accum; D = accum * scale - zero; "
           "E = accum * scale - 400.0; return D, Y, E")
    D = torch.empty(L, M, N, dtype=U8)
    Y = torch.empty(L, M, N, dtype=torch.int32)
    E = torch.empty(L, M, N, dtype=torch.int8)
    zero = torch.rand(N, generator=GEN) * 700
    args = GemmArguments(A, B, D, torch.int32,
                         EpilogueArguments(src, scale=1 / 2048, zero=zero, D=D, Y=Y, E=E))
    result = _portable(args)[0].verify(args)
    assert result, result.report()
    assert torch.equal(Y.long(), exact(A, B))
    assert D.min() == 0 and D.max() == 255 and E.min() == -128 and E.max() == 127  # saturated


def test_uint8_grouped_over_k():
    """A grouped GEMM over K: each group's own K goes into the 128 * 128 * K term."""
    M, N, T = 12, 20, 70
    A, B = u8(M, T), u8(T, N)
    offs = torch.tensor([0, 33, 51, 70], dtype=torch.int32)  # an empty first group
    D = evtfuse.grouped_gemm(A, B, offs, "def e(accum): D = accum; return D", tune="none")
    assert D.dtype == torch.int32 and D.shape == (4, M, N)
    starts = [0, 0, 33, 51]
    for g, (s, e) in enumerate(zip(starts, offs.tolist())):
        assert torch.equal(D[g].long(), exact(A[:, s:e], B[s:e])), g
    ref = evaluate_grouped("def e(accum): D = accum; return D", A, B, offs, dict(D=D))["D"]
    assert torch.equal(D.long(), ref.long())


def test_uint8_gated_epilogue():
    """pairs(accum): the offset terms are added before the accumulator's columns split."""
    M, N, K = 9, 12, 40
    A, B = u8(M, K), u8(K, 2 * N)
    D = torch.empty(M, N, dtype=torch.float32)
    src = "def epi(accum):\n    gate, up = pairs(accum)\n    D = gate * 1e-6 - up * 2e-6\n    return D"
    args = GemmArguments(A, B, D, torch.int32, EpilogueArguments(src, D=D))
    result = _portable(args)[0].verify(args)
    assert result, result.report()
    acc = exact(A, B).double()
    want = acc[:, 0::2] * 1e-6 - acc[:, 1::2] * 2e-6
    assert torch.allclose(D.double(), want, rtol=1e-5, atol=1e-6)


def test_uint8_refusals_and_defaults():
    M, N, K = 16, 16, 32
    A, B = u8(M, K), u8(N, K).T
    D = torch.empty(M, N, dtype=torch.int32)
    fp32_acc = GemmArguments(A, B, D)  # float32 accumulation asked for uint8 inputs
    assert get_kernels(fp32_acc) == []
    assert "A and B are torch.uint8: pass accumulator_type=torch.int32" in explain(fp32_acc)
    args = GemmArguments(A, B, D, torch.int32)
    text = explain(args, cc=90)
    assert "hopper: refused: uint8 inputs run in the portable family only" in text
    assert [k.family.name for k in get_kernels(args, cc=90)] == ["portable", "portable"]
    with pytest.raises(evtfuse.EpilogueError, match="A and B are torch.int16; evtfuse "
                       "multiplies float16, .*float64, .*int8 and uint8 inputs") as e:
        GemmArguments(A.short(), B.short(), D, torch.int32)
    assert e.value.variable == "A"
    out = evtfuse.gemm(A, B)  # allocated: int32, as for int8
    assert out.dtype == torch.int32 and torch.equal(out.long(), exact(A, B))
    assert (evaluate(args)["D"].long() == exact(A, B)).all()


_OFFLINE_SCRIPT = """
import json, torch
from evtfuse import EpilogueArguments, GemmArguments
from evtfuse.backends.triton.families import PortableFamily, TileConfig
from evtfuse.runtime.offline import compile_for
M, N, K = 4096, 4096, 4096
A, B = torch.empty(M, K, dtype=torch.uint8), torch.empty(N, K, dtype=torch.uint8).T
D, Y = torch.empty(M, N, dtype=torch.uint8), torch.empty(M, N, dtype=torch.int32)
epi = EpilogueArguments("def e(accum, s): Y = accum; D = accum * s; return D, Y", s=0.01, D=D, Y=Y)
args = GemmArguments(A, B, D, torch.int32, epi)
c = compile_for(PortableFamily(), TileConfig(128, 128, 128, 8, 8, 3), args)
print("RESULT" + json.dumps({"shared": c.shared_bytes, "spills": c.spills,
                             "int8_mma": "s8.s8" in c.ptx}))
"""


@pytest.mark.slow
def test_uint8_kernel_compiles_for_sm90():
    """The portable uint8 kernel compiles offline to an sm_90 cubin, its dot an int8 MMA."""
    got = run_offline(_OFFLINE_SCRIPT, timeout=600)
    assert got["shared"] > 0 and got["int8_mma"], got
