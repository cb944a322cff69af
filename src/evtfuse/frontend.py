"""Frontend: epilogue source (a function or a string) -> checked syntax -> bound DAG.

Layer: frontend. User text is parsed with ``ast`` and walked; it is never executed
(no ``eval``/``exec``). Two steps:

* ``parse_epilogue`` checks everything the source alone decides (``accum`` first, SSA,
  supported syntax, known functions, defined names, the return) and yields a
  ``ParsedEpilogue`` of small expression trees;
* ``bind`` turns it into an ``ir.Dag`` once the operands' values and the problem shape
  (L, M, N) are known: shapes decide each operand's kind and each output's (see
  docs/architecture.md, "the tensor's shape decides its kind").

Every error is an ``EpilogueError`` naming the variable and, for source errors, the line.
"""

from __future__ import annotations

import ast
import difflib
import functools
import inspect
import io
import numbers
import re
import textwrap
import tokenize
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Union

import torch

from . import axes as axes_, ir, spellings
from .derivative import Diff
from .errors import EpilogueError, not_an_operand, scalar_value
from .ir import OperandKind, OperandSpec, Output, OutputKind, Space
from .optable import (BINARY_OPERATORS, CALLABLE, COMPARE_OPERATORS, FP8_DTYPES, OPS,
                      UNARY_OPERATORS, Category, OpDef, ParamValue)

# ----------------------------------------------------------------------------- syntax


@dataclass(frozen=True)
class Expr:
    """A binding-independent expression: a name, a literal, a call of a table row, an index."""

    kind: str  # "name" | "const" | "call" | "index" | "pair"
    line: int
    name: str | None = None  # for "name"
    value: float | None = None  # for "const"
    op: str | None = None  # for "call" (op-table row), "index" ("row"/"col"), "pair" ("gate"/"up")
    args: tuple["Expr", ...] = ()
    params: tuple[tuple[str, ParamValue], ...] = ()  # for "call": all, in the row's order
    # for a reduction or row function written with torch's dim (``x.sum(-1, keepdim=True)``):
    # its axes (``axes.Axes``); None: evtfuse's own (the output it is stored in picks them)
    axes: axes_.Axes | None = None


@dataclass(frozen=True)
class Assignment:
    target: str
    expr: Expr
    line: int

    @property
    def conditional(self) -> bool:
        """``target = store_where(cond, value)``: a conditional store."""
        return self.expr.kind == "call" and OPS[self.expr.op].category is Category.STORE


@dataclass(frozen=True)
class ParsedEpilogue:
    name: str
    params: tuple[str, ...]  # after accum, in order
    assignments: tuple[Assignment, ...]
    returns: tuple[tuple[str, int], ...]  # (name, line) in return order
    source_lines: tuple[str, ...]  # user's lines, index = line - line_offset - 1
    line_offset: int  # added to ast line numbers to give the user's line numbers
    where: str

    @functools.cached_property
    def outputs(self) -> tuple[str, ...]:  # read on every gemm call: computed once
        return tuple(n for n, _ in self.returns)

    @functools.cached_property
    def gated(self) -> bool | str:
        """Whether the epilogue takes the accumulator's columns in pairs
        (``gate, up = pairs(accum)``: its output is then half as wide as A @ B): False, or
        the pairs' layout, "interleaved" or "concatenated" (``ir.Dag.gated``)."""
        for a in self.assignments:
            if a.expr.kind == "pair":
                return dict(a.expr.params)[PAIR_LAYOUT]
        return False

    @functools.cached_property
    def columnwise(self) -> bool:
        """Whether each output column is a function of its own column alone: no reduction,
        no function of a whole row (softmax), no element index, not gated: a GEMM sharded
        over its columns (tensor parallelism's column-parallel Linear) can run it on each
        shard as it is."""
        cross = (Category.REDUCE, Category.ROWWISE, Category.INDEX)
        return not self.gated and not any(
            _calls(a.expr, lambda row: row.category in cross) for a in self.assignments)

    @functools.cached_property
    def sized(self) -> bool:
        """Whether it calls an op whose lowering reads the problem's sizes (``mean``: the
        count of reduced elements), so that its DAG holds them as constants."""
        return any(_calls(a.expr, lambda row: row.sized) for a in self.assignments)

    @functools.cached_property
    def conditional_outputs(self) -> tuple[str, ...]:
        """Outputs assigned ``store_where(cond, value)``: written only where cond holds, so
        the caller must give their buffers (``gemm`` allocates no such output)."""
        stores = {a.target for a in self.assignments if a.conditional}
        return tuple(n for n in self.outputs if n in stores)

    def text_of(self, line: int) -> str | None:
        return _line_text(self.source_lines, self.line_offset, line)

    def bind(self, given: Mapping[str, Any], problem: tuple[int, int, int],
             grouped: bool = False, rank: int | None = None) -> ir.Dag:
        """``bind`` (below) of this epilogue: what ``EpilogueArguments`` calls, as it calls
        ``DagEpilogue.bind`` for an epilogue given as a DAG (``dag_epilogue``)."""
        return bind(self, given, problem, grouped, rank)


def _line_text(source_lines: tuple[str, ...], line_offset: int, line: int) -> str | None:
    """The user's source line ``line`` (numbered as in their file), if the source has it."""
    k = line - line_offset - 1
    return source_lines[k] if 0 <= k < len(source_lines) else None


_INDEX_FUNCTIONS = {"row_index": "row", "col_index": "col"}
PAIRS = "pairs"  # gate, up = pairs(accum): the accumulator's columns 2j and 2j + 1
PAIR_LAYOUT = "layout"  # pairs(accum, layout="concatenated"): columns j and N + j
_PY_MINMAX = {"max": "maximum", "min": "minimum"}  # max(a, b) is elementwise


class _Parser:
    def __init__(self, source: str, line_offset: int, where: str, from_function: bool = False):
        self.source_lines = tuple(source.splitlines())
        self.line_offset = line_offset
        self.where = where
        self.from_function = from_function  # given as a function (not as source text)
        self.defined: dict[str, int] = {}
        self.paired = False  # a 'gate, up = pairs(accum)' was read

    def error(self, message: str, node: ast.AST | None = None, variable: str | None = None):
        line = getattr(node, "lineno", None)
        if line is not None:
            line += self.line_offset
            return EpilogueError(message, variable=variable, line=line, where=self.where,
                                 source_line=self._source_line(line))
        return EpilogueError(message, variable=variable)

    def exact_error(self, message: str, node: ast.AST, variable: str) -> EpilogueError:
        """One of the messages CUTLASS documents, word for word, its location after it."""
        line = self.line(node)
        return EpilogueError(message, variable=variable, line=line, where=self.where,
                             source_line=self._source_line(line), exact=True)

    def _source_line(self, line: int) -> str | None:
        return _line_text(self.source_lines, self.line_offset, line)

    def line(self, node: ast.AST) -> int:
        return node.lineno + self.line_offset

    # -- top level
    def parse_function(self, fn: ast.FunctionDef) -> ParsedEpilogue:
        a = fn.args
        if a.vararg or a.kwarg or a.kwonlyargs:
            raise self.error("the epilogue function takes plain positional parameters only "
                             "(no *args, **kwargs or keyword-only parameters)", fn)
        if a.defaults:
            raise self.error("epilogue parameters cannot have default values; pass every "
                             "operand to EpilogueArguments", fn)
        names = [p.arg for p in a.posonlyargs + a.args]
        if "accum" in names[1:]:
            operands = ", ".join(n for n in names if n != "accum")
            raise self.error(f"accum must be the first parameter of the epilogue function (the "
                             f"accumulator, A @ B, comes before the operands): write "
                             f"'def {fn.name}(accum, {operands})'", fn, "accum")
        if not names or names[0] != "accum":
            raise self.exact_error("accum must be an input to the epilogue function", fn, "accum")
        seen_params: set[str] = set()
        for p in names:
            if p in seen_params:
                raise self.error(f"parameter '{p}' is listed twice", fn, p)
            seen_params.add(p)
            self.defined[p] = fn.lineno + self.line_offset
        body = list(fn.body)
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            body = body[1:]  # docstring
        if not body or not isinstance(body[-1], ast.Return):
            raise self.error("the epilogue must end with a return of its outputs", fn)
        assignments = []
        for stmt in body[:-1]:
            pair = self.parse_pairs(stmt)
            assignments.extend(pair if pair else [self.parse_statement(stmt, names)])
        returns = self.parse_return(body[-1], names)
        if any(a.expr.kind == "pair" for a in assignments):
            self.check_gated(fn, body)
        if "D" not in [n for n, _ in returns]:
            raise self.exact_error("Output node D is not found in the epilogue function.",
                                   body[-1], "D")
        return ParsedEpilogue(fn.name, tuple(names[1:]), tuple(assignments), returns,
                              self.source_lines, self.line_offset, self.where)

    def parse_pairs(self, stmt: ast.stmt) -> list[Assignment] | None:
        """``gate, up = pairs(accum)``: two assignments of the accumulator's column pairs'
        halves (Expr "pair"), or None for any other statement."""
        if not (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call)
                and _callee_name(stmt.value.func) == PAIRS):
            return None
        call = stmt.value
        if not (len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Tuple)
                and len(stmt.targets[0].elts) == 2
                and all(isinstance(t, ast.Name) for t in stmt.targets[0].elts)):
            raise self.error("pairs(accum) gives two values: write 'gate, up = pairs(accum)' "
                             "(two plain names)", stmt)
        if len(call.args) != 1 or not isinstance(call.args[0], ast.Name) \
                or call.args[0].id != "accum" \
                or any(k.arg != PAIR_LAYOUT for k in call.keywords):
            raise self.error("pairs() takes only accum: write 'gate, up = pairs(accum)' (or "
                             "pairs(accum, layout=\"concatenated\")) and apply anything else "
                             "to gate and up after it", stmt)
        layout = ir.INTERLEAVED
        for k in call.keywords:
            if not (isinstance(k.value, ast.Constant) and k.value.value in ir.PAIR_LAYOUTS):
                raise self.error(f"pairs(accum, layout=...) takes \"interleaved\" (gate and up "
                                 f"columns alternate, the default) or \"concatenated\" (B's "
                                 f"first N columns are gate, the next N up), not "
                                 f"{ast.unparse(k.value)}", stmt, PAIR_LAYOUT)
            layout = k.value.value
        if self.paired:
            raise self.error("pairs(accum) can be taken once per epilogue", stmt)
        out = []
        for t, part in zip(stmt.targets[0].elts, ("gate", "up")):
            if t.id in self.defined:
                raise self.exact_error(f"Variable '{t.id}' cannot be defined twice.", stmt,
                                       t.id)
            self.defined[t.id] = self.line(stmt)
            out.append(Assignment(t.id, Expr("pair", self.line(stmt), op=part,
                                             params=((PAIR_LAYOUT, layout),)),
                                  self.line(stmt)))
        self.paired = True
        return out

    def check_gated(self, fn: ast.FunctionDef, body: list[ast.stmt]) -> None:
        """In a gated epilogue ``accum`` (2N columns wide) appears only in ``pairs(accum)``:
        everything else lives in the (M, N) space of the pairs."""
        for stmt in body:
            if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call) \
                    and _callee_name(stmt.value.func) == PAIRS:
                continue
            for node in ast.walk(stmt):
                if isinstance(node, ast.Name) and node.id == "accum":
                    raise self.error(
                        "accum cannot be used in a gated epilogue except as 'gate, up = "
                        "pairs(accum)': its columns come in pairs (2N wide) while the "
                        "epilogue's values are N wide; use gate and up", node, "accum")

    def parse_statement(self, stmt: ast.stmt, params: list[str]) -> Assignment:
        if isinstance(stmt, ast.Return):
            raise self.error("only one return is allowed, as the last statement", stmt)
        if isinstance(stmt, ast.AnnAssign) and stmt.value is not None \
                and isinstance(stmt.target, ast.Name):
            target, value = stmt.target, stmt.value
        elif isinstance(stmt, ast.Assign):
            if len(stmt.targets) != 1 or not isinstance(stmt.targets[0], ast.Name):
                raise self.error("assign one value to one plain name per statement "
                                 "(no tuple unpacking, chained or subscript targets)", stmt)
            target, value = stmt.targets[0], stmt.value
        elif isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
            name = stmt.target.id
            raise self.exact_error(f"Variable '{name}' cannot be defined twice.", stmt, name)
        else:
            kind = type(stmt).__name__
            raise self.error(f"unsupported statement ({kind}); an epilogue is a sequence of "
                             "single assignments followed by a return", stmt)
        name = target.id
        if name in self.defined:
            raise self.exact_error(f"Variable '{name}' cannot be defined twice.", stmt, name)
        try:
            expr = self.parse_expr(value, name)
        except RecursionError:  # what the loops over + - * / chains and signs do not cover
            raise self.error(too_deep(name), stmt, name) from None
        self.defined[name] = self.line(stmt)
        return Assignment(name, expr, self.line(stmt))

    def parse_return(self, stmt: ast.Return, params: list[str]) -> tuple[tuple[str, int], ...]:
        if stmt.value is None:
            raise self.error("the epilogue must return its outputs (at least D)", stmt)
        elts = stmt.value.elts if isinstance(stmt.value, ast.Tuple) else [stmt.value]
        out: list[tuple[str, int]] = []
        for e in elts:
            if not isinstance(e, ast.Name):
                raise self.error("return names only (assign an expression to a name first, "
                                 "then return the name)", stmt)
            if e.id not in self.defined:
                raise self.error(f"undefined name '{e.id}' in the return", stmt, e.id)
            if e.id in [n for n, _ in out]:
                raise self.error(f"output '{e.id}' is returned twice", stmt, e.id)
            if e.id in params and e.id != "accum":
                raise self.error(f"'{e.id}' is an input of the epilogue and cannot also be "
                                 "returned as an output; assign it to a new name", stmt, e.id)
            out.append((e.id, self.line(stmt)))
        return tuple(out)

    # -- expressions
    def parse_expr(self, node: ast.expr, target: str) -> Expr:
        line = self.line(node)
        if isinstance(node, ast.Name):
            if node.id not in self.defined:
                raise self.error(f"undefined name '{node.id}' (in the value of '{target}')"
                                 f"{self.undefined_hint(node.id)}", node, node.id)
            return Expr("name", line, name=node.id)
        if isinstance(node, ast.Constant):
            v = node.value
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise self.error(f"unsupported literal {v!r} in the value of '{target}'; only "
                                 "numbers are allowed", node, target)
            try:
                value = float(v)  # a float literal past the largest double is already inf
            except OverflowError:
                text = ast.get_source_segment("\n".join(self.source_lines), node) or str(v)
                raise self.error(f"the int literal {text[:12]}... ({len(text)} digits) in the "
                                 f"value of '{target}' does not fit a float (Python's float() "
                                 "of it raises OverflowError); a float literal such as 1e400 "
                                 "is inf", node, target) from None
            return Expr("const", line, value=value)
        if isinstance(node, ast.UnaryOp):
            # - - x nests one level per sign: the chain is walked by a loop, not recursion
            chain = []
            while isinstance(node, ast.UnaryOp):
                opname = UNARY_OPERATORS.get(type(node.op).__name__)
                if opname is None:
                    raise self.error(f"unsupported operator {type(node.op).__name__} in the "
                                     f"value of '{target}'", node, target)
                chain.append((opname, self.line(node)))
                node = node.operand
            inner = self.parse_expr(node, target)
            for opname, line in reversed(chain):
                if inner.kind == "const" and opname in ("neg", "identity"):
                    inner = Expr("const", line,
                                 value=-inner.value if opname == "neg" else inner.value)
                elif opname != "identity":
                    inner = Expr("call", line, op=opname, args=(inner,))
            return inner
        if isinstance(node, ast.BinOp) and not isinstance(node.op, ast.Pow):
            # a + b + c + ... nests to the left, one level per term: the left spine is walked
            # by a loop, so a sum of thousands of terms needs no recursion
            spine = []
            while isinstance(node, ast.BinOp) and not isinstance(node.op, ast.Pow):
                if type(node.op).__name__ not in BINARY_OPERATORS:
                    raise self.error(f"unsupported operator {type(node.op).__name__} in the "
                                     f"value of '{target}'; use + - * / ** & | or a "
                                     f"function",
                                     node, target)
                spine.append(node)
                node = node.left
            expr = self.parse_expr(node, target)
            for b in reversed(spine):
                expr = Expr("call", self.line(b), op=BINARY_OPERATORS[type(b.op).__name__],
                            args=(expr, self.parse_expr(b.right, target)))
            return expr
        if isinstance(node, ast.BinOp):  # x ** c
            exp = self.parse_expr(node.right, target)
            if exp.kind != "const":
                raise self.error(f"the exponent of ** must be a numeric literal (in the "
                                 f"value of '{target}')", node, target)
            base = self.parse_expr(node.left, target)
            return Expr("call", line, op="pow", args=(base,), params=(("exponent", exp.value),))
        if isinstance(node, ast.Compare):
            if len(node.ops) != 1:
                raise self.error(f"chained comparisons are not supported (in the value of "
                                 f"'{target}'); compare two values at a time", node, target)
            opname = COMPARE_OPERATORS.get(type(node.ops[0]).__name__)
            if opname is None:
                raise self.error(f"unsupported comparison {type(node.ops[0]).__name__} in the "
                                 f"value of '{target}'", node, target)
            return Expr("call", line, op=opname, args=(self.parse_expr(node.left, target),
                                                       self.parse_expr(node.comparators[0], target)))
        if isinstance(node, ast.Call):
            return self.parse_call(node, target)
        if isinstance(node, (ast.Attribute, ast.Subscript)):  # x.max(-1).values
            try:
                call = spellings.values_of(node, lambda name: name in self.defined)
            except spellings.SpellingError as exc:
                raise self.error(f"{exc} (in the value of '{target}')", node, target) from None
            if call is not None:
                return self.parse_call(call, target)
        raise self.error(f"unsupported syntax ({type(node).__name__}) in the value of "
                         f"'{target}'", node, target)

    def undefined_hint(self, name: str) -> str:
        """What to do about an undefined name: call a function, fix a misspelt variable, or
        pass what the epilogue cannot see (evtfuse reads its source only: no globals)."""
        if name in CALLABLE or name in _INDEX_FUNCTIONS:
            return f"; {name} is a function: call it ({name}(x))"
        close = difflib.get_close_matches(name, list(self.defined), n=1)
        if close:
            return f"; did you mean {close[0]}?"
        if self.from_function:
            return (f"; evtfuse reads only the epilogue function's own source, not the "
                    f"names of its module or of an enclosing function (a global constant is "
                    f"not seen): make {name} a parameter and pass its value to gemm or "
                    f"EpilogueArguments (a Python number is a runtime scalar), or write the "
                    f"literal")
        return (f"; evtfuse reads only the epilogue's own text: make {name} a parameter "
                f"and pass its value, or write the literal")

    def parse_call(self, node: ast.Call, target: str) -> Expr:
        written = ast.unparse(node)  # the call as written, for messages about its dims
        try:  # torch's spellings (methods, keywords) as evtfuse's
            spelled = spellings.rewrite(node, lambda name: name in self.defined)
        except spellings.SpellingError as exc:
            raise self.error(f"{exc} (in the value of '{target}')", node, target) from None
        if not isinstance(spelled, ast.Call):  # torch.mul(a, b) is a * b
            return self.parse_expr(spelled, target)
        node = spelled
        line = self.line(node)
        fname = _callee_name(node.func)
        if fname is None:
            raise self.error(f"unsupported call in the value of '{target}': call a recognised "
                             "function by name (relu, gelu, ...)", node, target)
        if fname == PAIRS:
            raise self.error(f"pairs(accum) gives two values and must be the whole value of "
                             f"a statement 'gate, up = pairs(accum)' (in the value of "
                             f"'{target}')", node, target)
        if fname in _INDEX_FUNCTIONS:
            if node.args or node.keywords:
                raise self.error(f"{fname}() takes no arguments", node, target)
            return Expr("index", line, op=_INDEX_FUNCTIONS[fname])
        if fname in _PY_MINMAX and len(node.args) == 2:
            fname = _PY_MINMAX[fname]
        row = CALLABLE.get(fname)
        if row is None:
            known = sorted(list(CALLABLE) + list(_INDEX_FUNCTIONS))
            close = difflib.get_close_matches(fname, sorted(set(known) | spellings.NAMES), n=1)
            mean = f"did you mean {close[0]}? " if close else ""
            raise self.error(f"unknown function '{fname}' in the value of '{target}'; {mean}"
                             f"recognised functions: {', '.join(known)} (and torch's "
                             f"spellings of docs/ops.md)", node, fname)
        if any(isinstance(a, ast.Starred) for a in node.args):
            raise self.error(f"*args is not supported in a call of {fname}", node, target)
        axes = None
        if row.category in (Category.REDUCE, Category.ROWWISE):  # torch's dim and keepdim
            given = {k.arg: k.value for k in node.keywords
                     if k.arg in (axes_.DIM, axes_.KEEPDIM)}
            if given:
                try:
                    axes = axes_.parse(given.get(axes_.DIM), given.get(axes_.KEEPDIM),
                                       written, single=row.category is Category.ROWWISE)
                except axes_.AxesError as exc:
                    raise self.error(f"{exc} (in the value of '{target}')", node,
                                     target) from None
                node = ast.copy_location(ast.Call(node.func, node.args, [
                    k for k in node.keywords if k.arg not in given]), node)
        pnames = [p for p, _ in row.params]
        params: dict[str, ParamValue] = row.defaults
        args = list(node.args)
        tensors, extra = args[: row.arity], args[row.arity:]
        if len(tensors) < row.arity or len(extra) > len(pnames):
            want = row.arity + len(pnames)
            span = f"{row.arity}" if not pnames else f"{row.arity} to {want}"
            raise self.error(f"{fname}() takes {span} positional argument(s), got {len(args)} "
                             f"(in the value of '{target}')", node, target)
        for pname, a in zip(pnames, extra):
            params[pname] = self.param(row, pname, a, target)
        for kw in node.keywords:
            if kw.arg is None or kw.arg not in pnames:
                raise self.error(f"{fname}() got an unexpected keyword argument '{kw.arg}'",
                                 node, target)
            params[kw.arg] = self.param(row, kw.arg, kw.value, target)
        for pname in row.required:
            if pname not in params:
                raise self.error(row.param_error(pname), node, target)
        parsed = tuple(self.parse_expr(a, target) for a in tensors)
        return Expr("call", line, op=fname, args=parsed,
                    params=tuple((p, params[p]) for p in pnames), axes=axes)

    def param(self, row: OpDef, pname: str, node: ast.expr, target: str) -> ParamValue:
        """A parameter's value: a numeric literal, or for a Choice one of its names as a
        string (``"fp16"``) or as a torch dtype attribute (``torch.float16``)."""
        choice = row.choice(pname)
        if choice is None:
            return self.literal(node, f"{row.name}() parameter '{pname}'", target)
        spelling, got = None, ast.unparse(node)
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            spelling, got = node.value, f'"{node.value}"'
        elif isinstance(node, ast.Attribute) and isinstance(getattr(torch, node.attr, None),
                                                            torch.dtype):
            spelling = node.attr  # the name only: nothing of the user's is evaluated
        name = None if spelling is None else choice.canonical(spelling)
        if name is None:
            raise self.error(row.param_error(pname, got), node, target)
        return name

    def literal(self, node: ast.expr, what: str, target: str) -> float:
        e = self.parse_expr(node, target)
        if e.kind != "const":
            raise self.error(f"{what} must be a numeric literal", node, target)
        return e.value


def _callee_name(func: ast.expr) -> str | None:
    """``relu`` / ``ops.relu`` / ``evtfuse.ops.relu`` -> ``relu``."""
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        base = func.value
        while isinstance(base, ast.Attribute):
            base = base.value
        if isinstance(base, ast.Name):
            return func.attr
    return None


def too_deep(name: str) -> str:
    return (f"the value of '{name}' is nested too deep to parse (Python's recursion limit); "
            f"split it into several assignments (t = ...; {name} = t + ...)")


_TARGET = re.compile(r"\s*([A-Za-z_]\w*)\s*(?::[^=]*)?=(?!=)")


def _too_deep_for_python(source: str, offset: int, where: str) -> EpilogueError:
    """The error for a source Python's own parser cannot build (RecursionError, or the
    MemoryError its parser raises for a chain of thousands of signs, ``- - - ... x``): the
    first logical line that fails alone, by its line and the name it assigns."""
    lines = source.splitlines(keepends=True)
    start = None
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if start is None and tok.type not in _NOT_CODE:
                start = tok.start[0]
            if tok.type == tokenize.NEWLINE and start is not None:
                text = "".join(lines[start - 1: tok.end[0]])
                try:
                    ast.parse(text.lstrip())
                except (RecursionError, MemoryError):
                    m = _TARGET.match(text)
                    name = m.group(1) if m else None
                    message = too_deep(name) if name else (
                        "the epilogue is nested too deep to parse (Python's recursion limit); "
                        "split long expressions into several assignments")
                    return EpilogueError(message, variable=name, line=start + offset,
                                         where=where, source_line=lines[start - 1])
                except SyntaxError:
                    pass  # a line of the function alone (its def, its return)
                start = None
    except (tokenize.TokenError, SyntaxError):
        pass
    return EpilogueError("the epilogue is nested too deep to parse (Python's recursion limit); "
                         "split long expressions into several assignments")


_NOT_CODE = (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT,
             tokenize.ENCODING)


def parse_module(source: str, offset: int = 0, where: str = "the epilogue string") -> ast.Module:
    """``ast.parse(source)``, every way it can fail an ``EpilogueError``: a syntax error at
    its line; a source too deep for Python's own parser (RecursionError, or MemoryError
    for thousands of nested signs) at the line that is; a character that is no text (a
    lone surrogate, as Python decodes a byte that is not UTF-8 from a command line) or a
    null byte. ``offset`` is added to line numbers, ``where`` names the source. The
    command line parses its ``--epilogue-file`` through it too."""
    try:
        return ast.parse(source)
    except SyntaxError as exc:  # a null byte's has no line
        line = exc.lineno + offset if exc.lineno else None
        raise EpilogueError(f"the epilogue is not valid Python: {exc.msg}", line=line,
                            where=where, source_line=exc.text) from None
    except (RecursionError, MemoryError):  # Python's own parser: a sum of ~5,000 terms
        raise _too_deep_for_python(source, offset, where) from None
    except UnicodeEncodeError as exc:  # '\udcff': a byte that was not UTF-8
        start = source.rfind("\n", 0, exc.start) + 1
        end = source.find("\n", exc.start)
        line = source.count("\n", 0, exc.start) + 1
        raise EpilogueError(f"the epilogue is not valid text: {_no_text(source[exc.start])} "
                            "is not UTF-8 text", line=line + offset, where=where,
                            source_line=_escaped(source[start: end if end >= 0 else None])
                            ) from None
    except ValueError as exc:  # "source code string cannot contain null bytes" (older Pythons)
        raise EpilogueError(f"the epilogue is not valid Python: {exc}", where=where) from None


def _no_text(ch: str) -> str:
    """A lone surrogate as what it stands for: the byte Python decoded it from (a byte that
    was not UTF-8, read with ``surrogateescape`` as ``sys.argv`` is), or the code point."""
    if "\udc80" <= ch <= "\udcff":
        return f"the byte 0x{ord(ch) - 0xDC00:02x}"
    return f"the character U+{ord(ch):04X}"


def _escaped(text: str) -> str:
    """``text`` printable whatever it holds: lone surrogates as ``\\xff`` / ``\\udc00``."""
    return "".join(ch if not "\ud800" <= ch <= "\udfff" else
                   f"\\x{ord(ch) - 0xDC00:02x}" if "\udc80" <= ch <= "\udcff" else
                   f"\\u{ord(ch):04x}" for ch in text)


EpilogueSource = Union[str, Callable[..., Any]]


@dataclass(frozen=True)
class EpilogueText:
    """An epilogue as data: its source text, the line of the user's file its first line
    is (0 for a string), and what error messages call it. What crosses the boundary of the
    PyTorch operator (``runtime.torch_op``) instead of the function."""

    source: str
    line_offset: int
    where: str
    from_function: bool


_LAMBDA = ("the epilogue is a lambda: evtfuse reads an epilogue's source (it never calls it) "
           "and does not read lambdas, whose source is the whole line around them and which "
           "cannot name their outputs; write a function, def epi(accum, C): D = accum + C; "
           "return D, and pass it (or its text)")


def epilogue_text(epilogue: EpilogueSource) -> EpilogueText:
    """The source of an epilogue given as a function or as source text (read, never run)."""
    if isinstance(epilogue, EpilogueText):
        return epilogue
    if isinstance(epilogue, str):
        return EpilogueText(epilogue, 0, "the epilogue string", False)
    if callable(epilogue):
        if getattr(epilogue, "__name__", None) == "<lambda>":
            raise EpilogueError(_LAMBDA)
        try:
            # the source and its first line come together: for a decorated function
            # (functools.wraps) __code__ is the wrapper's, while the source is the original's
            raw_lines, first_line = inspect.getsourcelines(epilogue)
        except (OSError, TypeError) as exc:
            raise EpilogueError(f"cannot read the source of {epilogue!r} ({exc}); pass the "
                                "epilogue as a string instead") from None
        return EpilogueText(textwrap.dedent("".join(raw_lines)), max(first_line - 1, 0),
                            getattr(epilogue, "__name__", "the epilogue"), True)
    raise EpilogueError(f"the epilogue must be a function or a source string, not "
                        f"{type(epilogue).__name__}")


def parse_epilogue(epilogue: EpilogueSource | EpilogueText | ParsedEpilogue) -> ParsedEpilogue:
    """Parse and check an epilogue given as a function, as source text or as an
    ``EpilogueText`` (an already parsed one is returned as it is)."""
    if isinstance(epilogue, ParsedEpilogue):
        return epilogue
    text = epilogue_text(epilogue)
    source, offset, where = text.source, text.line_offset, text.where
    module = parse_module(source, offset, where)
    fns = [s for s in module.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if not fns and any(isinstance(n, ast.Lambda) for n in ast.walk(module)):
        raise EpilogueError(_LAMBDA)
    if len(fns) != 1 or isinstance(fns[0], ast.AsyncFunctionDef):
        raise EpilogueError("the epilogue must be exactly one function definition "
                            "(def epi(accum, ...): ...; return D)")
    others = [s for s in module.body if s not in fns]
    if others:
        line = others[0].lineno + offset
        raise EpilogueError("the epilogue source must hold only the function definition; "
                            "statements outside it are not allowed", line=line, where=where,
                            source_line=source.splitlines()[others[0].lineno - 1])
    fn = fns[0]
    if fn.decorator_list:
        fn = ast.FunctionDef(fn.name, fn.args, fn.body, [], fn.returns, fn.type_comment,
                             lineno=fn.lineno, col_offset=fn.col_offset)
    parser = _Parser(source, offset, fn.name if text.from_function else where,
                     text.from_function)
    return parser.parse_function(fn)


ONE_LINE_LIMIT = 160  # characters of an epilogue's one-line form (a repr's)


def one_line(epilogue: EpilogueSource | EpilogueText, limit: int = ONE_LINE_LIMIT) -> str:
    """The epilogue as one line of source, ``def epi(accum, bias): D = relu(accum + bias);
    return D`` (docstring, comments and decorators dropped), cut to ``limit`` characters
    with ``...`` when longer: what a module's repr shows. Read, never run."""
    text = epilogue_text(epilogue)
    module = parse_module(text.source, text.line_offset, text.where)
    fn = next(s for s in module.body if isinstance(s, ast.FunctionDef))
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]  # the docstring

    def statement(stmt: ast.stmt) -> str:
        try:
            return ast.unparse(stmt)
        except RecursionError:  # a sum of thousands of terms: its text, on one line
            return " ".join((ast.get_source_segment(text.source, stmt) or "...").split())

    line = f"def {fn.name}({', '.join(a.arg for a in fn.args.args)}): " + \
        "; ".join(statement(s) for s in body)
    return line if len(line) <= limit else line[:limit - 3].rstrip() + "..."


# ----------------------------------------------------------------------------- binding

_LOADABLE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8,
                    torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool)
_STORABLE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64) + FP8_DTYPES


def _fmt_shape(shape) -> str:
    return "(" + ", ".join(str(int(s)) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def _dims(name: str, shape: tuple[int, ...], problem: tuple[int, int, int], what: str,
          where: str) -> tuple[bool, bool, bool]:
    """Right-align ``shape`` with (L, M, N); which of l, m, n the tensor spans."""
    L, M, N = problem
    if len(shape) > 3:
        raise EpilogueError(f"{what} '{name}' has shape {_fmt_shape(shape)} with "
                            f"{len(shape)} dimensions; at most 3 (L, M, N) are allowed{where}",
                            variable=name)
    padded = (1,) * (3 - len(shape)) + tuple(int(s) for s in shape)
    spans = []
    for size, full, dim in zip(padded, (L, M, N), "LMN"):
        if size == full:
            spans.append(True)
        elif size == 1:
            spans.append(False)
        else:
            raise EpilogueError(
                f"{what} '{name}' has shape {_fmt_shape(shape)}, which does not broadcast to "
                f"the output (L, M, N) = ({L}, {M}, {N}): its {dim} dimension is {size}, "
                f"not 1 or {full}{where}", variable=name)
    return spans[0] and L > 1, spans[1], spans[2]


def classify_operand(name: str, value: Any, problem: tuple[int, int, int]) -> OperandSpec:
    """The operand's kind from its Python type and shape (docs/architecture.md's table)."""
    if isinstance(value, bool) or value is None:
        raise not_an_operand(name, value)
    if isinstance(value, numbers.Real):
        scalar_value(name, value)  # one float() can hold (10**400 is an error naming it)
        return OperandSpec(name, OperandKind.RUNTIME_SCALAR, None)
    if not isinstance(value, torch.Tensor):
        raise not_an_operand(name, value)
    if value.dtype not in _LOADABLE_DTYPES + FP8_DTYPES:
        raise EpilogueError(f"Argument {name} has dtype {value.dtype}, which an epilogue cannot "
                            "load; use a floating-point or integer tensor", variable=name)
    if value.dim() == 0:
        return OperandSpec(name, OperandKind.DEVICE_SCALAR, value.dtype)
    batched, has_m, has_n = _dims(name, tuple(value.shape), problem, "Argument", "")
    if has_m and has_n:
        kind = OperandKind.FULL
    elif has_m:
        kind = OperandKind.PER_ROW
    elif has_n:
        kind = OperandKind.PER_COL
    else:
        kind = OperandKind.DEVICE_SCALAR
    return OperandSpec(name, kind, value.dtype, batched)


def classify_output(name: str, value: Any, problem: tuple[int, int, int],
                    reduction: bool = False) -> tuple[OutputKind, torch.dtype | None, bool]:
    """How an output is stored. For the result of a reduction, a dimension of size 1 is
    read as reduced even when the problem's M or N is 1 (reducing over one element is
    the same), so that an (M, 1) output stays per-row when N = 1, say."""
    if value is None:
        return OutputKind.NONE, None, False
    if not isinstance(value, torch.Tensor):
        raise EpilogueError(f"Output {name} must be a torch.Tensor (or None to compute it "
                            f"without storing it), not {type(value).__name__}", variable=name)
    if value.dtype not in _STORABLE_DTYPES + (torch.int8, torch.int32, torch.uint8):
        raise EpilogueError(f"Output {name} has dtype {value.dtype}, which an epilogue cannot "
                            "store", variable=name)
    if value.dim() == 0:
        return OutputKind.SCALAR, value.dtype, False
    batched, has_m, has_n = _dims(name, tuple(value.shape), problem, "Output", "")
    if reduction:
        padded = (1,) * (3 - value.dim()) + tuple(value.shape)
        has_m = has_m and padded[1] != 1  # M = 0: an empty (0, 1) result, not a scalar
        has_n = has_n and padded[2] != 1
    kind = {(True, True): OutputKind.FULL, (True, False): OutputKind.ROW,
            (False, True): OutputKind.COL, (False, False): OutputKind.SCALAR}[(has_m, has_n)]
    return kind, value.dtype, batched


def check_names(parsed: ParsedEpilogue, given: Mapping[str, Any]) -> None:
    """Every parameter and output provided (the documented message), nothing unexpected."""
    check_given(parsed.name, parsed.params, parsed.outputs, given)


def check_given(fn_name: str, params: tuple[str, ...], outputs: tuple[str, ...],
                given: Mapping[str, Any]) -> None:
    """``check_names`` from the epilogue's names alone (what ``gemm`` knows of it as
    constants under torch.compile)."""
    for p in params:
        if p not in given:
            raise EpilogueError(f"Argument {p} is not provided in the kwargs of the "
                                "EpilogueArguments constructor", variable=p)
    for o in outputs:
        if o not in given:
            raise EpilogueError(f"Argument {o} is not provided in the kwargs of the "
                                "EpilogueArguments constructor", variable=o)
    for k in given:
        if k in params or k in outputs:
            continue
        if k == "accum":
            raise EpilogueError(
                f"Argument accum is given a tensor, but {fn_name} does not return accum: "
                "the accumulator is stored only as a returned output (return ..., accum)",
                variable=k)
        raise EpilogueError(
            f"Argument {k} is not a parameter or an output of the epilogue function "
            f"{fn_name}({', '.join(['accum', *params])}) -> {', '.join(outputs)}", variable=k)


def bind(parsed: ParsedEpilogue, given: Mapping[str, Any], problem: tuple[int, int, int],
         grouped: bool = False, rank: int | None = None) -> ir.Dag:
    """Build the DAG for operand values ``given`` and output shape (L, M, N) ``problem``.

    ``grouped``: a grouped GEMM (``evtfuse.grouped_gemm``), its G groups in the L place and
    its T rows in the M place, each row in one group: full and per-row tensors are (T, N)
    and (T, 1) (a row's group is its batch, so a full output of a per-group value is
    (T, N)), per-group ones (G, 1, N) and (G, 1, 1) (``operand_specs``).
    ``rank``: 2 or 3, that of A @ B as torch has it, which torch's dims in the epilogue
    count (``x.sum(0)``: the columns of an (M, N) output, the batches of an (L, M, N) one);
    None: read off the full outputs given (``_output_rank``)."""
    check_names(parsed, given)
    specs = operand_specs(parsed.params, given, problem, grouped)
    env: dict[str, ir.Node] = {}
    acc: ir.Node | None = None

    def accum() -> ir.Node:
        nonlocal acc
        if acc is None:
            acc = ir.accum_node()
        return acc

    loads: dict[str, ir.Node] = {}
    parts: dict[str, ir.Node] = {}  # pairs(accum): "gate" / "up"

    def lookup(name: str, line: int) -> ir.Node:
        if name in env:
            return env[name]
        if name == "accum":
            return accum()
        spec = next(s for s in specs if s.name == name)
        if name not in loads:
            loads[name] = ir.load_node(spec, line)
        return loads[name]

    def error(message: str, line: int, variable: str | None) -> EpilogueError:
        return EpilogueError(message, variable=variable, line=line, where=parsed.where,
                             source_line=parsed.text_of(line))

    def leaf(e: Expr) -> ir.Node:
        if e.kind == "name":
            node = lookup(e.name, e.line)
            if node.conditional_store:
                raise error(f"'{e.name}' is a conditional store (store_where); it can only be "
                            "returned, not used in further computation (compute with the "
                            "value it stores instead)", e.line, e.name)
            return node
        if e.kind == "const":
            return ir.const_node(e.value, e.line)
        if e.kind == "pair":
            if e.op not in parts:
                parts[e.op] = ir.accum_node(e.line, e.op)
            return parts[e.op]
        return ir.index_node(e.op, e.line)

    def build(e: Expr, target: str) -> ir.Node:
        # inputs before users with a stack of their own: an expression thousands of terms
        # deep (a long sum) needs no recursion
        built: dict[int, ir.Node] = {}
        stack = [(e, False)]
        while stack:
            x, ready = stack.pop()
            if x.kind != "call":
                built[id(x)] = leaf(x)
            elif ready:
                ins = [built[id(a)] for a in x.args]
                if OPS[x.op].category is Category.ROWWISE:
                    built[id(x)] = rowwise(x, ins[0], target)
                elif OPS[x.op].category is Category.REDUCE:  # inside an expression
                    built[id(x)] = nested_reduction(x, ins[0], target)
                else:
                    built[id(x)] = ir.compute_node(x.op, ins, x.params, line=x.line)
                    if any(id(i) in late for i in ins):
                        late[id(built[id(x)])] = built[id(x)]
            else:
                stack.append((x, True))
                stack.extend((a, False) for a in reversed(x.args))
        return built[id(e)]

    # the ids of reductions and of every value computed from one (a reduction feeding
    # computation: docs/performance.md, "Reductions feeding computation")
    late: dict[int, ir.Node] = {}  # (kept alive: an id is never reused while held)

    def lowered(row, ins: tuple, line: int, var: str | None = None) -> ir.Node:
        """A row's ``lowered`` rule over ``ins`` (d.x, d.y, ...), as compute nodes."""
        node = row.lowered[1](Diff(_NodeBuilder(line), ins, None)).v
        if var is not None and node.kind is ir.NodeKind.COMPUTE:
            node = ir.compute_node(node.op, node.inputs, node.params, var=var, line=line)
        def mark(n: ir.Node) -> bool:  # the rule's new nodes computed from the reduction
            if id(n) in late:
                return True
            hit = n.kind is ir.NodeKind.COMPUTE and any([mark(i) for i in n.inputs])
            if hit:
                late[id(n)] = n
            return hit
        mark(node)
        return node

    def rowwise(x: Expr, src: ir.Node, target: str) -> ir.Node:
        """``softmax(src)`` and its kind: the row's reductions (over N, per batch), then the
        row's rule over src and them."""
        row = OPS[x.op]
        if id(src) in late:
            raise error(f"{x.op}(...) of a value computed from a reduction: a reduction cannot "
                        "reduce a value computed from another (one level of reduction "
                        "feeding computation)", x.line, None)
        if x.axes is not None:  # torch's dim: only the row's (the last dim) is evtfuse's
            reading = read_axes(x, target)
            if reading.space is not ir.Space.ROW or not reading.keep_batch:
                full = "(L, M, N)" if rank == 3 else "(M, N)"
                raise error(f"{x.axes.text}: evtfuse's {x.op} is over each row (dim=-1, the "
                            f"last dim); dim={x.axes.dims[0]} is another dim of the {full} "
                            f"output (in the value of '{target}')", x.line, target)
        shifted = any(OPS[op].shifted for op in row.lowered[0])  # its max is a shift
        reds = tuple(ir.reduce_node(op, src, ir.Space.ROW, True, line=x.line,
                                    params=(ir.SHIFT,) if shifted and op == "max" else ())
                     for op in row.lowered[0])
        late.update((id(r), r) for r in reds)
        return lowered(row, (src, *reds), x.line)

    rank = rank or _output_rank(parsed, given, problem, grouped)
    used = _used_names(parsed)

    def read_axes(x: Expr, target: str | None) -> axes_.Reading:
        """What ``x``'s torch dims mean for this output (``axes.read``), or the error."""
        try:
            return axes_.read(x.axes, rank, problem[0])
        except axes_.AxesError as exc:
            where = f" (in the value of '{target}')" if target else ""
            raise error(f"{exc}{where}", x.line, target) from None

    def broadcast_check(x: Expr, reading: axes_.Reading, target: str) -> None:
        """A reduction without keepdim whose torch shape would broadcast along other axes
        than its own, used in computation: refused (torch would compute something else)."""
        if not reading.broadcasts:
            full = "(L, M, N)" if rank == 3 else "(M, N)"
            raise error(f"{x.axes.text} without keepdim=True has torch's shape "
                        f"{reading.result_shape}, which torch aligns from the right against "
                        f"the {full} output, along other axes than the ones it keeps (in the "
                        f"value of '{target}'); write keepdim=True", x.line, target)

    def reduction(op: str, src: ir.Node, space: ir.Space, keep: bool, var: str | None,
                  line: int) -> ir.Node:
        """The reduce node (and, for mean, the division by the count after it)."""
        row = OPS[op]
        red_op = row.lowered[0][0] if row.lowered else op
        node = ir.reduce_node(red_op, src, space, keep, var=None if row.lowered else var,
                              line=line)
        late[id(node)] = node
        if row.lowered:  # mean: the sum, then a division by the count after it
            count = _reduced_count(space, node.batched, problem)
            node = lowered(row, (node, ir.const_node(float(count), line)), line, var)
        return node

    def nested_reduction(x: Expr, src: ir.Node, target: str) -> ir.Node:
        """A reduction inside an expression (``D = accum * rsqrt(mean(accum * accum) +
        eps)``): as if assigned to a name of its own and used (the same DAG), per row unless
        torch's dims say otherwise; it holds no user's name (``Node.var`` None)."""
        if id(src) in late:
            raise error(f"{x.op}(...) in the value of '{target}' reduces a value computed from "
                        "another reduction; a reduction's result can feed computation, but "
                        "not a second reduction", x.line, target)
        space, keep = ir.Space.ROW, True
        if x.axes is not None:
            reading = read_axes(x, target)
            broadcast_check(x, reading, target)
            space, keep = reading.space, reading.keep_batch
        return reduction(x.op, src, space, keep, None, x.line)

    def check_axes_output(x: Expr, reading: axes_.Reading, name: str, kind: OutputKind,
                          batched: bool) -> None:
        """A returned reduction with torch's dims: its output's shape must hold what they
        reduce (the axes, and with L > 1 whether the batches stay apart)."""
        batches_differ = problem[0] > 1 and not grouped and batched != reading.keep_batch
        if kind.space is reading.space and not batches_differ:
            return
        shape = _fmt_shape(tuple(given[name].shape))
        held = kind.value + (("" if batched else " over the batches too")
                             if problem[0] > 1 and not grouped else "")
        raise error(f"{x.axes.text} reduces "
                    f"{axes_.describe(reading.space, reading.keep_batch, rank)}, but output "
                    f"{name} has shape {shape}, which holds a {held}: give {name} the shape "
                    f"{axes_.shape_for(reading.space, reading.keep_batch, rank)}",
                    x.line, name)

    pending: dict[str, tuple[str, ir.Node, int]] = {}
    reduced: dict[str, ir.Node] = {}  # reductions by target (the output's node, when returned)
    for a in parsed.assignments:
        if a.expr.kind == "call" and OPS[a.expr.op].category is Category.REDUCE:
            x = a.expr
            op = x.op
            src = build(x.args[0], a.target)
            if id(src) in late:
                raise error(f"'{a.target}' = {op}(...) reduces a value computed from another "
                            "reduction; a reduction's result can feed computation, but not a "
                            "second reduction", a.line, a.target)
            reading = None if x.axes is None else read_axes(x, a.target)
            if a.target in parsed.outputs:  # the output's shape picks the axes
                kind, _, keep = classify_output(a.target, given[a.target], problem, reduction=True)
                if kind is OutputKind.FULL:
                    raise error(f"'{a.target}' = {op}(...) is a reduction, but output {a.target} "
                                f"has the full shape {_fmt_shape(tuple(given[a.target].shape))}; "
                                "give it the shape of what remains: (M, 1) per row, (N,) per "
                                "column, (1,) for the whole output (with a leading L to keep "
                                "batches apart)", a.line, a.target)
                if kind is OutputKind.NONE:
                    raise error(f"'{a.target}' = {op}(...) is a reduction; its output cannot be "
                                "None", a.line, a.target)
                space = kind.space
                if reading is not None:
                    check_axes_output(x, reading, a.target, kind, keep)
            elif reading is not None:
                space, keep = reading.space, reading.keep_batch
            else:  # used, not returned: per row (over N), batches apart
                space, keep = ir.Space.ROW, True
            if reading is not None and (a.target in used or a.target not in parsed.outputs):
                broadcast_check(x, reading, a.target)
            node = reduction(op, src, space, keep, a.target, a.line)
            pending[a.target] = (op, src, a.line)
            reduced[a.target] = node
            env[a.target] = node
            continue
        if _contains(a.expr, Category.STORE, below_top=True):
            raise error(f"store_where(...) must be the whole value of an assignment (as in "
                        f"'{a.target} = store_where(x > 0.0, x)'), not part of an expression",
                        a.line, a.target)
        node = build(a.expr, a.target)
        if node.kind in (ir.NodeKind.COMPUTE,) and node.var is None:
            was = id(node)
            node = ir.Node(node.kind, node.inputs, node.op, node.params, node.value, node.operand,
                           node.space, node.batched, node.dtype, a.target, a.line)
            if was in late:
                late[id(node)] = node
        env[a.target] = node

    outputs: list[Output] = []
    for name, line in parsed.returns:
        kind, dtype, batched = classify_output(name, given[name], problem,
                                               reduction=name in pending)
        if name in pending:
            pending.pop(name)
            node = reduced[name]
        else:
            node = lookup(name, line)
            if node.conditional_store and kind is not OutputKind.FULL:
                held = "is None" if kind is OutputKind.NONE else \
                    f"has shape {_fmt_shape(tuple(given[name].shape))}"
                raise error(f"'{name}' = store_where(...) writes only where its condition holds "
                            f"and keeps the buffer's values elsewhere, so output {name} must be "
                            f"a full output buffer you give (M, N) or (L, M, N); it {held}",
                            line, name)
            if kind is OutputKind.FULL and node.batched and not batched and problem[0] > 1 \
                    and not grouped:
                raise error(f"output {name} has shape {_fmt_shape(tuple(given[name].shape))}, "
                            f"but '{name}' differs per batch (L = {problem[0]}); give it the "
                            f"shape (L, M, N)", line, name)
            if kind not in (OutputKind.FULL, OutputKind.NONE):
                fits = node.space.join(kind.space) is kind.space and (
                    batched or not node.batched or problem[0] == 1)
                if not fits:
                    shape = _fmt_shape(tuple(given[name].shape))
                    raise error(f"output {name} has shape {shape}, which holds a "
                                f"{kind.value}, but '{name}' is not computed by sum/max/min: "
                                f"give {name} the full output shape, or reduce it "
                                f"(e.g. '{name}_sum = sum({name})')", line, name)
        if grouped:
            check_grouped_output(name, node, kind, batched, given[name])
        outputs.append(Output(name, node, kind, dtype, batched))
    if grouped:
        _check_grouped_reductions(late.values(), error)
    used = {id(n) for n in ir.Dag(tuple(outputs), specs).nodes} if pending else set()
    for name, (op, _, rline) in pending.items():
        if id(reduced[name]) not in used:
            raise error(f"'{name}' = {op}(...) is a reduction whose result is never returned "
                        "or used; return it, or compute with it", rline, name)
    for a in parsed.assignments:
        if a.conditional and a.target not in parsed.outputs:
            raise error(f"'{a.target}' = store_where(...) is a conditional store whose result "
                        "is never returned; return it (a conditional store is an output)",
                        a.line, a.target)
    return ir.Dag(tuple(outputs), specs, parsed.name, parsed.gated)


_GROUPED_LAYOUTS = ("a Python number, a 0-d tensor, (G, 1, 1) per group, (N,) or (G, 1, N) per "
                    "column (per group), (T, 1) per row, (T, N) full")


def operand_specs(params: tuple[str, ...], given: Mapping[str, Any],
                  problem: tuple[int, int, int], grouped: bool = False
                  ) -> tuple[OperandSpec, ...]:
    """Each operand's spec, read off its value (``classify_operand``; a grouped GEMM's as
    ``_grouped_operands`` reads them), in parameter order."""
    specs = tuple(classify_operand(p, given[p], problem) for p in params)
    return _grouped_operands(specs, given) if grouped else specs


def _grouped_operands(specs: tuple, given: Mapping[str, Any]) -> tuple:
    """A grouped GEMM's operands, each one of ``_GROUPED_LAYOUTS``: a row belongs to one
    group, so nothing has both a group dimension and rows. Where T is 1 a per-group
    (G, 1, N) or (G, 1, 1) reads as having rows; it is per group (column or scalar)."""
    out = []
    for s in specs:
        if s.batched and s.kind in (OperandKind.FULL, OperandKind.PER_ROW) \
                and given[s.name].dim() == 3 and given[s.name].shape[1] == 1:
            s = replace(s, kind=OperandKind.PER_COL if s.kind is OperandKind.FULL
                        else OperandKind.DEVICE_SCALAR)
        out.append(s)
        if s.batched and s.kind in (OperandKind.FULL, OperandKind.PER_ROW):
            raise EpilogueError(
                f"Argument '{s.name}' has shape {_fmt_shape(tuple(given[s.name].shape))}: in a "
                f"grouped GEMM a row belongs to one group, so a tensor with rows has no group "
                f"dimension; give it (T, N) or (T, 1) (operands: {_GROUPED_LAYOUTS})",
                variable=s.name)
    return tuple(out)


def check_grouped_output(name: str, node, kind: OutputKind, batched: bool, value) -> None:
    """What a grouped GEMM stores: full (T, N) outputs, per-row (T, 1) values, and
    reductions per row (T, 1), per group (G, 1, N) and (G, 1, 1), or over every group's
    rows (N,) and (1,) (no per-group or per-column stores of a value that is not reduced)."""
    if kind is OutputKind.NONE:
        return
    shape = _fmt_shape(tuple(value.shape))
    if node.kind is ir.NodeKind.REDUCE:
        if kind is OutputKind.ROW and batched:
            raise EpilogueError(
                f"output {name} has shape {shape}: a per-row reduction ({node.op}) of a "
                f"grouped GEMM has no group dimension, since a row belongs to one group; "
                f"give it (T, 1) (per group: (G, 1, N) per column, (G, 1, 1) in all)",
                variable=name)
        return
    if kind is OutputKind.FULL and not batched:
        return
    if kind is OutputKind.ROW and not batched:
        return
    raise EpilogueError(f"output {name} has shape {shape}; a grouped GEMM stores full (T, N) "
                        f"outputs and per-row (T, 1) values only (and reductions)",
                        variable=name)


class _NodeBuilder:
    """The algebra of ``derivative.Diff`` over DAG nodes (an op table row's ``lowered``
    rule builds its nodes with it)."""

    def __init__(self, line: int):
        self.line = line

    def const(self, value: float) -> ir.Node:
        return ir.const_node(value, self.line)

    def call(self, op: str, vals: list, params: dict) -> ir.Node:
        return ir.compute_node(op, vals, tuple(params.items()), line=self.line)


def _check_grouped_reductions(late, error) -> None:
    """What a grouped GEMM refuses of its reductions (``late``: the reductions and the
    values computed from them): a reduction feeding computation (no two-pass plan for
    grouped problems), and shifted_sumexp (the grouped reference evaluator combines the
    groups' results, which shifted_sumexp's are not without their max)."""
    reductions = [n for n in late if n.kind is ir.NodeKind.REDUCE]
    if len(reductions) < len(late):
        first = reductions[0]
        raise error(f"{first.op}(...) feeds computation (softmax, log_softmax, mean or a "
                    "reduction's result used); grouped GEMMs do not run reductions that feed "
                    "computation yet (docs/grouped.md)", first.line, first.var)
    shifted = [n for n in reductions if n.op == "shifted_sumexp"]
    if shifted:
        raise error("shifted_sumexp(...) in a grouped GEMM: grouped kernels do not compute it "
                    "yet; logsumexp(x) - max(x) gives the log of it", shifted[0].line,
                    shifted[0].var)


def _output_rank(parsed: ParsedEpilogue, given: Mapping[str, Any],
                 problem: tuple[int, int, int], grouped: bool) -> int | None:
    """The rank torch gives A @ B here, as torch's dims count it: 3 with batches (L > 1), 2
    for a grouped GEMM ((T, N) rows of every group), else that of the full output tensors
    given (gemm allocates them so); None where no full output says."""
    if grouped:
        return 2
    if problem[0] > 1:
        return 3
    ranks = {v.dim() for n in parsed.outputs
             if isinstance(v := given.get(n), torch.Tensor) and v.dim() in (2, 3)
             and tuple(v.shape[-2:]) == tuple(problem[1:])}
    return ranks.pop() if len(ranks) == 1 else None


def _used_names(parsed: ParsedEpilogue) -> set[str]:
    """The names the assignments' values read."""
    names: set[str] = set()
    for a in parsed.assignments:
        stack = [a.expr]
        while stack:
            x = stack.pop()
            if x.kind == "name":
                names.add(x.name)
            stack.extend(x.args)
    return names


def _reduced_count(space: ir.Space, batched: bool, problem: tuple[int, int, int]) -> int:
    """How many elements a reduction to ``space`` takes (over L too unless ``batched``)."""
    L, M, N = problem
    count = 1 if batched else L
    if space in (ir.Space.COL, ir.Space.SCALAR):
        count *= M
    if space in (ir.Space.ROW, ir.Space.SCALAR):
        count *= N
    return count


def _calls(e: Expr, test: Callable[[OpDef], bool], below_top: bool = False) -> bool:
    """Whether ``e`` holds a call of a row that passes ``test`` (only below its top call,
    where ``below_top``)."""
    stack = list(e.args) if below_top and e.kind == "call" else [e]
    while stack:
        x = stack.pop()
        if x.kind == "call" and test(OPS[x.op]):
            return True
        stack.extend(x.args)
    return False


def _contains(e: Expr, category: Category, below_top: bool = False) -> bool:
    """Whether ``e`` holds a call of a ``category`` row (only below its top call, where
    ``below_top``)."""
    return _calls(e, lambda row: row.category is category, below_top)


def problem_shape_of(value: Any) -> tuple[int, int, int] | None:
    """(L, M, N) read off a full output tensor, or None when it cannot say."""
    if isinstance(value, torch.Tensor) and value.dim() in (2, 3):
        if value.dim() == 2:
            return 1, int(value.shape[0]), int(value.shape[1])
        return tuple(int(s) for s in value.shape)  # type: ignore[return-value]
    return None


__all__ = ["parse_epilogue", "bind", "ParsedEpilogue", "Expr", "classify_operand",
           "classify_output", "check_names", "check_given", "check_grouped_output",
           "operand_specs", "problem_shape_of", "Space"]
