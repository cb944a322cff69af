"""Reverse-mode differentiation of an epilogue DAG (layer: passes).

Two named steps, pure functions of immutable DAGs:

* ``plan_forward(dag, wrt)``: which nodes a gradient reaches (those depending on ``wrt``:
  ``"accum"`` when A or B needs one, and the names of operands that do), an
  ``EpilogueError`` naming the op, its variable and line where a gradient must flow through
  an op without derivative, and what the backward will need from the forward beyond what it
  recomputes: a logsumexp's result in fp32 (the output itself when it is fp32) and a max's
  or min's argument (stored, so that the backward sees exactly the elements the forward
  compared), the result of a per-row reduction feeding computation and, for a max or min
  among those, the mask of its ties (uint8: where its argument equals it, as the forward
  compared them; the backward counts them in the kernel). A row function's
  max (softmax's: ``ir.is_shift``) passes no gradient; shifted_sumexp's rule holds it
  fixed. And the forward's *decisions*: every comparison the backward evaluates on values
  computed from the accumulator (relu's ``x > 0``, where's condition, clamp's bounds, a
  maximum's side, abs's sign), as a uint8 mask, and every step function's value it reads
  (floor, sign, a cast to an integer), in fp32: a recomputed or saved-and-rounded
  accumulator differs from the forward's in its last bits, and a decision taken on it can
  flip, so the backward would differentiate another function. Those are hidden outputs of
  the ``augmented`` forward DAG. In "save" mode (``save_accum``: a dtype), where the
  backward still reads the accumulator, the accumulator itself too, in that dtype (fp32
  where the backward combines it with a reduction the forward computed in fp32, such as
  softmax's logsumexp: a rounded copy there moves ``exp(x - lse)`` by |x| ulps, and where
  a scalar operand's gradient sums it over the whole problem, ``_sums_accumulator``): the
  backward then reads it instead of recomputing ``A @ B``.
* ``backward(plan, graded, wanted)``: the backward DAG, a new epilogue of the same GEMM.
  Its operands are the forward's, the gradients of the outputs in ``graded`` (shaped as
  the outputs: a per-row reduction's gradient is a per-row vector), and the saved values;
  it recomputes every forward value it needs from ``accum`` (from the saved accumulator in
  "save" mode: ``passes.read_saved_accumulator``, so no GEMM) and returns ``D`` (dAccum, the
  accumulator's gradient) and the gradient of each operand in ``wanted``, reduced in the
  same epilogue to the operand's shape (a bias's over the rows, a per-row vector's over the
  columns, a scalar's over everything, each keeping its own batches). Each node's gradient
  comes from its op-table row's rule (``optable``: ``OpDef.grad``); the result is simplified
  by the ordinary pass pipeline (``passes.optimize``): an epilogue DAG like any other, so it
  runs wherever an epilogue runs (``dag_epilogue.DagEpilogue``); ``BackwardPlan.source``
  prints it (``unparse.to_source``) for people.

What is left to the caller (``runtime.autograd``): dA = dAccum @ B^T and dB = A^T @ dAccum,
the sum over L of the gradient of a full operand shared by all batches (an epilogue output
cannot reduce over L alone), and the gradient of a max's or min's saved argument (``Injected``:
the row's rule evaluated in torch, where the ties can be counted).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Iterable

import torch

from . import ir
from .derivative import Diff, NoDerivative, apply_rule
from .errors import EpilogueError
from .ir import Dag, Node, NodeKind, OperandKind, OperandSpec, Output, OutputKind, Space
from .optable import OPS, TorchAlgebra
from .passes import optimize, read_saved_accumulator, read_saved_decisions, read_saved_values
from .unparse import to_source

ACCUM = "accum"  # in ``wrt`` / ``wanted``: the accumulator (A and B)


def accum_target(part: str | None) -> str:
    """Where a backward plan's ``outputs`` put the accumulator's gradient: ``accum``, or for
    a gated epilogue (``pairs(accum)``) ``accum.gate`` and ``accum.up``, the gradients of its
    even and odd columns (the caller interleaves them)."""
    return ACCUM if part is None else f"{ACCUM}.{part}"


ACCUM_TARGETS = (ACCUM, *(accum_target(p) for p in ir.PAIR_PARTS))
_KIND_OF_SPACE = {Space.FULL: OutputKind.FULL, Space.ROW: OutputKind.ROW,
                  Space.COL: OutputKind.COL, Space.SCALAR: OutputKind.SCALAR}
_OPERAND_OF_OUTPUT = {OutputKind.FULL: OperandKind.FULL, OutputKind.ROW: OperandKind.PER_ROW,
                      OutputKind.COL: OperandKind.PER_COL,
                      OutputKind.SCALAR: OperandKind.DEVICE_SCALAR}


def differentiable_dtype(dtype: torch.dtype | None) -> bool:
    """Whether an output of this dtype carries a gradient (torch: floating point only)."""
    return dtype is not None and dtype.is_floating_point


@dataclass(frozen=True)
class Saved:
    """A forward value the backward reads: ``result`` (a reduction's, in fp32),
    ``argument`` (what a max or min reduced), ``value`` (in fp32, a reduction whose result
    feeds computation: ``ForwardPlan.values``), ``ties`` (uint8, 1 where the argument of a
    max or min feeding computation equals its result: ``ForwardPlan.ties``), ``decision``
    (a comparison the backward evaluates, as the forward's uint8 mask, or a step
    function's value in fp32: ``ForwardPlan.decisions``) or ``accum``
    (the accumulator, in "save" mode, in ``dtype``); ``hidden``: stored by an extra output
    of the augmented forward named ``name`` (else it is the output ``of`` itself)."""

    name: str
    of: str  # the forward output (a reduction) it serves; ``accum`` for the accumulator
    role: str  # "result" | "argument" | "value" | "ties" | "decision" | "accum"
    kind: OutputKind
    batched: bool
    hidden: bool
    dtype: torch.dtype = torch.float32


@dataclass(frozen=True)
class ForwardPlan:
    dag: Dag  # the forward, as bound
    wrt: frozenset[str]
    active: frozenset[int]  # ids of the nodes a gradient can reach
    saved: tuple[Saved, ...]
    augmented: Dag  # ``dag`` with the hidden outputs of ``saved``
    names: frozenset[str]  # every name the forward uses (operands, outputs, hidden ones)
    # reductions feeding computation whose result the backward reads: (the node's index in
    # ``dag.nodes``, the ``Saved`` of role "value" holding it)
    values: tuple[tuple[int, str], ...] = ()
    # a max or min among them: (its index, the ``Saved`` of role "ties" holding the mask of
    # its ties: the backward counts them as the forward compared, not in a recomputed
    # accumulator, which differs in its last bits)
    ties: tuple[tuple[int, str], ...] = ()
    # the decisions the backward takes as the forward took them (``decision_key`` of the
    # node -> the ``Saved`` of role "decision" holding it)
    decisions: tuple[tuple[tuple, str], ...] = ()
    # the dtype the forward keeps its saved values in and the backward its own (dAccum,
    # scratch, injected and saved operands): float64 where the kernels compute in it
    work: torch.dtype = torch.float32

    @property
    def saved_accums(self) -> tuple[Saved, ...]:
        """The saved accumulator ("save" mode; a gated epilogue's gate and up halves), or
        nothing: the backward recomputes A @ B."""
        return tuple(s for s in self.saved if s.role == "accum")

    def differentiable_outputs(self) -> tuple[Output, ...]:
        """The outputs a gradient can come from: stored, floating point, reached from wrt."""
        return tuple(o for o in self.dag.outputs
                     if o.kind is not OutputKind.NONE and differentiable_dtype(o.dtype)
                     and id(o.node) in self.active)


@dataclass(frozen=True)
class Injected:
    """A gradient computed outside the kernel and read by it: the gradient of a max's or
    min's saved argument ``saved``, from output ``of``'s gradient (``OpDef.grad`` of the
    reduction evaluated in torch: ``runtime.autograd``)."""

    name: str  # the backward operand
    saved: Saved
    of: str
    op: str  # the reduction's row
    kind: OutputKind  # the output ``of``'s kind and batching
    batched: bool


@dataclass(frozen=True)
class BackwardPlan:
    """The backward epilogue and how to call it. ``grads``: forward output -> the operand
    carrying its gradient; ``saved``: saved value name -> backward operand; ``outputs``:
    ``accum`` or a forward operand -> the backward output holding its gradient (absent:
    no gradient reaches it); ``batch_summed``: full operands shared by all batches, whose
    per-batch gradient the caller sums over L; ``caller_sums``: outputs that hold the term
    of a reduction the caller computes (a grouped kernel's operand gradients,
    ``grouped_autograd.rowwise``): output name -> (the reduction's kind, batched)."""

    dag: Dag  # optimised, only the operands it reads
    grads: tuple[tuple[str, str], ...]
    saved: tuple[tuple[str, str], ...]
    injected: tuple[Injected, ...]
    outputs: tuple[tuple[str, str], ...]
    batch_summed: frozenset[str]
    first_batch: str | None = None  # operand: (L, 1, 1), 1.0 for batch 0 and 0.0 after
    caller_sums: tuple[tuple[str, OutputKind, bool], ...] = ()
    # outputs the caller allocates (fp32, their kind's shape) and drops: a per-column or
    # whole-output sum the backward's own computation uses, returned because the epilogue
    # language reduces a value it does not return over each row
    scratch: tuple[str, ...] = ()
    # decisions it evaluates that the forward plan did not save (``plan_forward`` saves
    # those of its trial backward; a final backward has none)
    unsaved_decisions: tuple[Node, ...] = ()
    work: torch.dtype = torch.float32  # the forward plan's (``ForwardPlan.work``)

    @property
    def empty(self) -> bool:
        """Nothing to compute: no gradient reaches anything wanted."""
        return not self.outputs

    @functools.cached_property
    def source(self) -> str:
        """The backward epilogue as source text, to show (``evtfuse show``): the runtime
        runs ``dag``."""
        return to_source(self.dag)


class _Namer:
    """Fresh names beside a set of taken ones (the forward's operands and outputs)."""

    def __init__(self, taken: Iterable[str]):
        self.taken = set(taken) | {ACCUM, "D"}

    def __call__(self, base: str) -> str:
        name, k = base, 1
        while name in self.taken:
            name, k = f"{base}_{k}", k + 1
        self.taken.add(name)
        return name


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


def plan_forward(dag: Dag, wrt: Iterable[str], parsed=None, *,
                 save_accum: torch.dtype | None = None, batches: int = 1,
                 work: torch.dtype = torch.float32) -> ForwardPlan:
    """What differentiating ``dag`` with respect to ``wrt`` needs (see the module's text);
    ``parsed``: the ``ParsedEpilogue`` it was bound from, for error messages.
    ``save_accum``: "save" mode, the dtype in which the forward stores the accumulator
    when its backward reads it (None: the backward recomputes it); ``batches``: the
    problem's L (the saved accumulator is per batch when L > 1); ``work``: the dtype of
    the saved values ("in fp32" below: float64 where the kernels compute in float64)."""
    wrt = frozenset(wrt)
    active = _active(dag, wrt)
    names = _Namer([o.name for o in dag.operands] + [o.name for o in dag.outputs])
    plan = ForwardPlan(dag, wrt, active, (), dag, frozenset(), work=work)
    outputs = plan.differentiable_outputs()
    reach = _reaching(dag, outputs, active)
    late = ir.after_reduction(dag)
    for n in dag.nodes:  # every op a gradient passes through must have a derivative
        if id(n) in reach and id(n) in late:
            why = _late_refusal(dag, n, late)
            if why:
                raise _no_derivative(n, why, parsed, wrt)
            if batches > 1 and ir.reduces_shared(n) and id(n.inputs[0]) in active:
                raise _no_derivative(n, "it reduces values the batches share (an operand "
                                     "without L) and feeds computation: its gradient per batch "
                                     "is not computed yet; give the operand its own batches "
                                     "(expand it to (L, M, N))", parsed, wrt)
        if id(n) in reach and n.kind is NodeKind.COMPUTE:
            try:
                _probe_rule(n)
            except NoDerivative as exc:
                raise _no_derivative(n, str(exc), parsed, wrt) from None
    saved: list[Saved] = []
    hidden: list[Output] = []
    for o in outputs:
        if o.node.kind is not NodeKind.REDUCE or id(o.node) in late:  # (late: below)
            continue
        try:
            used = _probe_rule(o.node, reduction=True).used
        except NoDerivative as exc:  # (a shifted_sumexp written on its own)
            raise _no_derivative(o.node, str(exc), parsed, wrt) from None
        if "ties" in used:  # max / min: keep the argument itself
            src = o.node.inputs[0]
            s = Saved(names(f"saved_{o.name}_arg"), o.name, "argument",
                      _KIND_OF_SPACE[src.space], src.batched, True, work)
            hidden.append(Output(s.name, src, s.kind, work, s.batched))
            saved.append(s)
        elif "out" in used:  # logsumexp: its result, in fp32
            if o.dtype == work:
                saved.append(Saved(o.name, o.name, "result", o.kind, o.batched, False, work))
            else:
                s = Saved(names(f"saved_{o.name}"), o.name, "result", o.kind, o.batched, True,
                          work)
                again = ir.reduce_node(o.node.op, o.node.inputs[0], o.kind.space, o.batched,
                                       var=s.name, line=o.node.line)
                hidden.append(Output(s.name, again, s.kind, work, s.batched))
                saved.append(s)
    values: list[tuple[int, str]] = []
    ties: list[tuple[int, str]] = []
    for k, n in enumerate(dag.nodes):  # reductions feeding computation: their results
        if n.kind is not NodeKind.REDUCE or id(n) not in late or id(n) not in reach:
            continue
        kind = _KIND_OF_SPACE[n.space]
        label = n.var or f"the {n.op} of line {n.line}"
        # kept per batch where it reduces values the batches share (ir.reduces_shared):
        # kept without L it would hold the sum of the L batches' copies
        per_batch = n.batched or (batches > 1 and ir.reduces_shared(n))
        if not ir.is_shift(n) and "ties" in _probe_reduction(dag, n).used:
            tied = ir.compute_node("eq", (n.inputs[0], n))  # a max or min: its ties
            t = Saved(names(f"saved_{n.var or n.op}_ties"), label, "ties",
                      _KIND_OF_SPACE[tied.space], tied.batched or per_batch, True, torch.uint8)
            hidden.append(Output(t.name, tied, t.kind, torch.uint8, t.batched))
            saved.append(t)
            ties.append((k, t.name))
        out = next((o for o in dag.outputs if o.node is n and o.dtype == work
                    and o.kind is kind and o.batched == per_batch), None)
        if out is not None:  # the output itself holds it in fp32
            s = Saved(out.name, out.name, "value", kind, per_batch, False, work)
        else:
            s = Saved(names(f"saved_{n.var or n.op}"), label, "value", kind, per_batch, True,
                      work)
            hidden.append(Output(s.name, n, kind, work, per_batch))
        saved.append(s)
        values.append((k, s.name))
    decisions: list[tuple[tuple, str]] = []
    if outputs:  # a trial backward says what it reads and which decisions it takes
        trial = ForwardPlan(dag, wrt, active, tuple(saved), dag, frozenset(names.taken),
                            tuple(values), tuple(ties), work=work)
        tried = backward(trial, [o.name for o in outputs], wrt, batches=batches)
        if values:  # keep those it reads (mean's sum: none, the count is a constant)
            read = {name for name, _ in tried.saved}
            dropped = {name for _, name in values + ties} - read
            values = [v for v in values if v[1] in read]
            ties = [v for v in ties if v[1] in read]
            saved = [v for v in saved if v.name not in dropped]
            hidden = [h for h in hidden if h.name not in dropped]
        forward_ids = frozenset(id(n) for n in dag.nodes)
        memo: dict[int, tuple] = {}
        for n in tried.unsaved_decisions:  # each as the forward took it
            mask = n.dtype is torch.bool
            named = _first_named(n)
            base = named.var if named is not None else n.op
            label = base if named is None or named.line is None else \
                f"{base} (line {named.line})"
            s = Saved(names(f"saved_{base}_{'mask' if mask else 'step'}"), label, "decision",
                      _KIND_OF_SPACE[n.space], n.batched, True,
                      torch.uint8 if mask else work)
            hidden.append(Output(s.name, n, s.kind, s.dtype, s.batched))
            saved.append(s)
            decisions.append((decision_key(n, forward_ids, memo), s.name))
    augmented = dag.replace_outputs(dag.outputs + tuple(hidden)) if hidden else dag
    plan = ForwardPlan(dag, wrt, active, tuple(saved), augmented, frozenset(names.taken),
                       tuple(values), tuple(ties), tuple(decisions), work)
    if save_accum is None or not reads_accumulator(plan, batches):
        return plan
    if save_accum.itemsize < work.itemsize and (
            values or any(s.role == "result" for s in saved) or _sums_accumulator(plan, batches)):
        # read beside a reduction the forward took in its working precision, or summed
        # over the whole problem into one number
        save_accum = work
    for acc in (n for n in dag.nodes if n.kind is NodeKind.ACCUM):  # gated: gate and up
        s = Saved(names(f"saved_{acc.var}"), accum_target(acc.op), "accum", OutputKind.FULL,
                  batches > 1, True, save_accum)
        hidden.append(Output(s.name, acc, OutputKind.FULL, save_accum, s.batched))
        saved.append(s)
    return ForwardPlan(dag, wrt, active, tuple(saved),
                       dag.replace_outputs(dag.outputs + tuple(hidden)), frozenset(names.taken),
                       tuple(values), tuple(ties), tuple(decisions), work)


def reads_accumulator(plan: ForwardPlan, batches: int = 1) -> bool:
    """Whether some backward of ``plan`` reads the accumulator (then "save" mode can spare
    it a GEMM): the backward of every differentiable output for everything in ``wrt`` reads
    all that any other does."""
    graded = [o.name for o in plan.differentiable_outputs()]
    if not graded:
        return False
    bwd = backward(plan, graded, plan.wrt, batches=batches).dag
    return any(n.kind is NodeKind.ACCUM for n in bwd.nodes)


def _sums_accumulator(plan: ForwardPlan, batches: int) -> bool:
    """Whether the gradient of a scalar operand (``alpha`` of ``alpha * accum``: one sum over
    the whole problem) reads the accumulator. Such a sum of terms of both signs can cancel
    to a few parts in a thousand of its terms' sizes (one fuzz draw: 67 from terms summing
    to 54,000 in magnitude), and a copy of the accumulator rounded to 16 bits then moves it
    by percents - with no other entries to average over, as a vector's gradient has. Its
    accumulator is saved in fp32 (twice the memory, for such epilogues only)."""
    scalars = {o.name for o in plan.dag.operands if o.name in plan.wrt
               and o.kind.space is Space.SCALAR}
    graded = [o.name for o in plan.differentiable_outputs()]
    if not scalars or not graded:
        return False
    bwd = backward(plan, graded, scalars, batches=batches).dag
    return any(n.kind is NodeKind.ACCUM for n in bwd.nodes)


def _spec(name: str, kind: OutputKind, dtype, batched: bool) -> OperandSpec:
    return OperandSpec(name, _OPERAND_OF_OUTPUT[kind], dtype, batched)


def backward(plan: ForwardPlan, graded: Iterable[str], wanted: Iterable[str], *,
             batches: int = 1, name: str = "backward") -> BackwardPlan:
    """The backward epilogue of ``plan`` for gradients arriving at the outputs ``graded``,
    giving the gradients of ``wanted`` (``accum`` and operand names, within ``plan.wrt``).
    ``batches``: the problem's L (a full operand shared by L > 1 batches gets a per-batch
    gradient, summed by the caller)."""
    dag, active = plan.dag, plan.active
    wanted = frozenset(wanted) & plan.wrt
    names = _Namer(plan.names)
    alg = _NodeAlgebra()
    adj: dict[int, Node] = {}

    def add(n: Node, g: Node) -> None:
        if id(n) in active:
            adj[id(n)] = g if id(n) not in adj else ir.compute_node("add", (adj[id(n)], g))

    graded = set(graded)
    grads, saved_ops, injected, operands = [], [], [], list(dag.operands)
    first = OperandSpec(names("first_batch"), OperandKind.DEVICE_SCALAR, torch.float32, True)

    def spread(e: Node, lacks_m: bool, lacks_n: bool, lacks_l: bool) -> Node:
        """An adjoint already summed over the dims a value lacks, as a contribution to be
        summed over them like every other: kept at one representative (row 0, column 0,
        batch 0), zero elsewhere. Exact (a select, no division)."""
        for lacks, axis in ((lacks_m, "row"), (lacks_n, "col")):
            if lacks:
                at0 = ir.compute_node("eq", (ir.index_node(axis), ir.const_node(0.0)))
                e = ir.compute_node("where", (at0, e, ir.const_node(0.0)))
        if lacks_l and batches > 1:
            if first not in operands:
                operands.append(first)
            e = ir.compute_node("where", (ir.load_node(first), e, ir.const_node(0.0)))
        return e

    # values computed from a reduction (per row, column or whole: ``_late_refusal``) take
    # their gradient as a value of their own shape ("exact": not spread), which the
    # reduction's rule broadcasts back over the tile; what flows from them into other
    # values is spread as everything else is
    late = ir.after_reduction(dag)
    exact: dict[int, Node] = {}
    by_name = {s.name: s for s in plan.saved}
    ties_of: dict[int, OperandSpec] = {}  # a max or min feeding computation: its ties
    for k, sname in plan.ties:
        t = by_name[sname]
        ties_of[id(dag.nodes[k])] = spec = _spec(names(t.name), t.kind, t.dtype, t.batched)
        operands.append(spec)
        saved_ops.append((t.name, spec.name))

    scratch: list[Output] = []

    def tile_sum(x: Node, n: Node) -> Node:
        """``x`` summed over the dims ``n`` lacks, for the backward's own computation: a
        per-row sum, batches apart, as an unreturned reduction; any other (per column,
        whole, over the batches too) also returned, as scratch (the language reduces a
        value it does not return over each row, batches apart)."""
        r = ir.reduce_node("sum", x, n.space, n.batched)
        if n.space is not Space.ROW or (not n.batched and batches > 1):
            scratch.append(Output(names("scratch"), r, _KIND_OF_SPACE[n.space], plan.work,
                                  n.batched))
        return r

    def add_exact(n: Node, g: Node) -> None:
        if id(n) in active:
            exact[id(n)] = g if id(n) not in exact else ir.compute_node("add", (exact[id(n)], g))

    saved_of = {(s.of, s.role): s for s in plan.saved}
    for o in plan.differentiable_outputs():
        if o.name not in graded:
            continue
        gname = names(f"grad_{o.name}")
        gspec = _spec(gname, o.kind, o.dtype, o.batched)
        operands.append(gspec)
        grads.append((o.name, gname))
        g = ir.load_node(gspec)
        if id(o.node) in late and o.node.space is not Space.FULL and o.kind is not OutputKind.FULL:
            add_exact(o.node, g)  # a reduction or a mean, stored in its own shape
            continue
        if o.node.kind is not NodeKind.REDUCE:  # stored once per element of the output
            add(o.node, spread(g, o.kind in (OutputKind.COL, OutputKind.SCALAR),
                               o.kind in (OutputKind.ROW, OutputKind.SCALAR), not o.batched))
            continue
        src = o.node.inputs[0]
        arg = saved_of.get((o.name, "argument"))
        if arg is not None:  # max / min: the saved argument's gradient comes from torch
            iname = names(f"grad_{arg.name}")
            ispec = OperandSpec(iname, _OPERAND_OF_OUTPUT[arg.kind], plan.work, arg.batched)
            operands.append(ispec)
            injected.append(Injected(iname, arg, o.name, o.node.op, o.kind, o.batched))
            add(src, spread(ir.load_node(ispec), src.space in (Space.COL, Space.SCALAR),
                            src.space in (Space.ROW, Space.SCALAR), not src.batched))
            continue
        res = saved_of.get((o.name, "result"))
        out = None
        if res is not None:
            sname = names(f"saved_{o.name}") if not res.hidden else names(res.name)
            sspec = _spec(sname, res.kind, plan.work, res.batched)
            operands.append(sspec)
            saved_ops.append((res.name, sname))
            out = ir.load_node(sspec)
        d = Diff(alg, (src,), g, o.node.param_dict, out=(lambda: out) if out is not None else None)
        (contribution,) = apply_rule(OPS[o.node.op].grad, d)
        if contribution is not None:
            add(src, contribution)
    for n in reversed(dag.nodes):
        if id(n) in late and n.space is not Space.FULL:
            # a reduction feeding computation, or a value computed from one
            e, a = exact.get(id(n)), adj.get(id(n))
            if a is not None:  # what the tile's uses contribute, summed over each row
                row = tile_sum(a, n)
                e = row if e is None else ir.compute_node("add", (e, row))
            if e is None or ir.is_shift(n):  # a shift passes no gradient (ir.is_shift)
                continue
            shift = ir.shift_of(dag, n) if n.kind is NodeKind.REDUCE else None
            ins, out, ties = n.inputs, n, None
            if id(n) in ties_of:  # a max or min: the rule's "x == out" is the forward's mask
                ins, out = (ir.load_node(ties_of[id(n)]),), ir.const_node(1.0)
                ties = tile_sum(ins[0], n)
            d = Diff(alg, ins, e, n.param_dict, out=lambda out=out: out,
                     shift=(lambda: shift) if shift is not None else None,
                     ties=(lambda: ties) if ties is not None else None)
            for inp, g in zip(n.inputs, apply_rule(OPS[n.op].grad, d)):
                if g is None:
                    continue
                if n.kind is NodeKind.REDUCE:  # its rule, over the tile
                    add(inp, g)
                elif id(inp) in late and inp.space is not Space.FULL:
                    add_exact(inp, g)
                else:  # summed over the dims n lacks, as an output's gradient would be
                    add(inp, spread(g, n.space in (Space.COL, Space.SCALAR),
                                    n.space in (Space.ROW, Space.SCALAR), not n.batched))
            continue
        a = adj.get(id(n))
        if a is None or n.kind is not NodeKind.COMPUTE:
            continue
        d = Diff(alg, n.inputs, a, n.param_dict, out=lambda n=n: n)
        for inp, g in zip(n.inputs, apply_rule(OPS[n.op].grad, d)):
            if g is not None:
                add(inp, g)
    outputs, results, batch_summed = [], [], set()
    for acc in (n for n in dag.nodes if n.kind is NodeKind.ACCUM):  # gated: gate and up
        if ACCUM in wanted and id(acc) in adj:
            out_name = "D" if acc.op is None else names(f"grad_{acc.op}")
            outputs.append(Output(out_name, adj[id(acc)], OutputKind.FULL, plan.work, True))
            results.append((accum_target(acc.op), out_name))
    loads = {n.operand.name: n for n in dag.nodes if n.kind is NodeKind.LOAD}
    for spec in dag.operands:
        n = loads.get(spec.name)
        if spec.name not in wanted or n is None or id(n) not in adj:
            continue
        out_name = names(f"grad_{spec.name}")
        a = adj[id(n)]
        if spec.kind is OperandKind.FULL:
            per_batch = not spec.batched and batches > 1
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
    # every epilogue returns a D: here unstored, a literal (reading no accumulator)
    filler = Output("D", ir.const_node(0.0), OutputKind.NONE, None, False)
    if not any(o.name == "D" for o in outputs):
        outputs.insert(0, filler)
    outputs += scratch
    bwd = Dag(tuple(outputs), tuple(operands), name, dag.gated)
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
        saved_ops.append((s.name, dspec.name))
    if decided:
        bwd = read_saved_decisions(bwd, decided)
    if plan.values:  # the reductions feeding computation: read as the forward stored them
        loads = {}
        for k, sname in plan.values:
            s = by_name[sname]
            vspec = _spec(names(s.name), s.kind, plan.work, s.batched)
            loads[id(dag.nodes[k])] = vspec
            saved_ops.append((s.name, vspec.name))
        bwd = read_saved_values(bwd, loads)
    for kept in plan.saved_accums:  # "save" mode: the accumulator is read from the forward's copy
        kspec = OperandSpec(names(kept.name), OperandKind.FULL, kept.dtype, kept.batched)
        saved_ops.append((kept.name, kspec.name))
        part = None if kept.of == ACCUM else kept.of.split(".")[1]
        bwd = read_saved_accumulator(bwd, kspec, part)
    bwd = optimize(bwd, dtype=plan.work)
    if not any(o.name == "D" for o in bwd.outputs):  # dead-code elimination dropped it
        bwd = bwd.replace_outputs((filler, *bwd.outputs))
    # gated while it still reads the accumulator's pairs (not when it reads saved copies)
    gated = any(n.kind is NodeKind.ACCUM for n in bwd.nodes) and dag.gated
    bwd = Dag(bwd.outputs, bwd.used_operands, name, gated)
    used = {o.name for o in bwd.operands}
    return BackwardPlan(bwd, tuple(grads),
                        tuple((s, n) for s, n in saved_ops if n in used),
                        tuple(i for i in injected if i.name in used), tuple(results),
                        frozenset(batch_summed), first.name if first.name in used else None,
                        scratch=tuple(o.name for o in scratch),
                        unsaved_decisions=tuple(unsaved), work=plan.work)


def output_shape(kind: OutputKind, batched: bool, problem: tuple) -> tuple:
    """The shape of an output evtfuse stores for this kind (a hidden output's, a gradient's)."""
    L, M, N = problem
    lead = (L,) if batched else ()
    return {OutputKind.FULL: (*lead, M, N), OutputKind.ROW: (*lead, M, 1),
            OutputKind.COL: (L, 1, N) if batched else (N,),
            OutputKind.SCALAR: (L, 1, 1) if batched else (1,)}[kind]


def reduced_dims(kind: OutputKind, batched: bool) -> tuple[int, ...]:
    """The dims of (L, M, N) an output of this kind reduces (as the reference evaluator)."""
    dims = [] if batched else [0]
    if kind in (OutputKind.COL, OutputKind.SCALAR):
        dims.append(1)
    if kind in (OutputKind.ROW, OutputKind.SCALAR):
        dims.append(2)
    return tuple(dims)


def injected_gradient(inj: Injected, saved: torch.Tensor, grad: torch.Tensor,
                      problem: tuple[int, int, int]) -> torch.Tensor:
    """The gradient of a max's or min's saved argument (shaped as ``saved``) from the
    gradient ``grad`` of its result (shaped as the output): the reduction row's rule on the
    argument broadcast to (L, M, N), with its ties counted, summed back to its shape."""
    L, M, N = problem
    shape3 = (1,) * (3 - saved.dim()) + tuple(saved.shape)
    dtype = torch.promote_types(saved.dtype, torch.float32)
    x = saved.reshape(shape3).to(dtype).expand(L, M, N)
    row = OPS[inj.op]
    dims = reduced_dims(inj.kind, inj.batched)
    out = row.torch_fn(x, dims)
    ties = (x == out).sum(dim=dims, keepdim=True).to(x.dtype)
    g = grad.to(x.dtype).reshape(out.shape)
    d = Diff(TorchAlgebra(like=x), (x,), g.expand(L, M, N), {},
             out=lambda: out.expand(L, M, N), ties=lambda: ties.expand(L, M, N))
    (dx,) = apply_rule(row.grad, d)
    return dx.expand(L, M, N).sum_to_size(shape3).reshape(saved.shape)


def first_batch(batches, device) -> torch.Tensor:
    """The value of a backward's ``first_batch`` operand: (L, 1, 1), 1.0 at batch 0."""
    return (torch.arange(batches, device=device) == 0).to(torch.float32).reshape(-1, 1, 1)


def wrt_of_dag(dag: Dag) -> frozenset[str]:
    """Everything an epilogue can be differentiated with respect to: the accumulator and its
    floating-point tensor operands (what ``evtfuse show`` differentiates)."""
    return frozenset([ACCUM] + [o.name for o in dag.operands
                                if o.kind is not OperandKind.RUNTIME_SCALAR
                                and o.dtype is not None and o.dtype.is_floating_point])


__all__ = ["ACCUM", "ACCUM_TARGETS", "accum_target", "Saved", "ForwardPlan", "Injected", "BackwardPlan", "plan_forward",
           "decision_key",
           "backward", "reads_accumulator", "output_shape", "reduced_dims", "first_batch",
           "injected_gradient", "wrt_of_dag", "differentiable_dtype"]
