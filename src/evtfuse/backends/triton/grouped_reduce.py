"""Reductions in a grouped GEMM over M (``KernelSpec.grouped``): partials, tickets, combines.

Layer: backends/triton, under ``reduce_emit`` (whose ``ReductionEmitter`` hands a grouped
kernel's reductions to ``GroupedReductions``). A grouped program finds its group in
``offs`` on the device (``codegen._group_lines``): ``bid`` is its group, ``grp_tile0``
the first row tile of that group among every group's tiles, ``pid_m`` its tile within the
group, ``grp_tiles`` the tiles of all groups (what actually runs: programs past it return
at once), ``M`` the group's end row and ``grp_rows`` (T) every group's rows. Invariant:
each reduction is combined in the kernel by the last program of a set whose size the
programs know on the device, so no program that returns early is ever waited for and the
host never reads ``offs``:

* per row ``(T, 1)`` (sum, max, min, logsumexp, shifted_sumexp): a row belongs to one row tile of one
  group; each of the tile's ``num_pid_n`` programs stores its partial at
  ``[pid_n, row]`` of a ``(tiles along N, T)`` workspace and takes a ticket of the tile
  (``grp_tile0 + pid_m``, at most ``cdiv(T, BLOCK_M) + G`` of them); the last of the
  ``num_pid_n`` combines them in ascending ``pid_n`` and stores the tile's rows of its
  group. Rows at or past ``offs[-1]`` are not written.
* per group per column ``(G, 1, N)`` and per group ``(G, 1, 1)``: a tile stores its
  column (scalar) partial at its row tile's slot; the last of the group's tiles (its
  count from ``offs``) for a column tile (for the group) combines the group's partials,
  in ascending row tile (then column tile) order. Without the group dimension, ``(N,)``
  and ``(1,)``, the same over every group's tiles (``grp_tiles``): rows of no group
  count in none.
* a group with no rows has no tile: program 0 writes the reduction's identity there
  (sum 0, max -inf, min +inf, logsumexp -inf), as for a problem with M = 0
  (docs/operands.md), and the whole ``(N,)`` / ``(1,)`` output when no group has rows.

Deterministic (a fixed order of combination; no float atomics), and no launch follows
the kernel. Every identifier comes from the kernel's namer (``spec.names``) or is fixed
text of the grouped kernel (``grp_*``).
"""

from __future__ import annotations

from ...ir import OutputKind
from ...optable import EXP_PARTIALS, OPS, _lit, empty_result, finish_exp_partials
from .spec import _LD_L2, reduce_outputs

FILL_GROUPS = 128  # groups program 0 looks at per step when writing empty groups' identity


def needs_fill(o) -> bool:
    """Whether an empty group (or no row in any group) leaves ``o`` to program 0."""
    return o.kind in (OutputKind.COL, OutputKind.SCALAR)


def _i64(x: str) -> str:
    return f"tl.cast({x}, tl.int64)"


class GroupedReductions:
    """Emits a grouped kernel's reductions (``ReductionEmitter`` delegates to it)."""

    def __init__(self, emitter):
        self.r = emitter  # the ReductionEmitter: its namer, masks and partial helpers
        self.names = emitter.names
        self.spec = emitter.spec

    # ---- the tile's partial

    def partial(self, o, rv: str, sub, indent: str, first: bool, last: bool) -> list[str]:
        """The stores of the tile's partial of ``o`` (``rv``: its masked values)."""
        u = self.names.user(o.name)
        ws, ws2 = u("ws"), u("ws2")
        lse = o.node.op in EXP_PARTIALS
        gpm = _i64(f"(grp_tile0 + {sub.pid_m})")  # the tile's row tile among all groups'
        if o.kind is OutputKind.COL:
            at = f"{gpm} * N + {sub.rn}"
            if lse:
                pm, ps = u("pm"), u("ps")
                return [f"{indent}{pm}, {ps} = {self.r._lse_part}({rv}, 0)",
                        f"{indent}tl.store({ws} + {at}, {pm}, mask={sub.rn} < N)",
                        f"{indent}tl.store({ws2} + {at}, {ps}, mask={sub.rn} < N)"]
            return [f"{indent}tl.store({ws} + {at}, {self.r._part(o, 0, rv)}, mask={sub.rn} < N)"]
        lines = self.r._tile_partial(o, rv, indent, first)
        if not last:
            return lines
        acc, accs = u("racc"), u("raccs")
        if o.kind is OutputKind.ROW:
            at, mask = f"{_i64(sub.pid_n)} * grp_rows + {sub.rm}", f", mask={sub.rm} < M"
        else:
            at, mask = f"{gpm} * num_pid_n + {sub.pid_n}", ""
        lines.append(f"{indent}tl.store({ws} + {at}, {acc}{mask})")
        if lse:
            lines.append(f"{indent}tl.store({ws2} + {at}, {accs}{mask})")
        return lines

    # ---- the last program of a set combines

    def combine(self, o, sub, indent: str) -> list[str]:
        """After the tile's partials are stored: a ticket, and the last program of the
        set (see the module's docstring) combines and stores."""
        inner = indent + "    "
        if o.kind is OutputKind.ROW:
            lines = self.r._ticket(o, f"grp_tile0 + {sub.pid_m}", "num_pid_n", sub.barrier(),
                                   indent)
            return lines + self._combine_rows(o, sub.rm, inner)
        if o.batched:
            group, count, first = "bid", "grp_cnt", "grp_tile0"
        else:
            group, count, first = "0", "grp_tiles", "0"
        if o.kind is OutputKind.COL:
            ticket = f"{group} * num_pid_n + {sub.pid_n}" if o.batched else sub.pid_n
            lines = self.r._ticket(o, ticket, count, sub.barrier(), indent)
            return lines + self._combine_columns(o, sub.rn, first, count, inner)
        lines = self.r._ticket(o, group, f"{count} * num_pid_n", sub.barrier(), indent)
        return lines + self._combine_scalar(o, sub.lane(), f"{first} * num_pid_n",
                                            f"{count} * num_pid_n", group, inner)

    def _steps(self, o, count: str, load, inner: str, first: int = 1) -> list[str]:
        """``cm`` (``cms``: logsumexp's sum) combined with partials ``first`` to ``count``
        - 1 in ascending order; ``load(j, ws)`` spells partial j of workspace ``ws``."""
        u = self.names.user(o.name)
        cm, cms = u("cm"), u("cms")
        body = inner + "    "
        if o.node.op in EXP_PARTIALS:
            pm, ps = u("p", 0), u("p", 1)
            return [f"{inner}for j0 in range({first}, {count}):",
                    f"{body}{pm} = {load('j0', u('ws'))}",
                    f"{body}{ps} = {load('j0', u('ws2'))}",
                    f"{body}{cm}, {cms} = _ef_lse_combine({cm}, {cms}, {pm}, {ps})"]
        comb = OPS[o.node.op].combiner(self.spec.cuda_spellings)
        return [f"{inner}for j0 in range({first}, {count}):",
                f"{body}{cm} = {comb}({cm}, {load('j0', u('ws'))})"]

    def _result(self, o) -> str:
        u = self.names.user(o.name)
        cm, cms = u("cm"), u("cms")
        if o.node.op in EXP_PARTIALS:
            return f"({finish_exp_partials(o.node.op, cm, cms)})"
        return cm

    def _start(self, o, load, inner: str) -> list[str]:
        u = self.names.user(o.name)
        lines = [f"{inner}{u('cm')} = {load('0', u('ws'))}"]
        if o.node.op in EXP_PARTIALS:
            lines.append(f"{inner}{u('cms')} = {load('0', u('ws2'))}")
        return lines

    def _combine_rows(self, o, rm: str, inner: str) -> list[str]:
        """The tile's rows: partials ``[j, row]``, j over the tiles along N."""
        u = self.names.user(o.name)
        mask = f"{rm} < M"

        def load(j, ws):  # a lane past M never stored: logsumexp's sums 1 there, not log(0)
            other = "1.0" if ws == u("ws2") else "0.0"
            return (f"tl.load({ws} + {_i64(j)} * grp_rows + {rm}, mask={mask}, other={other}, "
                    f"{_LD_L2})")

        out = u("out")
        return (self._start(o, load, inner) + self._steps(o, "num_pid_n", load, inner)
                + [f"{inner}tl.store({out} + {rm} * {u('os')}, "
                   f"{self._result(o)}.to({out}.dtype.element_ty), mask={mask})"])

    def _combine_columns(self, o, rn: str, first: str, count: str, inner: str) -> list[str]:
        """Columns ``rn`` of a group (of every group): partials ``[row tile, column]``."""
        u = self.names.user(o.name)
        mask = f"{rn} < N"

        def load(j, ws):  # as _combine_rows' (a lane past N)
            other = "1.0" if ws == u("ws2") else "0.0"
            return (f"tl.load({ws} + {_i64(f'{first} + {j}')} * N + {rn}, mask={mask}, "
                    f"other={other}, {_LD_L2})")

        out = u("out")
        b = f"{_i64('bid')} * {u('osl')} + " if o.batched else ""
        return (self._start(o, load, inner) + self._steps(o, count, load, inner)
                + [f"{inner}tl.store({out} + {b}{rn} * {u('os')}, "
                   f"{self._result(o)}.to({out}.dtype.element_ty), mask={mask})"])

    def _combine_scalar(self, o, lane: str, base: str, count: str, group: str,
                        inner: str) -> list[str]:
        """``count`` contiguous partials from ``base``, read ``lane``-wide, then folded."""
        u = self.names.user(o.name)
        ln, cm, cms, out = u("ln"), u("cm"), u("cms"), u("out")
        ident = _lit(OPS[o.node.op].reduce_identity)
        lse = o.node.op in EXP_PARTIALS
        body = inner + "    "

        def load(ws, at, other):
            return (f"tl.load({ws} + {_i64(base)} + {at}, mask={at} < {count}, other={other}, "
                    f"{_LD_L2})")

        lines = [f"{inner}{ln} = {lane}",
                 f"{inner}{cm} = {load(u('ws'), ln, ident)}"]
        if lse:
            lines.append(f"{inner}{cms} = {load(u('ws2'), ln, '0.0')}")
        lines.append(f"{inner}for j0 in range({ln}.shape[0], {count}, {ln}.shape[0]):")
        if lse:
            pm, ps = u("p", 0), u("p", 1)
            lines += [f"{body}{pm} = {load(u('ws'), f'j0 + {ln}', ident)}",
                      f"{body}{ps} = {load(u('ws2'), f'j0 + {ln}', '0.0')}",
                      f"{body}{cm}, {cms} = _ef_lse_combine({cm}, {cms}, {pm}, {ps})"]
            lines.append(f"{inner}{cm}, {cms} = _ef_lse_reduce({cm}, {cms})")
        else:
            comb = OPS[o.node.op].combiner(self.spec.cuda_spellings)
            lines.append(f"{body}{cm} = {comb}({cm}, {load(u('ws'), f'j0 + {ln}', ident)})")
            total = f"tl.sum({cm}, axis=0)" if o.node.op == "sum" else f"tl.reduce({cm}, 0, {comb})"
            lines.append(f"{inner}{cm} = {total}")
        lines.append(f"{inner}tl.store({out} + {_i64(group)} * {u('osl')}, "
                     f"{self._result(o)}.to({out}.dtype.element_ty))")
        return lines

    # ---- groups without rows: program 0 writes the identity

    def fill_lines(self, i1: str) -> list[str]:
        """Lines after the scan over ``offs`` (every program knows ``grp_tiles``): program
        0 writes the identity of each per-group reduction into the groups with no tile,
        and of each reduction over every group when no group has a tile."""
        outs = [o for o in reduce_outputs(self.spec.dag) if needs_fill(o)]
        if not outs:
            return []
        i2, i3, i4 = i1 + "    ", i1 + "        ", i1 + "            "
        lines = [f"{i1}if pid == 0:"]
        batched = [o for o in outs if o.batched]
        if batched:
            lines += [f"{i2}for grp_f in range(0, L, {FILL_GROUPS}):",
                      f"{i3}grp_fg = grp_f + tl.arange(0, {FILL_GROUPS})",
                      f"{i3}grp_fe = tl.load(offs + grp_fg, mask=grp_fg < L, other=0)",
                      f"{i3}grp_fb = tl.load(offs + grp_fg - 1, mask=(grp_fg > 0) & (grp_fg < L), "
                      "other=0)",
                      f"{i3}grp_fz = (grp_fg < L) & (grp_fe - grp_fb <= 0)",
                      f"{i3}grp_f64 = grp_fg.to(tl.int64)"]
            for o in batched:
                u = self.names.user(o.name)
                out, ident = u("out"), _lit(empty_result(o.node.op))
                if o.kind is OutputKind.SCALAR:
                    lines.append(f"{i3}tl.store({out} + grp_f64 * {u('osl')}, "
                                 f"tl.full(({FILL_GROUPS},), {ident}, tl.float32)"
                                 f".to({out}.dtype.element_ty), mask=grp_fz)")
                    continue
                lines += [f"{i3}for grp_n0 in range(0, N, BLOCK_N):",
                          f"{i4}grp_fn = grp_n0 + tl.arange(0, BLOCK_N)",
                          f"{i4}tl.store({out} + grp_f64[:, None] * {u('osl')} + "
                          f"grp_fn[None, :] * {u('os')}, "
                          f"tl.full(({FILL_GROUPS}, BLOCK_N), {ident}, tl.float32)"
                          f".to({out}.dtype.element_ty), "
                          "mask=grp_fz[:, None] & (grp_fn[None, :] < N))"]
        shared = [o for o in outs if not o.batched]
        if shared:
            lines.append(f"{i2}if grp_tiles == 0:")
            for o in shared:
                u = self.names.user(o.name)
                out, ident = u("out"), _lit(empty_result(o.node.op))
                if o.kind is OutputKind.SCALAR:
                    lines.append(f"{i3}tl.store({out} + tl.arange(0, 1), tl.full((1,), {ident}, "
                                 f"tl.float32).to({out}.dtype.element_ty))")
                    continue
                lines += [f"{i3}for grp_n0 in range(0, N, BLOCK_N):",
                          f"{i4}grp_fn = grp_n0 + tl.arange(0, BLOCK_N)",
                          f"{i4}tl.store({out} + grp_fn * {u('os')}, "
                          f"tl.full((BLOCK_N,), {ident}, tl.float32).to({out}.dtype.element_ty), "
                          "mask=grp_fn < N)"]
        return lines

    def group_count_lines(self, i1: str) -> list[str]:
        """``grp_cnt``: the row tiles of the program's group (``offs`` as the scan reads
        it), where a per-group reduction waits for them."""
        if not any(o.batched and needs_fill(o) for o in reduce_outputs(self.spec.dag)):
            return []
        return [f"{i1}grp_cnt = tl.cdiv(tl.maximum(tl.load(offs + bid) - "
                "tl.load(offs + bid - 1, mask=bid > 0, other=0), 0), BLOCK_M)"]
