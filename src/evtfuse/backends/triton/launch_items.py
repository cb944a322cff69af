"""The positional arguments of a generated kernel's launch, shared by the kernel families:
getters of per-call values (tensors, runtime scalars), TMA descriptors (validated once per
plan, rebased per call), strides, reduction workspaces and the combine steps after the
kernel, and why a tensor cannot move by TMA.

Layer: backends/triton. Invariant: the items come in the order of the generated kernel's
parameters (``spec.epilogue_params`` for the epilogue's); a plan's fixed items (sizes,
strides, workspaces) hold for every problem of its structure, and what changes per call
is a callable ``get(A, B, values)`` (``KernelFamily.plan``). Imports no family module.
"""

from __future__ import annotations

import concurrent.futures
import functools
import numbers
from typing import Any

import torch

from ...arguments import OFFS_KEY, GemmArguments
from ...errors import not_an_operand, scalar_value
from ...ir import Dag, OperandKind, OutputKind
from ...optable import EXP_PARTIALS
from .family_base import INTERPRETER, Target, TileConfig, triton_cdiv
from .gluon_buffers import buffers, slot_columns
from .versions import LAUNCH_OPTIONS
from .spec import (FOLD_IDENTITY_BITS, FOLD_IDENTITY_BITS64, TMA_FAMILIES, KernelSpec, atomic_folded, combined_in_kernel,
                   full_outputs, reduce_outputs, staged_vector, vector_outputs)

INT32_MAX = 2 ** 31 - 1
TMA_STRIDE_BYTES = 2 ** 40  # a TMA descriptor's strides are below 2^40 bytes (cuTensorMapEncodeTiled)
TMA_DIM = 2 ** 31  # its dimensions: below 2^32 in the hardware, passed as int32 by Triton 3.6


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


def _get_a(A, B, values):
    return A


def _get_b(A, B, values):
    return B


def _get_offs(A, B, values):
    """A grouped GEMM's offsets (``GemmArguments.launch_values``)."""
    return values[OFFS_KEY]


def _value_getter(name: str):
    def get(A, B, values):
        return values[name]
    return get


def _scalar_getter(name: str):
    def get(A, B, values):
        v = values[name]
        if type(v) is float:
            return v
        if isinstance(v, numbers.Real) and not isinstance(v, bool):
            return scalar_value(name, v)  # 10**400: an error naming it
        # a repeated gemm call reaches a cached plan without the frontend's validation
        raise not_an_operand(name, v)
    return get


def _batched(t: torch.Tensor) -> bool:
    """Whether operand A or B has batch slices of its own (a leading dimension above 1)."""
    return t.dim() == 3 and t.shape[0] > 1


def _rebased(make):
    """``make(t)`` validated once per launch plan; later tensors of the plan's structure
    (same shape, strides, dtype and 16-byte alignment: the plan's key) get a copy of that
    descriptor with their own base. The launcher reads only the base's data pointer, which
    every view ``make`` takes (transpose, unsqueeze, batch 0) shares with the tensor. No
    tensor is kept: a descriptor kept for the next call (to skip this copy) held its
    tensor, a CUDA graph pool's output that torch.compile's "reduce-overhead" then found
    alive after its call and refused."""
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

    return get


def _descriptor_getter(name: str, batched: bool, config: TileConfig, gated: bool = False):
    make = _rebased(lambda t: _descriptor(t, batched, config, gated))

    def get(A, B, values):
        return make(values[name])
    return get


def _epilogue_items(args: GemmArguments, dag: Dag, family: str, config: TileConfig,
                    descriptor=None, direct: tuple[str, ...] = (), l2_spread: bool = False
                    ) -> list[Any]:
    """Items for ``spec.epilogue_params`` in the same order (see ``KernelFamily.plan``);
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
    """A reduction output the kernel writes itself (roles "out", "osl"[, "os"] of
    ``spec.epilogue_params``): its getter, batch stride, and row/column stride."""
    strides = _strides_lmn(args.epilogue.values[o.name])
    items = [_value_getter(o.name), strides[0] if o.batched else 0]
    if o.kind is not OutputKind.SCALAR:
        items.append(strides[1] if o.kind is OutputKind.ROW else strides[2])
    return items


def _allocate(specs: list[tuple], device: torch.device) -> list:
    return [torch.empty(shape, dtype=dt, device=device) for shape, dt, _ in specs]


@functools.lru_cache(maxsize=1)
def _allocator() -> concurrent.futures.ThreadPoolExecutor:
    """The thread that allocates ``StreamLocal`` sets outside any graph pool."""
    return concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="evtfuse-workspaces")


class StreamLocal:
    """Tensors a launch plan keeps between calls (reduction workspaces, ticket counters),
    one set per CUDA stream of the plan's device, made the first time a stream runs the
    plan: two streams running the same plan at once never share them.

    ``specs``: (shape, dtype, fill or None) of each tensor. A set is allocated on the
    device's default stream, outside any memory pool the current stream or thread
    allocates to (a CUDA graph's capture; torch.compile's "reduce-overhead" warm-up, which
    routes its thread's allocations: another thread allocates then), so a tensor the plan
    keeps is never a live allocation of a graph's pool; its fills run on the current
    stream (captured with a graph, so every replay starts from them). A set first made
    while a graph is captured is kept for the life of the process (the graph holds its
    addresses). Under the interpreter there is one set."""

    __slots__ = ("index", "specs", "sets", "device")
    _captured: list = []  # sets that captured graphs may still use

    def __init__(self, device: torch.device, specs: list[tuple]):
        self.device = device
        self.index = device.index if device.type == "cuda" else None
        self.specs = specs
        self.sets: dict[int, list] = {}
        self.current()  # the plan's first set, on the stream that builds it

    def current(self) -> list:
        stream = 0 if self.index is None else torch._C._cuda_getCurrentRawStream(self.index)
        got = self.sets.get(stream)
        if got is None:
            got = self.sets[stream] = self._make()
        return got

    def _make(self) -> list:
        capturing = self.index is not None and torch.cuda.is_current_stream_capturing()
        if self.index is None:
            made = _allocate(self.specs, self.device)
        elif capturing:  # a capture's own pool takes only its stream's allocations
            with torch.cuda.stream(torch.cuda.default_stream(self.index)):
                made = _allocate(self.specs, self.device)
        else:
            # torch.compile's "reduce-overhead" warm-up routes every allocation of this thread
            # to its graph pool, whatever the stream: another thread allocates the set, on the
            # default stream, and the current stream waits for that stream's earlier work
            made = _allocator().submit(_allocate, self.specs, self.device).result()
            current, default = (torch.cuda.current_stream(self.index),
                                torch.cuda.default_stream(self.index))
            if current != default:
                current.wait_stream(default)
        for t, (_, _, fill) in zip(made, self.specs):
            if fill is not None:
                t.fill_(fill)
        if capturing:
            StreamLocal._captured.append(made)
        return made

    def getter(self, i: int):
        """A plan item: the current stream's i-th tensor."""
        return lambda A, B, values: self.current()[i]


def _reduction_items(args: GemmArguments, dag: Dag, config: TileConfig, family: str,
                     target: Target, programs: int = 0):
    """Workspaces for reduction partials (``StreamLocal``: allocated once per plan and
    stream) and the steps that combine them, in a fixed order, into each output.
    ``programs`` > 0: a persistent kernel keeps whole-output, non-batched reductions per
    program (one partial each)."""
    from .combine import pdl_enabled

    if getattr(args, "group_dim", None) == "M":
        return _grouped_reduction_items(args, dag, config), []
    pdl = target.kind != INTERPRETER and pdl_enabled(target.cc // 10)
    items: list[Any] = []
    post: list[Any] = []
    mt = triton_cdiv(args.M, config.block_m)
    nt = triton_cdiv(args.N, config.block_n)
    dev = args.A.device
    made: list[tuple] = []  # (shape, dtype, fill or None) of each workspace, in order

    f64 = args.A.dtype == torch.float64  # partials in float64 (a float64 kernel's)

    def new(shape, dtype=torch.float64 if f64 else torch.float32, fill=None) -> int:
        made.append((tuple(shape), dtype, fill))
        return len(made) - 1

    steps = []
    for o in reduce_outputs(dag):
        if atomic_folded(o):  # a float32 value per row/column (per batch), kept as int32 bits
            extent = args.M if o.kind is OutputKind.ROW else args.N
            ws = new(((args.L if o.batched else 1) * extent,),
                     torch.int64 if f64 else torch.int32,  # float64: int64 bits
                     (FOLD_IDENTITY_BITS64 if f64 else FOLD_IDENTITY_BITS)[o.node.op])
            steps.append(("items", [ws, new((1,), torch.int32, 0)], o))
            continue
        shape = {OutputKind.ROW: (args.L, nt, args.M), OutputKind.COL: (args.L, mt, args.N),
                 OutputKind.SCALAR: (args.L, mt, nt)}[o.kind]
        per_program = programs > 0 and o.kind is OutputKind.SCALAR and not o.batched
        if per_program:
            shape = (programs,)
        ws = new(shape)
        if combined_in_kernel(o, family):  # the kernel combines: ticket counters, the output
            groups = {OutputKind.ROW: mt, OutputKind.COL: nt, OutputKind.SCALAR: 1}[o.kind]
            steps.append(("items", [ws, new(((args.L if o.batched else 1) * groups,),
                                            torch.int32, 0)], o))
            continue
        lse = o.node.op in EXP_PARTIALS
        steps.append(("combine", [ws, new(shape) if lse else None], o, per_program))
    local = StreamLocal(dev, made)
    for kind, spaces, o, *rest in steps:
        if kind == "items":
            items += [*(local.getter(i) for i in spaces), *_output_items(args, o)]
            continue
        items += [local.getter(i) for i in spaces if i is not None]
        post.append(_combiner(o.name, o.node.op, local, *spaces, o.kind,
                              o.batched and not rest[0], pdl))
    return items, post


def _grouped_reduction_items(args: GemmArguments, dag: Dag, config: TileConfig) -> list[Any]:
    """A grouped kernel's (over M) reduction items, in ``spec.grouped_roles`` order: every
    reduction is combined in the kernel (``grouped_reduce``). Workspaces for an upper
    bound of the row tiles that run, ``cdiv(T, BLOCK_M) + G`` (``offs`` is not read here):
    per row, a partial per tile along N and row; per column, per row tile and column; a
    scalar per tile. Ticket counters: per row tile; per (group,) column tile; per group
    (or one)."""
    T, N, G = args.M, args.N, args.L
    mt = triton_cdiv(T, config.block_m) + G
    nt = triton_cdiv(N, config.block_n)
    made: list[tuple] = []
    steps = []
    wdt = torch.float64 if args.A.dtype == torch.float64 else torch.float32
    for o in reduce_outputs(dag):
        size = {OutputKind.ROW: nt * T, OutputKind.COL: mt * N, OutputKind.SCALAR: mt * nt}[o.kind]
        spaces = [len(made)]
        made.append(((max(size, 1),), wdt, None))
        if o.node.op in EXP_PARTIALS:
            spaces.append(len(made))
            made.append(((max(size, 1),), wdt, None))
        groups = {OutputKind.ROW: mt, OutputKind.COL: nt, OutputKind.SCALAR: 1}[o.kind]
        if o.batched and o.kind is not OutputKind.ROW:
            groups *= G
        spaces.append(len(made))
        made.append(((groups,), torch.int32, 0))
        steps.append((spaces, o))
    local = StreamLocal(args.A.device, made)
    items: list[Any] = []
    for spaces, o in steps:
        items += [*(local.getter(i) for i in spaces), *_output_items(args, o)]
    return items


def _combiner(name: str, op: str, local: StreamLocal, ws: int, ws2: int | None, kind,
              batched: bool, pdl: bool = False):
    """The combine step after the kernel (``combine.combine_partials``, one launch, a fixed
    order): logsumexp's (max, sum of exp) partials, the TMA families' per-row/per-column
    sums and batched whole-output reductions. ``ws``/``ws2``: the partials' positions in
    ``local``'s sets, each viewed as (batches kept, partials per result, results).
    ``pdl``: a programmatic dependent launch (the kernel before it lets it start early,
    ``spec.launch_dependents_lines``)."""
    from .combine import combine_partials, launch_shape
    from .launch import direct_launcher

    first = local.current()[ws]
    ext = first.shape[-1] if kind in (OutputKind.ROW, OutputKind.COL) else 1
    b = first.shape[0] if batched else 1
    t = first.numel() // (b * ext)
    block, parts, warps = launch_shape(t, ext)
    consts = {"OP": op, "BLOCK": block, "PARTS": parts, "PDL": pdl}
    grid = (triton_cdiv(ext, block), b)
    state: dict[str, Any] = {}

    def combine(values) -> None:
        out = values[name]
        sl, sm, sn = _strides_lmn(out)
        spaces = local.current()
        pos = [spaces[ws], spaces[ws if ws2 is None else ws2], out, t, ext,
               sl if batched else 0, {OutputKind.ROW: sm, OutputKind.COL: sn}.get(kind, 0)]
        launch = state.get("launch")
        if launch is None or not launch(pos):
            compiled = combine_partials[grid](*pos, **consts, num_warps=warps, launch_pdl=pdl,
                                              **LAUNCH_OPTIONS)
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


def _gated_descriptor_getter(name: str, batched: bool, config: TileConfig):
    """``_descriptor_getter`` for a gated epilogue's tiles (``pairs(accum)``): a sub-tile
    spans half of its B columns."""
    return _descriptor_getter(name, batched, config, gated=True)


def _descriptor(t: torch.Tensor, batched: bool, config: TileConfig, gated: bool = False):
    """The TMA descriptor of a full aux tile's sub-tiles (``gated``: half as wide, the
    output's columns of the sub-tile's B columns)."""
    sub_n = config.block_n // (config.epi_split * (2 if gated else 1))
    block = [1, config.block_m, sub_n] if batched else [config.block_m, sub_n]
    return _make_descriptor(_as2d_or_3d(t, batched), block)


def _tma_ok(view: torch.Tensor, name: str) -> str | None:
    """Why ``view`` cannot be a TMA tensor as a descriptor takes it (rows along its last
    dimension): a 16-byte aligned base, a unit last stride and 16-byte aligned strides
    elsewhere, dimensions of size 1 aside (``_tma_strides``), strides below ``TMA_STRIDE_BYTES``
    and dimensions below ``TMA_DIM``."""
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
        if st * elt >= TMA_STRIDE_BYTES:
            return (f"{name}'s stride {st} ({st * elt} bytes) is 2^40 bytes or more; a TMA "
                    "descriptor's strides are below 2^40 bytes")
    if any(d >= TMA_DIM for d in shape):
        return f"{name} has a dimension of 2^31 or more (shape {shape}); TMA dimensions are int32"
    return None


def _tma_refusal(args: GemmArguments, outputs: bool = True) -> str | None:
    """Why A, B or a full aux operand/output cannot move by TMA (None: all can). A and B
    are checked as the kernels read them: column-major ones (last stride not 1) as their
    transposes; aux tiles row-major. ``outputs`` False: the full outputs are stored through
    pointers (a grouped kernel's), not checked."""
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
    for o in full_outputs(dag) if outputs else ():
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
    validated once per plan and rebased on each call's tensors (a concatenated gated
    epilogue's B blocks: half the tile's columns, ``codegen._hopper_mainloop``)."""
    bm, bn, bk = config.block_m, config.block_n, config.block_k
    if spec.dag.concatenated:  # gate's and up's halves of the tile, loaded apart
        bn //= 2

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


def _gluon_descriptor(t: torch.Tensor, block: list[int]):
    """A Gluon TMA descriptor: 128-byte-swizzled shared layout, as wgmma and ldmatrix read."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from .spec import TL_DTYPES

    gl_dtype = getattr(gl, TL_DTYPES[t.dtype].split(".")[1])
    layout = gl.NVMMASharedLayout.get_default_for(block, gl_dtype)
    return TensorDescriptor(t, list(t.shape), _tma_strides(t), block, layout)


def _gluon_full_getter(dag: Dag, batch: bool, direct: tuple[str, ...] = ()):
    """``descriptor(name, batched, config)`` for ``_epilogue_items``: whole tiles, except
    outputs staged per column piece and those stored by slot chunk (``gluon_buffers.Buffers``);
    in a batched kernel (``batch``) every tile's is 3-D, a leading 1 for tensors without
    batch slices of their own (``gluon_buffers.Buffers.batch``)."""

    pieces = {n for n, _ in buffers(dag, direct).piece_stores}  # as the kernel has them
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


def _largest_offset(t: torch.Tensor) -> int:
    """The offset, in elements, of ``t``'s element farthest from its first."""
    return sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride()) if n > 0)


def needs_int64(args: GemmArguments, family: str, config: TileConfig,
                direct: tuple[str, ...] = ()) -> bool:
    """Whether ``family``'s kernel for ``args`` must compute element offsets in 64 bits
    (``KernelSpec.int64``): a tensor it addresses through pointers (A and B in the
    portable family; operands and outputs that do not move by TMA, ``direct`` outputs
    and operands included; the reduction workspaces of ``config``'s tiles) has an element past
    2^31 - 1 from its first. An offset is an index times a stride, which Triton computes
    in int32 where both are (strides below 2^31 arrive as int32): a fp32 D of 16384 x 152064
    (an LM head's logits) or a C with a row stride of 2^30 wrapped to a negative offset.
    Smaller problems keep int32 arithmetic."""
    dag, values = args.optimized_dag, args.epilogue.values
    tma = family in TMA_FAMILIES
    tensors = [] if tma else [args.A, args.B]
    for s in dag.used_operands:
        if s.kind is OperandKind.RUNTIME_SCALAR or staged_vector(s, family) \
                or (tma and s.kind is OperandKind.FULL and s.name not in direct):
            continue
        tensors.append(values[s.name])
    for o in dag.outputs:
        t = values.get(o.name)
        if t is None or (tma and o.kind is OutputKind.FULL and o.name not in direct):
            continue
        tensors.append(t)
    if any(_largest_offset(t) > INT32_MAX for t in tensors):
        return True
    if not reduce_outputs(dag):
        return False
    mt, nt = triton_cdiv(args.M, config.block_m), triton_cdiv(args.N, config.block_n)
    return args.L * max(nt * args.M, mt * args.N, mt * nt) > INT32_MAX  # partials
