"""The hopper kernel family: persistent programs, tensor-descriptor (TMA) loads and stores,
grouped tile order, the epilogue per sub-tile (sm_90+).

Layer: backends/triton. Invariant: a config it offers a GPU fits shared memory by its estimate
(``HopperFamily._smem`` within ``SMEM_BUDGET``), and it supports only problems whose A, B
and full aux tiles can move by TMA (``launch_items._tma_refusal``). ``_sms`` is read from
this module's globals at call time (a test faking the SM count patches it here).

Grouped GEMMs over M (``grouped_gemm``, docs/grouped.md) run in the same kernel: the
programs' loop runs over every group's tiles, each tile's group found on the device in a
table of ``offs`` the program reads once (``group_emit``); A moves through one descriptor
over (T, K), B through a 3-D one over (G, K, N) (or its K-major transpose), and the full
outputs leave through pointers masked to the group's rows (``KernelSpec.direct``). Gated
epilogues (``pairs(accum)``, both layouts) run dense and grouped: a tile spans BLOCK_N of
B's 2N columns and BLOCK_N // 2 of the output's (the concatenated layout as two dots of
BLOCK_N // 2 columns each, from gate's and up's halves of B).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from ...arguments import GemmArguments
from ...errors import Status
from ...ir import OperandKind, OutputKind
from ...sizes import size_class
from .family_base import (F64_REFUSAL, K_GROUPED_REFUSAL, UINT8_REFUSAL, conditional_store_refusal, _INT_DTYPES, INTERPRETER, SMEM_BUDGET, KernelFamily, TileConfig, _sms,
                          even_tiles, fill_rank, fp8_promote, gated_refusal, grouped_over_m,
                          grouped_tile_bound, tile_count)
from .launch_items import (_batched, _epilogue_items, _gated_descriptor_getter, _get_offs,
                           _make_descriptor, _operand_getters, _reduction_items, _tma_refusal,
                           needs_int64)
from .spec import KernelSpec, full_outputs, reduce_outputs


# Epilogues of HEAVY_TILES or more full tiles (operands loaded and outputs stored): the
# sub-tiles are narrowed (EPI_SPLIT doubled, to 32 columns at least) until the accumulator
# and the tiles in flight, ``_epilogue_registers``, fit EPILOGUE_REGISTERS a thread.
# Offline sm_90 compiles of the MoE dX epilogue (two tiles in, three out;
# tests/test_grouped_hopper_cpu.py), registers a thread by that count against local-memory
# accesses: 160, 192 and 192 none; 256, 320 and 384 273-1409 (128x256 tiles in 8 warps in
# quarters 276, in eighths none). Lighter epilogues keep the measured configs.
HEAVY_TILES = 4
EPILOGUE_REGISTERS = 224

GROUPED_REDUCTIONS_REFUSAL = ("grouped GEMMs with per-column, per-group or whole-output "
                              "reductions run in the portable family only (grouped_reduce's "
                              "combines of a group's row tiles, and its identity for empty "
                              "groups, need the portable grid's scan of offs); per-row ones "
                              "run here too")


class HopperFamily(KernelFamily):
    name = "hopper"
    compile_s = 1.4  # KernelFamily.compile_s
    description = ("persistent, tensor-descriptor (TMA) loads and stores, grouped tile order, "
                   "epilogue per sub-tile (sm_90+)")

    def supports(self, args, target):
        grouped = grouped_over_m(args)
        if getattr(args, "offs", None) is not None and not grouped:
            return Status.fail(K_GROUPED_REFUSAL)
        if grouped and any(o.kind is not OutputKind.ROW
                           for o in reduce_outputs(args.optimized_dag)):
            return Status.fail(GROUPED_REDUCTIONS_REFUSAL)
        why = conditional_store_refusal(args) or gated_refusal(args)
        if why:
            return Status.fail(why)
        st = self._common(args, target)
        if not st:
            return st
        if args.A.dtype == torch.uint8:
            return Status.fail(UINT8_REFUSAL)
        if args.A.dtype == torch.float64:
            return Status.fail(F64_REFUSAL)
        if target.kind == "cuda" and target.cc < 90:
            return Status.fail(f"needs compute capability 9.0+ (TMA); this GPU is {target.cc}")
        if target.kind == INTERPRETER and target.cc < 90:
            return Status.fail("TMA kernels run under the interpreter only when asked for "
                               "with cc=90")
        why = _tma_refusal(args, outputs=not grouped)  # grouped: outputs through pointers
        if why:
            return Status.fail(why)
        return Status.success()

    def configs(self, args, target):
        if target.kind == INTERPRETER:
            return [TileConfig(32, 32, 16, 2, 4, 2, epi_split=2, prefetch=True),
                    TileConfig(16, 32, 16, 2, 4, 2, epi_split=1)]
        elt = args.A.element_size()
        tile_bytes = self._tile_bytes(args)
        bk = {4: 32, 2: 64, 1: 128}[elt]
        # measured on H100 bf16 (perf_probe.py, benchmarks/HISTORY.md): 128x256x64 with
        # 3 stages and a 2-way split epilogue wins at 4096^3..8192^3, with or without aux
        # loads; aux prefetch into registers and 2 CTAs/SM were slower everywhere
        cands = [
            TileConfig(128, 256, bk, 8, 8, 3, epi_split=2),
            TileConfig(128, 256, bk, 16, 8, 3, epi_split=2),
            TileConfig(128, 256, bk, 8, 8, 3, epi_split=2, flatten=False),
            TileConfig(128, 256, bk, 16, 8, 4, epi_split=4),
            TileConfig(256, 128, bk, 8, 8, 3, epi_split=2),
            TileConfig(128, 128, bk, 8, 8, 4, epi_split=1),
            TileConfig(128, 128, bk, 8, 4, 4, epi_split=2),
            TileConfig(64, 256, bk, 8, 4, 4, epi_split=2),
            TileConfig(128, 64, bk, 8, 4, 5, epi_split=1),
            TileConfig(64, 128, bk, 8, 4, 5, epi_split=1),
            TileConfig(64, 64, bk, 8, 4, 6, epi_split=1),
            # small M (64x8192x8192: B's read is the whole cost): twice the k-step per
            # barrier wait (splitk_probe.py: 64x64x128 0.0584 ms, cuBLAS 0.0583)
            TileConfig(64, 64, 2 * bk, 8, 4, 5, epi_split=1),
        ]
        tiles_in_flight = _full_tiles(args)
        # (a gated epilogue's sub-tiles are halves of these already: not narrowed further)
        heavy = tiles_in_flight if tiles_in_flight >= HEAVY_TILES \
            and not args.optimized_dag.gated else 0
        fits = []
        for c in cands:
            # wide or many outputs: split the epilogue further rather than overflow shared
            # memory (each stored sub-tile is staged there for its TMA store)
            while self._smem(c, elt, tile_bytes) > SMEM_BUDGET and c.epi_split < 4 \
                    and c.block_n // (c.epi_split * 2) >= 32:
                c = replace(c, epi_split=c.epi_split * 2)
            while heavy and _epilogue_registers(c, heavy) > EPILOGUE_REGISTERS \
                    and c.block_n // (c.epi_split * 2) >= 32:
                c = replace(c, epi_split=c.epi_split * 2)
            if self._smem(c, elt, tile_bytes) <= SMEM_BUDGET and c not in fits:
                fits.append(c)
        tiles = lambda c: tile_count(args, c)
        sms = _sms(target)
        # small problems: prefer tiles that still fill the GPU (nine in ten SMs: 128 tiles
        # of 128x256 at 2048^3 on 132 SMs do; relu aux there 0.035 ms, 128x128 0.039)
        # promoted fp8 accumulation (a second accumulator per tile): 256x128 tiles led at
        # 4096^3 and 8192^3 (fp8 scale+amax 0.138 / 1.10-1.15 ms; the 128x256 tiles first
        # otherwise took 0.241 / 1.86: fp8_accum_probe.py, benchmarks/HISTORY.md, nineteenth session)
        promote = fp8_promote(args, target)
        fits.sort(key=lambda c: (fill_rank(args, c, sms), promote and c.block_m != 256))
        # aux tiles asked into L2 over the mainloop (codegen._l2_spread_lines): in one wave
        # every program reads its C tile at the same moment after the last k-step
        small = TileConfig(128, 128, bk, 8, 4, 3, epi_split=2, flatten=False, ctas_per_sm=2,
                           l2_spread=_l2_spread_ok(args))
        if sms <= tiles(small) <= 2 * sms and not grouped_over_m(args) and self._smem(small, elt, tile_bytes) <= SMEM_BUDGET:
            # one wave at two programs per SM, tiles taken in launch order (no flattened
            # loop): relu aux at 2048^3 0.0344 ms against 0.0352 for 128x256 (perf_probe)
            fits.insert(1, small)
        if grouped_over_m(args) and reduce_outputs(args.optimized_dag):
            # grouped_reduce's combine is a loop inside the tile loop: Triton 3.6.0's
            # TritonGPUFuseNestedLoops fails on it in a flattened loop (offline sm_90 compile,
            # every flattened config; 3.9.0 compiles them), so these tiles loop unflattened
            fits = list(dict.fromkeys(replace(c, flatten=False) for c in fits))
        return fits

    @staticmethod
    def _tile_bytes(args: GemmArguments) -> tuple[int, int]:
        """Bytes per element of an epilogue sub-tile that go through shared memory: the
        full aux tiles loaded (TMA loads land there) and the outputs stored (staged there
        for their TMA stores); ``_smem`` says how much of it is live at once."""
        dag, values = args.optimized_dag, args.epilogue.values
        loads = sum(values[s.name].element_size() for s in dag.used_operands
                    if s.kind is OperandKind.FULL)
        stores = sum(values[o.name].element_size() for o in full_outputs(dag))
        return loads, stores

    @staticmethod
    def _smem(c: TileConfig, elt: int, tile_bytes: tuple[int, int]) -> int:
        """The A/B ring plus the epilogue's buffers: every loaded and stored sub-tile in a
        flattened persistent loop (the ring stays live through the epilogue), the stored
        ones only otherwise (Triton reuses the ring's space for the loads). An upper bound
        of offline sm_90 compiles, 128x256 tiles in halves, bytes per element beyond the
        ring, flattened / not: alpha-beta (C in, D out) 4 / 2, relu with an aux output (C
        in, D and F out) 4 / 2, BCE (C in) 2 / 0, an fp32 C with an fp16 D 6 / 2, D and the
        fp32 accumulator stored 6; two bf16 loads with bf16 and fp32 stores, in quarters, 8
        / 6. Counting the stored outputs alone, the plan put the fp32 C case at 180 KB
        (247 KB compiled) and the accumulator case at 211 KB (246 KB): launches failed
        (found by the call-sequence fuzz on the GPU)."""
        loads, stores = tile_bytes
        main = c.num_stages * (c.block_m + c.block_n) * c.block_k * elt
        per_element = loads + stores if c.flatten else stores
        epi = c.block_m * (c.block_n // c.epi_split) * max(per_element, 2)
        return main + epi

    def spec(self, args, config, target):
        A, B = args.A, args.B
        a_trans = bool(A.stride(-1) != 1)
        b_trans = bool(B.stride(-1) != 1)
        a_batched, b_batched = _batched(A), _batched(B)
        grouped = grouped_over_m(args)
        # gated: the prefetched sub-tiles would be the output's (not spelled yet)
        prefetch = config.prefetch and not getattr(args, "gated", False) and any(
            s.kind is OperandKind.FULL for s in args.optimized_dag.used_operands)
        l2 = config.l2_spread and _l2_spread_ok(args) and target.kind != INTERPRETER \
            and not grouped and not getattr(args, "gated", False)
        # two programs per SM: registers to spare for every piece's vectors at once (the
        # 128x256 eight-warp tiles, at 167 registers, lose 1.5-3% to the extra 25)
        early = config.ctas_per_sm == 2 and any(
            s.kind in (OperandKind.PER_ROW, OperandKind.PER_COL)
            for s in args.optimized_dag.used_operands)
        direct = _pointer_stores(args)
        return KernelSpec("hopper", args.optimized_dag, a_trans, b_trans, a_batched,
                          b_batched, config.epi_split, target.kind != INTERPRETER, prefetch,
                          int_acc=args.A.dtype in _INT_DTYPES, l2_spread=l2,
                          acc16=args.accumulator_type == torch.float16,
                          early_vectors=early, fp8_promote=fp8_promote(args, target),
                          int64=needs_int64(args, self.name, config, direct), runtime_m=True,
                          grouped=grouped, direct=direct)

    def plan(self, args, dag, config, target):
        spec = self.spec(args, config, target)
        if spec.grouped:
            return self._grouped_plan(args, dag, config, target, spec)
        bm, bn, bk = config.block_m, config.block_n, config.block_k
        items: list[Any] = [*_operand_getters(spec, config, _make_descriptor), args.M, args.N,
                            args.K, args.L]
        items += _epilogue_items(args, dag, "hopper", config, l2_spread=spec.l2_spread,
                                 descriptor=_gated_descriptor_getter
                                 if getattr(args, "gated", False) else None)
        tiles = tile_count(args, config)
        cap = _sms(target) * config.ctas_per_sm
        if dag.reductions:  # their per-program partials: one per program launched
            num_sms = programs = min(cap, tiles)
            one_wave = num_sms == tiles
        else:
            # constant over M's size class, so that every M of the class runs one compiled
            # kernel: the programs of the class's largest M, the launch's no more than the
            # tiles (each program's first tile is its own; in one wave its only one)
            widest = tile_count(args, config, size_class(args.M))
            num_sms, one_wave = min(cap, widest), widest <= cap
            programs = min(num_sms, tiles)
        red_items, post = _reduction_items(args, dag, config, "hopper", target, programs=num_sms)
        items += red_items
        consts = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=config.group_m,
                      INPUT_PRECISION=self.input_precision(args, target), NUM_SMS=num_sms,
                      FLATTEN=config.flatten, WARP_SPECIALIZE=config.warp_specialize,
                      ONE_ROW=args.M <= bm and args.L == 1, ONE_WAVE=one_wave,
                      EVEN_MN=even_tiles(args, config))
        if target.kind != INTERPRETER:
            consts.update(num_warps=config.num_warps, num_stages=config.num_stages)
        return items, consts, (programs,), post

    def _grouped_plan(self, args, dag, config, target, spec):
        """The launch plan of a grouped GEMM over M: ``offs`` after the sizes, the outputs
        through pointers, and as many programs as an upper bound of the tiles allows
        (``grouped_tile_bound``: the groups' sizes stay on the device); NUM_SMS, the
        loop's stride, is constant over M's size class (one compiled kernel for every T
        of the class). Per-row reductions: ``grouped_reduce``'s workspaces and tickets
        (``supports`` refuses the others)."""
        gated = getattr(args, "gated", False)
        items: list[Any] = [*_operand_getters(spec, config, _make_descriptor), args.M, args.N,
                            args.K, args.L, _get_offs]
        items += _epilogue_items(args, dag, "hopper", config, direct=spec.direct,
                                 descriptor=_gated_descriptor_getter if gated else None)
        items += _reduction_items(args, dag, config, "hopper", target)[0]  # per row only
        cap = _sms(target) * config.ctas_per_sm
        num_sms = min(cap, grouped_tile_bound(args, config, size_class(args.M)))
        programs = min(num_sms, grouped_tile_bound(args, config))
        consts = dict(BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                      GROUP_M=config.group_m, INPUT_PRECISION=self.input_precision(args, target),
                      NUM_SMS=num_sms, FLATTEN=config.flatten,
                      WARP_SPECIALIZE=config.warp_specialize, ONE_ROW=False, ONE_WAVE=False,
                      EVEN_MN=False, GROUPS=max(16, 1 << (args.L - 1).bit_length()))
        if target.kind != INTERPRETER:
            consts.update(num_warps=config.num_warps, num_stages=config.num_stages)
        return items, consts, (programs,), []


def _pointer_stores(args: GemmArguments) -> tuple[str, ...]:
    """The full outputs a hopper kernel stores through pointers (``KernelSpec.direct``):
    a grouped GEMM's, whose tiles end at their group's last row (a TMA store writes the
    whole tile); none otherwise."""
    if not grouped_over_m(args):
        return ()
    return tuple(o.name for o in full_outputs(args.optimized_dag))


def _l2_spread_ok(args: GemmArguments) -> bool:
    """Whether the epilogue reads full tiles whose rows the L2 requests can walk
    (``KernelSpec.l2_spread``): one batch of each, rows contiguous (stride 1 along N)."""
    fulls = [s for s in args.optimized_dag.used_operands if s.kind is OperandKind.FULL]
    return bool(fulls) and all(not s.batched and args.epilogue.values[s.name].stride(-1) == 1
                               for s in fulls)


def _full_tiles(args: GemmArguments) -> int:
    """How many full tiles the epilogue loads and stores (operands and outputs)."""
    dag = args.optimized_dag
    return (sum(1 for s in dag.used_operands if s.kind is OperandKind.FULL)
            + len(full_outputs(dag)))


def _epilogue_registers(c: TileConfig, tiles: int) -> int:
    """A thread's registers in the epilogue, as ``EPILOGUE_REGISTERS`` counts them: the
    tile's fp32 accumulator and, of each full tile but one, the sub-tile in flight."""
    threads = 32 * c.num_warps
    return (c.block_m * c.block_n + c.block_m * (c.block_n // c.epi_split) * (tiles - 1)) \
        // threads
