"""Bad input, fuzzed: a valid random epilogue (``epilogue_fuzz.cases``) with one mutation.

Mutations: a statement the language does not have (loops, imports, subscripts, attribute
access, strings, ``%``, walrus, ...) or a call it does not allow (unknown function, wrong
arity, a keyword argument, a function not called), a deleted or repeated line, a renamed
function, another return, or an operand of the wrong type, shape or dtype. The property
(docs/architecture.md, validation): building the arguments either succeeds, and then the portable
kernel matches the reference, or raises ``EpilogueError`` (or ``UnsupportedError``), never
another exception, and leaves every output tensor as it was. CPU tier only (the frontend
knows nothing of GPUs); ``EVTFUSE_FUZZ_EXAMPLES`` and ``EVTFUSE_FUZZ_SEED`` as in
``test_fuzz_kernels.py``.
"""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import evtfuse
from epilogue_fuzz import cases, drawn, pick, tiers
from evtfuse import EpilogueError
from evtfuse.errors import UnsupportedError

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tier")

STATEMENTS = (
    "for i in range(3): pass", "x = [1, 2]", "y = accum.T", "z = accum[0]", "w = 'text'",
    "import os", "q = lambda v: v", "if accum > 0: pass", "g = f'{accum}'", "h = accum @ accum",
    "k = accum if True else accum", "m = not accum", "n = accum and accum", "o = accum ** accum",
    "p = accum // 2.0", "r = accum % 2.0", "a, b = accum, accum", "accum += 1.0",
    "c: float = accum", "del accum", "assert accum", "u = accum.sum()", "v = torch.relu(accum)",
    "s = sum(accum, 1)", "e = relu()", "f = relu(accum, accum)", "j = clamp(accum)",
    "l = where(accum)", "t99 = t99", "x = print(accum)", "pass", "y = (accum := 1.0)",
    "z = {1: accum}", "w = ...", "v = 1j", "u = True", "t = None", "s = accum < 1.0 < 2.0",
    "q = max(accum, 1.0)", "p = sum(accum) + accum", "o = logsumexp(accum, 1)",
    "n = cast(accum, 'bogus')", "m = cast(accum)", "k = leaky_relu(accum, accum)",
    "h = accum.__class__", "g = nonexistent(accum)", "f = exp", "e = accum(1.0)",
    "b = abs(x=accum)", "d = col_index(accum)")
RETURNS = ("return", "return D + 1.0", "return undefined_name", "return (D,)", "return [D]",
           "return accum * 2.0", "return D, D", "return 'D'")
M, N, K = 33, 40, 24
VALUES = (
    lambda: torch.randn(M + 1, N), lambda: torch.randn(M, N).to(torch.complex64),
    lambda: "text", lambda: None, lambda: [1.0, 2.0], lambda: torch.randn(2, 2, M, N),
    lambda: torch.randn(M, N) > 0, lambda: torch.randn(3),
    lambda: torch.randn(M, N, dtype=torch.float64), lambda: float("nan"), lambda: True,
    lambda: torch.randn(1, 1, 1, 1), lambda: torch.empty(0),
    lambda: torch.randint(0, 5, (M, N)), lambda: torch.randn(M, 2 * N).half()[:, ::2])


@st.composite
def mutated(draw):
    """(case, source, replaced operand or None, its new value's maker index)."""
    case = draw(cases())
    lines = case.source.splitlines()
    kind = draw(st.sampled_from(("statement", "statement", "delete", "repeat", "rename",
                                 "return", "operand")))
    operand = None
    if kind == "statement":
        at = draw(st.integers(1, len(lines) - 1))
        lines.insert(at, "    " + draw(st.sampled_from(STATEMENTS)))
    elif kind == "delete" and len(lines) > 3:
        del lines[draw(st.integers(1, len(lines) - 2))]
    elif kind == "repeat" and len(lines) > 2:
        at = draw(st.integers(1, len(lines) - 2))
        lines.insert(at, lines[at])
    elif kind == "rename":
        called = sorted(set(re.findall(r"\b([a-z_]+)\(", case.source)))
        if called:
            name = draw(st.sampled_from(called))
            lines = [ln.replace(name + "(", "bogus_fn(") for ln in lines]
    elif kind == "return":
        lines[-1] = "    " + draw(st.sampled_from(RETURNS))
    elif kind == "operand" and case.operands:
        operand = (draw(st.sampled_from(case.operands)), draw(st.integers(0, len(VALUES) - 1)))
    return case, "\n".join(lines), operand


@tiers(quick=20, full=80)
def test_bad_input_gets_an_epilogue_error_and_leaves_outputs_alone(examples):
    @drawn(examples, base_seed=20261123)
    @given(mutated(), st.integers(0, 2 ** 16))
    def run(mutation, data_seed):
        _bad_input(mutation, data_seed)

    run()


def _bad_input(mutation, data_seed):
    case, source, operand = mutation
    values = dict(case.arguments(M, N, K, torch.float32, seed=data_seed).epilogue.values)
    if operand is not None:
        values[operand[0]] = VALUES[operand[1]]()
    outputs = {n: values[n] for n, _ in case.outputs if isinstance(values.get(n), torch.Tensor)}
    for t in outputs.values():
        t.fill_(7.0)
    A = torch.randn(M, K) * K ** -0.25
    B = torch.randn(K, N) * K ** -0.25
    try:
        epi = evtfuse.EpilogueArguments(source, **values)
        args = evtfuse.GemmArguments(A, B, values.get("D"), torch.float32, epi)
        args.optimized_dag  # noqa: B018 - binding and the passes run here
        kernel = pick(args, "portable", "first")
    except (EpilogueError, UnsupportedError) as e:
        assert str(e)  # a message, not an empty error
        for name, t in outputs.items():
            assert bool((t == 7.0).all()), f"{name} written though validation failed"
        return
    # still a valid epilogue (a harmless mutation): it must compute what the reference does
    assert kernel is not None, evtfuse.explain(args)
    result = kernel.verify(args)
    assert result, f"{source}\n{result.report()}"
