"""Spellings every kernel emitter shares: masks, per-row/per-column operand loads and the
accumulator's split into column pieces.

Layer: backends/triton, below the emitters. ``epilogue_emit``, ``reduce_emit``, ``codegen``
(portable and hopper kernels) and ``gluon_codegen`` (Gluon kernels) import it; it imports
none of them, so the emitters depend on it instead of on each other. Pure text: each
function returns Triton source for the names it is given.
"""

from __future__ import annotations

from ...ir import OperandKind
from .names import User


def all_of(*conds: str) -> str:
    """A mask: every condition of ``conds`` (Triton expressions, tensors or scalars). Two or
    more are written ``((a) & (b) ...) != 0``: Triton 3.9's CPU interpreter gives `&` of a
    boolean tensor and a scalar condition integer data that tl.load and tl.store refuse as
    a mask (versions.WORKAROUNDS["interpreter_scalar_and"]); the GPU compiler folds the
    comparison away."""
    if len(conds) == 1:
        return conds[0]
    return "(" + " & ".join(f"({c})" for c in conds) + ") != 0"


def vector_load(u: User, kind: OperandKind, bofs: str, rm: str, rn: str,
                ct: str = "tl.float32") -> str:
    """A per-row or per-column operand read from global memory, broadcast over the tile,
    in the epilogue's compute dtype ``ct``. A row past M (a column past N) reads 1.0:
    nothing computed there is stored or reduced (reductions mask the edge they run
    across), and a statistic a second pass or a backward divides by or takes the log of
    (softmax's sum, a max's tie count) is then no 0 there (numpy's divide-by-zero and
    invalid-value warnings under the interpreter)."""
    if kind is OperandKind.PER_ROW:
        return (f"tl.load({u('ptr')} + {bofs} + {rm} * {u('sm')}, mask={rm} < M, other=1.0)"
                f".to({ct})[:, None]")
    return (f"tl.load({u('ptr')} + {bofs} + {rn} * {u('sn')}, mask={rn} < N, other=1.0)"
            f".to({ct})[None, :]")


def split_pieces(split: int, indent: str, root: str = "acc", rows: str = "BLOCK_M",
                 width: str = "BLOCK_N") -> tuple[list[str], list[str]]:
    """Code splitting ``root`` (``rows`` high, ``width`` wide) into ``split`` column pieces
    (left to right) and their names."""
    if split == 1:
        return [], [root]
    lines: list[str] = []
    pieces = [root]
    level = 0
    while len(pieces) < split:
        nxt = []
        half = f"({width}) // 2"
        for p in pieces:
            a, b = f"{p}_l{level}", f"{p}_r{level}"
            lines.append(f"{indent}{a}, {b} = tl.split(tl.permute(tl.reshape({p}, "
                         f"({rows}, 2, {half})), (0, 2, 1)))")
            nxt += [a, b]
        pieces = nxt
        width = half
        level += 1
    return lines, pieces
