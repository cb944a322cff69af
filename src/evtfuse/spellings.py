"""torch's spellings of epilogue calls, rewritten to evtfuse's before a call is parsed.

Layer: frontend (used by ``frontend._Parser.parse_call``; only ``ast`` nodes, nothing of
the user's is evaluated). Users write epilogues as they write torch; ``FORMS`` lists the
spellings taken (docs/ops.md prints it). ``rewrite`` returns the call as evtfuse spells
it (a plain name as callee, or an operator expression), or raises ``SpellingError`` with
the message the parser reports at the call's line.
"""

from __future__ import annotations

import ast
import copy
from typing import Callable

FORMS = (
    "method forms: `accum.relu()`, `(accum + C).exp()`, `x.clamp(min=0.0)`: the receiver "
    "becomes the first argument (a receiver is an expression or an epilogue variable, not a "
    "module path such as `torch` or `F`)",
    "`F.gelu(x, approximate=\"tanh\")` / `\"none\"`: `gelu_tanh` / `gelu`",
    "`torch.clamp(x, min=a, max=b)` (also `clip`, `clamp_min`, `clamp_max`, and one bound "
    "given): `clamp`, `maximum` or `minimum`",
    "`F.leaky_relu(x, negative_slope=s)`: `leaky_relu`'s `slope`",
    "`F.softplus(x, beta=b, threshold=t)` (positional or keywords): `softplus(x, beta=b, "
    "threshold=t)`, numeric literals; a beta that is an operand: `where(b * x > t, x, "
    "softplus(b * x, threshold=t) / b)`, torch's formula",
    "`inplace=False` (`F.relu(x, inplace=False)`) is dropped; `inplace=True` is refused",
    "`torch.add / sub / mul / div / pow / neg` and their methods (`x.pow(2)`, `x.mul(y)`): "
    "the Python operators (a `pow` exponent a numeric literal, as `**`)",
)
_GELU_APPROXIMATE = {"tanh": "gelu_tanh", "none": "gelu"}
SOFTPLUS_THRESHOLD = 20.0  # torch's default threshold


class SpellingError(ValueError):
    """A torch spelling evtfuse cannot take; the message names the call and the fix."""


def rewrite(node: ast.Call, is_variable: Callable[[str], bool]) -> ast.AST:
    """``node`` with evtfuse's spelling: a call with a plain name as callee, torch's
    keywords mapped, or the operator expression it stands for."""
    name, args = _callee(node, is_variable)
    if name is None:
        return node
    keywords = _drop_inplace(name, node.keywords)
    if name == "gelu":
        name, keywords = _gelu(keywords)
    elif name in ("clamp", "clip", "clamp_min", "clamp_max"):
        name, args, keywords = _clamp(name, args, keywords)
    elif name == "leaky_relu":
        keywords = [_renamed(k, "negative_slope", "slope") for k in keywords]
    elif name == "softplus":
        return _softplus(args, keywords, node)
    elif name in _OPERATORS:
        return _operator(name, args, keywords, node)
    return _call(node, name, args, keywords)


# torch functions and methods that are Python operators in an epilogue
_OPERATORS = {"add": ast.Add, "sub": ast.Sub, "mul": ast.Mult, "div": ast.Div,
              "pow": ast.Pow, "neg": ast.USub}


def _operator(name: str, args: list, keywords: list, node: ast.Call) -> ast.AST:
    """``torch.mul(a, b)`` / ``a.mul(b)`` as ``a * b``; ``pow(x, e)`` (also ``exponent=``)
    as ``x ** e``; ``neg(x)`` as ``-x``."""
    args = [*args, *(k.value for k in keywords if k.arg in ("other", "exponent"))]
    extra = [k.arg for k in keywords if k.arg not in ("other", "exponent")]
    want = 1 if name == "neg" else 2
    if extra or len(args) != want:
        raise SpellingError(f"{name}() takes {want} value(s)"
                            + (f", not the keyword {extra[0]}" if extra else f", got {len(args)}"))
    op = _OPERATORS[name]()
    expr = ast.UnaryOp(op=op, operand=args[0]) if name == "neg" else \
        ast.BinOp(left=args[0], op=op, right=args[1])
    return ast.copy_location(expr, node)


def _callee(node: ast.Call, is_variable) -> tuple[str | None, list]:
    """(the function's name, its arguments): ``f(x)``, ``torch.f(x)``, ``F.f(x)``, or the
    method form ``x.f()``, whose receiver is the first argument."""
    func = node.func
    if isinstance(func, ast.Name):
        return func.id, list(node.args)
    if not isinstance(func, ast.Attribute):
        return None, list(node.args)
    root = func.value
    while isinstance(root, ast.Attribute):
        root = root.value
    if isinstance(root, ast.Name) and not is_variable(root.id):  # a module path
        return func.attr, list(node.args)
    return func.attr, [func.value, *node.args]  # a method of a value


def _drop_inplace(name: str, keywords: list) -> list:
    kept = []
    for k in keywords:
        if k.arg != "inplace":
            kept.append(k)
        elif not (isinstance(k.value, ast.Constant) and k.value.value is False):
            raise SpellingError(f"{name}(inplace={ast.unparse(k.value)}): an epilogue "
                                f"computes new values; drop inplace (or pass inplace=False)")
    return kept


def _gelu(keywords: list) -> tuple[str, list]:
    name, kept = "gelu", []
    for k in keywords:
        if k.arg != "approximate":
            kept.append(k)
            continue
        value = k.value.value if isinstance(k.value, ast.Constant) else None
        if value not in _GELU_APPROXIMATE:
            raise SpellingError(f"gelu(approximate=...) takes \"none\" (erf, gelu) or \"tanh\" "
                                f"(gelu_tanh), not {ast.unparse(k.value)}")
        name = _GELU_APPROXIMATE[value]
    return name, kept


def _is_none(node) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _clamp(name: str, args: list, keywords: list):
    """torch.clamp(x, min=None, max=None) and its aliases as clamp / maximum / minimum."""
    bounds = {"min": None, "max": None}
    slots = {"clamp_min": ("min",), "clamp_max": ("max",)}.get(name, ("min", "max"))
    for slot, a in zip(slots, args[1:]):
        bounds[slot] = a
    for k in keywords:
        if k.arg not in bounds:
            raise SpellingError(f"{name}() got an unexpected keyword argument '{k.arg}' "
                                f"(it takes min and max)")
        bounds[k.arg] = k.value
    lo, hi = (None if b is None or _is_none(b) else b for b in (bounds["min"], bounds["max"]))
    if not args:
        raise SpellingError(f"{name}() needs the value to clamp")
    x = args[0]
    if lo is not None and hi is not None:
        return "clamp", [x, lo, hi], []
    if lo is not None:
        return "maximum", [x, lo], []
    if hi is not None:
        return "minimum", [x, hi], []
    raise SpellingError(f"{name}() needs min or max (at least one bound)")


def _renamed(k: ast.keyword, old: str, new: str) -> ast.keyword:
    if k.arg != old:
        return k
    return ast.copy_location(ast.keyword(arg=new, value=k.value), k)


def _is_number(node) -> bool:
    """A numeric literal as written: ``2.0``, ``3``, ``-1.5`` (what a row's parameter takes)."""
    while isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        node = node.operand
    return isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
        and not isinstance(node.value, bool)


def _softplus(args: list, keywords: list, node: ast.Call) -> ast.AST:
    """torch's ``softplus(x, beta=1, threshold=20)``: with numeric literals, the row's own
    parameters (``softplus(x, beta=b, threshold=t)``); a beta that is not a literal (an
    operand) as ``where(beta * x > t, x, softplus(beta * x, threshold=t) / beta)``, torch's
    formula in the same order of operations (t must then be a literal)."""
    if len(args) > 3:
        raise SpellingError(f"softplus() takes 3 positional arguments (x, beta, threshold), "
                            f"got {len(args)}")
    given = dict(zip(("beta", "threshold"), args[1:]))
    for k in keywords:
        if k.arg not in ("beta", "threshold"):
            raise SpellingError(f"softplus() got an unexpected keyword argument '{k.arg}' "
                                f"(it takes beta and threshold)")
        if k.arg in given:
            raise SpellingError(f"softplus() got multiple values for argument '{k.arg}'")
        given[k.arg] = k.value
    if not args:
        raise SpellingError("softplus() needs the value")
    x, beta = args[0], given.get("beta")
    if beta is None or _is_number(beta):
        kept = [ast.copy_location(ast.keyword(arg=k, value=v), node) for k, v in given.items()]
        return _call(node, "softplus", [x], kept)
    threshold = given.get("threshold",
                          ast.copy_location(ast.Constant(SOFTPLUS_THRESHOLD), node))
    if not _is_number(threshold):
        raise SpellingError(f"softplus() parameter 'threshold' must be a numeric literal "
                            f"(got {ast.unparse(threshold)})")

    def scaled():
        return ast.copy_location(ast.BinOp(left=copy.deepcopy(beta), op=ast.Mult(),
                                           right=copy.deepcopy(x)), node)

    linear = ast.copy_location(ast.Compare(left=scaled(), ops=[ast.Gt()],
                                           comparators=[copy.deepcopy(threshold)]), node)
    curve = _call(node, "softplus", [scaled()],
                  [ast.copy_location(ast.keyword(arg="threshold",
                                                 value=copy.deepcopy(threshold)), node)])
    curve = ast.copy_location(ast.BinOp(left=curve, op=ast.Div(), right=copy.deepcopy(beta)),
                              node)
    return _call(node, "where", [linear, copy.deepcopy(x), curve], [])


def _call(node: ast.Call, name: str, args: list, keywords: list) -> ast.Call:
    func = ast.copy_location(ast.Name(id=name, ctx=ast.Load()), node)
    return ast.copy_location(ast.Call(func=func, args=args, keywords=keywords), node)


__all__ = ["FORMS", "rewrite", "SpellingError", "SOFTPLUS_THRESHOLD"]
