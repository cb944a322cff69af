"""The language of the op table's derivatives (layer: ir, below ``optable``; imports nothing
of evtfuse).

Each row of ``optable.OPS`` carries its derivative as a *rule*: a function of a ``Diff``
that returns, for each input of the op, the gradient flowing into it (a ``Sym``), or None
where none flows (a comparison's inputs, ``where``'s condition). A rule is written with
Python operators and the table's own ops::

    def sigmoid_rule(d):            # d.x: the input, d.out: the result, d.g: its gradient
        return (d.g * (1.0 - d.out) * d.out,)

A rule never computes anything itself: it builds an expression over an *algebra* (any
object with ``const(value)`` and ``call(op, values, params)``), so one rule serves every
reading of it: the backward pass (``autodiff``) builds DAG nodes, ``docgen`` prints text
for docs/ops.md, ``optable.TorchAlgebra`` evaluates it on tensors with the table's torch
meaning (tests, and the ties of max/min reductions). A rule raises ``NoDerivative`` where its op has none for these parameters
(``cast`` to an integer); a row whose ``grad`` is None has none at all.

Reduction rows' rules see ``d.x`` (the reduced value, broadcast), ``d.out`` (the result)
and ``d.g`` (the result's gradient, broadcast), and may use ``d.ties``: the number of
reduced elements equal to the result (max and min share their gradient among ties, as
torch's amax does), or ``d.shift``: the row's max a shifted reduction (softmax's
shifted_sumexp) is taken relative to, held fixed.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping


class NoDerivative(Exception):
    """The op has no derivative for these parameters; the text says why."""


class Sym:
    """A value of a derivative formula over an algebra: Python operators build new ones."""

    __slots__ = ("alg", "v")
    __hash__ = None  # type: ignore[assignment]  # == builds an expression

    def __init__(self, alg: Any, v: Any):
        self.alg, self.v = alg, v

    def _of(self, other: Any) -> "Sym":
        return other if isinstance(other, Sym) else Sym(self.alg, self.alg.const(float(other)))

    def _call(self, op: str, *args: Any, **params: Any) -> "Sym":
        vals = [self._of(a).v for a in args]
        return Sym(self.alg, self.alg.call(op, vals, params))

    def __add__(self, o): return self._call("add", self, o)
    def __radd__(self, o): return self._call("add", o, self)
    def __sub__(self, o): return self._call("sub", self, o)
    def __rsub__(self, o): return self._call("sub", o, self)
    def __mul__(self, o): return self._call("mul", self, o)
    def __rmul__(self, o): return self._call("mul", o, self)
    def __truediv__(self, o): return self._call("div", self, o)
    def __rtruediv__(self, o): return self._call("div", o, self)
    def __neg__(self): return self._call("neg", self)
    def __lt__(self, o): return self._call("lt", self, o)
    def __le__(self, o): return self._call("le", self, o)
    def __gt__(self, o): return self._call("gt", self, o)
    def __ge__(self, o): return self._call("ge", self, o)
    def __eq__(self, o): return self._call("eq", self, o)  # type: ignore[override]
    def __ne__(self, o): return self._call("ne", self, o)  # type: ignore[override]

    def __pow__(self, exponent: float) -> "Sym":
        if isinstance(exponent, Sym):
            raise TypeError("a derivative's exponent must be a number (pow's is a constant)")
        return self._call("pow", self, exponent=float(exponent))

    def __bool__(self):
        raise TypeError("a derivative formula cannot branch on a value; use d.where(...)")


class Diff:
    """What a rule sees: ``x``, ``y``, ``z`` (the op's inputs, also ``args``), ``out`` (its
    result), ``g`` (the result's gradient), ``params`` (the row's parameters), ``ties``
    (reductions: how many elements equal the result), ``shift`` (shifted reductions: the
    row's max, held fixed), ``const(v)``, and every op of the table by name:
    ``d.sigmoid(v)``, ``d.where(c, a, b)``, ``d.pow(v, exponent=3.0)``."""

    def __init__(self, alg: Any, args: tuple, g: Any, params: Mapping[str, Any] | None = None,
                 out: Callable[[], Any] | None = None, ties: Callable[[], Any] | None = None,
                 shift: Callable[[], Any] | None = None):
        self._alg = alg
        self.args = tuple(Sym(alg, a) for a in args)
        self.g = Sym(alg, g)
        self.params = dict(params or {})
        self._out, self._ties, self._shift = out, ties, shift
        self.used: set[str] = set()  # which of out / ties / shift the rule read

    @property
    def x(self) -> Sym:
        return self.args[0]

    @property
    def y(self) -> Sym:
        return self.args[1]

    @property
    def z(self) -> Sym:
        return self.args[2]

    @property
    def out(self) -> Sym:
        if self._out is None:
            raise NoDerivative("the result is not available here")
        self.used.add("out")
        return Sym(self._alg, self._out())

    @property
    def ties(self) -> Sym:
        if self._ties is None:
            raise NoDerivative("the count of tied elements is not available here")
        self.used.add("ties")
        return Sym(self._alg, self._ties())

    @property
    def shift(self) -> Sym:
        if self._shift is None:
            raise NoDerivative("written on its own, outside softmax and log_softmax: the "
                               "gradient of the max it is taken relative to is not counted")
        self.used.add("shift")
        return Sym(self._alg, self._shift())

    def const(self, value: float) -> Sym:
        return Sym(self._alg, self._alg.const(float(value)))

    def __getattr__(self, name: str) -> Callable[..., Sym]:
        if name.startswith("_"):
            raise AttributeError(name)

        def op(*args: Any, **params: Any) -> Sym:
            vals = [a.v if isinstance(a, Sym) else self._alg.const(float(a)) for a in args]
            return Sym(self._alg, self._alg.call(name, vals, params))
        return op


def apply_rule(rule: Callable[[Diff], tuple], d: Diff) -> tuple:
    """The rule's per-input gradients as the algebra's values (None where none flows)."""
    return tuple(None if s is None else s.v for s in rule(d))


# ------------------------------------------------------------------ algebras

_OPERATORS = {"add": ("+", 1), "sub": ("-", 1), "mul": ("*", 2), "div": ("/", 2),
              "lt": ("<", 0), "le": ("<=", 0), "gt": (">", 0), "ge": (">=", 0),
              "eq": ("==", 0), "ne": ("!=", 0)}


class TextAlgebra:
    """Formulas as text (docs/ops.md): values are (text, precedence, op)."""

    def const(self, value: float):
        text = repr(value)
        return (text, 4 if value >= 0 or text == "nan" else 3, None)

    def call(self, op: str, vals: list, params: dict):
        if op in _OPERATORS:
            sym, prec = _OPERATORS[op]
            (a, pa, _), (b, pb, ob) = vals
            left = a if pa >= prec else f"({a})"
            # a + (b + c) and a * (b * c) need no parentheses; a - (b - c), a * (b / c) do
            right = b if pb > prec or (pb == prec and op in ("add", "mul") and ob == op) \
                else f"({b})"
            return (f"{left} {sym} {right}", prec, op)
        if op == "neg":
            a, pa, _ = vals[0]
            return (f"-{a}" if pa >= 3 else f"-({a})", 3, op)
        if op == "pow":
            a, pa, _ = vals[0]
            return (f"{a if pa >= 4 else f'({a})'} ** {params['exponent']!r}", 4, op)
        ps = [f"{k}={v!r}" for k, v in params.items()]
        return (f"{op}({', '.join([v[0] for v in vals] + ps)})", 4, op)

    @staticmethod
    def leaf(name: str):
        return (name, 4, None)

    @staticmethod
    def text(value) -> str:
        return value[0]


__all__ = ["NoDerivative", "Sym", "Diff", "apply_rule", "TextAlgebra"]
