"""Logging set-up (layer: base). evtfuse logs to the ``evtfuse`` logger and is quiet by
default; ``EVTFUSE_LOG=debug|info|warning|error`` (read when evtfuse is imported, and by
the CLI, whose ``-v``/``-vv`` raise it) attaches a stderr handler at that level, so that
tuning and cache decisions show for library users too.
"""

from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger("evtfuse")

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "warn": logging.WARNING, "error": logging.ERROR, "quiet": logging.ERROR}


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record is emitted (test runners swap it)."""

    def __init__(self) -> None:
        super().__init__()
        self._evtfuse_cli = True

    @property  # type: ignore[override]
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def setup_logging(verbose: int = 0) -> int:
    """Level from ``-v`` (info) / ``-vv`` (debug), else ``EVTFUSE_LOG``, else warnings only."""
    env = os.environ.get("EVTFUSE_LOG", "").strip().lower()
    level = _LEVELS.get(env, logging.WARNING)
    if verbose:
        level = min(level, logging.INFO if verbose == 1 else logging.DEBUG)
    handler = next((h for h in log.handlers if getattr(h, "_evtfuse_cli", False)), None)
    if handler is None:
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("evtfuse %(levelname)s: %(message)s"))
        log.addHandler(handler)
    log.setLevel(level)
    handler.setLevel(level)
    return level


def setup_from_environment() -> None:
    """Called on import: only when EVTFUSE_LOG is set (a library adds no handler otherwise)."""
    if os.environ.get("EVTFUSE_LOG", "").strip():
        setup_logging()
