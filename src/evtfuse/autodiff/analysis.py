"""What differentiating a DAG asks of it, node by node, before anything is built.

Layer: passes (core: ``ir``, ``derivative`` and the op table). The algebras the table's
rules run over (``_NodeAlgebra`` builds nodes, ``_Probe`` builds nothing and records what a
rule reads or whether it raises), which nodes a gradient reaches (``_active``,
``_reaching``), the error for an op without derivative on the way (``_no_derivative``,
``_late_refusal``) and the *decisions* a backward takes (``_decisions``, keyed across
backward DAGs of one plan by ``decision_key``).
"""

from __future__ import annotations

from typing import Iterable

import torch

from .. import ir
from ..derivative import Diff, NoDerivative, apply_rule
from ..errors import EpilogueError
from ..ir import Dag, Node, NodeKind, OperandKind, Output
from ..optable import OPS
from .plans import ACCUM


class _NodeAlgebra:
    """Rules build DAG nodes (derivative.py's algebra protocol)."""

    def const(self, value: float) -> Node:
        return ir.const_node(value)

    def call(self, op: str, vals: list, params: dict) -> Node:
        row = OPS[op]
        full = tuple((k, params[k] if k in params else d) for k, d in row.params)
        return ir.compute_node(op, vals, full)


class _Probe:
    """Rules run for what they read and whether they raise, building nothing."""

    def const(self, value: float):
        return None

    def call(self, op: str, vals: list, params: dict):
        return None


def _active(dag: Dag, wrt: frozenset[str]) -> frozenset[int]:
    active: set[int] = set()
    for n in dag.nodes:
        if n.kind is NodeKind.ACCUM:
            hit = ACCUM in wrt
        elif n.kind is NodeKind.LOAD:
            hit = n.operand.name in wrt and n.operand.kind is not OperandKind.RUNTIME_SCALAR
        elif n.kind in (NodeKind.COMPUTE, NodeKind.REDUCE):
            hit = n.dtype is not torch.bool and any(id(i) in active for i in n.inputs)
        else:
            hit = False
        if hit:
            active.add(id(n))
    return frozenset(active)


def _reaching(dag: Dag, outputs: Iterable[Output], active: frozenset[int]) -> set[int]:
    """Active nodes with a path to one of ``outputs`` through active nodes."""
    reach: set[int] = set()
    stack = [o.node for o in outputs if id(o.node) in active]
    while stack:
        n = stack.pop()
        if id(n) in reach:
            continue
        reach.add(id(n))
        stack.extend(i for i in n.inputs if id(i) in active)
    return reach


def _probe_rule(n: Node, reduction: bool = False, shift: bool = False) -> Diff:
    """Run ``n``'s rule on nothing: raises NoDerivative where it has none; says what it reads.
    ``shift``: a shifted reduction has its row's shift beside it."""
    row = OPS[n.op]
    if row.grad is None:
        raise NoDerivative(f"the op table gives {n.op} no derivative")
    alg = _Probe()
    d = Diff(alg, tuple(None for _ in n.inputs), None, n.param_dict, out=lambda: None,
             ties=(lambda: None) if reduction else None,
             shift=(lambda: None) if shift else None)
    apply_rule(row.grad, d)
    return d


def _probe_reduction(dag: Dag, n: Node) -> Diff:
    """``_probe_rule`` of the reduction ``n`` of ``dag``, with its shift where it has one
    (softmax's shifted_sumexp)."""
    return _probe_rule(n, reduction=True, shift=ir.shift_of(dag, n) is not None)


def _no_derivative(n: Node, reason: str, parsed, wrt: frozenset[str]) -> EpilogueError:
    var = n.var
    if var is None and parsed is not None:
        var = next((a.target for a in parsed.assignments if a.line == n.line), None)
    what = ", ".join(sorted("A, B" if w == ACCUM else w for w in wrt))
    args = ", ".join(f"{k}={v!r}" for k, v in n.params)
    message = (f"{n.op}({'...' + (', ' + args if args else '')}) "
               f"{f'in the value of {var!r} ' if var else ''}has no derivative ({reason}), and "
               f"the gradient of {what} must flow through it: compute it under "
               "torch.no_grad(), or detach the inputs that need no gradient")
    return EpilogueError(message, variable=var, line=n.line,
                         where=getattr(parsed, "where", None),
                         source_line=parsed.text_of(n.line) if parsed is not None and n.line
                         else None)


def _late_refusal(dag: Dag, n: Node, late: set[int]) -> str | None:
    """Why a gradient cannot pass ``n``, a reduction feeding computation or a value computed
    from one (None: it can). Such a value (a sum, a mean, a logsumexp, a max or min, what
    is computed from them; per row, per column or whole, per batch or shared by the
    batches) takes its gradient as a value of its own shape: summed over what it lacks
    where the tile's computation uses it (a reduction feeding computation in the backward
    too: ``backward``'s ``tile_sum``), then broadcast back by the reduction's rule."""
    if n.kind is NodeKind.REDUCE:
        if any(id(i) in late for i in n.inputs):
            return "it reduces a value computed from another reduction: not differentiated"
        if ir.is_shift(n):  # softmax's max: the gradient passes by the row's other terms
            return None
        try:
            _probe_reduction(dag, n)
        except NoDerivative as exc:
            return str(exc)
    return None


def decision_key(n: Node, forward: frozenset[int], memo: dict[int, tuple] | None = None) -> tuple:
    """What identifies a value built of forward nodes across backward DAGs built from one
    plan: a forward node by its identity (the plan holds it), a node a rule built (a
    comparison, a constant) by its structure."""
    memo = {} if memo is None else memo
    if id(n) in memo:
        return memo[id(n)]
    if id(n) in forward:
        key: tuple = ("forward", id(n))
    else:
        value = None if n.value is None else repr(n.value)
        key = (n.kind.value, n.op, n.params, value, n.space.value, n.batched, str(n.dtype),
               tuple(decision_key(i, forward, memo) for i in n.inputs))
    memo[id(n)] = key
    return key


def _decisions(bwd: Dag, forward: frozenset[int]) -> list[Node]:
    """The decisions of a backward DAG not yet reading saved values: nodes built of forward
    values alone (forward nodes, constants, indices) whose op decides (``OpDef.decides``:
    a comparison, a step function) and which depend on the accumulator other than
    through a reduction (whose result the backward reads as the forward stored it); the
    outermost ones (a condition made of comparisons is one decision)."""
    built: dict[int, bool] = {}  # of forward values alone
    from_accum: dict[int, bool] = {}
    for n in bwd.nodes:
        if n.kind is NodeKind.COMPUTE:
            built[id(n)] = id(n) in forward or all(built[id(i)] for i in n.inputs)
            from_accum[id(n)] = any(from_accum[id(i)] for i in n.inputs)
        else:  # a reduction's result is read as the forward stored it
            built[id(n)] = n.kind in (NodeKind.CONST, NodeKind.INDEX) or id(n) in forward
            from_accum[id(n)] = n.kind is NodeKind.ACCUM
    found: list[Node] = []
    seen: set[int] = set()
    stack = [o.node for o in reversed(bwd.outputs)]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if (n.kind is NodeKind.COMPUTE and built[id(n)] and from_accum[id(n)]
                and OPS[n.op].decides(n.param_dict)):
            found.append(n)
            continue
        stack.extend(reversed(n.inputs))
    return found


def _first_named(n: Node) -> Node | None:
    """The first node under ``n`` (itself included, depth first) holding a user's variable:
    what a decision's messages name (relu's ``out <= 0`` is a decision on ``F``)."""
    stack, seen = [n], set()
    while stack:
        m = stack.pop()
        if m.var:
            return m
        if id(m) not in seen:
            seen.add(id(m))
            stack.extend(reversed(m.inputs))
    return None
