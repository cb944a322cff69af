"""Reductions feeding computation: an epilogue split into two passes (layer: passes).

A reduction's result may feed further computation (``lse = logsumexp(accum); D =
exp(accum - lse)``, ``softmax``, ``mean``). Where a kernel cannot finish the reduction
before it computes with it (the row spans several tiles), the epilogue runs in two
passes (docs/performance.md, "Reductions feeding computation"):

- **first** (the GEMM's epilogue): every output computed before any reduction's result is
  needed, the reductions that feed computation (fp32, into workspaces, combined as any
  reduction output), and each full-tile value the rest reads (the accumulator, or a value
  computed from it: fp32, stored once into a workspace);
- **second** (an epilogue over K = 0, no GEMM): the rest, reading those workspaces as
  full operands and the reductions as per-row / per-column / scalar operands, and the
  original operands as they are.

``split`` builds both DAGs from the optimised one; both are ordinary epilogues (no
reduction feeds computation in either), so every kernel family and the reference read
them as they read a user's. Names given to workspaces are fresh: no user name meets them.
Each stage's DAG has an output named D (the frontend requires one): ``rename`` maps a
stage's output names back to the buffers they fill.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch

from . import ir
from .errors import EpilogueError
from .ir import Dag, Node, NodeKind, OperandKind, OperandSpec, Output, OutputKind, Space

_KIND_OF_SPACE = {Space.ROW: (OutputKind.ROW, OperandKind.PER_ROW),
                  Space.COL: (OutputKind.COL, OperandKind.PER_COL),
                  Space.SCALAR: (OutputKind.SCALAR, OperandKind.DEVICE_SCALAR),
                  Space.FULL: (OutputKind.FULL, OperandKind.FULL)}


@dataclass(frozen=True)
class Workspace:
    """An fp32 buffer the first pass writes and the second reads: ``space`` FULL (a value,
    (L|1, M, N)) or a reduction's (ROW (L|1, M, 1), COL (L|1, 1, N), SCALAR (L|1, 1, 1))."""

    name: str
    space: Space
    batched: bool

    def shape(self, problem: tuple[int, int, int]) -> tuple[int, ...]:
        L, M, N = problem
        m = M if self.space in (Space.FULL, Space.ROW) else 1
        n = N if self.space in (Space.FULL, Space.COL) else 1
        if self.space is Space.COL:
            return (L, 1, n) if self.batched else (n,)
        if self.space is Space.SCALAR:
            return (L, 1, 1) if self.batched else (1,)
        return (L, m, n) if self.batched else (m, n)


@dataclass(frozen=True)
class Split:
    """The two passes of an epilogue whose reductions feed computation."""

    first: Dag
    second: Dag
    workspaces: tuple[Workspace, ...]
    rename: tuple[dict, dict]  # per stage: its output name -> the buffer's name (user or workspace)


def feeds_computation(dag: Dag) -> bool:
    """Whether a reduction's result feeds computation in ``dag``."""
    return any(n.kind is NodeKind.REDUCE and dag.users[id(n)] for n in dag.nodes)


def row_reductions_only(dag: Dag) -> bool:
    """Whether every reduction that feeds computation is per row (over N), batches apart:
    what a kernel whose tile spans the row computes in one pass."""
    return all(n.space is Space.ROW and n.batched == n.inputs[0].batched
               for n in dag.nodes if n.kind is NodeKind.REDUCE and dag.users[id(n)])


def fresh_names(taken: set[str], stem: str) -> Iterator[str]:
    """Names ``stem0``, ``stem1``, ... not in ``taken`` (each added to it as it is given)."""
    k = 0
    while True:
        name = f"{stem}{k}"
        k += 1
        if name not in taken:
            taken.add(name)
            yield name


def split(dag: Dag, dtype: torch.dtype = torch.float32) -> Split:
    """The first and second pass of ``dag`` (``feeds_computation(dag)`` must hold); the
    workspaces between them hold ``dtype`` (float64 where the kernels compute in it)."""
    late = ir.after_reduction(dag)
    users = dag.users
    # a reduction of a value computed from a reduction (the frontend refuses them in
    # epilogues; a backward could build one) is an output of the second pass, which reduces
    # what it computes; one that feeds computation would need a third pass
    chained = {id(n) for n in dag.nodes
               if n.kind is NodeKind.REDUCE and any(id(i) in late for i in n.inputs)}
    for n in dag.nodes:
        if id(n) in chained and users[id(n)]:
            raise EpilogueError(f"{n.op}(...) in the value of {n.var or 'a reduction'!r} reduces "
                                "a value computed from another reduction and feeds computation: "
                                "that takes three passes, and evtfuse's kernels run two",
                                variable=n.var, line=n.line)
    taken = {"accum", "D"} | {o.name for o in dag.operands} | {o.name for o in dag.outputs}
    fresh = fresh_names(taken, "ef_ws")
    out_batched = {id(o.node): o.batched for o in dag.outputs if o.node.kind is NodeKind.REDUCE}

    workspaces: list[Workspace] = []
    first_outs: list[Output] = [o for o in dag.outputs if id(o.node) not in late
                                or (o.node.kind is NodeKind.REDUCE and id(o.node) not in chained)]
    loaded: dict[int, Node] = {}  # id(first-pass node) -> its load in the second pass
    for n in dag.nodes:
        if id(n) in late and n.kind is not NodeKind.REDUCE:
            continue
        feeds = any(id(u) in late and u.kind is not NodeKind.REDUCE for u in users[id(n)])
        if not feeds:
            continue
        if n.kind is NodeKind.REDUCE:
            # per batch where it reduces values the batches share (ir.reduces_shared): an
            # unbatched workspace would sum the L batches' copies
            batched = out_batched.get(id(n), n.batched) or ir.reduces_shared(n)
            space = n.space
        elif n.space is Space.FULL and n.kind in (NodeKind.ACCUM, NodeKind.COMPUTE):
            batched, space = n.batched, Space.FULL
        else:
            continue  # a leaf, or a value without the accumulator: computed again
        ws = Workspace(next(fresh), space, batched)
        workspaces.append(ws)
        okind, lkind = _KIND_OF_SPACE[space]
        first_outs.append(Output(ws.name, n, okind, dtype, batched))
        loaded[id(n)] = ir.load_node(OperandSpec(ws.name, lkind, dtype, batched))

    # the second pass: the late nodes over loads of the workspaces, leaves as they are
    ws_specs = tuple(loaded[id(n)].operand for n in dag.nodes if id(n) in loaded)
    new: dict[int, Node] = {}
    for n in dag.nodes:
        if id(n) in loaded:
            new[id(n)] = loaded[id(n)]
        elif n.kind in (NodeKind.LOAD, NodeKind.CONST, NodeKind.INDEX):
            new[id(n)] = n
        elif (n.kind is NodeKind.COMPUTE or id(n) in chained) and \
                all(id(i) in new for i in n.inputs):
            new[id(n)] = ir.with_inputs(n, tuple(new[id(i)] for i in n.inputs))
    second_outs = [Output(o.name, new[id(o.node)], o.kind, o.dtype, o.batched)
                   for o in dag.outputs if id(o.node) in late
                   and (o.node.kind is not NodeKind.REDUCE or id(o.node) in chained)]
    first, r1 = _with_d(first_outs, dag.operands, dag, dag.gated)
    second, r2 = _with_d(second_outs, dag.operands + ws_specs, dag, False)
    return Split(first, second, tuple(workspaces), (r1, r2))


def _with_d(outs: list[Output], operands: tuple, dag: Dag, gated: bool) -> tuple[Dag, dict]:
    """A stage's DAG with an output named D (its first, renamed, where the user's D is
    elsewhere), and the map of its output names to the buffers' names."""
    rename = {o.name: o.name for o in outs}
    if "D" not in rename:
        first = outs[0]
        outs = [Output("D", first.node, first.kind, first.dtype, first.batched)] + outs[1:]
        rename = {"D" if k == first.name else k: v for k, v in rename.items()}
    return Dag(tuple(outs), tuple(operands), dag.name, gated), rename


__all__ = ["Workspace", "Split", "feeds_computation", "row_reductions_only", "split", "fresh_names"]
