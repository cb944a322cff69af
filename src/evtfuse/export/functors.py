"""How each op-table row is spelled as a CUTLASS compute functor, and the functors evtfuse
emits for the rows CUTLASS has none for.

Layer: export. ``Sm90Compute<ComputeFn, ElementOutput, ElementCompute, RoundStyle>`` calls
``ComputeFn<cutlass::Array<ElementCompute, N>>`` on its inputs' fragments, and passes the
node's ``Arguments`` last when ``ComputeFn<ElementCompute>::Arguments`` exists (activation
parameters, such as ``LeakyReLU``'s ``leaky_alpha``). ``CUTLASS`` maps a row to a functor
CUTLASS 4.2 defines (``cutlass/functional.h``, ``cutlass/array.h``,
``cutlass/epilogue/thread/activation.h``), with the initialiser of its ``Arguments``;
``EMITTED`` holds, for every other elementwise row, the scalar body of a functor written
the way activation.h writes its own: a ``template <typename T> struct`` with
``operator()`` over ``T``, and a specialisation over ``cutlass::Array<T, N>`` that applies
it element by element. Comparisons compute in float: 1 for true, 0 for false (``where``
reads a nonzero condition as true), which is how the DAG's bool values reach compute.
"""

from __future__ import annotations

from ..ir import Node

THREAD = "cutlass::epilogue::thread::"

# row -> (CUTLASS functor, parameter names of its Arguments in order)
CUTLASS: dict[str, tuple[str, tuple[str, ...]]] = {
    "add": ("cutlass::plus", ()),
    "sub": ("cutlass::minus", ()),
    "mul": ("cutlass::multiplies", ()),
    "div": ("cutlass::divides", ()),
    "neg": ("cutlass::negate", ()),
    "multiply_add": ("cutlass::homogeneous_multiply_add", ()),
    "maximum": ("cutlass::maximum_with_nan_propagation", ()),  # torch.maximum keeps NaN
    "minimum": ("cutlass::minimum_with_nan_propagation", ()),
    "identity": (THREAD + "Identity", ()),
    "cast": (THREAD + "Identity", ()),  # the rounding is the node's ElementOutput
    "relu": (THREAD + "ReLu", ()),
    "leaky_relu": (THREAD + "LeakyReLU", ("slope",)),  # Arguments {leaky_alpha}
    "sigmoid": (THREAD + "Sigmoid", ()),
    "tanh": (THREAD + "Tanh", ()),
    "silu": (THREAD + "SiLu", ()),
    "hardswish": (THREAD + "HardSwish", ()),
    "gelu": (THREAD + "GELU", ()),
    "gelu_tanh": (THREAD + "GELU_taylor", ()),
}

# row -> (functor name, arity, parameters with defaults, scalar body over floats a, b, c
# and ``args.<parameter>``); the body is one C++ expression giving a float
EMITTED: dict[str, tuple[str, int, tuple[tuple[str, float], ...], str]] = {
    "exp": ("EvtfuseExp", 1, (), "expf(a)"),
    "log": ("EvtfuseLog", 1, (), "logf(a)"),
    "sqrt": ("EvtfuseSqrt", 1, (), "sqrtf(a)"),
    "rsqrt": ("EvtfuseRsqrt", 1, (), "1.f / sqrtf(a)"),  # rsqrtf is device-only
    "abs": ("EvtfuseAbs", 1, (), "fabsf(a)"),
    "log1p": ("EvtfuseLog1p", 1, (), "log1pf(a)"),
    "expm1": ("EvtfuseExpm1", 1, (), "expm1f(a)"),
    "floor": ("EvtfuseFloor", 1, (), "floorf(a)"),
    "ceil": ("EvtfuseCeil", 1, (), "ceilf(a)"),
    "round": ("EvtfuseRound", 1, (), "rintf(a)"),  # half to even, as torch.round
    "sign": ("EvtfuseSign", 1, (), "a != a ? a : float((a > 0.f) - (a < 0.f))"),
    "sin": ("EvtfuseSin", 1, (), "sinf(a)"),
    "cos": ("EvtfuseCos", 1, (), "cosf(a)"),
    "tan": ("EvtfuseTan", 1, (), "tanf(a)"),
    "erf": ("EvtfuseErf", 1, (), "erff(a)"),
    "log_sigmoid": ("EvtfuseLogSigmoid", 1, (), "fminf(a, 0.f) - log1pf(expf(-fabsf(a)))"),
    "softplus": ("EvtfuseSoftplus", 1, (("beta", 1.0), ("threshold", 20.0)),
                 "args.beta * a > args.threshold ? a : log1pf(expf(args.beta * a)) / args.beta"),
    "pow": ("EvtfusePow", 1, (("exponent", 2.0),), "powf(a, args.exponent)"),
    "clamp": ("EvtfuseClamp", 3, (), "((a < b ? b : a) > c) ? c : (a < b ? b : a)"),
    "lt": ("EvtfuseLess", 2, (), "a < b ? 1.f : 0.f"),
    "le": ("EvtfuseLessEqual", 2, (), "a <= b ? 1.f : 0.f"),
    "gt": ("EvtfuseGreater", 2, (), "a > b ? 1.f : 0.f"),
    "ge": ("EvtfuseGreaterEqual", 2, (), "a >= b ? 1.f : 0.f"),
    "eq": ("EvtfuseEqual", 2, (), "a == b ? 1.f : 0.f"),
    "ne": ("EvtfuseNotEqual", 2, (), "a != b ? 1.f : 0.f"),
    "logical_and": ("EvtfuseLogicalAnd", 2, (), "(a != 0.f && b != 0.f) ? 1.f : 0.f"),
    "logical_or": ("EvtfuseLogicalOr", 2, (), "(a != 0.f || b != 0.f) ? 1.f : 0.f"),
    "logical_not": ("EvtfuseLogicalNot", 1, (), "a == 0.f ? 1.f : 0.f"),
    "where": ("EvtfuseWhere", 3, (), "a != 0.f ? b : c"),
}

SUPPORTED = frozenset(CUTLASS) | frozenset(EMITTED)


def _float(v: float) -> str:
    return f"{float(v)!r}f"


def spelling(n: Node) -> tuple[str, str]:
    """(the functor ``Sm90Compute`` takes for ``n``, the initialiser of its ``Arguments``)."""
    ps = n.param_dict
    if n.op in CUTLASS:
        fn, names = CUTLASS[n.op]
        return fn, "{" + ", ".join(_float(ps[k]) for k in names) + "}"
    name, _, params, _ = EMITTED[n.op]
    return name, "{" + ", ".join(_float(ps.get(k, d)) for k, d in params) + "}"


def definition(name: str) -> str:
    """The C++ of the emitted functor ``name`` (one of ``EMITTED``'s)."""
    op, (_, arity, params, body) = next((op, row) for op, row in EMITTED.items()
                                        if row[0] == name)
    ins = "abc"[:arity]
    scalar_args = ", ".join(f"T const& {x}_" for x in ins)
    array_args = ", ".join(f"cutlass::Array<T, N> const& {x}" for x in ins)
    call = ", ".join(f"{x}[i]" for x in ins)
    if params:
        fields = " ".join(f"float {k} = {_float(d)};" for k, d in params)
        scalar_args += ", Arguments const& args = Arguments()"
        array_args += ", Arguments const& args = Arguments()"
        call += ", args"
        scalar_head = f"  struct Arguments {{ {fields} }};\n"
        array_head = f"  using Arguments = typename {name}<T>::Arguments;\n"
    else:
        scalar_head = array_head = ""
    converts = " ".join(f"float const {x} = float({x}_);" for x in ins)
    return (f"// evtfuse's {op}: no CUTLASS functor computes it\n"
            f"template <typename T>\n"
            f"struct {name} {{\n"
            f"{scalar_head}"
            f"  CUTLASS_HOST_DEVICE T operator()({scalar_args}) const {{\n"
            f"    {converts}\n"
            f"    return T({body});\n"
            f"  }}\n"
            f"}};\n\n"
            f"template <typename T, int N>\n"
            f"struct {name}<cutlass::Array<T, N>> {{\n"
            f"{array_head}"
            f"  CUTLASS_HOST_DEVICE cutlass::Array<T, N> operator()({array_args}) const {{\n"
            f"    cutlass::Array<T, N> y;\n"
            f"    {name}<T> op;\n"
            f"    CUTLASS_PRAGMA_UNROLL\n"
            f"    for (int i = 0; i < N; ++i) {{\n"
            f"      y[i] = op({call});\n"
            f"    }}\n"
            f"    return y;\n"
            f"  }}\n"
            f"}};\n")


__all__ = ["CUTLASS", "EMITTED", "SUPPORTED", "spelling", "definition"]
