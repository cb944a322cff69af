"""Issue 46, round 3, inside PyTorch (CPU, Triton's interpreter, tiny sizes).

- ``linear_cross_entropy`` on special values (inf, -inf, NaN in hidden, weight or bias;
  logits of +-inf, NaN, inf - inf, overflow; ignored rows holding them; every row ignored)
  against ``torch.nn.functional.cross_entropy`` of ``hidden @ weight.T + bias`` in fp32, for
  every reduction and option (label smoothing, 1.0 included, softcap, z-loss): the loss,
  the lse and the gradients of hidden, weight and bias, NaN exactly where torch's are.
"""

from __future__ import annotations

import math

import pytest
import torch

import evtfuse

F = torch.nn.functional
INF, NAN = math.inf, math.nan
# the interpreter's numpy warns of the inf - inf and 0 * inf that torch's kernels meet too
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

# ------------------------------------------------------------------ linear cross-entropy

T, H, V = 5, 3, 4
CLOSE = dict(rtol=1e-4, atol=1e-5, equal_nan=True)  # fp32 against fp32 torch


def _base():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(T, H, generator=g)
    weight = torch.randn(V, H, generator=g) * 0.5
    weight[:, 0] = torch.tensor([0.5, -0.7, 0.3, -0.2])  # column 0: both signs
    bias = torch.randn(V, generator=g)
    target = torch.tensor([1, 0, 3, 2, -100])
    return hidden, weight, bias, target


def _special_case(name: str):
    """(hidden, weight, bias, target) with special values placed as ``name`` says."""
    h, w, b, y = _base()
    h, w, b, y = h.clone(), w.clone(), b.clone(), y.clone()
    if name == "inf_hidden_target_logit_neg_inf":  # row 0: +-inf logits, its target's -inf
        h[0, 0] = INF
    elif name == "inf_hidden_target_logit_pos_inf":
        h[0, 0] = INF
        y[0] = 0
    elif name == "neg_inf_hidden":
        h[1, 0] = -INF
    elif name == "row_of_neg_inf_logits":
        h[2] = torch.tensor([INF, 0.0, 0.0])
        w[:, 0] = -w[:, 0].abs()
    elif name == "nan_hidden":
        h[3, 1] = NAN
    elif name == "inf_in_an_ignored_row":
        h[4, 0] = INF
    elif name == "inf_minus_inf_logits":  # NaN logits in row 0
        h[0, :2] = INF
        w[:, 1] = -w[:, 0]
    elif name == "nan_weight":
        w[2, 1] = NAN
    elif name == "inf_weight":
        w[3, 2] = INF
    elif name == "neg_inf_weight":
        w[1, 2] = -INF
    elif name == "neg_inf_bias":
        b[2] = -INF
    elif name == "overflowing_logits":
        h, w = h * 1e30, w * 1e30
    elif name == "every_row_ignored":
        h[0, 0] = INF
        y[:] = -100
    else:
        raise AssertionError(name)
    return h, w, b, y


SPECIAL_CASES = ["inf_hidden_target_logit_neg_inf", "inf_hidden_target_logit_pos_inf",
                 "neg_inf_hidden", "row_of_neg_inf_logits", "nan_hidden", "inf_in_an_ignored_row",
                 "inf_minus_inf_logits", "nan_weight", "inf_weight", "neg_inf_weight",
                 "neg_inf_bias", "overflowing_logits", "every_row_ignored"]
LCE_OPTIONS = [{}, dict(label_smoothing=0.2, z_loss=1e-2), dict(label_smoothing=1.0),
               dict(softcap=2.0)]


def torch_lce(h, w, y, bias=None, reduction="mean", label_smoothing=0.0, softcap=None, z_loss=0.0):
    """torch's cross_entropy of the logits (plus the z-loss), and their logsumexp."""
    z = h @ w.T
    if bias is not None:
        z = z + bias
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    loss = F.cross_entropy(z, y, reduction=reduction, label_smoothing=label_smoothing)
    lse = torch.logsumexp(z, -1)
    if z_loss:
        valid = y != -100
        zl = torch.where(valid, z_loss * lse * lse, 0.0)
        loss = loss + (zl if reduction == "none" else
                       zl.sum() / valid.sum() if reduction == "mean" else zl.sum())
    return loss, lse


def _lce_both(inputs, with_bias=True, weigh=lambda loss, lse: loss.sum(), **options):
    """Ours and torch's: (loss, lse, gradients of hidden, weight, bias) of
    ``weigh(loss, lse)``."""
    h, w, b, y = inputs
    out = []
    for fn in (lambda *a, **k: evtfuse.linear_cross_entropy(*a, return_lse=True, **k),
               torch_lce):
        leaves = [t.clone().requires_grad_(True) for t in (h, w, b)]
        bias = leaves[2] if with_bias else None
        loss, lse = fn(leaves[0], leaves[1], y, bias=bias, **options)
        weigh(loss, lse).backward()
        out.append((loss.detach(), lse.detach(),
                    *(t.grad for t in (leaves if with_bias else leaves[:2]))))
    return out


@pytest.mark.parametrize("case", SPECIAL_CASES)
def test_linear_cross_entropy_special_values_match_torch(case):
    """Every reduction and option: loss, lse and gradients as torch's, NaN where torch's
    are NaN (a row whose max logit is +-inf: torch's log_softmax is x - max - ..., NaN over
    the whole row, its loss and gradient, ignored or not)."""
    inputs = _special_case(case)
    g = torch.linspace(0.5, 1.5, T)
    for reduction in ("none", "mean", "sum"):
        for options in LCE_OPTIONS if reduction != "sum" else LCE_OPTIONS[:3]:
            def weigh(loss, lse):
                return (loss * g).sum() if reduction == "none" else loss * 1.3

            ours, want = _lce_both(inputs, weigh=weigh, reduction=reduction, **options)
            for what, a, b in zip(("loss", "lse", "d_hidden", "d_weight", "d_bias"), ours, want):
                torch.testing.assert_close(
                    a, b, **CLOSE, msg=lambda m: f"{case} {reduction} {options} {what}: {m}")


@pytest.mark.parametrize("case", ["inf_hidden_target_logit_neg_inf", "row_of_neg_inf_logits",
                                  "nan_hidden", "inf_weight", "neg_inf_weight",
                                  "every_row_ignored"])
def test_linear_cross_entropy_special_values_through_the_lse(case):
    """A gradient through the returned lse alone (torch.logsumexp's: NaN only at a +inf) and
    with the loss's (summed before the matmuls, as torch's autograd does); no bias once."""
    inputs = _special_case(case)
    g = torch.linspace(-1.0, 2.0, T)
    for reduction in ("mean", "none"):
        for weigh in (lambda loss, lse: (lse * g).sum(),
                      lambda loss, lse: (lse * g).sum() + loss.sum()):
            ours, want = _lce_both(inputs, weigh=weigh, reduction=reduction, z_loss=1e-2)
            for a, b in zip(ours, want):
                torch.testing.assert_close(a, b, **CLOSE)
    ours, want = _lce_both(inputs, with_bias=False, reduction="mean", label_smoothing=0.1)
    for a, b in zip(ours, want):
        torch.testing.assert_close(a, b, **CLOSE)


def test_linear_cross_entropy_the_reported_case():
    """The issue's: an inf in hidden whose target logit is -inf: NaN per row and in the
    mean, as torch (was +inf)."""
    h, w, b, y = _special_case("inf_hidden_target_logit_neg_inf")
    want = F.cross_entropy(h @ w.T, y, reduction="none")
    got = evtfuse.linear_cross_entropy(h, w, y, reduction="none")
    assert torch.isnan(want[0]) and torch.isnan(got[0])
    assert torch.isnan(evtfuse.linear_cross_entropy(h, w, y))


# ------------------------------------------------------------------ torch.export.save / load


class _Plain(torch.nn.Module):
    """An evtfuse.gemm call with tensor operands only (no Python-number scalar)."""

    def __init__(self):
        super().__init__()
        self.W = torch.nn.Parameter(torch.randn(4, 3))
        self.C = torch.nn.Buffer(torch.randn(3))

    def forward(self, x):
        return evtfuse.gemm(x, self.W, "def e(accum, C):\n    D = relu(accum + C)\n    return D",
                            C=self.C)


class _Mixed(torch.nn.Module):
    """Python-number scalars of both kinds, an int and a float."""

    def __init__(self):
        super().__init__()
        self.W = torch.nn.Parameter(torch.randn(4, 3))

    def forward(self, x):
        return evtfuse.gemm(x, self.W, "def e(accum, alpha, k):\n    D = alpha * accum + k\n"
                            "    return D", alpha=0.5, k=2)


class _Grouped(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.W = torch.nn.Parameter(torch.randn(2, 4, 3))
        self.offs = torch.nn.Buffer(torch.tensor([2, 5], dtype=torch.int32))

    def forward(self, x):
        return evtfuse.grouped_gemm(x, self.W, self.offs)


def _exportable():
    torch.manual_seed(0)
    return {"nn.Linear": (torch.nn.Sequential(evtfuse.nn.Linear(4, 3), torch.nn.ReLU()),
                          torch.randn(5, 4)),
            "gemm, tensors only": (_Plain(), torch.randn(5, 4)),
            "gemm, int and float scalars": (_Mixed(), torch.randn(5, 4)),
            "grouped_gemm": (_Grouped(), torch.randn(5, 4))}


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_exported_programs_save_load_and_run(tmp_path, grad):
    """torch.export.save of an exported program calling evtfuse (evtfuse::gemm, or its
    functional form where parameters require grad) writes, and the loaded program runs and
    gives the module's results. Failed before for every call without a Python-number
    scalar ("Empty list with type number nyi": the schema's Scalar[]) and for an int next
    to a float."""
    for name, (module, x) in _exportable().items():
        with torch.set_grad_enabled(grad):
            program = torch.export.export(module, (x,))
        path = tmp_path / f"{name.replace(' ', '_').replace(',', '')}.pt2"
        torch.export.save(program, str(path))
        loaded = torch.export.load(str(path))
        with torch.no_grad():
            want = module(x)
            got = loaded.module()(x)
        torch.testing.assert_close(got, want, msg=lambda m: f"{name}: {m}")


def test_an_exported_program_loads_in_a_fresh_process(tmp_path):
    """A process that only imports evtfuse (which registers the operators) and torch loads
    the saved programs and gets the same results."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    names = []
    for k, (module, x) in enumerate(_exportable().values()):
        with torch.no_grad():
            torch.export.save(torch.export.export(module, (x,)), str(tmp_path / f"{k}.pt2"))
            torch.save((x, module(x)), tmp_path / f"{k}.io")
        names.append(str(k))
    script = (
        "import sys, torch, evtfuse\n"
        "for k in sys.argv[2:]:\n"
        "    program = torch.export.load(f'{sys.argv[1]}/{k}.pt2')\n"
        "    x, want = torch.load(f'{sys.argv[1]}/{k}.io')\n"
        "    torch.testing.assert_close(program.module()(x), want)\n"
        "print('loaded', len(sys.argv) - 2)\n")
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([sys.executable, "-c", script, str(tmp_path), *names], env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"loaded {len(names)}" in res.stdout
