"""The frontend's result: ``ParsedEpilogue``, a checked epilogue (``syntax.ParsedSyntax``)
that binds itself to a call's values (``binding.bind``), as ``DagEpilogue`` does for an
epilogue given as a DAG (``dag_epilogue``): what ``EpilogueArguments`` calls.

Layer: frontend, above ``binding`` (which reads the syntax it binds, not this class).
"""

from __future__ import annotations

from typing import Any, Mapping

from .. import ir
from .binding import bind
from .syntax import ParsedSyntax


class ParsedEpilogue(ParsedSyntax):
    """A parsed epilogue (``parse_epilogue``): ``ParsedSyntax`` with ``bind``."""

    def bind(self, given: Mapping[str, Any], problem: tuple[int, int, int],
             grouped: bool = False, rank: int | None = None) -> ir.Dag:
        """``binding.bind`` of this epilogue."""
        return bind(self, given, problem, grouped, rank)
