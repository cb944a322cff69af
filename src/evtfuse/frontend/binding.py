"""The frontend's binding: a ``ParsedEpilogue`` and the operands' values -> an ``ir.Dag``.

Layer: frontend (core: ``ir``, ``axes``, ``derivative`` and the op table). ``bind`` builds
the DAG once the operands' values and the problem (L, M, N) are known: each operand's and
each output's kind read off its shape (``operands``), reductions with or without torch's
dims (``axes``), row functions and ``mean`` built by their table rows' ``lowered`` rules,
and every check of what the epilogue computes against the values given, each error an
``EpilogueError`` at the user's line. ``_Binder`` holds what one binding builds.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from .. import axes as axes_, ir
from ..derivative import Diff
from ..errors import EpilogueError
from ..ir import Output, OutputKind
from ..optable import OPS, Category
from .operands import (_fmt_shape, check_grouped_output, check_names, classify_output,
                       operand_specs)
from .syntax import Assignment, Expr, ParsedSyntax, _contains


def bind(parsed: ParsedSyntax, given: Mapping[str, Any], problem: tuple[int, int, int],
         grouped: bool = False, rank: int | None = None) -> ir.Dag:
    """Build the DAG for operand values ``given`` and output shape (L, M, N) ``problem``.

    ``grouped``: a grouped GEMM (``evtfuse.grouped_gemm``), its G groups in the L place and
    its T rows in the M place, each row in one group: full and per-row tensors are (T, N)
    and (T, 1) (a row's group is its batch, so a full output of a per-group value is
    (T, N)), per-group ones (G, 1, N) and (G, 1, 1) (``operand_specs``).
    ``rank``: 2 or 3, that of A @ B as torch has it, which torch's dims in the epilogue
    count (``x.sum(0)``: the columns of an (M, N) output, the batches of an (L, M, N) one);
    None: read off the full outputs given (``_output_rank``)."""
    check_names(parsed, given)
    specs = operand_specs(parsed.params, given, problem, grouped)
    binder = _Binder(parsed, given, problem, grouped, specs,
                     rank or _output_rank(parsed, given, problem, grouped))
    for a in parsed.assignments:
        binder.assign(a)
    outputs = [binder.output(name, line) for name, line in parsed.returns]
    binder.check_unused(outputs)
    return ir.Dag(tuple(outputs), specs, parsed.name, parsed.gated)


class _Binder:
    """One binding: the nodes of the user's variables (``env``), the accumulator (or its
    pairs) and each operand's load, made once each, the reductions assigned to names, and
    the ids of reductions and of every value computed from one (``late``: a reduction
    feeding computation, docs/performance.md, "Reductions feeding computation")."""

    def __init__(self, parsed: ParsedSyntax, given: Mapping[str, Any],
                 problem: tuple[int, int, int], grouped: bool, specs: tuple, rank: int | None):
        self.parsed, self.given, self.problem = parsed, given, problem
        self.grouped, self.specs, self.rank = grouped, specs, rank
        self.env: dict[str, ir.Node] = {}
        self.acc: ir.Node | None = None
        self.loads: dict[str, ir.Node] = {}
        self.parts: dict[str, ir.Node] = {}  # pairs(accum): "gate" / "up"
        self.late: dict[int, ir.Node] = {}  # (kept alive: an id is never reused while held)
        self.used = _used_names(parsed)
        self.pending: dict[str, tuple[str, ir.Node, int]] = {}  # reductions assigned
        # reductions by target (the output's node, when returned)
        self.reduced: dict[str, ir.Node] = {}

    # -- leaves and expressions
    def accum(self) -> ir.Node:
        if self.acc is None:
            self.acc = ir.accum_node()
        return self.acc

    def lookup(self, name: str, line: int) -> ir.Node:
        if name in self.env:
            return self.env[name]
        if name == "accum":
            return self.accum()
        spec = next(s for s in self.specs if s.name == name)
        if name not in self.loads:
            self.loads[name] = ir.load_node(spec, line)
        return self.loads[name]

    def error(self, message: str, line: int, variable: str | None) -> EpilogueError:
        return EpilogueError(message, variable=variable, line=line, where=self.parsed.where,
                             source_line=self.parsed.text_of(line))

    def leaf(self, e: Expr) -> ir.Node:
        if e.kind == "name":
            node = self.lookup(e.name, e.line)
            if node.conditional_store:
                raise self.error(f"'{e.name}' is a conditional store (store_where); it can only "
                                 "be returned, not used in further computation (compute with "
                                 "the value it stores instead)", e.line, e.name)
            return node
        if e.kind == "const":
            return ir.const_node(e.value, e.line)
        if e.kind == "pair":
            if e.op not in self.parts:
                self.parts[e.op] = ir.accum_node(e.line, e.op)
            return self.parts[e.op]
        return ir.index_node(e.op, e.line)

    def build(self, e: Expr, target: str) -> ir.Node:
        # inputs before users with a stack of their own: an expression thousands of terms
        # deep (a long sum) needs no recursion
        late = self.late
        built: dict[int, ir.Node] = {}
        stack = [(e, False)]
        while stack:
            x, ready = stack.pop()
            if x.kind != "call":
                built[id(x)] = self.leaf(x)
            elif ready:
                ins = [built[id(a)] for a in x.args]
                if OPS[x.op].category is Category.ROWWISE:
                    built[id(x)] = self.rowwise(x, ins[0], target)
                elif OPS[x.op].category is Category.REDUCE:  # inside an expression
                    built[id(x)] = self.nested_reduction(x, ins[0], target)
                else:
                    built[id(x)] = ir.compute_node(x.op, ins, x.params, line=x.line)
                    if any(id(i) in late for i in ins):
                        late[id(built[id(x)])] = built[id(x)]
            else:
                stack.append((x, True))
                stack.extend((a, False) for a in reversed(x.args))
        return built[id(e)]

    def lowered(self, row, ins: tuple, line: int, var: str | None = None) -> ir.Node:
        """A row's ``lowered`` rule over ``ins`` (d.x, d.y, ...), as compute nodes."""
        late = self.late
        node = row.lowered[1](Diff(_NodeBuilder(line), ins, None)).v
        if var is not None and node.kind is ir.NodeKind.COMPUTE:
            node = ir.compute_node(node.op, node.inputs, node.params, var=var, line=line)
        def mark(n: ir.Node) -> bool:  # the rule's new nodes computed from the reduction
            if id(n) in late:
                return True
            hit = n.kind is ir.NodeKind.COMPUTE and any([mark(i) for i in n.inputs])
            if hit:
                late[id(n)] = n
            return hit
        mark(node)
        return node

    def rowwise(self, x: Expr, src: ir.Node, target: str) -> ir.Node:
        """``softmax(src)`` and its kind: the row's reductions (over N, per batch), then the
        row's rule over src and them."""
        row = OPS[x.op]
        if id(src) in self.late:
            raise self.error(f"{x.op}(...) of a value computed from a reduction: a reduction "
                             "cannot reduce a value computed from another (one level of "
                             "reduction feeding computation)", x.line, None)
        if x.axes is not None:  # torch's dim: only the row's (the last dim) is evtfuse's
            reading = self.read_axes(x, target)
            if reading.space is not ir.Space.ROW or not reading.keep_batch:
                full = "(L, M, N)" if self.rank == 3 else "(M, N)"
                raise self.error(f"{x.axes.text}: evtfuse's {x.op} is over each row (dim=-1, "
                                 f"the last dim); dim={x.axes.dims[0]} is another dim of the "
                                 f"{full} output (in the value of '{target}')", x.line, target)
        shifted = any(OPS[op].shifted for op in row.lowered[0])  # its max is a shift
        reds = tuple(ir.reduce_node(op, src, ir.Space.ROW, True, line=x.line,
                                    params=(ir.SHIFT,) if shifted and op == "max" else ())
                     for op in row.lowered[0])
        self.late.update((id(r), r) for r in reds)
        return self.lowered(row, (src, *reds), x.line)

    # -- reductions
    def read_axes(self, x: Expr, target: str | None) -> axes_.Reading:
        """What ``x``'s torch dims mean for this output (``axes.read``), or the error."""
        try:
            return axes_.read(x.axes, self.rank, self.problem[0])
        except axes_.AxesError as exc:
            where = f" (in the value of '{target}')" if target else ""
            raise self.error(f"{exc}{where}", x.line, target) from None

    def broadcast_check(self, x: Expr, reading: axes_.Reading, target: str) -> None:
        """A reduction without keepdim whose torch shape would broadcast along other axes
        than its own, used in computation: refused (torch would compute something else)."""
        if not reading.broadcasts:
            full = "(L, M, N)" if self.rank == 3 else "(M, N)"
            raise self.error(f"{x.axes.text} without keepdim=True has torch's shape "
                             f"{reading.result_shape}, which torch aligns from the right "
                             f"against the {full} output, along other axes than the ones it "
                             f"keeps (in the value of '{target}'); write keepdim=True",
                             x.line, target)

    def reduction(self, op: str, src: ir.Node, space: ir.Space, keep: bool, var: str | None,
                  line: int) -> ir.Node:
        """The reduce node (and, for mean, the division by the count after it)."""
        row = OPS[op]
        red_op = row.lowered[0][0] if row.lowered else op
        node = ir.reduce_node(red_op, src, space, keep, var=None if row.lowered else var,
                              line=line)
        self.late[id(node)] = node
        if row.lowered:  # mean: the sum, then a division by the count after it
            count = _reduced_count(space, node.batched, self.problem)
            node = self.lowered(row, (node, ir.const_node(float(count), line)), line, var)
        return node

    def nested_reduction(self, x: Expr, src: ir.Node, target: str) -> ir.Node:
        """A reduction inside an expression (``D = accum * rsqrt(mean(accum * accum) +
        eps)``): as if assigned to a name of its own and used (the same DAG), per row unless
        torch's dims say otherwise; it holds no user's name (``Node.var`` None)."""
        if id(src) in self.late:
            raise self.error(f"{x.op}(...) in the value of '{target}' reduces a value computed "
                             "from another reduction; a reduction's result can feed "
                             "computation, but not a second reduction", x.line, target)
        space, keep = ir.Space.ROW, True
        if x.axes is not None:
            reading = self.read_axes(x, target)
            self.broadcast_check(x, reading, target)
            space, keep = reading.space, reading.keep_batch
        return self.reduction(x.op, src, space, keep, None, x.line)

    def check_axes_output(self, x: Expr, reading: axes_.Reading, name: str, kind: OutputKind,
                          batched: bool) -> None:
        """A returned reduction with torch's dims: its output's shape must hold what they
        reduce (the axes, and with L > 1 whether the batches stay apart)."""
        L = self.problem[0]
        batches_differ = L > 1 and not self.grouped and batched != reading.keep_batch
        if kind.space is reading.space and not batches_differ:
            return
        shape = _fmt_shape(tuple(self.given[name].shape))
        held = kind.value + (("" if batched else " over the batches too")
                             if L > 1 and not self.grouped else "")
        raise self.error(f"{x.axes.text} reduces "
                         f"{axes_.describe(reading.space, reading.keep_batch, self.rank)}, but "
                         f"output {name} has shape {shape}, which holds a {held}: give {name} "
                         f"the shape "
                         f"{axes_.shape_for(reading.space, reading.keep_batch, self.rank)}",
                         x.line, name)

    # -- assignments
    def assign(self, a: Assignment) -> None:
        """``a.target = a.expr``: its node, under its name."""
        if a.expr.kind == "call" and OPS[a.expr.op].category is Category.REDUCE:
            self.assign_reduction(a)
            return
        if _contains(a.expr, Category.STORE, below_top=True):
            raise self.error(f"store_where(...) must be the whole value of an assignment (as "
                             f"in '{a.target} = store_where(x > 0.0, x)'), not part of an "
                             f"expression", a.line, a.target)
        node = self.build(a.expr, a.target)
        if node.kind in (ir.NodeKind.COMPUTE,) and node.var is None:
            was = id(node)
            node = ir.Node(node.kind, node.inputs, node.op, node.params, node.value, node.operand,
                           node.space, node.batched, node.dtype, a.target, a.line)
            if was in self.late:
                self.late[id(node)] = node
        self.env[a.target] = node

    def assign_reduction(self, a: Assignment) -> None:
        """``a.target = sum(...)`` (a reduction, the whole value): over the axes its output's
        shape says when returned, its torch dims say, or else per row."""
        x = a.expr
        op = x.op
        src = self.build(x.args[0], a.target)
        if id(src) in self.late:
            raise self.error(f"'{a.target}' = {op}(...) reduces a value computed from another "
                             "reduction; a reduction's result can feed computation, but not a "
                             "second reduction", a.line, a.target)
        reading = None if x.axes is None else self.read_axes(x, a.target)
        space, keep = self.reduced_space(a, reading)
        if reading is not None and (a.target in self.used
                                    or a.target not in self.parsed.outputs):
            self.broadcast_check(x, reading, a.target)
        node = self.reduction(op, src, space, keep, a.target, a.line)
        self.pending[a.target] = (op, src, a.line)
        self.reduced[a.target] = node
        self.env[a.target] = node

    def reduced_space(self, a: Assignment, reading: axes_.Reading | None
                      ) -> tuple[ir.Space, bool]:
        """Where an assigned reduction reduces to, and whether it keeps the batches apart."""
        x, op = a.expr, a.expr.op
        if a.target in self.parsed.outputs:  # the output's shape picks the axes
            value = self.given[a.target]
            kind, _, keep = classify_output(a.target, value, self.problem, reduction=True)
            if kind is OutputKind.FULL:
                raise self.error(f"'{a.target}' = {op}(...) is a reduction, but output "
                                 f"{a.target} has the full shape "
                                 f"{_fmt_shape(tuple(value.shape))}; give it the shape of "
                                 "what remains: (M, 1) per row, (N,) per column, (1,) for the "
                                 "whole output (with a leading L to keep batches apart)",
                                 a.line, a.target)
            if kind is OutputKind.NONE:
                raise self.error(f"'{a.target}' = {op}(...) is a reduction; its output cannot "
                                 "be None", a.line, a.target)
            if reading is not None:
                self.check_axes_output(x, reading, a.target, kind, keep)
            return kind.space, keep
        if reading is not None:
            return reading.space, reading.keep_batch
        return ir.Space.ROW, True  # used, not returned: per row (over N), batches apart

    # -- outputs
    def output(self, name: str, line: int) -> Output:
        """The returned ``name``, stored as its value given says."""
        kind, dtype, batched = classify_output(name, self.given[name], self.problem,
                                               reduction=name in self.pending)
        if name in self.pending:
            self.pending.pop(name)
            node = self.reduced[name]
        else:
            node = self.lookup(name, line)
            self.check_stored(name, line, node, kind, batched)
        if self.grouped:
            check_grouped_output(name, node, kind, batched, self.given[name])
        return Output(name, node, kind, dtype, batched)

    def check_stored(self, name: str, line: int, node: ir.Node, kind: OutputKind,
                     batched: bool) -> None:
        """A returned value that is not a reduction assigned to it: its output's shape must
        hold it (a conditional store full, a per-batch value per batch, a vector a value
        that does not vary along what it lacks)."""
        L = self.problem[0]
        if node.conditional_store and kind is not OutputKind.FULL:
            held = "is None" if kind is OutputKind.NONE else \
                f"has shape {_fmt_shape(tuple(self.given[name].shape))}"
            raise self.error(f"'{name}' = store_where(...) writes only where its condition "
                             f"holds and keeps the buffer's values elsewhere, so output {name} "
                             f"must be a full output buffer you give (M, N) or (L, M, N); it "
                             f"{held}", line, name)
        if kind is OutputKind.FULL and node.batched and not batched and L > 1 \
                and not self.grouped:
            raise self.error(f"output {name} has shape "
                             f"{_fmt_shape(tuple(self.given[name].shape))}, but '{name}' "
                             f"differs per batch (L = {L}); give it the shape (L, M, N)",
                             line, name)
        if kind not in (OutputKind.FULL, OutputKind.NONE):
            fits = node.space.join(kind.space) is kind.space and (
                batched or not node.batched or L == 1)
            if not fits:
                shape = _fmt_shape(tuple(self.given[name].shape))
                raise self.error(f"output {name} has shape {shape}, which holds a "
                                 f"{kind.value}, but '{name}' is not computed by sum/max/min: "
                                 f"give {name} the full output shape, or reduce it "
                                 f"(e.g. '{name}_sum = sum({name})')", line, name)

    def check_unused(self, outputs: list[Output]) -> None:
        """What a grouped GEMM refuses of its reductions; every reduction assigned used or
        returned, every conditional store returned."""
        if self.grouped:
            _check_grouped_reductions(self.late.values(), self.error)
        used = {id(n) for n in ir.Dag(tuple(outputs), self.specs).nodes} \
            if self.pending else set()
        for name, (op, _, rline) in self.pending.items():
            if id(self.reduced[name]) not in used:
                raise self.error(f"'{name}' = {op}(...) is a reduction whose result is never "
                                 "returned or used; return it, or compute with it", rline, name)
        for a in self.parsed.assignments:
            if a.conditional and a.target not in self.parsed.outputs:
                raise self.error(f"'{a.target}' = store_where(...) is a conditional store whose "
                                 "result is never returned; return it (a conditional store is "
                                 "an output)", a.line, a.target)


class _NodeBuilder:
    """The algebra of ``derivative.Diff`` over DAG nodes (an op table row's ``lowered``
    rule builds its nodes with it)."""

    def __init__(self, line: int):
        self.line = line

    def const(self, value: float) -> ir.Node:
        return ir.const_node(value, self.line)

    def call(self, op: str, vals: list, params: dict) -> ir.Node:
        return ir.compute_node(op, vals, tuple(params.items()), line=self.line)


def _check_grouped_reductions(late, error) -> None:
    """What a grouped GEMM refuses of its reductions (``late``: the reductions and the
    values computed from them): a reduction feeding computation (no two-pass plan for
    grouped problems), and shifted_sumexp (the grouped reference evaluator combines the
    groups' results, which shifted_sumexp's are not without their max)."""
    reductions = [n for n in late if n.kind is ir.NodeKind.REDUCE]
    if len(reductions) < len(late):
        first = reductions[0]
        raise error(f"{first.op}(...) feeds computation (softmax, log_softmax, mean or a "
                    "reduction's result used); grouped GEMMs do not run reductions that feed "
                    "computation yet (docs/grouped.md)", first.line, first.var)
    shifted = [n for n in reductions if n.op == "shifted_sumexp"]
    if shifted:
        raise error("shifted_sumexp(...) in a grouped GEMM: grouped kernels do not compute it "
                    "yet; logsumexp(x) - max(x) gives the log of it", shifted[0].line,
                    shifted[0].var)


def _output_rank(parsed: ParsedSyntax, given: Mapping[str, Any],
                 problem: tuple[int, int, int], grouped: bool) -> int | None:
    """The rank torch gives A @ B here, as torch's dims count it: 3 with batches (L > 1), 2
    for a grouped GEMM ((T, N) rows of every group), else that of the full output tensors
    given (gemm allocates them so); None where no full output says."""
    if grouped:
        return 2
    if problem[0] > 1:
        return 3
    ranks = {v.dim() for n in parsed.outputs
             if isinstance(v := given.get(n), torch.Tensor) and v.dim() in (2, 3)
             and tuple(v.shape[-2:]) == tuple(problem[1:])}
    return ranks.pop() if len(ranks) == 1 else None


def _used_names(parsed: ParsedSyntax) -> set[str]:
    """The names the assignments' values read."""
    names: set[str] = set()
    for a in parsed.assignments:
        stack = [a.expr]
        while stack:
            x = stack.pop()
            if x.kind == "name":
                names.add(x.name)
            stack.extend(x.args)
    return names


def _reduced_count(space: ir.Space, batched: bool, problem: tuple[int, int, int]) -> int:
    """How many elements a reduction to ``space`` takes (over L too unless ``batched``)."""
    L, M, N = problem
    count = 1 if batched else L
    if space in (ir.Space.COL, ir.Space.SCALAR):
        count *= M
    if space in (ir.Space.ROW, ir.Space.SCALAR):
        count *= N
    return count
