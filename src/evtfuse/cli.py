"""The ``evtfuse`` command: ``demo``, ``run``, ``show``, ``profile``, ``bench``, ``cache``.

Layer: cli (the top). Uses only the public API (``get_kernels``, ``explain``, ``Kernel``,
``evtfuse.reference``, ``evtfuse.runtime.cache``) and never executes user text: an
epilogue given as a string or as ``path.py:fn`` is read and parsed with ``ast``; the file
is never imported.

With a CUDA GPU the commands run there; without one they run small problems through
Triton's CPU interpreter and say so. Exit status: 0 ok, 1 verification failed, 2 bad
input, 3 no kernel supports the problem (the reason is printed), 4 a tool or module is
missing (ncu, ``evtfuse.bench``). Logging goes to the ``evtfuse`` logger: quiet unless
``-v``/``-vv`` or ``EVTFUSE_LOG=info|debug``.
"""

from __future__ import annotations

import ast
import csv
import io
import logging
import os
import shutil
import statistics
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer

log = logging.getLogger("evtfuse")

EXIT_OK, EXIT_VERIFY, EXIT_INPUT, EXIT_UNSUPPORTED, EXIT_MISSING = 0, 1, 2, 3, 4

app = typer.Typer(name="evtfuse", no_args_is_help=True, add_completion=False,
                  help="Custom GEMM epilogues as Python functions, fused into one Triton kernel.",
                  pretty_exceptions_enable=False, rich_markup_mode=None)
cache_app = typer.Typer(no_args_is_help=True, help="The on-disk kernel and tuning cache.")
app.add_typer(cache_app, name="cache")


# ============================================================================ logging

from .logs import setup_logging  # noqa: E402  (shared with library users: evtfuse.logs)


@app.callback()
def _root(verbose: Annotated[int, typer.Option(
        "--verbose", "-v", count=True, help="-v: info, -vv: debug (or EVTFUSE_LOG=debug)")] = 0):
    """evtfuse: write a GEMM epilogue as a Python function; get one fused kernel."""
    setup_logging(verbose)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``evtfuse`` script (and ``python -m evtfuse.cli``)."""
    app(args=argv, prog_name="evtfuse")


# ============================================================================ small helpers

class CliError(Exception):
    """A message for the user and the exit status that goes with it."""

    def __init__(self, message: str, code: int = EXIT_INPUT):
        super().__init__(message)
        self.code = code


def _fail(exc: CliError) -> None:
    typer.echo(f"error: {exc}", err=True)
    raise typer.Exit(exc.code)


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
    from .ir import dtype_name

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


# ============================================================================ epilogue sources

def _looks_like_source(text: str) -> bool:
    return text.lstrip().startswith("def ") or "\n" in text


def load_epilogue_file(spec: str) -> tuple[str, str]:
    """``path.py:fn`` (or ``path.py`` with one epilogue in it) -> (source, where).

    The file is parsed with ``ast`` and never imported or executed. The function's text is
    cut out with ``ast.get_source_segment`` (decorators dropped) and preceded by blank lines
    so that line numbers in error messages are the file's.
    """
    path_s, sep, fn_name = spec.rpartition(":")
    if not sep or not fn_name.isidentifier():
        path_s, fn_name = spec, ""
    path = Path(path_s)
    if not path.is_file():
        raise CliError(f"epilogue file '{path}' does not exist")
    text = path.read_text()
    try:
        tree = ast.parse(text, filename=str(path))
    except SyntaxError as exc:
        raise CliError(f"{path}:{exc.lineno}: not valid Python: {exc.msg}") from None
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    if fn_name:
        chosen = [n for n in fns if n.name == fn_name]
        if not chosen:
            names = ", ".join(n.name for n in fns) or "none"
            raise CliError(f"{path} has no top-level function '{fn_name}' (functions: {names})")
    else:
        chosen = [n for n in fns if n.args.args and n.args.args[0].arg == "accum"]
        if len(chosen) != 1:
            names = ", ".join(n.name for n in chosen) or "none"
            raise CliError(f"{path}: say which epilogue to use as {path}:NAME "
                           f"(functions taking accum first: {names})")
    node = chosen[0]
    segment = ast.get_source_segment(text, node, padded=True)
    source = "\n" * (node.lineno - 1) + textwrap.dedent(segment) + "\n"
    return source, f"{path}:{node.name}"


def resolve_epilogue(epilogue: str | None, epilogue_file: str | None) -> tuple[str, str]:
    """The epilogue source text and a short description of where it came from."""
    if epilogue and epilogue_file:
        raise CliError("give --epilogue or --epilogue-file, not both")
    if epilogue_file:
        return load_epilogue_file(epilogue_file)
    if epilogue:
        return epilogue, "the epilogue string"
    raise CliError("no epilogue: pass --epilogue \"def epi(accum, ...): ...\" or "
                   "--epilogue-file path.py:fn")


def resolve_positional(target: str) -> tuple[str, str]:
    """``show``'s argument: a source string, or ``path.py[:fn]``."""
    if _looks_like_source(target):
        return target, "the epilogue string"
    return load_epilogue_file(target)


# ============================================================================ devices

@dataclass
class Device:
    torch_device: Any
    interpreter: bool
    description: str


def pick_device() -> Device:
    """A CUDA GPU if there is one, else the CPU through Triton's interpreter (turned on here,
    before any kernel module is generated)."""
    import torch

    if torch.cuda.is_available():
        dev = torch.device("cuda")
        return Device(dev, False, f"CUDA GPU: {torch.cuda.get_device_name(dev)}")
    try:
        from .runtime.device import use_interpreter
    except ImportError:
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        use_interpreter()
    return Device(torch.device("cpu"), True,
                  "no CUDA GPU found: running through Triton's CPU interpreter (TRITON_INTERPRET=1)")


def _synchronize(device: Device) -> None:
    if not device.interpreter:
        import torch

        torch.cuda.synchronize(device.torch_device)


def time_ms(fn: Callable[[], Any], device: Device, iterations: int, warmup: int) -> float:
    """Median milliseconds per call (CUDA events on a GPU, wall clock on the CPU)."""
    import torch

    for _ in range(warmup):
        fn()
    _synchronize(device)
    times = []
    if device.interpreter:
        for _ in range(max(iterations, 1)):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    else:
        for _ in range(max(iterations, 1)):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def _api():
    """The evtfuse runtime API (get_kernels, explain); a clear error when it is not there."""
    import evtfuse

    missing = [n for n in ("get_kernels", "explain") if not hasattr(evtfuse, n)]
    if missing:
        raise CliError("the kernel runtime is not available in this evtfuse "
                       f"(evtfuse.{missing[0]} is missing); only the reference evaluator can run",
                       EXIT_MISSING)
    return evtfuse


# ============================================================================ problems

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

    from .arguments import EpilogueArguments, GemmArguments
    from .frontend import parse_epilogue

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
    b_shape = lead + ((K, N) if spec.b_major == "n" else (N, K))
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
                         accumulator_type=spec.acc_dtype, epilogue=epi, allow_tf32=spec.tf32)
    return BuiltProblem(args, epi, A, B, values, table)


def problem_spec_from_flags(*, mnkl: str | None, ab_dtype: str | None, c_dtype: str | None,
                            d_dtype: str | None, acc_dtype: str, a_major: str, b_major: str,
                            scalar: list[str], alpha: float | None, beta: float | None,
                            operand: list[str], output: list[str], seed: int, tf32: bool,
                            device: Device) -> ProblemSpec:
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
                       kinds(output, OUTPUT_KINDS, "--output"), seed, tf32)


# ============================================================================ running

@dataclass
class RunReport:
    kernel: str
    ok: bool | None
    verify_text: str
    fused_ms: float | None
    eager_ms: float | None

    @property
    def speedup(self) -> float | None:
        if self.fused_ms and self.eager_ms:
            return self.eager_ms / self.fused_ms
        return None


TUNE_MODES = ("fast", "exhaustive", "none")


def choose_kernel(args: Any, name_filter: str | None = None, tune: str = "none"):
    """The kernel to run: the first ``get_kernels`` offers whose name contains
    ``name_filter``; else, with ``tune`` "fast"/"exhaustive", the autotuner's choice (timed
    once per problem and kept in the cache, as ``evtfuse.gemm`` does); else the first."""
    api = _api()
    if tune not in TUNE_MODES:
        raise CliError(f"--tune is one of {', '.join(TUNE_MODES)}, not '{tune}'")
    kernels = api.get_kernels(args)
    if name_filter:
        kernels = [k for k in kernels if name_filter in k.name]
    if not kernels:
        why = api.explain(args)
        extra = f" named like '{name_filter}'" if name_filter else ""
        raise CliError(f"no kernel{extra} supports this problem:\n{textwrap.indent(why, '  ')}",
                       EXIT_UNSUPPORTED)
    log.info("kernels offered: %s", ", ".join(k.name for k in kernels))
    if tune != "none" and not name_filter:
        from .runtime.tuner import choose_kernel as tuned_choice

        kernel = tuned_choice(args, tune=tune)
        log.info("tuner (%s) chose %s", tune, kernel.name)
        return kernel
    return kernels[0]


def run_and_report(args: Any, kernel: Any, device: Device, *, eager: Callable[[], Any] | None,
                   verify: bool, iterations: int, warmup: int) -> RunReport:
    """Run ``kernel`` on ``args`` (timed), verify against the reference, time ``eager``."""
    kernel.compile(args)
    verify_text, ok = "", None
    if verify:
        result = kernel.verify(args)
        ok = bool(result)
        verify_text = result.report()
    fused_ms = eager_ms = None
    if iterations > 0:
        fused_ms = time_ms(lambda: kernel.run(args), device, iterations, warmup)
        if eager is not None:
            eager_ms = time_ms(eager, device, iterations, warmup)
    return RunReport(kernel.name, ok, verify_text, fused_ms, eager_ms)


def format_report(rep: RunReport, flops: float | None, device: Device) -> list[str]:
    lines = [f"kernel:   {rep.kernel}"]
    if rep.ok is not None:
        lines.append("verify:   " + ("PASSED" if rep.ok else "FAILED") + " against evtfuse.reference")
        lines += ["          " + ln.strip() for ln in rep.verify_text.splitlines()[1:]]
    if rep.fused_ms is not None:
        t = f"time:     fused {rep.fused_ms:.3f} ms"
        if flops and not device.interpreter:
            t += f" ({flops / rep.fused_ms / 1e9:.1f} TFLOP/s)"
        if rep.eager_ms is not None:
            t += f" | eager torch {rep.eager_ms:.3f} ms"
            if not device.interpreter:
                t += f" | speedup {rep.speedup:.2f}x"
        lines.append(t)
        if device.interpreter:
            lines.append("          (Triton's CPU interpreter: timings are not meaningful and no "
                         "speedup is reported; run on a CUDA GPU)")
    return lines


def eager_of(args: Any) -> Callable[[], Any]:
    """Unfused PyTorch: ``A @ B`` in its dtype, then the epilogue op by op (reference evaluator)."""
    import torch

    from .reference import evaluate

    def eager():
        acc = torch.matmul(args.A, args.B)
        return evaluate(args, accum=acc)

    return eager


# ============================================================================ demo

DEMO_EPILOGUES = {
    "alpha_beta": (
        "alpha-beta with extra X and Y outputs (CuTe DSL EFC example)",
        "def alpha_beta(accum, C, X, alpha, beta, x_factor):\n"
        "    Y = accum\n"
        "    D = accum * alpha + C * beta + X * x_factor\n"
        "    return D, Y\n"),
    "relu_aux": (
        "ReLU with an aux store of the pre-activation (CUTLASS notebook)",
        "def relu_aux(accum, C, alpha, beta):\n"
        "    F = accum * alpha + C * beta\n"
        "    D = relu(F)\n"
        "    return D, F\n"),
}


def _demo_case(name: str, device: Device, mnk: tuple[int, int, int], dtype, iterations: int,
               warmup: int, tune: str = "fast") -> tuple[list[str], bool]:
    import torch

    from .arguments import EpilogueArguments, GemmArguments

    title, source = DEMO_EPILOGUES[name]
    M, N, K = mnk
    dev = device.torch_device
    gen = torch.Generator().manual_seed(2025)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(dtype).to(dev)

    A, B = randn(M, K), randn(K, N, scale=K ** -0.5)
    C, X = randn(M, N), randn(M, N)
    alpha, beta, x_factor = 1.5, 0.5, -0.25
    D, other = torch.empty(M, N, dtype=dtype, device=dev), torch.empty(M, N, dtype=dtype, device=dev)
    if name == "alpha_beta":
        epi = EpilogueArguments(source, C=C, X=X, alpha=alpha, beta=beta, x_factor=x_factor,
                                D=D, Y=other)

        def eager():
            Y = A @ B
            return Y * alpha + C * beta + X * x_factor, Y
    else:
        epi = EpilogueArguments(source, C=C, alpha=alpha, beta=beta, D=D, F=other)

        def eager():
            F = (A @ B) * alpha + C * beta
            return torch.relu(F), F
    args = GemmArguments(A=A, B=B, out=D, accumulator_type=torch.float32, epilogue=epi)
    lines = [title] + ["    " + ln for ln in source.rstrip().splitlines()]
    kernel = choose_kernel(args, tune=tune)
    rep = run_and_report(args, kernel, device, eager=eager, verify=True, iterations=iterations,
                         warmup=warmup)
    lines += ["    " + ln for ln in format_report(rep, 2.0 * M * N * K, device)]
    return lines, bool(rep.ok)


@app.command()
def demo(
    size: Annotated[Optional[str], typer.Option(help="M,N,K (default 4096,4096,4096 on a GPU, "
                                                     "128,96,64 on the CPU)")] = None,
    dtype: Annotated[Optional[str], typer.Option(help="inputs and outputs (default bf16 on a "
                                                      "GPU, f16 on the CPU)")] = None,
    iterations: Annotated[Optional[int], typer.Option(
        help="timed runs (default 20 GPU, 2 CPU)")] = None,
    tune: Annotated[str, typer.Option(help="fast | exhaustive | none: how the kernel is chosen "
                                           "(autotuning, as evtfuse.gemm does)")] = "fast",
):
    """Fuse the EFC alpha-beta epilogue (and a ReLU + aux one) into a GEMM, verify, time.

    Runs Y = accum; D = accum * alpha + C * beta + X * x_factor and D = relu(F) with F stored,
    through get_kernels()/run(), checks every output against evtfuse.reference, and reports
    the kernel chosen, its time and the speedup over eager PyTorch. Exit status 1 if a
    verification fails.
    """
    try:
        device = pick_device()
        M, N, K, _ = parse_mnkl(size or ("128,96,64" if device.interpreter else "4096,4096,4096"))
        dt = parse_dtype(dtype or ("f16" if device.interpreter else "bf16"))
        iters = iterations if iterations is not None else (2 if device.interpreter else 20)
        warmup = 1 if device.interpreter else 5
        typer.echo(f"evtfuse demo: {device.description}")
        if device.interpreter:
            typer.echo("  small problem on the CPU; timings are not meaningful "
                       "(run on a CUDA GPU for 4096^3 bf16)")
        typer.echo(f"  problem: M={M} N={N} K={K}, {short_dtype(dt)} in/out, fp32 accumulation\n")
        all_ok = True
        for k, name in enumerate(DEMO_EPILOGUES, 1):
            lines, ok = _demo_case(name, device, (M, N, K), dt, iters, warmup, tune)
            all_ok &= ok
            typer.echo(f"[{k}] " + "\n".join(lines) + "\n")
        typer.echo("demo: all outputs match the reference" if all_ok
                   else "demo: VERIFICATION FAILED")
        if not all_ok:
            raise typer.Exit(EXIT_VERIFY)
    except CliError as exc:
        _fail(exc)
    except _user_errors() as exc:
        _fail(CliError(str(exc)))


def _user_errors() -> tuple[type[BaseException], ...]:
    from .errors import EpilogueError, UnsupportedError

    return (EpilogueError, UnsupportedError)


# ============================================================================ run / show / profile

# the options run, show and profile share
EpilogueOpt = Annotated[Optional[str], typer.Option(
    "--epilogue", "-e", help='epilogue source, e.g. "def epi(accum, C, alpha): D = alpha * accum '
                             '+ C; return D"')]
EpilogueFileOpt = Annotated[Optional[str], typer.Option(
    "--epilogue-file", "-f", help="path.py:fn (parsed with ast, never imported)")]
MnklOpt = Annotated[Optional[str], typer.Option(
    help="M,N,K,L (default 4096,4096,4096,1 on a GPU, 128,96,64,1 on the CPU)")]
AbOpt = Annotated[Optional[str], typer.Option("--ab-dtype", help="A and B (default bf16 GPU, f16 CPU)")]
COpt = Annotated[Optional[str], typer.Option("--c-dtype", help="full-tensor operands (default: ab)")]
DOpt = Annotated[Optional[str], typer.Option("--d-dtype", help="full outputs (default: c)")]
AccOpt = Annotated[str, typer.Option("--acc-dtype", help="accumulator")]
AMajorOpt = Annotated[str, typer.Option("--a-major", help="k: A row-major (M,K); m: column-major")]
BMajorOpt = Annotated[str, typer.Option("--b-major", help="n: B row-major (K,N); k: column-major")]
ScalarOpt = Annotated[Optional[list[str]], typer.Option(
    "--scalar", "-s", help="NAME=VALUE: a runtime scalar (repeatable)")]
AlphaOpt = Annotated[Optional[float], typer.Option(help="shortcut for --scalar alpha=VALUE")]
BetaOpt = Annotated[Optional[float], typer.Option(help="shortcut for --scalar beta=VALUE")]
OperandOpt = Annotated[Optional[list[str]], typer.Option(
    "--operand", help="NAME=KIND[:DTYPE], KIND one of full, row (M,1), col (N,), scalar (0-d), "
                      "batch-scalar (L,1,1). Default: full, but alpha/beta are runtime scalars and "
                      "bias is col")]
OutputOpt = Annotated[Optional[list[str]], typer.Option(
    "--output", help="NAME=KIND[:DTYPE], KIND one of full, row, col, scalar (reductions), none")]
SeedOpt = Annotated[int, typer.Option(help="random seed of the operands")]
Tf32Opt = Annotated[bool, typer.Option("--tf32", help="let fp32 inputs use TF32")]
KernelOpt = Annotated[Optional[str], typer.Option("--kernel", help="use the first kernel whose name "
                                                                   "contains this")]


def _spec(device, mnkl, ab_dtype, c_dtype, d_dtype, acc_dtype, a_major, b_major, scalar, alpha,
          beta, operand, output, seed, tf32) -> ProblemSpec:
    return problem_spec_from_flags(mnkl=mnkl, ab_dtype=ab_dtype, c_dtype=c_dtype, d_dtype=d_dtype,
                                   acc_dtype=acc_dtype, a_major=a_major, b_major=b_major,
                                   scalar=scalar or [], alpha=alpha, beta=beta,
                                   operand=operand or [], output=output or [], seed=seed,
                                   tf32=tf32, device=device)


def _describe(spec: ProblemSpec, where: str, built: BuiltProblem, device: Device) -> list[str]:
    lines = [f"device:   {device.description}",
             f"epilogue: {where}",
             f"problem:  M={spec.M} N={spec.N} K={spec.K} L={spec.L}, A {short_dtype(spec.ab_dtype)} "
             f"{spec.a_major}-major, B {short_dtype(spec.ab_dtype)} {spec.b_major}-major, "
             f"accumulator {short_dtype(spec.acc_dtype)}"]
    lines += ["  " + t for t in built.table]
    return lines


@app.command()
def run(
    epilogue: EpilogueOpt = None, epilogue_file: EpilogueFileOpt = None, mnkl: MnklOpt = None,
    ab_dtype: AbOpt = None, c_dtype: COpt = None, d_dtype: DOpt = None, acc_dtype: AccOpt = "f32",
    a_major: AMajorOpt = "k", b_major: BMajorOpt = "n", scalar: ScalarOpt = None,
    alpha: AlphaOpt = None, beta: BetaOpt = None, operand: OperandOpt = None,
    output: OutputOpt = None,
    verify: Annotated[bool, typer.Option(
        "--verify/--no-verify", help="compare every output with evtfuse.reference")] = False,
    iterations: Annotated[Optional[int], typer.Option(
        help="timed runs (default 20 GPU, 1 CPU); 0: no timing")] = None,
    warmup: Annotated[Optional[int], typer.Option(help="untimed runs first")] = None,
    eager: Annotated[bool, typer.Option(
        "--eager/--no-eager", help="also time unfused PyTorch")] = True,
    kernel: KernelOpt = None, seed: SeedOpt = 0, tf32: Tf32Opt = False,
    tune: Annotated[str, typer.Option(help="fast | exhaustive | none: autotune the kernel "
                                           "choice (kept in the cache) or take the first")] = "fast",
):
    """Run one epilogue fused into a GEMM: operands are made from its parameters and the flags.

    Example: evtfuse run -e "def epi(accum, C, alpha): D = alpha * accum + C; return D"
    --mnkl 4096,4096,4096,1 --ab-dtype bf16 --alpha 1.5 --verify
    """
    try:
        device = pick_device()
        source, where = resolve_epilogue(epilogue, epilogue_file)
        spec = _spec(device, mnkl, ab_dtype, c_dtype, d_dtype, acc_dtype, a_major, b_major, scalar,
                     alpha, beta, operand, output, seed, tf32)
        built = build_problem(source, spec, device)
        for line in _describe(spec, where, built, device):
            typer.echo(line)
        k = choose_kernel(built.args, kernel, tune)
        iters = iterations if iterations is not None else (1 if device.interpreter else 20)
        warm = warmup if warmup is not None else (0 if device.interpreter else 5)
        rep = run_and_report(built.args, k, device, eager=eager_of(built.args) if eager else None,
                             verify=verify, iterations=iters, warmup=warm)
        for line in format_report(rep, spec.flops, device):
            typer.echo(line)
        if rep.ok is False:
            raise typer.Exit(EXIT_VERIFY)
    except CliError as exc:
        _fail(exc)
    except _user_errors() as exc:
        _fail(CliError(str(exc)))


@app.command()
def show(
    target: Annotated[str, typer.Argument(help='path.py:fn, or the epilogue source as a string')],
    mnkl: MnklOpt = None, ab_dtype: AbOpt = None, c_dtype: COpt = None, d_dtype: DOpt = None,
    acc_dtype: AccOpt = "f32", a_major: AMajorOpt = "k", b_major: BMajorOpt = "n",
    scalar: ScalarOpt = None, alpha: AlphaOpt = None, beta: BetaOpt = None,
    operand: OperandOpt = None, output: OutputOpt = None, kernel: KernelOpt = None,
    source_code: Annotated[bool, typer.Option("--source/--no-source",
                                              help="print the generated kernel")] = True,
):
    """Print the epilogue's DAG, its EVT view (as CUTLASS would nest it) and the generated
    Triton kernel for a given shape and dtypes."""
    from . import ir
    from .passes import optimize

    try:
        device = pick_device()
        source, where = resolve_positional(target)
        spec = _spec(device, mnkl, ab_dtype, c_dtype, d_dtype, acc_dtype, a_major, b_major, scalar,
                     alpha, beta, operand, output, 0, False)
        built = build_problem(source, spec, device)
        for line in _describe(spec, where, built, device):
            typer.echo(line)
        dag = built.args.dag
        typer.echo("\n== DAG ==")
        typer.echo(ir.format_dag(dag))
        opt = optimize(dag)
        if ir.format_dag(opt) != ir.format_dag(dag):
            typer.echo("\n== DAG after the passes ==")
            typer.echo(ir.format_dag(opt))
        typer.echo("\n== EVT ==")
        typer.echo(ir.format_evt(opt))
        if source_code:
            k = choose_kernel(built.args, kernel)
            typer.echo(f"\n== kernel {k.name} ==")
            typer.echo(k.source(built.args))
    except CliError as exc:
        _fail(exc)
    except _user_errors() as exc:
        _fail(CliError(str(exc)))


NCU_METRICS = (
    ("launch__registers_per_thread", "registers per thread"),
    ("launch__shared_mem_per_block_static", "static shared memory per block"),
    ("launch__shared_mem_per_block_dynamic", "dynamic shared memory per block"),
    ("gpu__time_duration.sum", "duration"),
    ("dram__bytes.sum", "DRAM bytes moved"),
    ("dram__bytes.sum.per_second", "achieved DRAM bandwidth"),
    ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "DRAM throughput (% of peak)"),
    ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "SM throughput (% of peak)"),
    ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
     "memory throughput (% of peak)"),
)


def parse_ncu_csv(text: str) -> list[dict[str, tuple[str, str]]]:
    """Rows of ``ncu --csv --page raw`` output: metric -> (value, unit), one dict per kernel."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    if len(lines) < 2:
        return []
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    header, units, data = rows[0], rows[1], rows[2:]
    if not data or "ID" not in header:  # no units row
        header, data, units = rows[0], rows[1:], [""] * len(rows[0])
    out = []
    for row in data:
        out.append({h: (v, u) for h, v, u in zip(header, row, units)})
    return out


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def profile(ctx: typer.Context):
    """Run (as `evtfuse run`, same options) under Nsight Compute and print registers, shared
    memory, achieved bandwidth and throughput of the fused kernel. Needs `ncu` on PATH.

    The problem is run once without ncu first (compile, autotune, cache the choice), then
    under ncu, which profiles the first launch of the chosen kernel."""
    ncu = shutil.which("ncu")
    if ncu is None:
        typer.echo("error: Nsight Compute's `ncu` is not on PATH, so nothing can be profiled. "
                   "Install Nsight Compute (it ships with the CUDA toolkit) and put ncu on PATH, "
                   "or use `evtfuse run` for timings.", err=True)
        raise typer.Exit(EXIT_MISSING)
    run_args = [a for a in ctx.args]
    base = [sys.executable, "-m", "evtfuse.cli", "run", *run_args]
    # first without ncu: compiles, autotunes and caches the choice (ncu must profile the
    # chosen kernel, not the tuner's candidates), and reports input errors plainly
    prep = subprocess.run(base + ["--iterations", "0", "--no-eager", "--no-verify"],
                          capture_output=True, text=True)
    if prep.returncode != 0:
        typer.echo(prep.stdout + prep.stderr, nl=False)
        raise typer.Exit(prep.returncode)
    typer.echo(prep.stdout, nl=False)
    cmd = [ncu, "--csv", "--page", "raw", "--kernel-name", "regex:evtfuse", "--launch-count", "1",
           "--metrics", ",".join(m for m, _ in NCU_METRICS),
           *base, "--no-verify", "--no-eager", "--iterations", "1", "--warmup", "0"]
    typer.echo("profiling with: " + " ".join(cmd[:8]) + " ... evtfuse run " + " ".join(run_args))
    log.debug("ncu command: %s", cmd)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    rows = parse_ncu_csv(proc.stdout)
    if proc.returncode != 0 or not rows:
        typer.echo(proc.stdout[-4000:])
        typer.echo(proc.stderr[-4000:], err=True)
        typer.echo(f"error: ncu exited with status {proc.returncode} and "
                   f"{'no' if not rows else len(rows)} profiled kernel(s)", err=True)
        raise typer.Exit(proc.returncode or EXIT_UNSUPPORTED)
    for row in rows:
        name = row.get("Kernel Name", ("?", ""))[0]
        typer.echo(f"kernel: {name}")
        for metric, label in NCU_METRICS:
            if metric in row:
                value, unit = row[metric]
                typer.echo(f"  {label:34s} {value} {unit}".rstrip())


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def verify(ctx: typer.Context):
    """Check the fused kernel of an epilogue against the reference evaluator: `evtfuse run`
    with --verify and no timing (same options). Exit status 1 when an output differs."""
    main(["run", *ctx.args, "--verify", "--iterations", "0", "--no-eager"])


# ============================================================================ bench / cache

@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def bench(ctx: typer.Context):
    """Benchmarks (evtfuse.bench): every argument is passed on to evtfuse.bench.main.
    Use `evtfuse bench -- --help` for the benchmark's own options."""
    import importlib

    try:
        module = importlib.import_module("evtfuse.bench")
    except ImportError as exc:
        if getattr(exc, "name", None) != "evtfuse.bench":
            typer.echo(f"error: the benchmark module evtfuse.bench cannot be imported ({exc}); "
                       "`pip install -e .[bench]` installs what it needs", err=True)
            raise typer.Exit(EXIT_MISSING) from None
        module = None
    entry = getattr(module, "main", None)
    if entry is None:
        typer.echo("error: the benchmark module evtfuse.bench (with a main(argv) function) is not "
                   "available in this installation of evtfuse", err=True)
        raise typer.Exit(EXIT_MISSING)
    try:
        code = entry(list(ctx.args))
    except SystemExit as exc:  # argparse --help and errors
        code = exc.code
    raise typer.Exit(int(code or 0) if not isinstance(code, str) else 1)


def _cache_module():
    try:
        from .runtime import cache
    except ImportError as exc:
        raise CliError(f"the kernel cache is not available ({exc})", EXIT_MISSING) from None
    return cache


@cache_app.command("list")
def cache_list():
    """List the cached tuning choices (the folder is EVTFUSE_CACHE_DIR or ~/.cache/evtfuse)."""
    try:
        cache = _cache_module()
    except CliError as exc:
        _fail(exc)
    entries = cache.list_entries()
    typer.echo(f"cache: {cache.cache_dir()}")
    if not entries:
        typer.echo("no entries")
        return
    for e in entries:
        head = e.get("kernel", "?")
        rest = ", ".join(f"{k}={v}" for k, v in sorted(e.items()) if k not in ("kernel", "file"))
        typer.echo(f"  {head}  {rest}".rstrip())
    typer.echo(f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}")


@cache_app.command("clear")
def cache_clear():
    """Remove every evtfuse cache entry (generated kernels and tuning choices)."""
    try:
        cache = _cache_module()
    except CliError as exc:
        _fail(exc)
    n = cache.clear()
    typer.echo(f"removed {n} file{'s' if n != 1 else ''} from {cache.cache_dir().parent}")


if __name__ == "__main__":
    main()
