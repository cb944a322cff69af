"""The frontend's sources: an epilogue as text, read into ``ast`` and parsed.

Layer: frontend (core: ``ast``, ``inspect`` and ``tokenize``; the user's code is read,
never run). ``epilogue_text`` (the source of a function or a string, as ``EpilogueText``),
``parse_module`` (``ast.parse`` with every way it fails an ``EpilogueError`` at its line:
syntax, a source too deep for Python's own parser, bytes that are no text),
``parse_epilogue`` (the one function of a source, walked by ``parser._Parser``) and
``one_line`` (an epilogue on one line, for a repr).
"""

from __future__ import annotations

import ast
import inspect
import io
import re
import textwrap
import tokenize
from dataclasses import dataclass
from typing import Any, Callable, Union

from ..errors import EpilogueError
from .parsed import ParsedEpilogue
from .parser import _Parser
from .syntax import too_deep


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
