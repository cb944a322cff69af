"""``evtfuse demo``: two epilogues from the CUTLASS/CuTe examples, fused, verified, timed.

Layer: tools (cli). The kernel is chosen through ``report.choose_kernel`` (looked up in
``report`` at call time, so that replacing it there, as the tests do, takes effect here too).
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from . import report
from .base import EXIT_VERIFY, CliError, _fail, _user_errors
from .device import Device, pick_device
from .problem import parse_dtype, parse_mnkl, short_dtype
from .report import format_report, run_and_report


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

    from ..arguments import EpilogueArguments, GemmArguments

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
    kernel = report.choose_kernel(args, tune=tune)
    rep = run_and_report(args, kernel, device, eager=eager, verify=True, iterations=iterations,
                         warmup=warmup)
    lines += ["    " + ln for ln in format_report(rep, 2.0 * M * N * K, device)]
    return lines, bool(rep.ok)


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
