"""The Gluon epilogue's shared memory: which buffers a DAG's epilogue needs, and their size.

Layer: backends/triton. ``buffers(dag)`` decides, once per kernel, where each full aux
tile and full output lives between global memory and the consumer's registers: aux tiles
in whole-tile load buffers, outputs staged in a load buffer of their dtype, in column
pieces, in a load buffer's 128-byte chunks, or stored from registers. The gluon family
sizes its A/B ring and refuses configs from this plan (``gluon_family``); the emitter
(``gluon_codegen``) allocates and uses exactly these buffers, so the two cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...ir import Dag, OperandKind
from .spec import full_outputs, staged_vector


@dataclass(frozen=True)
class Buffers:
    """Shared-memory buffers of the epilogue. Every name here is a user's (an operand's or
    output's); the emitter asks the kernel's namer for the identifiers of buffers and
    descriptors (``names.Names``, roles "lb", "vb", "ob", "desc").

    ``loads`` (operand name, dtype): whole-tile buffers, two (one per consumer), filled by
    TMA ahead of the epilogue by the epilogue-memory warp. ``tile_stores`` (output name,
    the name of the load whose buffer hosts it): an output of a load's dtype is staged in that load's buffer (the tile
    was read into registers before any output is written) and stored by the same warp.
    ``piece_stores`` (output name, dtype): the other outputs are staged per column piece
    in two buffers per consumer and TMA-stored by the consumer itself, so they cost
    ``2 * BLOCK_M * SUB_N`` elements per consumer instead of a whole tile. ``vectors``
    (operand name, dtype, per-row?): per-row/per-column operands TMA-loaded with the aux
    tiles, ``BLOCK_M`` or ``BLOCK_N`` elements per consumer (``codegen.staged_vector``).
    ``direct_stores``: outputs the consumer stores from registers with masked global
    stores (``KernelSpec.direct``, chosen by ``GluonFamily`` where the shared memory their
    pieces would take costs A/B stages): no buffer. ``slot_stores`` (output name, host
    load; ``KernelSpec.chunk``): a second output of a load buffer's dtype, staged in the
    buffer's 128-byte column chunks once the chunk's in-place output has left; the
    consumer TMA-stores both by chunk (``gluon_tile.SlotPlan``), so it costs no shared memory.
    ``direct_loads``: full operands the consumer reads from global memory with masked loads,
    piece by piece (``KernelSpec.direct`` names them too, where their buffers would leave
    too few A/B stages): no buffer."""

    loads: tuple[tuple[str, torch.dtype], ...]
    tile_stores: tuple[tuple[str, str], ...]
    piece_stores: tuple[tuple[str, torch.dtype], ...]
    vectors: tuple[tuple[str, torch.dtype, bool], ...] = ()
    direct_stores: tuple[str, ...] = ()
    direct_loads: tuple[str, ...] = ()
    slot_stores: tuple[tuple[str, str], ...] = ()
    chunked: bool = False  # the consumer stores the tile-staged outputs by chunk
    # a batched kernel (A or B has batch slices, L > 1): every tile descriptor and buffer
    # has a leading batch dimension (1 in the buffers; consumers read and write 2-D views,
    # ``_c`` of a buffer ``_c3``), at batch ``bid`` for the tiles named in ``own_batch``
    # (tensors with their own slices), at 0 for those shared by every batch
    batch: bool = False
    own_batch: tuple[str, ...] = ()

    def at(self, name: str, row: str, col: str) -> str:
        """The TMA coordinates of the block of tile ``name`` at ``row``, ``col``."""
        if not self.batch:
            return f"[{row}, {col}]"
        return f"[{'bid' if name in self.own_batch else '0'}, {row}, {col}]"

    def view(self, buf: str, rows: str, cols: str) -> str:
        """``buf`` (one block of a buffer) as the 2-D ``rows`` x ``cols`` block the
        consumer's loads and stores take."""
        return f"{buf}.reshape([{rows}, {cols}])" if self.batch else buf

    def dtype_of(self, load: str) -> torch.dtype:
        """The dtype of the buffer of load ``load`` (an operand's name)."""
        return next(dt for n, dt in self.loads if n == load)

    @property
    def consumer_tiles(self) -> tuple[tuple[str, str], ...]:
        """Tile-staged outputs the consumer stores by 128-byte chunk (``chunked``: with slot
        outputs, or where asked) instead of the epilogue-memory warp's whole-tile store."""
        return self.tile_stores if self.chunked else ()

    @property
    def own(self) -> list[tuple[str, str, int]]:
        """Every buffer allocated: (the operand's or output's name, the buffer's role in
        ``names.ROLES``, how many): two of each tile and vector (one per consumer), four
        piece buffers (two per consumer). Its layout is that of the name's descriptor."""
        out = [(n, "lb", 2) for n, _ in self.loads]
        out += [(n, "vb", 2) for n, _, _ in self.vectors]
        out += [(n, "ob", 4) for n, _ in self.piece_stores]
        return out

    def smem_bytes(self, block_m: int, block_n: int, sub_n: int) -> int:
        """Shared memory of both consumers' epilogue buffers."""
        tiles = 2 * block_m * block_n * sum(dt.itemsize for _, dt in self.loads)
        pieces = 2 * 2 * block_m * sub_n * sum(dt.itemsize for _, dt in self.piece_stores)
        vectors = sum(2 * (block_m if row else block_n) * dt.itemsize for _, dt, row in self.vectors)
        return tiles + pieces + vectors


def buffers(dag: Dag, direct: tuple[str, ...] = (), slots: bool = False, batch: bool = False
            ) -> Buffers:
    """How ``dag``'s epilogue uses shared memory; ``slots``: outputs without a buffer of
    their own go into the chunks of a load buffer that already hosts an output (one each);
    ``batch``: a batched kernel's (``Buffers.batch``)."""
    vectors = tuple((s.name, s.dtype, s.kind is OperandKind.PER_ROW) for s in dag.used_operands
                    if staged_vector(s, "gluon"))
    loads = tuple((s.name, s.dtype) for s in dag.used_operands
                  if s.kind is OperandKind.FULL and s.name not in direct)
    direct_loads = tuple(s.name for s in dag.used_operands
                         if s.kind is OperandKind.FULL and s.name in direct)
    free = list(loads)
    tile, piece, slot = [], [], []
    hosts = {}  # load buffers holding an output, by dtype, that can still take a slot output
    for o in full_outputs(dag):
        if o.name in direct:
            continue
        match = next((ld for ld in free if ld[1] == o.dtype), None)
        if match is not None:
            free.remove(match)
            tile.append((o.name, match[0]))
            hosts.setdefault(o.dtype, []).append(tile[-1][1])
        elif slots and hosts.get(o.dtype):
            slot.append((o.name, hosts[o.dtype].pop(0)))
        else:
            piece.append((o.name, o.dtype))
    own = tuple(s.name for s in dag.used_operands
                if s.kind is OperandKind.FULL and s.batched and s.name not in direct)
    own += tuple(o.name for o in full_outputs(dag) if o.batched)
    return Buffers(loads, tuple(tile), tuple(piece), vectors,
                   tuple(o.name for o in full_outputs(dag) if o.name in direct),
                   direct_loads, tuple(slot),
                   chunked=slots and bool(tile), batch=batch, own_batch=own if batch else ())


def slot_columns(dtype: torch.dtype) -> int:
    """Columns of one slot chunk: 128 bytes, the shared layout's swizzle width, so that a
    chunk of a 128-byte-swizzled tile buffer is one TMA box of its own (a [rows, chunk]
    block lies contiguous in the buffer)."""
    return 128 // dtype.itemsize


def _chunk_widths(bufs: Buffers) -> set[int]:
    """Columns of a chunk of each of ``bufs``'s consumer-stored tiles (``slot_columns``)."""
    return {slot_columns(bufs.dtype_of(buf)) for _, buf in bufs.consumer_tiles}


def chunk_columns(bufs: Buffers) -> int:
    """Columns of the chunks of ``bufs``'s consumer-stored tiles (one width: ``slots_fit``)."""
    return min(_chunk_widths(bufs))


def slots_fit(bufs: Buffers, block_n: int, sub_n: int) -> bool:
    """Whether the consumer can store ``bufs``'s tile-staged outputs (and slot outputs) by
    chunk: one chunk width for all, the chunks tile the tile and line up with the
    epilogue's pieces (whole pieces per chunk where slot outputs wait for a chunk, or
    whole chunks per piece), and no other output needs the TMA group counts
    (piece-staged outputs wait on them)."""
    if not bufs.consumer_tiles or bufs.piece_stores or bufs.direct_stores:
        return False
    chunks = _chunk_widths(bufs)
    if len(chunks) != 1:
        return False
    c = chunks.pop()
    return block_n % c == 0 and (c % sub_n == 0 or (not bufs.slot_stores and sub_n % c == 0))
