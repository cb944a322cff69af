"""Gluon source emitter: a warp-specialized ping-pong Hopper GEMM with the DAG's epilogue.

Layer: backends/triton. Gluon (``triton.experimental.gluon``, shipped with Triton 3.6) is
Triton's lower-level dialect: layouts, shared memory, mbarriers, TMA and warpgroup MMA are
explicit. This emitter produces one module with a ``@gluon.jit`` kernel named
``evtfuse_kernel`` laid out as CUTLASS's ping-pong kernel
(``KernelTmaWarpSpecializedPingpong``), which lets one tile's epilogue run while the tensor
cores work on the next tile:

* a 1-warp **producer** partition streams A and B tiles through a ring of ``NUM_STAGES``
  shared-memory stages (TMA, ``ready``/``empty`` mbarriers);
* two 4-warp **consumer** partitions (one warpgroup each; two each where
  ``KernelSpec.warps`` is 8, 64 of a tile's rows per warpgroup) take alternate tiles of the
  persistent program; each runs its tile's mainloop (``warpgroup_mma``) and then its
  epilogue. An ``order`` mbarrier pair makes the mainloops strictly alternate, so while one
  warpgroup computes its epilogue the other owns the tensor cores (required for
  correctness too: both consumers wait on one ring by parity);
* a 1-warp **epilogue-memory** partition TMA-loads every full aux operand of a tile, and
  its slices of per-row/per-column operands, into its consumer's shared buffers ahead of
  time (``c_ready``) and TMA-stores the outputs the
  consumer left in those buffers (``d_ready``), then reuses them two tiles on; outputs
  without a buffer of their dtype are staged per column piece and TMA-stored by the
  consumer itself (``Buffers``). Slot configs (``KernelSpec.chunk``) have the consumer
  TMA-store the buffers' outputs by 128-byte column chunk as their pieces finish, and stage
  a second output of the buffer's dtype in each chunk once it has left (``gluon_tile.SlotPlan``).

The epilogue itself is the Triton families' (``epilogue_emit.EpilogueEmitter``): the op
table's spellings are layout-free Triton calls, which Gluon kernels may call on tensors in the
wgmma accumulator layout; only tile-shaped values (aux tiles, broadcasts, row/column
indices) need that layout here. Scope (``gluon_family.GluonFamily.supports``): Hopper
(sm_90), fp16/bf16 A and B; per-row/-column operands of fp16/bf16/fp32 contiguous and
16-byte aligned (they move by TMA; those with batch slices of their own are read from
global memory instead); stored per-row/-column vectors (``gluon_tile.GluonTile.along``). Batched problems
(L > 1): the persistent schedule runs the tiles of every batch, batch by batch; a batched
A or B and every aux tile and output move by 3-D TMA blocks (``Buffers.batch``).
Design notes and measurements of the prototype: benchmarks/HISTORY.md (its probe,
``gluon_probe.py``, is in the git history).

**Cooperative tiles** (``KernelSpec.coop``, CUTLASS's ``KernelTmaWarpSpecializedCooperative``):
both consumers work on every tile of the program, consumer ``WHICH`` on rows
``WHICH * EPI_M`` to ``(WHICH + 1) * EPI_M`` (``EPI_M = BLOCK_M // 2``), reading its rows of
A's stage and all of B's; every stage is released by both (``empty`` counts two
arrivals), so neither can run a ring phase ahead and no ``order`` barrier is needed. The
epilogue-memory warp works on *units*: a unit is what one consumer's buffers hold at a
time (ping-pong: tile ``u`` of the program; cooperative: half ``u % 2`` of tile ``u // 2``),
so in both structures buffer set ``u % 2`` serves unit ``u`` and is reused by unit ``u + 2``
(``_ef_unit_origin`` gives a unit's first row and column).

The emitter's steps follow the module it writes (``_kernel_source``): ``_producer``;
``gluon_memory`` (the epilogue-memory partition); ``_mma_step`` and ``_consumer`` (its
set-up, mainloop, epilogue on column pieces - ``gluon_tile`` - and finish); ``_kernel``
(signature, shared memory, barriers, ``warp_specialize``). ``gluon_kernel.GluonKernel``
holds what they share: the spec, the epilogue's buffers and emitter, the partitions'
argument lists; ``gluon_schedule`` the persistent schedule every partition follows.
"""

from __future__ import annotations

from .emit_common import split_pieces
from .epilogue_emit import EpilogueEmitter
from .gluon_buffers import Buffers, buffers
from . import gluon_schedule as schedule
from .gluon_kernel import GluonKernel
from .gluon_memory import mem, mem_issue
from .gluon_schedule import CONSTS, CONSTS_SIG, I1, I2, I3, SIZES
from .gluon_tile import GluonTile, SlotPlan, piece_select, piece_stores
from .names import Names
from .prelude import helpers_for
from .spec import (_FOLD_FINISH, KernelSpec, epilogue_params, int64_lines,
                   launch_dependents_lines, reduce_outputs)
from .versions import gluon_names

# Gluon's spellings for the running Triton (versions.py: they changed in 3.7 and 3.8)
TMA_LOAD, CTA_BARRIER = (gluon_names()[k] for k in ("tma_load", "cta_barrier"))

LAYOUT = "mma_layout"


# the epilogue's quarters in a runtime loop (one copy of the body, not four) where the
# body does not depend on the piece's place (no per-tile reductions): the exposed last
# epilogue of a small problem stalls on instruction fetch (H100, BCE loss, quarters: 8,600
# -> 4,024 SASS instructions; 2048^3 0.0395 -> 0.038 ms, 8192x8192x1024 0.263 -> 0.258).
# Not for halves (every piece stays live through the loop: offline sm_90, BCE halves spill
# 197 local accesses) nor outputs stored from registers (relu with an aux output: quarters
# compile without spills, halves spill 17; not timed on a GPU yet: ``LOOP_DIRECT``, a probe)
PIECE_LOOP = True
LOOP_DIRECT = False


def _piece_loop(epi: EpilogueEmitter, spec: KernelSpec, bufs: Buffers) -> bool:
    # slot outputs wait in registers across pieces: unrolled
    return PIECE_LOOP and spec.epi_split == 4 and (LOOP_DIRECT or not spec.direct) and \
        not bufs.slot_stores and \
        all(epi.reductions.program_reduced(o) for o in reduce_outputs(spec.dag))


def _kernel_source(spec: KernelSpec) -> str:
    """The kernel and its partitions' functions, in the module's order."""
    k = GluonKernel.of(spec)
    L = [
        *schedule.tile_coords(k.batch),
        *schedule.unit_origin(k.coop, k.batch),
        *_producer(k),
        *mem_issue(k),
        *mem(k),
        *_mma_step(k),
        *_consumer(k),
        *_consumer_wrappers(k),
        *_kernel(k),
    ]
    return "\n".join(L) + "\n"


# ---- producer partition: A and B through the ring

def _producer(k: GluonKernel) -> list[str]:
    """``_ef_producer``: the 1-warp partition TMA-loading A and B stages into the ring."""
    spec = k.spec
    a_k = schedule.coords(spec.a_trans, "off_m", "kk * BLOCK_K", spec.a_batched)
    b_k = schedule.coords(not spec.b_trans, "off_n", "kk * BLOCK_K", spec.b_batched)
    if k.gated:  # gate's B rows, then up's (from N + off_n), into the stage's two halves
        up_k = schedule.coords(not spec.b_trans, "N + off_n", "kk * BLOCK_K", spec.b_batched)
        b_loads = [f"{I3}{TMA_LOAD}(b_desc, {b_k}, bar, b_bufs.index(s).slice(0, BLOCK_N, dim=0))",
                   f"{I3}{TMA_LOAD}(b_desc, {up_k}, bar, "
                   "b_bufs.index(s).slice(BLOCK_N, BLOCK_N, dim=0))"]
        b_bytes = "2 * b_desc.block_type.nbytes"
    else:
        b_loads = [f"{I3}{TMA_LOAD}(b_desc, {b_k}, bar, b_bufs.index(s))"]
        b_bytes = "b_desc.block_type.nbytes"
    return [
        "@gluon.jit",
        f"def _ef_producer(a_desc, b_desc, a_bufs, b_bufs, ready, empty, {SIZES}, {CONSTS_SIG}):",
        *k.program,
        f"{I1}k_tiles = gl.cdiv(K, BLOCK_K)",
        f"{I1}nbytes: gl.constexpr = a_desc.block_type.nbytes + {b_bytes}",
        f"{I1}i = 0",
        f"{I1}for t in range(my_tiles):",
        f"{I2}{k.bid}pid_m, pid_n = _ef_tile_coords(start + t * nprog, num_pid_m, num_pid_n, GROUP_M)",
        f"{I2}off_m = pid_m * BLOCK_M",
        f"{I2}off_n = pid_n * BLOCK_N",
        f"{I2}for kk in range(k_tiles):",
        f"{I3}s = i % NUM_STAGES",
        f"{I3}mbarrier.wait(empty.index(s), ((i // NUM_STAGES) & 1) ^ 1)",
        f"{I3}bar = ready.index(s)",
        f"{I3}mbarrier.expect(bar, nbytes)",
        f"{I3}{TMA_LOAD}(a_desc, {a_k}, bar, a_bufs.index(s))",
        *b_loads,
        f"{I3}i += 1",
        "",
        "",
    ]


# ---- consumer partitions: mainloop and epilogue

def _mma_step(k: GluonKernel) -> list[str]:
    """``_ef_mma_step``: one k-step's wgmma on a ring stage, releasing the previous stage."""
    spec = k.spec
    # a batched operand's stage is a [1, rows, columns] block: its 2-D view for wgmma
    a_stage = schedule.stage("a_bufs", spec.a_batched, ("BLOCK_K", "BLOCK_M") if spec.a_trans
                     else ("BLOCK_M", "BLOCK_K"))
    b_stage = schedule.stage("b_bufs", spec.b_batched, ("BLOCK_N", "BLOCK_K") if spec.b_trans
                     else ("BLOCK_K", "BLOCK_N"))
    a_smem = f"{a_stage}.permute((1, 0))" if spec.a_trans else a_stage
    if k.coop:  # the consumer's rows of the stage (the family refuses a column-major A)
        a_smem = f"{a_stage}.slice(WHICH * EPI_M, EPI_M, dim=0)"
    b_smem = f"{b_stage}.permute((1, 0))" if spec.b_trans else b_stage
    blocks_sig = ", BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr" \
        if k.blocks else ""
    return [
        "@gluon.jit",
        "def _ef_mma_step(i, kk, acc, a_bufs, b_bufs, ready, empty, NUM_STAGES: gl.constexpr, "
        f"WHICH: gl.constexpr, EPI_M: gl.constexpr{blocks_sig}):",
        f"{I1}s = i % NUM_STAGES",
        f"{I1}mbarrier.wait(ready.index(s), (i // NUM_STAGES) & 1)",
        f"{I1}acc = warpgroup_mma({a_smem}, {b_smem}, acc, use_acc=kk > 0, is_async=True)",
        f"{I1}acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))",
        f"{I1}# wgmma i-1 is done: release its stage",
        f"{I1}mbarrier.arrive(empty.index((i + NUM_STAGES - 1) % NUM_STAGES), pred=kk > 0)",
        f"{I1}return acc",
        "",
        "",
    ]


def _consumer(k: GluonKernel) -> list[str]:
    """``_ef_consumer``: a consumer warpgroup's set-up, then per tile its mainloop and
    epilogue, then its program-level reductions."""
    return [
        *_consumer_setup(k),
        *_consumer_mainloop(k),
        *_consumer_epilogue(k),
        *_consumer_finish(k),
    ]


def _consumer_setup(k: GluonKernel) -> list[str]:
    """The consumer's signature, layout, sizes, views of its buffers, the epilogue's
    program-level scalars and the whole-output reductions' accumulators."""
    spec = k.spec
    L = [
        "@gluon.jit",
        f"def _ef_consumer({k.cons_args}, {SIZES}, WHICH: gl.constexpr, {CONSTS_SIG}):",
        f"{I1}{LAYOUT}: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], "
        f"warps_per_cta=[{spec.warps}, 1], instr_shape=[16, {k.acc_n}, 16])",
        *int64_lines(spec, [r for r in k.roles if r[0] in k.consumer_params], I1),
        *k.program,
        f"{I1}k_tiles = gl.cdiv(K, BLOCK_K)",
        f"{I1}SUB_N: gl.constexpr = BLOCK_N // {spec.epi_split}",
        *([f"{I1}CH: gl.constexpr = {spec.chunk}  # columns of a store chunk (128 bytes)"]
          if spec.chunk else []),
        f"{I1}EPI_M: gl.constexpr = BLOCK_M{' // 2' if k.coop else ''}  # this consumer's rows of a tile",
        *([] if k.batch else [f"{I1}bid64 = 0"]),  # batched: each tile's (below)
        *_consumer_views(k),
    ]
    L += k.epi.prologue(I1)
    return L + _program_accumulators(k)


def _consumer_views(k: GluonKernel) -> list[str]:
    """The consumer's own buffer of each tile and vector buffer pair (a batched kernel's
    tiles: 2-D views)."""
    names, L = k.names, []
    for n, role in k.tile_bufs:
        if k.batch and role == "lb":
            L += [f"{I1}{names(n, 'lbc3')} = {names(n, 'lb')}.index(WHICH)",
                  f"{I1}{names(n, 'lbc')} = {k.bufs.view(names(n, 'lbc3'), 'EPI_M', 'BLOCK_N')}"]
        else:
            mine = {"lb": "lbc", "vb": "vbc"}[role]
            L.append(f"{I1}{names(n, mine)} = {names(n, role)}.index(WHICH)")
    return L


def _program_accumulators(k: GluonKernel) -> list[str]:
    """Whole-output reductions' row sums across this consumer's tiles, in the layout of a
    column piece's row sums (a zero tile split as the tiles are)."""
    if not any(k.epi.reductions.program_reduced(o) for o in reduce_outputs(k.spec.dag)):
        return []
    zero_lines, zero_pieces = split_pieces(k.spec.epi_split, I1, root="pz", rows="EPI_M")
    return [f"{I1}pz = gl.zeros((EPI_M, BLOCK_N), gl.float32, layout={LAYOUT})", *zero_lines,
            *k.epi.reductions.program_accumulators(I1, like=zero_pieces[0])]


def _consumer_mainloop(k: GluonKernel) -> list[str]:
    """The loop over the consumer's tiles up to its epilogue: the tile's wgmma k-steps
    (in turn with the other consumer, ping-pong), the tile's coordinates and the wait for
    its aux tiles."""
    coop, staged = k.coop, k.staged
    if coop:  # both consumers on every tile: each stage is released by both (``empty``
        # counts two arrivals), so neither can run a ring phase ahead of the other
        L = [f"{I1}for r in range(my_tiles):", f"{I2}t = r"]
    else:
        L = [f"{I1}for r in range((my_tiles - WHICH + 1) // 2):", f"{I2}t = 2 * r + WHICH"]
    L += [
        # a fresh accumulator per tile: the last tile's dies with its epilogue instead of
        # staying live (as the first wgmma's input) through it
        f"{I2}acc = gl.zeros((EPI_M, {k.acc_n}), gl.float32, layout={LAYOUT})",
        f"{I2}i0 = t * k_tiles  # ring index of this tile's first k-step",
    ]
    if not coop:
        # wait for the other consumer to have issued its previous mainloop: the ring's
        # barriers are waited on by parity, so a consumer must never run two phases ahead
        L.append(f"{I2}mbarrier.wait(order.index(WHICH), (r & 1) ^ (1 - WHICH))")
    L += [
        f"{I2}for kk in range(k_tiles):",
        f"{I3}acc = _ef_mma_step(i0 + kk, kk, acc, a_bufs, b_bufs, ready, empty, NUM_STAGES, "
        f"WHICH, EPI_M{k.blocks})",
    ]
    if staged and coop:
        L += [f"{I3}if WHICH == 0:",
              f"{I3}    mbarrier.arrive(c_go.index(0), pred=(r == 0) & "
              "(kk == gl.minimum(k_tiles, NUM_STAGES) - 1))"]
    if not coop:
        L.append(f"{I2}mbarrier.arrive(order.index(1 - WHICH))  # every wgmma issued: the other's turn")
    return L + [
        *([f"{I2}if WHICH == 0:", f"{I3}mbarrier.arrive(c_go.index(0), pred=r == 0)"]
          if staged and not coop else []),
        f"{I2}acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))",
        f"{I2}mbarrier.arrive(empty.index((i0 + k_tiles - 1) % NUM_STAGES))",
        f"{I2}{k.bid}pid_m_c, pid_n_c = _ef_tile_coords(start + t * nprog, num_pid_m, num_pid_n, GROUP_M)",
        *([f"{I2}bid64 = bid.to(gl.int64)"] if k.batch else []),
        f"{I2}row0 = pid_m_c * BLOCK_M{' + WHICH * EPI_M' if coop else ''}  # this consumer's first row",
        f"{I2}mbarrier.wait(c_ready.index(WHICH), r & 1)  # aux tiles in, old outputs out",
    ]


def _consumer_epilogue(k: GluonKernel) -> list[str]:
    """The tile's epilogue on its column pieces (as the hopper family's sub-tiles: a
    128x128 fp32 tile is 128 registers per thread, which leaves too few for
    transcendental-heavy epilogues, ptxas spills), in a runtime loop or unrolled, then
    the tile handed to the memory warp (``d_ready``)."""
    spec = k.spec
    split_lines, pieces = _gated_pieces(k) if k.gated else \
        split_pieces(spec.epi_split, I2, rows="EPI_M")
    plan = SlotPlan(k.bufs, len(pieces), spec.tile_n // spec.epi_split, spec.chunk, k.names) \
        if spec.chunk else None
    body = _piece_loop_lines(k, pieces, plan) if _piece_loop(k.epi, spec, k.bufs) \
        and not k.gated else _unrolled_pieces(k, pieces, plan)
    return [
        *split_lines,
        *body,
        f"{I2}fence_async_shared()",
        f"{I2}mbarrier.arrive(d_ready.index(WHICH))",
    ]


def _gated_pieces(k: GluonKernel) -> tuple[list[str], list[str]]:
    """A gated tile's accumulator split into gate's and up's halves, each into the
    epilogue's column pieces; piece ``j`` is named ``acc<j>p`` and its halves
    ``acc<j>p_gate`` and ``acc<j>p_up`` (one piece: ``acc``, ``acc_gate``, ``acc_up``), the
    names the epilogue reads (``EpilogueEmitter._acc``), as in the hopper family."""
    halves, (gate, up) = split_pieces(2, I2, rows="EPI_M", width="2 * BLOCK_N")
    lines = halves
    if k.spec.epi_split == 1:
        return lines + [f"{I2}acc_gate, acc_up = {gate}, {up}"], ["acc"]
    g_lines, gates = split_pieces(k.spec.epi_split, I2, gate, rows="EPI_M", width="BLOCK_N")
    u_lines, ups = split_pieces(k.spec.epi_split, I2, up, rows="EPI_M", width="BLOCK_N")
    lines += g_lines + u_lines
    lines += [f"{I2}acc{j}p_gate, acc{j}p_up = {g}, {u}" for j, (g, u) in enumerate(zip(gates, ups))]
    return lines, [f"acc{j}p" for j in range(len(gates))]


def _piece_loop_lines(k: GluonKernel, pieces: list[str], plan: SlotPlan | None) -> list[str]:
    """The pieces' epilogue as one runtime loop over them (``PIECE_LOOP``)."""
    names, bufs = k.names, k.bufs
    L = [
        f"{I2}PL: gl.constexpr = {pieces[0]}.type.layout  # every piece's",
        f"{I2}rm = row0 + gl.arange(0, EPI_M, layout=gl.SliceLayout(1, PL))",
        f"{I2}for k in range({len(pieces)}):",
        *piece_select(names, bufs, pieces, I3),
        f"{I3}rn = pid_n_c * BLOCK_N + k * SUB_N + gl.arange(0, SUB_N, "
        "layout=gl.SliceLayout(0, PL))",
    ]
    if reduce_outputs(k.spec.dag):
        L.append(f"{I3}mask = (rm[:, None] < M) & (rn[None, :] < N)")
    sub = GluonTile(bufs, "k", acc="pc", layout="PL", rn="rn", piece=None, first_sub="k == 0",
                     mask="mask", loop=True)
    L += k.epi.body(sub, I3)
    return L + piece_stores(names, bufs, len(pieces), I3, plan)


def _unrolled_pieces(k: GluonKernel, pieces: list[str], plan: SlotPlan | None) -> list[str]:
    """The pieces' epilogue written out piece by piece (chunked stores after each)."""
    spec, L = k.spec, []
    for j, piece in enumerate(pieces):
        layout = f"{piece}_gate.type.layout" if k.gated else \
            LAYOUT if spec.epi_split == 1 else f"{piece}.type.layout"
        rn = f"rn{j}"
        L += [
            f"{I2}rm = row0 + gl.arange(0, EPI_M, layout=gl.SliceLayout(1, {layout}))",
            f"{I2}{rn} = pid_n_c * BLOCK_N + {j} * SUB_N + gl.arange(0, SUB_N, "
            f"layout=gl.SliceLayout(0, {layout}))",
        ]
        if reduce_outputs(spec.dag):
            L.append(f"{I2}mask{j} = (rm[:, None] < M) & ({rn}[None, :] < N)")
        sub = GluonTile(k.bufs, j, acc=piece, layout=layout, rn=rn, piece=j,
                         first_sub="True" if j == 0 else "False", mask=f"mask{j}",
                         all_rn=tuple(f"rn{i}" for i in range(len(pieces))))
        L += k.epi.body(sub, I2, first=j == 0, last=j == len(pieces) - 1)
        if plan:
            L += plan.after_piece(j, I2)
    return L


def _consumer_finish(k: GluonKernel) -> list[str]:
    """After the consumer's last tile: its stores drained, its program-level reduction
    partials and atomic folds finished."""
    spec, red = k.spec, k.epi.reductions
    L = [f"{I1}tma.store_wait(pendings=0)"] if k.piece_bufs else []
    L += red.program_finish(I1, slot="2 * start + WHICH", count="2 * nprog",
                            lane=schedule.lane(32 * spec.warps, spec.warps), barrier=f"{CTA_BARRIER}()")
    L += red.fold_finish("2 * nprog", I1, lane=schedule.lane(_FOLD_FINISH, spec.warps),
                         barrier=f"{CTA_BARRIER}()")
    return L + ["", ""]


def _consumer_wrappers(k: GluonKernel) -> list[str]:
    """``_ef_consumer0`` and ``_ef_consumer1``: the consumer with ``WHICH`` fixed."""
    L = []
    for which in (0, 1):
        L += [
            "@gluon.jit",
            f"def _ef_consumer{which}({k.call}, {CONSTS_SIG}):",
            f"{I1}_ef_consumer({k.call}, {which}, {CONSTS})",
            "",
            "",
        ]
    return L


# ---- the kernel: shared memory, barriers, partitions

def _kernel(k: GluonKernel) -> list[str]:
    """``evtfuse_kernel``: its signature, shared memory, barriers and partitions."""
    return [*_kernel_signature(k), *_shared_memory(k), *_barriers(k), *_partitions(k)]


def _kernel_signature(k: GluonKernel) -> list[str]:
    """The kernel's decorator, parameters and programmatic-launch lines."""
    kparams = ", ".join(["a_desc", "b_desc", "M", "N", "K", "L"] + k.params)
    return [
        k.spec.jit_line("gluon"),
        f"def evtfuse_kernel({kparams},",
        f"                   {CONSTS_SIG},",
        "                   CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr):",
        *launch_dependents_lines(k.spec, I1),
    ]


def _shared_memory(k: GluonKernel) -> list[str]:
    """The A/B ring's stages and the epilogue's own buffers (``Buffers.own``)."""
    L = [
        f"{I1}dtype: gl.constexpr = a_desc.dtype",
        f"{I1}a_bufs = gl.allocate_shared_memory(dtype, [NUM_STAGES] + a_desc.block_type.shape, "
        "a_desc.layout)",
        f"{I1}b_bufs = gl.allocate_shared_memory(dtype, [NUM_STAGES] + b_desc.block_type.shape, "
        "b_desc.layout)" if not k.gated else
        f"{I1}b_bufs = gl.allocate_shared_memory(dtype, [NUM_STAGES, 2 * BLOCK_N, BLOCK_K], "
        "b_desc.layout)",
    ]
    for name, role, count in k.bufs.own:
        desc = k.names(name, "desc")
        L.append(f"{I1}{k.names(name, role)} = gl.allocate_shared_memory({desc}.dtype, [{count}] + "
                 f"{desc}.block_type.shape, {desc}.layout)")
    return L


def _barriers(k: GluonKernel) -> list[str]:
    """The mbarriers: the ring's ``ready``/``empty``, the units' ``c_ready``/``d_ready``,
    the consumers' ``order`` and the one-shot ``c_go``."""
    return [
        f"{I1}ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())",
        f"{I1}empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())",
        f"{I1}c_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())",
        f"{I1}d_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())",
        f"{I1}order = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())",
        *([f"{I1}c_go = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())",
           f"{I1}mbarrier.init(c_go.index(0), count=1)"] if k.staged else []),
        f"{I1}for i in gl.static_range(NUM_STAGES):",
        f"{I2}mbarrier.init(ready.index(i), count=1)",
        f"{I2}mbarrier.init(empty.index(i), count={2 if k.coop else 1})",
        f"{I1}for i in gl.static_range(2):",
        f"{I2}mbarrier.init(c_ready.index(i), count=1)",
        f"{I2}mbarrier.init(d_ready.index(i), count=1)",
        f"{I2}mbarrier.init(order.index(i), count=1)",
    ]


def _partitions(k: GluonKernel) -> list[str]:
    """``gl.warp_specialize``: the two consumers, the producer and the memory warp."""
    return [
        f"{I1}gl.warp_specialize([",
        f"{I2}(_ef_consumer0, ({k.call}, {CONSTS})),",
        f"{I2}(_ef_consumer1, ({k.call}, {CONSTS})),",
        f"{I2}(_ef_producer, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, {SIZES}, {CONSTS})),",
        f"{I2}(_ef_mem, (c_ready, d_ready, {k.go}{k.mem}{SIZES}, {CONSTS})),",
        f"{I1}], [{k.spec.warps}, 1, 1], [CONSUMER_REGS, PRODUCER_REGS, PRODUCER_REGS])",
    ]


IMPORTS = (
    "import triton\n"
    "import triton.language as tl\n"
    "from triton.experimental import gluon\n"
    "from triton.experimental.gluon import language as gl\n"
    "from triton.experimental.gluon.language.nvidia.hopper import (\n"
    "    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)\n\n"
)


def generate_gluon(spec: KernelSpec, header: str) -> str:
    """The whole generated module (``header``: the docstring ``codegen.generate`` writes)."""
    kernel = _kernel_source(spec)
    return header + IMPORTS + helpers_for(kernel) + "\n\n" + kernel
