"""Background tuning (``tune="background"``): the first call of a new problem class runs one
kernel at once; the class's other "fast" candidates are generated and compiled in background
threads and timed later, on the calling thread, one timing window per call, at the start of
later calls; the winner, once its outputs matched the running kernel's, is recorded as
"fast" records its choice, and later calls switch to it.

Layer: runtime.tuning, below ``runtime.tuner``: ``tuner._provisional`` starts a ``Session``
per tuning key (the key "fast" uses), handing it the tuner itself, whose settings, tables
and timing the session reads at each use (as the tuner's own search does: one set of
them, which tests change); ``tuner.launch_plan`` wraps the launch plan of each call
structure of the class in a ``SwitchingPlan``, which ``runtime.run`` caches as any plan.

Invariants:
- background threads make no CUDA call: they generate code (``Kernel.compile``) and run
  Triton's compiler on arguments the calling thread fetched (``background.compile_plan``);
  plans, workspaces, timing windows and every launch are made on the calling thread;
- nothing is timed, checked or switched while the calling stream captures a CUDA graph or
  torch.compile traces (``_busy``); a call takes its plan once and runs it to the end, so
  that concurrent calls run the old kernel or the new one, never a mix;
- a candidate is switched to only after its outputs on scratch buffers matched the running
  kernel's within ``runtime.verify``'s tolerances; one that fails to compile, to run or to
  match is dropped and logged;
- any other failure of a step abandons the session (logged): calls keep the first kernel.

Timing follows ``tuner._search``: a first round (each candidate's first launch, then a
window), ``tuner.ROUNDS - 1`` more rounds with the hopeless ones pruned after the first of
them, and the duel of two close leaders; without the search's time budget, since the
windows are spread over calls. Only calls of the M that started the session time (windows
of different M would not compare); calls of other Ms of the class follow its winner.
"""

from __future__ import annotations

import functools
import logging
import threading
import time

import torch

from ..arguments import OFFS_KEY, EpilogueArguments, GemmArguments
from ..errors import ConfigError
from ..ir import OutputKind
from . import background, cache
from .kernel import scratch_arguments
from .verify import compare

log = logging.getLogger("evtfuse")

CODEGEN, COMPILING, TIMING, VERIFYING, DONE = "codegen", "compiling", "timing", "verifying", "done"


def _capturing() -> bool:
    """Whether the current stream captures a CUDA graph."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _busy() -> bool:
    """Whether this is no moment for tuning work: torch.compile traces, or a CUDA graph is
    being captured on the current stream."""
    return torch.compiler.is_compiling() or _capturing()


def _codegen(kernel, args: GemmArguments) -> None:
    """A pool job: generate and import ``kernel``'s module for ``args`` (CPU work only)."""
    kernel.compile(args)


def _prepare_compile(kernel, args: GemmArguments):
    """On the calling thread: ``kernel``'s launch plan for ``args`` (workspaces included)
    and its launch arguments; returns the pool job that compiles it, or None for a plan
    compiled at its first launch (two passes, the interpreter's stand-ins)."""
    plan = kernel.plan(args)
    if not hasattr(plan, "warmup_positional"):
        return None
    positional = plan.positional(args.A, args.B, args.launch_values)
    return functools.partial(background.compile_plan, plan, positional)


def _poisoned_scratch(args: GemmArguments) -> GemmArguments:
    """``args`` with fresh outputs holding NaN (integers: their minimum), as
    ``Kernel.verify`` poisons: an element a kernel leaves unwritten shows."""
    scratch = scratch_arguments(args)
    for t in scratch.epilogue.outputs().values():
        if isinstance(t, torch.Tensor):
            t.fill_(float("nan") if t.dtype.is_floating_point else torch.iinfo(t.dtype).min)
    return scratch


def _fp8_fast_k(kernel, args: GemmArguments) -> int:
    """K where fp8 inputs accumulate fast over all of K (``verify.compare``), else 0."""
    if args.A.dtype.is_floating_point and args.A.dtype.itemsize == 1:
        from ..backends.triton.families import fp8_promote

        return 0 if fp8_promote(args, kernel.target) else args.K
    return 0


def outputs_match(kernel, running, args: GemmArguments) -> tuple[bool, str]:
    """Whether ``kernel``'s outputs for ``args`` (on poisoned scratch buffers) match those
    of the ``running`` kernel within ``verify.compare``'s tolerances; with the failing
    checks' lines."""
    ref, got = _poisoned_scratch(args), _poisoned_scratch(args)
    running.run(ref)
    kernel.run(got)
    tf32 = args.allow_tf32 and args.A.dtype == torch.float32
    bad = []
    for o in args.dag.outputs:
        if o.kind is OutputKind.NONE:
            continue
        mine, theirs = got.epilogue.values[o.name], ref.epilogue.values[o.name]
        if torch.equal(mine, theirs):
            continue
        check = compare(o.name, mine, theirs, o.dtype, tf32, args.A.dtype,
                        fp8_fast_k=_fp8_fast_k(kernel, args))
        if not check.ok:
            bad.append(check.line())
    return not bad, "; ".join(bad)


class Session:
    """The background tuning of one tuning key: its candidates (the running kernel
    ``first`` among them), their jobs, times and state. Every change is made under
    ``lock`` (``step``'s caller holds it); ``done`` is set last."""

    def __init__(self, key: str, args: GemmArguments, first, cands: list, tuning):
        self.key, self.M, self.device = key, int(args.M), args.A.device
        self.tuning = tuning  # the tuner (``runtime.tuner``): its settings, tables, timing
        self.first = first
        self.cands = [first, *(k for k in cands if k is not first)]
        self.lock = threading.Lock()
        self.state: str | None = None
        self.jobs: dict[str, background.Job] = {}
        self.dropped: dict[str, str] = {}
        self.times: dict[str, list[float]] = {}
        self.ranked: list = []
        self.winner = None
        self.done = False
        self.steps = 0  # boundaries that did work
        self._rounds = None
        self._started = 0.0
        self.compile_s = self.timing_s = 0.0
        self.captured = False  # a CUDA graph captured a call before the session ended

    def __repr__(self) -> str:
        return (f"Session({self.state}, first={self.first.name}, "
                f"{len(self.cands)} candidates, {len(self.dropped)} dropped)")

    def start(self, args: GemmArguments) -> None:
        """Start generating the other candidates' code in the pool (the first call does,
        after its launch); nothing if started already or another thread holds the lock."""
        if not self.lock.acquire(blocking=False):
            return
        try:
            if self.state is None:
                self._start(args)
        except Exception as exc:  # noqa: BLE001  (the calls go on with the first kernel)
            self._abandon(exc)
        finally:
            self.lock.release()

    def _start(self, args: GemmArguments) -> None:
        self._started = time.perf_counter()
        self.state = CODEGEN
        workers = self.tuning.compile_workers()
        for k in self.cands[1:]:
            self.jobs[k.name] = background.submit(functools.partial(_codegen, k, args), workers)

    def step(self, make_args) -> None:
        """One bounded piece of the tuning at a call's boundary (the caller holds ``lock``;
        ``make_args()`` gives the call's arguments, built only when needed): collect the
        jobs that ended, submit compiles, time one window, or check one winner."""
        try:
            self._advance(make_args)
        except Exception as exc:  # noqa: BLE001  (the calls go on with the first kernel)
            self._abandon(exc)

    def _advance(self, make_args) -> None:
        if self.state is None:
            self._start(make_args())
        elif self.state == CODEGEN:
            if self._settled():
                self._submit_compiles(make_args())
        elif self.state == COMPILING:
            if self._settled():
                self.compile_s = time.perf_counter() - self._started
                self._start_timing(make_args())
        elif self.state == TIMING:
            self._time_one(make_args())
        elif self.state == VERIFYING:
            self._verify_next(make_args())

    def _settled(self) -> bool:
        """Whether every pending job has ended; then their failures are dropped."""
        if not all(job.ready() for job in self.jobs.values()):
            return False
        by_name = {k.name: k for k in self.cands}
        for name, job in self.jobs.items():
            if job.error is not None:
                self._drop(by_name[name], job.error)
            elif job.cancelled:
                self.dropped[name] = "cancelled (the process is exiting)"
        self.jobs = {}
        return True

    def _live(self) -> list:
        return [k for k in self.cands if k.name not in self.dropped]

    def _submit_compiles(self, args: GemmArguments) -> None:
        self.steps += 1
        scratch = scratch_arguments(args)
        workers = self.tuning.compile_workers()
        for k in self._live()[1:]:
            try:
                job = _prepare_compile(k, scratch)
            except Exception as exc:  # noqa: BLE001
                self._drop(k, exc)
                continue
            if job is not None:
                self.jobs[k.name] = background.submit(job, workers)
        self.state = COMPILING

    def _start_timing(self, args: GemmArguments) -> None:
        live = self._live()
        if len(live) == 1:  # every other candidate dropped: the running kernel stays
            self._finish(self.first, args)
            return
        self._rounds = _rounds(live, self.times, self._drop, self.tuning)
        next(self._rounds)
        self.state = TIMING
        self._time_one(args)

    def _time_one(self, args: GemmArguments) -> None:
        self.steps += 1
        t0 = time.perf_counter()
        try:
            self._rounds.send(scratch_arguments(args))
        except StopIteration as stop:
            self.ranked = list(stop.value)
            self.state = VERIFYING
        finally:
            self.timing_s += time.perf_counter() - t0

    def _verify_next(self, args: GemmArguments) -> None:
        """Check the best candidate left against the running kernel: switch to it, or drop
        it (the next one is checked at the next boundary)."""
        self.steps += 1
        if not self.ranked or self.ranked[0] is self.first:
            self._finish(self.first, args)
            return
        best = self.ranked.pop(0)
        ok, why = outputs_match(best, self.first, args)
        if ok:
            self._finish(best, args)
            return
        self.dropped[best.name] = f"outputs differ: {why}"
        log.warning("evtfuse: background tuning dropped %s: its outputs differ from those of "
                    "%s (%s). This is a bug in evtfuse: please report it with EVTFUSE_LOG=debug "
                    "output", best.name, self.first.name, why)

    def _finish(self, kernel, args: GemmArguments) -> None:
        """Record ``kernel`` as the class's choice ("fast"'s record, on disk too) and let
        the calls switch to it."""
        tuning = self.tuning
        record = {**tuning.tuning_record(args, kernel, "fast"),
                  "candidates": len(self.times), "compile_s": round(self.compile_s, 3),
                  "timing_s": round(self.timing_s, 3), "via": "background"}
        with tuning._lock:
            tuning._records[self.key] = record
            self.winner, self.state = kernel, DONE
            self.done = True
        try:
            cache.store_choice(self.key, record)
        except (ConfigError, OSError) as exc:
            log.warning("evtfuse: background tuning's choice not stored: %s", exc)
        for k in self.cands:
            if k is not kernel:
                k.forget_plan(args)
        log.info("evtfuse: background tuning of %dx%dx%d done: %s (%d candidates timed, "
                 "%d dropped)", args.M, args.N, args.K, kernel.name, len(self.times),
                 len(self.dropped))

    def _drop(self, kernel, exc: BaseException) -> None:
        self.dropped[kernel.name] = f"{type(exc).__name__}: {exc}"
        self.tuning._report_failure(kernel, exc)

    def _abandon(self, exc: BaseException) -> None:
        log.warning("evtfuse: background tuning abandoned (%s: %s); calls keep %s. This is a "
                    "bug in evtfuse: please report it with EVTFUSE_LOG=debug output",
                    type(exc).__name__, exc, self.first.name, exc_info=log.isEnabledFor(
                        logging.DEBUG))
        with self.tuning._lock:
            self.state = DONE
            self.done = True


def _rounds(cands: list, times: dict, drop, tuner):
    """``tuner._search``'s timing as a generator (``tuner``: the tuner module, read at each
    use): each ``send(args)`` (scratch arguments)
    runs one window; returns every candidate that ran, best first: the contenders (the
    duel's winner first), then those pruned after the first sustained round."""
    ran = []
    for k in cands:
        args = yield
        try:
            k.run(args)  # its first launch (a compile, where the background one failed)
            times[k.name] = [tuner._time_kernel(k, args)]
        except Exception as exc:  # noqa: BLE001
            drop(k, exc)
            continue
        ran.append(k)
    timed = list(ran)
    for r in range(tuner.ROUNDS - 1):
        for k in timed:
            args = yield
            times[k.name].append(tuner._time_kernel(k, args))
        if r == 0:
            timed = tuner._contenders(timed, times)
    ranked = sorted(timed, key=lambda k: tuner._sustained(times[k.name]))
    if len(ranked) >= 2 and tuner.DUEL_ROUNDS > 0 and tuner._sustained(
            times[ranked[1].name]) <= (1 + tuner.DUEL_MARGIN) * tuner._sustained(
            times[ranked[0].name]):
        a, b = ranked[:2]
        for r in range(tuner.DUEL_ROUNDS):
            for k in ((b, a) if r % 2 == 0 else (a, b)):
                args = yield
                times[k.name].append(tuner._time_kernel(k, args))
        ranked[:2] = sorted((a, b), key=lambda k: tuner._sustained(times[k.name]))
    pruned = sorted((k for k in ran if k not in timed),
                    key=lambda k: tuner._sustained(times[k.name]))
    return ranked + pruned  # those pruned too: the next to check if the leaders fail theirs


class SwitchingPlan:
    """The launch plan of one call structure of a class under background tuning: at each
    call's boundary it lets the session advance (calls of the session's M), then runs its
    current plan; once the session is done it switches to the plan of the class's choice
    (``tuner.choose_kernel``) and is a plain plan from then on."""

    __slots__ = ("session", "tuning", "plan", "kernel_name", "parsed", "cc", "drives", "recipe",
                 "_first_args")

    def __init__(self, session: Session, kernel, args: GemmArguments, cc):
        self.session = session
        self.tuning = session.tuning
        self.plan = kernel.plan(args)
        self.kernel_name = kernel.name
        self.parsed = args.epilogue.parsed
        self.cc = cc
        self.drives = int(args.M) == session.M and args.A.device == session.device
        self.recipe = (args.accumulator_type, args.allow_tf32, args.fp8_fast_accum)
        # the session's first call starts its code generation after its own launch
        self._first_args = args if session.state is None and self.drives else None

    def __call__(self, A, B, values) -> None:
        session = self.session
        if session is not None and self._first_args is None:
            self._boundary(session, A, B, values)
        plan = self.plan  # read once: this call runs this plan to its end
        plan(A, B, values)
        first = self._first_args
        if first is not None:
            self._first_args = None
            session.start(first)

    def _boundary(self, session: Session, A, B, values) -> None:
        if session.done:
            self._switch(A, B, values)
            return
        if not session.captured and _capturing():
            session.captured = True  # said once per class
            log.warning("evtfuse: a CUDA graph is capturing a call of %s (M=%d, N=%d, K=%d) "
                        "before background tuning chose its kernel: the graph keeps %s, "
                        "never switched, however the tuning ends. Tune before capturing "
                        "(tune=\"fast\", or evtfuse.precompile) for the graph to hold the "
                        "tuned kernel.", self.parsed.name, A.shape[-2], B.shape[-1],
                        A.shape[-1], self.kernel_name)
        if not self.drives or _busy() or not session.lock.acquire(blocking=False):
            return
        try:
            if not session.done:
                session.step(lambda: self.arguments(A, B, values))
        finally:
            session.lock.release()
        if session.done:
            self._switch(A, B, values)

    def _switch(self, A, B, values) -> None:
        """Take the class's choice for this structure (never during a capture)."""
        if _busy():
            return
        try:
            args = self.arguments(A, B, values)
            kernel = self.tuning.choose_kernel(args, self.tuning.BACKGROUND, self.cc)
            self.plan = kernel.plan(args)
        except Exception as exc:  # noqa: BLE001  (the call goes on with its kernel)
            log.warning("evtfuse: background tuning's switch failed (%s: %s); the calls keep "
                        "their kernel", type(exc).__name__, exc)
        self.session = None

    def arguments(self, A, B, values) -> GemmArguments:
        """The call's ``GemmArguments`` (validated as ``runtime.api`` validates them)."""
        acc, tf32, fp8 = self.recipe
        named = {k: v for k, v in values.items() if k != OFFS_KEY}
        epi = EpilogueArguments.unbound(self.parsed, **named)
        return GemmArguments(A, B, named.get("D"), acc, epi, allow_tf32=tf32,
                             fp8_fast_accum=fp8, offs=values.get(OFFS_KEY))


def wait(session: Session, timeout: float | None = None) -> bool:
    """Wait until ``session``'s pending background jobs have ended (tests, benchmarks);
    whether they all did within ``timeout``."""
    end = None if timeout is None else time.monotonic() + timeout
    for job in list(session.jobs.values()):
        left = None if end is None else max(0.0, end - time.monotonic())
        if not job.wait(left):
            return False
    return True


__all__ = ["Session", "SwitchingPlan", "outputs_match", "wait"]
