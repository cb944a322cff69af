"""The frontend's reading of values: what an operand or an output is, from its shape.

Layer: frontend (core: ``ir`` and ``errors``; values are looked at, never computed with).
``classify_operand`` and ``classify_output`` (docs/architecture.md, "the tensor's shape
decides its kind"), ``check_names`` / ``check_given`` (every parameter and output given,
nothing else), a grouped GEMM's operands and outputs (``operand_specs``,
``check_grouped_output``) and ``problem_shape_of``.
"""

from __future__ import annotations

import numbers
from dataclasses import replace
from typing import Any, Mapping

import torch

from .. import ir
from ..errors import EpilogueError, not_an_operand, scalar_value
from ..ir import OperandKind, OperandSpec, OutputKind
from ..optable import FP8_DTYPES
from .syntax import ParsedSyntax


_LOADABLE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8,
                    torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool)
_STORABLE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64) + FP8_DTYPES


def _fmt_shape(shape) -> str:
    return "(" + ", ".join(str(int(s)) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def _dims(name: str, shape: tuple[int, ...], problem: tuple[int, int, int], what: str,
          where: str) -> tuple[bool, bool, bool]:
    """Right-align ``shape`` with (L, M, N); which of l, m, n the tensor spans."""
    L, M, N = problem
    if len(shape) > 3:
        raise EpilogueError(f"{what} '{name}' has shape {_fmt_shape(shape)} with "
                            f"{len(shape)} dimensions; at most 3 (L, M, N) are allowed{where}",
                            variable=name)
    padded = (1,) * (3 - len(shape)) + tuple(int(s) for s in shape)
    spans = []
    for size, full, dim in zip(padded, (L, M, N), "LMN"):
        if size == full:
            spans.append(True)
        elif size == 1:
            spans.append(False)
        else:
            raise EpilogueError(
                f"{what} '{name}' has shape {_fmt_shape(shape)}, which does not broadcast to "
                f"the output (L, M, N) = ({L}, {M}, {N}): its {dim} dimension is {size}, "
                f"not 1 or {full}{where}", variable=name)
    return spans[0] and L > 1, spans[1], spans[2]


def classify_operand(name: str, value: Any, problem: tuple[int, int, int]) -> OperandSpec:
    """The operand's kind from its Python type and shape (docs/architecture.md's table)."""
    if isinstance(value, bool) or value is None:
        raise not_an_operand(name, value)
    if isinstance(value, numbers.Real):
        scalar_value(name, value)  # one float() can hold (10**400 is an error naming it)
        return OperandSpec(name, OperandKind.RUNTIME_SCALAR, None)
    if not isinstance(value, torch.Tensor):
        raise not_an_operand(name, value)
    if value.dtype not in _LOADABLE_DTYPES + FP8_DTYPES:
        raise EpilogueError(f"Argument {name} has dtype {value.dtype}, which an epilogue cannot "
                            "load; use a floating-point or integer tensor", variable=name)
    if value.dim() == 0:
        return OperandSpec(name, OperandKind.DEVICE_SCALAR, value.dtype)
    batched, has_m, has_n = _dims(name, tuple(value.shape), problem, "Argument", "")
    if has_m and has_n:
        kind = OperandKind.FULL
    elif has_m:
        kind = OperandKind.PER_ROW
    elif has_n:
        kind = OperandKind.PER_COL
    else:
        kind = OperandKind.DEVICE_SCALAR
    return OperandSpec(name, kind, value.dtype, batched)


def classify_output(name: str, value: Any, problem: tuple[int, int, int],
                    reduction: bool = False) -> tuple[OutputKind, torch.dtype | None, bool]:
    """How an output is stored. For the result of a reduction, a dimension of size 1 is
    read as reduced even when the problem's M or N is 1 (reducing over one element is
    the same), so that an (M, 1) output stays per-row when N = 1, say."""
    if value is None:
        return OutputKind.NONE, None, False
    if not isinstance(value, torch.Tensor):
        raise EpilogueError(f"Output {name} must be a torch.Tensor (or None to compute it "
                            f"without storing it), not {type(value).__name__}", variable=name)
    if value.dtype not in _STORABLE_DTYPES + (torch.int8, torch.int32, torch.uint8):
        raise EpilogueError(f"Output {name} has dtype {value.dtype}, which an epilogue cannot "
                            "store", variable=name)
    if value.dim() == 0:
        return OutputKind.SCALAR, value.dtype, False
    batched, has_m, has_n = _dims(name, tuple(value.shape), problem, "Output", "")
    if reduction:
        padded = (1,) * (3 - value.dim()) + tuple(value.shape)
        has_m = has_m and padded[1] != 1  # M = 0: an empty (0, 1) result, not a scalar
        has_n = has_n and padded[2] != 1
    kind = {(True, True): OutputKind.FULL, (True, False): OutputKind.ROW,
            (False, True): OutputKind.COL, (False, False): OutputKind.SCALAR}[(has_m, has_n)]
    return kind, value.dtype, batched


def check_names(parsed: ParsedSyntax, given: Mapping[str, Any]) -> None:
    """Every parameter and output provided (the documented message), nothing unexpected."""
    check_given(parsed.name, parsed.params, parsed.outputs, given)


def check_given(fn_name: str, params: tuple[str, ...], outputs: tuple[str, ...],
                given: Mapping[str, Any]) -> None:
    """``check_names`` from the epilogue's names alone (what ``gemm`` knows of it as
    constants under torch.compile)."""
    for p in params:
        if p not in given:
            raise EpilogueError(f"Argument {p} is not provided in the kwargs of the "
                                "EpilogueArguments constructor", variable=p)
    for o in outputs:
        if o not in given:
            raise EpilogueError(f"Argument {o} is not provided in the kwargs of the "
                                "EpilogueArguments constructor", variable=o)
    for k in given:
        if k in params or k in outputs:
            continue
        if k == "accum":
            raise EpilogueError(
                f"Argument accum is given a tensor, but {fn_name} does not return accum: "
                "the accumulator is stored only as a returned output (return ..., accum)",
                variable=k)
        raise EpilogueError(
            f"Argument {k} is not a parameter or an output of the epilogue function "
            f"{fn_name}({', '.join(['accum', *params])}) -> {', '.join(outputs)}", variable=k)


_GROUPED_LAYOUTS = ("a Python number, a 0-d tensor, (G, 1, 1) per group, (N,) or (G, 1, N) per "
                    "column (per group), (T, 1) per row, (T, N) full")


def operand_specs(params: tuple[str, ...], given: Mapping[str, Any],
                  problem: tuple[int, int, int], grouped: bool = False
                  ) -> tuple[OperandSpec, ...]:
    """Each operand's spec, read off its value (``classify_operand``; a grouped GEMM's as
    ``_grouped_operands`` reads them), in parameter order."""
    specs = tuple(classify_operand(p, given[p], problem) for p in params)
    return _grouped_operands(specs, given) if grouped else specs


def _grouped_operands(specs: tuple, given: Mapping[str, Any]) -> tuple:
    """A grouped GEMM's operands, each one of ``_GROUPED_LAYOUTS``: a row belongs to one
    group, so nothing has both a group dimension and rows. Where T is 1 a per-group
    (G, 1, N) or (G, 1, 1) reads as having rows; it is per group (column or scalar)."""
    out = []
    for s in specs:
        if s.batched and s.kind in (OperandKind.FULL, OperandKind.PER_ROW) \
                and given[s.name].dim() == 3 and given[s.name].shape[1] == 1:
            s = replace(s, kind=OperandKind.PER_COL if s.kind is OperandKind.FULL
                        else OperandKind.DEVICE_SCALAR)
        out.append(s)
        if s.batched and s.kind in (OperandKind.FULL, OperandKind.PER_ROW):
            raise EpilogueError(
                f"Argument '{s.name}' has shape {_fmt_shape(tuple(given[s.name].shape))}: in a "
                f"grouped GEMM a row belongs to one group, so a tensor with rows has no group "
                f"dimension; give it (T, N) or (T, 1) (operands: {_GROUPED_LAYOUTS})",
                variable=s.name)
    return tuple(out)


def check_grouped_output(name: str, node, kind: OutputKind, batched: bool, value) -> None:
    """What a grouped GEMM stores: full (T, N) outputs, per-row (T, 1) values, and
    reductions per row (T, 1), per group (G, 1, N) and (G, 1, 1), or over every group's
    rows (N,) and (1,) (no per-group or per-column stores of a value that is not reduced)."""
    if kind is OutputKind.NONE:
        return
    shape = _fmt_shape(tuple(value.shape))
    if node.kind is ir.NodeKind.REDUCE:
        if kind is OutputKind.ROW and batched:
            raise EpilogueError(
                f"output {name} has shape {shape}: a per-row reduction ({node.op}) of a "
                f"grouped GEMM has no group dimension, since a row belongs to one group; "
                f"give it (T, 1) (per group: (G, 1, N) per column, (G, 1, 1) in all)",
                variable=name)
        return
    if kind is OutputKind.FULL and not batched:
        return
    if kind is OutputKind.ROW and not batched:
        return
    raise EpilogueError(f"output {name} has shape {shape}; a grouped GEMM stores full (T, N) "
                        f"outputs and per-row (T, 1) values only (and reductions)",
                        variable=name)


def problem_shape_of(value: Any) -> tuple[int, int, int] | None:
    """(L, M, N) read off a full output tensor, or None when it cannot say."""
    if isinstance(value, torch.Tensor) and value.dim() in (2, 3):
        if value.dim() == 2:
            return 1, int(value.shape[0]), int(value.shape[1])
        return tuple(int(s) for s in value.shape)  # type: ignore[return-value]
    return None
