"""Ready-made epilogues: the CUTLASS C++ epilogue menu, written over the frontend.

Layer: library (above the frontend; knows nothing of kernels). Every entry is an epilogue
*source string* produced from one small template, so each is exactly what a user could
have typed; ``*_args`` factories wrap a source and its values into ``EpilogueArguments``.
Nothing here is special to a backend: a kernel sees the same DAG it would see for the
hand-written function.

The operand's shape decides its kind (docs/architecture.md), so one source serves many CUTLASS
variants: ``alpha`` may be a Python number (runtime scalar, CUTLASS ``alpha``), a 0-d
tensor (``alpha_ptr``), an ``(L, 1, 1)`` tensor (``alpha_ptr_array``, per batch) or a
vector (per-channel alpha: ``(N,)`` per column, ``(M, 1)`` per row); ``bias`` is a per-row
bias when shaped ``(M, 1)`` and a per-column bias when shaped ``(N,)``.

>>> from evtfuse import library
>>> print(library.lin_comb_elt_act("relu"), end="")
def lin_comb_relu(accum, C, alpha, beta):
    F = alpha * accum + beta * C
    D = relu(F)
    return D
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any, Literal, Mapping

from .errors import EpilogueError, shorten
from .ir import INTERLEAVED, PAIR_LAYOUTS
from .optable import CALLABLE, Category

Scale = Literal["default", "no_beta", "only_alpha", "nothing"]

#: ``ScaleType`` of CUTLASS's LinearCombination -> (operands, the linear term).
#: CUTLASS's scale_type.h: Default ``alpha*acc + beta*C``, NoBetaScaling ``alpha*acc + C``,
#: OnlyAlphaScaling ``alpha*acc``, Nothing ``acc``.
SCALES: Mapping[str, tuple[tuple[str, ...], str]] = {
    "default": (("C", "alpha", "beta"), "alpha * accum + beta * C"),
    "no_beta": (("C", "alpha"), "alpha * accum + C"),
    "only_alpha": (("alpha",), "alpha * accum"),
    "nothing": ((), "accum"),
}

#: The activations of CUTLASS's menu (``cutlass::epilogue::thread``), by evtfuse name.
#: Every other unary row of the op table is usable too (``lin_comb_generic``).
ACTIVATIONS: Mapping[str, str] = {
    "identity": "Identity",
    "relu": "ReLu",
    "gelu": "GELU",
    "gelu_tanh": "GELU_taylor",
    "sigmoid": "Sigmoid",
    "silu": "SiLu",
    "hardswish": "HardSwish",
    "leaky_relu": "LeakyReLU",
    "tanh": "Tanh",
    "clamp": "Clamp",
}

#: Clamp's bounds are runtime operands (CUTLASS passes them as activation arguments).
CLAMP_BOUNDS = ("lower_bound", "upper_bound")


# ----------------------------------------------------------------------------- calls

#: source text -> the call of this module (or of evtfuse.nn) that returned it, as text:
#: what a module's repr shows instead of the source (``call_of``). Bounded: the oldest
#: entries go first.
_CALLS: dict[str, str] = {}
_CALLS_LIMIT = 4096


def _argument(value: Any) -> str:
    if isinstance(value, str) and '"' not in value:
        return f'"{value}"'
    return repr(value)


def call_text(fn: Any, args: tuple, kwargs: Mapping[str, Any]) -> str:
    """``fn(*args, **kwargs)`` as text, one spelling per meaning: ``gated("swiglu",
    layout="concatenated")`` for that call however it was written (the first argument always,
    the others left out where equal to their defaults, positionally up to the first left out,
    by name after)."""
    import inspect

    sig = inspect.signature(fn)
    bound = sig.bind(*args, **kwargs)
    bound.apply_defaults()
    parts, by_name = [], False
    for k, (name, p) in enumerate(sig.parameters.items()):
        value = bound.arguments[name]
        if k and p.default is not inspect.Parameter.empty and value == p.default:
            by_name = True
            continue
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            parts += [f"{k}={_argument(v)}" for k, v in value.items()]
        elif p.kind is inspect.Parameter.VAR_POSITIONAL:
            parts += [_argument(v) for v in value]
        elif by_name or p.kind is inspect.Parameter.KEYWORD_ONLY:
            parts.append(f"{name}={_argument(value)}")
        else:
            parts.append(_argument(value))
    return f"{fn.__name__}({', '.join(parts)})"


def remembered(fn):
    """Decorate a function returning epilogue source: each source it returns is remembered
    with the call that made it (``call_of``)."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        source = fn(*args, **kwargs)
        _CALLS.pop(source, None)  # the latest call is the one shown
        _CALLS[source] = call_text(fn, args, kwargs)
        while len(_CALLS) > _CALLS_LIMIT:
            del _CALLS[next(iter(_CALLS))]
        return source

    return wrapper


def call_of(source: Any) -> str | None:
    """The call of this module that returned ``source`` (``lin_comb_elt_act("relu")``),
    or None when no call of this process did."""
    return _CALLS.get(source) if isinstance(source, str) else None


# ----------------------------------------------------------------------------- templates

def _function(name: str, params: tuple[str, ...], body: list[str], returns: tuple[str, ...]) -> str:
    """``def name(accum, *params): body; return returns`` as source text."""
    head = f"def {name}({', '.join(('accum',) + tuple(params))}):"
    lines = [head] + [f"    {line}" for line in body] + [f"    return {', '.join(returns)}"]
    return "\n".join(lines) + "\n"


def _activation_call(activation: str, x: str, params: Mapping[str, float]) -> tuple[str, tuple[str, ...]]:
    """The expression applying ``activation`` to variable ``x``, and the operands it adds."""
    if activation == "identity":
        if params:
            raise EpilogueError(f"identity takes no parameters, got {sorted(params)}")
        return x, ()
    row = CALLABLE.get(activation)
    if row is None or row.category is not Category.ELEMENTWISE:
        known = ", ".join(sorted(n for n, r in CALLABLE.items()
                                 if r.category is Category.ELEMENTWISE and r.arity == 1))
        raise EpilogueError(f"unknown activation '{activation}'; use one of: {known}, clamp, "
                            "identity (or lin_comb_generic with an expression in x)",
                            variable="activation")
    if activation == "clamp":
        if params:
            raise EpilogueError("clamp's bounds are operands (lower_bound, upper_bound), "
                                "not parameters", variable="activation")
        return f"clamp({x}, {', '.join(CLAMP_BOUNDS)})", CLAMP_BOUNDS
    if row.arity != 1:
        raise EpilogueError(f"'{activation}' takes {row.arity} inputs; an activation takes one",
                            variable="activation")
    allowed = dict(row.params)
    for k in params:
        if k not in allowed:
            raise EpilogueError(f"{activation}() has no parameter '{k}'"
                                + (f"; it has {', '.join(allowed)}" if allowed else ""),
                                variable=k)
    # a Choice (cast's dtype) as written, "fp16" or torch.float16: the frontend checks it
    extra = "".join(f", {k}={v!r}" if row.choice(k) else f", {k}={float(v)!r}"
                    for k, v in params.items())
    return f"{activation}({x}{extra})", ()


def _lincomb(name: str, scale: str, *, bias: bool = False, activation: str = "identity",
             activation_params: Mapping[str, float] | None = None, aux: bool = False,
             activation_expr: str | None = None) -> str:
    """The one template behind the menu: ``D = act(linear term [+ bias])`` [, the pre-activation]."""
    if scale not in SCALES:
        raise EpilogueError(f"unknown scale '{scale}'; use one of {', '.join(SCALES)}",
                            variable="scale")
    operands, term = SCALES[scale]
    operands = tuple(operands)
    if bias:
        operands += ("bias",)
        term = f"{term} + bias"
    if activation_expr is not None:
        act, act_operands = activation_expr, ()
    else:
        act, act_operands = _activation_call(activation, "F", activation_params or {})
    operands += act_operands
    if act == "F":  # no activation: D is the linear term itself
        body = [f"D = {term}"]
        returns: tuple[str, ...] = ("D",)
        if aux:
            raise EpilogueError("aux=True stores the value before the activation; there is no "
                                "activation here", variable="aux")
    else:
        body = [f"F = {term}", f"D = {act}"]
        returns = ("D", "F") if aux else ("D",)
    return _function(name, operands, body, returns)


# ----------------------------------------------------------------------------- the menu

@remembered
def linear_combination(scale: Scale = "default") -> str:
    """``D = alpha * accum + beta * C`` (CUTLASS ``LinearCombination``).

    ``scale``: ``"default"``; ``"no_beta"`` (``D = alpha * accum + C``, CUTLASS
    ``ScaleType::NoBetaScaling``); ``"only_alpha"`` (``D = alpha * accum``, C never read);
    ``"nothing"`` (``D = accum``).
    """
    suffix = "" if scale == "default" else f"_{scale}"
    return _lincomb(f"linear_combination{suffix}", scale)


@remembered
def lin_comb_elt_act(activation: str, scale: Scale = "default", *, aux: bool = False,
                     **activation_params: float) -> str:
    """``D = activation(alpha * accum + beta * C)`` (CUTLASS ``LinCombEltAct`` /
    ``LinearCombinationRelu``, ``...GELU``, ...). ``activation`` is one of ``ACTIVATIONS``
    (``leaky_relu`` takes ``slope=``; ``clamp`` adds operands ``lower_bound, upper_bound``).
    With ``aux=True`` the pre-activation value is returned too, as output ``F``.
    """
    return _lincomb(f"lin_comb_{activation}", scale, activation=activation,
                    activation_params=activation_params, aux=aux)


@remembered
def lin_comb_clamp(scale: Scale = "default") -> str:
    """``D = clamp(alpha * accum + beta * C, lower_bound, upper_bound)``
    (CUTLASS ``LinearCombinationClamp``; bounds are runtime operands)."""
    return lin_comb_elt_act("clamp", scale)


@remembered
def lin_comb_bias_elt_act(activation: str = "identity", scale: Scale = "default", *,
                          aux: bool = False, **activation_params: float) -> str:
    """``D = activation(alpha * accum + beta * C + bias)`` (CUTLASS
    ``LinearCombinationBiasElementwise``, ``LinCombPerRowBiasEltAct``,
    ``LinCombPerColBiasEltAct``): ``bias`` shaped ``(M, 1)`` is per row, ``(N,)`` per column.
    """
    name = "lin_comb_bias" + ("" if activation == "identity" else f"_{activation}")
    return _lincomb(name, scale, bias=True, activation=activation,
                    activation_params=activation_params, aux=aux)


@remembered
def lin_comb_generic(activation: str, scale: Scale = "default", *, bias: bool = False,
                     aux: bool = False) -> str:
    """``D = f(alpha * accum + beta * C)`` with a user activation (CUTLASS
    ``LinearCombinationGeneric<MyActivation>``).

    ``activation`` is the name of any one-input function of the op table (``"softplus"``,
    ``"exp"``, ...) or an expression in ``x`` (``"x * x"``, ``"softplus(x) - 0.5 * x"``).
    The expression is parsed with ``ast`` and checked here; it is never executed.
    """
    if activation.isidentifier() and activation != "x":
        return _lincomb(f"lin_comb_{activation}", scale, bias=bias, activation=activation,
                        aux=aux)
    return _lincomb("lin_comb_generic", scale, bias=bias, aux=aux,
                    activation_expr=_substitute_x(activation, "F"))


def _substitute_x(expression: str, var: str) -> str:
    """``expression`` with the name ``x`` replaced by ``var``; only ``x`` may be free."""
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise EpilogueError(f"the activation expression {shorten(repr(expression))} is not "
                            f"valid Python: {exc.msg}", variable="activation") from None
    except (RecursionError, MemoryError):  # Python's parser: thousands of nested signs
        raise _too_deep(expression) from None
    except ValueError as exc:  # a lone surrogate or a null byte
        raise EpilogueError(f"the activation expression {shorten(repr(expression))} is not "
                            f"valid text: {exc}", variable="activation") from None

    class Rename(ast.NodeTransformer):
        def visit_Call(self, node: ast.Call) -> ast.AST:  # keep function names as they are
            fname = node.func.id if isinstance(node.func, ast.Name) else None
            if fname not in CALLABLE and fname not in ("max", "min"):
                shown = fname or ast.unparse(node.func)
                raise EpilogueError(f"the activation expression {expression!r} calls "
                                    f"'{shown}', which is not an epilogue function (see "
                                    "docs/ops.md)", variable="activation")
            node.args = [self.visit(a) for a in node.args]
            node.keywords = [self.visit(k) for k in node.keywords]
            return node

        def visit_Name(self, node: ast.Name) -> ast.AST:
            if node.id != "x":
                raise EpilogueError(f"the activation expression {expression!r} uses '{node.id}'; "
                                    "it may only use x, numbers and functions",
                                    variable="activation")
            return ast.copy_location(ast.Name(var, ast.Load()), node)

    try:
        body = Rename().visit(tree.body)
        return ast.unparse(body)
    except RecursionError:  # the walk and unparse recurse too
        raise _too_deep(expression) from None


def _too_deep(expression: str) -> EpilogueError:
    return EpilogueError(f"the activation expression {shorten(repr(expression))} is nested "
                         "too deep to parse (Python's recursion limit); write the epilogue "
                         "as a function of several assignments", variable="activation")


@remembered
def per_channel_scaling(scale: Scale = "default", activation: str = "identity", *,
                        bias: bool = False, **activation_params: float) -> str:
    """Per-channel ``alpha`` and ``beta`` (CUTLASS ``PerColLinCombPerColBiasEltAct``,
    ``ScaleType::OnlyAlphaPerChannelScaling``): the linear-combination source; pass alpha
    and beta as vectors (``(N,)`` per output column, ``(M, 1)`` per row). Use
    ``per_channel_args`` to have the shapes checked.
    """
    name = "per_channel" + ("" if activation == "identity" else f"_{activation}")
    return _lincomb(name, scale, bias=bias, activation=activation,
                    activation_params=activation_params)


@remembered
def fp8_scaled_output(activation: str = "identity", *, amax: bool = True, bias: bool = False,
                      **activation_params: float) -> str:
    """The FP8 output recipe (CUTLASS ``ScaledLinCombPerRowBiasEltActAmaxAux``, reduced to
    its core): ``Z = activation(accum * scale_a * scale_b [+ bias])``, ``D = Z * scale_d``
    (D typically float8_e4m3fn) and ``amax = max(abs(Z))``: the absolute maximum of the
    unscaled output, from which the next step's ``scale_d`` is derived. Give ``amax`` a
    ``(1,)`` fp32 buffer (or ``(L, 1, 1)`` for one per batch).
    """
    act, operands = _activation_call(activation, "Z0", activation_params)
    params: tuple[str, ...] = ("scale_a", "scale_b", "scale_d")
    pre = "accum * scale_a * scale_b" + (" + bias" if bias else "")
    params = params[:2] + (("bias",) if bias else ()) + params[2:] + operands
    if act == "Z0":
        body = [f"Z = {pre}"]
    else:
        body = [f"Z0 = {pre}", f"Z = {act}"]
    body.append("D = Z * scale_d")
    returns: tuple[str, ...] = ("D",)
    if amax:
        body.append("amax = max(abs(Z))")
        returns += ("amax",)
    return _function("fp8_scaled_output", params, body, returns)


# ----------------------------------------------------------------------------- factories

def _is_vector(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor) and value.dim() >= 1 and value.numel() > 1


def lin_comb_args(D: Any, *, alpha: Any = 1.0, C: Any = None, beta: Any = None,
                  bias: Any = None, activation: str = "identity", F: Any = None,
                  activation_params: Mapping[str, float] | None = None,
                  **activation_operands: Any):
    """``EpilogueArguments`` for the linear-combination family, picking the variant from
    what is given: no ``C`` -> only alpha; ``C`` without ``beta`` -> C added unscaled;
    ``bias`` -> bias variant; ``F`` (a buffer) -> the pre-activation value is stored too.
    ``activation_operands`` are the clamp bounds (``lower_bound=``, ``upper_bound=``).
    """
    from .arguments import EpilogueArguments

    if C is None and beta is not None:
        raise EpilogueError("beta is given but C is not; pass C (or drop beta)", variable="C")
    scale = "only_alpha" if C is None else ("no_beta" if beta is None else "default")
    aux = F is not None
    source = _lincomb("lin_comb", scale, bias=bias is not None, activation=activation,
                      activation_params=activation_params or {}, aux=aux)
    values = {"alpha": alpha, "D": D, **activation_operands}
    if C is not None:
        values["C"] = C
    if beta is not None:
        values["beta"] = beta
    if bias is not None:
        values["bias"] = bias
    if aux:
        values["F"] = F
    return EpilogueArguments(source, **values)


def per_channel_args(D: Any, *, alpha: Any, C: Any = None, beta: Any = None, bias: Any = None,
                     activation: str = "identity", **activation_params: float):
    """``EpilogueArguments`` for per-channel scaling; ``alpha`` (and ``beta`` when given)
    must be vectors: ``(N,)`` (per output column) or ``(M, 1)`` (per row)."""
    for name, v in (("alpha", alpha), ("beta", beta)):
        if v is not None and not _is_vector(v):
            raise EpilogueError(f"per-channel {name} must be a vector tensor ((N,) per column or "
                                f"(M, 1) per row), not {_describe(v)}", variable=name)
    return lin_comb_args(D, alpha=alpha, C=C, beta=beta, bias=bias, activation=activation,
                         activation_params=activation_params)


def fp8_scaled_output_args(D: Any, *, scale_a: Any, scale_b: Any, scale_d: Any,
                           amax: Any = None, bias: Any = None, activation: str = "identity",
                           **activation_params: float):
    """``EpilogueArguments`` for ``fp8_scaled_output`` (``amax=None``: no amax output)."""
    from .arguments import EpilogueArguments

    source = fp8_scaled_output(activation, amax=amax is not None, bias=bias is not None,
                               **activation_params)
    values = {"scale_a": scale_a, "scale_b": scale_b, "scale_d": scale_d, "D": D}
    if amax is not None:
        values["amax"] = amax
    if bias is not None:
        values["bias"] = bias
    return EpilogueArguments(source, **values)


def _describe(value: Any) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return repr(value)


#: Gated epilogues (``pairs(accum)``, docs/gated.md) by name: the activation of gate.
GATED: Mapping[str, str] = {"swiglu": "silu", "geglu": "gelu", "reglu": "relu"}


@remembered
def gated(kind: str = "swiglu", *, bias: bool = False, layout: str = "interleaved") -> str:
    """A gated epilogue: ``D = act(gate) * up`` over ``gate, up = pairs(accum)`` (the
    accumulator's interleaved column pairs; B from ``evtfuse.interleave_gate_up``), or with
    ``layout="concatenated"`` over ``pairs(accum, layout="concatenated")`` (B's first N
    columns gate, the next N up: a ``[W_gate; W_up]`` weight's ``W.t()``, as it is).
    ``bias``: two per-column operands of the output's width N, ``bias_gate`` and
    ``bias_up`` (the ``nn.Linear`` biases of the two projections), added before the
    activation and the product."""
    if kind not in GATED:
        raise EpilogueError(f"unknown gated epilogue '{kind}'; one of {', '.join(GATED)}")
    if layout not in PAIR_LAYOUTS:
        raise EpilogueError(f"layout must be one of {', '.join(PAIR_LAYOUTS)}, not {layout!r}",
                            variable="layout")
    act = GATED[kind]
    pairs = "gate, up = pairs(accum)" if layout == INTERLEAVED else \
        f"gate, up = pairs(accum, layout={layout!r})"
    name = kind if layout == INTERLEAVED else f"{kind}_{layout}"
    if bias:
        return _function(f"{name}_bias", ("bias_gate", "bias_up"),
                         [pairs, f"D = {act}(gate + bias_gate) * (up + bias_up)"], ("D",))
    return _function(name, (), [pairs, f"D = {act}(gate) * up"], ("D",))


SWIGLU = gated("swiglu")
GEGLU = gated("geglu")


# ----------------------------------------------------------------------------- C++ names

@dataclass(frozen=True)
class MenuEntry:
    """One CUTLASS C++ epilogue and the evtfuse call giving the same computation."""

    cutlass: str  # the C++ name
    function: str  # a function of this module
    args: tuple[Any, ...] = ()
    kwargs: tuple[tuple[str, Any], ...] = ()
    note: str = ""  # how the operands are passed

    @property
    def call(self) -> str:
        """The evtfuse call as text, e.g. ``lin_comb_elt_act("relu")``."""
        parts = [repr(a).replace("'", '"') for a in self.args]
        parts += [f"{k}={v!r}".replace("'", '"') for k, v in self.kwargs]
        return f"{self.function}({', '.join(parts)})"

    def source(self) -> str:
        return globals()[self.function](*self.args, **dict(self.kwargs))


def _act_entries() -> tuple[MenuEntry, ...]:
    classic = {"relu": "LinearCombinationRelu", "gelu_tanh": "LinearCombinationGELU",
               "sigmoid": "LinearCombinationSigmoid", "silu": "LinearCombinationSilu",
               "hardswish": "LinearCombinationHardswish",
               "leaky_relu": "LinearCombinationLeakyRelu"}
    out = []
    for act, cpp in classic.items():
        kw = (("slope", 0.01),) if act == "leaky_relu" else ()
        out.append(MenuEntry(cpp, "lin_comb_elt_act", (act,), kw))
    for act, functor in ACTIVATIONS.items():
        if act in ("identity", "clamp"):
            continue
        kw = (("slope", 0.01),) if act == "leaky_relu" else ()
        out.append(MenuEntry(f"fusion::LinCombEltAct<{functor}>", "lin_comb_elt_act", (act,), kw))
    return tuple(out)


CUTLASS_MENU: tuple[MenuEntry, ...] = (
    MenuEntry("LinearCombination", "linear_combination", (),
              note="alpha, beta: numbers (runtime scalars)"),
    MenuEntry("LinearCombination (alpha_ptr, beta_ptr)", "linear_combination", (),
              note="alpha, beta: 0-d tensors (device scalars)"),
    MenuEntry("LinearCombination (alpha_ptr_array, beta_ptr_array)", "linear_combination", (),
              note="alpha, beta: (L, 1, 1) tensors (one per batch)"),
    MenuEntry("LinearCombination, ScaleType::NoBetaScaling", "linear_combination", ("no_beta",)),
    MenuEntry("LinearCombination, ScaleType::OnlyAlphaScaling", "linear_combination",
              ("only_alpha",)),
    MenuEntry("LinearCombination, ScaleType::Nothing", "linear_combination", ("nothing",)),
    MenuEntry("LinearCombination, ScaleType::OnlyAlphaPerChannelScaling", "per_channel_scaling",
              ("only_alpha",), note="alpha: (N,) or (M, 1) tensor"),
    *_act_entries(),
    MenuEntry("LinearCombinationClamp", "lin_comb_clamp", (),
              note="lower_bound, upper_bound: numbers or tensors"),
    MenuEntry("fusion::LinCombEltAct<Clamp>", "lin_comb_elt_act", ("clamp",),
              note="lower_bound, upper_bound operands"),
    MenuEntry("LinearCombinationBiasElementwise<ReLu>", "lin_comb_bias_elt_act", ("relu",),
              note="bias: (M, 1) per row or (N,) per column"),
    MenuEntry("LinearCombinationBiasRelu", "lin_comb_bias_elt_act", ("relu",)),
    MenuEntry("fusion::LinCombPerRowBias", "lin_comb_bias_elt_act", (), note="bias: (M, 1)"),
    MenuEntry("fusion::LinCombPerColBias", "lin_comb_bias_elt_act", (), note="bias: (N,)"),
    MenuEntry("fusion::LinCombPerRowBiasEltAct<Act>", "lin_comb_bias_elt_act", ("relu",),
              note="bias: (M, 1); any activation"),
    MenuEntry("fusion::LinCombPerColBiasEltAct<Act>", "lin_comb_bias_elt_act", ("relu",),
              note="bias: (N,); any activation"),
    MenuEntry("fusion::LinCombPerRowBiasEltActAux<Act>", "lin_comb_bias_elt_act", ("relu",),
              (("aux", True),), note="F: the pre-activation aux output"),
    MenuEntry("fusion::PerColLinCombPerColBiasEltAct<Act>", "per_channel_scaling",
              ("default", "relu"), (("bias", True),), note="alpha, beta, bias: (N,) tensors"),
    MenuEntry("LinearCombinationGeneric<MyActivation>", "lin_comb_generic", ("x * x",),
              note="any expression in x, or a function name"),
    MenuEntry("fusion::ScaledLinCombPerRowBiasEltActAmaxAux (core)", "fp8_scaled_output", (),
              note="scale_a, scale_b, scale_d: 0-d tensors; D fp8; amax (1,) fp32"),
)


def menu_table() -> str:
    """The Markdown table mapping each CUTLASS C++ name to its evtfuse call (docs/library.md)."""
    rows = ["| CUTLASS C++ | evtfuse (`evtfuse.library`) | operands |", "|---|---|---|"]
    for e in CUTLASS_MENU:
        rows.append(f"| `{e.cutlass}` | `{e.call}` | {e.note} |")
    return "\n".join(rows)


__all__ = [
    "Scale", "SCALES", "ACTIVATIONS", "CLAMP_BOUNDS", "linear_combination", "lin_comb_elt_act",
    "lin_comb_clamp", "lin_comb_bias_elt_act", "lin_comb_generic", "per_channel_scaling",
    "fp8_scaled_output", "lin_comb_args", "per_channel_args", "fp8_scaled_output_args",
    "MenuEntry", "CUTLASS_MENU", "menu_table", "GATED", "gated", "SWIGLU", "GEGLU", "call_of",
]
