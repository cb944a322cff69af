"""The forward step of differentiation: ``plan_forward`` and what it asks of a backward.

Layer: passes (core: ``ir``, ``derivative`` and the op table). ``plan_forward`` checks
that a gradient can pass every op it reaches and says what the forward must keep for its
backward (the package's text: results and arguments of stored reductions, reductions
feeding computation and their ties, the decisions a trial backward takes, in "save" mode
the accumulator), as hidden outputs of the ``augmented`` DAG. ``reads_accumulator`` (whether
"save" mode spares a GEMM) and ``wrt_of_dag`` (everything an epilogue can be differentiated
with respect to).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import torch

from .. import ir
from ..derivative import NoDerivative
from ..ir import Dag, Node, NodeKind, OperandKind, Output, OutputKind, Space
from .analysis import (_active, _first_named, _late_refusal, _no_derivative, _probe_reduction,
                       _probe_rule, _reaching, decision_key)
from .backward_step import backward
from .plans import _KIND_OF_SPACE, ACCUM, ForwardPlan, Saved, _Namer, accum_target


def plan_forward(dag: Dag, wrt: Iterable[str], parsed=None, *,
                 save_accum: torch.dtype | None = None, batches: int = 1,
                 work: torch.dtype = torch.float32) -> ForwardPlan:
    """What differentiating ``dag`` with respect to ``wrt`` needs (see the package's text);
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
    _check_derivatives(dag, wrt, active, reach, late, parsed, batches)
    kept = _Kept(names, work)
    kept.stored_reductions(outputs, late, parsed, wrt)
    kept.reductions_feeding(dag, reach, late, batches)
    if outputs:  # a trial backward says what it reads and which decisions it takes
        kept.trial(ForwardPlan(dag, wrt, active, tuple(kept.saved), dag, frozenset(names.taken),
                               tuple(kept.values), tuple(kept.ties), work=work),
                   outputs, batches)
    hidden = kept.hidden
    augmented = dag.replace_outputs(dag.outputs + tuple(hidden)) if hidden else dag
    plan = ForwardPlan(dag, wrt, active, tuple(kept.saved), augmented, frozenset(names.taken),
                       tuple(kept.values), tuple(kept.ties), tuple(kept.decisions), work)
    if save_accum is None or not reads_accumulator(plan, batches):
        return plan
    if save_accum.itemsize < work.itemsize and (
            kept.values or any(s.role == "result" for s in kept.saved)
            or _sums_accumulator(plan, batches)):
        # read beside a reduction the forward took in its working precision, or summed
        # over the whole problem into one number
        save_accum = work
    kept.accumulators(dag, save_accum, batches)
    return ForwardPlan(dag, wrt, active, tuple(kept.saved),
                       dag.replace_outputs(dag.outputs + tuple(kept.hidden)),
                       frozenset(names.taken), tuple(kept.values), tuple(kept.ties),
                       tuple(kept.decisions), work)


def _check_derivatives(dag: Dag, wrt: frozenset[str], active: frozenset[int], reach: set[int],
                       late: set[int], parsed, batches: int) -> None:
    """Every op a gradient passes through must have a derivative: else the error naming
    it (``_no_derivative``)."""
    for n in dag.nodes:
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


@dataclass
class _Kept:
    """What the forward keeps for its backward, as ``plan_forward`` finds it: the
    ``Saved`` values, the hidden outputs storing them, the reductions feeding computation
    (``values``) and the ties of the maxes and mins among them (node index, saved name),
    and the decisions (``decision_key``, saved name)."""

    names: _Namer
    work: torch.dtype
    saved: list[Saved] = field(default_factory=list)
    hidden: list[Output] = field(default_factory=list)
    values: list[tuple[int, str]] = field(default_factory=list)
    ties: list[tuple[int, str]] = field(default_factory=list)
    decisions: list[tuple[tuple, str]] = field(default_factory=list)

    def keep(self, s: Saved, node: Node, dtype: torch.dtype) -> None:
        """``s``, stored by a hidden output of ``node`` in ``dtype``."""
        self.hidden.append(Output(s.name, node, s.kind, dtype, s.batched))
        self.saved.append(s)

    def stored_reductions(self, outputs: tuple[Output, ...], late: set[int], parsed,
                          wrt: frozenset[str]) -> None:
        """A stored reduction's result (logsumexp's, in fp32) or argument (a max's or min's,
        whose ties the caller counts) where its rule reads them."""
        names, work = self.names, self.work
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
                self.keep(s, src, work)
            elif "out" in used:  # logsumexp: its result, in fp32
                if o.dtype == work:
                    self.saved.append(Saved(o.name, o.name, "result", o.kind, o.batched, False,
                                            work))
                else:
                    s = Saved(names(f"saved_{o.name}"), o.name, "result", o.kind, o.batched,
                              True, work)
                    again = ir.reduce_node(o.node.op, o.node.inputs[0], o.kind.space,
                                           o.batched, var=s.name, line=o.node.line)
                    self.keep(s, again, work)

    def reductions_feeding(self, dag: Dag, reach: set[int], late: set[int],
                           batches: int) -> None:
        """The result of each reduction feeding computation that a gradient reaches (the
        output itself where it holds it in fp32), and a max's or min's ties."""
        names, work = self.names, self.work
        for k, n in enumerate(dag.nodes):
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
                          _KIND_OF_SPACE[tied.space], tied.batched or per_batch, True,
                          torch.uint8)
                self.keep(t, tied, torch.uint8)
                self.ties.append((k, t.name))
            out = next((o for o in dag.outputs if o.node is n and o.dtype == work
                        and o.kind is kind and o.batched == per_batch), None)
            if out is not None:  # the output itself holds it in fp32
                s = Saved(out.name, out.name, "value", kind, per_batch, False, work)
                self.saved.append(s)
            else:
                s = Saved(names(f"saved_{n.var or n.op}"), label, "value", kind, per_batch,
                          True, work)
                self.keep(s, n, work)
            self.values.append((k, s.name))

    def trial(self, trial: ForwardPlan, outputs: tuple[Output, ...], batches: int) -> None:
        """A trial backward of every output for everything in ``wrt``: the reductions'
        results it does not read are dropped (mean's sum: the count is a constant), and
        each decision it takes is kept as the forward took it (a uint8 mask, or a step
        function's value)."""
        tried = backward(trial, [o.name for o in outputs], trial.wrt, batches=batches)
        if self.values:  # keep those it reads
            read = {name for name, _ in tried.saved}
            dropped = {name for _, name in self.values + self.ties} - read
            self.values = [v for v in self.values if v[1] in read]
            self.ties = [v for v in self.ties if v[1] in read]
            self.saved = [v for v in self.saved if v.name not in dropped]
            self.hidden = [h for h in self.hidden if h.name not in dropped]
        forward_ids = frozenset(id(n) for n in trial.dag.nodes)
        memo: dict[int, tuple] = {}
        for n in tried.unsaved_decisions:  # each as the forward took it
            mask = n.dtype is torch.bool
            named = _first_named(n)
            base = named.var if named is not None else n.op
            label = base if named is None or named.line is None else \
                f"{base} (line {named.line})"
            s = Saved(self.names(f"saved_{base}_{'mask' if mask else 'step'}"), label,
                      "decision", _KIND_OF_SPACE[n.space], n.batched, True,
                      torch.uint8 if mask else self.work)
            self.keep(s, n, s.dtype)
            self.decisions.append((decision_key(n, forward_ids, memo), s.name))

    def accumulators(self, dag: Dag, dtype: torch.dtype, batches: int) -> None:
        """"Save" mode: the accumulator (a gated epilogue's gate and up halves) in
        ``dtype``."""
        for acc in (n for n in dag.nodes if n.kind is NodeKind.ACCUM):  # gated: gate and up
            s = Saved(self.names(f"saved_{acc.var}"), accum_target(acc.op), "accum",
                      OutputKind.FULL, batches > 1, True, dtype)
            self.keep(s, acc, dtype)


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


def wrt_of_dag(dag: Dag) -> frozenset[str]:
    """Everything an epilogue can be differentiated with respect to: the accumulator and its
    floating-point tensor operands (what ``evtfuse show`` differentiates)."""
    return frozenset([ACCUM] + [o.name for o in dag.operands
                                if o.kind is not OperandKind.RUNTIME_SCALAR
                                and o.dtype is not None and o.dtype.is_floating_point])
