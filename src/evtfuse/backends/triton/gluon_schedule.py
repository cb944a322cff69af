"""The persistent schedule of the Gluon kernels (``gluon_codegen``), as every partition
sees it: program ``p`` takes tiles ``p, p + nprog, ...`` (``program``), a tile's
coordinates in grouped order (``tile_coords``), an epilogue unit's origin (``unit_origin``:
a whole tile for ping-pong consumers, half a tile for cooperative ones), the
epilogue-memory warp's first aux loads (``first_loads``), and the A/B ring's TMA
coordinates and stage views (``coords``, ``stage``).

Layer: backends/triton, below ``gluon_codegen``.
"""

from __future__ import annotations

I1, I2, I3 = "    ", "        ", "            "
SIZES = "M, N, K, L"  # the problem's sizes, every partition's arguments
CONSTS_SIG = "BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, " \
             "GROUP_M: gl.constexpr, NUM_STAGES: gl.constexpr, EVEN_MN: gl.constexpr"
CONSTS = "BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_STAGES, EVEN_MN"


def lane(n: int, warps: int) -> str:
    """An index vector of ``n`` elements (a multiple of ``32 * warps``) spread over the
    threads of a consumer partition of ``warps`` warps."""
    return f"gl.arange(0, {n}, layout=gl.BlockedLayout([{n // (32 * warps)}], [32], [{warps}], [0]))"


# every partition's view of the persistent schedule: program p takes tiles p, p + nprog, ...
def program(batch: bool) -> list[str]:
    """The persistent schedule's sizes (``batch``: the tiles of every batch, batch by batch)."""
    return [
        f"{I1}start = gl.program_id(0)",
        f"{I1}nprog = gl.num_programs(0)",
        f"{I1}num_pid_m = gl.cdiv(M, BLOCK_M)",
        f"{I1}num_pid_n = gl.cdiv(N, BLOCK_N)",
        f"{I1}my_tiles = gl.cdiv(num_pid_m * num_pid_n{' * L' if batch else ''} - start, nprog)",
    ]


def tile_coords(batch: bool) -> list[str]:
    """``_ef_tile_coords``: a tile's (batch,) row and column of tiles: grouped order,
    bands of ``GROUP_M`` row-tiles, within each batch."""
    head = [
        "@gluon.jit",
        "def _ef_tile_coords(tile, num_pid_m, num_pid_n, GROUP_M: gl.constexpr):",
    ]
    if batch:
        head += [f"{I1}per_batch = num_pid_m * num_pid_n",
                 f"{I1}bid = tile // per_batch",
                 f"{I1}tile = tile % per_batch"]
    return head + [
        f"{I1}group = GROUP_M * num_pid_n",
        f"{I1}first_m = (tile // group) * GROUP_M",
        f"{I1}group_m = gl.minimum(num_pid_m - first_m, GROUP_M)",
        f"{I1}pid_m = first_m + ((tile % group) % group_m)",
        f"{I1}pid_n = (tile % group) // group_m",
        f"{I1}return {'bid, ' if batch else ''}pid_m, pid_n",
        "",
        "",
    ]


def first_loads(staged: bool, tail: str, coop: bool = False) -> list[str]:
    """The memory warp's aux loads for units 0 and 1 (``staged``: the second waits; for
    cooperative tiles, both: they are the halves of the first tile)."""
    issue = f"_ef_mem_issue({{t}}, start, nprog, num_pid_m, num_pid_n, c_ready, {tail})"
    if coop:
        wait = [f"{I1}mbarrier.wait(c_go.index(0), 0)  # the ring's first fill has landed"]
        return [*(wait if staged else []), f"{I1}{issue.format(t=0)}", f"{I1}{issue.format(t=1)}"]
    wait = [f"{I2}mbarrier.wait(c_go.index(0), 0)  # consumer 0's first mainloop issued"]
    return [f"{I1}{issue.format(t=0)}", f"{I1}if my_units > 1:", *(wait if staged else []),
            f"{I2}{issue.format(t=1)}"]


def unit_origin(coop: bool, batch: bool) -> list[str]:
    """``_ef_unit_origin``: the (batch,) first row and column of an epilogue unit's block. A unit
    is what one consumer's aux and output buffers hold at a time: ping-pong, tile ``u``
    of the program (consumer ``u % 2`` takes it whole); cooperative, half ``u % 2`` (the
    rows of consumer ``u % 2``) of the program's tile ``u // 2``. Either way buffer set
    ``u % 2`` serves unit ``u`` and is reused by unit ``u + 2``."""
    tile, rows = ("start + (u // 2) * nprog", " + (u % 2) * (BLOCK_M // 2)") if coop \
        else ("start + u * nprog", "")
    bid = "bid, " if batch else ""
    return [
        "@gluon.jit",
        "def _ef_unit_origin(u, start, nprog, num_pid_m, num_pid_n, BLOCK_M: gl.constexpr, "
        "BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr):",
        f"{I1}{bid}pid_m, pid_n = _ef_tile_coords({tile}, num_pid_m, num_pid_n, GROUP_M)",
        f"{I1}return {bid}pid_m * BLOCK_M{rows}, pid_n * BLOCK_N",
        "",
        "",
    ]


def coords(trans: bool, row: str, k: str, batched: bool = False) -> str:
    """An A or B block's TMA coordinates (``batched``: the operand has batch slices)."""
    b = "bid, " if batched else ""
    return f"[{b}{k}, {row}]" if trans else f"[{b}{row}, {k}]"


def stage(bufs: str, batched: bool, shape: tuple[str, str]) -> str:
    """Stage ``s`` of an A/B ring as the 2-D block wgmma reads (a batched operand's
    blocks are [1, rows, columns])."""
    if batched:
        return f"{bufs}.index(s).reshape([{shape[0]}, {shape[1]}])"
    return f"{bufs}.index(s)"
