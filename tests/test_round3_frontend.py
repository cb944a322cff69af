"""Issue 46, round 3, the frontend's items: each a wrong answer or a misleading refusal
before, checked against torch here.

- softplus with torch's whole signature (beta, threshold; positional or keyword): the op
  table's forward, its derivative rule, the reference evaluator and the kernel against
  torch, on both sides of and exactly at ``beta * x == threshold``;
- a reduction anywhere in an expression (the README's RMS norm as written), the same DAG
  as the two-assignment form, forward through the kernel and gradients against torch;
- torch's spellings of reductions (``x.sum(-1, keepdim=True)``, ``F.softmax(x, -1)``,
  ``x.amax(0)``, ...) with torch's meaning of dim and keepdim, and the refusal, naming the
  dim and the line, of those evtfuse has no reduction for;
- messages that point a newcomer at the fix (``epilogue=``, a misspelt function, a lambda,
  a module-level constant).

CPU tier: kernels run under Triton's interpreter at small sizes.
"""

from __future__ import annotations

import math

import pytest
import torch

import evtfuse
from evtfuse import EpilogueArguments, EpilogueError, ir
from evtfuse.derivative import Diff, apply_rule
from evtfuse.frontend import parse_epilogue
from evtfuse.optable import OPS, TorchAlgebra
from evtfuse.reference import evaluate

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="CPU-interpreter tier (the frontend is the same on a GPU)")

F = torch.nn.functional


def _below(v: float) -> float:
    return torch.nextafter(torch.tensor(v), torch.tensor(-math.inf)).item()


def _above(v: float) -> float:
    return torch.nextafter(torch.tensor(v), torch.tensor(math.inf)).item()


# ------------------------------------------------ 8: softplus

# (beta, threshold, x with x * beta == threshold exactly in fp32)
SOFTPLUS_CASES = [(1.0, 20.0, 20.0), (2.0, 10.0, 5.0), (0.5, 3.0, 6.0), (4.0, 1.0, 0.25),
                  (-1.5, 3.0, -2.0), (2.0, 100.0, 50.0)]


def _softplus_points(beta: float, threshold: float, edge: float) -> torch.Tensor:
    """x at the edge, one ulp either side of it, and values far from it (both branches)."""
    pts = [edge, _below(edge), _above(edge), 0.0, -0.0, 1.0, -1.0, 3.5, -7.0, 30.0, -30.0,
           2.0 * edge, 0.5 * edge, -edge, 1e-3, 60.0]
    return torch.tensor(pts, dtype=torch.float32)


def _exact_gemm_inputs(values: torch.Tensor, n: int = 4):
    """A, B (fp32) whose product is exactly ``values`` laid out as (M, n): A = I."""
    M = -(-values.numel() // n)
    vals = torch.zeros(M * n)
    vals[: values.numel()] = values
    return torch.eye(M), vals.reshape(M, n).clone()


@pytest.mark.parametrize("beta, threshold, edge", SOFTPLUS_CASES)
def test_softplus_row_reference_and_rule_match_torch_at_the_threshold(beta, threshold, edge):
    x = _softplus_points(beta, threshold, edge)
    want = F.softplus(x, beta=beta, threshold=threshold)
    row = OPS["softplus"]
    params = {"beta": beta, "threshold": threshold}
    got = row.torch_fn(x, **params)
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    # the derivative rule on tensors against torch.autograd, in fp32 and fp64
    for dtype in (torch.float32, torch.float64):
        xs = x.to(dtype).requires_grad_(True)
        g = torch.linspace(-2.0, 3.0, x.numel(), dtype=dtype)
        (tg,) = torch.autograd.grad(F.softplus(xs, beta=beta, threshold=threshold), xs, g)
        d = Diff(TorchAlgebra(like=xs.detach()), (xs.detach(),), g, params,
                 out=lambda: F.softplus(xs.detach(), beta=beta, threshold=threshold))
        (rg,) = apply_rule(row.grad, d)
        torch.testing.assert_close(rg, tg, rtol=1e-6 if dtype == torch.float32 else 1e-12,
                                   atol=0, equal_nan=True)
    # the reference evaluator of a parsed epilogue (the row read through the frontend)
    epi = EpilogueArguments(f"def e(accum):\n    D = softplus(accum, beta={beta!r}, "
                            f"threshold={threshold!r})\n    return D",
                            D=torch.empty(1, x.numel()))
    ref = evaluate(epi, x.reshape(1, 1, -1))["D"].reshape(-1)
    torch.testing.assert_close(ref, want, rtol=0, atol=0, equal_nan=True)


SOFTPLUS_SPELLED = {  # the value of D -> torch's (beta, threshold), the edge
    "F.softplus(accum, beta=2.0, threshold=10.0)": (2.0, 10.0, 5.0),
    "F.softplus(accum, 0.5, 3.0)": (0.5, 3.0, 6.0),
    "torch.nn.functional.softplus(accum, threshold=1.0)": (1.0, 1.0, 1.0),
    "F.softplus(accum, 4.0, threshold=1.0)": (4.0, 1.0, 0.25),
    "softplus(accum, beta=-1.5, threshold=3.0)": (-1.5, 3.0, -2.0),
    "F.softplus(accum, beta=b, threshold=10.0)": (2.0, 10.0, 5.0),  # b an operand
    "F.softplus(accum, b)": (2.0, 20.0, 10.0),
    "F.softplus(accum)": (1.0, 20.0, 20.0),
}


@pytest.mark.parametrize("expr", list(SOFTPLUS_SPELLED))
def test_softplus_spellings_through_the_kernel_and_their_gradients(expr):
    """Forward through the kernel and dA, dB through evtfuse's backward against torch
    autograd, with accum exactly at, one ulp around and far from the threshold."""
    beta, threshold, edge = SOFTPLUS_SPELLED[expr]
    A, B = _exact_gemm_inputs(_softplus_points(beta, threshold, edge))
    src = f"def e(accum, b):\n    D = {expr}\n    return D"
    got = evtfuse.gemm(A, B, src, b=2.0)
    want = F.softplus(A @ B, beta=beta, threshold=threshold)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    # gradients
    a1, b1 = A.clone().requires_grad_(True), B.clone().requires_grad_(True)
    a2, b2 = A.clone().requires_grad_(True), B.clone().requires_grad_(True)
    g = torch.linspace(-1.0, 2.0, got.numel()).reshape(got.shape)
    evtfuse.gemm(a1, b1, src, b=2.0).backward(g)
    F.softplus(a2 @ b2, beta=beta, threshold=threshold).backward(g)
    torch.testing.assert_close(a1.grad, a2.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(b1.grad, b2.grad, rtol=1e-5, atol=1e-6)


def test_softplus_with_torch_defaults_keeps_its_kernel_code():
    """beta 1 and threshold 20 (written or not) spell the same helper as before."""
    row = OPS["softplus"]
    assert row.spell(["x"], {"beta": 1.0, "threshold": 20.0}) == "_ef_softplus(x)"
    assert row.spell(["x"], {"beta": 2.0, "threshold": 10.0}) == \
        "_ef_softplus_beta(x, 2.0, 10.0)"


@pytest.mark.parametrize("expr, phrase", [
    ("F.softplus(accum, beta=b, threshold=t)", "softplus() parameter 'threshold' must be a "
                                               "numeric literal (got t)"),
    ("F.softplus(accum, 2.0, beta=3.0)", "softplus() got multiple values for argument 'beta'"),
    ("F.softplus(accum, 2.0, 20.0, 1.0)", "softplus() takes 3 positional arguments"),
])
def test_softplus_refusals_name_the_call_and_line(expr, phrase):
    with pytest.raises(EpilogueError) as e:
        parse_epilogue(f"def e(accum, b, t):\n    D = {expr}\n    return D")
    assert phrase in str(e.value) and e.value.line == 2 and e.value.variable == "D"


# ------------------------------------------------ 10: a reduction inside an expression

GEN = torch.Generator().manual_seed(46)
M, K, N, L = 6, 8, 10, 2  # M != N: a wrong axis cannot hide
A2, B2 = torch.randn(M, K, generator=GEN), torch.randn(K, N, generator=GEN)
A3 = torch.randn(L, M, K, generator=GEN)
C2 = torch.randn(M, N, generator=GEN)
W = torch.randn(N, generator=GEN)
EPS = 1e-5


def _readme_expressions() -> list[str]:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    found = [e for e in ("D = accum * rsqrt(mean(accum * accum) + eps)",) if e in text]
    assert found, "the README's RMS-norm example moved: update this test"
    return found


INSIDE = {  # an epilogue with a reduction inside an expression -> its two-assignment form
    "def e(accum, eps):\n    D = accum * rsqrt(mean(accum * accum) + eps)\n    return D":
        "def e(accum, eps):\n    ms = mean(accum * accum)\n    D = accum * rsqrt(ms + eps)\n"
        "    return D",
    "def e(accum, eps):\n    D = accum / max(abs(accum))\n    return D":
        "def e(accum, eps):\n    m = max(abs(accum))\n    D = accum / m\n    return D",
    "def e(accum, eps):\n    D = (accum - max(accum)) / sum(abs(accum)) + logsumexp(accum)\n"
    "    return D":
        "def e(accum, eps):\n    m = max(accum)\n    s = sum(abs(accum))\n"
        "    q = logsumexp(accum)\n    D = (accum - m) / s + q\n    return D",
}


def _torch_inside(src: str, acc: torch.Tensor) -> torch.Tensor:
    if "rsqrt" in src:
        return acc * torch.rsqrt((acc * acc).mean(-1, keepdim=True) + EPS)
    if "logsumexp" in src:
        return (acc - acc.amax(-1, keepdim=True)) / acc.abs().sum(-1, keepdim=True) \
            + acc.logsumexp(-1, keepdim=True)
    return acc / acc.abs().amax(-1, keepdim=True)


@pytest.mark.parametrize("src", list(INSIDE))
def test_a_reduction_inside_an_expression_is_the_two_assignment_dag(src):
    D = torch.empty(M, N)
    inside = EpilogueArguments(src, eps=EPS, D=D).dag
    named = EpilogueArguments(INSIDE[src], eps=EPS, D=D).dag
    assert ir.signature(inside) == ir.signature(named)
    # the reduction holds no user's name: none can meet a name of the user's
    assert all(n.var is None for n in inside.nodes if n.kind is ir.NodeKind.REDUCE)


@pytest.mark.parametrize("src", list(INSIDE))
def test_a_reduction_inside_an_expression_through_the_kernel_and_its_gradients(src):
    got = evtfuse.gemm(A2, B2, src, eps=EPS)
    torch.testing.assert_close(got, _torch_inside(src, A2 @ B2), rtol=1e-5, atol=1e-5)
    a1, b1 = A2.clone().requires_grad_(True), B2.clone().requires_grad_(True)
    a2, b2 = A2.clone().requires_grad_(True), B2.clone().requires_grad_(True)
    g = torch.randn(M, N, generator=GEN)
    evtfuse.gemm(a1, b1, src, eps=EPS).backward(g)
    _torch_inside(src, a2 @ b2).backward(g)
    torch.testing.assert_close(a1.grad, a2.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(b1.grad, b2.grad, rtol=1e-4, atol=1e-5)


def test_the_readme_rms_norm_runs_as_written():
    """The README's line, verbatim, with a per-column weight that takes a gradient too and
    user names like unparse's own (t0, t1: the backward's source is generated)."""
    (line,) = _readme_expressions()
    src = f"def rms(accum, eps, t0):\n    {line}\n    t1 = D * t0\n    return D, t1"
    a1, b1, w1 = (t.clone().requires_grad_(True) for t in (A2, B2, W))
    a2, b2, w2 = (t.clone().requires_grad_(True) for t in (A2, B2, W))
    D1, T1 = evtfuse.gemm(a1, b1, src, eps=EPS, t0=w1)
    acc = a2 @ b2
    D2 = acc * torch.rsqrt((acc * acc).mean(-1, keepdim=True) + EPS)
    T2 = D2 * w2
    torch.testing.assert_close(D1, D2, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(T1, T2, rtol=1e-5, atol=1e-5)
    g1, g2 = torch.randn(M, N, generator=GEN), torch.randn(M, N, generator=GEN)
    (D1 * g1 + T1 * g2).sum().backward()
    (D2 * g1 + T2 * g2).sum().backward()
    for x, y in ((a1, a2), (b1, b2), (w1, w2)):
        torch.testing.assert_close(x.grad, y.grad, rtol=1e-4, atol=1e-5)


def test_a_reduction_of_a_value_computed_from_one_inside_an_expression_is_refused():
    with pytest.raises(EpilogueError) as e:
        EpilogueArguments("def e(accum):\n    D = accum * sum(accum - max(accum))\n    return D",
                          D=torch.empty(M, N))
    assert "sum(...) in the value of 'D' reduces a value computed from another reduction" \
        in str(e.value)
    assert e.value.line == 2 and e.value.variable == "D"


# ------------------------------------------------ 13: torch's spellings of reductions

SPELLED_2D = {  # the value of D for an (M, N) output -> torch's, from the accumulator x
    "torch.softmax(accum, dim=-1)": lambda x: torch.softmax(x, dim=-1),
    "F.softmax(accum, -1)": lambda x: F.softmax(x, -1),
    "accum.softmax(-1)": lambda x: x.softmax(-1),
    "F.softmax(accum, dim=1)": lambda x: F.softmax(x, dim=1),
    "F.log_softmax(accum, -1)": lambda x: F.log_softmax(x, -1),
    "accum.log_softmax(dim=-1)": lambda x: x.log_softmax(dim=-1),
    "torch.log_softmax(accum, 1)": lambda x: torch.log_softmax(x, 1),
    "accum - accum.sum(-1, keepdim=True)": lambda x: x - x.sum(-1, keepdim=True),
    "accum - accum.sum(1, keepdim=True)": lambda x: x - x.sum(1, keepdim=True),
    "accum - torch.sum(accum, dim=0)": lambda x: x - torch.sum(x, dim=0),
    "accum - accum.sum(0, keepdim=True)": lambda x: x - x.sum(0, keepdim=True),
    "accum - accum.sum(dim=(0, 1))": lambda x: x - x.sum(dim=(0, 1)),
    "accum - accum.sum()": lambda x: x - x.sum(),
    "accum - torch.sum(accum, (0, 1), True)": lambda x: x - torch.sum(x, (0, 1), True),
    "accum - accum.amax(-1, keepdim=True)": lambda x: x - x.amax(-1, keepdim=True),
    "accum - accum.amax(0)": lambda x: x - x.amax(0),
    "accum - torch.amax(accum)": lambda x: x - torch.amax(x),
    "accum - accum.amin(dim=-2, keepdim=True)": lambda x: x - x.amin(dim=-2, keepdim=True),
    "accum - accum.max(-1, keepdim=True).values": lambda x: x - x.max(-1, keepdim=True).values,
    "accum - torch.max(accum, 0)[0]": lambda x: x - torch.max(x, 0)[0],
    "accum - accum.max()": lambda x: x - x.max(),
    "accum - torch.min(accum, dim=1, keepdim=True).values":
        lambda x: x - torch.min(x, dim=1, keepdim=True).values,
    "accum - accum.min()": lambda x: x - x.min(),
    "accum - torch.logsumexp(accum, -1, keepdim=True)":
        lambda x: x - torch.logsumexp(x, -1, keepdim=True),
    "accum - accum.logsumexp(0)": lambda x: x - x.logsumexp(0),
    "accum - accum.logsumexp(dim=(0, 1))": lambda x: x - x.logsumexp(dim=(0, 1)),
    "accum - accum.mean(-1, keepdim=True)": lambda x: x - x.mean(-1, keepdim=True),
    "accum - accum.mean(0)": lambda x: x - x.mean(0),
    "accum - accum.mean()": lambda x: x - x.mean(),
    "accum * torch.mean(accum * accum, dim=1, keepdim=True)":
        lambda x: x * torch.mean(x * x, dim=1, keepdim=True),
    "accum - ops.sum(accum, dim=0)": lambda x: x - x.sum(0),  # evtfuse's own, with a dim
    "F.softmax(accum, dim=-1, dtype=torch.float32)":
        lambda x: F.softmax(x, -1, dtype=torch.float32),
    "accum - accum.sum(-1, keepdim=True, dtype=None)": lambda x: x - x.sum(-1, keepdim=True),
    "accum - mean(accum, -1, keepdim=True)": lambda x: x - x.mean(-1, keepdim=True),
    "torch.max(accum, C)": lambda x: torch.max(x, C2),  # two tensors: elementwise
    "accum.min(C)": lambda x: x.min(C2),
}

SPELLED_3D = {  # the same for a batched (L, M, N) output
    "accum - accum.sum(-1, keepdim=True)": lambda x: x - x.sum(-1, keepdim=True),
    "accum - accum.sum(2, keepdim=True)": lambda x: x - x.sum(2, keepdim=True),
    "accum - accum.sum(-2, keepdim=True)": lambda x: x - x.sum(-2, keepdim=True),
    "accum - accum.sum(1, keepdim=True)": lambda x: x - x.sum(1, keepdim=True),
    "accum - accum.sum((0, 1))": lambda x: x - x.sum((0, 1)),
    "accum - accum.sum((0, 1), keepdim=True)": lambda x: x - x.sum((0, 1), keepdim=True),
    "accum - accum.sum()": lambda x: x - x.sum(),
    "accum - accum.sum((-2, -1), keepdim=True)": lambda x: x - x.sum((-2, -1), keepdim=True),
    "accum - accum.amax((0, 2), keepdim=True)": lambda x: x - x.amax((0, 2), keepdim=True),
    "accum - accum.mean((1, 2), keepdim=True)": lambda x: x - x.mean((1, 2), keepdim=True),
    "accum - torch.logsumexp(accum, dim=-1, keepdim=True)":
        lambda x: x - torch.logsumexp(x, dim=-1, keepdim=True),
    "F.softmax(accum, dim=2)": lambda x: F.softmax(x, dim=2),
    "accum.log_softmax(-1)": lambda x: x.log_softmax(-1),
}


def _spelled(expr: str) -> str:
    return f"def e(accum, C):\n    D = {expr}\n    return D"


@pytest.mark.parametrize("expr", list(SPELLED_2D))
def test_torch_reductions_compute_what_torch_does(expr):
    got = evtfuse.gemm(A2, B2, _spelled(expr), C=C2)
    torch.testing.assert_close(got, SPELLED_2D[expr](A2 @ B2), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("expr", list(SPELLED_3D))
def test_torch_reductions_of_a_batched_output_compute_what_torch_does(expr):
    got = evtfuse.gemm(A3, B2, _spelled(expr), C=C2)
    torch.testing.assert_close(got, SPELLED_3D[expr](A3 @ B2), rtol=1e-5, atol=1e-5)


GRADS = [("accum.softmax(-1)", False), ("accum - accum.mean(0)", False),
         ("relu(accum) - accum.mean(0)", False), ("relu(accum) - accum.mean((0, 1))", True),
         ("accum * accum.amax(-1, keepdim=True)", False), ("relu(accum) * accum.sum()", False),
         ("accum - accum.sum((0, 1))", True), ("accum * accum.mean(-2, keepdim=True)", True)]


@pytest.mark.parametrize("mode", ["recompute", "save"])  # save: the forward re-written
@pytest.mark.parametrize("expr, batched", GRADS)
@pytest.mark.cover("expr")  # the quick tier: each expression once, in one mode or the other
def test_torch_reductions_gradients(expr, batched, mode):
    fn = (SPELLED_3D if batched else SPELLED_2D).get(expr) or {
        "accum * accum.amax(-1, keepdim=True)": lambda x: x * x.amax(-1, keepdim=True),
        "relu(accum) - accum.mean(0)": lambda x: torch.relu(x) - x.mean(0),
        "relu(accum) - accum.mean((0, 1))": lambda x: torch.relu(x) - x.mean((0, 1)),
        "relu(accum) * accum.sum()": lambda x: torch.relu(x) * x.sum(),
        "accum * accum.mean(-2, keepdim=True)": lambda x: x * x.mean(-2, keepdim=True)}[expr]
    A = A3 if batched else A2
    a1, b1 = A.clone().requires_grad_(True), B2.clone().requires_grad_(True)
    a2, b2 = A.clone().requires_grad_(True), B2.clone().requires_grad_(True)
    got = evtfuse.gemm(a1, b1, _spelled(expr), C=C2, backward=mode)
    want = fn(a2 @ b2)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    g = torch.randn(want.shape, generator=GEN)
    got.backward(g)
    want.backward(g)
    torch.testing.assert_close(a1.grad, a2.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(b1.grad, b2.grad, rtol=1e-4, atol=1e-4)


RETURNED = [  # (A, r's value, r's buffer shape, torch's r)
    (A2, "accum.sum(-1, keepdim=True)", (M, 1), lambda x: x.sum(-1, keepdim=True)),
    (A2, "accum.sum(0)", (N,), lambda x: x.sum(0)),
    (A2, "torch.amax(accum)", (), lambda x: torch.amax(x)),
    (A2, "torch.logsumexp(accum, 1, keepdim=True)", (M, 1),
     lambda x: torch.logsumexp(x, 1, keepdim=True)),
    (A2, "accum.mean(dim=0, keepdim=True)", (1, N), lambda x: x.mean(dim=0, keepdim=True)),
    (A3, "accum.sum(-1, keepdim=True)", (L, M, 1), lambda x: x.sum(-1, keepdim=True)),
    (A3, "accum.sum((0, 2), keepdim=True)", (1, M, 1), lambda x: x.sum((0, 2), keepdim=True)),
    (A3, "accum.mean((0, 1))", (N,), lambda x: x.mean((0, 1))),
    (A3, "accum.amin((-2, -1), keepdim=True)", (L, 1, 1),
     lambda x: x.amin((-2, -1), keepdim=True)),
]


@pytest.mark.parametrize("A, expr, shape, fn", RETURNED, ids=[f"{r[1]}-{r[2]}" for r in RETURNED])
def test_returned_torch_reductions_compute_what_torch_does(A, expr, shape, fn):
    src = f"def e(accum):\n    D = accum\n    r = {expr}\n    return D, r"
    D, r = evtfuse.gemm(A, B2, src, r=torch.full(shape, float("nan")))
    torch.testing.assert_close(r, fn(A @ B2), rtol=1e-5, atol=1e-5)


def test_a_column_sum_as_the_only_output_through_gemm():
    """D = accum.sum(0): no full output tells the rank; gemm's A and B do."""
    D = evtfuse.gemm(A2, B2, "def e(accum):\n    D = accum.sum(0)\n    return D",
                     D=torch.empty(N))
    torch.testing.assert_close(D, (A2 @ B2).sum(0), rtol=1e-5, atol=1e-5)


def _refused(src: str, A=A2, **values) -> EpilogueError:
    if A is None:
        with pytest.raises(EpilogueError) as e:
            EpilogueArguments(src, **values).bind((1, M, N))
        return e.value
    values.setdefault("D", None)
    with pytest.raises(EpilogueError) as e:
        evtfuse.gemm(A, B2, src, **values)
    return e.value


REFUSED = [  # (A, the value of D, a phrase of the message)
    (A2, "accum - accum.sum(-1)", "accum.sum(-1) without keepdim=True has torch's shape (M,)"),
    (A3, "accum - accum.sum(-2)", "accum.sum(-2) without keepdim=True has torch's shape (L, N)"),
    (A3, "accum - accum.sum(0)", "accum.sum(0): dim=0 reduces the batches (L) only"),
    (A3, "F.softmax(accum, dim=1)", "F.softmax(accum, dim=1): evtfuse's softmax is over each "
                                    "row (dim=-1, the last dim); dim=1"),
    (A2, "F.softmax(accum, 0)", "evtfuse's softmax is over each row"),
    (A2, "F.softmax(accum)", "softmax() without dim: torch picks the dim"),
    (A2, "accum - torch.logsumexp(accum)", "logsumexp() needs dim"),
    (A2, "accum - accum.sum(2, keepdim=True)", "accum.sum(2, keepdim=True): dim=2 is out of "
                                               "range for the (M, N) output"),
    (A2, "accum - accum.sum((1, -1), keepdim=True)", "dim -1 appears more than once"),
    (A2, "accum - accum.max(-1).indices", "evtfuse computes no indices"),
    (A2, "accum - accum.sum(dim=C)", "dim must be an int literal, a tuple of them, or None"),
    (A2, "accum - accum.sum(-1, keepdim=1)", "keepdim must be True or False"),
    (A2, "accum.sum(-1, dtype=torch.float64)", "sum(dtype=torch.float64): an epilogue computes "
                                               "in fp32"),
]


@pytest.mark.parametrize("A, expr, phrase", REFUSED, ids=[r[1] for r in REFUSED])
def test_torch_reductions_evtfuse_has_not_are_refused_with_the_dim_and_line(A, expr, phrase):
    e = _refused(_spelled(expr), A, C=C2)
    assert phrase in str(e) and e.line == 2 and e.variable == "D", str(e)


def test_a_returned_torch_reduction_needs_the_output_shape_of_its_dims():
    src = "def e(accum):\n    D = accum\n    r = {}\n    return D, r"
    e = _refused(src.format("accum.sum(-1, keepdim=True)"), r=torch.empty(N))
    assert "accum.sum(-1, keepdim=True) reduces each row, but output r has shape (10,), which " \
           "holds a per-column reduction: give r the shape (M, 1)" in str(e)
    assert e.line == 3 and e.variable == "r"
    e = _refused(src.format("accum.sum(-1, keepdim=True)"), A3, r=torch.empty(M, 1))
    assert "reduces each row, per batch, but output r has shape (6, 1), which holds a per-row " \
           "reduction over the batches too: give r the shape (L, M, 1)" in str(e)
    # torch's accum.sum() is every element's sum; before, the output's shape made it per row
    e = _refused(src.format("accum.sum()"), r=torch.empty(M, 1))
    assert "accum.sum() reduces every element, but output r has shape (6, 1)" in str(e)


def test_dims_that_need_the_rank_are_refused_where_no_output_tells_it():
    e = _refused("def e(accum):\n    D = accum.sum(0)\n    return D", None, D=torch.empty(N))
    assert "dim=0 means different axes for a 2-D (M, N) output and a batched (L, M, N) one" \
        in str(e) and e.line == 2
    # negative dims mean the same axes for both: read without the rank
    EpilogueArguments("def e(accum):\n    D = accum.sum(-2)\n    return D",
                      D=torch.empty(N)).bind((1, M, N))


def test_a_per_row_value_computed_from_a_reduction_is_stored_per_row():
    """``m = 2.0 * max(D)`` into an (M, 1) output: refused before (its batch flag against an
    output without L, though L is 1), now stored; with L > 1 an (M, 1) output of it is
    still refused (it differs per batch)."""
    src = "def e(accum):\n    D = accum\n    m = 2.0 * max(D) + sum(D)\n    return D, m"
    _, m = evtfuse.gemm(A2, B2, src, m=torch.empty(M, 1))
    acc = A2 @ B2
    torch.testing.assert_close(m, 2.0 * acc.amax(-1, keepdim=True) + acc.sum(-1, keepdim=True),
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(EpilogueError, match="is not computed by sum/max/min"):
        evtfuse.gemm(A3, B2, src, m=torch.empty(M, 1))


# ------------------------------------------------ 15: messages that point at the fix

SCALE = 2.0  # a module-level constant an epilogue cannot see


def _epi_times_two(accum):
    D = accum * 2.0
    return D


def _epi_with_a_global(accum):
    D = accum * SCALE
    return D


def test_gemm_says_epilogue_for_epilog():
    with pytest.raises(EpilogueError) as e:
        evtfuse.gemm(A2, B2, epilog=_epi_times_two)
    assert "gemm got epilog=, which is neither one of its keywords nor an operand or output " \
           "of the epilogue identity(accum) -> D: did you mean epilogue=?" in str(e.value)
    assert e.value.variable == "epilog"
    with pytest.raises(EpilogueError, match="did you mean tune="):
        evtfuse.gemm(A2, B2, _epi_times_two, tunes="none")
    # an operand named like a keyword of gemm is still an operand
    got = evtfuse.gemm(A2, B2, "def e(accum, tuned): D = accum * tuned; return D", tuned=2.0)
    torch.testing.assert_close(got, 2.0 * (A2 @ B2), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("expr, name, close", [
    ("rellu(accum)", "rellu", "relu"), ("accum.sofmax(-1)", "sofmax", "softmax"),
    ("torch.clmap(accum, min=0.0)", "clmap", "clamp"), ("gleu(accum)", "gleu", "gelu")])
def test_a_misspelt_function_gets_the_closest_name(expr, name, close):
    with pytest.raises(EpilogueError) as e:
        parse_epilogue(f"def e(accum):\n    D = {expr}\n    return D")
    assert f"unknown function '{name}' in the value of 'D'; did you mean {close}? recognised " \
           f"functions:" in str(e.value)
    assert e.value.line == 2 and e.value.variable == name


def test_a_lambda_is_said_to_be_one():
    for epilogue in (lambda accum: accum * 2.0, "lambda accum: accum * 2.0",
                     "epi = lambda accum: accum * 2.0"):
        with pytest.raises(EpilogueError) as e:
            evtfuse.gemm(A2, B2, epilogue)
        assert "the epilogue is a lambda: evtfuse reads an epilogue's source (it never calls " \
               "it) and does not read lambdas" in str(e.value)
        assert "write a function, def epi(accum, C): D = accum + C; return D" in str(e.value)


def test_a_global_name_is_said_to_be_unseen():
    with pytest.raises(EpilogueError) as e:
        evtfuse.gemm(A2, B2, _epi_with_a_global)
    text = str(e.value)
    assert "undefined name 'SCALE' (in the value of 'D'); evtfuse reads only the epilogue " \
           "function's own source, not the names of its module" in text
    assert "make SCALE a parameter and pass its value to gemm or EpilogueArguments" in text
    assert "or write the literal" in text
    assert e.value.variable == "SCALE"
    assert e.value.line == _epi_with_a_global.__code__.co_firstlineno + 1
    with pytest.raises(EpilogueError, match="evtfuse reads only the epilogue's own text: make "
                                            "SCALE a parameter"):
        parse_epilogue("def e(accum):\n    D = accum * SCALE\n    return D")
    with pytest.raises(EpilogueError, match="undefined name 'scael' .*; did you mean scale\\?"):
        parse_epilogue("def e(accum, scale):\n    D = accum * scael\n    return D")
