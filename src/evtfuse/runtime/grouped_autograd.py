"""Gradients of grouped GEMMs: the operator ``torch.ops.evtfuse.grouped_gemm_functional``.

Layer: runtime.torch, beside ``runtime.autograd``, whose forward plans, backward plans and
backward kernel call it shares (``grad_plan.forward_of(..., grouped=True)``); its grouped
GEMMs run below autograd (``calls.plain_grouped_gemm``). Schema::

    evtfuse::grouped_gemm_functional(Tensor A, Tensor B, Tensor offs, str epilogue, str layout,
                                     Tensor?[] tensors, Scalar[]? scalars, Tensor[] outs) -> Tensor[]

The functional form of ``evtfuse::grouped_gemm`` (A (T, K), B (G, K, N), offs (G,)), as
``gemm_functional`` is of ``evtfuse::gemm``. Forward: the epilogue with the hidden outputs
its backward reads (the accumulator, (T, N), in "save" mode), one grouped kernel. Backward:
the backward epilogue, derived with one batch (each row is in one group), runs as a grouped
kernel (K = 0 when it reads no accumulator) that writes dAccum (T, N) and reduces the
operand gradients that sum over rows or columns (a per-group bias (G, 1, N), routing
weights (T, 1), a per-group scale (G, 1, 1), a shared (N,) vector or scalar) in the same
kernel (``backends/triton/grouped_reduce``). A gated backward kernel ("recompute" mode
of a gated epilogue) computes no reductions yet: it stores each such gradient as its (T, N) fp32 term, summed
here by torch, per group with ``index_add`` over each row's group (found from offs on the
device: no host synchronisation; ``grad_plan.caller_reductions``, ``_sum_rows``). Then
dA = dAccum @ B_g^T (a grouped GEMM over M) and dB_g = A_g^T @ dAccum_g (a grouped GEMM
over K), both evtfuse calls. Rows at or past offs[-1] are in no group: their gradients are
zero, and no gradient flows from the outputs' rows there.

Over K (A (M, T), B (T, N), the result (G, M, N)): the problem is a batched one with the
group in the L place, so the forward plan and the backward epilogue are ``gemm``'s for a
batch of G (reductions fused, an operand shared by the groups summed over them); the
backward kernel is a grouped kernel over K (K = 0 when it reads no accumulator) writing
dAccum (G, M, N). Then dA[:, k_g] = dAccum_g @ B[k_g]^T, one grouped GEMM over M of B's
rows (``grouped_gemm(B, dAccum.mT, offs)``, transposed), and dB[k_g] = A[:, k_g]^T @
dAccum_g, another (``grouped_gemm(A.mT, dAccum, offs)``); each written into a zeroed
tensor in its input's memory order, so that A's columns and B's rows at or past offs[-1]
(in no group) get zero.
"""

from __future__ import annotations

import torch

from ..ir import OutputKind
from . import calls, eager_autograd
from .autograd import (accumulator_gradient, check_first_order, in_layout_of,
                       operand_gradients, remember, run_backward)
from .grad_plan import Forward, allocate_results, backward_inputs, forward_of
from .run import run_grouped_values
from .torch_op import Layout, _lib, scalars_arg, unwire, values_of, wire

SCHEMA = ("grouped_gemm_functional(Tensor A, Tensor B, Tensor offs, str epilogue, str layout, "
          "Tensor?[] tensors, Scalar[]? scalars, Tensor[] outs) -> Tensor[]")
_lib.define(SCHEMA)


def _grouping(B: torch.Tensor, offs: torch.Tensor) -> tuple:
    """``forward_of``'s (grouped, groups) for a grouped GEMM: over M (B (G, K, N)), or over
    K (B (T, N)), a batched problem of offs' G groups."""
    return (True, None) if B.dim() == 3 else (False, offs.shape[0])


def _impl(A, B, offs, epilogue, layout, tensors, scalars, outs) -> list:
    grouped, groups = _grouping(B, offs)
    fwd = forward_of(A, B, unwire(epilogue), layout, tensors, outs, grouped, groups)
    results = allocate_results(fwd, A, B, outs, groups)
    run_grouped_values(A, B, offs, fwd.source, fwd.layout,
                       values_of(fwd.layout, tensors, scalars, results))
    return results


def _fake(A, B, offs, epilogue, layout, tensors, scalars, outs) -> list:
    torch._check(A.shape[-1] == B.shape[-2],
                 lambda: f"A @ B: A is {tuple(A.shape)} and B is {tuple(B.shape)}")
    grouped, groups = _grouping(B, offs)
    fwd = forward_of(A, B, unwire(epilogue), layout, tensors, outs, grouped, groups)
    return allocate_results(fwd, A, B, outs, groups)


_lib.impl("grouped_gemm_functional", _impl, "CompositeExplicitAutograd")
torch.library.register_fake("evtfuse::grouped_gemm_functional", _fake, lib=_lib)


def _sum_rows(term: torch.Tensor, kind: OutputKind, batched: bool, offs: torch.Tensor,
              like: torch.Tensor) -> torch.Tensor:
    """A reduction of its term (T, N) or (T, 1) (rows past offs[-1] are zero), as the
    kernel would compute it: along each row (ROW), over the rows (COL) or both (SCALAR),
    the rows per group when ``batched``; in the operand's shape and dtype."""
    if kind is OutputKind.ROW:
        g = term.sum(-1, keepdim=True)
    else:
        per_col = term if kind is OutputKind.COL else term.sum(-1, keepdim=True)
        if batched:
            G = offs.shape[0]
            rows = torch.arange(term.shape[0], device=term.device, dtype=offs.dtype)
            group = torch.searchsorted(offs, rows, right=True).clamp_max(G - 1)
            g = per_col.new_zeros(G, per_col.shape[-1]).index_add_(0, group, per_col)
        else:
            g = per_col.sum(0)
    return g.to(like.dtype).reshape(like.shape)


def _backward(ctx, grads):
    check_first_order()
    fwd: Forward = ctx.fwd
    lay: Layout = ctx.lay
    A, B, offs, *rest = ctx.saved_tensors
    n = len(lay.tensors)
    tensors = dict(zip(lay.tensors, rest[:n]))
    saved = dict(zip(ctx.saved_names, rest[n:]))
    needs = ctx.needs_input_grad
    need_a, need_b, need_t = needs[0], needs[1], needs[5]
    no_scalars = None  # as runtime.autograd's
    none = (None,) * 5 + ([None] * n, no_scalars, [None] * ctx.n_outs)
    groups = offs.shape[0] if fwd.over_k else None
    request = backward_inputs(fwd, lay, grads, tensors, saved, ctx.scalars, need_a or need_b,
                              need_t, A, B, groups)
    if request is None:
        return none
    bplan, values = request
    results = run_backward(bplan, A, B, values, tensors, lay, fwd, offs)
    if fwd.over_k:
        da, db = _over_k_products(accumulator_gradient(results, fwd), A, B, offs, need_a,
                                  need_b, lay.tune)
        return (da, db, None, None, None,
                operand_gradients(bplan, results, lay, need_t, tensors), no_scalars,
                [None] * ctx.n_outs)
    names, sums = dict(bplan.outputs), {n: (k, b) for n, k, b in bplan.caller_sums}
    grouped_gemm = calls.plain_grouped_gemm  # below autograd
    dacc = accumulator_gradient(results, fwd)
    da = db = None
    if dacc is not None:
        if need_a:  # rows past offs[-1] stay zero
            da = grouped_gemm(dacc, B.mT, offs, tune=lay.tune, D=torch.zeros_like(A))
        if need_b:
            db = in_layout_of(B, lambda: grouped_gemm(A.mT, dacc, offs, tune=lay.tune),
                              lambda: grouped_gemm(dacc.mT, A, offs, tune=lay.tune))
    tgrads = []
    for name, need in zip(lay.tensors, need_t):
        g = results.get(name) if need else None
        if g is not None and names[name] in sums:
            g = _sum_rows(g, *sums[names[name]], offs, tensors[name])
        tgrads.append(None if g is None else g.reshape(tensors[name].shape))
    return da, db, None, None, None, tgrads, no_scalars, [None] * ctx.n_outs


def _over_k_products(dacc, A, B, offs, need_a: bool, need_b: bool, tune: str) -> tuple:
    """(dA, dB) of a grouped GEMM over K from dAccum (G, M, N): dA[:, k_g] = dAccum_g @
    B[k_g]^T and dB[k_g] = A[:, k_g]^T @ dAccum_g, each a grouped GEMM over M (of B's rows,
    of A's columns) written into zeros in its input's memory order (``zeros_like``: a
    weight's gradient needs no copy), so that the range at or past offs[-1] stays zero."""
    da = db = None
    if dacc is None:
        return da, db
    grouped_gemm = calls.plain_grouped_gemm  # below autograd
    if need_a:  # (T, M) rows grouped as B's, transposed into A's (M, T)
        da = grouped_gemm(B, dacc.mT, offs, tune=tune, D=torch.zeros_like(A).mT).mT
    if need_b:
        db = grouped_gemm(A.mT, dacc, offs, tune=tune, D=torch.zeros_like(B))
    return da, db


def _setup_context(ctx, inputs, output) -> None:
    A, B, offs, epilogue, layout, tensors, scalars, outs = inputs
    grouped, groups = _grouping(B, offs)
    remember(ctx, (A, B, offs), A, B, epilogue, layout, tensors, scalars, outs, output,
             grouped, groups)


torch.library.register_autograd("evtfuse::grouped_gemm_functional", _backward,
                                setup_context=_setup_context, lib=_lib)
_EAGER = eager_autograd.eager_function("grouped_gemm_functional",
                                       torch.ops.evtfuse.grouped_gemm_functional.default, 3,
                                       _setup_context, _backward)


def call(A, B, offs, source: str, layout: str, tensors: list, scalars: list, outs: list) -> list:
    """``evtfuse::grouped_gemm_functional``, as ``autograd.call`` calls its operator."""
    if not torch.compiler.is_compiling():
        return eager_autograd.apply(_EAGER, (A, B, offs), wire(source), layout, tensors,
                                    scalars_arg(scalars), outs)
    return torch.ops.evtfuse.grouped_gemm_functional.default(A, B, offs, wire(source), layout,
                                                             tensors, scalars_arg(scalars), outs)


__all__ = ["SCHEMA", "call"]
