"""GPU tier: tensors past 2^31 elements, on every kernel offered (issue 30).

Found on an H200: an fp32 D of 16384 x 152064 (an LM head's logits), an int8 C of more
than 2^31 elements and an int8 C with a row stride of 2^30 each ended in ``CUDA error: an
illegal memory access`` in every portable kernel (element offsets computed in int32).
Kernels now take 64-bit offsets where a tensor they address through pointers needs them
(``KernelSpec.int64``); the CPU tier checks the specs, sources and sm_90 compiles and runs
the interpreter on strided cases (``tests/test_offsets_cpu.py``). Here the findings at full
size, each kernel of each family on NaN-poisoned outputs, checked against torch row block
by row block (``Kernel.verify`` would hold several fp32 copies of a 10 GB output).

Memory (GPU): the LM head ~12 GB (D 10 GB), the int8 C ~3 GB, the strided C ~3.3 GB;
nothing above 16 GB at once. Time: dominated by compiles, ~1-2 min per family and test
cold (the hopper and gluon families offer about ten configs each). Run with
``PYTHONPATH=src python3 -m pytest -m gpu tests/gpu/test_gpu_offsets.py``.
"""

from __future__ import annotations

import pytest
import torch

from evtfuse import EpilogueArguments, GemmArguments, explain, get_kernels

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

ROWS = 1024  # rows of the reference computed at a time


def _rand(*shape, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(*shape, device="cuda", generator=g) * scale).to(dtype)


def _kernels(args, family):
    ks = [k for k in get_kernels(args) if k.family.name == family]
    assert ks, explain(args)
    return ks


def _int64(k, args) -> bool:
    return k.family.spec(args, k.config, k.target).int64


def _close(got: torch.Tensor, ref: torch.Tensor, rel: float, what: str) -> None:
    assert torch.isfinite(got).all(), f"{what}: NaN or inf (an element left unwritten?)"
    err = (got.double() - ref.double()).abs().max().item()
    scale = ref.double().abs().max().item()
    assert err <= rel * scale + 1e-6, f"{what}: max error {err:.3g} (scale {scale:.3g})"


@pytest.mark.parametrize("family", ["portable", "hopper", "gluon"])
def test_lm_head_fp32_logits_of_more_than_2_31_elements(family):
    if family == "gluon" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the gluon family runs on Hopper (sm_90)")
    M, N, K = 16384, 152064, 256
    A = _rand(M, K, dtype=torch.bfloat16, seed=1, scale=K ** -0.25)
    W = _rand(N, K, dtype=torch.bfloat16, seed=2, scale=K ** -0.25)  # nn.Linear's weight
    bias = _rand(N, seed=3)
    D = torch.empty(M, N, device="cuda")  # 2.49e9 elements
    r = torch.empty(M, 1, device="cuda")
    args = GemmArguments(A, W.T, D, epilogue=EpilogueArguments(
        "def epi(accum, bias): D = accum + bias; r = logsumexp(D); return D, r",
        bias=bias, D=D, r=r))
    Wf = W.float()
    for k in _kernels(args, family):
        if family == "portable":
            assert _int64(k, args), k.name
        D.fill_(float("nan"))
        r.fill_(float("nan"))
        k.run(args)
        torch.cuda.synchronize()
        for r0 in range(0, M, ROWS):
            ref = A[r0:r0 + ROWS].float() @ Wf.T + bias
            _close(D[r0:r0 + ROWS], ref, 1e-4, f"{k.name} D rows {r0}+")
            _close(r[r0:r0 + ROWS, 0], torch.logsumexp(ref.double(), dim=1), 1e-5,
                   f"{k.name} r rows {r0}+")


@pytest.mark.parametrize("family", ["portable", "hopper"])  # gluon: no int8 tiles (a refusal)
def test_int8_C_of_more_than_2_31_elements(family):
    M, N, K = 16384, 152064, 128
    A = _rand(M, K, dtype=torch.bfloat16, seed=4, scale=K ** -0.25)
    B = _rand(N, K, dtype=torch.bfloat16, seed=5, scale=K ** -0.25).T
    g = torch.Generator(device="cuda").manual_seed(6)
    C = torch.randint(-100, 101, (M, N), device="cuda", generator=g, dtype=torch.int8)  # 2.49e9
    s, m = torch.empty(M, 1, device="cuda"), torch.empty(M, 1, device="cuda")
    args = GemmArguments(A, B, None, epilogue=EpilogueArguments(
        "def epi(accum, C): D = accum + C; s = sum(D); m = max(D); return D, s, m",
        C=C, D=None, s=s, m=m))
    Bf = B.float()
    for k in _kernels(args, family):
        if family == "portable":
            assert _int64(k, args), k.name
        s.fill_(float("nan"))
        m.fill_(float("nan"))
        k.run(args)
        torch.cuda.synchronize()
        for r0 in range(0, M, ROWS):
            ref = (A[r0:r0 + ROWS].float() @ Bf + C[r0:r0 + ROWS].float()).double()
            # a row sum of 152064 terms of |x| ~ 50 in fp32: within 1e-6 of the sum of |x|
            err = (s[r0:r0 + ROWS, 0].double() - ref.sum(dim=1)).abs()
            assert torch.isfinite(s[r0:r0 + ROWS]).all(), f"{k.name} s rows {r0}+"
            assert (err <= 1e-6 * ref.abs().sum(dim=1) + 1e-3).all(), \
                f"{k.name} s rows {r0}+: max error {err.max().item():.3g}"
            _close(m[r0:r0 + ROWS, 0], ref.max(dim=1).values, 1e-5, f"{k.name} m rows {r0}+")


@pytest.mark.parametrize("family", ["portable", "hopper"])  # gluon: no int8 tiles (a refusal)
def test_int8_C_and_scale_with_rows_2_30_apart(family):
    """Four rows 2^30 elements apart (the last at 3 * 2^30): an int8 C tile (TMA in the
    hopper family: its row stride, 2^30 bytes, is within TMA's limits) and an int8 per-row
    scale read through pointers, over 3.2 GB buffers each."""
    M, N, K = 4, 4096, 256
    g = torch.Generator(device="cuda").manual_seed(7)
    cbuf = torch.zeros(3 * 2 ** 30 + N, device="cuda", dtype=torch.int8)
    C = cbuf.as_strided((M, N), (2 ** 30, 1))
    C.copy_(torch.randint(-5, 6, (M, N), device="cuda", generator=g, dtype=torch.int8))
    sbuf = torch.zeros(3 * 2 ** 30 + 1, device="cuda", dtype=torch.int8)
    scale = sbuf.as_strided((M, 1), (2 ** 30, 1))
    scale.copy_(torch.tensor([[1], [2], [-3], [4]], dtype=torch.int8))
    A = _rand(M, K, dtype=torch.bfloat16, seed=8)
    B = _rand(K, N, dtype=torch.bfloat16, seed=9)
    D = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    r = torch.empty(M, 1, device="cuda")
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(
        "def epi(accum, C, scale): D = accum * scale + C; r = sum(D); return D, r",
        C=C, scale=scale, D=D, r=r))
    for k in _kernels(args, family):
        assert _int64(k, args), k.name  # the scale by pointer, in every family
        result = k.verify(args)
        assert result, f"{k.name}:\n{result.report()}"
