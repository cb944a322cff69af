"""Turning measurements into the floor, ratios, a summary, targets, JSON, Markdown, a chart.

Layer: bench (reporting; pure, no GPU). A *cell* is one workload at one shape: a dict
with ``workload``, ``title``, ``shape`` [M, N, K], ``dtype``, ``flops``, ``bytes``
(per tensor and ``total``) and ``systems`` {name: {status, ms, ...}}. ``finalize_cell``
adds ``floor`` and ``ratios``; everything else reads cells and never assumes that a
system or a value is there.

The floor (benchmarks/README.md): max(compute, memory), compute = 2MNK at cuBLAS's rate
measured on that shape, memory = bytes (A, B, every epilogue input and stored output,
each once) at the copy bandwidth measured in the same run.
"""

from __future__ import annotations

import json
import math
from typing import Any, Iterable, Mapping, Sequence

SYSTEMS = ("evtfuse", "mm", "lt", "eager", "compiled")
PEERS = ("mm", "lt", "eager", "compiled")
TIMED = ("ok", "mismatch")  # statuses that carry a time
SYSTEM_LABELS = {"evtfuse": "evtfuse", "mm": "cuBLAS mm", "lt": "cuBLASLt fused",
                 "eager": "eager torch", "compiled": "torch.compile"}


# ----------------------------------------------------------------------------- numbers


def floor_ms(flops: float, mm_rate_flops_per_s: float | None, nbytes: float,
             bandwidth_bytes_per_s: float | None) -> dict[str, Any]:
    """{'ms', 'compute_ms', 'memory_ms', 'bound'}; ms is None unless both rates are known."""
    compute = flops / mm_rate_flops_per_s * 1e3 if mm_rate_flops_per_s else None
    memory = nbytes / bandwidth_bytes_per_s * 1e3 if bandwidth_bytes_per_s else None
    if compute is None or memory is None:
        return {"ms": None, "compute_ms": compute, "memory_ms": memory, "bound": None}
    bound = "compute" if compute >= memory else "memory"
    return {"ms": max(compute, memory), "compute_ms": compute, "memory_ms": memory,
            "bound": bound}


def tflops(flops: float, ms: float | None) -> float | None:
    return flops / (ms * 1e-3) / 1e12 if ms else None


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0 or not _finite(a) or not _finite(b):
        return None
    return a / b


def geomean(values: Iterable[float | None]) -> float | None:
    vs = [v for v in values if v is not None and _finite(v) and v > 0]
    if not vs:
        return None
    return math.exp(sum(math.log(v) for v in vs) / len(vs))


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def timed_ms(cell: Mapping[str, Any], system: str) -> float | None:
    s = (cell.get("systems") or {}).get(system) or {}
    ms = s.get("ms")
    return ms if s.get("status") in TIMED and _finite(ms) else None


# ----------------------------------------------------------------------------- cells


def finalize_cell(cell: dict[str, Any], bandwidth_bytes_per_s: float | None) -> dict[str, Any]:
    """Add ``floor``, per-system ``tflops`` and ``x_floor``, and ``ratios`` (in place)."""
    fl = float(cell.get("flops") or 0.0)
    mm = timed_ms(cell, "mm")
    rate = fl / (mm * 1e-3) if mm else None
    total = float((cell.get("bytes") or {}).get("total") or 0)
    floor = floor_ms(fl, rate, total, bandwidth_bytes_per_s)
    cell["floor"] = floor
    for name, s in (cell.get("systems") or {}).items():
        ms = timed_ms(cell, name)
        s["tflops"] = tflops(fl, ms)
        s["x_floor"] = ratio(ms, floor["ms"])
    evt = timed_ms(cell, "evtfuse")
    ratios = {"evtfuse/floor": ratio(evt, floor["ms"])}
    for p in PEERS:
        ratios[f"evtfuse/{p}"] = ratio(evt, timed_ms(cell, p))
    for p in PEERS:
        ratios[f"{p}/floor"] = ratio(timed_ms(cell, p), floor["ms"])
    cell["ratios"] = ratios
    return cell


def cell_key(cell: Mapping[str, Any]) -> tuple:
    return (cell.get("workload"), tuple(cell.get("shape") or ()), cell.get("dtype"))


def is_complete(cell: Mapping[str, Any]) -> bool:
    return not cell.get("incomplete")


# ----------------------------------------------------------------------------- summary


def _r(cell, key):
    return (cell.get("ratios") or {}).get(key)


def summarize(cells: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    non_id = [c for c in cells if c.get("workload") != "identity"]

    def worst(cs, key):
        best = None
        for c in cs:
            v = _r(c, key)
            if v is not None and (best is None or v > best[0]):
                best = (v, f"{c.get('workload')} @ {c.get('shape_str')}")
        return {"value": best[0], "where": best[1]} if best else {"value": None, "where": None}

    statuses: dict[str, dict[str, int]] = {}
    for c in cells:
        for name, s in (c.get("systems") or {}).items():
            st = statuses.setdefault(name, {})
            key = s.get("status", "?")
            st[key] = st.get(key, 0) + 1
    slower = [f"{c.get('workload')} @ {c.get('shape_str')}" for c in non_id
              if (_r(c, "evtfuse/compiled") or 0) > 1.0]
    return {
        "cells": len(cells),
        "geomean evtfuse/floor": geomean(_r(c, "evtfuse/floor") for c in cells),
        "worst evtfuse/floor": worst(cells, "evtfuse/floor"),
        "geomean evtfuse/compiled (non-identity)": geomean(_r(c, "evtfuse/compiled")
                                                           for c in non_id),
        "worst evtfuse/compiled": worst(non_id, "evtfuse/compiled"),
        "cells where evtfuse is slower than compiled": slower,
        "geomean compiled/floor": geomean(_r(c, "compiled/floor") for c in cells),
        "worst compiled/floor": worst(cells, "compiled/floor"),
        "geomean eager/floor": geomean(_r(c, "eager/floor") for c in cells),
        "geomean lt/floor": geomean(_r(c, "lt/floor") for c in cells),
        "worst evtfuse/lt": worst([c for c in cells if not c.get("lt_partial")], "evtfuse/lt"),
        "statuses": statuses,
    }


def _pick(cells, workload, shape_str, dtype="bf16"):
    for c in cells:
        if c.get("workload") == workload and c.get("shape_str") == shape_str \
                and c.get("dtype") == dtype:
            return c
    return None


def _target(name, value, threshold, le=True, detail=""):
    ok = None if value is None else (value <= threshold if le else value >= threshold)
    return {"target": name, "value": value, "threshold": threshold,
            "op": "<=" if le else ">=", "ok": ok, "detail": detail}


def targets(cells: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The speed targets of issues 4 and 6 (H100 bf16), each with its measured value."""
    bf = [c for c in cells if c.get("dtype") == "bf16"]
    non_id = [c for c in bf if c.get("workload") != "identity"]
    fused_lt = [c for c in bf if not c.get("lt_partial")]
    s = summarize(bf)
    out = [
        _target("evtfuse <= torch.compile, every non-identity cell (max ratio)",
                s["worst evtfuse/compiled"]["value"], 1.0,
                detail=s["worst evtfuse/compiled"]["where"] or ""),
        _target("geomean evtfuse/torch.compile, non-identity", geomean(
            _r(c, "evtfuse/compiled") for c in non_id), 0.87),
        _target("evtfuse/cuBLASLt where Lt fuses the epilogue (max)",
                summarize(fused_lt)["worst evtfuse/lt"]["value"], 1.02,
                detail=summarize(fused_lt)["worst evtfuse/lt"]["where"] or ""),
        _target("geomean evtfuse/floor", s["geomean evtfuse/floor"], 1.12),
        _target("max evtfuse/floor", s["worst evtfuse/floor"]["value"], 1.35,
                detail=s["worst evtfuse/floor"]["where"] or ""),
    ]
    for shp in ("4096^3", "8192^3"):
        c = _pick(bf, "identity", shp)
        out.append(_target(f"identity throughput vs cuBLAS at {shp} (mm/evtfuse)",
                           ratio(1.0, _r(c, "evtfuse/mm")) if c else None, 0.97, le=False))
    for shp in ("8192x8192x1024", "4096^3"):
        c = _pick(bf, "bce_loss", shp)
        out.append(_target(f"BCE loss evtfuse/compiled at {shp}",
                           _r(c, "evtfuse/compiled") if c else None, 0.8))
    c = _pick(bf, "row_amax", "8192x8192x1024")
    out.append(_target("row amax evtfuse/compiled at 8192x8192x1024",
                       _r(c, "evtfuse/compiled") if c else None, 0.8))
    c = _pick(bf, "row_amax", "4096^3")
    out.append(_target("row amax evtfuse/floor at 4096^3", _r(c, "evtfuse/floor") if c else None,
                       1.05))
    c = _pick(bf, "fp8_scale_amax", "8192^3")
    out.append(_target("fp8 scale+amax evtfuse / _scaled_mm alone at 8192^3",
                       _r(c, "evtfuse/mm") if c else None, 1.10))
    c = _pick(bf, "lmhead_ce", "8192x128256x4096")
    out.append(_target("LM head CE evtfuse / (x @ W)", _r(c, "evtfuse/mm") if c else None, 1.05))
    evt = ((c or {}).get("systems") or {}).get("evtfuse") or {}
    out.append(_target("LM head CE evtfuse extra memory (MiB)",
                       evt.get("extra_mib") if evt.get("status") in TIMED else None, 64.0))
    firsts = [((c.get("cold") or {}).get("first_call_s"), c) for c in bf]
    firsts = [(v, c) for v, c in firsts if _finite(v)]
    slowest = max(firsts, key=lambda p: p[0]) if firsts else None
    out.append(_target("evtfuse first call (compile + tuning), slowest cell (s)",
                       slowest[0] if slowest else None, 30.0,
                       detail=f"{slowest[1].get('workload')} @ {slowest[1].get('shape_str')}"
                       if slowest else ""))
    return out


# ----------------------------------------------------------------------------- formatting


def fmt_num(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf"
        return f"{v:.{digits}f}"
    return str(v)


def fmt_ratio(v: float | None) -> str:
    return "-" if v is None or not _finite(v) else f"{v:.2f}x"


class _Notes:
    """Numbered footnotes for the Markdown table (same text, same number)."""

    def __init__(self):
        self.items: list[str] = []

    def ref(self, text: str) -> str:
        text = " ".join(str(text).split())
        if len(text) > 400:
            text = text[:397] + "..."
        if text not in self.items:
            self.items.append(text)
        return f"[{self.items.index(text) + 1}]"


def fmt_system(s: Mapping[str, Any] | None, notes: _Notes) -> str:
    if not s:
        return "-"
    st = s.get("status")
    if st == "n/a":
        return "-"
    if st in TIMED:
        text = f"{fmt_num(s.get('ms'))} ({fmt_ratio(s.get('x_floor'))})"
        if st == "mismatch":
            text += " MISMATCH" + notes.ref(f"result differs from eager: rel err "
                                            f"{fmt_num(s.get('rel_err'), 4)} "
                                            f"{s.get('error') or ''}".strip())
        elif s.get("note"):
            text += notes.ref(s["note"])
        k = s.get("kernel_ms")
        if _finite(k) and _finite(s.get("ms")) and s["ms"] > 1.05 * k:
            text += notes.ref(f"kernel.run alone (arguments built once): {k:.3f} ms; the "
                              "rest is evtfuse.gemm's host work per call")
        return text
    msg = s.get("error") or s.get("note") or ""
    return f"{st}{notes.ref(msg)}" if msg else str(st)


def fmt_cold(cell: Mapping[str, Any]) -> str:
    cold = cell.get("cold") or {}
    a, b = cold.get("first_call_s"), cold.get("warm_call_ms")
    if a is None and b is None:
        return "-"
    return f"{fmt_num(a, 1)} s / {fmt_num(b, 3)} ms"


TABLE_COLUMNS = ("workload", "shape", "floor ms", "evtfuse ms (x floor)", "cuBLAS mm",
                 "cuBLASLt", "eager", "torch.compile", "evt/compiled", "evt/lt", "evt/mm",
                 "evt TFLOP/s", "first call / warm call", "evtfuse kernel")


def markdown_table(cells: Sequence[Mapping[str, Any]], notes: _Notes | None = None) -> str:
    notes = notes if notes is not None else _Notes()
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |",
             "|" + "|".join("---" for _ in TABLE_COLUMNS) + "|"]
    for c in cells:
        sy = c.get("systems") or {}
        fl = c.get("floor") or {}
        bound = {"compute": "C", "memory": "M"}.get(fl.get("bound"), "")
        floor_txt = f"{fmt_num(fl.get('ms'))} {bound}".strip()
        r = c.get("ratios") or {}
        evt = sy.get("evtfuse") or {}
        row = [c.get("title") or c.get("workload", "?"), c.get("shape_str", "?"), floor_txt,
               fmt_system(sy.get("evtfuse"), notes), fmt_system(sy.get("mm"), notes),
               fmt_system(sy.get("lt"), notes), fmt_system(sy.get("eager"), notes),
               fmt_system(sy.get("compiled"), notes), fmt_ratio(r.get("evtfuse/compiled")),
               fmt_ratio(r.get("evtfuse/lt")), fmt_ratio(r.get("evtfuse/mm")),
               fmt_num(evt.get("tflops"), 0), fmt_cold(c), evt.get("kernel") or "-"]
        if c.get("incomplete"):
            row[0] += " (incomplete)"
        lines.append("| " + " | ".join(str(x).replace("|", "\\|") for x in row) + " |")
    return "\n".join(lines)


def markdown_report(result: Mapping[str, Any]) -> str:
    meta = result.get("meta") or {}
    cells = result.get("cells") or []
    notes = _Notes()
    table = markdown_table(cells, notes)
    bw = result.get("bandwidth_bytes_per_s")
    head = [
        "# evtfuse benchmark",
        "",
        f"- date: {meta.get('date', '?')}",
        f"- GPU: {meta.get('gpu', '?')}",
        f"- torch {meta.get('torch', '?')}, triton {meta.get('triton', '?')}, "
        f"CUDA {meta.get('cuda', '?')}, evtfuse {meta.get('evtfuse', '?')}",
        f"- command: `{meta.get('command', '?')}`",
        f"- dtype: {meta.get('dtype', '?')} (fp8 workloads: fp8 e4m3 inputs); tune="
        f"{meta.get('tune', '?')}; evtfuse/Triton caches: {meta.get('caches', '?')}",
        f"- copy bandwidth: {fmt_num(bw / 1e12 if bw else None, 2)} TB/s (read + write, "
        f"device-to-device copy)",
        f"- times: median over {meta.get('rounds', 1)} round(s) (every system timed once per "
        "round, in turn) of triton.testing.do_bench's median ms (L2 flushed before each call, "
        "inputs rotated among several sets when one set is under 50 MiB); (Nx) = time / floor; "
        "floor = max(2MNK at cuBLAS's measured rate on that shape, bytes / copy bandwidth), "
        "C/M = compute/memory bound",
        f"- complete: {'yes' if result.get('complete') else 'no: ' + str(result.get('left', '?')) + ' cell(s) not run; rerun the same command with --resume'}",
        "",
        table,
    ]
    if notes.items:
        head += ["", "Notes:", ""] + [f"{i + 1}. {t}" for i, t in enumerate(notes.items)]
    summ = result.get("summary") or {}
    if summ:
        head += ["", "## Summary", "", "| measure | value |", "|---|---|"]
        for k, v in summ.items():
            if k == "statuses":
                v = "; ".join(f"{n}: " + ", ".join(f"{s} {c}" for s, c in d.items())
                              for n, d in v.items())
            elif isinstance(v, dict):
                v = f"{fmt_ratio(v.get('value'))} ({v.get('where') or '-'})"
            elif isinstance(v, list):
                v = ", ".join(v) if v else "none"
            elif isinstance(v, float):
                v = fmt_ratio(v)
            head.append(f"| {k} | {v} |")
    tg = result.get("targets") or []
    if tg:
        head += ["", "## Targets (issues 4 and 6, bf16)", "",
                 "| target | measured | goal | met |", "|---|---|---|---|"]
        for t in tg:
            met = {True: "yes", False: "NO", None: "not measured"}[t.get("ok")]
            detail = f" ({t['detail']})" if t.get("detail") else ""
            head.append(f"| {t['target']} | {fmt_num(t.get('value'))}{detail} | "
                        f"{t['op']} {t['threshold']} | {met} |")
    return "\n".join(head) + "\n"


# ----------------------------------------------------------------------------- JSON


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # "nan", "inf": strict JSON has no such numbers
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)


def to_json(result: Mapping[str, Any]) -> str:
    return json.dumps(_clean(result), indent=1, allow_nan=False)


def assemble(meta: Mapping[str, Any], cells: Sequence[dict[str, Any]], bandwidth: float | None,
             complete: bool, left: int = 0) -> dict[str, Any]:
    """The whole result: cells finalized, with summary and targets."""
    for c in cells:
        if "floor" not in c:
            finalize_cell(c, c.get("bandwidth_bytes_per_s") or bandwidth)
    return {"meta": dict(meta), "bandwidth_bytes_per_s": bandwidth, "complete": complete,
            "left": left, "cells": list(cells), "summary": summarize(cells),
            "targets": targets(cells)}


# ----------------------------------------------------------------------------- chart


def write_chart(result: Mapping[str, Any], path: str) -> str | None:
    """time / floor per workload and shape, one bar per system; None if nothing to draw."""
    cells = [c for c in result.get("cells") or [] if (c.get("floor") or {}).get("ms")]
    if not cells:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    shapes: list[str] = []
    for c in cells:
        if c.get("shape_str") not in shapes:
            shapes.append(c.get("shape_str"))
    fig, axes = plt.subplots(len(shapes), 1, figsize=(14, 3.6 * len(shapes)), squeeze=False)
    width = 0.8 / len(SYSTEMS)
    for ax, shp in zip(axes[:, 0], shapes):
        row = [c for c in cells if c.get("shape_str") == shp]
        for k, name in enumerate(SYSTEMS):
            xs, ys = [], []
            for i, c in enumerate(row):
                v = ((c.get("systems") or {}).get(name) or {}).get("x_floor")
                if v is not None and _finite(v):
                    xs.append(i + (k - (len(SYSTEMS) - 1) / 2) * width)
                    ys.append(v)
            ax.bar(xs, ys, width, label=SYSTEM_LABELS[name])
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_yticks([t for t in (0.25, 0.5, 0.75, 1, 1.25, 1.5, 2, 3, 5, 10, 20)
                       if t <= max(2.0, ax.get_ylim()[1])])
        ax.set_xticks(range(len(row)))
        labels = []
        for c in row:
            evt = (c.get("systems") or {}).get("evtfuse") or {}
            st = evt.get("status")
            labels.append(c.get("workload", "?") + ("" if st in TIMED else f"\n(evtfuse: {st})"))
        ax.set_xticklabels(labels, rotation=15, fontsize=8)
        ax.set_ylabel("time / floor")
        meta = result.get("meta") or {}
        what = ", ".join(str(x) for x in (meta.get("dtype"), meta.get("gpu")) if x)
        ax.set_title(f"{shp}" + (f" ({what})" if what else ""), fontsize=10)
        ax.grid(axis="y", which="both", alpha=0.3)
    axes[0, 0].legend(ncol=len(SYSTEMS), fontsize=8, loc="lower center",
                      bbox_to_anchor=(0.5, 1.12), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


__all__ = ["SYSTEMS", "PEERS", "floor_ms", "tflops", "ratio", "geomean", "finalize_cell",
           "summarize", "targets", "markdown_table", "markdown_report", "to_json", "assemble",
           "write_chart", "cell_key", "is_complete"]
