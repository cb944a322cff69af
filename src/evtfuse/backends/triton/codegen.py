"""Triton source emitter: one fused GEMM + epilogue kernel from a ``KernelSpec``.

Layer: backends/triton. Reads the optimised ``ir.Dag`` and the op table; never the user's
source. The generated module holds the ``_ef_`` helpers it calls and one ``@triton.jit``
kernel named ``evtfuse_kernel``. Values that may change between runs (runtime scalars,
pointers, strides, sizes) are kernel arguments; tile sizes are ``tl.constexpr``; literals
of the epilogue are baked in. Two families share the epilogue emitter and differ in the
mainloop and in how full tiles move:

* ``hopper``: persistent grid over tiles (grouped order), tensor descriptors (TMA) for
  A, B and every full aux load/store, the epilogue applied per sub-tile of the
  accumulator (``EPI_SPLIT`` pieces along N) to keep register pressure low;
* ``portable``: one program per tile, pointer loads (any strides, any alignment): the
  mainloop reads rows/columns past the edge as wrapped ones and masks K only where it is
  not a multiple of BLOCK_K (``EVEN_K``), the epilogue masks its loads and stores; runs
  on any Triton GPU target and under the CPU interpreter.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from ... import ir
from ...ir import Dag, Node, NodeKind, OperandKind, OutputKind, Space
from ...optable import FP8_DTYPES, OPS, Category, _lit, int_range
from .prelude import helpers_for

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
    direct: tuple[str, ...] = ()  # gluon: outputs stored from registers (no shared memory)
    coop: bool = False  # gluon: both consumers on one tile (each BLOCK_M // 2 rows)
    chunk: int = 0  # gluon: columns of the consumer's store chunks (``gluon_codegen._SlotPlan``; 0: none)
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

    def key(self) -> str:
        text = "|".join([self.family, ir.signature(self.dag), str(int(self.a_trans)),
                         str(int(self.b_trans)), str(int(self.a_batched)),
                         str(int(self.b_batched)), str(self.epi_split), str(int(self.cuda)),
                         str(int(self.prefetch)), str(int(self.int_acc)), ",".join(self.direct),
                         str(int(self.coop)), str(self.chunk), str(self.tile_n), str(int(self.l2_spread)),
                         str(int(self.early_vectors)), str(self.warps),
                         str(int(self.fp8_promote)), GENERATOR_VERSION])
        return hashlib.sha256(text.encode()).hexdigest()[:24]


GENERATOR_VERSION = "36"  # also part of the tuning key: a new generator re-tunes
#                           (35: the interpreter's maximum/minimum with a scalar first; gluon
#                           stages planned with the scratch of per-column reductions;
#                           36: the gluon family takes batched problems)
TMA_FAMILIES = ("hopper", "gluon")  # full aux tiles move through tensor descriptors
_LD_L2 = 'cache_modifier=".cg"'  # loads of partials other SMs wrote: from L2, not a stale L1
_FOLD_FINISH = 4096  # workspace elements copied per step by the last program (atomic folds)
# a fold workspace's resting value: the float32 bits of the reduction's identity, as int32
FOLD_IDENTITY_BITS = {"max": -8388608, "min": 0x7F800000}  # -inf (0xFF800000), +inf
_COMBINE_LOADS = 8  # partials loaded per step of an in-kernel per-row/per-column combine


# integer output dtypes and the fp32 range they saturate to (the op table's reading)
INT_OUTPUTS = {dt: int_range(dt) for dt in (torch.int8, torch.uint8, torch.int32)}


def _saturated(value: str, dtype: torch.dtype) -> str:
    """An fp8 store's value clamped to the dtype's largest finite value, NaN kept."""
    return f"_ef_sat({value}, {_lit(torch.finfo(dtype).max)})"


def uname(name: str) -> str:
    """Kernel-argument prefix for a user operand/output (keeps Triton names free)."""
    return f"u_{name}"


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


def epilogue_params(dag: Dag, family: str, direct: tuple[str, ...] = (), l2_spread: bool = False
                    ) -> list[str]:
    """Kernel parameters for the epilogue's operands and outputs, in a fixed order
    (``direct``: outputs a TMA family stores through pointers, ``KernelSpec.direct``;
    ``l2_spread``: full aux tiles also get their pointer and row stride, ``KernelSpec.l2_spread``)."""
    params: list[str] = []
    for spec in dag.used_operands:
        u = uname(spec.name)
        if spec.kind is OperandKind.RUNTIME_SCALAR:
            params.append(u)
        elif spec.kind is OperandKind.DEVICE_SCALAR:
            params += [f"{u}_ptr", f"{u}_sl"]
        elif staged_vector(spec, family):
            params.append(f"{u}_desc")
        elif spec.kind is OperandKind.PER_ROW:
            params += [f"{u}_ptr", f"{u}_sl", f"{u}_sm"]
        elif spec.kind is OperandKind.PER_COL:
            params += [f"{u}_ptr", f"{u}_sl", f"{u}_sn"]
        elif family in TMA_FAMILIES:
            params += [f"{u}_desc"] + ([f"{u}_ptr", f"{u}_sm"] if l2_spread else [])
        else:
            params += [f"{u}_ptr", f"{u}_sl", f"{u}_sm", f"{u}_sn"]
    for o in full_outputs(dag):
        u = uname(o.name)
        tma = family in TMA_FAMILIES and o.name not in direct
        params += [f"{u}_desc"] if tma else [f"{u}_ptr", f"{u}_sl", f"{u}_sm", f"{u}_sn"]
    for o in vector_outputs(dag):
        u = uname(o.name)
        params += [f"{u}_ptr", f"{u}_sl", f"{u}_sm", f"{u}_sn"]
    for o in reduce_outputs(dag):
        u = uname(o.name)
        if combined_in_kernel(o, family) or atomic_folded(o):
            params += _written_params(o)
        else:
            params += [f"{u}_ws", f"{u}_ws2"] if o.node.op == "logsumexp" else [f"{u}_ws"]
    return params


def _written_params(o) -> list[str]:
    """The parameters of a reduction output the kernel writes itself: workspace, ticket
    counter, output pointer, batch stride and (per row/column) element stride."""
    u = uname(o.name)
    return [f"{u}_ws", f"{u}_cnt", f"{u}_out", f"{u}_osl"] + (
        [] if o.kind is OutputKind.SCALAR else [f"{u}_os"])


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
    block's partials): measured on an H100 (BENCHMARKS.md, fifth session), that design
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

    The TMA families' per-row/per-column sums (and every logsumexp) are combined after the
    kernel: per-group tickets are slow at many tiles per group there (see
    ``atomic_folded``; max and min avoid them with atomic folds)."""
    if o.node.kind is not NodeKind.REDUCE or o.node.op == "logsumexp" or atomic_folded(o):
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
    if not spec.cuda or not combined_after(spec.dag, spec.family):
        return []
    return [f"{indent}_ef_launch_dependents()"]


class _Epilogue:
    """Emits the epilogue of one DAG: program-level scalars once, the rest per sub-tile."""

    def __init__(self, spec: KernelSpec):
        self.spec = spec
        self.dag = spec.dag
        self.hoisted: dict[int, str] = {}

    @property
    def _lse_part(self) -> str:
        """logsumexp's per-tile (max, sum of exp) helper: on a GPU its exp is MUFU.EX2
        without subnormal handling (the terms are exp(x - max) <= 1; one below 2^-126 adds
        nothing to a sum >= 1)."""
        return "_ef_lse_part_cuda" if self.spec.cuda else "_ef_lse_part"

    def program_reduced(self, o) -> bool:
        """A whole-output reduction kept in registers across all tiles of a persistent
        program (one partial per program, per consumer warpgroup in the gluon family,
        not per tile): the cross-warp step and the ticket run once, after the last tile."""
        return self.spec.family in TMA_FAMILIES and o.kind is OutputKind.SCALAR and not o.batched

    def program_accumulators(self, indent: str, like: str | None = None) -> list[str]:
        """The accumulators ``program_reduced`` outputs carry across tiles: one value per
        tile row. ``like``: a sub-tile whose row sums have the layout they must have (a
        Gluon consumer's column pieces)."""
        lines = []
        for o in reduce_outputs(self.dag):
            if self.program_reduced(o):
                u = uname(o.name)
                ident = _lit(OPS[o.node.op].reduce_identity)
                zeros = f"tl.sum({like}, axis=1)" if like else "tl.zeros((BLOCK_M,), tl.float32)"
                full = f"{zeros} + {ident}" if like else f"tl.full((BLOCK_M,), {ident}, tl.float32)"
                lines.append(f"{indent}pacc_{u} = {full}")
                if o.node.op == "logsumexp":
                    lines.append(f"{indent}pacc_{u}_s = {zeros}")
        return lines

    def program_finish(self, indent: str, slot: str = "start", count: str = "tl.num_programs(0)",
                       lane: str = "tl.arange(0, BLOCK_M)", barrier: str = "tl.debug_barrier()"
                       ) -> list[str]:
        """After a program's (a consumer's) last tile: its partial goes to workspace entry
        ``slot`` of ``count``; the last to arrive combines them (``lane``-wide reads)."""
        lines = []
        for o in reduce_outputs(self.dag):
            if not self.program_reduced(o):
                continue
            u = uname(o.name)
            row = OPS[o.node.op]
            if o.node.op == "logsumexp":
                lines.append(f"{indent}pm_{u}, ps_{u} = _ef_lse_reduce(pacc_{u}, pacc_{u}_s)")
                lines.append(f"{indent}tl.store({u}_ws + {slot}, pm_{u})")
                lines.append(f"{indent}tl.store({u}_ws2 + {slot}, ps_{u})")
            elif o.node.op == "sum":
                lines.append(f"{indent}tl.store({u}_ws + {slot}, tl.sum(pacc_{u}, axis=0))")
            else:
                comb = row.combiner(self.spec.cuda)
                lines.append(f"{indent}tl.store({u}_ws + {slot}, tl.reduce(pacc_{u}, 0, {comb}))")
            if combined_in_kernel(o, self.spec.family):
                lines += self._combine_scalar(o, lane, "0", "0", count, barrier, indent)
        return lines

    def fold_finish(self, count: str, indent: str, lane: str = f"tl.arange(0, {_FOLD_FINISH})",
                    barrier: str = "tl.debug_barrier()") -> list[str]:
        """After a program's last tile (``atomic_folded`` outputs): a ticket per program;
        the last of ``count`` copies each workspace into its output (``lane``: an index
        vector of ``_FOLD_FINISH`` elements) and resets it to the identity."""
        lines: list[str] = []
        for o in reduce_outputs(self.dag):
            if not atomic_folded(o):
                continue
            u = uname(o.name)
            ext = "M" if o.kind is OutputKind.ROW else "N"
            total = f"L * {ext}" if o.batched else ext
            inner, body = indent + "    ", indent + "        "
            lines += self._ticket(o, "0", count, barrier, indent)  # one counter per output
            lines += [
                f"{inner}for f0 in range(0, {total}, {_FOLD_FINISH}):",
                f"{body}fo_{u} = f0 + {lane}",
                f"{body}fm_{u} = fo_{u} < {total}",
                f"{body}fb_{u} = tl.load({u}_ws + fo_{u}, mask=fm_{u}, {_LD_L2})",
                f"{body}tl.store({u}_out + (fo_{u} // {ext}) * {u}_osl + (fo_{u} % {ext}) * {u}_os, "
                f"fb_{u}.to(tl.float32, bitcast=True).to({u}_out.dtype.element_ty), mask=fm_{u})",
                # Triton may give the reset another layout than the load (it did for 16-bit
                # outputs on sm_90: a thread reset elements before the thread that loads
                # them had read them), so every thread's loads come before any reset
                f"{body}{barrier}",
                f"{body}tl.store({u}_ws + fo_{u}, {FOLD_IDENTITY_BITS[o.node.op]}, mask=fm_{u})",
            ]
        return lines

    def fold_names(self) -> list[str]:
        """The kernel parameters ``fold_finish`` reads (see ``epilogue_params``)."""
        return [p for o in reduce_outputs(self.dag) if atomic_folded(o) for p in _written_params(o)]

    @staticmethod
    def _program_level(n: Node) -> bool:
        return n.space is Space.SCALAR and not n.batched and n.kind is not NodeKind.INDEX \
            and n.kind is not NodeKind.REDUCE and n.kind is not NodeKind.ACCUM

    def prologue(self, indent: str) -> list[str]:
        """Scalars that do not depend on the tile: loaded and computed once per program."""
        lines: list[str] = []
        for k, n in enumerate(self.dag.nodes):
            if not self._program_level(n):
                continue
            expr = self._expr(n, self.hoisted, sub=None)
            name = f"s{k}"
            if n.kind is NodeKind.CONST:
                self.hoisted[id(n)] = expr  # literals stay inline
                continue
            lines.append(f"{indent}{name} = {expr}")
            self.hoisted[id(n)] = name
        return lines

    def _arg(self, n: Node, env: dict[int, str], as_float: bool) -> str:
        v = env[id(n)]
        if as_float and n.dtype is torch.bool:
            return f"({v}).to(tl.float32)"
        return v

    def _expr(self, n: Node, env: dict[int, str], sub) -> str:
        if n.kind is NodeKind.ACCUM:
            return f"{sub.acc}.to(tl.float32)" if self.spec.int_acc else sub.acc
        if n.kind is NodeKind.CONST:
            return _lit(n.value)
        if n.kind is NodeKind.INDEX:
            return f"{sub.rm}[:, None].to(tl.float32)" if n.op == "row" \
                else f"{sub.rn}[None, :].to(tl.float32)"
        if n.kind is NodeKind.LOAD:
            return self._load(n.operand, sub)
        if n.kind is NodeKind.COMPUTE:
            row = OPS[n.op]
            if row.category is Category.SELECT:
                c = env[id(n.inputs[0])]
                cond = c if n.inputs[0].dtype is torch.bool else f"({c} != 0.0)"
                args = [cond] + [self._arg(i, env, True) for i in n.inputs[1:]]
            else:
                args = [self._arg(i, env, True) for i in n.inputs]
            return row.spell(args, n.param_dict, cuda=self.spec.cuda)
        raise NotImplementedError(f"the Triton emitter has no code for {n.kind.value} nodes yet")

    def _load(self, spec, sub) -> str:
        u = uname(spec.name)
        if spec.kind is OperandKind.RUNTIME_SCALAR:
            return u
        bofs = f"bid64 * {u}_sl" if spec.batched else "0"
        if spec.kind is OperandKind.DEVICE_SCALAR:
            return f"tl.load({u}_ptr + {bofs}).to(tl.float32)"
        if spec.kind in (OperandKind.PER_ROW, OperandKind.PER_COL):
            return sub.load_vector(u, spec.kind, bofs)
        return sub.load_full(u, spec.batched)

    def body(self, sub, indent: str, first: bool = True, last: bool = True) -> list[str]:
        """Loads, computes and stores for one sub-tile described by ``sub`` (``first`` and
        ``last`` say where it stands among the tile's sub-tiles)."""
        env: dict[int, str] = dict(self.hoisted)
        lines: list[str] = []
        users = self.dag.users
        for k, n in enumerate(self.dag.nodes):
            if id(n) in env or n.kind is NodeKind.REDUCE:
                continue
            expr = self._expr(n, env, sub)
            single_use = len(users[id(n)]) <= 1 and not any(o.node is n for o in self.dag.outputs)
            if n.kind in (NodeKind.ACCUM, NodeKind.CONST) or (
                    single_use and n.kind is NodeKind.COMPUTE and len(expr) < 60):
                env[id(n)] = expr if n.kind is not NodeKind.COMPUTE else f"({expr})"
                continue
            name = f"v{k}{sub.suffix}"
            lines.append(f"{indent}{name} = {expr}")
            env[id(n)] = name
        for o in full_outputs(self.dag):
            v = self._arg(o.node, env, True)
            if o.node.space is not Space.FULL:
                v = f"({v} + {sub.zeros()})"
            if o.dtype in INT_OUTPUTS:
                if self.spec.int_acc and o.node.kind is NodeKind.ACCUM and o.dtype == torch.int32:
                    v = sub.acc  # the exact int32 accumulator
                else:  # round half to even, saturate, as CUTLASS's float-to-int converters
                    lo, hi = INT_OUTPUTS[o.dtype]
                    v = f"_ef_round_sat({v}, {lo}, {hi})"
            elif o.dtype in FP8_DTYPES:  # saturate (satfinite), NaN kept, as CUTLASS does
                v = _saturated(v, o.dtype)
            lines.append(indent + sub.store_full(uname(o.name), v, o.batched))
        for o in vector_outputs(self.dag):
            lines += self._store_vector(o, env, sub, indent)
        for o in reduce_outputs(self.dag):
            lines += self._reduce(o, env, sub, indent, first, last)
        if last:
            for o in reduce_outputs(self.dag):
                if combined_in_kernel(o, self.spec.family) and not self.program_reduced(o):
                    lines += self._combine(o, sub, indent)
        return lines

    def _ticket(self, o, group: str, count: str, barrier: str, indent: str) -> list[str]:
        """Take a ticket for ``group``: the partial stores of every thread of the program
        are ordered before it (barrier, then a release at GPU scope); the last of ``count``
        tickets acquires the others' partials, resets the counter for the next launch and
        runs the lines that follow (indented one more level)."""
        u = uname(o.name)
        return [f"{indent}{barrier}",
                f"{indent}tk_{u} = tl.atomic_add({u}_cnt + {group}, 1, sem=\"acq_rel\", scope=\"gpu\")",
                f"{indent}if tk_{u} == {count} - 1:",
                f"{indent}    tl.atomic_xchg({u}_cnt + {group}, 0)"]

    def _combine(self, o, sub, indent: str) -> list[str]:
        """Lines run after a tile's partials are stored: the last tile of the group
        combines the group's partials (ascending order) into the output."""
        u = uname(o.name)
        b = "bid64 * " if o.batched else "0 * "
        if o.kind is OutputKind.SCALAR:
            count = "num_pid_m * num_pid_n" if o.batched else "num_pid_m * num_pid_n * L"
            return self._combine_scalar(o, sub.lane(), "bid64" if o.batched else "0",
                                        f"{b}num_pid_m * num_pid_n", count, sub.barrier(), indent)
        if o.kind is OutputKind.ROW:  # partials [L, tiles along N, M]
            tiles, other, extent, idx = "num_pid_n", "num_pid_m", "M", [sub.rm]
            group = sub.pid_m
        else:  # per column: partials [L, tiles along M, N]; every piece's columns
            tiles, other, extent, idx = "num_pid_m", "num_pid_n", "N", list(sub.all_rn)
            group = sub.pid_n
        count = tiles if o.batched else f"{tiles} * L"
        base = f"{b}{tiles} * {extent}"
        comb = OPS[o.node.op].combiner(self.spec.cuda)
        # a partial past the end reads as the value that changes nothing (-0.0 for sums:
        # x + -0.0 is x for every x, signed zeros included)
        ident = "-0.0" if o.node.op == "sum" else _lit(OPS[o.node.op].reduce_identity)
        inner, body = indent + "    ", indent + "        "
        lines = self._ticket(o, f"{b}{other} + {group}", count, sub.barrier(), indent)
        for i in idx:
            mask = f"{i} < {extent}"
            # _COMBINE_LOADS loads in flight per step, combined in ascending order (one L2
            # round trip per partial made a 64-tile row's combine cost ~25 us on an H100)
            loads = [f"{body}p{k}_{u} = tl.load({u}_ws + {base} + (j0 + {k}) * {extent} + {i}, "
                     f"mask=({mask}) & (j0 + {k} < {count}), other={ident}, {_LD_L2})"
                     for k in range(_COMBINE_LOADS)]
            lines += [f"{inner}cm_{u} = tl.load({u}_ws + {base} + {i}, mask={mask}, {_LD_L2})",
                      f"{inner}for j0 in range(1, {count}, {_COMBINE_LOADS}):",
                      *loads,
                      *[f"{body}cm_{u} = {comb}(cm_{u}, p{k}_{u})" for k in range(_COMBINE_LOADS)],
                      f"{inner}tl.store({u}_out + {b}{u}_osl + {i} * {u}_os, "
                      f"cm_{u}.to({u}_out.dtype.element_ty), mask={mask})"]
        return lines

    def _combine_scalar(self, o, lane: str, group: str, base: str, count: str, barrier: str,
                        indent: str) -> list[str]:
        """The whole-output case: ``count`` partials at ``base``, read ``lane``-wide."""
        u = uname(o.name)
        row = OPS[o.node.op]
        ident = _lit(row.reduce_identity)
        inner = indent + "    "
        comb = row.combiner(self.spec.cuda)
        total = f"tl.sum(cm_{u}, axis=0)" if o.node.op == "sum" else f"tl.reduce(cm_{u}, 0, {comb})"
        lines = self._ticket(o, group, count, barrier, indent)
        lines += [f"{inner}ln_{u} = {lane}",
                  f"{inner}cm_{u} = tl.load({u}_ws + {base} + ln_{u}, mask=ln_{u} < {count}, "
                  f"other={ident}, {_LD_L2})",
                  f"{inner}for j0 in range(ln_{u}.shape[0], {count}, ln_{u}.shape[0]):",
                  f"{inner}    cm_{u} = {comb}(cm_{u}, tl.load({u}_ws + {base} + j0 + ln_{u}, "
                  f"mask=j0 + ln_{u} < {count}, other={ident}, {_LD_L2}))",
                  f"{inner}tl.store({u}_out + {group} * {u}_osl, ({total}).to({u}_out.dtype.element_ty))"]
        return lines

    def _reduce(self, o, env, sub, indent, first: bool, last: bool) -> list[str]:
        """This sub-tile's part of a reduction output; partials go to the workspace."""
        n = o.node
        row = OPS[n.op]
        u = uname(o.name)
        acc_name = f"racc_{u}"
        v = self._arg(n.inputs[0], env, True)
        if n.inputs[0].space is not Space.FULL:
            v = f"({v} + {sub.zeros()})"
        ident = _lit(row.reduce_identity)
        # only the edge the reduction runs across is masked before it: a per-row result's
        # rows past M (a per-column one's columns past N) are dropped where the partials
        # are stored or folded, so their values never count (one instruction less per
        # element than the tile's mask); where the tiles cover M and N exactly
        # (``EVEN_MN``, a constexpr) the mask is constant and folds away (two instructions
        # per element of an epilogue that issues ~26)
        if o.kind is OutputKind.ROW:
            keep = f"({sub.rn}[None, :] < N)"
        elif o.kind is OutputKind.COL:
            keep = f"({sub.rm}[:, None] < M)"
        else:
            keep = sub.mask
        lines = [f"{indent}rv_{u}{sub.suffix} = tl.where(({keep}) | EVEN_MN, {v}, {ident})"]
        rv = f"rv_{u}{sub.suffix}"
        lse = n.op == "logsumexp"
        comb = row.combiner(self.spec.cuda)

        def part(axis: int, x: str) -> str:
            if n.op == "sum":
                return f"tl.sum({x}, axis={axis})"
            return f"tl.reduce({x}, {axis}, {comb})"

        def combine(a: str, b: str) -> str:
            return f"{comb}({a}, {b})"

        ws_row = f"(bid64 * num_pid_n + {sub.pid_n}) * M + {sub.rm}"
        ws_col = f"(bid64 * num_pid_m + {sub.pid_m}) * N + {sub.rn}"
        ws_one = f"(bid64 * num_pid_m + {sub.pid_m}) * num_pid_n + {sub.pid_n}"
        if o.kind is OutputKind.COL:  # each sub-tile holds its own columns: store now
            if lse:
                lines.append(f"{indent}pm_{u}, ps_{u} = {self._lse_part}({rv}, 0)")
                lines.append(f"{indent}tl.store({u}_ws + {ws_col}, pm_{u}, mask={sub.rn} < N)")
                lines.append(f"{indent}tl.store({u}_ws2 + {ws_col}, ps_{u}, mask={sub.rn} < N)")
            elif atomic_folded(o):
                b = "bid64 * N + " if o.batched else ""
                lines.append(f"{indent}_ef_fold({u}_ws + {b}{sub.rn}, {part(0, rv)}, "
                             f"{sub.rn} < N, {n.op == 'max'})")
            else:
                lines.append(f"{indent}tl.store({u}_ws + {ws_col}, {part(0, rv)}, "
                             f"mask={sub.rn} < N)")
            return lines
        if self.program_reduced(o):
            if lse:
                lines.append(f"{indent}pm_{u}, ps_{u} = {self._lse_part}({rv}, 1)")
                lines.append(f"{indent}pacc_{u}, pacc_{u}_s = _ef_lse_combine(pacc_{u}, "
                             f"pacc_{u}_s, pm_{u}, ps_{u})")
            else:
                lines.append(f"{indent}pacc_{u} = {combine(f'pacc_{u}', part(1, rv))}")
            return lines
        # per-row and whole-output partials combine across the tile's sub-tiles first
        if lse:
            lines.append(f"{indent}pm_{u}, ps_{u} = {self._lse_part}({rv}, 1)")
            if o.kind is OutputKind.SCALAR:
                lines.append(f"{indent}pm_{u}, ps_{u} = _ef_lse_reduce(pm_{u}, ps_{u})")
            if first:
                lines.append(f"{indent}{acc_name}, {acc_name}_s = pm_{u}, ps_{u}")
            else:
                lines.append(f"{indent}{acc_name}, {acc_name}_s = _ef_lse_combine({acc_name}, "
                             f"{acc_name}_s, pm_{u}, ps_{u})")
        else:
            p = part(1, rv)
            if o.kind is OutputKind.SCALAR:
                p = part(0, p)
            lines.append(f"{indent}{acc_name} = {p if first else combine(acc_name, p)}")
        if last:
            if atomic_folded(o):
                b = "bid64 * M + " if o.batched else ""
                lines.append(f"{indent}_ef_fold({u}_ws + {b}{sub.rm}, {acc_name}, "
                             f"{sub.rm} < M, {n.op == 'max'})")
            elif o.kind is OutputKind.ROW:
                lines.append(f"{indent}tl.store({u}_ws + {ws_row}, {acc_name}, mask={sub.rm} < M)")
                if lse:
                    lines.append(f"{indent}tl.store({u}_ws2 + {ws_row}, {acc_name}_s, "
                                 f"mask={sub.rm} < M)")
            else:
                lines.append(f"{indent}tl.store({u}_ws + {ws_one}, {acc_name})")
                if lse:
                    lines.append(f"{indent}tl.store({u}_ws2 + {ws_one}, {acc_name}_s)")
        return lines

    def _store_vector(self, o, env, sub, indent) -> list[str]:
        """A value that is constant along the axes its (vector/scalar) output lacks."""
        u = uname(o.name)
        v = self._arg(o.node, env, True)
        conds = [] if o.batched or not sub.bid else [f"({sub.bid} == 0)"]
        if o.kind is OutputKind.ROW:
            val = sub.along(v, OutputKind.ROW)
            ptr = f"{u}_ptr + bid64 * {u}_sl + {sub.rm} * {u}_sm"
            mask = f"({sub.rm} < M) & ({sub.pid_n} == 0) & ({sub.first_sub})"
        elif o.kind is OutputKind.COL:
            val = sub.along(v, OutputKind.COL)
            ptr = f"{u}_ptr + bid64 * {u}_sl + {sub.rn} * {u}_sn"
            mask = f"({sub.rn} < N) & ({sub.pid_m} == 0)"
        else:
            val, at, only = sub.one(v)
            ptr = f"{u}_ptr + bid64 * {u}_sl{at}"
            mask = f"({sub.pid_m} == 0) & ({sub.pid_n} == 0) & ({sub.first_sub}){only}"
        mask = " & ".join([mask] + conds)
        if o.dtype in FP8_DTYPES:
            val = _saturated(val, o.dtype)
        return [f"{indent}tl.store({ptr}, ({val}).to({u}_ptr.dtype.element_ty), mask={mask})"]


def vector_load(u: str, kind: OperandKind, bofs: str, rm: str, rn: str) -> str:
    """A per-row or per-column operand read from global memory, broadcast over the tile."""
    if kind is OperandKind.PER_ROW:
        return f"tl.load({u}_ptr + {bofs} + {rm} * {u}_sm, mask={rm} < M, other=0.0).to(tl.float32)[:, None]"
    return f"tl.load({u}_ptr + {bofs} + {rn} * {u}_sn, mask={rn} < N, other=0.0).to(tl.float32)[None, :]"


class _TritonTile:
    """What a Triton tile (portable or hopper) spells the same way: the emitter asks a
    tile for tile-shaped zeros, the program's barrier, a BLOCK_M-wide index vector and
    its per-row/per-column operands."""

    def load_vector(self, u: str, kind: OperandKind, bofs: str) -> str:
        return vector_load(u, kind, bofs, self.rm, self.rn)

    def zeros(self) -> str:
        return f"tl.zeros(({self.bm}, {self.bn}), tl.float32)"

    def barrier(self) -> str:
        return "tl.debug_barrier()"

    def lane(self) -> str:
        return "tl.arange(0, BLOCK_M)"

    bid = "bid"  # the tile's batch (a stored vector without batch slices: batch 0's)

    def along(self, v: str, kind: OutputKind) -> str:
        """``v`` (a scalar or a per-row/per-column value) as the tile's 1-D vector of its
        rows (``kind`` ROW) or columns (COL), for a stored vector output."""
        if kind is OutputKind.ROW:
            return f"tl.reshape({v} + tl.zeros(({self.bm}, 1), tl.float32), ({self.bm},))"
        return f"tl.reshape({v} + tl.zeros((1, {self.bn}), tl.float32), ({self.bn},))"

    def one(self, v: str) -> tuple[str, str, str]:
        """A scalar value ``v`` as a stored scalar output takes it: (value, pointer offset,
        mask term) of the one store."""
        return f"tl.sum(tl.reshape({v} + tl.zeros((1, 1), tl.float32), (1,)), axis=0)", "", ""


@dataclass
class _PortableTile(_TritonTile):
    acc: str = "acc"
    rm: str = "rm"
    rn: str = "rn"
    bm: str = "BLOCK_M"
    bn: str = "BLOCK_N"
    pid_m: str = "pid_m"
    pid_n: str = "pid_n"
    first_sub: str = "True"
    suffix: str = ""
    mask: str = "mask"
    all_rn: tuple = ("rn",)

    def load_full(self, u: str, batched: bool) -> str:
        b = f"bid64 * {u}_sl + " if batched else ""
        return (f"tl.load({u}_ptr + {b}{self.rm}[:, None] * {u}_sm + {self.rn}[None, :] * {u}_sn, "
                f"mask=mask, other=0.0).to(tl.float32)")

    def store_full(self, u: str, value: str, batched: bool) -> str:
        b = f"bid64 * {u}_sl + " if batched else ""
        return (f"tl.store({u}_ptr + {b}{self.rm}[:, None] * {u}_sm + {self.rn}[None, :] * {u}_sn, "
                f"({value}).to({u}_ptr.dtype.element_ty), mask=mask)")


@dataclass
class _HopperTile(_TritonTile):
    acc: str
    rn: str
    off_n: str
    suffix: str
    first_sub: str
    rm: str = "rm"
    bm: str = "BLOCK_M"
    bn: str = "SUB_N"
    pid_m: str = "pid_m_c"
    pid_n: str = "pid_n_c"
    prefetched: bool = False
    mask: str = ""
    all_rn: tuple = ()
    early_vectors: bool = False  # the vectors were loaded at the epilogue's top (ve_ names)

    def load_vector(self, u: str, kind: OperandKind, bofs: str) -> str:
        if not self.early_vectors:
            return super().load_vector(u, kind, bofs)
        return _early_vector_name(u, kind, self.suffix)

    def load_full(self, u: str, batched: bool) -> str:
        if self.prefetched:
            return f"pf_{u}{self.suffix}.to(tl.float32)"
        if batched:
            return (f"{u}_desc.load([bid, off_m_c, {self.off_n}]).reshape(BLOCK_M, SUB_N)"
                    f".to(tl.float32)")
        return f"{u}_desc.load([off_m_c, {self.off_n}]).to(tl.float32)"

    def store_full(self, u: str, value: str, batched: bool) -> str:
        if batched:
            return (f"{u}_desc.store([bid, off_m_c, {self.off_n}], "
                    f"({value}).to({u}_desc.dtype).reshape(1, BLOCK_M, SUB_N))")
        return f"{u}_desc.store([off_m_c, {self.off_n}], ({value}).to({u}_desc.dtype))"


def _dot_extra(spec: KernelSpec) -> str:
    """``tl.dot`` keywords beyond precision and accumulator type: for fp8 inputs with
    promotion, the K elements summed in reduced precision before each fp32 add."""
    return "max_num_imprecise_acc=BLOCK_K, " if spec.fp8_promote else ""


def _acc_type(spec: KernelSpec) -> str:
    return "tl.int32" if spec.int_acc else "tl.float32"


def _portable_source(spec: KernelSpec) -> str:
    epi = _Epilogue(spec)
    params = ", ".join(["A", "B", "M", "N", "K", "L", "sa_l", "sa_m", "sa_k", "sb_l", "sb_k", "sb_n"]
                       + epilogue_params(spec.dag, "portable"))
    I1, I2 = "    ", "        "
    lines = [
        "@triton.jit",
        f"def evtfuse_kernel({params},",
        "                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,",
        "                   GROUP_M: tl.constexpr, INPUT_PRECISION: tl.constexpr,",
        "                   EVEN_K: tl.constexpr, ONE_ROW: tl.constexpr, EVEN_MN: tl.constexpr):",
        *launch_dependents_lines(spec, I1),
        f"{I1}pid = tl.program_id(0)",
        f"{I1}bid = tl.program_id(1)",
        f"{I1}bid64 = bid.to(tl.int64)",
        f"{I1}num_pid_m = tl.cdiv(M, BLOCK_M)",
        f"{I1}num_pid_n = tl.cdiv(N, BLOCK_N)",
        # one row of tiles (M <= BLOCK_M): the program is its tile's column
        f"{I1}if ONE_ROW:",
        f"{I2}pid_m = pid * 0",
        f"{I2}pid_n = pid",
        f"{I1}else:",
        f"{I2}group = GROUP_M * num_pid_n",
        f"{I2}first_m = (pid // group) * GROUP_M",
        f"{I2}group_m = tl.minimum(num_pid_m - first_m, GROUP_M)",
        f"{I2}pid_m = first_m + ((pid % group) % group_m)",
        f"{I2}pid_n = (pid % group) // group_m",
        f"{I1}rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
        f"{I1}rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)",
        f"{I1}rk = tl.arange(0, BLOCK_K)",
        # rows and columns past the edge load wrapped ones (row m % M) instead of masking:
        # the mainloop's loads stay unmasked wherever K is a multiple of BLOCK_K, and the
        # store mask drops those rows and columns
        f"{I1}a_ptrs = A + bid64 * sa_l + (rm % M)[:, None].to(tl.int64) * sa_m + rk[None, :] * sa_k",
        f"{I1}b_ptrs = B + bid64 * sb_l + rk[:, None] * sb_k + (rn % N)[None, :].to(tl.int64) * sb_n",
        f"{I1}acc = tl.zeros((BLOCK_M, BLOCK_N), dtype={_acc_type(spec)})",
        f"{I1}for k in range(0, tl.cdiv(K, BLOCK_K)):",
        f"{I2}if EVEN_K:",
        f"{I2}    a = tl.load(a_ptrs)",
        f"{I2}    b = tl.load(b_ptrs)",
        f"{I2}else:",
        f"{I2}    k_left = K - k * BLOCK_K",
        f"{I2}    a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)",
        f"{I2}    b = tl.load(b_ptrs, mask=rk[:, None] < k_left, other=0.0)",
        f"{I2}acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION, {_dot_extra(spec)}"
        f"out_dtype={_acc_type(spec)})",
        f"{I2}a_ptrs += BLOCK_K * sa_k",
        f"{I2}b_ptrs += BLOCK_K * sb_k",
        f"{I1}mask = (rm[:, None] < M) & (rn[None, :] < N)",
    ]
    lines += epi.prologue(I1)
    lines += epi.body(_PortableTile(), I1)
    finish = epi.fold_finish("tl.num_programs(0) * tl.num_programs(1)", I1)
    helper: list[str] = []
    if finish:  # its own function: inlined, its loop's registers spilled the tile's (sm_90)
        names = ", ".join(epi.fold_names() + ["M", "N", "L"])
        helper = ["@triton.jit(noinline=True)", f"def _ef_fold_finish({names}):", *finish, "", ""]
        lines.append(f"{I1}_ef_fold_finish({names})")
    return "\n".join(helper + lines) + "\n"


def _split_lines(split: int, indent: str, root: str = "acc", rows: str = "BLOCK_M"
                 ) -> tuple[list[str], list[str]]:
    """Code splitting ``root`` (``rows`` high) into ``split`` column pieces (left to
    right) and their names."""
    if split == 1:
        return [], [root]
    lines: list[str] = []
    pieces = [root]
    width = "BLOCK_N"
    level = 0
    while len(pieces) < split:
        nxt = []
        half = f"({width}) // 2"
        for p in pieces:
            a, b = f"{p}_l{level}", f"{p}_r{level}"
            lines.append(f"{indent}{a}, {b} = tl.split(tl.permute(tl.reshape({p}, "
                         f"({rows}, 2, {half})), (0, 2, 1)))")
            nxt += [a, b]
        pieces = nxt
        width = half
        level += 1
    return lines, pieces


# the last k-steps of a tile's mainloop over which its aux tiles are asked into L2
L2_SPREAD_STEPS = 32
_PREFETCH_L2 = ('"{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; '
                'mov.u32 $0, 0; }"')


def _l2_spread_lines(spec: KernelSpec, i2: str, i3: str) -> tuple[list[str], list[str]]:
    """Lines before the k-loop and inside it that ask each full aux tile into L2, one
    128-byte line at a time (``prefetch.global.L2``, no registers held, nothing waited
    for), spread evenly over the mainloop's last ``min(k_tiles - 1, L2_SPREAD_STEPS)``
    k-steps: the epilogue's TMA loads then hit L2 instead of every program reading its
    tile from DRAM at the same moment after the last k-step, and the DRAM traffic trickles
    beside the mainloop's instead of arriving in one burst (hopper family, one batch; rows
    and columns past the edge are not asked for). H100, 2048^3, one wave of 128x128 tiles:
    alpha-beta 0.0325 -> 0.0314 ms, BCE 0.0362 -> 0.0350, silu*X 0.0331 -> 0.0320; the
    whole tile asked for at once, before or halfway through the mainloop, was slower than
    nothing (BENCHMARKS.md, thirteenth session)."""
    before = [f"{i2}pf_steps = tl.minimum(k_tiles - 1, {L2_SPREAD_STEPS})",
              f"{i2}pf_first = k_tiles - pf_steps",
              f"{i2}pf_r = tl.arange(0, BLOCK_M)"]
    inside = [f"{i3}pf_j = ki - pf_first"]
    for op in spec.dag.used_operands:
        if op.kind is not OperandKind.FULL:
            continue
        u = uname(op.name)
        line = 128 // (op.dtype.itemsize if op.dtype is not None else 2)  # elements per line
        before.append(f"{i2}pf_{u} = {u}_ptr + (off_m + pf_r).to(tl.int64) * {u}_sm + off_n")
        inside += [
            f"{i3}for pf_c in tl.static_range(0, BLOCK_N, {line}):",
            # line (row r, column piece c) is number (c / line) * BLOCK_M + r of the tile's
            # BLOCK_M * BLOCK_N / line lines, asked for at k-step line * steps // lines
            f"{i3}    pf_id = (pf_c // {line}) * BLOCK_M + pf_r",
            f"{i3}    pf_sel = ((pf_id * pf_steps) // (BLOCK_M * (BLOCK_N // {line})) == pf_j) "
            f"& (off_m + pf_r < M) & (off_n + pf_c < N)",
            f"{i3}    tl.inline_asm_elementwise({_PREFETCH_L2}, \"=r,l,r\", "
            f"[pf_{u} + pf_c, pf_sel.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)",
        ]
    return before, inside


def _hopper_source(spec: KernelSpec) -> str:
    epi = _Epilogue(spec)
    params = ", ".join(["a_desc", "b_desc", "M", "N", "K", "L"] + epilogue_params(spec.dag, "hopper",
                                                                             l2_spread=spec.l2_spread))
    I1, I2, I3 = "    ", "        ", "            "
    a_idx = "[bid, off_m, off_k]" if spec.a_batched else "[off_m, off_k]"
    if spec.a_trans:
        a_idx = "[bid, off_k, off_m]" if spec.a_batched else "[off_k, off_m]"
    b_idx = "[bid, off_k, off_n]" if spec.b_batched else "[off_k, off_n]"
    if spec.b_trans:
        b_idx = "[bid, off_n, off_k]" if spec.b_batched else "[off_n, off_k]"
    a_load = f"a_desc.load({a_idx})"
    b_load = f"b_desc.load({b_idx})"
    if spec.a_batched:
        a_load += ".reshape(BLOCK_K, BLOCK_M)" if spec.a_trans else ".reshape(BLOCK_M, BLOCK_K)"
    if spec.b_batched:
        b_load += ".reshape(BLOCK_N, BLOCK_K)" if spec.b_trans else ".reshape(BLOCK_K, BLOCK_N)"
    if spec.a_trans:
        a_load += ".T"
    if spec.b_trans:
        b_load += ".T"
    lines = [
        "@triton.jit",
        "def _ef_tile_coords(tile, tiles_per_batch, num_pid_m, num_pid_n, GROUP_M: tl.constexpr,",
        "                    ONE_ROW: tl.constexpr):",
        # one row of tiles and one batch (M <= BLOCK_M, L == 1): the tile is its column, no
        # integer divisions ahead of the first load (small-M problems, where they show)
        f"{I1}if ONE_ROW:",
        f"{I2}return tile * 0, tile * 0, tile",
        f"{I1}bid = tile // tiles_per_batch",
        f"{I1}t = tile % tiles_per_batch",
        f"{I1}group = GROUP_M * num_pid_n",
        f"{I1}first_m = (t // group) * GROUP_M",
        f"{I1}group_m = tl.minimum(num_pid_m - first_m, GROUP_M)",
        f"{I1}pid_m = first_m + ((t % group) % group_m)",
        f"{I1}pid_n = (t % group) // group_m",
        f"{I1}return bid, pid_m, pid_n",
        "",
        "",
        "@triton.jit",
        f"def evtfuse_kernel({params},",
        "                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,",
        "                   GROUP_M: tl.constexpr, INPUT_PRECISION: tl.constexpr,",
        "                   NUM_SMS: tl.constexpr, FLATTEN: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,",
        "                   ONE_ROW: tl.constexpr, ONE_WAVE: tl.constexpr, EVEN_MN: tl.constexpr):",
        f"{I1}SUB_N: tl.constexpr = BLOCK_N // {spec.epi_split}",
        *launch_dependents_lines(spec, I1),
        f"{I1}start = tl.program_id(0)",
        f"{I1}num_pid_m = tl.cdiv(M, BLOCK_M)",
        f"{I1}num_pid_n = tl.cdiv(N, BLOCK_N)",
        f"{I1}k_tiles = tl.cdiv(K, BLOCK_K)",
        f"{I1}tiles_per_batch = num_pid_m * num_pid_n",
        f"{I1}num_tiles = tiles_per_batch * L",
        # one wave (a program per tile): the loop's end is a constant, its trip count one
        f"{I1}tiles_end = NUM_SMS if ONE_WAVE else num_tiles",
    ]
    lines += epi.prologue(I1)
    lines += epi.program_accumulators(I1)
    lines += [
        f"{I1}tile_c = start - NUM_SMS",
        f"{I1}for tile in tl.range(start, tiles_end, NUM_SMS, flatten=FLATTEN, "
        "warp_specialize=WARP_SPECIALIZE):",
        f"{I2}bid, pid_m, pid_n = _ef_tile_coords(tile, tiles_per_batch, num_pid_m, num_pid_n, "
        "GROUP_M, ONE_ROW)",
        f"{I2}off_m = pid_m * BLOCK_M",
        f"{I2}off_n = pid_n * BLOCK_N",
        f"{I2}acc = tl.zeros((BLOCK_M, BLOCK_N), dtype={_acc_type(spec)})",
    ]
    if spec.prefetch:
        # aux tiles requested before the mainloop, so that their latency hides behind it
        for spec_op in spec.dag.used_operands:
            if spec_op.kind is not OperandKind.FULL:
                continue
            u = uname(spec_op.name)
            for s in range(spec.epi_split):
                off = f"off_n + {s} * (BLOCK_N // {spec.epi_split})"
                if spec_op.batched:
                    lines.append(f"{I2}pf_{u}_{s} = {u}_desc.load([bid, off_m, {off}])"
                                 f".reshape(BLOCK_M, BLOCK_N // {spec.epi_split})")
                else:
                    lines.append(f"{I2}pf_{u}_{s} = {u}_desc.load([off_m, {off}])")
    spread = _l2_spread_lines(spec, I2, I3) if spec.l2_spread else ([], [])
    lines += spread[0]
    lines += [
        f"{I2}for ki in range(k_tiles):",
        f"{I3}off_k = ki * BLOCK_K",
        *spread[1],
        f"{I3}acc = tl.dot({a_load}, {b_load}, acc, input_precision=INPUT_PRECISION, "
        f"{_dot_extra(spec)}out_dtype={_acc_type(spec)})",
        # the epilogue recomputes its tile's coordinates: with a flattened loop the
        # mainloop of the next tile may already have started
        f"{I2}tile_c += NUM_SMS",
        f"{I2}bid, pid_m_c, pid_n_c = _ef_tile_coords(tile_c, tiles_per_batch, num_pid_m, "
        "num_pid_n, GROUP_M, ONE_ROW)",
        f"{I2}bid64 = bid.to(tl.int64)",
        f"{I2}off_m_c = pid_m_c * BLOCK_M",
        f"{I2}off_n_c = pid_n_c * BLOCK_N",
        f"{I2}rm = off_m_c + tl.arange(0, BLOCK_M)",
    ]
    split_lines, pieces = _split_lines(spec.epi_split, I2)
    piece_n = [f"off_n_c + {s} * SUB_N" if s else "off_n_c" for s in range(len(pieces))]
    if spec.early_vectors:
        lines += _early_vector_lines(spec, piece_n, I2)
    lines += split_lines
    for s, piece in enumerate(pieces):
        off_n = piece_n[s]
        rn = f"rn{s}"
        sub = _HopperTile(acc=piece, rn=rn, off_n=f"({off_n})", suffix=f"_{s}",
                          first_sub="True" if s == 0 else "False", prefetched=spec.prefetch,
                          mask=f"mask{s}", all_rn=tuple(f"rn{k}" for k in range(len(pieces))),
                          early_vectors=spec.early_vectors)
        if not spec.early_vectors:
            lines.append(f"{I2}{rn} = {off_n} + tl.arange(0, SUB_N)")
        if reduce_outputs(spec.dag):
            lines.append(f"{I2}mask{s} = (rm[:, None] < M) & ({rn}[None, :] < N)")
        lines += epi.body(sub, I2, first=s == 0, last=s == len(pieces) - 1)
    lines += epi.program_finish(I1)
    lines += epi.fold_finish("tl.num_programs(0)", I1)
    return "\n".join(lines) + "\n"


def _early_vector_name(u: str, kind: OperandKind, suffix: str) -> str:
    """The variable an early vector load goes into (``_early_vector_lines``): one per
    piece (``suffix`` "_0", "_1", ...) for a per-column operand, one per tile per-row."""
    return f"ve_{u}" if kind is OperandKind.PER_ROW else f"ve_{u}{suffix}"


def _early_vector_lines(spec: KernelSpec, piece_n: list[str], indent: str) -> list[str]:
    """Every piece's column indices and per-row/per-column operand loads, at the top of
    the tile's epilogue (``KernelSpec.early_vectors``): the pieces' L2 round trips overlap
    instead of each waiting behind the previous piece's store. Measured on an H100
    (BENCHMARKS.md, fourteenth session): the one-wave two-per-SM kernel at 2048^3, where
    both programs of an SM reach their epilogue together and nothing hides a load."""
    lines = [f"{indent}rn{s} = {off} + tl.arange(0, SUB_N)" for s, off in enumerate(piece_n)]
    for op in spec.dag.used_operands:
        if op.kind not in (OperandKind.PER_ROW, OperandKind.PER_COL):
            continue
        u = uname(op.name)
        bofs = f"bid64 * {u}_sl" if op.batched else "0"
        pieces = [0] if op.kind is OperandKind.PER_ROW else range(len(piece_n))
        for s in pieces:
            name = _early_vector_name(u, op.kind, f"_{s}")
            lines.append(f"{indent}{name} = {vector_load(u, op.kind, bofs, 'rm', f'rn{s}')}")
    return lines


def generate(spec: KernelSpec) -> str:
    """The whole generated module for ``spec``."""
    header = (
        f'"""evtfuse generated kernel ({spec.family}); key {spec.key()}.\n\n'
        + "\n".join("  " + line for line in ir.format_dag(spec.dag).splitlines())
        + '\n"""\n'
    )
    if spec.family == "gluon":
        from .gluon_codegen import generate_gluon

        return generate_gluon(spec, header)
    kernel = _hopper_source(spec) if spec.family == "hopper" else _portable_source(spec)
    header += "import triton\nimport triton.language as tl\n\n"
    return header + helpers_for(kernel) + "\n\n" + kernel


def check_emittable(dag: Dag) -> str | None:
    """Why this emitter cannot produce the DAG, or None."""
    for o in reduce_outputs(dag):
        if OPS[o.node.op].reduce_identity is None:
            return f"output {o.name}: the kernels have no code for the reduction {o.node.op}"
    for n in dag.nodes:
        if n.kind is NodeKind.LOAD and n.operand.dtype is not None \
                and n.operand.dtype not in TL_DTYPES:
            return f"operand {n.operand.name} has dtype {n.operand.dtype}, which the kernels cannot load yet"
    for o in dag.outputs:
        if o.node.kind is NodeKind.REDUCE:
            continue  # written by the launch plan's combine step, any float dtype
        if o.dtype is not None and o.dtype not in (torch.float16, torch.bfloat16, torch.float32) \
                and o.dtype not in INT_OUTPUTS and o.dtype not in FP8_DTYPES:
            return (f"output {o.name} has dtype {o.dtype}; the kernels store fp16, bf16, fp32, "
                    "fp8 (e4m3fn, e5m2), int8, uint8 and int32")
    return None
