"""The reference evaluator on the examples of CUTLASS's epilogue documentation, against plain torch.

Tolerances: elementwise epilogues whose torch expression is the same sequence of fp32
operations must match bit for bit (torch.equal). Epilogues with transcendental functions
are compared to torch in fp32 with rtol=atol=1e-6 (same ops, but torch's CPU kernels may
round a value differently depending on its position in a tensor). Reductions are compared
to torch in float64: rtol=1e-5 and atol=1e-5 * sqrt(number of summed terms) for sums in
fp32, 1e-12 when the reference itself computes in float64; max/min are exact.
"""

from __future__ import annotations

import math

import pytest
import torch

from evtfuse import EpilogueArguments, GemmArguments
from evtfuse.ops import clamp, gelu, log, relu, sigmoid, tanh  # noqa: F401 (plain torch)
from evtfuse.reference import evaluate

L, M, N, K = 3, 33, 40, 16


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=_gen(seed)).to(dtype)


def _empty(*shape, dtype=torch.float32):
    return torch.full(shape, float("nan"), dtype=dtype)


def _labels(*shape, seed=0):
    return (torch.rand(*shape, generator=_gen(seed)) < 0.3).float()


def _sum_close(got: torch.Tensor, want64: torch.Tensor, terms: int) -> None:
    assert got.shape == want64.shape
    torch.testing.assert_close(got.double(), want64, rtol=1e-5, atol=1e-5 * math.sqrt(terms))


# ------------------------------------------------------------------ the CUTLASS notebook

def my_epilogue(accum, C, alpha, beta, extra_scalar):
    Aux = (alpha * accum) + (beta * C)
    D = extra_scalar * Aux
    return D, Aux


@pytest.mark.parametrize("batched", [False, True])
def test_notebook_my_epilogue_fp16(batched):
    lead = (L,) if batched else ()
    A = _randn(*lead, M, K, seed=1, dtype=torch.float16)
    B = _randn(*lead, K, N, seed=2, dtype=torch.float16)
    C = _randn(*lead, M, N, seed=3, dtype=torch.float16)
    alpha, beta, extra_scalar = 1.0, 2.0, 0.5
    D_, Aux_ = _empty(*lead, M, N, dtype=torch.float16), _empty(*lead, M, N, dtype=torch.float16)
    epi = EpilogueArguments(my_epilogue, C=C, alpha=alpha, beta=beta, extra_scalar=extra_scalar,
                            D=D_, Aux=Aux_)
    args = GemmArguments(A=A, B=B, out=D_, accumulator_type=torch.float32, epilogue=epi)
    got = evaluate(args)
    # the notebook's check, with the accumulator in fp32 as the kernel keeps it
    D, Aux = my_epilogue(A.float() @ B.float(), C.float(), alpha, beta, extra_scalar)
    assert got["D"].dtype == torch.float16 and got["D"].shape == D_.shape
    assert torch.equal(got["D"], D.half())
    assert torch.equal(got["Aux"], Aux.half())
    # the notebook computes its reference in fp16 (A @ B rounded to fp16 first): close to a
    # few fp16 ulps of |D| <= ~20, not equal
    torch.testing.assert_close(got["D"], my_epilogue(A @ B, C, alpha, beta, extra_scalar)[0],
                               rtol=2e-3, atol=4e-3)
    assert torch.isnan(D_).all()  # the reference never writes the buffers


def relu_aux_store(accum, alpha, C):
    F = (accum * alpha) + (C * 2.0)  # Constant beta
    D = relu(F)
    return D, F


def test_notebook_relu_aux_store():
    A, B, C = _randn(M, K, seed=4), _randn(K, N, seed=5), _randn(M, N, seed=6)
    D, F = _empty(M, N), _empty(M, N)
    args = GemmArguments(A, B, out=D, epilogue=EpilogueArguments(relu_aux_store, alpha=3.0, C=C,
                                                                D=D, F=F))
    got = evaluate(args)
    D_ref, F_ref = relu_aux_store(A @ B, 3.0, C)  # evtfuse.ops.relu: runs in plain torch
    assert torch.equal(got["F"], F_ref) and torch.equal(got["D"], D_ref)
    assert (got["D"] == 0).any() and (got["D"] > 0).any()
    assert torch.equal(got["F"], (A @ B) * 3.0 + C * 2.0)


def relu_scale_return_acc(accum, alpha, beta, C, scale):
    F = relu((accum * alpha) + (C * beta))
    D = F * scale
    return D, F, accum


def test_notebook_relu_scale_return_acc():
    A, B = _randn(L, M, K, seed=7), _randn(L, K, N, seed=8)
    C = _randn(L, M, N, seed=9)
    D, F = _empty(L, M, N, dtype=torch.float16), _empty(L, M, N, dtype=torch.float16)
    acc_out = _empty(L, M, N)
    epi = EpilogueArguments(relu_scale_return_acc, alpha=1.0, beta=2.0, C=C, scale=0.5,
                            D=D, F=F, accum=acc_out)
    got = evaluate(GemmArguments(A, B, out=D, epilogue=epi))
    D_ref, F_ref, acc_ref = relu_scale_return_acc(A @ B, 1.0, 2.0, C, 0.5)
    assert torch.equal(got["D"], D_ref.half()) and torch.equal(got["F"], F_ref.half())
    assert got["accum"].dtype == torch.float32 and torch.equal(got["accum"], acc_ref)


def test_notebook_string_form():
    epi_str = ("def epi(accum, alpha, beta, C): F = (accum * alpha) + (C * beta); D = relu(F); "
               "return D, F")
    A, B, C = _randn(M, K, seed=10), _randn(K, N, seed=11), _randn(M, N, seed=12)
    D, F = _empty(M, N), _empty(M, N)
    got = evaluate(GemmArguments(A, B, out=D, epilogue=EpilogueArguments(
        epi_str, alpha=1.0, beta=0.5, C=C, D=D, F=F)))
    F_ref = (A @ B) * 1.0 + (C * 0.5)
    assert torch.equal(got["F"], F_ref) and torch.equal(got["D"], torch.relu(F_ref))


# ------------------------------------------------------------------ CuTe DSL EFC examples

def test_efc_alpha_beta_with_x_and_y():
    src = ("def epi(accum, C, X, alpha, beta, x_factor):\n"
           "    Y = accum\n"
           "    D = accum * alpha + C * beta + X * x_factor\n"
           "    return D, Y")
    A, B = _randn(L, M, K, seed=13), _randn(L, K, N, seed=14)
    C, X = _randn(L, M, N, seed=15), _randn(L, M, N, seed=16)
    D, Y = _empty(L, M, N), _empty(L, M, N)
    got = evaluate(GemmArguments(A, B, out=D, epilogue=EpilogueArguments(
        src, C=C, X=X, alpha=1.5, beta=-0.25, x_factor=0.75, D=D, Y=Y)))
    acc = A @ B
    assert torch.equal(got["Y"], acc)
    assert torch.equal(got["D"], acc * 1.5 + C * -0.25 + X * 0.75)


def test_efc_multiple_outputs():
    src = "def epi(accum, c):\n    D = accum + c\n    d_squared = D * D\n    return D, d_squared"
    A, B, c = _randn(M, K, seed=17), _randn(K, N, seed=18), _randn(M, N, seed=19)
    got = evaluate(GemmArguments(A, B, epilogue=EpilogueArguments(
        src, c=c, D=_empty(M, N), d_squared=_empty(M, N))))
    d = A @ B + c
    assert torch.equal(got["D"], d) and torch.equal(got["d_squared"], d * d)


@pytest.mark.parametrize("bias_shape", [(N,), (M, 1)])
def test_efc_complex_expression(bias_shape):
    src = """
def epi(accum, C, X, bias, scale):
    result = (accum + bias) * scale
    result2 = result + C
    result3 = result2 + tanh(X)
    D = gelu(result3)
    return D
"""
    A, B = _randn(M, K, seed=20), _randn(K, N, seed=21)
    C, X, bias = _randn(M, N, seed=22), _randn(M, N, seed=23), _randn(*bias_shape, seed=24)
    got = evaluate(GemmArguments(A, B, epilogue=EpilogueArguments(
        src, C=C, X=X, bias=bias, scale=0.5, D=_empty(M, N))))
    want = torch.nn.functional.gelu((A @ B + bias) * 0.5 + C + torch.tanh(X))
    torch.testing.assert_close(got["D"], want, rtol=1e-6, atol=1e-6)
    want64 = torch.nn.functional.gelu((A.double() @ B.double() + bias.double()) * 0.5
                                      + C.double() + torch.tanh(X.double()))
    torch.testing.assert_close(got["D"].double(), want64, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ BCE loss (Colfax article)

BCE = """
def bce(accum, bias, C):
    f = accum + bias
    t = (1 - C) * (-f) + log(clamp(sigmoid(f), 1e-3, 0.999))
    loss = sum(t)
    D = t
    return D, loss
"""


def _bce_terms64(acc64, bias, C):
    f = acc64 + bias.double()
    return (1 - C.double()) * (-f) + torch.log(torch.clamp(torch.sigmoid(f), 1e-3, 0.999))


@pytest.mark.parametrize("bias_shape", [(M, 1), (N,), (1, N)])
@pytest.mark.parametrize("loss_shape,dims", [((1,), (0, 1, 2)), ((), (0, 1, 2)),
                                             ((M, 1), (0, 2)), ((N,), (0, 1)), ((1, N), (0, 1))])
def test_bce_loss(bias_shape, loss_shape, dims):
    A, B = _randn(M, K, seed=30) * 0.5, _randn(K, N, seed=31)
    bias, C = _randn(*bias_shape, seed=32), _labels(M, N, seed=33)
    loss = _empty(*loss_shape)
    args = GemmArguments(A, B, epilogue=EpilogueArguments(BCE, bias=bias, C=C, D=None, loss=loss))
    got = evaluate(args)
    t64 = _bce_terms64(A.double() @ B.double(), bias, C)
    want = t64.unsqueeze(0).sum(dim=dims, keepdim=True).reshape(loss_shape)
    assert got["loss"].shape == loss.shape
    terms = t64.numel() // max(want.numel(), 1)
    _sum_close(got["loss"], want, terms)
    assert (got["loss"] < 0).all()  # log-likelihood terms are negative: not a trivial zero
    # D=None: computed for its consumer, returned uncast as (L, M, N)
    assert got["D"].shape == (1, M, N)
    torch.testing.assert_close(got["D"][0].double(), t64, rtol=1e-5, atol=1e-5)


def test_bce_loss_float64_reference():
    A, B = _randn(L, M, K, seed=34) * 0.5, _randn(K, N, seed=35)
    bias, C = _randn(N, seed=36), _labels(L, M, N, seed=37)
    loss, D = _empty(L, 1, 1), _empty(L, M, N)
    args = GemmArguments(A, B, out=D, epilogue=EpilogueArguments(BCE, bias=bias, C=C, D=D,
                                                                loss=loss))
    t64 = _bce_terms64(A.double() @ B.double(), bias, C)
    want = t64.sum(dim=(1, 2), keepdim=True)
    got64 = evaluate(args, compute_dtype=torch.float64, cast=False)
    assert got64["loss"].dtype == torch.float64 and got64["loss"].shape == (L, 1, 1)
    torch.testing.assert_close(got64["loss"], want, rtol=1e-12, atol=1e-12)
    got64_cast = evaluate(args, compute_dtype=torch.float64)
    assert got64_cast["loss"].dtype == torch.float32
    assert torch.equal(got64_cast["loss"], want.float())
    got32 = evaluate(args)
    _sum_close(got32["loss"], want, M * N)


# ------------------------------------------------------------------ reductions

RED_SRC = """
def red(accum, bias):
    v = accum * 0.5 + bias
    D = v
    s = {op}(v)
    return D, s
"""

TORCH_RED = {"sum": lambda t, d: t.sum(dim=d, keepdim=True),
             "max": lambda t, d: t.amax(dim=d, keepdim=True),
             "min": lambda t, d: t.amin(dim=d, keepdim=True)}


@pytest.mark.parametrize("op", ["sum", "max", "min"])
@pytest.mark.parametrize("out_shape,dims", [
    ((M, 1), (0, 2)), ((L, M, 1), (2,)), ((N,), (0, 1)), ((1, N), (0, 1)), ((L, 1, N), (1,)),
    ((1,), (0, 1, 2)), ((), (0, 1, 2)), ((L, 1, 1), (1, 2)), ((1, M, 1), (0, 2)),
])
def test_reductions_batched_and_over_batches(op, out_shape, dims):
    A, B = _randn(L, M, K, seed=40), _randn(L, K, N, seed=41)
    bias = _randn(N, seed=42)
    args = GemmArguments(A, B, epilogue=EpilogueArguments(
        RED_SRC.format(op=op), bias=bias, D=_empty(L, M, N), s=_empty(*out_shape)))
    got = evaluate(args)["s"]
    v64 = (A.double() @ B.double()) * 0.5 + bias.double()
    want = TORCH_RED[op](v64, dims).reshape(out_shape)
    assert got.shape == out_shape
    if op == "sum":
        _sum_close(got, want, v64.numel() // max(want.numel(), 1))
    else:  # max/min pick an element: exact against the fp32 values
        v32 = (A @ B) * 0.5 + bias
        assert torch.equal(got, TORCH_RED[op](v32, dims).reshape(out_shape))
    dag = args.dag
    assert dag.output("s").batched is (len(out_shape) == 3 and out_shape[0] == L)


@pytest.mark.parametrize("out_shape,factor", [((L, M, 1), N), ((M, 1), L * N), ((1,), L * M * N),
                                              ((L, 1, 1), M * N)])
def test_sum_of_a_value_shared_by_all_batches(out_shape, factor):
    """sum(r) for r (M, 1) shared by every batch: a per-batch output sums over N only,
    an output without L sums over the batches too."""
    r = _randn(M, 1, seed=43)
    src = "def e(accum, r):\n    D = accum + r\n    s = sum(r)\n    return D, s"
    args = GemmArguments(_randn(L, M, K, seed=44), _randn(K, N, seed=45), epilogue=EpilogueArguments(
        src, r=r, D=_empty(L, M, N), s=_empty(*out_shape)))
    got = evaluate(args)["s"]
    r64 = r.double().expand(L, M, N)
    dims = {3: (2,), 2: (0, 2), 1: (0, 1, 2)}[len(out_shape)] if out_shape != (L, 1, 1) else (1, 2)
    want = r64.sum(dim=dims, keepdim=True).reshape(out_shape)
    _sum_close(got, want, factor)
    if out_shape == (L, M, 1):
        torch.testing.assert_close(got[0].double(), r.double() * N, rtol=1e-6, atol=1e-5)


def test_reduction_of_a_shared_full_operand_per_batch():
    X = _randn(M, N, seed=46)
    src = "def e(accum, X):\n    D = accum + X\n    s = sum(X)\n    m = max(X)\n    return D, s, m"
    args = GemmArguments(_randn(L, M, K, seed=47), _randn(K, N, seed=48), epilogue=EpilogueArguments(
        src, X=X, D=_empty(L, M, N), s=_empty(L, M, 1), m=_empty(M, 1)))
    got = evaluate(args)
    want = X.double().sum(dim=1, keepdim=True)
    for b in range(L):
        _sum_close(got["s"][b], want, N)
    assert torch.equal(got["m"], X.amax(dim=1, keepdim=True))


# ------------------------------------------------------------------ indices, params, evaluate API

def test_row_and_col_index():
    src = "def e(accum):\n    D = accum + row_index() * 1000.0 + col_index()\n    return D"
    A, B = _randn(L, M, K, seed=50), _randn(K, N, seed=51)
    got = evaluate(GemmArguments(A, B, epilogue=EpilogueArguments(src, D=_empty(L, M, N))))["D"]
    rows = torch.arange(M, dtype=torch.float32).view(1, M, 1)
    cols = torch.arange(N, dtype=torch.float32).view(1, 1, N)
    assert torch.equal(got, A @ B + rows * 1000.0 + cols)


def test_parameters_and_python_max_through_the_frontend():
    src = ("def e(accum, C):\n    D = leaky_relu(accum, 0.2) + accum ** 3 + max(accum, C) "
           "+ min(C, 0.0) + clamp(C, -0.5, 0.5)\n    return D")
    A, B, C = _randn(M, K, seed=52), _randn(K, N, seed=53), _randn(M, N, seed=54)
    got = evaluate(GemmArguments(A, B, epilogue=EpilogueArguments(src, C=C, D=_empty(M, N))))
    acc = A @ B
    want = (torch.nn.functional.leaky_relu(acc, 0.2) + torch.pow(acc, 3.0) + torch.maximum(acc, C)
            + torch.minimum(C, torch.tensor(0.0)) + torch.clamp(C, -0.5, 0.5))
    assert torch.equal(got["D"], want)


def test_evaluate_entry_points():
    src = "def e(accum, alpha, b):\n    D = accum * alpha + b\n    return D"
    A, B, b = _randn(L, M, K, seed=55), _randn(K, N, seed=56), _randn(M, 1, seed=57)
    epi = EpilogueArguments(src, alpha=2.0, b=b, D=_empty(L, M, N))
    args = GemmArguments(A, B, epilogue=epi)
    acc = A @ B
    assert torch.equal(evaluate(args)["D"], acc * 2.0 + b)  # accum defaults to A @ B
    other = _randn(L, M, N, seed=58)
    assert torch.equal(evaluate(args, other)["D"], other * 2.0 + b)
    assert torch.equal(evaluate(epi, other)["D"], other * 2.0 + b)
    assert torch.equal(evaluate(args, operands={"alpha": -1.0})["D"], acc * -1.0 + b)
    dag_out = evaluate(args.dag, other, {"alpha": 2.0, "b": b})["D"]
    assert dag_out.shape == (L, M, N) and torch.equal(dag_out, other * 2.0 + b)
    with pytest.raises(TypeError):
        evaluate(epi)  # the accumulator is needed
    with pytest.raises(TypeError):
        evaluate("not a dag", other)
    with pytest.raises(KeyError):
        evaluate(args.dag, other, {"alpha": 2.0})  # b missing


def test_compute_dtype_float64_accumulator():
    src = "def e(accum, C):\n    D = sigmoid(accum) * C\n    return D"
    A, B, C = _randn(M, K, seed=59), _randn(K, N, seed=60), _randn(M, N, seed=61)
    args = GemmArguments(A, B, epilogue=EpilogueArguments(src, C=C, D=_empty(M, N)))
    got = evaluate(args, compute_dtype=torch.float64, cast=False)["D"]
    assert got.dtype == torch.float64
    want = torch.sigmoid(A.double() @ B.double()) * C.double()
    torch.testing.assert_close(got, want, rtol=1e-14, atol=1e-14)
    got32 = evaluate(args)["D"]
    assert got32.dtype == torch.float32
    torch.testing.assert_close(got32.double(), want, rtol=1e-5, atol=1e-6)


def test_device_scalar_and_batched_operands():
    src = "def e(accum, s, r, c):\n    D = accum * s + r - c\n    return D"
    A, B = _randn(L, M, K, seed=62), _randn(K, N, seed=63)
    s, r, c = _randn(L, 1, 1, seed=64), _randn(L, M, 1, seed=65), _randn(L, 1, N, seed=66)
    got = evaluate(GemmArguments(A, B, epilogue=EpilogueArguments(
        src, s=s, r=r, c=c, D=_empty(L, M, N))))["D"]
    assert torch.equal(got, (A @ B) * s + r - c)
    s0 = torch.tensor(0.75)
    got = evaluate(GemmArguments(A, B, epilogue=EpilogueArguments(
        src, s=s0, r=r[0], c=c[0, 0], D=_empty(L, M, N))))["D"]
    assert torch.equal(got, (A @ B) * 0.75 + r[0] - c[0, 0])
