"""The gradient oracle of the autograd tests: torch.autograd through the reference evaluator.

``reference_grads`` evaluates an epilogue's DAG with ``evtfuse.reference`` in float64 on
tensors that require grad (A, B and the tensor operands; the accumulator is ``A @ B`` in
float64) and asks torch.autograd for the gradients of ``sum(out * grad_out)`` over the
graded outputs: every op's torch function differentiated by torch, never by evtfuse.
``autodiff_grads`` computes the same with evtfuse's backward DAG (``autodiff``) evaluated by
the reference evaluator (no kernel): the pass alone. Both fold the epilogue's constants in
fp32 first, as every kernel does (``passes.fold_constants``), so that the two see the same
literals (``sigmoid(0.5)`` in fp32 differs from float64's by 1.5e-8, which a steep softmax
made a 1e-6 difference in a gradient). Both return {name: gradient}, the
GEMM's A and B under ``GA`` and ``GB`` (an operand may be named A). Imported by ``test_autodiff.py``,
``test_autograd.py`` and ``test_fuzz_grads.py``.
"""

from __future__ import annotations

import torch

from evtfuse import autodiff, reference
from evtfuse.frontend import bind, parse_epilogue
from evtfuse.passes import fold_constants

F64 = torch.float64
GA, GB = "@A", "@B"  # the keys of A's and B's gradients


def problem_of(A: torch.Tensor, B: torch.Tensor) -> tuple[int, int, int]:
    la = A.shape[0] if A.dim() == 3 else 1
    lb = B.shape[0] if B.dim() == 3 else 1
    return max(la, lb), A.shape[-2], B.shape[-1]


def _f64(v):
    if isinstance(v, torch.Tensor) and v.dtype.is_floating_point:
        return v.detach().to(F64)
    return v


def reference_grads(source, A, B, values: dict, grad_out: dict, wrt) -> dict:
    """{name: gradient} for A, B and the operands in ``wrt``, by torch.autograd in float64.
    ``values``: operands and outputs (outputs: tensors for their shapes, or None)."""
    problem = problem_of(A, B)
    dag = fold_constants(bind(parse_epilogue(source), values, problem))
    leaves = {GA: _f64(A).requires_grad_(True), GB: _f64(B).requires_grad_(True)}
    ops = {}
    for k, v in values.items():
        ops[k] = _f64(v)
        if k in wrt:
            leaves[k] = ops[k] = ops[k].clone().requires_grad_(True)
    acc = torch.matmul(leaves[GA], leaves[GB])
    outs = reference.evaluate(dag, acc, ops, compute_dtype=F64, cast=False)
    loss = sum((outs[n].reshape(g.shape) * _f64(g)).sum() for n, g in grad_out.items())
    names = list(leaves)
    if not loss.requires_grad:  # only constants graded (``where(c, 0.5, 0.5)``): no gradient
        return {n: torch.zeros_like(t) for n, t in leaves.items()}
    got = torch.autograd.grad(loss, [leaves[n] for n in names], allow_unused=True)
    return {n: (torch.zeros_like(leaves[n]) if g is None else g) for n, g in zip(names, got)}


def autodiff_grads(source, A, B, values: dict, grad_out: dict, wrt, save=False) -> dict:
    """The same gradients through ``autodiff`` (the backward DAG, evaluated by the reference
    evaluator in float64) and two float64 matmuls; ``save``: "save" mode (the backward reads
    the accumulator the forward stored, here in float64)."""
    problem = problem_of(A, B)
    parsed = parse_epilogue(source)
    dag = fold_constants(bind(parsed, values, problem))
    plan = autodiff.plan_forward(dag, {autodiff.ACCUM, *wrt}, parsed,
                                 save_accum=F64 if save else None, batches=problem[0])
    acc = torch.matmul(_f64(A), _f64(B))
    ops = {k: _f64(v) for k, v in values.items()}
    hidden = {s.name: None for s in plan.saved if s.hidden}
    fwd = reference.evaluate(plan.augmented, acc, {**ops, **hidden}, compute_dtype=F64,
                             cast=False)
    saved = {}
    for s in plan.saved:
        t = fwd[s.name if s.hidden else s.of]
        saved[s.name] = t.reshape(autodiff.output_shape(s.kind, s.batched, problem))
    bplan = autodiff.backward(plan, grad_out, {autodiff.ACCUM, *wrt}, batches=problem[0])
    bvals = dict(ops)
    bvals.update({op: _f64(grad_out[o]) for o, op in bplan.grads})
    bvals.update({op: saved[s] for s, op in bplan.saved})
    if bplan.first_batch:
        bvals[bplan.first_batch] = autodiff.first_batch(problem[0], acc.device).to(F64)
    for inj in bplan.injected:
        bvals[inj.name] = autodiff.injected_gradient(inj, saved[inj.saved.name],
                                                     _f64(grad_out[inj.of]), problem)
    result = {}
    if bplan.empty:
        back = {}
    else:
        back = reference.evaluate(bplan.dag, acc, bvals, compute_dtype=F64, cast=False)
    outputs = dict(bplan.outputs)
    dacc = back.get(outputs.get(autodiff.ACCUM))
    if dacc is None:
        dacc = torch.zeros(problem, dtype=F64)
    dacc = dacc.expand(problem)
    result[GA] = _sum_to(torch.matmul(dacc, _f64(B).transpose(-1, -2)), A.shape)
    result[GB] = _sum_to(torch.matmul(_f64(A).transpose(-1, -2), dacc), B.shape)
    for name in wrt:
        out = outputs.get(name)
        v = values[name]
        if out is None:
            result[name] = torch.zeros(v.shape, dtype=F64)
            continue
        g = back[out]
        if name in bplan.batch_summed:
            g = g.reshape(problem).sum(0)
        result[name] = g.reshape(v.shape)
    return result


def _sum_to(t: torch.Tensor, shape) -> torch.Tensor:
    if t.dim() > len(shape):
        t = t.sum(0)
    return t


def assert_grads_close(got: dict, want: dict, rtol=1e-6, atol=1e-6, what=""):
    assert set(got) >= set(want), (sorted(got), sorted(want))
    for name, w in want.items():
        g = got[name]
        assert g.shape == w.shape, (what, name, g.shape, w.shape)
        torch.testing.assert_close(g.to(F64), w.to(F64), rtol=rtol, atol=atol, equal_nan=True,
                                   msg=lambda m, name=name: f"{what} d{name}: {m}")


# outputs storing a value once for many elements of (L, M, N): per-row (M, 1), per-column
# (N,) and scalar (1,) vectors of broadcast values, a full (M, N) output shared by batches
SHARED_OUTPUTS = """
def epi(accum, C, bias, rowv, s):
    D = accum * C
    V = rowv * 2.0 + s
    W = sigmoid(bias) * s
    S = s * 3.0
    E = C * bias
    return D, V, W, S, E
"""

# outputs of which a gradient may reach any subset (D, F) or none (G, passed as None)
SUBSET_OUTPUTS = """
def epi(accum, C, alpha):
    F = alpha * accum + C
    G = F * F
    D = relu(F)
    return D, F, G
"""


def shared_outputs_values(rand, M: int, N: int, lead: tuple) -> dict:
    """``SHARED_OUTPUTS``'s operands (``rand(*shape, seed=)``) and outputs; ``lead``: (L,)
    for a batched problem (only D is batched), else ()."""
    return dict(C=rand(M, N, seed=2), bias=rand(N, seed=3), rowv=rand(M, 1, seed=4),
                s=rand(seed=5), D=torch.empty(*lead, M, N), V=torch.empty(M, 1),
                W=torch.empty(N), S=torch.empty(1), E=torch.empty(M, N))
