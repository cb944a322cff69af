"""GPU tier: grouped GEMMs (``evtfuse.grouped_gemm``, over M and over K; the portable family).

A mixture of experts' up-projection at moderate sizes: 8 and 64 groups, uniform and skewed
routing (one group a quarter of the tokens, some groups empty), bf16, the expert weight
passed as ``W.mT``, per-group bias and scale, per-row routing weights and a full operand,
against a per-group loop of the reference evaluator (``reference.evaluate_grouped``);
that no call reads ``offs`` on the host (a CUDA graph captures it and replays with other
offsets); that the grid's programs past the last group write nothing; and a gated (SwiGLU)
expert up-projection (``pairs(accum)``); groups over K (the experts' weight gradient); a
training step's gradients, over M and over K; every candidate of the hopper family's
grouped kernel (persistent, TMA) on ragged, empty and skewed groups. Run with
``PYTHONPATH=src python3 -m pytest -m gpu tests/gpu/test_gpu_grouped.py``.
"""

from __future__ import annotations

import pytest
import torch

import evtfuse
from evtfuse.reference import evaluate_grouped
from gpu_helpers import check_grouped_family

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

MOE = """def moe(accum, bias, s, w, C):
    F = silu(accum + bias) * s
    D = F * w + C
    return D"""


def _rand(*shape, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(*shape, device="cuda", generator=g) * scale).to(dtype)


def _sizes(G: int, T: int, skewed: bool) -> list[int]:
    """Rows per group summing to T: uniform, or one group a quarter of T, every fourth
    group empty and the rest spread unevenly."""
    if not skewed:
        return [T // G + (1 if g < T % G else 0) for g in range(G)]
    big = T // 4
    weights = [0 if g % 4 == 3 else 1 + (g * 5) % 7 for g in range(G)]
    weights[1] = 0
    rest = T - big
    sizes = [rest * w // sum(weights) for w in weights]
    sizes[1] = big
    sizes[0] += T - sum(sizes)
    return sizes


def _offs(sizes) -> torch.Tensor:
    return torch.tensor(sizes, dtype=torch.int32, device="cuda").cumsum(0).to(torch.int32)


@pytest.mark.parametrize("G", [8, 64])
@pytest.mark.parametrize("skewed", [False, True], ids=["uniform", "skewed"])
def test_moe_up_projection(G, skewed):
    T, K, N = 4096, 512, 1024
    dt = torch.bfloat16
    A = _rand(T, K, dtype=dt, seed=1)
    W = _rand(G, N, K, dtype=dt, seed=2, scale=K ** -0.5)  # an expert weight (G, N, K)
    offs = _offs(_sizes(G, T, skewed))
    ops = dict(bias=_rand(G, 1, N, dtype=dt, seed=3), s=_rand(G, 1, 1, seed=4).abs(),
               w=_rand(T, 1, seed=5).abs(), C=_rand(T, N, dtype=dt, seed=6))
    D = evtfuse.grouped_gemm(A, W.mT, offs, MOE, tune="none", **ops)
    torch.cuda.synchronize()
    ref = evaluate_grouped(MOE, A, W.mT, offs, {**ops, "D": D})["D"]
    torch.testing.assert_close(D.float(), ref.float(), atol=3e-2, rtol=2e-2)


SWIGLU_MOE = """def moe(accum, w):
    gate, up = pairs(accum)
    D = silu(gate) * up * w
    return D"""


@pytest.mark.parametrize("G", [8, 64])
@pytest.mark.parametrize("skewed", [False, True], ids=["uniform", "skewed"])
def test_moe_swiglu_gated(G, skewed):
    """A gated (SwiGLU) expert up-projection with routing weights: experts' gate and up
    weights interleaved along N (``interleave_gate_up(..., dim=1)``), tuned as by default,
    against the reference."""
    T, K, N = 4096, 512, 768
    dt = torch.bfloat16
    A = _rand(T, K, dtype=dt, seed=21)
    Wg, Wu = (_rand(G, N, K, dtype=dt, seed=s, scale=K ** -0.5) for s in (22, 23))
    W = evtfuse.interleave_gate_up(Wg, Wu, dim=1)
    offs = _offs(_sizes(G, T, skewed))
    w = _rand(T, 1, seed=24).abs()
    D = torch.full((T, N), float("nan"), dtype=dt, device="cuda")
    evtfuse.grouped_gemm(A, W.mT, offs, SWIGLU_MOE, w=w, D=D)
    torch.cuda.synchronize()
    ref = evaluate_grouped(SWIGLU_MOE, A, W.mT, offs, {"w": w, "D": D})["D"]
    torch.testing.assert_close(D.float(), ref.float(), atol=3e-2, rtol=2e-2)


@pytest.mark.parametrize("G", [8, 64])
@pytest.mark.parametrize("skewed", [False, True], ids=["uniform", "skewed"])
def test_moe_weight_gradient_groups_over_k(G, skewed):
    """Groups over K: the experts' weight gradient ``x[rows].T @ dY[rows]`` per expert,
    A the transposed view of the tokens (M, T), B (T, N), output (G, M, N) scaled per
    expert, with its per-row sums (G, M, 1) in the same kernel."""
    T, M, N = 4096, 512, 1024
    dt = torch.bfloat16
    x, dY = _rand(T, M, dtype=dt, seed=31), _rand(T, N, dtype=dt, seed=32)
    offs = _offs(_sizes(G, T, skewed))
    epi = "def e(accum, s):\n    D = accum * s\n    R = sum(D)\n    return D, R"
    s = _rand(G, 1, 1, seed=33).abs()
    D = torch.full((G, M, N), float("nan"), dtype=dt, device="cuda")
    R = torch.full((G, M, 1), float("nan"), device="cuda")
    evtfuse.grouped_gemm(x.t(), dY, offs, epi, s=s, D=D, R=R)
    torch.cuda.synchronize()
    ref = evaluate_grouped(epi, x.t(), dY, offs, {"s": s, "D": D, "R": R})
    torch.testing.assert_close(D.float(), ref["D"].float(), atol=3e-2, rtol=2e-2)
    torch.testing.assert_close(R, ref["R"], atol=0.5, rtol=2e-2)


@pytest.mark.parametrize("mode", ["save", "recompute"])
def test_moe_training_step_gradients(mode):
    """Gradients of a grouped GEMM over M (bf16, skewed routing): A, the expert weight,
    per-expert bias and per-token routing weights, against torch autograd of a per-expert
    loop in fp32 from the same bf16 values."""
    G, T, K, N = 8, 2048, 256, 512
    dt = torch.bfloat16
    A = _rand(T, K, dtype=dt, seed=41).requires_grad_()
    W = _rand(G, N, K, dtype=dt, seed=42, scale=K ** -0.5).requires_grad_()
    bias = _rand(G, 1, N, dtype=dt, seed=43).requires_grad_()
    w = _rand(T, 1, seed=44).abs().requires_grad_()
    sizes = _sizes(G, T, True)
    offs = _offs(sizes)
    epi = "def e(accum, bias, w): D = gelu_tanh(accum + bias) * w; return D"
    g = _rand(T, N, dtype=dt, seed=45)
    evtfuse.grouped_gemm(A, W.mT, offs, epi, bias=bias, w=w, backward=mode).backward(g)
    got = [t.grad.float() for t in (A, W, bias, w)]
    ref = [t.detach().float().requires_grad_() for t in (A, W, bias, w)]
    rA, rW, rb, rw = ref
    start, outs = 0, []
    for e, n in enumerate(sizes):
        rows = slice(start, start + n)
        outs.append(torch.nn.functional.gelu(rA[rows] @ rW[e].T + rb[e], approximate="tanh")
                    * rw[rows])
        start += n
    torch.cat(outs).backward(g.float())
    for name, a, r in zip(("A", "W", "bias", "w"), got, ref):
        err = ((a - r.grad).norm() / r.grad.norm()).item()
        assert err < 1e-2, f"{name}: relative error {err:.2e}"


@pytest.mark.parametrize("mode", ["save", "recompute"])
def test_weight_gradient_groups_over_k_gradients(mode):
    """Gradients of a grouped GEMM over K (bf16, skewed groups, offs[-1] < T): A = x.t()
    (the tokens, as a weight gradient reads them), B, a per-group scale (G, 1, 1) and a
    per-group bias (G, 1, N), with a per-row sum output, against torch autograd of a
    per-group loop in fp32 from the same bf16 values; each gradient in its input's layout,
    zero past offs[-1]."""
    G, T, M, N = 8, 2048, 256, 384
    dt = torch.bfloat16
    x = _rand(T, M, dtype=dt, seed=51).requires_grad_()
    dY = _rand(T, N, dtype=dt, seed=52, scale=T ** -0.5).requires_grad_()
    s = _rand(G, 1, 1, seed=53).abs().requires_grad_()
    bias = _rand(G, 1, N, dtype=dt, seed=54).requires_grad_()
    sizes = _sizes(G, T - 100, True)
    offs = _offs(sizes)
    epi = "def e(accum, s, bias):\n    D = gelu_tanh(accum * s + bias)\n    R = sum(D)\n" \
          "    return D, R"
    gD, gR = _rand(G, M, N, dtype=dt, seed=55), _rand(G, M, 1, seed=56)
    D, R = evtfuse.grouped_gemm(x.t(), dY, offs, epi, s=s, bias=bias, backward=mode,
                                R=torch.empty(G, M, 1, device="cuda"))
    ((D.float() * gD.float()).sum() + (R * gR).sum()).backward()
    got = [t.grad for t in (x, dY, s, bias)]
    assert got[0].is_contiguous() and got[1].is_contiguous()
    end = sum(sizes)
    assert (got[0][end:] == 0).all() and (got[1][end:] == 0).all()
    ref = [t.detach().float().requires_grad_() for t in (x, dY, s, bias)]
    rx, rdY, rs, rb = ref
    start, loss = 0, 0.0
    for g, n in enumerate(sizes):
        rows = slice(start, start + n)
        Dg = torch.nn.functional.gelu((rx[rows].T @ rdY[rows]) * rs[g] + rb[g],
                                      approximate="tanh")
        loss = loss + (Dg * gD[g].float()).sum() + (Dg.sum(-1, keepdim=True) * gR[g]).sum()
        start += n
    loss.backward()
    for name, a, r in zip(("x", "dY", "s", "bias"), got, ref):
        err = ((a.float() - r.grad).norm() / r.grad.norm()).item()
        assert err < 1e-2, f"{name}: relative error {err:.2e}"


def test_rows_past_the_end_untouched_and_tuned():
    """offs[-1] < T: the rows past it keep what they held; the default tuning runs."""
    G, T, K, N = 8, 1000, 256, 384
    A, B = _rand(T, K, dtype=torch.bfloat16, seed=7), _rand(G, K, N, dtype=torch.bfloat16, seed=8)
    offs = _offs([100, 0, 37, 250, 1, 0, 300, 200])  # ends at 888
    D = torch.full((T, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    evtfuse.grouped_gemm(A, B, offs, D=D)
    torch.cuda.synchronize()
    ref = evaluate_grouped("def e(accum): D = accum; return D", A, B, offs, {"D": D})["D"]
    torch.testing.assert_close(D[:888].float(), ref[:888].float(), atol=3e-2, rtol=2e-2)
    assert D[888:].isnan().all()


def test_cuda_graph_replays_with_new_offsets():
    """The call never reads offs on the host: captured once, replayed after offs changed
    in place, it follows the new groups."""
    G, T, K, N = 16, 2048, 256, 512
    dt = torch.bfloat16
    A, B = _rand(T, K, dtype=dt, seed=9), _rand(G, K, N, dtype=dt, seed=10)
    bias = _rand(G, 1, N, dtype=dt, seed=11)
    epi = "def e(accum, bias): D = relu(accum + bias); return D"
    offs = _offs(_sizes(G, T, False))
    D = torch.empty(T, N, dtype=dt, device="cuda")
    evtfuse.grouped_gemm(A, B, offs, epi, tune="none", bias=bias, D=D)  # compile, plan
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        evtfuse.grouped_gemm(A, B, offs, epi, tune="none", bias=bias, D=D)
    offs.copy_(_offs(_sizes(G, T, True)))
    graph.replay()
    torch.cuda.synchronize()
    ref = evaluate_grouped(epi, A, B, offs, {"bias": bias, "D": D})["D"]
    torch.testing.assert_close(D.float(), ref.float(), atol=3e-2, rtol=2e-2)


def test_1024_groups_mostly_empty():
    G, T, K, N = 1024, 3000, 128, 256
    sizes = [0] * G
    for i in range(0, G, 3):
        sizes[i] = 1 + i % 9
    sizes[-1] += T - sum(sizes)
    A, B = _rand(T, K, dtype=torch.bfloat16, seed=12), _rand(G, K, N, dtype=torch.bfloat16, seed=13)
    offs = _offs(sizes)
    bias = _rand(G, 1, N, dtype=torch.bfloat16, seed=14)
    epi = "def e(accum, bias): D = accum + bias; return D"
    D = evtfuse.grouped_gemm(A, B, offs, epi, tune="none", bias=bias)
    torch.cuda.synchronize()
    ref = evaluate_grouped(epi, A, B, offs, {"bias": bias, "D": D})["D"]
    torch.testing.assert_close(D.float(), ref.float(), atol=3e-2, rtol=2e-2)


# -- reductions over M (issue 33): per row, per group, over every group's rows

_IDENT = {"sum": 0.0, "max": float("-inf"), "min": float("inf"), "logsumexp": float("-inf")}


def _reduced(op: str, x: torch.Tensor, dims) -> torch.Tensor:
    if x.numel() == 0:
        return torch.full([1 if d in dims else n for d, n in enumerate(x.shape)], _IDENT[op],
                          device=x.device)
    return {"sum": lambda: x.sum(dims, keepdim=True), "max": lambda: x.amax(dims, keepdim=True),
            "min": lambda: x.amin(dims, keepdim=True),
            "logsumexp": lambda: torch.logsumexp(x, dims, keepdim=True)}[op]()


@pytest.mark.parametrize("op", ["sum", "max", "logsumexp"])
@pytest.mark.parametrize("G", [8, 64])
def test_moe_reductions(op, G):
    """Every reduction kind of a grouped GEMM over M (skewed routing: empty groups, one a
    quarter of the tokens; T - 100 rows in groups), against torch per group in fp32 from
    the same bf16 inputs; twice (the plan's tickets reset); the same results bit for bit."""
    T, K, N = 4096, 512, 1024
    dt = torch.bfloat16
    A = _rand(T, K, dtype=dt, seed=51)
    W = _rand(G, N, K, dtype=dt, seed=52, scale=K ** -0.5)
    bias = _rand(G, 1, N, dtype=dt, seed=53)
    sizes = _sizes(G, T - 100, True)
    offs = _offs(sizes)
    epi = (f"def e(accum, bias):\n    D = accum + bias\n    R = {op}(D)\n    P = {op}(D)\n"
           f"    S = {op}(D)\n    V = {op}(D)\n    return D, R, P, S, V")
    runs = []
    for _ in range(2):
        outs = dict(R=torch.full((T, 1), float("nan"), device="cuda"),
                    P=torch.full((G, 1, N), float("nan"), device="cuda"),
                    S=torch.full((G, 1, 1), float("nan"), device="cuda"),
                    V=torch.full((N,), float("nan"), device="cuda"))
        D = torch.empty(T, N, dtype=dt, device="cuda")
        evtfuse.grouped_gemm(A, W.mT, offs, epi, bias=bias, D=D, **outs)
        torch.cuda.synchronize()
        runs.append(outs)
    start, rows = 0, []
    for g, n in enumerate(sizes):
        x = A[start:start + n].float() @ W[g].float().T + bias[g].float()
        if n:
            torch.testing.assert_close(outs["R"][start:start + n], _reduced(op, x, (1,)),
                                       atol=2e-3, rtol=1e-3)
        torch.testing.assert_close(outs["P"][g], _reduced(op, x, (0,)).view(1, N),
                                   atol=1e-2, rtol=1e-3)
        torch.testing.assert_close(outs["S"][g], _reduced(op, x, (0, 1)).view(1, 1),
                                   atol=5e-1 if op == "sum" else 1e-3, rtol=1e-3)
        rows.append(x)
        start += n
    torch.testing.assert_close(outs["V"], _reduced(op, torch.cat(rows), (0,)).view(N),
                               atol=1e-1 if op == "sum" else 1e-3, rtol=1e-3)
    assert outs["R"][T - 100:].isnan().all()
    for name in outs:
        assert torch.equal(runs[0][name].nan_to_num(), runs[1][name].nan_to_num()), name


def test_reductions_in_a_cuda_graph_with_new_offsets():
    """Per-group sums captured once and replayed after offs changed in place (groups that
    were full now empty and the reverse: their identity, 0)."""
    G, T, K, N = 16, 2048, 256, 512
    dt = torch.bfloat16
    A, B = _rand(T, K, dtype=dt, seed=61), _rand(G, K, N, dtype=dt, seed=62)
    epi = "def e(accum):\n    D = accum\n    P = sum(D)\n    R = max(D)\n    return D, P, R"
    offs = _offs(_sizes(G, T, False))
    D = torch.empty(T, N, dtype=dt, device="cuda")
    P = torch.empty(G, 1, N, device="cuda")
    R = torch.empty(T, 1, device="cuda")
    evtfuse.grouped_gemm(A, B, offs, epi, tune="none", D=D, P=P, R=R)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        evtfuse.grouped_gemm(A, B, offs, epi, tune="none", D=D, P=P, R=R)
    sizes = _sizes(G, T, True)
    offs.copy_(_offs(sizes))
    graph.replay()
    torch.cuda.synchronize()
    start = 0
    for g, n in enumerate(sizes):  # the reductions read fp32 values, not D's bf16 ones
        x = A[start:start + n].float() @ B[g].float()
        torch.testing.assert_close(P[g], x.sum(0, keepdim=True), atol=5e-2, rtol=1e-3)
        if n:
            torch.testing.assert_close(R[start:start + n], x.amax(1, keepdim=True),
                                       atol=2e-3, rtol=1e-3)
        start += n


# -- the hopper family's grouped kernel (persistent, TMA): every candidate a GPU is offered

HOPPER_MOE = """def moe(accum, bias, s, w, C, cb, alpha):
    F = silu(accum + bias) * s
    D = F * w + alpha * C + cb
    return D, F"""


@pytest.mark.parametrize("G,skewed", [(8, False), (64, True), (1, False)],
                         ids=["8-uniform", "64-skewed", "one-group"])
@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_every_hopper_grouped_candidate(G, skewed, dt):
    """Each hopper candidate of a mixture of experts' up-projection: T and N no multiples
    of any tile, 1 to 64 groups (skewed: a quarter of the tokens in one group, a quarter
    of the groups empty), rows past offs[-1], the expert weight as ``W.mT``; per-group
    (G, 1, N) and (G, 1, 1), per-row (T, 1), full (T, N), shared (N,) and scalar operands;
    two full outputs."""
    T, K, N = 3000, 512, 1000
    A = _rand(T + 37, K, dtype=dt, seed=41)
    W = _rand(G, N, K, dtype=dt, seed=42, scale=K ** -0.5)
    offs = _offs(_sizes(G, T, skewed))  # ends at T: the last 37 rows are in no group
    ops = dict(bias=_rand(G, 1, N, dtype=dt, seed=43), s=_rand(G, 1, 1, seed=44).abs(),
               w=_rand(T + 37, 1, seed=45).abs(), C=_rand(T + 37, N, dtype=dt, seed=46),
               cb=_rand(N, seed=47), alpha=0.5)
    outs = {n: torch.empty(T + 37, N, dtype=dt, device="cuda") for n in ("D", "F")}
    names = check_grouped_family(HOPPER_MOE, A, W.mT, offs, outs, **ops)
    assert len(names) >= 8, names


def test_every_hopper_grouped_candidate_row_major_weights_and_tiny_groups():
    """B (G, K, N) stored N-contiguous; many groups of a few rows each (most tiles end
    inside the rows of the next group, whose rows the kernel loads but must not write)."""
    G, K, N = 96, 256, 512
    sizes = [(g * 5) % 11 for g in range(G)]
    T = sum(sizes) + 5
    A, B = _rand(T, K, dtype=torch.bfloat16, seed=51), _rand(G, K, N, dtype=torch.bfloat16,
                                                             seed=52, scale=K ** -0.5)
    outs = {"D": torch.empty(T, N, dtype=torch.bfloat16, device="cuda")}
    check_grouped_family("def e(accum, bias): D = relu(accum + bias); return D", A, B,
                         _offs(sizes), outs, bias=_rand(G, 1, N, dtype=torch.bfloat16, seed=53))


def test_fast_tuning_times_both_families():
    """A grouped problem's candidates alternate between the hopper and portable families
    (``discovery.alternate_families``), so ``tune="fast"`` times both; the result is right."""
    G, T, K, N = 8, 4096, 512, 1024
    dt = torch.bfloat16
    A, W = _rand(T, K, dtype=dt, seed=61), _rand(G, N, K, dtype=dt, seed=62, scale=K ** -0.5)
    offs = _offs(_sizes(G, T, True))
    D = torch.empty(T, N, dtype=dt, device="cuda")
    args = evtfuse.GemmArguments(A, W.mT, D, offs=offs, epilogue=evtfuse.EpilogueArguments.unbound(
        "def e(accum): D = accum; return D", D=D))
    fams = [k.family.name for k in evtfuse.get_kernels(args)]
    assert fams[:2] in (["hopper", "portable"], ["portable", "hopper"]), fams
    evtfuse.grouped_gemm(A, W.mT, offs, D=D, tune="fast")
    torch.cuda.synchronize()
    ref = evaluate_grouped("def e(accum): D = accum; return D", A, W.mT, offs, {"D": D})["D"]
    torch.testing.assert_close(D.float(), ref.float(), atol=3e-2, rtol=2e-2)


@pytest.mark.parametrize("op", ["sum", "max", "logsumexp"])
def test_every_hopper_grouped_candidate_with_a_per_row_reduction(op):
    """Per-row (T, 1) reductions in the hopper family's persistent grouped kernel (the
    partials, a ticket per row tile, the last column tile's combine), every candidate,
    skewed groups (empty ones among them) and rows past offs[-1]."""
    G, T, K, N = 16, 2000, 256, 1000
    dt = torch.bfloat16
    A = _rand(T + 37, K, dtype=dt, seed=61)
    W = _rand(G, N, K, dtype=dt, seed=62, scale=K ** -0.5)
    offs = _offs(_sizes(G, T, True))
    src = f"def e(accum, bias):\n    D = accum + bias\n    R = {op}(D)\n    return D, R"
    outs = {"D": torch.empty(T + 37, N, dtype=dt, device="cuda"),
            "R": torch.empty(T + 37, 1, device="cuda")}
    names = check_grouped_family(src, A, W.mT, offs, outs, bias=_rand(G, 1, N, dtype=dt, seed=63))
    assert len(names) >= 8, names


def test_every_hopper_candidate_of_the_moe_down_projection_backward():
    """The MoE layer's dX epilogue (``moe.down_grad``: the saved gate and up read, three
    full outputs, the routing weight's gradient a per-row sum): every hopper candidate,
    which the tuner now times beside the portable kernel (before, portable only: 2.06x an
    identity GEMM of its shape, benchmarks/HISTORY.md, thirty-seventh session)."""
    from evtfuse.runtime import moe

    src, outputs = moe.down_grad("silu")
    grad = dict(outputs)
    G, T, H, I = 8, 3000, 512, 1408
    dt = torch.bfloat16
    dy = _rand(T, H, dtype=dt, seed=71)
    W = _rand(G, H, I, dtype=dt, seed=72, scale=H ** -0.5)
    offs = _offs(_sizes(G, T - 40, True))
    ops = dict(G=_rand(T, I, dtype=dt, seed=73), U=_rand(T, I, dtype=dt, seed=74),
               s=_rand(T, 1, dtype=dt, seed=75).abs())
    outs = {"D": torch.empty(T, I, dtype=dt, device="cuda"),
            grad["G"]: torch.empty(T, I, dtype=dt, device="cuda"),
            grad["U"]: torch.empty(T, I, dtype=dt, device="cuda"),
            grad["s"]: torch.empty(T, 1, device="cuda")}
    names = check_grouped_family(src, dy, W, offs, outs, atol=5e-2, **ops)
    assert len(names) >= 8, names
