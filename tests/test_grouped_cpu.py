"""Grouped GEMMs (``evtfuse.grouped_gemm``, groups over M) on the CPU tier: the portable
kernel under Triton's interpreter against a per-group loop of the reference evaluator
(``reference.evaluate_grouped``), bad inputs, torch.compile, and an offline sm_90 compile."""

from __future__ import annotations

import re

import pytest
import torch

import evtfuse
from evtfuse import EpilogueArguments, EpilogueError, GemmArguments, UnsupportedError
from evtfuse.frontend import parse_epilogue
from evtfuse.reference import evaluate_grouped
from grouped_cases import GROUP_CASES, offs_of
from offline_run import run_offline

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="CPU-interpreter tier; tests/gpu/test_gpu_grouped.py on a GPU")

GEN = torch.Generator().manual_seed(33)


def rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=GEN).to(dtype)


def moe(accum, bias, w, s, C, cb, alpha):
    F = silu(accum + bias) * s
    D = F * w + alpha * C + cb
    R = w * 2.0
    return D, F, R


def check(fn, A, B, offs, dtype, **operands):
    """Run ``grouped_gemm`` and compare every output with the reference, over the rows
    that belong to a group (those past offs[-1] must stay as they were: NaN)."""
    got = evtfuse.grouped_gemm(A, B, offs, fn, **operands)
    got = got if isinstance(got, tuple) else (got,)
    outs = parse_epilogue(fn).outputs
    named = {n: t for n, t in zip(outs, got) if t is not None}
    ref = evaluate_grouped(fn, A, B, offs, {**operands, **named})
    end = int(offs[-1])
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.float16 else dict(atol=1e-4, rtol=1e-4)
    for name, t in named.items():
        torch.testing.assert_close(t[:end].float(), ref[name][:end].float(), **tol,
                                   msg=lambda m: f"{name}: {m}")
    return named


CASES = {**GROUP_CASES,  # and:
    "all_empty_but_one": ([0, 0, 0, 33, 0, 0], 40),
    "one_row": ([0, 1, 0], 1),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_every_operand_kind(case, dtype):
    sizes, T = CASES[case]
    G, K, N = len(sizes), 40, 36
    A, B = rand(T, K, dtype=dtype), rand(G, K, N, dtype=dtype)
    offs = offs_of(sizes)
    ops = dict(bias=rand(G, 1, N, dtype=dtype), w=rand(T, 1), s=rand(G, 1, 1).abs(),
               C=rand(T, N, dtype=dtype), cb=rand(N), alpha=0.5)
    D = torch.full((T, N), float("nan"), dtype=dtype)
    R = torch.full((T, 1), float("nan"))
    named = check(moe, A, B, offs, dtype, **ops, D=D, F=None, R=R)
    end = int(offs[-1])
    assert named["D"] is D and D[end:].isnan().all()  # rows of no group: not written
    assert R[end:].isnan().all()


def test_bad_offsets_stay_inside_the_tensors():
    """offs past T or below 0 are not checked (the host never reads them) but clamped:
    nothing outside D is written (D is a view into a larger buffer here)."""
    G, T, K, N = 3, 20, 16, 16
    A, B = rand(T, K), rand(G, K, N)
    buf = torch.full((T + 40, N), 7.0)
    D = buf[20:20 + T]
    offs = torch.tensor([-8, 10, 50], dtype=torch.int32)
    evtfuse.grouped_gemm(A, B, offs, D=D)
    assert (buf[:20] == 7.0).all() and (buf[20 + T:] == 7.0).all()
    torch.testing.assert_close(D[:10], A[:10] @ B[1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(D[10:], A[10:] @ B[2], atol=1e-4, rtol=1e-4)


def test_transposed_expert_weight():
    """B as ``W.mT`` of an expert weight W (G, N, K): K-contiguous, as torch._grouped_mm
    takes it; and a column-major A."""
    G, T, K, N = 3, 50, 24, 40
    W = rand(G, N, K)
    A = rand(K, T).t()
    offs = offs_of([20, 0, 30])
    check("def epi(accum, bias): D = relu(accum + bias); return D", A, W.mT, offs,
          torch.float32, bias=rand(G, 1, N))


def test_identity_and_allocated_dtype():
    G, T, K, N = 2, 19, 16, 24
    A, B, offs = rand(T, K), rand(G, K, N), offs_of([11, 8])
    D = evtfuse.grouped_gemm(A, B, offs)
    ref = torch.cat([A[:11] @ B[0], A[11:] @ B[1]])
    torch.testing.assert_close(D, ref, atol=1e-4, rtol=1e-4)
    D16 = evtfuse.grouped_gemm(A, B, offs, "def e(accum): D = accum; return D",
                               D_dtype=torch.float16)
    assert D16.dtype == torch.float16 and D16.shape == (T, N)


@pytest.mark.slow
def test_many_groups():
    """More groups than one step of the kernel's scan over offs (``group_emit.GROUP_SCAN``)."""
    G, K, N = 300, 16, 16
    sizes = [(g * 7) % 3 for g in range(G)]  # 0, 1 or 2 rows each
    T = sum(sizes)
    A, B, offs = rand(T, K), rand(G, K, N), offs_of(sizes)
    check("def epi(accum, bias): D = accum + bias; return D", A, B, offs, torch.float32,
          bias=rand(G, 1, N))


# -- groups over K (a mixture of experts' weight gradient): A (M, T), B (T, N) -> (G, M, N)

def k_groups_reference(A, B, offs):
    """The (G, M, N) accumulator of a grouped GEMM over K, group by group in torch."""
    ends = offs.tolist()
    return torch.stack([A[:, s:e].float() @ B[s:e].float()
                        for s, e in zip([0] + ends[:-1], ends)])


K_CASES = {  # group sizes over T, T (>= their sum: columns past offs[-1] are in no group)
    "ragged": ([7, 33, 1, 20], 61),
    "empty_first_last": ([0, 12, 0, 40, 0], 52),
    "one_group": ([45], 45),
    "past_the_end": ([9, 14], 30),
    "all_empty": ([0, 0, 0], 5),
}


@pytest.mark.parametrize("case", list(K_CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_groups_over_k_every_operand_and_output_kind(case, dtype):
    """The weight gradient of experts, ``x.T @ dY`` per group (A a transposed view, as
    autograd has it), with the batched operands of a (G, M, N) problem: per-group full,
    per-row and per-column vectors, a shared full tensor, a scalar; a per-row reduction
    and a per-group total. Empty groups give the epilogue of a zero accumulator."""
    sizes, T = K_CASES[case]
    G, M, N = len(sizes), 24, 20
    x, dY = rand(T, M, dtype=dtype), rand(T, N, dtype=dtype)
    offs = offs_of(sizes)
    ops = dict(C=rand(G, M, N, dtype=dtype), r=rand(G, M, 1), c=rand(G, 1, N), S=rand(M, N),
               alpha=0.25)
    epi = """def e(accum, C, r, c, S, alpha):
    D = alpha * accum + C * r + c
    E = relu(D) - S
    R = sum(E)
    Z = max(D)
    return D, E, R, Z"""
    outs = dict(D=torch.empty(G, M, N, dtype=dtype), R=torch.empty(G, M, 1),
                Z=torch.empty(G, 1, 1))
    D, E, R, Z = evtfuse.grouped_gemm(x.t(), dY, offs, epi, **ops, **outs)
    assert E.shape == (G, M, N) and E.dtype == dtype
    acc = k_groups_reference(x.t(), dY, offs)
    want_D = 0.25 * acc + ops["C"].float() * ops["r"] + ops["c"]
    want_E = torch.relu(want_D.to(dtype).float()) - ops["S"]
    tol = dict(atol=3e-2, rtol=2e-2) if dtype == torch.float16 else dict(atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(D.float(), want_D, **tol)
    torch.testing.assert_close(E.float(), want_E, **tol)
    ref = evaluate_grouped(epi, x.t(), dY, offs, {**ops, "D": D, "E": E, "R": R, "Z": Z})
    for name, t in (("R", R), ("Z", Z)):
        torch.testing.assert_close(t.float(), ref[name].float(), **tol, msg=lambda m: f"{name}: {m}")


def test_groups_over_k_identity_allocated_offsets_past_t_and_gated():
    """The identity epilogue allocates (G, M, N); offsets past T are clamped to it; a
    gated epilogue over K takes B (T, 2N) and gives (G, M, N)."""
    M, N, T = 10, 14, 30
    A, B = rand(M, T), rand(T, N)
    offs = torch.tensor([12, 12, 99], dtype=torch.int32)
    D = evtfuse.grouped_gemm(A, B, offs)
    assert D.shape == (3, M, N)
    want = torch.stack([A[:, :12] @ B[:12], torch.zeros(M, N), A[:, 12:] @ B[12:]])
    torch.testing.assert_close(D, want, atol=1e-4, rtol=1e-4)
    G2 = evtfuse.grouped_gemm(A, B, offs, "def e(accum):\n    g, u = pairs(accum)\n"
                              "    D = silu(g) * u\n    return D")
    acc = torch.stack([A[:, :12] @ B[:12], torch.zeros(M, N), A[:, 12:] @ B[12:]])
    torch.testing.assert_close(G2, torch.nn.functional.silu(acc[..., 0::2]) * acc[..., 1::2],
                               atol=1e-4, rtol=1e-4)


def test_groups_over_k_empty_dimensions():
    offs = offs_of([3, 2])
    assert evtfuse.grouped_gemm(rand(0, 5), rand(5, 4), offs).shape == (2, 0, 4)
    assert evtfuse.grouped_gemm(rand(3, 5), rand(5, 0), offs).shape == (2, 3, 0)
    zero = evtfuse.grouped_gemm(rand(3, 0), rand(0, 4), offs_of([0, 0]))
    assert zero.shape == (2, 3, 4) and (zero == 0).all()


def test_groups_over_k_refuse_a_misshaped_output():
    A, B, offs = rand(8, 16), rand(16, 12), offs_of([10, 6])
    with pytest.raises(EpilogueError, match="give it the shape \\(L, M, N\\)") as e:
        evtfuse.grouped_gemm(A, B, offs, D=torch.empty(8, 12))
    assert e.value.variable == "D"


def test_groups_over_k_compile_fullgraph_aot_eager():
    A, B, offs, bias = rand(12, 30), rand(30, 20), offs_of([10, 5, 15]), rand(3, 1, 20)

    def f(A, B, offs, bias):
        return evtfuse.grouped_gemm(A, B, offs, "def e(accum, bias): D = accum + bias; return D",
                                    bias=bias)

    import torch._dynamo

    torch._dynamo.reset()
    assert torch._dynamo.explain(f)(A, B, offs, bias).graph_break_count == 0
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(A, B, offs, bias)
    torch.testing.assert_close(got, f(A, B, offs, bias))
    torch.testing.assert_close(got, k_groups_reference(A, B, offs) + bias, atol=1e-4, rtol=1e-4)


def test_compile_fullgraph_aot_eager():
    G, T, K, N = 3, 30, 16, 20
    A, B, offs = rand(T, K), rand(G, K, N), offs_of([10, 5, 15])
    bias, w = rand(G, 1, N), rand(T, 1)

    def f(A, B, offs, bias, w):
        return evtfuse.grouped_gemm(A, B, offs, "def e(accum, bias, w): D = relu(accum + bias) * w; return D",
                                    bias=bias, w=w)

    import torch._dynamo

    torch._dynamo.reset()
    assert torch._dynamo.explain(f)(A, B, offs, bias, w).graph_break_count == 0
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(A, B, offs, bias, w)
    torch.testing.assert_close(got, f(A, B, offs, bias, w))


BAD = {
    "int64 offs": (lambda A, B, o: (A, B, o.long()), "offs must be torch.int32", "offs"),
    "2-D offs": (lambda A, B, o: (A, B, o[None]), "offs must be 1-D", "offs"),
    "offs not a tensor": (lambda A, B, o: (A, B, [4, 8]), "offs must be a torch.Tensor", "offs"),
    "groups differ": (lambda A, B, o: (A, B, o[:1]), "offs has 1 groups but B", "offs"),
    "offs on meta": (lambda A, B, o: (A, B, o.to("meta")), "keep the offsets on A's device", "offs"),
    "3-D A": (lambda A, B, o: (A[None], B, o), "A must be (T, K)", "A"),
    "4-D B": (lambda A, B, o: (A, B[None], o), "B must be (G, K, N)", "B"),
    "3-D A over K": (lambda A, B, o: (A[None], B[0], o), "A must be (M, T)", "A"),
    "T differs over K": (lambda A, B, o: (A, B[0, :10], o), "differs from B's K", "B"),
    "K differs": (lambda A, B, o: (A[:, :8], B, o), "differs from B's K", "B"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_inputs(case):
    make, phrase, variable = BAD[case]
    A, B, offs = rand(8, 16), rand(2, 16, 12), offs_of([4, 4])
    with pytest.raises(EpilogueError, match=re.escape(phrase)) as e:
        evtfuse.grouped_gemm(*make(A, B, offs))
    assert e.value.variable == variable


def test_bad_operands_and_outputs():
    A, B, offs = rand(8, 16), rand(2, 16, 12), offs_of([4, 4])
    with pytest.raises(EpilogueError, match="a tensor with rows has no group dimension") as e:
        evtfuse.grouped_gemm(A, B, offs, "def e(accum, C): D = accum + C; return D",
                             C=rand(2, 8, 12))
    assert e.value.variable == "C"
    with pytest.raises(EpilogueError, match="a per-row reduction .sum. of a grouped GEMM has "
                       "no group dimension") as e:
        evtfuse.grouped_gemm(A, B, offs, "def e(accum): D = accum; R = sum(D); return D, R",
                             R=torch.empty(2, 8, 1))
    assert e.value.variable == "R"
    with pytest.raises(EpilogueError, match="stores full .T, N. outputs and per-row"):
        evtfuse.grouped_gemm(A, B, offs, "def e(accum, b): D = accum; E = b * 2.0; return D, E",
                             b=rand(2, 1, 12), E=torch.empty(2, 1, 12))
    with pytest.raises(EpilogueError, match="does not broadcast"):
        evtfuse.grouped_gemm(A, B, offs, "def e(accum, b): D = accum + b; return D",
                             b=rand(3, 1, 12))


def test_a_copy_with_new_values_stays_grouped():
    """The tuner times candidates on scratch outputs (``EpilogueArguments.with_values``):
    the copy of a grouped problem's arguments binds as grouped, its (T, N) D included."""
    A, B, offs = rand(8, 16), rand(3, 16, 12), offs_of([4, 0, 4])
    D = torch.empty(8, 12)
    args = GemmArguments(A, B, D, offs=offs,
                         epilogue=EpilogueArguments.unbound("def e(accum): D = accum; return D", D=D))
    scratch = torch.empty_like(D)
    copy = args.epilogue.with_values(D=scratch)
    assert repr(copy.dag) == repr(args.epilogue.dag) and copy.values["D"] is scratch


def test_other_families_refuse_with_a_reason():
    A, B, offs = rand(8, 16), rand(2, 16, 12), offs_of([4, 4])
    D = torch.empty(8, 12)
    args = GemmArguments(A, B, D, offs=offs,
                         epilogue=EpilogueArguments.unbound("def e(accum): D = accum; return D", D=D))
    text = evtfuse.explain(args)
    assert "gluon: refused: grouped GEMMs" in text and "portable: supported" in text
    # the hopper family runs them on sm_90 (tests/test_grouped_hopper_cpu.py)
    assert "hopper: refused: TMA kernels run under the interpreter only" in text
    assert "hopper: supported" in evtfuse.explain(args, cc=90)
    k = evtfuse.get_kernels(args)[0]
    with pytest.raises(UnsupportedError, match="grouped"):
        k.verify(args)


_OFFLINE_SCRIPT = """
import json, torch
from evtfuse import EpilogueArguments, GemmArguments
from evtfuse.backends.triton.families import PortableFamily, TileConfig
from evtfuse.runtime.offline import compile_for
G, T, K, N = 8, 4096, 1024, 2048
dt = torch.bfloat16
A, W = torch.empty(T, K, dtype=dt), torch.empty(G, N, K, dtype=dt)
bias, w = torch.empty(G, 1, N, dtype=dt), torch.empty(T, 1, dtype=torch.float32)
D = torch.empty(T, N, dtype=dt)
offs = torch.zeros(G, dtype=torch.int32)
epi = EpilogueArguments.unbound("def e(accum, bias, w): D = silu(accum + bias) * w; return D",
                                bias=bias, w=w, D=D)
args = GemmArguments(A, W.mT, D, epilogue=epi, offs=offs)
c = compile_for(PortableFamily(), TileConfig(128, 128, 64, 8, 8, 3), args)
print("RESULT" + json.dumps({"shared": c.shared_bytes, "spills": c.spills,
                             "ld_offs": c.ptx.count("ld.global")}))
"""


@pytest.mark.slow
def test_grouped_kernel_compiles_for_sm90():
    """The grouped portable kernel (bf16, an expert weight as W.mT, bias and routing
    weights) compiles offline to an sm_90 cubin."""
    got = run_offline(_OFFLINE_SCRIPT, timeout=600)
    assert got["shared"] > 0 and got["ld_offs"] > 0, got
