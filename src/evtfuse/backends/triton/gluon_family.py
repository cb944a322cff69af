"""The gluon kernel family: CUTLASS's ping-pong and cooperative warp-specialized kernels
written in Gluon (``gluon_codegen``), for sm_90: its shared-memory plan, configs and launch.

Layer: backends/triton. Invariant: every config it accepts (``spec``) fits the SM's shared
memory (``SMEM_LIMIT``) with its A/B stages, epilogue buffers and Triton's own scratch
(``GluonFamily.fit_stages``); every config it offers has at least ``GLUON_MIN_STAGES``
(ping-pong) or ``COOP_MIN_STAGES`` (cooperative) A/B stages. The module globals its code
reads at call time (``COOP_CHUNKS``, ``_gluon_available``, ``_sms``) are patched here.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import torch

from ...arguments import GemmArguments
from ...errors import Status
from ...ir import Dag, OperandKind, OutputKind
from .family_base import (F64_REFUSAL, FP16_ACC_GLUON, GROUPED_REFUSAL, UINT8_REFUSAL, conditional_store_refusal, SMEM_LIMIT, KernelFamily, TileConfig, _sms, even_tiles, tile_count,
                          tile_work)
from .gluon_buffers import buffers, chunk_columns, slots_fit
from .launch_items import (_batched, _epilogue_items, _gluon_descriptor, _gluon_full_getter,
                           _operand_getters, _reduction_items, _tma_refusal, _vector_view,
                           needs_int64)
from .spec import KernelSpec, atomic_folded, full_outputs, reduce_outputs, staged_vector


def _gluon_available() -> bool:
    try:
        from triton.experimental.gluon.language.nvidia import hopper  # noqa: F401
    except ImportError:
        return False
    return True


def _gated_refusal(args: GemmArguments) -> str | None:
    """What the gluon family does not take of a gated epilogue (``pairs(accum)``): it reads
    B's concatenated halves (``layout="concatenated"``), K-major (B = W.t() of a (2N, K)
    weight, as ``nn.GatedMLP`` keeps it), one batch; the hopper and portable families take
    the rest (``gluon_codegen._Kernel.gated``)."""
    if not getattr(args, "gated", False):
        return None
    if not args.optimized_dag.concatenated:
        return ("gated epilogues in the interleaved layout run in the hopper and portable "
                "families (the gluon family reads B's concatenated halves: docs/gated.md)")
    if args.B.stride(-1) == 1:
        return ("a gated epilogue with B row-major (2N contiguous) runs in the hopper and "
                "portable families (the gluon family loads gate's and up's halves of a "
                "K-major B, W.t() of a (2N, K) weight)")
    if args.L > 1:
        return "batched gated epilogues run in the hopper and portable families"
    return None


def _vector_refusal(args: GemmArguments) -> str | None:
    """Why a staged per-row/per-column operand cannot move by TMA (None: all can)."""
    values = args.epilogue.values
    for spec in args.optimized_dag.used_operands:
        if staged_vector(spec, "gluon"):
            v = _vector_view(values[spec.name], spec.kind)
            if v.stride(0) != 1:
                return (f"{spec.name} is not contiguous (stride {v.stride(0)}); the gluon family "
                        "TMA-loads per-row/per-column operands")
            if v.data_ptr() % 16:
                return (f"{spec.name}'s data pointer is not 16-byte aligned; the gluon family "
                        "TMA-loads per-row/per-column operands")
    return None


def _gluon_split(dag: Dag) -> int:
    """Column pieces of the gluon epilogue's first configs: a 128x128 fp32 tile is 128
    registers per thread of a consumer's 232; heavier epilogues start on narrower pieces
    (offline sm_90 compiles: the BCE loss as written spilled ~500 accesses in halves, none
    in quarters; after ``passes.stable_forms`` neither spills). ``GluonFamily.configs``
    offers the other count too and the tuner keeps the faster (BCE: halves)."""
    return 4 if reduce_outputs(dag) or tile_work(dag) >= 4 else 2


GLUON_TILE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
GLUON_MIN_STAGES = 4  # a shallower A/B ring starves the tensor cores (3 stages: -25%)
GLUON_MAX_STAGES = 5
COOP_MIN_STAGES = 3  # 128x256x64 stages (48 KB) hold twice the MMA work of 128x128x64 ones
COOP_MAX_STAGES = 4
# chunked consumer stores in cooperative tiles without a slot output too (perf_probe
# --coop-chunks; H100: alpha-beta 4096^3 halves 0.1988 -> 0.2015 ms, silu*X 0.2049 ->
# 0.2064, quarters within 1%: off)
COOP_CHUNKS = False


class GluonFamily(KernelFamily):
    """CUTLASS's ping-pong and cooperative structures written in Gluon (see
    ``gluon_codegen``): 128x128 tiles per consumer warpgroup, or 128x256 tiles shared by
    both (``TileConfig.cooperative``)."""

    name = "gluon"
    compile_s = 2.0  # KernelFamily.compile_s
    description = ("warp-specialized ping-pong (Gluon, sm_90): a TMA producer warp, two MMA "
                   "warpgroups on alternate tiles (one's epilogue overlaps the other's "
                   "mainloop) or both on one 128x256 tile (cooperative, '_co'), aux tiles "
                   "TMA-loaded into shared memory ahead of the epilogue")

    def supports(self, args, target):
        if getattr(args, "offs", None) is not None:
            return Status.fail(GROUPED_REFUSAL)
        why = _gated_refusal(args)
        if why:
            return Status.fail(why)
        why = conditional_store_refusal(args)
        if why:
            return Status.fail(why)
        if target.kind != "cuda":
            return Status.fail("Gluon kernels need a Hopper GPU (they do not run under "
                               "Triton's CPU interpreter)")
        if target.cc != 90:
            return Status.fail(f"needs compute capability 9.0 (warpgroup MMA); this GPU is "
                               f"{target.cc}")
        if not _gluon_available():
            return Status.fail("this Triton has no Gluon (triton.experimental.gluon, Triton 3.6+)")
        st = self._common(args, target)
        if not st:
            return st
        if args.A.dtype == torch.uint8:
            return Status.fail(UINT8_REFUSAL)
        if args.A.dtype == torch.float64:
            return Status.fail(F64_REFUSAL)
        if args.accumulator_type == torch.float16:
            return Status.fail(FP16_ACC_GLUON)
        if args.A.dtype not in (torch.float16, torch.bfloat16):
            return Status.fail(f"A and B are {args.A.dtype}; the gluon family takes fp16 and "
                               "bf16 (the hopper family takes the others)")
        dag = args.optimized_dag
        values = args.epilogue.values
        tiles = [(s.name, values[s.name]) for s in dag.used_operands if s.kind is OperandKind.FULL]
        tiles += [(o.name, values[o.name]) for o in full_outputs(dag)]
        for name, t in tiles:
            if t.dtype not in GLUON_TILE_DTYPES:
                return Status.fail(f"{name} is {t.dtype}; the gluon family moves fp16, bf16 and "
                                   "fp32 tiles (the hopper family takes the others)")
        why = _tma_refusal(args) or _vector_refusal(args)
        if why:
            return Status.fail(why)
        if not self.configs(args, target):
            elt = args.A.element_size()
            split = self._split(dag, elt)
            kb = self._epilogue_smem(dag, split, self._direct(dag, split, elt)) // 1024
            return Status.fail(f"the epilogue's tiles need {kb} KB of shared memory, which "
                               f"leaves less than {GLUON_MIN_STAGES} stages for A and B")
        return Status.success()

    BM, BN, BK = 128, 128, 64  # per consumer warpgroup: 128 fp32 accumulator registers
    # setmaxnreg of the consumer and of the producer and memory warps, by warps per
    # consumer (``TileConfig.num_warps``): two consumers and two 1-warp partitions share
    # the SM's 64K registers (4: 2 x 128 x 232 + 2 x 32 x 40; 8: 2 x 256 x 120 + 2 x 32 x 24)
    REGS = {4: (232, 40), 8: (120, 24)}

    @staticmethod
    def _forced_split() -> int:
        """The piece count ``EVTFUSE_GLUON_SPLIT`` forces (0: none)."""
        return int(os.environ.get("EVTFUSE_GLUON_SPLIT", "0"))

    def _split(self, dag: Dag, elt: int) -> int:
        forced = self._forced_split()
        if forced:
            return forced
        split = _gluon_split(dag)
        # narrower pieces also shrink the piece-staged outputs' buffers: take them when
        # that buys A/B stages, or where halves would read the aux tiles through pointers
        # (hundreds of spills: ``_ping_pong`` offers no such halves)
        if split < 4 and (self._stages(dag, 4, elt) > self._stages(dag, split, elt)
                          or self._reads_directly(dag, split, elt)):
            split = 4
        return split

    CO_BN = 256  # cooperative tiles: 128x256, 64 rows per consumer
    # Tile order of the cooperative tiles: bands of 4 row-tiles. At 8192x8192x1024 a wave
    # of 132 such tiles then covers all of B's columns (4 x 33 tiles), so B stays in L2
    # from one wave to the next while the output streams through it; bands of 8 cover half
    # of B per wave and fetch it again (Nsight Compute, identity, 8192x8192x1024: L2 hit
    # rate 93% against 85%, DRAM throughput 30% against 35%). Measured on H100
    # (group_probe.py, guarded timing, ms, GROUP_M 4 / 8): identity 0.1937 / 0.1957,
    # row amax 0.2178 / 0.2183, BCE 0.2836 / 0.2910 at 8192x8192x1024; alpha-beta 0.1882 /
    # 0.1887 and BCE 0.2061 / 0.2072 at 4096^3; alpha-beta 0.0333 / 0.0335, BCE 0.0397 /
    # 0.0402, identity 0.0287 / 0.0286 at 2048^3.
    CO_GROUP_M = 4

    def _epilogue_smem(self, dag: Dag, split: int, direct: tuple[str, ...] = (),
                       coop: bool = False, slots: bool = False) -> int:

        bm, bn = (self.BM // 2, self.CO_BN) if coop else (self.BM, self.BN)
        return buffers(dag, direct, slots).smem_bytes(bm, bn, bn // split)

    # Shared memory Triton allocates beyond the planned buffers and A/B ring: mbarriers (at
    # most ~400 bytes) and, where a reduction runs across a tile's rows (per-column
    # outputs), the scratch through which the warps combine their partial results: up to
    # 8 * warps * columns of a piece bytes (the largest one; two such reductions share it).
    # Measured in offline sm_90 compiles (scripts/smem_probe.py; bytes beyond the estimate,
    # per-column sum or max, warps x piece columns): 4 x 32: 1,176; 4 x 64: 2,200 (and the
    # cooperative 4 x 64: 2,152); 8 x 32: 2,204; 8 x 64: 4,252; per-row and whole-problem
    # reductions 280-364, BCE at 8 warps 408. A flat 2,048 let three configs past the
    # 232,448-byte limit (found by the fuzz test: a launch failed with OutOfResources).
    SMEM_RESERVE = 2048

    def _reserve(self, dag: Dag, split: int, warps: int = 4, coop: bool = False) -> int:
        """Bytes kept free for Triton's own allocations (``SMEM_RESERVE``)."""
        if not any(o.kind is OutputKind.COL for o in reduce_outputs(dag)):
            return self.SMEM_RESERVE
        sub_n = (self.CO_BN if coop else self.BN) // split
        return max(self.SMEM_RESERVE, 512 + 8 * warps * sub_n)

    def _ring(self, dag: Dag, split: int, elt: int, direct: tuple[str, ...],
              coop: bool = False, slots: bool = False, warps: int = 4) -> int:
        stage = (self.BM + (self.CO_BN if coop else self.BN)) * self.BK * elt
        most = COOP_MAX_STAGES if coop else GLUON_MAX_STAGES
        free = (SMEM_LIMIT - self._reserve(dag, split, warps, coop)
                - self._epilogue_smem(dag, split, direct, coop, slots))
        return min(most, free // stage)

    def _config_direct(self, dag: Dag, config: TileConfig, elt: int) -> tuple[str, ...]:
        """The outputs ``config``'s kernel stores from registers (none with store chunks)."""
        if config.slots:
            return ()
        return self._direct(dag, config.epi_split, elt, config.num_stages, config.cooperative)

    def fit_stages(self, args: GemmArguments, config: TileConfig) -> int:
        """The most A/B stages, up to ``config.num_stages``, that ``config``'s kernel fits
        in shared memory with (``with_config`` may ask for 8-warp consumers, which need more
        scratch than the 4-warp config's plan left). ``args`` as the family emits them
        (``runtime.two_pass.judged``: where it runs them in two passes, the first pass's,
        whose workspaces take shared memory too)."""
        return self._fit_stages(args.optimized_dag, args.A.element_size(), config)

    def _fit_stages(self, dag: Dag, elt: int, config: TileConfig) -> int:
        direct = self._config_direct(dag, config, elt)
        return min(config.num_stages,
                   self._ring(dag, config.epi_split, elt, direct, config.cooperative,
                              config.slots, config.num_warps))

    def _chunk(self, dag: Dag, split: int, coop: bool = False) -> int:
        """Columns of the consumer's store chunks where the tile-staged outputs, and every
        output without a buffer of its own, fit them (``gluon_buffers.slots_fit``), else 0."""

        bufs = buffers(dag, slots=True)
        bn = self.CO_BN if coop else self.BN
        return chunk_columns(bufs) if slots_fit(bufs, bn, bn // split) else 0

    def _direct(self, dag: Dag, split: int, elt: int, stages: int | None = None,
                coop: bool = False) -> tuple[str, ...]:
        """Outputs to store from registers instead of staging their pieces in shared
        memory: all piece-staged ones, where that buys A/B stages (measured on H100, alpha-
        beta 8192x8192x1024: 3, 4, 5 stages 0.301, 0.253, 0.237 ms; relu with an aux output
        has C/D tiles and F pieces, 4 stages) and a config's ``stages`` need them; and,
        ping-pong only, where the aux tiles' buffers leave fewer than ``GLUON_MIN_STAGES``,
        every full operand and output (``gluon_buffers.Buffers.direct_loads``)."""

        pieces = tuple(n for n, _ in buffers(dag).piece_stores)
        staged = self._ring(dag, split, elt, (), coop)
        best: tuple[str, ...] = ()
        if pieces and self._ring(dag, split, elt, pieces, coop) > staged and (
                stages is None or stages > staged):
            best = pieces
        if coop or self._ring(dag, split, elt, best, coop) >= GLUON_MIN_STAGES:
            return best
        # the aux tiles themselves leave too few stages (two per consumer: the MLP block's
        # backward reads gate and up, 128 KB): every full tile read and written by the
        # consumer from registers, its loads' latency under the other consumer's mainloop
        loads = tuple(s.name for s in dag.used_operands if s.kind is OperandKind.FULL)
        for every in (loads, loads + tuple(o.name for o in full_outputs(dag))):
            if self._ring(dag, split, elt, every, coop) >= GLUON_MIN_STAGES:
                return every
        return best

    def _reads_directly(self, dag: Dag, split: int, elt: int) -> bool:
        """Whether ``split``'s ping-pong kernel reads full operands through pointers
        (``_direct``): offline sm_90, the MLP block's backward (gate and up read, three
        outputs) spills 485 local accesses in halves, 21 in quarters with its outputs
        staged by piece, 34 in eighths with everything through pointers."""
        fulls = {s.name for s in dag.used_operands if s.kind is OperandKind.FULL}
        return bool(fulls & set(self._direct(dag, split, elt)))

    def _stages(self, dag: Dag, split: int, elt: int, coop: bool = False) -> int:
        return self._ring(dag, split, elt, self._direct(dag, split, elt, coop=coop), coop)

    @staticmethod
    def _coop_refusal(args: GemmArguments) -> str | None:
        """Why the cooperative tiles do not fit ``args`` (None: they do)."""
        if args.A.stride(-1) != 1:
            return "A is column-major (a consumer takes its rows of the stage by slicing A's)"
        for o in reduce_outputs(args.optimized_dag):
            if o.kind is OutputKind.COL and not atomic_folded(o):
                return (f"{o.name} is a per-column {o.node.op}: one partial per tile and column, "
                        "and a cooperative tile's two consumers each hold half the rows")
            if o.kind is OutputKind.SCALAR and o.batched:
                # (both consumers stored to the tile's one slot: the last store won, and a
                # batch's result lost half its rows; Triton 3.9 showed it at 19 rows a batch)
                return (f"{o.name} is a per-batch {o.node.op}: one partial per tile, and a "
                        "cooperative tile's two consumers each hold half the rows")
        return None

    @staticmethod
    def _coop_splits(dag: Dag) -> tuple[int, ...]:
        """Column pieces of the cooperative configs: quarters (64x64 per consumer), and
        halves too for light epilogues (``_gluon_split``), where they can win (alpha-beta
        2048^3 on H100: 0.0335 ms against 0.0351); a heavy epilogue in halves spills and
        compiles for minutes (the GPU tier's every-op epilogue: 38,485 local accesses,
        124 s offline)."""
        return (4, 2) if _gluon_split(dag) == 2 else (4,)

    def _coop_configs(self, args: GemmArguments) -> list[TileConfig]:
        """128x256 tiles, both consumers on each (CUTLASS's cooperative kernel): the
        mainloop reads A and B as the hopper family's 128x256 tiles do (a third less L2
        traffic than 128x128 per consumer), and the aux tiles still arrive by TMA during
        it, which the hopper family cannot do; no epilogue overlaps a mainloop, but a
        problem of about one wave of tiles has no next mainloop to overlap anyway."""
        if self._coop_refusal(args):
            return []
        dag, elt = args.optimized_dag, args.A.element_size()
        out = []
        for split in self._coop_splits(dag):
            slots, stages = self._slots_and_stages(dag, split, elt, coop=True)
            if stages >= COOP_MIN_STAGES:
                out.append(TileConfig(self.BM, self.CO_BN, self.BK, self.CO_GROUP_M, 4, stages,
                                      epi_split=split, cooperative=True, slots=slots))
        return out

    def _slotted(self, dag: Dag, split: int, elt: int, coop: bool = False) -> bool:
        """Whether ``split``'s configs have the consumer store the tile-staged outputs by
        chunk, with the register-stored outputs staged in their chunks after them
        (``TileConfig.slots``): ping-pong tiles wherever the chunks fit, cooperative ones
        where an output would otherwise go from registers (``COOP_CHUNKS``). Measured on
        H100 (perf_probe): relu with an aux output 8192x8192x1024 0.2775 -> 0.2622 ms,
        2048^3 0.0400 -> 0.0351, 64x8192x8192 0.0708 -> 0.0701, cooperative 4096^3 0.207
        (its best kernel now); chunked stores alone: alpha-beta 8192x8192x1024 halves
        0.2436/0.2392 -> 0.2374/0.2363 (GROUP_M 8/4), quarters (in the runtime piece loop)
        0.2358 -> 0.2314, 4096^3 halves 0.2076 -> 0.2019; silu*X 8192x8192x1024 halves
        0.2361 -> 0.2313, quarters 0.2352 -> 0.2306."""
        if not self._chunk(dag, split, coop):
            return False
        return bool(self._direct(dag, split, elt, coop=coop)) or not coop or COOP_CHUNKS

    def _slots_and_stages(self, dag: Dag, split: int, elt: int, coop: bool = False
                          ) -> tuple[bool, int]:
        """Whether ``split``'s configs use store chunks (``_slotted``), and the A/B stages
        that leaves (slot outputs take no shared memory, register-stored ones neither)."""
        if self._slotted(dag, split, elt, coop):
            stages = self._ring(dag, split, elt, (), coop=coop, slots=True)
            if coop or stages >= GLUON_MIN_STAGES:
                return True, stages
        return False, self._stages(dag, split, elt, coop=coop)

    # Tile orders of the ping-pong configs: bands of 8 and 4 row-tiles, or of 8 and 16
    # where the epilogue moves HEAVY_TILES or more full tiles (aux loads and stored outputs).
    # Measured on H100 (group_probe.py, guarded timing, ms, GROUP_M 4 / 8 / 16): relu with
    # an aux output (C in, D and F out) 8192x8192x1024 0.2743 / 0.2589 / **0.2530** (and
    # 0.2741 / 0.2580 / 0.2521 on another machine), 16384x4096x4096 0.8162 / **0.7963** /
    # 0.9264, 4096^3 0.2127 / **0.2065** / 0.2325: bands of 4 never lead there. With one or
    # two tiles bands of 16 lose (alpha-beta 8192x8192x1024 0.2312 / 0.2317 / 0.2518,
    # silu*X 0.2253 / 0.2232 / 0.2476, BCE 0.2371 / 0.2456 / 0.2509, identity 0.1982 /
    # 0.1986 / 0.2048). Under Nsight Compute bands of 16 re-read A and B from DRAM less
    # (alpha-beta: 285 -> 228 MB read); the three-tile epilogue, the heaviest on DRAM, is
    # the one that gains from it.
    PP_GROUPS, HEAVY_PP_GROUPS, HEAVY_TILES = (8, 4), (8, 16), 3

    def _pp_groups(self, dag: Dag) -> tuple[int, ...]:
        """GROUP_M values of the ping-pong configs for ``dag`` (``PP_GROUPS``)."""
        loads = sum(1 for s in dag.used_operands if s.kind is OperandKind.FULL)
        tiles = loads + len(full_outputs(dag))
        return self.HEAVY_PP_GROUPS if tiles >= self.HEAVY_TILES else self.PP_GROUPS

    def _ping_pong(self, dag: Dag, split: int, elt: int) -> list[TileConfig]:
        """The ping-pong configs of ``split`` column pieces (GROUP_M ``_pp_groups``), none
        where fewer than ``GLUON_MIN_STAGES`` A/B stages fit."""
        slots, stages = self._slots_and_stages(dag, split, elt)
        if stages < GLUON_MIN_STAGES:
            return []
        if split < 4 and not slots and self._reads_directly(dag, split, elt):
            return []  # aux tiles read through pointers in halves: hundreds of spills
        # measured (gluon_probe.py, alpha-beta 8192x8192x1024 on H100): 5 stages,
        # GROUP_M 8 best (0.239 ms); GROUP_M moves it by +-5%, non-monotonically
        return [TileConfig(self.BM, self.BN, self.BK, g, 4, stages, epi_split=split, slots=slots)
                for g in self._pp_groups(dag)]

    # Consumers of two warpgroups each (``TileConfig.num_warps`` 8: 64 rows and 64
    # accumulator registers per thread) for epilogues of WIDE_WORK or more elementwise ops
    # per element (``tile_work``) that store no full tile (their results are reductions):
    # one warpgroup's epilogue then issues more instructions than the other's mainloop
    # takes (BCE 8192x8192x1024: ~26 per element on one warp per scheduler), and eight
    # warps issue it in half the time. Measured on H100 (wide_consumer_probe.py, guarded
    # timing, ms, 4 / 8 warps, halves; quarters): BCE (7 ops, a sum) 8192x8192x1024 0.2447 /
    # **0.2276**; 0.2676 / 0.2410, 16384x4096x4096 0.8853 / **0.7919**, 4096^3 0.2067 /
    # **0.2046**, 2048^3 0.0387 / 0.0369; 0.0371 / **0.0368**. Epilogues that store a tile
    # tie or lose, heavy ones too (8 ops, tanh, sigmoid and exp, D stored: 0.2047 / 0.2052
    # at 8192x8192x1024, 4096^3 quarters 0.1935 / 0.1948; 6 ops with gelu_tanh: quarters
    # 0.2100 / 0.2151; relu with an aux output, alpha-beta, silu*X, gelu_tanh + bias lose
    # 1-5%), and row amax / logsumexp tie or lose at 4096^3 and larger. Offered first,
    # halves before quarters; the tuner times the 4-warp configs too.
    WIDE_WORK = 6

    def _wide(self, dag: Dag, elt: int, ping_pong: list[TileConfig]) -> list[TileConfig]:
        """The two-warpgroup consumers (``WIDE_WORK``) of the first of ``ping_pong``'s
        configs of each piece count, halves first, with the stages that fit at 8 warps;
        none for other epilogues."""
        if tile_work(dag) < self.WIDE_WORK or full_outputs(dag):
            return []
        first: dict[int, TileConfig] = {}
        for c in ping_pong:
            if c.epi_split in first:
                continue
            wide = replace(c, num_warps=8)
            stages = self._fit_stages(dag, elt, wide)
            if stages >= GLUON_MIN_STAGES:
                first[c.epi_split] = replace(wide, num_stages=stages)
        return [first[k] for k in sorted(first)]

    def _gated_configs(self, dag: Dag, elt: int) -> list[TileConfig]:
        """A gated epilogue's configs: ping-pong tiles of 128 of B's columns (64 output
        columns: gate's 64 and up's 64 in one stage, one 128x128 accumulator per
        consumer), no store chunks; both piece counts."""
        split = self._split(dag, elt)
        out = []
        for sp in (split, 2 if split == 4 else 4):
            stages = self._stages(dag, sp, elt)
            if stages >= GLUON_MIN_STAGES:
                out += [TileConfig(self.BM, self.BN, self.BK, g, 4, stages, epi_split=sp)
                        for g in self._pp_groups(dag)]
        return out

    def configs(self, args, target):
        dag = args.optimized_dag
        elt = args.A.element_size()
        if getattr(args, "gated", False):
            return self._gated_configs(dag, elt)
        split = self._split(dag, elt)
        out = self._ping_pong(dag, split, elt)
        if not out:
            return []
        # the other piece count too, for the tuner: which wins depends on the epilogue
        # (the BCE loss: halves 0.263 ms, quarters 0.274 at 8192x8192x1024, perf_probe)
        if not self._forced_split():
            out += self._ping_pong(dag, 2 if split == 4 else 4, elt)
            if self._reads_directly(dag, 8, elt):  # eighths: fewer pointers live at once
                out += self._ping_pong(dag, 8, elt)
        # where outputs go from registers for a fifth stage (and do not fit slots), also
        # quarters with every output staged (four stages): TMA stores and the epilogue's
        # runtime piece loop (relu with an aux output, H100: 2048^3 0.0396 -> 0.0377 ms;
        # 8192x8192x1024 0.277 -> 0.285, where the tuner keeps the fifth stage)
        four = self._ring(dag, 4, elt, ())
        if self._direct(dag, 4, elt) and not self._slotted(dag, 4, elt) \
                and four >= GLUON_MIN_STAGES and self._forced_split() in (0, 4):
            out.append(TileConfig(self.BM, self.BN, self.BK, 8, 4, four, epi_split=4))
        return self._wide(dag, elt, out) + out[:2] + self._coop_configs(args) + out[2:]

    def spec(self, args, config, target):
        dag = args.optimized_dag
        if config.slots:
            chunk, direct = self._chunk(dag, config.epi_split, config.cooperative), ()
            if not chunk:
                raise ValueError(f"config {config.name}: this epilogue's outputs do not fit "
                                 "store chunks")
        else:
            chunk = 0
            direct = self._direct(dag, config.epi_split, args.A.element_size(),
                                  config.num_stages, config.cooperative)
        if config.num_warps not in self.REGS or (config.cooperative and config.num_warps != 4):
            raise ValueError(f"config {config.name}: gluon consumers are 4 or 8 warps "
                             "(cooperative tiles: 4)")
        fits = self.fit_stages(args, config)
        if fits < config.num_stages:
            raise ValueError(f"config {config.name}: {config.num_stages} A/B stages do not fit "
                             f"shared memory with this epilogue ({SMEM_LIMIT} bytes on sm_90, "
                             f"buffers and scratch included); at most {fits} do")
        return KernelSpec("gluon", dag, bool(args.A.stride(-1) != 1),
                          bool(args.B.stride(-1) != 1), _batched(args.A), _batched(args.B),
                          config.epi_split, True,
                          direct=direct, coop=config.cooperative, chunk=chunk,
                          tile_n=config.block_n if chunk else 0, warps=config.num_warps,
                          int64=needs_int64(args, self.name, config, direct), runtime_m=True)

    def plan(self, args, dag, config, target):
        spec = self.spec(args, config, target)
        bm, bn, bk = config.block_m, config.block_n, config.block_k
        # gated: the kernel's BLOCK_N, its epilogue's tiles and its outputs' are the output's
        # columns, half the tile's B columns (``gluon_codegen._Kernel.gated``)
        out_config = replace(config, block_n=bn // 2) if getattr(args, "gated", False) else config
        items: list[Any] = [*_operand_getters(spec, config, _gluon_descriptor), args.M, args.N,
                            args.K, args.L]
        items += _epilogue_items(args, dag, "gluon", out_config,
                                 descriptor=_gluon_full_getter(dag, spec.a_batched or spec.b_batched,
                                                               spec.direct),
                                 direct=spec.direct)
        tiles = tile_count(args, config)
        # one whole-output partial per consumer warpgroup, two per program
        red_items, post = _reduction_items(args, dag, config, "gluon", target,
                                           programs=2 * min(_sms(target), tiles))
        items += red_items
        consumer_regs, producer_regs = self.REGS[config.num_warps]
        consts = dict(BLOCK_M=bm, BLOCK_N=out_config.block_n, BLOCK_K=bk, GROUP_M=config.group_m,
                      NUM_STAGES=config.num_stages, EVEN_MN=even_tiles(args, config),
                      CONSUMER_REGS=consumer_regs, PRODUCER_REGS=producer_regs,
                      num_warps=config.num_warps)
        return items, consts, (min(_sms(target), tiles),), post
