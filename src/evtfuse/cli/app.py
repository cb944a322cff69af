"""The ``evtfuse`` command's typer application and entry point: ``app`` (with its ``cache``
and ``export`` groups) and ``main``.

Layer: tools (cli), below the commands: ``evtfuse.cli`` registers each command on ``app``
(in the order ``--help`` lists them); a command that runs another (``verify`` runs
``run``) calls ``main``, by then complete.
"""

from __future__ import annotations

from typing import Annotated

import typer

from ..logs import setup_logging  # shared with library users: evtfuse.logs

app = typer.Typer(name="evtfuse", no_args_is_help=True, add_completion=False,
                  help="Custom GEMM epilogues as Python functions, fused into one Triton kernel.",
                  pretty_exceptions_enable=False, rich_markup_mode=None)
cache_app = typer.Typer(no_args_is_help=True, help="The on-disk kernel and tuning cache.")
app.add_typer(cache_app, name="cache")
export_app = typer.Typer(no_args_is_help=True, help="An epilogue as code for another library.")
app.add_typer(export_app, name="export")


@app.callback()
def _root(verbose: Annotated[int, typer.Option(
        "--verbose", "-v", count=True, help="-v: info, -vv: debug (or EVTFUSE_LOG=debug)")] = 0):
    """evtfuse: write a GEMM epilogue as a Python function; get one fused kernel."""
    setup_logging(verbose)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``evtfuse`` script (and ``python -m evtfuse.cli``)."""
    app(args=argv, prog_name="evtfuse")
