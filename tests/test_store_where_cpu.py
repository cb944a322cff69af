"""Conditional stores (``D = store_where(cond, value)``) on the CPU tier: the portable
kernel under Triton's interpreter writes D where cond holds and leaves its other elements
as the buffer had them, against an independent torch reading; every candidate, conditions
of every space, batched and grouped problems, ``Kernel.verify``; the frontend's errors;
the TMA families' refusal; no derivative yet."""

from __future__ import annotations

import pytest
import torch

import evtfuse
from evtfuse import EpilogueArguments, EpilogueError, GemmArguments

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="CPU-interpreter tier; tests/gpu/test_gpu_kernels.py on a GPU")

GEN = torch.Generator().manual_seed(36)


def rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=GEN).to(dtype)


CLIP = """def clip(accum, C, bias):
    F = accum + bias
    D = store_where(F > C, F)
    G = F * 2.0
    return D, G"""


def test_every_candidate_keeps_what_the_condition_leaves():
    M, N, K = 37, 40, 24
    A, B, C, bias = rand(M, K), rand(K, N), rand(M, N), rand(N)
    old = rand(M, N)
    D, G = old.clone(), torch.empty(M, N)
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(CLIP, C=C, bias=bias, D=D, G=G))
    F = A @ B + bias
    want = torch.where(F > C, F, old)
    kernels = evtfuse.get_kernels(args)
    assert len(kernels) >= 2
    for k in kernels:
        D.copy_(old)
        G.fill_(float("nan"))
        k.run(args)
        torch.testing.assert_close(D, want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(G, 2.0 * F, atol=1e-5, rtol=1e-5)
        assert torch.equal(D[~(F > C)], old[~(F > C)])  # untouched, bit for bit
        assert k.verify(args), k.verify(args)  # poisoned: NaN kept where nothing is stored


@pytest.mark.parametrize("cond,expect", [
    ("row_index() < 5.0", lambda F, r, c, x: (r < 5).expand_as(F)),  # per row
    ("col_index() >= 3.0", lambda F, r, c, x: (c >= 3).expand_as(F)),  # per column
    ("x", lambda F, r, c, x: (x != 0).expand_as(F)),  # a float per-row operand: nonzero
    ("(accum > 0.0) & (x > 0.0)", lambda F, r, c, x: (F > 0) & (x > 0)),
])
def test_conditions_of_every_space(cond, expect):
    M, N, K = 19, 21, 16
    A, B = rand(M, K), rand(K, N)
    x = (rand(M, 1) > 0).float() * rand(M, 1)
    src = f"def e(accum, x):\n    D = store_where({cond}, accum * 3.0)\n    return D"
    D = torch.full((M, N), -7.0)
    out = evtfuse.gemm(A, B, src, x=x, D=D)
    assert out is D
    F = A @ B
    r, c = torch.arange(M).view(M, 1), torch.arange(N).view(1, N)
    mask = expect(F, r, c, x)
    torch.testing.assert_close(D, torch.where(mask, 3.0 * F, torch.tensor(-7.0)),
                               atol=1e-5, rtol=1e-5)


def test_batched_and_in_place_of_an_operand():
    """D given as the operand C's own buffer: where the condition fails, C's value stays."""
    L, M, N, K = 2, 9, 12, 8
    A, B, C = rand(L, M, K), rand(L, K, N), rand(L, M, N)
    old = C.clone()
    evtfuse.gemm(A, B, "def e(accum, C):\n    D = store_where(accum > C, accum)\n    return D",
                 C=C, D=C)
    acc = A @ B
    torch.testing.assert_close(C, torch.where(acc > old, acc, old), atol=1e-5, rtol=1e-5)


def test_grouped():
    sizes, K, N = [5, 0, 9], 16, 12
    T = sum(sizes) + 2
    A, B = rand(T, K), rand(len(sizes), K, N)
    offs = torch.tensor(sizes).cumsum(0).to(torch.int32)
    D = torch.full((T, N), 5.0)
    evtfuse.grouped_gemm(A, B, offs, "def e(accum):\n    D = store_where(accum < 0.0, accum)\n"
                         "    return D", D=D)
    start = 0
    for g, end in enumerate(offs.tolist()):
        acc = A[start:end] @ B[g]
        torch.testing.assert_close(D[start:end], torch.where(acc < 0, acc, torch.tensor(5.0)),
                                   atol=1e-5, rtol=1e-5)
        start = end
    assert (D[start:] == 5.0).all()


def test_tma_families_refuse_with_a_reason():
    M, N, K = 16, 16, 16
    A, B, D = rand(M, K), rand(K, N), torch.empty(M, N)
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(
        "def e(accum): D = store_where(accum > 0.0, accum); return D", D=D))
    text = evtfuse.explain(args, cc=90)
    assert "hopper: refused: conditional stores (store_where: D) run in the portable family" \
        in text
    assert "portable: supported" in text


@pytest.mark.parametrize("src,given,match", [
    ("def e(accum):\n    D = store_where(accum > 0.0, accum) * 2.0\n    return D", "D",
     r"line 2.*store_where\(\.\.\.\) must be the whole value of an assignment"),
    ("def e(accum):\n    S = store_where(accum > 0.0, accum)\n    D = S + 1.0\n    return D, S",
     "DS", r"'S' is a conditional store \(store_where\); it can only be returned"),
    ("def e(accum):\n    S = store_where(accum > 0.0, accum)\n    D = accum\n    return D", "D",
     r"'S' = store_where\(\.\.\.\) is a conditional store whose result is never returned"),
    ("def e(accum):\n    D = accum\n    R = store_where(accum > 0.0, accum)\n    return D, R",
     "Drow", r"output R must be a full output buffer you give .* it has shape \(8, 1\)"),
    ("def e(accum):\n    D = accum\n    R = store_where(accum > 0.0, accum)\n    return D, R",
     "Dnone", r"output R must be a full output buffer you give .* it is None"),
])
def test_source_errors(src, given, match):
    M, N, K = 8, 6, 4
    A, B = rand(M, K), rand(K, N)
    outs = {"D": torch.empty(M, N)}
    if "S" in given:
        outs["S"] = torch.empty(M, N)
    if given.endswith("row"):
        outs["R"] = torch.empty(M, 1)
    if given.endswith("none"):
        outs["R"] = None
    with pytest.raises(EpilogueError, match=match):
        EpilogueArguments(src, **outs).bind((1, M, N))


def test_an_output_gemm_would_allocate_is_refused():
    """gemm allocates the outputs it is not given; a conditional store's unwritten elements
    would then be whatever that memory held: gemm asks for the buffer instead."""
    A, B = rand(8, 4), rand(4, 6)
    with pytest.raises(EpilogueError, match=r"output D is a conditional store.*pass D="):
        evtfuse.gemm(A, B, "def e(accum): D = store_where(accum > 0.0, accum); return D")


def test_no_derivative_yet():
    A = rand(8, 4).requires_grad_(True)
    B = rand(4, 6)
    with pytest.raises(EpilogueError, match=r"store_where\(\.\.\.\) in the value of 'D' has no "
                       r"derivative"):
        evtfuse.gemm(A, B, "def e(accum): D = store_where(accum > 0.0, accum); return D",
                     D=torch.zeros(8, 6))


def test_special_values_are_stored_unchanged_where_the_condition_holds():
    """Conditions and values made of special floats (+-0, +-inf, NaN, subnormals): a NaN
    condition is nonzero, so stored; every stored value bit for bit."""
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-40,
                            -1e-40, 3.4e38, -1.0, 1.0])
    M, N = special.numel(), special.numel()
    x = special.view(M, 1).expand(M, N).contiguous()  # per-row conditions
    C = special.view(1, N).expand(M, N).contiguous()  # values along the columns
    A, B = torch.zeros(M, 4), torch.zeros(4, N)  # accum = 0
    old = torch.full((M, N), 12.5)
    D = old.clone()
    evtfuse.gemm(A, B, "def e(accum, x, C):\n    D = store_where(x, C + accum)\n    return D",
                 x=x, C=C, D=D)
    want = torch.where(x != 0, C + 0.0, old)
    assert torch.equal(D.isnan(), want.isnan())
    ok = ~want.isnan()
    assert torch.equal(D[ok], want[ok]) and torch.equal(D[ok].signbit(), want[ok].signbit())
