"""Print the hottest SASS instructions of an Nsight Compute report's source page (CSV),
by warp stall samples, with each one's leading stall reasons and its index in the listing
(to read its neighbours: the wait's branch follows its TRYWAIT); a development probe.

    ncu -i REPORT.ncu-rep --page source --print-source sass --csv > src.csv
    python3 scripts/ncu_hot.py src.csv [--top 40]
"""

from __future__ import annotations

import argparse
import csv


def _num(s: str) -> float:
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return 0.0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("csv")
    p.add_argument("--top", type=int, default=40)
    a = p.parse_args()
    with open(a.csv, newline="") as f:
        rows = [r for r in csv.reader(f)]
    head_i = next(i for i, r in enumerate(rows) if any("Source" == c or "Source" in c for c in r)
                  and any("Sampling" in c for c in r))
    head = rows[head_i]
    body = [r for r in rows[head_i + 1:] if len(r) == len(head)]
    col = {c: i for i, c in enumerate(head)}
    total_c = next(c for c in head if "Sampling (All Samples)" in c and "Not" not in c)
    src_c = next(c for c in head if c in ("Source", "# Source") or c.endswith("Source"))
    reason_cs = [c for c in head if c.startswith("stall_") and "Not Issued" not in c]
    total = sum(_num(r[col[total_c]]) for r in body) or 1.0
    print(f"columns: {len(head)}; instructions: {len(body)}; samples: {total:.0f}")
    ranked = sorted(enumerate(body), key=lambda ir: -_num(ir[1][col[total_c]]))[: a.top]
    for i, r in ranked:
        s = _num(r[col[total_c]])
        reasons = sorted(((_num(r[col[c]]), c) for c in reason_cs), reverse=True)[:3]
        rs = ", ".join(f"{c.replace('stall_', '')}={v:.0f}" for v, c in reasons if v > 0)
        print(f"{100 * s / total:5.1f}% #{i:<5} {r[col[src_c]].strip()[:64]:64} {rs}")


if __name__ == "__main__":
    main()
