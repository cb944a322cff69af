"""The latest measurement of every benchmark cell across several runs' JSON files, and
the issue targets' aggregates over them (geomean evtfuse/compiled, geomean time/floor,
worst cells). A reporting aid for BENCHMARKS.md: each ratio stays within its own run.

    python3 scripts/latest_cells.py RUN_LABEL=FILE.json ... [--drop RUN:workload@shape ...]
                                    [--chart latest_chart.png]

Files are given oldest first; a later run's cell replaces an earlier one. ``--drop``
removes a cell of one run (e.g. measured with code since reverted).
"""

from __future__ import annotations

import argparse
import json
import math


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("runs", nargs="+", help="LABEL=path.json, oldest first")
    p.add_argument("--drop", nargs="*", default=[], help="LABEL:workload@shape")
    p.add_argument("--chart", help="draw the latest cells' time over floor (the suite's chart)")
    a = p.parse_args()
    latest: dict[tuple, tuple[str, dict]] = {}
    for item in a.runs:
        label, path = item.split("=", 1)
        for c in json.load(open(path))["cells"]:
            if f"{label}:{c['workload']}@{c['shape_str']}" in a.drop:
                continue
            if c["systems"].get("evtfuse", {}).get("ms") is None:
                continue
            latest[(c["workload"], c["shape_str"], c["dtype"])] = (label, c)
    rows, vs_compiled, vs_floor = [], [], []
    for (w, shape, dt), (label, c) in sorted(latest.items()):
        r = c["ratios"]
        evt = c["systems"]["evtfuse"]["ms"]
        rows.append((w, shape, dt, label, evt, r.get("evtfuse/floor"), r.get("evtfuse/compiled"),
                     r.get("evtfuse/lt")))
        if r.get("evtfuse/floor"):
            vs_floor.append((r["evtfuse/floor"], w, shape, label))
        if w != "identity" and r.get("evtfuse/compiled"):
            vs_compiled.append((r["evtfuse/compiled"], w, shape, label))
    fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    print("| workload | shape | dtype | run | evtfuse ms | x floor | evt/compiled | evt/lt |")
    print("|---|---|---|---|---|---|---|---|")
    for w, shape, dt, label, evt, fl, comp, lt in rows:
        print(f"| {w} | {shape} | {dt} | {label} | {evt:.3f} | {fmt(fl)} | {fmt(comp)} | {fmt(lt)} |")
    gm = lambda xs: math.exp(sum(math.log(x[0]) for x in xs) / len(xs))  # noqa: E731
    print(f"\ngeomean evtfuse/compiled over {len(vs_compiled)} non-identity cells: {gm(vs_compiled):.3f}")
    print(f"geomean evtfuse/floor over {len(vs_floor)} cells: {gm(vs_floor):.3f}")
    print("worst x floor:", ", ".join(f"{w}@{s} {v:.2f} ({lb})" for v, w, s, lb in sorted(vs_floor)[-5:]))
    if a.chart:
        from evtfuse.bench.report import write_chart

        gpu = next((c.get("meta", {}).get("gpu") for _, c in latest.values() if c.get("meta")), None)
        write_chart({"cells": [c for _, c in sorted(latest.values(), key=lambda lc: lc[1]["workload"])],
                     "meta": {"dtype": "bf16", "gpu": gpu or "H100, latest run of each cell"}}, a.chart)
        print("chart:", a.chart)
    print("slower than compiled:", ", ".join(f"{w}@{s} {v:.2f} ({lb})" for v, w, s, lb in
                                             sorted(vs_compiled) if v > 1.0))


if __name__ == "__main__":
    main()
