"""GPU tier: ``evtfuse.nn.GatedMLP`` and ``evtfuse.nn.MLP`` in bf16 at moderate sizes: the
output and every gradient against the same block in float64 torch, no further from it than
torch's own bf16 block is (each activation, with and without biases, a token count no
multiple of a tile); under torch.compile (Inductor) the eager block's results; gate and up
weights apart (concatenated per call) the same results.
Run with ``PYTHONPATH=src python3 -m pytest -m gpu tests/gpu/test_gpu_mlp.py``.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from evtfuse.nn import GatedMLP, MLP

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

ACTS = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu,
        "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}


def _run(block, x, dy, forward):
    x = x.detach().clone().requires_grad_(True)
    for p in block.parameters():
        p.grad = None
    y = forward(block, x)
    y.backward(dy.to(y.dtype))
    return [y.detach(), x.grad, *(p.grad for p in block.parameters())]


def _gated(m, x):
    return m.down_proj(ACTS[m.activation](m.gate_proj(x)) * m.up_proj(x))


def _plain(m, x):
    return m.fc2(ACTS[m.activation](m.fc1(x)))


def _rel(got, want) -> float:
    return ((got.double() - want).norm() / want.norm()).item()


def _check(block, reference, T, H, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, device="cuda", generator=g) * p.shape[-1] ** -0.5)
    x = torch.randn(T, H, device="cuda", generator=g).bfloat16()
    dy = torch.randn(T, H, device="cuda", generator=g).bfloat16()
    ours = _run(block, x, dy, lambda m, t: m(t))
    torch_bf16 = _run(copy.deepcopy(block), x, dy, reference)
    exact = _run(copy.deepcopy(block).double(), x.double(), dy.double(), reference)
    names = ["y", "dx", *(n for n, _ in block.named_parameters())]
    for name, got, tb, want in zip(names, ours, torch_bf16, exact):
        # no further from float64 than torch's bf16 block, within bf16's rounding
        assert _rel(got, want) <= max(1.5 * _rel(tb, want), 4e-3), (name, _rel(got, want),
                                                                    _rel(tb, want))
    return ours, x, dy


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("activation", sorted(ACTS))
def test_gated_mlp_bf16(activation, bias):
    block = GatedMLP(512, 1408, activation, bias=bias, device="cuda", dtype=torch.bfloat16)
    _check(block, _gated, 1000, 512)


@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_plain_mlp_bf16(activation):
    block = MLP(512, 2048, activation=activation, device="cuda", dtype=torch.bfloat16)
    _check(block, _plain, 777, 512, seed=1)


def test_compiled_block_matches_eager():
    block = GatedMLP(1024, 2816, "silu", device="cuda", dtype=torch.bfloat16)
    eager, x, dy = _check(block, _gated, 2048, 1024, seed=2)
    twin = copy.deepcopy(block)
    torch._dynamo.reset()
    compiled = torch.compile(twin, fullgraph=True)
    got = _run(twin, x, dy, lambda m, t: compiled(t))
    names = ["y", "dx", *(n for n, _ in block.named_parameters())]
    for name, a, b in zip(names, got, eager):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=lambda m: f"{name}: {m}")


def test_weights_apart_match_packed():
    """Gate and up weights in two buffers: the forward concatenates them per call; the
    same results as packed."""
    block = GatedMLP(512, 1408, "gelu_tanh", device="cuda", dtype=torch.bfloat16)
    packed, x, dy = _check(block, _gated, 600, 512, seed=3)
    apart = copy.deepcopy(block)
    apart.up_proj.weight = torch.nn.Parameter(apart.up_proj.weight.detach().clone())
    got = _run(apart, x, dy, lambda m, t: m(t))
    for a, b in zip(got, packed):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)
