"""Epilogue sources for the cli: ``--epilogue`` text, or ``path.py[:fn]`` read with ``ast``.

Layer: cli. A file is parsed, never imported or executed; the function's text is cut out
with its line numbers kept, so error messages point into the user's file.
"""

from __future__ import annotations

import ast
import io
import os
import stat
import textwrap
import tokenize
from pathlib import Path

from ..runtime.cache import read_regular_bytes
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
    text = read_source_file(path)
    try:
        tree = ast.parse(text, filename=str(path))
    except SyntaxError as exc:
        where = f":{exc.lineno}" if exc.lineno else ""
        raise CliError(f"{shown(path)}{where}: not valid Python: {exc.msg}") from None
    except (RecursionError, MemoryError, ValueError):
        # too deep for Python's parser (a 20,000-term sum; thousands of nested signs) or a
        # null byte: the library's own message for the same text, at its line of the file
        from ..errors import EpilogueError
        from ..frontend import parse_module

        try:
            parse_module(text, 0, shown(path))
        except EpilogueError as exc:
            raise CliError(str(exc)) from None
        raise  # parse_module raises for what ast.parse did
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    if fn_name:
        chosen = [n for n in fns if n.name == fn_name]
        if not chosen:
            names = ", ".join(n.name for n in fns) or "none"
            raise CliError(f"{shown(path)} has no top-level function '{fn_name}' "
                           f"(functions: {names})")
    else:
        chosen = [n for n in fns if n.args.args and n.args.args[0].arg == "accum"]
        if len(chosen) != 1:
            names = ", ".join(n.name for n in chosen) or "none"
            raise CliError(f"{shown(path)}: say which epilogue to use as {shown(path)}:NAME "
                           f"(functions taking accum first: {names})")
    node = chosen[0]
    segment = ast.get_source_segment(text, node, padded=True)
    source = "\n" * (node.lineno - 1) + textwrap.dedent(segment) + "\n"
    return source, f"{shown(path)}:{node.name}"


FILE_LIMIT = 16 << 20  # bytes: an epilogue file is Python source


def shown(path: Path | str) -> str:
    """A path as a message can print it: bytes that are not UTF-8 (which Python keeps as
    lone surrogates) as ``\\xff``."""
    return str(path).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def read_source_file(path: Path) -> str:
    """The text of the epilogue file ``path``: a regular file (a folder, a FIFO, a device
    is refused by what it is; a FIFO is opened without blocking, so ``-f`` on one never
    waits for a writer) of at most ``FILE_LIMIT`` bytes, decoded as Python decodes source
    (UTF-8, or the encoding a ``# -*- coding: ... -*-`` line declares)."""
    name = shown(path)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise CliError(f"epilogue file '{name}' does not exist") from None
    except OSError as exc:
        raise CliError(f"epilogue file '{name}' cannot be read: "
                       f"{exc.strerror or exc}") from None
    if stat.S_ISDIR(info.st_mode):
        raise CliError(f"epilogue file '{name}' is a directory; give a .py file "
                       "(path.py or path.py:function)")
    if not stat.S_ISREG(info.st_mode):
        raise CliError(f"epilogue file '{name}' is not a regular file (a FIFO, socket or "
                       "device); give a .py file")
    try:
        _, raw = read_regular_bytes(path, FILE_LIMIT)
    except ValueError:
        raise CliError(f"epilogue file '{name}' holds more than {FILE_LIMIT >> 20} MiB; an "
                       "epilogue file is Python source") from None
    except OSError as exc:  # replaced since the stat above, or unreadable
        raise CliError(f"epilogue file '{name}' cannot be read: "
                       f"{exc.strerror or exc}") from None
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
    except SyntaxError as exc:  # bad UTF-8 in the first two lines, or an unknown coding
        encoding, why = "utf-8", exc.msg
    else:
        why = None
    try:
        text = raw.decode(encoding)
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise CliError(f"epilogue file '{name}' is not {encoding.upper()} text: the byte "
                       f"0x{raw[exc.start]:02x} on line {line} cannot be decoded (save the "
                       "file as UTF-8)") from None
    if why:
        raise CliError(f"epilogue file '{name}': {why}")
    return text


def check_text(text: str, option: str) -> str:
    """``text`` given on the command line, refused when it holds a byte that is not UTF-8
    (which Python keeps as a lone surrogate: the byte 0xff is '\\udcff')."""
    for i, ch in enumerate(text):
        if "\ud800" <= ch <= "\udfff":
            what = f"the byte 0x{ord(ch) - 0xDC00:02x}" if "\udc80" <= ch <= "\udcff" \
                else f"the character U+{ord(ch):04X}"
            raise CliError(f"{option} is not UTF-8 text: {what} at character {i + 1} "
                           f"(in '{shown(text[max(0, i - 20): i + 20])}')")
    return text


def resolve_epilogue(epilogue: str | None, epilogue_file: str | None) -> tuple[str, str]:
    """The epilogue source text and a short description of where it came from."""
    if epilogue and epilogue_file:
        raise CliError("give --epilogue or --epilogue-file, not both")
    if epilogue_file:
        return load_epilogue_file(epilogue_file)
    if epilogue:
        return check_text(epilogue, "--epilogue"), "the epilogue string"
    raise CliError("no epilogue: pass --epilogue \"def epi(accum, ...): ...\" or "
                   "--epilogue-file path.py:fn")


def resolve_positional(target: str) -> tuple[str, str]:
    """``show``'s argument: a source string, or ``path.py[:fn]``."""
    if _looks_like_source(target):
        return check_text(target, "the epilogue argument"), "the epilogue string"
    return load_epilogue_file(target)
