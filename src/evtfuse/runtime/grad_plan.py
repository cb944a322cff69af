"""The plans of the differentiable operators (``runtime.autograd``,
``runtime.grouped_autograd``): which backward mode a call takes, the forward a call
structure runs with what its backward keeps (``Forward``, ``forward_of``), and the backward
plan for the gradients a backward receives (``backward_inputs``).

Layer: runtime.torch, below ``runtime.autograd``, which runs them; plain Python over
shapes, dtypes and DAGs (``autodiff``): it runs no kernel. "auto" for ``backward`` saves the
accumulator when recomputing it costs more than storing and reading it (``backward_mode``).

Plans are built once per call *structure*: the epilogue, the layout, the dtypes, and which
dims of (L, M, N) each tensor spans (a pattern, never the sizes themselves: symbolic sizes
under torch.compile are not specialised). The plan binds the epilogue to placeholder
sizes; a call whose shapes do not broadcast is bound to its own tensors first, which
raises the frontend's message.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import autodiff, ir
from ..dag_epilogue import DagEpilogue
from ..errors import EpilogueError
from ..frontend import ParsedEpilogue
from ..ir import NodeKind, Output, OutputKind, Space
from . import torch_op
from .torch_op import Layout, check_backward, parse_layout, parsed_of, values_of


_PLACE = (2, 3, 5)  # placeholder L, M, N (where the real one is neither 0 nor 1)


GRAD_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


# "auto": save the accumulator when recomputing it costs more than storing and reading it.
# Recomputing is a GEMM of 2*M*N*K flops at the tensor cores' peak P; saving writes M*N
# elements of e bytes in the forward and reads them in the backward, 2*M*N*e bytes at the
# memory bandwidth W. Save when 2*M*N*K / P >= 2*M*N*e / W, i.e. K >= e * (P / W). P / W
# (flops per byte) by the inputs' dtype, from an H100 SXM / H200: dense bf16 990e12 flop/s
# over 3.35e12 / 4.8e12 B/s is 295 / 206: 256 between them; TF32 half that; fp32 without
# TF32 (no tensor cores, ~67e12 flop/s) 16; fp8 / int8 twice bf16. e: the saved copy's
# size (16-bit inputs keep A's dtype, as torch eager keeps its bf16 pre-activation; others
# fp32). The crossovers: K >= 512 for fp16 / bf16 and TF32, 64 for fp32, 2048 for fp8.
_FLOP_PER_BYTE_16BIT = 256


def saved_accum_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the forward stores the accumulator in, in "save" mode (float64 inputs: their
    float64 accumulator)."""
    return dtype if dtype in (torch.float16, torch.bfloat16, torch.float64) else torch.float32


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """What the forward keeps for its backward and the backward computes in: float64 for
    float64 inputs (their kernels compute in float64), else fp32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def save_threshold(dtype: torch.dtype, allow_tf32: bool = False) -> int:
    """The least K for which "auto" saves the accumulator (see the rule above)."""
    if dtype in (torch.float16, torch.bfloat16):
        ratio = _FLOP_PER_BYTE_16BIT
    elif dtype.is_floating_point and dtype.itemsize == 1 or dtype == torch.int8:
        ratio = 2 * _FLOP_PER_BYTE_16BIT
    elif dtype == torch.float32 and allow_tf32:
        ratio = _FLOP_PER_BYTE_16BIT // 2
    else:
        ratio = _FLOP_PER_BYTE_16BIT // 16
    return saved_accum_dtype(dtype).itemsize * ratio


def backward_mode(choice: str, K, dtype: torch.dtype, allow_tf32: bool = False) -> str:
    """"save" or "recompute" for the ``backward`` option ``choice``: "auto" compares K with
    ``save_threshold``. A symbolic K (torch.compile, ``dynamic=True``) is compared too: a
    guard ``K >= threshold`` on the compiled graph, no graph break (a K that crosses it
    recompiles, and the other mode's graph has its own outputs)."""
    check_backward(choice)
    if choice != "auto":
        return choice
    return "save" if K >= save_threshold(dtype, allow_tf32) else "recompute"


def dtype_name(dtype: torch.dtype) -> str:
    """``float32`` for torch.float32: how the layout's ``alloc`` writes a dtype."""
    return str(dtype).removeprefix("torch.")


def problem_of(A: torch.Tensor, B: torch.Tensor, grouped: bool = False,
               gated: bool = False, groups=None) -> tuple:
    """(L, M, N) of the epilogue over A @ B; of a grouped GEMM over M (A (T, K), B
    (G, K, N)), (G, T, N); of one over K (A (M, T), B (T, N), ``groups`` = G: a batched
    problem), (G, M, N); ``gated`` (``pairs(accum)``): N is half of B's columns."""
    N = B.shape[-1] // 2 if gated else B.shape[-1]
    if grouped:
        return B.shape[0], A.shape[0], N
    if groups is not None:
        return groups, A.shape[-2], N
    la = A.shape[0] if A.dim() == 3 else 1
    lb = B.shape[0] if B.dim() == 3 else 1
    return (la if lb == 1 else lb), A.shape[-2], N


def full_shape(A: torch.Tensor, B: torch.Tensor, grouped: bool = False,
                gated: bool = False, groups=None) -> tuple:
    """The shape ``evtfuse.gemm`` gives a full output: (M, N), or (L, M, N) when batched;
    a grouped GEMM's: (T, N) over M, (G, M, N) over K (``groups`` = G)."""
    L, M, N = problem_of(A, B, grouped, gated, groups)
    batched = A.dim() == 3 or B.dim() == 3 or groups is not None
    return (L, M, N) if batched and not grouped else (M, N)


def hidden_shape(s: autodiff.Saved, problem: tuple, grouped: bool) -> tuple:
    """The shape of a hidden output the forward stores for its backward (a grouped GEMM's
    rows are (T, ...) whatever their group)."""
    if grouped:
        return (problem[1], 1 if s.kind is OutputKind.ROW else problem[2])
    return autodiff.output_shape(s.kind, s.batched, problem)


def _pattern(shape, problem) -> tuple | None:
    """Which of (L, M, N) each dim of ``shape`` spans, right-aligned ("=" or "1"); None when
    a dim is neither (the frontend's error to give)."""
    if len(shape) > 3:
        return None
    codes = []
    for size, full in zip(shape, problem[3 - len(shape):]):
        if size == full:
            codes.append("=")
        elif size == 1:
            codes.append("1")
        else:
            return None
    return tuple(codes)


def _placeholder(pattern: tuple, place: tuple) -> tuple:
    return tuple(p if c == "=" else 1 for c, p in zip(pattern, place[3 - len(pattern):]))


@dataclass(frozen=True)
class Forward:
    """A call structure's differentiable forward: what it runs and what its backward needs."""

    parsed: ParsedEpilogue | DagEpilogue
    plan: autodiff.ForwardPlan
    source: str  # the epilogue the forward runs (the user's, or with the hidden outputs)
    layout: Layout  # for evtfuse::gemm over the returned outputs, in order
    alloc: tuple[tuple[str, torch.dtype], ...]
    hidden: tuple[autodiff.Saved, ...]
    batches: int  # 1, or 2 for any L > 1 (1 for a grouped GEMM: each row in one group)
    where: str
    grouped: bool  # a grouped GEMM over M (``grouped_autograd``)
    gated: bool | str  # the accumulator in pairs (their layout, ``Dag.gated``): N is half B's
    over_k: bool = False  # a grouped GEMM over K: a batched problem, L the group count
    # backward plans by (outputs graded, A and B wanted, operands wanted), and what
    # ``run_backward`` derives from each (``_BackwardCall``, by the plan's id)
    backwards: dict = field(default_factory=dict, compare=False, hash=False)
    backward_calls: dict = field(default_factory=dict, compare=False, hash=False)

    @functools.cached_property
    def position(self) -> dict[str, int]:
        """Each returned output's position in the operator's results."""
        return {name: k for k, name in enumerate(self.layout.outs)}

    @property
    def output_names(self) -> tuple[str, ...]:
        return self.layout.outs

    def problem(self, A: torch.Tensor, B: torch.Tensor, groups=None) -> tuple:
        """(L, M, N) of a call of this forward (``groups``: G of a grouped GEMM over K)."""
        return problem_of(A, B, self.grouped, self.gated, groups if self.over_k else None)

    def full_shape(self, A: torch.Tensor, B: torch.Tensor, groups=None) -> tuple:
        """The shape of a full output of a call of this forward."""
        return full_shape(A, B, self.grouped, self.gated, groups if self.over_k else None)


_forwards: dict[tuple, Forward] = {}


def forward_of(A, B, source: str, layout: str, tensors: list, outs: list,
               grouped: bool = False, groups=None) -> Forward:
    """The ``Forward`` of a call (built once per structure) of the operator's ``layout``
    string; ``grouped``: a grouped GEMM over M (``evtfuse.grouped_gemm``, A (T, K), B (G,
    K, N)); ``groups``: G of a grouped GEMM over K (A (M, T), B (T, N)), which is a batched
    problem (G, M, N) (the frontend binds it as one, each group in the L place)."""
    lay = parse_layout(layout)
    parsed = parsed_of(source, lay)
    problem = problem_of(A, B, grouped, parsed.gated, groups)
    every = (*tensors, *outs)
    pats = tuple([_pattern(t.shape, problem) for t in every])
    if parsed.sized:  # its DAG holds a count of reduced elements (mean): bound as is
        place = tuple(int(d) for d in problem)
    else:
        place = tuple([int(d) if (d == 0 or d == 1) else p for d, p in zip(problem, _PLACE)])
    mode = backward_mode(lay.backward, A.shape[-1], A.dtype, lay.allow_tf32)
    # the layout string says every name and option ``lay`` holds (the two strings' hashes
    # are kept by Python: a call of a structure seen before hashes no field of ``lay``)
    key = (source, layout, mode, pats, tuple([t.dtype for t in every]), place, A.dtype,
           B.dtype, A.dim(), B.dim(), grouped, groups is not None)
    hit = _forwards.get(key)
    if hit is not None:
        return hit
    if any(p is None for p in pats):  # the frontend names the tensor that does not fit
        values = values_of(lay, tensors, [1.0] * len(lay.scalars), outs)
        values.update({a.split(":")[0]: None for a in lay.alloc})
        parsed.bind(values, tuple(int(d) for d in problem), grouped)
        raise EpilogueError("a tensor's shape does not broadcast to the output (L, M, N)")
    if len(_forwards) > 1024:
        _forwards.clear()
    hit = _forwards[key] = _build(source, parsed, lay, tensors, outs, pats, place, A, B, mode,
                                  grouped, groups is not None)
    return hit


def _build(text: str, parsed, lay: Layout, tensors, outs, pats, place, A, B,
           mode: str, grouped: bool, over_k: bool = False) -> Forward:
    def meta(shape, dtype):
        return torch.empty(shape, dtype=dtype, device="meta")

    values: dict[str, Any] = {}
    n = len(tensors)
    for name, t, pat in zip(lay.tensors, tensors, pats[:n]):
        values[name] = meta(_placeholder(pat, place), t.dtype)
    values.update({name: 1.0 for name in lay.scalars})
    values.update({name: None for name in lay.nones})
    for name, t, pat in zip(lay.outs, outs, pats[n:]):
        values[name] = meta(_placeholder(pat, place), t.dtype)
    alloc = []
    full = place if (A.dim() == 3 or B.dim() == 3 or over_k) and not grouped else place[1:]
    for item in lay.alloc:
        name, dt = item.split(":")
        alloc.append((name, getattr(torch, dt)))
        values[name] = meta(full, alloc[-1][1])
    dag = parsed.bind(values, place, grouped, rank=len(full))
    batches = 1 if grouped else place[0]
    wrt = {n for n in lay.grad if n not in ("A", "B")}
    if "A" in lay.grad or "B" in lay.grad:
        if A.dtype not in GRAD_DTYPES:
            raise EpilogueError(f"A and B are {A.dtype}: evtfuse computes gradients of A and B "
                                f"of {', '.join(dtype_name(d) for d in GRAD_DTYPES)} only "
                                "(dA and dB are torch matmuls in their dtype)", variable="A")
        wrt.add(autodiff.ACCUM)
    keep = saved_accum_dtype(A.dtype) if mode == "save" else None
    plan = autodiff.plan_forward(dag, wrt, parsed, save_accum=keep, batches=batches,
                                 work=work_dtype(A.dtype))
    hidden = tuple(s for s in plan.saved if s.hidden)
    names = (*lay.outs, *(a for a, _ in alloc), *(s.name for s in hidden))
    if hidden:
        where = f"{parsed.where} (with what its backward keeps)"
        source = torch_op.register(DagEpilogue(plan.augmented, parsed.name, where, len(full)))
        run = Layout(lay.tensors, lay.nones, lay.scalars, names, 0, where, False, lay.tune,
                     lay.allow_tf32, lay.fp8_fast_accum, lay.cc)
    else:
        source = text
        run = Layout(lay.tensors, lay.nones, lay.scalars, names, lay.line, lay.where,
                     lay.from_function, lay.tune, lay.allow_tf32, lay.fp8_fast_accum, lay.cc)
    return Forward(parsed, plan, source, run, tuple(alloc), hidden, batches, parsed.where,
                   grouped, parsed.gated, over_k)


def allocate_results(fwd: Forward, A, B, outs: list, groups=None) -> list:
    """The op's results before they are written: like ``outs``, the allocated full outputs,
    the hidden ones (fp32, the saved accumulator in its own dtype); ``groups``: G of a
    grouped GEMM over K."""
    problem = fwd.problem(A, B, groups)
    res = [torch.empty(t.shape, dtype=t.dtype, device=A.device) for t in outs]
    full = fwd.full_shape(A, B, groups)
    res += [A.new_empty(full, dtype=dt) for _, dt in fwd.alloc]
    res += [A.new_empty(hidden_shape(s, problem, fwd.grouped), dtype=s.dtype)
            for s in fwd.hidden]
    return res


def caller_reductions(bplan: autodiff.BackwardPlan, grouped: bool = False
                      ) -> autodiff.BackwardPlan:
    """``bplan`` for a kernel that computes no reductions (a gated one while it reads the
    accumulator's pairs, grouped or not): each reduction output (an operand's gradient
    summed over rows, columns or both) stored instead as its term, under the same name,
    full or, for a term constant along its row, per row, in fp32; the caller sums it
    (``BackwardPlan.caller_sums``). A grouped kernel's (over M) full outputs are per row,
    (T, N); it computes the reductions itself (per row (T, 1), per group (G, 1, N) and
    (G, 1, 1), over every group's rows (N,) and (1,): ``backends/triton/grouped_reduce``),
    so a grouped plan that is not gated keeps them. Any kernel leaves to the caller a
    reduction of a value computed from the backward's own reduction feeding computation (a
    bias's gradient through an RMS norm: kernels reduce no value computed from a
    reduction)."""
    late = ir.after_reduction(bplan.dag)
    nested = {o.name for o in bplan.dag.outputs if o.name not in bplan.scratch
              and o.node.kind is NodeKind.REDUCE and id(o.node.inputs[0]) in late}
    if not grouped and not bplan.dag.gated and not nested:
        return bplan
    outs, sums = [], []
    for o in bplan.dag.outputs:
        if o.name in bplan.scratch:  # a sum the kernel's own computation uses
            outs.append(o)
        elif o.node.kind is NodeKind.REDUCE and not bplan.dag.gated and o.name not in nested:
            outs.append(o)  # reduced in the kernel (a grouped one's: grouped_reduce)
        elif o.node.kind is NodeKind.REDUCE:
            term = o.node.inputs[0]
            kind = {Space.FULL: OutputKind.FULL, Space.ROW: OutputKind.ROW}.get(term.space)
            if kind is None:
                raise NotImplementedError(
                    f"{bplan.dag.name}: the gradient {o.name} sums a value constant along "
                    "the rows; this kernel cannot compute it yet")
            outs.append(Output(o.name, term, kind, bplan.work, term.batched and not grouped))
            sums.append((o.name, o.kind, o.batched))
        elif o.kind is OutputKind.FULL and grouped:
            outs.append(Output(o.name, o.node, OutputKind.FULL, o.dtype))
        else:
            outs.append(o)
    dag = bplan.dag.replace_outputs(outs)
    return dataclasses.replace(bplan, dag=dag, caller_sums=tuple(sums))


def backward_inputs(fwd: Forward, lay: Layout, grads, tensors: dict, saved: dict, scalars,
                    need_ab: bool, need_t, A: torch.Tensor, B: torch.Tensor, groups=None):
    """(the backward plan, its operands' values) of a call whose outputs got ``grads``, or
    None when no gradient arrives at a differentiable output or none is wanted. Plans are
    kept on ``fwd`` per (outputs graded, A and B wanted, operands wanted), made for the
    kernel that runs them (``caller_reductions``: a grouped (over M) or gated one leaves
    its sums to the caller). ``groups``: G of a grouped GEMM over K."""
    # which outputs have a gradient and which inputs want one: all the plan depends on
    # beyond ``fwd`` (a per-call key of booleans, not sets: host time per backward)
    key = (tuple(g is not None for g in grads), bool(need_ab), tuple(bool(n) for n in need_t))
    if key not in fwd.backwards:  # (None kept too: nothing to do for this key)
        fwd.backwards[key] = _backward_plan(fwd, lay, grads, need_ab, need_t)
    bplan = fwd.backwards[key]
    if bplan is None or bplan.empty:
        return None
    problem = fwd.problem(A, B, groups)
    values: dict[str, Any] = dict(tensors)
    values.update(zip(lay.scalars, scalars))
    values.update({op: grads[fwd.position[o]].contiguous() for o, op in bplan.grads})
    values.update({op: saved[s] for s, op in bplan.saved})
    if bplan.first_batch:
        values[bplan.first_batch] = autodiff.first_batch(problem[0], A.device)
    for inj in bplan.injected:
        values[inj.name] = autodiff.injected_gradient(
            inj, saved[inj.saved.name], grads[fwd.position[inj.of]], problem).contiguous()
    return bplan, values


def _backward_plan(fwd: Forward, lay: Layout, grads, need_ab: bool, need_t):
    """``backward_inputs``' plan for these gradients and needs (None: nothing to do)."""
    wanted = {name for name, need in zip(lay.tensors, need_t) if need}
    if need_ab:
        wanted.add(autodiff.ACCUM)
    differentiable = {o.name for o in fwd.plan.differentiable_outputs()}
    graded = frozenset(name for name, g in zip(fwd.output_names, grads)
                       if g is not None and name in differentiable)
    if not graded or not wanted:
        return None
    return caller_reductions(autodiff.backward(fwd.plan, graded, frozenset(wanted),
                                               batches=fwd.batches,
                                               name=f"{fwd.parsed.name}_backward"), fwd.grouped)


__all__ = ["GRAD_DTYPES", "Forward", "forward_of", "allocate_results", "backward_mode",
           "save_threshold", "saved_accum_dtype", "work_dtype", "dtype_name", "problem_of",
           "full_shape", "hidden_shape", "backward_inputs", "caller_reductions"]
