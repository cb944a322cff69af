"""The reductions' part of the epilogue: per-tile partials, their combination and folds.

Layer: backends/triton, under ``epilogue_emit`` (whose ``EpilogueEmitter`` holds one
``ReductionEmitter`` as ``reductions`` and hands it each sub-tile's values). For every
reduction output of the DAG it writes the Triton statements that reduce a sub-tile
(``partial``), carry a whole-output reduction across a persistent program's tiles
(``program_accumulators``, ``program_finish``), combine a group's partials in the last
program to arrive (tickets, ``combine``) and copy atomically folded workspaces into their
outputs (``fold_finish``). Every identifier comes from the kernel's namer (``spec.names``).
"""

from __future__ import annotations

from ...ir import OutputKind
from ...optable import EXP_PARTIALS, OPS, _lit, finish_exp_partials
from .emit_common import all_of
from .grouped_reduce import GroupedReductions
from .spec import (_COMBINE_LOADS, _FOLD_FINISH, _LD_L2, FOLD_IDENTITY_BITS,
                   FOLD_IDENTITY_BITS64, TMA_FAMILIES,
                   KernelSpec, atomic_folded, combined_in_kernel, reduce_outputs, written_roles)


class ReductionEmitter:
    """Emits the reduction outputs' partials, combines and folds for one DAG."""

    def __init__(self, spec: KernelSpec):
        self.spec = spec
        self.dag = spec.dag
        self.names = spec.names
        # a grouped kernel over M combines every reduction itself (``grouped_reduce``)
        self.grouped = GroupedReductions(self) if spec.grouped else None

    @property
    def _lse_part(self) -> str:
        """logsumexp's (``EXP_PARTIALS``') per-tile (max, sum of exp) helper: on a GPU its exp is MUFU.EX2
        without subnormal handling (the terms are exp(x - max) <= 1; one below 2^-126 adds
        nothing to a sum >= 1)."""
        return "_ef_lse_part_cuda" if self.spec.cuda_spellings else "_ef_lse_part"

    def program_reduced(self, o) -> bool:
        """A whole-output reduction kept in registers across all tiles of a persistent
        program (one partial per program, per consumer warpgroup in the gluon family,
        not per tile): the cross-warp step and the ticket run once, after the last tile."""
        return self.spec.family in TMA_FAMILIES and o.kind is OutputKind.SCALAR and not o.batched

    # ---- a persistent program's whole-output partials

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
                if o.node.op in EXP_PARTIALS:
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
            lines += self._program_store(o, slot, indent)
            if combined_in_kernel(o, self.spec.family):
                lines += self._combine_scalar(o, lane, "0", "0", count, barrier, indent)
        return lines

    def _program_store(self, o, slot: str, indent: str) -> list[str]:
        """The store of a program's partial of ``o`` into workspace entry ``slot``."""
        u = self.names.user(o.name)
        ws, pacc = u("ws"), u("pacc")
        if o.node.op in EXP_PARTIALS:
            return [f"{indent}{u('pm')}, {u('ps')} = _ef_lse_reduce({pacc}, {u('paccs')})",
                    f"{indent}tl.store({ws} + {slot}, {u('pm')})",
                    f"{indent}tl.store({u('ws2')} + {slot}, {u('ps')})"]
        if o.node.op == "sum":
            return [f"{indent}tl.store({ws} + {slot}, tl.sum({pacc}, axis=0))"]
        comb = OPS[o.node.op].combiner(self.spec.cuda_spellings)
        return [f"{indent}tl.store({ws} + {slot}, tl.reduce({pacc}, 0, {comb}))"]

    # ---- atomically folded outputs

    def fold_finish(self, count: str, indent: str, lane: str = f"tl.arange(0, {_FOLD_FINISH})",
                    barrier: str = "tl.debug_barrier()") -> list[str]:
        """After a program's last tile (``atomic_folded`` outputs): a ticket per program;
        the last of ``count`` copies each workspace into its output (``lane``: an index
        vector of ``_FOLD_FINISH`` elements) and resets it to the identity."""
        lines: list[str] = []
        if self.grouped:  # no folds: each reduction is combined per set (``grouped_reduce``)
            return lines
        for o in reduce_outputs(self.dag):
            if not atomic_folded(o):
                continue
            lines += self._ticket(o, "0", count, barrier, indent)  # one counter per output
            lines += self._fold_copy(o, lane, barrier, indent + "    ")
        return lines

    def _fold_copy(self, o, lane: str, barrier: str, inner: str) -> list[str]:
        """The loop copying ``o``'s folded workspace into its output and resetting it."""
        u = self.names.user(o.name)
        ext = "M" if o.kind is OutputKind.ROW else "N"
        total = f"L * {ext}" if o.batched else ext
        body = inner + "    "
        fo, fm, fb, ws, out = u("fo"), u("fm"), u("fb"), u("ws"), u("out")
        return [
            f"{inner}for f0 in range(0, {total}, {_FOLD_FINISH}):",
            f"{body}{fo} = f0 + {lane}",
            f"{body}{fm} = {fo} < {total}",
            f"{body}{fb} = tl.load({ws} + {fo}, mask={fm}, {_LD_L2})",
            f"{body}tl.store({out} + ({fo} // {ext}) * {u('osl')} + ({fo} % {ext}) * {u('os')}, "
            f"{fb}.to({self.spec.compute}, bitcast=True).to({out}.dtype.element_ty), mask={fm})",
            # Triton may give the reset another layout than the load (it did for 16-bit
            # outputs on sm_90: a thread reset elements before the thread that loads
            # them had read them), so every thread's loads come before any reset
            f"{body}{barrier}",
            f"{body}tl.store({ws} + {fo}, {self._identity_bits(o)}, mask={fm})",
        ]

    def _identity_bits(self, o) -> int:
        """The bits of ``o``'s identity a fold workspace rests at (int32, or int64 in a
        float64 kernel)."""
        return (FOLD_IDENTITY_BITS64 if self.spec.f64 else FOLD_IDENTITY_BITS)[o.node.op]

    @property
    def _fold(self) -> str:
        """The atomic fold helper: of float32 bits, or float64 bits in a float64 kernel."""
        return "_ef_fold64" if self.spec.f64 else "_ef_fold"

    def fold_params(self) -> list[tuple[str, str]]:
        """The kernel parameters ``fold_finish`` reads, with their roles (see
        ``epilogue_params``)."""
        return [(self.names(o.name, r), r) for o in reduce_outputs(self.dag) if atomic_folded(o)
                for r in written_roles(o)]

    def fold_names(self) -> list[str]:
        """The names of ``fold_params``."""
        return [p for p, _ in self.fold_params()]

    # ---- combining the partials of a group in its last program

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

    def combine(self, o, sub, indent: str) -> list[str]:
        """Lines run after a tile's partials are stored: the last tile of the group
        combines the group's partials (ascending order) into the output."""
        if self.grouped:
            return self.grouped.combine(o, sub, indent)
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
        lines = self._ticket(o, f"{b}{other} + {group}", count, sub.barrier(), indent)
        for i in idx:
            lines += self._combine_vector(o, i, base, extent, count, b, indent + "    ")
        return lines

    def _combine_vector(self, o, i: str, base: str, extent: str, count: str, b: str,
                        inner: str) -> list[str]:
        """The combine of a per-row/per-column output's partials at indices ``i``."""
        u = self.names.user(o.name)
        ws, cm, out = u("ws"), u("cm"), u("out")
        comb = OPS[o.node.op].combiner(self.spec.cuda_spellings)
        # a partial past the end reads as the value that changes nothing (-0.0 for sums:
        # x + -0.0 is x for every x, signed zeros included)
        ident = "-0.0" if o.node.op == "sum" else _lit(OPS[o.node.op].reduce_identity)
        body = inner + "    "
        mask = f"{i} < {extent}"
        # _COMBINE_LOADS loads in flight per step, combined in ascending order (one L2
        # round trip per partial made a 64-tile row's combine cost ~25 us on an H100)
        # a workspace of 2^31 partials or more (``KernelSpec.int64``): the step in 64 bits
        j = "tl.cast(j0, tl.int64)" if self.spec.int64 else "j0"
        loads = [f"{body}{u('p', k)} = tl.load({ws} + {base} + ({j} + {k}) * {extent} + {i}, "
                 f"mask={all_of(mask, f'j0 + {k} < {count}')}, other={ident}, {_LD_L2})"
                 for k in range(_COMBINE_LOADS)]
        return [f"{inner}{cm} = tl.load({ws} + {base} + {i}, mask={mask}, {_LD_L2})",
                f"{inner}for j0 in range(1, {count}, {_COMBINE_LOADS}):",
                *loads,
                *[f"{body}{cm} = {comb}({cm}, {u('p', k)})" for k in range(_COMBINE_LOADS)],
                f"{inner}tl.store({out} + {b}{u('osl')} + {i} * {u('os')}, "
                f"{cm}.to({out}.dtype.element_ty), mask={mask})"]

    def _combine_scalar(self, o, lane: str, group: str, base: str, count: str, barrier: str,
                        indent: str) -> list[str]:
        """The whole-output case: ``count`` partials at ``base``, read ``lane``-wide."""
        u = self.names.user(o.name)
        ws, cm, ln, out = u("ws"), u("cm"), u("ln"), u("out")
        row = OPS[o.node.op]
        ident = _lit(row.reduce_identity)
        inner = indent + "    "
        comb = row.combiner(self.spec.cuda_spellings)
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

    # ---- a reduction feeding computation, whole in the tile (one pass)

    def inline(self, n, k: int, v: str, sub, indent: str) -> tuple[list[str], str]:
        """Per-row reduction node ``n`` (number ``k``) of the tile-shaped values ``v``,
        whole in the tile: the tile spans the row (``KernelFamily.one_pass``), so its value
        is ready for the computation it feeds. Its lines and its (BLOCK_M, 1) value."""
        row = OPS[n.op]
        name = self.names.value(k, sub.piece)
        rv = f"tl.where({sub.rn}[None, :] < N, {v}, {_lit(row.reduce_identity)})"
        if n.op in EXP_PARTIALS:
            pm, ps = self.names.row_part(k, "m"), self.names.row_part(k, "s")
            # as combine.combine_partials finishes one
            return [f"{indent}{pm}, {ps} = {self._lse_part}({rv}, 1)",
                    f"{indent}{name} = ({finish_exp_partials(n.op, pm, ps)})[:, None]"], name
        if n.op == "sum":
            red = f"(tl.sum({rv}, axis=1) + 0.0)"  # + 0.0: as ``_part``
        else:
            red = f"tl.reduce({rv}, 1, {row.combiner(self.spec.cuda_spellings)})"
        return [f"{indent}{name} = {red}[:, None]"], name

    # ---- a sub-tile's part of a reduction

    def partial(self, o, v: str, sub, indent: str, first: bool, last: bool) -> list[str]:
        """This sub-tile's part of reduction output ``o`` of the values ``v`` (tile-shaped);
        partials go to the workspace."""
        lines, rv = self._masked(o, v, sub, indent)
        if self.grouped:
            return lines + self.grouped.partial(o, rv, sub, indent, first, last)
        if o.kind is OutputKind.COL:  # each sub-tile holds its own columns: store now
            return lines + self._column_partial(o, rv, sub, indent)
        if self.program_reduced(o):
            return lines + self._program_partial(o, rv, indent)
        # per-row and whole-output partials combine across the tile's sub-tiles first
        lines += self._tile_partial(o, rv, indent, first)
        if last:
            lines += self._tile_store(o, sub, indent)
        return lines

    def _masked(self, o, v: str, sub, indent: str) -> tuple[list[str], str]:
        """The line giving the sub-tile's values entering the reduction (role "rv"), and
        that name."""
        u = self.names.user(o.name)
        ident = _lit(OPS[o.node.op].reduce_identity)
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
        return [f"{indent}{rv} = tl.where(({keep}) | EVEN_MN, {v}, {ident})"], rv

    def _part(self, o, axis: int, x: str) -> str:
        """``x`` reduced along ``axis`` by ``o``'s reduction."""
        if o.node.op == "sum":
            # + 0.0: a partial of -0.0 terms is 0.0, as torch's sums (which start from
            # 0.0) give; a GPU's tree of -0.0 + -0.0 would keep -0.0
            return f"(tl.sum({x}, axis={axis}) + 0.0)"
        return f"tl.reduce({x}, {axis}, {OPS[o.node.op].combiner(self.spec.cuda_spellings)})"

    def _combined(self, o, a: str, b: str) -> str:
        """Two partials ``a`` and ``b`` of ``o`` combined."""
        return f"{OPS[o.node.op].combiner(self.spec.cuda_spellings)}({a}, {b})"

    def _column_partial(self, o, rv: str, sub, indent: str) -> list[str]:
        """A per-column output's partial of the sub-tile's columns, stored (or folded) now."""
        u = self.names.user(o.name)
        ws = u("ws")
        ws_col = f"(bid64 * num_pid_m + {sub.pid_m}) * N + {sub.rn}"
        if o.node.op in EXP_PARTIALS:
            pm, ps = u("pm"), u("ps")
            return [f"{indent}{pm}, {ps} = {self._lse_part}({rv}, 0)",
                    f"{indent}tl.store({ws} + {ws_col}, {pm}, mask={sub.rn} < N)",
                    f"{indent}tl.store({u('ws2')} + {ws_col}, {ps}, mask={sub.rn} < N)"]
        if atomic_folded(o):
            b = "bid64 * N + " if o.batched else ""
            return [f"{indent}{self._fold}({ws} + {b}{sub.rn}, {self._part(o, 0, rv)}, "
                    f"{sub.rn} < N, {o.node.op == 'max'})"]
        return [f"{indent}tl.store({ws} + {ws_col}, {self._part(o, 0, rv)}, "
                f"mask={sub.rn} < N)"]

    def _program_partial(self, o, rv: str, indent: str) -> list[str]:
        """The sub-tile's row partials added to the program's accumulator (``program_reduced``)."""
        u = self.names.user(o.name)
        pacc = u("pacc")
        if o.node.op in EXP_PARTIALS:
            pm, ps = u("pm"), u("ps")
            return [f"{indent}{pm}, {ps} = {self._lse_part}({rv}, 1)",
                    f"{indent}{pacc}, {u('paccs')} = _ef_lse_combine({pacc}, "
                    f"{u('paccs')}, {pm}, {ps})"]
        return [f"{indent}{pacc} = {self._combined(o, pacc, self._part(o, 1, rv))}"]

    def _tile_partial(self, o, rv: str, indent: str, first: bool) -> list[str]:
        """A per-row or whole-output partial of the sub-tile, combined into the tile's
        running partial (role "racc"; ``first``: the tile's first sub-tile starts it)."""
        u = self.names.user(o.name)
        acc_name, acc_s = u("racc"), u("raccs")
        if o.node.op not in EXP_PARTIALS:
            p = self._part(o, 1, rv)
            if o.kind is OutputKind.SCALAR:
                p = self._part(o, 0, p)
            return [f"{indent}{acc_name} = {p if first else self._combined(o, acc_name, p)}"]
        pm, ps = u("pm"), u("ps")
        lines = [f"{indent}{pm}, {ps} = {self._lse_part}({rv}, 1)"]
        if o.kind is OutputKind.SCALAR:
            lines.append(f"{indent}{pm}, {ps} = _ef_lse_reduce({pm}, {ps})")
        if first:
            lines.append(f"{indent}{acc_name}, {acc_s} = {pm}, {ps}")
        else:
            lines.append(f"{indent}{acc_name}, {acc_s} = _ef_lse_combine({acc_name}, "
                         f"{acc_s}, {pm}, {ps})")
        return lines

    def _tile_store(self, o, sub, indent: str) -> list[str]:
        """After the tile's last sub-tile: its running partial folded or stored."""
        u = self.names.user(o.name)
        acc_name, acc_s, ws, ws2 = u("racc"), u("raccs"), u("ws"), u("ws2")
        lse = o.node.op in EXP_PARTIALS
        if atomic_folded(o):
            b = "bid64 * M + " if o.batched else ""
            return [f"{indent}{self._fold}({ws} + {b}{sub.rm}, {acc_name}, "
                    f"{sub.rm} < M, {o.node.op == 'max'})"]
        if o.kind is OutputKind.ROW:
            ws_row = f"(bid64 * num_pid_n + {sub.pid_n}) * M + {sub.rm}"
            lines = [f"{indent}tl.store({ws} + {ws_row}, {acc_name}, mask={sub.rm} < M)"]
            if lse:
                lines.append(f"{indent}tl.store({ws2} + {ws_row}, {acc_s}, "
                             f"mask={sub.rm} < M)")
            return lines
        ws_one = f"(bid64 * num_pid_m + {sub.pid_m}) * num_pid_n + {sub.pid_n}"
        lines = [f"{indent}tl.store({ws} + {ws_one}, {acc_name})"]
        if lse:
            lines.append(f"{indent}tl.store({ws2} + {ws_one}, {acc_s})")
        return lines
