"""Running the cells: every system on one workload and shape, in one process.

Layer: bench (orchestration; needs a CUDA GPU). For each cell the systems run in this
order: eager torch (its result is the reference), cuBLAS ``A @ B`` (measured once per
shape and dtype; it sets the compute floor), the cuBLASLt fused call where PyTorch has
one, evtfuse (a first call that compiles and tunes, timed as the cold start, then a
warm call), and ``torch.compile(mode="max-autotune-no-cudagraphs")`` of the whole
function. Each system's result is checked against the reference before it is timed.

Invariant: nothing a system does can stop the suite. Every system runs under its own
``try``; a failure becomes a record with a status (``unsupported``, ``rejected``,
``error``, ``skipped``) and the message, and the next system runs.
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from . import report
from . import workloads as W
from .timing import bench_ms, extra_memory_mib, host_timed_s, rel_err, rotating

COMPILE_MODE = "max-autotune-no-cudagraphs"


class Budget:
    """Seconds left before the run must stop and write what it has."""

    def __init__(self, seconds: float, start: float | None = None):
        self.seconds = float(seconds)
        self.start = time.monotonic() if start is None else start

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float:
        return self.seconds - self.elapsed()

    def allows(self, need_s: float) -> bool:
        return self.left() >= need_s


@dataclass
class Config:
    dtype: torch.dtype = torch.bfloat16
    tune: str = "fast"
    compile: bool = True
    warmup_ms: float = 25.0
    rep_ms: float = 100.0
    # timing rounds per cell, every system once per round (interleaved). Seven: at
    # 16384x4096x4096 one system's rounds spread 7% within a cell on an H100 (run BY), so
    # the median of three could not resolve the 2% of issue 4's cuBLASLt target; nine
    # rounds did at 4096^3 (run BR). A round costs ~1 s per cell against ~20-60 s of
    # torch.compile's compile
    rounds: int = 7
    tol: float | None = None  # relative error on norms; None: by dtype
    max_sets: int = 8
    l2_bytes: int = 50 * 2**20
    seed: int = 0
    reserve_s: float = 15.0  # kept free at the end for writing the outputs
    compile_estimate_s: float = 90.0  # before any torch.compile has been seen
    evtfuse_estimate_s: float = 35.0  # before any evtfuse first call has been seen
    device: str = "cuda"
    systems: frozenset = frozenset(report.SYSTEMS)  # mm always runs: it sets the floor
    log: Callable[[str], None] = field(default=lambda s: print(s, file=sys.stderr, flush=True))


def tolerance(w: W.Workload, cfg: Config) -> float:
    if cfg.tol is not None:
        return cfg.tol
    if w.fp8:
        return 0.07  # fp8 e4m3 output: 3 mantissa bits
    return {torch.float32: 1e-2}.get(cfg.dtype, 2e-2)


def classify_error(exc: BaseException) -> tuple[str, str]:
    """(status, message): evtfuse's UnsupportedError -> unsupported, its EpilogueError ->
    rejected (the frontend refused the epilogue), anything else -> error."""
    status = "error"
    try:
        import evtfuse

        if isinstance(exc, getattr(evtfuse, "UnsupportedError", ())):
            status = "unsupported"
        elif isinstance(exc, getattr(evtfuse, "EpilogueError", ())):
            status = "rejected"
    except Exception:  # pragma: no cover
        pass
    msg = f"{type(exc).__name__}: {exc}".strip()
    return status, msg[:1500]


class InputSet:
    """One set of inputs (A, B, operands) and evtfuse's preallocated outputs."""

    def __init__(self, values: dict[str, Any], outs: dict[str, Any]):
        self.values = values
        self.outs = outs

    @property
    def A(self):
        return self.values["A"]

    @property
    def B(self):
        return self.values["B"]

    @property
    def ops(self) -> dict[str, Any]:
        return {k: v for k, v in self.values.items() if k not in ("A", "B")}


def new_cell(w: W.Workload, shape: W.Shape, cfg: Config) -> dict[str, Any]:
    return {
        "workload": w.name, "title": w.title, "shape": list(shape),
        "shape_str": W.shape_str(shape), "dtype": W.dtype_name(cfg.dtype),
        "input_dtype": W.dtype_name(w.input_dtype(cfg.dtype)),
        "flops": W.flops(shape), "bytes": W.count_bytes(w, shape, cfg.dtype),
        "lt_partial": w.lt_partial, "notes": w.notes, "systems": {}, "cold": {},
    }


def named_outputs(w: W.Workload, out: Any) -> dict[str, torch.Tensor]:
    """A torch form's result (tuple in return order) as {name: tensor}, stored outputs only."""
    vals = out if isinstance(out, (tuple, list)) else (out,)
    res = {}
    for spec, v in zip(w.outputs, vals):
        if spec.stored and isinstance(v, torch.Tensor):
            res[spec.name] = v
    return res


class Runner:
    def __init__(self, cfg: Config, budget: Budget):
        self.cfg, self.budget = cfg, budget
        self.timers: list[tuple[dict[str, Any], str, Callable[[], Any]]] = []
        self.compiled: dict[tuple, Callable] = {}
        self.compile_seen: list[float] = []
        self.evtfuse_seen: list[float] = []
        self.bandwidth: float | None = None
        try:
            import torch._dynamo as dynamo

            for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                         "accumulated_recompile_limit"):
                if hasattr(dynamo.config, name):
                    setattr(dynamo.config, name, max(getattr(dynamo.config, name), 512))
            if hasattr(dynamo.config, "automatic_dynamic_shapes"):
                dynamo.config.automatic_dynamic_shapes = False
        except Exception:  # pragma: no cover
            pass
        try:  # max-autotune prints a table of choices per GEMM: keep the log readable
            import torch._inductor.config as inductor_config

            if hasattr(inductor_config, "autotune_num_choices_displayed"):
                inductor_config.autotune_num_choices_displayed = 0
        except Exception:  # pragma: no cover
            pass

    # -- helpers
    def _bench(self, rec: dict[str, Any], key: str, fn: Callable[[], Any]) -> None:
        """Time ``fn`` into ``rec[key]`` at the end of the cell (``_time_rounds``)."""
        self.timers.append((rec, key, fn))

    def _time_rounds(self) -> None:
        """Every registered timing once per round, rounds in turn; each value is the
        median of its rounds' medians (``rec[key + "_rounds"]`` keeps them). Interleaved
        because the GPU's clock moves with its power state over a cell: measured one
        system after the other, the same kernel read 1.54 and 1.98 ms within a minute at
        8192^3 on an H100 (benchmarks/HISTORY.md, fifth session), more than the ratios measured."""
        timers, self.timers = self.timers, []
        times: list[list[float]] = [[] for _ in timers]
        for _ in range(max(1, self.cfg.rounds)):
            for k, (rec, key, fn) in enumerate(timers):
                if rec.get(f"{key}_error"):
                    continue
                try:
                    times[k].append(bench_ms(fn, self.cfg.warmup_ms, self.cfg.rep_ms))
                except Exception as exc:  # noqa: BLE001 - recorded, the other timings go on
                    rec[f"{key}_error"] = classify_error(exc)[1][:300]
        for (rec, key, _), ts in zip(timers, times):
            if ts:
                rec[key] = statistics.median(ts)
                rec[f"{key}_rounds"] = ts
            elif key == "ms":
                self._fail(rec, RuntimeError(rec.get("ms_error", "not timed")))

    def _check(self, rec: dict[str, Any], w: W.Workload, produced: Mapping[str, Any],
               ref: Mapping[str, torch.Tensor] | None) -> None:
        """Set rec's status to ok or mismatch from the outputs' error against ``ref``."""
        if ref is None:
            rec["status"] = "ok"
            rec["note"] = "not checked: the eager reference failed"
            return
        errs: dict[str, float] = {}
        for name in w.stored_outputs:
            x, r = produced.get(name), ref.get(name)
            if isinstance(x, torch.Tensor) and isinstance(r, torch.Tensor):
                errs[name] = rel_err(x, r)
        rec["rel_err_by_output"] = errs
        tol = tolerance(w, self.cfg)
        rec["tolerance"] = tol
        bad = {k: v for k, v in errs.items() if not (v <= tol)}  # NaN is bad
        rec["rel_err"] = max(errs.values(), key=lambda v: float("inf") if v != v else v) \
            if errs else None
        if not errs:
            rec["note"] = "no output to check against the reference"
        if bad:
            rec["status"] = "mismatch"
            rec["error"] = "; ".join(f"{k}: rel err {v:.3g} > {tol:g}" for k, v in bad.items())
        else:
            rec["status"] = "ok"

    def _fail(self, rec: dict[str, Any], exc: BaseException) -> None:
        status, msg = classify_error(exc)
        rec.update(status=status, error=msg, ms=None)
        if isinstance(exc, torch.cuda.OutOfMemoryError):
            gc.collect()
            torch.cuda.empty_cache()

    def _skip_budget(self, need_s: float) -> dict[str, Any]:
        return {"status": "skipped", "ms": None, "budget": True,
                "note": f"time budget: {self.budget.left():.0f} s left, about {need_s:.0f} s "
                        "needed; rerun with --resume"}

    def _evtfuse_need(self) -> float:
        seen = max(self.evtfuse_seen, default=None)
        return (self.cfg.evtfuse_estimate_s if seen is None else max(10.0, 1.25 * seen)) \
            + self.cfg.reserve_s

    def _compile_need(self) -> float:
        seen = max(self.compile_seen, default=None)
        return (self.cfg.compile_estimate_s if seen is None else max(20.0, 1.25 * seen)) \
            + self.cfg.reserve_s

    # -- the run
    def measure_bandwidth(self) -> float:
        from .timing import copy_bandwidth

        self.bandwidth, _ = copy_bandwidth(device=self.cfg.device)
        return self.bandwidth

    def make_sets(self, w: W.Workload, shape: W.Shape, store_all: bool = False) -> list[InputSet]:
        cfg = self.cfg
        first = InputSet(W.make_inputs(w, shape, cfg.dtype, cfg.device, cfg.seed),
                         W.make_outputs(w, shape, cfg.dtype, cfg.device, poison=True,
                                        store_all=store_all))
        n = W.rotation_count(W.set_bytes(first.values, first.outs), cfg.l2_bytes, cfg.max_sets)
        sets = [first]
        for k in range(1, n):
            sets.append(InputSet(W.make_inputs(w, shape, cfg.dtype, cfg.device, cfg.seed + k),
                                 W.make_outputs(w, shape, cfg.dtype, cfg.device, poison=False,
                                                store_all=store_all)))
        return sets

    def run_cell(self, w: W.Workload, shape: W.Shape) -> dict[str, Any]:
        cfg = self.cfg
        cell = new_cell(w, shape, cfg)
        cell["bandwidth_bytes_per_s"] = self.bandwidth
        systems = cell["systems"]
        try:
            sets = self.make_sets(w, shape)
        except BaseException as exc:  # noqa: BLE001 - e.g. out of memory
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            rec: dict[str, Any] = {}
            self._fail(rec, exc)
            rec["error"] = "making the inputs: " + rec["error"]
            for s in report.SYSTEMS:
                systems[s] = dict(rec)
            return report.finalize_cell(cell, self.bandwidth)
        cell["rotation_sets"] = len(sets)
        ref = None
        chosen = self.cfg.systems
        unchosen = {"status": "skipped", "ms": None, "note": "not in --systems"}
        try:
            ref = self.run_eager(systems, w, sets, timed="eager" in chosen)
            self.run_mm(systems, w, shape, sets)
            for name, run in (("lt", lambda: self.run_lt(systems, w, sets, ref)),
                              ("evtfuse", lambda: self.run_evtfuse(cell, w, shape, sets, ref)),
                              ("compiled", lambda: self.run_compiled(systems, w, shape, sets,
                                                                     ref))):
                if name in chosen:
                    run()
                else:
                    systems[name] = dict(unchosen)
            self._time_rounds()
        finally:
            self.timers = []
            del sets, ref
            gc.collect()
            torch.cuda.empty_cache()
        if any(s.get("budget") for s in systems.values()):
            cell["incomplete"] = True
        return report.finalize_cell(cell, self.bandwidth)

    def run_eager(self, systems, w, sets, timed: bool = True) -> dict[str, torch.Tensor] | None:
        """Eager torch: its first call's outputs are the reference of every check."""
        rec: dict[str, Any] = {}
        systems["eager"] = rec
        ref = None
        try:
            s0 = sets[0]
            t, out = host_timed_s(lambda: w.eager(s0.A, s0.B, **s0.ops))
            ref = named_outputs(w, out)
            del out
            if not timed:
                rec.update(status="skipped", ms=None, note="not in --systems (run once for "
                           "the reference)")
                return ref
            rec.update(status="ok", first_call_s=t, rel_err=0.0, reference=True)
            self._bench(rec, "ms", rotating(lambda s: w.eager(s.A, s.B, **s.ops), sets))
            rec["extra_mib"] = extra_memory_mib(lambda: w.eager(s0.A, s0.B, **s0.ops))
        except Exception as exc:  # noqa: BLE001
            self._fail(rec, exc)
        return ref

    def run_mm(self, systems, w, shape, sets) -> None:
        rec: dict[str, Any] = {"note": "torch._scaled_mm alone (bf16 out)" if w.fp8 else None}
        systems["mm"] = rec
        try:
            s0 = sets[0]
            w.matmul(s0.A, s0.B, s0.ops)
            rec["status"] = "ok"
            self._bench(rec, "ms", rotating(lambda s: w.matmul(s.A, s.B, s.ops), sets))
            rec["extra_mib"] = extra_memory_mib(lambda: w.matmul(s0.A, s0.B, s0.ops))
        except Exception as exc:  # noqa: BLE001
            self._fail(rec, exc)
        if rec.get("note") is None:
            rec.pop("note", None)

    def run_lt(self, systems, w, sets, ref) -> None:
        if w.lt is None:
            systems["lt"] = {"status": "n/a", "ms": None,
                             "note": "no cuBLASLt epilogue that PyTorch reaches"}
            return
        note = w.lt_name + (" (does part of the work)" if w.lt_partial else "")
        rec: dict[str, Any] = {"note": note}
        systems["lt"] = rec
        try:
            s0 = sets[0]
            produced = named_outputs(w, w.lt(s0.A, s0.B, **s0.ops))
            self._check(rec, w, produced, ref)
            del produced
            self._bench(rec, "ms", rotating(lambda s: w.lt(s.A, s.B, **s.ops), sets))
            rec["extra_mib"] = extra_memory_mib(lambda: w.lt(s0.A, s0.B, **s0.ops))
        except Exception as exc:  # noqa: BLE001
            self._fail(rec, exc)

    def run_evtfuse(self, cell, w, shape, sets, ref) -> None:
        rec: dict[str, Any] = {}
        cell["systems"]["evtfuse"] = rec
        try:
            import evtfuse
        except Exception as exc:  # noqa: BLE001
            self._fail(rec, exc)
            return
        gemm = getattr(evtfuse, "gemm", None)
        if gemm is None:
            rec.update(status="error", ms=None,
                       error="evtfuse.gemm is not available (the runtime is not in this tree)")
            return
        need = self._evtfuse_need()
        if not self.budget.allows(need):
            cell["systems"]["evtfuse"] = self._skip_budget(need)
            return
        tune = self.cfg.tune

        def call(s: InputSet):
            return gemm(s.A, s.B, epilogue=w.epilogue, tune=tune, **w.gemm_options(),
                        **w.epilogue_operands(s.ops), **s.outs)

        s0 = sets[0]
        try:
            try:
                first_s, out = host_timed_s(lambda: call(s0))
            except Exception as exc:  # noqa: BLE001
                if all(o.stored for o in w.outputs):
                    raise
                # the runtime may not take D=None yet: store D instead, and say so
                status, msg = classify_error(exc)
                for k, s in enumerate(sets):
                    extra = W.make_outputs(w, shape, self.cfg.dtype, self.cfg.device,
                                           poison=(k == 0), store_all=True)
                    s.outs.update({n: t for n, t in extra.items() if s.outs.get(n) is None})
                unstored = ", ".join(o.name for o in w.outputs if not o.stored)
                rec["note"] = f"{unstored} stored: passing None failed ({status}: {msg})"
                try:
                    first_s, out = host_timed_s(lambda: call(s0))
                except Exception as exc2:  # noqa: BLE001
                    same = classify_error(exc2) == (status, msg)
                    rec["note"] = (f"tried {unstored}=None first, then with {unstored} stored: "
                                   + ("both failed the same way" if same
                                      else f"with None: {status}: {msg}"))
                    raise
            self.evtfuse_seen.append(first_s)
            cell["cold"]["first_call_s"] = first_s
            rec["first_call_s"] = first_s
            produced = self._evtfuse_outputs(rec, w, s0, out)
            del out
            self._check(rec, w, produced, ref)
            del produced
            warm = [host_timed_s(lambda: call(s0))[0] for _ in range(3)]
            cell["cold"]["warm_call_ms"] = statistics.median(warm) * 1e3
            self._bench(rec, "ms", rotating(call, sets))
            rec["extra_mib"] = extra_memory_mib(lambda: call(s0))
        except Exception as exc:  # noqa: BLE001
            self._fail(rec, exc)
            return
        self._evtfuse_kernel_alone(rec, w, sets)

    def _evtfuse_kernel_alone(self, rec, w, sets) -> None:
        """The chosen kernel's name and ``kernel.run(args)`` time with the arguments built
        once: what evtfuse.gemm's host work adds shows as ms - kernel_ms (diagnostic)."""
        try:
            from evtfuse.runtime.tuner import choose_kernel

            argsets = [w.gemm_arguments(s.A, s.B, s.ops, s.outs) for s in sets]
            kernel = choose_kernel(argsets[0], tune=self.cfg.tune)
            rec["kernel"] = getattr(kernel, "name", repr(kernel))
            self._bench(rec, "kernel_ms", rotating(kernel.run, argsets))
        except Exception as exc:  # noqa: BLE001 - internal API; only a diagnostic
            rec["kernel_error"] = classify_error(exc)[1][:300]

    @staticmethod
    def _evtfuse_outputs(rec, w, s0: InputSet, out) -> dict[str, Any]:
        """The outputs evtfuse wrote: the returned tensors, else the buffers passed in."""
        vals = out if isinstance(out, (tuple, list)) else (out,)
        names = list(w.output_names)
        if len(vals) != len(names):  # a runtime that leaves out the unstored outputs
            names = [n for n in names if s0.outs.get(n) is not None]
        got = dict(zip(names, vals)) if len(vals) == len(names) else {}
        produced: dict[str, Any] = {}
        for name in w.output_names:
            mine, theirs = s0.outs.get(name), got.get(name)
            if isinstance(theirs, torch.Tensor):
                if isinstance(mine, torch.Tensor) and theirs.data_ptr() != mine.data_ptr():
                    rec.setdefault("warnings", []).append(
                        f"returned a new tensor for {name} instead of writing the one passed")
                produced[name] = theirs
            else:
                produced[name] = mine
        return produced

    def run_compiled(self, systems, w, shape, sets, ref) -> None:
        if not self.cfg.compile:
            systems["compiled"] = {"status": "skipped", "ms": None, "note": "--no-compile"}
            return
        key = (w.name, tuple(shape), W.dtype_name(self.cfg.dtype))
        fn = self.compiled.get(key)
        if fn is None:
            need = self._compile_need()
            if not self.budget.allows(need):
                systems["compiled"] = self._skip_budget(need)
                return
        rec: dict[str, Any] = {}
        systems["compiled"] = rec
        try:
            if fn is None:
                fn = torch.compile(whole_function(w, shape), mode=COMPILE_MODE, dynamic=False)
                self.compiled[key] = fn
            s0 = sets[0]
            t, out = host_timed_s(lambda: fn(s0.A, s0.B, **s0.ops))
            self.compile_seen.append(t)
            rec["compile_s"] = t
            produced = named_outputs(w, out)
            del out
            self._check(rec, w, produced, ref)
            del produced
            self._bench(rec, "ms", rotating(lambda s: fn(s.A, s.B, **s.ops), sets))
            rec["extra_mib"] = extra_memory_mib(lambda: fn(s0.A, s0.B, **s0.ops))
        except Exception as exc:  # noqa: BLE001
            self._fail(rec, exc)


def whole_function(w: W.Workload, shape: W.Shape) -> Callable:
    """matmul + epilogue as one function with its own code object: dynamo keeps its
    compiled graphs and guards per code object, so no cell's call checks another's guards."""
    def whole(A, B, **ops):
        return w.eager(A, B, **ops)

    name = f"whole_{w.name}_{'x'.join(str(d) for d in shape)}"
    code = whole.__code__.replace(co_name=name)
    if hasattr(code, "co_qualname"):
        code = code.replace(co_qualname=name)
    fn = types.FunctionType(code, whole.__globals__, name, whole.__defaults__, whole.__closure__)
    fn.__kwdefaults__ = whole.__kwdefaults__
    return fn


def one_line(cell: Mapping[str, Any]) -> str:
    """``alpha_beta @ 4096^3: evtfuse 0.200 (1.05x) | mm ...`` for the progress log."""
    parts = []
    for name in report.SYSTEMS:
        s = (cell.get("systems") or {}).get(name) or {}
        st = s.get("status", "-")
        if st in report.TIMED:
            txt = f"{name} {s['ms']:.3f}"
            if s.get("x_floor") is not None:
                txt += f" ({s['x_floor']:.2f}x)"
            if st == "mismatch":
                txt += " MISMATCH"
        else:
            txt = f"{name} {st}"
        parts.append(txt)
    return f"{cell.get('workload')} @ {cell.get('shape_str')}: " + " | ".join(parts)


__all__ = ["Budget", "Config", "Runner", "classify_error", "named_outputs", "new_cell",
           "one_line", "tolerance", "COMPILE_MODE"]
