"""A reduction of an operand the batches share, feeding computation, in a batched problem
(found by issue 46's float64 gradchecks): ``r = sum(C); D = accum * (C * r)`` with C (M, N)
and L = 2. In two passes (N past one tile) the first pass kept r in an (M, 1) workspace,
which sums over the batches as an unbatched output does: D came out twice too large, and
its gradients with it; a max's ties were refused with a message naming an internal output.
Forward and gradients against the float64 oracle, one pass and two, both backward modes."""

from __future__ import annotations

import pytest
import torch

import evtfuse

from grad_oracle import GA, GB, reference_grads

BODIES = ["r = sum(C)\n    D = accum * (C * r)", "r = max(C * 2.0)\n    D = accum * (C - r)",
          "r = min(relu(C))\n    D = accum * (C + r)", "r = logsumexp(C)\n    D = accum + exp(C - r)",
          "r = mean(C * C)\n    D = accum * C * rsqrt(r + 1.0)"]


@pytest.mark.parametrize("mode", ["recompute", "save"])
@pytest.mark.parametrize("N", [6, 70], ids=["one_pass", "two_passes"])
@pytest.mark.parametrize("body", BODIES)
@pytest.mark.cover
def test_a_shared_operands_reduction_in_a_batched_problem(body, N, mode):
    """The forward and the gradients of A and B (C needing none) as the oracle's; with C
    needing one, a clear refusal (its per-batch gradient through the reduction is not
    computed: it came out L times too large or wrong)."""
    g = torch.Generator().manual_seed(N)
    A, B = torch.randn(2, 4, 5, generator=g), torch.randn(5, N, generator=g)
    C = torch.randn(4, N, generator=g)
    C[1] = -1.0  # a row of ties for min(relu(C))
    src = f"def e(accum, C):\n    {body}\n    return D"
    a, b = A.clone().requires_grad_(), B.clone().requires_grad_()
    D = evtfuse.gemm(a, b, src, C=C, backward=mode)
    up = torch.randn(2, 4, N, generator=g)
    (D * up).sum().backward()
    values = {"C": C, "D": torch.empty(2, 4, N)}
    from evtfuse import EpilogueArguments, GemmArguments
    from evtfuse.reference import evaluate
    want_d = evaluate(GemmArguments(A, B, values["D"], torch.float32,
                                    EpilogueArguments(src, **values)))["D"]
    torch.testing.assert_close(D, want_d, rtol=1e-4, atol=1e-4)
    want = reference_grads(src, A, B, values, {"D": up}, set())
    for got, key in ((a.grad, GA), (b.grad, GB)):
        torch.testing.assert_close(got.double(), want[key], rtol=1e-3, atol=1e-3)
    with pytest.raises(evtfuse.EpilogueError, match="reduces values the batches share"):
        evtfuse.gemm(A, B, src, C=C.clone().requires_grad_(), backward=mode)


def test_the_same_reduction_of_an_operand_with_its_own_batches_is_differentiated():
    g = torch.Generator().manual_seed(0)
    A, B, C = torch.randn(2, 4, 5, generator=g), torch.randn(5, 70, generator=g), \
        torch.randn(2, 4, 70, generator=g)
    src = "def e(accum, C):\n    r = sum(C)\n    D = accum * (C * r)\n    return D"
    a, b, c = (t.clone().requires_grad_() for t in (A, B, C))
    up = torch.randn(2, 4, 70, generator=g)
    (evtfuse.gemm(a, b, src, C=c) * up).sum().backward()
    want = reference_grads(src, A, B, {"C": C, "D": torch.empty(2, 4, 70)}, {"D": up}, {"C"})
    for got, key in ((a.grad, GA), (b.grad, GB), (c.grad, "C")):
        torch.testing.assert_close(got.double(), want[key], rtol=1e-3, atol=1e-3)
