"""Gradients of grouped GEMMs over K (``evtfuse.grouped_gemm`` with A (M, T), B (T, N), the
result (G, M, N); ``runtime.grouped_autograd``) on the CPU tier: against torch autograd of
a per-group loop of plain torch, for A, B and every operand kind of the batched rule (per
group and shared by the groups), a reduction output, both backward modes, empty groups and
offs[-1] < T (A's columns and B's rows there get zero); A and B in either memory order
(the gradients in theirs); a subset of inputs; a gated epilogue (B (T, 2N)); finite
differences (gradcheck); torch.compile of a training step."""

from __future__ import annotations

import pytest
import torch

import evtfuse
from grouped_cases import grads_of  # tests/ is on the path (its conftest.py)

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="CPU-interpreter tier; tests/gpu/test_gpu_grouped.py on a GPU")

GEN = torch.Generator().manual_seed(33)
F = torch.nn.functional
TOL = dict(atol=2e-4, rtol=2e-4)

EPI = """def e(accum, C, r, c, S, v, s, alpha):
    D = gelu_tanh(alpha * accum + c) * r + C * s
    E = D * S + v
    R = sum(E * D)
    return D, E, R"""


def rand(*shape):
    return torch.randn(*shape, generator=GEN)


def offs_of(sizes) -> torch.Tensor:
    return torch.tensor(sizes, dtype=torch.int32).cumsum(0).to(torch.int32)


def spans(offs):
    ends = offs.tolist()
    return list(zip([0] + ends[:-1], ends))


def reference(A, B, offs, C, r, c, S, v, s, alpha):
    """(D, E, R), (G, M, N) / (G, M, 1), group by group in torch."""
    Ds, Es, Rs = [], [], []
    for g, (lo, hi) in enumerate(spans(offs)):
        D = F.gelu(alpha * (A[:, lo:hi] @ B[lo:hi]) + c[g], approximate="tanh") * r[g] \
            + C[g] * s[g]
        E = D * S + v
        Ds.append(D)
        Es.append(E)
        Rs.append((E * D).sum(-1, keepdim=True))
    return torch.stack(Ds), torch.stack(Es), torch.stack(Rs)


def inputs(G, M, T, N):
    named = dict(A=rand(M, T), B=rand(T, N), C=rand(G, M, N), r=rand(G, M, 1), c=rand(G, 1, N),
                 S=rand(M, N), v=rand(N), s=rand(G, 1, 1))
    return {k: t.requires_grad_(True) for k, t in named.items()}


CASES = {  # group sizes over T, T (>= their sum: columns past offs[-1] are in no group)
    "ragged_with_empty": ([7, 0, 12, 1], 20),
    "past_the_end": ([5, 6], 17),
    "empty_first_last": ([0, 9, 0], 9),
    "one_group": ([11], 11),
}


@pytest.mark.parametrize("mode", ["recompute", "save"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.cover("case")
def test_every_operand_and_output_against_torch(case, mode):
    sizes, T = CASES[case]
    G, M, N = len(sizes), 6, 10
    offs = offs_of(sizes)
    x = inputs(G, M, T, N)
    ops = {k: t for k, t in x.items() if k not in ("A", "B")}
    gD, gE, gR = rand(G, M, N), rand(G, M, N), rand(G, M, 1)
    D, E, R = evtfuse.grouped_gemm(x["A"], x["B"], offs, EPI, **ops, alpha=0.5, backward=mode,
                                   R=torch.empty(G, M, 1))
    got = grads_of((D * gD).sum() + (E * gE).sum() + (R * gR).sum(), x)
    rD, rE, rR = reference(x["A"], x["B"], offs, **ops, alpha=0.5)
    torch.testing.assert_close(D, rD, **TOL)
    want = grads_of((rD * gD).sum() + (rE * gE).sum() + (rR * gR).sum(), x)
    for name in x:
        torch.testing.assert_close(got[name], want[name], **TOL, msg=lambda m: f"{name}: {m}")
    end = int(offs[-1])
    assert (got["A"][:, end:] == 0).all() and (got["B"][end:] == 0).all()  # in no group


def test_gradients_in_the_inputs_memory_order():
    """The MoE weight gradient's inputs: A = x.t() (x (T, M) tokens), B = dY (T, N); and a
    row-major A with a column-major B (``W.t()``): each gradient has its input's strides
    (no copy by AccumulateGrad), and its values are torch's."""
    sizes, T, M, N = [3, 0, 8], 13, 5, 7
    offs = offs_of(sizes)
    epi = "def e(accum): D = relu(accum); return D"
    for A, B in ((rand(T, M).t(), rand(T, N)), (rand(M, T), rand(N, T).t())):
        A.requires_grad_(True)
        B.requires_grad_(True)
        gA, gB = torch.autograd.grad(evtfuse.grouped_gemm(A, B, offs, epi).square().sum(), (A, B))
        assert gA.stride() == A.stride() and gB.stride() == B.stride(), (gA.stride(), gB.stride())
        ref = torch.stack([torch.relu(A[:, lo:hi] @ B[lo:hi]) for lo, hi in spans(offs)])
        wA, wB = torch.autograd.grad(ref.square().sum(), (A, B))
        torch.testing.assert_close(gA, wA, **TOL)
        torch.testing.assert_close(gB, wB, **TOL)


def test_a_subset_of_inputs():
    """Only B wants a gradient; then only an operand (no dA, no dB: the backward kernel
    computes that operand's gradient alone)."""
    sizes, T, M, N = [4, 6], 10, 5, 8
    offs = offs_of(sizes)
    A, B, c = rand(M, T), rand(T, N).requires_grad_(True), rand(2, 1, N)
    epi = "def e(accum, c): D = silu(accum + c); return D"
    (gB,) = torch.autograd.grad(evtfuse.grouped_gemm(A, B, offs, epi, c=c).sum(), (B,))
    ref = torch.stack([F.silu(A[:, lo:hi] @ B[lo:hi] + c[g]) for g, (lo, hi) in enumerate(spans(offs))])
    torch.testing.assert_close(gB, torch.autograd.grad(ref.sum(), (B,))[0], **TOL)
    B.requires_grad_(False)
    c.requires_grad_(True)
    (gc,) = torch.autograd.grad(evtfuse.grouped_gemm(A, B, offs, epi, c=c).sum(), (c,))
    ref = torch.stack([F.silu(A[:, lo:hi] @ B[lo:hi] + c[g]) for g, (lo, hi) in enumerate(spans(offs))])
    torch.testing.assert_close(gc, torch.autograd.grad(ref.sum(), (c,))[0], **TOL)


@pytest.mark.parametrize("mode", ["recompute", "save"])
def test_gated_epilogue(mode):
    """B (T, 2N), gate and up interleaved: dA and dB from the interleaved dAccum."""
    sizes, T, M, N = [6, 0, 5], 13, 4, 6
    offs = offs_of(sizes)
    A, B = rand(M, T).requires_grad_(True), rand(T, 2 * N).requires_grad_(True)
    bg = rand(N).requires_grad_(True)
    epi = "def e(accum, bg):\n    g, u = pairs(accum)\n    D = silu(g + bg) * u\n    return D"
    D = evtfuse.grouped_gemm(A, B, offs, epi, bg=bg, backward=mode)
    gy = rand(len(sizes), M, N)
    got = torch.autograd.grad((D * gy).sum(), (A, B, bg))
    acc = torch.stack([A[:, lo:hi] @ B[lo:hi] for lo, hi in spans(offs)])
    ref = F.silu(acc[..., 0::2] + bg) * acc[..., 1::2]
    want = torch.autograd.grad((ref * gy).sum(), (A, B, bg))
    for name, a, b in zip(("A", "B", "bg"), got, want):
        torch.testing.assert_close(a, b, **TOL, msg=lambda m: f"{name}: {m}")


@pytest.mark.filterwarnings("ignore:Input #:UserWarning")  # gradcheck prefers float64
@pytest.mark.parametrize("fast_mode", [True, pytest.param(False, marks=pytest.mark.slow)],
                         ids=["fast_mode", "whole_jacobian"])
def test_gradcheck_in_fp32(fast_mode):
    """Finite differences (fp32: the kernels take no float64 A and B), loose tolerances;
    a group past T's end and an empty one. gradcheck's fast mode (a random projection of
    the Jacobian) in the quick tier, the whole Jacobian in the full one."""
    offs = offs_of([2, 0, 3])
    A, B = rand(3, 6).requires_grad_(True), rand(6, 2).requires_grad_(True)
    c = rand(3, 1, 2).requires_grad_(True)

    def f(A, B, c):
        return evtfuse.grouped_gemm(A, B, offs, "def e(accum, c): D = tanh(accum) * c; return D",
                                    c=c, backward="recompute")

    assert torch.autograd.gradcheck(f, (A, B, c), eps=1e-3, atol=1e-2, rtol=1e-2,
                                    fast_mode=fast_mode)


def test_compiled_training_step_matches_eager():
    sizes, T, M, N = [4, 0, 7], 12, 5, 6
    offs = offs_of(sizes)
    A, B = rand(M, T).requires_grad_(True), rand(T, N).requires_grad_(True)
    bias = rand(3, 1, N).requires_grad_(True)
    epi = "def e(accum, bias): D = gelu_tanh(accum + bias); return D"
    wanted = {"A": A, "B": B, "bias": bias}
    want = grads_of(evtfuse.grouped_gemm(A, B, offs, epi, bias=bias).square().sum(), wanted)

    import torch._dynamo

    torch._dynamo.reset()
    fwd = torch.compile(lambda A, B, offs, bias: evtfuse.grouped_gemm(A, B, offs, epi, bias=bias),
                        fullgraph=True, backend="aot_eager")
    got = grads_of(fwd(A, B, offs, bias).square().sum(), wanted)
    for k in wanted:
        torch.testing.assert_close(got[k], want[k], atol=1e-5, rtol=1e-5, msg=lambda m: f"{k}: {m}")
