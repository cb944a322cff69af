"""Random epilogues (``epilogue_fuzz.cases``: ops of the op table, operands of every kind,
full, unstored and reduced outputs, batches) differentiated, against torch.autograd of the
reference evaluator (``grad_oracle``).

Two tiers of the same check, each drawing the backward mode ("recompute" from ``accum``,
or "save": the backward reads the accumulator the forward stored). The backward pass alone (``autodiff``: the backward DAG
evaluated by the reference evaluator in float64, on the very accumulator the oracle uses, so
the two agree to rounding even at the kinks of relu or abs): many examples, tight
tolerances. The whole path (``evtfuse.gemm`` forward and backward kernels under Triton's
interpreter, fp32): fewer examples, fp32 tolerances. Examples come from fixed seeds
(``epilogue_fuzz.drawn``); ``EVTFUSE_FUZZ_EXAMPLES`` / ``EVTFUSE_FUZZ_SEED`` draw more.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

import evtfuse
from evtfuse.frontend import parse_epilogue

from epilogue_fuzz import CPU_SHAPES, cases, drawn, tensor_operands, tiers
from grad_oracle import GA, GB, assert_grads_close, autodiff_grads, reference_grads


def _upstream(args, seed: int) -> dict:
    """A random gradient for every output that can carry one (stored, floating point)."""
    g = torch.Generator().manual_seed(seed)
    values = args.epilogue.values
    out = {}
    for o in args.dag.outputs:
        t = values.get(o.name)
        if isinstance(t, torch.Tensor) and t.dtype.is_floating_point:
            out[o.name] = torch.randn(tuple(t.shape), generator=g).to(t.device, t.dtype)
    return out


def _subset(grads: dict, keep: int) -> dict:
    """Some of the outputs' gradients (``keep`` picks which; never none)."""
    names = sorted(grads)
    chosen = {n: grads[n] for k, n in enumerate(names) if keep >> k & 1}
    return chosen or {names[0]: grads[names[0]]}


def _backward_dag(case, shape, data_seed, keep, save):
    # float64 against the oracle, but literals are fp32 (as in every kernel) and the
    # passes fold constants in fp32: sigmoid(0.5) folded is 1.5e-8 off float64's, 6e-8 in
    # a gradient summed over a row (gradients here are O(1) to O(10)): 1e-6, far below
    # what a wrong derivative rule gives
    args = case.arguments(*shape, torch.float32, seed=data_seed)
    values = dict(args.epilogue.values)
    grads = _subset(_upstream(args, data_seed), keep)
    wrt = set(tensor_operands(args))
    want = reference_grads(case.source, args.A, args.B, values, grads, wrt)
    got = autodiff_grads(case.source, args.A, args.B, values, grads, wrt, save=save)
    assert_grads_close(got, want, rtol=1e-6, atol=1e-6,
                       what=f"{case.source}\n({'save' if save else 'recompute'})")


@tiers(quick=15, full=60)
def test_random_backward_dags_match_torch_autograd(examples):
    @drawn(examples, 11)
    @given(case=cases(differentiable=True), shape=st.sampled_from(CPU_SHAPES),
           data_seed=st.integers(0, 2 ** 16), keep=st.integers(1, 15), save=st.booleans())
    def run(case, shape, data_seed, keep, save):
        _backward_dag(case, shape, data_seed, keep, save)

    run()


@tiers(quick=10, full=40)
def test_random_backward_dags_through_reductions_feeding_computation(examples):
    """The same, with a per-row sum, mean or logsumexp feeding computation (an RMS norm, a
    softmax written with a logsumexp) drawn in: the backward reads the forward's result and
    sums over each row itself."""
    @drawn(examples, 13)
    @given(case=cases(differentiable=True, feeding=True), shape=st.sampled_from(CPU_SHAPES),
           data_seed=st.integers(0, 2 ** 16), keep=st.integers(1, 15), save=st.booleans())
    def run(case, shape, data_seed, keep, save):
        _backward_dag(case, shape, data_seed, keep, save)

    run()


def _train_through_kernels(examples: int, seed: int, drawn_cases) -> None:
    """``check_kernels`` (fp32, on the CPU, rtol 2e-3) over ``examples`` of ``drawn_cases``
    from ``seed`` (``epilogue_fuzz.drawn``), each in a drawn backward mode."""
    @drawn(examples, seed)
    @given(case=drawn_cases, shape=st.sampled_from(CPU_SHAPES[:3]),
           data_seed=st.integers(0, 2 ** 16), keep=st.integers(1, 15),
           mode=st.sampled_from(["recompute", "save"]))
    def run(case, shape, data_seed, keep, mode):
        check_kernels(case, shape, torch.float32, data_seed, keep, "cpu", rtol=2e-3, mode=mode)

    run()


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-interpreter tier")
@tiers(quick=2, full=6)
def test_random_epilogues_with_reductions_feeding_computation_train(examples):
    """evtfuse.gemm's gradients through reductions feeding computation (both kernels, fp32,
    one pass or two) against the oracle."""
    _train_through_kernels(examples, 14, cases(max_steps=2, differentiable=True, feeding=True))


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-interpreter tier")
@tiers(quick=3, full=30)
def test_random_epilogues_with_decisions_and_reductions_feeding_computation_train(examples):
    """The same with decisions on computed values drawn in too (``cases(deciding=True)``:
    where on a computed condition, relu, clamp, abs of computed values), as the GPU
    gradient fuzz draws them, through the kernels' two passes. (The GPU fuzz's one crash
    so far, a decision below a reduction feeding computation, came once in 464 examples:
    tests/test_decisions.py holds it; 120 examples here did not draw it.)"""
    _train_through_kernels(examples, 15, cases(differentiable=True, feeding=True,
                                               deciding=True))


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-interpreter tier")
@tiers(quick=3, full=14)
def test_random_epilogues_train_through_the_kernels(examples):
    """evtfuse.gemm's gradients (forward and backward kernels, fp32) against the oracle."""
    _train_through_kernels(examples, 12, cases(max_steps=2, differentiable=True))


def check_kernels(case, shape, dtype, data_seed, keep, device, rtol, mode="auto"):
    """``case`` through ``evtfuse.gemm`` on ``device`` with every input requiring grad,
    backpropagated from some of its outputs, in backward mode ``mode``; every gradient
    against the float64 oracle (tolerance ``rtol`` relative to the largest gradient of each
    input). Shared with the GPU tier (``gpu/test_gpu_autograd.py``)."""
    assume(not {"A", "B"} & set(dict(case.names).values()))  # gemm's own arguments
    args = case.arguments(*shape, dtype, device=device, seed=data_seed)
    values = dict(args.epilogue.values)
    grads = _subset(_upstream(args, data_seed), keep)
    wrt = set(tensor_operands(args))
    A = args.A.detach().requires_grad_(True)  # keeps the drawn layout (a transposed view)
    B = args.B.detach().requires_grad_(True)
    outputs = parse_epilogue(case.source).outputs
    call = {}
    for name, v in values.items():
        if name in wrt:
            call[name] = v.detach().clone().requires_grad_(True)
        elif name in outputs and isinstance(v, torch.Tensor):
            call[name] = torch.empty_like(v)  # a fresh output: written by a copy
        else:
            call[name] = v
    res = evtfuse.gemm(A, B, case.source, backward=mode, **call)
    res = res if isinstance(res, tuple) else (res,)
    loss = sum((r.float() * grads[n].float()).sum() for n, r in zip(outputs, res) if n in grads)
    loss.backward()
    got = {GA: A.grad, GB: B.grad, **{n: call[n].grad for n in wrt}}
    cpu = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in values.items()}
    want = reference_grads(case.source, args.A.cpu(), args.B.cpu(), cpu,
                           {n: g.cpu() for n, g in grads.items()}, wrt)
    for name, w in want.items():
        g = got[name]
        g = torch.zeros_like(w) if g is None else g.cpu()
        scale = float(w.abs().max()) if w.numel() else 0.0
        assert_grads_close({name: g}, {name: w}, rtol=rtol, atol=rtol * (1.0 + scale),
                           what=f"{case.source}\noutputs {case.outputs} graded {sorted(grads)} "
                                f"({mode})")
