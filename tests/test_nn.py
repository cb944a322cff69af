"""``evtfuse.nn``: a ``Linear`` that is a ``torch.nn.Linear`` (state dict, parameters) with a
fused epilogue, and ``fuse_activations``; on the CPU through Triton's interpreter."""

from __future__ import annotations

import pytest
import torch

import evtfuse
from evtfuse.nn import Linear, fuse_activations

IN, OUT = 24, 16


def _close(got, want, tol=1e-4):
    assert got.shape == want.shape
    assert torch.allclose(got.double(), want.double(), atol=tol, rtol=tol), (got - want).abs().max()


def test_loads_a_torch_linear_state_dict_and_matches_it_over_batch_dimensions():
    torch.manual_seed(0)
    ref = torch.nn.Linear(IN, OUT)
    lin = Linear(IN, OUT)
    lin.load_state_dict(ref.state_dict())
    assert set(lin.state_dict()) == {"weight", "bias"}
    x = torch.randn(2, 5, IN)
    with torch.no_grad():
        _close(lin(x), ref(x))
    assert 'epilogue="def linear(accum, bias): D = accum + bias; return D"' in repr(lin)


@pytest.mark.parametrize("lead", [(), (7,), (2, 5)])
def test_inputs_of_any_leading_dims_get_outputs_and_gradients_of_torch_linear(lead):
    """A 2-D input is used as it is and its output returned as it is (no reshape: no view
    node in the autograd graph, the evtfuse node is the output's own); 1-D and 3-D inputs
    are flattened and their output unflattened; values and gradients are torch.nn.Linear's
    with gelu_tanh after it."""
    torch.manual_seed(5)
    ref = torch.nn.Linear(IN, OUT)
    lin = Linear(IN, OUT, epilogue=evtfuse.nn.with_activation("gelu_tanh"))
    lin.load_state_dict(ref.state_dict())
    x = torch.randn(*lead, IN)
    xs = [x.clone().requires_grad_(True) for _ in range(2)]
    g = torch.randn(*lead, OUT)
    y = lin(xs[0])
    want = torch.nn.functional.gelu(ref(xs[1]), approximate="tanh")
    assert y.shape == want.shape
    if len(lead) == 1:
        assert type(y.grad_fn).__name__ == "evtfuse_gemm_functionalBackward"
    y.backward(g)
    want.backward(g)
    _close(y.detach(), want.detach())
    for got, exp in ((xs[0].grad, xs[1].grad), (lin.weight.grad, ref.weight.grad),
                     (lin.bias.grad, ref.bias.grad)):
        _close(got, exp)


def test_without_bias_and_with_an_epilogue_of_its_own():
    torch.manual_seed(1)
    plain = Linear(IN, OUT, bias=False)
    assert plain.bias is None
    x = torch.randn(7, IN)
    with torch.no_grad():
        _close(plain(x), x @ plain.weight.T)
    epi = "def e(accum, bias, scale):\n    D = gelu_tanh(accum + bias) * scale\n    return D"
    lin = Linear(IN, OUT, epilogue=epi, scale=0.5)
    with torch.no_grad():
        want = torch.nn.functional.gelu(x @ lin.weight.T + lin.bias, approximate="tanh") * 0.5
        _close(lin(x), want)
    assert 'epilogue="def e(accum, bias, scale): D = gelu_tanh(accum + bias) * scale; ' \
        'return D", scale=0.5' in repr(lin)
    with pytest.raises(ValueError, match="takes a bias"):
        Linear(IN, OUT, bias=False, epilogue=epi, scale=0.5)


def test_parameters_requiring_grad_get_gradients():
    """A training step: loss.backward() fills weight.grad and bias.grad as torch.nn.Linear
    does (tests/test_autograd.py: more epilogues, torch.compile)."""
    torch.manual_seed(4)
    ref = torch.nn.Linear(IN, OUT)
    lin = Linear(IN, OUT)
    lin.load_state_dict(ref.state_dict())
    x = torch.randn(3, IN)
    for module in (lin, ref):
        module(x).square().sum().backward()
    _close(lin.weight.grad, ref.weight.grad)
    _close(lin.bias.grad, ref.bias.grad)


def test_fuse_activations_swaps_linear_activation_pairs():
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(IN, 32), torch.nn.GELU(approximate="tanh"),
                                torch.nn.Linear(32, OUT), torch.nn.ReLU())
    x = torch.randn(6, IN)
    with torch.no_grad():
        want = model(x)
        fuse_activations(model)
        assert isinstance(model[0], Linear) and isinstance(model[1], torch.nn.Identity)
        assert isinstance(model[2], Linear) and isinstance(model[3], torch.nn.Identity)
        _close(model(x), want)


def test_a_compiled_model_of_evtfuse_linears_matches_eager():
    torch.manual_seed(3)
    model = torch.nn.Sequential(Linear(IN, 32, epilogue=evtfuse.nn.with_activation("silu")),
                                Linear(32, OUT)).requires_grad_(False)
    x = torch.randn(2, 4, IN)
    want = model(x)
    got = torch.compile(model, fullgraph=True, backend="aot_eager")(x)
    _close(got, want)
