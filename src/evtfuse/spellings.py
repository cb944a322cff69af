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
    "reductions with torch's `dim` and `keepdim` (`x.sum(-1, keepdim=True)`, `torch.mean(x, "
    "dim=0)`, `x.amax((0, 1))`, `torch.logsumexp(x, -1)`; also `amin`, `min`, `max`, whose "
    "values `.values` / `[0]` are taken, and evtfuse's own `sum(x, dim=...)`): each row, "
    "each column or everything as torch's dims say for the output's rank, (M, N) or "
    "(L, M, N), the batches apart unless dim 0 of a batched output is reduced; with no dim "
    "torch's `x.sum()` reduces everything (evtfuse's own `sum(x)` takes its axes from its "
    "output). Without keepdim the result must broadcast as torch broadcasts it (`x.sum(0)` "
    "does; `x.sum(-1)`, shaped (M,), is refused unless only returned); dims that reduce "
    "the batches only, and non-negative dims where the output's rank is not known, are "
    "refused",
    "`torch.softmax(x, dim=-1)`, `F.softmax(x, -1)`, `x.softmax(-1)` (and `log_softmax`): "
    "`softmax(x)` for the last dim; another dim, or none (torch's implicit dim), is refused",
    "`torch.max(a, b)` / `a.min(b)` with two values: `maximum` / `minimum`",
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
    name, args, torchy = _callee(node, is_variable)
    if name is None:
        return node
    keywords = _drop_inplace(name, node.keywords)
    if name in REDUCTIONS or name in ROW_FUNCTIONS:
        return _reduction(name, args, keywords, node, torchy)
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


# torch functions and methods that are Python operators in an epilogue (NAMES: below)
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


# module paths whose functions are torch's (``torch.sum``, ``F.softmax``,
# ``torch.nn.functional.softmax``); any other (``ops.sum``, ``evtfuse.ops.sum``) is evtfuse's
TORCH_MODULES = ("torch", "F", "nn")


def _callee(node: ast.Call, is_variable) -> tuple[str | None, list, bool]:
    """(the function's name, its arguments, whether it is torch's): ``f(x)``, ``torch.f(x)``,
    ``F.f(x)``, or the method form ``x.f()``, whose receiver is the first argument (a
    method is torch's: a tensor's)."""
    func = node.func
    if isinstance(func, ast.Name):
        return func.id, list(node.args), False
    if not isinstance(func, ast.Attribute):
        return None, list(node.args), False
    root = func.value
    while isinstance(root, ast.Attribute):
        root = root.value
    if isinstance(root, ast.Name) and not is_variable(root.id):  # a module path
        return func.attr, list(node.args), root.id in TORCH_MODULES
    return func.attr, [func.value, *node.args], True  # a method of a value


# ---- reductions: torch's dims and keepdim, or evtfuse's own (the output picks the axes)

# torch's name -> the op-table row; max and min with a dim give torch's values
REDUCTIONS = {"sum": "sum", "mean": "mean", "logsumexp": "logsumexp", "amax": "max",
              "amin": "min", "max": "max", "min": "min"}
ROW_FUNCTIONS = ("softmax", "log_softmax")
_TORCH_ONLY = ("amax", "amin")  # not evtfuse's own names: torch's meaning however written


def _kw(node: ast.AST, name: str, value: ast.expr) -> ast.keyword:
    return ast.copy_location(ast.keyword(arg=name, value=value), node)


def _slots(name: str, args: list, keywords: list, slots: tuple[str, ...],
           allowed: tuple[str, ...] = ()) -> dict:
    """torch's arguments after x by name: positional ones in ``slots``' order, then the
    keywords (``allowed``: others taken, and dropped where None or fp32, as ``dtype=None``;
    refused otherwise)."""
    if len(args) - 1 > len(slots):
        raise SpellingError(f"{name}() takes {len(slots) + 1} positional arguments "
                            f"(x, {', '.join(slots)}), got {len(args)}")
    given = dict(zip(slots, args[1:]))
    for k in keywords:
        if k.arg in allowed and _is_none_or_fp32(k.value):
            continue  # what the epilogue computes in anyway
        if k.arg in allowed:
            raise SpellingError(f"{name}({k.arg}={ast.unparse(k.value)}): an epilogue computes "
                                f"in fp32; drop {k.arg} (cast(x, \"bf16\") rounds a value)")
        if k.arg not in slots:
            raise SpellingError(f"{name}() got an unexpected keyword argument '{k.arg}' (it "
                                f"takes {' and '.join(slots)})")
        if k.arg in given:
            raise SpellingError(f"{name}() got multiple values for argument '{k.arg}'")
        given[k.arg] = k.value
    return given


def _is_none_or_fp32(node) -> bool:
    """``None``, ``torch.float32`` or ``torch.float`` as written."""
    if isinstance(node, ast.Constant):
        return node.value is None
    return isinstance(node, ast.Attribute) and node.attr in ("float32", "float") \
        and isinstance(node.value, ast.Name) and node.value.id == "torch"


def _is_dim(node) -> bool:
    """An int literal or a tuple of them: a dim, not a value (``torch.max(x, 1)``)."""
    from .axes import _int_literal
    if isinstance(node, (ast.Tuple, ast.List)):
        return all(_int_literal(e) is not None for e in node.elts)
    return _int_literal(node) is not None


def _reduction(name: str, args: list, keywords: list, node: ast.Call, torchy: bool) -> ast.AST:
    """A reduction or row function (softmax) as evtfuse's row with ``dim`` and ``keepdim``
    keywords where its axes are torch's (the parser reads them: ``axes.parse``), or with
    none where they are evtfuse's own (``sum(x)``: the output picks them)."""
    if not args:
        raise SpellingError(f"{name}() needs the value")
    x = args[0]
    if name in ROW_FUNCTIONS:
        # torch.softmax(x, dim, dtype=None), F.softmax(x, dim=None, _stacklevel, dtype=None)
        given = _slots(name, args, keywords, ("dim",), allowed=("dtype",))
        dim = given.get("dim")
        if dim is None or (isinstance(dim, ast.Constant) and dim.value is None):
            if torchy:
                raise SpellingError(f"{name}() without dim: torch picks the dim from the "
                                    f"input's rank (an implicit dim, deprecated); write "
                                    f"dim=-1 (each row, the one {name} evtfuse computes)")
            return _call(node, name, [x], [])
        return _call(node, name, [x], [_kw(node, "dim", dim)])
    row = REDUCTIONS[name]
    torchy = torchy or name in _TORCH_ONLY
    if name in ("max", "min"):
        second = args[1] if len(args) > 1 else None
        if second is not None and not (torchy and _is_dim(second)):
            # max(a, b): elementwise (evtfuse's own, and torch's torch.max(a, b))
            pair = {"max": "maximum", "min": "minimum"}[name]
            if len(args) != 2 or keywords:
                raise SpellingError(f"{name}(a, b) is elementwise and takes two values, got "
                                    f"{len(args)} and {len(keywords)} keyword(s)")
            return _call(node, pair, args, [])
    given = _slots(name, args, keywords, ("dim", "keepdim"),
                   allowed=("dtype",) if row in ("sum", "mean") else ())
    if "dim" not in given and "keepdim" not in given and not torchy:
        return _call(node, row, [x], [])  # evtfuse's own: the output picks the axes
    if "dim" not in given and name == "logsumexp":
        raise SpellingError("logsumexp() needs dim (torch's has no default): dim=-1 for "
                            "each row")
    dim = given.get("dim", ast.copy_location(ast.Constant(None), node))
    keep = given.get("keepdim", ast.copy_location(ast.Constant(False), node))
    return _call(node, row, [x], [_kw(node, "dim", dim), _kw(node, "keepdim", keep)])


def values_of(node: ast.expr, is_variable: Callable[[str], bool]) -> ast.Call | None:
    """``x.max(-1).values`` / ``torch.max(x, 1)[0]``: the call whose values these are (torch's
    max and min with a dim give (values, indices)); None where ``node`` is neither form.
    Their indices (``.indices``, ``[1]``) are refused: evtfuse computes no argmax."""
    if isinstance(node, ast.Attribute) and node.attr in ("values", "indices"):
        call, part = node.value, node.attr
    elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
            and node.slice.value in (0, 1) and not isinstance(node.slice.value, bool):
        call, part = node.value, ("values", "indices")[node.slice.value]
    else:
        return None
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
            and call.func.attr in ("max", "min")):
        return None
    _, args, _ = _callee(call, is_variable)
    if not (len(args) > 1 and _is_dim(args[1]) or any(k.arg == "dim" for k in call.keywords)):
        return None  # torch.max(a, b)[0] is a row of the elementwise max: not read
    if part == "indices":
        raise SpellingError(f"{ast.unparse(node)}: evtfuse computes no indices (argmax, "
                            f"argmin); take the values (.values)")
    return call


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


# every name a call may have here that is not an op-table row's (for "did you mean")
NAMES = frozenset(["clip", "clamp_min", "clamp_max", *_OPERATORS, *REDUCTIONS, *ROW_FUNCTIONS])

__all__ = ["FORMS", "rewrite", "values_of", "SpellingError", "SOFTPLUS_THRESHOLD", "NAMES",
           "REDUCTIONS", "ROW_FUNCTIONS", "TORCH_MODULES"]
