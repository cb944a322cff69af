"""Every row's derivative (``OpDef.grad``, evtfuse.derivative) against torch.autograd of
torch's own function for the row (``special_values.TORCH_OWN``), on random values and on
the points where torch's conventions decide: 0 and -0 (relu, abs, leaky_relu), the kinks
of hardswish (+-3) and softplus (20), ties of maximum / minimum / clamp and of max / min
reductions, NaN and the infinities. The rule is evaluated on tensors
(``optable.TorchAlgebra``) in float64: it must give torch's gradient, NaN where torch
gives NaN."""

from __future__ import annotations

import math

import pytest
import torch

from evtfuse.derivative import Diff, NoDerivative, TextAlgebra, apply_rule
from evtfuse.optable import CAST_TARGETS, OPS, Category, Choice, TorchAlgebra, f32

from special_values import TORCH_OWN

NAN, INF = math.nan, math.inf
# values every one-input row is checked at (random ones are added)
POINTS = (0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, -3.0, 2.9, -3.1, 20.0, 20.5, -20.0, 50.0,
          -50.0, 1e-30, 1e30, INF, -INF, NAN)
# pairs / triples with ties, NaN and crossing bounds (clamp: lo > hi too)
PAIRS = [(a, b) for a in (1.0, -1.0, 0.0, 2.0, NAN) for b in (1.0, -1.0, 0.0, 2.0, NAN)]
TRIPLES = [(x, lo, hi) for x in (0.0, 1.0, 1.5, 2.0, 3.0, NAN) for lo in (1.0, 2.0)
           for hi in (1.0, 2.0, NAN)]
# rows whose domain is positive (random values drawn there)
POSITIVE = {"log", "sqrt", "rsqrt"}


def _params_of(row):
    """Every parameter set a row is checked with: its defaults, other numbers, each Choice."""
    extra = {"pow": [{"exponent": c} for c in (2.0, 3.0, 0.5, -1.0, -2.0, 1.0, 0.0, 1.7)],
             "leaky_relu": [{"slope": s} for s in (0.01, 0.2, -0.5)]}
    if row.name in extra:
        return extra[row.name]
    sets = [dict(row.defaults)]
    for name, default in row.params:
        if isinstance(default, Choice):
            sets = [{**s, name: c} for s in sets for c, _ in default.names]
    return sets


def _inputs(row) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(sum(map(ord, row.name)))
    rand = torch.randn(64, generator=g, dtype=torch.float64) * 3
    if row.name in POSITIVE:
        rand = rand.abs() + 0.05
    if row.arity == 1:
        return [torch.cat([torch.tensor(POINTS, dtype=torch.float64), rand])]
    pts = PAIRS if row.arity == 2 else TRIPLES
    cols = [torch.tensor(c, dtype=torch.float64) for c in zip(*pts)]
    more = [torch.randn(64, generator=g, dtype=torch.float64) for _ in range(row.arity)]
    return [torch.cat([c, m]) for c, m in zip(cols, more)]


def _torch_grads(row, ins, params, g):
    """torch's result and gradients, with its own conventions; the exceptions are where
    torch disagrees with itself or rounds the gradient where a kernel does not."""
    leaves = [t.clone().requires_grad_(True) for t in ins]
    args = list(leaves)
    if row.category is Category.SELECT:
        args[0] = leaves[0].detach() != 0
    if row.name == "pow":  # the exponent as the kernel holds it (fp32), as the row does
        params = {"exponent": f32(params["exponent"])}
    out = TORCH_OWN[row.name](*args, **params)
    if not out.dtype.is_floating_point:  # comparisons: a bool result carries no gradient
        return out, [None] * len(ins)
    grads = list(torch.autograd.grad(out, leaves, g, allow_unused=True))
    if row.name == "cast":
        # torch's x.to(fp8) rounds the gradient to fp8 on its way back through the fp8
        # tensor; a kernel's cast result is an fp32 register: the gradient passes unrounded
        grads = [g.clone()]
    if row.name == "hardswish":
        # torch's vectorised CPU kernel gives NaN at x = NaN, its scalar path (and its CUDA
        # kernel) the gradient itself, as the rule does
        grads[0] = torch.where(torch.isnan(ins[0]), g, grads[0])
    return out.detach(), grads


def _rule_grads(row, ins, params, g, out):
    alg = TorchAlgebra(like=ins[0])
    d = Diff(alg, tuple(ins), g, params, out=lambda: out.to(torch.float64))
    return apply_rule(row.grad, d)


def _same(got, want, what):
    if got is None:
        got = torch.zeros_like(want)
    got = got.to(torch.float64).expand(want.shape)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12, equal_nan=True,
                               msg=lambda m: f"{what}: {m}")


ELEMENTWISE = sorted(n for n, r in OPS.items()
                     if r.category not in (Category.REDUCE, Category.STORE, Category.ROWWISE))


@pytest.mark.parametrize("name", ELEMENTWISE)
def test_each_rows_derivative_is_torchs(name):
    row = OPS[name]
    assert row.grad is not None, f"{name} has no derivative"
    ins = _inputs(row)
    g = torch.arange(ins[0].numel(), dtype=torch.float64) * 0.25 - 2.0  # exact in fp32 too
    for params in _params_of(row):
        if name == "cast" and not CAST_TARGETS[params["dtype"]].dtype.is_floating_point:
            with pytest.raises(NoDerivative, match="rounds to an integer"):
                _rule_grads(row, ins, params, g, ins[0])
            continue
        out, want = _torch_grads(row, ins, params, g)
        if row.category is Category.COMPARE:
            assert all(w is None for w in want)
        got = _rule_grads(row, ins, params, g, out)
        assert len(got) == row.arity
        for k, (a, w) in enumerate(zip(got, want)):
            if w is None:
                assert a is None, f"{name}: a gradient into input {k}, where torch has none"
                continue
            _same(a, w, f"{name}{params} input {k}")


@pytest.mark.parametrize("name", ["sum", "max", "min", "logsumexp"])
@pytest.mark.parametrize("dims", [(1,), (0, 1)])
def test_each_reductions_derivative_is_torchs(name, dims):
    """``d.ties`` is the count of tied elements; max/min share a tie's gradient evenly (as
    amax), a NaN row gives NaN everywhere (as amax)."""
    x = torch.tensor([[1.0, 3.0, 3.0, 0.5], [2.0, 2.0, 2.0, 2.0], [-1.0, NAN, 4.0, 0.0],
                      [-INF, -INF, -INF, -INF], [0.0, -0.0, -5.0, 5.0]], dtype=torch.float64)
    x = torch.cat([x, torch.randn(6, 4, generator=torch.Generator().manual_seed(3),
                                  dtype=torch.float64)])
    if name == "logsumexp":
        x = x[torch.arange(x.shape[0]) != 3]  # all -inf: NaN both ways, checked by the above
    leaf = x.clone().requires_grad_(True)
    out = TORCH_OWN[name](leaf, dims)
    g = torch.linspace(0.5, 2.0, out.numel(), dtype=torch.float64).reshape(out.shape)
    (want,) = torch.autograd.grad(out, leaf, g)
    res = out.detach()
    mask = (x == res).to(torch.float64)
    d = Diff(TorchAlgebra(like=x), (x,), g.expand(x.shape), {}, out=lambda: res.expand(x.shape),
             ties=lambda: mask.sum(dims, keepdim=True).expand(x.shape))
    (got,) = apply_rule(OPS[name].grad, d)
    _same(got, want, name)
    assert ("ties" in d.used) == (name in ("max", "min"))


def test_rules_read_as_text():
    """docs/ops.md prints each rule (docgen, through TextAlgebra)."""
    alg = TextAlgebra()
    L = TextAlgebra.leaf
    d = Diff(alg, (L("x"),), L("g"), {}, out=lambda: L("out"))
    (text,) = apply_rule(OPS["sigmoid"].grad, d)
    assert TextAlgebra.text(text) == "g * (1.0 - out) * out"
    d = Diff(alg, (L("x"), L("y")), L("g"), {})
    assert [TextAlgebra.text(t) for t in apply_rule(OPS["sub"].grad, d)] == ["g", "-g"]
    d = Diff(alg, (L("x"), L("y")), L("g"), {})
    assert TextAlgebra.text(apply_rule(OPS["div"].grad, d)[1]) == "-(g * (x / y / y))"
