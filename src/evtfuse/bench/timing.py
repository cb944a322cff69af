"""Measuring on the GPU: kernel time, copy bandwidth, extra memory, result error.

Layer: bench (measurement). Times are medians of ``triton.testing.do_bench`` (CUDA
events around each call, L2 flushed before each call); without Triton the same method
is used here directly. Nothing in this module is imported by the CPU tests' pure parts
except ``rel_err``, which works on any device.
"""

from __future__ import annotations

import itertools
import statistics
import time
from typing import Any, Callable, Sequence

import torch


def rotating(call: Callable[[Any], Any], sets: Sequence[Any]) -> Callable[[], Any]:
    """A no-argument function calling ``call(set)`` on each input set in turn."""
    if len(sets) == 1:
        only = sets[0]
        return lambda: call(only)
    it = itertools.cycle(sets)
    return lambda: call(next(it))


def bench_ms(fn: Callable[[], Any], warmup_ms: float = 25, rep_ms: float = 100) -> float:
    """Median time of one call of ``fn`` in milliseconds."""
    try:
        from triton.testing import do_bench
    except ImportError:  # pragma: no cover - triton is a dependency
        do_bench = None
    if do_bench is not None:
        return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
    return _events_median_ms(fn, warmup_ms, rep_ms)  # pragma: no cover


def _events_median_ms(fn, warmup_ms, rep_ms):  # pragma: no cover - GPU only
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        flush.zero_()
        fn()
    end.record()
    torch.cuda.synchronize()
    est = max(start.elapsed_time(end) / 5, 1e-3)
    for _ in range(max(1, int(warmup_ms / est))):
        fn()
    n = max(1, int(rep_ms / est))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for s, e in zip(starts, ends):
        flush.zero_()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def guarded_ms(fn: Callable[[], Any], reps: int = 200, sleep_cycles: int = 400_000) -> float:
    """Median time of one call of ``fn`` in milliseconds, L2 flushed before each call, with
    the GPU kept busy (``torch.cuda._sleep``) while the host enqueues the call, so that no
    host-side cost can fall between the events: the kernels' own time, with a tighter spread
    than ``bench_ms``. The spin between calls lets the GPU run cooler than under the
    suite's back-to-back calls, so kernels within ~2% of each other can rank differently
    here than in the suite or the tuner (which time sustained load): a development probes'
    method; the suite keeps ``bench_ms``."""
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    for _ in range(10):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends):
        flush.zero_()
        torch.cuda._sleep(sleep_cycles)
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def copy_bandwidth(nbytes: int = 2**30, device: str = "cuda") -> tuple[float, float]:
    """(bytes per second counting read + write, ms) of a device-to-device copy."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    src.fill_(1)
    ms = bench_ms(lambda: dst.copy_(src))
    del src, dst
    torch.cuda.empty_cache()
    return 2.0 * nbytes / (ms * 1e-3), ms


def host_timed_s(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Wall seconds of one call, synchronised before and after; and its result."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    result = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0, result


def graph_replay(fn: Callable[[], Any], warmups: int = 3) -> Callable[[], None]:
    """``fn`` captured in a CUDA graph after ``warmups`` calls on a side stream (tuning,
    compiles and plans done off the capture, as torch's ``make_graphed_callables`` warms
    up): the graph's replay, which runs ``fn``'s kernels without its host work. GPU only."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmups):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def back_to_back_ms(fn: Callable[[], Any], grads: Sequence[torch.Tensor] = (),
                    steps: int = 20) -> float:
    """A step's time in ``steps`` back-to-back steps, as a training loop runs them (L2 warm,
    the host free to run ahead; CUDA events around the run, ``grads``' gradients set to None
    before each step; the median of three runs), after one warm-up step. GPU only."""
    fn()
    runs = []
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(steps):
            for t in grads:
                t.grad = None
            fn()
        end.record()
        torch.cuda.synchronize()
        runs.append(start.elapsed_time(end) / steps)
    return statistics.median(runs)


def extra_memory_mib(fn: Callable[[], Any]) -> float:
    """Peak device memory one call allocates beyond what is held before it (MiB)."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del result
    return max(0.0, (peak - base) / 2**20)


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """||x - ref|| / ||ref|| (2-norms in fp32; NaN anywhere gives NaN)."""
    if x.shape != ref.shape:
        if x.numel() != ref.numel():
            raise ValueError(f"shape {tuple(x.shape)} differs from the reference's "
                             f"{tuple(ref.shape)}")
        x = x.reshape(ref.shape)
    xf, rf = x.float(), ref.float()
    num = torch.linalg.vector_norm(xf - rf).item()
    den = torch.linalg.vector_norm(rf).item()
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den




def kernel_profile(fn: Callable[[], Any], grads: Sequence[torch.Tensor] = (),
                   steps: int = 10) -> dict:
    """Where a step's GPU time goes (torch.profiler over ``steps`` calls of ``fn`` after one
    warm-up, ``grads``' gradients set to None before each): ``kernels``, each kernel's GPU
    ms per step by name (largest first), ``kernel_sum`` their sum, and ``idle_before``, the
    idle GPU ms per step before each kernel (the six largest: gaps between one kernel's
    end and the next one's start, the first step's left out), ``idle`` their total,
    ``exposed`` each kernel's share of the busy GPU ms per step (``exposed_ms``). A
    step's time above ``kernel_sum`` is idle GPU: host work, or something that
    synchronises. GPU only. The profiled steps run back to back, L2 warm: compare kernel
    times within one profile, not with ``do_bench``'s (the same cuBLAS GEMMs took 1.26-1.27
    ms here and 1.37-1.42 under ``do_bench`` in one run on an H200)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            for t in grads:
                t.grad = None
            fn()
        torch.cuda.synchronize()
    rows = {e.key[:90]: e.device_time_total / steps / 1e3 for e in prof.key_averages()
            if e.device_time_total > 0}
    spans = sorted((e.time_range.start, e.time_range.end, e.name[:60]) for e in prof.events()
                   if e.device_type.name == "CUDA")
    # the first step's gaps left out: the GPU waits there for the host, which starts the
    # profile even with it (one step's kernels: as many as the steps' average)
    spans = spans[len(spans) // steps:]
    idle: dict = {}
    last_end = spans[0][1] if spans else 0
    for start, end, name in spans[1:]:  # a gap: no kernel running (overlaps are not gaps)
        if start > last_end:
            idle[name] = idle.get(name, 0.0) + (start - last_end) / max(1, steps - 1) / 1e3
        last_end = max(last_end, end)
    return {"kernels": dict(sorted(rows.items(), key=lambda kv: -kv[1])),
            "kernel_sum": sum(rows.values()),
            "exposed": {k: v / max(1, steps - 1) for k, v in exposed_ms(spans).items()},
            "idle_before": dict(sorted(idle.items(), key=lambda kv: -kv[1])[:6]),
            "idle": sum(idle.values())}


def exposed_ms(spans: Sequence[tuple]) -> dict:
    """Each name's share of the busy GPU time, in ms: ``spans`` are (start_us, end_us,
    name), and each instant where kernels run is charged to the one that started first.
    A kernel that a programmatic dependent launch starts early (``combine_partials``, whose
    programs wait on their SMs for the kernel that writes its partials) is charged only for
    the time after that kernel ends; its time in ``kernels`` counts the wait. The shares
    and the idle time add up to the step. Largest first."""
    spans = sorted(spans)  # by start: the lowest index running is the first started
    edges = sorted([(s, 1, i) for i, (s, _, _) in enumerate(spans)]
                   + [(e, -1, i) for i, (_, e, _) in enumerate(spans)])
    running: set = set()
    out: dict = {}
    prev = None
    for t, kind, i in edges:
        if running and prev is not None and t > prev:
            name = spans[min(running)][2]
            out[name] = out.get(name, 0.0) + (t - prev) / 1e3
        if kind == 1:
            running.add(i)
        else:
            running.discard(i)
        prev = t
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def synchronizing_calls(fn: Callable[[], Any]) -> list[str]:
    """The calls in one run of ``fn`` that make the host wait for the GPU, as torch's sync
    debug mode reports them (``.item()``, ``nonzero``, a copy to the host...; not a
    ``torch.cuda.synchronize`` of one's own), one line each: an idle GPU inside a step with
    a fast host comes from these. GPU only."""
    import warnings

    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    return [f"{w.filename}:{w.lineno}: {str(w.message)[:200]}" for w in caught
            if "called a synchronizing" in str(w.message)]


__all__ = ["bench_ms", "copy_bandwidth", "extra_memory_mib", "guarded_ms", "host_timed_s",
           "exposed_ms", "kernel_profile", "rel_err", "rotating", "synchronizing_calls"]
