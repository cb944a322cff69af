"""GPU tier: gradients through evtfuse on a real GPU, bf16 and fp32, every kernel family.

The forward and the backward epilogue (each one ``evtfuse::gemm``) are pinned to one kernel
family at a time (its first configuration that supports the call; the tuner's choice where
it supports none), and every gradient is compared with torch.autograd of the reference
evaluator in float64 (``grad_oracle``, on the CPU) by relative norm. Also: a compiled
training step (Inductor) and ``evtfuse.nn.Linear`` against ``torch.nn.Linear``, and the
random-epilogue gradient fuzz (``test_fuzz_grads.check_kernels``) at GPU sizes. Each in
both backward modes ("recompute": the backward kernel recomputes A @ B; "save": it reads
the accumulator the forward stored, bf16 for bf16 inputs, over K = 0).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import evtfuse
from evtfuse.frontend import parse_epilogue
from evtfuse.runtime import api, run, tuner

from epilogue_fuzz import GPU_SHAPES, cases, drawn
from grad_oracle import GA, GB, reference_grads
from test_fuzz_grads import check_kernels

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DEV = "cuda"
FAMILIES = ["gluon", "hopper", "portable"]
# relative-norm tolerance of a gradient against float64, by the run's dtype
REL = {torch.bfloat16: 3e-2, torch.float32: 2e-3}
MODES = ["recompute", "save"]


@pytest.fixture
def family(request, monkeypatch):
    """Pin every kernel choice (forward and backward) to one family where it can run."""
    name = request.param
    real = tuner.choose_kernel

    def choose(args, tune="fast", cc=None):
        ks = [k for k in api.get_kernels(args, cc=cc) if k.family.name == name]
        return ks[0] if ks else real(args, tune=tune, cc=cc)

    monkeypatch.setattr(api, "choose_kernel", choose)
    run._fast.clear()
    run._last_call.clear()
    if name == "gluon" and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the gluon family needs a Hopper GPU")
    yield name
    run._fast.clear()
    run._last_call.clear()


def _rand(*shape, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return (torch.randn(tuple(shape), device=DEV, generator=g) * scale).to(dtype)


def _rel(got, want) -> float:
    got, want = got.double().cpu(), want.double().cpu()
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


def check(source, A, B, values, graded, wrt, dtype, mode="auto"):
    A = A.detach().requires_grad_(True)
    B = B.detach().requires_grad_(True)
    outputs = parse_epilogue(source).outputs
    call = {k: (v.detach().clone().requires_grad_(True) if k in wrt else
                torch.empty_like(v) if k in outputs and isinstance(v, torch.Tensor) else v)
            for k, v in values.items()}
    res = evtfuse.gemm(A, B, source, backward=mode, **call)
    res = res if isinstance(res, tuple) else (res,)
    grads = {n: _rand(*r.shape, dtype=r.dtype, seed=7 + k)
             for k, (n, r) in enumerate(zip(outputs, res)) if n in graded}
    sum((r.float() * grads[n].float()).sum() for n, r in zip(outputs, res) if n in grads).backward()
    cpu = {k: (v.detach().cpu() if isinstance(v, torch.Tensor) else v) for k, v in values.items()}
    cpu.update({n: r.detach().cpu() for n, r in zip(outputs, res) if r is not None})
    want = reference_grads(source, A.detach().cpu(), B.detach().cpu(), cpu,
                           {n: g.cpu() for n, g in grads.items()}, set(wrt))
    got = {GA: A.grad, GB: B.grad, **{k: call[k].grad for k in wrt}}
    for name, w in want.items():
        assert got[name] is not None, name
        assert got[name].shape == w.shape, name
        assert _rel(got[name], w) < REL[dtype], (name, _rel(got[name], w), source, mode)


EPI = """
def epi(accum, C, bias, rowv, s, alpha):
    F = alpha * accum + C * rowv
    D = gelu_tanh(F + bias) * s
    return D, F
"""
REDUCE = """
def epi(accum, bias):
    D = silu(accum + bias)
    R = logsumexp(D)
    S = sum(D * D)
    X = max(accum)
    return D, R, S, X
"""


@pytest.mark.parametrize("family", FAMILIES, indirect=True)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("mnk", [(256, 384, 128), (1000, 776, 264)])
@pytest.mark.parametrize("mode", MODES)
def test_gradients_of_every_operand_kind(family, dtype, mnk, mode):
    M, N, K = mnk
    values = dict(C=_rand(M, N, dtype=dtype, seed=2), bias=_rand(N, dtype=dtype, seed=3),
                  rowv=_rand(M, 1, seed=4), s=_rand(seed=5), alpha=0.75)
    check(EPI, _rand(M, K, dtype=dtype, seed=0, scale=K ** -0.5), _rand(K, N, dtype=dtype, seed=1),
          values, {"D", "F"}, {"C", "bias", "rowv", "s"}, dtype, mode)


@pytest.mark.parametrize("family", FAMILIES, indirect=True)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("mode", MODES)
def test_gradients_of_reductions(family, dtype, mode):
    M, N, K = 520, 384, 200
    values = dict(bias=_rand(N, dtype=dtype, seed=3), R=torch.empty(M, 1, device=DEV),
                  S=torch.empty(N, device=DEV), X=torch.empty(M, 1, device=DEV))
    check(REDUCE, _rand(M, K, dtype=dtype, scale=K ** -0.5), _rand(K, N, dtype=dtype, seed=1),
          values, {"D", "R", "S", "X"}, {"bias"}, dtype, mode)


@pytest.mark.parametrize("family", FAMILIES, indirect=True)
@pytest.mark.parametrize("mode", MODES)
def test_batched_gradients(family, mode):
    L, M, N, K = 3, 256, 264, 128
    dtype = torch.bfloat16
    src = "def e(accum, C, cb, sb):\n    D = tanh(accum * sb + C) * cb\n    R = sum(D)\n" \
          "    return D, R"
    values = dict(C=_rand(M, N, dtype=dtype, seed=2), cb=_rand(L, 1, N, seed=3),
                  sb=_rand(L, 1, 1, seed=4), R=torch.empty(L, M, 1, device=DEV))
    check(src, _rand(L, M, K, dtype=dtype, scale=K ** -0.5), _rand(K, N, dtype=dtype, seed=1),
          values, {"D", "R"}, {"C", "cb", "sb"}, dtype, mode)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("mode", ["auto", *MODES])
def test_linear_training_step_matches_torch_linear(dtype, mode):
    torch.manual_seed(0)
    ref = torch.nn.Linear(512, 768, device=DEV, dtype=dtype)
    lin = evtfuse.nn.Linear(512, 768, device=DEV, dtype=dtype, backward=mode,
                            epilogue=evtfuse.nn.with_activation("gelu_tanh"))
    lin.load_state_dict(ref.state_dict())
    x = _rand(4, 100, 512, dtype=dtype, seed=9)
    xr, xl = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    torch.nn.functional.gelu(ref(xr), approximate="tanh").float().square().mean().backward()
    lin(xl).float().square().mean().backward()
    for got, want in ((lin.weight.grad, ref.weight.grad), (lin.bias.grad, ref.bias.grad),
                      (xl.grad, xr.grad)):
        assert _rel(got, want) < REL[dtype]


@pytest.mark.parametrize("mode", MODES)
def test_compiled_training_step_with_inductor(mode):
    torch._dynamo.reset()
    M, N, K = 512, 384, 256
    leaves = [_rand(M, K, dtype=torch.bfloat16, scale=K ** -0.5), _rand(K, N, dtype=torch.bfloat16),
              _rand(M, N, dtype=torch.bfloat16, seed=2), _rand(N, dtype=torch.bfloat16, seed=3)]

    def step(A, B, C, bias):
        D, F = evtfuse.gemm(A, B, EPI, C=C, bias=bias, rowv=torch.ones(A.shape[0], 1, device=DEV),
                            s=torch.ones((), device=DEV), alpha=0.5, backward=mode)
        return D.float().sum() + F.float().square().mean()

    def grads(fn):
        ts = [t.detach().clone().requires_grad_(True) for t in leaves]
        fn(*ts).backward()
        return [t.grad for t in ts]

    eager = grads(step)
    compiled = grads(torch.compile(step, fullgraph=True))
    for got, want in zip(compiled, eager):
        assert _rel(got, want) < 1e-2


@drawn(12, 21)
@given(case=cases(differentiable=True, feeding=True), shape=st.sampled_from(GPU_SHAPES[:3]), data_seed=st.integers(0, 2 ** 16),
       keep=st.integers(1, 15))
def test_random_epilogues_train_on_the_gpu(case, shape, data_seed, keep):
    mode = MODES[data_seed % 2]  # from the seed: the drawn examples stay those of before
    check_kernels(case, shape, torch.float32, data_seed, keep, DEV, rtol=5e-3, mode=mode)


def test_save_mode_runs_the_backward_without_a_gemm(monkeypatch):
    """The MLP up-projection's shape of step at a small size: "auto" saves at K = 1024 bf16
    (the backward kernel over K = 0, reading a bf16 (M, N) copy), recomputes at K = 256."""
    calls = []
    real = torch.ops.evtfuse.gemm.default

    class Spy:
        @staticmethod
        def default(A, B, epilogue, layout, tensors, *rest):
            calls.append((tuple(A.shape), [(t.dtype, tuple(t.shape)) for t in tensors]))
            return real(A, B, epilogue, layout, tensors, *rest)

    monkeypatch.setattr(torch.ops.evtfuse, "gemm", Spy)
    for K, want in ((1024, 0), (256, 256)):
        lin = evtfuse.nn.Linear(K, 768, device=DEV, dtype=torch.bfloat16,
                                epilogue=evtfuse.nn.with_activation("gelu_tanh"))
        x = _rand(512, K, dtype=torch.bfloat16, seed=9).requires_grad_(True)
        calls.clear()
        lin(x).float().sum().backward()
        ((shape, tensors),) = calls
        assert shape == (512, want), K
        # grad_D, and in save mode the saved accumulator
        assert tensors.count((torch.bfloat16, (512, 768))) == (2 if want == 0 else 1)
