"""A backward differentiates the forward that ran (issue 46, item 1): every decision the
backward takes on values computed from the accumulator (relu's sign, where's condition,
clamp's bounds, a maximum's side, abs's sign, a step function's value) is the forward's
own, read from what the forward stored, in both backward modes; "save" mode keeps the
accumulator in fp32 where its backward reads it beside a reduction the forward took in
fp32 (softmax's logsumexp).

The kernel tests build boundary values the interpreter shows: an fp16 accumulator saved in
fp16 moves ``accum + bias`` across zero where the forward's fp32 sum did not cross it."""

from __future__ import annotations

import pytest
import torch

import evtfuse
from evtfuse import autodiff
from evtfuse.frontend import bind, parse_epilogue
from evtfuse.ir import NodeKind
from evtfuse.optable import OPS

MODES = ["recompute", "save"]


def _boundary(rows=4, cols=4):
    """fp16 A, B whose fp32 accumulator is 1000.19995 everywhere (fp16 rounds it to 1000.0)
    and a bias of -1000.1: the forward's ``accum + bias`` is +0.09995, a rounded copy's is
    -0.1."""
    A = torch.tensor([[1000.0, 0.2]], dtype=torch.float16).repeat(rows, 1)
    B = torch.ones(2, cols, dtype=torch.float16)
    bias = torch.full((cols,), -1000.1, dtype=torch.float32)
    return A, B, bias


@pytest.mark.parametrize("mode", MODES)
def test_relu_mask_is_the_forwards_at_a_boundary(mode):
    """The issue's epilogue: dA was 0 in save mode (the backward's relu saw the fp16 copy
    of the accumulator below -bias) where the forward's relu passed it."""
    def epi(accum, bias):
        F = accum + bias
        D = relu(F) * 2.0  # noqa: F821
        return D, F

    A, B, bias = _boundary()
    A.requires_grad_(), B.requires_grad_()
    D, F = evtfuse.gemm(A, B, epi, bias=bias, backward=mode)
    assert bool((F > 0).all())  # the forward's decision: relu passes everything
    D.float().sum().backward()
    a64, b64 = A.detach().double().requires_grad_(), B.detach().double().requires_grad_()
    (torch.relu(a64 @ b64 + bias.double()) * 2.0).sum().backward()
    torch.testing.assert_close(A.grad.double(), a64.grad, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(B.grad.double(), b64.grad, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("body,torch_fn", [
    ("D = where(accum + bias > 0.0, accum, 0.5 * accum)",
     lambda x, b: torch.where(x + b > 0, x, 0.5 * x)),
    ("D = clamp(accum + bias, 0.0, 1.0)", lambda x, b: torch.clamp(x + b, 0.0, 1.0)),
    ("D = maximum(accum + bias, 0.0)", lambda x, b: torch.clamp_min(x + b, 0.0)),
    ("D = abs(accum + bias)", lambda x, b: torch.abs(x + b)),
    ("D = (accum + bias) * sign(accum + bias)", lambda x, b: (x + b) * torch.sign(x + b)),
    ("D = accum * floor(accum + bias)", lambda x, b: x * torch.floor(x + b)),
])
def test_every_kind_of_decision_at_a_boundary(mode, body, torch_fn):
    """Each decision taken as the forward took it (the float64 gradient at the fp32
    accumulator the forward used, not at its fp16 rounding, 0.1 away across a boundary)."""
    A, B, bias = _boundary()
    A.requires_grad_(), B.requires_grad_()
    D = evtfuse.gemm(A, B, f"def epi(accum, bias):\n    {body}\n    return D", bias=bias,
                     backward=mode)
    D.float().sum().backward()
    a64, b64 = A.detach().double().requires_grad_(), B.detach().double().requires_grad_()
    acc = (a64 @ b64).detach().float().double()  # the fp32 accumulator the forward had
    acc = acc + (a64 @ b64 - (a64 @ b64).detach())  # its value, with the gradient of A @ B
    torch_fn(acc, bias.double()).sum().backward()
    torch.testing.assert_close(A.grad.double(), a64.grad, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(B.grad.double(), b64.grad, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("mode", MODES)
def test_softmax_gradient_in_save_mode_as_accurate_as_recompute(mode):
    """Logits of about +-40 (fp16's ulp there is 1/32): a copy of the accumulator rounded
    to fp16 moved exp(x - lse) by up to 3%; save mode now keeps it in fp32."""
    g = torch.Generator().manual_seed(3)
    A = (torch.randn(8, 16, generator=g) * 2.3).to(torch.float16).requires_grad_()
    B = (torch.randn(16, 12, generator=g) * 2.3).to(torch.float16).requires_grad_()
    up = torch.randn(8, 12, generator=g)
    D = evtfuse.gemm(A, B, "def epi(accum):\n    D = softmax(accum)\n    return D",
                     D_dtype=torch.float32, backward=mode)
    (D * up).sum().backward()
    a64, b64 = A.detach().double().requires_grad_(), B.detach().double().requires_grad_()
    (torch.softmax(a64 @ b64, -1) * up.double()).sum().backward()
    scale = a64.grad.abs().max()
    assert (A.grad.double() - a64.grad).abs().max() <= 2e-3 * scale
    assert (B.grad.double() - b64.grad).abs().max() <= 2e-3 * b64.grad.abs().max()


M, N = 5, 6


def _plan(src, save=None, **extra):
    values = dict(bias=torch.randn(N), C=torch.randn(M, N), D=torch.empty(M, N), **extra)
    parsed = parse_epilogue(src)
    values = {k: v for k, v in values.items() if k in parsed.params or k in parsed.outputs}
    dag = bind(parsed, values, (1, M, N))
    return autodiff.plan_forward(dag, {"accum", "bias"} & set(parsed.params) | {"accum"},
                                 parsed, save_accum=save)


def _from_accum_decisions(bwd):
    """Comparisons and step functions in a backward DAG computed from its accumulator."""
    from_accum, found = {}, []
    for n in bwd.nodes:
        from_accum[id(n)] = n.kind is NodeKind.ACCUM or (
            n.kind is NodeKind.COMPUTE and any(from_accum[id(i)] for i in n.inputs))
        if from_accum[id(n)] and n.kind is NodeKind.COMPUTE and OPS[n.op].decides(n.param_dict):
            found.append(n)
    return found


DECIDING = [
    "D = relu(accum + bias)", "D = leaky_relu(accum, 0.1)", "D = hardswish(accum)",
    "D = softplus(accum)", "D = abs(accum) + C", "D = clamp(accum, -1.0, 1.0)",
    "D = maximum(accum, C)", "D = minimum(accum, bias)",
    "D = where(accum > C, accum, C)", "D = where((accum > 0.0) & (C < 1.0), accum, 0.0)",
    "D = accum * sign(accum)", "D = accum * floor(accum)", "D = accum * round(accum)",
    "D = accum * ceil(accum)",
]


@pytest.mark.parametrize("body", DECIDING)
@pytest.mark.parametrize("save", [None, torch.float16])
def test_no_backward_decides_on_a_recomputed_accumulator(body, save):
    """Over the op table's deciding rows: the backward reads every decision from the
    forward's hidden outputs (a uint8 mask per comparison, fp32 per step value) and
    evaluates none on the accumulator, in both modes."""
    plan = _plan(f"def epi(accum, bias, C):\n    {body}\n    return D", save)
    bwd = autodiff.backward(plan, ["D"], plan.wrt)
    assert bwd.unsaved_decisions == ()
    assert _from_accum_decisions(bwd.dag) == []
    kept = [s for s in plan.saved if s.role == "decision"]
    assert kept and all(s.dtype in (torch.uint8, torch.float32) for s in kept)
    assert {s.name for s in kept} <= {o.name for o in plan.augmented.outputs}


def test_a_relu_backward_reads_its_mask_not_the_accumulator():
    """relu(accum + bias): the backward needs the forward's mask alone, so save mode keeps
    no accumulator and neither mode runs a GEMM (K = 0)."""
    for save in (None, torch.float16):
        plan = _plan("def epi(accum, bias):\n    D = relu(accum + bias)\n    return D", save)
        assert [s.dtype for s in plan.saved] == [torch.uint8]
        bwd = autodiff.backward(plan, ["D"], plan.wrt)
        assert not any(n.kind is NodeKind.ACCUM for n in bwd.dag.nodes)


def test_save_mode_keeps_fp32_beside_a_forward_reduction():
    smooth = _plan("def epi(accum, bias):\n    D = silu(accum + bias)\n    return D",
                   torch.float16)
    assert [s.dtype for s in smooth.saved_accums] == [torch.float16]
    soft = _plan("def epi(accum):\n    D = softmax(accum)\n    return D", torch.float16)
    assert [s.dtype for s in soft.saved_accums] == [torch.float32]


def test_no_decision_without_an_accumulator_gradient_path():
    """A comparison of operands alone (no accumulator) is not saved: the backward reads
    the same operands the forward did."""
    plan = _plan("def epi(accum, bias, C):\n    D = accum * where(C > 0.0, C, bias)\n"
                 "    return D")
    assert not [s for s in plan.saved if s.role == "decision"]


@pytest.mark.parametrize("body,torch_fn", [
    ("D = clamp(C, -2.0, 2.0) + accum", lambda c, b: torch.clamp(c, -2.0, 2.0)),
    ("D = clamp(clamp(C, -2.0, 2.0), -2.0, 2.0) + accum",
     lambda c, b: torch.clamp(torch.clamp(c, -2.0, 2.0), -2.0, 2.0)),
    ("D = maximum(C, 0.0) + accum", lambda c, b: torch.maximum(c, torch.zeros(()))),
    ("D = maximum(C, bias) + accum", lambda c, b: torch.maximum(c, b)),
    ("D = minimum(bias, C) + accum", lambda c, b: torch.minimum(b, c)),
])
def test_ties_and_bounds_take_torchs_gradient(body, torch_fn):
    """At a tie of maximum or minimum each side gets half (torch.maximum's rule) and at a
    bound clamp passes the gradient (torch.clamp's), in the kernels and in evtfuse.ops (the
    reference evaluator: autograd of its where-based formulas gave a tie's whole gradient
    to one side, and made the gradient oracle disagree with torch at every tie)."""
    C = torch.tensor([[2.0, -2.0, 0.0, 1.0, 3.0, -0.5]] * 4)
    bias = torch.tensor([0.0, -2.0, 0.0, 1.0, 0.5, -0.5])
    A, B = torch.randn(4, 3), torch.randn(3, 6)
    c, b = C.clone().requires_grad_(), bias.clone().requires_grad_()
    evtfuse.gemm(A, B, f"def epi(accum, C, bias):\n    {body}\n    return D", C=c,
                 bias=b).sum().backward()
    tc, tb = C.clone().requires_grad_(), bias.clone().requires_grad_()
    torch_fn(tc, tb).sum().backward()
    torch.testing.assert_close(c.grad, tc.grad)
    torch.testing.assert_close(b.grad if b.grad is not None else torch.zeros(6),
                               tb.grad if tb.grad is not None else torch.zeros(6))
    from evtfuse import ops
    ec = C.clone().requires_grad_()
    ops.clamp(ec, torch.tensor(-2.0), torch.tensor(2.0)).sum().backward()
    torch.testing.assert_close(ec.grad, (C.abs() <= 2.0).float())


@pytest.mark.parametrize("mode", MODES)
def test_grouped_and_gated_decisions_at_a_boundary(mode):
    """The same boundary through a grouped GEMM over M (two groups) and a gated epilogue:
    their backward reads the forward's masks too."""
    A, B, bias = _boundary(rows=6)
    A.requires_grad_()
    Bg = B.unsqueeze(0).repeat(2, 1, 1).requires_grad_()
    offs = torch.tensor([2, 6], dtype=torch.int32)
    D = evtfuse.grouped_gemm(A, Bg, offs, "def epi(accum, bias):\n    D = relu(accum + bias)\n"
                             "    return D", bias=bias, backward=mode)
    D.float().sum().backward()
    assert torch.all(A.grad == 4.0), A.grad  # every relu passed (4 columns of ones)
    gated = "def epi(accum, bias):\n    gate, up = pairs(accum)\n    D = relu(gate + bias) * up\n" \
            "    return D"
    A2 = A.detach().clone().requires_grad_()
    B2 = torch.ones(2, 8, dtype=torch.float16).requires_grad_()
    evtfuse.gemm(A2, B2, gated, bias=bias, backward=mode).float().sum().backward()
    a64, b64 = A2.detach().double().requires_grad_(), B2.detach().double().requires_grad_()
    acc = (a64 @ b64).detach().float().double() + (a64 @ b64 - (a64 @ b64).detach())
    (torch.relu(acc[:, 0::2] + bias.double()) * acc[:, 1::2]).sum().backward()
    torch.testing.assert_close(A2.grad.double(), a64.grad, rtol=2e-3, atol=2e-3)


# the GPU gradient fuzz's example (seed 101 of session 37): a decision (the where) below a
# reduction feeding computation (the logsumexp), the reduction's result also returned
_BELOW_A_REDUCTION = (
    "def epi(accum, C):\n"
    "    t0 = where((accum > -0.25) & (accum < 0.25), accum * 2.0, 0.0)\n"
    "    t2 = hardswish(t0) - 3.0\n"
    "    q3 = logsumexp(t2)\n"
    "    D = exp(t2 - q3) * C\n"
    "    return D, q3")


@pytest.mark.parametrize("save", [None, torch.float16])
def test_a_backward_reads_a_reduction_above_a_kept_decision(save):
    """The backward reads both what the forward kept, the decision's mask and the
    logsumexp: before, reading the masks rebuilt the nodes above them, the logsumexp was
    computed again, and the backward's own sum of a value computed from it (the gradient
    arriving at the logsumexp) was a chain of reductions that its two passes broke on
    (IndexError in ``staging.split``)."""
    plan = _plan(_BELOW_A_REDUCTION, save, q3=torch.empty(1))
    assert plan.values and [s for s in plan.saved if s.role == "decision"]
    bwd = autodiff.backward(plan, ["D", "q3"], plan.wrt)
    assert not [n for n in bwd.dag.nodes if n.kind is NodeKind.REDUCE and n.op == "logsumexp"]
    assert {name for name, _ in bwd.saved} >= {name for _, name in plan.values}


@pytest.mark.parametrize("mode", MODES)
def test_gradients_through_a_reduction_above_a_decision_match_torch(mode):
    g = torch.Generator().manual_seed(3)
    A = (torch.randn(24, 16, generator=g) / 8).to(torch.bfloat16)
    B = (torch.randn(16, 20, generator=g) / 2).to(torch.bfloat16)
    C = torch.randn(24, 20, generator=g)
    Ag, Bg, Cg = (t.clone().requires_grad_(True) for t in (A, B, C))
    D, q3 = evtfuse.gemm(Ag, Bg, _BELOW_A_REDUCTION, C=Cg, q3=torch.empty(1), backward=mode)
    gD, gq = torch.randn(D.shape, generator=g), torch.randn(1, generator=g)
    ((D.float() * gD).sum() + (q3 * gq).sum()).backward()
    A64, B64, C64 = (t.double().requires_grad_(True) for t in (A, B, C))
    acc = A64 @ B64
    t0 = torch.where((acc > -0.25) & (acc < 0.25), acc * 2.0, torch.zeros(()).double())
    t2 = torch.nn.functional.hardswish(t0) - 3.0
    lse = torch.logsumexp(t2.reshape(-1), 0)
    ((torch.exp(t2 - lse) * C64 * gD).sum() + lse * gq[0]).backward()
    for got, want in ((Ag.grad, A64.grad), (Bg.grad, B64.grad), (Cg.grad, C64.grad)):
        torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2 * want.abs().max().item())


def _chain(feeds: bool):
    """x = accum; m = logsumexp(x) (whole); y = exp(x - m); s = sum(y) (whole, of a value
    computed from m); D = y / s where ``feeds``, else D = y and s returned."""
    from evtfuse import ir
    from evtfuse.ir import Dag, Output, OutputKind, Space

    x = ir.accum_node()
    m = ir.reduce_node("logsumexp", x, Space.SCALAR, False)
    y = ir.compute_node("exp", (ir.compute_node("sub", (x, m)),))
    s = ir.reduce_node("sum", y, Space.SCALAR, False)
    if feeds:
        outs = (Output("D", ir.compute_node("div", (y, s)), OutputKind.FULL, torch.float32),)
    else:
        outs = (Output("D", y, OutputKind.FULL, torch.float32),
                Output("s", s, OutputKind.SCALAR, torch.float32))
    return Dag(outs, (), "chain", False)


def test_two_passes_reduce_a_value_computed_from_a_reduction_in_the_second():
    """A reduction of a value computed from a reduction feeding computation, returned (the
    frontend refuses one in an epilogue; a backward could build one): an output of the
    second pass, which computes it from the first's workspace; before, the first pass took
    it and ``split`` failed on a second pass without outputs (IndexError) or handed the
    first pass a reduction feeding computation."""
    from evtfuse.reference import evaluate
    from evtfuse.staging import split

    dag = _chain(False)
    sp = split(dag)
    assert [o.name for o in sp.second.outputs] == ["D", "s"]
    assert [o.node.kind for o in sp.second.outputs] == [NodeKind.COMPUTE, NodeKind.REDUCE]
    assert not any(n.kind is NodeKind.REDUCE and sp.first.users[id(n)] for n in sp.first.nodes)
    acc = torch.randn(1, 6, 5)
    whole = evaluate(dag, acc, {}, cast=False)
    first = evaluate(sp.first, acc, {}, cast=False)
    ws = {sp.rename[0][o.name]: first[o.name] for o in sp.first.outputs}
    second = evaluate(sp.second, acc, ws, cast=False)
    for name in ("D", "s"):
        torch.testing.assert_close(second[name].reshape(-1), whole[name].reshape(-1))


def test_a_chain_of_reductions_feeding_computation_is_refused_by_name():
    from evtfuse.errors import EpilogueError
    from evtfuse.staging import split

    with pytest.raises(EpilogueError, match="three passes"):
        split(_chain(True))
