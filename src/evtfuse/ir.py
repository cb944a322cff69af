"""Epilogue IR: an immutable DAG of accumulator, load, constant, compute and reduce nodes.

Layer: ir. Knows nothing of kernels or of the source text it came from (beyond line
numbers kept for messages). Nodes are frozen and compared by identity; a pass builds new
nodes rather than editing old ones. Every node carries its inferred *space* (how the
value varies over the (M, N) output tile), whether it varies with the batch index, and its
dtype (fp32 for arithmetic, bool for comparisons).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from enum import Enum
from typing import Iterable

import torch

from .optable import OPS, Category, OpDef, ParamValue


class NodeKind(Enum):
    ACCUM = "accum"  # the GEMM accumulator, A @ B; op "gate"/"up": its even/odd columns (pairs)
    LOAD = "load"  # an operand of the epilogue (scalar, vector or tensor)
    CONST = "const"  # a literal of the source, or a folded constant
    COMPUTE = "compute"  # one row of the op table
    REDUCE = "reduce"  # sum/max/min over the axes its output lacks
    INDEX = "index"  # row_index() / col_index()


class Space(Enum):
    """How a value varies over the output's (M, N): the broadcast class."""

    SCALAR = 0  # one value
    ROW = 1  # one value per row (shape (M, 1)); CUTLASS calls its load a column broadcast
    COL = 2  # one value per column (shape (1, N)); CUTLASS: row broadcast
    FULL = 3  # one value per element

    def join(self, other: "Space") -> "Space":
        if self is other:
            return self
        if self is Space.SCALAR:
            return other
        if other is Space.SCALAR:
            return self
        return Space.FULL


class OperandKind(Enum):
    RUNTIME_SCALAR = "runtime scalar"  # a Python number: a kernel argument
    DEVICE_SCALAR = "device scalar"  # 0-d, (1,), (L,1,1) tensor
    PER_ROW = "per-row vector"  # (M,1), (L,M,1)
    PER_COL = "per-column vector"  # (N,), (1,N), (L,1,N)
    FULL = "full tensor"  # (M,N), (L,M,N)

    @property
    def space(self) -> Space:
        return _KIND_SPACE[self]


_KIND_SPACE = {
    OperandKind.RUNTIME_SCALAR: Space.SCALAR,
    OperandKind.DEVICE_SCALAR: Space.SCALAR,
    OperandKind.PER_ROW: Space.ROW,
    OperandKind.PER_COL: Space.COL,
    OperandKind.FULL: Space.FULL,
}


@dataclass(frozen=True)
class OperandSpec:
    """An input of the epilogue as bound to a value: its kind, dtype and batching."""

    name: str
    kind: OperandKind
    dtype: torch.dtype | None  # None for runtime scalars
    batched: bool = False  # has its own slice per batch (a leading L > 1)

    def describe(self) -> str:
        dt = "" if self.dtype is None else f" {dtype_name(self.dtype)}"
        return f"{self.kind.value}{dt}{' per batch' if self.batched else ''}"


class OutputKind(Enum):
    FULL = "aux store"  # (M,N) / (L,M,N)
    ROW = "per-row reduction"  # (M,1) / (L,M,1)
    COL = "per-column reduction"  # (N,), (1,N) / (L,1,N)
    SCALAR = "whole-output reduction"  # (1,), 0-d / (L,1,1)
    NONE = "not stored"  # passed as None: computed for its consumers only

    @property
    def space(self) -> Space:
        return {OutputKind.FULL: Space.FULL, OutputKind.ROW: Space.ROW,
                OutputKind.COL: Space.COL, OutputKind.SCALAR: Space.SCALAR,
                OutputKind.NONE: Space.FULL}[self]


@dataclass(frozen=True, eq=False)
class Node:
    kind: NodeKind
    inputs: tuple["Node", ...] = ()
    op: str | None = None  # op-table row for COMPUTE/REDUCE; "row"/"col" for INDEX;
    #                        ACCUM: None (the accumulator), "gate" / "up" (``pairs(accum)``)
    params: tuple[tuple[str, ParamValue], ...] = ()  # a row's parameters, in its order
    value: float | None = None  # CONST
    operand: OperandSpec | None = None  # LOAD
    space: Space = Space.FULL
    batched: bool = False
    dtype: torch.dtype = torch.float32
    var: str | None = None  # the user's variable name, when the node was assigned to one
    line: int | None = None  # source line, for messages

    @property
    def opdef(self) -> OpDef:
        assert self.op is not None
        return OPS[self.op]

    @property
    def param_dict(self) -> dict[str, ParamValue]:
        return dict(self.params)

    @property
    def conditional_store(self) -> bool:
        """A ``store_where(cond, value)`` node: an output stored only where cond holds."""
        return self.kind is NodeKind.COMPUTE and OPS[self.op].category is Category.STORE

    def short(self) -> str:
        if self.kind is NodeKind.ACCUM:
            return "accum" if self.op is None else f"pairs(accum).{self.op}"
        if self.kind is NodeKind.LOAD:
            return f"load {self.operand.name}"
        if self.kind is NodeKind.CONST:
            return f"const {self.value!r}"
        if self.kind is NodeKind.INDEX:
            return f"{self.op}_index()"
        ps = "".join(f", {k}={v!r}" for k, v in self.params)
        return f"{self.op}({{}}{ps})"


@dataclass(frozen=True)
class Output:
    """A returned value: its name, the node computing it, how it is stored and in what dtype."""

    name: str
    node: Node
    kind: OutputKind
    dtype: torch.dtype | None  # None when not stored
    batched: bool = False  # FULL: per-batch slices; reductions: keep L (else reduce over it)


@dataclass(frozen=True)
class Dag:
    """An epilogue: outputs in return order, and every declared operand in parameter order.

    ``gated``: the epilogue takes the accumulator's columns in pairs (``gate, up =
    pairs(accum)``): the GEMM's accumulator is 2N wide, the epilogue's (L, M, N) space is
    its pairs, and only "gate"/"up" ACCUM nodes read it. Its value is the pairs' layout
    (``PAIR_LAYOUTS``): "interleaved" (or True; column 2j is gate j, 2j+1 up j) or
    "concatenated" (``pairs(accum, layout="concatenated")``: column j is gate j, N+j up j);
    False for an epilogue that is not gated."""

    outputs: tuple[Output, ...]
    operands: tuple[OperandSpec, ...]
    name: str = "epilogue"
    gated: bool | str = False

    @property
    def concatenated(self) -> bool:
        """A gated DAG whose accumulator holds gate's N columns, then up's."""
        return self.gated == CONCATENATED

    @functools.cached_property
    def nodes(self) -> tuple[Node, ...]:
        """Every node reachable from an output, inputs before users (stable order)."""
        order: list[Node] = []
        seen: set[int] = set()
        for out in self.outputs:
            _postorder(out.node, seen, order)
        return tuple(order)

    @functools.cached_property
    def users(self) -> dict[int, list[Node]]:
        """id(node) -> nodes that take it as an input."""
        result: dict[int, list[Node]] = {id(n): [] for n in self.nodes}
        for n in self.nodes:
            for i in n.inputs:
                result[id(i)].append(n)
        return result

    def output(self, name: str) -> Output:
        for o in self.outputs:
            if o.name == name:
                return o
        raise KeyError(name)

    @property
    def loads(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.kind is NodeKind.LOAD)

    @property
    def used_operands(self) -> tuple[OperandSpec, ...]:
        used = {n.operand.name for n in self.loads}
        return tuple(o for o in self.operands if o.name in used)

    @property
    def reductions(self) -> tuple[Output, ...]:
        return tuple(o for o in self.outputs if o.node.kind is NodeKind.REDUCE)

    def replace_outputs(self, outputs: Iterable[Output]) -> "Dag":
        return Dag(tuple(outputs), self.operands, self.name, self.gated)

    def __str__(self) -> str:
        return format_dag(self)


def _postorder(node: Node, seen: set[int], order: list[Node]) -> None:
    stack: list[tuple[Node, bool]] = [(node, False)]
    while stack:
        n, expanded = stack.pop()
        if id(n) in seen:
            continue
        if expanded:
            seen.add(id(n))
            order.append(n)
            continue
        stack.append((n, True))
        for i in reversed(n.inputs):
            if id(i) not in seen:
                stack.append((i, False))


# ---------------------------------------------------------------- construction helpers

PAIR_PARTS = ("gate", "up")  # pairs(accum): column 2j is gate j, column 2j + 1 is up j
INTERLEAVED, CONCATENATED = PAIR_LAYOUTS = ("interleaved", "concatenated")  # Dag.gated


def accum_node(line: int | None = None, part: str | None = None) -> Node:
    """The accumulator, or with ``part`` ("gate" / "up") one of its column pairs' halves."""
    assert part is None or part in PAIR_PARTS, part
    return Node(NodeKind.ACCUM, op=part, space=Space.FULL, batched=True,
                var="accum" if part is None else part, line=line)


def load_node(spec: OperandSpec, line: int | None = None) -> Node:
    return Node(NodeKind.LOAD, operand=spec, space=spec.kind.space, batched=spec.batched,
                var=spec.name, line=line)


def const_node(value: float, line: int | None = None) -> Node:
    return Node(NodeKind.CONST, value=float(value), space=Space.SCALAR, line=line)


def index_node(axis: str, line: int | None = None) -> Node:
    space = Space.ROW if axis == "row" else Space.COL
    return Node(NodeKind.INDEX, op=axis, space=space, line=line)


def compute_node(op: str, inputs: Iterable[Node], params: Iterable[tuple[str, ParamValue]] = (),
                 var: str | None = None, line: int | None = None) -> Node:
    """A compute node with its space, batching and dtype inferred from its inputs."""
    inputs = tuple(inputs)
    row = OPS[op]
    space = Space.SCALAR
    for i in inputs:
        space = space.join(i.space)
    batched = any(i.batched for i in inputs)
    dtype = torch.bool if row.result_is_bool else torch.float32
    return Node(NodeKind.COMPUTE, inputs, op, tuple(params), space=space, batched=batched,
                dtype=dtype, var=var, line=line)


SHIFT = ("shift", 1.0)  # the params of a row function's max taken as a shift (``is_shift``)


def reduce_node(op: str, source: Node, result_space: Space, keep_batch: bool,
                var: str | None = None, line: int | None = None,
                params: tuple[tuple[str, ParamValue], ...] = ()) -> Node:
    """A reduction of ``source`` to ``result_space`` (the space its output has); ``params``:
    only ``(SHIFT,)``, on a row function's max (``is_shift``)."""
    return Node(NodeKind.REDUCE, (source,), op, params, space=result_space,
                batched=keep_batch and source.batched, var=var, line=line)


def reduces_shared(n: Node) -> bool:
    """Whether ``n`` reduces values the batches share (a reduction of an operand without L):
    the same in every batch. Computation reads it per batch, as each batch's kernel
    programs compute it (``reference``, ``staging.split``'s workspace, ``autodiff``'s saved
    value and ties keep it per batch); an output of it lacking L sums the L batches' copies,
    as any output reduces the dims its shape lacks."""
    return n.kind is NodeKind.REDUCE and not n.inputs[0].batched


def is_shift(n: Node) -> bool:
    """Whether ``n`` is a row function's *shift*: the max the frontend builds beside a
    shifted reduction (``OpDef.shifted``: softmax's shifted_sumexp) for softmax and
    log_softmax, whose lowered expressions do not change with it. Its value is computed as
    any max's; a gradient passes through the row function's own terms, not through it
    (``autodiff``)."""
    return n.kind is NodeKind.REDUCE and n.op == "max" and n.params == (SHIFT,)


def shift_of(dag: Dag, n: Node) -> Node | None:
    """The shift beside the shifted reduction ``n`` (over the same value, per row), or None
    where ``n`` was written on its own."""
    return next((m for m in dag.users[id(n.inputs[0])] if is_shift(m) and
                 m.space is n.space and m.batched == n.batched), None)


def with_inputs(node: Node, inputs: tuple[Node, ...]) -> Node:
    """The same node over new inputs, with space/batching/dtype re-inferred."""
    if node.kind is NodeKind.COMPUTE:
        return compute_node(node.op, inputs, node.params, node.var, node.line)
    if node.kind is NodeKind.REDUCE:
        return Node(NodeKind.REDUCE, inputs, node.op, node.params, space=node.space,
                    batched=node.batched and inputs[0].batched, var=node.var, line=node.line)
    assert not inputs, node
    return node


# ---------------------------------------------------------------- verifier

class IRError(AssertionError):
    """The DAG broke an invariant: a pass produced something no backend may read."""


def verify(dag: Dag) -> None:
    """Check the DAG's invariants (run between passes in debug mode)."""
    position = {id(n): i for i, n in enumerate(dag.nodes)}
    operand_names = {o.name for o in dag.operands}
    out_nodes = {id(o.node) for o in dag.outputs}
    late = after_reduction(dag)
    for n in dag.nodes:
        for i in n.inputs:
            if position[id(i)] >= position[id(n)]:
                raise IRError(f"{n.short()} uses a node defined after it")
        if n.kind is NodeKind.COMPUTE:
            row = OPS.get(n.op)
            if row is None or row.category in (Category.REDUCE, Category.INDEX, Category.ROWWISE):
                raise IRError(f"compute node with op {n.op!r}")
            if len(n.inputs) != row.arity:
                raise IRError(f"{n.op} takes {row.arity} inputs, has {len(n.inputs)}")
            expect = compute_node(n.op, n.inputs, n.params)
            if (expect.space, expect.batched, expect.dtype) != (n.space, n.batched, n.dtype):
                raise IRError(f"{n.op}: stale inferred space/batch/dtype")
        elif n.kind is NodeKind.REDUCE:
            if OPS[n.op].category is not Category.REDUCE or len(n.inputs) != 1:
                raise IRError(f"bad reduce node {n.op}")
            if OPS[n.op].lowered is not None:
                raise IRError(f"{n.op} reduce node: the frontend writes it with "
                              f"{OPS[n.op].lowered[0][0]}")
            if n.params and not is_shift(n):
                raise IRError(f"reduce node {n.op} with parameters {n.params}")
            if id(n) not in out_nodes and not dag.users[id(n)]:
                raise IRError(f"reduction {n.op} feeds nothing")
        elif n.kind is NodeKind.LOAD:
            if n.operand.name not in operand_names:
                raise IRError(f"load of undeclared operand {n.operand.name}")
        elif n.kind is NodeKind.CONST:
            if n.value is None:
                raise IRError("constant without a value")
        elif n.kind is NodeKind.ACCUM:
            if (n.op is not None) != dag.gated or (n.op is not None and n.op not in PAIR_PARTS):
                raise IRError(f"{n.short()} in a DAG with gated={dag.gated}")
        for u in dag.users[id(n)]:
            if u.kind is NodeKind.REDUCE and id(n) in late:
                raise IRError("reduction of a value computed from a reduction")
            if n.kind is NodeKind.REDUCE and u.kind is not NodeKind.COMPUTE:
                raise IRError(f"reduction {n.op} is used by {u.short()}")
    names = [o.name for o in dag.outputs]
    if len(set(names)) != len(names):
        raise IRError(f"duplicate output names {names}")


def after_reduction(dag: Dag) -> set[int]:
    """The ids of the reductions that feed computation and of every node computed from one
    (docs/performance.md, "Reductions feeding computation")."""
    late: set[int] = set()
    for n in dag.nodes:  # inputs before users
        if (n.kind is NodeKind.REDUCE and dag.users[id(n)]) or \
                any(id(i) in late for i in n.inputs):
            late.add(id(n))
    return late


def signature(dag: Dag) -> str:
    """Canonical text of everything in the DAG that shapes generated code (no names of
    variables, no line numbers): equal signatures compute the same function."""
    names: dict[int, str] = {}
    parts = []
    for k, n in enumerate(dag.nodes):
        names[id(n)] = f"%{k}"
        if n.kind is NodeKind.LOAD:
            o = n.operand
            desc = f"load {o.name}:{o.kind.name}:{dtype_name(o.dtype)}:{int(o.batched)}"
        elif n.kind is NodeKind.CONST:
            desc = f"const {float(n.value).hex()}"
        elif n.kind in (NodeKind.COMPUTE, NodeKind.REDUCE):
            # (a shift's mark shapes no code: its value is any max's, ``is_shift``)
            ps = ",".join(f"{k}={v if isinstance(v, str) else float(v).hex()}"
                          for k, v in n.params if not is_shift(n))
            desc = f"{n.kind.value} {n.op}({','.join(names[id(i)] for i in n.inputs)};{ps})"
        else:
            desc = f"{n.kind.value} {n.op or ''}"
        parts.append(f"{desc}:{n.space.name}:{int(n.batched)}:{dtype_name(n.dtype)}")
    for o in dag.outputs:
        parts.append(f"out {o.name}={names[id(o.node)]}:{o.kind.name}:{dtype_name(o.dtype)}:"
                     f"{int(o.batched)}")
    if dag.gated:
        parts.append("gated:concatenated" if dag.concatenated else "gated")
    return ";".join(parts)


# ---------------------------------------------------------------- printers

# names of the dtypes evtfuse takes, short and as torch spells them (the CLI's --ab-dtype,
# gemm's <name>_dtype): name -> torch's attribute
DTYPE_NAMES = {
    "f32": "float32", "fp32": "float32", "float32": "float32", "float": "float32",
    "f16": "float16", "fp16": "float16", "float16": "float16", "half": "float16",
    "bf16": "bfloat16", "bfloat16": "bfloat16",
    "f64": "float64", "fp64": "float64", "float64": "float64",
    "e4m3": "float8_e4m3fn", "fp8": "float8_e4m3fn", "fp8e4m3": "float8_e4m3fn",
    "float8_e4m3fn": "float8_e4m3fn", "e5m2": "float8_e5m2", "fp8e5m2": "float8_e5m2",
    "float8_e5m2": "float8_e5m2",
    "i8": "int8", "int8": "int8", "u8": "uint8", "uint8": "uint8", "i32": "int32",
    "int32": "int32",
}


def dtype_named(name: str) -> torch.dtype | None:
    """The dtype ``DTYPE_NAMES`` gives ``name`` (any case), or None."""
    key = DTYPE_NAMES.get(name.strip().lower())
    return getattr(torch, key) if key else None


def rounding_of(dtype: torch.dtype) -> str | None:
    """``cast``'s name of a 16-bit float dtype (``cast(x, "bf16")``: x rounded as a store in
    that dtype rounds it), or None for a dtype a value keeps as it is computed."""
    return {torch.float16: "fp16", torch.bfloat16: "bf16"}.get(dtype)


def dtype_name(dtype: torch.dtype | None) -> str:
    if dtype is None:
        return "-"
    return {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16",
            torch.float64: "f64", torch.bool: "bool", torch.int32: "i32", torch.int64: "i64",
            torch.int8: "i8", torch.uint8: "u8"}.get(dtype, str(dtype).replace("torch.", ""))


def _label(n: Node, names: dict[int, str]) -> str:
    if n.kind in (NodeKind.COMPUTE, NodeKind.REDUCE):
        ps = "".join(f", {k}={v!r}" for k, v in n.params)
        return f"{n.op}({', '.join(names[id(i)] for i in n.inputs)}{ps})"
    if n.kind is NodeKind.LOAD:
        return f"load {n.operand.name} : {n.operand.describe()}"
    return n.short()


def format_dag(dag: Dag) -> str:
    """One line per node, in evaluation order, then the outputs."""
    names: dict[int, str] = {}
    lines = [f"dag {dag.name}({', '.join(o.name for o in dag.operands)})"
             + (f" gated: pairs(accum, layout={dag.gated!r})" if dag.concatenated
                else " gated: pairs(accum)" if dag.gated else "")]
    for k, n in enumerate(dag.nodes):
        names[id(n)] = f"%{k}"
        where = f"  # line {n.line}" if n.line else ""
        var = f" [{n.var}]" if n.var and n.kind in (NodeKind.COMPUTE, NodeKind.REDUCE) else ""
        meta = f"{dtype_name(n.dtype)} {n.space.name.lower()}{' batched' if n.batched else ''}"
        lines.append(f"  %{k} = {_label(n, names)} : {meta}{var}{where}")
    for o in dag.outputs:
        lines.append(f"  store {o.name} <- {names[id(o.node)]} : {o.kind.value}, "
                     f"{dtype_name(o.dtype)}{' per batch' if o.batched else ''}")
    return "\n".join(lines)


_EVT_NAMES = {
    "add": "plus", "sub": "minus", "mul": "multiplies", "div": "divides", "neg": "negate",
    "multiply_add": "multiply_add", "maximum": "maximum", "minimum": "minimum",
    "relu": "ReLu", "gelu": "GELU", "gelu_tanh": "GELU_taylor", "sigmoid": "Sigmoid",
    "silu": "SiLu", "tanh": "Tanh", "hardswish": "HardSwish", "leaky_relu": "LeakyReLU",
    "clamp": "Clamp",
}


def _evt_leaf(n: Node) -> str:
    if n.kind is NodeKind.ACCUM:
        return "Sm90AccFetch" if n.op is None else f"Sm90AccFetch<{n.op}: pairs>"
    if n.kind is NodeKind.CONST:
        return f"Sm90ScalarBroadcast<{n.value!r}>"
    if n.kind is NodeKind.INDEX:
        return f"Sm90{'Row' if n.op == 'row' else 'Col'}Index"
    k = n.operand.kind
    if k in (OperandKind.RUNTIME_SCALAR, OperandKind.DEVICE_SCALAR):
        return f"Sm90ScalarBroadcast<{n.operand.name}>"
    if k is OperandKind.PER_ROW:
        return f"Sm90ColBroadcast<{n.operand.name}>"
    if k is OperandKind.PER_COL:
        return f"Sm90RowBroadcast<{n.operand.name}>"
    return f"Sm90AuxLoad<{n.operand.name}>"


_EVT_REDUCE = {"sum": "plus", "max": "maximum", "min": "minimum", "logsumexp": "logsumexp",
               "shifted_sumexp": "shifted_sumexp"}


def _evt_store(o: Output) -> str:
    # a reduction is the store node itself (its reduce function is a template argument);
    # a non-reduced value stored to a vector/scalar output is a plain store of that value
    fn = f"{_EVT_REDUCE[o.node.op]}, " if o.node.kind is NodeKind.REDUCE else ""
    return {OutputKind.FULL: f"Sm90AuxStore<{o.name}>",
            # CUTLASS names a reduction by the vector it yields: a column vector (M, 1)
            # from a per-row reduction, a row vector (N,) from a per-column one
            OutputKind.ROW: f"Sm90ColReduction<{fn}{o.name}>",
            OutputKind.COL: f"Sm90RowReduction<{fn}{o.name}>",
            OutputKind.SCALAR: f"Sm90ScalarReduction<{fn}{o.name}>",
            OutputKind.NONE: f"(unstored {o.name})"}[o.kind]


def format_evt(dag: Dag) -> str:
    """The DAG as CUTLASS would nest it: tree visitors, and a topological visitor
    (shared values computed once, referred to by number) where a value feeds several users.
    """
    users = dag.users
    out_count: dict[int, int] = {}
    for o in dag.outputs:
        out_count[id(o.node)] = out_count.get(id(o.node), 0) + 1
    shared = [n for n in dag.nodes
              if n.kind in (NodeKind.COMPUTE, NodeKind.ACCUM)
              and len(users[id(n)]) + out_count.get(id(n), 0) > 1
              and not (n.kind is NodeKind.ACCUM and len(users[id(n)]) <= 1)]
    shared_ids = {id(n): k for k, n in enumerate(shared)}
    lines: list[str] = []
    if shared:
        lines.append("Sm90TopologicalVisitor: values computed once and shared")
        for n in shared:
            lines.append(f"  node {shared_ids[id(n)]}:")
            _evt_tree(n, "    ", lines, shared_ids, top=n)
    for o in dag.outputs:
        lines.append(f"Sm90EVT<{_evt_store(o)}>")
        root = o.node.inputs[0] if o.node.kind is NodeKind.REDUCE else o.node
        _evt_tree(root, "  ", lines, shared_ids, top=None)
    return "\n".join(lines)


def _evt_tree(root: Node, indent: str, lines: list[str], shared: dict[int, int],
              top: Node | None) -> None:
    stack = [(root, indent)]  # depth first, inputs in order, without recursion (deep chains)
    while stack:
        n, ind = stack.pop()
        if id(n) in shared and n is not top:
            lines.append(f"{ind}-> node {shared[id(n)]}")
        elif n.kind in (NodeKind.COMPUTE, NodeKind.REDUCE):
            name = _EVT_NAMES.get(n.op, n.op)
            ps = "".join(f", {k}={v!r}" for k, v in n.params)
            lines.append(f"{ind}Sm90Compute<{name}{ps}>")
            stack.extend((i, ind + "  ") for i in reversed(n.inputs))
        else:
            lines.append(f"{ind}{_evt_leaf(n)}")


__all__ = [
    "DTYPE_NAMES", "dtype_named", "rounding_of",
    "reduces_shared",
    "NodeKind", "Space", "OperandKind", "OperandSpec", "OutputKind", "Node", "Output", "Dag",
    "PAIR_PARTS", "PAIR_LAYOUTS", "INTERLEAVED", "CONCATENATED", "accum_node", "load_node",
    "const_node", "index_node", "compute_node", "reduce_node", "with_inputs", "verify",
    "after_reduction", "IRError", "format_dag", "format_evt", "dtype_name", "signature",
]
