"""One table of evtfuse's suite cells on several Tritons, from benchmark runs of each.

Usage (from the repository root, after ``benchmarks/run.py --out DIR`` once per Triton on
one machine in one sitting; the first directory is the baseline):

    python3 scripts/triton_table.py 3.6.0=bench_out/t360 3.7.1=bench_out/t371 3.9.0=...

Prints a Markdown table: per cell, evtfuse's time on each Triton (ms), the kernel each
picked, its first call (s), and each time's ratio to the baseline's; then the geomean of
those ratios per Triton (issue target: within 1.03). Cells that failed on a Triton are
listed with their error, never dropped silently.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path


def _cells(folder: str) -> dict[tuple[str, str], dict]:
    data = json.loads((Path(folder) / "results.json").read_text())
    return {(c["workload"], c["shape_str"]): c["systems"].get("evtfuse", {}) for c in data["cells"]}


def main(argv: list[str]) -> int:
    runs = [a.split("=", 1) for a in argv]
    if len(runs) < 2 or any(len(r) != 2 for r in runs):
        print(__doc__)
        return 2
    tables = {name: _cells(folder) for name, folder in runs}
    base = runs[0][0]
    names = [n for n, _ in runs]
    print("| cell | " + " | ".join(f"{n} ms" for n in names) + " | "
          + " | ".join(f"{n}/{base}" for n in names[1:]) + " | kernels | first call s |")
    print("|---" * (2 * len(names) + 2) + "|")
    logs: dict[str, list[float]] = {n: [] for n in names[1:]}
    failed = []
    for key in tables[base]:
        row = [tables[n].get(key, {}) for n in names]
        ms = [r.get("ms") if r.get("status") == "ok" else None for r in row]
        for n, r in zip(names, row):
            status = r.get("status")
            if status in (None, "skipped"):  # a run's budget ended first, or never reached it
                failed.append(f"NOT MEASURED: {key[0]} {key[1]} on {n} ({status or 'absent'})")
            elif status != "ok":
                failed.append(f"FAILED: {key[0]} {key[1]} on {n}: {status} {r.get('error', '')}"[:300])
        ratios = []
        for n, m in zip(names[1:], ms[1:]):
            if m and ms[0]:
                logs[n].append(math.log(m / ms[0]))
                ratios.append(f"{m / ms[0]:.3f}")
            else:
                ratios.append("-")
        kernels = " / ".join(str(r.get("kernel", "-")) for r in row)
        first = " / ".join(f"{r['first_call_s']:.1f}" if r.get("first_call_s") else "-" for r in row)
        cells = " | ".join(f"{m:.4f}" if m else (r.get("status") or "absent").upper()
                           for m, r in zip(ms, row))
        print(f"| {key[0]} {key[1]} | {cells} | {' | '.join(ratios)} | {kernels} | {first} |")
    print()
    for n, v in logs.items():
        if v:
            print(f"geomean {n}/{base}: {math.exp(sum(v) / len(v)):.3f} over {len(v)} cells")
    for f in failed:
        print(f)
    return 1 if any(f.startswith("FAILED") for f in failed) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
