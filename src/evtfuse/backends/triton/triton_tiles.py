"""The tile objects of the Triton families' kernels (``codegen``): what the epilogue
emitter (``epilogue_emit.EpilogueEmitter``) asks of the tile it writes code for - how a
full aux tile or a per-row/-column vector is loaded, how a full output is stored, the
tile's rows and columns, its masks - answered for each family: ``PortableTile`` (pointer
loads and masked stores, one program per tile), ``HopperTile`` (TMA descriptors, the
accumulator in pieces along N), and their grouped-GEMM forms (``GroupedTile``,
``GroupedHopperTile``: outputs stored through pointers masked to the group's rows).

Layer: backends/triton, below ``codegen``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...ir import OperandKind, OutputKind
from .emit_common import vector_load
from .names import User


class TritonTile:
    """What a Triton tile (portable or hopper) spells the same way: the emitter asks a
    tile for tile-shaped zeros, the program's barrier, a BLOCK_M-wide index vector and
    its per-row/per-column operands. ``u``: the operand's or output's identifiers
    (``names.User``); ``ct``: the dtype the epilogue computes in (``KernelSpec.compute``)."""

    ct = "tl.float32"

    def load_vector(self, u: User, kind: OperandKind, bofs: str) -> str:
        return vector_load(u, kind, bofs, self.rm, self.rn, self.ct)

    def zeros(self) -> str:
        return f"tl.zeros(({self.bm}, {self.bn}), {self.ct})"

    def barrier(self) -> str:
        return "tl.debug_barrier()"

    def lane(self) -> str:
        return "tl.arange(0, BLOCK_M)"

    bid = "bid"  # the tile's batch (a stored vector without batch slices: batch 0's)

    def along(self, v: str, kind: OutputKind) -> str:
        """``v`` (a scalar or a per-row/per-column value) as the tile's 1-D vector of its
        rows (``kind`` ROW) or columns (COL), for a stored vector output."""
        if kind is OutputKind.ROW:
            return f"tl.reshape({v} + tl.zeros(({self.bm}, 1), {self.ct}), ({self.bm},))"
        return f"tl.reshape({v} + tl.zeros((1, {self.bn}), {self.ct}), ({self.bn},))"

    def one(self, v: str) -> tuple[str, str, str]:
        """A scalar value ``v`` as a stored scalar output takes it: (value, pointer offset,
        mask condition, "" for none) of the one store."""
        return f"tl.sum(tl.reshape({v} + tl.zeros((1, 1), {self.ct}), (1,)), axis=0)", "", ""


class PointerStores:
    """Full outputs stored through pointers, masked (``self.mask``) to the tile's rows and
    columns: the portable kernel's, and a grouped hopper kernel's (a TMA store of a whole
    tile would write past its group's rows)."""

    def _offsets(self, u: User, batched: bool) -> str:
        b = f"bid64 * {u('sl')} + " if batched else ""
        return f"{u('ptr')} + {b}{self.rm}[:, None] * {u('sm')} + {self.rn}[None, :] * {u('sn')}"

    def store_full(self, u: User, value: str, batched: bool, where: str | None = None) -> str:
        """The store of a full output's tile; ``where``: a conditional store's condition
        (``store_where``), the elements it does not hold left as the buffer has them."""
        mask = self.mask if where is None else f"{self.mask} & ({where})"
        return (f"tl.store({self._offsets(u, batched)}, "
                f"({value}).to({u('ptr')}.dtype.element_ty), mask={mask})")


@dataclass
class PortableTile(PointerStores, TritonTile):
    acc: str = "acc"
    rm: str = "rm"
    rn: str = "rn"
    bm: str = "BLOCK_M"
    bn: str = "BLOCK_N"
    pid_m: str = "pid_m"
    pid_n: str = "pid_n"
    first_sub: str = "True"
    piece: int | None = None  # one piece: the whole tile
    mask: str = "mask"
    all_rn: tuple = ("rn",)

    def load_full(self, u: User, batched: bool) -> str:
        return f"tl.load({self._offsets(u, batched)}, mask=mask, other=0.0).to({self.ct})"


@dataclass
class GroupedTile(PortableTile):
    """A grouped program's tile: ``bid`` is its group, and a stored value without a group
    dimension (a per-row value of (T, 1)) is written by the group of its rows, not by
    group 0 only."""

    bid = ""


@dataclass
class HopperTile(TritonTile):
    acc: str
    rn: str
    off_n: str
    piece: int  # the sub-tile's number (left to right)
    first_sub: str
    rm: str = "rm"
    bm: str = "BLOCK_M"
    bn: str = "SUB_N"
    pid_m: str = "pid_m_c"
    pid_n: str = "pid_n_c"
    prefetched: bool = False
    mask: str = ""
    all_rn: tuple = ()
    early_vectors: bool = False  # the vectors were loaded at the epilogue's top (role "ve")

    def load_vector(self, u: User, kind: OperandKind, bofs: str) -> str:
        if not self.early_vectors:
            return super().load_vector(u, kind, bofs)
        return early_vector_name(u, kind, self.piece)

    def load_full(self, u: User, batched: bool) -> str:
        if self.prefetched:
            return f"{u('pf', self.piece)}.to(tl.float32)"
        if batched:
            return (f"{u('desc')}.load([bid, off_m_c, {self.off_n}]).reshape(BLOCK_M, SUB_N)"
                    f".to(tl.float32)")
        return f"{u('desc')}.load([off_m_c, {self.off_n}]).to(tl.float32)"

    def store_full(self, u: User, value: str, batched: bool) -> str:
        desc = u("desc")
        if batched:
            return (f"{desc}.store([bid, off_m_c, {self.off_n}], "
                    f"({value}).to({desc}.dtype).reshape(1, BLOCK_M, SUB_N))")
        return f"{desc}.store([off_m_c, {self.off_n}], ({value}).to({desc}.dtype))"


@dataclass
class GroupedHopperTile(PointerStores, HopperTile):
    """A grouped hopper kernel's sub-tile: full aux tiles come by TMA (a row past the
    group's end is loaded, its result masked), full outputs leave through pointers masked
    to the group's rows (``mask<piece>``), and a per-row value of (T, 1) is written by the
    group of its rows (``bid`` is the group; ``GroupedTile`` likewise)."""

    bid = ""


def early_vector_name(u: User, kind: OperandKind, piece: int) -> str:
    """The variable an early vector load goes into (``codegen._early_vector_lines``): one per
    piece for a per-column operand, one per tile per-row."""
    return u("ve") if kind is OperandKind.PER_ROW else u("ve", piece)
