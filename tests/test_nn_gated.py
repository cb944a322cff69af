"""``evtfuse.nn.Linear`` with a gated epilogue (issue 47): the two projections of a gated
MLP in one module, ``out_features`` the gated width, against torch (fp32, the interpreter)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import evtfuse
from evtfuse.library import gated

H, I, T = 8, 6, 5


def _halves(w: torch.Tensor, layout: str):
    return (w[:I], w[I:]) if layout == "concatenated" else (w[0::2], w[1::2])


@pytest.mark.parametrize("layout", ["concatenated", "interleaved"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("kind,act", [("swiglu", F.silu),
                                      ("geglu", F.gelu)])
def test_gated_linear_matches_two_projections(layout, bias, kind, act):
    torch.manual_seed(0)
    lin = evtfuse.nn.Linear(H, I, bias=bias, epilogue=gated(kind, bias=bias, layout=layout))
    assert lin.out_features == I and tuple(lin.weight.shape) == (2 * I, H)
    assert set(lin.state_dict()) == ({"weight", "bias"} if bias else {"weight"})
    x = torch.randn(2, T, H, requires_grad=True)
    y = lin(x)
    assert tuple(y.shape) == (2, T, I)
    up = torch.randn(2, T, I)
    (y * up).sum().backward()
    w = lin.weight.detach().clone().requires_grad_()
    b = lin.bias.detach().clone().requires_grad_() if bias else None
    xr = x.detach().clone().requires_grad_()
    wg, wu = _halves(w, layout)
    g, u = xr @ wg.T, xr @ wu.T
    if bias:
        bg, bu = _halves(b, layout)
        g, u = g + bg, u + bu
    want = act(g) * u
    torch.testing.assert_close(y, want, rtol=1e-3, atol=1e-3)
    (want * up).sum().backward()
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(lin.weight.grad, w.grad, rtol=1e-3, atol=1e-3)
    if bias:
        torch.testing.assert_close(lin.bias.grad, b.grad, rtol=1e-3, atol=1e-3)
    assert "weight_rows=12" in repr(lin) and "out_features=6" in repr(lin)


def test_gated_linear_refuses_a_bias_its_epilogue_does_not_take():
    with pytest.raises(ValueError, match="bias_gate and bias_up"):
        evtfuse.nn.Linear(H, I, bias=True, epilogue=gated("swiglu"))
    with pytest.raises(ValueError, match="bias_gate and bias_up, and this Linear has none"):
        evtfuse.nn.Linear(H, I, bias=False, epilogue=gated("swiglu", bias=True))


class _MLP(torch.nn.Module):  # as transformers' MLPs are written: activation in forward
    def __init__(self):
        super().__init__()
        self.fc1, self.act, self.fc2 = torch.nn.Linear(H, I), torch.nn.GELU(), \
            torch.nn.Linear(I, H)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def test_fuse_activations_says_what_it_fused_and_what_it_left():
    """Issue 47: it fused nothing in such models without a word."""
    model = torch.nn.ModuleDict({"mlp": _MLP(), "seq": torch.nn.Sequential(
        torch.nn.Linear(H, I), torch.nn.SiLU())})
    with pytest.warns(UserWarning, match=r"fused 1 .*\(seq\.0\).*left mlp\.fc1: _MLP holds "
                                         r"it beside the activation module 'act'"):
        evtfuse.nn.fuse_activations(model)
    fusion = model.evtfuse_fusion
    assert fusion.fused == ["seq.0"]
    assert [n for n, _ in fusion.left] == ["mlp.fc1", "mlp.fc2"]
    with pytest.warns(UserWarning, match="fused 0 .*no torch.nn.Sequential holds"):
        evtfuse.nn.fuse_activations(torch.nn.Linear(H, I))
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # all fused, nothing left: silent
        evtfuse.nn.fuse_activations(torch.nn.Sequential(torch.nn.Linear(H, I), torch.nn.ReLU()))


def test_a_library_epilogue_shows_as_one_call_however_it_was_written():
    """The repr showed the latest call's spelling: gated("swiglu") became
    gated("swiglu", bias=False, layout="interleaved") once another test wrote it so."""
    from evtfuse import library
    for written in (gated("swiglu", bias=False, layout="interleaved"), gated(kind="swiglu"),
                    gated("swiglu")):
        assert library.call_of(written) == 'gated("swiglu")'
    library.gated("reglu", layout="concatenated", bias=False)
    assert library.call_of(library.gated("reglu", layout="concatenated")) == \
        'gated("reglu", layout="concatenated")'
