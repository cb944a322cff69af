"""The plans of reverse-mode differentiation: what ``plan_forward`` and ``backward`` give.

Layer: passes (core: ``ir`` and ``unparse``). ``ForwardPlan`` (what a gradient reaches and
what the forward keeps for its backward: ``Saved`` values, hidden outputs of the augmented
DAG), ``BackwardPlan`` (the backward epilogue and how to call it, with the ``Injected``
gradients its caller computes), the names of the accumulator's gradients (``ACCUM``,
``accum_target``) and the fresh names both steps give (``_Namer``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Iterable

import torch

from .. import ir
from ..ir import Dag, Node, OperandKind, OperandSpec, Output, OutputKind, Space
from ..unparse import to_source

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


def _spec(name: str, kind: OutputKind, dtype, batched: bool) -> OperandSpec:
    return OperandSpec(name, _OPERAND_OF_OUTPUT[kind], dtype, batched)
