"""A test helper: run a call that might block (reading a FIFO) and fail, not hang, when it
does. Imported by test_cache.py and test_round3_cli.py."""

from __future__ import annotations

import os
import threading


def finishes(fn, fifos=(), timeout=60.0):
    """``fn()``'s result, failing the test when it blocks for ``timeout`` s (then the
    FIFOs are opened for writing once, which releases a reader blocked on them)."""
    out: dict = {}

    def target():
        try:
            out["value"] = fn()
        except BaseException as exc:  # handed to the test's thread
            out["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    hung = t.is_alive()
    if hung:
        for p in fifos:
            try:
                os.close(os.open(p, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        t.join(10)
    assert not hung, f"{fn} blocked for {timeout} s"
    if "error" in out:
        raise out["error"]
    return out.get("value")
