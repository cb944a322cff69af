"""The portable kernel family: one program per tile, pointer loads with masks.

Layer: backends/triton. Runs on any GPU and under Triton's CPU interpreter, any strides;
it refuses only what every family refuses (``KernelFamily._common``). It runs grouped GEMMs
(``evtfuse.grouped_gemm``) with the same kernel, over M each program finding its group in
``offs`` on the device (``group_emit.group_lines``), over K each batch its group's range of
K (``group_emit.k_group_lines``; the one family that groups over K). Invariant: its
plan's items follow the portable kernel's parameters (``launch_items``). It runs gated
epilogues (``pairs(accum)``, docs/gated.md) of every problem (the hopper family: grouped
ones over M): a tile is BLOCK_N columns of B and BLOCK_N // 2 of the output, the
accumulator split after the mainloop.
"""

from __future__ import annotations

from typing import Any

import torch

from ...errors import Status
from .family_base import (_INT_DTYPES, INTERPRETER, KernelFamily, TileConfig, even_tiles,
                          fp8_promote, gated_refusal, triton_cdiv)
from .launch_items import _dims3, _get_offs, _epilogue_items, _get_a, _get_b, _reduction_items, needs_int64
from .spec import KernelSpec
from ...staging import feeds_computation, row_reductions_only


def one_pass_max_n(target) -> int:
    """The widest row a tile spans in one pass: 256 columns on a GPU (a 64x256 fp32 tile in
    eight warps), 64 under the interpreter (its tiles cost time per element)."""
    return 64 if target.kind == INTERPRETER else 256


# float64's tiles (CUDA-core dots: float64 is for checking, gradcheck and float64 models):
# eight accumulator elements a thread. ptxas time grows with them, as float64 epilogues
# inline libdevice per element: the round-3 epilogue of 20 unary ops compiled for sm_90 in
# 7.1 s at 32x64 in four warps (16 a thread, 3,383 spilled words), 2.9 s at 32x64 in eight
# and 2.8 s at 32x32 in four; a gradcheck compiles about 18 such kernels.
F64_TILES = (TileConfig(32, 64, 16, 8, 8, 2), TileConfig(32, 32, 16, 8, 4, 2))


def triton_next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


class PortableFamily(KernelFamily):
    name = "portable"
    compile_s = 0.9  # KernelFamily.compile_s
    description = "one program per tile, pointer loads with masks (any GPU, any strides; CPU interpreter)"

    def supports(self, args, target):
        st = self._common(args, target)
        why = gated_refusal(args) if st else None
        return Status.fail(why) if why else st

    @staticmethod
    def grouped(args) -> bool:
        """Groups over M (each program finds its group's rows in ``offs``)."""
        return getattr(args, "group_dim", None) == "M"

    @staticmethod
    def k_grouped(args) -> bool:
        """Groups over K (a batched grid; each batch's K range from ``offs``)."""
        return getattr(args, "group_dim", None) == "K"

    def one_pass(self, args, target) -> bool:
        """Whether an epilogue whose reductions feed computation runs here in one pass: each
        is per row (over N), and one tile spans the row (N up to ``one_pass_max_n``)."""
        dag = args.optimized_dag
        return (feeds_computation(dag) and row_reductions_only(dag) and not args.gated
                and not self.grouped(args) and not self.k_grouped(args)
                and args.N <= one_pass_max_n(target))

    def configs(self, args, target):
        if feeds_computation(args.optimized_dag):  # one pass: a tile spans the row
            bn = max(16, triton_next_pow2(args.N))
            if target.kind == INTERPRETER:
                return [TileConfig(16, bn, 16, group_m=2, num_warps=1, num_stages=1)]
            if args.A.dtype == torch.float64:  # few elements a thread, as F64_TILES: 16 rows
                return [TileConfig(16, bn, 16, 8, 8 if bn >= 128 else 4, 2)]
            bk = {8: 16, 4: 32, 2: 64, 1: 128}[args.A.element_size()]
            return [TileConfig(64, bn, bk, 8, 4 if bn <= 128 else 8, 3),
                    TileConfig(32, bn, bk, 8, 4, 4)]
        if target.kind == INTERPRETER:
            small = TileConfig(16, 16, 16, group_m=2, num_warps=1, num_stages=1)
            mid = TileConfig(32, 32, 32, group_m=4, num_warps=1, num_stages=1)
            return [mid, small]
        if args.A.dtype == torch.float64:
            return list(F64_TILES)
        elt = args.A.element_size()
        bk = {8: 16, 4: 32, 2: 64, 1: 128}[elt]
        cands = [
            TileConfig(128, 128, bk, 8, 8, 3),
            TileConfig(128, 64, bk, 8, 4, 4),
            TileConfig(64, 128, bk, 8, 4, 4),
            TileConfig(64, 64, bk, 8, 4, 4),
            TileConfig(128, 256, bk, 8, 8, 3),
            TileConfig(32, 64, bk, 8, 4, 4),
        ]
        if args.M <= 64:
            cands.sort(key=lambda c: (c.block_m > 64, -c.block_n))
        return cands

    def spec(self, args, config, target):
        return KernelSpec("portable", args.optimized_dag, False, False, False, False, 1,
                          target.kind != INTERPRETER, int_acc=args.A.dtype in _INT_DTYPES,
                          u8_offset=args.A.dtype == torch.uint8,
                          acc16=args.accumulator_type == torch.float16,
                          fp8_promote=fp8_promote(args, target),
                          int64=needs_int64(args, self.name, config),
                          grouped=self.grouped(args), k_grouped=self.k_grouped(args),
                          runtime_m=args.A.stride(-1) == 1,
                          f64=args.A.dtype == torch.float64)

    def plan(self, args, dag, config, target):
        grouped, k_grouped = self.grouped(args), self.k_grouped(args)
        items: list[Any] = [_get_a, _get_b, args.M, args.N, args.K, args.L,
                            *_dims3(args.A), *_dims3(args.B),
                            *([_get_offs] if grouped or k_grouped else [])]
        items += _epilogue_items(args, dag, "portable", config)
        red_items, post = _reduction_items(args, dag, config, "portable", target)
        items += red_items
        # gated (pairs(accum)): a tile spans BLOCK_N of B's 2N columns
        nb = 2 * args.N if getattr(args, "gated", False) else args.N
        if grouped:  # an upper bound: programs past the last group's tiles return at once
            grid = ((triton_cdiv(args.M, config.block_m) + args.L)
                    * triton_cdiv(nb, config.block_n), 1)
        else:
            grid = (triton_cdiv(args.M, config.block_m) * triton_cdiv(nb, config.block_n),
                    args.L)
        consts = dict(BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                      GROUP_M=config.group_m, INPUT_PRECISION=self.input_precision(args, target),
                      EVEN_K=args.K % config.block_k == 0 and not k_grouped,
                      ONE_ROW=args.M <= config.block_m and not grouped,
                      EVEN_MN=even_tiles(args, config) and not grouped)
        if target.kind != INTERPRETER:
            consts.update(num_warps=config.num_warps, num_stages=config.num_stages)
        return items, consts, grid, post
