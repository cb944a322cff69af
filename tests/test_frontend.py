"""Frontend and argument objects: source forms, the documented messages word for word,
clear messages (variable + line) for everything else, operand/output classification and
GemmArguments validation. Nothing here needs a GPU."""

from __future__ import annotations

import functools
import inspect

import pytest
import torch

from evtfuse import EpilogueArguments, EpilogueError, GemmArguments
from evtfuse import ir
from evtfuse.frontend import classify_operand, classify_output, parse_epilogue
from evtfuse.ir import NodeKind, OperandKind, OutputKind
from evtfuse.reference import evaluate

L, M, N, K = 3, 5, 7, 4  # all different, so that every shape has one reading


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=_gen(seed)).to(dtype)


def _poisoned(*shape):
    return torch.full(shape, float("nan"))


def _line_of(fn, text: str) -> int:
    """The file line number of the (unique) line of ``fn`` containing ``text``."""
    lines, start = inspect.getsourcelines(fn)
    hits = [k for k, line in enumerate(lines) if text in line]
    assert len(hits) == 1, (text, hits)
    assert start == inspect.unwrap(fn).__code__.co_firstlineno
    return start + hits[0]


# ------------------------------------------------------------------ user functions (line tests)

def epi_linear(accum, C, alpha, beta):
    F = alpha * accum + beta * C
    D = relu(F)  # noqa: F821 - recognised by name, never executed
    return D, F


def bad_subscript(accum, C):
    x = accum * 2.0
    y = C[0]
    D = x + y
    return D


def bad_undefined(accum, alpha):
    t = accum * alpha
    D = t + missing_name  # noqa: F821
    return D


def bad_unknown_fn(accum):
    t = accum + 1.0
    D = frobnicate(t)  # noqa: F821
    return D


def bad_lambda(accum):
    f = lambda x: x  # noqa: E731
    D = accum
    return D


def bad_ifexp(accum, alpha):
    D = accum if alpha else alpha
    return D


def bad_unpack(accum, alpha):
    t = accum * alpha
    D, E = t, t
    return D


def bad_pow(accum, alpha):
    t = accum * 2.0
    D = t ** alpha
    return D


def bad_chain(accum):
    t = accum * 2.0
    D = 0.0 < t < 1.0
    return D


def bad_ssa(accum):
    tmp = accum * 2.0
    # Redefine tmp, which violates SSA form.
    tmp = tmp - 1.0
    D = tmp / 4.0
    return D, tmp


def bad_augassign(accum):
    tmp = accum * 2.0
    tmp += 1.0
    D = tmp
    return D


def fail_missing_accum(alpha, beta, C):
    D = (C * beta)
    return D


def fail_missing_D(accum, alpha, beta, C):
    F = (accum * alpha) + (C * beta)
    return F


def my_epi(accum, alpha, beta, C):
    F = (accum * alpha) + (C * beta)
    D = relu(F)  # noqa: F821
    return D


def red_unreturned(accum, bias):
    f = accum + bias
    s = sum(f)
    D = f * 2.0
    return D


def red_reused(accum, bias):
    f = accum + bias
    s = max(f)
    D = f - s
    return D, s


def red_inside(accum):
    D = accum - max(accum)
    return D


def out_not_reduced(accum, bias):
    D = accum + bias
    R = accum * 2.0
    return D, R


def _noop(fn):
    @functools.wraps(fn)
    def wrapper(*a, **k):
        return fn(*a, **k)
    return wrapper


@_noop
def bad_decorated(accum):
    t = accum * 2.0
    D = t + nowhere  # noqa: F821
    return D


# ------------------------------------------------------------------ source forms

ONE_LINE = "def epi(accum, alpha, beta, C): F = (accum * alpha) + (C * beta); D = relu(F); return D, F"
MULTI_LINE = """
def epi(accum, alpha, beta, C):
    F = (accum * alpha) + (C * beta)
    D = relu(F)
    return D, F
"""


def _linear_expect(acc, alpha, beta, C):
    F = acc * alpha + C * beta
    return torch.relu(F), F


@pytest.mark.parametrize("source", [ONE_LINE, MULTI_LINE, "function"])
def test_source_forms_agree(source):
    if source == "function":
        def source(accum, alpha, beta, C):
            F = (accum * alpha) + (C * beta)
            D = relu(F)  # noqa: F821
            return D, F
    C = _randn(M, N, seed=1)
    acc = _randn(M, N, seed=2)
    D, F = _poisoned(M, N), _poisoned(M, N)
    epi = EpilogueArguments(source, alpha=1.5, beta=-0.5, C=C, D=D, F=F)
    assert epi.operand_names == ("alpha", "beta", "C")
    assert epi.output_names == ("D", "F")
    dag = epi.dag
    assert [o.name for o in dag.outputs] == ["D", "F"]
    assert [n.op for n in dag.nodes if n.kind is NodeKind.COMPUTE] == ["mul", "mul", "add", "relu"]
    got = evaluate(epi, acc)
    D_ref, F_ref = _linear_expect(acc, 1.5, -0.5, C)
    assert torch.equal(got["D"], D_ref) and torch.equal(got["F"], F_ref)
    assert torch.isnan(D).all() and torch.isnan(F).all()  # evaluate never writes outputs


def test_one_line_string_lines_and_multiline_lines():
    p1 = parse_epilogue(ONE_LINE)
    assert {a.line for a in p1.assignments} == {1}
    p2 = parse_epilogue(MULTI_LINE)
    assert [a.line for a in p2.assignments] == [3, 4]
    assert [a.target for a in p2.assignments] == ["F", "D"]


def test_function_form_lines_are_file_lines():
    p = parse_epilogue(epi_linear)
    assert p.name == "epi_linear"
    assert p.params == ("C", "alpha", "beta")
    assert [a.line for a in p.assignments] == [_line_of(epi_linear, "F = alpha"),
                                               _line_of(epi_linear, "D = relu(F)")]
    assert p.returns == (("D", _line_of(epi_linear, "return D, F")),
                         ("F", _line_of(epi_linear, "return D, F")))


def test_string_form_is_not_executed(tmp_path):
    marker = tmp_path / "pwned"
    write = f"open({str(marker)!r}, 'w').write('x')"
    src = f"{write}\ndef epi(accum):\n    D = accum\n    return D\n{write}\n"
    with pytest.raises(EpilogueError, match="outside") as exc:  # refused, never run
        EpilogueArguments(src, D=_poisoned(M, N))
    assert exc.value.line == 1
    assert not marker.exists()
    with pytest.raises(EpilogueError):  # a call inside the function is never made either
        EpilogueArguments(f"def epi(accum):\n    D = {write}\n    return D", D=_poisoned(M, N))
    assert not marker.exists()


def test_docstring_annotations_and_module_prefix_are_accepted():
    src = ('def epi(accum, b):\n    """doc"""\n    t: float = accum + b\n'
           '    D = evtfuse.ops.gelu(t)\n    return D')
    b = _randn(N, seed=3)
    acc = _randn(M, N, seed=4)
    epi = EpilogueArguments(src, b=b, D=_poisoned(M, N))
    assert torch.equal(evaluate(epi, acc)["D"], torch.nn.functional.gelu(acc + b))


# ------------------------------------------------------------------ positional-only epilogue

@pytest.mark.parametrize("name", ["s", "fn", "e", "epilogue", "self"])
def test_operand_names_that_shadow_parameters(name):
    src = f"def epi(accum, {name}):\n    D = accum * {name}\n    return D"
    acc = _randn(M, N, seed=5)
    epi = EpilogueArguments(src, **{name: 2.5, "D": _poisoned(M, N)})
    assert epi.operand_names == (name,)
    assert epi.values[name] == 2.5
    assert torch.equal(evaluate(epi, acc)["D"], acc * 2.5)


def test_output_named_epilogue():
    src = "def f(accum):\n    D = accum\n    epilogue = accum * 2.0\n    return D, epilogue"
    acc = _randn(M, N, seed=6)
    epi = EpilogueArguments(src, D=_poisoned(M, N), epilogue=_poisoned(M, N))
    assert torch.equal(evaluate(epi, acc)["epilogue"], acc * 2.0)


# ------------------------------------------------------------------ documented messages, word for word

def _raises(fn, *args, **kwargs) -> EpilogueError:
    with pytest.raises(EpilogueError) as info:
        fn(*args, **kwargs)
    assert isinstance(info.value, ValueError)
    return info.value


def _documented(e: EpilogueError, message: str, variable: str) -> None:
    """A message CUTLASS documents: word for word first, then its location (the line)."""
    assert e.bare_message == message and e.variable == variable and e.line is not None
    assert str(e).startswith(f"{message} (line {e.line} of ")


def test_message_missing_accum():
    e = _raises(EpilogueArguments, fail_missing_accum, alpha=1.0, beta=2.0,
                C=_randn(M, N), D=_poisoned(M, N))
    _documented(e, "accum must be an input to the epilogue function", "accum")
    e = _raises(EpilogueArguments, "def f(): D = 1.0; return D", D=_poisoned(M, N))
    _documented(e, "accum must be an input to the epilogue function", "accum")
    assert str(e).startswith("accum must be an input to the epilogue function (line 1 of ")


def test_accum_not_first_says_it_must_come_first():
    """accum listed after an operand is not missing: the message says where it goes."""
    e = _raises(EpilogueArguments, "def f(alpha, accum): D = accum; return D", alpha=1.0,
                D=_poisoned(M, N))
    assert e.bare_message.startswith("accum must be the first parameter of the epilogue")
    assert "write 'def f(accum, alpha)'" in str(e) and e.line == 1 and e.variable == "accum"


def test_message_missing_D():
    e = _raises(EpilogueArguments, fail_missing_D, alpha=1.0, beta=2.0, C=_randn(M, N),
                F=_poisoned(M, N))
    _documented(e, "Output node D is not found in the epilogue function.", "D")
    assert e.line == _line_of(fail_missing_D, "return")


def test_message_ssa():
    e = _raises(EpilogueArguments, bad_ssa, D=_poisoned(M, N), tmp=_poisoned(M, N))
    _documented(e, "Variable 'tmp' cannot be defined twice.", "tmp")
    assert e.line == _line_of(bad_ssa, "tmp = tmp - 1.0")
    e = _raises(EpilogueArguments, bad_augassign, D=_poisoned(M, N))
    _documented(e, "Variable 'tmp' cannot be defined twice.", "tmp")
    assert e.line == _line_of(bad_augassign, "tmp += 1.0")
    # a parameter is defined too
    e = _raises(EpilogueArguments, "def f(accum, a):\n    a = accum\n    D = a\n    return D",
                a=1.0, D=_poisoned(M, N))
    _documented(e, "Variable 'a' cannot be defined twice.", "a")
    assert e.line == 2
    assert str(e) == ("Variable 'a' cannot be defined twice. (line 2 of the epilogue string)"
                      "\n    a = accum")


def test_message_argument_not_provided():
    C = _randn(M, N)
    e = _raises(EpilogueArguments, my_epi, alpha=1.0, beta=2.0, C=C)
    assert str(e) == "Argument D is not provided in the kwargs of the EpilogueArguments constructor"
    e = _raises(EpilogueArguments, my_epi, beta=2.0, C=C, D=_poisoned(M, N))
    assert str(e) == ("Argument alpha is not provided in the kwargs of the EpilogueArguments "
                      "constructor")
    assert e.variable == "alpha"


# ------------------------------------------------------------------ other source errors: variable and line

SOURCE_ERRORS = [
    # (function, kwargs, line marker, variable, words the message must contain)
    (bad_subscript, dict(C=1.0), "y = C[0]", "y", ["Subscript", "'y'"]),
    (bad_undefined, dict(alpha=1.0), "D = t + missing_name", "missing_name",
     ["undefined name 'missing_name'", "'D'"]),
    (bad_unknown_fn, dict(), "D = frobnicate(t)", "frobnicate",
     ["unknown function 'frobnicate'", "relu"]),
    (bad_lambda, dict(), "f = lambda x: x", "f", ["Lambda", "'f'"]),
    (bad_ifexp, dict(alpha=1.0), "D = accum if alpha else alpha", "D", ["IfExp", "'D'"]),
    (bad_unpack, dict(alpha=1.0), "D, E = t, t", None, ["tuple unpacking"]),
    (bad_pow, dict(alpha=1.0), "D = t ** alpha", "D", ["exponent", "literal", "'D'"]),
    (bad_chain, dict(), "D = 0.0 < t < 1.0", "D", ["chained comparison", "'D'"]),
    (bad_decorated, dict(), "D = t + nowhere", "nowhere", ["undefined name 'nowhere'"]),
]


@pytest.mark.parametrize("fn,kwargs,marker,variable,words", SOURCE_ERRORS,
                         ids=[c[0].__name__ for c in SOURCE_ERRORS])
def test_source_error_names_variable_and_line(fn, kwargs, marker, variable, words):
    e = _raises(EpilogueArguments, fn, D=_poisoned(M, N), **kwargs)
    line = _line_of(fn, marker)
    assert e.line == line
    assert e.variable == variable
    text = str(e)
    assert text.startswith(f"line {line} of {fn.__name__}: ")
    assert text.rstrip().endswith(marker.strip()) or marker.strip() in text.splitlines()[-1]
    for w in words:
        assert w in text, (w, text)


@pytest.mark.parametrize("body,line,words", [
    ("    D = accum[0]", 2, ["Subscript"]),
    ("    D = (lambda x: x)(accum)", 2, ["unsupported call"]),
    ("    D = accum if accum else accum", 2, ["IfExp"]),
    ("    t = accum\n    D, E = t, t", 3, ["tuple unpacking"]),
    ("    D = accum ** accum", 2, ["exponent"]),
    ("    t = accum\n    D = t < t <= t", 3, ["chained"]),
    ("    D = accum // 2.0", 2, ["FloorDiv"]),
    ("    D = accum % 2.0", 2, ["Mod"]),
    ("    D = accum + 'x'", 2, ["literal"]),
    ("    D = not accum", 2, ["Not"]),
    ("    D = accum and accum", 2, ["BoolOp"]),
    ("    D = relu(accum, 2.0)", 2, ["relu() takes 1 positional argument"]),
    ("    D = leaky_relu(accum, accum)", 2, ["slope", "literal"]),
    ("    D = leaky_relu(accum, alpha=0.1)", 2, ["unexpected keyword argument 'alpha'"]),
    ("    D = row_index(accum)", 2, ["takes no arguments"]),
    ("    D = accum\n    if D:\n        pass", 3, ["unsupported statement (If)"]),
    ("    D = accum\n    print(D)", 3, ["unsupported statement (Expr)"]),
    ("    t = accum\n    return t\n    D = t\n    return D", 3, ["only one return"]),
    ("    D = accum\n    return D + 1.0", 3, ["return names only"]),
    ("    D = accum\n    return D, D", 3, ["returned twice"]),
    ("    D = accum\n    return D, nope", 3, ["undefined name 'nope'"]),
])
def test_string_source_errors(body, line, words):
    src = f"def epi(accum):\n{body}" + ("" if "return" in body else "\n    return D")
    e = _raises(parse_epilogue, src)
    assert e.line == line
    text = str(e)
    assert text.startswith(f"line {line} of the epilogue string: ")
    for w in words:
        assert w in text, (w, text)
    # the offending source line closes the message
    assert text.splitlines()[-1].strip() == src.splitlines()[line - 1].strip()


def test_returning_an_input_and_syntax_errors():
    e = _raises(parse_epilogue, "def f(accum, C):\n    D = accum\n    return D, C")
    assert "'C' is an input" in str(e) and e.variable == "C" and e.line == 3
    e = _raises(parse_epilogue, "def f(accum):\n    D = accum +\n    return D")
    assert "not valid Python" in str(e) and e.line == 2
    e = _raises(parse_epilogue, "D = accum")
    assert "exactly one function" in str(e)
    e = _raises(parse_epilogue, "def f(accum, *rest):\n    D = accum\n    return D")
    assert "positional parameters only" in str(e)
    e = _raises(parse_epilogue, "def f(accum, a=1.0):\n    D = accum\n    return D")
    assert "default values" in str(e)
    e = _raises(parse_epilogue, 42)
    assert "function or a source string" in str(e)


# ------------------------------------------------------------------ binding errors

def test_unexpected_keyword_argument():
    e = _raises(EpilogueArguments, my_epi, alpha=1.0, beta=2.0, C=_randn(M, N),
                D=_poisoned(M, N), gamma=3.0)
    assert e.variable == "gamma"
    assert "gamma" in str(e) and "not a parameter or an output" in str(e)
    assert "my_epi(accum, alpha, beta, C) -> D" in str(e)
    e = _raises(EpilogueArguments, "def e(accum): D = accum; return D", D=_poisoned(M, N),
                gamma=3.0)
    assert "e(accum) -> D" in str(e)  # no dangling comma without parameters


def test_accumulator_given_but_not_returned():
    e = _raises(EpilogueArguments, "def e(accum): D = accum * 2.0; return D",
                D=_poisoned(M, N), accum=_poisoned(M, N))
    assert e.variable == "accum"
    assert "does not return accum" in str(e) and "return ..., accum" in str(e)


def test_function_used_without_a_call():
    e = _raises(EpilogueArguments, "def e(accum):\n    f = exp\n    D = accum\n    return D",
                D=_poisoned(M, N))
    assert "line 2" in str(e) and "undefined name 'exp'" in str(e)
    assert "exp is a function: call it (exp(x))" in str(e)


@pytest.mark.parametrize("shape,dim", [((M, N + 1), "N"), ((M + 1, 1), "M"), ((M,), "N"),
                                       ((2, M, N), "L"), ((L, M, N, 1), None)])
def test_operand_shape_that_cannot_broadcast(shape, dim):
    src = "def epi(accum, X):\n    D = accum + X\n    return D"
    e = _raises(EpilogueArguments, src, X=_randn(*shape), D=_poisoned(L, M, N))
    assert e.variable == "X"
    assert "'X'" in str(e)
    if dim is None:
        assert "at most 3" in str(e)
    else:
        assert "does not broadcast" in str(e) and f"its {dim} dimension" in str(e)


@pytest.mark.parametrize("shape", [(M, N + 2), (M + 1, 1), (2, M, N), (L, M, N, 1)])
def test_output_shape_neither_full_nor_reduction(shape):
    src = "def epi(accum):\n    D = accum\n    R = accum * 2.0\n    return D, R"
    e = _raises(EpilogueArguments, src, D=_poisoned(L, M, N), R=_poisoned(*shape))
    assert e.variable == "R"
    assert "Output 'R'" in str(e)


def test_output_with_reduction_shape_but_no_reduction():
    e = _raises(EpilogueArguments, out_not_reduced, bias=_randn(M, 1), D=_poisoned(M, N),
                R=_poisoned(M, 1))
    assert e.variable == "R"
    assert e.line == _line_of(out_not_reduced, "return D, R")
    assert "not computed by sum/max/min" in str(e) and "R" in str(e)


def test_full_output_of_a_value_that_differs_per_batch():
    src = "def epi(accum, C):\n    D = accum\n    R = C * 2.0\n    Q = accum * 2.0\n    return D, R, Q"
    # R depends on C (M, N) only: an (M, N) output is fine; Q depends on accum, which
    # differs per batch when L > 1, so an (M, N) Q cannot hold it
    e = _raises(EpilogueArguments, src, C=_randn(M, N), D=_poisoned(L, M, N),
                R=_poisoned(M, N), Q=_poisoned(M, N))
    assert e.variable == "Q" and e.line == 5 and "differs per batch" in str(e)
    epi = EpilogueArguments(src, C=_randn(M, N), D=_poisoned(L, M, N), R=_poisoned(M, N),
                            Q=_poisoned(L, M, N))
    assert epi.dag.output("R").batched is False and epi.dag.output("Q").batched is True


def test_reduction_never_returned():
    e = _raises(EpilogueArguments, red_unreturned, bias=_randn(N), D=_poisoned(M, N))
    assert e.variable == "s"
    assert e.line == _line_of(red_unreturned, "s = sum(f)")
    assert "never returned" in str(e)


def test_reduction_used_in_further_computation():
    # a reduction's result feeds computation (issue 35; tests/test_softmax_cpu.py runs it)
    epi = EpilogueArguments(red_reused, bias=_randn(N), D=_poisoned(M, N), s=_poisoned(M, 1))
    assert epi.dag.output("D").node.inputs[1] is epi.dag.output("s").node
    # inside an expression (issue 46): the DAG of the two-assignment form
    inside = EpilogueArguments(red_inside, D=_poisoned(M, N)).dag
    named = EpilogueArguments("def e(accum):\n    m = max(accum)\n    D = accum - m\n"
                              "    return D", D=_poisoned(M, N)).dag
    assert ir.signature(inside) == ir.signature(named)


def test_reduction_into_full_or_none_output():
    src = "def epi(accum):\n    D = accum\n    s = sum(accum)\n    return D, s"
    e = _raises(EpilogueArguments, src, D=_poisoned(M, N), s=_poisoned(M, N))
    assert e.variable == "s" and e.line == 3 and "full shape" in str(e)
    e = _raises(EpilogueArguments, src, D=_poisoned(M, N), s=None)
    assert e.variable == "s" and e.line == 3 and "cannot be None" in str(e)


# ------------------------------------------------------------------ operand kinds

RS, DS, ROW, COL, FULL = (OperandKind.RUNTIME_SCALAR, OperandKind.DEVICE_SCALAR,
                          OperandKind.PER_ROW, OperandKind.PER_COL, OperandKind.FULL)

OPERAND_TABLE = [
    # (value, L, kind, batched)
    (2.0, L, RS, False), (3, L, RS, False), (-0.5, 1, RS, False),
    ((), L, DS, False), ((1,), L, DS, False), ((1, 1), L, DS, False),
    ((L, 1, 1), L, DS, True), ((1, 1, 1), L, DS, False), ((1, 1, 1), 1, DS, False),
    ((N,), L, COL, False), ((1, N), L, COL, False), ((L, 1, N), L, COL, True),
    ((1, 1, N), L, COL, False), ((1, 1, N), 1, COL, False),
    ((M, 1), L, ROW, False), ((L, M, 1), L, ROW, True), ((1, M, 1), L, ROW, False),
    ((1, M, 1), 1, ROW, False),
    ((M, N), L, FULL, False), ((L, M, N), L, FULL, True), ((1, M, N), L, FULL, False),
    ((1, M, N), 1, FULL, False), ((M, N), 1, FULL, False),
]


def _value(spec, seed=7, dtype=torch.float32):
    if isinstance(spec, tuple):
        return _randn(*spec, seed=seed, dtype=dtype) if spec else torch.tensor(1.25, dtype=dtype)
    return spec


@pytest.mark.parametrize("spec,l,kind,batched", OPERAND_TABLE)
def test_classify_operand(spec, l, kind, batched):
    value = _value(spec)
    got = classify_operand("X", value, (l, M, N))
    assert got.name == "X"
    assert got.kind is kind
    assert got.batched is batched
    assert got.dtype == (None if kind is RS else torch.float32)


@pytest.mark.parametrize("spec,l,kind,batched", OPERAND_TABLE)
def test_operand_kind_through_arguments(spec, l, kind, batched):
    value = _value(spec)
    A = _randn(l, M, K, seed=8) if l > 1 else _randn(M, K, seed=8)
    B = _randn(K, N, seed=9)
    D = _poisoned(l, M, N) if l > 1 else _poisoned(M, N)
    epi = EpilogueArguments("def epi(accum, X): D = accum * X; return D", X=value, D=D)
    args = GemmArguments(A=A, B=B, out=D, epilogue=epi)
    (spec_,) = args.dag.operands
    assert (spec_.kind, spec_.batched) == (kind, batched)
    (load,) = args.dag.loads
    assert load.space is kind.space and load.batched is batched
    # and the value it stands for is the broadcast one
    acc = torch.matmul(A, B)
    want = acc * value
    want = want.expand(torch.broadcast_shapes(want.shape, D.shape)).reshape(D.shape)
    assert torch.equal(evaluate(args, acc)["D"], want)


def test_classify_operand_dtype_and_errors():
    spec = classify_operand("h", _randn(M, 1, dtype=torch.float16), (1, M, N))
    assert spec.dtype == torch.float16 and spec.kind is ROW
    assert classify_operand("i", torch.arange(N, dtype=torch.int32), (1, M, N)).kind is COL
    for bad in (True, None, [1.0, 2.0], "x"):
        e = _raises(classify_operand, "X", bad, (1, M, N))
        assert e.variable == "X" and "Argument X" in str(e)
    e = _raises(classify_operand, "Z", torch.zeros(M, N, dtype=torch.complex64), (1, M, N))
    assert "complex64" in str(e) and e.variable == "Z"


OUTPUT_TABLE = [
    (None, L, OutputKind.NONE, False, None),
    ((), L, OutputKind.SCALAR, False, torch.float32), ((1,), L, OutputKind.SCALAR, False, torch.float32),
    ((L, 1, 1), L, OutputKind.SCALAR, True, torch.float32),
    ((M, 1), L, OutputKind.ROW, False, torch.float32), ((L, M, 1), L, OutputKind.ROW, True, torch.float32),
    ((N,), L, OutputKind.COL, False, torch.float32), ((1, N), L, OutputKind.COL, False, torch.float32),
    ((L, 1, N), L, OutputKind.COL, True, torch.float32),
    ((M, N), L, OutputKind.FULL, False, torch.float32), ((L, M, N), L, OutputKind.FULL, True, torch.float32),
    ((1, M, N), 1, OutputKind.FULL, False, torch.float32),
]


@pytest.mark.parametrize("spec,l,kind,batched,dtype", OUTPUT_TABLE)
def test_classify_output(spec, l, kind, batched, dtype):
    value = None if spec is None else _value(spec)
    assert classify_output("Y", value, (l, M, N)) == (kind, dtype, batched)


def test_output_kinds_through_arguments():
    src = """
def epi(accum, bias):
    f = accum + bias
    D = f * 2.0
    rs = sum(f)
    cm = max(f)
    tot = min(f)
    u = relu(f)
    return D, rs, cm, tot, u
"""
    epi = EpilogueArguments(src, bias=_randn(N), D=_poisoned(L, M, N), rs=_poisoned(L, M, 1),
                            cm=_poisoned(N), tot=_poisoned(1), u=None)
    kinds = {o.name: (o.kind, o.batched, o.dtype) for o in epi.dag.outputs}
    assert kinds == {"D": (OutputKind.FULL, True, torch.float32),
                     "rs": (OutputKind.ROW, True, torch.float32),
                     "cm": (OutputKind.COL, False, torch.float32),
                     "tot": (OutputKind.SCALAR, False, torch.float32),
                     "u": (OutputKind.NONE, False, None)}
    assert [o.node.kind for o in epi.dag.outputs][1:4] == [NodeKind.REDUCE] * 3
    assert _raises(classify_output, "Y", [1.0], (1, M, N)).variable == "Y"
    e = _raises(classify_output, "Y", torch.zeros(M, N, dtype=torch.bool), (1, M, N))
    assert "cannot store" in str(e)


# ------------------------------------------------------------------ GemmArguments validation

def _epi(D, C=None):
    if C is None:
        return EpilogueArguments("def epi(accum): D = relu(accum); return D", D=D)
    return EpilogueArguments("def epi(accum, C): D = accum + C; return D", C=C, D=D)


def test_gemm_arguments_shapes():
    D = _poisoned(L, M, N)
    args = GemmArguments(_randn(L, M, K), _randn(K, N), out=D, epilogue=_epi(D))
    assert (args.L, args.M, args.N, args.K) == (L, M, N, K)
    assert args.problem == (L, M, N)
    args = GemmArguments(_randn(1, M, K), _randn(L, K, N), out=D, epilogue=_epi(D))
    assert args.L == L
    args = GemmArguments(_randn(M, K), _randn(K, N), out=_poisoned(M, N))  # no epilogue
    assert [o.name for o in args.dag.outputs] == ["D"] and args.L == 1


def test_gemm_arguments_k_mismatch():
    e = _raises(GemmArguments, _randn(M, K), _randn(K + 1, N), out=_poisoned(M, N))
    assert f"A's K ({K})" in str(e) and f"B's K ({K + 1})" in str(e)


def test_gemm_arguments_batch_mismatch():
    e = _raises(GemmArguments, _randn(2, M, K), _randn(3, K, N), out=_poisoned(3, M, N))
    assert "batch 2" in str(e) and "batch 3" in str(e)
    D = _poisoned(2, M, N)
    e = _raises(GemmArguments, _randn(3, M, K), _randn(K, N), out=D, epilogue=_epi(D))
    assert e.variable == "D" and "L dimension" in str(e)


def test_gemm_arguments_dtype_and_rank():
    e = _raises(GemmArguments, _randn(M, K, dtype=torch.float16), _randn(K, N), out=_poisoned(M, N))
    assert "float16" in str(e) and "float32" in str(e)
    e = _raises(GemmArguments, _randn(K), _randn(K, N), out=_poisoned(M, N))
    assert e.variable == "A"
    e = _raises(GemmArguments, _randn(M, K), [[1.0]], out=_poisoned(M, N))
    assert e.variable == "B"
    e = _raises(GemmArguments, _randn(M, K), _randn(K, N), out=_poisoned(M, N),
                accumulator_type="float32")
    assert e.variable == "accumulator_type"


def test_gemm_arguments_out_and_D_must_agree():
    D = _poisoned(M, N)
    e = _raises(GemmArguments, _randn(M, K), _randn(K, N), out=_poisoned(M, N), epilogue=_epi(D))
    assert e.variable == "D"
    assert GemmArguments(_randn(M, K), _randn(K, N), epilogue=_epi(D)).out is D


def test_output_aliasing_input_is_refused():
    A = _randn(M, N, seed=1)  # K == N, so D could be A
    B = _randn(N, N, seed=2)
    e = _raises(GemmArguments, A, B, out=A, epilogue=_epi(A))
    assert e.variable == "D" and "overlaps input A" in str(e)
    big = _randn(M, N + 1, seed=3)
    C = big[:, 1:]  # overlaps D = big[:, :-1] without being it
    D = big[:, :-1]
    e = _raises(GemmArguments, _randn(M, K), _randn(K, N), out=D, epilogue=_epi(D, C))
    assert e.variable == "D" and "overlaps input C" in str(e)


def test_in_place_D_aliasing_C_exactly_is_allowed():
    C = _randn(M, N, seed=4)
    A, B = _randn(M, K, seed=5), _randn(K, N, seed=6)
    args = GemmArguments(A, B, out=C, epilogue=_epi(C, C))
    assert args.out is C
    acc = A @ B
    assert torch.equal(evaluate(args, acc)["D"], acc + C)
    # a view of the same memory with the same shape and strides is the same tensor to us
    view = C.view(M, N)
    args = GemmArguments(A, B, out=view, epilogue=_epi(view, C))
    assert args.out.data_ptr() == C.data_ptr()


def test_outputs_sharing_memory_are_refused():
    D = _poisoned(M, N)
    src = "def epi(accum): F = accum * 2.0; D = relu(F); return D, F"
    e = _raises(GemmArguments, _randn(M, K), _randn(K, N), out=D,
                epilogue=EpilogueArguments(src, D=D, F=D))
    assert "share memory" in str(e) and e.variable == "F"
    buf = _poisoned(M, N + 1)
    epi = EpilogueArguments(src, D=buf[:, :N], F=buf[:, 1:])
    e = _raises(GemmArguments, _randn(M, K), _randn(K, N), epilogue=epi)
    assert "share memory" in str(e)


def test_reduction_output_aliasing_its_input_is_refused():
    bias = _randn(M, 1, seed=7)
    src = "def epi(accum, bias): f = accum + bias; D = f; s = sum(f); return D, s"
    e = _raises(GemmArguments, _randn(M, K), _randn(K, N),
                epilogue=EpilogueArguments(src, bias=bias, D=_poisoned(M, N), s=bias))
    assert e.variable == "s" and "overlaps input bias" in str(e)


# ------------------------------------------------------------------ errors at construction, outputs untouched

def test_errors_at_construction_leave_outputs_untouched():
    D, F, s = _poisoned(M, N), _poisoned(M, N), _poisoned(M, 1)
    A, B, C = _randn(M, K, seed=1), _randn(K, N, seed=2), _randn(M, N, seed=3)
    bad = [
        lambda: EpilogueArguments(bad_ssa, D=D, tmp=F),
        lambda: EpilogueArguments(my_epi, alpha=1.0, beta=1.0, C=C),
        lambda: EpilogueArguments(my_epi, alpha=1.0, beta=1.0, C=_randn(M + 1, N), D=D),
        lambda: EpilogueArguments("def e(accum): D = accum; s = accum + 1.0; return D, s", D=D, s=s),
        lambda: GemmArguments(A, _randn(K + 1, N), out=D, epilogue=_epi(D)),
        lambda: GemmArguments(A, B, out=D, epilogue=EpilogueArguments(
            "def e(accum): F = accum; D = F * 2.0; return D, F", D=D, F=D)),
        lambda: GemmArguments(_randn(2, M, K), B, out=D, epilogue=_epi(D, C)),
    ]
    for make in bad:
        with pytest.raises(EpilogueError):
            make()
        assert torch.isnan(D).all() and torch.isnan(F).all() and torch.isnan(s).all()
    # construction of good arguments does not write either
    GemmArguments(A, B, out=D, epilogue=EpilogueArguments(
        "def e(accum, C): F = accum + C; D = relu(F); s = sum(F); return D, F, s",
        C=C, D=D, F=F, s=s))
    assert torch.isnan(D).all() and torch.isnan(F).all() and torch.isnan(s).all()


def test_bind_is_deferred_until_problem_known():
    epi = EpilogueArguments("def e(accum, b): D = accum + b; return D", b=_randn(N), D=None)
    with pytest.raises(EpilogueError, match="problem shape is not known"):
        epi.dag
    args = GemmArguments(_randn(M, K), _randn(K, N), epilogue=epi)
    assert args.dag.operands[0].kind is COL
    assert args.dag.outputs[0].kind is OutputKind.NONE


def test_D_itself_a_reduction_binds_with_the_gemm_problem():
    """A (M, 1) D that is sum(...) says nothing about N: the problem comes from A and B."""
    D = _poisoned(M, 1)
    epi = EpilogueArguments("def e(accum):\n    D = sum(accum)\n    return D", D=D)
    A, B = _randn(M, K, seed=1), _randn(K, N, seed=2)
    args = GemmArguments(A, B, epilogue=epi)
    assert args.problem == (1, M, N) and args.out is D
    assert args.dag.output("D").kind is OutputKind.ROW
    torch.testing.assert_close(evaluate(args)["D"], (A @ B).sum(dim=1, keepdim=True))
    # a full-shaped D still binds at construction (and so reports shape errors there)
    e = _raises(EpilogueArguments, "def e(accum, b):\n    D = accum + b\n    return D",
                b=_randn(M + 1, 1), D=_poisoned(M, N))
    assert e.variable == "b"
