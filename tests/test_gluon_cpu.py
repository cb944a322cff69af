"""The gluon family without a GPU: its refusals, its shared-memory plan, and offline
compiles of generated kernels for sm_90 (``runtime.offline``), which check that
each one is valid Gluon, fits shared memory and does not spill heavily. Results on a
GPU: tests/gpu/test_gpu_gluon.py.
"""

from __future__ import annotations

import os

import pytest
import torch

from evtfuse import EpilogueArguments, GemmArguments, explain
from evtfuse.backends.triton.families import SMEM_LIMIT, GluonFamily, Target
from evtfuse.backends.triton.gluon_buffers import buffers
from evtfuse.backends.triton.gluon_family import _vector_refusal
from evtfuse.backends.triton.versions import spelling
from evtfuse.backends.triton.names import Names
from offline_run import run_offline

pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")

BF = torch.bfloat16
M, N, K = 512, 384, 256
H100 = Target("cuda", 90, torch.device("cpu"), 132)
STORE = spelling("tma_store")  # Gluon's TMA store as the installed Triton spells it


def _args(src, dtype=BF, **ops):
    A, B = torch.randn(M, K).to(dtype), torch.randn(K, N).to(dtype)
    if "D" not in ops:
        ops["D"] = torch.empty(M, N, dtype=dtype)
    return GemmArguments(A, B, ops["D"], epilogue=EpilogueArguments(src, **ops))


ALPHA_BETA = "def epi(accum, C, alpha, beta): D = alpha * accum + beta * C; return D"
RELU_AUX = "def epi(accum, C, alpha): F = alpha * accum + C * 2.0; D = relu(F); return D, F"


def test_refused_under_interpreter_with_reason():
    args = _args(ALPHA_BETA, dtype=torch.float16, C=torch.randn(M, N).half(), alpha=1.0, beta=1.0)
    assert "gluon: refused: Gluon kernels need a Hopper GPU" in explain(args)


def test_refusals_on_hopper_target():
    fam = GluonFamily()
    fp32 = _args(ALPHA_BETA, dtype=torch.float32, C=torch.randn(M, N), alpha=1.0, beta=1.0)
    assert not fam.supports(fp32, Target("cuda", 80, torch.device("cpu"), 108))
    assert "compute capability 9.0" in fam.supports(fp32, Target("cuda", 100, torch.device("cpu"), 148)).reason


def test_output_shares_a_load_buffer_of_its_dtype():
    b = buffers(_args(ALPHA_BETA, C=torch.randn(M, N).to(BF), alpha=1.0, beta=1.0).optimized_dag)
    assert b.tile_stores == (("D", "C"),) and not b.piece_stores  # D staged in C's buffer
    assert b.smem_bytes(128, 128, 64) == 2 * 128 * 128 * 2
    b = buffers(_args(ALPHA_BETA, C=torch.randn(M, N).to(BF), alpha=1.0, beta=1.0,
                      D=torch.empty(M, N)).optimized_dag)  # fp32 D: staged per piece
    assert b.piece_stores == (("D", torch.float32),) and not b.tile_stores
    assert b.smem_bytes(128, 128, 32) == 2 * 128 * 128 * 2 + 2 * 2 * 128 * 32 * 4
    b = buffers(_args(RELU_AUX, C=torch.randn(M, N).to(BF), alpha=0.5,
                      F=torch.empty(M, N, dtype=BF)).optimized_dag)
    assert len(b.tile_stores) == 1 and len(b.piece_stores) == 1


def test_vectors_staged_in_shared_memory_by_tma():
    src = "def epi(accum, r, bias, y): D = accum * r + bias + y; return D"
    y = torch.randint(0, 3, (N,))  # int64: read from global memory, not staged
    args = _args(src, r=torch.randn(M, 1).to(BF), bias=torch.randn(N), y=y)
    b = buffers(args.optimized_dag)
    assert b.vectors == (("r", BF, True), ("bias", torch.float32, False))
    assert b.smem_bytes(128, 128, 64) == 2 * 2 * 128 * 64 * 2 + 2 * 128 * 2 + 2 * 128 * 4  # D pieces
    assert _vector_refusal(args) is None  # GluonFamily.supports asks it (on a GPU)
    strided = _args(src, r=torch.randn(M, 2).to(BF)[:, :1], bias=torch.randn(N), y=y)
    why = _vector_refusal(strided)
    assert "r is not contiguous (stride 2)" in why and "TMA-loads" in why
    unaligned = _args(src, r=torch.randn(M, 1).to(BF), bias=torch.randn(N + 1)[1:], y=y)
    assert "bias's data pointer is not 16-byte aligned" in _vector_refusal(unaligned)


def test_configs_fit_shared_memory_or_refuse():
    fam = GluonFamily()
    ab = _args(ALPHA_BETA, C=torch.randn(M, N).to(BF), alpha=1.0, beta=1.0)
    cfgs = fam.configs(ab, H100)
    assert cfgs and all(c.num_stages == 5 for c in cfgs if not c.cooperative)
    # 128x256 cooperative tiles: C's 64 KB leave three 48 KB stages
    assert [(c.block_n, c.epi_split, c.num_stages) for c in cfgs if c.cooperative] == [
        (256, 4, 3), (256, 2, 3)]
    two = _args(RELU_AUX, C=torch.randn(M, N).to(BF), alpha=0.5, F=torch.empty(M, N, dtype=BF))
    # D staged in C's tiles; F's pieces would leave 4 stages, so F goes into C's chunks
    # after D (slots) at five stages, in quarters (two per chunk) and halves (one)
    cfgs = [c for c in fam.configs(two, H100) if not c.cooperative]
    assert [(c.num_stages, c.epi_split, c.slots) for c in cfgs] == [
        (5, 4, True), (5, 4, True), (5, 2, True), (5, 2, True)]
    # three full tiles through the epilogue (C in, D and F out): bands of 8 and 16 row-tiles
    # (GluonFamily.HEAVY_PP_GROUPS); alpha-beta's two: 8 and 4
    assert [c.group_m for c in cfgs] == [8, 16, 8, 16]
    assert [c.group_m for c in fam.configs(ab, H100) if not c.cooperative] == [8, 4, 8, 4]
    assert [(fam.spec(two, c, H100).direct, fam.spec(two, c, H100).chunk) for c in cfgs] == [
        ((), 64)] * 4
    assert fam._ring(two.optimized_dag, 4, 2, ()) == 4  # with F's pieces in shared memory
    # an fp16 F has no bf16 buffer to share: stored from registers at five stages, and
    # every output staged at four
    f16 = _args(RELU_AUX, C=torch.randn(M, N).to(BF), alpha=0.5, F=torch.empty(M, N, dtype=torch.half))
    cfgs = [c for c in fam.configs(f16, H100) if not c.cooperative]
    assert [c.num_stages for c in cfgs] == [5, 5, 5, 5, 4] and not any(c.slots for c in cfgs)
    assert [fam.spec(f16, c, H100).direct for c in cfgs] == [("F",)] * 4 + [()]
    assert cfgs[-1].epi_split == 4  # every output staged: quarters, 4 stages
    assert fam.spec(ab, cfgs[0], H100).direct == ()  # alpha-beta stages D in C's tiles
    many = _args("def epi(accum, C, X, Y): D = accum + C + X + Y; return D",
                 C=torch.randn(M, N).to(BF), X=torch.randn(M, N).to(BF), Y=torch.randn(M, N).to(BF))
    # three aux tiles (192 KB in halves) are read through pointers, in quarters and eighths
    assert fam._epilogue_smem(many.optimized_dag, fam._split(many.optimized_dag, 2)) == 192 * 1024
    cfgs = [c for c in fam.configs(many, H100) if not c.cooperative]
    assert sorted({c.epi_split for c in cfgs}) == [4, 8], cfgs
    assert all(set(fam.spec(many, c, H100).direct) == {"C", "X", "Y"} for c in cfgs)


BCE = ("def epi(accum, bias, C): f = accum + bias; "
       "t = (1.0 - C) * (-f) + log(clamp(sigmoid(f), 1e-3, 0.999)); loss = sum(t); D = f; "
       "return D, loss")


def test_two_warpgroup_consumers_for_epilogues_of_many_ops():
    """Epilogues of ``WIDE_WORK`` or more elementwise ops that store no full tile get
    ping-pong configs whose consumers are 8 warps (two warpgroups), first, halves before
    quarters; lighter ones and those that store a tile none. Their kernels lay the
    accumulator over 8 warps and launch 8-warp consumers."""
    from dataclasses import replace

    from evtfuse.backends.triton.codegen import generate
    from evtfuse.backends.triton.families import tile_work

    fam = GluonFamily()
    bce = _args(BCE, bias=torch.randn(N), C=torch.randn(M, N).to(BF), loss=torch.empty(1), D=None)
    assert tile_work(bce.optimized_dag) >= fam.WIDE_WORK
    cfgs = fam.configs(bce, H100)
    wide = [c for c in cfgs if c.num_warps == 8]
    assert cfgs[:2] == wide and [c.epi_split for c in wide] == [2, 4]
    assert not any(c.cooperative for c in wide) and wide[0].name == "128x128x64_w8_s5_g8_e2"
    # the same configs at 4 warps follow
    assert {replace(c, num_warps=4) for c in wide} <= set(cfgs[2:])
    for light in (_args(ALPHA_BETA, C=torch.randn(M, N).to(BF), alpha=1.0, beta=1.0),
                  _args(RELU_AUX, C=torch.randn(M, N).to(BF), alpha=0.5, F=torch.empty(M, N, dtype=BF))):
        assert tile_work(light.optimized_dag) < fam.WIDE_WORK
        assert all(c.num_warps == 4 for c in fam.configs(light, H100))
    stored = _args("def epi(accum, bias): f = accum + bias; "
                   "D = tanh(f) * sigmoid(f) + exp(-abs(f)); return D", bias=torch.randn(N))
    assert tile_work(stored.optimized_dag) >= fam.WIDE_WORK  # many ops, but D is stored
    assert all(c.num_warps == 4 for c in fam.configs(stored, H100))
    src = generate(fam.spec(bce, wide[0], H100))
    four = generate(fam.spec(bce, replace(wide[0], num_warps=4), H100))
    assert "warps_per_cta=[8, 1]" in src and "], [8, 1, 1], [CONSUMER_REGS" in src
    assert "warps_per_cta=[4, 1]" in four and "], [4, 1, 1], [CONSUMER_REGS" in four
    # two consumers and the two 1-warp partitions within the SM's 64K registers
    for warps, (consumer, producer) in fam.REGS.items():
        assert 2 * 32 * warps * consumer + 2 * 32 * producer <= 65536
    coop = next(c for c in cfgs if c.cooperative)
    with pytest.raises(ValueError, match="cooperative tiles: 4"):
        fam.spec(bce, replace(coop, num_warps=8), H100)


def _kernel_source(args):
    from evtfuse.backends.triton.codegen import generate

    fam = GluonFamily()
    return generate(fam.spec(args, fam.configs(args, H100)[0], H100))


def _function(source, name):
    """The text of generated function ``name`` (to the next blank line pair)."""
    start = source.index(f"def {name}(")
    return source[start:source.index("\n\n\n", start)]


def test_second_tiles_aux_loads_wait_for_the_first_mainloop():
    """The memory warp loads the first tile's aux tiles at once and the second tile's only
    after consumer 0 has issued its first mainloop (a one-shot barrier), so that the second
    does not compete with the ring's first fill; a kernel with no aux loads has no barrier."""
    src = _kernel_source(_args(ALPHA_BETA, C=torch.randn(M, N).to(BF), alpha=1.0, beta=1.0))
    mem = _function(src, "_ef_mem")
    first, wait, second = (mem.index(x) for x in ("_ef_mem_issue(0,", "mbarrier.wait(c_go.index(0), 0)",
                                                  "_ef_mem_issue(1,"))
    assert first < wait < second
    consumer = _function(src, "_ef_consumer")
    # consumer 0 arrives once, after its first tile's mainloop is issued
    arrive = consumer.index("mbarrier.arrive(c_go.index(0), pred=r == 0)")
    assert consumer.index("if WHICH == 0:") < arrive
    assert consumer.index("mbarrier.arrive(order.index(1 - WHICH))") < arrive
    assert src.count("mbarrier.init(c_go.index(0), count=1)") == 1
    assert "c_go" not in _kernel_source(_args("def epi(accum): D = accum; return D"))


def test_cooperative_tiles_share_the_ring():
    """Cooperative configs (128x256, both consumers on every tile): each consumer takes its
    64 rows of A's stage, every stage waits for both consumers' release, the mainloops do
    not alternate, and the memory warp moves the aux tiles in halves (units); offered
    only where a consumer's half of the tile is well defined for every output."""
    from evtfuse.backends.triton.codegen import generate

    fam = GluonFamily()
    args = _args(ALPHA_BETA, C=torch.randn(M, N).to(BF), alpha=1.0, beta=1.0)
    coop = [c for c in fam.configs(args, H100) if c.cooperative]
    assert coop and all(c.name.endswith("_co") for c in coop)
    src = generate(fam.spec(args, coop[0], H100))
    assert "a_bufs.index(s).slice(WHICH * EPI_M, EPI_M, dim=0)" in src
    assert "mbarrier.init(empty.index(i), count=2)" in src
    consumer = _function(src, "_ef_consumer")
    assert "order.index" not in consumer and "EPI_M: gl.constexpr = BLOCK_M // 2" in consumer
    assert "row0 = pid_m_c * BLOCK_M + WHICH * EPI_M" in consumer
    assert "my_units = 2 * my_tiles" in _function(src, "_ef_mem")
    assert "(u % 2) * (BLOCK_M // 2)" in _function(src, "_ef_unit_origin")
    # both halves of the first tile load once consumer 0 has seen the ring's first fill
    mem = _function(src, "_ef_mem")
    assert mem.index("mbarrier.wait(c_go.index(0), 0)") < mem.index("_ef_mem_issue(0,") \
        < mem.index("_ef_mem_issue(1,")
    assert "(kk == gl.minimum(k_tiles, NUM_STAGES) - 1)" in consumer
    # the ping-pong source is unchanged in these respects
    pp = generate(fam.spec(args, fam.configs(args, H100)[0], H100))
    assert "count=2" not in pp and "my_units = my_tiles" in pp and "order.index" in pp
    # halves only for light epilogues (a heavy one in halves spills)
    assert [c.epi_split for c in coop] == [4, 2]
    heavy = _args("def epi(accum, C): D = silu(accum) * tanh(C) + sigmoid(accum * C); return D",
                  C=torch.randn(M, N).to(BF))
    assert [c.epi_split for c in fam.configs(heavy, H100) if c.cooperative] == [4]
    # refusals: a column-major A (its stage is sliced by rows), a per-column sum
    a_col = GemmArguments(torch.randn(K, M).to(BF).T, args.B, args.out, epilogue=args.epilogue)
    assert "column-major" in fam._coop_refusal(a_col)
    assert not any(c.cooperative for c in fam.configs(a_col, H100))
    col = _args("def epi(accum): D = accum; cs = sum(accum); return D, cs", cs=torch.empty(N))
    assert "per-column sum" in fam._coop_refusal(col)
    folded = _args("def epi(accum): D = accum; cm = max(accum); return D, cm", cm=torch.empty(N))
    assert fam._coop_refusal(folded) is None  # atomic folds do not care whose rows
    # a per-batch whole-output reduction: one partial per tile (both halves stored to it)
    for op in ("sum", "max", "logsumexp"):
        per_batch = GemmArguments(
            torch.randn(3, M, K).to(BF), args.B, None, torch.float32,
            EpilogueArguments(f"def epi(accum): D = accum; s = {op}(accum); return D, s",
                              D=torch.empty(3, M, N), s=torch.empty(3, 1, 1)))
        assert f"per-batch {op}" in fam._coop_refusal(per_batch)
        assert not any(c.cooperative for c in fam.configs(per_batch, H100))
        assert any(not c.cooperative for c in fam.configs(per_batch, H100))


def test_quarters_run_in_a_runtime_loop_where_the_body_allows():
    """One copy of the epilogue body for the four column pieces (a loop with the piece's
    slices selected at its top), where no per-tile reduction needs the piece's place and
    no output is stored from registers; halves and the rest stay unrolled."""
    from evtfuse.backends.triton.codegen import generate
    from evtfuse.backends.triton.families import TileConfig

    fam = GluonFamily()

    def source(args, split, stages=4):
        return generate(fam.spec(args, TileConfig(128, 128, 64, 8, 4, stages, epi_split=split),
                                 H100))

    bce = _args(CASES["bce"][0], bias=torch.randn(N), C=torch.randn(M, N).to(BF),
                loss=torch.empty(1), D=None)
    consumer = _function(source(bce, 4), "_ef_consumer")
    assert "for k in range(4):" in consumer and consumer.count("_ef_log_sigmoid_cuda(") == 1
    c_buf = Names.of(bce.optimized_dag)("C", "lbc")  # the consumer's buffer of C
    for j in range(4):  # each piece's C slice, once
        assert consumer.count(f"{c_buf}.slice({j} * SUB_N, SUB_N, dim=1).load(PL)") == 1
    halves = _function(source(bce, 2), "_ef_consumer")
    assert "for k in range(" not in halves and halves.count("_ef_log_sigmoid_cuda(") == 2
    ab = _args(ALPHA_BETA, C=torch.randn(M, N).to(BF), alpha=1.0, beta=1.0)
    consumer = _function(source(ab, 4), "_ef_consumer")
    nm = Names.of(ab.optimized_dag)
    for j in range(4):  # D, staged in C's buffer, goes into its slice after the body
        assert f"{nm('C', 'lbc')}.slice({j} * SUB_N, SUB_N, dim=1).store({nm('D', 'st')})" in consumer
    amax = _args(CASES["row_amax"][0], amax=torch.empty(M, 1))  # per-row partials: unrolled
    assert "for k in range(" not in _function(source(amax, 4), "_ef_consumer")
    aux = _args(RELU_AUX, C=torch.randn(M, N).to(BF), alpha=0.5, F=torch.empty(M, N, dtype=torch.half))
    assert "for k in range(" not in _function(source(aux, 4, stages=5), "_ef_consumer")  # F direct
    assert "for k in range(4):" in _function(source(aux, 4), "_ef_consumer")  # F staged


def test_slot_stores_share_the_load_buffer_chunk_by_chunk():
    """relu with an aux output: D goes into C's buffer in place, F into the same chunk
    once D's chunk has left; the consumer stores both by 128-byte chunk (64 bf16 columns)
    and waits on the bulk groups in their issue order; the memory warp only loads."""
    from evtfuse.backends.triton.codegen import generate
    from evtfuse.backends.triton.gluon_buffers import slot_columns, slots_fit

    two = _args(RELU_AUX, C=torch.randn(M, N).to(BF), alpha=0.5, F=torch.empty(M, N, dtype=BF))
    b = buffers(two.optimized_dag, slots=True)
    assert b.slot_stores == (("F", "C"),) and b.consumer_tiles == (("D", "C"),)
    assert not b.piece_stores and b.smem_bytes(128, 128, 32) == 2 * 128 * 128 * 2  # C's tiles only
    assert slot_columns(BF) == 64 and slot_columns(torch.float32) == 32
    assert slots_fit(b, 128, 32) and slots_fit(b, 128, 64) and not slots_fit(b, 128, 128)
    assert buffers(two.optimized_dag).slot_stores == ()  # only when asked
    fam = GluonFamily()
    cfg = fam.configs(two, H100)[0]
    assert cfg.slots and cfg.name.endswith("_sl")
    src = generate(fam.spec(two, cfg, H100))
    consumer, mem = _function(src, "_ef_consumer"), _function(src, "_ef_mem")
    nm = Names.of(two.optimized_dag)
    c_buf = nm("C", "lbc")
    assert nm("D", "desc") not in mem and STORE not in mem
    lines = [ln.strip() for ln in consumer.splitlines()]
    stores = [ln for ln in lines if ln.startswith((STORE, "tma.store_wait",
                                                   nm("F", "hold"), f"{c_buf}.slice"))
              and ".load(" not in ln]
    chunk = lambda d, c: (f"{STORE}({nm(d, 'desc')}, [row0, pid_n_c * BLOCK_N + "
                          f"{c} * CH], {c_buf}.slice({c} * CH, CH, dim=1))")
    d_piece = lambda j: f"{c_buf}.slice({j} * SUB_N, SUB_N, dim=1).store((v7_{j}).to({c_buf}.dtype))"
    f_piece = lambda j: f"{c_buf}.slice({j} * SUB_N, SUB_N, dim=1).store({nm('F', 'hold', j)})"
    hold = lambda j: f"{nm('F', 'hold', j)} = (v6_{j}).to({c_buf}.dtype)"
    assert [ln.split("  #")[0] for ln in stores] == [
        d_piece(0), hold(0),
        d_piece(1), hold(1), chunk("D", 0),
        d_piece(2), hold(2),
        d_piece(3), hold(3), chunk("D", 1),
        "tma.store_wait(pendings=1)", f_piece(0), f_piece(1), chunk("F", 0),  # D0 done, D1 may run
        "tma.store_wait(pendings=1)", f_piece(2), f_piece(3), chunk("F", 1),  # D1 done, F0 may run
        "tma.store_wait(pendings=0)"]  # before the memory warp may reload C
    assert lines.index("tma.store_wait(pendings=0)  # the buffers are free again") < \
        lines.index("mbarrier.arrive(d_ready.index(WHICH))")
    # without a slot output: ping-pong halves store D by chunk from the consumer, and so do
    # quarters from their runtime piece loop (every second piece completes a chunk);
    # cooperative tiles keep the memory warp's whole-half store
    ab = _args(ALPHA_BETA, C=torch.randn(M, N).to(BF), alpha=1.0, beta=1.0)
    cfgs = fam.configs(ab, H100)
    assert [(c.epi_split, c.cooperative, c.slots) for c in cfgs] == [
        (2, False, True), (2, False, True), (4, True, False), (2, True, False),
        (4, False, True), (4, False, True)]
    assert fam.spec(ab, cfgs[0], H100).chunk == 64  # a 64-column half is one chunk
    src = generate(fam.spec(ab, cfgs[0], H100))
    consumer, mem = _function(src, "_ef_consumer"), _function(src, "_ef_mem")
    nm = Names.of(ab.optimized_dag)
    d_desc = nm("D", "desc")
    assert consumer.count(f"{STORE}({d_desc}") == 2
    assert consumer.count("tma.store_wait(") == 1 and d_desc not in mem
    loop = _function(generate(fam.spec(ab, cfgs[4], H100)), "_ef_consumer")
    assert "for k in range(4):" in loop
    branches = loop.split(f"{nm('C', 'lbc')}.slice(")[1:]  # the loop's bottom: the slice stores, by piece
    issued = [b.count(f"{STORE}({d_desc}") for b in branches
              if b.startswith(tuple(f"{j} * SUB_N, SUB_N, dim=1).store({nm('D', 'st')})" for j in range(4)))]
    assert issued == [0, 1, 0, 1]
    assert f"{STORE}({d_desc}, [row0, col0]" in _function(
        generate(fam.spec(ab, cfgs[2], H100)), "_ef_mem")
    # relu with an aux output: the cooperative tiles stage F in C's chunks too
    coop = [c for c in fam.configs(two, H100) if c.cooperative]
    assert coop and all(c.slots for c in coop) and fam.spec(two, coop[0], H100).chunk == 64


def test_chunks_narrower_than_a_piece(monkeypatch):
    """Cooperative halves are 128 columns a piece: asked for chunks (``COOP_CHUNKS``, a
    probe), each piece issues its two 64-column chunks; slot outputs need whole pieces per
    chunk, so they do not fit there."""
    from evtfuse.backends.triton import gluon_family
    from evtfuse.backends.triton.codegen import generate
    from evtfuse.backends.triton.gluon_buffers import slots_fit

    monkeypatch.setattr(gluon_family, "COOP_CHUNKS", True)  # read by GluonFamily._slotted
    fam = GluonFamily()
    ab = _args(ALPHA_BETA, C=torch.randn(M, N).to(BF), alpha=1.0, beta=1.0)
    halves = next(c for c in fam.configs(ab, H100) if c.cooperative and c.epi_split == 2)
    assert halves.slots
    consumer = _function(generate(fam.spec(ab, halves, H100)), "_ef_consumer")
    issues = [ln.strip() for ln in consumer.splitlines() if STORE in ln]
    assert [ln.split("BLOCK_N + ")[1].split(" ")[0] for ln in issues] == ["0", "1", "2", "3"]
    two = _args(RELU_AUX, C=torch.randn(M, N).to(BF), alpha=0.5, F=torch.empty(M, N, dtype=BF))
    assert not slots_fit(buffers(two.optimized_dag, slots=True), 256, 128)
    assert slots_fit(buffers(ab.optimized_dag, slots=True), 256, 128)


_SPECIALIZE_SRC = """
def evtfuse_kernel(one, n16, odd, ptr, M):
    pass
"""


def test_offline_compiles_specialize_as_the_jit_does(tmp_path):
    """An integer 1 becomes a constant, integers and pointers divisible by 16 carry that
    divisibility (wider loads and stores in the SASS), others neither: as Triton's JIT; a
    parameter the decorator leaves unspecialised (M: ``KernelSpec.runtime_m``) neither."""
    from triton.runtime.jit import JITFunction

    from evtfuse.runtime.cache import import_source
    from evtfuse.runtime.offline import _specialized

    path = tmp_path / "specialize_kernel.py"
    path.write_text(_SPECIALIZE_SRC)
    module = import_source("evtfuse_specialize_test", str(path), _SPECIALIZE_SRC)
    # what @triton.jit(do_not_specialize=["M"]) makes with the interpreter off
    fn = JITFunction(module.evtfuse_kernel, do_not_specialize=["M"])
    for m in (1, 4096):
        sig, consts, attrs = _specialized(fn, [1, 384, 7, torch.empty(4), m])
        assert sig == {"one": "constexpr", "n16": "i32", "odd": "i32", "ptr": "*fp32", "M": "i32"}
        assert consts == {(0,): 1}
        assert attrs == {(1,): [["tt.divisibility", 16]], (3,): [["tt.divisibility", 16]]}


CASES = {
    "alpha_beta": (ALPHA_BETA, dict(C="full", alpha=1.0, beta=0.5)),
    "relu_aux_two_outputs": (RELU_AUX, dict(C="full", alpha=0.5, F="outbf")),
    "fp32_output": ("def epi(accum, bias): D = relu(accum + bias); return D", dict(bias="col", D="f32")),
    "identity_col_major_b": ("def epi(accum): D = accum; return D", dict(B_col=True)),
    "bias_gelu": ("def epi(accum, bias): D = gelu_tanh(accum + bias); return D", dict(bias="col")),
    "silu_mul": ("def epi(accum, X): D = silu(accum) * X; return D", dict(X="full")),
    "aux_device_scalar": ("def epi(accum, C, s): D = accum * s + C; return D",
                          dict(C="full", s="dev")),
    "row_amax": ("def epi(accum): D = accum; amax = max(abs(accum)); return D, amax", dict(amax="row")),
    "col_min_fold": ("def epi(accum): D = accum; cm = min(accum); return D, cm", dict(cm="colout")),
    "lse_target": ("def epi(accum, y): lse = logsumexp(accum); "
                   "tgt = sum(where(col_index() == y, accum, 0.0)); D = accum; return D, lse, tgt",
                   dict(y="yrow", lse="row", tgt="row", D=None)),
    "row_and_col_vectors": ("def epi(accum, r, bias): D = accum * r + bias; return D",
                            dict(r="rowbf", bias="colbf")),
    "stored_vectors": ("def epi(accum, r, bias, s): D = accum * r + bias; "
                       "inv = 1.0 / (r * r + 1.0); b2 = bias * 2.0; s3 = s * 3.0; "
                       "return D, inv, b2, s3",
                       dict(r="rowbf", bias="col", s="dev", inv="row", b2="colout", s3="one")),
    "bce": ("def bce(accum, bias, C): f = accum + bias; "
            "t = (1 - C) * (-f) + log(clamp(sigmoid(f), 1e-3, 0.999)); loss = sum(t); D = f; "
            "return D, loss", dict(bias="col", C="full", loss="one", D=None)),
}


_MAKERS = {
    "full": lambda: torch.randn(M, N).to(BF),
    "col": lambda: torch.randn(N),
    "row": lambda: torch.empty(M, 1),
    "rowbf": lambda: torch.randn(M, 1).to(BF),
    "colbf": lambda: torch.randn(N).to(BF),
    "yrow": lambda: torch.randint(0, N, (M, 1)),
    "one": lambda: torch.empty(1),
    "outbf": lambda: torch.empty(M, N, dtype=BF),
    "colout": lambda: torch.empty(N, dtype=BF),
    "colf32": lambda: torch.empty(N),
    "f32": lambda: torch.empty(M, N),
    "dev": lambda: torch.randn(()),
    None: lambda: None,
}


def _make(kind):
    """A value for a case's operand: a kind named in _MAKERS, or the value itself."""
    return _MAKERS[kind]() if kind in _MAKERS else kind


def compile_case(name):
    """Offline-compile one case (called in a subprocess with the interpreter off)."""
    from dataclasses import replace

    from evtfuse.runtime.offline import compile_for

    src, spec = CASES[name]
    spec = dict(spec)
    b_col = spec.pop("B_col", False)
    ops = {k: _make(v) for k, v in spec.items()}
    args = _args(src, **ops)
    if b_col:
        args = GemmArguments(args.A, torch.randn(N, K).to(BF).T, args.out, epilogue=args.epilogue)
    fam = GluonFamily()
    result = {}
    cfgs = fam.configs(args, H100)
    first = next(c for c in cfgs if not c.cooperative and c.num_warps == 4)
    wide = replace(first, num_warps=8)
    wide = replace(wide, num_stages=fam.fit_stages(args, wide))
    for key, cfg in [("pingpong", first), ("wide", wide),
                     *(("coop", c) for c in cfgs if c.cooperative)][:3]:
        out = compile_for(fam, cfg, args)
        result[key] = {"shared": out.shared_bytes, "spills": out.spills,
                       "wgmma": "wgmma.mma_async" in out.ptx, "setmaxnreg": "setmaxnreg" in out.ptx}
    return result


SCRIPT = """
import json, sys
sys.path.insert(0, {tests!r})
import test_gluon_cpu as t
out = {{}}
for name in t.CASES:
    try:
        out[name] = t.compile_case(name)
    except Exception as exc:  # reported per case by the test
        out[name] = {{"error": f"{{type(exc).__name__}}: {{str(exc)[-3000:]}}"}}
print("RESULT" + json.dumps(out))
"""


COLUMN_SCRIPT = """
import json, sys
from dataclasses import replace
import torch
sys.path.insert(0, {tests!r})
import test_gluon_cpu as t
from evtfuse.runtime.offline import compile_for
fam, out = t.GluonFamily(), {{}}
for name, src, ops in t.COLUMN_CASES:
    args = t._args(src, **{{k: t._make(v) for k, v in ops.items()}})
    for c in fam.configs(args, t.H100):
        if c.num_warps == 4 and not c.cooperative:
            c = replace(c, num_warps=8)
            c = replace(c, num_stages=fam.fit_stages(args, c))
        out[name + " " + c.name] = compile_for(fam, c, args).shared_bytes
print("RESULT" + json.dumps(out))
"""
# per-column reductions (their warps combine partials through scratch memory), 8-warp
# consumers in halves: 5 stages planned with a flat 2 KB reserve came to 233,628 and
# 234,152 bytes (scripts/smem_probe.py), over the limit
COLUMN_CASES = [
    ("col_max", "def epi(accum): D = accum; R = max(accum); return D, R", dict(R="colf32")),
    ("aux_col_min", "def epi(accum, C, bias): D = accum * C + bias; R = min(accum); return D, R",
     dict(C="full", bias="colbf", R="colf32")),
]


@pytest.mark.slow
def test_column_reductions_fit_shared_memory_at_every_warp_count():
    """Every config the family offers for per-column reductions, and each ping-pong one
    at 8 warps with the stages ``fit_stages`` gives it, within the limit once compiled."""
    got = run_offline(COLUMN_SCRIPT.format(tests=os.path.dirname(__file__)))
    assert len(got) >= 8, got
    over = {k: v for k, v in got.items() if v > SMEM_LIMIT}
    assert not over, over
    assert any("_w8_s4_" in k and "_e2" in k for k in got), got  # halves lost a stage


def test_configs_over_shared_memory_are_refused_with_the_most_that_fit():
    from dataclasses import replace

    args = _args("def epi(accum): D = accum; R = max(accum); return D, R",
                 R=torch.empty(N))
    fam = GluonFamily()
    halves = next(c for c in fam.configs(args, H100) if c.epi_split == 2 and not c.cooperative)
    assert halves.num_stages == 5 and fam.fit_stages(args, halves) == 5
    wide = replace(halves, num_warps=8)
    assert fam.fit_stages(args, wide) == 4
    with pytest.raises(ValueError, match="5 A/B stages do not fit shared memory.*at most 4 do"):
        fam.spec(args, wide, H100)
    fam.spec(args, replace(wide, num_stages=4), H100)


@pytest.fixture(scope="module")
def compiled():
    """Every case compiled for sm_90 in one subprocess: the CPU tier runs with Triton's
    interpreter on, under which Triton's library functions cannot be compiled."""
    return run_offline(SCRIPT.format(tests=os.path.dirname(__file__)))


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("kind", ["pingpong", "wide", "coop"])
@pytest.mark.slow
def test_offline_compile_for_sm90(compiled, name, kind):
    """The first ping-pong config of 4-warp consumers, the same at 8 warps (two
    warpgroups per consumer, whether or not the family offers it for the case) and the
    first cooperative config of each case (every case has row-major A and no per-column
    sum, so the family offers both)."""
    assert "error" not in compiled[name], compiled[name].get("error")
    assert kind in compiled[name], f"{name}: no {kind} config"
    out = compiled[name][kind]
    assert out["shared"] <= SMEM_LIMIT
    assert out["wgmma"] and out["setmaxnreg"]
    # a few spilled scalars are tolerated; a spilled tile (hundreds of accesses) is not
    assert out["spills"] < 100, f"{out['spills']} local-memory accesses: the epilogue spills"


# ------------------------------------------------------------------ batched problems (L > 1)
LB = 3
BATCHED_SRC = ("def epi(accum, C, alpha, r, bias): Y = accum + bias; "
               "D = alpha * accum + C * r; return D, Y")


def _batched_args():
    """A with batch slices, B and C shared (weights; an aux tile every batch reads), a
    per-batch device scalar, a per-batch bf16 row vector, a shared fp32 bias, an fp32
    second output."""
    A, B = torch.randn(LB, M, K).to(BF), torch.randn(K, N).to(BF)
    ops = dict(C=torch.randn(M, N).to(BF),
               alpha=torch.randn(LB, 1, 1), r=torch.randn(LB, M, 1).to(BF), bias=torch.randn(N),
               D=torch.empty(LB, M, N, dtype=BF), Y=torch.empty(LB, M, N))
    return GemmArguments(A, B, ops["D"], epilogue=EpilogueArguments(BATCHED_SRC, **ops))


def test_batched_problems_run_batch_by_batch_with_3d_tiles():
    """The family takes L > 1: tiles run batch by batch through the persistent schedule,
    a batched A's stages and every aux tile and output move by 3-D TMA blocks, at batch
    ``bid`` for tensors with slices of their own and at 0 for shared ones (B, C); the
    per-batch row vector is read from global memory at its batch, the shared bias staged."""
    from evtfuse.backends.triton.codegen import generate

    args = _batched_args()
    fam = GluonFamily()
    offline = Target("cuda", 90, torch.device("cpu"), 132, offline=True)  # CPU tensors allowed
    assert fam.supports(args, offline), fam.supports(args, offline).reason
    cfg = next(c for c in fam.configs(args, H100) if not c.cooperative)
    spec = fam.spec(args, cfg, H100)
    assert (spec.a_batched, spec.b_batched) == (True, False)
    src = generate(spec)
    assert "my_tiles = gl.cdiv(num_pid_m * num_pid_n * L - start, nprog)" in src
    assert "bid = tile // per_batch" in src
    assert "a_desc, [bid, off_m, kk * BLOCK_K]" in src
    assert "b_desc, [kk * BLOCK_K, off_n]" in src
    nm = spec.names
    assert f"{nm('C', 'desc')}, [0, row0, col0]" in src and f"{nm('D', 'desc')}, [bid, row0, col0]" in src
    assert "a_bufs.index(s).reshape([BLOCK_M, BLOCK_K])" in src
    assert nm("bias", "vb") in src and nm("r", "vb") not in src
    assert f"tl.load({nm('r', 'ptr')} + bid64 * {nm('r', 'sl')}" in src
    b = buffers(args.optimized_dag, batch=True)
    assert set(b.own_batch) == {"D", "Y"}
    # the plan's descriptors: 3-D, a leading 1 for the shared C
    items, _, grid, _ = fam.plan(args, args.optimized_dag, cfg, H100)
    descs = [it(args.A, args.B, args.epilogue.values) for it in items if callable(it)]
    shapes = [list(d.shape) for d in descs if hasattr(d, "block_shape")]
    assert [LB, M, K] in shapes and [1, M, N] in shapes and [LB, M, N] in shapes, shapes
    assert grid == (min(132, LB * -(-M // 128) * -(-N // 128)),)


def test_batched_source_leaves_unbatched_kernels_alone():
    """A one-batch problem's kernel has none of the batched kernel's indexing."""
    from evtfuse.backends.triton.codegen import generate

    args = _args(ALPHA_BETA, C=torch.randn(M, N).to(BF), alpha=1.0, beta=0.5)
    fam = GluonFamily()
    src = generate(fam.spec(args, fam.configs(args, H100)[0], H100))
    assert "bid" not in src.replace("bid64", "") and ".reshape([" not in src


BATCHED_SCRIPT = """
import json, sys
sys.path.insert(0, {tests!r})
import test_gluon_cpu as t
from evtfuse.runtime.offline import compile_for
fam, out = t.GluonFamily(), {{}}
args = t._batched_args()
seen = set()
for c in fam.configs(args, t.H100):
    key = (c.cooperative, c.num_warps, c.slots)
    if key in seen:
        continue
    seen.add(key)
    try:
        r = compile_for(fam, c, args)
        out[c.name] = {{"shared": r.shared_bytes, "spills": r.spills}}
    except Exception as exc:
        out[c.name] = {{"error": f"{{type(exc).__name__}}: {{str(exc)[-2000:]}}"}}
print("RESULT" + json.dumps(out))
"""


@pytest.mark.slow
def test_batched_kernels_compile_for_sm90():
    """The first config of each structure the family offers for the batched case,
    compiled for sm_90: valid Gluon (3-D blocks viewed in 2-D by the consumers and wgmma),
    within shared memory, no spilled tile."""
    got = run_offline(BATCHED_SCRIPT.format(tests=os.path.dirname(__file__)))
    assert any("_co" in k for k in got) and any("_co" not in k for k in got), got
    for name, r in got.items():
        assert "error" not in r, f"{name}: {r['error']}"
        assert r["shared"] <= SMEM_LIMIT and r["spills"] < 100, (name, r)


def _mlp_backward_args(M=8192, H=4096, I=14336):
    """The SwiGLU block's backward GEMM (``runtime.mlp``): dy @ W_down with the derived
    epilogue, reading gate and up (two full tiles), writing their gradients in place and
    the activation (CPU tensors: only shapes, dtypes and strides matter here)."""
    from evtfuse.runtime.mlp import _parts, down_grad

    bf = torch.bfloat16
    dy, w2 = torch.empty(M, H, dtype=bf), torch.empty(H, I, dtype=bf)
    p, a = torch.empty(M, 2 * I, dtype=bf), torch.empty(M, I, dtype=bf)
    epi, outs = down_grad("silu", True)
    grads = {dict(outs)[n]: t for n, t in _parts(p, True, I).items()}
    return GemmArguments(dy, w2, a, epilogue=EpilogueArguments(epi, D=a, **_parts(p, True, I),
                                                               **grads))


def test_aux_tiles_too_large_for_shared_memory_are_read_through_pointers():
    """Two bf16 aux tiles per consumer (128 KB) leave fewer than four A/B stages: the family
    reads them through pointers in the consumer (``Buffers.direct_loads``) instead of
    refusing, in quarters and eighths only (halves spill), and the kernel takes pointers
    and strides for them, no descriptors."""
    from evtfuse.backends.triton.codegen import generate
    from evtfuse.ir import OperandKind
    from evtfuse.runtime.offline import offered

    args = _mlp_backward_args()
    gluon = [c for f, c in offered(args) if f.name == "gluon"]
    assert {c.epi_split for c in gluon} == {4, 8} and not any(c.slots for c in gluon), gluon
    fam = GluonFamily()
    for c in gluon:
        spec = fam.spec(args, c, Target("cuda", 90, torch.device("cpu"), 132, offline=True))
        loads = {s.name for s in spec.dag.used_operands if s.kind is OperandKind.FULL}
        assert loads and loads <= set(spec.direct)
        bufs = buffers(spec.dag, spec.direct)
        assert set(bufs.direct_loads) == loads and not bufs.loads
        src = generate(spec)
        for name in loads:
            assert f"{spec.names(name, 'ptr')}" in src and f"{spec.names(name, 'desc')}" not in src


_DIRECT_SCRIPT = """
import json, sys
sys.path.insert(0, {tests!r})
from test_gluon_cpu import _mlp_backward_args
from evtfuse.runtime.offline import compile_for, offered
args = _mlp_backward_args()
out = {{}}
for f, c in offered(args):
    if f.name == "gluon":
        r = compile_for(f, c, args)
        out[c.name] = {{"shared": r.shared_bytes, "spills": r.spills}}
print("RESULT" + json.dumps(out))
"""


@pytest.mark.slow
def test_pointer_read_aux_tiles_compile_for_sm90():
    """The MLP block's backward in the gluon family compiles offline to sm_90 within shared
    memory: eighths without spills, quarters with a few (21 local accesses; the tuner
    times both)."""
    got = run_offline(_DIRECT_SCRIPT.format(tests=os.path.dirname(__file__)), timeout=900)
    assert got
    for name, r in got.items():
        assert 0 < r["shared"] <= 232448, (name, r)
        if name.endswith("_e8"):
            assert r["spills"] == 0, (name, r)
