"""GPU tier: issue 46, round 3 (the CPU tier's tests/test_round3_torch.py, compiled).

float64 on the GPU (the portable family: tl.dot in float64, the float64 helpers' static
branches, float64 runtime-scalar parameters, 64-bit atomic folds of max/min): a many-op
epilogue and reductions of every shape against torch in float64, the op table's gradchecks,
``evtfuse.nn.Linear`` in float64; ``linear_cross_entropy`` on special values against torch.
"""

from __future__ import annotations

import pytest
import torch

import evtfuse
from test_round3_torch import (GRAD_FORMS, LCE_OPTIONS, SPECIAL_CASES, T, _epilogue,
                               _grad_groups, _gradcheck, _lce_both, _special_case)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
              pytest.mark.filterwarnings("ignore::UserWarning")]

F64 = torch.float64


def test_float64_ops_and_reductions_match_torch_on_the_gpu():
    """Every unary row of GRAD_FORMS on the accumulator, one output each, and reductions of
    every shape (the per-row max and per-column min folded with 64-bit atomics), at a size
    of several tiles, within a few float64 ulps of torch."""
    g = torch.Generator(device="cuda").manual_seed(0)
    M, K, N = 300, 64, 520
    A = torch.randn(M, K, dtype=F64, device="cuda", generator=g) / 8
    B = torch.randn(K, N, dtype=F64, device="cuda", generator=g)
    C = torch.randn(M, N, dtype=F64, device="cuda", generator=g)
    unary = ["relu", "sigmoid", "log_sigmoid", "tanh", "gelu", "gelu_tanh", "silu",
             "softplus", "exp", "log", "sqrt", "rsqrt", "abs", "log1p", "expm1", "sin", "cos",
             "tan", "erf", "pow"]
    src, _ = _epilogue(unary, False)
    got = evtfuse.gemm(A, B, src, C=C, bias=C[0], s=torch.tensor(0.7, dtype=F64, device="cuda"))
    from evtfuse import EpilogueArguments, GemmArguments
    from evtfuse.reference import evaluate

    outs = {f"o{k}": torch.empty(M, N, dtype=F64, device="cuda") for k in range(len(unary))}
    outs["D"] = torch.empty(M, N, dtype=F64, device="cuda")
    epi = EpilogueArguments(src, C=C, bias=C[0], s=torch.tensor(0.7, dtype=F64, device="cuda"),
                            **outs)
    want = evaluate(GemmArguments(A, B, outs["D"], F64, epi))
    names = ["D"] + [f"o{k}" for k in range(len(unary))]
    for name, x in zip(names, (got[-1], *got[:-1])):
        torch.testing.assert_close(x, want[name], rtol=1e-12, atol=1e-12, msg=name)
    red = ("def e(accum, C):\n    x = accum + C\n    a = max(x)\n    b = min(x)\n"
           "    c = sum(x)\n    d = logsumexp(x)\n    e = max(x)\n    D = softmax(x)\n"
           "    return D, a, b, c, d, e")
    D, a, b, c, d, e = evtfuse.gemm(A, B, red, C=C, a=torch.empty(M, 1, dtype=F64, device="cuda"),
                                    b=torch.empty(N, dtype=F64, device="cuda"),
                                    c=torch.empty(M, 1, dtype=F64, device="cuda"),
                                    d=torch.empty(N, dtype=F64, device="cuda"),
                                    e=torch.empty(1, dtype=F64, device="cuda"))
    x = A @ B + C
    close = dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(D, torch.softmax(x, -1), **close)
    torch.testing.assert_close(a[:, 0], x.amax(1), rtol=0, atol=0)
    torch.testing.assert_close(b, x.amin(0), rtol=0, atol=0)
    torch.testing.assert_close(c[:, 0], x.sum(1), **close)
    torch.testing.assert_close(d, torch.logsumexp(x, 0), **close)
    torch.testing.assert_close(e, x.amax().reshape(1), rtol=0, atol=0)
    alpha = 1.0 / 3.0  # fp32 would round it
    D = evtfuse.gemm(A, B, "def e(accum, alpha):\n    D = alpha * accum\n    return D",
                     alpha=alpha)
    torch.testing.assert_close(D, alpha * (A @ B), **close)


@pytest.mark.parametrize("variant", ["on_accum", "on_operand", "save"])
@pytest.mark.parametrize("group", range(len(_grad_groups())))
def test_gradcheck_every_op_in_float64_on_the_gpu(group, variant):
    """One gradcheck a test (each compiles its own float64 kernels, minutes of a CPU core:
    three in one test ran past the tier's 540 s per shard part)."""
    ops = _grad_groups()[group]
    rowwise = any(op in ("sum", "max", "min", "logsumexp", "mean", "softmax", "log_softmax")
                  for op in ops)
    if variant == "save":
        _gradcheck(*_epilogue(ops, False), mode="save", device="cuda", tune="none")
    else:
        _gradcheck(*_epilogue(ops, variant == "on_operand"), batched=rowwise, device="cuda",
                   tune="none")


def test_nn_linear_in_float64_on_the_gpu():
    torch.manual_seed(0)
    ref = torch.nn.Linear(64, 48).double().cuda()
    lin = evtfuse.nn.Linear(64, 48, epilogue=evtfuse.nn.with_activation("gelu")).double().cuda()
    lin.load_state_dict(ref.state_dict())
    x = torch.randn(4, 33, 64, dtype=F64, device="cuda", requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    y, want = lin(x), torch.nn.functional.gelu(ref(x2))
    torch.testing.assert_close(y, want, rtol=1e-12, atol=1e-12)
    g = torch.randn(y.shape, dtype=F64, device="cuda")
    (y * g).sum().backward()
    (want * g).sum().backward()
    for got, exp in ((x.grad, x2.grad), (lin.weight.grad, ref.weight.grad),
                     (lin.bias.grad, ref.bias.grad)):
        torch.testing.assert_close(got, exp, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("case", [c for c in SPECIAL_CASES if c != "overflowing_logits"])
def test_linear_cross_entropy_special_values_on_the_gpu(case):
    inputs = _special_case(case)
    g = torch.linspace(0.5, 1.5, T, device="cuda")
    for reduction in ("none", "mean", "sum"):
        for options in LCE_OPTIONS:
            def weigh(loss, lse):
                return (loss * g).sum() if reduction == "none" else loss * 1.3

            ours, want = _lce_both(inputs, weigh=weigh, device="cuda", reduction=reduction,
                                   **options)
            for what, a, b in zip(("loss", "lse", "d_hidden", "d_weight", "d_bias"), ours, want):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, equal_nan=True,
                                           msg=lambda m: f"{case} {reduction} {options} {what}: {m}")


def test_linear_cross_entropy_of_overflowing_products_on_the_gpu():
    """Products h_k * w_k beyond fp32's range: the kernels' fused multiply-add takes each
    product unrounded into the sum (IEEE's fma), so a row of products +inf, +inf, -inf sums
    to +inf where torch's matmul, rounding each product first, gives inf - inf = NaN. Both
    are IEEE evaluations of the sum; the loss and lse are torch's of the logits evtfuse's
    GEMM computed (the CPU tier's interpreter, which rounds each product, matches torch's
    matmul: tests/test_round3_torch.py)."""
    h, w, b, y = (t.cuda() for t in _special_case("overflowing_logits"))
    z = evtfuse.gemm(h, w.t(), "def e(accum, bias):\n    D = accum + bias\n    return D",
                     bias=b, tune="none")
    assert torch.isinf(z).any()
    for reduction in ("none", "mean", "sum"):
        for options in LCE_OPTIONS:
            loss, lse = evtfuse.linear_cross_entropy(h, w, y, bias=b, reduction=reduction,
                                                     return_lse=True, **options)
            zc = z if options.get("softcap") is None else \
                options["softcap"] * torch.tanh(z / options["softcap"])
            want = torch.nn.functional.cross_entropy(
                zc, y, reduction=reduction, label_smoothing=options.get("label_smoothing", 0.0))
            want_lse = torch.logsumexp(zc, -1)
            if options.get("z_loss"):
                valid = y != -100
                zl = torch.where(valid, options["z_loss"] * want_lse * want_lse, 0.0)
                want = want + (zl if reduction == "none" else
                               zl.sum() / valid.sum() if reduction == "mean" else zl.sum())
            msg = f"{reduction} {options}"
            torch.testing.assert_close(lse, want_lse, equal_nan=True, msg=lambda m: f"{msg}: {m}")
            torch.testing.assert_close(loss, want, equal_nan=True, msg=lambda m: f"{msg}: {m}")


def test_forms_cover_the_op_table():
    from evtfuse.optable import OPS

    assert {n for n, r in OPS.items() if r.differentiable} == set(GRAD_FORMS)
