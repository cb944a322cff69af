"""The house's size limits (issue 51): no function in ``src/`` over 120 lines and no module
over 600, tables aside (``TABLES``: modules that are one table of data, read row by row).
Read with ``ast``, so the limits hold for every function, nested ones and methods too."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "evtfuse"
FUNCTION_LINES, MODULE_LINES = 120, 600
TABLES = {"optable.py"}  # the op table: one row per op


def _offenders(root: Path) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        rel = path.relative_to(root).as_posix()
        lines = text.count("\n")
        if lines > MODULE_LINES and rel not in TABLES:
            out.append(f"{rel}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > FUNCTION_LINES:
                    out.append(f"{rel}:{node.lineno} {node.name}: {n} lines")
    return out


def test_no_function_or_module_over_the_limits():
    assert _offenders(SRC) == []


def test_the_check_finds_a_long_function_and_a_long_module(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_LINES))
    (tmp_path / "long.py").write_text(f"def f():\n{body}\n" + "\n" * MODULE_LINES)
    (tmp_path / "optable.py").write_text("\n" * (MODULE_LINES + 1))  # a table: allowed
    assert _offenders(tmp_path) == [f"long.py: {FUNCTION_LINES + 1 + MODULE_LINES} lines",
                                    f"long.py:1 f: {FUNCTION_LINES + 1} lines"]
