"""The epilogue emitter: Triton statements for one DAG's epilogue on a tile of the accumulator.

Layer: backends/triton. Reads the optimised ``ir.Dag`` and the op table (each op's Triton
spelling), never the user's source. Every kernel family uses it: the tile object a family
passes in (``triton_tiles.PortableTile`` / ``HopperTile``, ``gluon_tile.GluonTile``) says
how that family loads and stores full tiles; the emitter computes the values and the
per-row/per-column/scalar operands and outputs, and hands every reduction's values to its
``reductions`` (``reduce_emit.ReductionEmitter``: per-tile partials and their combination,
tickets, atomic folds, program-level sums), the same way for all families.
Program-level scalars are emitted once, the rest once per sub-tile. Every identifier it
writes for an operand, an output or a node comes from the kernel's namer (``spec.names``).
"""

from __future__ import annotations

import torch

from ...ir import Node, NodeKind, OperandKind, OutputKind, Space
from ...optable import CAST_TARGETS, FP8_DTYPES, OPS, Category, _lit
from .emit_common import all_of
from .reduce_emit import ReductionEmitter
from .spec import (INT_OUTPUTS, KernelSpec, _saturated, combined_in_kernel, full_outputs,
                   reduce_outputs, vector_outputs)


class EpilogueEmitter:
    """Emits the epilogue of one DAG: program-level scalars once, the rest per sub-tile."""

    def __init__(self, spec: KernelSpec):
        self.spec = spec
        self.dag = spec.dag
        self.names = spec.names
        self.hoisted: dict[int, str] = {}
        self.reductions = ReductionEmitter(spec)  # the reduction outputs' code

    @staticmethod
    def _program_level(n: Node) -> bool:
        return n.space is Space.SCALAR and not n.batched and n.kind is not NodeKind.INDEX \
            and n.kind is not NodeKind.REDUCE and n.kind is not NodeKind.ACCUM

    def prologue(self, indent: str) -> list[str]:
        """Scalars that do not depend on the tile: loaded and computed once per program."""
        lines: list[str] = []
        for k, n in enumerate(self.dag.nodes):
            if not self._program_level(n):
                continue
            expr = self._expr(n, self.hoisted, sub=None)
            name = self.names.hoisted(k)
            if n.kind is NodeKind.CONST:
                self.hoisted[id(n)] = expr  # literals stay inline
                continue
            lines.append(f"{indent}{name} = {expr}")
            self.hoisted[id(n)] = name
        return lines

    def _arg(self, n: Node, env: dict[int, str], as_float: bool) -> str:
        v = env[id(n)]
        if as_float and n.dtype is torch.bool:
            return f"({v}).to({self.spec.compute})"
        return v

    @staticmethod
    def _acc(n: Node, sub) -> str:
        """The accumulator tile, or one half of its column pairs (``pairs(accum)``: the
        portable kernel's ``acc_gate`` / ``acc_up``, ``codegen._gated_split_lines``)."""
        return sub.acc if n.op is None else f"{sub.acc}_{n.op}"

    def _expr(self, n: Node, env: dict[int, str], sub) -> str:
        if n.kind is NodeKind.ACCUM:
            acc = self._acc(n, sub)
            # int32 and fp16 accumulators: the epilogue computes in fp32
            return f"{acc}.to(tl.float32)" if self.spec.int_acc or self.spec.acc16 else acc
        if n.kind is NodeKind.CONST:
            return _lit(n.value)
        if n.kind is NodeKind.INDEX:
            return f"{sub.rm}[:, None].to({self.spec.compute})" if n.op == "row" \
                else f"{sub.rn}[None, :].to({self.spec.compute})"
        if n.kind is NodeKind.LOAD:
            return self._load(n.operand, sub)
        if n.kind is NodeKind.COMPUTE:
            row = OPS[n.op]
            if row.category is Category.SELECT:
                c = env[id(n.inputs[0])]
                cond = c if n.inputs[0].dtype is torch.bool else f"({c} != 0.0)"
                args = [cond] + [self._arg(i, env, True) for i in n.inputs[1:]]
            else:
                args = [self._arg(i, env, True) for i in n.inputs]
            if self.spec.f64 and n.op == "cast":
                # to a float dtype through fp32, as torch converts a float64 (c10's Half,
                # BFloat16 and float8 types are made from a float): fp32 itself rounds;
                # the rounded value back in float64, as the reference's cast gives it
                if CAST_TARGETS[n.param_dict["dtype"]].dtype.is_floating_point:
                    args = [f"({args[0]}).to(tl.float32)"]
                return f"({row.spell(args, n.param_dict)}).to(tl.float64)"
            return row.spell(args, n.param_dict, cuda=self.spec.cuda_spellings)
        raise NotImplementedError(f"the Triton emitter has no code for {n.kind.value} nodes yet")

    def _load(self, spec, sub) -> str:
        u = self.names.user(spec.name)
        if spec.kind is OperandKind.RUNTIME_SCALAR:
            if self.spec.f64:
                # a float64 tensor (x + -0.0 is x, -0.0 included): the CPU interpreter
                # passes the Python float itself and rounds it to fp32 where it is assigned
                # to a name (the GPU's float64 parameter needs nothing)
                return f"({u()} + tl.full((), -0.0, tl.float64))"
            return u()
        bofs = f"bid64 * {u('sl')}" if spec.batched else "0"
        if spec.kind is OperandKind.DEVICE_SCALAR:
            return f"tl.load({u('ptr')} + {bofs}).to({self.spec.compute})"
        if spec.kind in (OperandKind.PER_ROW, OperandKind.PER_COL):
            return sub.load_vector(u, spec.kind, bofs)
        return sub.load_full(u, spec.batched)

    def body(self, sub, indent: str, first: bool = True, last: bool = True) -> list[str]:
        """Loads, computes and stores for one sub-tile described by ``sub`` (``first`` and
        ``last`` say where it stands among the tile's sub-tiles)."""
        env: dict[int, str] = dict(self.hoisted)
        lines = self._values(env, sub, indent)
        for o in full_outputs(self.dag):
            lines.append(indent + self._store_full(o, env, sub))
        for o in vector_outputs(self.dag):
            lines += self._store_vector(o, env, sub, indent)
        for o in reduce_outputs(self.dag):
            lines += self.reductions.partial(o, self._reduced(o, env, sub), sub, indent,
                                             first, last)
        if last:
            for o in reduce_outputs(self.dag):
                if (self.spec.grouped or combined_in_kernel(o, self.spec.family)) and \
                        not self.reductions.program_reduced(o):
                    lines += self.reductions.combine(o, sub, indent)
        return lines

    def _values(self, env: dict[int, str], sub, indent: str) -> list[str]:
        """The sub-tile's loads and computed values: each node's expression goes into
        ``env``, inline where it is short and used once, else as a named variable."""
        lines: list[str] = []
        users = self.dag.users
        for k, n in enumerate(self.dag.nodes):
            if id(n) in env:
                continue
            if n.kind is NodeKind.REDUCE:
                if users[id(n)]:  # feeds computation: whole in the tile (one pass)
                    more, env[id(n)] = self.reductions.inline(
                        n, k, self._tile_shaped(n.inputs[0], env, sub), sub, indent)
                    lines += more
                continue
            expr = self._expr(n, env, sub)
            single_use = len(users[id(n)]) <= 1 and not any(o.node is n for o in self.dag.outputs)
            if n.kind in (NodeKind.ACCUM, NodeKind.CONST) or (
                    single_use and n.kind is NodeKind.COMPUTE and len(expr) < 60):
                env[id(n)] = expr if n.kind is not NodeKind.COMPUTE else f"({expr})"
                continue
            name = self.names.value(k, sub.piece)
            lines.append(f"{indent}{name} = {expr}")
            env[id(n)] = name
        return lines

    def _store_full(self, o, env: dict[int, str], sub) -> str:
        """The store of full output ``o``'s tile (conditional for ``store_where``)."""
        v = self._arg(o.node, env, True)
        where = None
        if o.node.conditional_store:
            cond = o.node.inputs[0]  # store_where(cond, value): stored where cond holds
            where = env[id(cond)] if cond.dtype is torch.bool else f"({env[id(cond)]} != 0.0)"
        if o.node.space is not Space.FULL:
            v = f"({v} + {sub.zeros()})"
        v = self._converted(o, v, sub)
        return (sub.store_full(self.names.user(o.name), v, o.batched) if where is None else
                sub.store_full(self.names.user(o.name), v, o.batched, where=where))

    def _converted(self, o, v: str, sub) -> str:
        """``v`` as full output ``o``'s dtype takes it: integers rounded and saturated, fp8
        saturated; other dtypes unchanged (the store converts)."""
        if o.dtype in INT_OUTPUTS:
            if self.spec.int_acc and o.node.kind is NodeKind.ACCUM and o.dtype == torch.int32:
                return self._acc(o.node, sub)  # the exact int32 accumulator
            # round half to even, saturate, as CUTLASS's float-to-int converters
            lo, hi = INT_OUTPUTS[o.dtype]
            return f"_ef_round_sat({v}, {lo}, {hi})"
        if o.dtype in FP8_DTYPES:  # saturate (satfinite), NaN kept, as CUTLASS does
            return _saturated(v, o.dtype)
        return v

    def _reduced(self, o, env: dict[int, str], sub) -> str:
        """The tile-shaped values reduction output ``o`` reduces."""
        return self._tile_shaped(o.node.inputs[0], env, sub)

    def _tile_shaped(self, n: Node, env: dict[int, str], sub) -> str:
        """Node ``n``'s value as a float tile (broadcast where it is not full)."""
        v = self._arg(n, env, True)
        if n.space is not Space.FULL:
            v = f"({v} + {sub.zeros()})"
        return v

    def _store_vector(self, o, env, sub, indent) -> list[str]:
        """A value that is constant along the axes its (vector/scalar) output lacks."""
        u = self.names.user(o.name)
        ptr0, sl = u("ptr"), u("sl")
        v = self._arg(o.node, env, True)
        conds = [] if o.batched or not sub.bid else [f"{sub.bid} == 0"]
        if o.kind is OutputKind.ROW:
            val = sub.along(v, OutputKind.ROW)
            ptr = f"{ptr0} + bid64 * {sl} + {sub.rm} * {u('sm')}"
            conds = [f"{sub.rm} < M", f"{sub.pid_n} == 0", sub.first_sub, *conds]
        elif o.kind is OutputKind.COL:
            val = sub.along(v, OutputKind.COL)
            ptr = f"{ptr0} + bid64 * {sl} + {sub.rn} * {u('sn')}"
            conds = [f"{sub.rn} < N", f"{sub.pid_m} == 0", *conds]
        else:
            val, at, only = sub.one(v)
            ptr = f"{ptr0} + bid64 * {sl}{at}"
            conds = [f"{sub.pid_m} == 0", f"{sub.pid_n} == 0", sub.first_sub,
                     *filter(None, [only]), *conds]
        mask = all_of(*conds)
        if o.dtype in FP8_DTYPES:
            val = _saturated(val, o.dtype)
        return [f"{indent}tl.store({ptr}, ({val}).to({ptr0}.dtype.element_ty), mask={mask})"]
