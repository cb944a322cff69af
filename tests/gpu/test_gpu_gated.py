"""GPU tier: gated epilogues (``gate, up = pairs(accum)``, interleaved layout; the hopper and
portable families, and the gluon family for the concatenated layout) at moderate sizes in bf16: SwiGLU and GeGLU with and without biases, the
weight passed as ``W.t()`` from ``evtfuse.interleave_gate_up``, every config of both families
the tuner may pick, against torch's two separate projections in fp32 and the reference
evaluator; the MLP block's up projection (three stored outputs, every candidate);
a training step's gradients in both backward modes; the concatenated layout
(``pairs(accum, layout="concatenated")``), dense and a mixture of experts' training step;
every candidate of the hopper family's grouped kernel, in both layouts.
Run with ``PYTHONPATH=src python3 -m pytest -m gpu tests/gpu/test_gpu_gated.py``.
"""

from __future__ import annotations

import pytest
import torch

import evtfuse
from evtfuse import EpilogueArguments, GemmArguments, library
from evtfuse.reference import evaluate

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

F = torch.nn.functional


def _rand(*shape, dtype=torch.bfloat16, seed=0, scale=1.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(*shape, device="cuda", generator=g) * scale).to(dtype)


def _expected(x, Wg, Wu, act, bg=None, bu=None):
    g, u = x.float() @ Wg.float().T, x.float() @ Wu.float().T
    if bg is not None:
        g, u = g + bg.float(), u + bu.float()
    return act(g) * u


@pytest.mark.parametrize("kind,act", [("swiglu", F.silu), ("geglu", F.gelu)])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("M,K,N", [(1000, 512, 1408), (4096, 1024, 2048)])
def test_gated_gemm_bf16(kind, act, bias, M, K, N):
    x = _rand(M, K, seed=1, scale=0.5)
    Wg, Wu = _rand(N, K, seed=2, scale=0.05), _rand(N, K, seed=3, scale=0.05)
    W = evtfuse.interleave_gate_up(Wg, Wu)
    ops = dict(bias_gate=_rand(N, seed=4), bias_up=_rand(N, seed=5)) if bias else {}
    D = evtfuse.gemm(x, W.t(), library.gated(kind, bias=bias), **ops)
    assert D.shape == (M, N) and D.dtype == torch.bfloat16
    want = _expected(x, Wg, Wu, act, ops.get("bias_gate"), ops.get("bias_up"))
    torch.testing.assert_close(D.float(), want, atol=2e-2, rtol=2e-2)


def _families(args) -> set:
    """The families whose kernels a dense gated ``args`` must be offered: hopper and
    portable, and gluon for the concatenated layout over a K-major B (W.t())."""
    gluon = args.optimized_dag.concatenated and args.B.stride(-1) != 1
    return {"hopper", "portable"} | ({"gluon"} if gluon else set())


def _every_kernel_gives(args, D, want) -> None:
    """Every kernel offered for dense gated ``args`` (every family of ``_families``), each
    on a poisoned D, gives ``want``."""
    kernels = evtfuse.get_kernels(args)
    assert {k.family.name for k in kernels} == _families(args), evtfuse.explain(args)
    for k in kernels:
        D.fill_(float("nan"))
        k.run(args)
        torch.cuda.synchronize()
        torch.testing.assert_close(D.float(), want, atol=2e-2, rtol=2e-2, msg=str(k))


def test_every_config_matches_the_reference():
    M, K, N = 777, 256, 600  # edges in M and N for every tile
    x, W = _rand(M, K, seed=6, scale=0.5), _rand(2 * N, K, seed=7, scale=0.05)
    D = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    args = GemmArguments(x, W.t(), D, epilogue=EpilogueArguments(library.SWIGLU, D=D))
    want = evaluate(args)["D"].float()
    _every_kernel_gives(args, D, want)


@pytest.mark.parametrize("mode", ["save", "recompute"])
def test_swiglu_training_step_gradients(mode):
    """Gradients of a SwiGLU up-projection with biases (bf16): x, W_gate and W_up through
    the interleaved weight, both biases, against torch autograd in fp32 from the same bf16
    values (save mode: the backward reads the saved halves; recompute: a gated backward
    kernel, the biases' gradients summed by torch)."""
    M, K, N = 2048, 1024, 1408
    x = _rand(M, K, seed=11, scale=0.5).requires_grad_()
    Wg = _rand(N, K, seed=12, scale=0.05).requires_grad_()
    Wu = _rand(N, K, seed=13, scale=0.05).requires_grad_()
    bg, bu = _rand(N, seed=14).requires_grad_(), _rand(N, seed=15).requires_grad_()
    leaves = (x, Wg, Wu, bg, bu)
    g = _rand(M, N, seed=16)
    W = evtfuse.interleave_gate_up(Wg, Wu)
    evtfuse.gemm(x, W.t(), library.gated("swiglu", bias=True), bias_gate=bg, bias_up=bu,
                 backward=mode).backward(g)
    got = [t.grad.float() for t in leaves]
    ref = [t.detach().float().requires_grad_() for t in leaves]
    rx, rg, ru, rbg, rbu = ref
    (F.silu(rx @ rg.T + rbg) * (rx @ ru.T + rbu)).backward(g.float())
    for name, a, r in zip(("x", "W_gate", "W_up", "bias_gate", "bias_up"), got, ref):
        err = ((a - r.grad).norm() / r.grad.norm()).item()
        assert err < 1e-2, f"{name}: relative error {err:.2e}"


# -- the concatenated layout: pairs(accum, layout="concatenated"), [W_gate; W_up] as it is

@pytest.mark.parametrize("M,K,N", [(1000, 512, 1408), (777, 256, 600)])
def test_concatenated_every_config(M, K, N):
    """A [W_gate; W_up] (2N, K) weight passed as W.t() with no interleaving: every
    config of both families against torch's two projections (edges in M and N for every
    tile)."""
    x = _rand(M, K, seed=21, scale=0.5)
    Wg, Wu = _rand(N, K, seed=22, scale=0.05), _rand(N, K, seed=23, scale=0.05)
    bg, bu = _rand(N, seed=24), _rand(N, seed=25)
    W = torch.cat((Wg, Wu))
    D = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    epi = EpilogueArguments(library.gated("swiglu", bias=True, layout="concatenated"),
                            bias_gate=bg, bias_up=bu, D=D)
    args = GemmArguments(x, W.t(), D, epilogue=epi)
    want = _expected(x, Wg, Wu, F.silu, bg, bu)
    _every_kernel_gives(args, D, want)


@pytest.mark.parametrize("mode", ["save", "recompute"])
def test_concatenated_moe_training_step_gradients(mode):
    """A mixture of experts' SwiGLU up-projection over experts' concatenated (G, 2N, K)
    weights (bf16, a group empty): gradients of x, the weight (its gate and up halves),
    the routing weights, against torch autograd in fp32 from the same bf16 values."""
    G, K, N = 8, 512, 704
    sizes = [300, 0, 517, 64, 1, 900, 250, 16]
    T = sum(sizes)
    x = _rand(T, K, seed=31, scale=0.5).requires_grad_()
    W = _rand(G, 2 * N, K, seed=32, scale=0.05).requires_grad_()
    w = _rand(T, 1, dtype=torch.float32, seed=33).abs().requires_grad_()
    offs = torch.tensor(sizes, device="cuda").cumsum(0).to(torch.int32)
    src = ("def e(accum, w):\n    gate, up = pairs(accum, layout=\"concatenated\")\n"
           "    D = silu(gate) * up * w\n    return D")
    g = _rand(T, N, seed=34)
    evtfuse.grouped_gemm(x, W.mT, offs, src, w=w, backward=mode).backward(g)
    got = [t.grad.float() for t in (x, W, w)]
    ref = [t.detach().float().requires_grad_() for t in (x, W, w)]
    rx, rW, rw = ref
    start, outs = 0, []
    for e, n in enumerate(sizes):
        h = rx[start:start + n] @ rW[e].T
        outs.append(F.silu(h[:, :N]) * h[:, N:] * rw[start:start + n])
        start += n
    torch.cat(outs).backward(g.float())
    for name, a, r in zip(("x", "W", "w"), got, ref):
        err = ((a - r.grad).norm() / r.grad.norm()).item()
        assert err < 1e-2, f"{name}: relative error {err:.2e}"


# -- grouped over M in the hopper family (persistent, TMA): every candidate, both layouts

@pytest.mark.parametrize("layout", ["interleaved", "concatenated"])
@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_every_hopper_grouped_gated_candidate(layout, dt):
    """A mixture of experts' SwiGLU up-projection over (G, 2N, K) expert weights passed
    as W.mT (gate and up interleaved, or concatenated as torch._grouped_mm's users keep
    them): per-group biases of gate and up, routing weights, a full operand, gate itself
    as a second output; ragged and empty groups, rows past offs[-1], N no multiple of the
    tiles' output columns."""
    from gpu_helpers import check_grouped_family

    G, K, N = 8, 512, 704
    sizes = [300, 0, 517, 64, 1, 900, 250, 16]
    T = sum(sizes) + 29
    src = (f"def e(accum, bias_gate, bias_up, w, C):\n"
           f"    gate, up = pairs(accum, layout=\"{layout}\")\n"
           "    D = silu(gate + bias_gate) * (up + bias_up) * w + C\n"
           "    E = gate\n    return D, E")
    x = _rand(T, K, dtype=dt, seed=71, scale=0.5)
    W = _rand(G, 2 * N, K, dtype=dt, seed=72, scale=0.05)
    ops = dict(bias_gate=_rand(G, 1, N, dtype=dt, seed=73), bias_up=_rand(G, 1, N, dtype=dt, seed=74),
               w=_rand(T, 1, dtype=torch.float32, seed=75).abs(), C=_rand(T, N, dtype=dt, seed=76))
    outs = {n: torch.empty(T, N, dtype=dt, device="cuda") for n in ("D", "E")}
    offs = torch.tensor(sizes, device="cuda").cumsum(0).to(torch.int32)
    names = check_grouped_family(src, x, W.mT, offs, outs, **ops)
    assert len(names) >= 8, names


@pytest.mark.parametrize("layout", ["interleaved", "concatenated"])
def test_mlp_up_projection_every_candidate(layout):
    """``GatedMLP``'s up projection as it runs (``runtime.mlp.up_source``): D = silu(gate) *
    up and the pre-activations G and U stored for the backward, into the two halves of one
    (M, 2N) buffer (strided views, as the block keeps them); every candidate (hopper and
    portable), each output on poisoned buffers, against the reference evaluator; M and N
    off the tiles."""
    from evtfuse.runtime.mlp import _parts, up_source

    M, K, N = 1000, 512, 1400
    x = _rand(M, K, seed=31, scale=0.5)
    Wg, Wu = _rand(N, K, seed=32, scale=0.05), _rand(N, K, seed=33, scale=0.05)
    W = evtfuse.interleave_gate_up(Wg, Wu) if layout == "interleaved" else torch.cat((Wg, Wu))
    src = up_source("silu", True, False, torch.bfloat16)
    if layout == "interleaved":
        src = src.replace('pairs(accum, layout="concatenated")', "pairs(accum)")
    p = torch.empty(M, 2 * N, device="cuda", dtype=torch.bfloat16)
    D = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    outs = dict(D=D, **_parts(p, True, N))
    args = GemmArguments(x, W.t(), D, epilogue=EpilogueArguments(src, **outs))
    want = evaluate(args)
    kernels = evtfuse.get_kernels(args)
    assert {k.family.name for k in kernels} == _families(args), evtfuse.explain(args)
    for k in kernels:
        for t in outs.values():
            t.fill_(float("nan"))
        k.run(args)
        torch.cuda.synchronize()
        for name, t in outs.items():
            torch.testing.assert_close(t.float(), want[name].float(), atol=2e-2, rtol=2e-2,
                                       msg=lambda m: f"{k.name} {name}: {m}")
