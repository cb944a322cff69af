"""Write evtfuse's shipped tuning defaults (``src/evtfuse/runtime/defaults.json``) from the
benchmark suite's results: for each GPU, input dtype and shape, the kernels the tuner chose
for the suite's epilogues there (the latest run of each cell), most often chosen first.

    python3 scripts/defaults_table.py --runs-file benchmarks/results/2026-11-22/RUNS.txt \\
        [--runs-file ...] [--sms "NVIDIA H100 80GB HBM3=132"] [--out PATH]

``--runs-file`` takes the files ``latest_cells.py`` takes (later files' cells replace earlier
ones). A GPU's SM count is not in the results: ``--sms NAME=COUNT`` gives it (H100 SXM and
H200: 132), so that a GPU of the same kind without its own entries uses these.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import latest_cells  # noqa: E402

KNOWN_SMS = {"NVIDIA H100 80GB HBM3": 132, "NVIDIA H200": 132}
DEFAULT_OUT = os.path.join(os.path.dirname(__file__), "..", "src", "evtfuse", "runtime",
                           "defaults.json")


def table(runs: list[tuple[str, str]], drop: list[str], sms: dict[str, int]) -> dict:
    meta = {}
    for label, path in runs:
        with open(path) as f:
            meta[label] = json.load(f).get("meta", {})
    chosen: dict[tuple, collections.Counter] = collections.defaultdict(collections.Counter)
    for (_, _, _), (label, cell) in latest_cells.collect(runs, drop).items():
        dtype = cell.get("input_dtype") or cell["dtype"]  # fp8 workloads: their inputs
        kernel = cell["systems"]["evtfuse"].get("kernel")
        m = meta[label]
        if not kernel or not m.get("gpu"):
            continue
        key = (m["gpu"], str(m.get("sm", "")), f"torch.{_torch_dtype(dtype)}",
               tuple(cell["shape"]))
        chosen[key][kernel] += 1
    entries = []
    for (gpu, cc, dtype, shape), counts in sorted(chosen.items()):
        entries.append({"gpu": gpu, "cc": cc, "sms": sms.get(gpu, 0), "dtype": dtype,
                        "shape": list(shape),
                        "kernels": [k for k, _ in sorted(counts.items(), key=lambda kv: -kv[1])]})
    return {"format": 1, "source": "scripts/defaults_table.py over " +
            ", ".join(sorted({os.path.basename(p) for _, p in runs})[:3]) + " ...",
            "entries": entries}


def _torch_dtype(name: str) -> str:
    return {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32",
            "fp8e4m3": "float8_e4m3fn", "fp8e5m2": "float8_e5m2"}.get(name, name)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs-file", action="append", required=True)
    p.add_argument("--sms", action="append", default=[], help="GPU name=SM count")
    p.add_argument("--out", default=DEFAULT_OUT)
    a = p.parse_args()
    runs, drop = [], []
    for f in a.runs_file:
        items, d = latest_cells._read_runs_file(f)
        runs += [tuple(i.split("=", 1)) for i in items]
        drop += d
    sms = dict(KNOWN_SMS)
    sms.update({k: int(v) for k, v in (s.rsplit("=", 1) for s in a.sms)})
    data = table(runs, drop, sms)
    with open(a.out, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    print(f"{len(data['entries'])} entries -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
