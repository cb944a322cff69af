"""The consumer's epilogue tile in the Gluon kernels (``gluon_codegen``): one column piece
of the accumulator as the epilogue emitter sees it (``GluonTile``: aux tiles and vectors
read from the shared buffers the epilogue-memory warp filled, outputs stored from
registers, into a load's buffer, or staged per piece for TMA), the consumer's chunked TMA
stores of slot outputs (``SlotPlan``), and the piece loop's per-piece selections and stores
(``piece_select``, ``piece_stores``).

Layer: backends/triton, below ``gluon_codegen`` (which assembles the kernel).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...ir import OperandKind, OutputKind
from .emit_common import vector_load
from .gluon_buffers import Buffers
from .names import Names, User
from .versions import gluon_names

TMA_STORE, CTA_BARRIER = (gluon_names()[k] for k in ("tma_store", "cta_barrier"))


@dataclass
class GluonTile:
    """One column piece (number ``k``) of the consumer's tile: accumulator ``acc`` in
    layout ``layout`` (the wgmma layout, or the one ``split`` gives its pieces)."""

    bufs: Buffers
    k: int | str  # a piece number, or the name of the piece loop's index (``loop``)
    acc: str
    layout: str
    rn: str
    piece: int | None  # the piece's number (None: in the piece loop, one body for all)
    first_sub: str
    rm: str = "rm"
    bm: str = "EPI_M"  # the consumer's rows of the tile (``row0`` the first)
    bn: str = "SUB_N"
    pid_m: str = "pid_m_c"
    pid_n: str = "pid_n_c"
    mask: str = ""
    all_rn: tuple = ()
    loop: bool = False  # in the runtime piece loop: slices were taken by ``piece_select``

    @property
    def bid(self) -> str:
        """The tile's batch in a batched kernel ("": one batch)."""
        return "bid" if self.bufs.batch else ""

    def zeros(self) -> str:
        return f"gl.zeros(({self.bm}, {self.bn}), gl.float32, layout={self.layout})"

    def along(self, v: str, kind: OutputKind) -> str:
        # broadcast over a zero vector in the piece's row/column slice layout (that of
        # ``rm``/``rn``), then reduced over the axis of size 1: exact, no reshape
        if kind is OutputKind.ROW:
            z = f"gl.zeros(({self.bm},), gl.float32, layout=gl.SliceLayout(1, {self.layout}))[:, None]"
            return f"tl.sum({v} + {z}, axis=1)"
        z = f"gl.zeros(({self.bn},), gl.float32, layout=gl.SliceLayout(0, {self.layout}))[None, :]"
        return f"tl.sum({v} + {z}, axis=0)"

    def one(self, v: str) -> tuple[str, str, str]:
        # the value along the consumer's rows, stored by the lane of its first row
        return self.along(v, OutputKind.ROW), f" + {self.rm} * 0", f"{self.rm} == row0"

    def barrier(self) -> str:
        return f"{CTA_BARRIER}()"  # the consumer warpgroup's own barrier

    def lane(self) -> str:
        return f"({self.rm} - row0)"

    def load_full(self, u: User, batched: bool) -> str:
        if u.name in self.bufs.direct_loads:  # from global memory, this piece's elements
            # offsets in int32 unless the strides were made int64 (``KernelSpec.int64``):
            # 64-bit offsets of every element of five tiles spill (offline sm_90)
            bofs = f"bid64 * {u('sl')} + " if batched else ""
            return (f"tl.load({u('ptr')} + {bofs}{self.rm}[:, None] * {u('sm')} + "
                    f"{self.rn}[None, :] * {u('sn')}, "
                    f"mask=({self.rm}[:, None] < M) & ({self.rn}[None, :] < N), other=0.0)"
                    ".to(tl.float32)")
        if self.loop:
            return f"{u('ld')}.to(tl.float32)"
        return f"{u('lbc')}.slice({self.k} * SUB_N, SUB_N, dim=1).load({self.layout}).to(tl.float32)"

    def load_vector(self, u: User, kind: OperandKind, bofs: str) -> str:
        if not any(n == u.name for n, _, _ in self.bufs.vectors):
            return vector_load(u, kind, bofs, self.rm, self.rn)
        if kind is OperandKind.PER_ROW:
            return f"{u('vbc')}.load(gl.SliceLayout(1, {self.layout})).to(tl.float32)[:, None]"
        if self.loop:
            return f"{u('lv')}.to(tl.float32)[None, :]"
        return (f"{u('vbc')}.slice({self.k} * SUB_N, SUB_N).load(gl.SliceLayout(0, {self.layout}))"
                f".to(tl.float32)[None, :]")

    def store_full(self, u: User, value: str, batched: bool) -> str:
        if u.name in self.bufs.direct_stores:  # from registers
            bofs = f"bid64 * {u('sl')} + " if batched else ""
            return (f"tl.store({u('ptr')} + {bofs}{self.rm}[:, None].to(tl.int64) * {u('sm')} + "
                    f"{self.rn}[None, :].to(tl.int64) * {u('sn')}, "
                    f"({value}).to({u('ptr')}.dtype.element_ty), "
                    f"mask=({self.rm}[:, None] < M) & ({self.rn}[None, :] < N))")
        slot = dict(self.bufs.slot_stores)
        if u.name in slot:  # held until its chunk's in-place output has left (``SlotPlan``)
            return f"{u('hold', self.k)} = ({value}).to({u.names(slot[u.name], 'lbc')}.dtype)"
        tile = dict(self.bufs.tile_stores)
        if u.name in tile:  # stored later: whole by the epilogue-memory warp, or by chunk (``SlotPlan``)
            buf = u.names(tile[u.name], "lbc")
            if self.loop:  # stored into its slice after the body (``piece_stores``)
                return f"{u('st')} = ({value}).to({buf}.dtype)"
            return f"{buf}.slice({self.k} * SUB_N, SUB_N, dim=1).store(({value}).to({buf}.dtype))"
        # staged in one of this consumer's two piece buffers, stored by TMA from here: the
        # buffer's previous store (two pieces ago) is done once at most 2n - 1 of the n
        # piece outputs' later stores are pending (bulk groups complete in order)
        n = len(self.bufs.piece_stores)
        parity = f"{self.k} % 2" if self.loop else self.k % 2
        buf = f"{u('ob')}.index(WHICH * 2 + {parity})"
        return "; ".join([
            f"tma.store_wait(pendings={2 * n - 1})",
            f"{self.bufs.view(buf, 'EPI_M', 'SUB_N')}.store(({value}).to({u('ob')}.dtype))",
            "fence_async_shared()",
            f"{TMA_STORE}({u('desc')}, "
            f"{self.bufs.at(u.name, 'row0', f'pid_n_c * BLOCK_N + {self.k} * SUB_N')}, {buf})",
        ])


@dataclass(frozen=True)
class SlotPlan:
    """The consumer's chunked TMA stores of slot outputs (``Buffers.slot_stores``) and of
    the in-place outputs of their buffers. A chunk is ``per`` pieces (``CH`` columns, 128
    bytes). Once a chunk's last piece has run, its in-place outputs (written there as the
    pieces ran) leave by TMA; the slot outputs' pieces stay in registers (role "hold") until
    the next chunk's in-place stores are issued, then wait for their chunk's in-place
    stores to have read the buffer (bulk groups complete in order), take the chunk and
    leave. Per chunk ``c``: in-place ``c`` (``T`` groups, one per consumer-stored tile),
    then slots ``c - 1`` (``S``, one per slot output; none without slot outputs). Without
    slot outputs a piece may span several chunks (``per`` < 1: each piece issues its own)."""

    bufs: Buffers
    pieces: int
    sub_n: int  # columns of a piece
    chunk: int  # columns of a chunk
    names: Names

    @property
    def per(self) -> int:  # pieces per chunk (0: a piece holds several chunks)
        return self.chunk // self.sub_n

    @property
    def chunks(self) -> int:
        return self.pieces * self.sub_n // self.chunk

    def _issue(self, pairs, c: int, indent: str) -> list[str]:
        # a batched kernel's buffers: the chunk of the 3-D block (``Buffers.batch``)
        role, dim = ("lbc3", 2) if self.bufs.batch else ("lbc", 1)
        return [f"{indent}{TMA_STORE}({self.names(n, 'desc')}, "
                f"{self.bufs.at(n, 'row0', f'pid_n_c * BLOCK_N + {c} * CH')}, "
                f"{self.names(host, role)}.slice({c} * CH, CH, dim={dim}))" for n, host in pairs]

    def _flush(self, c: int, pendings: int, indent: str) -> list[str]:
        lines = [f"{indent}tma.store_wait(pendings={pendings})  # chunk {c}'s in-place stores "
                 "have read it"]
        for n, host in self.bufs.slot_stores:
            for j in range(c * self.per, (c + 1) * self.per):
                lines.append(f"{indent}{self.names(host, 'lbc')}.slice({j} * SUB_N, SUB_N, dim=1)"
                             f".store({self.names(n, 'hold', j)})")
        return [*lines, f"{indent}fence_async_shared()", *self._issue(self.bufs.slot_stores, c, indent)]

    def after_piece(self, k: int, indent: str) -> list[str]:
        """Lines after piece ``k``'s body (and its in-place stores)."""
        if not self.per:  # a piece of several chunks (no slot outputs): each leaves now
            every = self.sub_n // self.chunk
            lines = [f"{indent}fence_async_shared()"]
            for c in range(k * every, (k + 1) * every):
                lines += self._issue(self.bufs.consumer_tiles, c, indent)
            if k == self.pieces - 1:
                lines.append(f"{indent}tma.store_wait(pendings=0)  # the buffers are free again")
            return lines
        if (k + 1) % self.per:
            return []
        c = (k + 1) // self.per - 1
        s, t = len(self.bufs.slot_stores), len(self.bufs.consumer_tiles)
        lines = [f"{indent}fence_async_shared()", *self._issue(self.bufs.consumer_tiles, c, indent)]
        if s and c >= 1:  # newer than chunk c - 1's in-place stores: slots c - 2, in-place c
            lines += self._flush(c - 1, t + (s if c >= 2 else 0), indent)
        if c == self.chunks - 1:
            if s:  # newer than the last in-place stores: slots c - 1
                lines += self._flush(c, s if c >= 1 else 0, indent)
            lines.append(f"{indent}tma.store_wait(pendings=0)  # the buffers are free again")
        return lines


def by_piece(count: int, indent: str, body) -> list[str]:
    """An if/elif/else chain on the piece loop's index ``k``: the lines ``body(j)`` for
    piece ``j`` (shared-memory slices take constant offsets)."""
    lines = []
    for j in range(count):
        head = "if k == 0:" if j == 0 else ("else:" if j == count - 1 else f"elif k == {j}:")
        lines += [f"{indent}{head}", *(f"{indent}    {line}" for line in body(j))]
    return lines


def piece_select(names: Names, bufs: Buffers, pieces: list[str], indent: str) -> list[str]:
    """At the top of the piece loop: piece ``k`` of the accumulator and the slices of the
    aux tiles and column vectors it needs."""
    def select(j: int) -> list[str]:
        return [f"pc = {pieces[j]}",
                *(f"{names(n, 'ld')} = {names(n, 'lbc')}.slice({j} * SUB_N, SUB_N, dim=1).load(PL)"
                  for n, _ in bufs.loads),
                *(f"{names(n, 'lv')} = {names(n, 'vbc')}.slice({j} * SUB_N, SUB_N)"
                  f".load(gl.SliceLayout(0, PL))" for n, _, row in bufs.vectors if not row)]

    return by_piece(len(pieces), indent, select)


def piece_stores(names: Names, bufs: Buffers, count: int, indent: str,
                  plan: SlotPlan | None = None) -> list[str]:
    """At the bottom of the piece loop: the values of outputs staged in a load's tile
    buffer go into their slice (and, chunked, leave as their chunk completes)."""
    if not bufs.tile_stores:
        return []
    return by_piece(count, indent, lambda j: [
        *(f"{names(host, 'lbc')}.slice({j} * SUB_N, SUB_N, dim=1).store({names(n, 'st')})"
          for n, host in bufs.tile_stores),
        *(plan.after_piece(j, "") if plan else [])])
