"""A prototype Hopper (sm_90) Gluon GEMM whose 2-CTA cluster shares the B tile by TMA
multicast (Triton 3.7+; written against 3.9.0's Gluon), for issue 48: what a cluster and
multicast bring to a kernel, measured against the same kernel on one CTA, before the gluon
family takes them. Not part of the library; ``scripts/multicast_probe.py`` compiles it
offline for sm_90 and runs, checks and times it on a GPU.

C[M, N] = A[M, K] @ B[N, K]^T, bf16 in and out, fp32 accumulation; not persistent, not
warp-specialised: one cluster per 256 x BLOCK_N tile, two consumer warpgroups per CTA.

Gluon's multi-CTA model in 3.9.0 (checked against its sources and compiled output,
benchmarks/HISTORY.md, thirty-sixth session):
  * The kernel is written for the whole CLUSTER: every shape (descriptors' block shapes,
    shared allocations, the accumulator) is the cluster tile; a ``cga_layout`` on each
    layout says how it is spread over the CTAs, in units of CTA tiles (``[[1, 0]]``: dim 0
    split in two, CTA r holding half r; ``[[0, 0]]``: every CTA holds the whole tile).
    Bases in elements abort the process ("Layout is expected to be surjective").
  * ``ttgl.program_id(0)`` is the cluster index: the launcher sets gridDim.x = grid[0] *
    num_ctas and a cluster of (num_ctas, 1, 1); the grid is given in clusters.
  * ``tma.async_load(..., multicast=True)`` into a buffer whose layout broadcasts becomes
    one ``cp.async.bulk.tensor...multicast::cluster`` of the whole tile, issued by cluster
    rank 0 only (each CTA issuing half, as CUTLASS does, cannot be written), completing
    the tx bytes on the barrier at the same offset in every CTA.
  * The consumers' release of a stage must reach the leader from both CTAs; Gluon's
    ``mbarrier.arrive(from_cta=...)`` only routes from CTA 0 outwards, so the release is
    an inline-PTX remote arrive (``mapa`` + ``mbarrier.arrive...shared::cluster``), as
    CUTLASS's ``ClusterBarrier::arrive(cta_id)``; SYNC=1 uses a cluster barrier per k-step
    instead.
"""

from __future__ import annotations

import triton
from triton.experimental import gluon
import triton.experimental.gluon.language as ttgl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)


@gluon.jit
def cluster_cta_rank():
    # Gluon 3.9.0 has no builtin for the CTA's rank within its cluster (the CGA model hides
    # it); read the PTX special register. Uniform scalar result.
    return ttgl.inline_asm("mov.u32 $0, %cluster_ctarank;", "=r", [], ttgl.int32, is_pure=True)


@gluon.jit
def arrive_remote_cta0(bar):
    """One arrival per WARPGROUP on CTA 0's copy of `bar` (from any CTA of the cluster).

    Gluon 3.9.0's hopper ``mbarrier.arrive(bar, from_cta=m)`` cannot express this: its routing
    is "destination d receives the arrival of source d & m", so m=0 makes CTA 0 arrive on
    EVERY CTA's barrier (CTA 0 is the only possible remote source; verified in the PTX), and
    ``multicast_cta`` (rubin.mbarrier.arrive) lowers to mbarrier.arrive.multicast::cluster,
    which ptxas rejects for sm_90a.  So: inline PTX, as CUTLASS's ClusterBarrier::arrive(cta_id)
    does (mapa + mbarrier.arrive.shared::cluster).  Gluon passes the barrier memdesc as its
    32-bit shared::cta address.  The caller must have retired (warpgroup_mma_wait) the wgmma
    reading the stage: wgmma.wait_group is warpgroup-collective, so the warpgroup's first
    thread may signal for the whole warpgroup without a CTA barrier.
    """
    ttgl.inline_asm(
        "{\n"
        ".reg .pred p;\n"
        ".reg .b32 t, r;\n"
        "mov.u32 t, %tid.x;\n"
        "and.b32 t, t, 127;\n"
        "setp.eq.u32 p, t, 0;\n"
        "mapa.shared::cluster.u32 r, $0, 0;\n"
        "@p mbarrier.arrive.release.cluster.shared::cluster.b64 _, [r];\n"
        "}",
        "r", [bar], (), is_pure=False)


@gluon.jit
def _issue_load(a_desc, b_desc, a_smem, b_smem, ready, empty, step, off_m, off_n, is_leader,
                STAGES: ttgl.constexpr, MULTICAST: ttgl.constexpr, SYNC: ttgl.constexpr):
    """Load k-step `step` into stage step % STAGES.

    `ready[s]` (per CTA, count 1) is armed by this CTA's own expect (its one arrival) with
    the bytes THIS CTA will receive: its half of A (nbytes_per_cta of a split tile) plus the
    whole B tile (a broadcast tile's nbytes_per_cta is its full size) -- whether it issued
    the B copy itself (leader) or receives it by multicast from the leader.  The tx bytes
    may land before this CTA's expect (tx-count goes transiently negative, allowed by PTX,
    as in CUTLASS's multicast pipelines); the phase cannot complete before the expect's
    arrival because the pending-arrival count is still 1.
    """
    s = step % STAGES
    if MULTICAST:
        if SYNC == 0:
            # Consumer-release ("empty") barrier.  Only the leader (rank 0) writes into the
            # partner's shared memory (the multicast B copy), so only the leader must wait
            # until BOTH CTAs have finished reading stage s for step - STAGES.  empty[s] is
            # initialised with count 2 CTAs x WARPGROUPS in every CTA, but only rank 0's copy
            # is ever arrived on: each consumer warpgroup of each CTA signals CTA 0's empty[s]
            # (arrive_remote_cta0).  The release of step t completes phase t // STAGES of
            # rank 0's empty[t % STAGES].  The partner's own A copy into its own stage needs
            # no barrier: it is issued in program order after the warpgroup_mma_wait that
            # retired the reads of that stage (and the whole CTA passes Triton's bar.sync
            # before the TMA issue).
            if step >= STAGES:
                mbarrier.wait(empty.index(s), ((step - STAGES) // STAGES) & 1, pred=is_leader)
        # SYNC == 1: the caller did a full cluster barrier after retiring the reads.
    mbarrier.expect(ready.index(s), a_desc.nbytes_per_cta + b_desc.nbytes_per_cta)
    tma.async_load(a_desc, [off_m, step * a_desc.block_shape[1]], ready.index(s), a_smem.index(s))
    tma.async_load(b_desc, [off_n, step * b_desc.block_shape[1]], ready.index(s), b_smem.index(s),
                   multicast=MULTICAST)


@gluon.jit
def mc_gemm_kernel(a_desc, b_desc, c_desc, bias_ptr, M, N, K,
                   acc_layout: ttgl.constexpr, STAGES: ttgl.constexpr, MULTICAST: ttgl.constexpr,
                   SYNC: ttgl.constexpr, GROUP_M: ttgl.constexpr, EPI: ttgl.constexpr):
    BLOCK_M: ttgl.constexpr = a_desc.block_shape[0]  # cluster rows (128 * num_ctas)
    BLOCK_K: ttgl.constexpr = a_desc.block_shape[1]
    BLOCK_N: ttgl.constexpr = b_desc.block_shape[0]  # B is (N, K), K-major

    # ---- cluster tile coordinates (program_id is the CLUSTER id), grouped raster ----
    pid = ttgl.program_id(0)
    num_pid_m = ttgl.cdiv(M, BLOCK_M)
    num_pid_n = ttgl.cdiv(N, BLOCK_N)
    num_in_group = GROUP_M * num_pid_n
    group_id = pid // num_in_group
    first_m = group_id * GROUP_M
    group_size = ttgl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group_size)
    pid_n = (pid % num_in_group) // group_size
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N

    # ---- shared memory ring (cluster-shaped allocations, per-CTA halves/broadcasts) ----
    a_smem = ttgl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_shape, a_desc.layout)
    b_smem = ttgl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_shape, b_desc.layout)
    # allocate_mbarrier() gives shape [num_ctas] with one barrier per CTA (cga [[1]]), batched.
    ready = mbarrier.allocate_mbarrier(batch=STAGES)
    empty = mbarrier.allocate_mbarrier(batch=STAGES)
    for i in ttgl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2 * (ttgl.num_warps() // 4))
    # (Triton inserts fence.mbarrier_init.release.cluster + a cluster barrier after the inits
    # itself when the kernel has multicast copies / remote arrives: seen in the PTX.)

    if MULTICAST:
        is_leader = cluster_cta_rank() == 0
    else:
        is_leader = True

    k_tiles = ttgl.cdiv(K, BLOCK_K)

    # ---- prologue: fill STAGES-1 stages (fresh stages: no release to wait for) ----
    for i in ttgl.static_range(STAGES - 1):
        if i < k_tiles:
            _issue_load(a_desc, b_desc, a_smem, b_smem, ready, empty, i, off_m, off_n, is_leader,
                        STAGES, MULTICAST, SYNC)

    acc = ttgl.zeros([BLOCK_M, BLOCK_N], ttgl.float32, acc_layout)
    for j in range(k_tiles):
        s = j % STAGES
        mbarrier.wait(ready.index(s), (j // STAGES) & 1)
        acc = warpgroup_mma(a_smem.index(s), b_smem.index(s).permute((1, 0)), acc, is_async=True)
        # retire wgmma j-1: stage (j-1) % STAGES is no longer read by this CTA
        acc, _, _ = warpgroup_mma_wait(1, deps=[acc, a_smem.index(s), b_smem.index(s)])
        nxt = j + STAGES - 1
        if MULTICAST:
            if SYNC == 0:
                # release step j-1 to the leader (only if the leader will wait for it)
                if j >= 1:
                    if nxt < k_tiles:
                        arrive_remote_cta0(empty.index((j - 1) % STAGES))
            else:
                # coarse alternative (what Triton's own test does for wgmma + multicast):
                # a full cluster barrier = both CTAs have retired wgmma j-1.
                ttgl.barrier(cluster=True)
        if nxt < k_tiles:
            _issue_load(a_desc, b_desc, a_smem, b_smem, ready, empty, nxt, off_m, off_n, is_leader,
                        STAGES, MULTICAST, SYNC)
    acc = warpgroup_mma_wait(0, deps=[acc])

    # ---- epilogue (EPI 1: D = gelu_tanh(acc + bias), the bias a per-column vector
    # loaded in the accumulator's column slice: every CTA of the pair loads its columns)
    if EPI == 1:
        offs_n = off_n + ttgl.arange(0, BLOCK_N, layout=ttgl.SliceLayout(0, acc_layout))
        b = ttgl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(ttgl.float32)
        x = acc + ttgl.expand_dims(b, 0)
        y = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        t = 2.0 / (1.0 + ttgl.exp(-2.0 * y)) - 1.0  # tanh(y)
        acc = 0.5 * x * (1.0 + t)
    # ---- registers -> smem (cluster tile, split like A) -> TMA store ----
    c_smem = ttgl.allocate_shared_memory(c_desc.dtype, c_desc.block_shape, c_desc.layout,
                                         acc.to(c_desc.dtype))
    fence_async_shared()
    tma.async_store(c_desc, [off_m, off_n], c_smem)
    tma.store_wait(0)
    # No mbarrier.invalidate: a partner's remote arrive could still target empty[] (Triton
    # already ends a multi-CTA kernel with a cluster barrier, keeping smem alive).


# ------------------------------------------------------------------------------------------
# host side
# ------------------------------------------------------------------------------------------

def layouts(num_ctas: int, block_n: int = 256, warps_m: int = 8):
    """(cga_a, cga_b, cga_c, acc_layout, nvmma layouts) for a 128 * num_ctas x block_n cluster tile."""
    split = [[1, 0]] if num_ctas == 2 else []  # CTA r holds row-half r
    bcast = [[0, 0]] if num_ctas == 2 else []  # every CTA holds the whole tile
    la = ttgl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2, cga_layout=split)
    lb = ttgl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2, cga_layout=bcast)
    lc = ttgl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2, cga_layout=split)
    acc = ttgl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[warps_m, 1],
                                      instr_shape=[16, block_n, 16], cga_layout=split)
    return la, lb, lc, acc


def make_args(A, B, C, num_ctas=2, block_n=256, block_k=64, stages=3, multicast=True, sync=0,
              group_m=8, bias=None):
    """Positional kernel arguments; A (M,K), B (N,K), C (M,N), all row-major bf16.

    The descriptors' block shapes are the CLUSTER tile: A [128*num_ctas, BK] (the compiler's
    TMA box is the per-CTA [128, BK]); B [BN, BK] broadcast (box = the whole [BN, BK]);
    C [128*num_ctas, BN]."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    la, lb, lc, acc = layouts(num_ctas, block_n)
    bm = 128 * num_ctas
    a_desc = TensorDescriptor.from_tensor(A, [bm, block_k], la)
    b_desc = TensorDescriptor.from_tensor(B, [block_n, block_k], lb)
    c_desc = TensorDescriptor.from_tensor(C, [bm, block_n], lc)
    M, K = A.shape
    N = B.shape[0]
    mc = bool(multicast and num_ctas > 1)
    epi = 0 if bias is None else 1
    return [a_desc, b_desc, c_desc, C if bias is None else bias, M, N, K, acc, stages, mc, sync,
            group_m, epi]


def launch(A, B, C, num_ctas=2, block_n=256, stages=3, multicast=True, sync=0, group_m=8,
           bias=None):
    """Launch on a GPU; the grid is counted in clusters. ``bias`` (N,): D = gelu_tanh(A @ B.T
    + bias), else D = A @ B.T."""
    args = make_args(A, B, C, num_ctas, block_n, 64, stages, multicast, sync, group_m, bias)
    M, N = C.shape
    grid = (triton.cdiv(M, 128 * num_ctas) * triton.cdiv(N, block_n), )
    return mc_gemm_kernel[grid](*args, num_warps=8, num_ctas=num_ctas)


# name: (num_ctas, block_n, stages, multicast, sync): the multicast kernels and their controls
VARIANTS = {
    "mc_mbar": (2, 256, 3, True, 0),  # multicast B, empty mbarriers + remote arrive
    "mc_clbar": (2, 256, 3, True, 1),  # multicast B, a cluster barrier per k-step
    "cl2_nomc": (2, 256, 3, False, 0),  # 2-CTA clusters, no multicast (each CTA loads B)
    "cta1": (1, 256, 3, False, 0),  # control: one CTA
    "mc_mbar_s4": (2, 256, 4, True, 0),
    "mc_mbar_n128_s4": (2, 128, 4, True, 0),
    "cta1_n128_s4": (1, 128, 4, False, 0),
}
