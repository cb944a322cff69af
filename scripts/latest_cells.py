"""The latest measurement of every benchmark cell across several runs' JSON files, and
the issue targets' aggregates over them (geomean evtfuse/compiled, geomean time/floor,
worst cells, cells slower than torch.compile, the worst ratio to cuBLASLt where it fuses
the whole epilogue). A reporting
aid for BENCHMARKS.md: each ratio stays within its own run.

    python3 scripts/latest_cells.py RUN_LABEL=FILE.json ... [--drop RUN:workload@shape ...]
                                    [--runs-file RUNS.txt] [--chart latest_chart.png]
                                    [--spread [RUN]] [--tables]

Files are given oldest first; a later run's cell replaces an earlier one. ``--drop``
removes a cell of one run (e.g. measured with code since reverted). ``--runs-file`` reads
the same arguments (``LABEL=FILE`` items and a ``--drop`` line) from a file, with paths
relative to that file's folder (``benchmarks/results/<date>/RUNS.txt``). ``--spread``
lists every draw of each cell's ratios to torch.compile and cuBLASLt (from run RUN on), to
see which cells sit within their run-to-run noise of a target. ``--tables`` prints, instead
of the one flat table, BENCHMARKS.md's tables: one per workload family, each cell with
every peer's time from the run that measured it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex


def collect(runs: list[tuple[str, str]], drop: list[str]) -> dict[tuple, tuple[str, dict]]:
    """(workload, shape, dtype) -> (run label, cell) of the latest run that timed evtfuse."""
    latest: dict[tuple, tuple[str, dict]] = {}
    for label, path in runs:
        with open(path) as f:
            cells = json.load(f)["cells"]
        for c in cells:
            if f"{label}:{c['workload']}@{c['shape_str']}" in drop:
                continue
            if c["systems"].get("evtfuse", {}).get("ms") is None:
                continue
            latest[(c["workload"], c["shape_str"], c["dtype"])] = (label, c)
    return latest


def draws(runs: list[tuple[str, str]], drop: list[str], since: str | None = None
          ) -> dict[tuple, list[tuple[str, dict]]]:
    """(workload, shape, dtype) -> every (run label, cell) that timed evtfuse, oldest
    first, from run ``since`` on (all runs without it): how far one cell's ratios move
    from draw to draw (torch.compile's pick and the GPU's clocks change between runs)."""
    labels = [label for label, _ in runs]
    if since is not None and since not in labels:
        raise SystemExit(f"--since {since}: no such run")
    first = labels.index(since) if since else 0
    out: dict[tuple, list[tuple[str, dict]]] = {}
    for label, path in runs[first:]:
        one = collect([(label, path)], drop)
        for key, cell in one.items():
            out.setdefault(key, []).append(cell)
    return out


def spread(history: dict[tuple, list[tuple[str, dict]]], ratio: str = "evtfuse/compiled"
           ) -> list[tuple[str, str, list[tuple[float, str]]]]:
    """Cells with two or more draws of ``ratio``: (workload, shape, [(ratio, run), ...]
    sorted by ratio), widest range first."""
    rows = []
    for (w, shape, _dt), cells in history.items():
        vals = sorted((c["ratios"][ratio], label) for label, c in cells
                      if c["ratios"].get(ratio) is not None)
        if len(vals) >= 2 and w != "identity":
            rows.append((w, shape, vals))
    rows.sort(key=lambda r: r[2][0][0] / r[2][-1][0])
    return rows


def _geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def summary(latest: dict[tuple, tuple[str, dict]]) -> dict:
    """The targets' aggregates over the latest cells: each entry of the lists is
    (ratio, workload, shape, run), sorted by ratio."""
    vs_compiled, vs_floor, vs_lt = [], [], []
    for (w, shape, _dt), (label, c) in sorted(latest.items()):
        r = c["ratios"]
        if r.get("evtfuse/floor"):
            vs_floor.append((r["evtfuse/floor"], w, shape, label))
        if w != "identity" and r.get("evtfuse/compiled"):
            vs_compiled.append((r["evtfuse/compiled"], w, shape, label))
        if r.get("evtfuse/lt") and not c.get("lt_partial"):  # Lt does the whole epilogue
            vs_lt.append((r["evtfuse/lt"], w, shape, label))
    vs_compiled.sort()
    vs_floor.sort()
    vs_lt.sort()
    return {"cells": len(latest), "vs_compiled": vs_compiled, "vs_floor": vs_floor,
            "vs_lt": vs_lt,
            "geomean_compiled": _geomean([v[0] for v in vs_compiled]),
            "geomean_floor": _geomean([v[0] for v in vs_floor]),
            "slower_than_compiled": [v for v in vs_compiled if v[0] > 1.0]}


# BENCHMARKS.md's tables: workload families, and the shapes in the order they are listed
FAMILIES = (
    ("Elementwise epilogues", ("identity", "alpha_beta", "bias_relu", "bias_gelu_tanh",
                               "silu_mul", "relu_aux")),
    ("Reductions and losses", ("row_amax", "row_logsumexp", "bce_loss", "lmhead_ce")),
    ("fp8 inputs", ("fp8_scale_amax",)),
)
SHAPE_ORDER = ("64x8192x8192", "2048^3", "4096^3", "8192x8192x1024", "16384x4096x4096",
               "8192^3", "8192x128256x4096")


PEAK_BF16, PEAK_FP8 = 989.0, 1979.0  # dense TF/s of an H100 / H200 SXM


def _mnk(shape: str) -> tuple[int, int, int]:
    """M, N, K of a suite shape ("8192x8192x1024", or "4096^3" for a cube); the suite's
    ``bench.workloads.parse_shape`` reads the same names, but this script runs without torch
    (stdlib only), so it does not import it."""
    if shape.endswith("^3"):
        n = int(shape[:-2])
        return n, n, n
    m, n, k = (int(v) for v in shape.split("x"))
    return m, n, k


def _tflops(shape: str, ms: float | None, peak: float) -> str:
    """TF/s of a GEMM of ``shape`` in ``ms`` (2 M N K), and its share of ``peak``."""
    if ms is None:
        return "-"
    m, n, k = _mnk(shape)
    tf = 2 * m * n * k / ms / 1e9
    return f"{tf:.0f} ({100 * tf / peak:.0f}%)"


def family_tables(latest: dict[tuple, tuple[str, dict]]) -> str:
    """One Markdown table per workload family: every peer's median ms from the cell's own
    run, evtfuse's time over the floor (in brackets) and over torch.compile's, evtfuse's and
    cuBLAS's TF/s and their share of the dense peak (fp8's for fp8 inputs), the run. A
    cuBLASLt time marked * does part of the epilogue only (``lt_partial``)."""
    ms = lambda c, s: c["systems"].get(s, {}).get("ms")  # noqa: E731
    f3 = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    order = {s: i for i, s in enumerate(SHAPE_ORDER)}
    out = []
    for title, workloads in FAMILIES:
        rows = sorted(((w, sh), lc) for (w, sh, _dt), lc in latest.items() if w in workloads)
        if not rows:
            continue
        rows.sort(key=lambda r: (workloads.index(r[0][0]), order.get(r[0][1], len(order))))
        out += [f"### {title}", "",
                "| workload | shape | evtfuse (x floor) | TF/s (% of peak) | cuBLAS `A @ B` "
                "| TF/s (% of peak) | cuBLASLt fused | eager | torch.compile | "
                "evtfuse / compile | run |",
                "|---|---|---|---|---|---|---|---|---|---|---|"]
        for (w, shape), (label, c) in rows:
            r = c["ratios"]
            lt = ms(c, "lt")
            lt_s = f3(lt) + ("*" if lt is not None and c.get("lt_partial") else "")
            peak = PEAK_FP8 if w.startswith("fp8") else PEAK_BF16
            out.append(f"| {w} | {shape} | {f3(ms(c, 'evtfuse'))} "
                       f"({f3(r.get('evtfuse/floor'))}) | "
                       f"{_tflops(shape, ms(c, 'evtfuse'), peak)} | {f3(ms(c, 'mm'))} | "
                       f"{_tflops(shape, ms(c, 'mm'), peak)} | {lt_s} | "
                       f"{f3(ms(c, 'eager'))} | {f3(ms(c, 'compiled'))} | "
                       f"{f3(r.get('evtfuse/compiled'))} | {label} |")
        out.append("")
    return "\n".join(out)


def _read_runs_file(path: str) -> tuple[list[str], list[str]]:
    """(LABEL=FILE items with paths made relative to the file's folder, --drop items)."""
    with open(path) as f:
        words = shlex.split(f.read())
    folder = os.path.dirname(os.path.abspath(path))
    runs, drop = [], []
    target = runs
    for w in words:
        if w == "--drop":
            target = drop
            continue
        if target is runs:
            label, file = w.split("=", 1)
            w = f"{label}={os.path.join(folder, file)}"
        target.append(w)
    return runs, drop


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("runs", nargs="*", help="LABEL=path.json, oldest first")
    p.add_argument("--drop", nargs="*", default=[], help="LABEL:workload@shape")
    p.add_argument("--runs-file", help="a file of LABEL=path.json items and a --drop line")
    p.add_argument("--chart", help="draw the latest cells' time over floor (the suite's chart)")
    p.add_argument("--tables", action="store_true",
                   help="BENCHMARKS.md's tables (one per workload family, every peer) "
                        "instead of the flat one")
    p.add_argument("--spread", metavar="RUN", nargs="?", const="",
                   help="also every draw of each cell's evtfuse/compiled and evtfuse/cuBLASLt "
                        "ratios (from run RUN on, all runs without it), widest range first")
    a = p.parse_args(argv)
    items, drop = list(a.runs), list(a.drop)
    if a.runs_file:
        more, more_drop = _read_runs_file(a.runs_file)
        items, drop = more + items, more_drop + drop
    if not items:
        p.error("no runs: give LABEL=path.json items or --runs-file")
    latest = collect([tuple(i.split("=", 1)) for i in items], drop)
    fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    if a.tables:
        print(family_tables(latest))
    else:
        print("| workload | shape | dtype | run | evtfuse ms | x floor | evt/compiled | evt/lt |")
        print("|---|---|---|---|---|---|---|---|")
        for (w, shape, dt), (label, c) in sorted(latest.items()):
            r = c["ratios"]
            print(f"| {w} | {shape} | {dt} | {label} | {c['systems']['evtfuse']['ms']:.3f} | "
                  f"{fmt(r.get('evtfuse/floor'))} | {fmt(r.get('evtfuse/compiled'))} | "
                  f"{fmt(r.get('evtfuse/lt'))} |")
    s = summary(latest)
    cells = lambda xs: ", ".join(f"{w}@{sh} {v:.2f} ({lb})" for v, w, sh, lb in xs)  # noqa: E731
    print(f"\ngeomean evtfuse/compiled over {len(s['vs_compiled'])} non-identity cells: "
          f"{fmt(s['geomean_compiled'])}")
    print(f"geomean evtfuse/floor over {len(s['vs_floor'])} cells: {fmt(s['geomean_floor'])}")
    print("worst x floor:", cells(s["vs_floor"][-5:]))
    print("worst evtfuse/cuBLASLt (fused epilogue):", cells(s["vs_lt"][-3:]))
    if a.chart:
        from evtfuse.bench.report import write_chart

        gpu = next((c.get("meta", {}).get("gpu") for _, c in latest.values() if c.get("meta")), None)
        write_chart({"cells": [c for _, c in sorted(latest.values(), key=lambda lc: lc[1]["workload"])],
                     "meta": {"dtype": "bf16", "gpu": gpu or "H100, latest run of each cell"}}, a.chart)
        print("chart:", a.chart)
    print("slower than compiled:", cells(s["slower_than_compiled"]))
    if a.spread is not None:
        history = draws([tuple(i.split("=", 1)) for i in items], drop, a.spread or None)
        for ratio in ("evtfuse/compiled", "evtfuse/lt"):
            print(f"\n{ratio} draw to draw (low .. high, run):")
            for w, shape, vals in spread(history, ratio):
                shown = " ".join(f"{v:.3f} ({lb})" for v, lb in vals)
                print(f"  {w}@{shape}: {shown}")


if __name__ == "__main__":
    main()
