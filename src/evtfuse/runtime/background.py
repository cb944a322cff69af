"""Compiles a kernel will soon need but does not yet: the other ``EVEN_MN`` variant of an
epilogue with a reduction across M (per-column or whole-output), whose kernel specialises on
whether the tiles cover M exactly, so that a new M of the other kind (a last, shorter batch
of an epoch; a new batch size) finds its binary compiled instead of compiling for a second
or more.

Layer: runtime. One daemon thread per variant, once per process: inside it, Triton's
``AsyncCompileMode`` hands the compile to a one-thread executor and puts a placeholder in
the JIT function's cache at once, so that a launch of that variant from another thread
before the compile ends waits for it instead of compiling it again. A failure is logged
(debug) and left to the launch that needs the variant, which compiles and reports it as
ever. Nothing runs on the GPU here. ``EVTFUSE_BACKGROUND_COMPILE=0`` turns it off.

A process that ends while such a compile runs waits for it (at most ``EXIT_WAIT_S``): a
daemon thread stopped inside Triton's compiler aborted the interpreter's exit on Triton 3.9
("terminate called without an active exception", exit status 134, after every test of a
GPU shard had passed).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ..backends.triton.versions import async_compile_mode

log = logging.getLogger("evtfuse")

_started: set = set()
_threads: list[threading.Thread] = []
_lock = threading.Lock()
EXIT_WAIT_S = 120.0  # the longest an exiting process waits for its background compiles


def enabled() -> bool:
    return os.environ.get("EVTFUSE_BACKGROUND_COMPILE", "1") != "0"


def compile_variant(plan, A, B, values, **consts) -> bool:
    """Start compiling ``plan``'s kernel with ``consts`` in place of its own constants
    (for the tensors of this call: their dtypes and alignment), unless that variant was
    started before in this process; returns whether a compile was started."""
    mode = async_compile_mode()
    if mode is None or not enabled():
        return False
    key = (id(plan.jit), tuple(sorted({**plan.consts, **consts}.items())),
           A.dtype, B.dtype, A.device)
    with _lock:
        if key in _started:
            return False
        _started.add(key)
    positional = plan.positional(A, B, values)  # here: it may allocate a workspace
    thread = threading.Thread(target=_compile, args=(mode, plan, positional, consts),
                              name="evtfuse-background-compile", daemon=True)
    with _lock:
        if not _threads:
            atexit.register(_wait_at_exit)
        _threads.append(thread)
    thread.start()
    return True


def _compile(mode, plan, positional: list, consts: dict) -> None:
    """The thread's work: no CUDA call of its own (the arguments were fetched by the
    caller; Triton's compile needs none), so it cannot disturb a graph capture."""
    try:
        with ThreadPoolExecutor(1) as pool, mode(pool):
            plan.warmup_positional(positional, **consts)
        log.info("evtfuse: compiled in the background: the kernel's variant with %s", consts)
    except Exception as exc:  # noqa: BLE001  (the launch that needs it compiles and reports)
        log.debug("evtfuse: background compile with %s failed: %s", consts, exc)


def wait(timeout: float | None = None) -> None:
    """Wait for the background compiles started so far (tests, benchmarks)."""
    for t in list(_threads):
        t.join(timeout)


def _wait_at_exit() -> None:
    """The process is ending: let running compiles finish (all of them within
    ``EXIT_WAIT_S``) rather than stop them inside Triton's compiler."""
    end = time.monotonic() + EXIT_WAIT_S
    for t in list(_threads):
        t.join(max(0.0, end - time.monotonic()))
