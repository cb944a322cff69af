"""Kernels through Triton's CPU interpreter: both families, small and odd sizes, fp16/fp32.

Every kernel result is compared with the reference evaluator on fresh random data with
the outputs poisoned (NaN) first (``Kernel.verify``), so an unwritten element fails.
The Hopper (TMA) family runs here when asked for with ``cc=90``.
"""

from __future__ import annotations

import os

import pytest
import torch

import evtfuse
from evtfuse import EpilogueArguments, EpilogueError, GemmArguments, explain, get_kernels
from evtfuse.runtime import cache
from offline_run import run_offline
from tiers import quick

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="CPU-interpreter tier; the GPU tier covers kernels on a GPU")

GEN = torch.Generator().manual_seed(1234)


def rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=GEN).to(dtype)


def kernels_of(args, family, cc=None):
    ks = [k for k in get_kernels(args, cc=cc) if k.family.name == family]
    assert ks, explain(args, cc=cc)
    return ks


def verify_family(args, family):
    cc = 90 if family == "hopper" else None
    k = kernels_of(args, family, cc)[0]
    result = k.verify(args)
    assert result, result.report()
    return k


FAMILIES = ["portable", "hopper"]


# ------------------------------------------------------------ the reference examples

@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_notebook_my_epilogue(family, dtype):
    L, M, N, K = 1, 40, 48, 24
    A, B, C = rand(L, M, K, dtype=dtype), rand(L, K, N, dtype=dtype), rand(L, M, N, dtype=dtype)

    def my_epilogue(accum, C, alpha, beta, extra_scalar):
        Aux = (alpha * accum) + (beta * C)
        D = extra_scalar * Aux
        return D, Aux

    D, Aux = [torch.empty(L, M, N, dtype=dtype) for _ in range(2)]
    epi = EpilogueArguments(my_epilogue, C=C, alpha=1.0, beta=2.0, extra_scalar=0.5, D=D, Aux=Aux)
    verify_family(GemmArguments(A=A, B=B, out=D, accumulator_type=torch.float32, epilogue=epi), family)


@pytest.mark.parametrize("family", FAMILIES)
def test_relu_aux_store_and_return_accum(family):
    M, N, K = 32, 64, 16
    A, B, C = rand(M, K, dtype=torch.float16), rand(K, N, dtype=torch.float16), rand(M, N, dtype=torch.float16)

    def relu_scale_return_acc(accum, alpha, beta, C, scale):
        F = relu((accum * alpha) + (C * beta))  # noqa: F821
        D = F * scale
        return D, F, accum

    D, F = torch.empty(M, N, dtype=torch.float16), torch.empty(M, N, dtype=torch.float16)
    acc = torch.empty(M, N, dtype=torch.float32)
    epi = EpilogueArguments(relu_scale_return_acc, alpha=1.0, beta=2.0, C=C, scale=0.5, D=D, F=F,
                            accum=acc)
    verify_family(GemmArguments(A, B, D, torch.float32, epi), family)
    torch.testing.assert_close(acc, A.float() @ B.float(), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("family", FAMILIES)
def test_string_epilogue_and_efc_alpha_beta(family):
    M, N, K = 24, 32, 40
    A, B = rand(M, K), rand(K, N)
    C, X = rand(M, N), rand(M, N, dtype=torch.float16)
    D, Y = torch.empty(M, N), torch.empty(M, N)
    src = ("def epi(accum, C, X, alpha, beta, x_factor): Y = accum; "
           "D = accum * alpha + C * beta + X * x_factor; return D, Y")
    epi = EpilogueArguments(src, C=C, X=X, alpha=0.5, beta=-1.0, x_factor=2.0, D=D, Y=Y)
    verify_family(GemmArguments(A, B, D, epilogue=epi), family)


ALL_OPS = """
def epi(accum, C, bias, rowv, s):
    x = accum * 0.25 + bias
    a = relu(x) + leaky_relu(x, 0.2) + sigmoid(x) + tanh(x) + gelu(x) + gelu_tanh(x)
    b = silu(x) + hardswish(x) + softplus(x) + exp(-abs(x)) + log(abs(x) + 1.0) + log_sigmoid(x)
    c = sqrt(abs(x)) + rsqrt(abs(x) + 1.0) + sin(x) + cos(x) + tan(x * 0.1) + identity(x)
    d = maximum(x, C) + minimum(x, rowv) + clamp(x, -0.5, 0.5) + where(x > C, x, C)
    e = multiply_add(x, s, C) + x ** 2 + x ** 3 + abs(x) ** 0.5 - x / (abs(C) + 1.0)
    f = (x < C) * 1.0 + (x <= 0.0) + (x >= C) * 2.0 + (x == x) - (x != C) + max(x, 0.1) + min(x, 0.2)
    D = a + b + c + d + e + f
    return D
"""


@pytest.mark.parametrize("family", FAMILIES)
def test_every_op_in_one_epilogue(family):
    M, N, K = 32, 32, 16
    A, B = rand(M, K), rand(K, N)
    D = torch.empty(M, N)
    epi = EpilogueArguments(ALL_OPS, C=rand(M, N), bias=rand(N), rowv=rand(M, 1),
                            s=torch.tensor(0.75), D=D)
    verify_family(GemmArguments(A, B, D, epilogue=epi), family)


# ------------------------------------------------------------ shapes, layouts, batches

@pytest.mark.parametrize("mnk", [(1, 1, 1), (7, 7, 7), (33, 17, 9), (5, 70, 3)])
def test_odd_sizes_portable(mnk):
    M, N, K = mnk
    A, B, C = rand(M, K, dtype=torch.float16), rand(K, N, dtype=torch.float16), rand(M, N)
    D, F = torch.empty(M, N, dtype=torch.float16), torch.empty(M, N)
    src = "def epi(accum, C, alpha): F = alpha * accum + C * 2.0; D = relu(F); return D, F"
    verify_family(GemmArguments(A, B, D, epilogue=EpilogueArguments(src, C=C, alpha=1.5, D=D, F=F)),
                  "portable")


def test_odd_tails_hopper():
    # TMA needs 16-byte rows: fp16 N and K multiples of 8, M anything
    M, N, K = 37, 40, 24
    A, B = rand(M, K, dtype=torch.float16), rand(K, N, dtype=torch.float16)
    D = torch.empty(M, N, dtype=torch.float16)
    verify_family(GemmArguments(A, B, D), "hopper")


@pytest.mark.parametrize("family", FAMILIES)
def test_one_row_problem_with_one_dimensional_full_tensors(family):
    # M = 1: an (N,) tensor spans the whole (1, N) output, so it reads as a full tile
    # (operand shapes right-align); the TMA path once built a 1-D descriptor for it
    # (found by the fuzz test)
    M, N, K = 1, 16, 16
    A, B = rand(M, K, dtype=torch.float16), rand(K, N, dtype=torch.float16)
    bias, D, F = rand(N, dtype=torch.float16), torch.empty(N, dtype=torch.float16), torch.empty(M, N)
    src = "def epi(accum, bias): F = bias + accum; D = relu(F) * 2.0; return D, F"
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(src, bias=bias, D=D, F=F))
    assert {o.name: o.kind.name for o in args.dag.outputs} == {"D": "FULL", "F": "FULL"}
    verify_family(args, family)


@pytest.mark.parametrize("mnk", [(1, 16, 16), (16, 1, 16), (16, 16, 1)])
@pytest.mark.parametrize("a_col", [False, True])
@pytest.mark.parametrize("b_col", [False, True])
def test_one_row_column_or_k_problems_run_or_are_refused_with_reason(mnk, a_col, b_col):
    # a dimension of size 1 has an arbitrary stride in torch (a column-major (1, K) A:
    # strides (1, 1)); TMA descriptors once asserted on it (found by the fuzz test).
    # Where a TMA row would be 2 bytes the hopper family refuses and says which tensor
    M, N, K = mnk
    A = rand(K, M, dtype=torch.float16).T if a_col else rand(M, K, dtype=torch.float16)
    B = rand(N, K, dtype=torch.float16).T if b_col else rand(K, N, dtype=torch.float16)
    D, acc = torch.empty(M, N, dtype=torch.float16), torch.empty(M, N)
    epi = EpilogueArguments("def e(accum): D = accum * 2.0; return D, accum", D=D, accum=acc)
    args = GemmArguments(A, B, D, epilogue=epi)
    verify_family(args, "portable")
    hopper = [k for k in get_kernels(args, cc=90) if k.family.name == "hopper"]
    rows_of_one = N == 1 or (K == 1 and not a_col)
    assert bool(hopper) != rows_of_one, explain(args, cc=90)
    if hopper:
        assert hopper[0].verify(args)
    else:
        assert "not a multiple of 16 bytes" in explain(args, cc=90)


def test_tiny_problems_in_padded_storage_hopper():
    # 1x1x1 and the like as views of 64-wide rows: every row 16-byte aligned, the size-1
    # dimensions' strides replaced by aligned ones (a (1, 1) tensor's contiguous row
    # stride, 2 bytes, would not do)
    src = "def epi(accum, C, alpha, beta): D = alpha * accum + beta * C; return D"
    for M, N, K in [(1, 1, 1), (7, 7, 7), (1, 9, 3), (29, 33, 7)]:
        pad = lambda r, c: rand(r, 64, dtype=torch.float16)[:, :c]  # noqa: E731
        A, B, C = pad(M, K), pad(K, N), pad(M, N)
        D = torch.empty(M, 64, dtype=torch.float16)[:, :N]
        epi = EpilogueArguments(src, C=C, alpha=2.0, beta=1.0, D=D)
        verify_family(GemmArguments(A, B, D, epilogue=epi), "hopper")


@pytest.mark.parametrize("family", FAMILIES)
def test_maximum_and_minimum_with_a_scalar_first(family):
    # the interpreter's NaN-propagating maximum once or-ed a scalar's mask with a block's
    M, N, K = 33, 40, 24
    A, B = rand(M, K, dtype=torch.float16), rand(K, N, dtype=torch.float16)
    D, F = torch.empty(M, N, dtype=torch.float16), torch.empty(M, N)
    src = "def epi(accum, alpha): D = maximum(alpha, accum); F = minimum(0.5, accum); return D, F"
    verify_family(GemmArguments(A, B, D, epilogue=EpilogueArguments(src, alpha=0.25, D=D, F=F)),
                  family)


@pytest.mark.parametrize("family", FAMILIES)
def test_batched_transposed_shared_and_per_batch_operands(family):
    L, M, N, K = 3, 24, 32, 16
    A = rand(L, K, M, dtype=torch.float16).transpose(1, 2)  # column-major A
    B = rand(L, N, K, dtype=torch.float16).transpose(1, 2)  # column-major B
    C = rand(M, N, dtype=torch.float16)  # (M, N): shared by all batches
    alpha = rand(L, 1, 1)  # per-batch device scalar
    rowb = rand(L, M, 1)  # per-batch per-row vector
    colb = rand(1, N)  # per-column vector, shared
    D, Y = torch.empty(L, M, N, dtype=torch.float16), torch.empty(L, M, N)
    src = ("def epi(accum, C, alpha, rowb, colb): Y = accum; "
           "D = alpha * accum + C + rowb * colb; return D, Y")
    epi = EpilogueArguments(src, C=C, alpha=alpha, rowb=rowb, colb=colb, D=D, Y=Y)
    verify_family(GemmArguments(A, B, D, epilogue=epi), family)


def test_b_shared_across_batches_portable():
    L, M, N, K = 2, 16, 24, 8
    A, B = rand(L, M, K), rand(K, N)
    D = torch.empty(L, M, N)
    verify_family(GemmArguments(A, B, D), "portable")


@pytest.mark.parametrize("family", FAMILIES)
def test_vector_and_scalar_outputs_of_broadcast_values(family):
    M, N, K = 40, 32, 16
    A, B = rand(M, K), rand(K, N)
    rowv, colv = rand(M, 1), rand(N)
    D, r, c, s = torch.empty(M, N), torch.empty(M, 1), torch.empty(N), torch.empty(1)
    src = ("def epi(accum, rowv, colv, alpha): D = accum + rowv; r = rowv * alpha; "
           "c = exp(colv); s = alpha * 2.0; return D, r, c, s")
    epi = EpilogueArguments(src, rowv=rowv, colv=colv, alpha=3.0, D=D, r=r, c=c, s=s)
    verify_family(GemmArguments(A, B, D, epilogue=epi), family)


# ------------------------------------------------------------ runtime behaviour

def test_scalar_rerun_uses_new_value_without_recompiling():
    M, N, K = 16, 32, 16
    A, B, C = rand(M, K), rand(K, N), rand(M, N)
    D = torch.empty(M, N)
    src = "def epi(accum, C, alpha, beta): D = alpha * accum + beta * C; return D"
    epi = EpilogueArguments(src, C=C, alpha=1.0, beta=0.0, D=D)
    k = get_kernels(GemmArguments(A, B, D, epilogue=epi))[0]
    k.run(GemmArguments(A, B, D, epilogue=epi))
    modules = set(k._fns)
    k.run(GemmArguments(A, B, D, epilogue=epi.with_values(alpha=-2.0, beta=3.0)))
    assert set(k._fns) == modules  # the same compiled kernel served both
    torch.testing.assert_close(D, -2.0 * (A @ B) + 3.0 * C, rtol=1e-4, atol=1e-4)


def test_hopper_plan_reuses_validated_descriptors_for_new_tensors():
    """A launch plan validates each TMA descriptor once and rebases copies on later
    tensors of the same structure; results on new tensors (transposed B included) stay right."""
    M, N, K = 32, 32, 16
    src = "def epi(accum, C, alpha): D = alpha * accum + C; return D"

    epi: list = []

    def problem():
        A, B, C = rand(M, K, dtype=torch.float16), rand(N, K, dtype=torch.float16).T, rand(M, N)
        D = torch.full((M, N), float("nan"), dtype=torch.float16)
        if not epi:
            epi.append(EpilogueArguments(src, C=C, alpha=0.5, D=D))
        return GemmArguments(A, B, D, epilogue=epi[0].with_values(C=C, D=D))

    first = problem()
    k = kernels_of(first, "hopper", cc=90)[0]
    plan = k.plan(first)
    for _ in range(3):  # fresh tensors each time: the same plan, rebased descriptors
        args = problem()
        assert k.plan(args) is plan
        pos = plan.positional(args.A, args.B, args.epilogue.values)
        descs = [p for p in pos if type(p).__name__ == "TensorDescriptor"]
        assert [d.base.data_ptr() for d in descs] == [args.A.data_ptr(), args.B.data_ptr(),
                                                      args.epilogue.values["C"].data_ptr(),
                                                      args.epilogue.values["D"].data_ptr()]
        assert descs[1].shape == [N, K] and descs[1].strides == [K, 1]  # B as (N, K), K-major
        result = k.verify(args)
        assert result, result.report()


def test_outputs_untouched_when_validation_fails():
    M, N, K = 8, 8, 8
    A, B = rand(M, K), rand(K, N)
    D = torch.full((M, N), float("nan"))
    with pytest.raises(EpilogueError, match="does not broadcast"):
        GemmArguments(A, B, D, epilogue=EpilogueArguments(
            "def epi(accum, C): D = accum + C; return D", C=rand(3, N), D=D))
    with pytest.raises(EpilogueError, match="K"):
        GemmArguments(A, rand(K + 1, N), D)
    assert torch.isnan(D).all()


def test_explain_and_empty_get_kernels():
    M, N, K = 8, 8, 8
    f8 = torch.float8_e4m3fn  # refused under the interpreter (its fp8 conversions are wrong)
    fp8 = GemmArguments(rand(M, K).to(f8), rand(K, N).to(f8), torch.empty(M, N, dtype=f8))
    assert get_kernels(fp8) == []
    assert "fp8 needs a GPU" in explain(fp8)
    ints = GemmArguments(torch.ones(M, K, dtype=torch.int8), torch.ones(K, N, dtype=torch.int8),
                         torch.empty(M, N))
    assert get_kernels(ints) == [] and "int8" in explain(ints)


def test_cpu_tensors_without_interpreter(monkeypatch):
    from evtfuse.runtime import discovery

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(discovery, "_warned_no_interpreter", False)
    args = GemmArguments(rand(8, 8), rand(8, 8), torch.empty(8, 8))
    with pytest.warns(UserWarning, match=r"interpreter is off.*use_interpreter\(\)"):
        assert get_kernels(args) == []  # (warned once per process)
    assert "TRITON_INTERPRET" in explain(args)


def test_hopper_refuses_misaligned_with_reason():
    M, N, K = 16, 13, 16  # fp16 rows of 13 elements: 26 bytes, not a multiple of 16
    args = GemmArguments(rand(M, K, dtype=torch.float16), rand(K, N, dtype=torch.float16),
                         torch.empty(M, N, dtype=torch.float16))
    text = explain(args, cc=90)
    assert "hopper: refused" in text and "16" in text
    assert [k.family.name for k in get_kernels(args, cc=90)] == ["portable"] * 2
    verify_family(args, "portable")


def test_gemm_one_call_fuse_and_unstored_output():
    M, N, K = 24, 16, 8
    A, B, C = rand(M, K), rand(K, N), rand(M, N)

    def relu_aux(accum, C, alpha):
        F = alpha * accum + C * 2.0
        D = relu(F)  # noqa: F821
        return D, F

    D, F = evtfuse.gemm(A, B, relu_aux, C=C, alpha=0.5, F_dtype=torch.float16)
    assert D.dtype == torch.float32 and F.dtype == torch.float16 and D.shape == (M, N)
    ref_F = 0.5 * (A @ B) + 2.0 * C
    torch.testing.assert_close(F.float(), ref_F, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(D, ref_F.relu(), rtol=1e-4, atol=1e-4)
    D2, F2 = evtfuse.gemm(A, B, relu_aux, C=C, alpha=0.5, F=None)
    assert F2 is None
    torch.testing.assert_close(D2, D)
    f = evtfuse.fuse(relu_aux, alpha=0.5)
    D3, F3 = f(A, B, C=C)
    torch.testing.assert_close(D3, D)
    I = evtfuse.gemm(A, B)
    torch.testing.assert_close(I, A @ B, rtol=1e-4, atol=1e-4)


def test_generated_module_in_cache_dir_and_keys_fail_closed():
    args = GemmArguments(rand(8, 8), rand(8, 8), torch.empty(8, 8))
    k = get_kernels(args)[0]
    k.compile(args)
    files = list((cache.cache_dir() / "kernels").glob("k*.py"))
    assert files and os.environ["EVTFUSE_CACHE_DIR"] in str(files[0])
    assert "evtfuse_kernel" in k.source(args)
    with pytest.raises(TypeError):
        cache.make_key(object())
    assert cache.make_key(1.0, "a") != cache.make_key(1.0000001, "a")


def test_string_with_statements_outside_the_function_is_refused():
    with pytest.raises(EpilogueError, match="outside") as exc:
        EpilogueArguments("import os\ndef epi(accum): D = accum; return D", D=torch.empty(2, 2))
    assert exc.value.line == 1


def test_gemm_repeat_call_takes_fast_path_with_new_data():
    M, N, K = 16, 24, 8
    src = "def epi(accum, C, alpha): D = alpha * accum + C; return D"
    D = torch.empty(M, N)
    first = [rand(M, K), rand(K, N), rand(M, N)]
    evtfuse.gemm(*first[:2], src, C=first[2], alpha=1.0, D=D)
    A, B, C = rand(M, K), rand(K, N), rand(M, N)
    D.fill_(float("nan"))
    out = evtfuse.gemm(A, B, src, C=C, alpha=-3.0, D=D)
    assert out is D
    torch.testing.assert_close(D, -3.0 * (A @ B) + C, rtol=1e-4, atol=1e-4)
    # an output aliasing an input changes the structure: validated, not served blindly
    buf = rand(M * K + M * N)
    A2, D2 = buf[: M * K].view(M, K), buf[: M * N].view(M, N)
    with pytest.raises(EpilogueError, match="overlaps"):
        evtfuse.gemm(A2, B, src, C=C, alpha=1.0, D=D2)


def test_gemm_call_key_tells_apart_what_a_launch_plan_depends_on():
    """``gemm``'s per-call key (``run._call_key``): equal for new tensors of the same
    structure, different for another dtype, shape, stride, 16-byte alignment, device,
    aliasing pattern, or a None / scalar / tensor in a slot."""
    from evtfuse.runtime.run import _call_key

    def key(A, B, **kw):
        return _call_key(A, B, kw)[0]

    A, B, C, D = rand(8, 4), rand(4, 16), rand(8, 16), torch.empty(8, 16)
    base = key(A, B, C=C, alpha=1.0, D=D)
    assert key(rand(8, 4), rand(4, 16), C=rand(8, 16), alpha=-2.0, D=torch.empty(8, 16)) == base
    buf = torch.empty(8 * 16 + 1)
    different = [
        key(A.half(), B, C=C, alpha=1.0, D=D),                      # dtype
        key(rand(9, 4), B, C=C, alpha=1.0, D=D),                    # shape
        key(A, B, C=rand(16, 8).t(), alpha=1.0, D=D),               # strides
        key(A, B, C=buf[1:].view(8, 16), alpha=1.0, D=D),           # 16-byte alignment
        key(A, B, C=C, alpha=1.0, D=C),                             # D aliases C
        key(A, B, C=C, alpha=1.0, D=None),                          # D not stored
        key(A, B, C=C, alpha=torch.ones(()), D=D),                  # a tensor for a scalar
        key(A, B, C=C, alpha=None, D=D),                            # None for a scalar
        key(A, rand(16, 4).t(), C=C, alpha=1.0, D=D),               # B column-major
    ]
    assert all(k != base for k in different)
    assert len(set(different)) == len(different)
    assert key(A, B, C=C, alpha=1.0, D=torch.empty(8, 16, device="meta")) != base  # device


def test_gemm_last_call_path_respects_new_dtypes_and_scalars():
    M, N, K = 8, 16, 8
    A, B, C = rand(M, K), rand(K, N), rand(M, N)
    src = "def epi(accum, C, alpha): F = alpha * accum; D = F + C; return D, F"
    for _ in range(3):  # slow path, structure hit, then the same-objects path
        D, F = evtfuse.gemm(A, B, src, C=C, alpha=2.0, F_dtype=torch.float16)
        assert F.dtype == torch.float16
    D, F = evtfuse.gemm(A, B, src, C=C, alpha=-1.0, F_dtype=torch.float32)
    assert F.dtype == torch.float32
    torch.testing.assert_close(F, -(A @ B), rtol=1e-4, atol=1e-4)
    D, F = evtfuse.gemm(A, B, src, C=C, alpha=3.0, F_dtype=torch.float32)
    D, F = evtfuse.gemm(A, B, src, C=C, alpha=0.5, F_dtype=torch.float32)
    torch.testing.assert_close(D, 0.5 * (A @ B) + C, rtol=1e-4, atol=1e-4)


def test_gemm_repeat_calls_still_refuse_non_numbers_for_scalars():
    # a repeated call takes a cached launch plan without the frontend's checks; its
    # runtime scalars once went through float() ("text": a ValueError of Python's, True: 1)
    M, N, K = 8, 16, 8
    A, B, C = rand(M, K), rand(K, N), rand(M, N)
    src = "def epi(accum, C, alpha): D = alpha * accum + C; return D"
    D = torch.full((M, N), 7.0)
    evtfuse.gemm(A, B, src, C=C, alpha=2.0, D=D)  # slow path: the plan is cached
    D.fill_(7.0)
    for bad, words in [("text", "not str"), ([1.0], "not list"), (True, "not True")]:
        for _ in range(2):  # the structure hit, then the same-objects path
            with pytest.raises(EpilogueError, match=f"Argument alpha must be a number .*{words}"):
                evtfuse.gemm(A, B, src, C=C, alpha=bad, D=D)
    assert bool((D == 7.0).all())  # nothing written
    evtfuse.gemm(A, B, src, C=C, alpha=3, D=D)  # an int is a number
    torch.testing.assert_close(D, 3 * (A @ B) + C, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_evtfuse_log_environment_reaches_library_users():
    import subprocess
    import sys
    code = ("import torch, evtfuse, logging; "
            "assert logging.getLogger('evtfuse').level == logging.DEBUG; "
            "logging.getLogger('evtfuse').debug('hello from evtfuse')")
    env = dict(os.environ, EVTFUSE_LOG="debug")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "evtfuse DEBUG: hello from evtfuse" in res.stderr


def test_direct_launcher_steps_aside_for_launch_hooks():
    """Launch plans call Triton's compiled launcher directly only while no launch hook
    (a profiler's) is installed; an empty hook chain, Triton 3.6's default, is no hook."""
    from evtfuse.backends.triton.launch import _hooked

    class Chain:
        def __init__(self, calls):
            self.calls = calls

    assert not _hooked(None) and not _hooked(Chain([]))
    assert _hooked(Chain([print])) and _hooked(print)


class _Compiled:
    """The parts of a Triton ``CompiledKernel`` that ``launch.direct_launcher`` reads."""

    def __init__(self, run, signature, metas):
        from types import SimpleNamespace

        self.run, self.function, self.packed_metadata = run, "function", "meta"
        self.src = SimpleNamespace(signature=signature)
        self.metadata = SimpleNamespace(tensordesc_meta=metas)


def _launch_fixture(monkeypatch):
    """A stand-in for the installed Triton's ``CudaLauncher`` around a recording C launch
    function that takes exactly the arguments Triton's own launcher gives it (else
    TypeError, as the real one), a counting stand-in for the descriptor encoder and a
    driver stub (the real ones need a GPU). Returns (launcher, compiled, jit, seen,
    encoded, Desc)."""
    from types import SimpleNamespace

    import triton.backends.nvidia.driver as nv
    from triton.runtime import driver

    encoded, seen, arity = [], [], []

    def encode(desc, meta, *_):
        encoded.append(desc.base.data_ptr())
        return [f"map{desc.base.data_ptr()}:{meta['swizzle']}", *desc.shape, *desc.strides]

    def c_launch(*args):
        if arity and len(args) != arity[0]:
            raise TypeError(f"function takes exactly {arity[0]} arguments ({len(args)} given)")
        seen.append([list(a) if isinstance(a, (list, tuple)) else a for a in args])

    monkeypatch.setattr(nv, "make_tensordesc_arg", encode)
    monkeypatch.setattr(driver, "_active", SimpleNamespace(
        get_current_device=lambda: 0, get_current_stream=lambda device: 7,
        allocate_default_profile_scratch=lambda *a: None))

    class Desc:
        def __init__(self, t):
            self.base, self.shape, self.strides, self.padding = t, [4, 8], [8, 1], "zero"
            self.round_f32_to_tf32 = False

    signature = {"a_desc": "tensordesc<bf16[64, 64]>", "M": "i32", "c_desc":
                 "tensordesc<bf16[64, 32]>", "alpha": "fp32", "BLOCK": "constexpr"}
    metas = [{"swizzle": 128}, {"swizzle": 64}]
    run = object.__new__(nv.CudaLauncher)  # Triton's own class, its attributes set here
    run.__dict__.update(global_scratch_size=0, profile_scratch_size=0, global_scratch_align=1,
                        profile_scratch_align=1, launch_cooperative_grid=False, launch_pdl=True,
                        num_ctas=1, gsan_enabled=False, arg_annotations=("ann",),
                        kernel_signature=b"sig",
                        launch=nv.wrap_handle_tensordesc(c_launch, signature, metas))
    jit = SimpleNamespace(arg_names=list(signature))
    return run, _Compiled(run, signature, metas), jit, seen, encoded, Desc, arity


def test_raw_launch_passes_what_tritons_own_launcher_passes(monkeypatch):
    """The launch plans call Triton's C launcher below its Python launcher in the running
    Triton's convention (``versions.CHANGES["c_launcher"]``) and encode each TMA descriptor
    once per tensor address (``DescriptorCache``). Checked against the installed Triton's
    own ``CudaLauncher.__call__`` and descriptor wrapper around a recording C launcher: the
    same arguments reach it either way, and each tensor is encoded once however often it
    comes back."""
    import triton.backends.nvidia.driver as nv

    from evtfuse.backends.triton import launch as L

    run, compiled, jit, seen, encoded, Desc, arity = _launch_fixture(monkeypatch)
    launch = L.direct_launcher(compiled, jit, (2,), 4, {"BLOCK": 64})
    tensors = [torch.empty(32) for _ in range(3)]
    for k in range(7):
        args = [Desc(tensors[k % 3]), 128, Desc(tensors[(k + 1) % 3]), 0.5]
        nv.CudaLauncher.__call__(run, 2, 1, 1, 7, "function", "meta", None, None, None,
                                 *args, 64)  # Triton's own path, as its JIT calls it
        arity[:] = [len(seen[-1])]
        assert launch(args) is True
        assert seen[-1] == seen[-2], k
    # Triton's wrapper encoded on every call (14); the raw path once per tensor and slot
    assert len(encoded) == 14 + 6
    # launchers of another shape are called the way Triton calls them
    sig = list(compiled.src.signature.values())
    assert L.raw_launcher(run, sig, [None, None]) is None  # descriptors without metadata
    run.global_scratch_size = 64
    assert L.raw_launcher(run, sig, compiled.metadata.tensordesc_meta) is None


def test_a_launcher_of_another_convention_falls_back_and_says_so(monkeypatch, caplog):
    """Where the running Triton's C launcher takes other arguments than the convention
    evtfuse expects (Triton 3.7 changed it: "function takes exactly 16 arguments (55
    given)"), the first launch finds out, launches through Triton's launcher instead and
    logs it once; the kernel still runs, with Triton's own arguments."""
    import logging

    import triton.backends.nvidia.driver as nv

    from evtfuse.backends.triton import launch as L
    from evtfuse.backends.triton import versions

    run, compiled, jit, seen, encoded, Desc, arity = _launch_fixture(monkeypatch)
    wrong = "flat" if versions.spelling("c_launcher") == "packed" else "packed"
    monkeypatch.setattr(versions, "spelling", lambda name, version=None: wrong)
    monkeypatch.setattr(L, "_logged", set())
    launch = L.direct_launcher(compiled, jit, (2,), 4, {"BLOCK": 64})
    t = torch.empty(32)
    args = [Desc(t), 128, Desc(t), 0.5]
    nv.CudaLauncher.__call__(run, 2, 1, 1, 7, "function", "meta", None, None, None, *args, 64)
    arity[:] = [len(seen[-1])]
    with caplog.at_level(logging.WARNING, logger="evtfuse"):
        for _ in range(3):
            assert launch(args) is True
            assert seen[-1] == seen[0]
    assert len(seen) == 4
    warned = [r for r in caplog.records if "does not fit Triton" in r.getMessage()]
    assert len(warned) == 1 and "raw launch path" in warned[0].getMessage()


def test_direct_launches_keep_the_compiled_kernel_alive(monkeypatch):
    """A launch plan's direct launcher holds Triton's ``CompiledKernel`` itself, not only
    its function handle: Triton 3.9 unloads a kernel's module when that object is collected
    (the JIT's cache drops it when a second compile of the same key replaces it), and a
    launch through the handle then failed on the GPU with "invalid resource handle"."""
    import gc
    import weakref

    from evtfuse.backends.triton import launch as L

    run, compiled, jit, seen, encoded, Desc, arity = _launch_fixture(monkeypatch)
    launch = L.direct_launcher(compiled, jit, (2,), 4, {"BLOCK": 64})
    alive = weakref.ref(compiled)
    del compiled
    gc.collect()
    assert alive() is not None
    t = torch.empty(32)
    assert launch([Desc(t), 128, Desc(t), 0.5]) is True
    del launch
    gc.collect()
    assert alive() is None  # held by the launcher only


def _hopper_configs(M, N, K, src="def epi(accum, C): D = accum + C; return D", c_major=False):
    from evtfuse.backends.triton.families import HopperFamily, Target

    A, B = torch.empty(M, K, dtype=torch.bfloat16), torch.empty(K, N, dtype=torch.bfloat16)
    C, D = torch.empty(M, N, dtype=torch.bfloat16), torch.empty(M, N, dtype=torch.bfloat16)
    if c_major:
        C = torch.empty(N, M, dtype=torch.bfloat16).t()
    given = dict(C=C, D=D) if "C" in src else dict(D=D)
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(src, **given))
    return [c.name for c in HopperFamily().configs(args, Target("cuda", 90, None, 132))]


def test_hopper_configs_for_small_problems_fill_the_gpu():
    # 2048^3 on 132 SMs: 128 tiles of 128x256 fill 97% of the SMs and lead; one wave of
    # 128x128 tiles at two programs per SM is offered next
    small = _hopper_configs(2048, 2048, 2048)
    assert small[:2] == ["128x256x64_w8_s3_g8_e2", "128x128x64_w4_s3_g8_e2_nf_o2_l2"]
    # its aux tiles are asked into L2 over the mainloop only where there are full ones
    bias = _hopper_configs(2048, 2048, 2048, "def epi(accum): D = relu(accum); return D")
    assert bias[1] == "128x128x64_w4_s3_g8_e2_nf_o2"
    # and whose rows they can walk: not a column-major C
    assert _hopper_configs(2048, 2048, 2048, c_major=True)[1] == "128x128x64_w4_s3_g8_e2_nf_o2"
    # large problems: the measured order, no two-per-SM config
    large = _hopper_configs(4096, 4096, 4096)
    assert large[0] == "128x256x64_w8_s3_g8_e2" and not any("_o2" in n for n in large)
    # a problem too small for 128x256 tiles to fill the SMs leads with smaller tiles
    assert _hopper_configs(1024, 1024, 1024)[0] == "128x64x64_w4_s5_g8"  # 128 tiles


@pytest.mark.parametrize("family", quick(FAMILIES, ["portable"]))
def test_one_row_of_tiles_and_one_wave_paths(family):
    """Problems of one row of tiles (M <= BLOCK_M, one batch) take the tile's column from
    the program id without the grouped order's divisions (``ONE_ROW``), and persistent
    grids with a program per tile end their loop at a constant (``ONE_WAVE``). Every
    config runs on shapes that take each path and the general one: 20 rows are one row of
    32-row tiles but two of 16-row ones; up to 4 tiles fit the interpreter's 4 programs,
    6 or 7 do not; two batches are never one row."""
    seen = set()
    for L, M, N in [(1, 20, 40), (1, 20, 72), (1, 20, 200), (2, 20, 72)]:
        K = 40
        A, B = rand(L, M, K, dtype=torch.float16), rand(L, K, N, dtype=torch.float16)
        C, bias = rand(L, M, N), rand(N)
        D = torch.empty(L, M, N, dtype=torch.float16)
        rs, cm = torch.empty(L, M, 1), torch.empty(L, 1, N)
        src = ("def epi(accum, C, bias): D = relu(accum + bias) + C; rs = sum(D); cm = max(D); "
               "return D, rs, cm")
        args = GemmArguments(A, B, D, epilogue=EpilogueArguments(src, C=C, bias=bias, D=D,
                                                                 rs=rs, cm=cm))
        for k in kernels_of(args, family, 90 if family == "hopper" else None):
            result = k.verify(args)
            assert result, f"{k.name} at {(L, M, N)}: {result.report()}"
            consts = k.plan(args).consts
            seen.add((consts["ONE_ROW"], consts.get("ONE_WAVE")))
    if family == "hopper":
        assert seen == {(True, True), (True, False), (False, True), (False, False)}
    else:
        assert seen == {(True, None), (False, None)}


_DIVISIONS_SCRIPT = """
import json, re, torch
from evtfuse import EpilogueArguments, GemmArguments
from evtfuse.backends.triton.families import HopperFamily, PortableFamily, TileConfig
from evtfuse.runtime.offline import compile_for
out = {}
for M in (64, 256):
    N = K = 8192
    A, B = torch.empty(M, K, dtype=torch.bfloat16), torch.empty(K, N, dtype=torch.bfloat16)
    bias, D = torch.empty(N, dtype=torch.bfloat16), torch.empty(M, N, dtype=torch.bfloat16)
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(
        "def epi(accum, bias): D = relu(accum + bias); return D", bias=bias, D=D))
    for fam, cfg in [(HopperFamily(), TileConfig(64, 64, 128, 8, 4, 5)),
                     (PortableFamily(), TileConfig(64, 64, 64, 8, 4, 4))]:
        ptx = compile_for(fam, cfg, args).ptx
        out[f"{fam.name}{M}"] = len(re.findall(r"\\b(?:div|rem)\\.[su]32", ptx))
print("RESULT" + json.dumps(out))
"""


_L2_SCRIPT = """
import json, re, torch
from evtfuse import EpilogueArguments, GemmArguments
from evtfuse.backends.triton.families import HopperFamily, TileConfig
from evtfuse.runtime.offline import compile_for
out = {}
for cdt in (torch.bfloat16, torch.float32):
    n = 2048
    A, B = torch.empty(n, n, dtype=torch.bfloat16), torch.empty(n, n, dtype=torch.bfloat16)
    C, D = torch.empty(n, n, dtype=cdt), torch.empty(n, n, dtype=torch.bfloat16)
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(
        "def epi(accum, C, alpha): D = alpha * accum + C; return D", C=C, alpha=0.5, D=D))
    for l2 in (False, True):
        cfg = TileConfig(128, 128, 64, 8, 4, 3, epi_split=2, flatten=False, ctas_per_sm=2,
                         l2_spread=l2)
        c = compile_for(HopperFamily(), cfg, args)
        out[f"{str(cdt)[6:]}{int(l2)}"] = [len(re.findall(r"CCTL\\.E\\.PF2", c.sass)),
                                          c.registers, c.spills]
print("RESULT" + json.dumps(out))
"""


@pytest.mark.slow
def test_one_wave_kernel_asks_its_aux_tiles_into_l2_during_the_mainloop():
    """sm_90 SASS (offline compile, no GPU) of the one-wave hopper config at 2048^3 with
    ``l2_spread``: one L2 prefetch (``CCTL.E.PF2``) per 128-byte line of a tile row in the
    k-loop (2 for a bf16 C, 4 for fp32: the line follows the operand's dtype), none
    without the flag; no spills and no more registers, so two programs still fit an SM."""
    n = run_offline(_L2_SCRIPT, timeout=600)
    assert n["bfloat160"][0] == 0 and n["float320"][0] == 0, n
    assert n["bfloat161"][0] == 2 and n["float321"][0] == 4, n
    for dt in ("bfloat16", "float32"):
        assert n[f"{dt}1"][2] == 0 and n[f"{dt}1"][1] <= n[f"{dt}0"][1] + 8, n


_HOPPER_SMEM_SCRIPT = """
import json, torch
from evtfuse import EpilogueArguments, GemmArguments
from evtfuse.backends.triton.families import HopperFamily, Target
from evtfuse.runtime.offline import compile_for
n, fam = 4096, HopperFamily()
out = {}
cases = {
    "fp32_C_fp16_D": ("def epi(accum, C): D = relu(C) + accum; R = sum(accum); return D, R",
                      dict(C=torch.empty(n, n), R=torch.empty(n, 1))),
    "two_loads_two_stores": ("def epi(accum, C, X): F = accum * C; D = F + X; return D, F",
                             dict(C=torch.empty(n, n, dtype=torch.float16),
                                  X=torch.empty(n, n, dtype=torch.float16),
                                  F=torch.empty(n, n))),
    "accumulator_stored": ("def epi(accum): D = accum; return D, accum",
                           dict(accum=torch.empty(n, n))),
    "relu_aux": ("def epi(accum, C): F = accum + C * 2.0; D = relu(F); return D, F",
                 dict(C=torch.empty(n, n, dtype=torch.float16),
                      F=torch.empty(n, n, dtype=torch.float16))),
}
for name, (src, ops) in cases.items():
    A = torch.empty(n, n, dtype=torch.float16)
    D = torch.empty(n, n, dtype=torch.float16)
    args = GemmArguments(A, A, D, epilogue=EpilogueArguments(src, D=D, **ops))
    for cfg in fam.configs(args, Target("cuda", 90, torch.device("cpu"), 132))[:4]:
        out[name + " " + cfg.name] = compile_for(fam, cfg, args).shared_bytes
print("RESULT" + json.dumps(out))
"""


@pytest.mark.slow
def test_hopper_configs_with_aux_loads_and_several_stores_fit_shared_memory():
    """sm_90 compiles (no GPU) of the hopper family's first configs where the epilogue
    loads full aux tiles as wide as its outputs or wider: within the 232,448 bytes. The
    family's plan once counted the stored outputs alone (an fp32 C with an fp16 D came
    to 246,808 bytes, D and the fp32 accumulator to 245,784: the kernels failed to
    launch; found by the call-sequence fuzz)."""
    got = run_offline(_HOPPER_SMEM_SCRIPT, timeout=600)
    assert len(got) == 16, got
    over = {k: v for k, v in got.items() if v > 232_448}
    assert not over, over


@pytest.mark.slow
def test_one_row_kernels_compile_without_the_tile_orders_divisions():
    """sm_90 PTX (offline compile, no GPU) of bias+relu at 64x8192x8192 with 64-row tiles:
    the hopper kernel has no integer division or remainder at all (the grouped tile order
    and the persistent loop's trip count cost 21 at M=256), the portable one fewer than at
    M=256. What the one-row path bought at M=64 (benchmarks/HISTORY.md, twelfth session) is the
    divisions ahead of the first load; this keeps them from coming back."""
    n = run_offline(_DIVISIONS_SCRIPT, timeout=600)
    assert n["hopper64"] == 0 and n["hopper256"] > 0, n
    assert n["portable64"] < n["portable256"], n


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-interpreter tier")
@pytest.mark.parametrize("batched", [False, True])
def test_two_per_sm_config_loads_its_vectors_at_the_epilogues_top(batched):
    """The two-programs-per-SM hopper config issues every piece's per-column loads, and a
    per-row operand's one load, together at the top of the tile's epilogue
    (``KernelSpec.early_vectors``), and its results match the reference (interpreter,
    ragged M and N, fp32 row scale, fp16 bias, both batched when ``batched``); the
    one-per-SM config keeps the loads in each piece."""
    from dataclasses import replace

    from evtfuse.backends.triton.families import HopperFamily, TileConfig
    from evtfuse.runtime.kernel import Kernel

    L, M, N, K = (2 if batched else 1), 40, 72, 16
    lead = (L,) if batched else ()
    gen = torch.Generator().manual_seed(7)
    A = torch.randn(*lead, M, K, generator=gen).half()
    B = torch.randn(*lead, K, N, generator=gen).half()
    bias = torch.randn(*((L, 1) if batched else ()), N, generator=gen).half()
    s = torch.randn(*lead, M, 1, generator=gen)
    D = torch.empty(*lead, M, N, dtype=torch.float16)
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(
        "def epi(accum, bias, s): D = relu(accum * s + bias); return D", bias=bias, s=s, D=D))
    target = get_kernels(args, cc=90)[0].target
    cfg = TileConfig(32, 32, 16, 2, 4, 2, epi_split=2, flatten=False, ctas_per_sm=2)
    two, one = Kernel(HopperFamily(), cfg, target), Kernel(HopperFamily(), replace(cfg, ctas_per_sm=1), target)
    src = two.source(args)
    nm = HopperFamily().spec(args, cfg, target).names
    assert src.count(f"tl.load({nm('bias', 'ptr')}") == 2 and src.count(f"tl.load({nm('s', 'ptr')}") == 1, src
    for name in (nm("bias", "ve", 0), nm("bias", "ve", 1), nm("s", "ve")):
        assert f"{name} = tl.load(" in src, name
    assert src.index(f"{nm('bias', 've', 1)} = tl.load(") < src.index(f"{nm('D', 'desc')}.store(")
    assert "_ve" not in one.source(args)
    for k in (two, one):
        result = k.verify(args)
        assert result, result.report()
