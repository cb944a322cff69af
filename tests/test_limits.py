"""Epilogues at the limits: deep expressions, long chains, huge numbers (CPU tier).

Each either works (the kernel verified against the reference) or gives an
``EpilogueError`` naming the variable and the line; never a RecursionError or an
OverflowError from inside evtfuse. Numbers follow Python's ``float()``: a float literal
past the largest double (``1e400``) is inf, an int literal or a runtime scalar that
``float()`` cannot convert (``10**400``) is an error naming it.
"""

from __future__ import annotations

import math

import pytest
import torch

from evtfuse import EpilogueArguments, EpilogueError, GemmArguments, explain, get_kernels
from evtfuse.reference import evaluate

pytestmark = [
    pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-interpreter tier"),
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
]

M, N, K = 24, 32, 16
GEN = torch.Generator().manual_seed(30)


def _rand(*shape):
    return torch.randn(*shape, generator=GEN)


def _args(src: str, **values) -> GemmArguments:
    D = torch.empty(M, N)
    return GemmArguments(_rand(M, K), _rand(K, N), D, epilogue=EpilogueArguments(src, D=D,
                                                                                 **values))


def _verified(args) -> None:
    ks = [k for k in get_kernels(args) if k.family.name == "portable"]
    assert ks, explain(args)
    result = ks[0].verify(args)
    assert result, result.report()


def _sum_source(terms: int) -> str:
    body = " + ".join(["accum"] + [f"C * {k % 7}.0" for k in range(terms - 1)])
    return f"def epi(accum, C):\n    D = {body}\n    return D"


# ------------------------------------------------------------------ deep expressions

@pytest.mark.parametrize("terms", [400, 1500])
def test_a_long_sum_in_one_expression_works(terms):
    args = _args(_sum_source(terms), C=_rand(M, N))
    _verified(args)
    want = args.A @ args.B + args.epilogue.values["C"] * sum(k % 7 for k in range(terms - 1))
    torch.testing.assert_close(args.epilogue.values["D"], want, rtol=1e-4, atol=1e-3)


def test_a_long_chain_of_assignments_works():
    """2,000 assignments, each using the one before: a DAG 2,000 nodes deep (the reference
    evaluator and every pass walk it without recursion)."""
    lines = ["def epi(accum, C):", "    t0 = accum"]
    lines += [f"    t{k} = t{k - 1} * 0.5 + C" for k in range(1, 2000)]
    lines += ["    D = t1999", "    return D"]
    args = _args("\n".join(lines), C=_rand(M, N))
    _verified(args)


def test_deep_unary_and_call_nesting_works_or_says_too_deep():
    """-(-(...)) 600 times, and abs(abs(...)) as deep as Python's parser takes (200)."""
    src = "def epi(accum, C):\n    D = " + "-" * 600 + "accum + C\n    return D"
    _verified(_args(src, C=_rand(M, N)))
    src = "def epi(accum, C):\n    D = " + "abs(" * 150 + "accum" + ")" * 150 + " + C\n    return D"
    _verified(_args(src, C=_rand(M, N)))


def test_too_deep_for_pythons_parser_is_an_epilogue_error_at_its_line():
    src = _sum_source(20000).replace("def epi(accum, C):\n", "def epi(accum, C):\n    x = accum\n")
    with pytest.raises(EpilogueError) as info:
        _args(src, C=_rand(M, N))
    err = info.value
    assert err.line == 3 and err.variable == "D", (err.line, err.variable)
    assert "too deep" in str(err) and str(err).startswith("line 3 of the epilogue string")


def test_too_deep_over_several_lines_and_on_one_line():
    """A statement continued over lines is reported at its first line; a whole epilogue
    on one line at that line, without a variable to name."""
    terms = " + ".join(["accum"] * 20000)
    src = f'def epi(accum):\n    """doc"""\n    D = (accum +\n         {terms})\n    return D'
    with pytest.raises(EpilogueError) as info:
        EpilogueArguments(src, D=torch.empty(M, N))
    assert (info.value.line, info.value.variable) == (3, "D")
    with pytest.raises(EpilogueError, match="too deep") as info:
        EpilogueArguments(f"def epi(accum): D = {terms}; return D", D=torch.empty(M, N))
    assert info.value.line == 1


def test_what_the_frontend_still_walks_by_recursion_is_an_epilogue_error_when_too_deep():
    """``**`` nests to the right without parentheses; a chain of 1,500 is too deep for the
    frontend's recursive walk: an EpilogueError at its line, not a RecursionError."""
    src = "def epi(accum):\n    x = accum\n    D = x ** " + " ** ".join(["1.0"] * 1500) + "\n    return D"
    with pytest.raises(EpilogueError) as info:
        EpilogueArguments(src, D=torch.empty(M, N))
    assert (info.value.line, info.value.variable) == (3, "D")


def test_the_generated_kernel_of_a_long_sum_is_flat():
    """The emitter names intermediate values: no line of the generated module nests a
    400-term expression (Triton parses the module with Python's ast)."""
    args = _args(_sum_source(400), C=_rand(M, N))
    kernel = [k for k in get_kernels(args) if k.family.name == "portable"][0]
    source = kernel.source(args)
    assert max(len(line) for line in source.splitlines()) < 400


# ------------------------------------------------------------------ huge numbers

def test_a_float_literal_past_the_largest_double_is_inf_as_in_python():
    """``1e400`` is inf in Python: ``accum ** 1e400`` is pow(accum, inf) (0 for |accum| < 1,
    inf above), and ``accum * 1e400`` is +-inf."""
    assert float("1e400") == math.inf
    args = _args("def epi(accum):\n    D = accum ** 1e400 + accum * 1e-400\n    return D")
    _verified(args)
    acc = args.A @ args.B
    want = torch.pow(acc, math.inf)
    assert torch.equal(evaluate(args)["D"], want)
    assert torch.equal(args.epilogue.values["D"], want)
    args = _args("def epi(accum):\n    D = accum * 1e400\n    return D")
    _verified(args)
    assert torch.isinf(args.epilogue.values["D"]).all()


def test_an_int_literal_past_the_largest_double_is_an_error_at_its_line():
    big = "1" + "0" * 400
    with pytest.raises(OverflowError):
        float(int(big))  # what Python does with it
    src = f"def epi(accum):\n    x = accum\n    D = x * {big}\n    return D"
    with pytest.raises(EpilogueError) as info:
        _args(src)
    err = info.value
    assert err.line == 3 and err.variable == "D"
    assert "401 digits" in str(err) and "float" in str(err)
    src = f"def epi(accum):\n    D = leaky_relu(accum, {big})\n    return D"
    with pytest.raises(EpilogueError) as info:
        _args(src)
    assert info.value.line == 2


@pytest.mark.parametrize("value", [10 ** 400, -(10 ** 400)], ids=["1e400", "-1e400"])
def test_a_runtime_scalar_float_cannot_hold_is_an_error_naming_it(value):
    src = "def epi(accum, alpha):\n    D = alpha * accum\n    return D"
    with pytest.raises(EpilogueError) as info:
        _args(src, alpha=value)
    assert info.value.variable == "alpha"
    assert "alpha" in str(info.value) and "401 digits" in str(info.value)


def test_a_runtime_scalar_changed_to_a_huge_int_after_checks_is_an_error_naming_it():
    """A launch plan reads runtime scalars per call without the constructor's checks."""
    src = "def epi(accum, alpha):\n    D = alpha * accum\n    return D"
    args = _args(src, alpha=2.0)
    kernel = [k for k in get_kernels(args) if k.family.name == "portable"][0]
    kernel.run(args)
    args.epilogue.values["alpha"] = 10 ** 400
    with pytest.raises(EpilogueError, match="alpha"):
        kernel.run(args)
    with pytest.raises(EpilogueError, match="alpha"):
        evaluate(args)


def test_a_runtime_scalar_past_fp32_is_inf_as_torch_makes_it():
    """1e300 is a double but no float32: the kernels compute in fp32, where it is inf, as
    torch's own ``x * 1e300`` of an fp32 tensor gives."""
    src = "def epi(accum, alpha):\n    D = alpha * accum\n    return D"
    args = _args(src, alpha=1e300)
    _verified(args)
    acc = args.A @ args.B
    assert torch.equal(args.epilogue.values["D"], acc * 1e300)
