"""Gated epilogues (``gate, up = pairs(accum)``, interleaved layout) on the CPU tier: the
portable kernel under Triton's interpreter against torch's two separate projections,
the interleave helper, the frontend's parse and its errors, other families' refusals,
gradients (dense and grouped) against torch autograd, and an offline sm_90 compile
(docs/gated.md)."""

from __future__ import annotations

import pytest
import torch

import evtfuse
from evtfuse import EpilogueArguments, EpilogueError, GemmArguments, UnsupportedError, library
from evtfuse.frontend import parse_epilogue
from evtfuse.reference import evaluate
from offline_run import run_offline

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="CPU-interpreter tier; tests/gpu/test_gpu_gated.py on a GPU")

GEN = torch.Generator().manual_seed(34)
F = torch.nn.functional


def rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=GEN).to(dtype)


def swiglu(accum, bias_gate, bias_up):
    gate, up = pairs(accum)
    D = silu(gate + bias_gate) * (up + bias_up)
    return D


def expected(x, Wg, Wu, act, bg=None, bu=None):
    """torch's two projections and the activation (batched weights too: ``mT``)."""
    g = x.float() @ Wg.float().mT
    u = x.float() @ Wu.float().mT
    if bg is not None:
        g, u = g + bg.float(), u + bu.float()
    return act(g) * u


@pytest.mark.parametrize("kind,act", [("swiglu", F.silu), ("geglu", F.gelu)])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("layout", ["interleaved", "concatenated"])
def test_library_gated_against_torch(kind, act, bias, dtype, layout):
    """Both layouts: the interleaved weight, and a [W_gate; W_up] (2N, K) weight as a
    checkpoint holds it (``pairs(accum, layout="concatenated")``)."""
    M, K, N = 37, 40, 26  # odd M, N not a multiple of any tile's half width
    x, Wg, Wu = rand(M, K, dtype=dtype), rand(N, K, dtype=dtype), rand(N, K, dtype=dtype)
    W = evtfuse.interleave_gate_up(Wg, Wu) if layout == "interleaved" else torch.cat((Wg, Wu))
    ops = {}
    if bias:
        ops = dict(bias_gate=rand(N, dtype=dtype), bias_up=rand(N, dtype=dtype))
    D = evtfuse.gemm(x, W.t(), library.gated(kind, bias=bias, layout=layout), tune="none",
                     **ops)
    assert D.shape == (M, N) and D.dtype == dtype
    want = expected(x, Wg, Wu, act, ops.get("bias_gate"), ops.get("bias_up"))
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(D.float(), want, atol=tol * 10, rtol=tol)


def test_every_interpreter_config_and_the_reference():
    M, K, N = 19, 24, 21
    x, Wg, Wu = rand(M, K), rand(N, K), rand(N, K)
    bg, bu = rand(N), rand(N)
    W = evtfuse.interleave_gate_up(Wg, Wu)
    D = torch.empty(M, N)
    args = GemmArguments(x, W.t(), D, epilogue=EpilogueArguments(swiglu, bias_gate=bg,
                                                                 bias_up=bu, D=D))
    want = expected(x, Wg, Wu, F.silu, bg, bu)
    torch.testing.assert_close(evaluate(args)["D"], want, atol=1e-4, rtol=1e-4)
    kernels = evtfuse.get_kernels(args)
    assert len(kernels) == 2
    for k in kernels:
        D.fill_(float("nan"))
        k.run(args)
        torch.testing.assert_close(D, want, atol=1e-4, rtol=1e-4)


def test_operand_kinds_row_index_and_several_outputs():
    """Per-row and full operands, col_index over the output width, gate returned as an
    output of its own, and a row-major B."""
    def epi(accum, C, r, alpha):
        gate, up = pairs(accum)
        G = gate * 1.0
        D = relu(gate) * up * r + alpha * C + col_index()
        return D, G

    M, K, N = 9, 16, 12
    x, Wg, Wu = rand(M, K), rand(N, K), rand(N, K)
    B = evtfuse.interleave_gate_up(Wg, Wu).t().contiguous()  # (K, 2N) row-major
    C, r = rand(M, N), rand(M, 1)
    D, G = evtfuse.gemm(x, B, epi, tune="none", C=C, r=r, alpha=0.5)
    g, u = x @ Wg.T, x @ Wu.T
    torch.testing.assert_close(G, g, atol=1e-4, rtol=1e-4)
    want = F.relu(g) * u * r + 0.5 * C + torch.arange(N, dtype=torch.float32)
    torch.testing.assert_close(D, want, atol=1e-4, rtol=1e-4)


def test_batched():
    L, M, K, N = 2, 7, 16, 10
    x, Wg, Wu = rand(L, M, K), rand(N, K), rand(N, K)
    W = evtfuse.interleave_gate_up(Wg, Wu)
    D = evtfuse.gemm(x, W.t(), library.SWIGLU, tune="none")
    assert D.shape == (L, M, N)
    torch.testing.assert_close(D, expected(x, Wg, Wu, F.silu), atol=1e-4, rtol=1e-4)


def test_interleave_round_trip():
    Wg, Wu = rand(5, 3), rand(5, 3)
    W = evtfuse.interleave_gate_up(Wg, Wu)
    assert W.shape == (10, 3)
    assert torch.equal(W[0], Wg[0]) and torch.equal(W[1], Wu[0]) and torch.equal(W[9], Wu[4])
    g, u = evtfuse.split_gate_up(W)
    assert torch.equal(g, Wg) and torch.equal(u, Wu)
    b = evtfuse.interleave_gate_up(torch.arange(3.0), -torch.arange(3.0))
    assert b.tolist() == [0.0, -0.0, 1.0, -1.0, 2.0, -2.0]
    with pytest.raises(EpilogueError, match="one shape"):
        evtfuse.interleave_gate_up(rand(5, 3), rand(4, 3))
    with pytest.raises(EpilogueError, match="even number"):
        evtfuse.split_gate_up(rand(5, 3))


def test_parse_tuple_assignment():
    p = parse_epilogue(swiglu)
    assert p.gated
    assert [(a.target, a.expr.kind, a.expr.op) for a in p.assignments[:2]] == \
        [("gate", "pair", "gate"), ("up", "pair", "up")]
    assert not parse_epilogue("def e(accum):\n    D = accum\n    return D").gated
    D = torch.empty(3, 4)
    dag = EpilogueArguments(swiglu, bias_gate=rand(4), bias_up=rand(4), D=D).dag
    assert dag.gated and "pairs(accum).gate" in str(dag)


@pytest.mark.parametrize("src,match", [
    ("def e(accum):\n    gate, up = pairs(accum)\n    D = gate * accum\n    return D",
     "line 3.*accum cannot be used in a gated epilogue"),
    ("def e(accum):\n    t = accum * 2.0\n    gate, up = pairs(accum)\n    D = gate\n    return D",
     "line 2.*accum cannot be used in a gated epilogue"),
    ("def e(accum):\n    gate, up = pairs(accum)\n    D = gate\n    return D, accum",
     "accum cannot be used in a gated epilogue"),
    ("def e(accum, C):\n    gate, up = pairs(accum + C)\n    D = gate\n    return D",
     "pairs\\(\\) takes only accum"),
    ("def e(accum):\n    g = pairs(accum)\n    D = g\n    return D", "gives two values"),
    ("def e(accum):\n    D = relu(pairs(accum))\n    return D", "whole value of a statement"),
    ("def e(accum):\n    gate, up = pairs(accum)\n    g, u = pairs(accum)\n    D = g\n    return D",
     "once per epilogue"),
    ("def e(accum):\n    gate, gate2, up = pairs(accum)\n    D = gate\n    return D",
     "gives two values"),
    ("def e(accum, up):\n    gate, up = pairs(accum)\n    D = gate\n    return D",
     "cannot be defined twice"),
])
def test_source_errors(src, match):
    with pytest.raises(EpilogueError, match=match):
        parse_epilogue(src)


def test_odd_columns_refused():
    x, B = rand(4, 8), rand(8, 7)
    with pytest.raises(EpilogueError, match="odd number of columns \\(7\\)"):
        evtfuse.gemm(x, B, library.SWIGLU, tune="none")


def moe_swiglu(accum, bias_gate, bias_up, w, C, scale):
    gate, up = pairs(accum)
    D = silu(gate + bias_gate) * (up + bias_up) * w + scale * C
    return D


@pytest.mark.parametrize("sizes", [[7, 0, 20, 1], [0, 0, 13], [3]])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_grouped_moe_swiglu_against_per_expert_torch(sizes, dtype):
    """A mixture of experts' up-projection: experts' (G, N, K) gate and up weights
    interleaved along N, transposed into grouped_gemm's B; per-expert biases (G, 1, N),
    routing weights per row (T, 1), a full (T, N) operand and a scalar; ragged and empty
    groups, rows past offs[-1] untouched. Against torch, expert by expert, from the
    weights as they were before interleaving."""
    G, K, N = len(sizes), 24, 10
    T = sum(sizes) + 3  # three rows past the last group
    x = rand(T, K, dtype=dtype)
    Wg, Wu = rand(G, N, K, dtype=dtype) / K ** 0.5, rand(G, N, K, dtype=dtype) / K ** 0.5
    W = evtfuse.interleave_gate_up(Wg, Wu, dim=1)  # (G, 2N, K)
    bg, bu = rand(G, 1, N, dtype=dtype), rand(G, 1, N, dtype=dtype)
    w, C = rand(T, 1, dtype=dtype), rand(T, N, dtype=dtype)
    offs = torch.tensor(sizes).cumsum(0).to(torch.int32)
    D = torch.full((T, N), float("nan"), dtype=dtype)
    evtfuse.grouped_gemm(x, W.mT, offs, moe_swiglu, bias_gate=bg, bias_up=bu, w=w, C=C,
                         scale=0.5, D=D)
    start = 0
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.float16 else dict(atol=1e-4, rtol=1e-4)
    for g, end in enumerate(offs.tolist()):
        want = expected(x[start:end], Wg[g], Wu[g], F.silu, bg[g], bu[g]) * w[start:end].float() \
            + 0.5 * C[start:end].float()
        torch.testing.assert_close(D[start:end].float(), want, **tol)
        start = end
    assert D[start:].isnan().all()


def test_grouped_every_interpreter_config_spans_all_columns():
    """Every candidate of a grouped gated problem whose 2N columns of B take several tiles
    of each config (the grid counts B's 2N columns, not the output's N) writes every
    output element."""
    sizes, K, N = [9, 0, 23], 16, 21
    G, T = len(sizes), sum(sizes)
    x = rand(T, K)
    Wg, Wu = rand(G, N, K) / K ** 0.5, rand(G, N, K) / K ** 0.5
    W = evtfuse.interleave_gate_up(Wg, Wu, dim=1)
    offs = torch.tensor(sizes).cumsum(0).to(torch.int32)
    D = torch.empty(T, N)
    epi = EpilogueArguments.unbound("def e(accum):\n    gate, up = pairs(accum)\n"
                                    "    D = silu(gate) * up\n    return D", D=D)
    args = GemmArguments(x, W.mT, D, epilogue=epi, offs=offs)
    kernels = evtfuse.get_kernels(args)
    assert len(kernels) == 2
    for k in kernels:
        D.fill_(float("nan"))
        k.run(args)
        start = 0
        for g, end in enumerate(offs.tolist()):
            want = expected(x[start:end], Wg[g], Wu[g], F.silu)
            torch.testing.assert_close(D[start:end], want, atol=1e-4, rtol=1e-4)
            start = end


def test_grouped_swiglu_matches_torch_grouped_mm_on_concatenated_halves():
    """The MoE benchmark's pair (benchmarks/moe.py): ``torch._grouped_mm`` over the
    concatenated [gate; up] expert weights, then the epilogue in torch, equals evtfuse's
    fused call over the same weights interleaved."""
    G, K, N, T = 3, 32, 8, 48
    x, Wg, Wu, w = rand(T, K), rand(G, N, K), rand(G, N, K), rand(T, 1).abs()
    offs = torch.tensor([16, 16, 48], dtype=torch.int32)
    h = torch._grouped_mm(x, torch.cat((Wg, Wu), dim=1).mT, offs=offs).float()
    want = F.silu(h[:, :N]) * h[:, N:] * w
    epi = "def e(accum, w):\n    gate, up = pairs(accum)\n    D = silu(gate) * up * w\n    return D"
    got = evtfuse.grouped_gemm(x, evtfuse.interleave_gate_up(Wg, Wu, dim=1).mT, offs, epi, w=w)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_grouped_library_source_and_allocated_output():
    """library.SWIGLU on a grouped GEMM: the output evtfuse allocates is (T, N), half of
    B's columns."""
    x, W = rand(9, 16), rand(2, 12, 16)
    offs = torch.tensor([4, 9], dtype=torch.int32)
    D = evtfuse.grouped_gemm(x, W.mT, offs, library.SWIGLU)
    assert D.shape == (9, 6)
    Wg, Wu = evtfuse.split_gate_up(W, dim=1)
    for g, (s, e) in enumerate(((0, 4), (4, 9))):
        torch.testing.assert_close(D[s:e], expected(x[s:e], Wg[g], Wu[g], F.silu),
                                   atol=1e-4, rtol=1e-4)


def test_grouped_odd_columns_and_reductions_refused():
    A, offs = rand(8, 16), torch.tensor([4, 8], dtype=torch.int32)
    with pytest.raises(EpilogueError, match="odd number of columns \\(7\\)"):
        evtfuse.grouped_gemm(A, rand(2, 16, 7), offs, library.SWIGLU)
    with pytest.raises(UnsupportedError, match="gated epilogues .pairs.accum.. compute no reductions"):
        evtfuse.grouped_gemm(A, rand(2, 16, 12), offs,
                             "def e(accum):\n    g, u = pairs(accum)\n    D = g * u\n"
                             "    R = sum(D)\n    return D, R", R=torch.empty(8, 1))


def test_stacked_interleave_round_trip():
    Wg, Wu = rand(3, 5, 4), rand(3, 5, 4)
    W = evtfuse.interleave_gate_up(Wg, Wu, dim=1)
    assert W.shape == (3, 10, 4) and W.is_contiguous()
    assert torch.equal(W[2, 8], Wg[2, 4]) and torch.equal(W[2, 9], Wu[2, 4])
    g, u = evtfuse.split_gate_up(W, dim=-2)
    assert torch.equal(g, Wg) and torch.equal(u, Wu)
    with pytest.raises(EpilogueError, match="dim 3 is out of range"):
        evtfuse.interleave_gate_up(Wg, Wu, dim=3)
    with pytest.raises(EpilogueError, match="even number of rows along dim 1, not 5"):
        evtfuse.split_gate_up(Wg, dim=1)


def test_other_families_and_reductions_refused_with_a_reason():
    x, B = rand(8, 16), rand(16, 12)
    D = torch.empty(8, 6)
    args = GemmArguments(x, B, D, epilogue=EpilogueArguments(library.SWIGLU, D=D))
    text = evtfuse.explain(args, cc=90)
    assert "gluon: refused: gated" in text and "portable: supported" in text
    # the hopper family takes gated epilogues; these 6-column rows are too narrow for TMA
    assert "hopper: refused" in text and "TMA needs 16-byte aligned rows" in text
    S = torch.empty(8, 1)
    epi = EpilogueArguments("def e(accum):\n    gate, up = pairs(accum)\n    D = gate * up\n"
                            "    S = sum(D)\n    return D, S", D=D, S=S)
    args = GemmArguments(x, B, D, epilogue=epi)
    assert evtfuse.get_kernels(args) == []
    assert "compute no reductions and store full (M, N) outputs only" in evtfuse.explain(args)


GATED_GRAD = """def e(accum, bias_gate, bias_up, w, s):
    gate, up = pairs(accum)
    D = silu(gate + bias_gate) * (up + bias_up) * w
    E = gelu_tanh(gate) * s
    return D, E"""


def _gated_reference(x, Wg, Wu, bg, bu, w, s):
    gate, up = x @ Wg.mT, x @ Wu.mT
    return F.silu(gate + bg) * (up + bu) * w, F.gelu(gate, approximate="tanh") * s


@pytest.mark.parametrize("mode", ["recompute", "save"])
@pytest.mark.parametrize("batched", [False, True])
def test_gradients_against_torch(mode, batched):
    """Gradients of a gated epilogue with two outputs, with respect to x, the two
    projections' weights (through the interleaved one), their biases, a per-row vector and
    a scalar: the backward interleaves dgate and dup into dAccum; the gated kernel
    computes no reductions, so the operands' gradients are summed by torch."""
    L, M, K, N = 3, 12, 16, 10
    lead = (L,) if batched else ()
    x = rand(*lead, M, K).requires_grad_()
    Wg, Wu = rand(N, K).requires_grad_(), rand(N, K).requires_grad_()
    bg, bu = rand(N).requires_grad_(), rand(N).requires_grad_()
    w, s = rand(*lead, M, 1).requires_grad_(), rand(1).requires_grad_()
    leaves = dict(x=x, Wg=Wg, Wu=Wu, bg=bg, bu=bu, w=w, s=s)
    gD, gE = rand(*lead, M, N), rand(*lead, M, N)
    W = evtfuse.interleave_gate_up(Wg, Wu)
    D, E = evtfuse.gemm(x, W.t(), GATED_GRAD, bias_gate=bg, bias_up=bu, w=w, s=s,
                        backward=mode)
    ((D * gD).sum() + (E * gE).sum()).backward()
    got = {k: t.grad.clone() for k, t in leaves.items()}
    for t in leaves.values():
        t.grad = None
    rD, rE = _gated_reference(x, Wg, Wu, bg, bu, w, s)
    ((rD * gD).sum() + (rE * gE).sum()).backward()
    for k, t in leaves.items():
        torch.testing.assert_close(got[k], t.grad, atol=1e-4, rtol=1e-4, msg=lambda m: f"{k}: {m}")


def test_gradient_through_one_half_only():
    """An epilogue that uses gate only: dup is zero, interleaved as such."""
    x, W = rand(6, 8).requires_grad_(), rand(12, 8)
    src = "def e(accum):\n    g, u = pairs(accum)\n    D = relu(g)\n    return D"
    evtfuse.gemm(x, W.t(), src).sum().backward()
    Wg, _ = evtfuse.split_gate_up(W)
    torch.testing.assert_close(x.grad, (x.detach() @ Wg.T > 0).float() @ Wg, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", ["recompute", "save"])
def test_grouped_moe_swiglu_gradients(mode):
    """A mixture of experts' gated up-projection trains: gradients of x, the experts' gate
    and up weights (interleaved along N), per-expert biases and routing weights, against
    torch expert by expert."""
    sizes, K, N = [5, 0, 9], 16, 6
    G, T = len(sizes), sum(sizes) + 2
    x = rand(T, K).requires_grad_()
    Wg, Wu = rand(G, N, K).requires_grad_(), rand(G, N, K).requires_grad_()
    bg, bu = rand(G, 1, N).requires_grad_(), rand(G, 1, N).requires_grad_()
    w = rand(T, 1).requires_grad_()
    leaves = dict(x=x, Wg=Wg, Wu=Wu, bg=bg, bu=bu, w=w)
    offs = torch.tensor(sizes).cumsum(0).to(torch.int32)
    src = ("def e(accum, bias_gate, bias_up, w):\n    gate, up = pairs(accum)\n"
           "    D = silu(gate + bias_gate) * (up + bias_up) * w\n    return D")
    W = evtfuse.interleave_gate_up(Wg, Wu, dim=1)
    D = evtfuse.grouped_gemm(x, W.mT, offs, src, bias_gate=bg, bias_up=bu, w=w, backward=mode)
    end = int(offs[-1])
    g = rand(T, N)
    (D[:end] * g[:end]).sum().backward()
    got = {k: t.grad.clone() for k, t in leaves.items()}
    for t in leaves.values():
        t.grad = None
    start, loss = 0, 0.0
    for e, n in enumerate(sizes):
        rows = slice(start, start + n)
        rD = F.silu(x[rows] @ Wg[e].T + bg[e]) * (x[rows] @ Wu[e].T + bu[e]) * w[rows]
        loss = loss + (rD * g[rows]).sum()
        start += n
    loss.backward()
    for k, t in leaves.items():
        torch.testing.assert_close(got[k], t.grad, atol=1e-4, rtol=1e-4, msg=lambda m: f"{k}: {m}")
    assert (got["x"][end:] == 0).all()


_OFFLINE_SCRIPT = """
import json, torch
from evtfuse import EpilogueArguments, GemmArguments, library
from evtfuse.backends.triton.families import PortableFamily, TileConfig
from evtfuse.runtime.offline import compile_for
M, K, N = 4096, 1024, 2048
dt = torch.bfloat16
x, W = torch.empty(M, K, dtype=dt), torch.empty(2 * N, K, dtype=dt)
bg, bu, D = torch.empty(N, dtype=dt), torch.empty(N, dtype=dt), torch.empty(M, N, dtype=dt)
epi = EpilogueArguments(library.gated("swiglu", bias=True, layout=LAYOUT), bias_gate=bg,
                        bias_up=bu, D=D)
args = GemmArguments(x, W.t(), D, epilogue=epi)
out = {}
for bn in (128, 256):
    c = compile_for(PortableFamily(), TileConfig(128, bn, 64, 8, 8, 3), args)
    out[bn] = {"shared": c.shared_bytes, "spills": c.spills}
print("RESULT" + json.dumps(out))
"""


@pytest.mark.parametrize("layout", ["interleaved", "concatenated"])
@pytest.mark.slow
def test_gated_kernel_compiles_for_sm90(layout):
    """The gated portable kernel (bf16 SwiGLU with biases, W.t(); B's columns interleaved,
    or a [W_gate; W_up] weight's) compiles offline to an sm_90 cubin at BLOCK_N 128 and
    256."""
    got = run_offline(_OFFLINE_SCRIPT.replace("LAYOUT", repr(layout)), timeout=600)
    assert got["128"]["shared"] > 0 and got["256"]["shared"] > 0, got


def test_batched_gradient_of_an_operand_shared_by_the_batches():
    """A (M, N) operand shared by a batched gated GEMM's batches: its per-batch gradient
    term is N wide (the output's width, not B's 2N), summed over L (it was allocated 2N
    wide, and the backward refused it)."""
    L, M, K, N = 2, 5, 8, 6
    x, W = rand(L, M, K), rand(2 * N, K)
    C = rand(M, N).requires_grad_()
    src = "def e(accum, C):\n    g, u = pairs(accum)\n    D = silu(g) * u * C\n    return D"
    evtfuse.gemm(x, W.t(), src, C=C, backward="recompute").sum().backward()
    h = x @ W.t()
    torch.testing.assert_close(C.grad, (F.silu(h[..., 0::2]) * h[..., 1::2]).sum(0),
                               atol=1e-4, rtol=1e-4)


MLP_UP = """def mlp_up(accum, bias_gate, bias_up, C):
    gate, up = pairs(accum, layout="LAYOUT")
    G = gate + bias_gate
    U = up + bias_up
    D = silu(G) * U + C
    return D, G, U"""


@pytest.mark.parametrize("layout", ["interleaved", "concatenated"])
@pytest.mark.parametrize("L,M,N", [(1, 40, 24), (1, 9, 40), (2, 19, 16)])
def test_hopper_dense_every_candidate_both_layouts(layout, L, M, N):
    """Dense gated GEMMs in the hopper family (TMA loads and stores, persistent; the MLP
    block's up projection): every hopper candidate under the interpreter (cc=90), three
    full outputs (the output and the pre-activations, as ``GatedMLP`` keeps them), per-column
    biases and a full operand, M and N off the tiles (N = 24 and 40: output tiles of 16
    columns end mid-tile), batched weights; each output against the reference evaluator,
    and against torch's separate projections."""
    K = 32
    x = rand(L, M, K, dtype=torch.float16)
    Wg, Wu = rand(L, N, K, dtype=torch.float16), rand(L, N, K, dtype=torch.float16)
    W = evtfuse.interleave_gate_up(Wg, Wu, dim=1) if layout == "interleaved" \
        else torch.cat((Wg, Wu), dim=1)
    if L == 1:
        x, Wg, Wu, W = x[0], Wg[0], Wu[0], W[0]
    shape = x.shape[:-1] + (N,)
    ops = dict(bias_gate=rand(N, dtype=torch.float16), bias_up=rand(N, dtype=torch.float16),
               C=rand(*shape, dtype=torch.float16))
    outs = {n: torch.empty(shape, dtype=torch.float16) for n in ("D", "G", "U")}
    src = MLP_UP.replace("LAYOUT", layout)
    args = GemmArguments(x, W.mT, outs["D"], epilogue=EpilogueArguments(src, **ops, **outs))
    kernels = [k for k in evtfuse.get_kernels(args, cc=90) if k.family.name == "hopper"]
    assert kernels, evtfuse.explain(args, cc=90)
    ref = evaluate(args)
    g = x.float() @ Wg.float().mT + ops["bias_gate"].float()
    u = x.float() @ Wu.float().mT + ops["bias_up"].float()
    for k in kernels:
        for t in outs.values():
            t.fill_(float("nan"))
        k.run(args)
        for name, t in outs.items():
            torch.testing.assert_close(t.float(), ref[name].float(), atol=2e-2, rtol=2e-2,
                                       msg=lambda m: f"{k.name} {name}: {m}")
        torch.testing.assert_close(outs["G"].float(), g, atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(outs["U"].float(), u, atol=2e-2, rtol=2e-2)


_GLUON_SCRIPT = """
import json, torch
from evtfuse import EpilogueArguments, GemmArguments
from evtfuse.runtime.mlp import _parts, up_source
from evtfuse.runtime.offline import compile_for, offered
M, K, N = 4096, 1024, 1408
dt = torch.bfloat16
x, W = torch.empty(M, K, dtype=dt), torch.empty(2 * N, K, dtype=dt)
p, D = torch.empty(M, 2 * N, dtype=dt), torch.empty(M, N, dtype=dt)
args = GemmArguments(x, W.t(), D, epilogue=EpilogueArguments(
    up_source("silu", True, False, dt), D=D, **_parts(p, True, N)))
out = {}
for f, c in offered(args):
    if f.name == "gluon":
        r = compile_for(f, c, args)
        out[c.name] = {"shared": r.shared_bytes, "spills": r.spills, "wgmma": "wgmma.mma_async" in r.ptx}
print("RESULT" + json.dumps(out))
"""


def test_gluon_takes_concatenated_k_major_gated_epilogues_and_refuses_the_rest():
    """The gluon family offers ping-pong tiles for a gated epilogue over a K-major
    [W_gate; W_up] weight (the MLP block's up projection) and refuses, with a reason, the
    interleaved layout, a row-major B and batched problems (cc=90 target)."""
    M, K, N = 64, 32, 48
    x, W = rand(M, K, dtype=torch.float16), rand(2 * N, K, dtype=torch.float16)
    D = torch.empty(M, N, dtype=torch.float16)

    def explain(src, B, A=x, out=D):
        return evtfuse.explain(GemmArguments(A, B, out, epilogue=EpilogueArguments(src, D=out)),
                               cc=90)

    from evtfuse.runtime.offline import offered  # an sm_90 target without a GPU

    concat = library.gated("swiglu", layout="concatenated")
    args = GemmArguments(x, W.t(), D, epilogue=EpilogueArguments(concat, D=D))
    assert "gluon" in {f.name for f, _ in offered(args)}
    assert "gluon: refused: gated epilogues in the interleaved layout" in explain(
        library.SWIGLU, evtfuse.interleave_gate_up(W[:N], W[N:]).t())
    assert "gluon: refused: a gated epilogue with B row-major" in explain(
        concat, W.t().contiguous())
    Db = torch.empty(2, M, N, dtype=torch.float16)
    xb = rand(2, M, K, dtype=torch.float16)
    assert "gluon: refused: batched gated epilogues" in explain(concat, W.t(), xb, Db)


@pytest.mark.slow
def test_gluon_gated_kernel_compiles_for_sm90_without_spills():
    """The MLP block's up projection (three outputs) in every gluon config offered compiles
    offline to sm_90 with warpgroup MMAs, within shared memory, without spills."""
    got = run_offline(_GLUON_SCRIPT, timeout=900)
    assert got, "no gluon config offered"
    for name, r in got.items():
        assert r["spills"] == 0 and 0 < r["shared"] <= 232448 and r["wgmma"], (name, r)
