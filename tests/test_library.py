"""evtfuse.library: each ready epilogue, read by the reference evaluator, equals plain torch.

CPU only, no kernels: the library is source text over the frontend, so the reference
evaluator (the oracle of every kernel test) is what these tests compare against an
independent torch formula written out here.
"""

from __future__ import annotations

import ast

import pytest
import torch
import torch.nn.functional as tF

from evtfuse import EpilogueArguments, EpilogueError, library
from evtfuse.frontend import parse_epilogue
from evtfuse.ir import OperandKind
from evtfuse.reference import evaluate

L, M, N = 2, 12, 10


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen(seed), dtype=torch.float32)


@pytest.fixture
def accum() -> torch.Tensor:
    return randn(L, M, N, seed=1) * 3.0  # spans the interesting range of every activation


@pytest.fixture
def C() -> torch.Tensor:
    return randn(L, M, N, seed=2)


def out(*shape, dtype=torch.float32) -> torch.Tensor:
    return torch.full(shape or (L, M, N), float("nan"), dtype=dtype)  # never read as input


def ev(source: str, accum: torch.Tensor, **values) -> dict[str, torch.Tensor]:
    values.setdefault("D", out())
    return evaluate(EpilogueArguments(source, **values), accum)


TORCH_ACTIVATIONS = {
    "identity": lambda x: x,
    "relu": torch.relu,
    "gelu": lambda x: tF.gelu(x),
    "gelu_tanh": lambda x: tF.gelu(x, approximate="tanh"),
    "sigmoid": torch.sigmoid,
    "silu": tF.silu,
    "hardswish": tF.hardswish,
    "leaky_relu": lambda x: tF.leaky_relu(x, 0.01),
    "tanh": torch.tanh,
}


# ------------------------------------------------------------------ linear combination

def test_linear_combination_source_is_the_documented_formula():
    src = library.linear_combination()
    parsed = parse_epilogue(src)
    assert parsed.params == ("C", "alpha", "beta") and parsed.outputs == ("D",)
    assert "D = alpha * accum + beta * C" in src


@pytest.mark.parametrize("form", ["number", "0-d", "(1,)", "(L,1,1)", "(N,)", "(M,1)"])
def test_linear_combination_scalar_forms(accum, C, form):
    alpha_v = torch.tensor([1.5, -0.75])[:L].view(L, 1, 1)
    beta_v = torch.tensor([0.5, 2.0])[:L].view(L, 1, 1)
    if form == "number":
        alpha, beta, a, b = 1.5, 0.5, 1.5, 0.5
    elif form == "0-d":
        alpha, beta = torch.tensor(1.5), torch.tensor(0.5)
        a, b = 1.5, 0.5
    elif form == "(1,)":
        alpha, beta = torch.tensor([1.5]), torch.tensor([0.5])
        a, b = 1.5, 0.5
    elif form == "(L,1,1)":  # CUTLASS alpha_ptr_array: one value per batch
        alpha, beta, a, b = alpha_v, beta_v, alpha_v, beta_v
    elif form == "(N,)":  # per-column (per output channel)
        alpha, beta = randn(N, seed=5), randn(N, seed=6)
        a, b = alpha.view(1, 1, N), beta.view(1, 1, N)
    else:  # per-row
        alpha, beta = randn(M, 1, seed=7), randn(M, 1, seed=8)
        a, b = alpha.view(1, M, 1), beta.view(1, M, 1)
    got = ev(library.linear_combination(), accum, C=C, alpha=alpha, beta=beta)["D"]
    torch.testing.assert_close(got, a * accum + b * C)


def test_per_batch_scalar_really_differs_per_batch(accum, C):
    alpha = torch.tensor([2.0, -3.0]).view(L, 1, 1)
    ea = EpilogueArguments(library.linear_combination("only_alpha"), alpha=alpha, D=out())
    assert ea.dag.operands[0].kind is OperandKind.DEVICE_SCALAR and ea.dag.operands[0].batched
    got = evaluate(ea, accum)["D"]
    torch.testing.assert_close(got[0], 2.0 * accum[0])
    torch.testing.assert_close(got[1], -3.0 * accum[1])


def test_scale_variants(accum, C):
    d = ev(library.linear_combination("no_beta"), accum, C=C, alpha=2.0)["D"]
    torch.testing.assert_close(d, 2.0 * accum + C)
    d = ev(library.linear_combination("only_alpha"), accum, alpha=-0.5)["D"]
    torch.testing.assert_close(d, -0.5 * accum)
    d = ev(library.linear_combination("nothing"), accum)["D"]
    torch.testing.assert_close(d, accum)
    assert "C" not in parse_epilogue(library.linear_combination("only_alpha")).params
    with pytest.raises(EpilogueError, match="unknown scale"):
        library.linear_combination("beta_only")


# ------------------------------------------------------------------ activations

@pytest.mark.parametrize("act", sorted(TORCH_ACTIVATIONS))
def test_lin_comb_elt_act(accum, C, act):
    src = library.lin_comb_elt_act(act) if act != "identity" else library.linear_combination()
    got = ev(src, accum, C=C, alpha=0.75, beta=-1.25)["D"]
    want = TORCH_ACTIVATIONS[act](0.75 * accum - 1.25 * C)
    torch.testing.assert_close(got, want)


def test_activation_actually_applied(accum, C):
    relu = ev(library.lin_comb_elt_act("relu"), accum, C=C, alpha=1.0, beta=1.0)["D"]
    plain = ev(library.linear_combination(), accum, C=C, alpha=1.0, beta=1.0)["D"]
    assert (plain < 0).any() and (relu >= 0).all() and not torch.equal(relu, plain)


def test_leaky_relu_slope_is_a_parameter(accum, C):
    src = library.lin_comb_elt_act("leaky_relu", slope=0.2)
    assert "slope=0.2" in src
    got = ev(src, accum, C=C, alpha=1.0, beta=0.5)["D"]
    torch.testing.assert_close(got, tF.leaky_relu(accum + 0.5 * C, 0.2))
    with pytest.raises(EpilogueError, match="no parameter 'alpha'"):
        library.lin_comb_elt_act("leaky_relu", alpha=0.2)


@pytest.mark.parametrize("bounds", ["numbers", "tensors"])
def test_clamp(accum, C, bounds):
    lo, hi = (-1.0, 2.5) if bounds == "numbers" else (torch.tensor(-1.0), torch.tensor(2.5))
    for src in (library.lin_comb_clamp(), library.lin_comb_elt_act("clamp")):
        got = ev(src, accum, C=C, alpha=1.0, beta=1.0, lower_bound=lo, upper_bound=hi)["D"]
        want = torch.clamp(accum + C, -1.0, 2.5)
        torch.testing.assert_close(got, want)
        assert got.min() == -1.0 and got.max() == 2.5


def test_aux_returns_the_pre_activation(accum, C):
    src = library.lin_comb_elt_act("gelu", aux=True)
    res = ev(src, accum, C=C, alpha=1.0, beta=2.0, F=out())
    torch.testing.assert_close(res["F"], accum + 2.0 * C)
    torch.testing.assert_close(res["D"], tF.gelu(accum + 2.0 * C))
    with pytest.raises(EpilogueError, match="no activation"):
        library.lin_comb_args(out(), alpha=1.0, F=out())  # identity: nothing before it


def test_unknown_activation_is_a_clear_error():
    with pytest.raises(EpilogueError, match="unknown activation 'mish'.*relu"):
        library.lin_comb_elt_act("mish")
    with pytest.raises(EpilogueError, match="unknown activation 'sum'"):
        library.lin_comb_elt_act("sum")  # a reduction is not an activation


# ------------------------------------------------------------------ bias

@pytest.mark.parametrize("kind", ["per-row", "per-column", "per-column (1,N)", "per-batch row"])
def test_bias_shape_decides(accum, C, kind):
    if kind == "per-row":
        bias = randn(M, 1, seed=11)
        b3 = bias.view(1, M, 1)
    elif kind == "per-column":
        bias = randn(N, seed=12)
        b3 = bias.view(1, 1, N)
    elif kind == "per-column (1,N)":
        bias = randn(1, N, seed=13)
        b3 = bias.view(1, 1, N)
    else:
        bias = randn(L, M, 1, seed=14)
        b3 = bias
    src = library.lin_comb_bias_elt_act("relu")
    ea = EpilogueArguments(src, C=C, alpha=1.5, beta=0.25, bias=bias, D=out())
    spec = {o.name: o for o in ea.dag.operands}["bias"]
    expect_kind = OperandKind.PER_ROW if "row" in kind else OperandKind.PER_COL
    assert spec.kind is expect_kind
    got = evaluate(ea, accum)["D"]
    torch.testing.assert_close(got, torch.relu(1.5 * accum + 0.25 * C + b3))


def test_bias_without_activation_and_other_scales(accum):
    bias = randn(N, seed=3)
    got = ev(library.lin_comb_bias_elt_act(scale="only_alpha"), accum, alpha=2.0, bias=bias)["D"]
    torch.testing.assert_close(got, 2.0 * accum + bias)


def test_bias_with_aux(accum, C):
    bias = randn(M, 1, seed=4)
    res = ev(library.lin_comb_bias_elt_act("silu", aux=True), accum, C=C, alpha=1.0, beta=1.0,
             bias=bias, F=out())
    torch.testing.assert_close(res["F"], accum + C + bias)
    torch.testing.assert_close(res["D"], tF.silu(accum + C + bias))


# ------------------------------------------------------------------ per-channel

def test_per_channel_alpha_beta(accum, C):
    alpha, beta = randn(N, seed=21), randn(N, seed=22)
    got = ev(library.per_channel_scaling(), accum, C=C, alpha=alpha, beta=beta)["D"]
    torch.testing.assert_close(got, alpha * accum + beta * C)
    ea = library.per_channel_args(out(), alpha=alpha, C=C, beta=beta, activation="relu")
    torch.testing.assert_close(evaluate(ea, accum)["D"], torch.relu(alpha * accum + beta * C))
    alpha_rows = randn(M, 1, seed=23)
    ea = library.per_channel_args(out(), alpha=alpha_rows)
    torch.testing.assert_close(evaluate(ea, accum)["D"], alpha_rows * accum)


def test_per_channel_rejects_scalars():
    with pytest.raises(EpilogueError, match="per-channel alpha must be a vector"):
        library.per_channel_args(out(), alpha=2.0)
    with pytest.raises(EpilogueError, match="per-channel beta"):
        library.per_channel_args(out(), alpha=randn(N, seed=1), C=out(), beta=torch.tensor(1.0))


# ------------------------------------------------------------------ generic

def test_generic_with_an_op_name(accum, C):
    got = ev(library.lin_comb_generic("softplus"), accum, C=C, alpha=1.0, beta=-1.0)["D"]
    torch.testing.assert_close(got, tF.softplus(accum - C))


def test_generic_with_an_expression(accum, C):
    src = library.lin_comb_generic("x * x - 0.5 * tanh(x)")
    assert "D = F * F - 0.5 * tanh(F)" in src
    got = ev(src, accum, C=C, alpha=0.5, beta=0.5)["D"]
    x = 0.5 * accum + 0.5 * C
    torch.testing.assert_close(got, x * x - 0.5 * torch.tanh(x))
    got = ev(library.lin_comb_generic("x", "only_alpha"), accum, alpha=3.0)["D"]
    torch.testing.assert_close(got, 3.0 * accum)


def test_generic_expression_is_checked_never_run():
    with pytest.raises(EpilogueError, match="uses 'y'"):
        library.lin_comb_generic("x * y")
    with pytest.raises(EpilogueError, match="calls '__import__.*not an epilogue function"):
        library.lin_comb_generic("__import__('os').system('false') + x")
    with pytest.raises(EpilogueError, match="calls 'torch.exp'"):
        library.lin_comb_generic("torch.exp(x)")
    with pytest.raises(EpilogueError, match="not valid Python"):
        library.lin_comb_generic("x +")


# ------------------------------------------------------------------ FP8 recipe

def test_fp8_scaled_output_with_amax(accum):
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this torch has no float8_e4m3fn")
    sa, sb, sd = torch.tensor(0.5), torch.tensor(1.25), torch.tensor(4.0)
    D, amax = out(dtype=torch.float8_e4m3fn), out(1)
    res = evaluate(library.fp8_scaled_output_args(D, scale_a=sa, scale_b=sb, scale_d=sd,
                                                  amax=amax), accum)
    z = accum * 0.5 * 1.25
    assert res["D"].dtype == torch.float8_e4m3fn
    torch.testing.assert_close(res["D"].float(), (z * 4.0).to(torch.float8_e4m3fn).float())
    assert res["amax"].shape == (1,)
    torch.testing.assert_close(res["amax"], z.abs().max().reshape(1))
    assert D.isnan().all(), "evaluate never writes the output buffers"


def test_fp8_recipe_with_activation_bias_and_per_batch_amax(accum):
    bias = randn(M, 1, seed=31)
    src = library.fp8_scaled_output("relu", bias=True)
    res = ev(src, accum, scale_a=torch.tensor(2.0), scale_b=torch.tensor(0.5), bias=bias,
             scale_d=torch.tensor(0.25), amax=out(L, 1, 1))
    z = torch.relu(accum + bias)
    torch.testing.assert_close(res["D"], z * 0.25)
    torch.testing.assert_close(res["amax"], z.abs().amax(dim=(1, 2), keepdim=True))
    no_amax = library.fp8_scaled_output(amax=False)
    assert parse_epilogue(no_amax).outputs == ("D",)


# ------------------------------------------------------------------ factories

def test_lin_comb_args_picks_the_variant(accum, C):
    torch.testing.assert_close(evaluate(library.lin_comb_args(out(), alpha=2.0), accum)["D"],
                               2.0 * accum)
    torch.testing.assert_close(evaluate(library.lin_comb_args(out(), alpha=2.0, C=C), accum)["D"],
                               2.0 * accum + C)
    bias = randn(N, seed=9)
    ea = library.lin_comb_args(out(), alpha=1.0, C=C, beta=3.0, bias=bias, activation="sigmoid",
                               F=out())
    res = evaluate(ea, accum)
    torch.testing.assert_close(res["F"], accum + 3.0 * C + bias)
    torch.testing.assert_close(res["D"], torch.sigmoid(accum + 3.0 * C + bias))
    ea = library.lin_comb_args(out(), C=C, beta=1.0, activation="clamp", lower_bound=0.0,
                               upper_bound=1.0)
    torch.testing.assert_close(evaluate(ea, accum)["D"], torch.clamp(accum + C, 0.0, 1.0))
    with pytest.raises(EpilogueError, match="beta is given but C is not"):
        library.lin_comb_args(out(), beta=1.0)


def test_documented_error_when_an_operand_is_missing():
    with pytest.raises(EpilogueError) as exc:
        EpilogueArguments(library.linear_combination(), C=out(), alpha=1.0, D=out())
    assert str(exc.value) == ("Argument beta is not provided in the kwargs of the "
                              "EpilogueArguments constructor")


# ------------------------------------------------------------------ the C++ menu

def _values_for(source: str) -> dict:
    parsed = parse_epilogue(source)
    vals: dict = {}
    for p in parsed.params:
        vals[p] = {"C": randn(L, M, N, seed=41), "bias": randn(N, seed=42),
                   "lower_bound": -0.5, "upper_bound": 0.5}.get(
            p, torch.tensor(0.75) if p.startswith("scale") else 1.25)
    for o in parsed.outputs:
        vals[o] = out(1) if o == "amax" else out()
    return vals


@pytest.mark.parametrize("entry", library.CUTLASS_MENU, ids=lambda e: e.cutlass)
def test_every_menu_entry_parses_and_evaluates(entry, accum):
    source = entry.source()
    ast.parse(source)
    assert entry.call.startswith(entry.function + "(")
    res = evaluate(EpilogueArguments(source, **_values_for(source)), accum)
    assert res["D"].shape == (L, M, N) and torch.isfinite(res["D"]).all()


def test_menu_covers_the_issue_list():
    names = " ".join(e.cutlass for e in library.CUTLASS_MENU)
    for cpp in ["LinearCombination", "NoBetaScaling", "OnlyAlphaScaling", "LinearCombinationRelu",
                "LinearCombinationGELU", "GELU_taylor", "Sigmoid", "Silu", "Hardswish",
                "LeakyRelu", "Tanh", "Clamp", "LinearCombinationBiasElementwise", "PerRowBias",
                "PerColBias", "PerColLinCombPerColBiasEltAct", "LinearCombinationGeneric",
                "AmaxAux", "alpha_ptr", "alpha_ptr_array"]:
        assert cpp in names, cpp
    table = library.menu_table()
    assert table.count("\n") == len(library.CUTLASS_MENU) + 1
