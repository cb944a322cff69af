"""An optimised epilogue DAG as a CUTLASS Sm90 epilogue visitor tree (the plan, not the text).

Layer: export. Reads an ``ir.Dag`` after ``passes.optimize`` (never source text) and
builds the tree CUTLASS 4.2's ``cutlass/epilogue/fusion/sm90_visitor_*.hpp`` nodes form:

- ``Leaf``: a node op with no children (``Sm90AccFetch``, ``Sm90SrcFetch``,
  ``Sm90ScalarBroadcast``, ``Sm90RowBroadcast``, ``Sm90ColBroadcast``, ``Sm90AuxLoad``), or
  a node op that takes its inputs from a topological visitor's edges (``Sm90Compute``,
  ``Sm90AuxStore``, the reductions);
- ``Tree``: ``Sm90EVT<op, children...>`` (``Sm90TreeVisitor``): the op applied to its
  children's values; its ``Arguments`` are the children's, then the op's;
- ``Topo``: ``Sm90TopologicalVisitor<ElementCompute, edges, ops...>`` where a value feeds
  several consumers: each op is visited once, in order, fed the values its edge sequence
  names; the last op's value is the result; its ``Arguments`` are the ops', in order.

Stores pass their input through (CUTLASS's store and reduction nodes return what they
visit), so an aux store or a reduction sits on the path from its value to the root:
``Sm90EVT<Sm90AuxStore<F>, F's tree>``. The root's value is the kernel's D (the first
full output, ``D`` by name when there is one), written by the collective epilogue itself.

Naming: CUTLASS's ``Sm90ColBroadcast`` / ``Sm90ColReduction`` hold one value per *row*
(an (M, 1) column vector), ``Sm90RowBroadcast`` / ``Sm90RowReduction`` one per *column*
((N,), a row vector): evtfuse's ``Space.ROW`` maps to CUTLASS's Col nodes.

What cannot be expressed raises ``ExportError`` naming the reason and the user's line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

import torch

from .. import ir
from ..errors import EpilogueError
from ..ir import Dag, Node, NodeKind, OperandKind, OutputKind, Space
from . import functors

ROUND = "cutlass::FloatRoundStyle::round_to_nearest"
FUSION = "cutlass::epilogue::fusion::"
ELEMENTS = {torch.float16: "cutlass::half_t", torch.bfloat16: "cutlass::bfloat16_t",
            torch.float32: "float"}


class ExportError(EpilogueError):
    """An epilogue (or a choice of the export) that CUTLASS's Sm90 EVT cannot express."""


def element(dtype: torch.dtype | None, what: str, line: int | None = None) -> str:
    if dtype in ELEMENTS:
        return ELEMENTS[dtype]
    if dtype is not None and dtype.is_floating_point and dtype.itemsize == 1:
        raise ExportError(f"{what} is {ir.dtype_name(dtype)}: fp8 with its scaling is not "
                          "exported (the Sm90 EVT's fp8 scale factors and amax are a separate "
                          "fusion); use f16, bf16 or f32", line=line)
    raise ExportError(f"{what} is {ir.dtype_name(dtype)}: an export loads and stores f16, bf16 "
                      "and f32 only", line=line)


# ---------------------------------------------------------------- the tree

@dataclass
class Leaf:
    """One node op: its C++ type, its ``Arguments`` initialiser, what it is (``role``, for
    comments and the structural tests) and the DAG node or output it comes from."""

    cpp: str
    args: str
    role: str
    comment: str = ""
    alias: str | None = None  # a `using` name the tree refers to instead of ``cpp``
    alias_decl: str | None = None  # the declaration of ``alias`` (written before the tree)
    source: object = None  # the ir.Node it computes or loads, the ir.Output it stores


@dataclass
class Tree:
    op: Leaf
    children: list["Visitor"]


@dataclass
class Topo:
    edges: list[tuple[int, ...]]
    ops: list["Visitor"]


Visitor = Union[Leaf, Tree, Topo]


def walk(v: Visitor):
    """Every node op of ``v`` in the order its ``Arguments`` list them (children, then the
    op; a topological visitor's ops in order): the order CUTLASS reads them in."""
    if isinstance(v, Leaf):
        yield v
    elif isinstance(v, Tree):
        for c in v.children:
            yield from walk(c)
        yield v.op
    else:
        for o in v.ops:
            yield from walk(o)


# ---------------------------------------------------------------- choices

@dataclass(frozen=True)
class Choices:
    """The element types and tile the tree's nodes are typed with."""

    element_c: str | None  # None: no source tensor C (ElementC = void)
    element_d: str
    tile: str = "TileShape"  # the C++ name of the CTA tile shape
    descriptor: str = "EpilogueDescriptor"


@dataclass
class Param:
    """A parameter of the generated host function: C++ type and name, and what it is."""

    cpp_type: str
    name: str
    what: str


@dataclass
class Plan:
    """The tree and everything the emitter needs around it."""

    root: Visitor
    d_output: ir.Output
    c_operand: ir.OperandSpec | None
    params: list[Param]  # the host function's epilogue parameters, in the epilogue's order
    functors: list[str]  # names of the functors emitted alongside (``functors.FUNCTORS``)
    strides: list[tuple[str, str]] = field(default_factory=list)  # (variable, stride type)
    aliases: list[str] = field(default_factory=list)  # `using` declarations, in order


# ---------------------------------------------------------------- refusals

def _where(dag_name: str, parsed, n_line: int | None) -> dict:
    return dict(line=n_line, where=dag_name,
                source_line=parsed.text_of(n_line) if (parsed is not None and n_line) else None)


def check_exportable(dag: Dag, parsed=None) -> None:
    """Raise ``ExportError`` for what CUTLASS's Sm90 EVT cannot express."""
    def refuse(reason: str, n: Node | None = None, variable: str | None = None):
        raise ExportError(f"cannot export to CUTLASS: {reason}", variable=variable,
                          **_where(dag.name, parsed, n.line if n is not None else None))

    if dag.gated:
        first = next((n for n in dag.nodes if n.kind is NodeKind.ACCUM), None)
        refuse("a gated pair (pairs(accum)) reads the accumulator's columns in pairs; no Sm90 "
               "EVT node fetches half of them", first)
    late = ir.after_reduction(dag)
    for n in dag.nodes:
        if n.kind is NodeKind.REDUCE and id(n) in late:
            refuse(f"the result of {n.op}() feeds computation (softmax, log_softmax and "
                   "normalisations do): an Sm90 reduction node's result is only written to "
                   "memory, never read back in the same epilogue", n, n.var)
        if n.kind is NodeKind.REDUCE and n.op not in ("sum", "max", "min"):
            refuse(f"a {n.op} reduction has no CUTLASS reduction functor (sum, max and min "
                   "do)", n, n.var)
        if n.kind is NodeKind.REDUCE and n.inputs[0].space is not Space.FULL:
            refuse(f"{n.op}() of a value that is not a full tile: the Sm90 reduction nodes "
                   "reduce the (M, N) tile", n, n.var)
        if n.conditional_store:
            refuse("a conditional store (store_where) writes only where its condition holds; "
                   "the Sm90 aux store writes every element", n, n.var)
        if n.kind is NodeKind.INDEX:
            refuse(f"{n.op}_index() has no Sm90 EVT node (no node reads an element's "
                   "coordinates)", n)
        if n.kind is NodeKind.LOAD and n.operand.kind is not OperandKind.RUNTIME_SCALAR:
            element(n.operand.dtype, f"operand {n.operand.name}", n.line)
        if n.kind is NodeKind.COMPUTE and n.op not in functors.SUPPORTED:
            refuse(f"{n.op} has no CUTLASS spelling here", n, n.var)
        if n.kind is NodeKind.COMPUTE and n.op == "cast" and \
                n.param_dict["dtype"] not in ("fp32", "fp16", "bf16"):
            refuse(f"cast to {n.param_dict['dtype']}: an export rounds to fp16, bf16 or fp32 "
                   "only (fp8 scaling is not exported)", n, n.var)
    for o in dag.outputs:
        if o.kind is OutputKind.NONE:
            continue
        element(o.dtype, f"output {o.name}", o.node.line)
        if o.kind is not OutputKind.FULL and o.node.kind is not NodeKind.REDUCE:
            refuse(f"output {o.name} is a vector or scalar that is not a reduction (a value "
                   "broadcast to it); the Sm90 nodes store full tiles or reduce them",
                   o.node, o.name)
        if o.kind is OutputKind.FULL and o.node.space is not Space.FULL:
            refuse(f"output {o.name} is a full tensor of a {o.node.space.name.lower()} value: "
                   "an Sm90 store of a broadcast value is not exported; add accum * 0 or "
                   "store a vector", o.node, o.name)
    if not any(o.kind is OutputKind.FULL for o in dag.outputs):
        refuse("no full-tensor output to be the kernel's D (CUTLASS 4.2's Sm90 collective "
               "epilogue stores D; a custom EVT with ElementD = void fails its "
               "static_assert 'SmemElementD is void')")


# ---------------------------------------------------------------- building

class _Builder:
    def __init__(self, dag: Dag, choices: Choices, d_out: ir.Output,
                 c_operand: ir.OperandSpec | None):
        self.dag, self.ch, self.d_out, self.c_operand = dag, choices, d_out, c_operand
        self.functors: list[str] = []
        self.strides: list[tuple[str, str]] = []
        self.aliases: list[str] = []
        self.count = 0

    def name(self, stem: str, user: str | None = None) -> str:
        """Every generated C++ name: a running number makes it unique whatever the user's
        names are (``Aux3_F``)."""
        self.count += 1
        return f"{stem}{self.count}" + (f"_{user}" if user else "")

    # -- leaves
    def leaf(self, n: Node) -> Leaf:
        leaf = self._leaf(n)
        leaf.source = n
        return leaf

    def _leaf(self, n: Node) -> Leaf:
        if n.kind is NodeKind.ACCUM:
            return Leaf(FUSION + "Sm90AccFetch", "{}", "AccFetch", "accum")
        if n.kind is NodeKind.CONST:
            return Leaf(f"{FUSION}Sm90ScalarBroadcast<float>", f"{{{{{_float(n.value)}}}}}",
                        "ScalarBroadcast(const)", f"the constant {n.value!r}")
        spec = n.operand
        name = spec.name
        k = spec.kind
        if k is OperandKind.RUNTIME_SCALAR:
            return Leaf(f"{FUSION}Sm90ScalarBroadcast<float>", f"{{{{{name}}}}}",
                        f"ScalarBroadcast({name})", f"{name}: a runtime scalar")
        el = element(spec.dtype, f"operand {name}")
        if k is OperandKind.DEVICE_SCALAR:
            return Leaf(f"{FUSION}Sm90ScalarBroadcast<{el}>", f"{{{{}}, {{{name}}}}}",
                        f"ScalarBroadcast({name})", f"{name}: a scalar in device memory")
        if k is OperandKind.PER_COL:
            return Leaf(f"{FUSION}Sm90RowBroadcast<0, {self.ch.tile}, {el}, float, "
                        "cute::Stride<cute::_0, cute::_1, cute::_0>>",
                        f"{{{name}, {el}(0), {{}}}}", f"RowBroadcast({name})",
                        f"{name}: one value per column, (N,)")
        if k is OperandKind.PER_ROW:
            return Leaf(f"{FUSION}Sm90ColBroadcast<0, {self.ch.tile}, {el}, float, "
                        "cute::Stride<cute::_1, cute::_0, cute::_0>>",
                        f"{{{name}, {el}(0), {{}}}}", f"ColBroadcast({name})",
                        f"{name}: one value per row, (M, 1)")
        if self.c_operand is not None and name == self.c_operand.name:
            return Leaf(f"{FUSION}Sm90SrcFetch<{el}>", "{}", f"SrcFetch({name})",
                        f"{name}: the source tensor C (loaded by the collective)")
        alias = self.name("AuxLoad", name)
        desc = f"{alias}Descriptor"
        decl = (f"using {desc} = cutlass::epilogue::collective::detail::AuxLoadDescriptor<\n"
                f"    {self.ch.descriptor}, cutlass::layout::RowMajor, {el}>;\n"
                f"using {alias} = {FUSION}Sm90AuxLoad<\n"
                f"    {desc}::Stages, typename {desc}::EpilogueTile, {el},\n"
                f"    typename {desc}::Stride, typename {desc}::SmemLayoutAtom, "
                f"typename {desc}::CopyOpS2R>;")
        stride = f"stride_{alias}"
        self.strides.append((stride, f"typename {desc}::Stride"))
        return Leaf(alias, f"{{{name}, {el}(0), {stride}}}", f"AuxLoad({name})",
                    f"{name}: a full (M, N) tensor", alias=alias, alias_decl=decl)

    def compute(self, n: Node) -> Leaf:
        fn, args = functors.spelling(n)
        if fn.startswith("Evtfuse") and fn not in self.functors:
            self.functors.append(fn)
        out = "float"
        if n.op == "cast":
            out = {"fp32": "float", "fp16": "cutlass::half_t",
                   "bf16": "cutlass::bfloat16_t"}[n.param_dict["dtype"]]
        ps = "".join(f", {k}={v!r}" for k, v in n.params)
        what = f"{n.var} = " if n.var else ""
        return Leaf(f"{FUSION}Sm90Compute<{fn}, {out}, float, {ROUND}>", args,
                    f"Compute({n.op})", f"{what}{n.op}{'(' + ps[2:] + ')' if ps else ''}"
                    + (f"  (line {n.line})" if n.line else ""), source=n)

    def identity(self) -> Leaf:
        return Leaf(f"{FUSION}Sm90Compute<cutlass::epilogue::thread::Identity, float, float, "
                    f"{ROUND}>", "{}", "Compute(identity)", "the value D stores")

    def store(self, o: ir.Output) -> Leaf:
        leaf = self._store(o)
        leaf.source = o
        return leaf

    def _store(self, o: ir.Output) -> Leaf:
        el = element(o.dtype, f"output {o.name}")
        if o.kind is OutputKind.FULL:
            alias = self.name("AuxStore", o.name)
            desc = f"{alias}Descriptor"
            decl = (f"using {desc} = cutlass::epilogue::collective::detail::AuxStoreDescriptor<\n"
                    f"    {self.ch.descriptor}, cutlass::layout::RowMajor, {el}>;\n"
                    f"using {alias} = {FUSION}Sm90AuxStore<\n"
                    f"    {desc}::Stages, typename {desc}::EpilogueTile, {el}, {ROUND},\n"
                    f"    typename {desc}::Stride, typename {desc}::SmemLayoutAtom, "
                    f"typename {desc}::CopyOpR2S>;")
            stride = f"stride_{alias}"
            self.strides.append((stride, f"typename {desc}::Stride"))
            return Leaf(alias, f"{{{o.name}, {stride}}}", f"AuxStore({o.name})",
                        f"store {o.name}: a full (M, N) tensor", alias=alias, alias_decl=decl)
        op = o.node.op
        fn = {"sum": "cutlass::plus", "max": "cutlass::maximum_with_nan_propagation",
              "min": "cutlass::minimum_with_nan_propagation"}[op]
        identity = {"sum": "0.f", "max": "-cutlass::platform::numeric_limits<float>::infinity()",
                    "min": "cutlass::platform::numeric_limits<float>::infinity()"}[op]
        if o.kind is OutputKind.SCALAR:
            if op == "min":
                raise ExportError(
                    f"cannot export to CUTLASS: output {o.name} is min() over the whole "
                    "output: Sm90ScalarReduction reduces atomically and CUTLASS 4.2 has no "
                    "atomic minimum (sum and max have atomic_add and atomic_maximum)",
                    variable=o.name, **_where(self.dag.name, None, o.node.line))
            atomic = {"sum": "cutlass::atomic_add", "max": "cutlass::atomic_maximum"}[op]
            return Leaf(f"{FUSION}Sm90ScalarReduction<{fn}, {atomic}, {el}, float, {ROUND}, "
                        "cute::Stride<cute::_0, cute::_0, cute::_0>>",
                        f"{{{o.name}, {identity}, {{}}}}", f"ScalarReduction({op}, {o.name})",
                        f"{o.name} = {op}() over the whole output")
        # per-row (M, 1): CUTLASS's column reduction; per-column (N,): its row reduction;
        # non-atomic with the final reduction done by the last CTA (its workspace)
        cutlass_name, stride = (("Sm90ColReduction", "cute::Stride<cute::_1, cute::_0, cute::_0>")
                                if o.kind is OutputKind.ROW else
                                ("Sm90RowReduction", "cute::Stride<cute::_0, cute::_1, cute::_0>"))
        what = "each row, (M, 1)" if o.kind is OutputKind.ROW else "each column, (N,)"
        return Leaf(f"{FUSION}{cutlass_name}<{fn}, {fn}, {fn}, 0, {self.ch.tile}, {el}, float, "
                    f"{ROUND}, {stride}>",
                    f"{{{o.name}, {identity}, {{}}}}",
                    f"{cutlass_name.removeprefix('Sm90')}({op}, {o.name})",
                    f"{o.name} = {op}() over {what}")


def _float(v: float) -> str:
    if v != v:
        return "cutlass::platform::numeric_limits<float>::quiet_NaN()"
    if v in (float("inf"), float("-inf")):
        return ("" if v > 0 else "-") + "cutlass::platform::numeric_limits<float>::infinity()"
    return f"{float(v)!r}f".replace("inf", "INFINITY")


def _duplicable(n: Node, c_name: str | None) -> bool:
    """Leaves that cost nothing to visit twice: the accumulator, the collective's C, scalars
    and constants (vector and aux loads hold shared memory or registers of their own)."""
    if n.kind in (NodeKind.ACCUM, NodeKind.CONST):
        return True
    if n.kind is NodeKind.LOAD:
        return n.operand.kind in (OperandKind.RUNTIME_SCALAR, OperandKind.DEVICE_SCALAR) or \
            n.operand.name == c_name
    return False


def choose_d(dag: Dag) -> ir.Output:
    full = [o for o in dag.outputs if o.kind is OutputKind.FULL]
    return next((o for o in full if o.name == "D"), full[0])


def choose_c(dag: Dag) -> ir.OperandSpec | None:
    full = [o for o in dag.used_operands if o.kind is OperandKind.FULL]
    return next((o for o in full if o.name == "C"), full[0] if full else None)


def build(dag: Dag, choices: Choices, parsed=None) -> Plan:
    """The EVT of an optimised ``dag`` (``check_exportable`` first)."""
    check_exportable(dag, parsed)
    d_out = choose_d(dag)
    c_op = choose_c(dag)
    b = _Builder(dag, choices, d_out, c_op)
    c_name = c_op.name if c_op else None
    root = d_out.node

    # stores on each value: (aux stores of other full outputs, reductions of it), in
    # output order; the value D stores is the root and needs no store node
    stores: dict[int, list[ir.Output]] = {}
    for o in dag.outputs:
        if o.kind is OutputKind.NONE or o is d_out:
            continue
        value = o.node.inputs[0] if o.node.kind is NodeKind.REDUCE else o.node
        stores.setdefault(id(value), []).append(o)
    uses: dict[int, int] = {id(n): 0 for n in dag.nodes}
    for n in dag.nodes:
        if n.kind is NodeKind.COMPUTE:
            for i in n.inputs:
                uses[id(i)] += 1
    values = [n for n in dag.nodes if n.kind is not NodeKind.REDUCE]

    def shared(n: Node) -> bool:
        if _duplicable(n, c_name) and not stores.get(id(n)):
            return False
        if n is root:
            return uses[id(n)] > 0
        return uses[id(n)] != 1

    if not any(shared(n) for n in values):
        tree = _tree(b, root, stores)
        if root.kind is not NodeKind.COMPUTE or root.op == "cast":
            tree = Tree(b.identity(), [tree])  # D's value in ElementCompute (float)
    else:
        tree = _topo(b, dag, root, values, stores, uses, c_name)
    params = _params(dag, c_op, d_out)
    aliases = [leaf.alias_decl for leaf in walk(tree) if leaf.alias_decl]
    return Plan(tree, d_out, c_op, params, b.functors, b.strides, aliases)


def _tree(b: _Builder, n: Node, stores: dict[int, list[ir.Output]]) -> Visitor:
    """``n``'s value as a tree (every node below it used once), its stores wrapped round it."""
    if n.kind is NodeKind.COMPUTE:
        v: Visitor = Tree(b.compute(n), [_tree(b, i, stores) for i in n.inputs])
    else:
        v = b.leaf(n)
    for o in stores.get(id(n), ()):
        v = Tree(b.store(o), [v])
    return v


def _topo(b: _Builder, dag: Dag, root: Node, values: list[Node],
          stores: dict[int, list[ir.Output]], uses: dict[int, int], c_name) -> Topo:
    """One topological visitor over the DAG: each value that is shared (used twice, a
    vector or aux load used twice, a value whose stores are off D's path) or that takes a
    shared value is an op fed by edges; a closed subtree under it (reading no such value)
    is one op, an ``Sm90EVT``, with no edges; each store is an op fed its value; D's value
    comes last (an identity op reading it when it is used or stored itself)."""
    def is_op(n: Node) -> bool:
        # a node that must be visited as its own op: shared, or reads an op node
        if n.kind is not NodeKind.COMPUTE:
            return not _duplicable(n, c_name) and uses[id(n)] > 1 or bool(stores.get(id(n))) \
                or n is root
        return uses[id(n)] != 1 or bool(stores.get(id(n))) or n is root or \
            any(op_node[id(i)] for i in n.inputs)

    op_node: dict[int, bool] = {}
    for n in values:  # inputs before users
        op_node[id(n)] = is_op(n)
    ops: list[Visitor] = []
    edges: list[tuple[int, ...]] = []
    index: dict[int, int] = {}

    def add(v: Visitor, e: tuple[int, ...]) -> int:
        ops.append(v)
        edges.append(e)
        return len(ops) - 1

    def closed(n: Node) -> Visitor:  # a subtree reading no op node, stores inside it
        return _tree(b, n, stores)

    for n in values:
        if not op_node[id(n)]:
            continue
        if n.kind is NodeKind.COMPUTE and not any(op_node[id(i)] for i in n.inputs):
            # a shared value over a closed subtree: one Sm90EVT op, fed no edges
            k = add(Tree(b.compute(n), [closed(i) for i in n.inputs]), ())
        elif n.kind is NodeKind.COMPUTE:
            ins = []
            for i in n.inputs:
                if op_node[id(i)]:
                    ins.append(index[id(i)])
                else:  # a closed input subtree: an op of its own, visited first
                    ins.append(add(closed(i), ()))
            k = add(b.compute(n), tuple(ins))
        else:
            k = add(b.leaf(n), ())
        index[id(n)] = k
        for o in stores.get(id(n), ()):
            add(b.store(o), (k,))
    # D's value last: move it there when nothing after it reads it, else read it again
    k = index[id(root)]
    if k == len(ops) - 1 and root.kind is NodeKind.COMPUTE and root.op != "cast":
        return Topo(edges, ops)
    add(b.identity(), (k,))
    return Topo(edges, ops)


def _params(dag: Dag, c_op, d_out) -> list[Param]:
    params = []
    used = {o.name for o in dag.used_operands}
    for spec in dag.operands:
        if spec.name not in used:
            continue
        if spec.kind is OperandKind.RUNTIME_SCALAR:
            params.append(Param("float", spec.name, "a runtime scalar"))
            continue
        el = ELEMENTS[spec.dtype]
        what = {OperandKind.DEVICE_SCALAR: "a scalar in device memory",
                OperandKind.PER_ROW: "(M, 1): one value per row",
                OperandKind.PER_COL: "(N,): one value per column",
                OperandKind.FULL: "(M, N) row-major"}[spec.kind]
        if c_op is not None and spec.name == c_op.name:
            what += ", the source C"
        params.append(Param(f"{el} const*", spec.name, what))
    for o in dag.outputs:
        if o.kind is OutputKind.NONE:
            continue
        what = {OutputKind.FULL: "(M, N) row-major", OutputKind.ROW: "(M,): per-row reduction",
                OutputKind.COL: "(N,): per-column reduction",
                OutputKind.SCALAR: "(1,): whole-output reduction"}[o.kind]
        if o is d_out:
            what += ", the kernel's D"
        params.append(Param(f"{ELEMENTS[o.dtype]}*", o.name, "output " + what))
    return params


__all__ = ["ExportError", "Leaf", "Tree", "Topo", "Visitor", "Plan", "Param", "Choices",
           "walk", "build", "check_exportable", "choose_c", "choose_d", "element", "ELEMENTS"]
