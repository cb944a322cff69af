"""Benchmark workloads: what each computes, its operands and outputs, and its peers' forms.

Layer: bench (definitions; pure, no GPU needed). A ``Workload`` names an epilogue of
``epilogues.py`` (what evtfuse runs), the same computation in plain torch (what eager
PyTorch and ``torch.compile`` run, and what a CPU test checks against the reference
evaluator), and, where PyTorch reaches one, the cuBLASLt call that fuses it. Operands
and outputs are described by kind, so that inputs can be made at any size and the
bytes an ideal kernel moves can be counted without a GPU.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch

from ..ir import dtype_named
from . import epilogues as E

# ----------------------------------------------------------------------------- dtypes

# the suite's names of its dtypes (its results' "dtype"), read through the one table of
# dtype names (``ir.DTYPE_NAMES``)
_NAMES = ("bf16", "fp16", "fp32")
DTYPES: Mapping[str, torch.dtype] = {name: dtype_named(name) for name in _NAMES}
FP8 = dtype_named("fp8e4m3") if hasattr(torch, "float8_e4m3fn") else None
# fp8 inputs: evtfuse (``fp8_fast_accum``) and cuBLAS's peers (``use_fast_accum``) are
# measured in the same accumulation mode: fast, the tensor cores' reduced precision over
# all of K (evtfuse's default; benchmarks/HISTORY.md, nineteenth session, measures both modes)
FP8_FAST_ACCUM = True


def dtype_name(dtype: torch.dtype) -> str:
    for name, dt in (*DTYPES.items(), ("fp8e4m3", FP8)):
        if dt is not None and dt == dtype:
            return name
    return str(dtype).replace("torch.", "")


def element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


# ----------------------------------------------------------------------------- shapes

Shape = tuple[int, int, int]  # (M, N, K)

DEFAULT_SHAPES: tuple[Shape, ...] = (  # run order: the target shapes first
    (4096, 4096, 4096),
    (8192, 8192, 1024),
    (8192, 8192, 8192),
    (2048, 2048, 2048),
    (16384, 4096, 4096),
    (64, 8192, 8192),
)
QUICK_SHAPES: tuple[Shape, ...] = ((4096, 4096, 4096), (8192, 8192, 1024))
QUICK_WORKLOADS: tuple[str, ...] = ("identity", "alpha_beta", "relu_aux", "bce_loss")
LMHEAD_SHAPE: Shape = (8192, 128256, 4096)


def parse_shape(text: str) -> Shape:
    """``"4096"`` -> (4096, 4096, 4096); ``"8192x8192x1024"`` -> (M, N, K)."""
    t = text.strip().lower().replace("*", "x")
    m = re.fullmatch(r"(\d+)(?:\^3)?", t)
    if m:
        n = int(m.group(1))
        return (n, n, n)
    parts = t.split("x")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"shape {text!r}: write N (for N^3) or MxNxK, e.g. 8192x8192x1024")
    M, N, K = (int(p) for p in parts)
    if min(M, N, K) <= 0:
        raise ValueError(f"shape {text!r}: sizes must be positive")
    return (M, N, K)


def shape_str(shape: Sequence[int]) -> str:
    M, N, K = shape
    return f"{M}^3" if M == N == K else f"{M}x{N}x{K}"


# ----------------------------------------------------------------------------- specs


@dataclass(frozen=True)
class Operand:
    """An epilogue input. ``kind``: full (M,N) | col (N,) | row (M,1) | py_scalar |
    dev_scalar (0-d fp32 tensor); ``init``: randn | labels (0/1) | targets (int64 class ids,
    in [0, N)) | a number. ``peer_only`` operands go to the peers' torch forms only."""

    name: str
    kind: str
    init: Any = "randn"
    dtype: str = "in"  # "in" (the inputs' dtype, fp8 excluded -> bf16), "fp32", "int64"
    peer_only: bool = False


@dataclass(frozen=True)
class OutputSpec:
    """An epilogue output: full (M,N) | row (M,1) | scalar (1,); ``stored=False`` is
    passed as None (computed for its consumers, never written)."""

    name: str
    kind: str = "full"
    dtype: str = "in"  # "in" (the inputs' dtype) | "fp32" | "fp8"
    stored: bool = True


@dataclass(frozen=True)
class Workload:
    name: str
    title: str
    epilogue: Callable[..., Any]
    operands: tuple[Operand, ...]
    outputs: tuple[OutputSpec, ...]
    torch_epilogue: Callable[..., tuple]  # (acc, **operands) -> outputs, return order
    lt: Callable[..., tuple] | None = None  # (A, B, **operands) -> outputs (None = not made)
    lt_name: str = ""
    lt_partial: bool = False  # the cuBLASLt call does only part of the workload
    fp8: bool = False  # inputs are fp8 e4m3 whatever --dtype says; B is column-major
    shapes: tuple[Shape, ...] | None = None  # own shapes (ignores --shapes)
    reduction: bool = False
    notes: str = ""

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.outputs)

    @property
    def stored_outputs(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.outputs if o.stored)

    def input_dtype(self, run_dtype: torch.dtype) -> torch.dtype:
        return FP8 if self.fp8 else run_dtype

    def value_dtype(self, run_dtype: torch.dtype) -> torch.dtype:
        """The dtype of full operands and 'in' outputs (bf16 when inputs are fp8)."""
        return torch.bfloat16 if self.fp8 else run_dtype

    def output_dtype(self, spec: OutputSpec, run_dtype: torch.dtype) -> torch.dtype:
        if spec.dtype == "fp32":
            return torch.float32
        if spec.dtype == "fp8":
            return FP8
        return self.value_dtype(run_dtype)

    def operand_dtype(self, spec: Operand, run_dtype: torch.dtype) -> torch.dtype:
        return {"fp32": torch.float32, "int64": torch.int64}.get(spec.dtype,
                                                                 self.value_dtype(run_dtype))

    # -- the peers' whole functions (matmul + epilogue) in plain torch
    def matmul(self, A: torch.Tensor, B: torch.Tensor, ops: Mapping[str, Any]) -> torch.Tensor:
        """cuBLAS's A @ B for this workload (``torch._scaled_mm`` for fp8, to bf16)."""
        if self.fp8:
            one = ops["one"]
            return torch._scaled_mm(A, B, scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                                    use_fast_accum=FP8_FAST_ACCUM)
        return A @ B

    def eager(self, A: torch.Tensor, B: torch.Tensor, **ops: Any) -> tuple:
        if self.fp8:  # fold the scale into the GEMM, as a PyTorch user does
            acc = torch._scaled_mm(A, B, scale_a=ops["scale"], scale_b=ops["one"],
                                   out_dtype=torch.bfloat16, use_fast_accum=FP8_FAST_ACCUM)
            return _fp8_after_scaled_mm(acc)
        return self.torch_epilogue(A @ B, **self.epilogue_operands(ops))

    def epilogue_operands(self, ops: Mapping[str, Any]) -> dict[str, Any]:
        return {o.name: ops[o.name] for o in self.operands if not o.peer_only}

    def gemm_arguments(self, A: torch.Tensor, B: torch.Tensor, ops: Mapping[str, Any],
                       outs: Mapping[str, Any]):
        """evtfuse's arguments for one input set (fp32 accumulation): what ``Kernel.run``
        takes, built once instead of per ``evtfuse.gemm`` call."""
        import evtfuse

        epi = evtfuse.EpilogueArguments(self.epilogue, **self.epilogue_operands(ops), **outs)
        return evtfuse.GemmArguments(A, B, outs.get("D"), torch.float32, epi,
                                     **self.gemm_options())

    def gemm_options(self) -> dict[str, Any]:
        """evtfuse's keyword options for this workload: fp8 inputs accumulate as the
        cuBLAS peers are measured (``FP8_FAST_ACCUM``)."""
        return {"fp8_fast_accum": FP8_FAST_ACCUM} if self.fp8 else {}


def _as_tuple(x) -> tuple:
    return x if isinstance(x, tuple) else (x,)


# ----------------------------------------------------------------------------- torch forms
# Plain torch, as a PyTorch user writes it; they run on any dtype (the benchmark's bf16
# accumulator, the tests' fp32 one) and return the outputs in the epilogue's order.


def _t_identity(acc):
    return (acc,)


def _t_alpha_beta(acc, C, alpha, beta):
    return (alpha * acc + beta * C,)


def _t_bias_relu(acc, bias):
    return (torch.relu(acc + bias),)


def _t_bias_gelu_tanh(acc, bias):
    return (torch.nn.functional.gelu(acc + bias, approximate="tanh"),)


def _t_relu_aux(acc, C, alpha):
    F = alpha * acc + 2.0 * C
    return (torch.relu(F), F)


def _t_silu_mul(acc, X):
    return (torch.nn.functional.silu(acc) * X,)


def _t_row_amax(acc):
    return (acc, acc.abs().amax(dim=-1, keepdim=True).float())


def _t_bce_loss(acc, bias, C):
    f = acc + bias
    t = (1.0 - C) * (-f) + torch.log(torch.clamp(torch.sigmoid(f), 1e-3, 0.999))
    return (f, t.sum(dtype=torch.float32).reshape(1))


def _t_fp8_scale_amax(acc, scale):
    s = acc * scale
    return _fp8_after_scaled_mm(s)


def _fp8_after_scaled_mm(s):
    d = s.to(FP8) if FP8 is not None else s
    return (d, s.abs().amax().float().reshape(1))


def _t_row_logsumexp(acc):
    return (acc, torch.logsumexp(acc, dim=-1, keepdim=True).float())


def _t_lmhead_ce(acc, y):
    lse = torch.logsumexp(acc, dim=-1, keepdim=True).float()
    tgt = acc.gather(-1, y).float()
    return (acc, lse, tgt)


# ----------------------------------------------------------------------------- cuBLASLt forms


def _lt_alpha_beta(A, B, C, alpha, beta):
    return (torch.addmm(C, A, B, beta=beta, alpha=alpha),)


def _lt_bias_relu(A, B, bias):
    return (torch._addmm_activation(bias, A, B, use_gelu=False),)


def _lt_bias_gelu_tanh(A, B, bias):
    return (torch._addmm_activation(bias, A, B, use_gelu=True),)


def _lt_fp8(A, B, scale, one):
    return (torch._scaled_mm(A, B, scale_a=scale, scale_b=one, out_dtype=FP8,
                             use_fast_accum=FP8_FAST_ACCUM), None)


# ----------------------------------------------------------------------------- the list

_C = Operand("C", "full")
_BIAS = Operand("bias", "col")
_D = OutputSpec("D")

WORKLOADS: tuple[Workload, ...] = (
    Workload("identity", "D = acc", E.identity, (), (_D,), _t_identity),
    Workload("alpha_beta", "alpha*acc + beta*C", E.alpha_beta,
             (_C, Operand("alpha", "py_scalar", 1.25), Operand("beta", "py_scalar", 0.5)),
             (_D,), _t_alpha_beta, lt=_lt_alpha_beta, lt_name="torch.addmm"),
    Workload("bias_relu", "relu(acc + bias_col)", E.bias_relu, (_BIAS,), (_D,), _t_bias_relu,
             lt=_lt_bias_relu, lt_name="torch._addmm_activation"),
    Workload("bias_gelu_tanh", "gelu_tanh(acc + bias_col)", E.bias_gelu_tanh, (_BIAS,), (_D,),
             _t_bias_gelu_tanh, lt=_lt_bias_gelu_tanh, lt_name="torch._addmm_activation(gelu)"),
    Workload("relu_aux", "F=alpha*acc+2C; D=relu(F); out D,F", E.relu_aux,
             (_C, Operand("alpha", "py_scalar", 1.25)), (_D, OutputSpec("F")), _t_relu_aux),
    Workload("silu_mul", "silu(acc) * X", E.silu_mul, (Operand("X", "full"),), (_D,),
             _t_silu_mul),
    Workload("row_amax", "D = acc; amax = max(abs(acc)) per row", E.row_amax, (),
             (_D, OutputSpec("amax", "row", "fp32")), _t_row_amax, reduction=True),
    Workload("bce_loss", "BCE loss sum (bias_col, labels C), D not stored", E.bce_loss,
             (_BIAS, Operand("C", "full", "labels")),
             (OutputSpec("D", stored=False), OutputSpec("loss", "scalar", "fp32")), _t_bce_loss,
             reduction=True),
    Workload("fp8_scale_amax", "fp8: D = fp8(acc*scale); amax = max(abs(D))", E.fp8_scale_amax,
             (Operand("scale", "dev_scalar", 0.75, "fp32"),
              Operand("one", "dev_scalar", 1.0, "fp32", peer_only=True)),
             (OutputSpec("D", dtype="fp8"), OutputSpec("amax", "scalar", "fp32")),
             _t_fp8_scale_amax, lt=_lt_fp8, lt_name="torch._scaled_mm(out fp8)", lt_partial=True,
             fp8=True, reduction=True,
             notes="mm = torch._scaled_mm alone (bf16 out); lt computes no amax"),
    Workload("row_logsumexp", "D = acc; lse = logsumexp(acc) per row", E.row_logsumexp, (),
             (_D, OutputSpec("lse", "row", "fp32")), _t_row_logsumexp, reduction=True),
    Workload("lmhead_ce", "LM head: lse, target logit per row; logits not stored", E.lmhead_ce,
             (Operand("y", "row", "targets", "int64"),),
             (OutputSpec("D", stored=False), OutputSpec("lse", "row", "fp32"),
              OutputSpec("tgt", "row", "fp32")), _t_lmhead_ce, shapes=(LMHEAD_SHAPE,),
             reduction=True, notes="loss = mean(lse - tgt); x (8192x4096) @ W (4096x128256)"),
)
BY_NAME: Mapping[str, Workload] = {w.name: w for w in WORKLOADS}


def select_workloads(names: Sequence[str] | None) -> list[Workload]:
    if not names:
        return list(WORKLOADS)
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise ValueError(f"unknown workload(s) {', '.join(unknown)}; known: "
                         f"{', '.join(BY_NAME)}")
    return [BY_NAME[n] for n in names]


def cells_for(workloads: Sequence[Workload], shapes: Sequence[Shape]) -> list[tuple[Workload, Shape]]:
    """(workload, shape) pairs in run order: shape by shape, then the own-shape workloads."""
    cells = [(w, s) for s in shapes for w in workloads if w.shapes is None]
    cells += [(w, s) for w in workloads if w.shapes is not None for s in w.shapes]
    return cells


# ----------------------------------------------------------------------------- sizes


def flops(shape: Shape) -> float:
    M, N, K = shape
    return 2.0 * M * N * K


def _numel(kind: str, M: int, N: int) -> int:
    return {"full": M * N, "col": N, "row": M, "dev_scalar": 1, "scalar": 1,
            "py_scalar": 0}[kind]


def count_bytes(w: Workload, shape: Shape, run_dtype: torch.dtype) -> dict[str, int]:
    """Bytes an ideal fused kernel moves, each tensor touched once: A, B, every epilogue
    input, every stored output. Keys: each name, and ``total``."""
    M, N, K = shape
    ein = element_size(w.input_dtype(run_dtype))
    out: dict[str, int] = {"A": M * K * ein, "B": K * N * ein}
    for o in w.operands:
        if o.peer_only:
            continue
        out[o.name] = _numel(o.kind, M, N) * element_size(w.operand_dtype(o, run_dtype))
    for s in w.outputs:
        out[s.name] = _numel(s.kind, M, N) * element_size(w.output_dtype(s, run_dtype)) \
            if s.stored else 0
    out["total"] = sum(out.values())
    return out


# ----------------------------------------------------------------------------- inputs


def make_inputs(w: Workload, shape: Shape, run_dtype: torch.dtype, device: Any = "cpu",
                seed: int = 0) -> dict[str, Any]:
    """One input set: A (M,K), B (K,N) (column-major for fp8) and every operand.

    A and B are scaled so that the accumulator is about N(0, 1) whatever K is."""
    M, N, K = shape
    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(seed)  # made on the device: fast at any size
    s = K ** -0.25
    in_dtype = w.input_dtype(run_dtype)

    def randn(*size):
        return torch.randn(*size, generator=g, device=dev)

    A = (randn(M, K) * s).to(device=device, dtype=in_dtype)
    if w.fp8:
        B = (randn(N, K) * s).to(device=device, dtype=in_dtype).t()  # column-major (K, N)
    else:
        B = (randn(K, N) * s).to(device=device, dtype=in_dtype)
    values: dict[str, Any] = {"A": A, "B": B}
    for o in w.operands:
        dt = w.operand_dtype(o, run_dtype)
        size = {"full": (M, N), "col": (N,), "row": (M, 1), "dev_scalar": ()}.get(o.kind)
        if o.kind == "py_scalar":
            values[o.name] = float(o.init)
        elif isinstance(o.init, (int, float)) and not isinstance(o.init, bool):
            values[o.name] = torch.full(size, float(o.init), dtype=dt, device=device)
        elif o.init == "labels":
            values[o.name] = (torch.rand(*size, generator=g, device=dev) < 0.5).to(dtype=dt)
        elif o.init == "targets":
            values[o.name] = torch.randint(0, N, size, generator=g, device=dev).to(dtype=dt)
        else:
            values[o.name] = (randn(*size) * (0.5 if o.kind == "col" else 1.0)).to(
                device=device, dtype=dt)
    return values


def make_outputs(w: Workload, shape: Shape, run_dtype: torch.dtype, device: Any = "cpu",
                 poison: bool = True, store_all: bool = False) -> dict[str, torch.Tensor | None]:
    """Preallocated outputs, NaN-filled when ``poison`` (so that an output a kernel never
    writes cannot pass the check); None for the unstored ones unless ``store_all``."""
    M, N, _ = shape
    outs: dict[str, torch.Tensor | None] = {}
    for s in w.outputs:
        if not (s.stored or store_all):
            outs[s.name] = None
            continue
        size = {"full": (M, N), "row": (M, 1), "scalar": (1,)}[s.kind]
        dt = w.output_dtype(s, run_dtype)
        t = torch.empty(size, dtype=dt, device=device)
        if poison:
            try:
                t.fill_(float("nan"))
            except (RuntimeError, NotImplementedError):  # a dtype without fill: poison via fp32
                t.copy_(torch.full(size, float("nan"), device=device))
        outs[s.name] = t
    return outs


def set_bytes(values: Mapping[str, Any], outputs: Mapping[str, Any] | None = None) -> int:
    """Device bytes held by one input set (and its preallocated outputs)."""
    total = 0
    for v in list(values.values()) + list((outputs or {}).values()):
        if isinstance(v, torch.Tensor):
            total += v.numel() * v.element_size()
    return total


def rotation_count(one_set_bytes: int, l2_bytes: int = 50 * 2**20, max_sets: int = 8) -> int:
    """How many input sets to rotate among so that consecutive calls miss in L2."""
    if one_set_bytes <= 0:
        return max_sets
    if one_set_bytes >= l2_bytes:
        return 1
    return max(2, min(max_sets, math.ceil(2 * l2_bytes / one_set_bytes)))


def parse_cell(text: str) -> tuple[Workload, Shape]:
    """``"alpha_beta@2048"`` (a cell as the probe scripts name it) -> workload and shape."""
    name, sep, shape = text.partition("@")
    if not sep:
        raise ValueError(f"cell {text!r}: write workload@shape, e.g. alpha_beta@2048")
    return select_workloads([name])[0], parse_shape(shape)


def probe_set(w: Workload, shape: Shape, seed: int = 0, run_dtype: torch.dtype = torch.bfloat16,
              device: Any = "cuda") -> tuple[dict[str, Any], dict[str, torch.Tensor | None]]:
    """One input set and its outputs, not poisoned (for timing probes, not checks)."""
    return (make_inputs(w, shape, run_dtype, device, seed),
            make_outputs(w, shape, run_dtype, device, poison=False))


__all__ = ["Workload", "Operand", "OutputSpec", "WORKLOADS", "BY_NAME", "DEFAULT_SHAPES",
           "QUICK_SHAPES", "QUICK_WORKLOADS", "LMHEAD_SHAPE", "parse_shape", "shape_str",
           "select_workloads", "cells_for", "flops", "count_bytes", "make_inputs",
           "make_outputs", "rotation_count", "set_bytes", "DTYPES", "dtype_name", "parse_cell",
           "probe_set"]
