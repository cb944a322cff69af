"""The one-call API: ``gemm``, ``grouped_gemm``, ``fuse``; and ``get_kernels``, ``explain``.

Layer: runtime, above ``runtime.discovery`` (``get_kernels``, ``explain``: re-exported
here) and ``runtime.tuner``. ``gemm`` allocates missing outputs, picks a kernel by
autotuning on first use for the (epilogue, shapes, dtypes, layouts, GPU) and remembers
the choice on disk (``runtime.tuner``). Invariant: its cached paths serve a call only
after the memory checks of ``GemmArguments`` hold for the call's tensors as they are now
(``memory.tensor_state``).
"""

from __future__ import annotations

import logging
import weakref
from typing import Any, Callable, NamedTuple

import torch

from ..arguments import OFFS_KEY, EpilogueArguments, GemmArguments, check_grouped, check_tensors
from ..dag_epilogue import DagEpilogue
from ..errors import EpilogueError, UnsupportedError, not_an_operand
from ..frontend import EpilogueSource, EpilogueText, check_given, epilogue_text, parse_epilogue
from ..ir import OutputKind, dtype_named
from ..memory import byte_span, tensor_state
from .device import device_guard
from .dtensor_call import has_dtensor
from .discovery import explain, get_kernels, kernels_for, order_by_fill  # noqa: F401 (re-exported)
from .kernel import Kernel
from . import autograd, grouped_autograd, torch_op
from .torch_op import (Layout, check_devices, check_no_grad, check_outputs_writable,
                       constant_result, layout_text, parsed_cache, parsed_of)
from .tuner import choose_kernel, launch_plan  # noqa: F401 (choose_kernel re-exported)

log = logging.getLogger("evtfuse")

# ------------------------------------------------------------------ one call

def default_output_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of an output ``gemm`` allocates (``<name>_dtype`` picks another): A's, but
    int32 for int8 and uint8 inputs (as ``torch._int_mm``: a silent rounding of the product
    to 8 bits would be a trap) and bf16 for fp8 inputs (as ``torch._scaled_mm`` is commonly
    called)."""
    if dtype in (torch.int8, torch.uint8):
        return torch.int32
    if dtype.is_floating_point and dtype.itemsize == 1:
        return torch.bfloat16
    return dtype


def _output_shape(A: torch.Tensor, B: torch.Tensor, gated: bool = False) -> tuple[int, ...]:
    """Shape of an output gemm allocates: (M, N), or (L, M, N) when A or B is batched;
    ``gated`` (``pairs(accum)``): N is half of B's columns (an odd count is refused when
    the arguments are built)."""
    M, N = A.shape[-2], (B.shape[-1] // 2 if gated else B.shape[-1])
    if A.dim() == 3 or B.dim() == 3:
        return (max(A.shape[0] if A.dim() == 3 else 1, B.shape[0] if B.dim() == 3 else 1), M, N)
    return (M, N)


class _Epilogue(NamedTuple):
    """What a ``gemm`` call reads of its epilogue, parsed and checked once per function or
    string (``_epilogue_of``): the ``EpilogueText`` that crosses the operator's boundary
    and the names the call's keywords are sorted by."""

    source: str  # the epilogue's source text (the operator's ``epilogue`` string)
    line: int  # the line of the user's file its first line is (0 for a string)
    where: str  # what error messages call it
    from_function: bool  # given as a function (not as source text)
    name: str  # the function's name
    params: tuple  # its operands' names, after accum, in order
    outputs: tuple  # its outputs' names, in return order
    gated: bool | str  # ``pairs(accum)``: B holds 2N columns for N output columns (their layout)
    conditional: tuple  # outputs assigned ``store_where``: the caller gives their buffers


@constant_result
def _epilogue_of(epilogue) -> _Epilogue:
    """An epilogue's ``_Epilogue``, parsed and checked once per function or string (a DAG
    evtfuse derived, ``DagEpilogue``, is registered under its text instead): a constant,
    under torch.compile too (the function is read here, never traced)."""
    key = epilogue if isinstance(epilogue, str) else getattr(epilogue, "__code__", epilogue)
    hit = _epilogues.get(key)
    if hit is None:
        text, parsed = _read(epilogue)
        _check_keyword_names(parsed)
        hit = _epilogues[key] = _Epilogue(text.source, text.line_offset, text.where,
                                          text.from_function, parsed.name, parsed.params,
                                          parsed.outputs, parsed.gated,
                                          parsed.conditional_outputs)
    return hit


def _read(epilogue) -> tuple[EpilogueText, Any]:
    """The text the operator carries for ``epilogue`` and its parsed form (or DAG), which
    an operator call of that text then runs (``torch_op.parsed_cache``)."""
    if isinstance(epilogue, DagEpilogue):
        return EpilogueText(torch_op.register(epilogue), 0, epilogue.where, False), epilogue
    text = epilogue_text(epilogue)
    parsed = parse_epilogue(text)
    parsed_cache[(text.source, text.line_offset, text.where)] = parsed
    return text, parsed


_epilogues: dict[Any, _Epilogue] = {}

# gemm's and grouped_gemm's own keywords: an operand or output of one of these names could
# not be passed (``<output>_dtype`` picks an allocated output's dtype)
_CALL_KEYWORDS = frozenset(["A", "B", "offs", "epilogue", "tune", "allow_tf32",
                            "fp8_fast_accum", "accumulator_type", "cc", "deterministic",
                            "backward"])


def _check_keyword_names(parsed) -> None:
    """An operand or output named like a keyword of ``gemm`` (``tune``, ``cc``, ...) or an
    output's ``<name>_dtype`` could not be passed: an error naming it and its line."""
    lines = {name: parsed.line_offset + 1 for name in parsed.params}  # the def line
    lines.update(parsed.returns)
    dtype_keys = {f"{o}_dtype" for o in parsed.outputs}
    for name, line in lines.items():
        if name in _CALL_KEYWORDS or name in dtype_keys:
            what = "a keyword of gemm" if name in _CALL_KEYWORDS else \
                f"the keyword that picks output {name[:-len('_dtype')]}'s dtype"
            raise EpilogueError(f"the epilogue's '{name}' has the name of {what}, so it "
                                f"cannot be passed to gemm; rename it", variable=name,
                                line=line, where=parsed.where, source_line=parsed.text_of(line))


def _check_operands_given(A, B, epi: _Epilogue, named: dict, call: str = "gemm") -> None:
    """What ``gemm`` checks before anything else, in its own words: A and B are 2-D or 3-D
    tensors, every conditional store's output is given, and every operand of the epilogue
    is a keyword argument of the call (a misspelt one named with the closest parameter)."""
    for name, t in (("A", A), ("B", B)):
        if isinstance(t, torch.Tensor) and t.dim() not in (2, 3):
            raise EpilogueError(f"{call}: {name} must have 2 or 3 dimensions ((M, K) / (L, M, K) "
                                f"for A, (K, N) / (L, K, N) for B), got shape {tuple(t.shape)}",
                                variable=name)
    for name in epi.conditional:
        if named.get(name) is None:
            raise EpilogueError(
                f"output {name} is a conditional store (store_where): where its condition "
                f"fails it keeps what its buffer holds, so {call} allocates no such output; "
                f"pass {name}= a full output tensor", variable=name)
    params = epi.params
    strangers = [k for k in named if k not in params and k not in epi.outputs]
    if strangers:  # (torch.compile traces this function: difflib is off a valid call's way)
        _check_call_keywords(strangers, epi, call)
    missing = [p for p in params if p not in named]
    if not missing:
        return
    import difflib

    unknown = [k for k in named if k not in params]
    close = {m: difflib.get_close_matches(m, unknown, n=1) for m in missing}
    p = missing[0]
    hint = f"; '{close[p][0]}' was given: a misspelling of {p}?" if close[p] else ""
    raise EpilogueError(f"Argument {p} is not provided in the kwargs of {call}: pass every "
                        f"operand of {epi.name}({', '.join(['accum', *params])}) as a keyword "
                        f"argument{hint}", variable=p)


def _check_call_keywords(strangers: list, epi: _Epilogue, call: str) -> None:
    """A keyword neither the epilogue's nor the call's, close to one of the call's own (a
    misspelt ``epilogue=``, ``tune=``): an error that names it and the keyword it is like
    (others are left to the epilogue's own check, which lists its names)."""
    import difflib

    for k in strangers:
        keyword = difflib.get_close_matches(k, sorted(_CALL_KEYWORDS), n=1, cutoff=0.75)
        if keyword:
            raise EpilogueError(f"{call} got {k}=, which is neither one of its keywords nor "
                                f"an operand or output of the epilogue {epi.name}("
                                f"{', '.join(['accum', *epi.params])}) -> "
                                f"{', '.join(epi.outputs)}: did you mean {keyword[0]}=?",
                                variable=k)


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
    at other tile orders), "none" (the heuristic's first choice), "background" (run
    "none"'s choice at once, compile "fast"'s candidates in background threads, time them
    one window per later call and switch to the winner once its outputs matched:
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
    memory traffic (K >= 512 for fp16 / bf16: ``runtime.autograd.backward_mode``).

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
    check_tensors(A, B, "gemm")
    autograd.check_backward(backward)
    acc16 = _acc16(A, accumulator_type)
    epi = _epilogue_of(_IDENTITY if epilogue is None else epilogue)
    outputs = epi.outputs
    named, dtypes = _split_dtypes(operands_and_outputs, outputs)
    _check_operands_given(A, B, epi, named)
    tensors, tnames, nones, scalars, snames, outs, onames = _sort(named, epi)
    check_devices(A, B, tnames, tensors, onames, outs, call="gemm")
    grad = _requiring_grad(A, B, tensors, tnames)
    _check_acc16_grad(acc16, grad)
    check_outputs_writable(outs, onames, "gemm", recorded=bool(grad))
    dist = _dtensor_call("gemm", A, B, None, epi, named, dtypes, tensors, tnames, nones,
                         outs, onames, lambda: _output_shape(A, B, epi.gated))
    if dist is not None and grad:  # on the local shards, differentiable (runtime.dtensor_call)
        return dist.run_local(
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
        _allocate_missing(A, outputs, named, dtypes, lambda: _output_shape(A, B, epi.gated),
                          outs, onames)
    layout = layout_text(tuple(tnames), tuple(nones), tuple(snames), tuple(onames), epi.line,
                         epi.where, epi.from_function, (tune, allow_tf32, fp8_fast_accum, cc),
                         acc16=acc16)
    torch_op.call(A, B, epi.source, layout, tensors, scalars, outs)
    return _returned(outputs, onames, outs)


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
    check_tensors(A, B, "grouped_gemm")
    autograd.check_backward(backward)
    acc16 = _acc16(A, accumulator_type)
    epi = _epilogue_of(_IDENTITY if epilogue is None else epilogue)
    outputs = epi.outputs
    named, dtypes = _split_dtypes(operands_and_outputs, outputs)
    if isinstance(offs, torch.Tensor) and offs.dim() == 1 and not offs.is_contiguous():
        # the kernels read offs packed: a strided or expanded offs (at most 1024 int32) is
        # copied, on the device (docs/grouped.md); the operator itself refuses one
        offs = offs.contiguous()
    check_grouped(A, B, offs)  # shapes, dtype and device only: offs stays on the device
    _check_operands_given(A, B, epi, named, "grouped_gemm")
    tensors, tnames, nones, scalars, snames, outs, onames = _sort(named, epi)
    check_devices(A, B, tnames, tensors, onames, outs, call="grouped_gemm")
    grad = _requiring_grad(A, B, tensors, tnames)
    _check_acc16_grad(acc16, grad)
    check_outputs_writable(outs, onames, "grouped_gemm", recorded=bool(grad))
    width = B.shape[-1] // 2 if epi.gated else B.shape[-1]  # odd: refused when bound

    def shape():
        return (offs.shape[0], A.shape[0], width) if B.dim() == 2 else (A.shape[0], width)

    dist = _dtensor_call("grouped_gemm", A, B, offs, epi, named, dtypes, tensors, tnames,
                         nones, outs, onames, shape)
    if dist is not None and grad:  # on the local shards, differentiable (runtime.dtensor_call)
        return dist.run_local(
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
        _allocate_missing(A, outputs, named, dtypes, shape, outs, onames)
    layout = layout_text(tuple(tnames), tuple(nones), tuple(snames), tuple(onames), epi.line,
                         epi.where, epi.from_function, (tune, allow_tf32, fp8_fast_accum, cc),
                         acc16=acc16)
    torch_op.call_grouped(A, B, offs, epi.source, layout, tensors, scalars, outs)
    return _returned(outputs, onames, outs)


def _dtensor_call(call: str, A, B, offs, epi: _Epilogue, named: dict, dtypes: dict,
                  tensors: list, tnames: list, nones: list, outs: list, onames: list,
                  shape: Callable[[], tuple]):
    """A ``DTensorCall`` (``runtime.dtensor_call``) for a call some tensor of which is a
    DTensor, else None (at once while ``torch.distributed.tensor`` is not imported)."""
    if not has_dtensor(A, B, tensors, outs, offs):
        return None
    from .dtensor_call import DTensorCall

    parsed = parsed_of(epi.source, Layout((), (), (), (), epi.line, epi.where,
                                          epi.from_function))
    numbers = {n: v for n, v in named.items() if isinstance(v, (int, float)) and n in epi.params}
    missing = [n for n in epi.outputs if n not in named]
    size = shape() if missing else ()
    allocated = {n: (size, dtypes.get(n, default_output_dtype(A.dtype))) for n in missing}
    return DTensorCall(call, A, B, offs, parsed, tensors, tnames, numbers, nones, outs, onames,
                       allocated)


def _split_dtypes(named: dict, outputs: tuple) -> tuple[dict, dict]:
    """(the operands and outputs, {output: dtype}): the ``<name>_dtype`` keywords, which
    pick an allocated output's dtype, taken out of ``named`` (copied only when one is); a
    dtype's name ("float16", "bf16", "torch.float32") is taken for the dtype."""
    dtypes = {}
    for name in outputs:
        if f"{name}_dtype" in named:
            if not dtypes:
                named = dict(named)
            dtypes[name] = dtype_argument(f"{name}_dtype", named.pop(f"{name}_dtype"))
    return named, dtypes


def dtype_argument(key: str, value: Any) -> torch.dtype:
    """``value`` of the keyword ``key`` (``D_dtype``) as a ``torch.dtype``: a dtype, or its
    name as torch spells it ("float16", "torch.bfloat16") or a short one ("bf16", "fp32");
    otherwise an ``EpilogueError`` naming ``key``."""
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str):
        name = value.strip().lower()
        name = name[len("torch."):] if name.startswith("torch.") else name
        got = dtype_named(name) or getattr(torch, name, None)
        if isinstance(got, torch.dtype):
            return got
    raise EpilogueError(f"{key} must be a torch.dtype (torch.float16) or a dtype's name "
                        f"(\"float16\", \"bf16\"), not {value!r}", variable=key)


def _allocate_missing(A: torch.Tensor, outputs: tuple, named: dict, dtypes: dict,
                      shape: Callable[[], tuple], outs: list, onames: list) -> None:
    """Append to ``outs`` / ``onames`` a new tensor of ``shape()`` for each output not
    given, in its ``dtypes`` entry or ``default_output_dtype``."""
    missing = [n for n in outputs if n not in named]
    if not missing:
        return
    size = shape()
    for name in missing:
        outs.append(torch.empty(size, dtype=dtypes.get(name, default_output_dtype(A.dtype)),
                                device=A.device))
        onames.append(name)


def _returned(outputs: tuple, onames: list, outs: list):
    """The outputs in the epilogue's return order (one tensor when it returns one; None for
    an output not stored)."""
    if len(outputs) == 1:
        return outs[0] if onames else None
    got = dict(zip(onames, outs))
    return tuple(got.get(n) for n in outputs)


def run_grouped_values(A: torch.Tensor, B: torch.Tensor, offs: torch.Tensor, source: str,
                       lay: Layout, values: dict[str, Any]) -> None:
    """The eager implementation of ``torch.ops.evtfuse.grouped_gemm``: ``run_values`` with
    ``offs`` (the same cached paths: its structure and address are part of what they
    check), one launch of the chosen kernel's plan, no host synchronisation."""
    _on_device(A, _run_values, A, B, source, lay, values, offs)


def _acc16(A: torch.Tensor, accumulator_type) -> bool:
    """Whether ``gemm``'s ``accumulator_type`` asks for fp16 accumulation (None: the
    inputs' own, fp32 or int32); the arguments' validation refuses it for inputs that do
    not have it (bf16, fp32, integers), naming ``accumulator_type``."""
    if accumulator_type is None or accumulator_type == _accumulator_of(A.dtype):
        return False
    if accumulator_type == torch.float16:
        return True
    raise ValueError(f"accumulator_type must be None (the inputs' own: "
                     f"{_accumulator_of(A.dtype)} for {A.dtype}) or torch.float16 (fp16 and "
                     f"fp8 inputs), not {accumulator_type!r}")


def _check_acc16_grad(acc16: bool, grad: tuple) -> None:
    if acc16 and grad:
        raise NotImplementedError(
            f"accumulator_type=torch.float16 is forward-only, and {', '.join(grad)} "
            f"require{'s' if len(grad) == 1 else ''} grad: the backward would not be the "
            "forward's derivative. Run under torch.no_grad() (inference), detach the inputs, "
            "or accumulate in fp32 (accumulator_type=None).")


def _accumulator_of(dtype: torch.dtype) -> torch.dtype:
    if dtype == torch.float64:
        return torch.float64
    return torch.float32 if dtype.is_floating_point else torch.int32


def _accumulator(A: torch.Tensor, lay: Layout) -> torch.dtype:
    """The accumulator dtype of an operator call (its layout's, else the inputs' own)."""
    return torch.float16 if lay.acc16 else _accumulator_of(A.dtype)


def _requiring_grad(A: torch.Tensor, B: torch.Tensor, tensors: list, tnames: list) -> tuple:
    """The names of the inputs a gradient must reach ("A", "B", operands), under grad mode."""
    if not torch.is_grad_enabled():
        return ()
    return tuple(n for n, t in (("A", A), ("B", B), *zip(tnames, tensors)) if t.requires_grad)


def _gemm_with_grad(A, B, epi: _Epilogue, named, dtypes, options, grad, tensors, tnames,
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
    alloc = tuple(f"{n}:{autograd.dtype_name(dtypes.get(n, default_output_dtype(A.dtype)))}"
                  for n in outputs if n not in named)
    over_k = offs is not None and B.dim() == 2
    K = A.shape[-1] // offs.shape[0] if over_k else A.shape[-1]
    mode = autograd.backward_mode(backward, K, A.dtype, allow_tf32)
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


def _sort(named: dict, epi: _Epilogue) -> tuple:
    """A call's operands and outputs by kind, as the operator's lists take them: (tensors,
    their names, names passed None, scalars, their names, outputs given, their names)."""
    outputs = epi.outputs
    tensors, tnames, nones, scalars, snames, outs, onames = [], [], [], [], [], [], []
    for name, v in named.items():
        if isinstance(v, torch.Tensor):
            if name in outputs:
                outs.append(v)
                onames.append(name)
            else:
                tensors.append(v)
                tnames.append(name)
        elif v is None:
            nones.append(name)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            scalars.append(torch_op.scalar_arg(name, v))
            snames.append(name)
        else:
            check_given(epi.name, epi.params, outputs, {**named, **dict.fromkeys(outputs)})
            raise not_an_operand(name, v)
    return tensors, tnames, nones, scalars, snames, outs, onames


def run_kernel_through_op(kernel: Kernel, args: GemmArguments) -> None:
    """``Kernel.run`` under torch.compile: one ``torch.ops.evtfuse.gemm`` call naming the
    kernel (the arguments' outputs are all given)."""
    epi = _epilogue_of(args.epilogue.epilogue)
    named = args.epilogue.values
    check_no_grad(args.A, args.B, named)
    tensors, tnames, nones, scalars, snames, outs, onames = _sort(named, epi)
    options = ("none", args.allow_tf32, args.fp8_fast_accum, kernel.target.cc)
    layout = layout_text(tuple(tnames), tuple(nones), tuple(snames), tuple(onames), epi.line,
                         epi.where, epi.from_function, options, kernel.name,
                         acc16=args.accumulator_type == torch.float16)
    torch_op.call(args.A, args.B, epi.source, layout, tensors, scalars, outs)


def _run_named(A, B, parsed, lay: Layout, values: dict) -> None:
    """The operator's implementation for a call naming its kernel (``Kernel.run`` under
    torch.compile)."""
    args = GemmArguments(A, B, values.get("D"), _accumulator(A, lay),
                         EpilogueArguments.unbound(parsed, **values), allow_tf32=lay.allow_tf32,
                         fp8_fast_accum=lay.fp8_fast_accum)
    for k in get_kernels(args, None if lay.cc < 0 else lay.cc):
        if k.name == lay.kernel:
            k.run(args)
            return
    raise UnsupportedError(f"kernel {lay.kernel} does not support these arguments:\n"
                           f"{explain(args)}")


def run_values(A: torch.Tensor, B: torch.Tensor, source: str, lay: Layout,
               values: dict[str, Any]) -> None:
    """The eager implementation of ``torch.ops.evtfuse.gemm``: every output of the
    epilogue ``source`` in place, for ``values`` (every operand and output by name), on
    the tensors' device (and that device's current stream), whichever is current."""
    _on_device(A, _run_values, A, B, source, lay, values)


def _on_device(A: torch.Tensor, run: Callable, *args) -> None:
    """``run(*args)`` with A's device current (``device_guard``; none where it is already)."""
    guard = device_guard(A)
    if guard is None:
        run(*args)
        return
    with guard:
        run(*args)


def _run_values(A, B, source: str, lay: Layout, values: dict[str, Any], offs=None) -> None:
    """``run_values``; with ``offs``, a grouped GEMM's (``run_grouped_values``): its launch
    values carry offs under ``OFFS_KEY``, so that every cached path keys on it and checks
    it as it checks the epilogue's tensors (structure, address, in-place changes, overlap
    with an output)."""
    key = (source, lay.line, lay.where)
    cc = None if lay.cc < 0 else lay.cc
    options = (lay.tune, lay.allow_tf32, lay.fp8_fast_accum, cc, lay.acc16)
    launch = values if offs is None else {**values, OFFS_KEY: offs}
    last = _last_call.get(key)
    if last is not None and last.options == options and A is last.A() and B is last.B() \
            and _same_objects(launch, last.given) \
            and [tensor_state(t()) for t in last.tensors] == last.state:
        # the same tensors as the last call with this epilogue, none of them changed in
        # place since (address, shape, strides, storage): launch at once
        last.plan(A, B, launch)
        return
    parsed = parsed_of(source, lay)
    if lay.kernel:  # (no grouped call names its kernel)
        _run_named(A, B, parsed, lay, values)
        return
    call_key, tensors, state = _call_key(A, B, launch)
    fast_key = (id(parsed), options, call_key)
    hit = _fast.get(fast_key)
    if hit is not None and hit.parsed is parsed and hit.disjoint(state):
        _last_call[key] = _LastCall(options, A, B, launch, hit.plan, tensors, state)
        hit.plan(A, B, launch)
        return
    # first call of this structure, or tensors that now overlap: validate everything
    # bound by GemmArguments, to the problem A and B make (not guessed from D's shape: a D
    # of the wrong shape is named as such; per-group operands of a grouped GEMM bind too)
    epi = EpilogueArguments.unbound(parsed, **values)
    args = GemmArguments(A, B, values.get("D"), _accumulator(A, lay), epi,
                         allow_tf32=lay.allow_tf32, fp8_fast_accum=lay.fp8_fast_accum, offs=offs)
    plan = launch_plan(args, tune=lay.tune, cc=cc)  # tune="background": a SwitchingPlan
    plan(A, B, launch)
    if len(_fast) > 1024:
        _fast.clear()
    names = ["A", "B", *(n for n, v in launch.items() if isinstance(v, torch.Tensor))]
    _fast[fast_key] = _Structure(parsed, plan, _overlap_pairs(names, tensors, parsed.outputs))


_IDENTITY = "def identity(accum):\n    D = accum\n    return D"
_fast: dict[tuple, "_Structure"] = {}
# per epilogue, the last call's objects: a loop passing the same tensors again skips even
# the structure key (it keeps those tensors alive until the next call)
_last_call: dict[Any, "_LastCall"] = {}


class _Structure:
    """A validated call structure's plan and the memory checks a later call of the structure repeats: the byte spans of each given
    output and each other tensor at another address (``pairs``: positions in the call's
    tensors and their spans, fixed by the structure's shapes, strides and dtypes)."""

    __slots__ = ("parsed", "plan", "pairs")

    def __init__(self, parsed, plan, pairs: tuple):
        self.parsed, self.plan, self.pairs = parsed, plan, pairs

    def disjoint(self, state: list) -> bool:
        """Whether the call's tensors (their ``tensor_state``) pass ``GemmArguments``'s
        overlap checks as the structure's first call did: no given output meets another
        tensor (same-address pairs are part of the structure, checked when it was first
        seen). Else the call is validated from scratch, which says what overlaps."""
        for i, j, si, sj in self.pairs:  # memory.ranges_meet, inline: spans are nonzero here
            a, b = state[i][0], state[j][0]  # the addresses (``tensor_state``'s first)
            if a < b + sj and b < a + si:
                return False
        return True


def _overlap_pairs(names: list[str], tensors: list, outputs: tuple) -> tuple:
    """``_Structure.pairs`` for a validated call: each given output against every other
    tensor at another address (A and B first, then the keywords' tensors, as ``_call_key``
    lists them), with their byte spans; an empty tensor meets nothing."""
    spans = [byte_span(t) for t in tensors]
    ptrs = [t.data_ptr() for t in tensors]
    pairs = []
    for i, n in enumerate(names):
        if n not in outputs or not spans[i]:
            continue
        for j in range(len(tensors)):
            if j != i and spans[j] and ptrs[j] != ptrs[i] and (j > i or names[j] not in outputs):
                pairs.append((i, j, spans[i], spans[j]))
    return tuple(pairs)


class _LastCall:
    """The last call of an epilogue: its options and plan, weak references to its tensors
    (evtfuse keeps no tensor of a call alive: a CUDA graph pool's tensors must die with
    the graph) and the state of those tensors."""

    __slots__ = ("options", "A", "B", "given", "plan", "tensors", "state")

    def __init__(self, options, A, B, given, plan, tensors, state):
        self.options, self.A, self.B, self.plan = options, weakref.ref(A), weakref.ref(B), plan
        self.given = {n: weakref.ref(v) if isinstance(v, torch.Tensor) else v
                      for n, v in given.items()}
        self.tensors, self.state = [weakref.ref(t) for t in tensors], state


def _call_key(A: torch.Tensor, B: torch.Tensor, named: dict) -> tuple[tuple, list, list]:
    """What a cached launch plan depends on in a call's tensors and values, in one pass:
    each tensor's ``kernel.tensor_key`` (dtype, shape, strides, 16-byte alignment, device)
    and which tensors share an address (numbered by first appearance), each other value
    as None or "scalar" (``kernel.value_key``); with the call's tensors and their
    ``tensor_state`` (address, shape, strides, storage size), for the memory checks. Per
    call with new tensors, so kept lean (host time per ``gemm`` call, benchmarks/HISTORY.md
    thirteenth session)."""
    seen: dict[int, int] = {}
    parts = []
    tensors = []
    state = []
    for n, v in (("A", A), ("B", B), *named.items()):  # no keyword can be named A or B
        if isinstance(v, torch.Tensor):
            st = tensor_state(v)
            p, shape, strides, _storage = st
            parts.append((n, v.dtype, shape, strides, not p & 15, v.device,
                          seen.setdefault(p, len(seen))))
            tensors.append(v)
            state.append(st)
        else:
            parts.append((n, None if v is None else "scalar"))
    return tuple(parts), tensors, state


def _same_objects(now: dict, before: dict) -> bool:
    """Whether ``now`` passes the same tensors (and None values) as ``before`` (tensors
    held as weak references), scalars free to differ."""
    if now.keys() != before.keys():
        return False
    for name, v in now.items():
        w = before[name]
        if type(w) is weakref.ref:
            if v is not w():
                return False  # another tensor (or the last one is gone)
            continue
        if v is w:
            continue
        if isinstance(v, (torch.Tensor, torch.dtype)) or isinstance(w, torch.dtype) \
                or v is None or w is None:
            return False  # another tensor, dtype or None: check the structure
    return True


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
