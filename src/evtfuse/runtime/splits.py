"""What an epilogue's DAG allows each split of a GEMM call over a device mesh: the modes'
names, the nodes that mix what a split would separate (``mixing``), the row reductions a
split of the columns leaves as partial results (``row_partials``), and the operands a split
of K must hand each rank a part of (``summands``). Read by ``runtime.sharding``, which turns
them into DTensor placements.

Layer: runtime.torch, below ``runtime.sharding``; it reads the bound DAG (``ir``) and the
op table's ``degree`` (``optable``), nothing of torch.distributed.
"""

from __future__ import annotations

from typing import Any

from ..ir import NodeKind, OutputKind, Space, is_shift
from ..optable import Category

REPLICATE, COLUMNS, ROWS, BATCHES, INNER = "replicate", "columns", "rows", "batches", "inner"
MODES = (REPLICATE, COLUMNS, ROWS, BATCHES, INNER)
PARTIAL_OPS = ("sum", "max", "min")  # a row's reduction that its shards' results combine into
COMBINED_OPS = ("logsumexp",)  # one whose shards' results evtfuse.gemm combines itself


def summands(dag, tensors: set) -> tuple[str | None, frozenset]:
    """Whether each rank's epilogue of its partial sums (K split) is its part of the whole
    call's: (why not, or None; the tensor operands each rank must hold a part of). Every
    stored output must be of degree 1 (``OpDef.degree``) in the accumulator and in the
    operands that are added to something of degree 1 (found by growing that set until
    nothing more is added to the accumulator)."""
    parts: set[str] = set()
    while True:
        degree: dict[int, int | None] = {}
        blame: dict[int, Any] = {}  # a node of degree None: the node that made it so
        reads: dict[int, frozenset] = {}  # the operands each node reads, through its inputs
        grown = False
        for n in dag.nodes:
            ins = [degree[id(i)] for i in n.inputs]
            reads[id(n)] = frozenset().union(*(reads[id(i)] for i in n.inputs)) | (
                {n.operand.name} if n.kind is NodeKind.LOAD else set())
            if n.kind is NodeKind.ACCUM:
                d = 1 if n.op is None else None
            elif n.kind is NodeKind.LOAD:
                d = 1 if n.operand.name in parts else 0
            elif n.kind in (NodeKind.CONST, NodeKind.INDEX):
                d = 0
            elif n.kind is NodeKind.REDUCE:
                d = ins[0] if n.op == "sum" or ins[0] == 0 else None
            elif n.opdef.degree is not None:
                d = n.opdef.degree(*ins)
            else:
                d = 0 if all(x == 0 for x in ins) else None
            if d is None and n.kind is NodeKind.COMPUTE and n.op in ("add", "sub") \
                    and set(ins) == {0, 1}:  # a constant added to a partial sum
                loads = reads[id(n.inputs[ins.index(0)])]
                if loads & tensors and not (loads & tensors) <= parts:
                    parts |= loads & tensors
                    grown = True
                    break
            degree[id(n)] = d
            if d is None:
                blame[id(n)] = next((blame[id(i)] for i in n.inputs if id(i) in blame), n)
        if grown:
            continue
        for o in dag.outputs:
            if o.kind is OutputKind.NONE:
                continue
            d = degree[id(o.node)]
            if d == 1:
                continue
            if d == 0:
                return f"its output {o.name} does not depend on the accumulator", frozenset()
            n = blame[id(o.node)]
            line = f"line {n.line}: " if n.line else ""
            what = f"{n.var} = " if n.var else ""
            return (f"{line}{what}{n.op or n.kind.value}(...) is not linear in the "
                    f"accumulator{' and the operands added to it' if parts else ''}, "
                    "so the parts of K cannot be summed after it"), frozenset()
        return None, frozenset(parts)


def row_partials(dag) -> dict[str, str]:
    """{output: op} of the outputs that store a row's ``sum``, ``max`` or ``min`` read by
    no other node (``Rules.partial``): a shard of the columns computes its part of it."""
    read = {id(i) for n in dag.nodes for i in n.inputs}
    out = {}
    for o in dag.outputs:
        n = o.node
        if n.kind is NodeKind.REDUCE and n.space is Space.ROW \
                and n.op in PARTIAL_OPS + COMBINED_OPS \
                and id(n) not in read:
            out[o.name] = n.op
    return out


def mixing(dag, problem: tuple, name: str, partial_nodes=frozenset()) -> dict[str, str]:
    """{mode: why its shards would not compute the whole call's}: from each node of the
    DAG (bound, before any pass: a value computed only for another counts too);
    ``partial_nodes``: ids of the row reductions the outputs keep as partial results
    (``row_partials``), which do not stop the columns from splitting."""
    why: dict[str, str] = {}

    def at(n) -> str:
        line = f"line {n.line}: " if n.line else ""
        if is_shift(n) or n.op == "shifted_sumexp":  # softmax's and log_softmax's lowering
            return f"{line}softmax or log_softmax (a function of the whole row)"
        return f"{line}{f'{n.var} = ' if n.var else ''}{n.op}(...)"

    if dag.gated:
        why[COLUMNS] = "it takes the accumulator's columns in pairs (pairs(accum))"
    for n in dag.nodes:
        if n.kind is NodeKind.REDUCE:
            if n.space in (Space.ROW, Space.SCALAR) and id(n) not in partial_nodes:
                why.setdefault(COLUMNS, f"{at(n)} reduces over the columns")
            if n.space in (Space.COL, Space.SCALAR):
                why.setdefault(ROWS, f"{at(n)} reduces over the rows")
            if n.inputs[0].batched and not n.batched and problem[0] > 1:
                why.setdefault(BATCHES, f"{at(n)} reduces over the batches")
        elif n.kind is NodeKind.COMPUTE and n.opdef.category is Category.ROWWISE:
            why.setdefault(COLUMNS, f"{at(n)} is a function of the whole row")
        elif n.kind is NodeKind.INDEX:
            mode, fn = (ROWS, "row_index()") if n.op == "row" else (COLUMNS, "col_index()")
            why.setdefault(mode, f"it reads {fn}{f' (line {n.line})' if n.line else ''}, "
                                 "which a shard would count from its own first index")
    if problem[0] > 1:
        for o in dag.outputs:
            if o.kind is not OutputKind.NONE and not o.batched:
                why.setdefault(BATCHES, f"its output {o.name} sums over the batches")
    return {mode: f"the epilogue {name}: {text}" for mode, text in why.items()}
