"""bf16 under Triton's CPU interpreter (``runtime.kernel.Bf16AsFp32Plan``): every bf16
tensor goes to the kernel as an exact fp32 copy and every bf16 output comes back rounded
to nearest even, as a GPU kernel stores it. Against torch in fp32 rounded once to bf16:
every candidate, operands and outputs of every kind, reductions, an output given in place
of an input, grouped and gated GEMMs, and gradients."""

from __future__ import annotations

import pytest
import torch

import evtfuse
from evtfuse import EpilogueArguments, GemmArguments

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="CPU-interpreter tier (a GPU reads bf16 itself)")

BF = torch.bfloat16
GEN = torch.Generator().manual_seed(35)


def rand(*shape, dtype=BF):
    return torch.randn(*shape, generator=GEN).to(dtype)


def assert_bf16_close(got: torch.Tensor, want: torch.Tensor):
    """Equal after rounding, but for the K sum's order: at most one bf16 step apart."""
    assert got.dtype == BF
    want = want.to(BF)
    step = want.float().abs() * 2.0 ** -7 + 1e-30
    diff = (got.float() - want.float()).abs()
    assert (diff <= step).all(), diff.max()


EPI = """def e(accum, C, bias, s):
    F = relu(accum + bias) * s
    D = F + C
    amax = max(abs(F))
    total = sum(F)
    return D, F, amax, total"""


def _want(A, B, C, bias, s):
    F = torch.relu(A.float() @ B.float() + bias.float()) * s
    return F + C.float(), F, F.abs().amax(1, keepdim=True), F.sum()


@pytest.mark.parametrize("cc", [None, 90], ids=["portable", "with_hopper"])
def test_every_candidate_against_torch(cc):
    M, N, K = 37, 40, 48
    A, B, C, bias = rand(M, K), rand(K, N), rand(M, N), rand(N)
    outs = dict(D=torch.empty(M, N, dtype=BF), F=torch.empty(M, N, dtype=BF),
                amax=torch.empty(M, 1, dtype=BF), total=torch.empty(1))
    args = GemmArguments(A, B, outs["D"], epilogue=EpilogueArguments(EPI, C=C, bias=bias, s=0.5,
                                                                     **outs))
    kernels = evtfuse.get_kernels(args, cc=cc)
    families = {k.family.name for k in kernels}
    assert "portable" in families and ("hopper" in families) == (cc == 90), families
    D, F, amax, total = _want(A, B, C, bias, 0.5)
    for k in kernels:
        for t in outs.values():
            t.fill_(float("nan"))
        k.run(args)
        assert_bf16_close(outs["D"], D)
        assert_bf16_close(outs["F"], F)
        assert_bf16_close(outs["amax"], amax)
        torch.testing.assert_close(outs["total"], total.reshape(1), rtol=1e-5, atol=1e-3)


def test_gemm_in_place_and_column_major_b():
    """D given as C's own buffer (read, then overwritten), B column-major."""
    M, N, K = 20, 24, 32
    A, Bt, C = rand(M, K), rand(N, K), rand(M, N)
    want = 2.0 * (A.float() @ Bt.float().t()) + C.float()
    out = evtfuse.gemm(A, Bt.t(), "def e(accum, C): D = 2.0 * accum + C; return D", C=C, D=C)
    assert out is C
    assert_bf16_close(C, want)


def test_grouped_rows_past_the_last_group_untouched():
    sizes, K, N = [5, 0, 9], 16, 12
    T = sum(sizes) + 3
    A, B, bias = rand(T, K), rand(len(sizes), K, N), rand(len(sizes), 1, N)
    offs = torch.tensor(sizes).cumsum(0).to(torch.int32)
    D = torch.full((T, N), 7.0, dtype=BF)
    evtfuse.grouped_gemm(A, B, offs, "def e(accum, bias): D = accum + bias; return D",
                         bias=bias, D=D)
    start = 0
    for g, end in enumerate(offs.tolist()):
        assert_bf16_close(D[start:end], A[start:end].float() @ B[g].float() + bias[g].float())
        start = end
    assert (D[start:] == 7.0).all()


def test_gated_swiglu():
    M, K, N = 9, 16, 10
    x, Wg, Wu = rand(M, K), rand(N, K), rand(N, K)
    W = evtfuse.interleave_gate_up(Wg, Wu)
    D = evtfuse.gemm(x, W.t(), "def e(accum):\n    gate, up = pairs(accum)\n"
                     "    D = silu(gate) * up\n    return D")
    g, u = x.float() @ Wg.float().t(), x.float() @ Wu.float().t()
    want = torch.nn.functional.silu(g) * u
    assert D.dtype == BF
    torch.testing.assert_close(D.float(), want, rtol=2 ** -7, atol=1e-2)


def test_gradients_against_torch():
    M, K, N = 12, 16, 10
    A = rand(M, K).requires_grad_(True)
    W = rand(N, K).requires_grad_(True)
    bias = rand(N).requires_grad_(True)
    out = evtfuse.gemm(A, W.t(), "def e(accum, bias): D = gelu(accum + bias); return D",
                       bias=bias)
    g = rand(M, N)
    out.backward(g)
    A2, W2, b2 = (t.detach().float().requires_grad_(True) for t in (A, W, bias))
    torch.nn.functional.gelu(A2 @ W2.t() + b2).backward(g.float())
    for got, want in ((A.grad, A2.grad), (W.grad, W2.grad), (bias.grad, b2.grad)):
        assert got.dtype == BF
        torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)
