"""What every ``evtfuse`` command shares: the exit codes, ``CliError`` and how it is reported.

Layer: cli. A command raises ``CliError(message, code)`` (or lets an ``EpilogueError``,
``UnsupportedError`` or ``ConfigError`` through, see ``_user_errors``) and ends with
``_fail``: the message goes to stderr as ``error: ...`` and the process exits with the code.
"""

from __future__ import annotations

import logging

import typer

log = logging.getLogger("evtfuse")

EXIT_OK, EXIT_VERIFY, EXIT_INPUT, EXIT_UNSUPPORTED, EXIT_MISSING = 0, 1, 2, 3, 4


class CliError(Exception):
    """A message for the user and the exit status that goes with it."""

    def __init__(self, message: str, code: int = EXIT_INPUT):
        super().__init__(message)
        self.code = code


def _fail(exc: CliError) -> None:
    typer.echo(f"error: {exc}", err=True)
    raise typer.Exit(exc.code)


def _user_errors() -> tuple[type[BaseException], ...]:
    from ..errors import ConfigError, EpilogueError, UnsupportedError

    return (EpilogueError, UnsupportedError, ConfigError)
