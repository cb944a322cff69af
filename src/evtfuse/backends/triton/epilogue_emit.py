"""The epilogue emitter: Triton statements for one DAG's epilogue on a tile of the accumulator.

Layer: backends/triton. Reads the optimised ``ir.Dag`` and the op table (each op's Triton
spelling), never the user's source. Every kernel family uses it: the tile object a family
passes in (``codegen._PortableTile`` / ``_HopperTile``, ``gluon_codegen._GluonTile``) says
how that family loads and stores full tiles; the emitter computes the values, the
per-row/per-column/scalar operands and outputs, and every reduction's per-tile partials
and their combination (tickets, atomic folds, program-level sums), the same way for all.
Program-level scalars are emitted once, the rest once per sub-tile. Every identifier it
writes for an operand, an output or a node comes from the kernel's namer (``spec.names``).
"""

from __future__ import annotations

import torch

from ...ir import Node, NodeKind, OperandKind, OutputKind, Space
from ...optable import FP8_DTYPES, OPS, Category, _lit
from .spec import (_COMBINE_LOADS, _FOLD_FINISH, _LD_L2, FOLD_IDENTITY_BITS, INT_OUTPUTS,
                   TMA_FAMILIES, KernelSpec, _saturated, atomic_folded, combined_in_kernel,
                   full_outputs, reduce_outputs, vector_outputs, written_roles)


def all_of(*conds: str) -> str:
    """A mask: every condition of ``conds`` (Triton expressions, tensors or scalars). Two or
    more are written ``((a) & (b) ...) != 0``: Triton 3.9's CPU interpreter gives `&` of a
    boolean tensor and a scalar condition integer data that tl.load and tl.store refuse as
    a mask (versions.WORKAROUNDS["interpreter_scalar_and"]); the GPU compiler folds the
    comparison away."""
    if len(conds) == 1:
        return conds[0]
    return "(" + " & ".join(f"({c})" for c in conds) + ") != 0"


class EpilogueEmitter:
    """Emits the epilogue of one DAG: program-level scalars once, the rest per sub-tile."""

    def __init__(self, spec: KernelSpec):
        self.spec = spec
        self.dag = spec.dag
        self.names = spec.names
        self.hoisted: dict[int, str] = {}

    @property
    def _lse_part(self) -> str:
        """logsumexp's per-tile (max, sum of exp) helper: on a GPU its exp is MUFU.EX2
        without subnormal handling (the terms are exp(x - max) <= 1; one below 2^-126 adds
        nothing to a sum >= 1)."""
        return "_ef_lse_part_cuda" if self.spec.cuda else "_ef_lse_part"

    def program_reduced(self, o) -> bool:
        """A whole-output reduction kept in registers across all tiles of a persistent
        program (one partial per program, per consumer warpgroup in the gluon family,
        not per tile): the cross-warp step and the ticket run once, after the last tile."""
        return self.spec.family in TMA_FAMILIES and o.kind is OutputKind.SCALAR and not o.batched

    def program_accumulators(self, indent: str, like: str | None = None) -> list[str]:
        """The accumulators ``program_reduced`` outputs carry across tiles: one value per
        tile row. ``like``: a sub-tile whose row sums have the layout they must have (a
        Gluon consumer's column pieces)."""
        lines = []
        for o in reduce_outputs(self.dag):
            if self.program_reduced(o):
                u = self.names.user(o.name)
                ident = _lit(OPS[o.node.op].reduce_identity)
                zeros = f"tl.sum({like}, axis=1)" if like else "tl.zeros((BLOCK_M,), tl.float32)"
                full = f"{zeros} + {ident}" if like else f"tl.full((BLOCK_M,), {ident}, tl.float32)"
                lines.append(f"{indent}{u('pacc')} = {full}")
                if o.node.op == "logsumexp":
                    lines.append(f"{indent}{u('paccs')} = {zeros}")
        return lines

    def program_finish(self, indent: str, slot: str = "start", count: str = "tl.num_programs(0)",
                       lane: str = "tl.arange(0, BLOCK_M)", barrier: str = "tl.debug_barrier()"
                       ) -> list[str]:
        """After a program's (a consumer's) last tile: its partial goes to workspace entry
        ``slot`` of ``count``; the last to arrive combines them (``lane``-wide reads)."""
        lines = []
        for o in reduce_outputs(self.dag):
            if not self.program_reduced(o):
                continue
            u = self.names.user(o.name)
            row = OPS[o.node.op]
            ws, pacc = u("ws"), u("pacc")
            if o.node.op == "logsumexp":
                lines.append(f"{indent}{u('pm')}, {u('ps')} = _ef_lse_reduce({pacc}, {u('paccs')})")
                lines.append(f"{indent}tl.store({ws} + {slot}, {u('pm')})")
                lines.append(f"{indent}tl.store({u('ws2')} + {slot}, {u('ps')})")
            elif o.node.op == "sum":
                lines.append(f"{indent}tl.store({ws} + {slot}, tl.sum({pacc}, axis=0))")
            else:
                comb = row.combiner(self.spec.cuda)
                lines.append(f"{indent}tl.store({ws} + {slot}, tl.reduce({pacc}, 0, {comb}))")
            if combined_in_kernel(o, self.spec.family):
                lines += self._combine_scalar(o, lane, "0", "0", count, barrier, indent)
        return lines

    def fold_finish(self, count: str, indent: str, lane: str = f"tl.arange(0, {_FOLD_FINISH})",
                    barrier: str = "tl.debug_barrier()") -> list[str]:
        """After a program's last tile (``atomic_folded`` outputs): a ticket per program;
        the last of ``count`` copies each workspace into its output (``lane``: an index
        vector of ``_FOLD_FINISH`` elements) and resets it to the identity."""
        lines: list[str] = []
        for o in reduce_outputs(self.dag):
            if not atomic_folded(o):
                continue
            u = self.names.user(o.name)
            ext = "M" if o.kind is OutputKind.ROW else "N"
            total = f"L * {ext}" if o.batched else ext
            inner, body = indent + "    ", indent + "        "
            fo, fm, fb, ws, out = u("fo"), u("fm"), u("fb"), u("ws"), u("out")
            lines += self._ticket(o, "0", count, barrier, indent)  # one counter per output
            lines += [
                f"{inner}for f0 in range(0, {total}, {_FOLD_FINISH}):",
                f"{body}{fo} = f0 + {lane}",
                f"{body}{fm} = {fo} < {total}",
                f"{body}{fb} = tl.load({ws} + {fo}, mask={fm}, {_LD_L2})",
                f"{body}tl.store({out} + ({fo} // {ext}) * {u('osl')} + ({fo} % {ext}) * {u('os')}, "
                f"{fb}.to(tl.float32, bitcast=True).to({out}.dtype.element_ty), mask={fm})",
                # Triton may give the reset another layout than the load (it did for 16-bit
                # outputs on sm_90: a thread reset elements before the thread that loads
                # them had read them), so every thread's loads come before any reset
                f"{body}{barrier}",
                f"{body}tl.store({ws} + {fo}, {FOLD_IDENTITY_BITS[o.node.op]}, mask={fm})",
            ]
        return lines

    def fold_params(self) -> list[tuple[str, str]]:
        """The kernel parameters ``fold_finish`` reads, with their roles (see
        ``epilogue_params``)."""
        return [(self.names(o.name, r), r) for o in reduce_outputs(self.dag) if atomic_folded(o)
                for r in written_roles(o)]

    def fold_names(self) -> list[str]:
        return [p for p, _ in self.fold_params()]

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
            return f"({v}).to(tl.float32)"
        return v

    @staticmethod
    def _acc(n: Node, sub) -> str:
        """The accumulator tile, or one half of its column pairs (``pairs(accum)``: the
        portable kernel's ``acc_gate`` / ``acc_up``, ``codegen._gated_split_lines``)."""
        return sub.acc if n.op is None else f"{sub.acc}_{n.op}"

    def _expr(self, n: Node, env: dict[int, str], sub) -> str:
        if n.kind is NodeKind.ACCUM:
            acc = self._acc(n, sub)
            return f"{acc}.to(tl.float32)" if self.spec.int_acc else acc
        if n.kind is NodeKind.CONST:
            return _lit(n.value)
        if n.kind is NodeKind.INDEX:
            return f"{sub.rm}[:, None].to(tl.float32)" if n.op == "row" \
                else f"{sub.rn}[None, :].to(tl.float32)"
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
            return row.spell(args, n.param_dict, cuda=self.spec.cuda)
        raise NotImplementedError(f"the Triton emitter has no code for {n.kind.value} nodes yet")

    def _load(self, spec, sub) -> str:
        u = self.names.user(spec.name)
        if spec.kind is OperandKind.RUNTIME_SCALAR:
            return u()
        bofs = f"bid64 * {u('sl')}" if spec.batched else "0"
        if spec.kind is OperandKind.DEVICE_SCALAR:
            return f"tl.load({u('ptr')} + {bofs}).to(tl.float32)"
        if spec.kind in (OperandKind.PER_ROW, OperandKind.PER_COL):
            return sub.load_vector(u, spec.kind, bofs)
        return sub.load_full(u, spec.batched)

    def body(self, sub, indent: str, first: bool = True, last: bool = True) -> list[str]:
        """Loads, computes and stores for one sub-tile described by ``sub`` (``first`` and
        ``last`` say where it stands among the tile's sub-tiles)."""
        env: dict[int, str] = dict(self.hoisted)
        lines: list[str] = []
        users = self.dag.users
        for k, n in enumerate(self.dag.nodes):
            if id(n) in env or n.kind is NodeKind.REDUCE:
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
        for o in full_outputs(self.dag):
            v = self._arg(o.node, env, True)
            where = None
            if o.node.kind is NodeKind.COMPUTE and OPS[o.node.op].category is Category.STORE:
                cond = o.node.inputs[0]  # store_where(cond, value): stored where cond holds
                where = env[id(cond)] if cond.dtype is torch.bool else f"({env[id(cond)]} != 0.0)"
            if o.node.space is not Space.FULL:
                v = f"({v} + {sub.zeros()})"
            if o.dtype in INT_OUTPUTS:
                if self.spec.int_acc and o.node.kind is NodeKind.ACCUM and o.dtype == torch.int32:
                    v = self._acc(o.node, sub)  # the exact int32 accumulator
                else:  # round half to even, saturate, as CUTLASS's float-to-int converters
                    lo, hi = INT_OUTPUTS[o.dtype]
                    v = f"_ef_round_sat({v}, {lo}, {hi})"
            elif o.dtype in FP8_DTYPES:  # saturate (satfinite), NaN kept, as CUTLASS does
                v = _saturated(v, o.dtype)
            store = (sub.store_full(self.names.user(o.name), v, o.batched) if where is None else
                     sub.store_full(self.names.user(o.name), v, o.batched, where=where))
            lines.append(indent + store)
        for o in vector_outputs(self.dag):
            lines += self._store_vector(o, env, sub, indent)
        for o in reduce_outputs(self.dag):
            lines += self._reduce(o, env, sub, indent, first, last)
        if last:
            for o in reduce_outputs(self.dag):
                if combined_in_kernel(o, self.spec.family) and not self.program_reduced(o):
                    lines += self._combine(o, sub, indent)
        return lines

    def _ticket(self, o, group: str, count: str, barrier: str, indent: str) -> list[str]:
        """Take a ticket for ``group``: the partial stores of every thread of the program
        are ordered before it (barrier, then a release at GPU scope); the last of ``count``
        tickets acquires the others' partials, resets the counter for the next launch and
        runs the lines that follow (indented one more level)."""
        u = self.names.user(o.name)
        return [f"{indent}{barrier}",
                f"{indent}{u('tk')} = tl.atomic_add({u('cnt')} + {group}, 1, sem=\"acq_rel\", scope=\"gpu\")",
                f"{indent}if {u('tk')} == {count} - 1:",
                f"{indent}    tl.atomic_xchg({u('cnt')} + {group}, 0)"]

    def _combine(self, o, sub, indent: str) -> list[str]:
        """Lines run after a tile's partials are stored: the last tile of the group
        combines the group's partials (ascending order) into the output."""
        u = self.names.user(o.name)
        ws, cm, out = u("ws"), u("cm"), u("out")
        b = "bid64 * " if o.batched else "0 * "
        if o.kind is OutputKind.SCALAR:
            count = "num_pid_m * num_pid_n" if o.batched else "num_pid_m * num_pid_n * L"
            return self._combine_scalar(o, sub.lane(), "bid64" if o.batched else "0",
                                        f"{b}num_pid_m * num_pid_n", count, sub.barrier(), indent)
        if o.kind is OutputKind.ROW:  # partials [L, tiles along N, M]
            tiles, other, extent, idx = "num_pid_n", "num_pid_m", "M", [sub.rm]
            group = sub.pid_m
        else:  # per column: partials [L, tiles along M, N]; every piece's columns
            tiles, other, extent, idx = "num_pid_m", "num_pid_n", "N", list(sub.all_rn)
            group = sub.pid_n
        count = tiles if o.batched else f"{tiles} * L"
        base = f"{b}{tiles} * {extent}"
        comb = OPS[o.node.op].combiner(self.spec.cuda)
        # a partial past the end reads as the value that changes nothing (-0.0 for sums:
        # x + -0.0 is x for every x, signed zeros included)
        ident = "-0.0" if o.node.op == "sum" else _lit(OPS[o.node.op].reduce_identity)
        inner, body = indent + "    ", indent + "        "
        lines = self._ticket(o, f"{b}{other} + {group}", count, sub.barrier(), indent)
        for i in idx:
            mask = f"{i} < {extent}"
            # _COMBINE_LOADS loads in flight per step, combined in ascending order (one L2
            # round trip per partial made a 64-tile row's combine cost ~25 us on an H100)
            # a workspace of 2^31 partials or more (``KernelSpec.int64``): the step in 64 bits
            j = "tl.cast(j0, tl.int64)" if self.spec.int64 else "j0"
            loads = [f"{body}{u('p', k)} = tl.load({ws} + {base} + ({j} + {k}) * {extent} + {i}, "
                     f"mask={all_of(mask, f'j0 + {k} < {count}')}, other={ident}, {_LD_L2})"
                     for k in range(_COMBINE_LOADS)]
            lines += [f"{inner}{cm} = tl.load({ws} + {base} + {i}, mask={mask}, {_LD_L2})",
                      f"{inner}for j0 in range(1, {count}, {_COMBINE_LOADS}):",
                      *loads,
                      *[f"{body}{cm} = {comb}({cm}, {u('p', k)})" for k in range(_COMBINE_LOADS)],
                      f"{inner}tl.store({out} + {b}{u('osl')} + {i} * {u('os')}, "
                      f"{cm}.to({out}.dtype.element_ty), mask={mask})"]
        return lines

    def _combine_scalar(self, o, lane: str, group: str, base: str, count: str, barrier: str,
                        indent: str) -> list[str]:
        """The whole-output case: ``count`` partials at ``base``, read ``lane``-wide."""
        u = self.names.user(o.name)
        ws, cm, ln, out = u("ws"), u("cm"), u("ln"), u("out")
        row = OPS[o.node.op]
        ident = _lit(row.reduce_identity)
        inner = indent + "    "
        comb = row.combiner(self.spec.cuda)
        total = f"tl.sum({cm}, axis=0)" if o.node.op == "sum" else f"tl.reduce({cm}, 0, {comb})"
        lines = self._ticket(o, group, count, barrier, indent)
        lines += [f"{inner}{ln} = {lane}",
                  f"{inner}{cm} = tl.load({ws} + {base} + {ln}, mask={ln} < {count}, "
                  f"other={ident}, {_LD_L2})",
                  f"{inner}for j0 in range({ln}.shape[0], {count}, {ln}.shape[0]):",
                  f"{inner}    {cm} = {comb}({cm}, tl.load({ws} + {base} + j0 + {ln}, "
                  f"mask=j0 + {ln} < {count}, other={ident}, {_LD_L2}))",
                  f"{inner}tl.store({out} + {group} * {u('osl')}, ({total}).to({out}.dtype.element_ty))"]
        return lines

    def _reduce(self, o, env, sub, indent, first: bool, last: bool) -> list[str]:
        """This sub-tile's part of a reduction output; partials go to the workspace."""
        n = o.node
        row = OPS[n.op]
        u = self.names.user(o.name)
        acc_name, acc_s = u("racc"), u("raccs")
        ws, ws2, pm, ps, pacc, pacc_s = u("ws"), u("ws2"), u("pm"), u("ps"), u("pacc"), u("paccs")
        v = self._arg(n.inputs[0], env, True)
        if n.inputs[0].space is not Space.FULL:
            v = f"({v} + {sub.zeros()})"
        ident = _lit(row.reduce_identity)
        # only the edge the reduction runs across is masked before it: a per-row result's
        # rows past M (a per-column one's columns past N) are dropped where the partials
        # are stored or folded, so their values never count (one instruction less per
        # element than the tile's mask); where the tiles cover M and N exactly
        # (``EVEN_MN``, a constexpr) the mask is constant and folds away (two instructions
        # per element of an epilogue that issues ~26)
        if o.kind is OutputKind.ROW:
            keep = f"({sub.rn}[None, :] < N)"
        elif o.kind is OutputKind.COL:
            keep = f"({sub.rm}[:, None] < M)"
        else:
            keep = sub.mask
        rv = u("rv", sub.piece)
        lines = [f"{indent}{rv} = tl.where(({keep}) | EVEN_MN, {v}, {ident})"]
        lse = n.op == "logsumexp"
        comb = row.combiner(self.spec.cuda)

        def part(axis: int, x: str) -> str:
            if n.op == "sum":
                # + 0.0: a partial of -0.0 terms is 0.0, as torch's sums (which start from
                # 0.0) give; a GPU's tree of -0.0 + -0.0 would keep -0.0
                return f"(tl.sum({x}, axis={axis}) + 0.0)"
            return f"tl.reduce({x}, {axis}, {comb})"

        def combine(a: str, b: str) -> str:
            return f"{comb}({a}, {b})"

        ws_row = f"(bid64 * num_pid_n + {sub.pid_n}) * M + {sub.rm}"
        ws_col = f"(bid64 * num_pid_m + {sub.pid_m}) * N + {sub.rn}"
        ws_one = f"(bid64 * num_pid_m + {sub.pid_m}) * num_pid_n + {sub.pid_n}"
        if o.kind is OutputKind.COL:  # each sub-tile holds its own columns: store now
            if lse:
                lines.append(f"{indent}{pm}, {ps} = {self._lse_part}({rv}, 0)")
                lines.append(f"{indent}tl.store({ws} + {ws_col}, {pm}, mask={sub.rn} < N)")
                lines.append(f"{indent}tl.store({ws2} + {ws_col}, {ps}, mask={sub.rn} < N)")
            elif atomic_folded(o):
                b = "bid64 * N + " if o.batched else ""
                lines.append(f"{indent}_ef_fold({ws} + {b}{sub.rn}, {part(0, rv)}, "
                             f"{sub.rn} < N, {n.op == 'max'})")
            else:
                lines.append(f"{indent}tl.store({ws} + {ws_col}, {part(0, rv)}, "
                             f"mask={sub.rn} < N)")
            return lines
        if self.program_reduced(o):
            if lse:
                lines.append(f"{indent}{pm}, {ps} = {self._lse_part}({rv}, 1)")
                lines.append(f"{indent}{pacc}, {pacc_s} = _ef_lse_combine({pacc}, "
                             f"{pacc_s}, {pm}, {ps})")
            else:
                lines.append(f"{indent}{pacc} = {combine(pacc, part(1, rv))}")
            return lines
        # per-row and whole-output partials combine across the tile's sub-tiles first
        if lse:
            lines.append(f"{indent}{pm}, {ps} = {self._lse_part}({rv}, 1)")
            if o.kind is OutputKind.SCALAR:
                lines.append(f"{indent}{pm}, {ps} = _ef_lse_reduce({pm}, {ps})")
            if first:
                lines.append(f"{indent}{acc_name}, {acc_s} = {pm}, {ps}")
            else:
                lines.append(f"{indent}{acc_name}, {acc_s} = _ef_lse_combine({acc_name}, "
                             f"{acc_s}, {pm}, {ps})")
        else:
            p = part(1, rv)
            if o.kind is OutputKind.SCALAR:
                p = part(0, p)
            lines.append(f"{indent}{acc_name} = {p if first else combine(acc_name, p)}")
        if last:
            if atomic_folded(o):
                b = "bid64 * M + " if o.batched else ""
                lines.append(f"{indent}_ef_fold({ws} + {b}{sub.rm}, {acc_name}, "
                             f"{sub.rm} < M, {n.op == 'max'})")
            elif o.kind is OutputKind.ROW:
                lines.append(f"{indent}tl.store({ws} + {ws_row}, {acc_name}, mask={sub.rm} < M)")
                if lse:
                    lines.append(f"{indent}tl.store({ws2} + {ws_row}, {acc_s}, "
                                 f"mask={sub.rm} < M)")
            else:
                lines.append(f"{indent}tl.store({ws} + {ws_one}, {acc_name})")
                if lse:
                    lines.append(f"{indent}tl.store({ws2} + {ws_one}, {acc_s})")
        return lines

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
