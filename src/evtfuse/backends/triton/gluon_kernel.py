"""What every step of a Gluon kernel's emitter reads (``gluon_codegen``, ``gluon_memory``):
``GluonKernel``, one kernel being written (its spec, epilogue buffers and emitter, the
argument lists its partitions pass each other), and the two choices of when the
epilogue-memory warp first loads (``MEM_FIRST``, ``COOP_GO``).

Layer: backends/triton, below ``gluon_memory`` and ``gluon_codegen``.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import gluon_schedule as schedule
from .epilogue_emit import EpilogueEmitter
from .gluon_buffers import Buffers, buffers
from .gluon_schedule import SIZES
from .names import Names
from .spec import KernelSpec, epilogue_params

# when the epilogue-memory warp loads the aux tiles of a program's first two tiles: "eager"
# both at the start; "second" the second tile's once the first consumer's first mainloop
# is issued (a one-shot barrier, ``c_go``), so that it does not compete with the A/B ring's
# first fill and the first tile's aux loads (H100, 2048^3, C tile loaded: 0.0362 ->
# 0.0339 ms; also waiting for the ring's first fill before the first tile's was no better)
MEM_FIRST = "second"
# cooperative tiles: the memory warp loads the first tile's aux halves once consumer 0 has
# waited for the ring's first fill (its k-step min(k_tiles, NUM_STAGES) - 1), so that they
# do not compete with it; False: at once (measured with a probe since removed)
COOP_GO = True


@dataclass
class GluonKernel:
    """One Gluon kernel being written: its spec, epilogue buffers and emitter, and the
    argument lists its partitions pass each other (what every step of the emitter reads)."""

    spec: KernelSpec
    bufs: Buffers
    epi: EpilogueEmitter
    roles: list  # the epilogue's (parameter, role) pairs (``epilogue_params``)

    @classmethod
    def of(cls, spec: KernelSpec) -> "GluonKernel":
        """The kernel of ``spec``: its buffers (``gluon_buffers``) and epilogue parameters."""
        batch = spec.a_batched or spec.b_batched
        bufs = buffers(spec.dag, spec.direct, slots=bool(spec.chunk), batch=batch)
        roles = epilogue_params(spec.names, spec.dag, "gluon", spec.direct)
        return cls(spec, bufs, EpilogueEmitter(spec), roles)

    @property
    def names(self) -> Names:
        """The kernel's namer."""
        return self.spec.names

    @property
    def gated(self) -> bool:
        """A gated epilogue over B's concatenated halves (``pairs(accum,
        layout="concatenated")``): BLOCK_N is the output's columns of a tile, and each A/B
        stage holds gate's BLOCK_N rows of B (K-major) and then up's, so one wgmma gives a
        (EPI_M, 2 * BLOCK_N) accumulator, gate's columns then up's
        (``GluonFamily.supports`` takes no other gated problem)."""
        return self.spec.dag.gated

    @property
    def acc_n(self) -> str:
        """The accumulator's columns (a gated tile's: gate's and up's)."""
        return "2 * BLOCK_N" if self.gated else "BLOCK_N"

    @property
    def coop(self) -> bool:
        """Cooperative tiles (``KernelSpec.coop``), else ping-pong."""
        return self.spec.coop

    @property
    def batch(self) -> bool:
        """L > 1 (``Buffers.batch``)."""
        return self.spec.a_batched or self.spec.b_batched

    @property
    def bid(self) -> str:
        """The batch's place in a tile's coordinates ("": one batch)."""
        return "bid, " if self.batch else ""

    @property
    def program(self) -> list[str]:
        """Every partition's first lines: the persistent schedule (``program``)."""
        return schedule.program(self.batch)

    @property
    def params(self) -> list[str]:
        """The epilogue's kernel parameters."""
        return [p for p, _ in self.roles]

    @property
    def piece_descs(self) -> set:
        """Descriptors of outputs the consumers store themselves: loads' and whole-tile
        stores' descriptors go to the epilogue-memory partition, these to the consumers."""
        return {self.names(n, "desc") for n, _ in
                self.bufs.piece_stores + self.bufs.slot_stores + self.bufs.consumer_tiles}

    @property
    def descs(self) -> list[str]:
        """The epilogue-memory partition's descriptors."""
        return [p for p, role in self.roles if role == "desc" and p not in self.piece_descs]

    @property
    def consumer_params(self) -> list[str]:
        """The epilogue parameters the consumers take."""
        return [p for p, role in self.roles if role != "desc" or p in self.piece_descs]

    @property
    def tile_bufs(self) -> list[tuple[str, str]]:
        """The buffers of tiles and vectors, each with its role (the consumer's view of
        each: roles "lbc", "vbc")."""
        return [(n, "lb") for n, _ in self.bufs.loads] + \
            [(n, "vb") for n, _, _ in self.bufs.vectors]

    @property
    def tile_buf_names(self) -> list[str]:
        """The names of ``tile_bufs``."""
        return [self.names(n, role) for n, role in self.tile_bufs]

    @property
    def piece_bufs(self) -> list[str]:
        """The piece buffers of outputs staged per column piece (role "ob")."""
        return [self.names(n, "ob") for n, _ in self.bufs.piece_stores]

    @property
    def load_names(self) -> list[str]:
        """The full aux operands the memory warp loads."""
        return [n for n, _ in self.bufs.loads]

    @property
    def vec_names(self) -> list[tuple[str, bool]]:
        """The staged per-row/per-column operands, each with whether it is per-row."""
        return [(n, row) for n, _, row in self.bufs.vectors]

    @property
    def mem(self) -> str:
        """The memory warp's own arguments (each followed by ", ")."""
        return "".join(f"{a}, " for a in self.descs + self.tile_buf_names)

    @property
    def staged(self) -> bool:
        """Whether the memory warp's first loads wait on the one-shot barrier ``c_go``
        (``MEM_FIRST``, ``COOP_GO``)."""
        return bool(self.load_names or self.vec_names) and \
            (COOP_GO if self.coop else MEM_FIRST == "second")

    @property
    def go(self) -> str:
        """The memory warp's ``c_go`` argument, where it has one."""
        return "c_go, " if self.staged else ""

    @property
    def cons_args(self) -> str:
        """The consumers' arguments before the sizes."""
        return ", ".join(["a_bufs", "b_bufs", "ready", "empty", "c_ready", "d_ready", "order"]
                         + (["c_go"] if self.staged else []) + self.tile_buf_names
                         + self.piece_bufs + self.consumer_params)

    @property
    def call(self) -> str:
        """The consumers' arguments, sizes included."""
        return f"{self.cons_args}, {SIZES}"

    @property
    def blocks(self) -> str:
        """The block sizes _ef_mma_step needs to view a batched operand's stages in 2-D."""
        return ", BLOCK_M, BLOCK_N, BLOCK_K" if self.batch else ""
