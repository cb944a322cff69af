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
from evtfuse import EpilogueArguments, EpilogueError
from evtfuse.derivative import Diff, TorchAlgebra, apply_rule
from evtfuse.frontend import parse_epilogue
from evtfuse.optable import OPS
from evtfuse.reference import evaluate

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="CPU-interpreter tier (the frontend is the same on a GPU)")

F = torch.nn.functional


def _below(v: float) -> float:
    return torch.nextafter(torch.tensor(v), torch.tensor(-math.inf)).item()


def _above(v: float) -> float:
    return torch.nextafter(torch.tensor(v), torch.tensor(math.inf)).item()


# ------------------------------------------------------------------ 8: softplus

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
