"""Problems from flags: dtypes, ``--mnkl``, ``NAME=VALUE`` lists, and the operands they make.

Layer: cli. ``problem_spec_from_flags`` turns ``run``/``show``/``profile`` options into a
``ProblemSpec``; ``build_problem`` makes A, B and a tensor (or number) for every parameter and
output of the epilogue, seeded, on the chosen device, as ``GemmArguments``. Bad input raises
``CliError``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .base import CliError, log
from .device import Device


DTYPE_NAMES = {
    "f32": "float32", "fp32": "float32", "float32": "float32", "float": "float32",
    "f16": "float16", "fp16": "float16", "float16": "float16", "half": "float16",
    "bf16": "bfloat16", "bfloat16": "bfloat16",
    "f64": "float64", "fp64": "float64", "float64": "float64",
    "e4m3": "float8_e4m3fn", "fp8": "float8_e4m3fn", "fp8e4m3": "float8_e4m3fn",
    "float8_e4m3fn": "float8_e4m3fn", "e5m2": "float8_e5m2", "fp8e5m2": "float8_e5m2",
    "float8_e5m2": "float8_e5m2",
    "i8": "int8", "int8": "int8", "u8": "uint8", "uint8": "uint8", "i32": "int32",
    "int32": "int32",
}


def parse_dtype(name: str):
    import torch

    key = DTYPE_NAMES.get(name.strip().lower())
    dtype = getattr(torch, key, None) if key else None
    if dtype is None:
        raise CliError(f"unknown dtype '{name}'; use one of: "
                       "f32, f16, bf16, f64, e4m3, e5m2, i8, u8, i32")
    return dtype


def short_dtype(dtype) -> str:
    from ..ir import dtype_name

    return dtype_name(dtype)


def parse_mnkl(text: str) -> tuple[int, int, int, int]:
    try:
        parts = [int(p) for p in text.replace("x", ",").split(",") if p.strip()]
    except ValueError:
        raise CliError(f"--mnkl takes M,N,K[,L] as integers, got '{text}'") from None
    if len(parts) == 3:
        parts.append(1)
    if len(parts) != 4 or min(parts) < 1:
        raise CliError(f"--mnkl takes M,N,K[,L] (positive integers), got '{text}'")
    return tuple(parts)  # type: ignore[return-value]


def parse_assignments(items: list[str], what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not name.isidentifier() or not value.strip():
            raise CliError(f"{what} takes NAME=VALUE, got '{item}'")
        out[name] = value.strip()
    return out


OPERAND_KINDS = ("full", "row", "col", "scalar", "batch-scalar")
OUTPUT_KINDS = ("full", "row", "col", "scalar", "none")


@dataclass
class ProblemSpec:
    """What ``run``/``show``/``profile`` build: sizes, dtypes, layouts, operand choices."""

    M: int
    N: int
    K: int
    L: int = 1
    ab_dtype: Any = None
    c_dtype: Any = None
    d_dtype: Any = None
    acc_dtype: Any = None
    a_major: str = "k"
    b_major: str = "n"
    scalars: dict[str, float] = field(default_factory=dict)
    operands: dict[str, tuple[str, Any]] = field(default_factory=dict)  # name -> (kind, dtype)
    outputs: dict[str, tuple[str, Any]] = field(default_factory=dict)
    seed: int = 0
    tf32: bool = False
    fp8_fast_accum: bool = True

    @property
    def flops(self) -> float:
        return 2.0 * self.M * self.N * self.K * self.L


@dataclass
class BuiltProblem:
    args: Any  # GemmArguments
    epilogue: Any  # EpilogueArguments
    A: Any
    B: Any
    values: dict[str, Any]
    table: list[str]  # one line per operand/output, for the report


def _shape_for(kind: str, spec: ProblemSpec, output: bool) -> tuple[int, ...]:
    L, M, N = spec.L, spec.M, spec.N
    lead = (L,) if L > 1 else ()
    return {"full": lead + (M, N), "row": lead + (M, 1), "col": (N,),
            "scalar": (1,) if output else (), "batch-scalar": (L, 1, 1)}[kind]


def build_problem(source: str, spec: ProblemSpec, device: Device) -> BuiltProblem:
    """Make A, B and a tensor (or number) for every parameter and output of ``source``."""
    import torch

    from ..arguments import EpilogueArguments, GemmArguments
    from ..frontend import parse_epilogue

    parsed = parse_epilogue(source)
    for name in list(spec.scalars) + list(spec.operands):
        if name not in parsed.params:
            raise CliError(f"'{name}' is not a parameter of {parsed.name}"
                           f"(accum, {', '.join(parsed.params)})")
    for name in spec.outputs:
        if name not in parsed.outputs:
            raise CliError(f"'{name}' is not an output of {parsed.name} "
                           f"(it returns {', '.join(parsed.outputs)})")
    gen = torch.Generator(device="cpu").manual_seed(spec.seed)
    dev = device.torch_device

    def randn(*shape, dtype, scale=1.0):
        t = torch.randn(*shape, generator=gen, dtype=torch.float32) * scale
        return t.to(dtype).to(dev)

    L, M, N, K = spec.L, spec.M, spec.N, spec.K
    lead = (L,) if L > 1 else ()
    # accum ~ N(0, 1) whatever K is, so activations see interesting values
    a_shape = lead + ((M, K) if spec.a_major == "k" else (K, M))
    NB = 2 * N if parsed.gated else N  # gated (pairs(accum)): B holds N pairs of columns
    b_shape = lead + ((K, NB) if spec.b_major == "n" else (NB, K))
    A = randn(*a_shape, dtype=spec.ab_dtype)
    B = randn(*b_shape, dtype=spec.ab_dtype, scale=K ** -0.5)
    if spec.a_major == "m":
        A = A.transpose(-1, -2)
    if spec.b_major == "k":
        B = B.transpose(-1, -2)

    values: dict[str, Any] = {}
    table: list[str] = []
    for p in parsed.params:
        kind, dtype = spec.operands.get(p, (None, None))
        if kind is None:
            if p in spec.scalars:
                values[p] = float(spec.scalars[p])
                table.append(f"{p}: runtime scalar = {values[p]:g}")
                continue
            kind = {"alpha": "runtime", "beta": "runtime", "bias": "col"}.get(p, "full")
            if kind == "runtime":
                values[p] = 1.0 if p == "alpha" else 0.5
                table.append(f"{p}: runtime scalar = {values[p]:g} (default; --{p} to change)")
                continue
        dtype = dtype or (spec.c_dtype if kind == "full" else torch.float32)
        shape = _shape_for(kind, spec, output=False)
        if kind in ("scalar", "batch-scalar"):
            if p in spec.scalars:
                t = torch.full(shape, float(spec.scalars[p]), dtype=dtype, device=dev)
            else:
                t = (torch.rand(shape, generator=gen) + 0.5).to(dtype).to(dev)
        else:
            t = randn(*shape, dtype=dtype)
        values[p] = t
        table.append(f"{p}: {kind} {tuple(shape)} {short_dtype(dtype)}")
    for o in parsed.outputs:
        kind, dtype = spec.outputs.get(o, ("full", None))
        if kind == "none":
            values[o] = None
            table.append(f"{o}: output, not stored")
            continue
        dtype = dtype or (spec.d_dtype if kind == "full" else torch.float32)
        shape = _shape_for(kind, spec, output=True)
        values[o] = torch.empty(shape, dtype=dtype, device=dev)
        table.append(f"{o}: output {kind} {tuple(shape)} {short_dtype(dtype)}")
    epi = EpilogueArguments(source, **values)
    D = values.get("D")
    args = GemmArguments(A=A, B=B, out=D if isinstance(D, torch.Tensor) else None,
                         accumulator_type=spec.acc_dtype, epilogue=epi, allow_tf32=spec.tf32,
                         fp8_fast_accum=spec.fp8_fast_accum)
    return BuiltProblem(args, epi, A, B, values, table)


def problem_spec_from_flags(*, mnkl: str | None, ab_dtype: str | None, c_dtype: str | None,
                            d_dtype: str | None, acc_dtype: str, a_major: str, b_major: str,
                            scalar: list[str], alpha: float | None, beta: float | None,
                            operand: list[str], output: list[str], seed: int, tf32: bool,
                            device: Device, fp8_fast_accum: bool = True) -> ProblemSpec:
    default_mnkl = "128,96,64,1" if device.interpreter else "4096,4096,4096,1"
    M, N, K, L = parse_mnkl(mnkl or default_mnkl)
    if device.interpreter and M * N * K * L > 512 ** 3:
        log.warning("%dx%dx%d (L=%d) through the CPU interpreter will be very slow", M, N, K, L)
    ab = parse_dtype(ab_dtype or ("f16" if device.interpreter else "bf16"))
    c = parse_dtype(c_dtype) if c_dtype else ab
    d = parse_dtype(d_dtype) if d_dtype else c
    if a_major not in ("k", "m"):
        raise CliError(f"--a-major is k (row-major A, K contiguous) or m (column-major), "
                       f"not '{a_major}'")
    if b_major not in ("n", "k"):
        raise CliError(f"--b-major is n (row-major B, N contiguous) or k (column-major), "
                       f"not '{b_major}'")
    scalars: dict[str, float] = {}
    for name, value in parse_assignments(scalar, "--scalar").items():
        try:
            scalars[name] = float(value)
        except ValueError:
            raise CliError(f"--scalar {name}={value}: not a number") from None
    if alpha is not None:
        scalars["alpha"] = alpha
    if beta is not None:
        scalars["beta"] = beta

    def kinds(items: list[str], allowed: tuple[str, ...], what: str) -> dict[str, tuple[str, Any]]:
        out = {}
        for name, value in parse_assignments(items, what).items():
            kind, _, dt = value.partition(":")
            if kind not in allowed:
                raise CliError(f"{what} {name}={value}: kind is one of {', '.join(allowed)}")
            out[name] = (kind, parse_dtype(dt) if dt else None)
        return out

    return ProblemSpec(M, N, K, L, ab, c, d, parse_dtype(acc_dtype), a_major, b_major, scalars,
                       kinds(operand, OPERAND_KINDS, "--operand"),
                       kinds(output, OUTPUT_KINDS, "--output"), seed, tf32, fp8_fast_accum)
