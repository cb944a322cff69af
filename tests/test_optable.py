"""The op table (evtfuse.optable.OPS) against independent computations, and evtfuse.ops.

Every elementwise / compare / select row is checked on fresh random fp32 data against a
computation that does not go through the table: Python operators for the exact ops, and
the ``math`` module in float64, element by element, for the transcendental ones.
"""

from __future__ import annotations

import math

import pytest
import torch

from evtfuse import ops
from evtfuse.optable import CALLABLE, OPS, Category, torch_apply

REDUCTIONS = {"sum", "max", "min", "logsumexp", "mean", "shifted_sumexp"}
SHAPE = (16, 24)  # 384 elements: both the vectorised and the scalar tail paths of torch


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _signed(seed: int, scale: float = 3.0) -> torch.Tensor:
    """Random fp32 with negatives and positives, never all zeros."""
    t = torch.randn(SHAPE, generator=_gen(seed)) * scale
    assert (t < 0).any() and (t > 0).any()
    return t


def _positive(seed: int) -> torch.Tensor:
    t = torch.rand(SHAPE, generator=_gen(seed)) * 5.0 + 1e-3
    assert (t > 0).all()
    return t


def _elementwise64(fn, *tensors: torch.Tensor) -> torch.Tensor:
    """fn applied with Python floats (float64), element by element."""
    flat = [t.double().flatten().tolist() for t in tensors]
    out = [fn(*vals) for vals in zip(*flat)]
    return torch.tensor(out, dtype=torch.float64).reshape(tensors[0].shape)


def _apply(name: str, *tensors, **params) -> torch.Tensor:
    row = OPS[name]
    full = dict(row.params)
    full.update({k: float(v) for k, v in params.items()})
    return torch_apply(row, list(tensors), full)


def _close(got: torch.Tensor, want64: torch.Tensor, rtol=2e-6, atol=2e-6) -> None:
    assert got.dtype == torch.float32
    assert got.shape == want64.shape
    torch.testing.assert_close(got.double(), want64, rtol=rtol, atol=atol)


# --------------------------------------------------------------- exact rows (fp32 bit for bit)

def _exact_cases():
    a, b = _signed(1), _signed(2)
    return {
        "add": ((a, b), lambda: a + b),
        "sub": ((a, b), lambda: a - b),
        "mul": ((a, b), lambda: a * b),
        "div": ((a, b), lambda: a / b),
        "neg": ((a,), lambda: -a),
        "identity": ((a,), lambda: a.clone()),
        "relu": ((a,), lambda: torch.where(a > 0, a, torch.zeros_like(a))),
        "abs": ((a,), lambda: torch.where(a < 0, -a, a)),
        "maximum": ((a, b), lambda: torch.where(a > b, a, b)),
        "minimum": ((a, b), lambda: torch.where(a < b, a, b)),
        "hardswish": ((a,), lambda: a * torch.where(a + 3.0 < 0, 0.0,
                                                    torch.where(a + 3.0 > 6, 6.0, a + 3.0)) / 6.0),
        "floor": ((a,), lambda: _elementwise64(math.floor, a).float()),
        "ceil": ((a,), lambda: _elementwise64(math.ceil, a).float()),
        "round": ((a * 2.0,), lambda: _elementwise64(round, a * 2.0).float()),  # halves to even
        "sign": ((a,), lambda: (a > 0).float() - (a < 0).float()),
    }


@pytest.mark.parametrize("name", sorted(_exact_cases()))
def test_exact_rows(name):
    inputs, expect = _exact_cases()[name]
    got = _apply(name, *inputs)
    want = expect()
    assert got.dtype == torch.float32
    assert torch.equal(got, want), name
    assert not torch.equal(got, torch.zeros_like(got))


def test_pow_default_and_parameters():
    x = _signed(3)
    # default exponent is 2
    assert OPS["pow"].params == (("exponent", 2.0),)
    assert torch.equal(_apply("pow", x), x * x)
    torch.testing.assert_close(_apply("pow", x, exponent=3.0).double(),
                               _elementwise64(lambda v: v ** 3, x), rtol=2e-6, atol=1e-5)
    assert torch.equal(_apply("pow", x, exponent=1.0), x)
    assert torch.equal(_apply("pow", x, exponent=0.0), torch.ones_like(x))
    p = _positive(4)
    _close(_apply("pow", p, exponent=0.5), _elementwise64(math.sqrt, p))
    _close(_apply("pow", p, exponent=-2.0), _elementwise64(lambda v: v ** -2.0, p),
           rtol=4e-6, atol=1e-6)
    _close(_apply("pow", p, exponent=1.7), _elementwise64(lambda v: v ** 1.7, p), rtol=4e-6)
    # odd and fractional exponents of negative numbers: sign kept / NaN, as torch.pow
    neg = -p
    assert (_apply("pow", neg, exponent=3.0) < 0).all()
    assert torch.isnan(_apply("pow", neg, exponent=0.5)).all()


def test_leaky_relu_slope():
    x = _signed(5)
    row = OPS["leaky_relu"]
    assert dict(row.params) == {"slope": 0.01}
    for slope in (0.01, 0.2, -0.5, 1.5):
        got = _apply("leaky_relu", x, slope=slope)
        want = torch.where(x >= 0, x, x * torch.tensor(slope, dtype=torch.float32))
        assert torch.equal(got, want), slope
    default = _apply("leaky_relu", x)
    assert torch.equal(default, torch.nn.functional.leaky_relu(x, 0.01))
    assert not torch.equal(default, _apply("leaky_relu", x, slope=0.2))


def test_clamp_with_tensor_and_scalar_bounds():
    x = _signed(6)
    lo = torch.full((), -1.25)
    hi = torch.full((), 0.75)
    got = _apply("clamp", x, lo, hi)
    want = torch.tensor([min(max(v, -1.25), 0.75) for v in x.flatten().tolist()]).reshape(x.shape)
    assert torch.equal(got, want)
    assert (got == -1.25).any() and (got == 0.75).any()  # both bounds were hit
    # per-element bounds broadcast
    lo_t = _signed(7)[:, :1] - 2.0
    hi_t = lo_t + 1.0
    got = _apply("clamp", x, lo_t, hi_t)
    assert torch.equal(got, torch.minimum(torch.maximum(x, lo_t), hi_t))
    assert ((got >= lo_t) & (got <= hi_t)).all()


def test_comparisons():
    a, b = _signed(8), _signed(9)
    b = torch.where(torch.rand(SHAPE, generator=_gen(10)) < 0.3, a, b)  # some ties
    assert (a == b).any() and (a != b).any()
    want = {"lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b, "eq": a == b, "ne": a != b}
    for name, w in want.items():
        row = OPS[name]
        assert row.category is Category.COMPARE and row.result_is_bool
        got = _apply(name, a, b)
        assert got.dtype == torch.bool
        assert torch.equal(got, w), name


def test_logical_rows():
    a, b = _signed(14), _signed(15)
    a[0, :3] = torch.tensor([0.0, -0.0, float("nan")])  # zeros are false, NaN true
    for name, want in (("logical_and", torch.logical_and(a, b)),
                       ("logical_or", torch.logical_or(a > 1, b > 1))):
        args = (a, b) if name == "logical_and" else (a > 1, b > 1)
        got = _apply(name, *args)
        assert got.dtype == torch.bool and torch.equal(got, want), name
    assert torch.equal(_apply("logical_not", a), a == 0)
    assert OPS["logical_and"].category is Category.COMPARE


def test_where():
    a, b = _signed(11), _signed(12)
    cond = _signed(13) > 0
    got = _apply("where", cond, a, b)
    want = torch.tensor([x if c else y for c, x, y in
                         zip(cond.flatten().tolist(), a.flatten().tolist(), b.flatten().tolist())]
                        ).reshape(SHAPE)
    assert torch.equal(got, want)
    assert OPS["where"].category is Category.SELECT


def _gelu(v):
    return 0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0)))


def _gelu_tanh(v):
    return 0.5 * v * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v ** 3)))


def _sigmoid(v):
    return 1.0 / (1.0 + math.exp(-v)) if v >= 0 else math.exp(v) / (1.0 + math.exp(v))


def _softplus(v):
    return v if v > 20.0 else math.log1p(math.exp(v))


TRANSCENDENTAL = {
    # name: (python float64 function, positive inputs only)
    "sigmoid": (_sigmoid, False),
    "tanh": (math.tanh, False),
    "gelu": (_gelu, False),
    "gelu_tanh": (_gelu_tanh, False),
    "silu": (lambda v: v * _sigmoid(v), False),
    "softplus": (_softplus, False),
    "log_sigmoid": (lambda v: min(v, 0.0) - math.log1p(math.exp(-abs(v))), False),
    "exp": (math.exp, False),
    "log": (math.log, True),
    "sqrt": (math.sqrt, True),
    "rsqrt": (lambda v: 1.0 / math.sqrt(v), True),
    "sin": (math.sin, False),
    "cos": (math.cos, False),
    "tan": (math.tan, False),
    "erf": (math.erf, False),
    "log1p": (math.log1p, True),
    "expm1": (math.expm1, False),
}


@pytest.mark.parametrize("name", sorted(TRANSCENDENTAL))
def test_transcendental_rows(name):
    fn, positive = TRANSCENDENTAL[name]
    x = _positive(20) if positive else _signed(21)
    got = _apply(name, x)
    _close(got, _elementwise64(fn, x), rtol=1e-5, atol=1e-6)


def test_softplus_is_linear_above_20():
    x = torch.tensor([19.0, 20.5, 25.0, 60.0, 100.0, -30.0])
    got = _apply("softplus", x)
    assert torch.equal(got[1:5], x[1:5])  # exactly x, no overflow of exp
    assert torch.isfinite(got).all()
    assert 0 < got[5] < 1e-12


def test_log_sigmoid_keeps_what_sigmoid_rounds_away():
    x = torch.tensor([-200.0, -100.0, -30.0, 20.0, 40.0, float("inf"), float("-inf"), float("nan")])
    got = _apply("log_sigmoid", x)
    want = torch.tensor([-200.0, -100.0, -30.0 - math.exp(-30.0), -math.exp(-20.0),
                         -math.exp(-40.0), 0.0, float("-inf"), float("nan")], dtype=torch.float64)
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=0.0, equal_nan=True)
    assert torch.isinf(torch.log(torch.sigmoid(x[:1])))  # what the unfused form gives


def test_multiply_add():
    a, b, c = _signed(30), _signed(31), _signed(32)
    got = _apply("multiply_add", a, b, c)
    _close(got, _elementwise64(lambda x, y, z: x * y + z, a, b, c), atol=1e-5)


def test_maximum_minimum_propagate_nan():
    a = _signed(33)
    b = _signed(34)
    a[0, 0] = float("nan")
    b[1, 1] = float("nan")
    for name in ("maximum", "minimum"):
        got = _apply(name, a, b)
        assert torch.isnan(got[0, 0]) and torch.isnan(got[1, 1])
        assert torch.isnan(got).sum() == 2


def test_maximum_minimum_signed_zero_ties_do_not_depend_on_position():
    """torch's own CPU maximum answers maximum(0.0, -0.0) differently in the vectorised body
    and the scalar tail of a tensor; the table's reading is one answer everywhere (b, as
    the Triton spelling tl.where(a > b, a, b))."""
    n = 100
    pos, neg = torch.zeros(n), torch.full((n,), -0.0)
    for name in ("maximum", "minimum"):
        assert torch.signbit(_apply(name, pos, neg)).all(), name
        assert not torch.signbit(_apply(name, neg, pos)).any(), name
        assert not OPS[name].commutative  # in bits, they are not
    x = _signed(35)
    lo, hi = torch.tensor(-0.0), torch.tensor(0.0)
    got = _apply("clamp", x, lo, hi)  # max(x<0, -0.0) = -0.0, then min(-0.0, 0.0) ties -> +0.0
    assert (got == 0).all()
    assert not torch.signbit(got).any()
    assert torch.equal(torch.signbit(_apply("maximum", x, lo)), x < 0)


def test_every_row_is_covered():
    """A new row must come with its own check here (not only the generic table reading)."""
    covered = (set(_exact_cases()) | set(TRANSCENDENTAL) |
               {"pow", "leaky_relu", "clamp", "lt", "le", "gt", "ge", "eq", "ne", "where",
                "multiply_add", "logical_and", "logical_or", "logical_not"}
               | {"cast", "store_where"}  # tests/test_cast.py, test_store_where_cpu.py
               | {"softmax", "log_softmax"})  # tests/test_softmax_cpu.py
    assert covered == set(OPS) - REDUCTIONS


def test_store_where_reads_as_the_value_where_stored():
    """store_where's table reading: the value where the condition holds (a bool, or a
    nonzero float), NaN where the output's buffer keeps its own element."""
    x = _signed(36)
    got = _apply("store_where", x > 0, x)
    assert torch.equal(got[x > 0], x[x > 0]) and got[x <= 0].isnan().all()
    got = _apply("store_where", (x > 0).float(), x)
    assert torch.equal(got[x > 0], x[x > 0]) and got[x <= 0].isnan().all()
    assert OPS["store_where"].category is Category.STORE and OPS["store_where"].grad is None


def test_shifted_sumexp_keeps_the_sum_where_the_max_is_large():
    """softmax's denominator: sum(exp(x - max)) without adding the max back (logsumexp(x) -
    max(x) of [1e8, 1e8, 0] is 0 in fp32, not log 2); NaN where the max is infinite, as
    torch's exp(x - max) gives, 0 over no element."""
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([[1e8, 1e8, 0.0], [-1e8, -1e8 + 8, -1e8], [3.0, inf, 0.0],
                      [-inf, -inf, -inf], [1.0, nan, 0.0], [-inf, 0.0, 1e4]])
    got = OPS["shifted_sumexp"].torch_fn(x, [1]).flatten()
    x64 = x[:2].double()  # rows 0, 1 in float64
    want = torch.exp(x64 - x64.amax(1, keepdim=True)).sum(1)
    torch.testing.assert_close(got[:2].double(), want, rtol=1e-7, atol=0)
    assert got[2:5].isnan().all() and got[5] == 1.0
    empty = OPS["shifted_sumexp"].torch_fn(torch.empty(2, 0), [1])
    assert torch.equal(empty, torch.zeros(2, 1))


def test_row_metadata():
    for name, row in OPS.items():
        assert row.name == name
        assert row.arity >= 1
        if row.commutative:
            x, y = _signed(40), _signed(41)
            assert torch.equal(_apply(name, x, y), _apply(name, y, x)), name
    assert {n for n, r in OPS.items() if r.category is Category.REDUCE} == REDUCTIONS
    for name in REDUCTIONS:
        with pytest.raises(TypeError):
            torch_apply(OPS[name], [_signed(42)], {})
        assert OPS[name].reduce_identity is not None
    assert not OPS["sub"].commutative and not OPS["div"].commutative


# --------------------------------------------------------------- evtfuse.ops in plain torch

def test_ops_all_is_the_callable_rows_but_python_builtins():
    assert ops.BUILTIN_NAMES == {"sum", "max", "min", "abs", "round"}
    assert ops.__all__ == sorted(set(CALLABLE) - ops.BUILTIN_NAMES)
    for name in ("add", "sub", "mul", "div", "neg", "pow", "lt", "eq"):
        assert name not in ops.__all__  # spelled with Python operators
    for name in ("relu", "gelu", "sigmoid", "where", "clamp", "maximum"):
        assert name in ops.__all__
    for name in ops.BUILTIN_NAMES:  # left out of import * (it reads __all__), importable by name
        assert callable(getattr(ops, name))


def _ops_inputs(name: str):
    row = OPS[name]
    if row.category is Category.SELECT:
        return [_signed(50) > 0, _signed(51), _signed(52)]
    if name in ("log", "sqrt", "rsqrt", "log1p"):
        return [_positive(53)]
    if name == "clamp":
        return [_signed(54), torch.tensor(-0.5), torch.tensor(1.5)]
    return [_signed(55 + k) for k in range(row.arity)]


@pytest.mark.parametrize("name", sorted(CALLABLE))
def test_ops_function_equals_table(name):
    fn = getattr(ops, name)
    assert callable(fn) and fn.__name__ == name
    row = OPS[name]
    if row.category is Category.REDUCE:
        x = _signed(60)
        want = {"sum": torch.sum, "max": torch.amax, "min": torch.amin, "mean": torch.mean,
                "logsumexp": lambda t, dim=(0, 1): torch.logsumexp(t, dim=dim),
                "shifted_sumexp": lambda t, dim=(0, 1): torch.exp(
                    t - t.amax(dim=dim, keepdim=True)).sum(dim=dim)}[name]
        assert torch.equal(fn(x), want(x))
        assert torch.equal(fn(x, dim=1), want(x, dim=1))
        assert fn(x, dim=0, keepdim=True).shape == (1, SHAPE[1])
        return
    inputs = _ops_inputs(name)
    required = {"cast": {"dtype": "bf16"}}.get(name, {})  # a Choice has no default
    got = fn(*inputs, **required)
    want = torch_apply(row, inputs, {**row.defaults, **required})
    assert torch.equal(got, want), name


def test_ops_max_min_of_two_values_are_elementwise():
    """In an epilogue max(a, b) is maximum(a, b); ops.max must mean the same in plain torch."""
    a, b = _signed(61), _signed(62)
    assert torch.equal(ops.max(a, b), torch.maximum(a, b))
    assert torch.equal(ops.min(a, b), torch.minimum(a, b))
    assert torch.equal(ops.max(a, 0.0), torch.relu(a))
    assert torch.equal(ops.sum(a, 1), a.sum(1))


def test_ops_parameters_and_numbers():
    x = _signed(63)
    assert torch.equal(ops.leaky_relu(x, 0.2), _apply("leaky_relu", x, slope=0.2))
    assert torch.equal(ops.leaky_relu(x, slope=0.2), _apply("leaky_relu", x, slope=0.2))
    assert not torch.equal(ops.leaky_relu(x, slope=0.2), ops.leaky_relu(x))
    assert torch.equal(ops.clamp(x, -1.0, 1.0), torch.clamp(x, -1.0, 1.0))
    assert torch.equal(ops.maximum(x, 0.5), torch.clamp(x, min=0.5))
    assert ops.relu(-2.0).item() == 0.0 and ops.relu(3.0).item() == 3.0
    with pytest.raises(TypeError):
        ops.leaky_relu(x, alpha=0.2)
    with pytest.raises(TypeError):
        ops.maximum(x)


def test_ops_epilogue_runs_in_plain_torch():
    """The notebook's point: one function is both the fused epilogue and eager torch code."""
    from evtfuse.ops import gelu, relu, sigmoid

    def epi(accum, C, alpha):
        F = relu(accum * alpha + C)
        D = gelu(F) * sigmoid(C)
        return D, F

    acc, C = _signed(64), _signed(65)
    D, F = epi(acc, C, 0.5)
    F_want = torch.relu(acc * 0.5 + C)
    assert torch.equal(F, F_want)
    assert torch.equal(D, torch.nn.functional.gelu(F_want) * torch.sigmoid(C))
