"""What shapes a generated kernel, and the questions its emitters ask of the DAG.

Layer: backends/triton. ``KernelSpec`` is everything the generated source depends on (its
hash is the compile cache's key, ``GENERATOR_VERSION`` included); the functions below say
which outputs are full tiles, stored vectors or reductions, how each reduction is
combined (in the kernel, by atomic folds, or by a launch after it) and which kernel
parameters the epilogue takes, in one fixed order that the families' launch plans
(``families``) and the emitters (``codegen``, ``gluon_codegen``) both follow.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property

import torch

from ... import ir
from ...ir import Dag, NodeKind, OperandKind, OutputKind
from ...optable import EXP_PARTIALS, _lit, int_range
from .names import Names

TL_DTYPES = {
    torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16", torch.float32: "tl.float32",
    torch.float64: "tl.float64", torch.int8: "tl.int8", torch.uint8: "tl.uint8",
    torch.int32: "tl.int32", torch.int64: "tl.int64", torch.int16: "tl.int16",
    torch.bool: "tl.int1",
}
TL_DTYPES.update({torch.float8_e4m3fn: "tl.float8e4nv", torch.float8_e5m2: "tl.float8e5"})


@dataclass(frozen=True)
class KernelSpec:
    """Everything that shapes the generated source (its cache key is a hash of this)."""

    family: str  # "hopper" | "portable"
    dag: Dag
    a_trans: bool  # A is column-major (M contiguous)
    b_trans: bool  # B is column-major (K contiguous)
    a_batched: bool
    b_batched: bool
    epi_split: int  # sub-tiles along N in the epilogue (hopper)
    cuda: bool  # real GPU (fast spellings, inline asm) vs the CPU interpreter
    prefetch: bool = False  # hopper: issue full aux loads before the mainloop of the tile
    int_acc: bool = False  # int8/uint8 inputs accumulated in int32
    acc16: bool = False  # fp16 or fp8 inputs accumulated in fp16 (``accumulator_type=
    #                      torch.float16``); the epilogue computes in fp32 from it
    u8_offset: bool = False  # portable: uint8 inputs, which Triton's dot does not take, as
    #                          int8 a - 128 and b - 128, the products' offset terms added
    #                          from per-row sums of A's tiles and per-column sums of B's
    #                          (``codegen._u8_lines``; exact modulo 2^32, as int32 is)
    direct: tuple[str, ...] = ()  # gluon: outputs stored, and full operands read, from registers (no shared memory);
    #                               hopper: a grouped kernel's full outputs, stored through
    #                               pointers masked to their group's rows
    coop: bool = False  # gluon: both consumers on one tile (each BLOCK_M // 2 rows)
    chunk: int = 0  # gluon: columns of the consumer's store chunks (``gluon_tile.SlotPlan``; 0: none)
    tile_n: int = 0  # gluon: BLOCK_N, where the store chunks need it
    l2_spread: bool = False  # hopper: full aux tiles asked into L2 line by line over the
    #                          mainloop's last k-steps (``_l2_spread_lines``)
    early_vectors: bool = False  # hopper: every piece's per-row/per-column operand loads
    #                              issued together at the top of the tile's epilogue
    warps: int = 4  # gluon: warps of each consumer partition (4: one warpgroup; 8: two,
    #                 64 of the tile's rows each)
    fp8_promote: bool = False  # fp8 inputs: each k-step's dot sums in the tensor cores'
    #                            reduced precision, then adds to the fp32 accumulator
    #                            (Triton's max_num_imprecise_acc = BLOCK_K); False: fast
    #                            accumulation over the whole of K
    int64: bool = False  # element offsets in 64 bits (``int64_lines``): some tensor the
    #                      kernel addresses through pointers reaches past 2^31 - 1 elements
    #                      (``launch_items.needs_int64``); in int32 they would wrap
    grouped: bool = False  # portable, hopper: a grouped GEMM (groups over M: L is the group
    #                        count, M the rows of every group, ``offs`` their cumulative ends)
    k_grouped: bool = False  # portable: a grouped GEMM over K (L is the group count, a
    #                          batch's K the range of its group in ``offs``)
    runtime_m: bool = False  # M (a grouped GEMM's rows) passed unspecialised: Triton
    #                          neither folds M == 1 nor assumes 16 | M, so every M of a size
    #                          class runs the same compiled kernel (``jit_line``). Where A
    #                          is read through TMA or along K; a portable kernel's loads of
    #                          an M-contiguous A vectorise on 16 | M, so there it stays
    f64: bool = False  # portable: float64 inputs, accumulated in float64; the epilogue
    #                    computes in float64 (``compute``), with the op table's portable
    #                    spellings (``cuda_spellings``: the GPU's are fp32 instructions)

    @property
    def compute(self) -> str:
        """The dtype the epilogue computes in: float64 for float64 inputs, else float32."""
        return "tl.float64" if self.f64 else "tl.float32"

    @property
    def cuda_spellings(self) -> bool:
        """Whether the op table's GPU spellings (``triton_cuda``: fp32 inline assembly,
        MUFU approximations) are used: on a GPU, not in float64."""
        return self.cuda and not self.f64

    def jit_line(self, module: str = "triton") -> str:
        """The kernel's decorator: ``@triton.jit`` or ``@gluon.jit``, with M's parameter
        unspecialised where ``runtime_m``."""
        if not self.runtime_m:
            return f"@{module}.jit"
        return f"@{module}.jit(do_not_specialize=[{self.rows_param()!r}])"

    def rows_param(self) -> str:
        """The kernel parameter that holds M (a grouped kernel's: every group's rows)."""
        return "grp_rows" if self.grouped else "M"

    @cached_property
    def names(self) -> Names:
        """The numbers of the DAG's operands and outputs, and every identifier the
        emitters build from them (``names.Names``)."""
        return Names.of(self.dag)

    def key(self) -> str:
        text = "|".join([self.family, ir.signature(self.dag), str(int(self.a_trans)),
                         str(int(self.b_trans)), str(int(self.a_batched)),
                         str(int(self.b_batched)), str(self.epi_split), str(int(self.cuda)),
                         str(int(self.prefetch)), str(int(self.int_acc)), ",".join(self.direct),
                         str(int(self.coop)), str(self.chunk), str(self.tile_n), str(int(self.l2_spread)),
                         str(int(self.early_vectors)), str(self.warps),
                         str(int(self.fp8_promote)), str(int(self.int64)),
                         str(int(self.grouped)), str(int(self.k_grouped)),
                         str(int(self.runtime_m)), GENERATOR_VERSION]
                        # fields added since: in the key only when set, so that the keys
                        # of kernels without them stay as they were
                        + (["u8_offset"] if self.u8_offset else [])
                        + (["acc16"] if self.acc16 else [])
                        + (["f64"] if self.f64 else []))
        return hashlib.sha256(text.encode()).hexdigest()[:24]


GENERATOR_VERSION = "41"  # also part of the tuning key: a new generator re-tunes
#                           (35: the interpreter's maximum/minimum with a scalar first; gluon
#                           stages planned with the scratch of per-column reductions;
#                           36: the gluon family takes batched problems; 37-39: identifiers
#                           by number, ``names``; 64-bit offsets past 2^31 elements,
#                           ``int64``; special values as torch: neg, relu, leaky_relu, tanh,
#                           softplus, pow, logsumexp; masks kept boolean for Triton 3.9;
#                           41: M unspecialised, ``runtime_m``)
TMA_FAMILIES = ("hopper", "gluon")  # full aux tiles move through tensor descriptors
_LD_L2 = 'cache_modifier=".cg"'  # loads of partials other SMs wrote: from L2, not a stale L1
_FOLD_FINISH = 4096  # workspace elements copied per step by the last program (atomic folds)
# a fold workspace's resting value: the float32 bits of the reduction's identity, as int32
FOLD_IDENTITY_BITS = {"max": -8388608, "min": 0x7F800000}  # -inf (0xFF800000), +inf
# a float64 kernel's: the float64 bits as int64 (-inf 0xFFF0000000000000, +inf)
FOLD_IDENTITY_BITS64 = {"max": -4503599627370496, "min": 0x7FF0000000000000}
_COMBINE_LOADS = 8  # partials loaded per step of an in-kernel per-row/per-column combine


# integer output dtypes and the fp32 range they saturate to (the op table's reading)
INT_OUTPUTS = {dt: int_range(dt) for dt in (torch.int8, torch.uint8, torch.int32)}


def _saturated(value: str, dtype: torch.dtype) -> str:
    """An fp8 store's value clamped to the dtype's largest finite value, NaN kept."""
    return f"_ef_sat({value}, {_lit(torch.finfo(dtype).max)})"


def full_outputs(dag: Dag):
    return [o for o in dag.outputs if o.kind is OutputKind.FULL]


def vector_outputs(dag: Dag):
    return [o for o in dag.outputs if o.kind in (OutputKind.ROW, OutputKind.COL, OutputKind.SCALAR)
            and o.node.kind is not NodeKind.REDUCE]


STAGED_VECTOR_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def staged_vector(spec, family: str) -> bool:
    """A per-row/per-column operand the gluon family TMA-loads into shared memory with the
    tile's aux tiles (its consumers then read it there instead of waiting on global loads,
    whose latency ptxas may leave exposed once per load); other dtypes, and vectors with
    batch slices of their own, are read directly."""
    return family == "gluon" and spec.kind in (OperandKind.PER_ROW, OperandKind.PER_COL) \
        and spec.dtype in STAGED_VECTOR_DTYPES and not spec.batched


def epilogue_params(names: Names, dag: Dag, family: str, direct: tuple[str, ...] = (),
                    l2_spread: bool = False, grouped: bool = False) -> list[tuple[str, str | None]]:
    """Kernel parameters for the epilogue's operands and outputs, in a fixed order, each
    as (identifier, its role in ``names.ROLES``; None: a runtime scalar's value)
    (``direct``: outputs a TMA family stores, and full operands it reads, through pointers,
    ``KernelSpec.direct``;
    ``l2_spread``: full aux tiles also get their pointer and row stride, ``KernelSpec.l2_spread``;
    ``grouped``: a grouped kernel over M, whose reductions are all combined in the kernel,
    ``grouped_roles``)."""
    roles: list[tuple[str, str | None]] = []
    for spec in dag.used_operands:
        if spec.kind is OperandKind.RUNTIME_SCALAR:
            got: list[str | None] = [None]
        elif spec.kind is OperandKind.DEVICE_SCALAR:
            got = ["ptr", "sl"]
        elif staged_vector(spec, family):
            got = ["desc"]
        elif spec.kind is OperandKind.PER_ROW:
            got = ["ptr", "sl", "sm"]
        elif spec.kind is OperandKind.PER_COL:
            got = ["ptr", "sl", "sn"]
        elif family in TMA_FAMILIES and spec.name not in direct:
            got = ["desc"] + (["ptr", "sm"] if l2_spread else [])
        else:
            got = ["ptr", "sl", "sm", "sn"]
        roles += [(spec.name, r) for r in got]
    for o in full_outputs(dag):
        tma = family in TMA_FAMILIES and o.name not in direct
        roles += [(o.name, r) for r in (["desc"] if tma else ["ptr", "sl", "sm", "sn"])]
    for o in vector_outputs(dag):
        roles += [(o.name, r) for r in ("ptr", "sl", "sm", "sn")]
    for o in reduce_outputs(dag):
        if grouped:
            roles += [(o.name, r) for r in grouped_roles(o)]
        elif combined_in_kernel(o, family) or atomic_folded(o):
            roles += [(o.name, r) for r in written_roles(o)]
        else:
            two = o.node.op in EXP_PARTIALS  # (max, sum of exp) partials
            roles += [(o.name, r) for r in (("ws", "ws2") if two else ("ws",))]
    return [(names(n, r), r) for n, r in roles]


def written_roles(o) -> tuple[str, ...]:
    """The parameters of a reduction output the kernel writes itself: workspace, ticket
    counter, output pointer, batch stride and (per row/column) element stride."""
    return ("ws", "cnt", "out", "osl") + (() if o.kind is OutputKind.SCALAR else ("os",))


def grouped_roles(o) -> tuple[str, ...]:
    """The kernel parameters of a grouped kernel's reduction output ``o``
    (``grouped_reduce``): its workspace (two for logsumexp and shifted_sumexp), ticket counters, the output,
    its batch stride and its row or column stride (not for a scalar)."""
    return (("ws", "ws2") if o.node.op in EXP_PARTIALS else ("ws",)) + ("cnt", "out", "osl") \
        + (() if o.kind is OutputKind.SCALAR else ("os",))


# strides among the roles: cast to int64 at a kernel's top where ``KernelSpec.int64``
STRIDE_ROLES = ("sl", "sm", "sn", "osl", "os")


def int64_lines(spec: KernelSpec, params, indent: str, fixed: tuple[str, ...] = ()) -> list[str]:
    """Where ``spec.int64``: each stride among ``params`` ((identifier, role) pairs) and the
    ``fixed`` stride parameters rebound to int64 at the top of a function, so that every
    element offset (an index times a stride, in int32 otherwise) is computed in 64 bits.
    ``tl.cast``: Triton passes a stride equal to 1 as a constant, which has no ``.to``."""
    if not spec.int64:
        return []
    strides = list(fixed) + [p for p, role in params if role in STRIDE_ROLES]
    return [f"{indent}{p} = tl.cast({p}, tl.int64)" for p in strides]


def reduce_outputs(dag: Dag):
    """Outputs computed by a reduction: each tile writes its partial result into a
    workspace (per-row: [L, tiles along N, M]; per-column: [L, tiles along M, N]; whole
    output: [L, tiles along M, tiles along N]), combined in a fixed order, so results are
    deterministic run to run: by the kernel itself (``combined_in_kernel``) or by the
    launch plan after it (logsumexp)."""
    return [o for o in dag.outputs if o.node.kind is NodeKind.REDUCE]


def atomic_folded(o) -> bool:
    """Per-row and per-column max/min (every family): each tile folds its partial results
    into a float32 workspace (one value per row or column, per batch when the output keeps
    L) with integer atomics on the floats' bits (prelude's ``_ef_fold``). The
    result does not depend on the order (the bits give a total order, NaN included), so it
    is deterministic. The last program of the launch to finish (one ticket per program,
    not per tile) copies the workspace into the output and resets it to the identity for
    the next launch, so no launch follows the kernel. Like the ticket counters, the
    workspace belongs to the launch plan: launches of one plan must not overlap (one
    stream; the same structure launched on concurrent streams is not supported).

    This replaced per-group tickets (the tile that completes a row block combined the
    block's partials): measured on an H100 (benchmarks/HISTORY.md, fifth session), that design
    made gluon row amax at 8192x8192x1024 0.21 -> 0.71 ms although the tickets alone cost
    nothing and the combines alone ~20 us; the combine ran on whichever tile came last,
    so a late SM took every combine of its row blocks and fell further behind."""
    return (o.node.kind is NodeKind.REDUCE and o.node.op in FOLD_IDENTITY_BITS
            and o.kind in (OutputKind.ROW, OutputKind.COL))


def combined_in_kernel(o, family: str) -> bool:
    """Whole-output reductions, and the portable family's per-row/per-column sums: the
    tile that completes a group of partials (a row block, a column block, the whole
    output; per batch or over all batches) combines them in a fixed order and stores the
    output, so no launch follows the kernel. A per-group ticket counter (int32 workspace,
    reset by that tile) tells it that it is the last. The hopper family keeps whole-output
    partials per program and combines them after its tile loop.

    The TMA families' per-row/per-column sums (and every ``EXP_PARTIALS`` reduction) are
    combined after the kernel: per-group tickets are slow at many tiles per group there (see
    ``atomic_folded``; max and min avoid them with atomic folds)."""
    if o.node.kind is not NodeKind.REDUCE or o.node.op in EXP_PARTIALS or atomic_folded(o):
        return False
    if family in TMA_FAMILIES:
        return o.kind is OutputKind.SCALAR and not o.batched
    return True


def combined_after(dag: Dag, family: str) -> list:
    """Reduction outputs whose partials the launch plan combines after the kernel (one
    ``combine.combine_partials`` launch each): neither ``combined_in_kernel`` nor
    ``atomic_folded``."""
    return [o for o in reduce_outputs(dag)
            if not combined_in_kernel(o, family) and not atomic_folded(o)]


def launch_dependents_lines(spec: KernelSpec, indent: str) -> list[str]:
    """A GPU kernel that a combine launch follows lets it start at once (programmatic
    dependent launch, ``prelude._ef_launch_dependents``): its programs take their place as
    SMs free and wait for this kernel's memory, so the launch's latency passes under this
    kernel's tail. Emitted first in the kernel: the dependents start only once every
    program has run it, so none waits for a program that is not resident yet."""
    if not spec.cuda or spec.grouped or not combined_after(spec.dag, spec.family):
        return []
    return [f"{indent}_ef_launch_dependents()"]
