"""The backward step of differentiation: ``backward``, a forward plan's backward epilogue.

Layer: passes (core: ``ir``, ``derivative``, the op table and ``passes``). ``backward``
seeds the gradients arriving at the graded outputs, runs each node's rule from the op
table (``OpDef.grad``) in reverse order, sums what a reduction feeding computation lacks
over the tile, returns dAccum and each wanted operand's gradient reduced to its shape,
reads what the forward kept (its decisions, the reductions' values, in "save" mode the
accumulator) and simplifies the DAG with ``passes.optimize``. ``_Backward`` holds what one
backward builds.
"""

from __future__ import annotations

from typing import Iterable

import torch

from .. import ir
from ..derivative import Diff, apply_rule
from ..ir import Dag, Node, NodeKind, OperandKind, OperandSpec, Output, OutputKind, Space
from ..optable import OPS
from ..passes import optimize, read_saved, read_saved_accumulator
from .analysis import _decisions, _NodeAlgebra, decision_key
from .plans import (_KIND_OF_SPACE, _OPERAND_OF_OUTPUT, ACCUM, BackwardPlan, ForwardPlan,
                    Injected, _Namer, _spec, accum_target)


def backward(plan: ForwardPlan, graded: Iterable[str], wanted: Iterable[str], *,
             batches: int = 1, name: str = "backward") -> BackwardPlan:
    """The backward epilogue of ``plan`` for gradients arriving at the outputs ``graded``,
    giving the gradients of ``wanted`` (``accum`` and operand names, within ``plan.wrt``).
    ``batches``: the problem's L (a full operand shared by L > 1 batches gets a per-batch
    gradient, summed by the caller)."""
    b = _Backward(plan, wanted, batches)
    b.seed(set(graded))
    b.propagate()
    outputs, results, batch_summed = b.gradients()
    return b.finish(outputs, results, batch_summed, name)


class _Backward:
    """One backward DAG as it is built: the adjoints (``adj``: summed over the tile;
    ``exact``: a value computed from a reduction, in its own shape), the backward's operands
    and what they carry (gradients of outputs, saved values, injected gradients), and the
    scratch outputs of sums its own computation uses."""

    def __init__(self, plan: ForwardPlan, wanted: Iterable[str], batches: int):
        self.plan, self.dag, self.active, self.batches = plan, plan.dag, plan.active, batches
        self.wanted = frozenset(wanted) & plan.wrt
        self.names = names = _Namer(plan.names)
        self.alg = _NodeAlgebra()
        self.adj: dict[int, Node] = {}
        self.grads: list[tuple[str, str]] = []
        self.saved_ops: list[tuple[str, str]] = []
        self.injected: list[Injected] = []
        self.operands = list(self.dag.operands)
        self.first = OperandSpec(names("first_batch"), OperandKind.DEVICE_SCALAR, torch.float32,
                                 True)
        # values computed from a reduction (per row, column or whole: ``_late_refusal``) take
        # their gradient as a value of their own shape ("exact": not spread), which the
        # reduction's rule broadcasts back over the tile; what flows from them into other
        # values is spread as everything else is
        self.late = ir.after_reduction(self.dag)
        self.exact: dict[int, Node] = {}
        self.by_name = {s.name: s for s in plan.saved}
        self.ties_of: dict[int, OperandSpec] = {}  # a max or min feeding computation: its ties
        for k, sname in plan.ties:
            t = self.by_name[sname]
            self.ties_of[id(self.dag.nodes[k])] = spec = _spec(names(t.name), t.kind, t.dtype,
                                                                t.batched)
            self.operands.append(spec)
            self.saved_ops.append((t.name, spec.name))
        self.scratch: list[Output] = []

    # -- adjoints
    def add(self, n: Node, g: Node) -> None:
        if id(n) in self.active:
            adj = self.adj
            adj[id(n)] = g if id(n) not in adj else ir.compute_node("add", (adj[id(n)], g))

    def add_exact(self, n: Node, g: Node) -> None:
        if id(n) in self.active:
            exact = self.exact
            exact[id(n)] = g if id(n) not in exact else ir.compute_node("add", (exact[id(n)], g))

    def spread(self, e: Node, lacks_m: bool, lacks_n: bool, lacks_l: bool) -> Node:
        """An adjoint already summed over the dims a value lacks, as a contribution to be
        summed over them like every other: kept at one representative (row 0, column 0,
        batch 0), zero elsewhere. Exact (a select, no division)."""
        for lacks, axis in ((lacks_m, "row"), (lacks_n, "col")):
            if lacks:
                at0 = ir.compute_node("eq", (ir.index_node(axis), ir.const_node(0.0)))
                e = ir.compute_node("where", (at0, e, ir.const_node(0.0)))
        if lacks_l and self.batches > 1:
            if self.first not in self.operands:
                self.operands.append(self.first)
            e = ir.compute_node("where", (ir.load_node(self.first), e, ir.const_node(0.0)))
        return e

    def spread_over(self, e: Node, space: Space, batched: bool) -> Node:
        """``spread`` over what a value of ``space`` (and batching) lacks."""
        return self.spread(e, space in (Space.COL, Space.SCALAR),
                           space in (Space.ROW, Space.SCALAR), not batched)

    def tile_sum(self, x: Node, n: Node) -> Node:
        """``x`` summed over the dims ``n`` lacks, for the backward's own computation: a
        per-row sum, batches apart, as an unreturned reduction; any other (per column,
        whole, over the batches too) also returned, as scratch (the language reduces a
        value it does not return over each row, batches apart)."""
        r = ir.reduce_node("sum", x, n.space, n.batched)
        if n.space is not Space.ROW or (not n.batched and self.batches > 1):
            self.scratch.append(Output(self.names("scratch"), r, _KIND_OF_SPACE[n.space],
                                       self.plan.work, n.batched))
        return r

    # -- the gradients arriving, and their way back
    def seed(self, graded: set[str]) -> None:
        """Each graded output's gradient, an operand of the backward, where it arrives."""
        for o in self.plan.differentiable_outputs():
            if o.name not in graded:
                continue
            gname = self.names(f"grad_{o.name}")
            gspec = _spec(gname, o.kind, o.dtype, o.batched)
            self.operands.append(gspec)
            self.grads.append((o.name, gname))
            g = ir.load_node(gspec)
            if id(o.node) in self.late and o.node.space is not Space.FULL \
                    and o.kind is not OutputKind.FULL:
                self.add_exact(o.node, g)  # a reduction or a mean, stored in its own shape
            elif o.node.kind is not NodeKind.REDUCE:  # stored once per element of the output
                self.add(o.node, self.spread(g, o.kind in (OutputKind.COL, OutputKind.SCALAR),
                                             o.kind in (OutputKind.ROW, OutputKind.SCALAR),
                                             not o.batched))
            else:
                self.seed_reduction(o, g)

    def seed_reduction(self, o: Output, g: Node) -> None:
        """A stored reduction's gradient ``g``, back to its argument: a max's or min's from
        torch (``Injected``), any other by its rule (reading a saved result where it needs
        its own)."""
        src = o.node.inputs[0]
        saved_of = {(s.of, s.role): s for s in self.plan.saved}
        arg = saved_of.get((o.name, "argument"))
        if arg is not None:  # max / min: the saved argument's gradient comes from torch
            iname = self.names(f"grad_{arg.name}")
            ispec = OperandSpec(iname, _OPERAND_OF_OUTPUT[arg.kind], self.plan.work,
                                arg.batched)
            self.operands.append(ispec)
            self.injected.append(Injected(iname, arg, o.name, o.node.op, o.kind, o.batched))
            self.add(src, self.spread_over(ir.load_node(ispec), src.space, src.batched))
            return
        res = saved_of.get((o.name, "result"))
        out = None
        if res is not None:
            sname = self.names(f"saved_{o.name}") if not res.hidden else self.names(res.name)
            sspec = _spec(sname, res.kind, self.plan.work, res.batched)
            self.operands.append(sspec)
            self.saved_ops.append((res.name, sname))
            out = ir.load_node(sspec)
        d = Diff(self.alg, (src,), g, o.node.param_dict,
                 out=(lambda: out) if out is not None else None)
        (contribution,) = apply_rule(OPS[o.node.op].grad, d)
        if contribution is not None:
            self.add(src, contribution)

    def propagate(self) -> None:
        """Every node's rule, users before inputs."""
        for n in reversed(self.dag.nodes):
            if id(n) in self.late and n.space is not Space.FULL:
                # a reduction feeding computation, or a value computed from one
                self.propagate_late(n)
                continue
            a = self.adj.get(id(n))
            if a is None or n.kind is not NodeKind.COMPUTE:
                continue
            d = Diff(self.alg, n.inputs, a, n.param_dict, out=lambda n=n: n)
            for inp, g in zip(n.inputs, apply_rule(OPS[n.op].grad, d)):
                if g is not None:
                    self.add(inp, g)

    def propagate_late(self, n: Node) -> None:
        """The rule of ``n``, a reduction feeding computation or a value computed from one:
        over its gradient in its own shape, what the tile's uses contribute summed in."""
        e, a = self.exact.get(id(n)), self.adj.get(id(n))
        if a is not None:  # what the tile's uses contribute, summed over each row
            row = self.tile_sum(a, n)
            e = row if e is None else ir.compute_node("add", (e, row))
        if e is None or ir.is_shift(n):  # a shift passes no gradient (ir.is_shift)
            return
        shift = ir.shift_of(self.dag, n) if n.kind is NodeKind.REDUCE else None
        ins, out, ties = n.inputs, n, None
        if id(n) in self.ties_of:  # a max or min: the rule's "x == out" is the forward's mask
            ins, out = (ir.load_node(self.ties_of[id(n)]),), ir.const_node(1.0)
            ties = self.tile_sum(ins[0], n)
        d = Diff(self.alg, ins, e, n.param_dict, out=lambda out=out: out,
                 shift=(lambda: shift) if shift is not None else None,
                 ties=(lambda: ties) if ties is not None else None)
        for inp, g in zip(n.inputs, apply_rule(OPS[n.op].grad, d)):
            if g is None:
                continue
            if n.kind is NodeKind.REDUCE:  # its rule, over the tile
                self.add(inp, g)
            elif id(inp) in self.late and inp.space is not Space.FULL:
                self.add_exact(inp, g)
            else:  # summed over the dims n lacks, as an output's gradient would be
                self.add(inp, self.spread_over(g, n.space, n.batched))

    # -- the backward epilogue
    def gradients(self) -> tuple[list[Output], list[tuple[str, str]], set[str]]:
        """The outputs holding the wanted gradients: dAccum (a gated epilogue's gate and up
        halves) and each operand's, reduced to its shape; what each holds; the full operands
        whose per-batch gradient the caller sums over L."""
        outputs, results, batch_summed = [], [], set()
        adj, wanted, names = self.adj, self.wanted, self.names
        for acc in (n for n in self.dag.nodes if n.kind is NodeKind.ACCUM):  # gated: gate, up
            if ACCUM in wanted and id(acc) in adj:
                out_name = "D" if acc.op is None else names(f"grad_{acc.op}")
                outputs.append(Output(out_name, adj[id(acc)], OutputKind.FULL, self.plan.work,
                                      True))
                results.append((accum_target(acc.op), out_name))
        loads = {n.operand.name: n for n in self.dag.nodes if n.kind is NodeKind.LOAD}
        for spec in self.dag.operands:
            n = loads.get(spec.name)
            if spec.name not in wanted or n is None or id(n) not in adj:
                continue
            out_name = names(f"grad_{spec.name}")
            a = adj[id(n)]
            if spec.kind is OperandKind.FULL:
                per_batch = not spec.batched and self.batches > 1
                if per_batch:
                    batch_summed.add(spec.name)
                outputs.append(Output(out_name, a, OutputKind.FULL, spec.dtype,
                                      spec.batched or per_batch))
            else:
                kind = {OperandKind.PER_ROW: OutputKind.ROW, OperandKind.PER_COL: OutputKind.COL,
                        OperandKind.DEVICE_SCALAR: OutputKind.SCALAR}[spec.kind]
                node = ir.reduce_node("sum", a, kind.space, spec.batched, var=out_name)
                outputs.append(Output(out_name, node, kind, spec.dtype, spec.batched))
            results.append((spec.name, out_name))
        return outputs, results, batch_summed

    def finish(self, outputs: list[Output], results: list[tuple[str, str]],
               batch_summed: set[str], name: str) -> BackwardPlan:
        """The backward DAG of ``outputs`` (and the scratch ones), reading what the forward
        kept, optimised, with the operands it reads."""
        plan, dag = self.plan, self.dag
        # every epilogue returns a D: here unstored, a literal (reading no accumulator)
        filler = Output("D", ir.const_node(0.0), OutputKind.NONE, None, False)
        if not any(o.name == "D" for o in outputs):
            outputs.insert(0, filler)
        outputs += self.scratch
        bwd = Dag(tuple(outputs), tuple(self.operands), name, dag.gated)
        bwd, unsaved = self.read_kept(bwd)
        bwd = optimize(bwd, dtype=plan.work)
        if not any(o.name == "D" for o in bwd.outputs):  # dead-code elimination dropped it
            bwd = bwd.replace_outputs((filler, *bwd.outputs))
        # gated while it still reads the accumulator's pairs (not when it reads saved copies)
        gated = any(n.kind is NodeKind.ACCUM for n in bwd.nodes) and dag.gated
        bwd = Dag(bwd.outputs, bwd.used_operands, name, gated)
        used = {o.name for o in bwd.operands}
        first = self.first
        return BackwardPlan(bwd, tuple(self.grads),
                            tuple((s, n) for s, n in self.saved_ops if n in used),
                            tuple(i for i in self.injected if i.name in used), tuple(results),
                            frozenset(batch_summed), first.name if first.name in used else None,
                            scratch=tuple(o.name for o in self.scratch),
                            unsaved_decisions=tuple(unsaved), work=plan.work)

    def read_kept(self, bwd: Dag) -> tuple[Dag, list[Node]]:
        """``bwd`` reading what the forward kept: its decisions (the others returned, for
        ``plan_forward`` to save), the reductions feeding computation as it stored them and,
        in "save" mode, its copy of the accumulator."""
        plan, dag, names, by_name = self.plan, self.dag, self.names, self.by_name
        forward_ids = frozenset(id(n) for n in dag.nodes)
        unsaved: list[Node] = []
        decided: dict[int, OperandSpec] = {}
        kept_decisions = dict(plan.decisions)
        memo: dict[int, tuple] = {}
        for n in _decisions(bwd, forward_ids):  # taken as the forward took them
            sname = kept_decisions.get(decision_key(n, forward_ids, memo))
            if sname is None:
                unsaved.append(n)
                continue
            s = by_name[sname]
            decided[id(n)] = dspec = _spec(names(s.name), s.kind, s.dtype, s.batched)
            self.saved_ops.append((s.name, dspec.name))
        loads = {}
        for k, sname in plan.values:  # the reductions feeding computation, as stored
            s = by_name[sname]
            vspec = _spec(names(s.name), s.kind, plan.work, s.batched)
            loads[id(dag.nodes[k])] = vspec
            self.saved_ops.append((s.name, vspec.name))
        if decided or loads:  # in one rewrite: either alone would rebuild the other's nodes
            bwd = read_saved(bwd, decided, loads)
        for kept in plan.saved_accums:  # "save" mode: read from the forward's copy
            kspec = OperandSpec(names(kept.name), OperandKind.FULL, kept.dtype, kept.batched)
            self.saved_ops.append((kept.name, kspec.name))
            part = None if kept.of == ACCUM else kept.of.split(".")[1]
            bwd = read_saved_accumulator(bwd, kspec, part)
        return bwd, unsaved
