"""Issue 46, round 3, inside PyTorch (CPU, Triton's interpreter, tiny sizes).

- ``linear_cross_entropy`` on special values (inf, -inf, NaN in hidden, weight or bias;
  logits of +-inf, NaN, inf - inf, overflow; ignored rows holding them; every row ignored)
  against ``torch.nn.functional.cross_entropy`` of ``hidden @ weight.T + bias`` in fp32, for
  every reduction and option (label smoothing, 1.0 included, softcap, z-loss): the loss,
  the lse and the gradients of hidden, weight and bias, NaN exactly where torch's are.
- ``torch.export.save`` / ``load`` of programs calling evtfuse (``evtfuse.nn.Linear``, a
  gemm with tensor operands only, int and float scalars, grouped_gemm), in this process and
  in a fresh one.
- float64: ``torch.autograd.gradcheck`` over every differentiable row of the op table (on
  the accumulator and on an operand; reductions as outputs; both backward modes), a
  forward computed in float64 (scalars, constants, reductions, two passes, casts,
  ``Kernel.verify``), ``evtfuse.nn.Linear(...).double()`` against ``torch.nn.Linear``.
"""

from __future__ import annotations

import math

import pytest
import torch

import evtfuse

from lce_reference import torch_lce
from tiers import quick

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


def _lce_both(inputs, with_bias=True, weigh=lambda loss, lse: loss.sum(), device="cpu",
              **options):
    """Ours and torch's: (loss, lse, gradients of hidden, weight, bias) of
    ``weigh(loss, lse)`` (on ``device``: the GPU tier's tests/gpu/test_gpu_round3.py)."""
    h, w, b, y = (t.to(device) for t in inputs)
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


@pytest.mark.parametrize("case", quick(SPECIAL_CASES, ["inf_minus_inf_logits"]))
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


@pytest.mark.parametrize("case", quick(["inf_hidden_target_logit_neg_inf", "row_of_neg_inf_logits",
                                        "nan_hidden", "inf_weight", "neg_inf_weight",
                                        "every_row_ignored"], ["row_of_neg_inf_logits"]))
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


@pytest.mark.slow
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


# ------------------------------------------------------------------ float64: gradcheck

F64 = torch.float64
GM, GK, GN = 3, 5, 4  # the gradchecks' M, K, N

# every differentiable row of the op table, as an expression of x and y (z), kept inside
# the row's domain and away from its kinks: "x" and "y" become the accumulator and C (the
# op on accum), or C and the bias (the op on an operand, its result times accum)
GRAD_FORMS: dict[str, str] = {
    "add": "{x} + {y}", "sub": "{x} - {y}", "mul": "{x} * {y}", "div": "{x} / ({y} * {y} + 0.5)",
    "neg": "-{x}", "pow": "({x} * {x} + 0.5) ** 2.5 + {x} ** 3",
    "lt": "where({x} < {y}, {x}, {y} * 2.0)", "le": "where({x} <= {y}, {x}, {y} * 2.0)",
    "gt": "where({x} > {y}, {x}, {y} * 2.0)", "ge": "where({x} >= {y}, {x}, {y} * 2.0)",
    "eq": "where({x} == {y}, {x}, {y} * 2.0)", "ne": "where({x} != {y}, {x}, {y} * 2.0)",
    "logical_and": "where(({x} > 0.0) & ({y} > 0.0), {x}, {y})",
    "logical_or": "where(({x} > 0.0) | ({y} > 0.0), {x}, {y})",
    "logical_not": "where(~({x} > 0.0), {x}, {y})",
    "identity": "identity({x})", "relu": "relu({x})", "leaky_relu": "leaky_relu({x}, slope=0.2)",
    "sigmoid": "sigmoid({x})", "log_sigmoid": "log_sigmoid({x})", "tanh": "tanh({x})",
    "gelu": "gelu({x})", "gelu_tanh": "gelu_tanh({x})", "silu": "silu({x})",
    "hardswish": "hardswish({x})", "softplus": "softplus({x})", "exp": "exp({x})",
    "log": "log({x} * {x} + 0.5)", "sqrt": "sqrt({x} * {x} + 0.5)",
    "rsqrt": "rsqrt({x} * {x} + 0.5)", "abs": "abs({x})", "log1p": "log1p({x} * {x})",
    "expm1": "expm1({x})", "floor": "floor({x}) + {x}", "ceil": "ceil({x}) + {x}",
    "round": "round({x}) + {x}", "sign": "sign({x}) + {x}", "sin": "sin({x})",
    "cos": "cos({x})", "tan": "tan({x} * 0.2)", "erf": "erf({x})",
    "maximum": "maximum({x}, {y})", "minimum": "minimum({x}, {y})",
    "clamp": "clamp({x}, {y} - 0.5, {y} + 0.5)", "multiply_add": "multiply_add({x}, {y}, {x})",
    "where": "where({x} > {y}, {x} * {y}, {y})",
    # rounding is straight-through (torch's .to()): checked with a wider step (CAST_EPS)
    "cast": 'cast({x}, "fp32")',
    # reductions feeding computation ({r}: the row's reduction of x, its own assignment);
    # also as outputs of every shape (REDUCED)
    "sum": "{x} * {r}", "max": "{x} - {r}", "min": "{x} - {r}", "logsumexp": "{x} - {r}",
    "mean": "{x} * {r}",
    "softmax": "softmax({x})", "log_softmax": "log_softmax({x})",
}
REDUCED = ("sum", "max", "min", "logsumexp", "mean")
# the reductions as outputs, each of one shape (a max or min is slow under the interpreter)
OUTPUT_SHAPES = {"sum": (1,), "max": (GM, 1), "min": (GN,), "logsumexp": (GM, 1), "mean": (GN,)}
CAST_EPS = 1e-3  # cast to fp32 moves by fp32 steps (6e-8 at 1.0): finite differences over 2e-3


def _grad_groups(size: int = 7) -> list[list[str]]:
    """The differentiable rows (but cast), a few per epilogue (one gradcheck each)."""
    from evtfuse.optable import OPS

    rows = [n for n, r in OPS.items() if r.differentiable and n != "cast"]
    return [rows[k:k + size] for k in range(0, len(rows), size)]


def test_every_differentiable_op_has_a_gradcheck_form():
    from evtfuse.optable import OPS

    assert {n for n, r in OPS.items() if r.differentiable} == set(GRAD_FORMS)


def _epilogue(ops: list[str], on_operand: bool) -> tuple[str, list]:
    """An epilogue with one output per op (and D), and the shaped output buffers it needs:
    none, every output is full (allocated by evtfuse.gemm)."""
    x, y = ("C", "bias") if on_operand else ("accum", "C")
    lines, outs = [], []
    for k, op in enumerate(ops):
        if op in REDUCED:
            lines.append(f"    r{k} = {op}({x})")
        expr = GRAD_FORMS[op].format(x=x, y=y, r=f"r{k}")
        if on_operand and op not in ("softmax", "log_softmax"):
            expr = f"accum * ({expr})"
        if on_operand and op in ("softmax", "log_softmax"):
            expr = GRAD_FORMS[op].format(x="accum * C")
        lines.append(f"    o{k} = {expr}")
        outs.append(f"o{k}")
    lines.append("    D = accum * s + bias")  # the scalar and the bias in every epilogue
    outs.append("D")
    src = "def e(accum, C, bias, s):\n" + "\n".join(lines) + f"\n    return {', '.join(outs)}\n"
    return src, []


def _gradcheck(src: str, shaped: list, eps: float = 1e-6, mode: str = "auto",
               batched: bool = False, device: str = "cpu", tune: str = "fast") -> None:
    """``batched``: A and C of two batches (B shared by them). The forward of an epilogue whose
    reductions feed computation keeps them for its backward as outputs, of (M, 1) at L = 1,
    which the kernels then run in two passes: under the interpreter a max costs as much as
    its elements (a combine call each), and the second pass's tiles are larger. C has
    batches of its own: a gradient through a reduction of an operand the batches share,
    feeding computation at L > 1, is refused (tests/test_shared_reductions.py)."""
    g = torch.Generator().manual_seed(7)
    lead = (2,) if batched else ()
    A = torch.randn(*lead, GM, GK, dtype=F64, generator=g)
    B = torch.randn(GK, GN, dtype=F64, generator=g)
    C = torch.randn(*lead, GM, GN, dtype=F64, generator=g)
    bias, s = torch.randn(GN, dtype=F64, generator=g), torch.tensor(0.7, dtype=F64)
    leaves = [t.to(device).requires_grad_(True) for t in (A, B, C, bias, s)]

    def f(A, B, C, bias, s):
        outs = {n: torch.empty(shape, dtype=F64, device=device) for n, shape in shaped}
        return evtfuse.gemm(A, B, src, C=C, bias=bias, s=s, backward=mode, tune=tune, **outs)

    assert torch.autograd.gradcheck(f, tuple(leaves), eps=eps, fast_mode=True), src


@pytest.mark.slow  # the quick tier: test_gradcheck_cast_in_float64, tests/test_autograd.py
@pytest.mark.parametrize("on_operand", [False, True], ids=["on_accum", "on_operand"])
@pytest.mark.parametrize("group", range(len(_grad_groups())))
def test_gradcheck_every_op_in_float64(group, on_operand):
    """torch.autograd.gradcheck (float64, fast mode) of evtfuse.gemm with respect to A, B, a
    full operand C, a bias and a 0-d device scalar, a group of op-table rows per epilogue,
    each applied to the accumulator or to an operand (times the accumulator); a group
    with reductions over batches of A. K = 5: the backward recomputes the accumulator."""
    ops = _grad_groups()[group]
    rowwise = any(op in REDUCED or op in ("softmax", "log_softmax") for op in ops)
    _gradcheck(*_epilogue(ops, on_operand), batched=rowwise)


@pytest.mark.slow
def test_gradcheck_reductions_as_outputs_and_saved_accumulator_in_float64():
    """Every reduction row also as an output (per row, per column, whole: OUTPUT_SHAPES),
    reducing over two batches; the backward reading the forward's saved accumulator."""
    lines = ["def e(accum, C, bias, s):", "    x = accum * s + C"]
    lines += [f"    {op}_x = {op}(x)" for op in REDUCED]
    lines += ["    D = accum * s + bias", f"    return D, {', '.join(op + '_x' for op in REDUCED)}"]
    _gradcheck("\n".join(lines) + "\n", [(op + "_x", OUTPUT_SHAPES[op]) for op in REDUCED],
               mode="save", batched=True)
    _gradcheck(*_epilogue(_grad_groups()[3], False), mode="save")


def test_gradcheck_cast_in_float64():
    _gradcheck(*_epilogue(["cast", "gelu"], False), eps=CAST_EPS)


# ------------------------------------------------------------------ float64: forward, modules


@pytest.mark.slow  # the quick tier: test_nn_linear_in_float64_matches_torch
def test_float64_forward_is_computed_in_float64():
    """float64 A and B: accumulated and computed in float64, every kind of value (a runtime
    scalar that fp32 would round, constants folded, reductions of every shape, a softmax in
    one pass and in two (N past one tile), casts through fp32 as torch's), within a few
    ulps of torch in float64; Kernel.verify with float64's tolerances; the TMA families
    say why they refuse."""
    from evtfuse import EpilogueArguments, GemmArguments, explain, get_kernels

    g = torch.Generator().manual_seed(3)
    for N in (6, 70):
        A = torch.randn(2, 4, 9, dtype=F64, generator=g)
        B = torch.randn(9, N, dtype=F64, generator=g)
        C = torch.randn(4, N, dtype=F64, generator=g)
        src = ("def e(accum, C, alpha):\n    x = alpha * accum + C * (1.0 / 3.0)\n"
               "    rs = sum(x)\n    cm = max(x)\n    tot = logsumexp(x)\n"
               "    D = softmax(x) + tanh(x) * erf(x) + cast(x, \"bf16\") + cast(x, \"fp32\")\n"
               "    return D, rs, cm, tot")
        outs = dict(rs=torch.empty(2, 4, 1, dtype=F64), cm=torch.empty(N, dtype=F64),
                    tot=torch.empty(1, dtype=F64))
        D, rs, cm, tot = evtfuse.gemm(A, B, src, C=C, alpha=0.1, **outs)
        x = 0.1 * (A @ B) + C * (1.0 / 3.0)
        want = (torch.softmax(x, -1) + torch.tanh(x) * torch.erf(x)
                + x.to(torch.bfloat16).double() + x.float().double())
        close = dict(rtol=1e-13, atol=1e-13)
        assert D.dtype == F64
        torch.testing.assert_close(D, want, **close)
        torch.testing.assert_close(rs, x.sum(-1, keepdim=True), **close)
        torch.testing.assert_close(cm, x.amax((0, 1)), **close)
        torch.testing.assert_close(tot, torch.logsumexp(x.reshape(-1), 0).reshape(1), **close)
        epi = EpilogueArguments(src, C=C, alpha=0.1, D=torch.empty(2, 4, N, dtype=F64), **outs)
        args = GemmArguments(A, B, epi.values["D"], F64, epi)
        result = get_kernels(args)[0].verify(args)
        assert result, result.report()
        assert "tol 1.0e-10" in result.report()
    text = explain(GemmArguments(A, B, epi.values["D"], F64, epi), cc=90)
    assert "hopper: refused: float64 inputs run in the portable family" in text


def test_nn_linear_in_float64_matches_torch():
    """evtfuse.nn.Linear(...).double() as torch.nn.Linear in float64: the output and the
    gradients of x, weight and bias to float64's precision; gradcheck of the module."""
    torch.manual_seed(0)
    ref = torch.nn.Linear(5, 4).double()
    lin = evtfuse.nn.Linear(5, 4, epilogue=evtfuse.nn.with_activation("gelu")).double()
    lin.load_state_dict(ref.state_dict())
    assert lin.weight.dtype == F64
    x = torch.randn(2, 3, 5, dtype=F64, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    y, want = lin(x), torch.nn.functional.gelu(ref(x2))
    assert y.dtype == F64
    torch.testing.assert_close(y, want, rtol=1e-13, atol=1e-13)
    g = torch.randn(y.shape, dtype=F64)
    (y * g).sum().backward()
    (want * g).sum().backward()
    for got, exp in ((x.grad, x2.grad), (lin.weight.grad, ref.weight.grad),
                     (lin.bias.grad, ref.bias.grad)):
        torch.testing.assert_close(got, exp, rtol=1e-12, atol=1e-12)
    plain = evtfuse.nn.Linear(5, 4).double()
    assert torch.autograd.gradcheck(lambda x, w, b: torch.func.functional_call(
        plain, {"weight": w, "bias": b}, (x,)), (x.detach().requires_grad_(True),
                                                 plain.weight.detach().clone().requires_grad_(True),
                                                 plain.bias.detach().clone().requires_grad_(True)))


_F64_OFFLINE = """
import json, sys, torch
sys.path.insert(0, "tests")
from test_round3_torch import _epilogue
from evtfuse import EpilogueArguments, GemmArguments
from evtfuse.runtime.offline import compile_for, offered
F64, M, K, N = torch.float64, 300, 64, 520
unary = ["sigmoid", "tanh", "gelu", "softplus", "log1p", "tan", "erf", "pow"]
src, _ = _epilogue(unary, False)
A, B, C = torch.empty(M, K, dtype=F64), torch.empty(K, N, dtype=F64), torch.empty(M, N, dtype=F64)
outs = {f"o{k}": torch.empty(M, N, dtype=F64) for k in range(len(unary))}
D = torch.empty(M, N, dtype=F64)
args = GemmArguments(A, B, D, F64, EpilogueArguments(src, D=D, C=C, bias=C[0],
                     s=torch.tensor(0.7, dtype=F64), **outs))
out = []
for fam, cfg in offered(args):
    c = compile_for(fam, cfg, args)
    out.append({"family": fam.name, "per_thread": cfg.block_m * cfg.block_n // (32 * cfg.num_warps),
                "registers": c.registers})
print("RESULT" + json.dumps(out))
"""


@pytest.mark.slow
def test_float64_tiles_keep_few_elements_a_thread_and_compile_for_sm90():
    """float64 kernels (the portable family's CUDA-core dots) offered on an sm_90 GPU hold
    at most eight accumulator elements a thread (ptxas time grows with them: a gradcheck
    on the GPU compiles about 18 float64 kernels) and compile, transcendental epilogue
    included."""
    from offline_run import run_offline

    got = run_offline(_F64_OFFLINE, timeout=900)
    assert got and all(c["family"] == "portable" for c in got), got
    assert all(c["per_thread"] <= 8 and c["registers"] > 0 for c in got), got
