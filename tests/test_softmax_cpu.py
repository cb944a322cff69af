"""Reductions feeding computation through the CPU interpreter: softmax, log_softmax, mean,
a logsumexp or a mean used after it (RMS norm), in one pass (a tile spans the row: N up to
64 under the interpreter) and in two passes (wider rows; the hopper family always).

Every kernel result is checked twice: by ``Kernel.verify`` (NaN-poisoned outputs against
the reference evaluator) and against an independent torch computation (torch.softmax,
torch.log_softmax, torch.mean) of the same fp32 accumulator. Also: special values (rows
with +inf, -inf, NaN, all -inf), which plan ``explain`` names, the errors (a reduction of a
reduction's result, an unused reduction, a gradient through a shifted_sumexp of one's own,
grouped GEMMs), the gradients of softmax and of reductions feeding computation (a max with
ties, per column and whole; their backward kernels on the hopper family too) and an
offline sm_90 compile of the new kernels.
"""

from __future__ import annotations

import pytest
import torch

from evtfuse import EpilogueArguments, GemmArguments, explain, get_kernels
from evtfuse.errors import EpilogueError
from offline_run import run_offline

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-interpreter tier")

GEN = torch.Generator().manual_seed(35)
ONE, TWO = 40, 70  # N of one tile (one pass) and of several (two passes) under the interpreter


def rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=GEN).to(dtype)


def run(src, M, N, K=16, L=1, ab=torch.float16, out=torch.float32, family="portable",
        extra=None, **values):
    """Build, check the plan, verify against the reference; the args and the accumulator."""
    lead = (L,) if L > 1 else ()
    A, B = rand(*lead, M, K, dtype=ab), rand(*lead, K, N, dtype=ab)
    D = torch.empty(*lead, M, N, dtype=out)
    outs = dict(extra or {})
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(src, D=D, **values, **outs))
    cc = 90 if family == "hopper" else None
    ks = [k for k in get_kernels(args, cc=cc) if k.family.name == family]
    assert ks, explain(args, cc=cc)
    result = ks[0].verify(args)
    assert result, result.report()
    acc = torch.matmul(A.float(), B.float())
    return args, acc, D, outs


def close(got, want, dtype):
    tol = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1.2e-2}[dtype]
    torch.testing.assert_close(got.float(), want.to(dtype).float(), rtol=tol, atol=tol,
                               equal_nan=True)


@pytest.mark.parametrize("N", [ONE, TWO])
@pytest.mark.parametrize("out", [torch.float32, torch.float16])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.cover
def test_softmax_full_output(op, out, N):
    args, acc, D, _ = run(f"def epi(accum, bias): D = {op}(accum + bias); return D", 37, N,
                          out=out, bias=rand(N))
    want = getattr(torch, op)(acc + args.epilogue.values["bias"], dim=-1)
    close(D, want, out)
    plan = "one pass" if N == ONE else "two passes"
    assert f"portable: supported ({plan}" in explain(args)


@pytest.mark.parametrize("N", [ONE, TWO])
def test_softmax_batched_fp32_inputs(N):
    args, acc, D, _ = run("def epi(accum): D = softmax(accum * 0.5); return D", 19, N, L=2,
                          ab=torch.float32)
    close(D, torch.softmax(acc * 0.5, dim=-1), torch.float32)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on the rows' inf - inf, on purpose
@pytest.mark.parametrize("N", [ONE, TWO])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_special_rows(op, N):
    """Rows with +inf, -inf, NaN, all -inf (NaN, as torch), from a full operand C."""
    M = 6
    C = torch.zeros(M, N)
    C[0, 3] = float("inf")
    C[1, :5] = float("-inf")
    C[2, 7] = float("nan")
    C[3, :] = float("-inf")
    C[4, 1], C[4, 2] = float("inf"), float("-inf")
    args, acc, D, _ = run(f"def epi(accum, C): D = {op}(accum + C); return D", M, N, C=C)
    want = getattr(torch, op)(acc + C, dim=-1)
    close(D, want, torch.float32)
    assert torch.isnan(D[3]).all() and torch.isnan(D[0]).all() and torch.isnan(D[2]).all()


def _large_rows(N: int) -> torch.Tensor:
    """Rows whose max is large against the log of their sum of exp: where logsumexp =
    max + log(sum) rounds log(sum) away (1e8: entirely; 1e4: ~2^-10)."""
    g = torch.Generator().manual_seed(36)
    rows = torch.zeros(8, N)
    rows[0, :2] = 1e8                                            # [1e8, 1e8, 0, ...]
    rows[1] = -1e8 + 8.0 * torch.arange(N) % 24                  # -1e8 + 0, 8, 16 (exact)
    rows[2] = 1e4 + torch.randn(N, generator=g)
    rows[3] = -1e4 + 3.0 * torch.randn(N, generator=g)
    rows[4] = 1e4 * torch.randn(N, generator=g)                  # mixed signs, ~3e4
    rows[5, ::2], rows[5, 1::2] = 1e8, -1e8                      # mixed: +-1e8
    rows[6] = 1e8 + 8.0 * (torch.arange(N) % 3)
    rows[7] = 20.0 * torch.randn(N, generator=g) + 1e6
    return rows


@pytest.mark.parametrize("family,N,plan", [("portable", ONE, "one pass"),
                                          ("portable", TWO, "two passes"),
                                          ("hopper", ONE, "two passes")])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
# a row whose max is -1e8: exp(x - max) overflows in the tile's columns past N (x = 0
# there, never stored): numpy warns; a select on the column mask per element would not
@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
@pytest.mark.cover("op")
def test_softmax_of_large_magnitude_rows(op, family, N, plan):
    """As torch computes them, exp(x - m) / s and (x - m) - log(s), in both plans: not
    through lse = m + log(s), which is m itself in fp32 where |m| is large ([1e8, 1e8]:
    softmax [1, 1] for [0.5, 0.5], log_softmax 0 for -0.693)."""
    X = _large_rows(N)
    A, B = torch.zeros(X.shape[0], 16), torch.zeros(16, N)
    D = torch.full(X.shape, -1234.5)
    src = f"def epi(accum, X): D = {op}(X); return D"
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(src, X=X, D=D))
    cc = 90 if family == "hopper" else None
    assert f"{family}: supported ({plan}" in explain(args, cc=cc)
    k = next(k for k in get_kernels(args, cc=cc) if k.family.name == family)
    result = k.verify(args)
    assert result, result.report()
    k.run(args)
    want = getattr(torch, op)(X, dim=-1)
    assert abs(float(want[0, 0]) - (0.5 if op == "softmax" else -0.6931472)) < 1e-6
    torch.testing.assert_close(D, want, rtol=2e-6, atol=1e-7 if op == "log_softmax" else 1e-44)


@pytest.mark.parametrize("family", ["hopper", "gluon", "portable"])
def test_first_pass_reduces_the_max_and_shifted_sumexp(family):
    """Two passes on an sm_90 GPU (N = 1000): the first pass's reductions are the row's max
    (folded in the kernel) and shifted_sumexp (logsumexp's partials, combined after the
    kernel); no logsumexp. The gluon family's first pass goes through the same emitters."""
    from evtfuse.backends.triton.codegen import generate
    from evtfuse.backends.triton.families import (GluonFamily, HopperFamily, PortableFamily,
                                                  Target)
    from evtfuse.backends.triton.spec import combined_after, reduce_outputs
    from evtfuse.runtime.two_pass import judged

    M, N, K = 256, 1000, 64
    A, B = torch.empty(M, K, dtype=torch.bfloat16), torch.empty(K, N, dtype=torch.bfloat16)
    D = torch.empty(M, N, dtype=torch.bfloat16)
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(
        "def epi(accum): D = log_softmax(accum); return D", D=D))
    fam = {"hopper": HopperFamily(), "gluon": GluonFamily(), "portable": PortableFamily()}[family]
    target = Target("cuda", 90, A.device, 132)
    first = judged(fam, args, target)
    assert first is not args
    dag = first.optimized_dag
    assert sorted(o.node.op for o in reduce_outputs(dag)) == ["max", "shifted_sumexp"]
    assert [o.node.op for o in combined_after(dag, family)] == ["shifted_sumexp"]
    code = generate(fam.spec(first, fam.configs(first, target)[0], target))
    assert "_ef_lse_part_cuda(" in code and "_ef_fold(" in code and "tl.log(" not in code


def test_softmax_on_the_hopper_family_two_passes():
    args, acc, D, _ = run("def epi(accum): D = softmax(accum); return D", 37, ONE,
                          family="hopper")
    close(D, torch.softmax(acc, dim=-1), torch.float32)
    assert "hopper: supported (two passes" in explain(args, cc=90)


@pytest.mark.parametrize("N", [ONE, TWO])
def test_logsumexp_feeding_computation_and_returned(N):
    lse = torch.empty(37, 1)
    args, acc, D, _ = run("def epi(accum): lse = logsumexp(accum); D = exp(accum - lse); "
                          "return D, lse", 37, N, extra={"lse": lse})
    close(D, torch.softmax(acc, dim=-1), torch.float32)
    close(lse, torch.logsumexp(acc, dim=-1, keepdim=True), torch.float32)


@pytest.mark.parametrize("N", [ONE, TWO])
@pytest.mark.parametrize("out", [torch.float32, torch.float16])
def test_rms_norm(N, out):
    src = ("def epi(accum, w):\n"
           "    ms = mean(accum * accum)\n"
           "    D = accum * rsqrt(ms + 1e-6) * w\n"
           "    return D")
    w = rand(N)
    args, acc, D, _ = run(src, 21, N, out=out, w=w)
    want = acc * torch.rsqrt((acc * acc).mean(dim=-1, keepdim=True) + 1e-6) * w
    close(D, want, out)


SHAPES = {"row": (lambda L, M, N: (M, 1), lambda a: a.mean((0, -1), keepdim=True)),
          "col": (lambda L, M, N: (N,), lambda a: a.mean((0, -2))),
          "all": (lambda L, M, N: (1,), lambda a: a.mean().reshape(1)),
          "row_b": (lambda L, M, N: (L, M, 1), lambda a: a.mean(-1, keepdim=True)),
          "col_b": (lambda L, M, N: (L, 1, N), lambda a: a.mean(-2, keepdim=True)),
          "all_b": (lambda L, M, N: (L, 1, 1), lambda a: a.mean((-2, -1), keepdim=True))}


@pytest.mark.parametrize("N", [ONE, TWO])
@pytest.mark.parametrize("where", list(SHAPES))
def test_mean(where, N):
    L, M = 2, 23
    shape, ref = SHAPES[where]
    r = torch.empty(shape(L, M, N))
    args, acc, D, _ = run("def epi(accum): D = accum; r = mean(accum * 2.0); return D, r",
                          M, N, L=L, extra={"r": r})
    close(r, ref(acc * 2.0).reshape(r.shape), torch.float32)


def test_mean_divides_after_the_sum():
    """Subnormal terms: sum(x / N) would flush them to 0; the sum, then the division, keeps
    torch.mean's value."""
    N, M = 40, 8
    C = torch.full((M, N), 2.0 ** -140)
    r = torch.empty(M, 1)
    args, acc, D, _ = run("def epi(accum, C): D = accum; r = mean(accum * 0.0 + C); "
                          "return D, r", M, N, C=C, extra={"r": r})
    want = C.mean(-1, keepdim=True)
    assert want.min() > 0
    torch.testing.assert_close(r, want, rtol=1e-6, atol=0)


def _error(src, **values):
    with pytest.raises(EpilogueError) as e:
        A, B = rand(8, 4), rand(4, 16)
        D = torch.empty(8, 16)
        GemmArguments(A, B, D, epilogue=EpilogueArguments(src, D=D, **values))
    return str(e.value)


@pytest.mark.parametrize("family", ["portable", "hopper"])
@pytest.mark.parametrize("N", [ONE, 72])  # rows of 16-byte multiples (the hopper family's TMA)
@pytest.mark.parametrize("expr", ["t", "t * 1.0"])
def test_a_reduction_stored_whole_in_a_full_output(expr, N, family):
    """``t = sum(accum); D = t`` (or ``t * 1.0``, folded to it): D holds the row's sum on
    every element (``passes.broadcast_stores``; code generation once failed on it with a
    KeyError), in one pass or two."""
    src = f"def epi(accum):\n    t = sum(accum)\n    D = {expr}\n    return D"
    _, acc, D, _ = run(src, 19, N, L=2, family=family)
    close(D, acc.sum(-1, keepdim=True).expand_as(acc), torch.float32)


def test_errors():
    msg = _error("def epi(accum):\n    lse = logsumexp(accum)\n    s = sum(accum - lse)\n"
                 "    D = accum\n    return D, s", s=torch.empty(8, 1))
    assert "reduces a value computed from another reduction" in msg and "line 3" in msg
    msg = _error("def epi(accum):\n    D = softmax(softmax(accum))\n    return D")
    assert "of a value computed from a reduction" in msg and "line 2" in msg
    msg = _error("def epi(accum):\n    s = sum(accum)\n    D = accum\n    return D")
    assert "never returned or used" in msg and "'s'" in msg


@pytest.mark.parametrize("mode", ["recompute", "save"])
@pytest.mark.parametrize("N", [ONE, TWO])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.cover
def test_gradients_through_softmax(op, N, mode):
    """softmax and log_softmax differentiated (their max a shift, ``ir.is_shift``: the
    backward reads the forward's max and shifted_sumexp and sums over each row itself, in
    one pass or two), with respect to A, B, a full operand inside the row function and a
    bias after it, two batches, against torch's own softmax in float64."""
    import evtfuse

    A0, B0, C0, b0 = rand(2, 24, 8), rand(2, 8, N), rand(2, 24, N), rand(N)
    src = f"def epi(accum, C, bias):\n    t = {op}(accum * 0.5 + C)\n    D = t * C + bias\n    return D"
    A, B, C, bias = (t.clone().requires_grad_() for t in (A0, B0, C0, b0))
    D = evtfuse.gemm(A, B, src, backward=mode, C=C, bias=bias, D=torch.empty(2, 24, N))
    g = rand(2, 24, N)
    D.backward(g)
    tA, tB, tC, tb = (t.clone().double().requires_grad_() for t in (A0, B0, C0, b0))
    tD = getattr(torch, op)(tA @ tB * 0.5 + tC, dim=-1) * tC + tb
    tD.backward(g.double())
    for got, want in ((A.grad, tA.grad), (B.grad, tB.grad), (C.grad, tC.grad), (bias.grad, tb.grad)):
        assert (got.double() - want).norm() <= 1e-5 * want.norm()


@pytest.mark.parametrize("mode", ["recompute", "save"])
@pytest.mark.parametrize("N", [ONE, TWO])
@pytest.mark.cover
def test_gradients_through_a_max_feeding_computation(N, mode):
    """A per-row max and min feeding computation differentiated as torch's amax and amin:
    the gradient shared evenly among tied elements, as the mask the forward kept marks them
    (a recomputed accumulator differs in its last bits). Rows 0 to 6 are all zeros after
    the relu: every element ties."""
    import evtfuse

    A0, B0, r0 = rand(24, 8), rand(8, N).abs(), rand(24, 1)
    A0[:7] = -A0[:7].abs()
    src = ("def epi(accum, rowv):\n    m = max(relu(accum))\n    n = min(accum * rowv)\n"
           "    D = accum / (m + 1.0) + n\n    return D, m")
    A, B, rowv = (t.clone().requires_grad_() for t in (A0, B0, r0))
    D, m = evtfuse.gemm(A, B, src, backward=mode, rowv=rowv, D=torch.empty(24, N),
                        m=torch.empty(24, 1))
    gD, gm = rand(24, N), rand(24, 1)
    torch.autograd.backward((D, m), (gD, gm))
    tA, tB, tr = (t.clone().double().requires_grad_() for t in (A0, B0, r0))
    acc = tA @ tB
    tm = torch.relu(acc).amax(-1, keepdim=True)
    tD = acc / (tm + 1.0) + (acc * tr).amin(-1, keepdim=True)
    torch.autograd.backward((tD, tm), (gD.double(), gm.double()))
    for got, want in ((A.grad, tA.grad), (B.grad, tB.grad), (rowv.grad, tr.grad)):
        assert (got.double() - want).norm() <= 1e-5 * want.norm()


@pytest.mark.parametrize("mode", ["recompute", "save"])
@pytest.mark.parametrize("M", [24, 80])  # the columns within one tile's rows, or several
@pytest.mark.cover("M")
def test_gradients_through_column_and_whole_reductions_feeding_computation(M, mode):
    """A per-column mean (centring the columns) and a whole-output absmax scale, both
    returned per batch and feeding computation, differentiated (the backward sums over
    each column and over everything, returning those sums as scratch outputs:
    ``BackwardPlan.scratch``), two batches, against torch in float64."""
    import evtfuse

    N = 40
    A0, B0, b0 = rand(2, M, 8), rand(8, N), rand(N)
    src = ("def epi(accum, bias):\n    c = mean(accum * bias)\n    s = max(abs(accum))\n"
           "    D = (accum - c) / s\n    return D, c, s")
    A, B, bias = (t.clone().requires_grad_() for t in (A0, B0, b0))
    D, c, sc = evtfuse.gemm(A, B, src, backward=mode, bias=bias, D=torch.empty(2, M, N),
                            c=torch.empty(2, 1, N), s=torch.empty(2, 1, 1))
    gD, gc, gs = rand(2, M, N), rand(2, 1, N), rand(2, 1, 1)
    torch.autograd.backward((D, c, sc), (gD, gc, gs))
    tA, tB, tb = (t.clone().double().requires_grad_() for t in (A0, B0, b0))
    acc = tA @ tB
    tc = (acc * tb).mean(1, keepdim=True)
    ts = acc.abs().amax((1, 2), keepdim=True)
    torch.autograd.backward(((acc - tc) / ts, tc, ts), (gD.double(), gc.double(), gs.double()))
    for got, want in ((A.grad, tA.grad), (B.grad, tB.grad), (bias.grad, tb.grad)):
        assert (got.double() - want).norm() <= 1e-5 * want.norm()


@pytest.mark.parametrize("src", [
    "def epi(accum, bias): D = softmax(accum + bias); return D",
    "def epi(accum):\n    m = max(relu(accum))\n    D = accum * m\n    return D",
    "def epi(accum, bias):\n    c = mean(accum * bias)\n    s = max(abs(accum))\n"
    "    D = (accum - c) / s\n    return D, c, s",
], ids=["softmax", "row_max_ties", "column_and_whole"])
def test_backward_kernels_on_the_hopper_family(src):
    """The backward epilogues of reductions feeding computation (softmax's shift, a max's
    tie mask, scratch sums over columns and everything) on the hopper family, as an sm_90
    GPU runs them in "recompute" mode, verified under the interpreter (evtfuse.gemm on the
    CPU runs the portable family)."""
    from evtfuse import autodiff
    from evtfuse.frontend import bind, parse_epilogue
    from evtfuse.runtime.autograd import caller_reductions

    M, N = 37, 80  # N: the uint8 tie mask's rows 16-byte aligned, as TMA needs
    parsed = parse_epilogue(src)
    given = dict(bias=rand(N), D=torch.empty(M, N), c=torch.empty(N), s=torch.empty(1))
    given = {k: v for k, v in given.items() if k in parsed.params or k in parsed.outputs}
    wrt = {"accum"} | ({"bias"} if "bias" in parsed.params else set())
    plan = autodiff.plan_forward(bind(parsed, given, (1, M, N)), wrt, parsed)
    bp = caller_reductions(autodiff.backward(
        plan, [o.name for o in plan.differentiable_outputs()], wrt))
    shapes = {"FULL": (M, N), "PER_ROW": (M, 1), "PER_COL": (N,), "DEVICE_SCALAR": (1,)}
    ops = {spec.name: (rand(*shapes[spec.kind.name]) > 0 if spec.dtype == torch.uint8
                       else rand(*shapes[spec.kind.name])).to(spec.dtype)
           for spec in bp.dag.operands}
    outs = {o.name: torch.empty({"FULL": (M, N), "ROW": (M, 1), "COL": (N,), "SCALAR": (1,)}
                                [o.kind.name]) for o in bp.dag.outputs if o.kind.name != "NONE"}
    D = outs.pop("D", None)
    args = GemmArguments(rand(M, 16, dtype=torch.float16), rand(16, N, dtype=torch.float16), D,
                         epilogue=EpilogueArguments(bp.source, D=D, **ops, **outs))
    ks = [k for k in get_kernels(args, cc=90) if k.family.name == "hopper"]
    assert ks, explain(args, cc=90)
    result = ks[0].verify(args)
    assert result, result.report()


def test_gradient_through_a_shifted_sumexp_of_ones_own_is_refused():
    """No silent detach: a shifted_sumexp written on its own (no shift beside it, as
    softmax has) raises at the forward call, naming the line."""
    import evtfuse

    A = rand(8, 4).requires_grad_()
    B = rand(4, 16)
    with pytest.raises(EpilogueError, match="line 3.*shifted_sumexp.*outside softmax"):
        evtfuse.gemm(A, B, "def epi(accum):\n    D = accum\n    s = shifted_sumexp(accum)\n"
                     "    return D, s", D=torch.empty(8, 16), s=torch.empty(8, 1))


@pytest.mark.parametrize("N", [16, 80])
def test_gradients_through_a_mean_and_an_rms_norm(N):
    """A mean's gradient (its count: N here, bound per problem size, not over the
    placeholder sizes the autograd layer builds other forwards with) and an RMS norm's
    (its backward sums over each row: a reduction feeding computation, one pass where a
    tile spans the row, else two) through evtfuse.gemm, against torch's, at two widths."""
    import evtfuse

    A0, B0, r0 = rand(24, 8), rand(8, N), rand(24, 1)
    src = ("def epi(accum, rowv):\n    ms = mean(accum * accum)\n"
           "    D = accum * rsqrt(ms + 1e-5) * rowv\n    m = mean(accum)\n    return D, m")
    A, B, rowv = (t.clone().requires_grad_() for t in (A0, B0, r0))
    D, m = evtfuse.gemm(A, B, src, rowv=rowv, D=torch.empty(24, N), m=torch.empty(24, 1))
    gD, gm = rand(24, N), rand(24, 1)
    torch.autograd.backward((D, m), (gD, gm))
    tA, tB, tr = (t.clone().double().requires_grad_() for t in (A0, B0, r0))
    acc = tA @ tB
    tD = acc * torch.rsqrt((acc * acc).mean(1, keepdim=True) + 1e-5) * tr
    torch.autograd.backward((tD, acc.mean(1, keepdim=True)), (gD.double(), gm.double()))
    for got, want in ((A.grad, tA.grad), (B.grad, tB.grad), (rowv.grad, tr.grad)):
        assert (got.double() - want).norm() <= 1e-4 * want.norm()


def test_grouped_refused():
    import evtfuse

    A, B = rand(8, 4), rand(2, 4, 16)
    offs = torch.tensor([4, 8], dtype=torch.int32)
    with pytest.raises(EpilogueError, match="grouped GEMMs do not run reductions that feed computation"):
        evtfuse.grouped_gemm(A, B, offs, "def epi(accum): D = softmax(accum); return D")


_OFFLINE_SCRIPT = """
import json, torch
from evtfuse import EpilogueArguments, GemmArguments
from evtfuse.backends.triton.families import Target
from evtfuse.runtime.kernel import second_kernel
from evtfuse.runtime.offline import compile_for, offered
from evtfuse.runtime.two_pass import judged, plan_name, staged
out = {}
for N in (128, 1000):
    M, K = 1024, 512
    A, B = torch.empty(M, K, dtype=torch.float16), torch.empty(K, N, dtype=torch.float16)
    D = torch.empty(M, N, dtype=torch.float16)
    src = "def epi(accum, bias): D = softmax(accum + bias); return D"
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(src, bias=torch.empty(N), D=D))
    target = Target("cuda", 90, A.device, 132, offline=True)
    seen = set()
    for fam, cfg in offered(args):
        if fam.name in seen or fam.name == "gluon":
            continue
        seen.add(fam.name)
        c = compile_for(fam, cfg, judged(fam, args, target))
        out[f"{N}-{fam.name}-{plan_name(fam, args, target)}"] = c.spills
    st = staged(args)
    k2 = second_kernel(st.args2, target)
    out[f"{N}-second-{k2.family.name}"] = compile_for(k2.family, k2.config, st.args2).spills
# the combine after a two-pass first pass finishes shifted_sumexp (the softmax denominator)
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from evtfuse.backends.triton.combine import combine_partials
sig = dict(ws="*fp32", ws2="*fp32", out="*fp32", T="i32", EXT="i32", osl="i32", os="i32",
           OP="constexpr", BLOCK="constexpr", PARTS="constexpr", PDL="constexpr")
consts = {(7,): "shifted_sumexp", (8,): 64, (9,): 16, (10,): True}
k = triton.compile(ASTSource(fn=combine_partials, signature=sig, constexprs=consts),
                   target=GPUTarget("cuda", 90, 32))
out["combine-shifted_sumexp"] = "cubin" in k.asm
print("RESULT" + json.dumps(out))
"""


@pytest.mark.slow
def test_softmax_kernels_compile_for_sm90():
    """The one-pass portable kernel (N = 128), the two-pass first passes (hopper, portable
    at N = 1000), the second pass and the combine that finishes shifted_sumexp compile
    offline to sm_90 cubins."""
    got = run_offline(_OFFLINE_SCRIPT, timeout=900)
    assert got.get("combine-shifted_sumexp") is True, got
    assert "128-portable-one pass" in got and "1000-portable-two passes" in got, got
    assert "128-hopper-two passes" in got and any(k.startswith("1000-second") for k in got), got
