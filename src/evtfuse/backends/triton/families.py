"""The Triton kernel families: what each supports, its tile configurations, its launch.

Layer: backends/triton. A family answers ``supports(args, target)`` with a ``Status``
carrying the reason, lists ``configs`` best first (a heuristic; the tuner measures), and
turns ``GemmArguments`` into a launch plan for the generated kernel (``plan``).
"""

from __future__ import annotations

import numbers
import os
from dataclasses import dataclass, replace
from typing import Any

import torch

from ...arguments import GemmArguments
from ...errors import Status, not_an_operand
from ...ir import Dag, NodeKind, OperandKind, OutputKind, Space
from ...optable import FP8_DTYPES
from .codegen import check_emittable
from .spec import (FOLD_IDENTITY_BITS, TMA_FAMILIES, KernelSpec, atomic_folded, combined_in_kernel,
                   full_outputs, reduce_outputs, staged_vector, vector_outputs)

INTERPRETER = "interpreter"
SMEM_LIMIT = 232_448  # bytes of shared memory per block on sm_90
SMEM_BUDGET = SMEM_LIMIT - 8_192  # what our estimate may use: barriers and scratch need room
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_INT_DTYPES = (torch.int8,)  # Triton's dot takes int8, not uint8
FP8_MIN_CC = 89  # tensor-core fp8 (Ada, Hopper and later)


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
    #                      once it has left (``gluon_codegen.Buffers.slot_stores``)

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


def _dims3(t: torch.Tensor) -> tuple[int, int, int]:
    """(sl, s_row, s_col) strides of a 2-D/3-D operand; sl = 0 when not batched."""
    if t.dim() == 3:
        return (t.stride(0) if t.shape[0] > 1 else 0), t.stride(1), t.stride(2)
    return 0, t.stride(0), t.stride(1)


def _strides_lmn(t: torch.Tensor) -> tuple[int, int, int]:
    """``t``'s strides right-aligned with (L, M, N) (0 for the dimensions it lacks)."""
    return (0,) * (3 - t.dim()) + tuple(t.stride())


def _vec_strides(t: torch.Tensor, kind: OperandKind, batched: bool) -> list[int]:
    """Strides of a scalar/vector operand right-aligned with (L, M, N)."""
    strides = _strides_lmn(t)
    sl = strides[0] if batched else 0
    if kind is OperandKind.DEVICE_SCALAR:
        return [sl]
    if kind is OperandKind.PER_ROW:
        return [sl, strides[1]]
    if kind is OperandKind.PER_COL:
        return [sl, strides[2]]
    return [sl, strides[1], strides[2]]


def _as2d_or_3d(t: torch.Tensor, batched: bool) -> torch.Tensor:
    """A full (M, N)-shaped view: 2-D unless it has its own batch slices. A full tensor of
    fewer dimensions spans the problem only where M is 1 (an (N,) tensor when M = 1; its
    shape right-aligns with (L, M, N)): it gets its leading 1s back."""
    if t.dim() < 2:
        t = t.reshape((1,) * (2 - t.dim()) + tuple(t.shape))
    if batched:
        return t if t.dim() == 3 else t.unsqueeze(0)
    while t.dim() > 2:
        t = t[0]
    return t


class KernelFamily:
    name = "base"
    description = ""

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
        elif args.A.dtype not in _FLOAT_DTYPES + FP8_DTYPES:
            return Status.fail(f"A and B are {args.A.dtype}; the Triton kernels take fp16, bf16, "
                               "fp32, fp8 (e4m3fn, e5m2) and int8 inputs (uint8: Triton's dot has "
                               "no unsigned 8-bit form)")
        elif args.accumulator_type != torch.float32:
            return Status.fail(f"accumulator_type {args.accumulator_type}: float inputs "
                               "accumulate in torch.float32")
        if target.kind == INTERPRETER and args.A.dtype == torch.bfloat16:
            return Status.fail("bf16 under Triton's CPU interpreter gives wrong results; use "
                               "fp16/fp32 on the CPU, bf16 on a GPU")
        if target.kind == INTERPRETER and args.A.device.type != "cpu":
            return Status.fail("the Triton interpreter needs CPU tensors")
        if target.kind != INTERPRETER and args.A.device.type != "cuda" and not target.offline:
            return Status.fail(f"tensors are on {args.A.device}; kernels need CUDA tensors, or "
                               "TRITON_INTERPRET=1 for CPU tensors")
        why = _fp8_refusal(args, target)
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
    stays at 1.3e-4 (BENCHMARKS.md, nineteenth session)."""
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


# ------------------------------------------------------------------ portable

class PortableFamily(KernelFamily):
    name = "portable"
    description = "one program per tile, pointer loads with masks (any GPU, any strides; CPU interpreter)"

    def supports(self, args, target):
        return self._common(args, target)

    def configs(self, args, target):
        if target.kind == INTERPRETER:
            small = TileConfig(16, 16, 16, group_m=2, num_warps=1, num_stages=1)
            mid = TileConfig(32, 32, 32, group_m=4, num_warps=1, num_stages=1)
            return [mid, small]
        elt = args.A.element_size()
        bk = {4: 32, 2: 64, 1: 128}[elt]
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
                          fp8_promote=fp8_promote(args, target))

    def plan(self, args, dag, config, target):
        items: list[Any] = [_get_a, _get_b, args.M, args.N, args.K, args.L,
                            *_dims3(args.A), *_dims3(args.B)]
        items += _epilogue_items(args, dag, "portable", config)
        red_items, post = _reduction_items(args, dag, config, "portable", target)
        items += red_items
        grid = (triton_cdiv(args.M, config.block_m) * triton_cdiv(args.N, config.block_n), args.L)
        consts = dict(BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                      GROUP_M=config.group_m, INPUT_PRECISION=self.input_precision(args, target),
                      EVEN_K=args.K % config.block_k == 0, ONE_ROW=args.M <= config.block_m,
                      EVEN_MN=even_tiles(args, config))
        if target.kind != INTERPRETER:
            consts.update(num_warps=config.num_warps, num_stages=config.num_stages)
        return items, consts, grid, post


def _get_a(A, B, values):
    return A


def _get_b(A, B, values):
    return B


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _value_getter(name: str):
    def get(A, B, values):
        return values[name]
    return get


def _scalar_getter(name: str):
    def get(A, B, values):
        v = values[name]
        if type(v) is float or (isinstance(v, numbers.Real) and not isinstance(v, bool)):
            return float(v)
        # a repeated gemm call reaches a cached plan without the frontend's validation
        raise not_an_operand(name, v)
    return get


def _reuse_last(make):
    """``make(t)``, reused while the same tensor object comes back (a loop re-running one
    set of buffers skips rebuilding its TMA descriptors). Keeps the last tensor alive."""
    last: list[Any] = [None, None]

    def get(t):
        if last[0] is t:
            return last[1]
        d = make(t)
        last[0], last[1] = t, d
        return d

    return get


def _batched(t: torch.Tensor) -> bool:
    """Whether operand A or B has batch slices of its own (a leading dimension above 1)."""
    return t.dim() == 3 and t.shape[0] > 1


def _rebased(make):
    """``make(t)`` validated once per launch plan; later tensors of the plan's structure
    (same shape, strides, dtype and 16-byte alignment: the plan's key) get a copy of that
    descriptor with their own base. The launcher reads only the base's data pointer, which
    every view ``make`` takes (transpose, unsqueeze, batch 0) shares with the tensor."""
    template: dict[str, Any] = {}
    cls: list[type] = []

    def get(t):
        if not template:
            d = make(t)
            template.update(vars(d), base=None)  # no tensor kept alive by the template
            cls.append(type(d))
            return d
        d = object.__new__(cls[0])
        vars(d).update(template)
        d.base = t
        return d

    return _reuse_last(get)


def _descriptor_getter(name: str, batched: bool, config: TileConfig):
    make = _rebased(lambda t: _descriptor(t, batched, config))

    def get(A, B, values):
        return make(values[name])
    return get


def _epilogue_items(args: GemmArguments, dag: Dag, family: str, config: TileConfig,
                    descriptor=None, direct: tuple[str, ...] = (), l2_spread: bool = False
                    ) -> list[Any]:
    """Items for ``codegen.epilogue_params`` in the same order (see ``KernelFamily.plan``);
    ``descriptor(name, batched, config)`` makes the getter of a full tile's descriptor;
    ``direct`` outputs get pointer and strides (``KernelSpec.direct``)."""
    values = args.epilogue.values
    out: list[Any] = []
    descriptor = descriptor or _descriptor_getter

    def full(name: str, t: torch.Tensor, batched: bool) -> list[Any]:
        """A full (M, N) tile source or target: a TMA descriptor, or pointer and strides."""
        if family in TMA_FAMILIES and name not in direct:
            return [descriptor(name, batched, config)]
        return [_value_getter(name)] + _vec_strides(t, OperandKind.FULL, batched)

    for spec in dag.used_operands:
        v = values[spec.name]
        if spec.kind is OperandKind.RUNTIME_SCALAR:
            out.append(_scalar_getter(spec.name))
        elif staged_vector(spec, family):
            out.append(_gluon_vector_getter(spec.name, spec.kind, config))
        elif spec.kind is OperandKind.FULL:
            out += full(spec.name, v, spec.batched)
            if l2_spread:  # pointer and row stride for the L2 requests (KernelSpec.l2_spread)
                out += [_value_getter(spec.name), _strides_lmn(v)[1]]
        else:
            out.append(_value_getter(spec.name))
            out += _vec_strides(v, spec.kind, spec.batched)
    for o in full_outputs(dag):
        out += full(o.name, values[o.name], o.batched)
    for o in vector_outputs(dag):
        t = values[o.name]
        shape = (1,) * (3 - t.dim()) + tuple(t.shape)
        strides = _strides_lmn(t)
        out += [_value_getter(o.name), strides[0] if o.batched else 0,
                strides[1] if shape[1] > 1 else 0, strides[2] if shape[2] > 1 else 0]
    return out


def _output_items(args: GemmArguments, o) -> list[Any]:
    """A reduction output the kernel writes itself (``{u}_out, {u}_osl[, {u}_os]`` of
    ``codegen.epilogue_params``): its getter, batch stride, and row/column stride."""
    strides = _strides_lmn(args.epilogue.values[o.name])
    items = [_value_getter(o.name), strides[0] if o.batched else 0]
    if o.kind is not OutputKind.SCALAR:
        items.append(strides[1] if o.kind is OutputKind.ROW else strides[2])
    return items


def _reduction_items(args: GemmArguments, dag: Dag, config: TileConfig, family: str,
                     target: Target, programs: int = 0):
    """Workspaces for reduction partials (allocated once per plan) and the steps that
    combine them, in a fixed order, into each output. ``programs`` > 0: a persistent
    kernel keeps whole-output, non-batched reductions per program (one partial each)."""
    from .combine import pdl_enabled

    pdl = target.kind != INTERPRETER and pdl_enabled(target.cc // 10)
    items: list[Any] = []
    post: list[Any] = []
    mt = triton_cdiv(args.M, config.block_m)
    nt = triton_cdiv(args.N, config.block_n)
    dev = args.A.device
    for o in reduce_outputs(dag):
        if atomic_folded(o):  # a float32 value per row/column (per batch), kept as int32 bits
            extent = args.M if o.kind is OutputKind.ROW else args.N
            ws = torch.full(((args.L if o.batched else 1) * extent,), FOLD_IDENTITY_BITS[o.node.op],
                            device=dev, dtype=torch.int32)
            items += [ws, torch.zeros(1, device=dev, dtype=torch.int32), *_output_items(args, o)]
            continue
        shape = {OutputKind.ROW: (args.L, nt, args.M), OutputKind.COL: (args.L, mt, args.N),
                 OutputKind.SCALAR: (args.L, mt, nt)}[o.kind]
        per_program = programs > 0 and o.kind is OutputKind.SCALAR and not o.batched
        if per_program:
            shape = (programs,)
        ws = torch.empty(shape, device=dev, dtype=torch.float32)
        if combined_in_kernel(o, family):  # the kernel combines: ticket counters, the output
            groups = {OutputKind.ROW: mt, OutputKind.COL: nt, OutputKind.SCALAR: 1}[o.kind]
            cnt = torch.zeros((args.L if o.batched else 1) * groups, device=dev, dtype=torch.int32)
            items += [ws, cnt, *_output_items(args, o)]
            continue
        lse = o.node.op == "logsumexp"
        ws2 = torch.empty(shape, device=dev, dtype=torch.float32) if lse else None
        items += [ws, ws2] if lse else [ws]
        post.append(_combiner(o.name, o.node.op, ws, ws2, o.kind, o.batched and not per_program,
                              pdl))
    return items, post


def _combiner(name: str, op: str, ws: torch.Tensor, ws2: torch.Tensor | None, kind,
              batched: bool, pdl: bool = False):
    """The combine step after the kernel (``combine.combine_partials``, one launch, a fixed
    order): logsumexp's (max, sum of exp) partials, the TMA families' per-row/per-column
    sums and batched whole-output reductions. The workspace is viewed as (batches kept,
    partials per result, results). ``pdl``: a programmatic dependent launch (the kernel
    before it lets it start early, ``codegen.launch_dependents_lines``)."""
    from .combine import combine_partials, launch_shape
    from .launch import direct_launcher

    ext = ws.shape[-1] if kind in (OutputKind.ROW, OutputKind.COL) else 1
    b = ws.shape[0] if batched else 1
    t = ws.numel() // (b * ext)
    block, parts, warps = launch_shape(t, ext)
    consts = {"OP": op, "BLOCK": block, "PARTS": parts, "PDL": pdl}
    grid = (triton_cdiv(ext, block), b)
    state: dict[str, Any] = {}

    def combine(values) -> None:
        out = values[name]
        sl, sm, sn = _strides_lmn(out)
        pos = [ws, ws if ws2 is None else ws2, out, t, ext, sl if batched else 0,
               {OutputKind.ROW: sm, OutputKind.COL: sn}.get(kind, 0)]
        launch = state.get("launch")
        if launch is None or not launch(pos):
            compiled = combine_partials[grid](*pos, **consts, num_warps=warps, launch_pdl=pdl)
            state.setdefault("launch", direct_launcher(compiled, combine_partials, grid,
                                                       len(pos), consts))

    combine.pdl = pdl  # type: ignore[attr-defined]  # what tests and probes read
    return combine


def _tma_strides(view: torch.Tensor) -> list[int]:
    """``view``'s strides for a TMA descriptor. A dimension of size 1 addresses nothing, so
    its stride (which torch leaves arbitrary: 1 for a column-major (1, K) A) is replaced:
    1 for the last dimension, else a contiguous tensor's rounded up to 16 bytes (a (1, 1)
    tensor's row would be 2 bytes), as the descriptor's alignment checks need."""
    strides = list(view.stride())
    align = max(16 // view.element_size(), 1)
    for d in range(view.dim() - 1, -1, -1):
        if view.shape[d] == 1:
            inner = strides[d + 1] * view.shape[d + 1] if d + 1 < view.dim() else 0
            strides[d] = -(-inner // align) * align if inner else 1
    return strides


def _make_descriptor(view: torch.Tensor, block: list[int]):
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor(view, list(view.shape), _tma_strides(view), block)


def _descriptor(t: torch.Tensor, batched: bool, config: TileConfig):
    sub_n = config.block_n // config.epi_split
    block = [1, config.block_m, sub_n] if batched else [config.block_m, sub_n]
    return _make_descriptor(_as2d_or_3d(t, batched), block)


# ------------------------------------------------------------------ hopper

def _tma_ok(view: torch.Tensor, name: str) -> str | None:
    """Why ``view`` cannot be a TMA tensor as a descriptor takes it (rows along its last
    dimension): a 16-byte aligned base, a unit last stride and 16-byte aligned strides
    elsewhere, dimensions of size 1 aside (``_tma_strides``)."""
    elt = view.element_size()
    if view.data_ptr() % 16:
        return f"{name}'s data pointer is not 16-byte aligned"
    strides = _tma_strides(view)
    shape = tuple(view.shape)
    if strides[-1] != 1:
        return (f"{name} is not contiguous along its rows (last stride {strides[-1]}, shape "
                f"{shape}); TMA tiles need unit-stride rows")
    for st in strides[:-1]:
        if (st * elt) % 16:
            return (f"{name}'s stride {st} ({st * elt} bytes) is not a multiple of 16 bytes "
                    f"(shape {shape}); TMA needs 16-byte aligned rows")
    return None


def _tma_refusal(args: GemmArguments) -> str | None:
    """Why A, B or a full aux operand/output cannot move by TMA (None: all can). A and B
    are checked as the kernels read them: column-major ones (last stride not 1) as their
    transposes; aux tiles row-major."""
    A, B = args.A, args.B
    if A.stride(-1) != 1 and A.stride(-2) != 1:
        return "A is neither row- nor column-major"
    if B.stride(-1) != 1 and B.stride(-2) != 1:
        return "B is neither row- nor column-major"
    checks = [(A.mT, "A (column-major, read as its transpose)") if A.stride(-1) != 1 else (A, "A"),
              (B.mT, "B (column-major, read as its transpose)") if B.stride(-1) != 1 else (B, "B")]
    dag = args.optimized_dag
    values = args.epilogue.values
    for spec in dag.used_operands:
        if spec.kind is OperandKind.FULL:
            checks.append((values[spec.name], spec.name))
    for o in full_outputs(dag):
        checks.append((values[o.name], o.name))
    for t, name in checks:
        why = _tma_ok(t, name)
        if why:
            return why
    if A.element_size() == 1 and (A.stride(-1) != 1 or (B.stride(-2) != 1 and B.shape[-1] > 1)):
        return (f"8-bit inputs ({A.dtype}) on the tensor cores (wgmma) need A row-major and "
                "B column-major (both K-contiguous, e.g. B = W.t() for W of shape (N, K)); "
                "the portable family takes other layouts")
    return None


def _operand_getters(spec: KernelSpec, config: TileConfig, make_descriptor) -> list[Any]:
    """The plan items for A and B: TMA descriptors (``make_descriptor(view, block)``) of
    their (M, K)/(K, N) views, or of the transposed view for a column-major operand,
    validated once per plan and rebased on each call's tensors."""
    bm, bn, bk = config.block_m, config.block_n, config.block_k

    def operand(trans: bool, batched: bool, block: list[int]):
        def make(t):
            view = _as2d_or_3d(t, batched)
            return make_descriptor(view.mT if trans else view, ([1] if batched else []) + block)
        return _rebased(make)

    make_a = operand(spec.a_trans, spec.a_batched, [bk, bm] if spec.a_trans else [bm, bk])
    make_b = operand(spec.b_trans, spec.b_batched, [bn, bk] if spec.b_trans else [bk, bn])

    def get_a(A, B, values):
        return make_a(A)

    def get_b(A, B, values):
        return make_b(B)

    return [get_a, get_b]


class HopperFamily(KernelFamily):
    name = "hopper"
    description = ("persistent, tensor-descriptor (TMA) loads and stores, grouped tile order, "
                   "epilogue per sub-tile (sm_90+)")

    def supports(self, args, target):
        st = self._common(args, target)
        if not st:
            return st
        if target.kind == "cuda" and target.cc < 90:
            return Status.fail(f"needs compute capability 9.0+ (TMA); this GPU is {target.cc}")
        if target.kind == INTERPRETER and target.cc < 90:
            return Status.fail("TMA kernels run under the interpreter only when asked for "
                               "with cc=90")
        why = _tma_refusal(args)
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
        # measured on H100 bf16 (scripts/perf_probe.py, BENCHMARKS.md): 128x256x64 with
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
        fits = []
        for c in cands:
            # wide or many outputs: split the epilogue further rather than overflow shared
            # memory (each stored sub-tile is staged there for its TMA store)
            while self._smem(c, elt, tile_bytes) > SMEM_BUDGET and c.epi_split < 4 \
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
        # otherwise took 0.241 / 1.86: fp8_accum_probe.py, BENCHMARKS.md nineteenth session)
        promote = fp8_promote(args, target)
        fits.sort(key=lambda c: (fill_rank(args, c, sms), promote and c.block_m != 256))
        # aux tiles asked into L2 over the mainloop (codegen._l2_spread_lines): in one wave
        # every program reads its C tile at the same moment after the last k-step
        small = TileConfig(128, 128, bk, 8, 4, 3, epi_split=2, flatten=False, ctas_per_sm=2,
                           l2_spread=_l2_spread_ok(args))
        if sms <= tiles(small) <= 2 * sms and self._smem(small, elt, tile_bytes) <= SMEM_BUDGET:
            # one wave at two programs per SM, tiles taken in launch order (no flattened
            # loop): relu aux at 2048^3 0.0344 ms against 0.0352 for 128x256 (perf_probe)
            fits.insert(1, small)
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
        prefetch = config.prefetch and any(s.kind is OperandKind.FULL
                                           for s in args.optimized_dag.used_operands)
        l2 = config.l2_spread and _l2_spread_ok(args) and target.kind != INTERPRETER
        # two programs per SM: registers to spare for every piece's vectors at once (the
        # 128x256 eight-warp tiles, at 167 registers, lose 1.5-3% to the extra 25)
        early = config.ctas_per_sm == 2 and any(
            s.kind in (OperandKind.PER_ROW, OperandKind.PER_COL)
            for s in args.optimized_dag.used_operands)
        return KernelSpec("hopper", args.optimized_dag, a_trans, b_trans, a_batched,
                          b_batched, config.epi_split, target.kind != INTERPRETER, prefetch,
                          int_acc=args.A.dtype in _INT_DTYPES, l2_spread=l2,
                          early_vectors=early, fp8_promote=fp8_promote(args, target))

    def plan(self, args, dag, config, target):
        spec = self.spec(args, config, target)
        bm, bn, bk = config.block_m, config.block_n, config.block_k
        items: list[Any] = [*_operand_getters(spec, config, _make_descriptor), args.M, args.N,
                            args.K, args.L]
        items += _epilogue_items(args, dag, "hopper", config, l2_spread=spec.l2_spread)
        tiles = tile_count(args, config)
        num_sms = min(_sms(target) * config.ctas_per_sm, tiles)
        red_items, post = _reduction_items(args, dag, config, "hopper", target, programs=num_sms)
        items += red_items
        consts = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=config.group_m,
                      INPUT_PRECISION=self.input_precision(args, target), NUM_SMS=num_sms,
                      FLATTEN=config.flatten, WARP_SPECIALIZE=config.warp_specialize,
                      ONE_ROW=args.M <= bm and args.L == 1, ONE_WAVE=num_sms == tiles,
                      EVEN_MN=even_tiles(args, config))
        if target.kind != INTERPRETER:
            consts.update(num_warps=config.num_warps, num_stages=config.num_stages)
        return items, consts, (num_sms,), post


def even_tiles(args: GemmArguments, config: TileConfig) -> bool:
    """Whether ``config``'s tiles cover M and N exactly (the kernels' ``EVEN_MN``
    constexpr: no tile reaches past an edge, so the epilogue's reduction masks fold away)."""
    return args.M % config.block_m == 0 and args.N % config.block_n == 0


def tile_count(args: GemmArguments, config: TileConfig) -> int:
    """Output tiles of ``config`` for ``args`` (every batch)."""
    return triton_cdiv(args.M, config.block_m) * triton_cdiv(args.N, config.block_n) * args.L


def fill_rank(args: GemmArguments, config: TileConfig, sms: int) -> float:
    """0 where ``config``'s tiles fill nine in ten of ``sms`` SMs, else 1 plus the share
    left idle: candidates are ordered by it (stable), within the hopper family and across
    families (``runtime.api.get_kernels``), so that a tuning budget reaches the configs
    that fill the GPU first."""
    tiles = tile_count(args, config)
    return 0.0 if tiles >= 0.9 * sms else 1.0 + (sms - tiles) / sms


def _l2_spread_ok(args: GemmArguments) -> bool:
    """Whether the epilogue reads full tiles whose rows the L2 requests can walk
    (``KernelSpec.l2_spread``): one batch of each, rows contiguous (stride 1 along N)."""
    fulls = [s for s in args.optimized_dag.used_operands if s.kind is OperandKind.FULL]
    return bool(fulls) and all(not s.batched and args.epilogue.values[s.name].stride(-1) == 1
                               for s in fulls)


def _sms(target: Target) -> int:
    return target.sms


# ------------------------------------------------------------------ gluon (ping-pong)

def _gluon_available() -> bool:
    try:
        from triton.experimental.gluon.language.nvidia import hopper  # noqa: F401
    except ImportError:
        return False
    return True


def _gluon_descriptor(t: torch.Tensor, block: list[int]):
    """A Gluon TMA descriptor: 128-byte-swizzled shared layout, as wgmma and ldmatrix read."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from .spec import TL_DTYPES

    gl_dtype = getattr(gl, TL_DTYPES[t.dtype].split(".")[1])
    layout = gl.NVMMASharedLayout.get_default_for(block, gl_dtype)
    return TensorDescriptor(t, list(t.shape), _tma_strides(t), block, layout)


def _gluon_full_getter(dag: Dag, batch: bool):
    """``descriptor(name, batched, config)`` for ``_epilogue_items``: whole tiles, except
    outputs staged per column piece and those stored by slot chunk (``gluon_codegen.Buffers``);
    in a batched kernel (``batch``) every tile's is 3-D, a leading 1 for tensors without
    batch slices of their own (``gluon_codegen.Buffers.batch``)."""
    from .gluon_codegen import buffers, slot_columns

    pieces = {n for n, _ in buffers(dag).piece_stores}
    slotted = buffers(dag, slots=True)
    chunked = {n for n, _ in slotted.slot_stores + slotted.consumer_tiles}

    def descriptor(name: str, batched: bool, config: TileConfig):
        width = config.block_n // config.epi_split if name in pieces else config.block_n
        if config.slots and name in chunked:  # a chunk of its buffer, of its own dtype
            width = slot_columns(dag.output(name).dtype)
        block = [1] * batch + [_epi_rows(config), width]
        make = _rebased(lambda t: _gluon_descriptor(_as2d_or_3d(t, batch), block))

        def get(A, B, values):
            return make(values[name])
        return get

    return descriptor


def _vector_view(t: torch.Tensor, kind: OperandKind) -> torch.Tensor:
    """A per-row/per-column operand as the 1-D tensor of its M or N values (same storage)."""
    shape, strides = (1,) * (3 - t.dim()) + tuple(t.shape), _strides_lmn(t)
    axis = 1 if kind is OperandKind.PER_ROW else 2
    return t.as_strided((shape[axis],), (strides[axis] if shape[axis] > 1 else 1,))


def _epi_rows(config: TileConfig) -> int:
    """Rows of a gluon consumer's epilogue block (its aux tiles' TMA box)."""
    return config.block_m // 2 if config.cooperative else config.block_m


def _gluon_vector_getter(name: str, kind: OperandKind, config: TileConfig):
    """The getter of a staged vector's 1-D TMA descriptor (one tile's slice per load)."""
    block = [_epi_rows(config) if kind is OperandKind.PER_ROW else config.block_n]
    make = _rebased(lambda t: _gluon_descriptor(_vector_view(t, kind), block))

    def get(A, B, values):
        return make(values[name])
    return get


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


def tile_work(dag: Dag) -> int:
    """The elementwise ops the epilogue runs on every element of the tile."""
    return sum(1 for n in dag.nodes if n.kind is NodeKind.COMPUTE and n.space is Space.FULL)


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
    description = ("warp-specialized ping-pong (Gluon, sm_90): a TMA producer warp, two MMA "
                   "warpgroups on alternate tiles (one's epilogue overlaps the other's "
                   "mainloop) or both on one 128x256 tile (cooperative, '_co'), aux tiles "
                   "TMA-loaded into shared memory ahead of the epilogue")

    def supports(self, args, target):
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
        # that buys A/B stages
        if split < 4 and self._stages(dag, 4, elt) > self._stages(dag, split, elt):
            split = 4
        return split

    CO_BN = 256  # cooperative tiles: 128x256, 64 rows per consumer
    # Tile order of the cooperative tiles: bands of 4 row-tiles. At 8192x8192x1024 a wave
    # of 132 such tiles then covers all of B's columns (4 x 33 tiles), so B stays in L2
    # from one wave to the next while the output streams through it; bands of 8 cover half
    # of B per wave and fetch it again (Nsight Compute, identity, 8192x8192x1024: L2 hit
    # rate 93% against 85%, DRAM throughput 30% against 35%). Measured on H100
    # (scripts/group_probe.py, guarded timing, ms, GROUP_M 4 / 8): identity 0.1937 / 0.1957,
    # row amax 0.2178 / 0.2183, BCE 0.2836 / 0.2910 at 8192x8192x1024; alpha-beta 0.1882 /
    # 0.1887 and BCE 0.2061 / 0.2072 at 4096^3; alpha-beta 0.0333 / 0.0335, BCE 0.0397 /
    # 0.0402, identity 0.0287 / 0.0286 at 2048^3.
    CO_GROUP_M = 4

    def _epilogue_smem(self, dag: Dag, split: int, direct: tuple[str, ...] = (),
                       coop: bool = False, slots: bool = False) -> int:
        from .gluon_codegen import buffers

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
        scratch than the 4-warp config's plan left)."""
        return self._fit_stages(args.optimized_dag, args.A.element_size(), config)

    def _fit_stages(self, dag: Dag, elt: int, config: TileConfig) -> int:
        direct = self._config_direct(dag, config, elt)
        return min(config.num_stages,
                   self._ring(dag, config.epi_split, elt, direct, config.cooperative,
                              config.slots, config.num_warps))

    def _chunk(self, dag: Dag, split: int, coop: bool = False) -> int:
        """Columns of the consumer's store chunks where the tile-staged outputs, and every
        output without a buffer of its own, fit them (``gluon_codegen.slots_fit``), else 0."""
        from .gluon_codegen import buffers, chunk_columns, slots_fit

        bufs = buffers(dag, slots=True)
        bn = self.CO_BN if coop else self.BN
        return chunk_columns(bufs) if slots_fit(bufs, bn, bn // split) else 0

    def _direct(self, dag: Dag, split: int, elt: int, stages: int | None = None,
                coop: bool = False) -> tuple[str, ...]:
        """Outputs to store from registers instead of staging their pieces in shared
        memory: all piece-staged ones, where that buys A/B stages (measured on H100, alpha-
        beta 8192x8192x1024: 3, 4, 5 stages 0.301, 0.253, 0.237 ms; relu with an aux output
        has C/D tiles and F pieces, 4 stages) and a config's ``stages`` need them."""
        from .gluon_codegen import buffers

        pieces = tuple(n for n, _ in buffers(dag).piece_stores)
        staged = self._ring(dag, split, elt, (), coop)
        if pieces and self._ring(dag, split, elt, pieces, coop) > staged and (
                stages is None or stages > staged):
            return pieces
        return ()

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
            return True, self._ring(dag, split, elt, (), coop=coop, slots=True)
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
        # measured (scripts/gluon_probe.py, alpha-beta 8192x8192x1024 on H100): 5 stages,
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

    def configs(self, args, target):
        dag = args.optimized_dag
        elt = args.A.element_size()
        split = self._split(dag, elt)
        out = self._ping_pong(dag, split, elt)
        if not out:
            return []
        # the other piece count too, for the tuner: which wins depends on the epilogue
        # (the BCE loss: halves 0.263 ms, quarters 0.274 at 8192x8192x1024, perf_probe)
        if not self._forced_split():
            out += self._ping_pong(dag, 2 if split == 4 else 4, elt)
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
                          tile_n=config.block_n if chunk else 0, warps=config.num_warps)

    def plan(self, args, dag, config, target):
        spec = self.spec(args, config, target)
        bm, bn, bk = config.block_m, config.block_n, config.block_k
        items: list[Any] = [*_operand_getters(spec, config, _gluon_descriptor), args.M, args.N,
                            args.K, args.L]
        items += _epilogue_items(args, dag, "gluon", config,
                                 descriptor=_gluon_full_getter(dag, spec.a_batched or spec.b_batched),
                                 direct=spec.direct)
        tiles = tile_count(args, config)
        # one whole-output partial per consumer warpgroup, two per program
        red_items, post = _reduction_items(args, dag, config, "gluon", target,
                                           programs=2 * min(_sms(target), tiles))
        items += red_items
        consumer_regs, producer_regs = self.REGS[config.num_warps]
        consts = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=config.group_m,
                      NUM_STAGES=config.num_stages, EVEN_MN=even_tiles(args, config),
                      CONSUMER_REGS=consumer_regs, PRODUCER_REGS=producer_regs,
                      num_warps=config.num_warps)
        return items, consts, (min(_sms(target), tiles),), post


FAMILIES: tuple[KernelFamily, ...] = (GluonFamily(), HopperFamily(), PortableFamily())

__all__ = ["FAMILIES", "KernelFamily", "TileConfig", "Target", "HopperFamily", "PortableFamily",
           "GluonFamily"]
