"""The backward pass (``evtfuse.autodiff``) and the DAG printer (``evtfuse.unparse``), without
kernels: the backward DAG evaluated by the reference evaluator gives torch.autograd's
gradients of the reference evaluator (``grad_oracle``), for every operand kind (full,
per-row, per-column, device scalars, per-batch and shared), every output kind (full, not
stored, per-row / per-column / whole-output reductions of sum, max, min, logsumexp),
gradients into a subset of the outputs, each in both backward modes ("recompute": from
``accum``; "save": from the accumulator the forward stored); a row without a derivative
raises naming its line; the printed source of a DAG binds back to the same DAG."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given

import evtfuse
from evtfuse import autodiff, ir
from evtfuse.errors import EpilogueError
from evtfuse.frontend import bind, parse_epilogue
from evtfuse.unparse import literal, to_source

from epilogue_fuzz import cases, drawn
from grad_oracle import (GB, SHARED_OUTPUTS, SUBSET_OUTPUTS, assert_grads_close,
                         autodiff_grads, reference_grads, shared_outputs_values)

M, N, K = 6, 5, 4


def _rand(*shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed + 7 * len(shape) + sum(shape))
    return torch.randn(tuple(shape), generator=g, dtype=torch.float64) * scale


def _check(source, A, B, values, graded, wrt, what=""):
    want = reference_grads(source, A, B, values, graded, wrt)
    got = autodiff_grads(source, A, B, values, graded, wrt)
    assert_grads_close(got, want, rtol=1e-9, atol=1e-9, what=what)
    saved = autodiff_grads(source, A, B, values, graded, wrt, save=True)
    assert_grads_close(saved, want, rtol=1e-9, atol=1e-9, what=f"{what} (save mode)")
    return got


ALL_OPS = """
def epi(accum, C, bias, rowv, s):
    x = accum * 0.5 + bias
    a = relu(x) + leaky_relu(x, 0.2) + sigmoid(x) + tanh(x) + gelu(x) + gelu_tanh(x)
    b = silu(x) + hardswish(x) + softplus(x) + exp(-abs(x)) + log(abs(x) + 1.0) + log_sigmoid(x)
    c = sqrt(abs(x) + 0.5) + rsqrt(abs(x) + 1.0) + sin(x) + cos(x) + tan(x * 0.1) + erf(x)
    d = maximum(x, C) + minimum(x, rowv) + clamp(x, rowv, C + 2.0) + where(x > C, x, C)
    e = multiply_add(x, s, C) + x ** 2 + x ** 3 - x / (abs(C) + 1.0) + cast(x, "bf16")
    f = identity(x) - (-x) * (x < C) + x ** -1.5 * 0.0 + abs(x) ** 0.5
    D = a + b + c + d + e + f
    return D
"""


def test_every_op_of_the_table_through_one_epilogue():
    A, B = _rand(M, K), _rand(K, N, seed=1)
    values = dict(C=_rand(M, N, seed=2), bias=_rand(N, seed=3), rowv=_rand(M, 1, seed=4),
                  s=_rand(seed=5), D=torch.empty(M, N))
    _check(ALL_OPS, A, B, values, {"D": _rand(M, N, seed=6)}, {"C", "bias", "rowv", "s"})


@pytest.mark.parametrize("L", [1, 3])
def test_every_operand_kind(L):
    """Full (per batch and shared), per-row, per-column (N,) and (L,1,N), device scalars
    0-d, (1,) and per batch (L,1,1); Python numbers get none."""
    lead = (L,) if L > 1 else ()
    A, B = _rand(*lead, M, K), _rand(K, N, seed=1)  # B shared by the batches
    src = """
def epi(accum, C, Cs, bias, cb, rowv, s0, s1, sb, alpha):
    t = accum * s0 + C * cb + Cs * rowv
    D = sigmoid(t + bias) * s1 * alpha + sb * t
    return D
"""
    values = dict(C=_rand(*lead, M, N, seed=2), Cs=_rand(M, N, seed=3), bias=_rand(N, seed=4),
                  cb=_rand(*lead, 1, N, seed=5), rowv=_rand(*lead, M, 1, seed=6),
                  s0=_rand(seed=7), s1=_rand(1, seed=8), sb=_rand(*lead, 1, 1, seed=9),
                  alpha=0.75, D=torch.empty(*lead, M, N))
    wrt = {"C", "Cs", "bias", "cb", "rowv", "s0", "s1", "sb"}
    got = _check(src, A, B, values, {"D": _rand(*lead, M, N, seed=10)}, wrt, f"L={L}")
    assert got["sb"].shape == values["sb"].shape and got[GB].shape == (K, N)


@pytest.mark.parametrize("op", ["sum", "max", "min", "logsumexp"])
@pytest.mark.parametrize("axis", ["row", "col", "all"])
@pytest.mark.parametrize("L", [1, 2])
def test_every_reduction_output(op, axis, L):
    lead = (L,) if L > 1 else ()
    shape = {"row": (*lead, M, 1), "col": (*lead, 1, N) if L > 1 else (N,),
             "all": (L, 1, 1) if L > 1 else (1,)}[axis]
    A, B = _rand(*lead, M, K), _rand(*lead, K, N, seed=1)
    src = f"""
def epi(accum, bias):
    D = tanh(accum) * bias
    R = {op}(D * 2.0 + accum)
    return D, R
"""
    values = dict(bias=_rand(N, seed=2), D=torch.empty(*lead, M, N), R=torch.empty(shape))
    for graded in ({"R"}, {"D", "R"}):
        grads = {n: _rand(*values[n].shape, seed=3 + len(n)) for n in graded}
        _check(src, A, B, values, grads, {"bias"}, f"{op} {axis} {sorted(graded)}")


@pytest.mark.parametrize("L", [1, 2])
def test_stored_vectors_and_outputs_shared_by_the_batches(L):
    """Outputs that store a value once for many elements of (L, M, N): a per-row vector
    (M, 1), a per-column one (N,), a scalar (1,), a full (M, N) output of a value shared
    by the batches. Their gradient reaches the value once (not once per column, row or
    batch): the backward keeps it at one representative element (row 0, column 0, batch 0)
    of what the reductions of the operands' gradients then sum."""
    lead = (L,) if L > 1 else ()
    src, values = SHARED_OUTPUTS, shared_outputs_values(_rand, M, N, lead)
    graded = {n: _rand(*values[n].shape, seed=10 + k) for k, n in enumerate("DVWSE")}
    A, B = _rand(*lead, M, K), _rand(K, N, seed=1)
    for subset in ({"V"}, {"W", "S"}, {"E"}, set(graded)):
        _check(src, A, B, values, {n: graded[n] for n in subset}, {"C", "bias", "rowv", "s"},
               f"L={L} {sorted(subset)}")


def test_max_ties_share_the_gradient_and_lse_keeps_its_fp32_result():
    """Ties of a max (an operand repeated along the reduced axis) share the gradient as
    torch's amax; a bf16 logsumexp output gets a hidden fp32 copy for the backward."""
    A, B = _rand(M, K), _rand(K, N, seed=1)
    src = """
def epi(accum, rowv):
    D = accum
    m = max(rowv + accum * 0.0)
    lse = logsumexp(accum)
    return D, m, lse
"""
    values = dict(rowv=_rand(M, 1, seed=2), D=torch.empty(M, N), m=torch.empty(M, 1),
                  lse=torch.empty(M, 1, dtype=torch.bfloat16))
    graded = {"m": _rand(M, 1, seed=3), "lse": _rand(M, 1, seed=4)}
    _check(src, A, B, values, graded, {"rowv"})
    plan = autodiff.plan_forward(bind(parse_epilogue(src), values, (1, M, N)),
                                 {"accum", "rowv"})
    roles = {(s.of, s.role, s.hidden) for s in plan.saved}
    assert roles == {("m", "argument", True), ("lse", "result", True)}
    values["lse"] = torch.empty(M, 1)  # fp32: the output itself is the saved result
    plan = autodiff.plan_forward(bind(parse_epilogue(src), values, (1, M, N)), {"accum"})
    assert {(s.of, s.role, s.hidden) for s in plan.saved} == {("m", "argument", True),
                                                               ("lse", "result", False)}


def test_gradients_into_a_subset_of_outputs_and_unstored_ones():
    A, B = _rand(M, K), _rand(K, N, seed=1)
    src = SUBSET_OUTPUTS
    values = dict(C=_rand(M, N, seed=2), alpha=1.5, D=torch.empty(M, N), F=torch.empty(M, N),
                  G=None)
    for graded in ({"D"}, {"F"}, {"D", "F"}):
        grads = {n: _rand(M, N, seed=len(n) + 3) for n in graded}
        _check(src, A, B, values, grads, {"C"}, str(sorted(graded)))


def test_a_backward_with_nothing_to_compute_is_empty():
    src = "def e(accum, C):\n    D = accum\n    F = C * 2.0\n    return D, F"
    values = dict(C=_rand(M, N), D=torch.empty(M, N), F=torch.empty(M, N))
    plan = autodiff.plan_forward(bind(parse_epilogue(src), values, (1, M, N)), {"C"})
    assert autodiff.backward(plan, {"D"}, {"C"}).empty  # D does not depend on C
    bp = autodiff.backward(plan, {"F"}, {"C"})
    assert not bp.empty and dict(bp.outputs) == {"C": "grad_C"}
    assert "D = accum" not in bp.source or "return D" in bp.source


def test_the_backward_of_a_linear_layer_reads_no_accumulator():
    """D = accum + bias: dAccum is the upstream gradient itself and the bias's gradient its
    column sums; the printed backward never mentions accum after the passes."""
    src = evtfuse.nn.BIAS
    values = dict(bias=_rand(N), D=torch.empty(M, N))
    plan = autodiff.plan_forward(bind(parse_epilogue(src), values, (1, M, N)),
                                 {"accum", "bias"})
    bp = autodiff.backward(plan, {"D"}, {"accum", "bias"})
    assert not any(n.kind is ir.NodeKind.ACCUM for n in bp.dag.nodes)
    assert bp.source == ("def backward(accum, grad_D):\n    grad_bias = sum(grad_D)\n"
                         "    D = grad_D\n    return D, grad_bias\n")


def test_save_mode_reads_the_saved_accumulator_and_no_accum():
    """"save" mode: the forward stores accum as a hidden output (in the dtype asked, per
    batch when L > 1), the backward reads it as a full operand named by the namer (never a
    user's name: here an operand is called saved_accum) and no accumulator; a backward that
    reads no accumulator (a linear layer) saves nothing."""
    src = "def e(accum, saved_accum, bias):\n    D = gelu(accum * saved_accum + bias)\n    return D"
    for L in (1, 3):
        lead = (L,) if L > 1 else ()
        values = dict(saved_accum=_rand(M, N), bias=_rand(N), D=torch.empty(*lead, M, N))
        dag = bind(parse_epilogue(src), values, (L, M, N))
        plan = autodiff.plan_forward(dag, {"accum", "bias", "saved_accum"},
                                     save_accum=torch.bfloat16, batches=L)
        (kept,) = plan.saved_accums
        assert kept.name not in ("saved_accum", "D", "bias", "accum")
        assert (kept.dtype, kept.batched, kept.hidden) == (torch.bfloat16, L > 1, True)
        out = plan.augmented.output(kept.name)
        assert out.node.kind is ir.NodeKind.ACCUM and out.dtype is torch.bfloat16
        assert f"{kept.name} = accum" in to_source(plan.augmented)
        bp = autodiff.backward(plan, {"D"}, {"accum", "bias", "saved_accum"}, batches=L)
        assert not any(n.kind is ir.NodeKind.ACCUM for n in bp.dag.nodes)
        (op,) = [op for name, op in bp.saved if name == kept.name]
        spec = next(o for o in bp.dag.operands if o.name == op)
        assert spec.kind is ir.OperandKind.FULL and spec.dtype is torch.bfloat16
        assert spec.batched is (L > 1) and op not in values
    linear = autodiff.plan_forward(
        bind(parse_epilogue(evtfuse.nn.BIAS), dict(bias=_rand(N), D=torch.empty(M, N)),
             (1, M, N)), {"accum", "bias"}, save_accum=torch.bfloat16)
    assert linear.saved_accums == () and linear.augmented is linear.dag


def test_a_backward_of_operands_only_runs_no_gemm():
    """A backward that needs no dAccum and reads no accumulator (the gradient of a bias
    added after a linear layer) returns D as an unstored literal, not as accum."""
    values = dict(bias=_rand(N), D=torch.empty(M, N))
    plan = autodiff.plan_forward(bind(parse_epilogue(evtfuse.nn.BIAS), values, (1, M, N)),
                                 {"bias"})
    bp = autodiff.backward(plan, {"D"}, {"bias"})
    assert not any(n.kind is ir.NodeKind.ACCUM for n in bp.dag.nodes)
    assert bp.dag.output("D").kind is ir.OutputKind.NONE


def test_an_op_without_derivative_raises_naming_its_line():
    src = '''def e(accum, C):
    x = accum * 2.0
    q = cast(x, "int8") * 0.5
    D = q + C
    return D
'''
    values = dict(C=_rand(M, N), D=torch.empty(M, N))
    dag = bind(parse_epilogue(src), values, (1, M, N))
    for wrt in ({"accum"}, {"accum", "C"}):
        with pytest.raises(EpilogueError, match=r"line 3 of the epilogue string: cast\(\.\.\., dtype='int8'\) in "
                                                r"the value of 'q' has no derivative .*integer"):
            autodiff.plan_forward(dag, wrt, parse_epilogue(src))
    plan = autodiff.plan_forward(dag, {"C"}, parse_epilogue(src))  # C does not pass the cast
    assert dict(autodiff.backward(plan, {"D"}, {"C"}).outputs) == {"C": "grad_C"}


def test_a_row_without_derivative_raises_wherever_a_gradient_passes_it(monkeypatch):
    """A row whose ``grad`` is None: an error naming it, its variable and line when a
    gradient must pass it; none when no gradient does."""
    import dataclasses

    from evtfuse.optable import OPS

    monkeypatch.setitem(OPS, "erf", dataclasses.replace(OPS["erf"], grad=None))
    src = "def e(accum, C):\n    y = erf(C) * 2.0\n    D = accum + y\n    return D"
    parsed = parse_epilogue(src)
    dag = bind(parsed, dict(C=_rand(M, N), D=torch.empty(M, N)), (1, M, N))
    with pytest.raises(EpilogueError, match=r"line 2 .*erf\(\.\.\.\) in the value of 'y' has "
                                            r"no derivative \(the op table gives erf no "
                                            r"derivative\), and the gradient of C must flow"):
        autodiff.plan_forward(dag, {"C"}, parsed)
    autodiff.plan_forward(dag, {"accum"}, parsed)  # A and B's gradient does not pass erf


LATE = [  # reductions feeding computation, and values computed from them
    ("def e(accum, rowv):\n    D = accum\n    m = mean(accum * rowv)\n    return D, m",
     {"m": (M, 1)}, {"rowv"}),
    ("def e(accum, bias):\n    D = accum\n    c = mean(accum * 2.0 + bias)\n    return D, c",
     {"c": (N,)}, {"bias"}),
    ("def e(accum, s):\n    D = accum\n    w = mean(accum * s)\n    return D, w",
     {"w": (1,)}, {"s"}),
    ("def e(accum, rowv, bias):\n    m = mean(accum * accum)\n"
     "    D = accum * rsqrt(m + 1e-6) * rowv + bias\n    return D", {}, {"rowv", "bias"}),
    ("def e(accum, C):\n    lse = logsumexp(accum + C)\n    D = exp(accum - lse)\n"
     "    return D, lse", {"lse": (M, 1)}, {"C"}),
    ("def e(accum, rowv):\n    q = sum(accum * accum)\n    D = sqrt(q + 1.0) * rowv\n"
     "    return D", {}, {"rowv"}),
    ("def e(accum, C, bias):\n    D = softmax(accum * C) + bias\n    return D", {}, {"C", "bias"}),
    ("def e(accum, rowv):\n    t = log_softmax(accum + rowv)\n    D = t * t\n    return D", {},
     {"rowv"}),
    ("def e(accum, C):\n    m = max(abs(accum * C))\n    D = accum / m\n    return D, m",
     {"m": (M, 1)}, {"C"}),
    ("def e(accum, rowv):\n    m = min(relu(accum - 5.0))\n    D = accum * m + rowv\n    return D",
     {}, {"rowv"}),
    ("def e(accum, bias):\n    c = sum(accum * bias)\n    D = (accum - c * 0.25) * bias\n    return D, c",
     {"c": (N,)}, {"bias"}),
    ("def e(accum, C):\n    s = max(abs(accum * C))\n    D = accum / s\n    return D, s",
     {"s": (1,)}, {"C"}),
]


@pytest.mark.parametrize("L", [1, 3])
@pytest.mark.parametrize("src,outs,wrt", LATE, ids=["row_mean", "col_mean", "whole_mean",
                                                   "rms_norm", "lse_shift", "norm_stored",
                                                   "softmax", "log_softmax", "absmax",
                                                   "min_ties", "col_centre", "whole_absmax"])
def test_gradients_through_values_computed_from_reductions(src, outs, wrt, L):
    """A value computed from a reduction's result (per row, per column or whole; a mean:
    the sum over a count; a norm; a
    function of a logsumexp; softmax and log_softmax, whose max is a shift; a max or min,
    whose ties the backward counts in the mask the forward kept: rows of zeros after a
    relu tie everywhere) takes its gradient as a value of its own shape, which the
    reduction's rule broadcasts back over the tile; the backward reads the reduction's
    result as the forward stored it (only where a rule needs it)."""
    lead = (L,) if L > 1 else ()
    A, B = _rand(*lead, M, K), _rand(K, N, seed=1)
    shapes = {k: (*lead, *v) if v != (N,) and v != (1,) else ((L, 1, N) if v == (N,) else
                                                                (L, 1, 1)) if L > 1 else v
              for k, v in outs.items()}
    operands = dict(rowv=_rand(*lead, M, 1, seed=4), bias=_rand(N, seed=3), s=_rand(seed=5),
                    C=_rand(*lead, M, N, seed=6))
    values = dict({k: v for k, v in operands.items() if k in wrt}, D=torch.empty(*lead, M, N),
                  **{k: torch.empty(*v) for k, v in shapes.items()})
    graded = {k: _rand(*v, seed=10 + i) for i, (k, v) in enumerate(shapes.items())}
    graded["D"] = _rand(*lead, M, N, seed=9)
    _check(src, A, B, values, graded, wrt, what=src)
    dag = bind(parse_epilogue(src), values, (L, M, N))
    plan = autodiff.plan_forward(dag, {"accum", *wrt}, parse_epilogue(src), batches=L)
    # the backward reads a reduction's result where a rule needs it, not a mean's sum
    # (its gradient needs only the count)
    assert bool(plan.values) == ("mean(accum *" not in src or "rsqrt" in src), plan.values
    bwd = autodiff.backward(plan, set(graded), {"accum", *wrt}, batches=L).dag
    # read, not recomputed (a max's ties: a sum over the mask the forward kept)
    assert all(n.op not in ("logsumexp", "max", "min", "shifted_sumexp") for n in bwd.nodes)


@pytest.mark.parametrize("src,outs", [
    ("def e(accum):\n    c = sum(accum)\n    D = accum - c\n    return D, c", {"c": (N,)}),
    ("def e(accum):\n    s = max(abs(accum))\n    D = accum / s\n    return D, s", {"s": (1,)}),
    ("def e(accum):\n    r = mean(accum * accum)\n    D = accum * r\n    return D, r",
     {"r": (M, 1)}),
])
def test_gradients_through_a_reduction_shared_by_the_batches(src, outs):
    """A reduction stored without its L (shared by the batches: (N,), (1,), (M, 1)) that
    feeds a batched tile's computation: its gradient sums over L too (a scratch output of
    the backward, ``BackwardPlan.scratch``)."""
    L = 3
    A, B = _rand(L, M, K), _rand(K, N, seed=1)
    values = {"D": torch.empty(L, M, N), **{k: torch.empty(*v) for k, v in outs.items()}}
    graded = {"D": _rand(L, M, N, seed=9), **{k: _rand(*v, seed=10) for k, v in outs.items()}}
    _check(src, A, B, values, graded, set(), what=src)
    dag = bind(parse_epilogue(src), values, (L, M, N))
    plan = autodiff.plan_forward(dag, {"accum"}, parse_epilogue(src), batches=L)
    assert autodiff.backward(plan, set(graded), {"accum"}, batches=L).scratch


def test_comparisons_and_integer_outputs_carry_no_gradient():
    """A comparison's result used as 1.0 / 0.0 passes no gradient back; an integer output
    (a quantised copy) carries none, so its cast needs no derivative."""
    src = '''def e(accum, C):
    q = cast(accum, "int8")
    D = (accum > C) * accum
    return D, q
'''
    A, B = _rand(M, K), _rand(K, N, seed=1)
    values = dict(C=_rand(M, N, seed=2), D=torch.empty(M, N),
                  q=torch.empty(M, N, dtype=torch.int8))
    got = _check(src, A, B, values, {"D": _rand(M, N, seed=3)}, {"C"})
    assert (got["C"] == 0).all()


def test_the_printer_round_trips_the_bound_dag():
    values = dict(C=_rand(M, N, seed=2), bias=_rand(N, seed=3), rowv=_rand(M, 1, seed=4),
                  s=_rand(seed=5), D=torch.empty(M, N))
    dag = bind(parse_epilogue(ALL_OPS), values, (1, M, N))
    src = to_source(dag)
    again = bind(parse_epilogue(src), values, (1, M, N))
    assert ir.signature(again) == ir.signature(dag)
    assert literal(float("inf")) == "1e999" and literal(-0.0) == "-0.0"


@pytest.mark.parametrize("src,outs", [
    ("def e(accum):\n    D = accum\n    r = mean(accum)\n    return D, r", {"r": (M, 1)}),
    ("def e(accum):\n    D = accum\n    c = mean(accum * 2.0)\n    return D, c", {"c": (N,)}),
    ("def e(accum):\n    D = softmax(accum)\n    return D", {}),
    ("def e(accum):\n    m = mean(accum * accum)\n    D = accum * rsqrt(m + 1e-6)\n    return D",
     {}),
])
def test_the_printer_round_trips_lowered_rows(src, outs):
    """``mean`` (the frontend's sum over a count) is printed as ``mean``, and the
    reductions of a lowered row function (softmax's max and shifted_sumexp) under names of
    their own: read back, the same DAG (the printer once failed on both with a KeyError)."""
    values = {"D": torch.empty(M, N), **{k: torch.empty(*v) for k, v in outs.items()}}
    dag = bind(parse_epilogue(src), values, (1, M, N))
    again = bind(parse_epilogue(to_source(dag)), values, (1, M, N))
    assert ir.signature(again) == ir.signature(dag), to_source(dag)


@drawn(40, 1)
@given(cases())
def test_the_printer_round_trips_random_epilogues(case):
    args = case.arguments(17, 24, 8, torch.float32)
    dag = args.dag
    src = to_source(dag)
    again = bind(parse_epilogue(src), args.epilogue.values, args.problem)
    assert ir.signature(again) == ir.signature(dag), src
