"""Autotuning: time candidate kernels once per problem class, remember the winner on disk.

Layer: runtime.tuning, between ``runtime.run`` (which asks it for a kernel and its launch
plan) and ``runtime.discovery`` (the candidates: ``get_kernels``); above
``runtime.background_tuning``, whose sessions it starts. The key holds everything that
changes which kernel is best or whether it runs at all: the code generator's and the
search's versions (new kernel families and a new search re-tune), the epilogue's DAG
signature, L, N, K and M's size class (``size_class``: a new M in a known class, as in
training with variable sequence lengths or serving with a new batch size, reuses the
class's choice instead of tuning again), dtypes, layouts (strides' order and TMA
alignment), the GPU's name and capability, and the tuning mode. A choice is reused only
where it is among the problem's own candidates (a kernel that needs 64-bit offsets at the
larger M has another name). The in-memory table answers repeated calls without touching
the disk. "fast" tuning times the heuristic's first few candidates within a time budget
(28 s by default, so that a first call with its parsing and launch stays under 30 s;
``EVTFUSE_TUNE_BUDGET_S``), or, near a shape the shipped defaults measured, their
suggestions and the heuristic's first two (``candidates``); "exhaustive" times all, then
the winner at other tile orders (``TILE_ORDERS``); "none" takes the first suggestion, else
the heuristic's first. Candidates compile at once in a pool of threads (``_precompile``)
before any is timed. "background" runs a kernel quick to compile at once (``_starter``) and
tunes as "fast" would (the starter among the candidates) over the following calls
(``runtime.background_tuning``), under "fast"'s key and record: a class tuned either way
is tuned for both. A tuning ("fast", "exhaustive") holds the key's lock
file (``cache.tuning_lock``): processes sharing the cache tune a class once.
"""

from __future__ import annotations

import logging
import os
import statistics
import sys
import threading
import time

import torch

from ..arguments import GemmArguments
from ..backends.triton.spec import GENERATOR_VERSION
from ..errors import UnsupportedError
from ..ir import signature
from ..sizes import size_class
from . import background_tuning, cache, triton_key
from .device import device_name
from .defaults import suggestions
from .discovery import explain, get_kernels, no_device_error
from .kernel import scratch_arguments

log = logging.getLogger("evtfuse")
# this module, as a background tuning (``background_tuning.Session``) reads its settings,
# tables and timing at each use (tests change them here)
_THIS = sys.modules[__name__]

FAST_CANDIDATES = 10  # the gluon family's 5-9 (two-warpgroup consumers for epilogues of many ops, 2 piece counts x 2 GROUP_M, cooperative, + staged quarters), then the hopper family's (configs that leave most SMs idle last: kernel.order_by_fill)
FROM_HEURISTIC = 2  # the heuristic's first candidates timed beside the shipped defaults'
TUNER_VERSION = "9"  # part of the key: a choice made by an older search is made again
#                      (4: the cooperative configs moved to GROUP_M 4; 5: the leaders' duel;
#                      6: candidates ordered by how much of the GPU their tiles fill;
#                      7: ping-pong bands of 16 row-tiles for three-tile epilogues, and
#                      exhaustive tuning tries its pick at other tile orders;
#                      8: two-warpgroup consumers for epilogues of many ops;
#                      9: keyed on M's size class)
_records: dict[str, dict] = {}  # tuning key (M's class) -> its choice, as the disk holds it
_chosen: dict[tuple, object] = {}  # (tuning key, M) -> the kernel chosen for that M
_sessions: dict[str, object] = {}  # tuning key -> its background tuning (``background_tuning``)
_lock = threading.RLock()  # writes of the tables above (background tuning switches from
#                            whichever thread finishes it)
BACKGROUND = "background"
TUNE_MODES = ("fast", "exhaustive", "none", BACKGROUND)


def chosen_kernels() -> list[tuple[int, str]]:
    """(M, kernel name) of every choice this process made so far, in the order made (the
    benchmarks record which kernels ran)."""
    with _lock:
        return [(m, getattr(k, "name", str(k))) for (_, m), k in _chosen.items()]


def layout_key(t: torch.Tensor) -> tuple:
    """What a kernel's support and speed depend on in a tensor, its sizes aside (the key
    holds L, N, K and M's class; the DAG's signature each operand's kind): dtype, which
    dims are unit-stride or of size 1, the strides' order and 16-byte alignment (TMA),
    the address's alignment, the device."""
    strides, size = t.stride(), t.element_size()
    return (str(t.dtype), tuple(d == 1 for d in t.shape), tuple(s == 1 for s in strides),
            tuple(sorted(range(t.dim()), key=lambda d: strides[d])),
            tuple(s * size % 16 == 0 for s in strides), t.data_ptr() % 16 == 0,
            str(t.device))


def tuning_key(args: GemmArguments, tune: str, cc) -> str:
    """The key of a tuning choice: the problem's structure, its size class and options
    (an accumulator other than the inputs' own, fp16, is a part only when chosen, and a
    mark of grouped problems over M since the hopper family runs them: the keys of every
    other problem stay as they were)."""
    values = args.epilogue.values
    tensors = sorted((k, layout_key(v)) for k, v in values.items()
                     if isinstance(v, torch.Tensor))
    acc = (str(args.accumulator_type),) if args.accumulator_type == torch.float16 else ()
    # grouped over M: choices made before the hopper family took them (portable only) are
    # not reused
    over_m = ("hopper-grouped",) if args.group_dim == "M" else ()
    return cache.make_key(GENERATOR_VERSION, TUNER_VERSION, signature(args.dag), args.L,
                          size_class(args.M), args.N, args.K,
                          layout_key(args.A), layout_key(args.B), tensors,
                          None if args.offs is None else layout_key(args.offs), args.allow_tf32,
                          args.fp8_fast_accum, device_name(args.A.device), cc, tune, *acc,
                          *over_m)


def _time_kernel(kernel, args: GemmArguments) -> float:
    """Median ms of ``kernel.run(args)``, measured as the benchmark suite measures
    (``triton.testing.do_bench``: L2 flushed before each call, CUDA events around it).

    The flush also keeps the host's launch work out of the time: the GPU is busy with it
    while the host enqueues the launch. Events recorded on an idle GPU around a launch
    also time the host's launch work (20-40 us on the H100 machine), which differs between
    families; with them the tuner took gluon for row amax at 4096^3 (0.207 ms) over the
    hopper kernel (0.196 ms; benchmarks/HISTORY.md, fifth session)."""
    if args.A.device.type != "cuda":
        t0 = time.perf_counter()
        kernel.run(args)
        return (time.perf_counter() - t0) * 1e3
    from triton.testing import do_bench

    return float(do_bench(lambda: kernel.run(args), warmup=WARMUP_MS, rep=REP_MS,
                          return_mode="median"))


def choose_kernel(args: GemmArguments, tune: str = "fast", cc=None):
    """The kernel to run ``args`` with: its size class's choice (``size_class``: in this
    process, or from the disk cache), or found by timing candidates (``tune``: "fast",
    "exhaustive"), or the first suggestion ("none"). "background": the class's choice where
    there is one (the record "fast" keeps), else the first suggestion while a
    ``background_tuning.Session`` tunes the class (``launch_plan`` wraps the calls' plans so
    that they switch to its winner)."""
    return _choose(args, tune, cc)[0]


def launch_plan(args: GemmArguments, tune: str = "fast", cc=None):
    """The launch plan of ``choose_kernel``'s kernel for ``args``; under a background
    tuning of its class, a ``background_tuning.SwitchingPlan`` that advances the tuning at
    its calls' boundaries and switches to the winner once it is known and verified."""
    kernel, session = _choose(args, tune, cc)
    if session is None or session.done:
        return kernel.plan(args)
    return background_tuning.SwitchingPlan(session, kernel, args, cc)


def check_tune(tune) -> None:
    """A ``ValueError`` naming the modes for anything else."""
    if tune not in TUNE_MODES:
        raise ValueError(f"tune must be 'fast', 'exhaustive', 'none' or 'background', "
                         f"not {tune!r}")


def _times_on_device(args: GemmArguments) -> bool:
    """Whether tuning times kernels for ``args``: on a GPU. Under Triton's CPU interpreter
    a tuning takes the first kernel untimed (tests replace this to drive the timing logic
    with stand-in kernels and a fake clock)."""
    return args.A.device.type == "cuda"


def _choose(args: GemmArguments, tune: str, cc):
    """(the kernel for ``args``, the background tuning session it runs under, or None)."""
    check_tune(tune)
    key = tuning_key(args, "fast" if tune == BACKGROUND else tune, cc)
    hit = _chosen.get((key, args.M))
    if hit is not None:
        return hit, None
    if args.A.device.type == "cuda":
        triton_key.install()  # Triton's key found while the families are asked (a thread)
    nowhere = no_device_error(args, cc)
    if nowhere is not None:  # CPU tensors, interpreter off: what to do, in the first line
        raise nowhere
    kernels = get_kernels(args, cc=cc)
    if not kernels:
        raise UnsupportedError("no evtfuse kernel supports these arguments:\n" + explain(args, cc))
    chosen = _recorded(args, key, kernels, tune)
    if chosen is None and len(kernels) > 1 and _times_on_device(args):
        if tune == BACKGROUND:
            return _provisional(args, key, kernels)
        if tune != "none":
            chosen = _tuned(args, key, kernels, tune)
    if chosen is None:  # one kernel, the interpreter's first, or "none"'s pick
        chosen = kernels[0] if len(kernels) == 1 or not _times_on_device(args) \
            else candidates(args, kernels, "none")[0]
    with _lock:
        _chosen[(key, args.M)] = chosen
    if args.A.device.type == "cuda":
        chosen.compile_ahead(args)  # the variant another M of the class may need
    return chosen, None


def _recorded(args: GemmArguments, key: str, kernels: list, tune: str, record=None):
    """The kernel of the class's recorded choice (this process's, else the disk's, or
    ``record``), where it is among ``kernels`` (for "exhaustive", their other tile orders
    too); None where there is none."""
    by_name = {k.name: k for k in kernels}
    record = record or _records.get(key) or cache.load_choice(key)
    if record and tune == "exhaustive" and record.get("kernel") not in by_name:
        # an exhaustive choice may be a candidate at another tile order (_refine_tile_order)
        for k in kernels:
            for v in _tile_order_variants(k, args):
                by_name.setdefault(v.name, v)
    if not record or record.get("kernel") not in by_name:
        return None
    chosen = by_name[record["kernel"]]
    with _lock:
        _records[key] = record  # the next M of the class does not read the disk again
    log.info("evtfuse: %s for %dx%dx%d: the choice of its size class (tuned at M=%s)",
             chosen.name, args.M, args.N, args.K, record.get("M"))
    return chosen


def _tuned(args: GemmArguments, key: str, kernels: list, tune: str):
    """Time the candidates ("fast", "exhaustive") and store the winner, one process at a
    time per key (``cache.tuning_lock``): one that waited for another's tuning takes the
    choice it stored."""
    with cache.tuning_lock(key) as held:
        if held:
            record = cache.load_choice(key)
            chosen = _recorded(args, key, kernels, tune, record) if record else None
            if chosen is not None:
                return chosen
        cands = candidates(args, kernels, tune)
        log.info("evtfuse: tuning %dx%dx%d (M class %d): %d candidates%s", args.M, args.N,
                 args.K, size_class(args.M), len(cands),
                 "" if cands is kernels else " (the shipped defaults' and the heuristic's)")
        cost: dict = {}
        chosen = _search(args, cands, tune, cost)
        if tune == "exhaustive":
            chosen = _refine_tile_order(args, chosen, kernels)
        record = {**tuning_record(args, chosen, tune), **cost}
        cache.store_choice(key, record)
    with _lock:
        _records[key] = record
    return chosen


def _starter(args: GemmArguments, kernels: list):
    """The kernel a "background" class's first call compiles and runs. On a GPU the first
    offered kernel of the family quickest to compile (``KernelFamily.compile_s``): that one
    compile is most of the call (benchmarks/cold_start.py: 2.5-3.1 s with the gluon
    kernel "none" picks, on an H200), and the tuning that follows times the starter beside
    "fast"'s candidates, so it is switched away from where it is slower. Elsewhere (the
    interpreter) what "none" takes."""
    if kernels[0].target.kind != "cuda":
        return candidates(args, kernels, "none")[0]
    return min(kernels, key=lambda k: k.family.compile_s)  # the first of the cheapest


def _provisional(args: GemmArguments, key: str, kernels: list):
    """"background" where the class has no choice yet: the starter (``_starter``), and the
    session tuning the class (started here for its first call). Not kept in ``_chosen``:
    the session's winner goes there."""
    first = _starter(args, kernels)
    with _lock:
        session = _sessions.get(key)
        if session is None:
            cands = candidates(args, kernels, "fast")[:FAST_CANDIDATES]
            session = _sessions[key] = background_tuning.Session(key, args, first, cands,
                                                                 _THIS)
    if session.done:  # its winner is not among this problem's kernels, or it was abandoned
        return first, None
    return (session.first if session.first in kernels else first), session


def candidates(args: GemmArguments, kernels: list, tune: str) -> list:
    """The kernels a search times (``tune="none"``: the first is taken untimed). Where the
    shipped defaults (``defaults.suggestions``: the suite's tuned choices on this kind of
    GPU, nearest shape) suggest kernels this problem is offered, "fast" and "none" start
    from them: "fast" times those and the heuristic's first ``FROM_HEURISTIC`` (fewer
    compiles and timing windows than the heuristic's ``FAST_CANDIDATES``), "none" takes the
    first suggestion. Elsewhere, and for "exhaustive", the families' own order."""
    if tune == "exhaustive":
        return kernels
    hints = hinted(args, kernels)
    if not hints:
        return kernels
    return hints + [k for k in kernels[:FROM_HEURISTIC] if k not in hints]


def hinted(args: GemmArguments, kernels: list) -> list:
    """The offered kernels the shipped defaults suggest for ``args``, in their order (none
    for a grouped GEMM: the defaults were measured on dense problems)."""
    target = kernels[0].target
    if target.kind != "cuda" or args.offs is not None:
        return []
    by_name = {k.name: k for k in kernels}
    names = suggestions(device_name(args.A.device), f"{target.cc // 10}.{target.cc % 10}",
                        target.sms, str(args.A.dtype), (int(args.M), int(args.N), int(args.K)))
    return [by_name[n] for n in names if n in by_name]


def tuning_record(args: GemmArguments, chosen, tune: str) -> dict:
    """What the disk keeps of a choice (``cache.TUNING_FIELDS``): the kernel, and the
    problem it was timed on for ``evtfuse cache list``."""
    return {"kernel": chosen.name, "M": int(args.M), "N": int(args.N), "K": int(args.K),
            "L": int(args.L), "dtype": str(args.A.dtype), "epilogue": args.epilogue.parsed.name,
            "tune": tune, "device": device_name(args.A.device)}


ROUNDS = 4  # timing rounds over all candidates, interleaved
# do_bench time per candidate and round: long enough for the GPU to reach the clocks it
# holds under sustained load. Measured on an H100 (benchmarks/HISTORY.md, ninth session; gelu +
# bias, 16384x4096x4096): with 15 ms windows cuBLAS read 0.721 ms and the gluon 128x128
# kernel ranked first (0.75-0.79 against 0.81-0.86 for the hopper 128x256 one); with
# 200 ms windows cuBLAS read 0.814, the hopper kernel ranked first (0.837-0.851 against
# 0.841-0.902) and the benchmark suite, which times as long, agreed (0.819 against 0.855)
REP_MS = 100
WARMUP_MS = 5  # do_bench's warm-up time before each window
# The two leaders after the rounds, when the second is within DUEL_MARGIN of the first, are
# timed DUEL_ROUNDS more times each, alternating which goes first; the pick between them is
# made on all their later rounds. At 2048^3-4096^3 the best candidates of different
# families sit within 1-3% of each other, and a median of three rounds picked a different
# one from process to process (benchmarks/HISTORY.md, thirteenth session: bias+relu 2048^3 drew the
# Gluon 128x128 kernel in one run, the hopper one-wave kernel in another)
DUEL_ROUNDS = 4
DUEL_MARGIN = 0.03


def _sustained(times: list[float]) -> float:
    """A candidate's time under sustained load: the median of its rounds after the first.

    The first round times each candidate right after its compile, seconds in which the
    GPU idled and cooled: it runs at boost clocks then, by as much as that candidate's
    compile let it cool. Measured on an H100 (benchmarks/HISTORY.md, ninth session; gelu+bias,
    two tunings from empty caches per shape): at 16384x4096x4096 the first rounds read
    0.725-0.807 ms and the later ones 0.738-0.935, and the lowest first-round time
    picked a different kernel in each tuning (cooperative e4, then ping-pong e4), while
    the later rounds' medians picked the same one both times (ping-pong e2 GROUP_M 8,
    0.74-0.77 ms against 0.80-0.88 for the others); 4096^3 likewise. An earlier tuner took
    the lowest time of any round (fifth session: at 8192^3 the first times ranked the
    families as a sustained duel did), which made the pick depend on compile times."""
    return statistics.median(times[1:] or times)


def _window_s(first_ms: float) -> float:
    """Seconds one do_bench window of a candidate takes: 6 calls to estimate its run time,
    the warm-up, the window itself and ~10 ms of host work."""
    return (6 * first_ms + WARMUP_MS + REP_MS + 10) / 1e3


def _later_s(first_ms: list[float]) -> float:
    """Seconds the later rounds and the duel take for candidates of these first times."""
    windows = [_window_s(t) for t in first_ms]
    later = (ROUNDS - 1) * sum(windows)
    if len(windows) >= 2:
        later += 2 * DUEL_ROUNDS * max(windows)
    return later


def _fits(spent: float, tried: int, first_ms: list[float], budget: float) -> bool:
    """Whether one more candidate fits the budget: ``spent`` seconds so far over ``tried``
    candidates (compiles and first windows; their mean stands for the next one's), plus the
    later rounds and the duel of those that ran (first times ``first_ms``) and of the next
    one (timed as their mean)."""
    mean_first = sum(first_ms) / len(first_ms)
    return spent + spent / tried + _later_s([*first_ms, mean_first]) <= budget


def _search(args: GemmArguments, kernels, tune: str, cost: dict | None = None):
    """Compile and time each candidate (first round), then time the ones that ran in
    ``ROUNDS - 1`` more rounds in turn, interleaved (after the first of them, only those
    within ``PRUNE_MARGIN`` of the best); the lowest ``_sustained`` time wins,
    after a duel (``_duel``) when the two best are within ``DUEL_MARGIN``. The first round
    takes a candidate only while the time spent, the next one's compile and first window
    (the mean of those so far) and the later rounds and the duel of all of them fit the
    budget (``_fits``). ``cost``, if given, receives where the search's time went (kept in
    the tuning record, shown by ``evtfuse cache list``): ``candidates`` timed,
    ``compile_s`` (the parallel precompile) and ``timing_s`` (the rest: the first round's
    leftover compiles and every timing window)."""
    from tqdm.auto import tqdm

    budget = float(os.environ.get("EVTFUSE_TUNE_BUDGET_S", "28"))
    cands = kernels if tune == "exhaustive" else kernels[:FAST_CANDIDATES]
    args = scratch_arguments(args)
    times: dict[str, list[float]] = {}
    ran = []
    compile_s = _precompile(cands, args)  # the candidates' compiles, at once
    budget -= compile_s
    t_start = time.perf_counter()
    show = log.isEnabledFor(logging.INFO) or os.environ.get("EVTFUSE_PROGRESS", "1") != "0"
    bar = tqdm(cands, desc=f"evtfuse tuning {args.M}x{args.N}x{args.K}", leave=False,
               disable=not show)
    tried = 0
    for k in bar:
        spent = time.perf_counter() - t_start
        if tune != "exhaustive" and ran and not _fits(spent, tried, [times[r.name][0] for r in ran],
                                                       budget):
            log.info("tuning budget of %.0f s spent after %d candidates", budget, len(ran))
            break
        tried += 1
        try:
            k.run(args)  # compile, warm up
            times[k.name] = [_time_kernel(k, args)]
        except Exception as exc:
            _report_failure(k, exc)
            continue
        ran.append(k)
    bar.close()
    if not ran:
        raise UnsupportedError("every candidate kernel failed to compile or run; see the log "
                               "(EVTFUSE_LOG=debug)")
    timed = list(ran)
    for r in range(ROUNDS - 1):
        for k in timed:
            times[k.name].append(_time_kernel(k, args))
        if r == 0:  # one sustained round each: drop the candidates that cannot win
            timed = _contenders(timed, times)
    best = _duel(args, sorted(timed, key=lambda k: _sustained(times[k.name])), times)
    for k in cands:  # the others' plans for this problem would keep their workspaces (a
        if k is not best:  # row logsumexp's partials: 110 MiB for a cross-entropy's chunks)
            k.forget_plan(args)
    for k in ran:
        log.debug("candidate %s: %s ms", k.name, ", ".join(f"{t:.4f}" for t in times[k.name]))
    if cost is not None:
        cost.update(candidates=len(ran), compile_s=round(compile_s, 3),
                    timing_s=round(time.perf_counter() - t_start, 3))
    return best


def compile_workers() -> int:
    """Threads compiling candidates at once (``EVTFUSE_COMPILE_WORKERS``; default: the
    CPU count, at most 16). Triton's compiles release the GIL: two threads compiled four
    candidates 1.7x as fast as one on a 2-core machine (offline sm_90 compiles)."""
    default = min(16, os.cpu_count() or 1)
    return max(1, int(os.environ.get("EVTFUSE_COMPILE_WORKERS", default)))


def _precompile(cands, args: GemmArguments) -> float:
    """Compile the candidates' kernels in a pool of ``compile_workers`` threads (Triton's
    ``AsyncCompileMode``) before any is timed; returns the seconds it took. A candidate
    that fails here is left to the timing loop, which compiles it again and reports the
    failure (``_report_failure``); nothing runs on the GPU here."""
    from concurrent.futures import ThreadPoolExecutor

    from ..backends.triton.versions import async_compile_mode

    mode, workers = async_compile_mode(), compile_workers()
    if mode is None or workers <= 1 or len(cands) <= 1:
        return 0.0
    t0 = time.perf_counter()
    plans = []
    for k in cands:  # module generation and import: here, one by one
        try:
            plans.append(k.plan(args))
        except Exception:  # noqa: BLE001  (reported by the timing loop)
            continue
    threads = max(1, min(workers, len(plans)))
    with ThreadPoolExecutor(threads) as pool, mode(pool, ignore_errors=True):
        for plan in plans:
            if hasattr(plan, "warmup"):
                try:
                    plan.warmup(args.A, args.B, args.launch_values)
                except Exception:  # noqa: BLE001  (reported by the timing loop)
                    continue
    spent = time.perf_counter() - t0
    log.info("evtfuse: %d candidates compiled in %.1f s (%d threads)", len(plans), spent,
             threads)
    return spent


def _report_failure(kernel, exc: BaseException) -> None:
    """A candidate that failed is skipped. A config over the GPU's resources (shared
    memory, registers, threads: Triton's ``OutOfResources``) is expected; any other failure
    to compile or launch is a bug, logged as a warning to report, never a silent reason to
    run a slower kernel."""
    first = (str(exc).splitlines() or [""])[0][:200]
    if type(exc).__name__ == "OutOfResources":
        log.info("candidate %s skipped: %s", kernel.name, first)
    else:
        log.warning("candidate %s failed (%s: %s); skipped. This is a bug in evtfuse: please "
                    "report it with EVTFUSE_LOG=debug output", kernel.name,
                    type(exc).__name__, first)


# Tile orders (GROUP_M: row-tiles per band of the persistent tile order) the exhaustive
# search also tries for the kernel it picked. The band decides how often A's and B's lines
# come back from DRAM while the outputs stream through L2, and it moves a kernel by up to
# 5% either way, not monotonically and differently per shape and epilogue (benchmarks/HISTORY.md,
# sixteenth session, H100: relu aux 8192x8192x1024 bands of 4 / 8 / 16 0.274 / 0.259 /
# 0.253 ms, 16384x4096x4096 0.816 / 0.796 / 0.926); the fast search keeps to the families'
# own one or two orders per config.
TILE_ORDERS = (4, 8, 16)


def _tile_order_variants(kernel, args: GemmArguments) -> list:
    """``kernel`` at the ``TILE_ORDERS`` it does not have; none where the problem has one
    row of tiles (the order does not change which tiles run together)."""
    if args.M <= kernel.config.block_m and args.L == 1:
        return []
    return [kernel.with_config(group_m=g) for g in TILE_ORDERS if g != kernel.config.group_m]


def _refine_tile_order(args: GemmArguments, chosen, kernels, variants=_tile_order_variants):
    """The best of ``chosen`` and its other tile orders (``variants``) not among
    ``kernels``, timed as ``_search`` times (exhaustive tuning only)."""
    seen = {k.name for k in kernels}
    more = [k for k in variants(chosen, args) if k.name not in seen]
    if not more:
        return chosen
    return _search(args, [chosen, *more], "exhaustive")


# A candidate slower than the best by more than this after its first sustained round is
# timed no more (it cannot win: the leaders' rounds vary by a few percent, the duel
# decides within 3%); it saves its later rounds, 0.1 s each, from a first call's tuning
PRUNE_MARGIN = 0.3


def _contenders(ran: list, times: dict[str, list[float]]) -> list:
    """The candidates of ``ran`` within ``PRUNE_MARGIN`` of the best sustained time so far
    (the best among them), in their order."""
    best = min(_sustained(times[k.name]) for k in ran)
    keep = [k for k in ran if _sustained(times[k.name]) <= (1 + PRUNE_MARGIN) * best]
    for k in ran:
        if k not in keep:
            log.debug("candidate %s: %.4f ms, over %.0f%% slower than the best: no more rounds",
                      k.name, _sustained(times[k.name]), 100 * PRUNE_MARGIN)
    return keep


def _duel(args: GemmArguments, ranked: list, times: dict[str, list[float]]):
    """The better of the two leaders of ``ranked`` (sorted by ``_sustained`` time) after
    ``DUEL_ROUNDS`` more rounds each, alternating which goes first, when they are within
    ``DUEL_MARGIN`` of each other; else the leader. The rounds are appended to ``times``."""
    if len(ranked) < 2 or DUEL_ROUNDS <= 0:
        return ranked[0]
    a, b = ranked[:2]
    if _sustained(times[b.name]) > (1 + DUEL_MARGIN) * _sustained(times[a.name]):
        return a
    for r in range(DUEL_ROUNDS):
        for k in ((b, a) if r % 2 == 0 else (a, b)):
            times[k.name].append(_time_kernel(k, args))
    log.debug("duel of %s and %s", a.name, b.name)
    return min((a, b), key=lambda k: _sustained(times[k.name]))
