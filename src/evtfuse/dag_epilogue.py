"""An epilogue given as a DAG a pass built, never printed and parsed again (layer: frontend).

The stages of a two-pass plan (``staging.split``), a forward with the values its backward
keeps and the backward itself (``autodiff``), an MLP block's derived backward: each is an
``ir.Dag`` already, built by a pass. ``DagEpilogue`` lets such a DAG go wherever a parsed
epilogue (``frontend.ParsedEpilogue``) goes: ``EpilogueArguments``, ``GemmArguments``,
``evtfuse.gemm`` and the PyTorch operators. The DAG is the IR: it is handed on as it is.

The DAG is kept in the form the frontend builds (``rebound``): one load per operand, and
each literal and ``row_index()`` / ``col_index()`` a leaf of its own use, as written in
source (the passes share them again), so that a derived epilogue has the ``ir.signature``
(the tuner's key) it had when it was printed and parsed. Binding it to a call's values
(``DagEpilogue.bind``) checks their names and reads each operand's and output's kind,
dtype and batching off its value, as ``frontend.bind`` reads them for a parsed epilogue,
and keeps everything else the DAG computes: where the values say what the DAG says (the
usual case), the DAG itself; else the DAG over loads and stores of what the values say,
each node's space and batching inferred again (``ir.with_inputs``). Its constants are its
own: a DAG built from the problem's sizes (mean's count of reduced elements) is bound to
problems of those sizes.

Text of it is for people and for keys, never read back by evtfuse: ``source`` (``unparse``,
what ``evtfuse show`` and messages print) and ``text``, the name under which the PyTorch
operators carry it (``runtime.torch_op.register``): its source and a hash of what shapes its
code, so that two DAGs with one source (operands of other kinds, another problem's count)
have two names. Only a process that never registered a text (a compiled graph a cache
brought from another) parses it, as it parses any epilogue text it is given.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import replace
from typing import Any, Mapping

from . import ir
from .frontend import (EpilogueSource, ParsedEpilogue, check_given, check_grouped_output,
                       classify_output, operand_specs, parse_epilogue)
from .ir import Dag, Node, NodeKind, OutputKind
from .unparse import is_mean, to_source

Store = tuple[OutputKind, Any, bool]  # an output's kind, dtype and batching


class DagEpilogue:
    """An epilogue as a DAG (``dag``), with what the runtime reads of a parsed one: its name,
    operands (``params``) and outputs in order, whether it is gated, and ``where`` (what
    messages call it). ``rank``: that of the output it was built for (2 or 3), where known,
    for its ``source``."""

    line_offset = 0  # no lines of a user's file
    assignments = ()  # nor statements (what messages look a variable's name up in)
    sized = True  # its constants may hold the sizes it was built for: bound as it is

    def __init__(self, dag: Dag, name: str | None = None, where: str | None = None,
                 rank: int | None = None):
        dag = dag if name in (None, dag.name) else replace(dag, name=name)
        self.rank = rank
        self.dag = rebound(dag, dag.operands, {o.name: (o.kind, o.dtype, o.batched)
                                               for o in dag.outputs}, rank)
        self.name = self.dag.name
        self.where = where or f"the epilogue {self.name} evtfuse derived"
        self.params = tuple(o.name for o in self.dag.operands)
        self.outputs = tuple(o.name for o in self.dag.outputs)
        self.returns = tuple((name, 0) for name in self.outputs)
        self.gated = self.dag.gated
        self.conditional_outputs = tuple(o.name for o in self.dag.outputs
                                         if o.node.conditional_store)

    def text_of(self, line: int) -> str | None:
        return None

    @functools.cached_property
    def source(self) -> str:
        """The DAG as epilogue source (``unparse.to_source``): to show, never to parse."""
        return to_source(self.dag, rank=self.rank)

    @functools.cached_property
    def text(self) -> str:
        """Its name as the PyTorch operators carry it: ``source`` and a comment holding a
        hash of the DAG's ``fingerprint``."""
        digest = hashlib.sha256(fingerprint(self.dag).encode()).hexdigest()[:24]
        return f"{self.source}# evtfuse dag {digest}\n"

    def bind(self, given: Mapping[str, Any], problem: tuple[int, int, int],
             grouped: bool = False, rank: int | None = None) -> Dag:
        """The DAG for operand and output values ``given`` and output shape (L, M, N)
        ``problem`` (``rank``: unused, a DAG's reductions know their axes)."""
        check_given(self.name, self.params, self.outputs, given)
        specs = operand_specs(self.params, given, problem, grouped)
        stores = self._stores(given, problem, grouped)
        if specs == self.dag.operands and all(
                stores[o.name] == (o.kind, o.dtype, o.batched) for o in self.dag.outputs):
            return self.dag
        return rebound(self.dag, specs, stores, self.rank)

    def _stores(self, given: Mapping[str, Any], problem: tuple[int, int, int],
                grouped: bool) -> dict[str, Store]:
        """Each output's kind, dtype and batching, read off its buffer (``classify_output``:
        one that assigns a reduction reads a dimension of size 1 as reduced)."""
        reductions = assigned_reductions(self.dag)
        stores = {}
        for o in self.dag.outputs:
            stores[o.name] = classify_output(o.name, given[o.name], problem,
                                             reduction=o.name in reductions)
            if grouped:
                check_grouped_output(o.name, o.node, stores[o.name][0], stores[o.name][2],
                                     given[o.name])
        return stores

    def __repr__(self) -> str:
        return f"DagEpilogue({self.name}({', '.join(self.params)}) -> {', '.join(self.outputs)})"


def fingerprint(dag: Dag) -> str:
    """Canonical text of everything in ``dag`` that shapes the code it runs as: its
    ``ir.signature``, its name, and every operand it declares, read or not."""
    operands = ",".join(f"{o.name}:{o.kind.name}:{ir.dtype_name(o.dtype)}:{int(o.batched)}"
                        for o in dag.operands)
    return f"{dag.name}({operands});{ir.signature(dag)}"


def assigned_reductions(dag: Dag) -> set[str]:
    """The outputs an epilogue's source assigns a reduction (``name = sum(...)``, or
    ``mean``): the first output of each reduction node, and of each mean whose sum is no
    output's (``unparse.to_source`` writes the DAG so)."""
    first: dict[int, str] = {}
    for o in dag.outputs:
        first.setdefault(id(o.node), o.name)
    return {name for node_id, name in first.items()
            if _reduction_written(dag.output(name).node, first)}


def _reduction_written(n: Node, first: dict[int, str]) -> bool:
    if n.kind is NodeKind.REDUCE:
        return True
    return is_mean(n) and id(n.inputs[0]) not in first


def rebound(dag: Dag, specs: tuple, stores: Mapping[str, Store], rank: int | None = None
            ) -> Dag:
    """``dag`` over the operands ``specs`` and with the outputs ``stores`` says, in the form
    ``frontend.bind`` builds: one load per operand, of its spec; each literal and index a
    leaf of its own use; each reduction an output assigns reduced to that output's space
    (per batch where it keeps them), each other one as the frontend reads a reduction
    used (``_kept``); each other node's space and batching inferred again from its
    inputs. ``rank``: that of the output the DAG was built for, where known."""
    assigned = assigned_reductions(dag)
    reduced = {id(_reduction_of(o.node)): (stores[o.name][0].space, stores[o.name][2])
               for o in dag.outputs if o.name in assigned}
    loads = {s.name: None for s in specs}
    spec_of = {s.name: s for s in specs}
    new: dict[int, Node] = {}

    def use(n: Node) -> Node:
        """``n`` as one of its users reads it: a leaf of its own for a literal or index."""
        if n.kind is NodeKind.CONST:
            return ir.const_node(n.value, n.line)
        if n.kind is NodeKind.INDEX:
            return ir.index_node(n.op, n.line)
        return new[id(n)]

    for n in dag.nodes:
        inputs = tuple(use(i) for i in n.inputs)
        if n.kind is NodeKind.LOAD:
            name = n.operand.name
            loads[name] = loads[name] or ir.load_node(spec_of[name], n.line)
            new[id(n)] = loads[name]
        elif n.kind is NodeKind.REDUCE:
            space, keep = reduced.get(id(n), (n.space, _kept(n, rank)))
            new[id(n)] = ir.reduce_node(n.op, inputs[0], space, keep, n.var, n.line, n.params)
        else:
            new[id(n)] = ir.with_inputs(n, inputs)
    outputs = tuple(ir.Output(o.name, use(o.node), *stores[o.name]) for o in dag.outputs)
    return Dag(outputs, tuple(specs), dag.name, dag.gated)


def _reduction_of(n: Node) -> Node:
    """The reduce node of an output assigned a reduction: itself, or a mean's sum."""
    return n if n.kind is NodeKind.REDUCE else n.inputs[0]


def _kept(r: Node, rank: int | None) -> bool:
    """Whether the reduction ``r``, which no output assigns, keeps the batches apart, as the
    frontend reads one used in computation (``axes.read``; ``unparse`` writes its dims so):
    unless it is over everything, or, for an output of rank 3, over the batches too, per
    batch (the same values where the problem has one batch)."""
    if r.batched == r.inputs[0].batched:
        return True
    return r.space is not ir.Space.SCALAR and rank != 3


def read_epilogue(epilogue: EpilogueSource | ParsedEpilogue | DagEpilogue
                  ) -> ParsedEpilogue | DagEpilogue:
    """An epilogue as arguments hold it: a DAG as it is, a parsed one as it is, a function
    or source text parsed (``frontend.parse_epilogue``)."""
    return epilogue if isinstance(epilogue, DagEpilogue) else parse_epilogue(epilogue)


__all__ = ["DagEpilogue", "fingerprint", "assigned_reductions", "rebound", "read_epilogue"]
