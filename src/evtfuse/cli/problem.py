"""Problems from flags: dtypes, ``--mnkl``, ``NAME=VALUE`` lists, and the operands they make.

Layer: cli. ``problem_spec_from_flags`` turns ``run``/``show``/``profile`` options into a
``ProblemSpec``; ``build_problem`` makes A, B and a tensor (or number) for every parameter and
output of the epilogue, seeded, on the chosen device, as ``GemmArguments``. Bad input raises
``CliError``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..ir import dtype_named
from .base import CliError, log
from .device import Device


def parse_dtype(name: str):
    dtype = dtype_named(name)
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


def _fmt_bytes(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} EiB"  # unreachable


def _mnkl_text(spec: ProblemSpec) -> str:
    return f"--mnkl {spec.M},{spec.N},{spec.K},{spec.L}"


def problem_bytes(spec: ProblemSpec, parsed: Any) -> tuple[int, int]:
    """What ``build_problem`` allocates for ``parsed`` at ``spec``'s sizes, in bytes: on the
    device (A, B, every tensor operand and stored output, in their dtypes) and in host
    staging (operands are drawn in fp32 on the CPU and scaled: twice the largest in fp32),
    computed in Python integers before anything is allocated."""
    import torch

    L, M, N, K = spec.L, spec.M, spec.N, spec.K
    NB = 2 * N if parsed.gated else N

    def size(dtype) -> int:
        return dtype.itemsize

    def count(shape) -> int:
        n = 1
        for d in shape:
            n *= d
        return n

    ab = L * K * (M + NB)
    device = ab * size(spec.ab_dtype)
    drawn = [L * M * K, L * K * NB]  # elements drawn in fp32 on the host
    for p in parsed.params:
        kind, dtype = spec.operands.get(p, (None, None))
        if kind is None:
            if p in spec.scalars or p in ("alpha", "beta"):
                continue  # runtime scalars
            kind = "col" if p == "bias" else "full"
        n = count(_shape_for(kind, spec, output=False))
        device += n * size(dtype or (spec.c_dtype if kind == "full" else torch.float32))
        drawn.append(n)
    for o in parsed.outputs:
        kind, dtype = spec.outputs.get(o, ("full", None))
        if kind != "none":
            device += count(_shape_for(kind, spec, output=True)) * size(
                dtype or (spec.d_dtype if kind == "full" else torch.float32))
    return device, 8 * max(drawn)


def available_bytes(device: Device) -> int | None:
    """Memory free for the problem: the GPU's free memory, or the host's available memory
    (``MemAvailable`` in /proc/meminfo, else the free physical pages); None when unknown."""
    if not device.interpreter:
        import torch

        try:
            return int(torch.cuda.mem_get_info(device.torch_device)[0])
        except (RuntimeError, AssertionError):
            return None
    return host_available_bytes()


def host_available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import os

        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits(spec: ProblemSpec, parsed: Any, device: Device) -> None:
    """Refuse, naming ``--mnkl``, a problem whose tensors cannot be allocated where it runs,
    before allocating any of them."""
    on_device, staging = problem_bytes(spec, parsed)
    host = host_available_bytes()
    if device.interpreter:
        need, have, where = on_device + staging, host, "the host has"
    else:
        need, have, where = on_device, available_bytes(device), "the GPU has"
        if host is not None and staging > host:  # operands are drawn on the host first
            need, have, where = staging, host, "drawing them in fp32 needs as much; the host has"
    if have is not None and need > have:
        raise CliError(f"{_mnkl_text(spec)}: the operands and outputs need "
                       f"{_fmt_bytes(on_device)} ({_fmt_bytes(need)} with what is drawn on the "
                       f"host) and {where} {_fmt_bytes(have)} available; give smaller sizes")


class allocation_errors:
    """A context in which an allocation that fails (torch's out-of-memory errors, on the GPU
    or the host) becomes a ``CliError`` naming ``--mnkl``: the estimate of ``check_fits``
    leaves out what verification and timing allocate later."""

    def __init__(self, spec: ProblemSpec):
        self.spec = spec

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        import torch

        if exc is None:
            return False
        text = str(exc)
        if isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or (
                isinstance(exc, RuntimeError) and (
                    "can't allocate memory" in text or "out of memory" in text)):
            first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
            raise CliError(f"{_mnkl_text(self.spec)}: the problem does not fit in memory "
                           f"({first[:200]}); give smaller sizes") from None
        return False


def build_problem(source: str, spec: ProblemSpec, device: Device) -> BuiltProblem:
    """Make A, B and a tensor (or number) for every parameter and output of ``source``;
    a problem too large for the memory where it runs is refused first (``check_fits``)."""
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
    check_fits(spec, parsed, device)
    with allocation_errors(spec):
        return _build(source, parsed, spec, device)


def _build(source: str, parsed: Any, spec: ProblemSpec, device: Device) -> BuiltProblem:
    import torch

    from ..arguments import EpilogueArguments, GemmArguments

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
