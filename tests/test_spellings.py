"""torch's spellings in epilogues (``evtfuse.spellings``) and the errors that point at the
fix: each spelling through the kernel (interpreter) against torch's own function on the
same accumulator; what is refused, with the call's line; gemm's own checks (operands
named like its keywords, a misspelt operand, a 1-D A)."""

from __future__ import annotations

import pytest
import torch

import evtfuse
from evtfuse import EpilogueError
from evtfuse.frontend import parse_epilogue

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="CPU-interpreter tier (the frontend is the same on a GPU)")

GEN = torch.Generator().manual_seed(36)
F = torch.nn.functional
A, B = torch.randn(16, 24, generator=GEN), torch.randn(24, 20, generator=GEN)
C = torch.randn(16, 20, generator=GEN)
ACC = A @ B

SPELLED = {  # the epilogue's value of D -> torch's, from the accumulator x and C
    "F.gelu(accum, approximate='tanh')": lambda x: F.gelu(x, approximate="tanh"),
    "torch.nn.functional.gelu(accum, approximate='none')": F.gelu,
    "torch.clamp(accum, min=-1.0, max=2.0)": lambda x: torch.clamp(x, min=-1.0, max=2.0),
    "torch.clamp(accum, min=0.5)": lambda x: torch.clamp(x, min=0.5),
    "torch.clamp(accum, max=0.5)": lambda x: torch.clamp(x, max=0.5),
    "torch.clamp(accum, None, 0.5)": lambda x: torch.clamp(x, None, 0.5),
    "torch.clip(accum, -0.5, 0.5)": lambda x: torch.clip(x, -0.5, 0.5),
    "torch.clamp_min(accum, 0.25)": lambda x: torch.clamp_min(x, 0.25),
    "accum.clamp_max(0.25)": lambda x: x.clamp_max(0.25),
    "F.leaky_relu(accum, negative_slope=0.2)": lambda x: F.leaky_relu(x, negative_slope=0.2),
    "F.softplus(accum, beta=2.0)": lambda x: F.softplus(x, beta=2.0),
    "F.softplus(accum, 0.5, 20.0)": lambda x: F.softplus(x, 0.5, 20.0),
    "F.softplus(accum, beta=2.0, threshold=10.0)": lambda x: F.softplus(x, 2.0, 10.0),
    "F.relu(accum, inplace=False)": F.relu,
    "accum.relu()": torch.relu,
    "accum.sigmoid() * accum.tanh()": lambda x: x.sigmoid() * x.tanh(),
    "(accum + C).abs().sqrt()": lambda x: (x + C).abs().sqrt(),
    "accum.clamp(min=0.0).pow(2)": lambda x: x.clamp(min=0.0).pow(2),
    "torch.exp(accum * 0.1).log()": lambda x: torch.exp(x * 0.1).log(),
    "accum.mul(C).add(C).neg()": lambda x: -(x * C + C),
    "torch.pow(accum, exponent=3.0) / torch.sub(C, 5.0)": lambda x: x ** 3 / (C - 5.0),
}


@pytest.mark.parametrize("expr", list(SPELLED))
def test_torch_spellings_compute_what_torch_does(expr):
    src = f"def e(accum, C):\n    D = {expr}\n    return D"
    got = evtfuse.gemm(A, B, src, C=C)
    torch.testing.assert_close(got, SPELLED[expr](ACC), atol=1e-4, rtol=1e-4)


def test_a_method_of_an_earlier_variable():
    src = "def e(accum, C):\n    t = accum + C\n    D = t.relu()\n    return D"
    torch.testing.assert_close(evtfuse.gemm(A, B, src, C=C), torch.relu(ACC + C),
                               atol=1e-4, rtol=1e-4)


REFUSED = {
    "F.gelu(accum, approximate='fast')": "gelu(approximate=...) takes \"none\"",
    "torch.clamp(accum)": "clamp() needs min or max",
    "torch.clamp(accum, low=0.0)": "clamp() got an unexpected keyword argument 'low'",
    "F.relu(accum, inplace=True)": "relu(inplace=True): an epilogue computes new values",
    "accum.pow(2.0, 3.0)": "pow() takes 2 value(s), got 3",
    "torch.mul(accum, 2.0, out=accum)": "mul() takes 2 value(s), not the keyword out",
}


@pytest.mark.parametrize("expr", list(REFUSED))
def test_refused_spellings_name_the_call_and_its_line(expr):
    src = f"def e(accum):\n    D = {expr}\n    return D"
    with pytest.raises(EpilogueError) as info:
        parse_epilogue(src)
    assert REFUSED[expr] in str(info.value) and info.value.line == 2
    assert info.value.variable == "D"


def test_gemm_names_a_misspelt_operand():
    with pytest.raises(EpilogueError, match="Argument alpha is not provided in the kwargs of "
                                            "gemm.*'alpah' was given: a misspelling of alpha") as e:
        evtfuse.gemm(A, B, "def e(accum, alpha): D = alpha * accum; return D", alpah=1.0)
    assert e.value.variable == "alpha"


@pytest.mark.parametrize("name", ["tune", "cc", "backward", "D_dtype"])
def test_operands_named_like_gemm_keywords_are_refused_with_their_line(name):
    src = f"def e(accum, x):\n    D = accum\n    {name} = x * 2.0\n    return D, {name}" \
        if name.endswith("_dtype") else f"def e(accum, {name}):\n    D = accum * {name}\n    return D"
    with pytest.raises(EpilogueError, match=f"'{name}' has the name of") as e:
        evtfuse.gemm(A, B, src, **({"x": 1.0} if name.endswith("_dtype") else {}))
    assert e.value.variable == name and e.value.line is not None


def test_a_one_dimensional_a_is_named():
    with pytest.raises(EpilogueError, match=r"gemm: A must have 2 or 3 dimensions .* got "
                                            r"shape \(24,\)") as e:
        evtfuse.gemm(A[0], B)
    assert e.value.variable == "A"


def test_conditions_combine_with_and_or_not():
    """``&``, ``|`` and ``~`` of comparisons (Python's precedence: ``~`` first, then ``&``,
    then ``|``), a runtime scalar on one side, and of plain values (true where nonzero,
    as torch.logical_*)."""
    src = ("def e(accum, C, t):\n    m = (accum > 0) & ~(C < t) | (accum < -2.0)\n"
           "    D = where(m, accum, C * t)\n    E = where(logical_and(accum, C - 1.0), 1.0, 0.0)"
           "\n    return D, E")
    D, E = evtfuse.gemm(A, B, src, C=C, t=-0.5)
    m = (ACC > 0) & ~(C < -0.5) | (ACC < -2.0)
    torch.testing.assert_close(D, torch.where(m, ACC, C * -0.5), atol=1e-4, rtol=1e-4)
    assert torch.equal(E, torch.logical_and(ACC, C - 1.0).float())
