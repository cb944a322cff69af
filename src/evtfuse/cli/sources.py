"""Epilogue sources for the cli: ``--epilogue`` text, or ``path.py[:fn]`` read with ``ast``.

Layer: cli. A file is parsed, never imported or executed; the function's text is cut out
with its line numbers kept, so error messages point into the user's file.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

from .base import CliError


def _looks_like_source(text: str) -> bool:
    return text.lstrip().startswith("def ") or "\n" in text


def load_epilogue_file(spec: str) -> tuple[str, str]:
    """``path.py:fn`` (or ``path.py`` with one epilogue in it) -> (source, where).

    The file is parsed with ``ast`` and never imported or executed. The function's text is
    cut out with ``ast.get_source_segment`` (decorators dropped) and preceded by blank lines
    so that line numbers in error messages are the file's.
    """
    path_s, sep, fn_name = spec.rpartition(":")
    if not sep or not fn_name.isidentifier():
        path_s, fn_name = spec, ""
    path = Path(path_s)
    if not path.is_file():
        raise CliError(f"epilogue file '{path}' does not exist")
    text = path.read_text()
    try:
        tree = ast.parse(text, filename=str(path))
    except SyntaxError as exc:
        raise CliError(f"{path}:{exc.lineno}: not valid Python: {exc.msg}") from None
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    if fn_name:
        chosen = [n for n in fns if n.name == fn_name]
        if not chosen:
            names = ", ".join(n.name for n in fns) or "none"
            raise CliError(f"{path} has no top-level function '{fn_name}' (functions: {names})")
    else:
        chosen = [n for n in fns if n.args.args and n.args.args[0].arg == "accum"]
        if len(chosen) != 1:
            names = ", ".join(n.name for n in chosen) or "none"
            raise CliError(f"{path}: say which epilogue to use as {path}:NAME "
                           f"(functions taking accum first: {names})")
    node = chosen[0]
    segment = ast.get_source_segment(text, node, padded=True)
    source = "\n" * (node.lineno - 1) + textwrap.dedent(segment) + "\n"
    return source, f"{path}:{node.name}"


def resolve_epilogue(epilogue: str | None, epilogue_file: str | None) -> tuple[str, str]:
    """The epilogue source text and a short description of where it came from."""
    if epilogue and epilogue_file:
        raise CliError("give --epilogue or --epilogue-file, not both")
    if epilogue_file:
        return load_epilogue_file(epilogue_file)
    if epilogue:
        return epilogue, "the epilogue string"
    raise CliError("no epilogue: pass --epilogue \"def epi(accum, ...): ...\" or "
                   "--epilogue-file path.py:fn")


def resolve_positional(target: str) -> tuple[str, str]:
    """``show``'s argument: a source string, or ``path.py[:fn]``."""
    if _looks_like_source(target):
        return target, "the epilogue string"
    return load_epilogue_file(target)
