"""Reductions in the epilogue through the CPU interpreter: per-row, per-column and
whole-output sum/max/min/logsumexp/shifted_sumexp, batched and over batches, odd sizes, both families.

Outputs are poisoned with NaN first (``Kernel.verify``); results are compared with the
reference evaluator. Sums of fp32 values in another order differ from the reference by a
few ulps times the number of terms, far inside the fp32 tolerance (1e-4 relative).
"""

from __future__ import annotations

import pytest
import torch

import evtfuse
from evtfuse import EpilogueArguments, GemmArguments, explain, get_kernels
from evtfuse.reference import evaluate

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-interpreter tier")

GEN = torch.Generator().manual_seed(99)


def rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=GEN).to(dtype)


def check(args, family):
    cc = 90 if family == "hopper" else None
    ks = [k for k in get_kernels(args, cc=cc) if k.family.name == family]
    assert ks, explain(args, cc=cc)
    result = ks[0].verify(args)
    assert result, result.report()
    return ks[0]


SHAPES = {"row": lambda L, M, N: (M, 1), "row_b": lambda L, M, N: (L, M, 1),
          "col": lambda L, M, N: (N,), "col_b": lambda L, M, N: (L, 1, N),
          "all": lambda L, M, N: (1,), "all_b": lambda L, M, N: (L, 1, 1)}


@pytest.mark.parametrize("family", ["portable", "hopper"])
@pytest.mark.parametrize("op", ["sum", "max", "min", "logsumexp", "shifted_sumexp"])
@pytest.mark.parametrize("where", list(SHAPES))
@pytest.mark.cover
def test_reduction_kinds(family, op, where):
    L, M, N, K = 2, 37, 48, 16
    A, B = rand(L, M, K, dtype=torch.float16), rand(L, K, N, dtype=torch.float16)
    bias = rand(N)
    D = torch.empty(L, M, N, dtype=torch.float16)
    r = torch.empty(SHAPES[where](L, M, N))
    src = f"def epi(accum, bias): D = accum + bias; r = {op}(D * 0.5); return D, r"
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(src, bias=bias, D=D, r=r))
    check(args, family)


@pytest.mark.parametrize("mnk", [(1, 1, 1), (7, 5, 3), (33, 65, 9)])
def test_reductions_at_odd_sizes(mnk):
    M, N, K = mnk
    A, B = rand(M, K), rand(K, N)
    rs, cm, tot = torch.empty(M, 1), torch.empty(N), torch.empty(1, dtype=torch.float16)
    src = ("def epi(accum): t = accum * accum; rs = sum(t); cm = max(accum); tot = logsumexp(accum); "
           "D = accum; return D, rs, cm, tot")
    args = GemmArguments(A, B, None, epilogue=EpilogueArguments(src, D=None, rs=rs, cm=cm, tot=tot))
    check(args, "portable")


@pytest.mark.parametrize("family", ["portable", "hopper"])
def test_bce_loss_of_the_evt_article(family):
    M, N, K = 48, 64, 32
    A, B = rand(M, K, dtype=torch.float16), rand(K, N, dtype=torch.float16)
    bias = rand(M, 1)  # per-row bias, as the article's column broadcast
    C = (torch.rand(M, N, generator=GEN) > 0.5).to(torch.float16)
    loss = torch.empty(1)
    src = """
def bce(accum, bias, C):
    f = accum + bias
    t = (1 - C) * (-f) + log(clamp(sigmoid(f), 1e-3, 0.999))
    loss = sum(t)
    D = f
    return D, loss
"""
    args = GemmArguments(A, B, None, epilogue=EpilogueArguments(src, bias=bias, C=C, D=None,
                                                                loss=loss))
    check(args, family)
    f = (A.float() @ B.float()) + bias
    ref = ((1 - C.float()) * (-f) + torch.log(torch.clamp(torch.sigmoid(f), 1e-3, 0.999))).double().sum()
    assert abs(loss.item() - ref.item()) <= 1e-5 * abs(ref.item()) + 1e-3


@pytest.mark.parametrize("family", ["portable", "hopper"])
def test_lm_head_cross_entropy_never_stores_logits(family):
    M, N, K = 24, 80, 16  # tokens, vocabulary, hidden
    x, W = rand(M, K, dtype=torch.float16), rand(K, N, dtype=torch.float16)
    y = torch.randint(0, N, (M, 1), generator=GEN)  # int64 targets
    lse, tgt = torch.empty(M, 1), torch.empty(M, 1)
    src = """
def ce(accum, y):
    lse = logsumexp(accum)
    tgt = sum(where(col_index() == y, accum, 0.0))
    D = accum
    return D, lse, tgt
"""
    args = GemmArguments(x, W, None, epilogue=EpilogueArguments(src, y=y, D=None, lse=lse, tgt=tgt))
    check(args, family)
    logits = x.float() @ W.float()
    want = torch.nn.functional.cross_entropy(logits, y[:, 0], reduction="none")
    torch.testing.assert_close((lse - tgt)[:, 0], want, rtol=1e-4, atol=1e-4)


def test_reductions_are_deterministic_bit_for_bit():
    M, N, K = 64, 96, 32
    A, B = rand(M, K), rand(K, N)
    src = "def epi(accum): s = sum(accum * 3.0); c = sum(exp(accum * 0.1)); D = accum; return D, s, c"
    first = evtfuse.gemm(A, B, src, D=None, s=torch.empty(1), c=torch.empty(N), deterministic=True)
    second = evtfuse.gemm(A, B, src, D=None, s=torch.empty(1), c=torch.empty(N), deterministic=True)
    assert first[0] is None
    assert torch.equal(first[1], second[1]) and torch.equal(first[2], second[2])


def test_reduction_overwrites_whatever_the_output_held():
    M, N, K = 16, 16, 8
    A, B = rand(M, K), rand(K, N)
    r = torch.full((M, 1), float("nan"))
    src = "def epi(accum): r = max(accum); D = accum; return D, r"
    evtfuse.gemm(A, B, src, D=None, r=r)
    torch.testing.assert_close(r, (A @ B).amax(dim=1, keepdim=True), rtol=1e-5, atol=1e-5)
    r.fill_(1e30)
    evtfuse.gemm(A, B, src, D=None, r=r)  # an accumulator would keep 1e30
    torch.testing.assert_close(r, (A @ B).amax(dim=1, keepdim=True), rtol=1e-5, atol=1e-5)


def test_sum_against_float64():
    M, N, K = 40, 56, 24
    A, B = rand(M, K), rand(K, N)
    s = torch.empty(M, 1)
    src = "def epi(accum): s = sum(accum); D = accum; return D, s"
    args = GemmArguments(A, B, None, epilogue=EpilogueArguments(src, D=None, s=s))
    get_kernels(args)[0].run(args)
    ref = evaluate(args, accum=A.double() @ B.double(), compute_dtype=torch.float64)["s"]
    scale = (A.double() @ B.double()).abs().sum(dim=1, keepdim=True)
    assert ((s.double() - ref).abs() <= 1e-6 * scale + 1e-6).all()


@pytest.mark.parametrize("out", ["fp16", "strided"])
def test_post_kernel_combine_into_any_output(out):
    """The hopper family's per-row sum, combined after the kernel, writes outputs of any
    float dtype and layout (through a copy)."""
    M, N, K = 40, 72, 16
    r = torch.empty(M, 1, dtype=torch.float16) if out == "fp16" else torch.empty(M, 2)[:, :1]
    src = "def epi(accum): D = accum; r = sum(accum); return D, r"
    args = GemmArguments(rand(M, K), rand(K, N), None,
                         epilogue=EpilogueArguments(src, D=None, r=r))
    k = check(args, "hopper")
    assert len(k.plan(args).post) == 1


@pytest.mark.parametrize("family", ["portable", "hopper"])
@pytest.mark.parametrize("op,where", [("sum", "row"), ("max", "col"), ("min", "row_b")])
@pytest.mark.cover
def test_combine_of_many_tiles(family, op, where):
    """More partials per group than the combine loads per step (8), and not a multiple of
    it: 11 tiles of 32 along the reduced axis."""
    L, K = 2, 8
    M, N = (340, 20) if where == "col" else (20, 340)
    r = torch.empty(SHAPES[where](L, M, N))
    src = f"def epi(accum): D = accum; r = {op}(accum); return D, r"
    A, B = rand(L, M, K), rand(L, K, N)
    args = GemmArguments(A, B, None, epilogue=EpilogueArguments(src, D=None, r=r))
    check(args, family)


@pytest.mark.parametrize("family", ["portable", "hopper"])
@pytest.mark.parametrize("where", ["row_b", "col", "all"])
@pytest.mark.cover("family")  # interpreted atomics are slow: the quick tier runs 2
def test_in_kernel_combine_runs_again_and_again(family, where):
    """In-kernel max: whole-output partials combined by the tile that completes them
    (ticket counter reset by that tile), per-row/per-column ones folded by atomics into a
    workspace that the last program copies out and resets: three launches of one kernel
    on new data each give the reference's result, and the plan has no step after the
    kernel."""
    L, M, N, K = 2, 37, 48, 16
    bias = rand(N)
    D = torch.empty(L, M, N, dtype=torch.float16)
    r = torch.empty(SHAPES[where](L, M, N))
    src = "def epi(accum, bias): D = accum + bias; r = max(abs(D)); return D, r"
    A, B = rand(L, M, K, dtype=torch.float16), rand(L, K, N, dtype=torch.float16)
    epi = EpilogueArguments(src, bias=bias, D=D, r=r)
    args = GemmArguments(A, B, D, epilogue=epi)
    k = check(args, family)
    assert k.plan(args).post == ()
    for _ in range(3):
        A.copy_(rand(L, M, K, dtype=torch.float16))
        r.fill_(float("nan"))
        k.run(args)
        torch.testing.assert_close(r, evaluate(args, cast=False)["r"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["portable", "hopper"])
@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("where", ["row", "col_b"])
@pytest.mark.cover
def test_atomic_fold_of_specials(family, op, where):
    """Per-row/per-column max and min fold through integer atomics on float bits: rows and
    columns holding NaN (either sign), +-inf, only negative values, signed zeros and
    values of mixed sign all give torch's result (NaN wins, as in torch.amax), into fp16
    outputs too; the workspace rests at the identity between launches."""
    L, M, N, K = 2, 36, 40, 8
    C = rand(L, M, N)
    C[:, 3] = -C[:, 3].abs() - 1.0  # a row of negatives only
    C[:, :, 5] = -C[:, :, 5].abs() - 1.0  # a column of negatives only
    C[0, 7, 9] = float("nan")
    C[1, 8, 11] = -float("nan")
    C[0, 10, 13] = float("inf")
    C[1, 12, 17] = -float("inf")
    C[:, 14] = -0.0
    C[:, 15] = 0.0
    C[0, 15, 2] = -0.0
    r = torch.empty(SHAPES[where](L, M, N), dtype=torch.float16)
    src = f"def epi(accum, C): D = accum; r = {op}(C); return D, r"
    A, B = rand(L, M, K), rand(L, K, N)
    args = GemmArguments(A, B, None, epilogue=EpilogueArguments(src, C=C, D=None, r=r))
    k = check(args, family)
    assert k.plan(args).post == ()
    want = (C.amax if op == "max" else C.amin)(dim=2 if where == "row" else 1, keepdim=True)
    if where == "row":
        want = want.amax(0) if op == "max" else want.amin(0)  # no L: over the batches too
    torch.testing.assert_close(r.float(), want.reshape(r.shape).half().float(), equal_nan=True,
                               rtol=0, atol=0)
    C.neg_()  # another launch: the maxima become minima
    k.run(args)
    torch.testing.assert_close(r.float(), evaluate(args, cast=False)["r"].reshape(r.shape).half().float(),
                               equal_nan=True, rtol=0, atol=0)


@pytest.mark.parametrize("family", ["portable", "hopper"])
def test_atomic_fold_into_strided_outputs(family):
    """The last program's copy writes folds through the output's strides: a per-row max
    into every other element of an fp16 buffer, a per-column min into a (1, N) view of a
    transposed fp32 buffer."""
    M, N, K = 40, 72, 16
    rbuf = torch.full((M, 2), 7.0, dtype=torch.float16)
    cbuf = torch.full((N, 3), 7.0)
    r, c = rbuf[:, :1], cbuf[:, 1:2].T
    src = "def epi(accum): D = accum; r = max(accum); c = min(accum); return D, r, c"
    args = GemmArguments(rand(M, K), rand(K, N), None,
                         epilogue=EpilogueArguments(src, D=None, r=r, c=c))
    k = check(args, family)
    assert k.plan(args).post == ()
    assert (rbuf[:, 1] == 7.0).all() and (cbuf[:, 0] == 7.0).all() and (cbuf[:, 2] == 7.0).all()


@pytest.mark.parametrize("family", ["portable", "hopper", "gluon"])
def test_fold_reset_waits_for_every_threads_copy(family):
    """The last program's reset of a fold workspace comes after a CTA barrier that follows
    the copy: Triton may lay the reset store out differently from the load (on sm_90 it
    did for 16-bit outputs, and the GPU tier's fold test read the identity back), so
    without the barrier one thread could reset an element another has not read yet."""
    from evtfuse.backends.triton import codegen, families

    fam = {"portable": families.PortableFamily, "hopper": families.HopperFamily,
           "gluon": families.GluonFamily}[family]()
    M, N, K = 384, 640, 128
    c = torch.empty(N, dtype=torch.bfloat16)
    src = "def epi(accum): D = accum; c = min(accum); return D, c"
    args = GemmArguments(rand(M, K, dtype=torch.bfloat16), rand(K, N, dtype=torch.bfloat16),
                         None, epilogue=EpilogueArguments(src, D=None, c=c))
    target = families.Target("cuda", 90, args.A.device, 132)
    spec = fam.spec(args, fam.configs(args, target)[0], target)
    lines = codegen.generate(spec).splitlines()
    at = f"{spec.names('c', 'ws')} + {spec.names('c', 'fo')}"
    load = next(i for i, ln in enumerate(lines) if f"= tl.load({at}" in ln)
    reset = next(i for i, ln in enumerate(lines) if ln.strip().startswith(f"tl.store({at}"))
    assert load < reset
    assert any("barrier()" in ln for ln in lines[load + 1:reset]), "\n".join(lines[load:reset + 1])


@pytest.mark.parametrize("family", ["portable", "hopper", "gluon"])
def test_max_min_combine_on_a_gpu_is_one_instruction(family):
    """On a GPU a max/min reduction combines partials with max.NaN.f32 / min.NaN.f32
    (``_ef_maximum_nan``; NaN wins as in torch.amax, checked with NaNs, infinities and
    signed zeros by the GPU tier's fold test), not the where-based helper's compare and
    select; the interpreter keeps the where-based one, whose results the CPU tier checks."""
    from evtfuse.backends.triton import codegen, families
    from evtfuse.backends.triton.prelude import helpers_for

    fam = {"portable": families.PortableFamily, "hopper": families.HopperFamily,
           "gluon": families.GluonFamily}[family]()
    M, N, K = 384, 640, 128
    src = "def epi(accum): D = accum; r = max(abs(accum)); c = min(accum); return D, r, c"
    args = GemmArguments(rand(M, K, dtype=torch.bfloat16), rand(K, N, dtype=torch.bfloat16),
                         None, epilogue=EpilogueArguments(src, D=None, r=torch.empty(M, 1),
                                                          c=torch.empty(N)))
    kinds = [("cuda", ("_ef_maximum_nan", "_ef_minimum_nan"))]
    if family != "gluon":  # Gluon kernels never run under the interpreter
        kinds.append((families.INTERPRETER, ("_ef_maximum", "_ef_minimum")))
    for kind, combiners in kinds:
        target = families.Target(kind, 90, args.A.device, 132)
        spec = fam.spec(args, fam.configs(args, target)[0], target)
        code = codegen.generate(spec)
        values = tuple(f"tl.reduce({spec.names(o, 'rv')}" for o in ("r", "c"))  # and pieces
        reduced = [ln for ln in code.splitlines() if any(v in ln for v in values)]
        assert reduced and all(any(f", {c})" in ln for c in combiners) for ln in reduced), reduced
        if kind == "cuda":
            assert "propagate_nan=tl.PropagateNan.ALL" in helpers_for("_ef_maximum_nan")


@pytest.mark.parametrize("family", ["portable", "hopper"])
def test_edges_past_the_problem_never_count(family):
    """Ragged tiles at both edges with a value that is 1.0 wherever a tile reaches past the
    problem (zero-filled or wrapped rows and columns plus 1): a per-row sum that counted a
    column past N, a per-column sum a row past M, or the whole sum either, would be off by
    whole units. (Per-row results mask only the columns before reducing, per-column ones
    only the rows; the other edge is dropped where partials are stored or folded.)"""
    M, N, K = 45, 56, 16  # 32-wide interpreter tiles: 13 rows and 8 columns past the edges
    A, B = rand(M, K, dtype=torch.float16), rand(K, N, dtype=torch.float16)
    rs, cs, tot = torch.empty(M, 1), torch.empty(N), torch.empty(1)
    src = ("def epi(accum): t = accum + 1.0; rs = sum(t); cs = sum(t); tot = sum(t); "
           "D = accum; return D, rs, cs, tot")
    args = GemmArguments(A, B, None, epilogue=EpilogueArguments(src, D=None, rs=rs, cs=cs, tot=tot))
    check(args, family)


@pytest.mark.parametrize("family", ["portable", "hopper"])
@pytest.mark.parametrize("mnk", [(64, 96, 16), (64, 80, 16), (40, 96, 16)])
@pytest.mark.cover
def test_reductions_where_tiles_cover_the_output_exactly_or_not(family, mnk):
    """``EVEN_MN``: where the tiles cover M and N exactly the reductions' edge masks fold
    away, elsewhere they stay; a whole-output sum, a per-row max and a per-column
    logsumexp verify both ways (the interpreter's 32x32 tiles: 64x96 even, 64x80 and 40x96
    not)."""
    from evtfuse.backends.triton.families import even_tiles

    M, N, K = mnk
    A, B = rand(M, K), rand(K, N)
    tot, rm, cl = torch.empty(1), torch.empty(M, 1), torch.empty(N)
    src = ("def epi(accum): tot = sum(accum * accum); rm = max(accum); cl = logsumexp(accum); "
           "D = accum; return D, tot, rm, cl")
    args = GemmArguments(A, B, None, epilogue=EpilogueArguments(src, D=None, tot=tot, rm=rm, cl=cl))
    k = check(args, family)
    assert even_tiles(args, k.config) == (M % k.config.block_m == 0 and N % k.config.block_n == 0)
    assert k.plan(args).consts["EVEN_MN"] == even_tiles(args, k.config)
    if mnk == (64, 96, 16):
        assert even_tiles(args, k.config)
    else:
        assert not even_tiles(args, k.config)
