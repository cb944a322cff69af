"""The single table of epilogue op semantics (layer: ir; imports only ``derivative``, the
language of its rules).

Every op the frontend recognises is one row of ``OPS``: its arity, its constant
keyword parameters, how it computes in torch (the reference evaluator and constant
folding call this), and how it is spelled in Triton (the emitter reads this).
Adding an op is adding one row here; nothing else needs to change.

Invariant: ``torch_fn`` receives fp32 (or bool) tensors and returns a tensor; a Triton
spelling is a format string over the argument expressions ``{0}``, ``{1}``... and the
parameters ``{slope}`` etc., or a callable ``(args, params) -> str`` for ops whose code
depends on a constant (``pow``, ``cast``). Spellings may call the helpers of
``evtfuse.backends.triton.prelude`` (prefixed ``_ef_``); ``triton_cuda`` is an optional
faster spelling used on a real GPU (the CPU interpreter has no libdevice).

A parameter is a number with a default, or a ``Choice``: a required name from a fixed
set (``cast``'s dtype, one of ``CAST_TARGETS``). ``round_to`` is the one reading of how a
kernel rounds a value to a dtype: the reference's output stores and ``cast`` both use it.

``grad`` is the row's derivative: a rule over ``derivative.Diff`` giving the gradient of
each input from the result's (torch's conventions at kinks and ties: ``relu'(0) = 0``,
``maximum`` splits a tie's gradient in halves, ``amax`` shares it among tied elements);
None where the op has none, and then differentiating through it is an error.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Mapping, Union

import torch

from .derivative import Diff, NoDerivative

TritonSpelling = Union[str, Callable[[list, dict], str]]
ParamValue = Union[float, str]  # a number, or a Choice's canonical name


class Category(Enum):
    ELEMENTWISE = "elementwise"  # float in, float out
    COMPARE = "compare"  # float in, bool out
    SELECT = "select"  # where(cond, a, b)
    REDUCE = "reduce"  # sum/max/min/logsumexp; over which axes is decided by the output
    INDEX = "index"  # row_index(), col_index(): the element's coordinates
    STORE = "store"  # store_where(cond, value): an output's whole value, stored where cond
    ROWWISE = "rowwise"  # softmax/log_softmax: a function of the whole row (over N)


@dataclass(frozen=True)
class Choice:
    """A required parameter naming one of a fixed set: the canonical names in order, each
    with the other spellings it accepts (``cast``'s dtype: ``"fp16"``, also ``"half"``)."""

    names: tuple[tuple[str, tuple[str, ...]], ...]

    def canonical(self, spelling: str) -> str | None:
        for name, aliases in self.names:
            if spelling == name or spelling in aliases:
                return name
        return None

    def listing(self) -> str:
        return ", ".join(f'"{name}"' for name, _ in self.names)


@dataclass(frozen=True)
class OpDef:
    name: str
    arity: int
    torch_fn: Callable[..., torch.Tensor]
    triton: TritonSpelling
    category: Category = Category.ELEMENTWISE
    # constant keyword parameters: a float default, or a Choice (a required name)
    params: tuple[tuple[str, float | Choice], ...] = ()
    commutative: bool = False
    triton_cuda: TritonSpelling | None = None
    doc: str = ""
    aliases: tuple[str, ...] = field(default=())
    reduce_identity: float | None = None  # REDUCE rows: the value that changes nothing
    # the derivative (derivative.py): Diff -> the gradient of each input (None: none flows);
    # None: the op has no derivative
    grad: Callable[[Diff], tuple] | None = None
    grad_doc: str = ""  # docs/ops.md's text for it, where the rule's own text is not enough
    # ROWWISE rows, and REDUCE rows computed after another reduction (mean): (the
    # reduction rows the frontend builds it on, the rule over ``derivative.Diff`` giving the
    # value: ROWWISE: from ``d.x`` and its row's reductions ``d.y``, ``d.z``...; REDUCE
    # (one reduction): from its result ``d.x`` and the count of reduced elements ``d.y``)
    lowered: tuple[tuple[str, ...], Callable[[Diff], object]] | None = None
    # REDUCE rows taken relative to their row's max (shifted_sumexp): where a row function
    # builds one (softmax, log_softmax), the frontend builds that max beside it as a shift
    # (``ir.is_shift``), which its rule reads as ``d.shift``, held fixed; written on its
    # own, it has no shift and no derivative
    shifted: bool = False
    # its value jumps where its input crosses a point (floor, sign, a cast to an integer:
    # a step function; a callable of the row's parameters where they decide): a backward
    # reading it takes the forward's own value (``autodiff``'s decisions), as it takes a
    # comparison's, never one recomputed from an accumulator that differs in its last bits
    steps: bool | Callable[[Mapping[str, Any]], bool] = False
    # how linearity in a set of summands carries through the op (``runtime.sharding``'s
    # split over K, where the accumulator and the operands added to it are each rank's
    # part of a sum): the inputs' degrees (0: none of those summands in it, 1: linear in
    # them, None: other) -> the result's; None: not linear (degree 0 from inputs of degree
    # 0 alone)
    degree: Callable[..., int | None] | None = None

    @property
    def result_is_bool(self) -> bool:
        return self.category is Category.COMPARE

    def decides(self, params: Mapping[str, Any]) -> bool:
        """Whether a result of this row is a decision: a comparison's bool, or the value
        of a step function (``steps``) for these parameters."""
        if self.result_is_bool:
            return True
        return bool(self.steps(params) if callable(self.steps) else self.steps)

    @property
    def differentiable(self) -> bool:
        """A gradient can pass it where a user writes it: its own rule, or (``mean``) the
        rows it is lowered to (a shifted row: only inside softmax and log_softmax)."""
        if self.shifted:
            return False
        if self.grad is not None:
            return True
        # mean; softmax and log_softmax (their max a shift, their shifted_sumexp's rule)
        return self.lowered is not None and all(OPS[r].grad is not None
                                                for r in self.lowered[0])

    @property
    def sized(self) -> bool:
        """Its lowering reads the count of reduced elements (``mean``): a DAG bound for one
        problem size holds that count as a constant."""
        return self.category is Category.REDUCE and self.lowered is not None

    @property
    def defaults(self) -> dict[str, float]:
        """The numeric parameters and their defaults (a Choice has no default)."""
        return {k: v for k, v in self.params if not isinstance(v, Choice)}

    @property
    def required(self) -> tuple[str, ...]:
        return tuple(k for k, v in self.params if isinstance(v, Choice))

    def choice(self, param: str) -> Choice | None:
        v = dict(self.params).get(param)
        return v if isinstance(v, Choice) else None

    def param_error(self, param: str, got: str | None = None) -> str:
        """The message for a Choice parameter given a name it does not allow (``got``, as
        written), or not given at all."""
        names = self.choice(param).listing()
        if got is None:
            return f"{self.name}() needs its parameter '{param}': one of {names}"
        return f"{self.name}() parameter '{param}' must be one of {names} (got {got})"

    def combiner(self, cuda: bool = False) -> str:
        """REDUCE rows: the helper that combines two partial results (``triton_cuda``'s on
        a GPU where the row has one)."""
        return self.triton_cuda if (cuda and self.triton_cuda is not None) else self.triton

    def spell(self, args: list[str], params: Mapping[str, ParamValue], cuda: bool = False) -> str:
        """Triton expression of this op applied to argument expressions ``args``."""
        spelling = self.triton_cuda if (cuda and self.triton_cuda is not None) else self.triton
        if callable(spelling):
            return spelling(args, dict(params))
        return spelling.format(*args, **{k: v if isinstance(v, str) else _lit(v)
                                         for k, v in params.items()})


def _lit(v: float) -> str:
    """A float literal Triton parses as fp32 (repr keeps every bit of a Python float)."""
    if math.isnan(v):
        return "float('nan')"
    if math.isinf(v):
        return "float('inf')" if v > 0 else "float('-inf')"
    return repr(float(v))


def f32(v: float) -> float:
    """``v`` rounded to fp32, as a kernel holds a literal (overflowing to +-inf)."""
    return float(torch.tensor(v, dtype=torch.float32))


def _pow_spelling(args: list, params: dict) -> str:
    """x ** c with c a compile-time constant (rounded to fp32, as every literal), with torch's
    own formulas where torch has one (c = 2, 3: products; -1, -2: 1 / x, 1 / (x * x); 0.5,
    -0.5: sqrt, 1 / sqrt) and C's pow on special values everywhere (x ** 0 is 1 for NaN and
    inf too)."""
    x, c = args[0], f32(params["exponent"])
    if c == 0.0:
        return f"tl.where({x} != {x}, 1.0, 1.0)"  # 1.0 shaped like x, whatever x holds
    if math.isnan(c):  # not written in a source (a literal exponent), but defined: C's pow
        return f"tl.where({x} == 1.0, 1.0, float('nan'))"
    if c == 0.5:
        return f"_ef_sqrt({x})"
    if c == -0.5:
        return f"(1.0 / _ef_sqrt({x}))"
    if math.isfinite(c) and c == int(c) and abs(c) <= 16:
        n = int(abs(c))
        if c > 0:
            return "(" + " * ".join([f"({x})"] * n) + ")"
        if n <= 2:
            return "(1.0 / (" + " * ".join([f"({x})"] * n) + "))"
        # (1 / x) ** n: where x ** n overflows, x ** -n may still be a denormal
        return f"_ef_powi(1.0 / ({x}), {n})"
    # C's pow: +-inf counts as an even integer, and so does every float from 2^24 on
    integer = math.isinf(c) or c == int(c)
    odd = integer and math.isfinite(c) and int(c) % 2 == 1
    return f"_ef_powf({x}, {_lit(c)}, {odd}, {integer}, {not math.isfinite(c)})"


def _t_pow(x: torch.Tensor, exponent: float) -> torch.Tensor:
    return torch.pow(x, f32(exponent))


# On a GPU, NaN-propagating max/min are one instruction (max.NaN.f32); their choice between
# +0.0 and -0.0 on a tie may differ from the where-based spelling (equal as numbers).
_NAN_MAX = "tl.maximum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)"
_NAN_MIN = "tl.minimum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)"

_SQRT1_2 = 0.7071067811865476
_SQRT_2_OVER_PI = 0.7978845608028654


def _t_gelu_tanh(x):
    return torch.nn.functional.gelu(x, approximate="tanh")


class _TorchsGradient(torch.autograd.Function):
    """A row's values as evtfuse computes them (bit for bit, where torch's own op differs in
    the sign of a zero), with the gradient of torch's own op (``torch.maximum``'s half to
    each side of a tie, ``torch.clamp``'s gradient at its bounds): autograd of a where-based
    formula would give a tie's whole gradient to one side, which is not torch's."""

    @staticmethod
    def forward(ctx, values, torchs, *args):
        ctx.torchs = torchs
        ctx.save_for_backward(*args)
        return values(*args)

    @staticmethod
    def backward(ctx, grad):
        args = [a.detach().requires_grad_(need) for a, need in
                zip(ctx.saved_tensors, ctx.needs_input_grad[2:])]
        wanted = [a for a in args if a.requires_grad]
        with torch.enable_grad():
            out = ctx.torchs(*args)
        got = iter(torch.autograd.grad(out, wanted, grad, allow_unused=True))
        return (None, None, *(next(got) if a.requires_grad else None for a in args))


def _with_torchs_gradient(values, torchs, *args):
    """``values(*args)``, differentiated (where autograd records it) as ``torchs``."""
    if torch.is_grad_enabled() and any(a.requires_grad for a in args):
        return _TorchsGradient.apply(values, torchs, *args)
    return values(*args)


def _hardswish_values(x):
    return x * torch.clamp(x + 3.0, 0.0, 6.0) / 6.0


def _t_hardswish(x):  # torch's gradient: 0 at -3 and g at 3 (the formula's autograd: -g/2, 3g/2)
    return _with_torchs_gradient(_hardswish_values, torch.nn.functional.hardswish, x)


def _t_rsqrt(x):
    return torch.rsqrt(x)


def _t_gelu(x):
    # torch's CPU gelu forms x * (1 + erf(x / sqrt 2)) before halving it: NaN at +inf and inf
    # from 2^127 on, where x * Phi(x) is x (as torch's CUDA gelu and the kernels give)
    return torch.where(x >= 2.0 ** 127, x, torch.nn.functional.gelu(x))


def _t_leaky_relu(x, slope):
    return torch.where(x > 0, x, x * slope)  # torch's formula: -0.0 * slope, 0.0 * slope


def _reduction(fn, identity: float):
    """A reduction over ``dims`` (keepdim) that gives ``identity`` over an empty axis (torch's
    amax and amin raise there)."""
    def reduce(x: torch.Tensor, dims) -> torch.Tensor:
        if x.numel() == 0:
            shape = [1 if d in dims else s for d, s in enumerate(x.shape)]
            return torch.full(shape, identity, dtype=x.dtype, device=x.device)
        return fn(x, dims)
    return reduce


def _t_shifted_sumexp(x: torch.Tensor, dims) -> torch.Tensor:
    """sum(exp(x - max(x))) over ``dims`` (keepdim), as torch's softmax forms it."""
    return torch.exp(x - x.amax(dim=tuple(dims), keepdim=True)).sum(dim=tuple(dims),
                                                                    keepdim=True)


def _maximum_values(a, b):
    # NaN-propagating like torch.maximum, and the same on every element: torch's CPU kernel
    # returns +0.0 or -0.0 for maximum(0.0, -0.0) depending on the element's position (its
    # vectorised body and scalar tail differ). Ties give b, as the Triton spelling does, so
    # maximum(0.0, -0.0) is -0.0 and maximum(-0.0, 0.0) is 0.0: not commutative bit for bit.
    return torch.where(torch.isnan(a) | (a > b), a, b)


def _minimum_values(a, b):
    return torch.where(torch.isnan(a) | (a < b), a, b)


def _t_maximum(a, b):
    return _with_torchs_gradient(_maximum_values, torch.maximum, a, b)


def _t_minimum(a, b):
    return _with_torchs_gradient(_minimum_values, torch.minimum, a, b)


def _t_store_where(cond, value):
    """A conditional store as a value: ``value`` where ``cond`` holds, NaN elsewhere (what
    a stored output keeps there is its buffer's own value, which the reference evaluator
    and ``Kernel.verify`` take from the buffer)."""
    cond = cond if cond.dtype == torch.bool else cond != 0
    return torch.where(cond, value, torch.full_like(value, float("nan")))


def _clamp_values(x, lo, hi):
    return _minimum_values(_maximum_values(x, lo), hi)


def _t_clamp(x, lo, hi):
    return _with_torchs_gradient(_clamp_values, torch.clamp, x, lo, hi)


# ---- cast(x, dtype): rounding to a dtype as a kernel stores it ----

# fp8 dtypes: stored saturating to torch.finfo(dtype).max, no inf kept (satfinite, as CUTLASS)
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def int_range(dtype: torch.dtype) -> tuple[float, float]:
    """The fp32 range an integer dtype saturates to (int32: up to the largest fp32 inside)."""
    info = torch.iinfo(dtype)
    return float(info.min), 2147483520.0 if dtype == torch.int32 else float(info.max)


def round_to(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``v`` rounded to ``dtype`` (a tensor of that dtype) as a kernel stores it: floats to
    nearest even, fp16/bf16 overflowing to inf; fp8 saturates to its largest finite value,
    inf included, NaN kept (CUTLASS's satfinite converters); integers round half to even
    and saturate, NaN giving 0 (CUTLASS's float-to-int converters)."""
    if dtype in FP8_DTYPES:
        fmax = torch.finfo(dtype).max
        return v.clamp(-fmax, fmax).to(dtype)  # clamp keeps NaN
    if dtype.is_floating_point or dtype == torch.bool:
        return v.to(dtype)
    lo, hi = int_range(dtype)
    return torch.where(torch.isnan(v), 0.0, torch.round(v).clamp(lo, hi)).to(dtype)


@dataclass(frozen=True)
class CastTarget:
    """A dtype ``cast`` rounds to: the other names it is written with, and the Triton
    spellings (format strings over ``{0}``) of the rounding, the result in fp32."""

    dtype: torch.dtype
    aliases: tuple[str, ...]
    triton: str  # exact under the CPU interpreter too
    triton_cuda: str | None = None


def _float_target(dtype, aliases, tl_type: str, interpreted: str | None = None) -> CastTarget:
    """Triton's own conversion, or on a GPU only where the interpreter needs an emulation."""
    native = f"({{0}}).to({tl_type}).to(tl.float32)"
    return CastTarget(dtype, aliases, interpreted or native, native if interpreted else None)


def _fp8_target(dtype, aliases) -> CastTarget:
    # Emulated in fp32 arithmetic everywhere, exact: Triton 3.6 converts fp32 to fp8 wrongly
    # under the CPU interpreter (500 -> 256), and on an H100 its portable (mma-layout)
    # kernels miscompile x.to(float8).to(float32) (wrong values, or ptxas crashes)
    fi = torch.finfo(dtype)
    mbits, emin = -round(math.log2(fi.eps)), round(math.log2(fi.smallest_normal))
    return CastTarget(dtype, aliases, f"_ef_round_fp8({{0}}, {mbits}, {emin}, {fi.max!r})")


def _int_target(dtype, aliases) -> CastTarget:
    lo, hi = int_range(dtype)
    return CastTarget(dtype, aliases, f"_ef_round_sat({{0}}, {lo!r}, {hi!r})")


CAST_TARGETS: Mapping[str, CastTarget] = {
    "fp32": CastTarget(torch.float32, ("float32", "f32"), "{0}"),
    "fp16": _float_target(torch.float16, ("float16", "half", "f16"), "tl.float16"),
    # bf16: the interpreter's own conversion is unreliable
    "bf16": _float_target(torch.bfloat16, ("bfloat16",), "tl.bfloat16", "_ef_round_bf16({0})"),
    "fp8e4m3": _fp8_target(torch.float8_e4m3fn, ("float8_e4m3fn", "e4m3", "fp8")),
    "fp8e5m2": _fp8_target(torch.float8_e5m2, ("float8_e5m2", "e5m2")),
    "int8": _int_target(torch.int8, ("i8",)),
    "uint8": _int_target(torch.uint8, ("u8",)),
    "int32": _int_target(torch.int32, ("i32",)),
}
CAST_DTYPE = Choice(tuple((name, t.aliases) for name, t in CAST_TARGETS.items()))


def _t_cast(x: torch.Tensor, dtype: str) -> torch.Tensor:
    return round_to(x, CAST_TARGETS[dtype].dtype).to(x.dtype)


def _cast_spelling(args: list, params: dict, cuda: bool = False) -> str:
    t = CAST_TARGETS[params["dtype"]]
    return (t.triton_cuda if cuda and t.triton_cuda else t.triton).format(*args)


# ---- degrees in a sum's parts (OpDef.degree) ----
def _deg_same(*degrees):
    """a + b: linear where both are (or neither: a constant)."""
    return degrees[0] if all(d == degrees[0] for d in degrees) else None


def _deg_product(a, b):
    """a * b: linear where one factor is and the other is constant."""
    return None if a is None or b is None or a + b > 1 else a + b


def _deg_quotient(a, b):
    """a / b: linear where a is and b is constant."""
    return a if b == 0 else None


# ---- derivatives (derivative.py): torch's formulas (its derivatives.yaml and the backward
# kernels they call), so that a gradient through evtfuse is the gradient torch would give ----

_INV_SQRT_2PI = 0.3989422804014327  # 1 / sqrt(2 pi): the normal density's factor
_TWO_OVER_SQRT_PI = 1.1283791670955126


def _g_pow(d: Diff) -> tuple:
    c = f32(d.params["exponent"])
    if c == 0.0:
        return (None,)  # torch: zeros (x ** 0 is 1 everywhere, NaN included)
    return (d.g * (c * d.x ** (c - 1.0)),)


def _g_gelu(d: Diff) -> tuple:
    cdf = 0.5 * (1.0 + d.erf(d.x * _SQRT1_2))
    pdf = _INV_SQRT_2PI * d.exp(d.x * d.x * -0.5)
    return (d.g * (cdf + d.x * pdf),)


def _g_gelu_tanh(d: Diff) -> tuple:
    x = d.x
    t = d.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * (x * x * x)))
    left = 0.5 * (1.0 + t)
    right = 0.5 * x * (1.0 - t * t) * _SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * (x * x))
    return (d.g * (left + right),)


def _g_silu(d: Diff) -> tuple:
    s = d.sigmoid(d.x)
    return (d.g * (s * (1.0 + d.x * (1.0 - s))),)


def _g_hardswish(d: Diff) -> tuple:
    return (d.where(d.x <= -3.0, 0.0, d.where(d.x < 3.0, d.g * (d.x / 3.0 + 0.5), d.g)),)


SOFTPLUS_DEFAULTS = (("beta", 1.0), ("threshold", 20.0))  # torch's F.softplus defaults


def _softplus_spelling(args: list, params: dict) -> str:
    """torch's defaults: ``_ef_softplus`` (no multiply or divide by beta); else the helper
    with beta and threshold, as fp32 literals."""
    beta, threshold = params.get("beta", 1.0), params.get("threshold", 20.0)
    if (beta, threshold) == (1.0, 20.0):
        return f"_ef_softplus({args[0]})"
    return f"_ef_softplus_beta({args[0]}, {_lit(beta)}, {_lit(threshold)})"


def _t_softplus(x, beta: float = 1.0, threshold: float = 20.0):
    return torch.nn.functional.softplus(x, beta=beta, threshold=threshold)


def _g_softplus(d: Diff) -> tuple:
    # torch's softplus_backward: z = exp(beta * x); g where beta * x > threshold, else
    # g * z / (z + 1) (the formula's side at beta * x == threshold, as the forward's)
    params = {**dict(SOFTPLUS_DEFAULTS), **d.params}
    beta, threshold = params["beta"], params["threshold"]
    bx = d.x if beta == 1.0 else d.x * beta
    z = d.exp(d.where(bx > threshold, 0.0, bx))  # 0 where unused: no exp overflow there
    return (d.where(bx > threshold, d.g, d.g * z / (z + 1.0)),)


def _g_abs(d: Diff) -> tuple:  # g * sign(x): sign(0) = sign(NaN) = 0, as torch.sgn
    return (d.g * d.where(d.x > 0.0, 1.0, d.where(d.x < 0.0, -1.0, 0.0)),)


def _g_maximum(d: Diff) -> tuple:  # a tie gives each side half; NaN: both the whole
    x, y, g = d.x, d.y, d.g
    return (d.where(x < y, 0.0, d.where(x == y, g / 2.0, g)),
            d.where(x > y, 0.0, d.where(x == y, g / 2.0, g)))


def _g_minimum(d: Diff) -> tuple:
    x, y, g = d.x, d.y, d.g
    return (d.where(x > y, 0.0, d.where(x == y, g / 2.0, g)),
            d.where(x < y, 0.0, d.where(x == y, g / 2.0, g)))


def _g_clamp(d: Diff) -> tuple:  # torch.clamp(x, lo, hi) with tensor bounds
    x, lo, hi, g = d.x, d.y, d.z, d.g
    return (d.where(x >= lo, d.where(x <= hi, g, 0.0), 0.0),
            d.where(x < lo, d.where(lo < hi, g, 0.0), 0.0),
            d.where(x > hi, g, d.where(hi < lo, g, 0.0)))


def _g_cast(d: Diff) -> tuple:
    target = CAST_TARGETS[d.params["dtype"]].dtype
    if not target.is_floating_point:
        raise NoDerivative(f"cast to {d.params['dtype']} rounds to an integer; torch's .to() "
                           "of an integer dtype is not differentiable either")
    return (d.g,)  # straight through, as torch's .to() of a float dtype


def _g_extreme(d: Diff) -> tuple:  # amax / amin: shared evenly among tied elements
    return (d.g / d.ties * d.where(d.x == d.out, 1.0, 0.0),)


_NO_GRADIENT = lambda d: (None,) * len(d.args)  # noqa: E731  (comparisons: bool results)


_ROWS: tuple[OpDef, ...] = (
    # ---- arithmetic (from Python operators) ----
    OpDef("add", 2, torch.add, "({0} + {1})", commutative=True, doc="a + b",
          grad=lambda d: (d.g, d.g), degree=_deg_same),
    OpDef("sub", 2, torch.sub, "({0} - {1})", doc="a - b", grad=lambda d: (d.g, -d.g),
          degree=_deg_same),
    OpDef("mul", 2, torch.mul, "({0} * {1})", commutative=True, doc="a * b",
          grad=lambda d: (d.g * d.y, d.g * d.x), degree=_deg_product),
    OpDef("div", 2, torch.div, "({0} / {1})", doc="a / b",
          grad=lambda d: (d.g / d.y, -(d.g * (d.x / d.y / d.y))), degree=_deg_quotient),
    # x * -1.0, not Triton's -x, which is 0 - x: -(0.0) must be -0.0
    OpDef("neg", 1, torch.neg, "({0} * -1.0)", doc="-a", grad=lambda d: (-d.g,),
          degree=lambda a: a),
    OpDef("pow", 1, _t_pow, _pow_spelling, params=(("exponent", 2.0),),
          doc="a ** c, c a numeric literal (rounded to fp32); as torch.pow on special values "
              "(a ** 0 is 1 for NaN and inf too, a negative a gives NaN for c not an integer)",
          grad=_g_pow),
    # ---- comparisons ----
    OpDef("lt", 2, torch.lt, "({0} < {1})", Category.COMPARE, doc="a < b",
          grad=_NO_GRADIENT),
    OpDef("le", 2, torch.le, "({0} <= {1})", Category.COMPARE, doc="a <= b",
          grad=_NO_GRADIENT),
    OpDef("gt", 2, torch.gt, "({0} > {1})", Category.COMPARE, doc="a > b",
          grad=_NO_GRADIENT),
    OpDef("ge", 2, torch.ge, "({0} >= {1})", Category.COMPARE, doc="a >= b",
          grad=_NO_GRADIENT),
    OpDef("eq", 2, torch.eq, "({0} == {1})", Category.COMPARE, commutative=True,
          doc="a == b", grad=_NO_GRADIENT),
    OpDef("ne", 2, torch.ne, "({0} != {1})", Category.COMPARE, commutative=True,
          doc="a != b", grad=_NO_GRADIENT),
    # a value is true where it is nonzero (NaN included), as torch.logical_*; the outer
    # != 0 keeps a mask the interpreter takes where one side is a scalar (versions.py,
    # WORKAROUNDS: interpreter_scalar_and)
    OpDef("logical_and", 2, torch.logical_and, "(((({0}) != 0) & (({1}) != 0)) != 0)",
          Category.COMPARE, commutative=True,
          doc="a and b (`a & b` of conditions; a value is true where nonzero)",
          grad=_NO_GRADIENT),
    OpDef("logical_or", 2, torch.logical_or, "(((({0}) != 0) | (({1}) != 0)) != 0)",
          Category.COMPARE, commutative=True,
          doc="a or b (`a | b` of conditions; a value is true where nonzero)",
          grad=_NO_GRADIENT),
    OpDef("logical_not", 1, torch.logical_not, "(({0}) == 0)", Category.COMPARE,
          doc="not a (`~a` of a condition; true where a is zero)", grad=_NO_GRADIENT),
    # ---- activations and math functions ----
    OpDef("identity", 1, lambda x: x, "{0}", doc="x", grad=lambda d: (d.g,),
          degree=lambda a: a),
    # a select, not max(x, 0.0): torch keeps -0.0 (and a GPU's max gives +0.0 for it)
    OpDef("relu", 1, torch.relu, "tl.where({0} < 0.0, 0.0, {0})",
          doc="max(x, 0) (NaN stays NaN, -0.0 stays -0.0)",
          grad=lambda d: (d.where(d.out <= 0.0, 0.0, d.g),)),
    OpDef("leaky_relu", 1, _t_leaky_relu,
          "tl.where({0} > 0.0, {0}, {0} * {slope})", params=(("slope", 0.01),),
          doc="x if x > 0 else slope * x",
          grad=lambda d: (d.where(d.x > 0.0, d.g, d.g * d.params["slope"]),)),
    OpDef("sigmoid", 1, torch.sigmoid, "_ef_sigmoid({0})", triton_cuda="_ef_sigmoid_cuda({0})",
          doc="1 / (1 + exp(-x)) (on a GPU: results below 2^-126 flush to 0)",
          grad=lambda d: (d.g * (1.0 - d.out) * d.out,)),
    OpDef("log_sigmoid", 1, torch.nn.functional.logsigmoid, "_ef_log_sigmoid({0})",
          triton_cuda="_ef_log_sigmoid_cuda({0})",
          doc="log(sigmoid(x)) = min(x, 0) - log(1 + exp(-|x|)), without the rounding of "
              "sigmoid (also what log(sigmoid(x)) becomes; on a GPU exp(-|x|) below 2^-126 "
              "flushes to 0: 0 above x = 87.3)",
          grad=lambda d: (d.g * d.sigmoid(-d.x),)),
    OpDef("tanh", 1, torch.tanh, "_ef_tanh({0})", triton_cuda="_ef_tanh_cuda({0})",
          doc="hyperbolic tangent", grad=lambda d: (d.g * (1.0 - d.out * d.out),)),
    OpDef("gelu", 1, _t_gelu, "_ef_gelu({0})",
          doc="x * Phi(x), erf form; x itself at +inf and from 2^127 on (torch's CPU kernel "
              "gives NaN and inf there, its CUDA kernel x)",
          grad=_g_gelu),
    OpDef("gelu_tanh", 1, _t_gelu_tanh, "_ef_gelu_tanh({0})",
          triton_cuda="_ef_gelu_tanh_cuda({0})",
          doc="GELU, tanh approximation (on a GPU 0.5x + 0.5x tanh(..) in one fused "
              "multiply-add: a zero result may be +0.0 where torch gives -0.0)",
          grad=_g_gelu_tanh),
    OpDef("silu", 1, torch.nn.functional.silu, "({0} * _ef_sigmoid({0}))",
          triton_cuda="({0} * _ef_sigmoid_cuda({0}))",
          doc="x * sigmoid(x) (on a GPU: -0.0 below x = -87.3, where sigmoid's results "
              "below 2^-126 flush to 0)",
          grad=_g_silu),
    OpDef("hardswish", 1, _t_hardswish,
          "({0} * tl.minimum(tl.maximum({0} + 3.0, 0.0), 6.0) / 6.0)",
          doc="x * clamp(x + 3, 0, 6) / 6", grad=_g_hardswish),
    OpDef("softplus", 1, _t_softplus, _softplus_spelling, params=SOFTPLUS_DEFAULTS,
          doc="torch's F.softplus(x, beta, threshold): log(1 + exp(beta * x)) / beta "
              "(exp(x) itself far below 0), x itself where beta * x > threshold (torch's "
              "defaults: beta 1, threshold 20)",
          grad=_g_softplus,
          grad_doc="`g` where `beta * x > threshold`, else `g * z / (z + 1)` with "
                   "`z = exp(beta * x)` (torch's softplus_backward)"),
    OpDef("exp", 1, torch.exp, "tl.exp({0})", doc="e ** x", grad=lambda d: (d.g * d.out,)),
    OpDef("log", 1, torch.log, "tl.log({0})", triton_cuda="_ef_log_cuda({0})",
          doc="natural logarithm (on a GPU: the hardware log2, a series near 1; relative "
              "error ~1e-6)",
          grad=lambda d: (d.g / d.x,)),
    OpDef("sqrt", 1, torch.sqrt, "_ef_sqrt({0})", doc="square root (IEEE rounded)",
          grad=lambda d: (d.g / (2.0 * d.out),)),
    OpDef("rsqrt", 1, _t_rsqrt, "(1.0 / _ef_sqrt({0}))", doc="1 / sqrt(x)",
          grad=lambda d: (-0.5 * d.g * d.out ** 3.0,)),
    OpDef("abs", 1, torch.abs, "tl.abs({0})", doc="|x|", grad=_g_abs),
    OpDef("log1p", 1, torch.log1p, "_ef_log1p({0})",
          doc="log(1 + x), accurate near 0 (a series below |x| = 1/16)",
          grad=lambda d: (d.g / (1.0 + d.x),)),
    OpDef("expm1", 1, torch.expm1, "_ef_expm1({0})",
          doc="exp(x) - 1, accurate near 0 (a series below |x| = 1/16)",
          grad=lambda d: (d.g * (d.out + 1.0),)),
    OpDef("floor", 1, torch.floor, "tl.floor({0})", triton_cuda="_ef_floor_cuda({0})",
          doc="the largest integer <= x",
          grad=lambda d: (None,), grad_doc="none (0, as torch)", steps=True),
    OpDef("ceil", 1, torch.ceil, "tl.ceil({0})", triton_cuda="_ef_ceil_cuda({0})",
          doc="the smallest integer >= x",
          grad=lambda d: (None,), grad_doc="none (0, as torch)", steps=True),
    OpDef("round", 1, torch.round, "_ef_round({0})",
          doc="the nearest integer, halves to even (as torch.round; round(-0.3) is -0.0)",
          grad=lambda d: (None,), grad_doc="none (0, as torch)", steps=True),
    OpDef("sign", 1, torch.sign, "tl.where({0} > 0.0, 1.0, tl.where({0} < 0.0, -1.0, 0.0))",
          doc="1, -1 or 0 (0 for +-0 and NaN, as torch.sign)",
          grad=lambda d: (None,), grad_doc="none (0, as torch)", steps=True),
    # on a GPU, tl.sin/tl.cos are the hardware's sin.approx/cos.approx, accurate only for
    # |x| < 100 pi: libdevice's (CUDA's sinf, cosf, tanf: full range reduction) match torch,
    # with subnormal arguments of sin/tan/erf handled apart (prelude: libdevice flushes them)
    OpDef("sin", 1, torch.sin, "tl.sin({0})", triton_cuda="_ef_sin_cuda({0})",
          doc="sine (on a GPU: CUDA's sinf, any argument)", grad=lambda d: (d.g * d.cos(d.x),)),
    OpDef("cos", 1, torch.cos, "tl.cos({0})", triton_cuda="tl.extra.cuda.libdevice.cos({0})",
          doc="cosine (on a GPU: CUDA's cosf, any argument)",
          grad=lambda d: (d.g * -d.sin(d.x),)),
    OpDef("tan", 1, torch.tan, "(tl.sin({0}) / tl.cos({0}))",
          triton_cuda="_ef_tan_cuda({0})",
          doc="tangent (on a GPU: CUDA's tanf, any argument)",
          grad=lambda d: (d.g * (1.0 + d.out * d.out),)),
    OpDef("erf", 1, torch.erf, "tl.math.erf({0})", triton_cuda="_ef_erf_cuda({0})",
          doc="the error function",
          grad=lambda d: (_TWO_OVER_SQRT_PI * d.exp(-(d.x * d.x)) * d.g,)),
    OpDef("maximum", 2, _t_maximum, "_ef_maximum({0}, {1})", triton_cuda=_NAN_MAX,  # ties give b: not commutative
          doc="elementwise max, NaN-propagating like torch; a tie of 0.0 and -0.0 may give "
              "either zero", grad=_g_maximum),
    OpDef("minimum", 2, _t_minimum, "_ef_minimum({0}, {1})", triton_cuda=_NAN_MIN,  # ties give b: not commutative
          doc="elementwise min, NaN-propagating like torch; a tie of 0.0 and -0.0 may give "
              "either zero", grad=_g_minimum),
    OpDef("clamp", 3, _t_clamp, "_ef_minimum(_ef_maximum({0}, {1}), {2})",
          triton_cuda=_NAN_MIN.format(_NAN_MAX.format("{0}", "{1}"), "{2}"),
          doc="min(max(x, lo), hi); a tie of 0.0 and -0.0 may give either zero", grad=_g_clamp),
    OpDef("where", 3, torch.where, "tl.where({0}, {1}, {2})", Category.SELECT,
          doc="a where cond else b",
          grad=lambda d: (None, d.where(d.x, d.g, 0.0), d.where(d.x, 0.0, d.g))),
    OpDef("store_where", 2, _t_store_where, "{1}", Category.STORE,
          doc="an output stored only where cond holds (nonzero); the output's other "
              "elements keep what its buffer held. The whole value of an assignment whose "
              "result is returned as a full output, given by the caller; portable kernels "
              "only (TMA stores write whole tiles)"),
    OpDef("multiply_add", 3, lambda a, b, c: a * b + c, "tl.fma({0}, {1}, {2})",
          doc="a * b + c (fused on a GPU and under Triton 3.9's CPU interpreter: rounded "
              "once, so finite where only a * b overflows)",
          grad=lambda d: (d.g * d.y, d.g * d.x, d.g),
          degree=lambda a, b, c: _deg_same(_deg_product(a, b), c)),
    OpDef("cast", 1, _t_cast, _cast_spelling, params=(("dtype", CAST_DTYPE),),
          triton_cuda=functools.partial(_cast_spelling, cuda=True),
          doc="x rounded to dtype as a kernel stores it, then used as fp32: floats to nearest "
              "even (fp16/bf16 overflow to inf); fp8 saturates to +-448 (e4m3) / +-57344 "
              "(e5m2), inf included, NaN kept; integers round half to even and saturate, "
              "NaN gives 0",
          steps=lambda p: not CAST_TARGETS[p["dtype"]].dtype.is_floating_point,
          grad=_g_cast, grad_doc="g, straight through as torch's .to() (float targets); integer "
                                 "targets: none"),
    # ---- reductions: axes come from the shape of the output they feed ----
    # torch_fn(x, dims) reduces with keepdim; ``triton`` names the combine helper of two
    # partial results; ``reduce_identity`` fills masked-off elements
    # ``torch_fn`` gives ``reduce_identity`` over an empty axis (M = 0, say), as the kernels do
    OpDef("sum", 1, _reduction(lambda x, dims: x.sum(dim=tuple(dims), keepdim=True), 0.0),
          "_ef_add", Category.REDUCE, reduce_identity=0.0,
          doc="sum (0 over no element; 0.0, not -0.0, of -0.0 terms, as torch)",
          grad=lambda d: (d.g,)),
    OpDef("max", 1, _reduction(lambda x, dims: x.amax(dim=tuple(dims), keepdim=True),
                               float("-inf")), "_ef_maximum",
          Category.REDUCE, reduce_identity=float("-inf"), triton_cuda="_ef_maximum_nan",
          doc="maximum (NaN-propagating; -inf over no element; of 0.0 and -0.0 either zero)",
          grad=_g_extreme),
    OpDef("min", 1, _reduction(lambda x, dims: x.amin(dim=tuple(dims), keepdim=True),
                               float("inf")), "_ef_minimum",
          Category.REDUCE, reduce_identity=float("inf"), triton_cuda="_ef_minimum_nan",
          doc="minimum (NaN-propagating; +inf over no element; of 0.0 and -0.0 either zero)",
          grad=_g_extreme),
    OpDef("logsumexp", 1, _reduction(lambda x, dims: torch.logsumexp(x, dim=tuple(dims),
                                                                     keepdim=True), float("-inf")),
          "_ef_lse_combine", Category.REDUCE, reduce_identity=float("-inf"),
          doc="log(sum(exp(x))), computed with a running max (+inf where an x is +inf, "
              "-inf over no element)",
          grad=lambda d: (d.g * d.exp(d.x - d.out),)),
    # mean: the sum, then one division by the count of reduced elements after it (not a
    # sum of x / count: that differs from torch.mean where the sum overflows or x is
    # subnormal); the frontend writes it as sum(x) / count
    OpDef("mean", 1, _reduction(lambda x, dims: x.mean(dim=tuple(dims), keepdim=True),
                                float("nan")),
          "_ef_add", Category.REDUCE, reduce_identity=0.0,
          doc="arithmetic mean: the sum (as `sum`) divided by the count of reduced elements "
              "after the reduction (NaN over no element, as torch.mean)",
          lowered=(("sum",), lambda d: d.x / d.y), grad=None,
          grad_doc="`g / count` (the sum's, then the division's: the frontend writes mean so)"),
    # softmax and log_softmax's denominator, as torch computes it: logsumexp's partials and
    # combine, finished as the sum alone, so that no max is added back (lse = max +
    # log(sum) rounds log(sum) away where |max| is large: [1e8, 1e8] has lse 1e8)
    OpDef("shifted_sumexp", 1, _reduction(_t_shifted_sumexp, 0.0),
          "_ef_lse_combine", Category.REDUCE, reduce_identity=float("-inf"),
          doc="sum(exp(x - max(x))) as torch computes it (softmax's denominator; "
              "logsumexp's partials, finished without the max): NaN where the max is "
              "infinite (a +inf element, an all -inf line) or NaN, 0 over no element",
          shifted=True, grad=lambda d: (d.g * d.exp(d.x - d.shift),),
          grad_doc="`g * exp(x - shift)` inside softmax and log_softmax, `shift` their row's "
                   "max held fixed (their value does not change with it, so it passes no "
                   "gradient); written on its own, none: differentiating through it is an "
                   "error"),
    # ---- row functions: built on the row's max and shifted_sumexp (docs/performance.md:
    # one pass where a tile spans the row, else two passes); as torch computes them:
    # exp(x - m) * (1 / s) and (x - m) - log(s), m the row's max, s its shifted_sumexp
    OpDef("softmax", 1, lambda x: torch.softmax(x, dim=-1), "", Category.ROWWISE,
          doc="torch.softmax(x, dim=-1) over the output's row (N): exp(x - m) * (1 / s) with "
              "m the row's max and s its shifted_sumexp, as torch computes it; a row with "
              "+inf or NaN is all NaN, an all -inf row NaN, as torch",
          lowered=(("max", "shifted_sumexp"), lambda d: d.exp(d.x - d.y) * (1.0 / d.z)),
          grad_doc="through its lowering, its max a shift (shifted_sumexp's): "
                   "`out * (g - sum(g * out))`, the sum over the row"),
    OpDef("log_softmax", 1, lambda x: torch.log_softmax(x, dim=-1), "", Category.ROWWISE,
          doc="torch.log_softmax(x, dim=-1) over the output's row (N): (x - m) - log(s) with "
              "m the row's max and s its shifted_sumexp, as torch computes it; a row with "
              "+inf or NaN is all NaN, an all -inf row NaN, as torch",
          lowered=(("max", "shifted_sumexp"), lambda d: (d.x - d.y) - d.log(d.z)),
          grad_doc="through its lowering, its max a shift (shifted_sumexp's): "
                   "`g - exp(out) * sum(g)`, the sum over the row"),
)

OPS: Mapping[str, OpDef] = {row.name: row for row in _ROWS}

# Python operators the frontend maps to table rows.
BINARY_OPERATORS = {"Add": "add", "Sub": "sub", "Mult": "mul", "Div": "div",
                    "BitAnd": "logical_and", "BitOr": "logical_or"}
COMPARE_OPERATORS = {"Lt": "lt", "LtE": "le", "Gt": "gt", "GtE": "ge", "Eq": "eq", "NotEq": "ne"}
UNARY_OPERATORS = {"USub": "neg", "UAdd": "identity", "Invert": "logical_not"}
OPERATOR_SYMBOLS = {"Add": "+", "Sub": "-", "Mult": "*", "Div": "/", "Lt": "<", "LtE": "<=",
                    "Gt": ">", "GtE": ">=", "Eq": "==", "NotEq": "!=", "BitAnd": "&",
                    "BitOr": "|", "USub": "-", "UAdd": "+", "Invert": "~"}

# Names a user may call in an epilogue (every row but the operator-only ones).
_OPERATOR_ONLY = {"add", "sub", "mul", "div", "neg", "pow", "lt", "le", "gt", "ge", "eq", "ne"}
CALLABLE = {name: row for name, row in OPS.items() if name not in _OPERATOR_ONLY}

# Reductions whose per-tile partials are (max, sum of exp(x - max)), combined by
# ``_ef_lse_combine``, in two workspaces: they differ only in how the combined pair is
# finished (``finish_exp_partials``)
EXP_PARTIALS = ("logsumexp", "shifted_sumexp")


def empty_result(op: str) -> float:
    """A REDUCE row's result over no element, as its ``torch_fn`` gives it (the reduction's
    identity for sum, max, min and logsumexp; 0 for shifted_sumexp, an empty sum)."""
    return float(OPS[op].torch_fn(torch.empty(0), (0,)).reshape(()))


def finish_exp_partials(op: str, m: str, s: str) -> str:
    """Triton: the result of ``op`` (one of ``EXP_PARTIALS``) from its combined max ``m``
    and sum of exp ``s`` (formed with 0 for an infinite max, ``_ef_lse_part``):
    logsumexp -inf over no element, +inf where an element is +inf (its sum is then +inf);
    shifted_sumexp the sum, NaN where the max is infinite (as torch's exp(x - max))."""
    if op == "logsumexp":  # log's argument 1 where the result is -inf (its sum is 0 there)
        return (f"tl.where({m} == float('-inf'), float('-inf'), "
                f"{m} + tl.log(tl.where({m} == float('-inf'), 1.0, {s})))")
    return f"tl.where(tl.abs({m}) == float('inf'), float('nan'), {s})"


def torch_apply(op: OpDef, inputs: list[torch.Tensor],
                params: Mapping[str, ParamValue]) -> torch.Tensor:
    """Apply an elementwise/compare/select row in torch (the one reading of its meaning)."""
    if op.category is Category.REDUCE:
        raise TypeError(f"{op.name} is a reduction; its axes come from the output it feeds")
    if op.category is Category.ROWWISE:
        return op.torch_fn(*inputs)  # a whole row's function: no scalar path to mimic
    if all(t.numel() == 1 for t in inputs):
        # torch's CPU kernels take a scalar path for one element and a vectorised one for
        # two or more, which differ in the last bits (gelu(-1.5): -0.10021082 against
        # -0.10021086; gelu(inf)): a single value (a folded constant, a scalar-space node)
        # is computed as any element of a tile is, so that where a pass moves it changes
        # no bit
        shape = torch.broadcast_shapes(*(t.shape for t in inputs))
        pair = op.torch_fn(*(t.reshape(1).repeat(2) for t in inputs), **params)
        return pair[:1].reshape(shape)
    return op.torch_fn(*inputs, **params)


class TorchAlgebra:
    """Formulas evaluated on tensors with the op table's torch meaning."""

    def __init__(self, like=None):
        self.like = like  # a tensor whose dtype and device constants take

    def const(self, value: float):
        kw = {} if self.like is None else {"dtype": self.like.dtype, "device": self.like.device}
        return torch.tensor(value, **kw)

    def call(self, op: str, vals: list, params: dict):
        row = OPS[op]
        if row.category is Category.SELECT:
            vals = [vals[0] if vals[0].dtype.is_floating_point is False else vals[0] != 0,
                    *vals[1:]]
        else:
            vals = [v.to(self.like.dtype) if self.like is not None and v.dtype != self.like.dtype
                    else v for v in vals]
        full = {**row.defaults, **params}
        return torch_apply(row, vals, full)
