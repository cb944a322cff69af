"""The frontend's syntax: what ``parse_epilogue`` yields and what binding reads of it.

Layer: frontend (core: ``ast``, ``axes`` and the op table only). ``Expr`` (a small
binding-independent expression tree), ``Assignment`` and ``ParsedEpilogue`` (a checked
epilogue, before any operand's value is known), the names the parser gives a meaning of
its own (``pairs``, ``row_index``, ``max`` of two values), and the questions asked of an
expression tree (``_calls``, ``_contains``).
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from typing import Callable

from .. import axes as axes_, ir
from ..optable import OPS, Category, OpDef, ParamValue


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
class ParsedSyntax:
    """A checked epilogue as the parser reads it: its name, parameters, assignments and
    returns, and the user's source lines for messages. ``parsed.ParsedEpilogue`` adds
    ``bind`` (``binding``, which reads this module, sits between them)."""

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



def _line_text(source_lines: tuple[str, ...], line_offset: int, line: int) -> str | None:
    """The user's source line ``line`` (numbered as in their file), if the source has it."""
    k = line - line_offset - 1
    return source_lines[k] if 0 <= k < len(source_lines) else None


_INDEX_FUNCTIONS = {"row_index": "row", "col_index": "col"}
PAIRS = "pairs"  # gate, up = pairs(accum): the accumulator's columns 2j and 2j + 1
PAIR_LAYOUT = "layout"  # pairs(accum, layout="concatenated"): columns j and N + j
_PY_MINMAX = {"max": "maximum", "min": "minimum"}  # max(a, b) is elementwise


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
