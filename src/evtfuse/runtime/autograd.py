"""Gradients of the fused GEMM: the differentiable operator ``torch.ops.evtfuse.gemm_functional``.

Layer: runtime.torch, above ``runtime.grad_plan`` (the plans it runs: ``forward_of``,
``backward_inputs``) and ``runtime.run`` (the forward's kernel); the same ``torch.library``
namespace as ``runtime.torch_op``. Schema::

    evtfuse::gemm_functional(Tensor A, Tensor B, str epilogue, str layout, Tensor?[] tensors,
                             Scalar[]? scalars, Tensor[] outs) -> Tensor[]

The functional form of ``evtfuse::gemm``: it writes nothing it is given and returns new
outputs (one like each tensor of ``outs``, which only say an output's shape and dtype; then
the full outputs the layout's ``alloc`` names; then the hidden outputs its backward reads),
so that autograd is registered on it with ``torch.library.register_autograd``.
torch.compile sees one opaque operator in the forward and AOTAutograd traces the backward
formula below, which is plain Python around torch operators: no graph break. ``evtfuse.gemm``
calls it instead of ``evtfuse::gemm`` when an input requires grad (the layout's ``grad``
names them) and copies the outputs its caller gave into those tensors.

Forward: the epilogue, with the hidden outputs ``autodiff.plan_forward`` asks for (its DAG,
``ForwardPlan.augmented``, registered as the operator's epilogue: ``torch_op.register``),
through ``run.run_values``: one fused kernel. Backward: the backward epilogue's DAG
(``autodiff.backward``, registered too) through ``evtfuse::gemm`` over the same A and B, which
recomputes every forward value in registers, from the accumulator: in "recompute" mode
``A @ B`` again, in "save" mode the copy the forward stored (a hidden output; the layout's
``backward``, "auto" choosing by cost: ``grad_plan.backward_mode``). The forward keeps its inputs and
the hidden outputs, nothing else; a backward that reads no accumulator (every one in "save"
mode) runs with K = 0: no GEMM; one whose dAccum is the upstream gradient itself does not
copy it. Then dA = dAccum @ B^T and dB = A^T @ dAccum as torch matmuls.
"""

from __future__ import annotations

import torch

from .. import autodiff
from ..dag_epilogue import DagEpilogue
from ..ir import CONCATENATED, PAIR_PARTS, NodeKind, OperandKind, OutputKind
from . import eager_autograd, torch_op
from .grad_plan import (GRAD_DTYPES, Forward, allocate_results, backward_inputs,
                        forward_of)
from .grad_plan import (backward_mode, caller_reductions, dtype_name, hidden_shape,  # noqa: F401
                        problem_of, save_threshold, saved_accum_dtype, work_dtype)  # (re-exported)
from .run import run_values
from .torch_op import (BACKWARD_MODES, check_backward,  # noqa: F401  (re-exported)
                       Layout, _lib, parse_layout, scalars_arg, unwire, values_of, wire)

SCHEMA = ("gemm_functional(Tensor A, Tensor B, str epilogue, str layout, Tensor?[] tensors, "
          "Scalar[]? scalars, Tensor[] outs) -> Tensor[]")
_lib.define(SCHEMA)


def accumulator_gradient(results: dict, fwd: "Forward") -> torch.Tensor | None:
    """dAccum from a backward's results: as it is, or a gated epilogue's gradients of gate
    and up interleaved into the accumulator's 2N columns, or side by side for the
    concatenated layout (a half no gradient reached is zero); None when none reached it."""
    if not fwd.gated:
        return results.get(autodiff.ACCUM)
    gate, up = (results.get(autodiff.accum_target(p)) for p in PAIR_PARTS)
    if gate is None and up is None:
        return None
    gate = torch.zeros_like(up) if gate is None else gate
    up = torch.zeros_like(gate) if up is None else up
    if fwd.gated == CONCATENATED:
        return torch.cat((gate, up), dim=-1)
    return torch.stack((gate, up), dim=-1).flatten(-2)


def _impl(A, B, epilogue, layout, tensors, scalars, outs) -> list:
    fwd = forward_of(A, B, unwire(epilogue), layout, tensors, outs)
    results = allocate_results(fwd, A, B, outs)
    run_values(A, B, fwd.source, fwd.layout, values_of(fwd.layout, tensors, scalars, results))
    return results


def _fake(A, B, epilogue, layout, tensors, scalars, outs) -> list:
    """The results' shapes and dtypes; runs nothing (the plan is Python over shapes)."""
    torch._check(A.shape[-1] == B.shape[-2],
                 lambda: f"A @ B: A is {tuple(A.shape)} and B is {tuple(B.shape)}")
    fwd = forward_of(A, B, unwire(epilogue), layout, tensors, outs)
    return allocate_results(fwd, A, B, outs)


_lib.impl("gemm_functional", _impl, "CompositeExplicitAutograd")
torch.library.register_fake("evtfuse::gemm_functional", _fake, lib=_lib)


# ------------------------------------------------------------------ autograd


def _setup_context(ctx, inputs, output) -> None:
    A, B, epilogue, layout, tensors, scalars, outs = inputs
    remember(ctx, (A, B), A, B, epilogue, layout, tensors, scalars, outs, output)


def remember(ctx, first: tuple, A, B, epilogue: str, layout: str, tensors, scalars, outs,
             output, grouped: bool = False, groups=None) -> None:
    """Keep on ``ctx`` what the backward of a call needs: the tensors ``first`` (A, B and a
    grouped GEMM's offs), the operands and what the forward saved for it (``grouped``,
    ``groups``: as ``forward_of``'s)."""
    lay = parse_layout(layout)
    fwd = forward_of(A, B, unwire(epilogue), layout, tensors, outs, grouped, groups)
    position = fwd.position
    saved = [(s.name, output[position[s.name if s.hidden else s.of]]) for s in fwd.plan.saved]
    ctx.save_for_backward(*first, *tensors, *(t for _, t in saved))
    ctx.fwd, ctx.lay, ctx.scalars = fwd, lay, list(scalars or ())
    ctx.saved_names = [name for name, _ in saved]
    ctx.n_outs = len(outs)
    ctx.set_materialize_grads(False)


def _backward(ctx, grads):
    check_first_order()
    fwd: Forward = ctx.fwd
    lay: Layout = ctx.lay
    A, B, *rest = ctx.saved_tensors
    n = len(lay.tensors)
    tensors = dict(zip(lay.tensors, rest[:n]))
    saved = dict(zip(ctx.saved_names, rest[n:]))
    needs = ctx.needs_input_grad
    need_a, need_b, need_t = needs[0], needs[1], needs[4]
    no_scalars = None  # the scalars' place (None when there are none: scalars_arg)
    none = (None, None, None, None, [None] * n, no_scalars, [None] * ctx.n_outs)
    request = backward_inputs(fwd, lay, grads, tensors, saved, ctx.scalars, need_a or need_b,
                              need_t, A, B)
    if request is None:
        return none
    bplan, values = request
    results = run_backward(bplan, A, B, values, tensors, lay, fwd)
    dacc = accumulator_gradient(results, fwd)
    da = db = None
    if dacc is not None:
        if need_a:
            da = _sum_to(in_layout_of(A, lambda: torch.matmul(dacc, B.mT),
                                      lambda: torch.matmul(B, dacc.mT)), A)
        if need_b:
            db = _sum_to(in_layout_of(B, lambda: torch.matmul(A.mT, dacc),
                                      lambda: torch.matmul(dacc.mT, A)), B)
    return (da, db, None, None, operand_gradients(bplan, results, lay, need_t, tensors),
            no_scalars, [None] * ctx.n_outs)


def operand_gradients(bplan: autodiff.BackwardPlan, results: dict, lay: Layout, need_t,
                      tensors: dict) -> list:
    """Each tensor operand's gradient (None where not wanted or none reached it) from a
    backward kernel's results over a (batched) problem: summed over L for an operand shared
    by the batches, and the terms ``bplan.caller_sums`` names reduced to the operand's
    shape; in the operand's shape."""
    names, sums = dict(bplan.outputs), {n: (k, b) for n, k, b in bplan.caller_sums}
    tgrads = []
    for name, need in zip(lay.tensors, need_t):
        g = results.get(name) if need else None
        if g is not None and name in bplan.batch_summed:
            g = g.sum(0)
        if g is not None and names[name] in sums:
            g = _sum_term(g, *sums[names[name]], tensors[name])
        tgrads.append(None if g is None else g.reshape(tensors[name].shape))
    return tgrads


def _sum_term(term: torch.Tensor, kind: OutputKind, batched: bool,
              like: torch.Tensor) -> torch.Tensor:
    """A reduction (``kind``, over L too unless ``batched``) of its term, as the kernel
    would compute it, in the operand's shape and dtype."""
    t = term.reshape((1,) * (3 - term.dim()) + tuple(term.shape))
    dims = autodiff.reduced_dims(kind, batched)
    return (t.sum(dim=dims, keepdim=True) if dims else t).to(like.dtype).reshape(like.shape)


def check_first_order() -> None:
    if torch.is_grad_enabled():  # create_graph=True: this backward would itself be recorded
        raise NotImplementedError(
            "evtfuse computes first-order gradients only: a gradient of its backward "
            "(autograd.grad(..., create_graph=True), then a second backward) is not supported")


def in_layout_of(like: torch.Tensor, product, transposed) -> torch.Tensor:
    """``like``'s gradient ``product()`` in ``like``'s memory order: where ``like`` is
    column-major (a weight passed as ``weight.t()``), ``transposed()`` (the product's
    transpose, computed row-major) transposed back, as torch's own matmul backward does, so
    that the gradient of the weight itself is contiguous and AccumulateGrad copies nothing
    (a (14336, 4096) bf16 copy: 0.38 ms of a 5.1 ms MLP step on an H200)."""
    if like.dim() >= 2 and like.stride(-2) == 1 and like.stride(-1) != 1:
        return transposed().mT
    return product()


def _sum_to(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A batched product's gradient of a tensor shared by the batches: summed over L."""
    return t.sum(0) if t.dim() > like.dim() else t


def run_backward(bplan: autodiff.BackwardPlan, A, B, values: dict, tensors: dict,
                 lay: Layout, fwd: Forward, offs: torch.Tensor | None = None) -> dict:
    """The backward epilogue through ``evtfuse::gemm``: {accum or operand: its gradient}.
    A dAccum that is a full operand as it is (the upstream gradient of ``accum + bias``) is
    taken from it, not copied by the kernel; with nothing else to compute, no kernel runs.
    A grouped GEMM's (``offs``): through ``evtfuse::grouped_gemm``; over M, every result
    zeroed first (rows past offs[-1] are not written), the terms of ``bplan.caller_sums``
    (T, N) or (T, 1) in fp32; over K (``fwd.over_k``), the results are a batched problem's
    (G, M, N) (every one written: an empty group's accumulator is zero)."""
    grouped = offs is not None
    groups = offs.shape[0] if grouped and fwd.over_k else None
    call = _BackwardCall.of(fwd, bplan, lay, A.dtype)
    new = A.new_zeros if grouped and not fwd.over_k else A.new_empty
    full = fwd.full_shape(A, B, groups)
    outs, results = [], {}
    for target, how, arg in call.results:
        if how is _FROM_OPERAND:  # dAccum is this operand as it is
            results[target] = values[arg].to(call.grad_dtype)
            continue
        if how is _SCRATCH:  # written, read by the kernel's own computation, dropped
            outs.append(new(autodiff.output_shape(*arg, fwd.problem(A, B, groups)),
                            dtype=fwd.plan.work))
            continue
        if how is _ACCUM:
            t = new(full, dtype=call.grad_dtype)
        elif how is _TERM:  # arg: (batched, per row)
            lead = full[:-2] if arg[0] else ()
            t = new((*lead, full[-2], *((1,) if arg[1] else full[-1:])), dtype=fwd.plan.work)
        elif how is _PER_BATCH:
            t = new(fwd.problem(A, B, groups), dtype=tensors[target].dtype)
        else:  # the operand's own shape and dtype
            op = tensors[target]
            t = new(op.shape, dtype=op.dtype)
        outs.append(t)
        results[target] = t
    if not outs:
        return results
    tvals = [values[n] for n in call.tnames]
    svals = [values[n] for n in call.snames]
    a, b = A, B
    if not call.reads_accum:
        # nothing reads the accumulator (a linear layer's dAccum is the upstream gradient):
        # a GEMM over K = 0 runs the epilogue alone
        # (a gated forward's backward then reads saved halves: N wide, not in pairs)
        a = A.new_empty((*A.shape[:-1], 0))
        b = B.new_empty((*B.shape[:-2], 0, full[-1]))
    if grouped:
        torch_op.call_grouped(a, b, offs, call.source, call.layout, tvals, svals, outs)
    else:
        torch_op.call(a, b, call.source, call.layout, tvals, svals, outs)
    return results


# how ``run_backward`` makes each result (``_BackwardCall.results``)
_FROM_OPERAND, _ACCUM, _TERM, _PER_BATCH, _LIKE_OPERAND, _SCRATCH = "from operand", "accum", \
    "term", "per batch", "like operand", "scratch"


class _BackwardCall:
    """What ``run_backward`` reads of a backward plan, derived once per plan (kept on its
    ``Forward``, beside the plan in ``backwards``): how each result is made, the names of
    the operator's tensors and scalars in order, its layout string, and whether the kernel
    reads the accumulator (else it runs over K = 0). All of it follows from the plan and
    the forward's structure (its layout's options and names, A's dtype: ``forward_of``'s
    key); a call supplies only sizes and tensors (host time per backward). ``source``: the
    operator's epilogue, the plan's DAG registered (``torch_op.register``)."""

    __slots__ = ("plan", "results", "tnames", "snames", "layout", "reads_accum", "grad_dtype",
                 "source")

    @staticmethod
    def of(fwd: Forward, bplan: autodiff.BackwardPlan, lay: Layout,
           dtype: torch.dtype) -> "_BackwardCall":
        hit = fwd.backward_calls.get(id(bplan))
        if hit is None or hit.plan is not bplan:  # (the plan is held: ids are not reused)
            hit = fwd.backward_calls[id(bplan)] = _BackwardCall(fwd, bplan, lay, dtype)
        return hit

    def __init__(self, fwd: Forward, bplan: autodiff.BackwardPlan, lay: Layout,
                 dtype: torch.dtype):
        self.plan = bplan
        self.grad_dtype = dtype if dtype in GRAD_DTYPES else torch.float32
        terms = {name: (batched, kind is OutputKind.ROW) for name, kind, batched in
                 ((n, bplan.dag.output(n).kind, bplan.dag.output(n).batched)
                  for n, _, _ in bplan.caller_sums)}
        results, onames = [], []
        for target, name in bplan.outputs:
            if target in autodiff.ACCUM_TARGETS:
                node = bplan.dag.output(name).node
                if node.kind is NodeKind.LOAD and node.operand.kind is OperandKind.FULL:
                    results.append((target, _FROM_OPERAND, node.operand.name))
                    continue
                results.append((target, _ACCUM, None))
            elif name in terms:
                results.append((target, _TERM, terms[name]))
            elif target in bplan.batch_summed:
                results.append((target, _PER_BATCH, None))
            else:
                results.append((target, _LIKE_OPERAND, None))
            onames.append(name)
        for name in bplan.scratch:  # (BackwardPlan.scratch)
            o = bplan.dag.output(name)
            results.append((None, _SCRATCH, (o.kind, o.batched)))
            onames.append(name)
        self.results = tuple(results)
        # the operands' kinds by structure: the forward's scalars are numbers (the schema's
        # Scalar[]), every other operand of the backward is a tensor
        scalars = set(lay.scalars)
        names = [spec.name for spec in bplan.dag.operands]
        self.tnames = tuple(n for n in names if n not in scalars)
        self.snames = tuple(n for n in names if n in scalars)
        nones = () if "D" in onames else ("D",)
        where = f"the backward of {fwd.where}"
        self.source = torch_op.register(DagEpilogue(bplan.dag, where=where))
        self.layout = Layout(self.tnames, nones, self.snames, tuple(onames), 0, where, False,
                             lay.tune, lay.allow_tf32, lay.fp8_fast_accum, lay.cc).text()
        self.reads_accum = any(nd.kind is NodeKind.ACCUM for nd in bplan.dag.nodes)


torch.library.register_autograd("evtfuse::gemm_functional", _backward,
                                setup_context=_setup_context, lib=_lib)
_EAGER = eager_autograd.eager_function("gemm_functional", torch.ops.evtfuse.gemm_functional.default,
                                       2, _setup_context, _backward)


def call(A, B, source: str, layout: str, tensors: list, scalars: list, outs: list) -> list:
    """``evtfuse::gemm_functional``: through its eager autograd Function outside
    torch.compile (``runtime.eager_autograd``: the same operator and formula, without
    torch.library's per-call flattening), as it is under torch.compile."""
    if not torch.compiler.is_compiling():
        return eager_autograd.apply(_EAGER, (A, B), wire(source), layout, tensors,
                                    scalars_arg(scalars), outs)
    return torch.ops.evtfuse.gemm_functional.default(A, B, wire(source), layout, tensors,
                                                     scalars_arg(scalars), outs)


__all__ = ["SCHEMA", "BACKWARD_MODES", "Forward", "forward_of", "dtype_name", "call",
           "backward_mode", "check_backward", "save_threshold", "saved_accum_dtype",
           "work_dtype", "hidden_shape", "allocate_results", "accumulator_gradient",
           "backward_inputs", "caller_reductions", "check_first_order", "in_layout_of",
           "operand_gradients", "problem_of", "remember", "run_backward"]
