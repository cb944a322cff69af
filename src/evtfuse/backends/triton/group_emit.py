"""What a grouped GEMM's kernel spells: a program's or a tile's group, found in ``offs`` on
the device, and its rows.

Layer: backends/triton, below ``codegen`` (the portable and hopper kernels call these).
Invariant: ``offs`` is read only on the device (no host synchronisation), and a group's
rows are clamped to [0, T), so offsets that are not what ``torch._grouped_mm`` asks for
(decreasing, negative, past T: never checked) give unspecified rows but never touch memory
outside A and the outputs. Pure text: each function returns Triton source.
"""

from __future__ import annotations

GROUP_SCAN = 128  # groups of ``offs`` a portable grouped program reads per step when finding its own


def group_tile_lines(indent: str) -> list[str]:
    """The row tiles of the groups ``grp_g`` (a vector of group numbers; those past L have
    none): ``grp_end`` and ``grp_beg`` their end and first rows as ``offs`` has them, ``grp_n``
    their tiles (cdiv(rows, BLOCK_M), none for an empty group)."""
    return [
        f"{indent}grp_end = tl.load(offs + grp_g, mask=grp_g < L, other=0)",
        f"{indent}grp_beg = tl.load(offs + grp_g - 1, mask=(grp_g > 0) & (grp_g < L), other=0)",
        f"{indent}grp_n = tl.where(grp_g < L, tl.cdiv(tl.maximum(grp_end - grp_beg, 0), BLOCK_M), 0)",
    ]


def group_rows_lines(indent: str, group: str, row0: str, end: str) -> list[str]:
    """Group ``group``'s first row into ``row0`` and its end row into ``end``, clamped to
    [0, grp_rows] (``grp_rows``: T, every group's rows)."""
    return [
        f"{indent}{row0} = tl.maximum(tl.load(offs + {group} - 1, mask={group} > 0, other=0), 0)",
        f"{indent}{end} = tl.minimum(tl.load(offs + {group}), grp_rows)",
    ]


def k_group_lines(i1: str) -> list[str]:
    """A program of a grouped GEMM over K (``KernelSpec.k_grouped``): its batch ``bid`` is
    its group, whose range of K is offs[bid-1] to offs[bid] (on the device, clamped to
    [0, grp_k): offsets past the whole K never read outside A and B). ``K`` becomes that
    range's length (an empty group's accumulator is zero) and the pointers move to its
    start; the mainloop then runs as in a dense batched GEMM (``EVEN_K`` is off)."""
    return [
        f"{i1}grp_k0 = tl.minimum(tl.maximum(tl.load(offs + bid - 1, mask=bid > 0, other=0), 0), grp_k)",
        f"{i1}K = tl.maximum(tl.minimum(tl.load(offs + bid), grp_k) - grp_k0, 0)",
        f"{i1}a_ptrs += grp_k0.to(tl.int64) * sa_k",
        f"{i1}b_ptrs += grp_k0.to(tl.int64) * sb_k",
    ]


def group_lines(i1: str, i2: str, reductions=None) -> list[str]:
    """A portable grouped program's group (``bid``) and rows (``KernelSpec.grouped``).

    The program's row tile ``pid_m`` counts over every group's tiles in group order
    (group g has cdiv(rows, BLOCK_M) of them, none when empty); the program reads ``offs``
    (cumulative end rows, on the device: no host synchronisation) ``GROUP_SCAN`` groups at
    a time, counts the groups whose tiles end at or before ``pid_m`` (that count is its
    group) and the tiles they hold (where its group's tiles start), and returns at once
    past the last group's last tile (the grid is an upper bound). From there on ``M`` is
    the group's end row: every mask of the tile (``rm < M``) stops at its group's end, and
    the mainloop's wrapped rows (``rm % M``) stay inside A. Rows at or past offs[-1] belong
    to no group: nothing is written there; a group of no rows has no tiles.
    ``reductions``: the kernel's ``grouped_reduce.GroupedReductions`` (None without
    reductions), whose lines for groups without rows follow the scan and whose group tile
    count follows ``bid``."""
    fill = reductions.fill_lines(i1) if reductions else []
    count = reductions.group_count_lines(i1) if reductions else []
    return [
        f"{i1}grp_id = 0",
        f"{i1}grp_tile0 = 0",
        f"{i1}grp_tiles = 0",
        f"{i1}for grp_c in range(0, L, {GROUP_SCAN}):",
        f"{i2}grp_g = grp_c + tl.arange(0, {GROUP_SCAN})",
        *group_tile_lines(i2),
        f"{i2}grp_cum = grp_tiles + tl.cumsum(grp_n, 0)",
        f"{i2}grp_done = grp_cum <= pid_m",
        f"{i2}grp_id += tl.sum(grp_done.to(tl.int32), 0)",
        f"{i2}grp_tile0 += tl.sum(tl.where(grp_done, grp_n, 0), 0)",
        f"{i2}grp_tiles += tl.sum(grp_n, 0)",
        *fill,
        f"{i1}if pid_m >= grp_tiles:",
        f"{i2}return",
        f"{i1}bid = grp_id",
        f"{i1}bid64 = bid.to(tl.int64)",
        *count,
        *group_rows_lines(i1, "bid", "grp_row0", "M"),
        f"{i1}pid_m = pid_m - grp_tile0",
    ]


def group_table_lines(indent: str) -> list[str]:
    """A persistent (hopper) grouped program's table of groups, read once at its start:
    every group's row tiles (``grp_n``, up to ``GROUPS`` groups, a power of two >= L) and
    their running sum ``grp_cum`` stay in registers; ``num_pid_m``, the row tiles of all
    groups, counts the tiles over which the program's loop runs."""
    return [
        f"{indent}grp_g = tl.arange(0, GROUPS)",
        *group_tile_lines(indent),
        f"{indent}grp_cum = tl.cumsum(grp_n, 0)",
        f"{indent}num_pid_m = tl.sum(grp_n, 0)",
    ]


def group_of_helper(i1: str) -> list[str]:
    """``_ef_group_of``: a persistent grouped program's tile, by its row tile ``pid_m``
    among all groups' (in group order; ``group_table_lines``' running sum ``grp_cum`` and
    counts ``grp_n``): its group, its first row and its group's end row. A tile's rows
    past its group's end are loaded (from the next group's A rows, or as TMA's zeros past
    T) and masked at the stores: each row's result depends on its own A row only."""
    return [
        "@triton.jit",
        "def _ef_group_of(pid_m, grp_cum, grp_n, offs, grp_rows, BLOCK_M: tl.constexpr):",
        f"{i1}grp_done = grp_cum <= pid_m",
        f"{i1}grp = tl.sum(grp_done.to(tl.int32), 0)",
        f"{i1}grp_tile0 = tl.sum(tl.where(grp_done, grp_n, 0), 0)",
        *group_rows_lines(i1, "grp", "grp_row0", "grp_last"),
        f"{i1}return grp, grp_row0 + (pid_m - grp_tile0) * BLOCK_M, grp_last",
        "",
        "",
    ]
