"""What every Triton kernel family shares: tile configurations, targets, the base class and
its checks, and the tile arithmetic the families and the runtime order candidates by.

Layer: backends/triton. A family (``KernelFamily``) answers ``supports(args, target)``
with a ``Status`` carrying the reason, lists ``configs`` best first (a heuristic; the tuner
measures), and turns ``GemmArguments`` into a launch plan for the generated kernel
(``plan``). Invariant: this module imports no family and no launch-argument code (the
family modules and ``launch_items`` import it); ``families`` is the public entry point.
``_sms`` is imported by name into ``hopper_family`` and ``gluon_family``: a test that fakes
the SM count patches it there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ...arguments import GemmArguments
from ...errors import Status
from ...ir import Dag, NodeKind, OperandKind, OutputKind, Space
from ...optable import FP8_DTYPES
from .codegen import check_emittable
from .spec import KernelSpec
from .versions import interpreter_refusal


INTERPRETER = "interpreter"
SMEM_LIMIT = 232_448  # bytes of shared memory per block on sm_90
SMEM_BUDGET = SMEM_LIMIT - 8_192  # what our estimate may use: barriers and scratch need room
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_INT_DTYPES = (torch.int8, torch.uint8)  # int32 accumulation; Triton's dot takes int8 only:
#                                         uint8 runs as int8 with offset sums (``u8_offset``)
UINT8_REFUSAL = ("uint8 inputs run in the portable family only: Triton's dot has no unsigned "
                 "8-bit form, and only the portable mainloop adds the offset sums that make "
                 "them exact as int8 (docs/dtypes-and-layouts.md)")
# fp16 accumulation (``accumulator_type=torch.float16``): Triton's dot takes out_dtype
# float16 for fp16 and fp8 operands only (bf16 and fp32 accumulate in fp32)
FP16_ACC_INPUTS = (torch.float16,) + FP8_DTYPES
FP16_ACC_GLUON = ("accumulator_type torch.float16: the gluon kernels' warpgroup MMAs "
                  "accumulate in fp32 (their register layouts are fp32's); the hopper and "
                  "portable families take fp16 accumulation")
FP8_MIN_CC = 89  # tensor-core fp8 (Ada, Hopper and later)
F64_REFUSAL = ("float64 inputs run in the portable family (no tensor-core or TMA form: "
               "Triton's dot in float64 runs on the CUDA cores)")


def gated_refusal(args: GemmArguments) -> str | None:
    """What the portable kernel does not do yet with a gated epilogue (``pairs(accum)``):
    it stores full outputs only (no reductions or stored vectors), with B's 2N columns
    below 2^31."""
    if not getattr(args, "gated", False):
        return None
    red = next((n for n in args.dag.nodes if n.kind is NodeKind.REDUCE), None)
    if red is not None:  # (by its op: a staged pass's names and lines are its own source's)
        return (f"a {red.op} reduction: gated epilogues (pairs(accum)) compute no reductions "
                "and store full (M, N) outputs only in this release (docs/gated.md)")
    for o in args.dag.outputs:
        if o.kind not in (OutputKind.FULL, OutputKind.NONE):
            return (f"output {o.name} is a {o.kind.value}; gated epilogues (pairs(accum)) "
                    f"store full (M, N) outputs only in this release (docs/gated.md)")
    if 2 * args.N >= 2 ** 31:
        return f"B has 2N = {2 * args.N} columns; gated epilogues need fewer than 2^31"
    return None


def conditional_store_refusal(args: GemmArguments) -> str | None:
    """The TMA families' refusal of conditional stores (``store_where``): a TMA store
    writes a whole tile, so the elements a condition leaves alone would be overwritten."""
    stores = [o.name for o in args.dag.outputs if o.node.conditional_store]
    if not stores:
        return None
    return (f"conditional stores (store_where: {', '.join(stores)}) run in the portable family "
            "only: TMA stores write whole tiles")


GROUPED_REFUSAL = ("grouped GEMMs (grouped_gemm, offs) run in the hopper and portable families "
                   "(the gluon kernels do not find their group in offs yet; docs/grouped.md)")
K_GROUPED_REFUSAL = ("grouped GEMMs over K (2-D A and B with offs) run in the portable family "
                     "only (the TMA kernels group over M; docs/grouped.md)")


def grouped_over_m(args: GemmArguments) -> bool:
    """Whether ``args`` is a grouped GEMM over M (``grouped_gemm`` with a 3-D B): L is the
    group count, M every group's rows (T), each group's rows found in ``offs`` on the
    device."""
    return getattr(args, "group_dim", None) == "M"


@dataclass(frozen=True)
class TileConfig:
    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    num_warps: int = 4  # per program; gluon: per consumer partition (4, or 8: two
    #                     warpgroups of 64 rows each, ``GluonFamily.WIDE_WORK``)
    num_stages: int = 3
    epi_split: int = 1
    flatten: bool = True
    warp_specialize: bool = False
    prefetch: bool = False  # hopper: load full aux tiles before the mainloop
    ctas_per_sm: int = 1  # hopper: persistent programs per SM (2: one's epilogue overlaps
    #                       the other's mainloop)
    cooperative: bool = False  # gluon: both consumer warpgroups on one tile (half the rows
    #                            each) instead of alternate tiles (ping-pong)
    l2_spread: bool = False  # hopper: aux tiles asked into L2 over the mainloop's last k-steps
    slots: bool = False  # gluon: the consumer TMA-stores tile-staged outputs by 128-byte
    #                      chunk, and a second output of their dtype goes into each chunk
    #                      once it has left (``gluon_buffers.Buffers.slot_stores``)

    @property
    def name(self) -> str:
        extra = f"_e{self.epi_split}" if self.epi_split > 1 else ""
        extra += "" if self.flatten else "_nf"
        extra += "_ws" if self.warp_specialize else ""
        extra += "_pf" if self.prefetch else ""
        extra += f"_o{self.ctas_per_sm}" if self.ctas_per_sm > 1 else ""
        extra += "_co" if self.cooperative else ""
        extra += "_sl" if self.slots else ""
        extra += "_l2" if self.l2_spread else ""
        return (f"{self.block_m}x{self.block_n}x{self.block_k}_w{self.num_warps}"
                f"_s{self.num_stages}_g{self.group_m}{extra}")


@dataclass(frozen=True)
class Target:
    kind: str  # "cuda" | INTERPRETER
    cc: int
    device: torch.device
    sms: int  # persistent kernels launch at most this many programs
    offline: bool = False  # compiled, never launched (``runtime.offline``): CPU tensors
    #                        stand for the GPU's, only their dtypes, shapes and strides count


class KernelFamily:
    name = "base"
    description = ""
    # Triton's compile time of one of the family's kernels, seconds (offline for sm_90,
    # Triton 3.9.0, one CPU core; bias + gelu at 8192x8192x1024, 2026-11-29: portable
    # 0.86-0.88, hopper 1.37-1.43, gluon 1.79-2.23): which family a "background" first call
    # compiles (``tuner._starter``)
    compile_s = 1.0

    def supports(self, args: GemmArguments, target: Target) -> Status:
        raise NotImplementedError

    def configs(self, args: GemmArguments, target: Target) -> list[TileConfig]:
        raise NotImplementedError

    def spec(self, args: GemmArguments, config: TileConfig, target: Target) -> KernelSpec:
        raise NotImplementedError

    def plan(self, args: GemmArguments, dag: Dag, config: TileConfig, target: Target
             ) -> tuple[list[Any], dict[str, Any], tuple[int, ...], list[Any]]:
        """(items, constexprs, grid, post) for launches on problems shaped like ``args``.

        ``items`` lists the kernel's positional arguments: a number (sizes, strides) or a
        workspace tensor is fixed for every problem of this structure; a callable
        ``get(A, B, values)`` produces a value that changes per call (tensors, descriptors,
        runtime scalars). ``post`` holds callables ``post(values)`` run after the kernel
        (combining reduction partials into their outputs).
        """
        raise NotImplementedError

    # ---- shared checks
    @staticmethod
    def _common(args: GemmArguments, target: Target) -> Status:
        if args.A.dtype in _INT_DTYPES:
            if args.accumulator_type != torch.int32:
                return Status.fail(f"A and B are {args.A.dtype}: pass accumulator_type="
                                   "torch.int32 (8-bit integers accumulate in int32)")
        elif args.A.dtype == torch.float64:
            if args.accumulator_type != torch.float64:
                return Status.fail("A and B are torch.float64: pass accumulator_type="
                                   "torch.float64 (float64 inputs accumulate, and their "
                                   "epilogue computes, in float64)")
        elif args.A.dtype not in _FLOAT_DTYPES + FP8_DTYPES:
            return Status.fail(f"A and B are {args.A.dtype}; the Triton kernels take fp16, bf16, "
                               "fp32, fp64, fp8 (e4m3fn, e5m2), int8 and uint8 inputs")
        elif args.accumulator_type == torch.float16:
            if args.A.dtype not in FP16_ACC_INPUTS:
                return Status.fail(f"accumulator_type torch.float16 takes fp16 and fp8 inputs, "
                                   f"not {args.A.dtype} (Triton's dot accumulates bf16 and "
                                   "fp32 in fp32): pass accumulator_type=torch.float32")
            if args.A.dtype in FP8_DTYPES and not args.fp8_fast_accum:
                return Status.fail("fp8_fast_accum=False promotes each k-step's sum to an fp32 "
                                   "accumulator; with accumulator_type=torch.float16 there is "
                                   "none: pass one or the other")
        elif args.accumulator_type != torch.float32:
            return Status.fail(f"accumulator_type {args.accumulator_type}: float inputs "
                               "accumulate in torch.float32 (or torch.float16 for fp16 and "
                               "fp8 inputs, torch.float64 for float64 inputs)")
        if target.kind == INTERPRETER and args.A.device.type != "cpu":
            return Status.fail("the Triton interpreter needs CPU tensors")
        why = interpreter_refusal() if target.kind == INTERPRETER else None
        if why:
            return Status.fail(why)
        if target.kind != INTERPRETER and args.A.device.type != "cuda" and not target.offline:
            return Status.fail(f"tensors are on {args.A.device}; kernels need CUDA tensors, or "
                               "TRITON_INTERPRET=1 for CPU tensors")
        why = _fp8_refusal(args, target) or _size_refusal(args)
        if why:
            return Status.fail(why)
        why = check_emittable(args.dag)
        if why:
            return Status.fail(why)
        return Status.success()

    @staticmethod
    def input_precision(args: GemmArguments, target: Target) -> str:
        if args.A.dtype == torch.float32:
            return "tf32" if (args.allow_tf32 and target.kind != INTERPRETER) else "ieee"
        return "ieee"


def fp8_promote(args: GemmArguments, target: Target) -> bool:
    """Whether fp8 inputs' partial sums are promoted to fp32 every k-step
    (``fp8_fast_accum=False``). On Hopper the tensor cores add fp8 products with fewer
    bits than fp32: with fast accumulation over all of K the error grows with K (H100,
    relative norm error 2.1e-4 at K = 256, 1.3e-3 at 4096, 3.1e-3 at 16384), promoted it
    stays at 1.3e-4 (benchmarks/HISTORY.md, nineteenth session)."""
    return (args.A.dtype in FP8_DTYPES and not args.fp8_fast_accum
            and target.kind != INTERPRETER)


def _fp8_refusal(args: GemmArguments, target: Target) -> str | None:
    """Why fp8 inputs, operands or outputs cannot run on ``target`` (None: they can)."""
    values = args.epilogue.values
    dag = args.optimized_dag
    names = [s.name for s in dag.used_operands if s.kind is not OperandKind.RUNTIME_SCALAR]
    names += [o.name for o in dag.outputs if o.kind is not OutputKind.NONE]
    fp8 = [n for n in names if getattr(values.get(n), "dtype", None) in FP8_DTYPES]
    if args.A.dtype in FP8_DTYPES:
        fp8.insert(0, "A and B")
    if not fp8:
        return None
    if target.kind == INTERPRETER:
        return (f"{', '.join(fp8)}: fp8 needs a GPU (Triton's CPU interpreter converts fp8 "
                "wrongly, e.g. 500.0 to 256.0); test the epilogue logic with fp16 on the CPU")
    if args.A.dtype in FP8_DTYPES and target.cc < FP8_MIN_CC:
        return (f"fp8 inputs need tensor-core fp8 (compute capability 8.9+); this GPU is "
                f"{target.cc}")
    return None


def _size_refusal(args: GemmArguments) -> str | None:
    """Why the problem's sizes pass what the kernels' int32 index arithmetic takes (row and
    column indices, tile counts, the rows or columns of every batch a fold runs over);
    element offsets past 2^31 are 64-bit where needed (``launch_items.needs_int64``)."""
    limit = 2 ** 31
    if max(args.M, args.N, args.K) >= limit:
        return f"M, N and K must each be below 2^31 (M={args.M}, N={args.N}, K={args.K})"
    if args.L * max(args.M, args.N) >= limit:
        return (f"L x M and L x N must be below 2^31 (L={args.L}, M={args.M}, N={args.N}); "
                "split the batch")
    return None


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def even_tiles(args: GemmArguments, config: TileConfig) -> bool:
    """The kernels' ``EVEN_MN`` constexpr: whether ``config``'s tiles cover exactly the
    edges the epilogue's reductions run across (a per-row one N's, a per-column one M's,
    a whole-output one both), so that their masks fold away. Only reductions read it: False
    without any, so that a new M changes it (and costs a compile) only for an epilogue
    with a per-column or whole-output reduction."""
    kinds = {o.kind for o in args.optimized_dag.reductions}
    if not kinds:
        return False
    across_m = any(k is not OutputKind.ROW for k in kinds)  # the tile's mask otherwise
    across_n = any(k is not OutputKind.COL for k in kinds)
    return ((not across_m or args.M % config.block_m == 0)
            and (not across_n or args.N % config.block_n == 0))


def even_tiles_vary(args: GemmArguments, config: TileConfig) -> bool:
    """Whether another M of the problem gives ``even_tiles`` the other value: an epilogue
    with a reduction across M (per-column or whole-output) where M alone decides it (a
    reduction across N too needs N covered exactly). Grouped problems never set
    ``EVEN_MN``. Such a kernel's other variant is compiled ahead (``runtime.background``)."""
    kinds = {o.kind for o in args.optimized_dag.reductions}
    if args.offs is not None or not any(k is not OutputKind.ROW for k in kinds):
        return False
    across_n = any(k is not OutputKind.COL for k in kinds)
    return not across_n or args.N % config.block_n == 0


def tile_count(args: GemmArguments, config: TileConfig, m: int | None = None) -> int:
    """Output tiles of ``config`` for ``args`` (every batch; at ``m`` rows if given). A
    grouped GEMM over M: the tiles of its T rows as if they were one group (each group
    adds at most one partial row tile: ``grouped_tile_bound``)."""
    rows = args.M if m is None else m
    if grouped_over_m(args):
        return triton_cdiv(rows, config.block_m) * _column_tiles(args, config)
    return triton_cdiv(rows, config.block_m) * _column_tiles(args, config) * args.L


def grouped_tile_bound(args: GemmArguments, config: TileConfig, m: int | None = None) -> int:
    """An upper bound of a grouped GEMM's tiles over M (the groups' sizes stay on the
    device): every group ends at most one partial row tile, ``cdiv(T, BLOCK_M) + G`` row
    tiles (at ``m`` rows if given) times the column tiles."""
    rows = args.M if m is None else m
    return (triton_cdiv(rows, config.block_m) + args.L) * _column_tiles(args, config)


def _column_tiles(args: GemmArguments, config: TileConfig) -> int:
    """Column tiles of a problem: a gated epilogue's tile spans BLOCK_N of B's 2N columns
    (BLOCK_N // 2 of the output's)."""
    return triton_cdiv(2 * args.N if getattr(args, "gated", False) else args.N, config.block_n)


def fill_rank(args: GemmArguments, config: TileConfig, sms: int) -> float:
    """0 where ``config``'s tiles fill nine in ten of ``sms`` SMs, else 1 plus the share
    left idle: candidates are ordered by it (stable), within the hopper family and across
    families (``runtime.api.get_kernels``), so that a tuning budget reaches the configs
    that fill the GPU first."""
    tiles = tile_count(args, config)
    return 0.0 if tiles >= 0.9 * sms else 1.0 + (sms - tiles) / sms


def tile_work(dag: Dag) -> int:
    """The elementwise ops the epilogue runs on every element of the tile."""
    return sum(1 for n in dag.nodes if n.kind is NodeKind.COMPUTE and n.space is Space.FULL)


def _sms(target: Target) -> int:
    return target.sms
