"""Compiles a kernel will soon need but does not yet: the other ``EVEN_MN`` variant of an
epilogue with a reduction across M (per-column or whole-output), whose kernel specialises on
whether the tiles cover M exactly, so that a new M of the other kind (a last, shorter batch
of an epoch; a new batch size) finds its binary compiled instead of compiling for a second
or more.

Layer: runtime.host (below the kernels, whose plans it compiles). One daemon thread per
variant, once per process: inside it, Triton's ``AsyncCompileMode`` hands the compile to a
one-thread executor and puts a placeholder in the JIT function's cache at once, so that a
launch of that variant from another thread before the compile ends waits for it instead of
compiling it again. A failure is logged (debug) and left to the launch that needs the
variant, which compiles and reports it as ever. Nothing runs on the GPU here.
``EVTFUSE_BACKGROUND_COMPILE=0`` turns it off.

A process that ends while such a compile runs waits for it (at most ``EXIT_WAIT_S``): a
daemon thread stopped inside Triton's compiler aborted the interpreter's exit on Triton 3.9
("terminate called without an active exception", exit status 134, after every test of a
GPU shard had passed).

``submit`` runs jobs in a small pool of such threads (background tuning's code generation
and compiles, ``runtime.background_tuning``), under the same exit rule: at exit the jobs not
yet started are dropped (marked cancelled), the running ones are waited for.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

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
    _start(thread)
    return True


def _start(thread: threading.Thread) -> None:
    """Start a daemon thread the process waits for at exit (``_wait_at_exit``)."""
    with _lock:
        if not _threads:
            atexit.register(_wait_at_exit)
        _threads.append(thread)
    thread.start()


def _compile(mode, plan, positional: list, consts: dict) -> None:
    """The thread's work: no CUDA call of its own (the arguments were fetched by the
    caller; Triton's compile needs none), so it cannot disturb a graph capture."""
    try:
        with ThreadPoolExecutor(1) as pool, mode(pool):
            plan.warmup_positional(positional, **consts)
        log.info("evtfuse: compiled in the background: the kernel's variant with %s", consts)
    except Exception as exc:  # noqa: BLE001  (the launch that needs it compiles and reports)
        log.debug("evtfuse: background compile with %s failed: %s", consts, exc)


def compile_plan(plan, positional: list) -> None:
    """Compile ``plan``'s kernel for arguments the caller fetched (``positional``), in this
    thread (a pool job's body): under Triton's ``AsyncCompileMode`` where there is one, so
    that a launch of the same kernel from another thread meanwhile waits for this compile
    instead of compiling it again. Raises what the compile raises."""
    mode = async_compile_mode()
    if mode is None:
        plan.warmup_positional(positional)
        return
    with ThreadPoolExecutor(1) as pool, mode(pool):
        plan.warmup_positional(positional)


class Job:
    """A function ``submit`` runs in a pool thread: ``ready()`` once it has run (or was
    dropped at exit: ``cancelled``), then ``error`` holds what it raised (None: it
    returned). The function is released once run, with what it holds."""

    __slots__ = ("fn", "error", "cancelled", "_done")

    def __init__(self, fn: Callable[[], None]):
        self.fn, self.error, self.cancelled = fn, None, False
        self._done = threading.Event()

    def ready(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def run(self) -> None:
        fn, self.fn = self.fn, None
        try:
            if fn is not None and not self.cancelled:
                fn()
        except BaseException as exc:  # noqa: BLE001  (the job's owner reports it)
            self.error = exc
        finally:
            self._done.set()

    def cancel(self) -> None:
        self.cancelled, self.fn = True, None
        self._done.set()


_jobs: "queue.SimpleQueue[Job | None]" = queue.SimpleQueue()
_workers: list[threading.Thread] = []
_idle = [0]  # pool threads waiting for a job
_closing = [False]


def submit(fn: Callable[[], None], workers: int) -> Job:
    """Run ``fn`` in a pool of at most ``workers`` daemon threads (started as jobs come,
    kept for the next ones); returns its ``Job``. Once the process is exiting, a job is
    cancelled at once. ``fn`` must make no CUDA call: fetch its arguments first."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, not {workers}")
    job = Job(fn)
    with _lock:
        if _closing[0]:
            job.cancel()
            return job
        _jobs.put(job)
        start = _jobs.qsize() > _idle[0] and len(_workers) < workers
        if start:
            thread = threading.Thread(target=_worker, name="evtfuse-background-tuning",
                                      daemon=True)
            _workers.append(thread)
    if start:
        _start(thread)
    return job


def _worker() -> None:
    """A pool thread: run jobs until the exit's ``None``."""
    while True:
        with _lock:
            _idle[0] += 1
        job = _jobs.get()
        with _lock:
            _idle[0] -= 1
        if job is None:
            return
        if _closing[0]:
            job.cancel()
            continue
        job.run()


def _close_pool() -> None:
    """No job starts any more: the queued ones are cancelled, each pool thread is told to
    end once its running job (if any) returns."""
    with _lock:
        _closing[0] = True
        workers = len(_workers)
    while True:
        try:
            job = _jobs.get_nowait()
        except queue.Empty:
            break
        if job is not None:
            job.cancel()
    for _ in range(workers):
        _jobs.put(None)


def wait(timeout: float | None = None) -> None:
    """Wait for the background compiles started so far (tests, benchmarks); the pool's
    threads, which wait for jobs, are not waited for (``Job.wait`` waits for a job)."""
    for t in list(_threads):
        if t not in _workers:
            t.join(timeout)


def _wait_at_exit() -> None:
    """The process is ending: drop the pool's queued jobs, and let running compiles finish
    (all of them within ``EXIT_WAIT_S``) rather than stop them inside Triton's compiler."""
    _close_pool()
    end = time.monotonic() + EXIT_WAIT_S
    for t in list(_threads):
        t.join(max(0.0, end - time.monotonic()))
