"""README.md's performance table and BENCHMARKS.md's headline and suite tables, generated
from the committed results files in benchmarks/results/, so that each number is written in
one place (a results file) and copied into the docs by this script only.

    PYTHONPATH=src python3 scripts/results_tables.py            # rewrite the generated parts
    PYTHONPATH=src python3 scripts/results_tables.py --check    # exit 1 if a part is stale

A generated part sits between ``<!-- BEGIN GENERATED: NAME ... -->`` and
``<!-- END GENERATED: NAME -->``; the text outside the markers is written by hand and may
quote no number that a generated part holds. ``SOURCES`` names the results file of every
part: a new run is taken into the docs by pointing ``SOURCES`` at its file (or, for the
fused-epilogue suite, adding it to ``RUNS.txt``) and running this script. tests/
test_results_tables.py checks that the committed docs equal the generated text.

A contributor tool, not part of the package: it reads benchmarks/results/, which
src/evtfuse must not depend on (the suite's latest cells come from scripts/latest_cells.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import latest_cells  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = "benchmarks/results"

# every results file a generated part reads, relative to benchmarks/results/
SOURCES = {
    "suite": "2026-11-22/RUNS.txt",                  # the fused-epilogue suite (H100)
    "moe": "2026-11-27/session26/moe.json",          # SwiGLU experts (H200)
    "moe_layer": "2026-11-29/session36/moe_layer.json",  # whole expert layers (H200)
    "training": "2026-11-27/session30/training_mlp.json",
    "mlp_block": "2026-11-29/session35/mlp_block_gluon.json",
    "lce": "2026-11-28/session32/lce.json",
    "models": "2026-11-29/session35/models_llama.json",
}

# the suite cells README's table shows: (workload, shape, how the row names it)
README_SUITE_ROWS = (
    ("alpha_beta", "8192x8192x1024", "`alpha*acc + beta*C`, 8192x8192x1024"),
    ("bias_gelu_tanh", "8192x8192x1024", "`gelu_tanh(acc + bias)`, 8192x8192x1024"),
    ("bias_relu", "8192^3", "`relu(acc + bias)`, 8192^3"),
    ("row_logsumexp", "8192x8192x1024", "D and logsumexp per row, 8192x8192x1024"),
    ("bce_loss", "8192x8192x1024",
     "binary cross-entropy loss, logits not stored, 8192x8192x1024"),
)
# the MoE cells README's table shows: (experts, K, N, routing)
README_MOE_ROWS = ((64, 2048, 1408, "uniform"), (8, 4096, 14336, "uniform"))


def _load(name: str, root: Path) -> dict:
    return json.loads((root / RESULTS / SOURCES[name]).read_text())


def _gpu(device: str) -> str:
    return "H200" if "H200" in device else "H100" if "H100" in device else device


def suite_cells(root: Path) -> dict:
    """The latest cell of every suite workload and shape, as BENCHMARKS.md lists them."""
    items, drop = latest_cells._read_runs_file(str(root / RESULTS / SOURCES["suite"]))
    return latest_cells.collect([tuple(i.split("=", 1)) for i in items], drop)


def _suite_cell(latest: dict, workload: str, shape: str) -> dict:
    found = [c for (w, sh, _dt), (_lb, c) in latest.items() if (w, sh) == (workload, shape)]
    if len(found) != 1:
        raise SystemExit(f"the suite has {len(found)} cells {workload}@{shape}")
    return found[0]


def _span(values, fmt: str = "{:.2f}") -> str:
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    return lo if lo == hi else f"{lo}-{hi}"


def _fill(text: str) -> str:
    return textwrap.fill(text, width=92, break_on_hyphens=False, break_long_words=False)


def _gib(mib: float) -> str:
    return f"{mib / 1024:.1f} GiB"


def readme_performance(root: Path) -> str:
    """README's table: evtfuse against the GEMM alone, torch.compile and eager, per row."""
    latest = suite_cells(root)
    rows = ["| workload | GPU | evtfuse | cuBLAS GEMM alone (no epilogue) | torch.compile "
            "| eager PyTorch |", "|---|---|---|---|---|---|"]
    for workload, shape, label in README_SUITE_ROWS:
        c = _suite_cell(latest, workload, shape)
        ms = {k: c["systems"][k]["ms"] for k in ("evtfuse", "mm", "compiled", "eager")}
        rows.append(f"| {label} | H100 | {ms['evtfuse']:.3f} | {ms['mm']:.3f} | "
                    f"{ms['compiled']:.3f} | {ms['eager']:.3f} |")
    moe = _load("moe", root)
    for g, k, n, routing in README_MOE_ROWS:
        c = next(c for c in moe["cells"]
                 if (c["experts"], c["K"], c["N"], c["routing"]) == (g, k, n, routing))
        rows.append(f"| SwiGLU experts, {g} x {k} -> 2 x {n}, {c['tokens']} tokens | "
                    f"{_gpu(moe['device'])} | {c['evtfuse_ms']:.3f} | {c['grouped_mm_ms']:.3f} "
                    f"(`_grouped_mm`) | {c['grouped_mm_compile_ms']:.3f} | "
                    f"{c['grouped_mm_eager_ms']:.3f} |")
    tr = _load("training", root)
    m = tr["mlp"]
    tokens, k, n = m["shape"]
    rows.append(f"| MLP training step, bias + GELU, {tokens} x {k} -> {n} | {_gpu(tr['device'])} "
                f"| {m['evtfuse_ms']:.3f} | {m['three_gemms_ms']:.3f} (three GEMMs) | "
                f"{m['compiled_ms']:.3f} | {m['eager_ms']:.3f} |")
    blk = _load("mlp_block", root)
    v = {name: var["median_ms"] for name, var in blk["variants"].items()}
    s = blk["shape"]
    rows.append(f"| SwiGLU MLP block (`evtfuse.nn.GatedMLP`), forward + backward, {s['tokens']} x "
                f"{s['hidden']} -> 2 x {s['inter']} | {_gpu(blk['device'])} | "
                f"{v['evtfuse']:.2f} | {v['cublas6']:.2f} (six GEMMs) | {v['compile']:.2f} | "
                f"{v['torch']:.2f} |")
    lce = _load("lce", root)
    r, cfg = lce["results"], lce["config"]
    rows.append(f"| LM-head cross-entropy, forward + backward, {cfg['tokens']} x {cfg['hidden']} x "
                f"{cfg['vocab']} | {_gpu(lce['device'])} | {r['evtfuse']['ms']:.2f} (compiled: "
                f"{r['evtfuse_compile']['ms']:.2f}) | {r['cublas']['ms']:.2f} (three GEMMs) | "
                f"{r['compile']['ms']:.2f} | {r['eager']['ms']:.2f} |")
    mod = _load("models", root)
    lm = mod["models"]["llama"]
    res = lm["results"]
    layers = mod["config"]["layers"]
    batch, seq = lm["tokens"]
    rows.append(f"| Llama training step (Llama-3-8B's shapes, {layers} layers, {batch} x {seq} "
                f"tokens), `evtfuse.hf.patch` | {_gpu(mod['device'])} | "
                f"{res['patched']['ms']:.2f} (compiled: {res['patched_compile']['ms']:.2f}), "
                f"{_gib(res['patched']['peak_beyond_mib'])} | - | "
                f"{res['original_compile']['ms']:.2f}, "
                f"{_gib(res['original_compile']['peak_beyond_mib'])} | "
                f"{res['original']['ms']:.2f}, {_gib(res['original']['peak_beyond_mib'])} |")
    s = latest_cells.summary(latest)
    workloads = {w for (w, _sh, _dt) in latest}
    shapes = {}
    for (w, sh, _dt) in latest:
        shapes.setdefault(w, set()).add(sh)
    slower = ("no fused epilogue is slower than torch.compile in its latest run"
              if not s["slower_than_compiled"] else
              f"{len(s['slower_than_compiled'])} fused epilogues are slower than torch.compile "
              "in their latest run")
    rows += ["", _fill(
             f"Over the benchmark suite's {s['cells']} cells ({len(workloads)} workloads at up to "
             f"{max(map(len, shapes.values()))} shapes, H100), evtfuse takes "
             f"{s['geomean_compiled']:.3f}x torch.compile's time (geomean over the "
             f"{len(s['vs_compiled'])} cells with an epilogue) and {s['geomean_floor']:.2f}x that "
             f"of the GEMM alone, and {slower}.")]
    return "\n".join(rows)


def benchmarks_headline(root: Path) -> str:
    """BENCHMARKS.md's headline paragraph: the suite's aggregates over its latest cells."""
    latest = suite_cells(root)
    s = latest_cells.summary(latest)
    workloads = {w for (w, _sh, _dt) in latest}
    shapes: dict[str, set] = {}
    for (w, sh, _dt) in latest:
        shapes.setdefault(w, set()).add(sh)
    identity = [v for v, w, _sh, _lb in s["vs_floor"] if w == "identity"]
    closest = s["vs_compiled"][-1]
    worst = s["vs_floor"][-1]
    lt = ", ".join(f"{_span([v for v, w2, *_ in s['vs_lt'] if w2 == w])}x ({w})"
                    for w in sorted({w for _v, w, _sh, _lb in s["vs_lt"]}))
    if s["slower_than_compiled"]:
        slower = (f"{len(s['slower_than_compiled'])} cells with an epilogue are slower than "
                  "torch.compile in their latest run")
    else:
        slower = "No cell with an epilogue is slower than torch.compile in its latest run"
    text = (
        f"On the suite's {s['cells']} cells ({len(workloads)} workloads at up to "
        f"{max(map(len, shapes.values()))} shapes, bf16, H100) evtfuse takes "
        f"**{s['geomean_compiled']:.3f}x the time of `torch.compile`** (geomean over the "
        f"{len(s['vs_compiled'])} cells with an epilogue) and **{s['geomean_floor']:.3f}x the "
        f"floor** (geomean over all {len(s['vs_floor'])}; the floor is defined under Method). "
        f"{slower} (the closest: {closest[1]} at {closest[2]}, {closest[0]:.3f}x); the worst "
        f"cell is {worst[1]} at {worst[2]}, {worst[0]:.2f}x the floor; a plain GEMM "
        f"(`identity`) runs at {_span(identity)}x cuBLAS's time. Where cuBLASLt fuses the "
        f"whole epilogue, evtfuse takes {lt} its time.")
    return _fill(text)


def benchmarks_suite_tables(root: Path) -> str:
    """BENCHMARKS.md's tables of the suite: one per workload family, every peer."""
    return latest_cells.family_tables(suite_cells(root)).rstrip("\n")


def benchmarks_moe_table(root: Path) -> str:
    """BENCHMARKS.md's mixture-of-experts table, every cell of the MoE results file."""
    moe = _load("moe", root)
    rows = ["| experts x K -> 2 x N | routing | `_grouped_mm` alone ms | + eager epilogue | "
            "torch.compile of both | evtfuse | concatenated | evtfuse / `_grouped_mm` alone | "
            "/ eager pair | / compile |", "|---|---|---|---|---|---|---|---|---|---|"]
    for c in moe["cells"]:
        rows.append(f"| {c['experts']} x {c['K']} -> 2 x {c['N']} | {c['routing']} | "
                    f"{c['grouped_mm_ms']:.3f} | {c['grouped_mm_eager_ms']:.3f} | "
                    f"{c['grouped_mm_compile_ms']:.3f} | {c['evtfuse_ms']:.3f} | "
                    f"{c['evtfuse_concat_ms']:.3f} | {c['evtfuse_over_grouped_mm']:.3f} | "
                    f"{c['evtfuse_over_grouped_mm_eager']:.3f} | "
                    f"{c['evtfuse_over_grouped_mm_compile']:.3f} |")
    cells = moe["cells"]
    ratio = lambda key: _span([c[key] for c in cells])  # noqa: E731
    concat = _span([c["evtfuse_concat_ms"] / c["evtfuse_ms"] for c in cells])
    large = [c for c in cells if c["experts"] == min(c2["experts"] for c2 in cells)]
    tf = lambda key: _span([c[key] for c in large], "{:.0f}")  # noqa: E731
    rows += ["", _fill(
        f"evtfuse takes {ratio('evtfuse_over_grouped_mm')}x the time of `torch._grouped_mm` "
        f"alone with no epilogue, {ratio('evtfuse_over_grouped_mm_compile')}x torch.compile's "
        f"and {ratio('evtfuse_over_grouped_mm_eager')}x the eager pair's (ratios from the "
        f"interleaved layout; the concatenated one takes {concat}x its time). With "
        f"{large[0]['experts']} large experts evtfuse reaches {tf('evtfuse_tflops')} TFLOP/s, "
        f"cuBLAS's grouped GEMM {tf('grouped_mm_tflops')} and a dense GEMM of the same FLOPs "
        f"{tf('dense_mm_tflops')}. Relative error against the eager pair: "
        f"{max(c['evtfuse_rel_err'] for c in cells):.1e} (bf16 rounding).".replace("e-0", "e-"))]
    return "\n".join(rows)


_LAYER_NAMES = {"evtfuse": "evtfuse (`evtfuse.nn.MoEExperts`)",
                "evtfuse_wgrad_mm": "evtfuse, weights' gradients by `torch._grouped_mm`",
                "hf_eager": "HF eager loop",
                "hf_grouped_mm": "HF `grouped_mm` experts, eager",
                "hf_grouped_mm_compile": "HF `grouped_mm` experts, torch.compile",
                "reference": "`_grouped_mm` reference (sort, grouped GEMMs, eager epilogues)"}


def benchmarks_moe_layer_table(root: Path) -> str:
    """BENCHMARKS.md's table of whole expert layers, forward + backward, every variant."""
    lay = _load("moe_layer", root)
    rows = ["| experts x H -> I, top-k | routing | variant | step ms | forward ms | backward ms "
            "| step TF/s | forward TF/s | backward TF/s | x evtfuse's step | peak MiB |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in lay["cells"]:
        for v in lay["variants"]:
            if f"{v}_step_ms" not in c:
                continue
            rows.append(
                f"| {c['experts']} x {c['H']} -> {c['I']}, top-{c['top_k']} | {c['routing']} | "
                f"{_LAYER_NAMES.get(v, v)} | {c[f'{v}_step_ms']:.2f} | {c[f'{v}_fwd_ms']:.2f} | "
                f"{c[f'{v}_bwd_ms']:.2f} | {c[f'{v}_step_tflops']:.0f} | "
                f"{c[f'{v}_fwd_tflops']:.0f} | {c[f'{v}_bwd_tflops']:.0f} | "
                f"{c[f'{v}_step_ms'] / c['evtfuse_step_ms']:.3f} | {c[f'{v}_peak_mib']:,.0f} |")
    cells = lay["cells"]
    err = max(c[k] for c in cells for k in c if k.startswith("evtfuse_rel_err"))
    ref = max(c[k] for c in cells for k in c if k.startswith("reference_rel_err"))
    rows += ["", _fill(
        f"{cells[0]['tokens']:,} tokens, {lay['rounds']} interleaved rounds, {_gpu(lay['device'])}, "
        f"torch {lay['torch'].split('+')[0]}, Triton {lay['triton']}, transformers "
        f"{lay['transformers']}. Largest relative error of evtfuse's output and gradients "
        f"against the HF eager block: {err:.1e}; the `_grouped_mm` reference's, computed the "
        f"same way: {ref:.1e} (bf16 rounding).".replace("e-0", "e-"))]
    return "\n".join(rows)


# (file, part name) -> the function that renders that part
PARTS = {
    ("README.md", "performance"): readme_performance,
    ("BENCHMARKS.md", "headline"): benchmarks_headline,
    ("BENCHMARKS.md", "suite-tables"): benchmarks_suite_tables,
    ("BENCHMARKS.md", "moe-table"): benchmarks_moe_table,
    ("BENCHMARKS.md", "moe-layer-table"): benchmarks_moe_layer_table,
}


def begin(name: str) -> str:
    return (f"<!-- BEGIN GENERATED: {name} (scripts/results_tables.py from benchmarks/results;"
            f" edit there, not here) -->")


def end(name: str) -> str:
    return f"<!-- END GENERATED: {name} -->"


def update(text: str, name: str, body: str, where: str = "the file") -> str:
    """``text`` with the part ``name`` (between its markers) replaced by ``body``."""
    b, e = begin(name), end(name)
    start, stop = text.find(b), text.find(e)
    if start < 0 or stop < start:
        raise SystemExit(f"{where} has no '{b}' ... '{e}' block")
    return text[:start] + b + "\n" + body + "\n" + text[stop:]


def render(root: Path = ROOT) -> dict[str, str]:
    """file name -> its text with every generated part up to date."""
    out: dict[str, str] = {}
    for (file, name), fn in PARTS.items():
        text = out.get(file) or (root / file).read_text()
        out[file] = update(text, name, fn(root), file)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="compare only; exit 1 if stale")
    p.add_argument("--root", default=str(ROOT), help="the repository root (default: this one)")
    a = p.parse_args(argv)
    root = Path(a.root)
    stale = False
    for file, text in render(root).items():
        if (root / file).read_text() == text:
            continue
        stale = True
        if not a.check:
            (root / file).write_text(text)
        print(f"{'stale' if a.check else 'wrote'}: {file}")
    if a.check and stale:
        print("run `PYTHONPATH=src python3 scripts/results_tables.py`")
    return 1 if (a.check and stale) else 0


if __name__ == "__main__":
    raise SystemExit(main())
