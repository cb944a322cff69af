"""Reductions in grouped GEMMs over M (issue 33) on the CPU tier: per row (T, 1), per group
(G, 1, N) and (G, 1, 1), over every group's rows (N,) and (1,), under Triton's interpreter,
against an independent torch loop over the groups (not the reference evaluator), and the
reference evaluator's grouped reductions against the same loop; an offline sm_90 compile."""

from __future__ import annotations

import pytest
import torch

import evtfuse
from evtfuse import EpilogueError
from evtfuse.reference import evaluate_grouped
from grouped_cases import GROUP_CASES, offs_of
from offline_run import run_offline
from tiers import quick

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="CPU-interpreter tier; tests/gpu/test_gpu_grouped.py on a GPU")

GEN = torch.Generator().manual_seed(133)
OPS = ("sum", "max", "min", "logsumexp")
IDENTITY = {"sum": 0.0, "max": float("-inf"), "min": float("inf"), "logsumexp": float("-inf")}


def rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=GEN).to(dtype)


def reduce(op: str, x: torch.Tensor, dims) -> torch.Tensor:
    """torch's reduction ``op`` of ``x`` over ``dims``; over no element, its identity."""
    if x.numel() == 0:
        shape = [1 if d in dims else n for d, n in enumerate(x.shape)]
        return torch.full(shape, IDENTITY[op])
    if op == "sum":
        return x.sum(dims, keepdim=True)
    if op == "max":
        return x.amax(dims, keepdim=True)
    if op == "min":
        return x.amin(dims, keepdim=True)
    return torch.logsumexp(x, dims, keepdim=True)


def epilogue(op: str) -> str:
    return (f"def e(accum, C):\n    D = accum + C\n    R = {op}(D)\n    P = {op}(D)\n"
            f"    S = {op}(D)\n    V = {op}(D)\n    W = {op}(D)\n    return D, R, P, S, V, W")


def expected(op: str, A, B, C, offs) -> dict:
    """Every reduction of ``epilogue(op)``, group by group in torch (D in fp32)."""
    G, T, N = B.shape[0], A.shape[0], B.shape[-1]
    R = torch.full((T, 1), float("nan"))
    P, S = torch.full((G, 1, N), IDENTITY[op]), torch.full((G, 1, 1), IDENTITY[op])
    rows = []
    start = 0
    for g, end in enumerate(offs.tolist()):
        D = A[start:end].float() @ B[g].float() + C[start:end].float()
        if end > start:
            R[start:end] = reduce(op, D, (1,))
            P[g] = reduce(op, D, (0,))
            S[g] = reduce(op, D, (0, 1))
            rows.append(D)
        start = max(start, end)
    everything = torch.cat(rows) if rows else torch.empty(0, N)
    return dict(R=R, P=P, S=S, V=reduce(op, everything, (0,)).reshape(N),
                W=reduce(op, everything, (0, 1)).reshape(1))


CASES = {**GROUP_CASES,  # and:
    "all_empty": ([0, 0, 0], 6),
}


def outputs(G, T, N, dtype=torch.float32) -> dict:
    nan = float("nan")
    return dict(R=torch.full((T, 1), nan, dtype=dtype), P=torch.full((G, 1, N), nan, dtype=dtype),
                S=torch.full((G, 1, 1), nan, dtype=dtype), V=torch.full((N,), nan, dtype=dtype),
                W=torch.full((1,), nan, dtype=dtype))


def check(op, A, B, C, offs, outs, tol):
    evtfuse.grouped_gemm(A, B, offs, epilogue(op), C=C, D=None, **outs)
    want = expected(op, A, B, C, offs)
    end = max(int(offs[-1]), 0)
    for name, t in outs.items():
        w = want[name]
        if name == "R":  # rows at or past offs[-1]: not written
            assert t[end:].isnan().all(), f"R written past offs[-1] ({op})"
            t, w = t[:end], w[:end]
        torch.testing.assert_close(t.float(), w, **tol, equal_nan=True, msg=lambda m: f"{op} {name}: {m}")


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("op", OPS)
@pytest.mark.cover
def test_every_reduction_kind(case, op):
    """Per row, per group per column, per group, per column and in all, in one kernel,
    each against torch per group: ragged groups, empty ones (their identity per group),
    rows past offs[-1] (in no group, not counted, R not written there), one group,
    groups smaller than a tile, T not a multiple of the tile; no group with rows."""
    sizes, T = CASES[case]
    G, K, N = len(sizes), 24, 36
    A, B, C = rand(T, K), rand(G, K, N), rand(T, N)
    check(op, A, B, C, offs_of(sizes), outputs(G, T, N), dict(atol=1e-4, rtol=1e-4))


@pytest.mark.slow
def test_half_inputs_and_outputs():
    sizes, T = [5, 0, 30, 11], 50
    G, K, N = len(sizes), 32, 40
    A, B, C = rand(T, K, dtype=torch.float16), rand(G, K, N, dtype=torch.float16), \
        rand(T, N, dtype=torch.float16)
    for op in ("sum", "max"):
        check(op, A, B, C, offs_of(sizes), outputs(G, T, N, torch.float16),
              dict(atol=5e-2, rtol=2e-2))


@pytest.mark.parametrize("op", quick(OPS, ["logsumexp"]))
def test_special_values_stay_in_their_group(op):
    """NaN in a row of group 1 and +inf in a row of group 2 (through C): per group, only
    that group's results see them; per row, only that row; over every group, both. A NaN in
    a row past offs[-1] counts nowhere."""
    sizes, T = [6, 9, 12], 30
    G, K, N = 3, 16, 20
    A, B, C = rand(T, K), rand(G, K, N), rand(T, N)
    C[8, 3] = float("nan")  # group 1
    C[20, 5] = float("inf")  # group 2
    C[28, :] = float("nan")  # no group
    offs = offs_of(sizes)
    outs = outputs(G, T, N)
    check(op, A, B, C, offs, outs, dict(atol=1e-4, rtol=1e-4))
    assert not outs["P"][0].isnan().any() and outs["P"][1, 0, 3].isnan()
    assert outs["S"][1].isnan().all() and not outs["S"][0].isnan().any()
    assert not outs["S"][2].isnan().any()
    assert outs["R"][8].isnan().all() and not outs["R"][:8].isnan().any()


def test_replay_after_offs_change_in_place():
    """The plan's ticket counters are reset by the programs that combine: a second call
    (the cached plan, the same workspaces) with offs changed in place is right too."""
    G, T, K, N = 4, 40, 16, 24
    A, B, C = rand(T, K), rand(G, K, N), rand(T, N)
    offs = offs_of([10, 10, 10, 10])
    for sizes in ([10, 10, 10, 10], [0, 25, 3, 2], [40, 0, 0, 0], [0, 0, 0, 0]):
        offs.copy_(offs_of(sizes))
        check("sum", A, B, C, offs, outputs(G, T, N), dict(atol=1e-4, rtol=1e-4))


def test_deterministic():
    sizes, T = [13, 40, 0, 21], 80
    G, K, N = 4, 48, 40
    A, B, C = rand(T, K), rand(G, K, N), rand(T, N)
    offs = offs_of(sizes)
    first = outputs(G, T, N)
    evtfuse.grouped_gemm(A, B, offs, epilogue("sum"), C=C, D=None, **first)
    again = outputs(G, T, N)
    evtfuse.grouped_gemm(A, B, offs, epilogue("sum"), C=C, D=None, **again)
    for name in first:
        assert torch.equal(first[name].nan_to_num(), again[name].nan_to_num()), name


def test_reference_evaluator_agrees_with_the_torch_loop():
    sizes, T = [4, 0, 9, 6], 25
    G, K, N = 4, 8, 12
    A, B, C = rand(T, K), rand(G, K, N), rand(T, N)
    offs = offs_of(sizes)
    for op in OPS:
        outs = outputs(G, T, N)
        ref = evaluate_grouped(epilogue(op), A, B, offs, dict(C=C, D=None, **outs))
        want = expected(op, A, B, C, offs)
        for name in outs:
            r, w = (ref[name][:19], want[name][:19]) if name == "R" else (ref[name], want[name])
            torch.testing.assert_close(r, w, atol=1e-4, rtol=1e-4)


def test_a_per_row_reduction_with_a_group_dimension_is_refused():
    A, B, offs = rand(8, 16), rand(2, 16, 12), offs_of([4, 4])
    with pytest.raises(EpilogueError, match="has no group dimension, since a row belongs") as e:
        evtfuse.grouped_gemm(A, B, offs, "def e(accum): D = accum; R = sum(D); return D, R",
                             R=torch.empty(2, 8, 1))
    assert e.value.variable == "R"


def test_kernels_without_reductions_do_not_change():
    """A grouped kernel without reductions has none of the reductions' lines (its source
    is the one before them: scripts/source_hashes.py and the report compare them)."""
    A, B, offs = rand(8, 16), rand(2, 16, 12), offs_of([4, 4])
    D = torch.empty(8, 12)
    args = evtfuse.GemmArguments(A, B, D, offs=offs, epilogue=evtfuse.EpilogueArguments.unbound(
        "def e(accum): D = accum; return D", D=D))
    k = evtfuse.get_kernels(args)[0]
    src = k.source(args)
    assert "grp_cnt" not in src and "pid == 0" not in src and "atomic" not in src


_OFFLINE_SCRIPT = """
import json, torch
from evtfuse import EpilogueArguments, GemmArguments
from evtfuse.backends.triton.families import PortableFamily, TileConfig
from evtfuse.runtime.offline import compile_for
G, T, K, N = 8, 4096, 1024, 2048
dt = torch.bfloat16
A, W = torch.empty(T, K, dtype=dt), torch.empty(G, N, K, dtype=dt)
C = torch.empty(T, N, dtype=dt)
outs = dict(D=torch.empty(T, N, dtype=dt), R=torch.empty(T, 1), P=torch.empty(G, 1, N),
            S=torch.empty(G, 1, 1), V=torch.empty(N), W=torch.empty(1))
offs = torch.zeros(G, dtype=torch.int32)
got = {}
for op in ("sum", "max", "logsumexp"):
    src = (f"def e(accum, C):\\n    D = accum + C\\n    R = {op}(D)\\n    P = {op}(D)\\n"
           f"    S = {op}(D)\\n    V = {op}(D)\\n    W = {op}(D)\\n    return D, R, P, S, V, W")
    epi = EpilogueArguments.unbound(src, C=C, **outs)
    args = GemmArguments(A, W.mT, outs["D"], epilogue=epi, offs=offs)
    c = compile_for(PortableFamily(), TileConfig(128, 128, 64, 8, 8, 3), args)
    got[op] = {"shared": c.shared_bytes, "spills": c.spills,
               "atom": c.ptx.count("atom.")}
print("RESULT" + json.dumps(got))
"""


@pytest.mark.slow
def test_grouped_reduction_kernel_compiles_for_sm90():
    """The grouped portable kernel with every reduction kind (bf16, W.mT) compiles offline
    to an sm_90 cubin; its only atomics are the integer tickets (no float atomics)."""
    got = run_offline(_OFFLINE_SCRIPT, timeout=600)
    for op, r in got.items():
        assert r["shared"] > 0 and r["atom"] > 0, (op, r)


def test_no_rows_at_all():
    """T = 0 (no kernel launches): every per-group result is the identity."""
    G, K, N = 3, 8, 5
    A, B, C = rand(0, K), rand(G, K, N), rand(0, N)
    for op in ("sum", "max"):
        check(op, A, B, C, offs_of([0, 0, 0]), outputs(G, 0, N), dict(atol=0.0, rtol=0.0))


# -- the grouped backward reduces its operands' gradients in the kernel

GRAD_EPI = """def moe(accum, bias, w, s, cb, k):
    H = silu(accum + bias) * s
    D = H * w + cb * k
    return D, H"""


@pytest.mark.parametrize("mode", ["recompute", "save"])
@pytest.mark.parametrize("sizes,T", [([7, 0, 20, 1], 31), ([0, 13, 0], 16), ([11], 11)])
def test_backward_reduces_operand_gradients_in_the_kernel(monkeypatch, mode, sizes, T):
    """The gradients of a per-group bias (G, 1, N) and scale (G, 1, 1), routing weights
    (T, 1), a shared (N,) vector and a 0-d device scalar come from the backward kernel's
    reductions (torch's per-group sum of (T, N) terms, ``grouped_autograd._sum_rows``, is
    never called), equal to torch autograd of a per-group loop: empty groups' gradients
    zero, rows past offs[-1] counted in none."""
    from evtfuse.runtime import grouped_autograd

    def summed_by_torch(*a, **k):
        raise AssertionError("an operand's gradient was summed by torch, not in the kernel")

    monkeypatch.setattr(grouped_autograd, "_sum_rows", summed_by_torch)
    G, K, N = len(sizes), 16, 12
    offs = offs_of(sizes)
    x = dict(A=rand(T, K), B=rand(G, K, N), bias=rand(G, 1, N), w=rand(T, 1),
             s=rand(G, 1, 1), cb=rand(N), k=rand(()))
    x = {n: v.requires_grad_(True) for n, v in x.items()}
    ops = {n: v for n, v in x.items() if n not in ("A", "B")}
    end = int(offs[-1])
    gD, gH = rand(T, N), rand(T, N)
    D, H = evtfuse.grouped_gemm(x["A"], x["B"], offs, GRAD_EPI, **ops, backward=mode)
    ((D[:end] * gD[:end]).sum() + (H[:end] * gH[:end]).sum()).backward()
    got = {n: t.grad.clone() for n, t in x.items()}
    for t in x.values():
        t.grad = None
    start, loss = 0, 0.0
    for g, e in enumerate(offs.tolist()):
        Hg = torch.nn.functional.silu(x["A"][start:e] @ x["B"][g] + x["bias"][g]) * x["s"][g]
        Dg = Hg * x["w"][start:e] + x["cb"] * x["k"]
        loss = loss + (Dg * gD[start:e]).sum() + (Hg * gH[start:e]).sum()
        start = e
    loss.backward()
    for n, t in x.items():
        want = t.grad if t.grad is not None else torch.zeros_like(t)
        torch.testing.assert_close(got[n], want, atol=2e-4, rtol=2e-4, msg=lambda m: f"{n}: {m}")
    assert (got["w"][end:] == 0).all()


def test_backward_plan_keeps_the_reductions():
    """The grouped backward epilogue returns its operands' gradients as reductions (no
    caller sums) unless the epilogue is gated (whose kernel has no reductions yet)."""
    from evtfuse.runtime.grouped_autograd import call  # noqa: F401 (registers the op)
    from evtfuse.runtime import grad_plan

    offs = offs_of([3, 0, 5])
    A, B = rand(8, 8).requires_grad_(), rand(3, 8, 6)
    bias = rand(3, 1, 6).requires_grad_()
    seen = []
    real = grad_plan.caller_reductions

    def spy(bplan, grouped=False):
        got = real(bplan, grouped)
        seen.append(got)
        return got

    import unittest.mock

    with unittest.mock.patch.object(grad_plan, "caller_reductions", spy):
        evtfuse.grouped_gemm(A, B, offs, "def e(accum, bias): D = relu(accum + bias); return D",
                             bias=bias).sum().backward()
    assert seen and seen[-1].caller_sums == ()
    assert "sum(" in seen[-1].source


def test_shifted_sumexp_is_refused():
    """shifted_sumexp (softmax's sum of exp(x - max)) is not computed by grouped kernels:
    a clear error naming it and its line, never a result combined without its max."""
    from evtfuse.errors import EpilogueError

    A, B, offs = rand(8, 16), rand(2, 16, 24), offs_of([3, 5])
    src = "def e(accum):\n    D = accum\n    R = shifted_sumexp(D)\n    return D, R"
    with pytest.raises(EpilogueError, match=r"line 3.*shifted_sumexp\(\.\.\.\) in a grouped GEMM"):
        evtfuse.grouped_gemm(A, B, offs, src, D=None, R=torch.empty(8, 1))
