"""``evtfuse export cutlass FILE``: an epilogue as a CUTLASS 4.2 C++ header (SM90 EVT).

Layer: cli. Reads the epilogue like ``show`` (``path.py[:fn]`` or the source as a string,
parsed with ``ast``, never imported), describes its parameters and outputs from
``--operand``/``--output`` (the kinds of ``evtfuse.export.cutlass``) and writes the header
to ``--out`` or stdout. A refusal (what the Sm90 EVT cannot express) exits with status 3,
bad input with 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from .base import EXIT_UNSUPPORTED, CliError, _fail, _user_errors
from .problem import parse_assignments
from .sources import resolve_positional


def _triple(text: str, flag: str) -> tuple[int, int, int]:
    try:
        parts = tuple(int(p) for p in text.replace("x", ",").split(",") if p.strip())
    except ValueError:
        parts = ()
    if len(parts) != 3 or min(parts) < 1:
        raise CliError(f"{flag} takes three positive integers M,N,K, got '{text}'")
    return parts  # type: ignore[return-value]


def export_cutlass(
    target: Annotated[str, typer.Argument(help="path.py:fn, or the epilogue source as a string")],
    operand: Annotated[Optional[list[str]], typer.Option(
        "--operand", help="NAME=KIND[:DTYPE], KIND one of runtime (a float argument), scalar "
                          "(one value in device memory), row (M,1), col (N,), full (M,N). "
                          "Default: alpha/beta runtime, bias col, others full")] = None,
    output: Annotated[Optional[list[str]], typer.Option(
        "--output", help="NAME=KIND[:DTYPE], KIND one of full, row, col, scalar (reductions), "
                         "none")] = None,
    ab_dtype: Annotated[str, typer.Option("--ab-dtype", help="A and B: f16 or bf16")] = "f16",
    c_dtype: Annotated[Optional[str], typer.Option(
        "--c-dtype", help="full operands (default: ab)")] = None,
    d_dtype: Annotated[Optional[str], typer.Option(
        "--d-dtype", help="full outputs (default: c)")] = None,
    tile: Annotated[str, typer.Option(help="the CTA tile M,N,K")] = "128,128,64",
    cluster: Annotated[str, typer.Option(help="the cluster shape M,N,K")] = "1,1,1",
    a_major: Annotated[str, typer.Option("--a-major", help="k: A row-major; m")] = "k",
    b_major: Annotated[str, typer.Option("--b-major", help="n: B (K,N) row-major; k")] = "n",
    name: Annotated[Optional[str], typer.Option(
        help="the C++ namespace (default: the epilogue's name)")] = None,
    out: Annotated[Optional[str], typer.Option(
        "--out", "-o", help="write the header to this file (default: stdout)")] = None,
):
    """Write the epilogue as a CUTLASS 4.2 C++ header for SM90: its epilogue visitor tree,
    the tree's Arguments, a GemmUniversal (TMA warp-specialised cooperative) and run() on
    device pointers. What the Sm90 EVT cannot express is refused (exit status 3)."""
    from ..export import ExportError, cutlass

    try:
        source, _ = resolve_positional(target)
        ops = parse_assignments(operand or [], "--operand")
        outs = parse_assignments(output or [], "--output")
        try:
            exported = cutlass(source, operands=ops, outputs=outs, ab_dtype=ab_dtype,
                               c_dtype=c_dtype, d_dtype=d_dtype,
                               tile=_triple(tile, "--tile"), cluster=_triple(cluster, "--cluster"),
                               a_major=a_major, b_major=b_major, name=name)
        except ExportError as exc:
            code = EXIT_UNSUPPORTED if str(exc).count("cannot export") else 2
            raise CliError(str(exc), code) from None
        if out:
            try:
                Path(out).write_text(exported.header)
            except OSError as exc:
                raise CliError(f"--out {out}: {exc.strerror or exc}") from None
            typer.echo(f"wrote {out} (namespace evtfuse_export::{exported.name})", err=True)
        else:
            typer.echo(exported.header, nl=False)
    except CliError as exc:
        _fail(exc)
    except _user_errors() as exc:
        _fail(CliError(str(exc)))
