"""GPU tier: the Gluon ping-pong family (Hopper only) against the reference evaluator.

Every case runs on NaN-poisoned outputs (``Kernel.verify``) with fresh random data. The
shapes exercise what the family's synchronisation depends on: one tile (the second
consumer has no work), fewer tiles than SMs, several tiles per program (odd and even
counts per consumer), K shorter than one k-step, ragged M/N/K (TMA zero fill and clipped
stores), and both operand layouts.
"""

from __future__ import annotations

import pytest
import torch

import evtfuse
from evtfuse import EpilogueArguments, GemmArguments, get_kernels
from gpu_helpers import ALL_OPS, check, family_kernels

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
              pytest.mark.skipif(torch.cuda.is_available()
                                 and torch.cuda.get_device_capability() != (9, 0),
                                 reason="the gluon family runs on Hopper (sm_90)")]

DEV = "cuda"
BF = torch.bfloat16


def _rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, device=DEV, dtype=torch.float32).to(dtype)


ALPHA_BETA = "def epi(accum, C, alpha, beta): D = alpha * accum + beta * C; return D"


@pytest.mark.parametrize("dtype", [BF, torch.float16])
@pytest.mark.parametrize("mnk", [(100, 64, 16), (300, 520, 72), (1000, 776, 264),
                                 (2048, 2048, 512), (4096, 4096, 4096), (8192, 1024, 1024)])
def test_alpha_beta(dtype, mnk):
    M, N, K = mnk  # rows of 16-byte multiples (TMA); smaller ones: test_tiny_problems_padded_storage
    A, B, C = _rand(M, K, dtype=dtype), _rand(K, N, dtype=dtype), _rand(M, N, dtype=dtype)
    D = torch.empty(M, N, device=DEV, dtype=dtype)
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(ALPHA_BETA, C=C, alpha=1.5, beta=-0.5, D=D))
    check(args, "gluon", n_configs=2 if M == 1000 else 1)


def test_tiny_problems_padded_storage():
    # 1x1x1, 7x7x7 and 1x9x3 in storage with 16-byte aligned rows (views of wider tensors)
    for M, N, K in [(1, 1, 1), (7, 7, 7), (1, 9, 3), (129, 33, 7)]:
        pad = lambda r, c: torch.randn(r, 64, device=DEV).to(BF)[:, :c]  # noqa: E731
        A, B, C = pad(M, K), pad(K, N), pad(M, N)
        D = torch.empty(M, 64, device=DEV, dtype=BF)[:, :N]
        args = GemmArguments(A, B, D, epilogue=EpilogueArguments(ALPHA_BETA, C=C, alpha=2.0, beta=1.0, D=D))
        check(args, "gluon", n_configs=1)


@pytest.mark.parametrize("layout", ["A_col", "B_col", "both_col"])
def test_operand_layouts(layout):
    M, N, K = 1000, 776, 264
    A = _rand(K, M, dtype=BF).T if layout in ("A_col", "both_col") else _rand(M, K, dtype=BF)
    B = _rand(N, K, dtype=BF).T if layout in ("B_col", "both_col") else _rand(K, N, dtype=BF)
    C = _rand(M, N, dtype=BF)
    D = torch.empty(M, N, device=DEV, dtype=BF)
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(ALPHA_BETA, C=C, alpha=1.0, beta=1.0, D=D))
    check(args, "gluon", n_configs=1)


def _verify_on_programs(kernels, args, monkeypatch, programs=5):
    """Verify ``kernels`` launched on ``programs`` persistent programs (a GPU of that
    many SMs), their plans made afresh for it and dropped after."""
    from evtfuse.backends.triton import gluon_family, hopper_family

    for module in (gluon_family, hopper_family):  # each family's plan reads its own _sms
        monkeypatch.setattr(module, "_sms", lambda target: programs)
    for k in kernels:
        k.forget_plans()
        try:
            assert k.plan(args).grid == (programs,)
            result = k.verify(args)
            assert result, f"{k.name}: {result.report()}"
        finally:  # later tests must not reuse the few-program plan
            k.forget_plans()


def test_few_programs_many_tiles(monkeypatch):
    # 5 programs for 48 tiles: 9-10 tiles each, odd and even counts per consumer
    M, N, K = 1000, 776, 200
    A, B, C = _rand(M, K, dtype=BF), _rand(K, N, dtype=BF), _rand(M, N, dtype=BF)
    D = torch.empty(M, N, device=DEV, dtype=BF)
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(ALPHA_BETA, C=C, alpha=1.0, beta=2.0, D=D))
    _verify_on_programs(family_kernels(args, "gluon")[:1], args, monkeypatch)


EPILOGUES = {
    "identity": ("def epi(accum): D = accum; return D", {}),
    "bias_gelu": ("def epi(accum, bias): D = gelu_tanh(accum + bias); return D", {"bias": "col"}),
    "silu_mul": ("def epi(accum, X): D = silu(accum) * X; return D", {"X": "full"}),
    "aux_device_scalar": ("def epi(accum, C, s): D = accum * s + C; return D", {"C": "full", "s": "dev"}),
    "row_vec_index": ("def epi(accum, r): D = accum + r * row_index() - col_index(); return D", {"r": "row"}),
    "all_ops": (ALL_OPS, {"C": "full", "bias": "col", "rowv": "row", "s": "scalar"}),
    # bf16 vectors, TMA-staged like the fp32 ones; an int64 one read from global memory
    "bf16_vectors": ("def epi(accum, r, bias): D = accum * r + bias; return D",
                     {"r": "rowbf", "bias": "colbf"}),
    "lse_target": ("def epi(accum, y): lse = logsumexp(accum); "
                   "tgt = sum(where(col_index() == y, accum, 0.0)); D = accum; return D, lse, tgt",
                   {"y": "target", "lse": "rowout", "tgt": "rowout", "D": None}),
    "relu_aux_two_outputs": ("def epi(accum, C, alpha): F = alpha * accum + C * 2.0; D = relu(F); return D, F",
                             {"C": "full", "alpha": "scalar", "F": "outbf"}),
    "fp32_out": ("def epi(accum, bias): D = relu(accum + bias); return D", {"bias": "col", "D": "out32"}),
    "fp16_out_two": ("def epi(accum, bias): D = accum + bias; E = sigmoid(D); return D, E",
                     {"bias": "col", "D": "out16", "E": "out16"}),
    "row_amax": ("def epi(accum): D = accum; amax = max(abs(accum)); return D, amax", {"amax": "rowout"}),
    "col_sum": ("def epi(accum): D = accum; cs = sum(accum * 0.5); return D, cs", {"cs": "colout"}),
    "lse": ("def epi(accum): D = accum; lse = logsumexp(accum * 0.1); return D, lse", {"lse": "rowout"}),
    # per-row, per-column and scalar values stored as vectors (no reduction): by the
    # consumer holding the first piece of a tile row / the tiles of row 0
    "stored_vectors": ("def epi(accum, r, bias, s): D = accum * r + bias; "
                       "inv = 1.0 / (r * r + 1.0); b2 = bias * 2.0; s3 = s * 3.0; "
                       "return D, inv, b2, s3",
                       {"r": "row", "bias": "col", "s": "dev", "inv": "rowout", "b2": "colout",
                        "s3": "scalarout"}),
    "bce": ("""
def bce(accum, bias, C):
    f = accum + bias
    t = (1 - C) * (-f) + log(clamp(sigmoid(f), 1e-3, 0.999))
    loss = sum(t)
    D = f
    return D, loss
""", {"bias": "col", "C": "label", "D": None, "loss": "scalarout"}),
}


def _operands(kinds, M, N):
    ops = {}
    for name, kind in kinds.items():
        ops[name] = {
            "full": lambda: _rand(M, N, dtype=BF),
            "label": lambda: (torch.rand(M, N, device=DEV) > 0.5).to(BF),
            "col": lambda: _rand(N),
            "row": lambda: _rand(M, 1),
            "colbf": lambda: _rand(N, dtype=BF),
            "rowbf": lambda: _rand(M, 1, dtype=BF),
            "target": lambda: torch.randint(0, N, (M, 1), device=DEV),
            "dev": lambda: _rand(1).reshape(()),
            "scalar": lambda: 0.75,
            "out32": lambda: torch.empty(M, N, device=DEV),
            "out16": lambda: torch.empty(M, N, device=DEV, dtype=torch.float16),
            "outbf": lambda: torch.empty(M, N, device=DEV, dtype=BF),
            "rowout": lambda: torch.empty(M, 1, device=DEV),
            "colout": lambda: torch.empty(N, device=DEV),
            "scalarout": lambda: torch.empty(1, device=DEV),
            None: lambda: None,
        }[kind]()
    return ops


def _epilogue_args(name, M, N, K):
    """The arguments of EPILOGUES[name] on fresh random data (a bf16 D unless it names one)."""
    src, kinds = EPILOGUES[name]
    ops = _operands(kinds, M, N)
    if "D" not in kinds:
        ops["D"] = torch.empty(M, N, device=DEV, dtype=BF)
    A, B = _rand(M, K, dtype=BF), _rand(K, N, dtype=BF) * 0.25
    return GemmArguments(A, B, ops["D"], epilogue=EpilogueArguments(src, **ops))


@pytest.mark.parametrize("name", list(EPILOGUES))
@pytest.mark.parametrize("mnk", [(1000, 776, 264), (2048, 1536, 1024)])
def test_epilogues(name, mnk):  # the same kernel at both sizes: compiled once
    check(_epilogue_args(name, *mnk), "gluon", n_configs=1)


@pytest.mark.parametrize("name", ["bce", "all_ops", "row_amax", "silu_mul", "lse_target"])
def test_other_piece_count(name):
    """The family offers its epilogue in 2 and in 4 column pieces (the tuner keeps the
    faster): the ping-pong configs after the first two use the other count."""
    args = _epilogue_args(name, 1000, 776, 264)
    ks = [k for k in family_kernels(args, "gluon") if not k.config.cooperative]
    others = [k for k in ks if k.config.epi_split != ks[0].config.epi_split]
    assert others, [k.name for k in ks]
    result = others[0].verify(args)
    assert result, result.report()


@pytest.mark.parametrize("name", list(EPILOGUES))
@pytest.mark.parametrize("mnk", [(1000, 776, 264), (2048, 1536, 1024)])
def test_epilogues_two_warpgroup_consumers(name, mnk):
    """The first ping-pong config at 8 warps per consumer (two warpgroups, 64 rows each;
    the family offers them for many-op epilogues that store no tile, ``GluonFamily._wide``),
    for every epilogue: one tile per program (the second consumer idle) and several, ragged."""
    args = _epilogue_args(name, *mnk)
    base = next(k for k in family_kernels(args, "gluon") if not k.config.cooperative)
    k = base.with_config(num_warps=8)
    result = k.verify(args)
    assert result, f"{k.name}: {result.report()}"


# cooperative tiles (128x256, each consumer 64 rows): one tile per program, ragged, and
# two to three tiles per program with K not a multiple of BLOCK_K (the aux buffers' reuse,
# the ring shared by both consumers)
@pytest.mark.parametrize("name", [n for n in EPILOGUES if n != "col_sum"])
@pytest.mark.parametrize("mnk", [(1000, 776, 264), (4000, 2600, 136)])
def test_cooperative_tiles(name, mnk):
    args = _epilogue_args(name, *mnk)
    ks = [k for k in family_kernels(args, "gluon") if k.config.cooperative]
    assert ks and ks[0].config.epi_split == 4, [k.name for k in ks]
    for k in ks:
        result = k.verify(args)
        assert result, f"{k.name}: {result.report()}"


def test_cooperative_tiles_refused_for_per_column_sums():
    """Both consumers of a cooperative tile hold half its rows: a per-column sum's one
    partial per tile and column does not fit, so the family offers ping-pong tiles only."""
    args = _epilogue_args("col_sum", 1000, 776, 264)
    ks = family_kernels(args, "gluon")
    assert ks and not any(k.config.cooperative for k in ks)
    assert "per-column sum" in ks[0].family._coop_refusal(args)


@pytest.mark.parametrize("mnk", [(1000, 776, 264), (2048, 2048, 512)])
def test_staged_quarters_of_register_stored_outputs(mnk):
    """Where an output goes from registers for a fifth A/B stage, the family also offers one
    ping-pong config that stages every output at four stages (TMA stores, the runtime piece
    loop): it verifies too, ragged and with one tile per consumer. (Its place in the list
    depends on the fill order, ``api.order_by_fill``: at 1000x776 the cooperative tiles,
    which fill fewer SMs, come after it.)"""
    M, N, K = mnk  # an fp16 F: no bf16 buffer to share with D (slots), so from registers
    F = torch.empty(M, N, device=DEV, dtype=torch.float16)
    D = torch.empty(M, N, device=DEV, dtype=BF)
    args = GemmArguments(_rand(M, K, dtype=BF), _rand(K, N, dtype=BF) * 0.25, D,
                         epilogue=EpilogueArguments(EPILOGUES["relu_aux_two_outputs"][0],
                                                    C=_rand(M, N, dtype=BF), alpha=0.75, F=F, D=D))
    ks = family_kernels(args, "gluon")
    fam = ks[0].family
    assert fam.spec(args, ks[0].config, ks[0].target).direct == ("F",)
    staged = [k for k in ks if not k.config.cooperative
              and not fam.spec(args, k.config, k.target).direct]
    assert [(k.config.epi_split, k.config.num_stages) for k in staged] == [(4, 4)], \
        [k.name for k in ks]
    result = staged[0].verify(args)
    assert result, result.report()


@pytest.mark.parametrize("mnk", [(1000, 776, 264), (2048, 2048, 512), (4000, 2600, 136)])
def test_slot_stores(mnk):
    """Where an output would go from registers for a fifth A/B stage, the family also
    offers it staged in the C buffer's 128-byte chunks after D's (``_sl``: the consumer
    TMA-stores D and F by chunk, the pieces of F wait in registers for D's chunk to have
    left): it verifies ragged, with one tile per consumer and with several."""
    args = _epilogue_args("relu_aux_two_outputs", *mnk)
    ks = [k for k in family_kernels(args, "gluon") if k.config.slots]
    assert ks, [k.name for k in family_kernels(args, "gluon")]
    spec = ks[0].family.spec(args, ks[0].config, ks[0].target)
    assert (spec.chunk, spec.direct, ks[0].config.num_stages) == (64, (), 5)
    result = ks[0].verify(args)
    assert result, result.report()


@pytest.mark.parametrize("mnk", [(512, 512, 128), (1000, 776, 264)])
def test_three_aux_tiles_read_through_pointers(mnk):
    """Three aux tiles per consumer would leave too few A/B stages in shared memory: the
    family reads them through pointers (quarters and eighths, ``Buffers.direct_loads``);
    every such candidate verifies, ragged too."""
    M, N, K = mnk
    A, B = _rand(M, K, dtype=BF), _rand(K, N, dtype=BF)
    C, X, Y = (_rand(M, N, dtype=BF) for _ in range(3))
    D = torch.empty(M, N, device=DEV, dtype=BF)
    src = "def epi(accum, C, X, Y): D = accum + C + X * Y; return D"
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(src, C=C, X=X, Y=Y, D=D))
    ks = [k for k in get_kernels(args) if k.family.name == "gluon"]
    assert {k.config.epi_split for k in ks if not k.config.cooperative} == {4, 8}, \
        [k.name for k in ks]
    for k in ks:
        result = k.verify(args)
        assert result, (k.name, result.report())


def test_strided_vector_refused_with_reason():
    M, N, K = 512, 384, 128
    A, B = _rand(M, K, dtype=BF), _rand(K, N, dtype=BF)
    bias = _rand(N, 2, dtype=BF)[:, 0]  # stride 2: no TMA
    D = torch.empty(M, N, device=DEV, dtype=BF)
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(
        "def epi(accum, bias): D = accum + bias; return D", bias=bias, D=D))
    assert "gluon: refused: bias is not contiguous (stride 2)" in evtfuse.explain(args)
    assert get_kernels(args)[0].verify(args)  # the hopper family takes it


def test_scalar_rerun_and_cuda_graph():
    M, N, K = 1024, 1024, 512
    A, B, C = _rand(M, K, dtype=BF), _rand(K, N, dtype=BF), _rand(M, N, dtype=BF)
    D = torch.empty(M, N, device=DEV, dtype=BF)
    epi = EpilogueArguments(ALPHA_BETA, C=C, alpha=1.0, beta=0.0, D=D)
    args = GemmArguments(A, B, D, epilogue=epi)
    k = family_kernels(args, "gluon")[0]
    assert k.verify(args)
    args2 = GemmArguments(A, B, D, epilogue=epi.with_values(alpha=-2.0, beta=3.0))
    assert k.verify(args2)
    k.run(args2)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        k.run(args2)
    A.copy_(_rand(M, K, dtype=BF))
    D.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    ref = evtfuse.reference.evaluate(args2, cast=False)["D"]
    torch.testing.assert_close(D.float(), ref, rtol=2e-2, atol=2e-2 * ref.abs().mean().item())


def test_gemm_tuner_sees_gluon_candidates():
    M, N, K = 2048, 2048, 1024
    A, B, C = _rand(M, K, dtype=BF), _rand(K, N, dtype=BF), _rand(M, N, dtype=BF)
    D = torch.empty(M, N, device=DEV, dtype=BF)
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(ALPHA_BETA, C=C, alpha=1.0, beta=1.0, D=D))
    from evtfuse.runtime.tuner import FAST_CANDIDATES

    names = [k.family.name for k in get_kernels(args)[:FAST_CANDIDATES]]
    assert "gluon" in names and "hopper" in names
    D = evtfuse.gemm(A, B, ALPHA_BETA, C=C, alpha=1.0, beta=1.0)
    ref = A.float() @ B.float() + C.float()
    torch.testing.assert_close(D.float(), ref, rtol=2e-2, atol=2e-2 * ref.abs().mean().item())


# ------------------------------------------------------------------ batched problems (L > 1)
# Tiles run batch by batch through one persistent schedule; batched A/B stages, aux tiles
# and outputs move by 3-D TMA descriptors (a leading 1 for tensors every batch shares).
# Ragged M and N: a batch's last row/column tiles must neither read the next batch's rows
# nor write them (the descriptors' batch dimension clips them, as M and N do).

def _structures(args):
    """The first kernel of each structure the family offers: ping-pong (4 warps),
    cooperative, two-warpgroup consumers; the slot-store config too where there is one."""
    ks = family_kernels(args, "gluon")
    picks = {}
    for k in ks:
        c = k.config
        key = "coop" if c.cooperative else ("wide" if c.num_warps == 8 else "pingpong")
        picks.setdefault(key, k)
        if c.slots:
            picks.setdefault(key + "_slots", k)
    return picks


def _verify_all(args, need=("pingpong",)):
    picks = _structures(args)
    assert set(need) <= set(picks), [k.name for k in family_kernels(args, "gluon")]
    for k in picks.values():
        result = k.verify(args)
        assert result, f"{k.name}: {result.report()}"


@pytest.mark.parametrize("layout", ["row", "A_col", "B_col", "both_col"])
def test_batched_alpha_beta(layout):
    L, M, N, K = 3, 1000, 776, 264
    A = _rand(L, K, M, dtype=BF).transpose(1, 2) if layout in ("A_col", "both_col") \
        else _rand(L, M, K, dtype=BF)
    B = _rand(L, N, K, dtype=BF).transpose(1, 2) if layout in ("B_col", "both_col") \
        else _rand(L, K, N, dtype=BF)
    C = _rand(L, M, N, dtype=BF)
    D = torch.empty(L, M, N, device=DEV, dtype=BF)
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(ALPHA_BETA, C=C, alpha=1.5,
                                                             beta=-0.5, D=D))
    # a column-major A has no cooperative tiles (its stage is sliced by rows)
    _verify_all(args, ("pingpong",) if layout in ("A_col", "both_col") else ("pingpong", "coop"))


def test_batched_shared_operands_per_batch_scalars():
    """B and C shared by every batch (2-D, at batch 0 of their 3-D descriptors), a
    per-batch device scalar and a per-batch bf16 row vector (read from global memory, not
    staged), a shared fp32 bias (staged), an fp32 second output."""
    L, M, N, K = 4, 520, 392, 200
    A = _rand(L, M, K, dtype=BF)
    B = _rand(K, N, dtype=BF)
    C = _rand(M, N, dtype=BF)
    alpha = _rand(L, 1, 1)
    rowb = _rand(L, M, 1, dtype=BF)
    bias = _rand(N)
    D = torch.empty(L, M, N, device=DEV, dtype=BF)
    Y = torch.empty(L, M, N, device=DEV, dtype=torch.float32)
    src = ("def epi(accum, C, alpha, rowb, bias): Y = accum + bias; "
           "D = alpha * accum + C + rowb; return D, Y")
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(src, C=C, alpha=alpha, rowb=rowb,
                                                             bias=bias, D=D, Y=Y))
    _verify_all(args)


def test_batched_reductions():
    """Per-batch per-row logsumexp, per-batch per-column sum, a per-batch sum and a sum over
    every batch, with D stored."""
    L, M, N, K = 3, 1000, 776, 264
    A, B = _rand(L, M, K, dtype=BF), _rand(L, K, N, dtype=BF) * 0.25
    D = torch.empty(L, M, N, device=DEV, dtype=BF)
    src = ("def epi(accum): D = accum; lse = logsumexp(accum); cs = sum(accum * 0.5); "
           "bs = sum(accum); tot = max(abs(accum)); return D, lse, cs, bs, tot")
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(
        src, D=D, lse=torch.empty(L, M, 1, device=DEV), cs=torch.empty(L, 1, N, device=DEV),
        bs=torch.empty(L, 1, 1, device=DEV), tot=torch.empty(1, device=DEV)))
    _verify_all(args)


@pytest.mark.parametrize("mnk", [(1000, 776, 264), (2048, 2048, 512)])
def test_batched_relu_aux_slot_stores(mnk):
    L = 2
    M, N, K = mnk
    A, B = _rand(L, M, K, dtype=BF), _rand(L, K, N, dtype=BF) * 0.25
    C = _rand(L, M, N, dtype=BF)
    D = torch.empty(L, M, N, device=DEV, dtype=BF)
    F = torch.empty(L, M, N, device=DEV, dtype=BF)
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(
        EPILOGUES["relu_aux_two_outputs"][0], C=C, alpha=0.75, F=F, D=D))
    _verify_all(args, ("pingpong", "pingpong_slots"))


def test_batched_few_programs_many_tiles(monkeypatch):
    """5 programs for 3 batches of 48 tiles: a program's tiles cross batches, odd and even
    counts per consumer."""
    L, M, N, K = 3, 1000, 776, 200
    A, B, C = _rand(L, M, K, dtype=BF), _rand(L, K, N, dtype=BF), _rand(L, M, N, dtype=BF)
    D = torch.empty(L, M, N, device=DEV, dtype=BF)
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(ALPHA_BETA, C=C, alpha=1.0,
                                                             beta=2.0, D=D))
    _verify_on_programs(_structures(args).values(), args, monkeypatch)


def test_batched_stored_vectors():
    """Per-batch per-row and scalar values and a shared per-column one stored as vectors
    (the shared one by batch 0's tiles), per-batch row and column operands."""
    L, M, N, K = 3, 1000, 776, 264
    A, B = _rand(L, M, K, dtype=BF), _rand(L, K, N, dtype=BF)
    r, c, s = _rand(L, M, 1), _rand(L, 1, N, dtype=BF), _rand(L, 1, 1)
    bias = _rand(N)
    D = torch.empty(L, M, N, device=DEV, dtype=BF)
    src = ("def epi(accum, r, c, s, bias): D = accum * r + c * s + bias; rr = r * s; b2 = bias * 2.0; "
           "s2 = s * s; return D, rr, b2, s2")
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(
        src, r=r, c=c, s=s, bias=bias, D=D, rr=torch.empty(L, M, 1, device=DEV),
        b2=torch.empty(N, device=DEV), s2=torch.empty(L, 1, 1, device=DEV)))
    _verify_all(args, ("pingpong", "coop"))
