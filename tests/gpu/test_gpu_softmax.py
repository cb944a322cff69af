"""GPU tier: reductions feeding computation (softmax, log_softmax, mean, RMS norm) in every
kernel family the GPU offers, in one pass (portable, N up to 256) and two passes (wider
rows; hopper and gluon always), against torch (torch.softmax, torch.log_softmax,
torch.mean of the fp32 accumulator) and ``Kernel.verify``; the gradients of softmax and of a
row max feeding computation against torch's. Run on the device machine:
``PYTHONPATH=src python3 -m pytest -m gpu tests/gpu/test_gpu_softmax.py``.
"""

from __future__ import annotations

import pytest
import torch

import evtfuse
from evtfuse import EpilogueArguments, GemmArguments, explain, get_kernels

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TOL = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1.2e-2}


def _args(src, M, N, K, dtype, out, **values):
    g = torch.Generator(device="cuda").manual_seed(M * 7 + N)
    A = torch.randn(M, K, device="cuda", generator=g).to(dtype)
    B = torch.randn(K, N, device="cuda", generator=g).to(dtype) / K ** 0.5
    D = torch.empty(M, N, device="cuda", dtype=out)
    return GemmArguments(A, B, D, epilogue=EpilogueArguments(src, D=D, **values)), A, B, D


def _first_per_family(args):
    seen, out = set(), []
    for k in get_kernels(args):
        if k.family.name not in seen:
            seen.add(k.family.name)
            out.append(k)
    return out


@pytest.mark.parametrize("N", [128, 256, 1000, 4096])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("out", [torch.float16, torch.float32])
def test_softmax_every_family(op, N, out):
    bias = torch.randn(N, device="cuda")
    args, A, B, D = _args(f"def epi(accum, bias): D = {op}(accum + bias); return D",
                          512, N, 256, torch.float16, out, bias=bias)
    ks = _first_per_family(args)
    assert ks, explain(args)
    want = getattr(torch, op)(A.float() @ B.float() + bias, dim=-1).to(out)
    for k in ks:
        result = k.verify(args)
        assert result, result.report()
        torch.testing.assert_close(D.float(), want.float(), rtol=TOL[out], atol=TOL[out])
    if N <= 256:
        assert "portable: supported (one pass" in explain(args)


@pytest.mark.parametrize("N", [96, 2048])
def test_softmax_special_rows(N):
    M = 64
    C = torch.zeros(M, N, device="cuda")
    C[0, 3] = float("inf")
    C[1, :5] = float("-inf")
    C[2, 7] = float("nan")
    C[3, :] = float("-inf")
    args, A, B, D = _args("def epi(accum, C): D = softmax(accum + C); return D", M, N, 64,
                          torch.bfloat16, torch.float32, C=C)
    want = torch.softmax((A.float() @ B.float()).cpu() + C.cpu(), dim=-1)
    for k in _first_per_family(args):
        k.run(args)
        torch.cuda.synchronize()
        torch.testing.assert_close(D.cpu(), want, rtol=1e-4, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("N", [200, 3000])
def test_rms_norm_and_means(N):
    M, K = 300, 128
    src = ("def epi(accum, w):\n"
           "    ms = mean(accum * accum)\n"
           "    D = accum * rsqrt(ms + 1e-6) * w\n"
           "    cm = mean(accum)\n"
           "    return D, cm")
    w = torch.randn(N, device="cuda")
    cm = torch.empty(N, device="cuda")
    args, A, B, D = _args(src, M, N, K, torch.float16, torch.float16, w=w, cm=cm)
    acc = A.float() @ B.float()
    for k in _first_per_family(args):
        result = k.verify(args)
        assert result, result.report()
        want = acc * torch.rsqrt((acc * acc).mean(-1, keepdim=True) + 1e-6) * w
        torch.testing.assert_close(D.float(), want.half().float(), rtol=2e-3, atol=2e-3)
        torch.testing.assert_close(cm, acc.mean(0), rtol=1e-4, atol=1e-5)


def test_gemm_one_call():
    A = torch.randn(256, 128, device="cuda", dtype=torch.float16)
    B = torch.randn(128, 1024, device="cuda", dtype=torch.float16)
    D = evtfuse.gemm(A, B, "def epi(accum): D = log_softmax(accum); return D")
    torch.testing.assert_close(D.float(), torch.log_softmax(A.float() @ B.float(), -1),
                               rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("mode", ["recompute", "save"])
@pytest.mark.parametrize("N", [200, 4096])  # one pass on the portable family; two passes
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_gradients_through_softmax(op, N, mode):
    """softmax and log_softmax differentiated (their max a shift: the backward reads the
    forward's max and sum and sums over each row itself) with respect to A, B and a bias
    inside the row function, bf16, against torch's own softmax in fp32 on the same bf16
    inputs."""
    g = torch.Generator(device="cuda").manual_seed(N)
    A0 = torch.randn(384, 256, device="cuda", generator=g).to(torch.bfloat16)
    B0 = (torch.randn(256, N, device="cuda", generator=g) / 16).to(torch.bfloat16)
    b0 = torch.randn(N, device="cuda", generator=g)
    gD = torch.randn(384, N, device="cuda", generator=g)
    A, B, bias = (t.clone().requires_grad_() for t in (A0, B0, b0))
    D = evtfuse.gemm(A, B, f"def epi(accum, bias): D = {op}(accum + bias); return D",
                     bias=bias, D=torch.empty(384, N, device="cuda"), backward=mode)
    D.backward(gD)
    tA, tB, tb = (t.detach().float().requires_grad_() for t in (A0, B0, b0))
    getattr(torch, op)(tA @ tB + tb, dim=-1).backward(gD)
    for got, want in ((A.grad, tA.grad), (B.grad, tB.grad), (bias.grad, tb.grad)):
        # A's and B's gradients pass a bf16 rounding of dAccum, as torch's bf16 matmul does
        assert (got.float() - want).norm() <= 1e-2 * want.norm()


@pytest.mark.parametrize("mode", ["recompute", "save"])
@pytest.mark.parametrize("N", [200, 4096])
def test_gradients_through_a_row_max_feeding_computation(N, mode):
    """A per-row absmax scale (``accum / max(abs(accum))``) differentiated as torch's amax,
    bf16, against torch in fp32 on the same inputs; rows 0 to 15 are all zeros after a relu
    (every element ties)."""
    g = torch.Generator(device="cuda").manual_seed(N + 1)
    A0 = torch.randn(384, 256, device="cuda", generator=g)
    A0[:16] = -A0[:16].abs()
    A0 = A0.to(torch.bfloat16)
    B0 = (torch.randn(256, N, device="cuda", generator=g).abs() / 16).to(torch.bfloat16)
    gD = torch.randn(384, N, device="cuda", generator=g)
    A, B = A0.clone().requires_grad_(), B0.clone().requires_grad_()
    src = ("def epi(accum):\n    m = max(relu(accum))\n    s = max(abs(accum))\n"
           "    D = accum / s + m\n    return D")
    D = evtfuse.gemm(A, B, src, D=torch.empty(384, N, device="cuda"), backward=mode)
    D.backward(gD)
    tA, tB = (t.detach().float().requires_grad_() for t in (A0, B0))
    acc = tA @ tB
    (acc / acc.abs().amax(-1, keepdim=True) + torch.relu(acc).amax(-1, keepdim=True)).backward(gD)
    for got, want in ((A.grad, tA.grad), (B.grad, tB.grad)):
        assert (got.float() - want).norm() <= 1e-2 * want.norm()


@pytest.mark.parametrize("mode", ["recompute", "save"])
def test_gradients_through_column_and_whole_reductions_feeding_computation(mode):
    """A per-column mean (centring the columns) and a whole-output absmax scale, returned
    per batch and feeding computation, differentiated (the backward's sums over each column
    and over everything: scratch outputs), two batches of 1000 x 512, bf16, against torch in
    fp32 on the same inputs."""
    g = torch.Generator(device="cuda").manual_seed(7)
    A0 = torch.randn(2, 1000, 256, device="cuda", generator=g).to(torch.bfloat16)
    B0 = (torch.randn(256, 512, device="cuda", generator=g) / 16).to(torch.bfloat16)
    b0 = torch.randn(512, device="cuda", generator=g)
    gD = torch.randn(2, 1000, 512, device="cuda", generator=g)
    A, B, bias = (t.clone().requires_grad_() for t in (A0, B0, b0))
    src = ("def epi(accum, bias):\n    c = mean(accum * bias)\n    s = max(abs(accum))\n"
           "    D = (accum - c) / s\n    return D, c, s")
    D, _, _ = evtfuse.gemm(A, B, src, bias=bias, D=torch.empty(2, 1000, 512, device="cuda"),
                           c=torch.empty(2, 1, 512, device="cuda"),
                           s=torch.empty(2, 1, 1, device="cuda"), backward=mode)
    D.backward(gD)
    tA, tB, tb = (t.detach().float().requires_grad_() for t in (A0, B0, b0))
    acc = tA @ tB
    ((acc - (acc * tb).mean(1, keepdim=True)) / acc.abs().amax((1, 2), keepdim=True)).backward(gD)
    for got, want in ((A.grad, tA.grad), (B.grad, tB.grad), (bias.grad, tb.grad)):
        assert (got.float() - want).norm() <= 1e-2 * want.norm()
