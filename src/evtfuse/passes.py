"""Passes: named DAG -> DAG rewrites, run in one ordered list.

Layer: passes. Each pass is a pure function of an ``ir.Dag``; ``optimize`` runs
``PIPELINE`` in order and, in debug mode (``debug=True`` or ``EVTFUSE_DEBUG=1``), checks
the DAG's invariants (``ir.verify``) before and after every pass. Every rewrite here is
exact in IEEE arithmetic: the optimised DAG computes bit-for-bit what the original
computes in fp32 (no ``x*0 -> 0``, no ``x+0 -> x``), except ``stable_forms``, whose
rewrites are exact in real arithmetic and replace a form that rounds an intermediate
(``log`` of a rounded ``sigmoid``) by one at least as accurate: results move by the ops'
own rounding, never away from the true value.
"""

from __future__ import annotations

import functools
import os
from typing import Callable

import torch

from . import ir
from .ir import Dag, Node, NodeKind, Output, OutputKind, Space
from .optable import OPS, Category, torch_apply

Pass = Callable[[Dag], Dag]


def _rebuild(dag: Dag, rewrite: Callable[[Node, tuple[Node, ...]], Node]) -> Dag:
    """Rebuild every node bottom-up: ``rewrite(node, new_inputs)`` returns its replacement."""
    new: dict[int, Node] = {}
    for n in dag.nodes:
        inputs = tuple(new[id(i)] for i in n.inputs)
        new[id(n)] = rewrite(n, inputs)
    outs = [Output(o.name, new[id(o.node)], o.kind, o.dtype, o.batched) for o in dag.outputs]
    return dag.replace_outputs(outs)


def _same_or_new(n: Node, inputs: tuple[Node, ...]) -> Node:
    if all(a is b for a, b in zip(inputs, n.inputs)):
        return n
    return ir.with_inputs(n, inputs)


# ------------------------------------------------------------------ dead code

def eliminate_dead_code(dag: Dag) -> Dag:
    """Drop unstored outputs that nothing else reads (an unused branch never reaches codegen).

    Assignments that no output reaches are already absent: a DAG holds only what its
    outputs reach.
    """
    keep: list[Output] = []
    needed = {id(n) for o in dag.outputs if o.kind is not OutputKind.NONE
              for n in Dag((o,), dag.operands, dag.name, dag.gated).nodes}
    for o in dag.outputs:
        if o.kind is OutputKind.NONE and id(o.node) not in needed:
            continue
        keep.append(o)
    return dag if len(keep) == len(dag.outputs) else dag.replace_outputs(keep)


# ------------------------------------------------------------------ constants

def _const_value(n: Node) -> float | None:
    return n.value if n.kind is NodeKind.CONST else None


def fold_constants(dag: Dag, dtype: torch.dtype = torch.float32) -> Dag:
    """Evaluate compute nodes whose inputs are all literals, in fp32 as the kernel would
    (``dtype``: float64 for a kernel that computes in float64); pick the branch of a
    ``where`` whose condition is a literal."""

    def rewrite(n: Node, inputs: tuple[Node, ...]) -> Node:
        if n.kind is not NodeKind.COMPUTE:
            return _same_or_new(n, inputs)
        row = OPS[n.op]
        if row.category is Category.SELECT and inputs[0].kind is NodeKind.CONST:
            return inputs[1] if inputs[0].value != 0 else inputs[2]
        if row.category is Category.ELEMENTWISE and inputs and \
                all(i.kind is NodeKind.CONST for i in inputs):
            vals = [torch.tensor(i.value, dtype=dtype) for i in inputs]
            out = torch_apply(row, vals, n.param_dict)
            return ir.const_node(float(out.item()), n.line)
        return _same_or_new(n, inputs)

    return _rebuild(dag, rewrite)


# ------------------------------------------------------------------ algebra

def _is(n: Node, value: float) -> bool:
    v = _const_value(n)
    return v is not None and v == value and (value != 0 or str(v) == str(value))


def _compute(n: Node, op: str) -> bool:
    """Whether ``n`` computes the op-table row ``op``."""
    return n.kind is NodeKind.COMPUTE and n.op == op


def simplify_algebra(dag: Dag) -> Dag:
    """Identities that hold bit-for-bit in IEEE fp32, NaN, infinities and signed zeros included:
    x*1, 1*x, x/1, x-0, x+(-0), x**1 -> x; x*-1 -> -x; -(-x) -> x; identity(x) -> x;
    relu(relu(x)), abs(abs(x)) -> inner; abs(-x) -> abs(x)."""

    def rewrite(n: Node, inputs: tuple[Node, ...]) -> Node:
        if n.kind is not NodeKind.COMPUTE:
            return _same_or_new(n, inputs)
        op = n.op
        a = inputs[0] if inputs else None
        b = inputs[1] if len(inputs) > 1 else None
        if op == "identity":
            return a
        if op == "mul":
            if _is(b, 1.0):
                return a
            if _is(a, 1.0):
                return b
            if _is(b, -1.0):
                return ir.compute_node("neg", (a,), var=n.var, line=n.line)
            if _is(a, -1.0):
                return ir.compute_node("neg", (b,), var=n.var, line=n.line)
        if op == "div" and _is(b, 1.0):
            return a
        if op == "sub" and _is(b, 0.0):
            return a
        if op == "add" and _is(b, -0.0):
            return a
        if op == "add" and _is(a, -0.0):
            return b
        if op == "pow" and n.param_dict.get("exponent") == 1.0:
            return a
        if op == "neg" and _compute(a, "neg"):
            return a.inputs[0]
        if op in ("relu", "abs") and _compute(a, op):
            return a
        if op == "abs" and _compute(a, "neg"):
            return ir.compute_node("abs", (a.inputs[0],), var=n.var, line=n.line)
        return _same_or_new(n, inputs)

    return _rebuild(dag, rewrite)


# ------------------------------------------------------------------ stable forms

def stable_forms(dag: Dag, dtype: torch.dtype = torch.float32) -> Dag:
    """The cross-entropy pattern ``log(clamp(s, lo, hi))`` of ``s = sigmoid(x)`` or
    ``s = 1 - sigmoid(x)``, with literal bounds ``0 < lo <= hi < 1`` -> ``clamp(log_sigmoid(x),
    log(lo), log(hi))`` (or of ``log_sigmoid(-x)``): ``s`` is in [0, 1] and log is increasing,
    NaN stays NaN. On a GPU that is no division and one transcendental less, and
    ``log_sigmoid`` does not round ``s`` first (near ``hi`` that rounding is a relative error
    of ~1e-4 in ``log(s)``). Unclamped ``log(sigmoid(x))`` is left as written: where the
    rounded sigmoid reaches 0 or 1 (|x| > ~17) the two forms differ by more than rounding,
    and the reference evaluator computes the form the user wrote."""

    def log_sigmoid_of(x: Node, line: int | None) -> Node | None:
        if _compute(x, "sigmoid"):
            return ir.compute_node("log_sigmoid", x.inputs, line=line)
        if _compute(x, "sub") and _is(x.inputs[0], 1.0) and _compute(x.inputs[1], "sigmoid"):
            neg = ir.compute_node("neg", x.inputs[1].inputs, line=line)
            return ir.compute_node("log_sigmoid", (neg,), line=line)
        return None

    def log_of(x: Node, var: str | None, line: int | None) -> Node | None:
        """``clamp(log_sigmoid(..), log(lo), log(hi))`` for ``log(x)``, or None."""
        if not _compute(x, "clamp"):
            return None
        src, lo, hi = x.inputs
        vlo, vhi = _const_value(lo), _const_value(hi)
        if vlo is None or vhi is None or not 0.0 < vlo <= vhi < 1.0:
            return None
        inner = log_sigmoid_of(src, line)
        if inner is None:
            return None
        bounds = [ir.const_node(float(torch.log(torch.tensor(v, dtype=dtype))), line)
                  for v in (vlo, vhi)]
        return ir.compute_node("clamp", (inner, *bounds), var=var, line=line)

    def rewrite(n: Node, inputs: tuple[Node, ...]) -> Node:
        if _compute(n, "log"):
            better = log_of(inputs[0], n.var, n.line)
            if better is not None:
                return better
        return _same_or_new(n, inputs)

    return _rebuild(dag, rewrite)


# ------------------------------------------------------------------ CSE

def eliminate_common_subexpressions(dag: Dag) -> Dag:
    """Compute each distinct value once: equal ops over equal inputs become one node."""
    table: dict[tuple, Node] = {}

    def key(n: Node, inputs: tuple[Node, ...]) -> tuple:
        ids = tuple(id(i) for i in inputs)
        if n.kind is NodeKind.COMPUTE and OPS[n.op].commutative:
            ids = tuple(sorted(ids))
        operand = n.operand.name if n.operand is not None else None
        value = None if n.value is None else (n.value, str(n.value))  # keeps -0.0 apart from 0.0
        return (n.kind, n.op, n.params, value, operand, ids, n.space, n.batched)

    def rewrite(n: Node, inputs: tuple[Node, ...]) -> Node:
        candidate = _same_or_new(n, inputs)
        if n.kind is NodeKind.REDUCE:
            return candidate  # each reduction belongs to its own output
        k = key(n, inputs)
        if k not in table:
            table[k] = candidate
        return table[k]

    return _rebuild(dag, rewrite)


# ------------------------------------------------------------------ reductions

def eliminate_reductions(dag: Dag) -> Dag:
    """``max``/``min`` of a value that is already constant along the reduced axes is the
    value itself (exact); sums are kept (N * x is not the sum the kernel would form)."""
    outs = []
    changed = False
    for o in dag.outputs:
        n = o.node
        if n.kind is NodeKind.REDUCE and n.op in ("max", "min"):
            src = n.inputs[0]
            fits = src.space.join(n.space) is n.space and (n.batched or not src.batched)
            if fits and src.dtype is not torch.bool:
                outs.append(Output(o.name, src, o.kind, o.dtype, o.batched))
                changed = True
                continue
        outs.append(o)
    return dag.replace_outputs(outs) if changed else dag


def read_saved_accumulator(dag: Dag, saved: ir.OperandSpec, part: str | None = None) -> Dag:
    """Every use of the accumulator (``part``: of its "gate" or "up" half, in a gated DAG)
    becomes a load of the full operand ``saved`` (that value as a forward stored it; added
    to the operands): with every part replaced, the DAG reads no ``A @ B``, so it runs over
    K = 0. Not in ``PIPELINE``: the backward of an epilogue applies it in "save" mode
    (``autodiff.backward``)."""
    assert saved.kind is ir.OperandKind.FULL, saved
    load = ir.load_node(saved)
    rebuilt = _as_loads(dag, lambda n: load if n.kind is NodeKind.ACCUM and n.op == part
                        else None)
    operands = dag.operands if saved in dag.operands else (*dag.operands, saved)
    return Dag(rebuilt.outputs, operands, dag.name, dag.gated)


def read_split_accumulator(dag: Dag, parts: tuple[ir.OperandSpec, ...]) -> Dag:
    """Every use of the accumulator becomes the sum of the full operands ``parts`` (a
    split-K GEMM's partial products over its slices of K, added in their order: the same
    sum on every run), which join the operands: the DAG reads no ``A @ B`` and runs over
    K = 0 (``runtime.split_k``'s second pass). Not for a gated DAG (its accumulator is read
    in halves). Not in ``PIPELINE``."""
    assert parts and not dag.gated, (parts, dag.gated)
    assert all(p.kind is ir.OperandKind.FULL for p in parts), parts
    total = ir.load_node(parts[0])
    for p in parts[1:]:
        total = ir.compute_node("add", (total, ir.load_node(p)))
    rebuilt = _as_loads(dag, lambda n: total if n.kind is NodeKind.ACCUM else None)
    return Dag(rebuilt.outputs, (*dag.operands, *parts), dag.name, dag.gated)


def accumulate_operand(dag: Dag, name: str) -> Dag:
    """Every load of the full operand ``name`` becomes the accumulator, and ``name`` leaves
    the operands: an epilogue that took a value as an operand runs as the epilogue of the
    GEMM producing it. A backward epilogue whose upstream gradient is ``dY @ W`` (an MLP's
    down projection's) runs over that product, with no pass of its own (``runtime.mlp``).
    Not in ``PIPELINE``."""
    spec = next(o for o in dag.operands if o.name == name)
    assert spec.kind is ir.OperandKind.FULL, spec
    accum = ir.accum_node()
    rebuilt = _as_loads(dag, lambda n: accum if n.kind is NodeKind.LOAD
                        and n.operand.name == name else None)
    return Dag(rebuilt.outputs, tuple(o for o in dag.operands if o.name != name), dag.name,
               dag.gated)


def _as_loads(dag: Dag, load_of: Callable[[Node], Node | None]) -> Dag:
    """``dag`` with every node for which ``load_of`` gives a load replaced by that load (a
    value read as a forward stored it); the operands are the caller's to add."""
    def rewrite(n: Node, inputs: tuple[Node, ...]) -> Node:
        load = load_of(n)
        return load if load is not None else _same_or_new(n, inputs)

    return _rebuild(dag, rewrite)


def broadcast_stores(dag: Dag) -> Dag:
    """A full output that holds a reduction's value itself (``t = sum(accum); D = t``, or
    ``D = t * 1.0`` once folded) stores it through ``identity``: the reduction then feeds
    computation, which computes it before the tile is stored (in one pass or two), and the
    output broadcasts it over the row. Without it the reduction was only a partial result
    and the store found no tile value (a KeyError in code generation)."""
    if not any(o.kind is OutputKind.FULL and o.node.kind is NodeKind.REDUCE
               for o in dag.outputs):
        return dag
    outs = [Output(o.name, ir.compute_node("identity", (o.node,)), o.kind, o.dtype, o.batched)
            if o.kind is OutputKind.FULL and o.node.kind is NodeKind.REDUCE else o
            for o in dag.outputs]
    return dag.replace_outputs(outs)


def read_saved(dag: Dag, decisions: dict[int, ir.OperandSpec],
               values: dict[int, ir.OperandSpec]) -> Dag:
    """What a forward kept, read instead of computed again (its operands added to the
    DAG's): each node whose id is a key of ``decisions`` (a comparison, stored as a uint8
    mask, read as ``mask != 0``; a step function's value, stored in fp32, the load itself),
    so that every decision the DAG takes is the forward's own, and each of ``values`` (a
    reduction whose result feeds computation), so that the DAG computes no reduction
    feeding computation. Both in one rewrite, while the nodes are still the forward's: a
    rewrite of either alone rebuilds the nodes above it, and the other's keys then match
    nothing (a decision below a reduction: the reduction computed again, and the backward's
    own reduction of a value computed from it, a chain no two passes run). Not in
    ``PIPELINE``: the backward of an epilogue applies it first (``autodiff.backward``)."""
    made: dict[int, Node] = {}

    def load_of(n: Node) -> Node | None:
        spec = values.get(id(n)) or decisions.get(id(n))
        if spec is None:
            return None
        if id(n) not in made:
            load = ir.load_node(spec)
            made[id(n)] = ir.compute_node("ne", (load, ir.const_node(0.0))) \
                if n.dtype is torch.bool else load  # a kept reduction is never a bool
        return made[id(n)]

    rebuilt = _as_loads(dag, load_of)
    read = {n.operand.name for n in rebuilt.nodes if n.kind is NodeKind.LOAD}
    extra = tuple(dict.fromkeys(s for s in (*decisions.values(), *values.values())
                                if s.name in read))
    return Dag(rebuilt.outputs, (*dag.operands, *extra), dag.name, dag.gated)


PIPELINE: tuple[tuple[str, Pass], ...] = (
    ("dead-code elimination", eliminate_dead_code),
    ("constant folding", fold_constants),
    ("algebraic simplification", simplify_algebra),
    ("stable forms", stable_forms),
    ("constant folding (again)", fold_constants),
    ("common-subexpression elimination", eliminate_common_subexpressions),
    ("reduction elimination", eliminate_reductions),
    ("broadcast stores", broadcast_stores),
    ("dead-code elimination (final)", eliminate_dead_code),
)


_IN_DTYPE = (fold_constants, stable_forms)  # the passes that compute values (``optimize``)


def debug_enabled() -> bool:
    return os.environ.get("EVTFUSE_DEBUG", "").lower() in ("1", "true", "yes", "debug")


def optimize(dag: Dag, debug: bool | None = None, passes=PIPELINE,
             dtype: torch.dtype = torch.float32) -> Dag:
    """Run the pass pipeline; with ``debug`` verify the DAG between passes. ``dtype``: what
    the kernel computes in (float64 for float64 inputs): the passes that compute constants
    compute them in it."""
    debug = debug_enabled() if debug is None else debug
    if dtype != torch.float32:
        passes = tuple((name, functools.partial(fn, dtype=dtype) if fn in _IN_DTYPE else fn)
                       for name, fn in passes)
    if debug:
        ir.verify(dag)
    for name, fn in passes:
        dag = fn(dag)
        if debug:
            try:
                ir.verify(dag)
            except ir.IRError as exc:
                raise ir.IRError(f"after pass '{name}': {exc}") from exc
    return dag


__all__ = ["PIPELINE", "optimize", "read_saved_accumulator", "read_split_accumulator",
           "accumulate_operand", "read_saved",
           "broadcast_stores", "eliminate_dead_code", "fold_constants", "simplify_algebra",
           "stable_forms", "eliminate_common_subexpressions", "eliminate_reductions", "Space"]
