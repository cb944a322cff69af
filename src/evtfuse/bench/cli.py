"""``evtfuse bench`` / ``python benchmarks/run.py``: arguments, the run loop, the outputs.

Layer: bench (entry point). ``main(argv)`` parses the arguments, runs every (workload,
shape) cell that the time budget allows, and writes ``results.json`` and ``results.md``
into ``--out`` after every cell (so a run that is killed keeps what it measured), and
``chart.png`` at the end; the Markdown table is printed last. ``--resume`` keeps the
complete cells of an earlier ``results.json`` in ``--out`` and runs only the others.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shlex
import signal
import sys
import time
from typing import Any, Sequence

from . import report
from . import workloads as W

EXIT_OK, EXIT_NO_GPU = 0, 2


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="evtfuse bench",
        description="Time evtfuse against cuBLAS, cuBLASLt, eager PyTorch and torch.compile "
                    "(max-autotune) on GEMM epilogue workloads, in one process.")
    p.add_argument("--dtype", choices=sorted(W.DTYPES), default="bf16",
                   help="input/output dtype (fp8 workloads always use fp8 e4m3 inputs)")
    p.add_argument("--workloads", type=_csv, default=None, metavar="A,B,...",
                   help="comma-separated workload names (default: all; see --list)")
    p.add_argument("--shapes", type=_csv, default=None, metavar="S,S,...",
                   help="comma-separated shapes, N (for N^3) or MxNxK (default: "
                        + ", ".join(W.shape_str(s) for s in W.DEFAULT_SHAPES) + ")")
    p.add_argument("--quick", action="store_true",
                   help="a small subset: " + ", ".join(W.QUICK_WORKLOADS) + " at "
                        + " and ".join(W.shape_str(s) for s in W.QUICK_SHAPES))
    p.add_argument("--out", default="bench_out", metavar="DIR",
                   help="where results.json, results.md and chart.png go (default: bench_out)")
    p.add_argument("--budget-s", type=float, default=540.0,
                   help="stop starting new work after this many seconds, then write what "
                        "was measured (default: 540, under a 10-minute limit)")
    p.add_argument("--no-compile", action="store_true",
                   help="skip torch.compile (its max-autotune compile is slow)")
    p.add_argument("--systems", type=_csv, default=None, metavar="S,S,...",
                   help="systems to time, of " + ", ".join(report.SYSTEMS) + " (default: all; "
                        "cuBLAS mm always runs, it sets the floor; eager always runs once, "
                        "it is the reference)")
    p.add_argument("--resume", action="store_true",
                   help="keep the complete cells of --out/results.json and run the others")
    p.add_argument("--tune", default="fast", help="evtfuse.gemm's tune= (default: fast)")
    p.add_argument("--tol", type=float, default=None,
                   help="relative error on norms above which a result is a mismatch "
                        "(default: 2e-2 for bf16/fp16, 1e-2 for fp32, 7e-2 for fp8 outputs)")
    p.add_argument("--warmup-ms", type=float, default=25.0)
    p.add_argument("--rep-ms", type=float, default=100.0)
    p.add_argument("--rounds", type=int, default=7,  # runner.Config.rounds says why seven
                   help="timing rounds per cell, every system timed once per round in turn; "
                        "a time is the median of its rounds")
    p.add_argument("--max-sets", type=int, default=8,
                   help="most input sets to rotate among when one set fits in L2")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-chart", action="store_true", help="do not draw chart.png")
    p.add_argument("--fresh-caches", action="store_true",
                   help="point EVTFUSE_CACHE_DIR and TRITON_CACHE_DIR at new empty folders, "
                        "so evtfuse's first calls show the full compile + tuning cost")
    p.add_argument("--list", action="store_true", help="list the workloads and exit")
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # "cpu": tests only
    return p


def plan(args: argparse.Namespace) -> tuple[list[W.Workload], list[W.Shape]]:
    """The workloads and shapes the arguments ask for (--quick unless overridden)."""
    names = args.workloads if args.workloads else (list(W.QUICK_WORKLOADS) if args.quick else None)
    workloads = W.select_workloads(names)
    if args.shapes:
        shapes = [W.parse_shape(s) for s in args.shapes]
    else:
        shapes = list(W.QUICK_SHAPES if args.quick else W.DEFAULT_SHAPES)
    return workloads, shapes


def _versions() -> dict[str, Any]:
    import torch

    meta: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda,
                            "python": platform.python_version()}
    try:
        import triton

        meta["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        meta["triton"] = None
    try:
        import evtfuse

        meta["evtfuse"] = evtfuse.__version__
    except Exception:  # noqa: BLE001
        meta["evtfuse"] = None
    if torch.cuda.is_available():
        meta["gpu"] = torch.cuda.get_device_name()
        meta["sm"] = "%d.%d" % torch.cuda.get_device_capability()
    return meta


def _load_previous(path: str, dtype: str) -> list[dict[str, Any]]:
    try:
        with open(path) as f:
            old = json.load(f)
    except (OSError, ValueError):
        return []
    return [c for c in old.get("cells") or [] if c.get("dtype") == dtype]


def _covers(cell: dict[str, Any], systems: frozenset, compile: bool) -> bool:
    """Whether an earlier cell measured every system this run asks for."""
    for name in systems:
        rec = (cell.get("systems") or {}).get(name)
        if rec is None:
            return False
        note = str(rec.get("note") or "")
        if rec.get("status") == "skipped" and (note.startswith("not in --systems")
                                               or (note == "--no-compile" and compile)):
            return False
    return True


def _write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def write_outputs(out_dir: str, result: dict[str, Any], chart: bool) -> dict[str, str]:
    os.makedirs(out_dir, exist_ok=True)
    paths = {"json": os.path.join(out_dir, "results.json"),
             "md": os.path.join(out_dir, "results.md")}
    _write_atomic(paths["json"], report.to_json(result))
    _write_atomic(paths["md"], report.markdown_report(result))
    if chart:
        try:
            p = report.write_chart(result, os.path.join(out_dir, "chart.png"))
            if p:
                paths["chart"] = p
        except Exception as exc:  # noqa: BLE001 - a chart is never worth a crash
            print(f"chart not drawn: {type(exc).__name__}: {exc}", file=sys.stderr)
    return paths


class _Stop(Exception):
    """SIGTERM: stop and write what was measured."""


def main(argv: Sequence[str] | None = None) -> int:
    start = time.monotonic()
    parser = build_parser()
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.list:
        for w in W.WORKLOADS:
            own = f"  [own shape {', '.join(W.shape_str(s) for s in w.shapes)}]" if w.shapes else ""
            lt = f"  lt: {w.lt_name}" if w.lt else ""
            print(f"{w.name:16s} {w.title}{lt}{own}")
        return EXIT_OK
    try:
        workloads, shapes = plan(args)
    except ValueError as exc:
        parser.error(str(exc))
    bad = [x for x in (args.systems or []) if x not in report.SYSTEMS]
    if bad:
        parser.error(f"unknown system(s) {', '.join(bad)}; known: {', '.join(report.SYSTEMS)}")
    systems = frozenset(args.systems or report.SYSTEMS) | {"mm"}

    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("evtfuse bench needs a CUDA GPU; none is visible", file=sys.stderr)
        return EXIT_NO_GPU

    from .runner import Budget, Config, Runner, one_line

    os.environ.setdefault("EVTFUSE_PROGRESS", "0")  # no tuning progress bars in the log
    caches = "as found"
    if args.fresh_caches:
        import tempfile

        root = tempfile.mkdtemp(prefix="evtfuse-bench-caches-")
        os.environ["EVTFUSE_CACHE_DIR"] = os.path.join(root, "evtfuse")
        os.environ["TRITON_CACHE_DIR"] = os.path.join(root, "triton")
        caches = f"fresh ({root})"

    dtype = W.DTYPES[args.dtype]
    cfg = Config(dtype=dtype, tune=args.tune, compile=not args.no_compile,
                 warmup_ms=args.warmup_ms, rep_ms=args.rep_ms, rounds=args.rounds, tol=args.tol,
                 max_sets=args.max_sets, seed=args.seed, device=args.device,
                 systems=systems)
    budget = Budget(args.budget_s, start)
    log = cfg.log
    meta = {"date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
            "command": ("python " + shlex.join(sys.argv)) if argv is None
            else shlex.join(["evtfuse", "bench", *argv]),
            "dtype": args.dtype, "tune": args.tune, "budget_s": args.budget_s,
            "rounds": args.rounds,
            "compile": not args.no_compile, "systems": sorted(systems), "host": platform.node(), "caches": caches,
            **_versions()}

    out_json = os.path.join(args.out, "results.json")
    previous = _load_previous(out_json, args.dtype) if args.resume else []
    done = {report.cell_key(c): c for c in previous
            if report.is_complete(c) and _covers(c, systems, not args.no_compile)}
    todo = [(w, s) for w, s in W.cells_for(workloads, shapes)
            if (w.name, tuple(s), args.dtype) not in done]
    if previous:
        log(f"resume: {len(done)} complete cell(s) kept, {len(todo)} to run")
    cells: dict[tuple, dict[str, Any]] = {report.cell_key(c): c for c in previous}

    def ordered() -> list[dict[str, Any]]:  # workload order, then shape order
        order = {w.name: i for i, w in enumerate(W.WORKLOADS)}
        return sorted(cells.values(), key=lambda c: (order.get(c.get("workload"), 99),
                                                     c.get("shape") or []))

    def previous_signal(signum, frame):
        raise _Stop()

    old_handler = signal.signal(signal.SIGTERM, previous_signal)
    runner = Runner(cfg, budget)
    left = len(todo)
    result: dict[str, Any] = {}
    try:
        try:
            runner.measure_bandwidth()
            log(f"copy bandwidth {runner.bandwidth / 1e12:.2f} TB/s; {len(todo)} cell(s) to "
                f"run, budget {args.budget_s:.0f} s")
        except Exception as exc:  # noqa: BLE001
            log(f"copy bandwidth not measured ({type(exc).__name__}: {exc}); no memory floor")
        meta["bandwidth_bytes_per_s"] = runner.bandwidth
        for w, shape in todo:
            if not budget.allows(cfg.reserve_s + 10):
                log(f"time budget spent: {left} cell(s) not run; rerun with --resume")
                break
            try:
                cell = runner.run_cell(w, shape)
            except Exception as exc:  # noqa: BLE001 - a bug here must not lose the run
                from .runner import classify_error, new_cell

                cell = new_cell(w, shape, cfg)
                _, msg = classify_error(exc)
                cell["systems"] = {s: {"status": "error", "ms": None, "error": f"bench: {msg}"}
                                   for s in report.SYSTEMS}
                report.finalize_cell(cell, runner.bandwidth)
            cells[report.cell_key(cell)] = cell
            if not cell.get("incomplete"):
                left -= 1
            log(f"[{budget.elapsed():5.0f} s] {one_line(cell)}")
            result = report.assemble(meta, ordered(), runner.bandwidth, left == 0, left)
            write_outputs(args.out, result, chart=False)
    except (_Stop, KeyboardInterrupt):
        log("interrupted: writing what was measured")
    finally:
        signal.signal(signal.SIGTERM, old_handler)
        result = report.assemble(meta, ordered(), runner.bandwidth, left == 0, left)
        paths = write_outputs(args.out, result, chart=not args.no_chart)
    print(report.markdown_report(result))
    print("wrote " + ", ".join(paths.values()), file=sys.stderr)
    return EXIT_OK


__all__ = ["main", "build_parser", "plan", "write_outputs"]
