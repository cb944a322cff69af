"""Triton source emitter: one fused GEMM + epilogue kernel from a ``KernelSpec``.

Layer: backends/triton. Reads the optimised ``ir.Dag`` and the op table; never the user's
source. The generated module holds the ``_ef_`` helpers it calls and one ``@triton.jit``
kernel named ``evtfuse_kernel``. Values that may change between runs (runtime scalars,
pointers, strides, sizes) are kernel arguments; tile sizes are ``tl.constexpr``; literals
of the epilogue are baked in. Two families share the epilogue emitter
(``epilogue_emit.EpilogueEmitter``, with the gluon family's kernels) and differ in the
mainloop and in how full tiles move, which their tile objects (``triton_tiles``) tell the
emitter:

* ``hopper``: persistent grid over tiles (grouped order), tensor descriptors (TMA) for
  A, B and every full aux load/store, the epilogue applied per sub-tile of the
  accumulator (``EPI_SPLIT`` pieces along N) to keep register pressure low; grouped GEMMs
  over M run over every group's tiles (``group_emit``), their outputs stored through
  pointers masked to the group's rows, gated epilogues among them;
* ``portable``: one program per tile, pointer loads (any strides, any alignment): the
  mainloop reads rows/columns past the edge as wrapped ones and masks K only where it is
  not a multiple of BLOCK_K (``EVEN_K``), the epilogue masks its loads and stores; runs
  on any Triton GPU target and under the CPU interpreter.

``generate`` writes the module of any family: a gluon kernel comes from ``gluon_codegen``,
which imports nothing from here (what both emitters spell alike is in ``emit_common``).
"""

from __future__ import annotations

import torch

from ... import ir
from ...ir import Dag, NodeKind, OperandKind
from ...optable import FP8_DTYPES, OPS
from .emit_common import split_pieces, vector_load
from .epilogue_emit import EpilogueEmitter
from .group_emit import group_lines, group_of_helper, group_table_lines, k_group_lines
from .triton_tiles import (GroupedHopperTile, GroupedTile, HopperTile, PortableTile,
                           early_vector_name)
from .prelude import helpers_for
from .spec import (INT_OUTPUTS, TL_DTYPES, KernelSpec, epilogue_params, int64_lines,
                   launch_dependents_lines, reduce_outputs)


def _dot_extra(spec: KernelSpec) -> str:
    """``tl.dot`` keywords beyond precision and accumulator type: for fp8 inputs with
    promotion, the K elements summed in reduced precision before each fp32 add."""
    return "max_num_imprecise_acc=BLOCK_K, " if spec.fp8_promote else ""


def _acc_type(spec: KernelSpec) -> str:
    return "tl.int32" if spec.int_acc else "tl.float16" if spec.acc16 else spec.compute


def _param(p: str, role: str | None, spec: KernelSpec) -> str:
    """A kernel parameter as the signature declares it: a runtime scalar (role None) of a
    float64 kernel annotated float64 (Triton passes a Python float as fp32 otherwise)."""
    return f"{p}: tl.float64" if role is None and spec.f64 else p


def _portable_source(spec: KernelSpec) -> str:
    epi = EpilogueEmitter(spec)
    roles = epilogue_params(spec.names, spec.dag, "portable", grouped=spec.grouped)
    # grouped: the parameter is all groups' rows; ``M`` becomes the program's group's end row
    # (``group_emit.group_lines``), a local of its own (a parameter equal to 1 is a constexpr)
    rows = spec.rows_param()
    # groups over K: the parameter is all groups' K; ``K`` becomes the program's group's
    # (``group_emit.k_group_lines``)
    depth = "grp_k" if spec.k_grouped else "K"
    gated = spec.dag.gated
    rnb, nb = ("rnb", "(2 * N)") if gated else ("rn", "N")  # B's columns
    # each tile column's column of B, inside B (concatenated pairs: gathered, wrapped already)
    b_cols = "rnb" if spec.dag.concatenated else f"({rnb} % {nb})"
    params = ", ".join(["A", "B", rows, "N", depth, "L", "sa_l", "sa_m", "sa_k", "sb_l", "sb_k", "sb_n"]
                       + (["offs"] if spec.grouped or spec.k_grouped else [])
                       + [_param(p, role, spec) for p, role in roles])
    I1, I2 = "    ", "        "
    # K past the edge: zeros, which a uint8 input holds as 128 (zero once offset)
    pad = "128" if spec.u8_offset else "0.0"
    lines = [
        spec.jit_line(),
        f"def evtfuse_kernel({params},",
        "                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,",
        "                   GROUP_M: tl.constexpr, INPUT_PRECISION: tl.constexpr,",
        "                   EVEN_K: tl.constexpr, ONE_ROW: tl.constexpr, EVEN_MN: tl.constexpr):",
        *launch_dependents_lines(spec, I1),
        # rows of A and B are int64 already; their k-steps (rk * sa_k, BLOCK_K * sa_k) not
        *int64_lines(spec, roles, I1, fixed=("sa_k", "sb_k")),
        f"{I1}pid = tl.program_id(0)",
        *([] if spec.grouped else [f"{I1}bid = tl.program_id(1)", f"{I1}bid64 = bid.to(tl.int64)"]),
        # grouped: an upper bound of the row tiles (each group ends at most one partial tile)
        f"{I1}num_pid_m = tl.cdiv({rows}, BLOCK_M){' + L' if spec.grouped else ''}",
        # gated (``pairs(accum)``): a tile is BLOCK_N columns of B, BLOCK_N // 2 of the output
        f"{I1}num_pid_n = tl.cdiv({'2 * N' if gated else 'N'}, BLOCK_N)",
        # one row of tiles (M <= BLOCK_M): the program is its tile's column
        f"{I1}if ONE_ROW:",
        f"{I2}pid_m = pid * 0",
        f"{I2}pid_n = pid",
        f"{I1}else:",
        f"{I2}group = GROUP_M * num_pid_n",
        f"{I2}first_m = (pid // group) * GROUP_M",
        f"{I2}group_m = tl.minimum(num_pid_m - first_m, GROUP_M)",
        f"{I2}pid_m = first_m + ((pid % group) % group_m)",
        f"{I2}pid_n = (pid % group) // group_m",
        *(group_lines(I1, I2, epi.reductions.grouped) if spec.grouped else []),
        f"{I1}rm = {'grp_row0 + ' if spec.grouped else ''}pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
        *(_concatenated_columns(I1) if spec.dag.concatenated else
          [f"{I1}{rnb} = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)"]),
        f"{I1}rk = tl.arange(0, BLOCK_K)",
        # rows and columns past the edge load wrapped ones (row m % M) instead of masking:
        # the mainloop's loads stay unmasked wherever K is a multiple of BLOCK_K, and the
        # store mask drops those rows and columns
        f"{I1}a_ptrs = A + bid64 * sa_l + (rm % M)[:, None].to(tl.int64) * sa_m + rk[None, :] * sa_k",
        f"{I1}b_ptrs = B + bid64 * sb_l + rk[:, None] * sb_k + {b_cols}[None, :].to(tl.int64) * sb_n",
        *(k_group_lines(I1) if spec.k_grouped else []),
        f"{I1}acc = tl.zeros((BLOCK_M, BLOCK_N), dtype={_acc_type(spec)})",
        *(_u8_lines("init", I1) if spec.u8_offset else []),
        f"{I1}for k in range(0, tl.cdiv(K, BLOCK_K)):",
        f"{I2}if EVEN_K:",
        f"{I2}    a = tl.load(a_ptrs)",
        f"{I2}    b = tl.load(b_ptrs)",
        f"{I2}else:",
        f"{I2}    k_left = K - k * BLOCK_K",
        f"{I2}    a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other={pad})",
        f"{I2}    b = tl.load(b_ptrs, mask=rk[:, None] < k_left, other={pad})",
        *(_u8_lines("step", I2) if spec.u8_offset else []),
        f"{I2}acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION, {_dot_extra(spec)}"
        f"out_dtype={_acc_type(spec)})",
        f"{I2}a_ptrs += BLOCK_K * sa_k",
        f"{I2}b_ptrs += BLOCK_K * sb_k",
        *(_u8_lines("finish", I1) if spec.u8_offset else []),
        *(_gated_split_lines(I1) if gated else []),
        f"{I1}mask = (rm[:, None] < M) & (rn[None, :] < N)",
    ]
    lines += epi.prologue(I1)
    tile = GroupedTile() if spec.grouped else PortableTile()
    tile.ct = spec.compute
    if gated:
        tile.bn = "(BLOCK_N // 2)"
    lines += epi.body(tile, I1)
    finish = epi.reductions.fold_finish("tl.num_programs(0) * tl.num_programs(1)", I1)
    helper: list[str] = []
    if finish:  # its own function: inlined, its loop's registers spilled the tile's (sm_90)
        names = ", ".join(epi.reductions.fold_names() + ["M", "N", "L"])
        helper = ["@triton.jit(noinline=True)", f"def _ef_fold_finish({names}):",
                  *int64_lines(spec, epi.reductions.fold_params(), I1), *finish, "", ""]
        lines.append(f"{I1}_ef_fold_finish({names})")
    return "\n".join(helper + lines) + "\n"


def _u8_lines(where: str, indent: str) -> list[str]:
    """uint8 A and B (``KernelSpec.u8_offset``), which Triton's dot does not take (every
    supported release: "only int8 supported!"), run as int8: a' = a - 128, b' = b - 128
    (exact in int8), and

        sum_k a b = sum_k a'b' + 128 sum_k a' + 128 sum_k b' + 128 * 128 * K,

    with each row's sum of A' and each column's sum of B' taken from the tiles the mainloop
    loaded anyway. In int32 every term wraps modulo 2^32, so the result is the true sum
    modulo 2^32: what an int32 accumulator of the uint8 products holds. K's padding loads
    128 (a' = 0: no term). ``where``: "init" (before the loop), "step" (after a k-step's
    loads, before its dot) or "finish" (after the loop)."""
    if where == "init":
        return [f"{indent}a_rowsum = tl.zeros((BLOCK_M,), dtype=tl.int32)",
                f"{indent}b_colsum = tl.zeros((BLOCK_N,), dtype=tl.int32)"]
    if where == "step":
        return [f"{indent}a = a.to(tl.int32) - 128",
                f"{indent}b = b.to(tl.int32) - 128",
                f"{indent}a_rowsum += tl.sum(a, axis=1)",
                f"{indent}b_colsum += tl.sum(b, axis=0)",
                f"{indent}a = a.to(tl.int8)",
                f"{indent}b = b.to(tl.int8)"]
    return [f"{indent}acc += (a_rowsum[:, None] + b_colsum[None, :]) * 128 + K * 16384"]


def _gated_split_lines(indent: str) -> list[str]:
    """After the mainloop of a gated epilogue's tile (``pairs(accum)``): the accumulator's
    BLOCK_N columns split into their pairs' halves, gate (even columns) and up (odd), and
    ``rn`` the tile's BLOCK_N // 2 output columns. ``tl.reshape`` keeps the element order
    (``can_reorder=False``), so (BM, BN // 2, 2)'s last axis is the pair."""
    return [
        _pair_split(indent, "acc", "BLOCK_N // 2"),
        f"{indent}rn = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)",
    ]


def _pair_split(indent: str, acc: str, half: str) -> str:
    """``acc`` (interleaved pairs, ``half`` of them per row) split into ``acc``_gate and
    ``acc``_up, the halves the epilogue emitter reads for ``pairs(accum)``."""
    return (f"{indent}{acc}_gate, {acc}_up = tl.split(tl.reshape({acc}, (BLOCK_M, {half}, 2), "
            "can_reorder=False))")


def _concatenated_columns(indent: str) -> list[str]:
    """A gated tile over B's concatenated columns (``pairs(accum, layout="concatenated")``:
    gate's N, then up's N): the tile's BLOCK_N columns of B are gathered in the interleaved
    order, column 2p of the tile is gate's output column j = pid_n * BLOCK_N // 2 + p (B's
    column j) and 2p + 1 is up's (B's column N + j), so one dot computes the pairs the
    interleaved layout would and ``_gated_split_lines`` splits them as it does. Output
    columns past N load wrapped ones (j % N) that the store mask drops."""
    return [
        f"{indent}rnb = (pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N) // 2) % N "
        "+ (tl.arange(0, BLOCK_N) % 2) * N",
    ]


# the last k-steps of a tile's mainloop over which its aux tiles are asked into L2
L2_SPREAD_STEPS = 32
_PREFETCH_L2 = ('"{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; '
                'mov.u32 $0, 0; }"')


def _l2_spread_lines(spec: KernelSpec, i2: str, i3: str) -> tuple[list[str], list[str]]:
    """Lines before the k-loop and inside it that ask each full aux tile into L2, one
    128-byte line at a time (``prefetch.global.L2``, no registers held, nothing waited
    for), spread evenly over the mainloop's last ``min(k_tiles - 1, L2_SPREAD_STEPS)``
    k-steps: the epilogue's TMA loads then hit L2 instead of every program reading its
    tile from DRAM at the same moment after the last k-step, and the DRAM traffic trickles
    beside the mainloop's instead of arriving in one burst (hopper family, one batch; rows
    and columns past the edge are not asked for). H100, 2048^3, one wave of 128x128 tiles:
    alpha-beta 0.0325 -> 0.0314 ms, BCE 0.0362 -> 0.0350, silu*X 0.0331 -> 0.0320; the
    whole tile asked for at once, before or halfway through the mainloop, was slower than
    nothing (benchmarks/HISTORY.md, thirteenth session)."""
    before = [f"{i2}pf_steps = tl.minimum(k_tiles - 1, {L2_SPREAD_STEPS})",
              f"{i2}pf_first = k_tiles - pf_steps",
              f"{i2}pf_r = tl.arange(0, BLOCK_M)"]
    inside = [f"{i3}pf_j = ki - pf_first"]
    for op in spec.dag.used_operands:
        if op.kind is not OperandKind.FULL:
            continue
        u = spec.names.user(op.name)
        line = 128 // (op.dtype.itemsize if op.dtype is not None else 2)  # elements per line
        before.append(f"{i2}{u('l2')} = {u('ptr')} + (off_m + pf_r).to(tl.int64) * {u('sm')} + off_n")
        inside += [
            f"{i3}for pf_c in tl.static_range(0, BLOCK_N, {line}):",
            # line (row r, column piece c) is number (c / line) * BLOCK_M + r of the tile's
            # BLOCK_M * BLOCK_N / line lines, asked for at k-step line * steps // lines
            f"{i3}    pf_id = (pf_c // {line}) * BLOCK_M + pf_r",
            f"{i3}    pf_sel = ((pf_id * pf_steps) // (BLOCK_M * (BLOCK_N // {line})) == pf_j) "
            f"& (off_m + pf_r < M) & (off_n + pf_c < N)",
            f"{i3}    tl.inline_asm_elementwise({_PREFETCH_L2}, \"=r,l,r\", "
            f"[{u('l2')} + pf_c, pf_sel.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)",
        ]
    return before, inside


def _ab_loads(spec: KernelSpec, off_n: str = "off_n", bn: str = "BLOCK_N") -> tuple[str, str]:
    """The mainloop's TMA loads of A's and B's blocks as ``tl.dot`` takes them (batched:
    the 3-D block reshaped to 2-D; column-major: transposed); B's block starts at column
    ``off_n`` and is ``bn`` wide."""
    a_idx = "[bid, off_m, off_k]" if spec.a_batched else "[off_m, off_k]"
    if spec.a_trans:
        a_idx = "[bid, off_k, off_m]" if spec.a_batched else "[off_k, off_m]"
    b_idx = f"[bid, off_k, {off_n}]" if spec.b_batched else f"[off_k, {off_n}]"
    if spec.b_trans:
        b_idx = f"[bid, {off_n}, off_k]" if spec.b_batched else f"[{off_n}, off_k]"
    a_load = f"a_desc.load({a_idx})"
    b_load = f"b_desc.load({b_idx})"
    if spec.a_batched:
        a_load += ".reshape(BLOCK_K, BLOCK_M)" if spec.a_trans else ".reshape(BLOCK_M, BLOCK_K)"
    if spec.b_batched:
        b_load += f".reshape({bn}, BLOCK_K)" if spec.b_trans else f".reshape(BLOCK_K, {bn})"
    if spec.a_trans:
        a_load += ".T"
    if spec.b_trans:
        b_load += ".T"
    return a_load, b_load


def _hopper_tile_coords(i1: str, i2: str) -> list[str]:
    """``_ef_tile_coords``: a tile's batch, row and column of tiles (grouped order)."""
    return [
        "@triton.jit",
        "def _ef_tile_coords(tile, tiles_per_batch, num_pid_m, num_pid_n, GROUP_M: tl.constexpr,",
        "                    ONE_ROW: tl.constexpr):",
        # one row of tiles and one batch (M <= BLOCK_M, L == 1): the tile is its column, no
        # integer divisions ahead of the first load (small-M problems, where they show)
        f"{i1}if ONE_ROW:",
        f"{i2}return tile * 0, tile * 0, tile",
        f"{i1}bid = tile // tiles_per_batch",
        f"{i1}t = tile % tiles_per_batch",
        f"{i1}group = GROUP_M * num_pid_n",
        f"{i1}first_m = (t // group) * GROUP_M",
        f"{i1}group_m = tl.minimum(num_pid_m - first_m, GROUP_M)",
        f"{i1}pid_m = first_m + ((t % group) % group_m)",
        f"{i1}pid_n = (t % group) // group_m",
        f"{i1}return bid, pid_m, pid_n",
        "",
        "",
    ]


def _prefetch_lines(spec: KernelSpec, indent: str) -> list[str]:
    """Every full aux tile's sub-tiles requested before the mainloop, so that their
    latency hides behind it (``KernelSpec.prefetch``)."""
    lines = []
    for spec_op in spec.dag.used_operands:
        if spec_op.kind is not OperandKind.FULL:
            continue
        u = spec.names.user(spec_op.name)
        for s in range(spec.epi_split):
            off = f"off_n + {s} * (BLOCK_N // {spec.epi_split})"
            if spec_op.batched:
                lines.append(f"{indent}{u('pf', s)} = {u('desc')}.load([bid, off_m, {off}])"
                             f".reshape(BLOCK_M, BLOCK_N // {spec.epi_split})")
            else:
                lines.append(f"{indent}{u('pf', s)} = {u('desc')}.load([off_m, {off}])")
    return lines


def _hopper_source(spec: KernelSpec) -> str:
    """The hopper family's kernel: a persistent loop over tiles, TMA loads, the epilogue
    per sub-tile. Grouped over M (``spec.grouped``): the tiles of every group, each found
    in the program's table of groups (``group_emit``); gated (``pairs(accum)``): a tile
    spans BLOCK_N of B's columns and BLOCK_N // 2 of the output's."""
    epi = EpilogueEmitter(spec)
    roles = epilogue_params(spec.names, spec.dag, "hopper", spec.direct, l2_spread=spec.l2_spread,
                            grouped=spec.grouped)
    grouped, gated = spec.grouped, spec.dag.gated
    params = ", ".join(["a_desc", "b_desc", spec.rows_param(), "N", "K", "L"]
                       + (["offs"] if grouped else []) + [p for p, _ in roles])
    I1, I2, I3 = "    ", "        ", "            "
    lines = [
        *_hopper_tile_coords(I1, I2),
        *(group_of_helper(I1) if grouped else []),
        spec.jit_line(),
        f"def evtfuse_kernel({params},",
        "                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,",
        "                   GROUP_M: tl.constexpr, INPUT_PRECISION: tl.constexpr,",
        "                   NUM_SMS: tl.constexpr, FLATTEN: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,",
        "                   ONE_ROW: tl.constexpr, ONE_WAVE: tl.constexpr, EVEN_MN: tl.constexpr"
        + ("," if grouped else "):"),
        *(["                   GROUPS: tl.constexpr):"] if grouped else []),
        # the output's columns of a sub-tile (gated: half of its B columns)
        f"{I1}SUB_N: tl.constexpr = BLOCK_N // {spec.epi_split * (2 if gated else 1)}",
        *launch_dependents_lines(spec, I1),
        *int64_lines(spec, roles, I1),
        f"{I1}start = tl.program_id(0)",
        *(group_table_lines(I1) if grouped else [f"{I1}num_pid_m = tl.cdiv(M, BLOCK_M)"]),
        # grouped_reduce's per-row partials and tickets count a tile's row tile among every
        # group's as grp_tile0 + pid_m: the persistent loop's pid_m_c already is that
        *([f"{I1}grp_tile0 = 0"] if grouped and reduce_outputs(spec.dag) else []),
        f"{I1}num_pid_n = tl.cdiv({'2 * N' if gated else 'N'}, BLOCK_N)",
        f"{I1}k_tiles = tl.cdiv(K, BLOCK_K)",
        f"{I1}tiles_per_batch = num_pid_m * num_pid_n",
        f"{I1}num_tiles = tiles_per_batch{'' if grouped else ' * L'}",
        # one wave (a program per tile): the loop's end is a constant, its trip count one
        f"{I1}tiles_end = NUM_SMS if ONE_WAVE else num_tiles",
    ]
    lines += epi.prologue(I1)
    lines += epi.reductions.program_accumulators(I1)
    lines += [
        f"{I1}tile_c = start - NUM_SMS",
        f"{I1}for tile in tl.range(start, tiles_end, NUM_SMS, flatten=FLATTEN, "
        "warp_specialize=WARP_SPECIALIZE):",
        f"{I2}bid, pid_m, pid_n = _ef_tile_coords(tile, tiles_per_batch, num_pid_m, num_pid_n, "
        "GROUP_M, ONE_ROW)",
        # grouped: the group is the batch, the row tile counts over every group's
        f"{I2}bid, off_m, grp_end_m = _ef_group_of(pid_m, grp_cum, grp_n, offs, grp_rows, BLOCK_M)"
        if grouped else f"{I2}off_m = pid_m * BLOCK_M",
        f"{I2}off_n = pid_n * {'(BLOCK_N // 2)' if spec.dag.concatenated else 'BLOCK_N'}",
    ]
    lines += _hopper_mainloop(spec, I2, I3)
    lines += [
        # the epilogue recomputes its tile's coordinates: with a flattened loop the
        # mainloop of the next tile may already have started
        f"{I2}tile_c += NUM_SMS",
        # grouped: the group and its rows are the mainloop's (finding them again costs
        # its reductions, and spills: offline sm_90, a MoE epilogue with two outputs at
        # 128x128, 247 spilled registers recomputed, 10 kept); from here on M is the
        # group's end row (every mask stops there)
        f"{I2}{'grp_t' if grouped else 'bid'}, pid_m_c, pid_n_c = _ef_tile_coords(tile_c, "
        "tiles_per_batch, num_pid_m, num_pid_n, GROUP_M, ONE_ROW)",
        *([f"{I2}off_m_c, M = off_m, grp_end_m"] if grouped else []),
        f"{I2}bid64 = bid.to(tl.int64)",
        *([] if grouped else [f"{I2}off_m_c = pid_m_c * BLOCK_M"]),
        f"{I2}off_n_c = pid_n_c * {'(BLOCK_N // 2)' if gated else 'BLOCK_N'}",
        f"{I2}rm = off_m_c + tl.arange(0, BLOCK_M)",
    ]
    lines += _hopper_pieces(spec, epi, I2)
    lines += epi.reductions.program_finish(I1)
    lines += epi.reductions.fold_finish("tl.num_programs(0)", I1)
    return "\n".join(lines) + "\n"


def _hopper_mainloop(spec: KernelSpec, i2: str, i3: str) -> list[str]:
    """A tile's accumulator and its k-loop of TMA loads and dots. A concatenated gated
    epilogue (``pairs(accum, layout="concatenated")``) has two accumulators, ``acc_gate``
    and ``acc_up``: each k-step's A block meets gate's B block (B's columns from ``off_n``)
    and up's (from N + ``off_n``), half the tile's columns each; columns past an edge are
    TMA's zeros or belong to output columns past N, which the stores mask."""
    acc_type = _acc_type(spec)
    dot = f"input_precision=INPUT_PRECISION, {_dot_extra(spec)}out_dtype={acc_type})"
    spread = _l2_spread_lines(spec, i2, i3) if spec.l2_spread else ([], [])
    prefetch = _prefetch_lines(spec, i2) if spec.prefetch else []
    if spec.dag.concatenated:
        a_load, gate = _ab_loads(spec, "off_n", "(BLOCK_N // 2)")
        up = _ab_loads(spec, "N + off_n", "(BLOCK_N // 2)")[1]
        return [
            f"{i2}acc_gate = tl.zeros((BLOCK_M, BLOCK_N // 2), dtype={acc_type})",
            f"{i2}acc_up = tl.zeros((BLOCK_M, BLOCK_N // 2), dtype={acc_type})",
            *prefetch,
            *spread[0],
            f"{i2}for ki in range(k_tiles):",
            f"{i3}off_k = ki * BLOCK_K",
            f"{i3}a = {a_load}",
            f"{i3}acc_gate = tl.dot(a, {gate}, acc_gate, {dot}",
            f"{i3}acc_up = tl.dot(a, {up}, acc_up, {dot}",
        ]
    a_load, b_load = _ab_loads(spec)
    return [
        f"{i2}acc = tl.zeros((BLOCK_M, BLOCK_N), dtype={acc_type})",
        *prefetch,
        *spread[0],
        f"{i2}for ki in range(k_tiles):",
        f"{i3}off_k = ki * BLOCK_K",
        *spread[1],
        f"{i3}acc = tl.dot({a_load}, {b_load}, acc, {dot}",
    ]


def _hopper_pieces(spec: KernelSpec, epi: EpilogueEmitter, indent: str) -> list[str]:
    """The tile's epilogue, sub-tile by sub-tile (``EPI_SPLIT`` column pieces, SUB_N of the
    output's columns each)."""
    split_lines, pieces = _accumulator_pieces(spec, indent)
    piece_n = [f"off_n_c + {s} * SUB_N" if s else "off_n_c" for s in range(len(pieces))]
    lines = _early_vector_lines(spec, piece_n, indent) if spec.early_vectors else []
    lines += split_lines
    tile = GroupedHopperTile if spec.grouped else HopperTile
    for s, piece in enumerate(pieces):
        off_n = piece_n[s]
        rn = f"rn{s}"
        sub = tile(acc=piece, rn=rn, off_n=f"({off_n})", piece=s,
                   first_sub="True" if s == 0 else "False", prefetched=spec.prefetch,
                   mask=f"mask{s}", all_rn=tuple(f"rn{k}" for k in range(len(pieces))),
                   early_vectors=spec.early_vectors)
        if not spec.early_vectors:
            lines.append(f"{indent}{rn} = {off_n} + tl.arange(0, SUB_N)")
        if reduce_outputs(spec.dag) or spec.grouped:  # grouped: the stores' masks
            lines.append(f"{indent}mask{s} = (rm[:, None] < M) & ({rn}[None, :] < N)")
        lines += epi.body(sub, indent, first=s == 0, last=s == len(pieces) - 1)
    return lines


def _accumulator_pieces(spec: KernelSpec, indent: str) -> tuple[list[str], list[str]]:
    """Code splitting the tile's accumulator into ``EPI_SPLIT`` column pieces, and the
    pieces' names. Gated (``pairs(accum)``): piece ``p`` of interleaved pairs is split into
    ``p``_gate and ``p``_up after the column split; the concatenated layout's
    accumulators, ``acc_gate`` and ``acc_up``, are split alike and piece k's halves are
    named ``acc<k>p_gate`` and ``acc<k>p_up`` (one piece: ``acc_gate``, ``acc_up``)."""
    if not spec.dag.gated:
        return split_pieces(spec.epi_split, indent)
    if not spec.dag.concatenated:
        lines, pieces = split_pieces(spec.epi_split, indent)
        return lines + [_pair_split(indent, p, "SUB_N") for p in pieces], pieces
    if spec.epi_split == 1:
        return [], ["acc"]
    gate_lines, gates = split_pieces(spec.epi_split, indent, "acc_gate", width="BLOCK_N // 2")
    up_lines, ups = split_pieces(spec.epi_split, indent, "acc_up", width="BLOCK_N // 2")
    lines = gate_lines + up_lines
    for k, (g, u) in enumerate(zip(gates, ups)):
        lines.append(f"{indent}acc{k}p_gate, acc{k}p_up = {g}, {u}")
    return lines, [f"acc{k}p" for k in range(len(gates))]


def _early_vector_lines(spec: KernelSpec, piece_n: list[str], indent: str) -> list[str]:
    """Every piece's column indices and per-row/per-column operand loads, at the top of
    the tile's epilogue (``KernelSpec.early_vectors``): the pieces' L2 round trips overlap
    instead of each waiting behind the previous piece's store. Measured on an H100
    (benchmarks/HISTORY.md, fourteenth session): the one-wave two-per-SM kernel at 2048^3, where
    both programs of an SM reach their epilogue together and nothing hides a load."""
    lines = [f"{indent}rn{s} = {off} + tl.arange(0, SUB_N)" for s, off in enumerate(piece_n)]
    for op in spec.dag.used_operands:
        if op.kind not in (OperandKind.PER_ROW, OperandKind.PER_COL):
            continue
        u = spec.names.user(op.name)
        bofs = f"bid64 * {u('sl')}" if op.batched else "0"
        pieces = [0] if op.kind is OperandKind.PER_ROW else range(len(piece_n))
        for s in pieces:
            name = early_vector_name(u, op.kind, s)
            lines.append(f"{indent}{name} = {vector_load(u, op.kind, bofs, 'rm', f'rn{s}')}")
    return lines


def generate(spec: KernelSpec) -> str:
    """The whole generated module for ``spec``."""
    header = (
        f'"""evtfuse generated kernel ({spec.family}); key {spec.key()}.\n\n'
        + "\n".join("  " + line for line in ir.format_dag(spec.dag).splitlines())
        + "\n\nOperands and outputs by number (``backends/triton/names.py``):\n"
        + "\n".join("  " + line for line in spec.names.table())
        + '\n"""\n'
    )
    if spec.family == "gluon":
        # imported here, not with this module: gluon_codegen reads the running Triton's
        # Gluon names when imported, and importing evtfuse must not import Triton (the CPU
        # interpreter is switched on after it); gluon_codegen imports nothing of this one
        from .gluon_codegen import generate_gluon

        return generate_gluon(spec, header)
    kernel = _hopper_source(spec) if spec.family == "hopper" else _portable_source(spec)
    header += "import triton\nimport triton.language as tl\n\n"
    return header + helpers_for(kernel) + "\n\n" + kernel


FLOAT_OUTPUTS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_emittable(dag: Dag) -> str | None:
    """Why this emitter cannot produce the DAG, or None."""
    for o in reduce_outputs(dag):
        if OPS[o.node.op].reduce_identity is None:
            return f"output {o.name}: the kernels have no code for the reduction {o.node.op}"
    for n in dag.nodes:
        if n.kind is NodeKind.LOAD and n.operand.dtype is not None \
                and n.operand.dtype not in TL_DTYPES:
            return f"operand {n.operand.name} has dtype {n.operand.dtype}, which the kernels cannot load yet"
    for o in dag.outputs:
        if o.node.kind is NodeKind.REDUCE:
            continue  # written by the launch plan's combine step, any float dtype
        if o.dtype is not None and o.dtype not in FLOAT_OUTPUTS \
                and o.dtype not in INT_OUTPUTS and o.dtype not in FP8_DTYPES:
            return (f"output {o.name} has dtype {o.dtype}; the kernels store fp16, bf16, fp32, "
                    "fp64, fp8 (e4m3fn, e5m2), int8, uint8 and int32")
    return None
