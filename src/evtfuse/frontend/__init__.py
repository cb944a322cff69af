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

The package's modules, each in the frontend layer (core: they import ``ir``, ``axes``,
``spellings``, ``derivative``, ``errors`` and the op table, never a backend or the
runtime): ``syntax`` (``Expr``, ``Assignment``, ``ParsedSyntax``), ``parsed``
(``ParsedEpilogue``: the syntax with ``bind``), ``parser`` (the
``ast`` walk, ``_Parser``), ``source`` (``epilogue_text``, ``parse_module``,
``parse_epilogue``, ``one_line``), ``operands`` (``classify_operand``,
``classify_output``, ``check_names``, the grouped GEMM's layouts) and ``binding``
(``bind``). Everything is importable from ``evtfuse.frontend`` as it was from the one
module this package was.
"""

from __future__ import annotations

from ..ir import Space
from .binding import bind
from .operands import (_fmt_shape, check_given, check_grouped_output,  # noqa: F401
                       check_names, classify_operand, classify_output, operand_specs,
                       problem_shape_of)
from .parsed import ParsedEpilogue
from .parser import _Parser  # noqa: F401 (re-exported)
from .source import (ONE_LINE_LIMIT, EpilogueSource, EpilogueText,  # noqa: F401
                     epilogue_text, one_line, parse_epilogue, parse_module)
from .syntax import (_INDEX_FUNCTIONS, _PY_MINMAX, PAIR_LAYOUT, PAIRS,  # noqa: F401
                     Assignment, Expr, ParsedSyntax, too_deep)

__all__ = ["parse_epilogue", "bind", "ParsedEpilogue", "Expr", "classify_operand",
           "classify_output", "check_names", "check_given", "check_grouped_output",
           "operand_specs", "problem_shape_of", "Space"]
