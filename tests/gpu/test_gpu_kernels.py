"""GPU tier: every kernel family on a real GPU, bf16/fp16/fp32, odd and large sizes.

Run on the device machine: ``PYTHONPATH=src python3 -m pytest -m gpu``. Each case runs a
kernel on NaN-poisoned outputs and compares with the reference evaluator
(``Kernel.verify``), on fresh random data.
"""

from __future__ import annotations

import pytest
import torch

import evtfuse
from evtfuse import EpilogueArguments, GemmArguments, get_kernels
from gpu_helpers import ALL_OPS, check

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DEV = "cuda"


def _rand(*shape, dtype=torch.float32, gen=None):
    return torch.randn(*shape, device=DEV, dtype=torch.float32, generator=gen).to(dtype)


ALPHA_BETA = "def epi(accum, C, alpha, beta): D = alpha * accum + beta * C; return D"
RELU_AUX = "def epi(accum, C, alpha): F = alpha * accum + C * 2.0; D = relu(F); return D, F"


@pytest.mark.parametrize("family", ["hopper", "portable"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("mnk", [(256, 512, 128), (1000, 776, 264), (4096, 4096, 4096)])
def test_alpha_beta(family, dtype, mnk):
    M, N, K = mnk
    A, B, C = _rand(M, K, dtype=dtype), _rand(K, N, dtype=dtype), _rand(M, N, dtype=dtype)
    D = torch.empty(M, N, device=DEV, dtype=dtype)
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(ALPHA_BETA, C=C, alpha=0.75,
                                                             beta=-1.25, D=D))
    check(args, family)


@pytest.mark.parametrize("mnk, c_dtype", [((2048, 2000, 256), torch.float32),
                                          ((2040, 2048, 2048), torch.bfloat16)])
def test_two_programs_per_sm_config_of_small_problems(mnk, c_dtype):
    # 2048x2048 outputs: one wave of 128x128 tiles at two programs per SM is a candidate,
    # its C tiles asked into L2 over the mainloop (ragged in N, then in M, so the last
    # column or row of tiles is partial and the requests past the edge are dropped; K=256
    # spreads them over 3 k-steps, K=2048 over 31)
    M, N, K = mnk
    A, B = _rand(M, K, dtype=torch.bfloat16), _rand(K, N, dtype=torch.bfloat16)
    C = _rand(M, N, dtype=c_dtype)
    D = torch.empty(M, N, device=DEV, dtype=torch.bfloat16)
    F = torch.empty(M, N, device=DEV, dtype=torch.bfloat16)
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(RELU_AUX, C=C, alpha=1.5, D=D, F=F))
    two = [k for k in get_kernels(args) if k.family.name == "hopper" and k.config.ctas_per_sm == 2]
    assert len(two) == 1 and two[0].config.l2_spread
    assert two[0].family.spec(args, two[0].config, two[0].target).l2_spread
    result = two[0].verify(args)
    assert result, result.report()


@pytest.mark.parametrize("mnk", [(2048, 2000, 256), (2040, 2048, 2048)])
def test_two_programs_per_sm_config_with_vectors(mnk):
    # the same config with a per-column bias and a per-row scale: every piece's vector
    # loads at the top of the tile's epilogue (KernelSpec.early_vectors), ragged N then M
    M, N, K = mnk
    A, B = _rand(M, K, dtype=torch.bfloat16), _rand(K, N, dtype=torch.bfloat16)
    bias, s = _rand(N, dtype=torch.bfloat16), _rand(M, 1)
    D = torch.empty(M, N, device=DEV, dtype=torch.bfloat16)
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(
        "def epi(accum, bias, s): D = gelu_tanh(accum * s + bias); return D", bias=bias, s=s, D=D))
    two = [k for k in get_kernels(args) if k.family.name == "hopper" and k.config.ctas_per_sm == 2]
    assert len(two) == 1 and two[0].family.spec(args, two[0].config, two[0].target).early_vectors
    result = two[0].verify(args)
    assert result, result.report()


@pytest.mark.parametrize("mnk", [(1, 1, 1), (7, 7, 7), (129, 1000, 33), (1000, 129, 7)])
def test_odd_sizes_portable(mnk):
    M, N, K = mnk
    A, B, C = _rand(M, K, dtype=torch.float16), _rand(K, N, dtype=torch.float16), _rand(M, N)
    D = torch.empty(M, N, device=DEV, dtype=torch.float16)
    F = torch.empty(M, N, device=DEV, dtype=torch.float32)
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(RELU_AUX, C=C, alpha=1.5, D=D, F=F))
    check(args, "portable")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_all_ops(dtype):
    M, N, K = 384, 640, 256
    A, B = _rand(M, K, dtype=dtype), _rand(K, N, dtype=dtype)
    C, bias, rowv = _rand(M, N, dtype=dtype), _rand(N), _rand(M, 1, dtype=dtype)
    D = torch.empty(M, N, device=DEV, dtype=torch.float32)
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(
        ALL_OPS, C=C, bias=bias, rowv=rowv, s=torch.tensor(0.5, device=DEV), D=D))
    for family in ("hopper", "portable"):
        check(args, family, n_configs=1)


@pytest.mark.parametrize("family", ["hopper", "portable"])
def test_batched_transposed_per_batch_scalars(family):
    L, M, N, K = 3, 320, 384, 192
    A = _rand(L, K, M, dtype=torch.bfloat16).transpose(1, 2)  # column-major A
    B = _rand(L, N, K, dtype=torch.bfloat16).transpose(1, 2)  # column-major B
    C = _rand(M, N, dtype=torch.bfloat16)  # shared by every batch
    alpha = _rand(L, 1, 1)
    rowb = _rand(L, M, 1)
    D = torch.empty(L, M, N, device=DEV, dtype=torch.bfloat16)
    Y = torch.empty(L, M, N, device=DEV, dtype=torch.float32)
    src = "def epi(accum, C, alpha, rowb): Y = accum; D = alpha * accum + C + rowb; return D, Y"
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(src, C=C, alpha=alpha, rowb=rowb,
                                                             D=D, Y=Y))
    check(args, family)


def test_scalar_rerun_uses_new_value():
    M, N, K = 512, 512, 256
    A, B, C = _rand(M, K, dtype=torch.bfloat16), _rand(K, N, dtype=torch.bfloat16), _rand(M, N)
    D = torch.empty(M, N, device=DEV, dtype=torch.float32)
    epi = EpilogueArguments(ALPHA_BETA, C=C, alpha=1.0, beta=0.0, D=D)
    args = GemmArguments(A, B, D, epilogue=epi)
    k = get_kernels(args)[0]
    assert k.verify(args)
    args2 = GemmArguments(A, B, D, epilogue=epi.with_values(alpha=-2.0, beta=3.0))
    assert k.verify(args2)
    torch.testing.assert_close(D, -2.0 * (A.float() @ B.float()) + 3.0 * C, rtol=1e-3, atol=1e-2)


def test_cuda_graph_capture():
    M, N, K = 1024, 1024, 512
    A, B, C = _rand(M, K, dtype=torch.bfloat16), _rand(K, N, dtype=torch.bfloat16), _rand(M, N, dtype=torch.bfloat16)
    D = torch.empty(M, N, device=DEV, dtype=torch.bfloat16)
    F = torch.empty(M, N, device=DEV, dtype=torch.bfloat16)
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(RELU_AUX, C=C, alpha=0.5, D=D, F=F))
    k = get_kernels(args)[0]
    k.run(args)  # compile outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        k.run(args)
    A.copy_(_rand(M, K, dtype=torch.bfloat16))
    D.fill_(float("nan"))
    F.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    ref = evtfuse.reference.evaluate(args, cast=False)
    assert not torch.isnan(D).any()
    torch.testing.assert_close(F.float(), ref["F"], rtol=2e-2, atol=2e-2 * ref["F"].abs().mean().item())
    torch.testing.assert_close(D.float(), ref["D"], rtol=2e-2, atol=2e-2 * ref["D"].abs().mean().item())


def test_gemm_one_call_and_fuse():
    M, N, K = 1024, 768, 512
    A, B, C = _rand(M, K, dtype=torch.bfloat16), _rand(K, N, dtype=torch.bfloat16), _rand(M, N, dtype=torch.bfloat16)

    def relu_aux(accum, C, alpha):
        F = alpha * accum + C * 2.0
        D = relu(F)  # noqa: F821 - recognised by name
        return D, F

    D, F = evtfuse.gemm(A, B, relu_aux, C=C, alpha=0.5, F_dtype=torch.float32)
    assert D.dtype == torch.bfloat16 and F.dtype == torch.float32
    ref_F = 0.5 * (A.float() @ B.float()) + 2.0 * C.float()
    torch.testing.assert_close(F, ref_F, rtol=1e-3, atol=1e-2)
    torch.testing.assert_close(D.float(), ref_F.relu(), rtol=2e-2, atol=5e-2)
    f = evtfuse.fuse(relu_aux)
    D2, F2 = f(A, B, C=C, alpha=0.5)
    torch.testing.assert_close(D2, D)


def test_tf32_opt_in():
    M, N, K = 512, 512, 512
    A, B = _rand(M, K), _rand(K, N)
    D = torch.empty(M, N, device=DEV)
    args = GemmArguments(A, B, D, allow_tf32=True)
    assert get_kernels(args)[0].verify(args)


RED_SHAPES = {"row": lambda L, M, N: (M, 1), "col_b": lambda L, M, N: (L, 1, N),
              "all": lambda L, M, N: (1,), "row_b": lambda L, M, N: (L, M, 1)}


@pytest.mark.parametrize("family", ["hopper", "portable"])
@pytest.mark.parametrize("op", ["sum", "max", "min", "logsumexp"])
@pytest.mark.parametrize("where", list(RED_SHAPES))
def test_reductions(family, op, where):
    L, M, N, K = 2, 1000, 776, 264
    A, B = _rand(L, M, K, dtype=torch.bfloat16), _rand(L, K, N, dtype=torch.bfloat16)
    bias = _rand(N)
    D = torch.empty(L, M, N, device=DEV, dtype=torch.bfloat16)
    r = torch.empty(RED_SHAPES[where](L, M, N), device=DEV)
    src = f"def epi(accum, bias): D = accum + bias; r = {op}(D * 0.125); return D, r"
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(src, bias=bias, D=D, r=r))
    check(args, family, n_configs=1)


@pytest.mark.parametrize("family", ["gluon", "hopper", "portable"])
def test_atomic_fold_of_specials(family):
    """Per-row max and per-column min fold by integer atomics on the float bits (every
    family): rows/columns holding NaN of either sign, +-inf, only negative values and
    signed zeros give torch's amax/amin exactly, in two launches on new data (the
    workspace rests at the identity between them)."""
    from gpu_helpers import family_kernels

    M, N, K = 384, 640, 128
    A, B = _rand(M, K, dtype=torch.bfloat16), _rand(K, N, dtype=torch.bfloat16)
    C = _rand(M, N, dtype=torch.bfloat16)
    C[3] = -C[3].abs() - 1.0  # a row of negatives only
    C[:, 5] = -C[:, 5].abs() - 1.0  # a column of negatives only
    C[7, 9], C[8, 11] = float("nan"), -float("nan")
    C[10, 13], C[12, 17] = float("inf"), -float("inf")
    C[14], C[15] = -0.0, 0.0
    rmax, cmin = torch.empty(M, 1, device=DEV), torch.empty(N, device=DEV, dtype=torch.bfloat16)
    src = "def epi(accum, C): D = accum; rmax = max(C); cmin = min(C); return D, rmax, cmin"
    args = GemmArguments(A, B, None, epilogue=EpilogueArguments(src, C=C, D=None, rmax=rmax,
                                                                cmin=cmin))
    k = family_kernels(args, family)[0]
    assert k.plan(args).post == ()
    for _ in range(2):
        rmax.fill_(float("nan"))
        cmin.fill_(float("nan"))
        k.run(args)
        torch.cuda.synchronize()
        Cf = C.float()
        torch.testing.assert_close(rmax, Cf.amax(dim=1, keepdim=True), equal_nan=True, rtol=0, atol=0)
        torch.testing.assert_close(cmin.float(), Cf.amin(dim=0), equal_nan=True, rtol=0, atol=0)
        C.neg_()


@pytest.mark.parametrize("family", ["gluon", "hopper", "portable"])
def test_combine_launch_waits_for_its_kernel(family):
    """On Hopper the combine after a kernel is a programmatic dependent launch: it starts
    while the kernel runs and must wait for its partials. Six launches back to back on new
    data, the workspace shared and no synchronization between them: each result is its
    own launch's (a combine reading early would see the last launch's partials); then the
    launch captured in a CUDA graph and replayed on new data."""
    from gpu_helpers import family_kernels

    M, N, K = 640, 1536, 256
    B = _rand(K, N, dtype=torch.bfloat16) * 0.25
    src = "def epi(accum): D = accum; r = logsumexp(accum); return D, r"
    runs = []
    for i in range(6):
        A = _rand(M, K, dtype=torch.bfloat16) * (0.1 * (i + 1))
        r = torch.full((M, 1), float("nan"), device=DEV)
        runs.append((A, r, GemmArguments(A, B, None, epilogue=EpilogueArguments(src, D=None, r=r))))
    k = family_kernels(runs[0][2], family)[0]
    post = k.plan(runs[0][2]).post
    assert len(post) == 1 and post[0].pdl is (torch.cuda.get_device_capability()[0] >= 9)
    assert "_ef_launch_dependents()" in k.source(runs[0][2])
    torch.cuda.synchronize()
    for _, _, args in runs:
        k.run(args)
    torch.cuda.synchronize()
    for A, r, _ in runs:
        want = torch.logsumexp(A.float() @ B.float(), dim=1, keepdim=True)
        torch.testing.assert_close(r, want, rtol=1e-4, atol=1e-4)
    # captured in a CUDA graph (the programmatic edge becomes a graph edge), replayed twice
    A, r, args = runs[0]
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        k.run(args)
    for scale in (0.3, -0.7):
        A.copy_(_rand(M, K, dtype=torch.bfloat16) * scale)
        r.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        want = torch.logsumexp(A.float() @ B.float(), dim=1, keepdim=True)
        torch.testing.assert_close(r, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", ["hopper", "portable"])
def test_lm_head_cross_entropy(family):
    M, N, K = 512, 5000, 256
    x, W = _rand(M, K, dtype=torch.bfloat16), _rand(K, N, dtype=torch.bfloat16) * 0.1
    y = torch.randint(0, N, (M, 1), device=DEV)
    lse, tgt = torch.empty(M, 1, device=DEV), torch.empty(M, 1, device=DEV)
    src = ("def ce(accum, y): lse = logsumexp(accum); "
           "tgt = sum(where(col_index() == y, accum, 0.0)); D = accum; return D, lse, tgt")
    args = GemmArguments(x, W, None, epilogue=EpilogueArguments(src, y=y, D=None, lse=lse, tgt=tgt))
    check(args, family, n_configs=1)
    want = torch.nn.functional.cross_entropy(x.float() @ W.float(), y[:, 0], reduction="none")
    torch.testing.assert_close((lse - tgt)[:, 0], want, rtol=1e-3, atol=1e-3)


def test_bce_loss_and_determinism():
    M, N, K = 2048, 2048, 512
    A, B = _rand(M, K, dtype=torch.bfloat16), _rand(K, N, dtype=torch.bfloat16)
    bias = _rand(N)
    C = (torch.rand(M, N, device=DEV) > 0.5).to(torch.bfloat16)
    src = ("def bce(accum, bias, C): f = accum + bias; "
           "t = (1 - C) * (-f) + log(clamp(sigmoid(f), 1e-3, 0.999)); loss = sum(t); D = f; "
           "return D, loss")
    l1 = evtfuse.gemm(A, B, src, bias=bias, C=C, D=None, loss=torch.empty(1, device=DEV))[1]
    l2 = evtfuse.gemm(A, B, src, bias=bias, C=C, D=None, loss=torch.empty(1, device=DEV))[1]
    assert torch.equal(l1, l2)
    f = A.double() @ B.double() + bias.double()
    ref = ((1 - C.double()) * (-f) + torch.log(torch.clamp(torch.sigmoid(f), 1e-3, 0.999))).sum()
    assert abs(l1.item() - ref.item()) <= 1e-4 * abs(ref.item())


@pytest.mark.parametrize("family", ["hopper", "portable"])
@pytest.mark.parametrize("mnk", [(512, 768, 1024), (1000, 528, 272)])  # int8 rows: 16-byte multiples for TMA
def test_int8(family, mnk):
    M, N, K = mnk
    A = torch.randint(-128, 128, (M, K), device=DEV, dtype=torch.int8)
    B = torch.randint(-128, 128, (N, K), device=DEV, dtype=torch.int8).T  # K-contiguous
    D = torch.empty(M, N, device=DEV, dtype=torch.int8)
    Y = torch.empty(M, N, device=DEV, dtype=torch.int32)
    H = torch.empty(M, N, device=DEV, dtype=torch.bfloat16)
    src = ("def epi(accum, scale, bias): Y = accum; D = accum * scale + bias; "
           "H = accum * 0.001; return D, Y, H")
    args = GemmArguments(A, B, D, torch.int32, EpilogueArguments(
        src, scale=0.0005, bias=_rand(N) * 3, D=D, Y=Y, H=H))
    check(args, family, n_configs=2)
    assert torch.equal(Y.long().cpu(), A.long().cpu() @ B.long().cpu())


@pytest.mark.parametrize("mnk", [(512, 768, 1024), (1000, 528, 272), (129, 67, 1000)])
def test_uint8_portable_exact(mnk):
    """uint8 A and B run by the portable kernel as int8 with offset sums: the int32
    accumulator exact for every configuration offered, scaled uint8 outputs saturating;
    the TMA families refuse uint8 (tests/test_uint8_cpu.py has the extremes too)."""
    M, N, K = mnk
    A = torch.randint(0, 256, (M, K), device=DEV, dtype=torch.uint8)
    B = torch.randint(0, 256, (N, K), device=DEV, dtype=torch.uint8).T
    D = torch.empty(M, N, device=DEV, dtype=torch.uint8)
    Y = torch.empty(M, N, device=DEV, dtype=torch.int32)
    src = "def epi(accum, scale, zero): Y = accum; D = accum * scale - zero; return D, Y"
    args = GemmArguments(A, B, D, torch.int32, EpilogueArguments(
        src, scale=1.0 / (16 * K), zero=_rand(N).abs() * 2000, D=D, Y=Y))
    assert {k.family.name for k in get_kernels(args)} == {"portable"}
    check(args, "portable", n_configs=len(get_kernels(args)))
    assert torch.equal(Y.long().cpu(), A.long().cpu() @ B.long().cpu())


def test_uint8_extremes_on_the_gpu():
    """All-255 rows against an all-255 column: K = 33025 gives 2147450625 (the largest
    such sum an int32 holds: every bit), K = 33040 wraps modulo 2^32 as an int32
    accumulator does; K not a multiple of any tile."""
    for K in (33025, 33040):
        A = torch.full((130, K), 255, device=DEV, dtype=torch.uint8)
        A[1::2] = torch.randint(0, 256, (65, K), device=DEV, dtype=torch.uint8)
        B = torch.full((K, 70), 255, device=DEV, dtype=torch.uint8)
        B[:, 1::2] = 0
        for k in get_kernels(GemmArguments(A, B, torch.empty(130, 70, device=DEV,
                                                            dtype=torch.int32), torch.int32)):
            D = torch.empty(130, 70, device=DEV, dtype=torch.int32)
            k.run(GemmArguments(A, B, D, torch.int32))
            want = A.long().cpu() @ B.long().cpu()
            want = ((want + 2 ** 31) % 2 ** 32) - 2 ** 31
            assert torch.equal(D.long().cpu(), want), (K, k.name)


@pytest.mark.parametrize("family", ["hopper", "portable"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("mnk", [(512, 768, 1024), (1000, 528, 272), (256, 256, 4096)])
@pytest.mark.parametrize("sign", ["zero-mean", "one-sign"])
def test_fp16_accumulation(family, dtype, mnk, sign):
    """accumulator_type=torch.float16 (fp16 and fp8 inputs, wgmma with an fp16
    accumulator): verify's fp16 summation bound holds for the first two configurations,
    also for one-sign data at K = 4096, where a sum rounded after every product would
    stagnate (the bound assumes the tensor cores round once per MMA instruction's k:
    runtime.verify); ``accum`` stored to fp32 holds fp16 values; C is added in fp32."""
    M, N, K = mnk
    A, B = _rand(M, K), _rand(N, K)
    if sign == "one-sign":
        A, B = A.abs() * 0.25, B.abs() * 0.25  # the sums stay under fp16's 65504
    A = A.to(dtype)
    B = B.to(dtype).T  # K-contiguous: 8-bit wgmma
    C = _rand(M, N)
    D = torch.empty(M, N, device=DEV, dtype=torch.bfloat16)
    Y = torch.empty(M, N, device=DEV, dtype=torch.float32)
    src = "def epi(accum, C): Y = accum; D = accum * 0.5 + C; return D, Y"
    args = GemmArguments(A, B, D, torch.float16, EpilogueArguments(src, C=C, D=D, Y=Y))
    assert "gluon" not in {k.family.name for k in get_kernels(args)}
    check(args, family, n_configs=2)
    assert torch.equal(Y.half().float(), Y)


def _unit_accum(family):
    """(M, N, A, B) of a 1024x512x16 bf16 problem whose accumulator is 1 everywhere, for
    checking an epilogue op on values the test chooses (skips gluon off Hopper)."""
    if family == "gluon" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the gluon family runs on Hopper (sm_90)")
    M, N, K = 1024, 512, 16
    A = torch.zeros(M, K, device=DEV, dtype=torch.bfloat16)
    B = torch.zeros(K, N, device=DEV, dtype=torch.bfloat16)
    A[:, 0], B[0, :] = 1.0, 1.0
    return M, N, A, B


@pytest.mark.parametrize("family", ["gluon", "hopper"])
@pytest.mark.parametrize("op", ["sigmoid", "log_sigmoid"])
def test_fast_sigmoid_and_log_sigmoid_accuracy(family, op):
    """On a GPU ``sigmoid`` and ``log_sigmoid`` use MUFU.EX2/RCP/LG2 without subnormal
    handling: check them against float64 over -120..120 and the special values (results
    below 2^-126 flush to zero by design)."""
    M, N, A, B = _unit_accum(family)
    r = torch.linspace(-120, 120, M, device=DEV).reshape(M, 1)
    c = torch.arange(N, device=DEV, dtype=torch.float32) * (240.0 / M / N)
    D = torch.empty(M, N, device=DEV)
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(
        f"def epi(accum, r, c): D = {op}(accum * r + c); return D", r=r, c=c, D=D))
    check(args, family, n_configs=1)
    X = (r + c).double()
    ref = torch.sigmoid(X) if op == "sigmoid" else torch.nn.functional.logsigmoid(X)
    normal = ref.abs() > 2.0 ** -126
    err = ((D.double() - ref).abs() / ref.abs())[normal].max().item()
    assert err < 1e-5, f"max relative error {err:.2e}"
    assert (D[~normal].abs() < 2.0 ** -126).all()
    r[:3, 0] = torch.tensor([float("inf"), float("-inf"), float("nan")], device=DEV)
    c.zero_()
    for k in [k for k in get_kernels(args) if k.family.name == family][:1]:
        k.run(args)
    torch.cuda.synchronize()
    want = [1.0, 0.0] if op == "sigmoid" else [0.0, float("-inf")]
    assert D[:2, 0].tolist() == want and D[2, 0] != D[2, 0]


@pytest.mark.parametrize("family", ["gluon", "hopper", "portable"])
def test_fast_log_accuracy(family):
    """On a GPU ``log`` is the hardware log2 with a series near 1: check it against float64
    over magnitudes from 1e-30 to 1e30 and around 1 (where an absolute error would be a
    large relative one)."""
    M, N, A, B = _unit_accum(family)
    # x = r_i + c_j: rows 1e-30..1e30 and 1 +- 0.2, columns add up to 5e-5
    r = torch.cat([torch.logspace(-30, 30, M // 2, device=DEV),
                   1.0 + torch.linspace(-0.2, 0.2, M // 2, device=DEV)]).reshape(M, 1)
    c = torch.arange(N, device=DEV, dtype=torch.float32) * 1e-7
    D = torch.empty(M, N, device=DEV)
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(
        "def epi(accum, r, c): D = log(accum * r + c); return D", r=r, c=c, D=D))
    check(args, family, n_configs=1)
    X = r + c  # the kernel's fp32 argument of log
    ref = torch.log(X.double())
    err = ((D.double() - ref).abs() / ref.abs().clamp_min(1e-30)).max().item()
    assert err < 2e-6, f"max relative error {err:.2e}"
    r[:4, 0] = torch.tensor([0.0, -1.0, float("inf"), float("nan")], device=DEV)
    c.zero_()
    for k in [k for k in get_kernels(args) if k.family.name == family][:1]:
        k.run(args)
    torch.cuda.synchronize()
    got = D[:4, 0].tolist()
    assert got[0] == float("-inf") and got[1] != got[1] and got[2] == float("inf") \
        and got[3] != got[3], got


def test_exhaustive_tuning_checks_tile_orders_and_caches_its_choice(monkeypatch):
    """``tune="exhaustive"``: every candidate, then the winner at the other tile orders
    (``tuner._refine_tile_order``); the result matches the reference, and a later call with
    the in-memory table cleared (a new process) takes the cached choice, which may be a
    tile order no candidate has, without tuning again."""
    from evtfuse.runtime import tuner

    M, N, K = 1024, 768, 512
    A, B, C = _rand(M, K, dtype=torch.bfloat16), _rand(K, N, dtype=torch.bfloat16), \
        _rand(M, N, dtype=torch.bfloat16)
    timed = []
    real_refine = tuner._refine_tile_order

    def refine(args, chosen, kernels, *rest):
        timed.append(chosen.name)
        return real_refine(args, chosen, kernels, *rest)

    monkeypatch.setattr(tuner, "_refine_tile_order", refine)
    D = evtfuse.gemm(A, B, ALPHA_BETA, C=C, alpha=0.5, beta=1.5, tune="exhaustive")
    ref = 0.5 * (A.float() @ B.float()) + 1.5 * C.float()
    torch.testing.assert_close(D.float(), ref, rtol=2e-2, atol=2e-2 * ref.abs().mean().item())
    assert len(timed) == 1  # the exhaustive search went on to the tile orders
    monkeypatch.setattr(tuner, "_records", {})
    monkeypatch.setattr(tuner, "_chosen", {})
    monkeypatch.setattr(tuner, "_search", lambda *a: pytest.fail("tuned again"))
    again = evtfuse.gemm(A, B, ALPHA_BETA, C=C, alpha=0.5, beta=1.5, tune="exhaustive")
    assert torch.equal(again, D)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_conditional_store_keeps_the_buffer_where_the_condition_fails(dtype):
    """``D = store_where(cond, value)`` through ``gemm`` (tuned: the portable family, the
    TMA families refuse conditional stores), every element the condition leaves as it was,
    bit for bit; and ``Kernel.verify`` of every candidate on poisoned buffers."""
    M, N, K = 1000, 776, 264
    A, B, C = _rand(M, K, dtype=dtype), _rand(K, N, dtype=dtype), _rand(M, N, dtype=dtype)
    src = "def clip(accum, C):\n    F = accum * 0.5\n    D = store_where(F > C, F)\n    return D"
    old = _rand(M, N, dtype=dtype)
    D = old.clone()
    evtfuse.gemm(A, B, src, C=C, D=D)
    F = (A.float() @ B.float()) * 0.5
    stored = F > C.float()
    margin = (F - C.float()).abs() > 1e-2  # away from the edge, where rounding may decide
    kept = stored & margin
    torch.testing.assert_close(D.float()[kept], F[kept].to(dtype).float(), rtol=2e-2, atol=5e-2)
    assert torch.equal(D[~stored & margin], old[~stored & margin])
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(src, C=C, D=D))
    kernels = get_kernels(args)
    assert kernels and all(k.family.name == "portable" for k in kernels)
    for k in kernels:
        assert k.verify(args), k.verify(args)
