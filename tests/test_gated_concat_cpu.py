"""Gated epilogues over the concatenated layout (``gate, up = pairs(accum,
layout="concatenated")``: B's first N columns are gate, the next N up, a ``[W_gate; W_up]``
weight's ``W.t()`` read as it is) on the CPU tier: the portable kernel under Triton's
interpreter against torch's two projections and against the interleaved layout, dense,
batched, grouped over M and over K, every interpreter config, N not a multiple of the
tile; gradients (dense, grouped over M and over K, both backward modes) landing in the
concatenated weight's halves; the parse, its errors and the unparse round trip
(docs/gated.md). The library's epilogues in both layouts and their offline sm_90 compiles:
tests/test_gated_cpu.py."""

from __future__ import annotations

import pytest
import torch

import evtfuse
from evtfuse import EpilogueArguments, EpilogueError, GemmArguments, library
from evtfuse.frontend import parse_epilogue
from evtfuse.reference import evaluate, evaluate_grouped
from evtfuse.unparse import to_source
from test_gated_cpu import expected  # torch's two projections, the one reference

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="CPU-interpreter tier; tests/gpu/test_gpu_gated.py on a GPU")

GEN = torch.Generator().manual_seed(36)
F = torch.nn.functional
TOL = dict(atol=1e-4, rtol=1e-4)

CONCAT = """def e(accum, bias_gate, bias_up):
    gate, up = pairs(accum, layout="concatenated")
    D = silu(gate + bias_gate) * (up + bias_up)
    return D"""


def rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=GEN).to(dtype)


def test_every_interpreter_config_the_reference_and_the_interleaved_layout():
    M, K, N = 19, 24, 21
    x, Wg, Wu, bg, bu = rand(M, K), rand(21, K), rand(21, K), rand(N), rand(N)
    D = torch.empty(M, N)
    for B in (torch.cat((Wg, Wu)).t(), torch.cat((Wg, Wu)).t().contiguous()):  # both orders
        args = GemmArguments(x, B, D, epilogue=EpilogueArguments(CONCAT, bias_gate=bg,
                                                                 bias_up=bu, D=D))
        want = expected(x, Wg, Wu, F.silu, bg, bu)
        torch.testing.assert_close(evaluate(args)["D"], want, **TOL)
        kernels = evtfuse.get_kernels(args)
        assert len(kernels) == 2
        for k in kernels:
            D.fill_(float("nan"))
            k.run(args)
            torch.testing.assert_close(D, want, **TOL)
    inter = evtfuse.gemm(x, evtfuse.interleave_gate_up(Wg, Wu).t(),
                         library.gated("swiglu", bias=True), bias_gate=bg, bias_up=bu)
    torch.testing.assert_close(D, inter, **TOL)


def test_batched():
    L, M, K, N = 2, 7, 16, 10
    x, Wg, Wu = rand(L, M, K), rand(L, N, K), rand(L, N, K)
    D = evtfuse.gemm(x, torch.cat((Wg, Wu), dim=1).mT, library.gated(layout="concatenated"),
                     tune="none")
    assert D.shape == (L, M, N)
    torch.testing.assert_close(D, expected(x, Wg, Wu, F.silu), **TOL)


def test_grouped_over_m_matches_torch_grouped_mm_and_every_config():
    """The MoE up-projection with experts' [gate; up] weights (G, 2N, K) as they are:
    ``torch._grouped_mm`` then the epilogue in torch, against the fused call (every
    interpreter config; a group empty, rows past offs[-1] untouched)."""
    G, K, N, T = 3, 32, 13, 40
    x, Wg, Wu, w = rand(T, K), rand(G, N, K), rand(G, N, K), rand(T, 1).abs()
    W = torch.cat((Wg, Wu), dim=1)
    offs = torch.tensor([16, 16, 37], dtype=torch.int32)
    h = torch._grouped_mm(x, W.mT, offs=offs).float()
    want = F.silu(h[:, :N]) * h[:, N:] * w
    epi = ("def e(accum, w):\n    gate, up = pairs(accum, layout=\"concatenated\")\n"
           "    D = silu(gate) * up * w\n    return D")
    D = torch.empty(T, N)
    args = GemmArguments(x, W.mT, D, epilogue=EpilogueArguments.unbound(epi, w=w, D=D),
                         offs=offs)
    kernels = evtfuse.get_kernels(args)
    assert len(kernels) == 2
    for k in kernels:
        D.fill_(float("nan"))
        k.run(args)
        torch.testing.assert_close(D[:37], want[:37], **TOL)
        assert D[37:].isnan().all()


def test_grouped_over_k_against_the_reference():
    M, N, T = 10, 11, 30
    A, B = rand(M, T), rand(T, 2 * N)
    offs = torch.tensor([12, 12, 27], dtype=torch.int32)
    epi = "def e(accum):\n    g, u = pairs(accum, layout=\"concatenated\")\n    D = silu(g) * u\n    return D"
    D = evtfuse.grouped_gemm(A, B, offs, epi)
    acc = torch.stack([A[:, :12] @ B[:12], torch.zeros(M, 2 * N), A[:, 12:27] @ B[12:27]])
    torch.testing.assert_close(D, F.silu(acc[..., :N]) * acc[..., N:], **TOL)
    ref = evaluate_grouped(epi, A, B, offs, {"D": D})
    torch.testing.assert_close(D, ref["D"], **TOL)


@pytest.mark.parametrize("mode", ["recompute", "save"])
@pytest.mark.parametrize("batched", [False, True])
def test_dense_gradients_land_in_the_concatenated_halves(mode, batched):
    L, M, K, N = 3, 12, 16, 10
    lead = (L,) if batched else ()
    x = rand(*lead, M, K).requires_grad_()
    W = rand(2 * N, K).requires_grad_()  # [W_gate; W_up]
    bg, bu = rand(N).requires_grad_(), rand(N).requires_grad_()
    gy = rand(*lead, M, N)
    D = evtfuse.gemm(x, W.t(), CONCAT, bias_gate=bg, bias_up=bu, backward=mode)
    got = torch.autograd.grad((D * gy).sum(), (x, W, bg, bu))
    ref = F.silu(x @ W[:N].t() + bg) * (x @ W[N:].t() + bu)
    want = torch.autograd.grad((ref * gy).sum(), (x, W, bg, bu))
    for name, a, b in zip(("x", "W", "bias_gate", "bias_up"), got, want):
        torch.testing.assert_close(a, b, **TOL, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("mode", ["recompute", "save"])
def test_grouped_over_m_gradients(mode):
    sizes, K, N = [5, 0, 9], 16, 7
    G, T = len(sizes), sum(sizes) + 2
    x = rand(T, K).requires_grad_()
    W = rand(G, 2 * N, K).requires_grad_()  # experts' [W_gate; W_up]
    w = rand(T, 1).requires_grad_()
    offs = torch.tensor(sizes).cumsum(0).to(torch.int32)
    src = ("def e(accum, w):\n    gate, up = pairs(accum, layout=\"concatenated\")\n"
           "    D = silu(gate) * up * w\n    return D")
    D = evtfuse.grouped_gemm(x, W.mT, offs, src, w=w, backward=mode)
    end, g = int(offs[-1]), rand(T, N)
    got = torch.autograd.grad((D[:end] * g[:end]).sum(), (x, W, w))
    start, loss = 0, 0.0
    for e, n in enumerate(sizes):
        rows = slice(start, start + n)
        h = x[rows] @ W[e].T
        loss = loss + (F.silu(h[:, :N]) * h[:, N:] * w[rows] * g[rows]).sum()
        start += n
    want = torch.autograd.grad(loss, (x, W, w))
    for name, a, b in zip(("x", "W", "w"), got, want):
        torch.testing.assert_close(a, b, **TOL, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("mode", ["recompute", "save"])
def test_grouped_over_k_gradients(mode):
    sizes, T, M, N = [6, 0, 5], 13, 4, 6
    offs = torch.tensor(sizes).cumsum(0).to(torch.int32)
    A, B = rand(M, T).requires_grad_(), rand(T, 2 * N).requires_grad_()
    epi = "def e(accum):\n    g, u = pairs(accum, layout=\"concatenated\")\n    D = silu(g) * u\n    return D"
    gy = rand(len(sizes), M, N)
    got = torch.autograd.grad((evtfuse.grouped_gemm(A, B, offs, epi, backward=mode) * gy).sum(),
                              (A, B))
    ends = offs.tolist()
    acc = torch.stack([A[:, s:e] @ B[s:e] for s, e in zip([0] + ends[:-1], ends)])
    want = torch.autograd.grad(((F.silu(acc[..., :N]) * acc[..., N:]) * gy).sum(), (A, B))
    for name, a, b in zip(("A", "B"), got, want):
        torch.testing.assert_close(a, b, **TOL, msg=lambda m: f"{name}: {m}")


def test_parse_errors_and_unparse_round_trip():
    assert parse_epilogue(CONCAT).gated == "concatenated"
    assert parse_epilogue(library.SWIGLU).gated == "interleaved"
    with pytest.raises(EpilogueError, match="takes \"interleaved\"") as e:
        parse_epilogue("def e(accum):\n    g, u = pairs(accum, layout=\"blocks\")\n"
                       "    D = g * u\n    return D")
    assert e.value.variable == "layout" and e.value.line == 2
    with pytest.raises(EpilogueError, match="pairs\\(\\) takes only accum"):
        parse_epilogue("def e(accum):\n    g, u = pairs(accum, order=\"concatenated\")\n"
                       "    D = g * u\n    return D")
    with pytest.raises(EpilogueError, match="layout must be one of"):
        library.gated(layout="blocks")
    D = torch.empty(4, 3)
    args = GemmArguments(rand(4, 8), rand(8, 6), D,
                         epilogue=EpilogueArguments(CONCAT, bias_gate=rand(3), bias_up=rand(3),
                                                    D=D))
    text = to_source(args.dag)
    assert "layout='concatenated'" in text and parse_epilogue(text).gated == "concatenated"
