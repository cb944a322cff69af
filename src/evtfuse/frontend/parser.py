"""The frontend's parser: an epilogue's ``ast`` walked into a ``ParsedEpilogue``.

Layer: frontend (core: ``ast``, ``spellings``, ``axes`` and the op table; nothing of the
user's is run). ``_Parser`` checks everything the source alone decides: ``accum`` first,
SSA, the supported statements and expressions, known functions and their parameters,
defined names, ``gate, up = pairs(accum)``, the return; each error an ``EpilogueError``
at the user's line (``source.parse_epilogue`` drives it).
"""

from __future__ import annotations

import ast
import difflib

import torch

from .. import axes as axes_, ir, spellings
from ..errors import EpilogueError
from ..optable import (BINARY_OPERATORS, CALLABLE, COMPARE_OPERATORS, UNARY_OPERATORS, Category,
                       OpDef, ParamValue)
from .parsed import ParsedEpilogue
from .syntax import (_INDEX_FUNCTIONS, _PY_MINMAX, PAIR_LAYOUT, PAIRS, Assignment, Expr,
                     _callee_name, _line_text, too_deep)


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
    # (the walk recurses only through parse_expr and parse_call, and the helpers below
    # return before it recurses: Python's recursion limit admits the same nesting as when
    # the checks were inline, ``too_deep`` beyond it)
    def parse_expr(self, node: ast.expr, target: str) -> Expr:
        line = self.line(node)
        if isinstance(node, ast.Name):
            self.check_defined(node, target)
            return Expr("name", line, name=node.id)
        if isinstance(node, ast.Constant):
            return Expr("const", line, value=self.number(node, target))
        if isinstance(node, ast.UnaryOp):
            # - - x nests one level per sign: the chain is walked by a loop, not recursion
            chain, node = self.sign_chain(node, target)
            return self.signed(chain, self.parse_expr(node, target))
        if isinstance(node, ast.BinOp) and not isinstance(node.op, ast.Pow):
            # a + b + c + ... nests to the left, one level per term: the left spine is walked
            # by a loop, so a sum of thousands of terms needs no recursion
            spine, node = self.left_spine(node, target)
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
            opname = self.comparison(node, target)
            return Expr("call", line, op=opname, args=(self.parse_expr(node.left, target),
                                                       self.parse_expr(node.comparators[0], target)))
        if isinstance(node, ast.Call):
            return self.parse_call(node, target)
        if isinstance(node, (ast.Attribute, ast.Subscript)):  # x.max(-1).values
            call = self.values_call(node, target)
            if call is not None:
                return self.parse_call(call, target)
        raise self.error(f"unsupported syntax ({type(node).__name__}) in the value of "
                         f"'{target}'", node, target)

    def check_defined(self, node: ast.Name, target: str) -> None:
        """A name read must be defined before (a parameter, or assigned above)."""
        if node.id not in self.defined:
            raise self.error(f"undefined name '{node.id}' (in the value of '{target}')"
                             f"{self.undefined_hint(node.id)}", node, node.id)

    def number(self, node: ast.Constant, target: str) -> float:
        """A numeric literal's value, as a float."""
        v = node.value
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.error(f"unsupported literal {v!r} in the value of '{target}'; only "
                             "numbers are allowed", node, target)
        try:
            return float(v)  # a float literal past the largest double is already inf
        except OverflowError:
            text = ast.get_source_segment("\n".join(self.source_lines), node) or str(v)
            raise self.error(f"the int literal {text[:12]}... ({len(text)} digits) in the "
                             f"value of '{target}' does not fit a float (Python's float() "
                             "of it raises OverflowError); a float literal such as 1e400 "
                             "is inf", node, target) from None

    def sign_chain(self, node: ast.UnaryOp, target: str
                   ) -> tuple[list[tuple[str, int]], ast.expr]:
        """A chain of signs (``- - x``): each sign's op and line, outermost first, and the
        expression under them."""
        chain = []
        while isinstance(node, ast.UnaryOp):
            opname = UNARY_OPERATORS.get(type(node.op).__name__)
            if opname is None:
                raise self.error(f"unsupported operator {type(node.op).__name__} in the "
                                 f"value of '{target}'", node, target)
            chain.append((opname, self.line(node)))
            node = node.operand
        return chain, node

    @staticmethod
    def signed(chain: list[tuple[str, int]], inner: Expr) -> Expr:
        """``sign_chain``'s signs applied to the parsed ``inner``: folded into a literal,
        ``+`` dropped, any other a call."""
        for opname, line in reversed(chain):
            if inner.kind == "const" and opname in ("neg", "identity"):
                inner = Expr("const", line,
                             value=-inner.value if opname == "neg" else inner.value)
            elif opname != "identity":
                inner = Expr("call", line, op=opname, args=(inner,))
        return inner

    def left_spine(self, node: ast.BinOp, target: str) -> tuple[list[ast.BinOp], ast.expr]:
        """The binary operators (not ``**``) down the left of ``a + b + c``, outermost
        first, and the leftmost operand."""
        spine = []
        while isinstance(node, ast.BinOp) and not isinstance(node.op, ast.Pow):
            if type(node.op).__name__ not in BINARY_OPERATORS:
                raise self.error(f"unsupported operator {type(node.op).__name__} in the "
                                 f"value of '{target}'; use + - * / ** & | or a "
                                 f"function",
                                 node, target)
            spine.append(node)
            node = node.left
        return spine, node

    def comparison(self, node: ast.Compare, target: str) -> str:
        """The op of a comparison of two values (``a > b``)."""
        if len(node.ops) != 1:
            raise self.error(f"chained comparisons are not supported (in the value of "
                             f"'{target}'); compare two values at a time", node, target)
        opname = COMPARE_OPERATORS.get(type(node.ops[0]).__name__)
        if opname is None:
            raise self.error(f"unsupported comparison {type(node.ops[0]).__name__} in the "
                             f"value of '{target}'", node, target)
        return opname

    def values_call(self, node: ast.expr, target: str) -> ast.Call | None:
        """The call of torch's ``x.max(-1).values`` (``spellings.values_of``), or None."""
        try:
            return spellings.values_of(node, lambda name: name in self.defined)
        except spellings.SpellingError as exc:
            raise self.error(f"{exc} (in the value of '{target}')", node, target) from None

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
        fname = self.callee(node, target)
        if fname in _INDEX_FUNCTIONS:
            if node.args or node.keywords:
                raise self.error(f"{fname}() takes no arguments", node, target)
            return Expr("index", line, op=_INDEX_FUNCTIONS[fname])
        fname, row = self.table_row(node, fname, target)
        axes, node = self.torch_axes(node, row, written, target)
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

    def callee(self, node: ast.Call, target: str) -> str:
        """The name a call calls (``relu``, ``ops.relu``), where it may be called."""
        fname = _callee_name(node.func)
        if fname is None:
            raise self.error(f"unsupported call in the value of '{target}': call a recognised "
                             "function by name (relu, gelu, ...)", node, target)
        if fname == PAIRS:
            raise self.error(f"pairs(accum) gives two values and must be the whole value of "
                             f"a statement 'gate, up = pairs(accum)' (in the value of "
                             f"'{target}')", node, target)
        return fname

    def table_row(self, node: ast.Call, fname: str, target: str) -> tuple[str, OpDef]:
        """The op-table row a call of ``fname`` calls (``max(a, b)``: ``maximum``) and the
        row's name, or the error naming the functions there are."""
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
        return fname, row

    def torch_axes(self, node: ast.Call, row: OpDef, written: str, target: str
                   ) -> tuple[axes_.Axes | None, ast.Call]:
        """A reduction's or row function's torch ``dim`` and ``keepdim`` (``axes.parse``),
        and the call without them; (None, the call) where it has none."""
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
        return axes, node

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
