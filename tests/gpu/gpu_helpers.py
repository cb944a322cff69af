"""Helpers shared by the GPU-tier test modules (imported by name: pytest puts this folder
on ``sys.path`` for the test modules beside it)."""

from __future__ import annotations

import pytest

import evtfuse
from evtfuse import get_kernels


# one epilogue that uses every elementwise op family of the op table
ALL_OPS = """
def epi(accum, C, bias, rowv, s):
    x = accum * 0.125 + bias
    a = relu(x) + leaky_relu(x, 0.2) + sigmoid(x) + tanh(x) + gelu(x) + gelu_tanh(x)
    b = silu(x) + hardswish(x) + softplus(x) + exp(-abs(x)) + log(abs(x) + 1.0) + log_sigmoid(x)
    c = sqrt(abs(x)) + rsqrt(abs(x) + 1.0) + sin(x) + cos(x) + tan(x * 0.1)
    d = maximum(x, C) + minimum(x, rowv) + clamp(x, -0.5, 0.5) + where(x > C, x, C)
    e = multiply_add(x, s, C) + x ** 2 + x ** 3 - x / (abs(C) + 1.0)
    D = a + b + c + d + e
    return D
"""


def family_kernels(args, family):
    """The kernels of one family for ``args``, best first; fails with ``explain`` if none."""
    ks = [k for k in get_kernels(args) if k.family.name == family]
    if not ks:
        pytest.fail(f"no {family} kernel for these arguments:\n{evtfuse.explain(args)}")
    return ks


def check(args, family, n_configs=2):
    """Verify the first ``n_configs`` kernels of ``family`` (poisoned outputs, reference)."""
    for k in family_kernels(args, family)[:n_configs]:
        result = k.verify(args)
        assert result, result.report()


def check_grouped_family(src, A, B, offs, outputs, family="hopper", atol=3e-2, rtol=2e-2,
                         **operands):
    """Run every ``family`` kernel of a grouped GEMM over M (``Kernel.verify`` does not take
    grouped ones) on NaN-filled ``outputs`` and compare each output with the reference
    evaluator's over the rows of some group; the rows at or past offs[-1] must stay NaN.
    Returns the kernels' names."""
    import torch

    from evtfuse import EpilogueArguments, GemmArguments
    from evtfuse.reference import evaluate_grouped

    args = GemmArguments(A, B, outputs["D"], offs=offs,
                         epilogue=EpilogueArguments.unbound(src, **operands, **outputs))
    ref = evaluate_grouped(src, A, B, offs, {**operands, **outputs})
    end = int(offs[-1])  # the test reads offs on the host; the kernels never do
    names = []
    for k in family_kernels(args, family):
        for t in outputs.values():
            t.fill_(float("nan"))
        k.run(args)
        torch.cuda.synchronize()
        for name, t in outputs.items():
            torch.testing.assert_close(t[:end].float(), ref[name][:end].float(), atol=atol,
                                       rtol=rtol, msg=lambda m: f"{k.name} {name}: {m}")
            assert t[end:].isnan().all(), f"{k.name} wrote {name}'s rows past offs[-1]"
        names.append(k.name)
    return names
