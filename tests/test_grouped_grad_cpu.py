"""Gradients of grouped GEMMs over M (``evtfuse.grouped_gemm``, ``runtime.grouped_autograd``)
on the CPU tier: against torch autograd of a per-group loop of plain torch, for A, B and
every operand kind, both backward modes, ragged and empty groups and rows past offs[-1];
gradients into a subset of outputs and inputs; a given output's rows of no group kept;
torch.compile of a training step; a bad ``backward`` (gated experts' gradients:
test_gated_cpu.py; groups over K: test_grouped_kgrad_cpu.py)."""

from __future__ import annotations

import pytest
import torch

import evtfuse
from grouped_cases import grads_of  # tests/ is on the path (its conftest.py)

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="CPU-interpreter tier; tests/gpu/test_gpu_grouped.py on a GPU")

GEN = torch.Generator().manual_seed(35)
F = torch.nn.functional

MOE = """def moe(accum, bias, w, s, C, cb, alpha):
    H = silu(accum + bias) * s
    D = H * w + alpha * C * cb
    R = w * 2.0
    return D, H, R"""


def rand(*shape):
    return torch.randn(*shape, generator=GEN)


def offs_of(sizes) -> torch.Tensor:
    return torch.tensor(sizes, dtype=torch.int32).cumsum(0).to(torch.int32)


def reference(A, B, offs, bias, w, s, C, cb, alpha):
    """(D, H, R) over the rows of the groups, group by group in torch."""
    Ds, Hs, start = [], [], 0
    for g, end in enumerate(offs.tolist()):
        H = F.silu(A[start:end] @ B[g] + bias[g]) * s[g]
        Hs.append(H)
        Ds.append(H * w[start:end] + alpha * C[start:end] * cb)
        start = end
    return torch.cat(Ds), torch.cat(Hs), w[:start] * 2.0


def inputs(sizes, T, K=16, N=12):
    G = len(sizes)
    named = dict(A=rand(T, K), B=rand(G, K, N), bias=rand(G, 1, N), w=rand(T, 1),
                 s=rand(G, 1, 1), C=rand(T, N), cb=rand(N))
    return {k: v.requires_grad_(True) for k, v in named.items()}


CASES = {"ragged": ([7, 0, 20, 1], 31), "rows_past_end": ([5, 9], 20),
         "empty_first_last": ([0, 13, 0], 13), "one_group": ([11], 11)}


@pytest.mark.parametrize("mode", ["recompute", "save"])
@pytest.mark.parametrize("case", list(CASES))
def test_every_operand_and_output_against_torch(case, mode):
    sizes, T = CASES[case]
    offs = offs_of(sizes)
    x = inputs(sizes, T)
    end = int(offs[-1])
    gD, gH, gR = rand(T, 12), rand(T, 12), rand(T, 1)
    ops = {k: v for k, v in x.items() if k not in ("A", "B")}
    D, H, R = evtfuse.grouped_gemm(x["A"], x["B"], offs, MOE, **ops, alpha=0.5, backward=mode,
                                   R=torch.empty(T, 1))  # a per-row output
    got = grads_of((D[:end] * gD[:end]).sum() + (H[:end] * gH[:end]).sum()
                   + (R[:end] * gR[:end]).sum(), x)
    rD, rH, rR = reference(x["A"], x["B"], offs, **ops, alpha=0.5)
    want = grads_of((rD * gD[:end]).sum() + (rH * gH[:end]).sum() + (rR * gR[:end]).sum(), x)
    for name in x:
        torch.testing.assert_close(got[name], want[name], atol=2e-4, rtol=2e-4,
                                   msg=lambda m: f"{name}: {m}")
    assert (got["A"][end:] == 0).all()  # rows of no group: no gradient


def test_a_subset_of_outputs_and_inputs():
    """A gradient into H only, wanted for B and bias only (A, w and C do not require grad)."""
    sizes, T = [6, 0, 10], 16
    offs = offs_of(sizes)
    x = inputs(sizes, T)
    for k in ("A", "w", "C", "s", "cb"):
        x[k].requires_grad_(False)
    ops = {k: v for k, v in x.items() if k not in ("A", "B")}
    _, H, _ = evtfuse.grouped_gemm(x["A"], x["B"], offs, MOE, **ops, alpha=1.0)
    got = grads_of(H.square().sum(), {"B": x["B"], "bias": x["bias"]})
    _, rH, _ = reference(x["A"], x["B"], offs, **ops, alpha=1.0)
    want = grads_of(rH.square().sum(), {"B": x["B"], "bias": x["bias"]})
    for name in ("B", "bias"):
        torch.testing.assert_close(got[name], want[name], atol=2e-4, rtol=2e-4)
    assert x["A"].grad is None and x["w"].grad is None


def test_given_output_keeps_rows_of_no_group():
    """A given D is written by a differentiable copy that keeps its rows past offs[-1]."""
    A, B = rand(10, 8).requires_grad_(), rand(2, 8, 6)
    offs = offs_of([3, 4])
    D = torch.full((10, 6), 7.0)
    evtfuse.grouped_gemm(A, B, offs, "def e(accum): D = relu(accum); return D", D=D)
    assert (D[7:] == 7.0).all() and D.requires_grad
    D.sum().backward()
    want = torch.cat([(A[:3] @ B[0] > 0).float() @ B[0].T, (A[3:7] @ B[1] > 0).float() @ B[1].T])
    torch.testing.assert_close(A.grad[:7], want, atol=1e-5, rtol=1e-5)
    assert (A.grad[7:] == 0).all()


def test_compiled_training_step_matches_eager():
    sizes, T = [4, 9, 3], 16
    offs = offs_of(sizes)
    x = inputs(sizes, T)
    epi = "def e(accum, bias, w): D = gelu_tanh(accum + bias) * w; return D"

    def step(A, B, offs, bias, w):
        evtfuse.grouped_gemm(A, B, offs, epi, bias=bias, w=w).square().sum().backward()

    import torch._dynamo

    args = (x["A"], x["B"], offs, x["bias"], x["w"])
    wanted = {k: x[k] for k in ("A", "B", "bias", "w")}
    step(*args)
    want = {k: t.grad.clone() for k, t in wanted.items()}
    torch._dynamo.reset()
    for t in wanted.values():
        t.grad = None
    fwd = torch.compile(lambda A, B, offs, bias, w: evtfuse.grouped_gemm(
        A, B, offs, epi, bias=bias, w=w), fullgraph=True, backend="aot_eager")
    fwd(*args).square().sum().backward()
    for k, t in wanted.items():
        torch.testing.assert_close(t.grad, want[k], atol=1e-5, rtol=1e-5, msg=lambda m: f"{k}: {m}")


def test_refusals_never_detach():
    offs = offs_of([4, 4])
    with pytest.raises(evtfuse.EpilogueError, match="backward must be"):
        evtfuse.grouped_gemm(rand(8, 16), rand(2, 16, 12), offs, backward="later")
    with torch.no_grad():  # inference: no gradient asked, none refused
        D = evtfuse.grouped_gemm(rand(6, 8).requires_grad_(), rand(8, 5), offs)
    assert not D.requires_grad


def test_expert_weight_gradient_in_the_weights_memory_order():
    """An expert weight (G, N, K) passed transposed (``W.mT``, as an MoE layer does) gets a
    contiguous gradient (no copy by AccumulateGrad), equal to torch's per-group product."""
    sizes, K, N = [6, 0, 9], 16, 12
    A, W = rand(sum(sizes), K), rand(len(sizes), N, K).requires_grad_(True)
    offs = offs_of(sizes)
    out = evtfuse.grouped_gemm(A, W.mT, offs, "def e(accum): D = relu(accum); return D")
    (gW,) = torch.autograd.grad(out.square().sum(), (W,))
    assert gW.is_contiguous(), gW.stride()
    start = 0
    for g, end in enumerate(offs.tolist()):
        h = torch.relu(A[start:end] @ W[g].detach().t())
        torch.testing.assert_close(gW[g], (2 * h).t() @ A[start:end], atol=1e-4, rtol=1e-4)
        start = end
