"""The DAG as epilogue source text: the inverse of the frontend (layer: ir, a printer).

``to_source(dag)`` writes ``def name(accum, <operands>): ...; return <outputs>`` using only
what an epilogue may say: the table's ops (by operator or by name), literals, operands,
``row_index()`` / ``col_index()`` and the reductions. For people: ``evtfuse show``, error
messages, the name a derived epilogue (``dag_epilogue.DagEpilogue``: a backward, a
two-pass stage) carries across the PyTorch operator's boundary. evtfuse runs such a DAG as
it is, never parsing this text back; still, parsed and bound again with operands and
outputs of the kinds the DAG's have, it gives the same DAG (``ir.signature``), so that a
text reaching a process that did not derive it (a compiled graph from a cache) runs the
same. Operands and outputs keep their names; every other value takes a name no operand or
output has (``t0``, ``t1``, ...); each computed node is one assignment.
"""

from __future__ import annotations

import math
from typing import Iterator

from .ir import PAIR_PARTS, Dag, Node, NodeKind, Space
from .optable import BINARY_OPERATORS, CALLABLE, COMPARE_OPERATORS, OPERATOR_SYMBOLS, OPS

_INFIX = {op: OPERATOR_SYMBOLS[py] for table in (BINARY_OPERATORS, COMPARE_OPERATORS)
          for py, op in table.items()}


def literal(value: float) -> str:
    """A float as epilogue source writes it (inf as 1e999, which Python reads as inf); NaN
    has no literal, and is written as inf - inf (constant folding makes it one again)."""
    if math.isnan(value):
        return "(1e999 - 1e999)"
    if math.isinf(value):
        return "1e999" if value > 0 else "-1e999"
    return repr(float(value))


def _param(value) -> str:
    if isinstance(value, str):
        return repr(value)
    if math.isnan(value):
        raise ValueError("a NaN parameter has no literal in an epilogue")
    return literal(value)


def _names(taken: set[str]) -> Iterator[str]:
    k = 0
    while True:
        name = f"t{k}"
        k += 1
        if name not in taken:
            yield name


def to_source(dag: Dag, name: str | None = None, rank: int | None = None) -> str:
    """``dag`` as the source of an epilogue function (its operands in order as parameters,
    its outputs in order in the return). It must have an output named D, as every epilogue.
    ``rank``: that of the output (2 or 3) it is bound for, where known: a reduction that is
    no output and reduces over the batches too is written with dim -3 where it is 3."""
    taken = {"accum"} | {o.name for o in dag.operands} | {o.name for o in dag.outputs}
    fresh = _names(taken)
    out_name: dict[int, str] = {}
    for o in dag.outputs:
        if o.node.kind in (NodeKind.COMPUTE, NodeKind.REDUCE):
            out_name.setdefault(id(o.node), o.name)
    text: dict[int, str] = {}
    lines: list[str] = []
    part_names: dict[str | None, str] = {None: "accum"}
    if dag.gated:  # the accumulator's column pairs, named once: ``gate, up = pairs(accum)``
        part_names.update(zip(PAIR_PARTS, (next(fresh), next(fresh))))
        layout = f", layout={dag.gated!r}" if dag.concatenated else ""
        lines.append(f"{part_names['gate']}, {part_names['up']} = pairs(accum{layout})")

    def ref(n: Node) -> str:
        return text[id(n)]

    # a mean whose sum has no name of its own (the frontend's lowering) is written as mean;
    # a named sum (an output: a two-pass plan's workspace) keeps its division
    means = {id(n): n.inputs[0] for n in dag.nodes
             if is_mean(n) and id(n.inputs[0]) not in out_name}
    mean_sums = {id(r) for r in means.values()}
    for n in dag.nodes:
        if n.kind is NodeKind.ACCUM:
            text[id(n)] = part_names[n.op]
        elif n.kind is NodeKind.LOAD:
            text[id(n)] = n.operand.name
        elif n.kind is NodeKind.CONST:
            text[id(n)] = literal(n.value)
        elif n.kind is NodeKind.INDEX:
            text[id(n)] = f"{n.op}_index()"
        elif n.kind is NodeKind.REDUCE:
            if id(n) in mean_sums:
                continue  # written as the mean that divides it (below)
            # a reduction that is no output (softmax's, a user's inside an expression): a
            # name of its own, read back as a reduction used (per row, or with the dims that
            # say its axes: ``_axes``); a row function's max, a shift (``ir.is_shift``), reads
            # back as a plain max: the same value and code, only not differentiable
            target = out_name.get(id(n))
            axes = "" if target else _axes(n, rank)  # an output's shape picks its axes
            target = target or next(fresh)
            text[id(n)] = target
            lines.append(f"{target} = {n.op}({ref(n.inputs[0])}{axes})")
        elif id(n) in means:  # mean(x): the frontend's sum(x) / count, as the user wrote it
            target = out_name.get(id(n))
            axes = "" if target else _axes(means[id(n)], rank)
            target = target or next(fresh)
            lines.append(f"{target} = mean({ref(means[id(n)].inputs[0])}{axes})")
            text[id(n)] = target
        else:
            target = out_name.get(id(n)) or next(fresh)
            lines.append(f"{target} = {_expression(n, ref, lines, fresh)}")
            text[id(n)] = target
    done = set(out_name.values())
    for o in dag.outputs:
        if o.name not in done and o.name != "accum":  # a second output of one node, or an
            # operand, accum (returned as itself), a literal
            lines.append(f"{o.name} = {ref(o.node)}")
            done.add(o.name)
    params = ", ".join(["accum", *(o.name for o in dag.operands)])
    body = "\n".join(f"    {line}" for line in lines)
    returns = ", ".join(o.name for o in dag.outputs)
    return f"def {name or dag.name}({params}):\n{body}\n    return {returns}\n"


_DIMS = {Space.ROW: (-1,), Space.COL: (-2,), Space.SCALAR: (-2, -1)}


def _axes(r: Node, rank: int | None) -> str:
    """The ``dim=`` and ``keepdim=`` a reduction that is no output is written with, as torch
    reads them (``axes.read``): none for evtfuse's own default, each row with the batches
    apart; a column or everything per batch by negative dims; everything over the batches
    too by every dim; a row or column over the batches too by dim -3 with them where the
    output has rank 3 (``rank``), else as per batch: the same values with one batch."""
    kept = r.batched == r.inputs[0].batched
    if r.space is Space.SCALAR and not kept:
        return ", dim=None, keepdim=True"
    if not kept and rank != 3:
        kept = True
    if r.space is Space.ROW and kept:
        return ""
    dims = _DIMS[r.space] if kept else (-3, *_DIMS[r.space])
    return f", dim={dims[0] if len(dims) == 1 else dims}, keepdim=True"


def is_mean(n: Node) -> bool:
    """Whether ``n`` is a ``mean`` as the frontend lowers it: a sum no variable names (the
    lowering's own), divided by a constant (the count of reduced elements)."""
    return (n.kind is NodeKind.COMPUTE and n.op == "div" and n.inputs[0].kind is NodeKind.REDUCE
            and n.inputs[0].op == "sum" and n.inputs[0].var is None
            and n.inputs[1].kind is NodeKind.CONST)


def _expression(n: Node, ref, lines: list[str], fresh: Iterator[str]) -> str:
    args = [ref(i) for i in n.inputs]
    op = n.op
    if op in _INFIX:
        return f"({args[0]} {_INFIX[op]} {args[1]})"
    if op == "neg":
        if n.inputs[0].kind is NodeKind.CONST:  # -(2.0) would be read as the literal -2.0
            held = next(fresh)
            lines.append(f"{held} = {args[0]}")
            args = [held]
        return f"(-{args[0]})"
    if op == "pow":
        return f"({args[0]} ** {_param(n.param_dict['exponent'])})"
    assert op in CALLABLE, op
    params = [f"{k}={_param(v)}" for k, v in n.params]
    return f"{op}({', '.join(args + params)})"


__all__ = ["to_source", "literal", "is_mean"]
assert set(_INFIX) | {"neg", "pow"} | set(CALLABLE) >= set(OPS)
