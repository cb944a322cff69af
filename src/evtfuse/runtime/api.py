"""The one-call API: ``gemm``, ``grouped_gemm``, ``fuse``; and ``get_kernels``, ``explain``.

Layer: runtime.api, the top of the runtime: above ``runtime.discovery`` (``get_kernels``,
``explain``: re-exported here), ``runtime.calls`` (a call's checks and its operator call),
the differentiable operators (``runtime.autograd``, ``runtime.grouped_autograd``) and
``runtime.dtensor_call``. ``gemm`` reads its arguments (``calls.read_call``), allocates
missing outputs and calls ``torch.ops.evtfuse.gemm``, whose implementation
(``runtime.run``) picks a kernel by autotuning on first use for the (epilogue, shapes,
dtypes, layouts, GPU) and remembers the choice on disk (``runtime.tuner``); a call with an
input that requires grad runs the differentiable operator instead, one with DTensors
through ``runtime.dtensor_call``.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..dag_epilogue import DagEpilogue
from ..errors import EpilogueError, UnsupportedError  # noqa: F401 (re-exported)
from ..frontend import EpilogueSource, parse_epilogue
from ..ir import OutputKind  # noqa: F401 (re-exported)
from . import autograd, grouped_autograd
from .calls import (CallEpilogue, allocate_missing, default_output_dtype, grouped_shape,
                    operator_call, output_shape, read_call)
from .calls import dtype_argument  # noqa: F401 (re-exported)
from .discovery import explain, get_kernels, kernels_for, order_by_fill  # noqa: F401 (re-exported)
from .dtensor_call import DTensorCall, has_dtensor
from .grad_plan import backward_mode, dtype_name
from .kernel import Kernel  # noqa: F401 (re-exported)
from .torch_op import Layout, layout_text, parsed_of
from .tuner import choose_kernel  # noqa: F401 (re-exported)


def gemm(A: torch.Tensor, B: torch.Tensor,
         epilogue: EpilogueSource | DagEpilogue | None = None, *, tune: str = "fast",
         allow_tf32: bool = False, fp8_fast_accum: bool = True,
         accumulator_type: torch.dtype | None = None, cc: int | None = None,
         deterministic: bool = True, backward: str = "auto", **operands_and_outputs: Any):
    """``epilogue(A @ B, **operands)`` in one fused kernel; returns the outputs in the
    function's return order (one tensor when it returns one).

    Outputs not given are allocated as full (L, M, N) tensors in A's dtype (int32 for int8
    inputs, bf16 for fp8: ``default_output_dtype``);
    ``<name>_dtype=torch.float32`` picks another dtype; pass ``name=None`` to compute an
    output without storing it (it is returned as None). ``tune``: "fast" (time a few
    candidates, bounded to about 30 s), "exhaustive" (every candidate, then the winner
    at other tile orders), "none" (the heuristic's first choice), "background" (run a
    kernel quick to compile at once, compile "fast"'s candidates in background threads, time
    them one window per later call and switch to the winner once its outputs matched:
    docs/performance.md; results may then change bitwise once, as with any retune).
    ``allow_tf32``: fp32
    inputs on TF32 tensor cores; ``fp8_fast_accum``: fp8 inputs summed in the tensor
    cores' reduced precision over all of K (the default, as ``torch._scaled_mm`` with
    ``use_fast_accum=True``); False promotes to fp32 every k-step (slower; an error that
    does not grow with K); ``accumulator_type``: None (fp32 for float inputs, int32 for
    8-bit integers) or ``torch.float16`` for fp16 and fp8 inputs (fp16 accumulation,
    docs/dtypes-and-layouts.md; forward only). Reductions are always
    deterministic (sums and logsumexp: each tile writes its partial result to a workspace
    that is combined in a fixed order; max and min: atomics on the floats' bits, whose
    result does not depend on their order), so ``deterministic=True`` holds for every call;
    ``False`` is refused until a faster non-deterministic path exists. ``backward`` (when an
    input requires grad): "save" stores the accumulator in the forward (an extra M x N
    tensor, in A's dtype for 16-bit inputs, else fp32, held until the backward) so that the
    backward kernel runs no GEMM; "recompute" recomputes ``A @ B`` in the backward kernel;
    "auto" (the default) saves when K is large enough that the GEMM costs more than the
    memory traffic (K >= 512 for fp16 / bf16: ``runtime.grad_plan.backward_mode``).

    The call is one PyTorch operator, ``torch.ops.evtfuse.gemm`` (``runtime.torch_op``):
    this function only sorts its arguments and allocates the missing outputs, in code
    torch.compile traces without a graph break. The first call for a structure
    (epilogue, shapes, strides, dtypes) validates, tunes and builds a launch plan; later
    calls fetch tensors, check that no output meets another tensor at its new address
    (tensors passed again: that none changed in place since), and launch; a call that
    fails those checks is validated from scratch, and raises what the first call would.
    """
    if not deterministic:
        raise ValueError("deterministic=False is not implemented: evtfuse's reductions are "
                         "always deterministic")
    epi, acc16, _, named, dtypes, lists, grad = read_call(
        "gemm", A, B, None, epilogue, accumulator_type, backward, operands_and_outputs)
    tensors, tnames, nones, scalars, snames, outs, onames = lists
    outputs = epi.outputs
    dist = _dtensor_call("gemm", A, B, None, epi, named, dtypes, tensors, tnames, nones,
                         outs, onames, lambda: output_shape(A, B, epi.gated), bool(grad))
    if dist is not None and (grad or dist.local_only):  # on the local shards, differentiable
        return dist.run_local(  # (runtime.dtensor_call)
            lambda a, b, **kw: gemm(a, b, epilogue, tune=tune, allow_tf32=allow_tf32,
                                    fp8_fast_accum=fp8_fast_accum,
                                    accumulator_type=accumulator_type, cc=cc, backward=backward,
                                    **kw), A, B, named, outputs, outs, onames)
    if grad:
        return _gemm_with_grad(A, B, epi, named, dtypes, (tune, allow_tf32, fp8_fast_accum, cc),
                               grad, tensors, tnames, nones, scalars, snames, outs, onames,
                               backward)
    if dist is not None:  # DTensor outputs; the operator's sharding rules place the rest
        dist.allocate(outs, onames)
    else:
        allocate_missing(A, outputs, named, dtypes, lambda: output_shape(A, B, epi.gated),
                         outs, onames)
    return operator_call(A, B, None, epi, (tune, allow_tf32, fp8_fast_accum, cc), acc16, lists)


def grouped_gemm(A: torch.Tensor, B: torch.Tensor, offs: torch.Tensor,
                 epilogue: EpilogueSource | DagEpilogue | None = None, *, tune: str = "fast",
                 allow_tf32: bool = False, fp8_fast_accum: bool = True,
                 accumulator_type: torch.dtype | None = None, cc: int | None = None,
                 backward: str = "auto", **operands_and_outputs: Any):
    """A grouped GEMM with a fused epilogue in ``torch._grouped_mm``'s layouts; returns the
    outputs in the function's return order, as ``gemm`` (``tune`` as ``gemm``'s). ``offs`` (G,) int32, cumulative
    group ends on A's device (a strided or expanded one is copied first, on the device: the
    kernels read it packed; the operator and ``GemmArguments`` refuse one).

    Groups over M (a mixture of experts' forward): A (T, K) rows sorted by group, B
    (G, K, N) (any strides: an expert weight (G, N, K) passed as ``W.mT``); group g has rows
    offs[g-1] to offs[g]. Groups over K (the experts' weight gradient, ``x.T @ dY`` per
    expert): A (M, T), B (T, N), group g the range offs[g-1] to offs[g] of T; the result is
    batched, (G, M, N), and its operands and outputs take the batched rule with L = G
    (docs/grouped.md); an empty group's accumulator is zero.

    Over M:
    Operands: per group (G, 1, N) (an expert's bias) and (G, 1, 1), per row (T, 1) (routing
    weights), full (T, N), per column (N,), scalars. Outputs: full (T, N) (allocated as
    ``gemm`` allocates; ``<name>_dtype`` picks another), per-row (T, 1) values, and
    reductions (sum, max, min, logsumexp; given, not allocated) per row (T, 1), per group
    (G, 1, N) and (G, 1, 1), or over every group's rows (N,) and (1,), an empty group's
    being the reduction's identity. A gated epilogue (``gate, up = pairs(accum)``, docs/gated.md) takes B
    (G, K, 2N), each expert's gate and up columns interleaved (``interleave_gate_up``), and
    gives (T, N) outputs. Rows at or past offs[-1] belong to no group and are not written (an
    output evtfuse allocates holds whatever ``torch.empty`` gave there). ``offs`` is never
    read on the host: no synchronisation (docs/grouped.md). The call is one operator,
    ``torch.ops.evtfuse.grouped_gemm``. Over M and over K it is differentiable with respect
    to A, B and every tensor operand (``runtime.grouped_autograd``; ``backward`` as
    ``gemm``'s, "auto" choosing over K by the mean group size T / G)."""
    epi, acc16, offs, named, dtypes, lists, grad = read_call(
        "grouped_gemm", A, B, offs, epilogue, accumulator_type, backward, operands_and_outputs)
    tensors, tnames, nones, scalars, snames, outs, onames = lists
    outputs = epi.outputs
    shape = grouped_shape(A, B, offs, epi.gated)
    dist = _dtensor_call("grouped_gemm", A, B, offs, epi, named, dtypes, tensors, tnames,
                         nones, outs, onames, shape, bool(grad))
    if dist is not None and (grad or dist.local_only):  # on the local shards, differentiable
        return dist.run_local(  # (runtime.dtensor_call)
            lambda a, b, o, **kw: grouped_gemm(a, b, o, epilogue, tune=tune,
                                               allow_tf32=allow_tf32,
                                               fp8_fast_accum=fp8_fast_accum,
                                               accumulator_type=accumulator_type, cc=cc,
                                               backward=backward, **kw),
            A, B, named, outputs, outs, onames)
    if grad:
        return _gemm_with_grad(A, B, epi, named, dtypes, (tune, allow_tf32, fp8_fast_accum, cc),
                               grad, tensors, tnames, nones, scalars, snames, outs, onames,
                               backward, offs)
    if dist is not None:  # DTensor outputs; the operator's sharding rules place the rest
        dist.allocate(outs, onames)
        offs = dist.offs
    else:
        allocate_missing(A, outputs, named, dtypes, shape, outs, onames)
    return operator_call(A, B, offs, epi, (tune, allow_tf32, fp8_fast_accum, cc), acc16, lists)


def _dtensor_call(call: str, A, B, offs, epi: CallEpilogue, named: dict, dtypes: dict,
                  tensors: list, tnames: list, nones: list, outs: list, onames: list,
                  shape: Callable[[], tuple], grad: bool = False):
    """A ``DTensorCall`` (``runtime.dtensor_call``) for a call some tensor of which is a
    DTensor, else None (at once while ``torch.distributed.tensor`` is not imported)."""
    if not has_dtensor(A, B, tensors, outs, offs):
        return None
    parsed = parsed_of(epi.source, Layout((), (), (), (), epi.line, epi.where,
                                          epi.from_function))
    numbers = {n: v for n, v in named.items() if isinstance(v, (int, float)) and n in epi.params}
    missing = [n for n in epi.outputs if n not in named]
    size = shape() if missing else ()
    allocated = {n: (size, dtypes.get(n, default_output_dtype(A.dtype))) for n in missing}
    return DTensorCall(call, A, B, offs, parsed, tensors, tnames, numbers, nones, outs, onames,
                       allocated, grad)


def _gemm_with_grad(A, B, epi: CallEpilogue, named, dtypes, options, grad, tensors, tnames,
                    nones, scalars, snames, outs, onames, backward, offs=None):
    """``gemm`` for a call some input of which requires grad: one call of the differentiable
    operator ``evtfuse::gemm_functional`` (``runtime.autograd``), which returns new outputs;
    those the caller gave are written by a copy (itself differentiable, as torch's
    ``out.copy_(x)``: a tensor reused across training steps carries the last step's graph,
    so give a fresh one per step). "auto" for ``backward`` is resolved here, from K (a
    guard under torch.compile when K is symbolic), so the layout says the mode as data.
    ``offs``: ``grouped_gemm``, through ``evtfuse::grouped_gemm_functional``
    (``runtime.grouped_autograd``); over M the copy keeps what a given output held in the
    rows of no group (at or past offs[-1]), as the call without gradients does; over K
    "auto" takes K as the mean group size T / G (the GEMM a recompute repeats is
    2 * M * N * T flops, the accumulator saved G * M * N elements). ``options``:
    the call's (tune, allow_tf32, fp8_fast_accum, cc), as ``layout_text`` takes them."""
    source, outputs = epi.source, epi.outputs
    _tune, allow_tf32, _fp8_fast_accum, _cc = options
    alloc = tuple(f"{n}:{dtype_name(dtypes.get(n, default_output_dtype(A.dtype)))}"
                  for n in outputs if n not in named)
    over_k = offs is not None and B.dim() == 2
    K = A.shape[-1] // offs.shape[0] if over_k else A.shape[-1]
    mode = backward_mode(backward, K, A.dtype, allow_tf32)
    layout = layout_text(tuple(tnames), tuple(nones), tuple(snames), tuple(onames), epi.line,
                         epi.where, epi.from_function, options, "", grad, alloc, mode)
    # the given outputs only tell their shapes and dtypes: no autograd edge to what they held
    given_outs = [o.detach() for o in outs]
    if offs is None:
        results = autograd.call(A, B, source, layout, tensors, scalars, given_outs)
    else:
        results = grouped_autograd.call(A, B, offs, source, layout, tensors, scalars, given_outs)
        unowned = torch.arange(A.shape[0], device=A.device) >= offs[-1]  # no host read
    got = {}
    for name, given, r in zip(onames, outs, results):
        if offs is not None and not over_k:
            r = torch.where(unowned.view(-1, *([1] * (r.dim() - 1))), given.detach(), r)
        given.copy_(r)
        got[name] = given
    got.update(zip((a.split(":")[0] for a in alloc), results[len(outs):]))
    if len(outputs) == 1:
        return got.get(outputs[0])
    return tuple(got.get(n) for n in outputs)


class Fused:
    """A reusable fused GEMM for one epilogue: ``f(A, B, **operands)`` (see ``gemm``)."""

    def __init__(self, epilogue: EpilogueSource, **defaults: Any):
        self.epilogue = epilogue
        self.parsed = parse_epilogue(epilogue)
        self.defaults = defaults
        self.__name__ = self.parsed.name

    def __call__(self, A: torch.Tensor, B: torch.Tensor, **operands: Any):
        return gemm(A, B, self.epilogue, **{**self.defaults, **operands})

    def __repr__(self) -> str:
        return f"evtfuse.fuse({self.parsed.name})"


def fuse(epilogue: EpilogueSource | None = None, **defaults: Any) -> Fused | Callable[[EpilogueSource], Fused]:
    """``evtfuse.fuse(fn)`` or ``@evtfuse.fuse``: a callable ``f(A, B, **operands)``."""
    if epilogue is None:
        return lambda fn: Fused(fn, **defaults)
    return Fused(epilogue, **defaults)


__all__ = ["get_kernels", "explain", "gemm", "grouped_gemm", "fuse", "Fused", "Kernel", "OutputKind",
           "EpilogueError", "UnsupportedError"]
