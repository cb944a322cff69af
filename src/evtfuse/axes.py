"""A reduction's axes as torch spells them (``dim=``, ``keepdim=``), read against evtfuse's.

Layer: frontend (support: ``ast`` nodes and ``ir.Space`` only; nothing of the user's is
evaluated). evtfuse's own ``sum(x)`` takes its axes from the output it is stored in (or
reduces each row where it is not returned); ``x.sum(-1, keepdim=True)``, ``F.softmax(x,
dim=-1)``, ``torch.amax(x, 0)`` say theirs. ``Axes`` is what the source says (the parser
reads it, ``parse``); ``read`` says what that means for an output of rank 2, (M, N), or 3,
(L, M, N), with torch's rules, or why evtfuse has no such reduction:

* the reduced set holds N and not M: each row (``Space.ROW``); M and not N: each column
  (``Space.COL``); both: everything (``Space.SCALAR``); L alone: refused (no evtfuse
  reduction reduces the batches only);
* the batches are kept apart unless L is reduced (rank 3);
* without keepdim the result loses the reduced dims, and torch aligns shapes from the
  right: it broadcasts against the output as evtfuse's per-row / per-column / scalar value
  does only where the reduced dims lead ((N,) after dim=0 of an (M, N) output; not (M,)
  after dim=-1, which torch would read along the columns).

Non-negative dims and -3 mean different axes for rank 2 and rank 3 (dim=0: the columns of
an (M, N) output, the batches of an (L, M, N) one): they are read only where the rank is
known; dims -1 and -2, and "every dim", mean the same axes for both.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from .ir import Space

KEEPDIM = "keepdim"
DIM = "dim"


class AxesError(ValueError):
    """The message for a dim evtfuse cannot read (the caller adds the line)."""


@dataclass(frozen=True)
class Axes:
    """``dim`` (the dims as written; None: every dim) and ``keepdim`` of a call, with the
    call as written (``text``, for messages)."""

    dims: tuple[int, ...] | None
    keepdim: bool
    text: str

    @property
    def dim_text(self) -> str:
        if self.dims is None:
            return "dim=None"
        return f"dim={self.dims[0]}" if len(self.dims) == 1 else f"dim={self.dims}"


@dataclass(frozen=True)
class Reading:
    """What ``Axes`` mean for one output: the reduction's space, whether the batches stay
    apart, and whether the result (as torch shapes it) broadcasts against the output as
    the reduced value does."""

    space: Space
    keep_batch: bool
    broadcasts: bool
    result_shape: str  # torch's shape of the result, in letters ("(M, 1)", "(N,)")


def _int_literal(node) -> int | None:
    sign = 1
    while isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        sign *= -1 if isinstance(node.op, ast.USub) else 1
        node = node.operand
    if isinstance(node, ast.Constant) and isinstance(node.value, int) \
            and not isinstance(node.value, bool):
        return sign * node.value
    return None


def parse(dim: ast.expr | None, keepdim: ast.expr | None, text: str,
          single: bool = False) -> Axes:
    """The ``Axes`` of a call's ``dim`` and ``keepdim`` arguments (``dim`` None: not given,
    every dim; ``single``: one int, as softmax takes)."""
    if dim is None or (isinstance(dim, ast.Constant) and dim.value is None):
        dims = None
    elif _int_literal(dim) is not None:
        dims = (_int_literal(dim),)
    elif isinstance(dim, (ast.Tuple, ast.List)) and not single \
            and all(_int_literal(e) is not None for e in dim.elts):
        dims = tuple(_int_literal(e) for e in dim.elts)
        if not dims:  # torch: an empty dim reduces every dim
            dims = None
    else:
        what = "an int literal" if single else "an int literal, a tuple of them, or None"
        raise AxesError(f"{text}: dim must be {what} (got {ast.unparse(dim)})")
    keep = False
    if keepdim is not None:
        if not (isinstance(keepdim, ast.Constant) and isinstance(keepdim.value, bool)):
            raise AxesError(f"{text}: keepdim must be True or False (got "
                            f"{ast.unparse(keepdim)})")
        keep = keepdim.value
    return Axes(dims, keep, text)


_NAMES = {2: ("M", "N"), 3: ("L", "M", "N")}
_SPACE = {(True, False): Space.ROW, (False, True): Space.COL, (True, True): Space.SCALAR}


def read(axes: Axes, rank: int | None, batches: int = 1) -> Reading:
    """``axes`` for an output of ``rank`` (2 or 3; None: not known, then only dims -1, -2
    and every dim are read, as they mean the same for both ranks) with ``batches`` (L)."""
    if axes.dims is not None and rank is None:
        unsure = [d for d in axes.dims if not -2 <= d <= -1]
        if unsure:
            raise AxesError(
                f"{axes.text}: dim={unsure[0]} means different axes for a 2-D (M, N) output "
                f"and a batched (L, M, N) one (dim=0: the columns of one, the batches of "
                f"the other), and this output's rank is not known here (no full output "
                f"tensor); write negative dims (dim=-1: each row, dim=-2: each column)")
    r = rank or 2
    names = _NAMES[r]
    if axes.dims is None:
        reduced = set(names)
    else:
        reduced = set()
        for d in axes.dims:
            if not -r <= d < r:
                raise AxesError(f"{axes.text}: dim={d} is out of range for the "
                                f"({', '.join(names)}) output (torch: dims {-r} to {r - 1})")
            name = names[d % r]
            if name in reduced:
                raise AxesError(f"{axes.text}: dim {d} appears more than once")
            reduced.add(name)
    over = ("N" in reduced, "M" in reduced)
    if over == (False, False):
        raise AxesError(f"{axes.text}: {axes.dim_text} reduces the batches (L) only, which "
                        f"no evtfuse reduction does (each row, each column or everything, "
                        f"per batch or over the batches too); return the full value and "
                        f"reduce it with torch")
    kept = [n for n in names if n not in reduced]
    if axes.keepdim:
        shape = [("1" if n in reduced else n) for n in names]
        broadcasts = True
    else:
        shape = kept
        # the reduced dims lead (a kept L of size 1 leads too, and broadcasts as it is)
        order = tuple(n for n in names if not (n == "L" and batches == 1 and n not in reduced))
        broadcasts = order[: len(reduced)] == tuple(n for n in order if n in reduced)
    result = "(" + ", ".join(shape) + ("," if len(shape) == 1 else "") + ")"
    return Reading(_SPACE[over], "L" not in reduced, broadcasts, result)


def describe(space: Space, keep_batch: bool, rank: int | None) -> str:
    """``"each row (per batch)"``: what a reduction to ``space`` reduces, in words."""
    what = {Space.ROW: "each row", Space.COL: "each column", Space.SCALAR: "every element"}
    if rank != 3:
        return what[space]
    return what[space] + (", per batch" if keep_batch else ", over the batches too")


def shape_for(space: Space, keep_batch: bool, rank: int | None) -> str:
    """The output shape evtfuse stores such a reduction in (``docs/operands.md``)."""
    batched = rank == 3 and keep_batch
    return {Space.ROW: "(L, M, 1)" if batched else "(M, 1)",
            Space.COL: "(L, 1, N)" if batched else "(N,)",
            Space.SCALAR: "(L, 1, 1)" if batched else "(1,)"}[space]


__all__ = ["Axes", "AxesError", "Reading", "parse", "read", "describe", "shape_for",
           "DIM", "KEEPDIM"]
