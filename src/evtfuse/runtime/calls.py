"""From a Python call to one operator call: what ``gemm`` and ``grouped_gemm`` check and
sort before anything runs, and the call of ``torch.ops.evtfuse.gemm`` (``grouped_gemm``)
it ends in.

Layer: runtime.ops, above ``runtime.torch_op`` (the operators' schemas and layouts) and
below every caller: ``runtime.api`` (``gemm``, ``grouped_gemm``: ``read_call``, then the
differentiable operator, DTensor, or ``operator_call``), ``Kernel.run`` under torch.compile
(``run_kernel_through_op``), and the operators built from GEMMs, which run below autograd
on local tensors: their forwards and backwards call ``plain_gemm`` and
``plain_grouped_gemm`` (``runtime.mlp``, ``moe``, ``cross_entropy``,
``grouped_autograd``). An operator call runs the eager implementation its operator has
registered (``runtime.run``); this module never imports it.

Each epilogue is read once per function or string (``epilogue_of``: a constant under
torch.compile); a call's operands and outputs are sorted into the operator's lists (tensors,
names passed None, scalars, outputs) in code torch.compile traces without a graph break.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import torch

from ..arguments import GemmArguments, check_grouped, check_tensors
from ..dag_epilogue import DagEpilogue
from ..errors import EpilogueError, not_an_operand
from ..frontend import EpilogueText, check_given, epilogue_text, parse_epilogue
from ..ir import dtype_named
from . import torch_op
from .torch_op import (Layout, check_backward, check_devices, check_no_grad,
                       check_outputs_writable, constant_result, layout_text, parsed_cache)


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


def output_shape(A: torch.Tensor, B: torch.Tensor, gated: bool = False) -> tuple[int, ...]:
    """Shape of an output gemm allocates: (M, N), or (L, M, N) when A or B is batched;
    ``gated`` (``pairs(accum)``): N is half of B's columns (an odd count is refused when
    the arguments are built)."""
    M, N = A.shape[-2], (B.shape[-1] // 2 if gated else B.shape[-1])
    if A.dim() == 3 or B.dim() == 3:
        return (max(A.shape[0] if A.dim() == 3 else 1, B.shape[0] if B.dim() == 3 else 1), M, N)
    return (M, N)


class CallEpilogue(NamedTuple):
    """What a ``gemm`` call reads of its epilogue, parsed and checked once per function or
    string (``epilogue_of``): the ``EpilogueText`` that crosses the operator's boundary
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
def epilogue_of(epilogue) -> CallEpilogue:
    """An epilogue's ``CallEpilogue``, parsed and checked once per function or string (a DAG
    evtfuse derived, ``DagEpilogue``, is registered under its text instead): a constant,
    under torch.compile too (the function is read here, never traced)."""
    key = epilogue if isinstance(epilogue, str) else getattr(epilogue, "__code__", epilogue)
    hit = _epilogues.get(key)
    if hit is None:
        text, parsed = _read(epilogue)
        _check_keyword_names(parsed)
        hit = _epilogues[key] = CallEpilogue(text.source, text.line_offset, text.where,
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


_epilogues: dict[Any, CallEpilogue] = {}
_IDENTITY = "def identity(accum):\n    D = accum\n    return D"


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


def _check_operands_given(A, B, epi: CallEpilogue, named: dict, call: str = "gemm") -> None:
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


def _check_call_keywords(strangers: list, epi: CallEpilogue, call: str) -> None:
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


def read_call(call: str, A, B, offs, epilogue, accumulator_type, backward: str,
              given: dict) -> tuple:
    """What ``gemm`` (``call``, or ``grouped_gemm`` with ``offs``) checks before anything
    else, in this order, each check raising its own error: A and B, ``backward``,
    ``accumulator_type``, the epilogue (read once: ``epilogue_of``), the ``<name>_dtype``
    keywords, a grouped call's offs (a strided or expanded one copied, on the device), every
    operand given, the devices, and, under grad mode, fp16 accumulation with gradients and
    outputs autograd could not follow. Returns (the epilogue, fp16 accumulation, offs, the
    operands and outputs by name, {output: dtype}, the operator's lists (``_sort``), the
    names of the inputs that require grad)."""
    check_tensors(A, B, call)
    check_backward(backward)
    acc16 = _acc16(A, accumulator_type)
    epi = epilogue_of(_IDENTITY if epilogue is None else epilogue)
    named, dtypes = _split_dtypes(given, epi.outputs)
    if call == "grouped_gemm":
        if isinstance(offs, torch.Tensor) and offs.dim() == 1 and not offs.is_contiguous():
            # the kernels read offs packed: a strided or expanded offs (at most 1024 int32) is
            # copied, on the device (docs/grouped.md); the operator itself refuses one
            offs = offs.contiguous()
        check_grouped(A, B, offs)  # shapes, dtype and device only: offs stays on the device
    _check_operands_given(A, B, epi, named, call)
    lists = _sort(named, epi)
    tensors, tnames, _nones, _scalars, _snames, outs, onames = lists
    check_devices(A, B, tnames, tensors, onames, outs, call=call)
    grad = _requiring_grad(A, B, tensors, tnames)
    _check_acc16_grad(acc16, grad)
    check_outputs_writable(outs, onames, call, recorded=bool(grad))
    return epi, acc16, offs, named, dtypes, lists, grad


def operator_call(A, B, offs, epi: CallEpilogue, options: tuple, acc16: bool, lists: tuple):
    """One call of ``torch.ops.evtfuse.gemm`` (with ``offs``: ``grouped_gemm``) for a read
    call whose outputs are all in ``lists`` (given or allocated); returns them in the
    epilogue's return order (``_returned``). ``options``: (tune, allow_tf32,
    fp8_fast_accum, cc)."""
    tensors, tnames, nones, scalars, snames, outs, onames = lists
    layout = layout_text(tuple(tnames), tuple(nones), tuple(snames), tuple(onames), epi.line,
                         epi.where, epi.from_function, options, acc16=acc16)
    if offs is None:
        torch_op.call(A, B, epi.source, layout, tensors, scalars, outs)
    else:
        torch_op.call_grouped(A, B, offs, epi.source, layout, tensors, scalars, outs)
    return _returned(epi.outputs, onames, outs)


def plain_gemm(A: torch.Tensor, B: torch.Tensor, epilogue=None, *, tune: str = "fast",
               allow_tf32: bool = False, fp8_fast_accum: bool = True,
               accumulator_type: torch.dtype | None = None, cc: int | None = None,
               **operands_and_outputs: Any):
    """``api.gemm`` below autograd, on tensors that are not DTensors: the same checks, the
    missing outputs allocated, one ``evtfuse::gemm`` call. For the operators built from
    GEMMs (their implementations and backward formulas run with grad mode off, on local
    tensors); an input that would need a gradient is an error rather than a result detached
    from the graph."""
    epi, acc16, _, named, dtypes, lists, grad = read_call(
        "gemm", A, B, None, epilogue, accumulator_type, "auto", operands_and_outputs)
    _below_autograd(grad)
    allocate_missing(A, epi.outputs, named, dtypes, lambda: output_shape(A, B, epi.gated),
                     lists[5], lists[6])
    return operator_call(A, B, None, epi, (tune, allow_tf32, fp8_fast_accum, cc), acc16, lists)


def plain_grouped_gemm(A: torch.Tensor, B: torch.Tensor, offs: torch.Tensor, epilogue=None, *,
                       tune: str = "fast", allow_tf32: bool = False,
                       fp8_fast_accum: bool = True, accumulator_type: torch.dtype | None = None,
                       cc: int | None = None, **operands_and_outputs: Any):
    """``api.grouped_gemm`` below autograd, as ``plain_gemm`` is ``gemm``'s."""
    epi, acc16, offs, named, dtypes, lists, grad = read_call(
        "grouped_gemm", A, B, offs, epilogue, accumulator_type, "auto", operands_and_outputs)
    _below_autograd(grad)
    allocate_missing(A, epi.outputs, named, dtypes, grouped_shape(A, B, offs, epi.gated),
                     lists[5], lists[6])
    return operator_call(A, B, offs, epi, (tune, allow_tf32, fp8_fast_accum, cc), acc16, lists)


def grouped_shape(A, B, offs, gated) -> Callable[[], tuple]:
    """The shape of a full output ``grouped_gemm`` allocates, as a function: (T, N) over M,
    (G, M, N) over K; ``gated``: N is half of B's columns (odd: refused when bound)."""
    width = B.shape[-1] // 2 if gated else B.shape[-1]

    def shape():
        return (offs.shape[0], A.shape[0], width) if B.dim() == 2 else (A.shape[0], width)

    return shape


def _below_autograd(grad: tuple) -> None:
    if grad:
        raise RuntimeError(f"evtfuse internal error: plain_gemm runs below autograd, but "
                           f"{', '.join(grad)} require grad (call evtfuse.gemm)")


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


def allocate_missing(A: torch.Tensor, outputs: tuple, named: dict, dtypes: dict,
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


def accumulator_dtype(A: torch.Tensor, lay: Layout) -> torch.dtype:
    """The accumulator dtype of an operator call (its layout's, else the inputs' own)."""
    return torch.float16 if lay.acc16 else _accumulator_of(A.dtype)


def _requiring_grad(A: torch.Tensor, B: torch.Tensor, tensors: list, tnames: list) -> tuple:
    """The names of the inputs a gradient must reach ("A", "B", operands), under grad mode."""
    if not torch.is_grad_enabled():
        return ()
    return tuple(n for n, t in (("A", A), ("B", B), *zip(tnames, tensors)) if t.requires_grad)


def _sort(named: dict, epi: CallEpilogue) -> tuple:
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


def run_kernel_through_op(kernel, args: GemmArguments) -> None:
    """``Kernel.run`` under torch.compile: one ``torch.ops.evtfuse.gemm`` call naming the
    kernel (``kernel.name``; the arguments' outputs are all given)."""
    epi = epilogue_of(args.epilogue.epilogue)
    named = args.epilogue.values
    check_no_grad(args.A, args.B, named)
    tensors, tnames, nones, scalars, snames, outs, onames = _sort(named, epi)
    options = ("none", args.allow_tf32, args.fp8_fast_accum, kernel.target.cc)
    layout = layout_text(tuple(tnames), tuple(nones), tuple(snames), tuple(onames), epi.line,
                         epi.where, epi.from_function, options, kernel.name,
                         acc16=args.accumulator_type == torch.float16)
    torch_op.call(args.A, args.B, epi.source, layout, tensors, scalars, outs)


__all__ = ["CallEpilogue", "epilogue_of", "read_call", "operator_call", "plain_gemm",
           "plain_grouped_gemm", "allocate_missing", "default_output_dtype", "dtype_argument",
           "output_shape", "grouped_shape", "accumulator_dtype", "run_kernel_through_op"]
