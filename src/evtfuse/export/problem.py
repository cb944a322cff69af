"""What an export is made for: the epilogue bound to a problem description, without tensors.

Layer: export (beside the backends: it reads the DAG, never source text). An export is
not made for tensors but for a description of them: each parameter's kind (a runtime
number, a device scalar, a per-row or per-column vector, a full tensor) and dtype, each
output's kind and dtype. ``bind_description`` turns that description into meta tensors
(shapes only, no memory), binds the parsed epilogue with ``frontend.bind`` at a symbolic
problem size, and runs ``passes.optimize``: the same checked, optimised DAG the Triton
backend compiles for tensors of those kinds (``evtfuse show`` builds it the same way from
its ``--operand``/``--output`` flags, with real tensors).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch

from .. import ir
from ..errors import EpilogueError
from ..frontend import ParsedEpilogue, bind, parse_epilogue
from ..passes import optimize

OPERAND_KINDS = ("runtime", "scalar", "row", "col", "full")  # runtime: a Python number
OUTPUT_KINDS = ("full", "row", "col", "scalar", "none")
# the symbolic problem the description is bound at: distinct M and N (so that no shape can
# read as another kind) and L = 1 (an export is one GEMM, not a batch)
SYMBOLIC_MN = (256, 128)


@dataclass(frozen=True)
class Description:
    """Each parameter's and output's (kind, dtype); dtype None for runtime numbers and
    outputs that are not stored."""

    operands: tuple[tuple[str, str, torch.dtype | None], ...]
    outputs: tuple[tuple[str, str, torch.dtype | None], ...]


def _dtype(text: str, what: str) -> torch.dtype:
    dtype = ir.dtype_named(text)
    if dtype is None:
        raise EpilogueError(f"{what}: unknown dtype '{text}'; use f16, bf16 or f32",
                            variable=what.split()[0])
    return dtype


def _split(name: str, value: str, allowed: tuple[str, ...], what: str) -> tuple[str, str | None]:
    if not isinstance(value, str):
        raise EpilogueError(f"{what} {name}: give its kind as a string (one of "
                            f"{', '.join(allowed)}, optionally ':DTYPE'), not {value!r}",
                            variable=name)
    kind, _, dt = value.partition(":")
    kind = kind.strip()
    if kind not in allowed:
        raise EpilogueError(f"{what} {name}={value!r}: the kind is one of {', '.join(allowed)}",
                            variable=name)
    return kind, dt.strip() or None


def describe(parsed: ParsedEpilogue, operands: Mapping[str, str] | None,
             outputs: Mapping[str, str] | None, c_dtype: torch.dtype,
             d_dtype: torch.dtype) -> Description:
    """The description of ``parsed``'s parameters and outputs: the kinds given, else the
    CLI's defaults (``alpha``/``beta`` runtime numbers, ``bias`` a per-column vector, any
    other parameter a full tensor; every output full). Full tensors default to ``c_dtype``
    (operands) and ``d_dtype`` (outputs); vectors, scalars and reductions to f32."""
    operands, outputs = dict(operands or {}), dict(outputs or {})
    for name in operands:
        if name not in parsed.params:
            raise EpilogueError(f"operands: '{name}' is not a parameter of {parsed.name}"
                                f"(accum, {', '.join(parsed.params)})", variable=name)
    for name in outputs:
        if name not in parsed.outputs:
            raise EpilogueError(f"outputs: '{name}' is not an output of {parsed.name} (it "
                                f"returns {', '.join(parsed.outputs)})", variable=name)
    ops = []
    for p in parsed.params:
        default = {"alpha": "runtime", "beta": "runtime", "bias": "col"}.get(p, "full")
        kind, dt = _split(p, operands.get(p, default), OPERAND_KINDS, "operand")
        if kind == "runtime":
            if dt:
                raise EpilogueError(f"operand {p}: a runtime number has no dtype (it is "
                                    "passed as a float)", variable=p)
            ops.append((p, kind, None))
        else:
            ops.append((p, kind, _dtype(dt, f"{p} operand") if dt else
                        (c_dtype if kind == "full" else torch.float32)))
    outs = []
    for o in parsed.outputs:
        kind, dt = _split(o, outputs.get(o, "full"), OUTPUT_KINDS, "output")
        if kind == "none":
            outs.append((o, kind, None))
        else:
            outs.append((o, kind, _dtype(dt, f"{o} output") if dt else
                         (d_dtype if kind == "full" else torch.float32)))
    return Description(tuple(ops), tuple(outs))


def _meta(kind: str, dtype: torch.dtype | None, output: bool) -> Any:
    M, N = SYMBOLIC_MN
    if kind == "runtime":
        return 1.0
    if kind == "none":
        return None
    shape = {"full": (M, N), "row": (M, 1), "col": (N,),
             "scalar": (1,) if output else ()}[kind]
    return torch.empty(shape, dtype=dtype, device="meta")


def bind_description(epilogue: Any, description_of) -> tuple[ParsedEpilogue, Description, ir.Dag]:
    """Parse ``epilogue`` (a function, its source, or a parsed epilogue: ``ast`` only, never
    executed), describe it with ``description_of(parsed)``, bind it at the symbolic problem
    and optimise it: (parsed, description, optimised DAG)."""
    parsed = parse_epilogue(epilogue)
    desc = description_of(parsed)
    values = {name: _meta(kind, dt, False) for name, kind, dt in desc.operands}
    values.update({name: _meta(kind, dt, True) for name, kind, dt in desc.outputs})
    M, N = SYMBOLIC_MN
    dag = bind(parsed, values, (1, M, N), rank=2)
    return parsed, desc, optimize(dag)


__all__ = ["OPERAND_KINDS", "OUTPUT_KINDS", "Description", "describe", "bind_description"]
