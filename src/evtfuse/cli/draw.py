"""A drawing of an epilogue DAG (``evtfuse show --png out.png``, or ``.svg`` / ``.pdf``).

Layer: cli. Graphviz's ``dot`` draws it where it is installed; otherwise matplotlib (the
``bench`` and ``test`` extras install it) lays it out in levels, inputs on the left. The
node kinds are told apart as in CUTLASS's EVT pictures: the accumulator and operand loads
(boxes), computations (ellipses), reductions (diamonds), constants and coordinates (plain
text) and the stores (outputs: double boxes, labelled with the output's kind and dtype).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..ir import Dag, Node, NodeKind

FORMATS = (".png", ".svg", ".pdf")


@dataclass(frozen=True)
class Shape:
    label: str
    kind: str  # "load" | "compute" | "reduce" | "const" | "store"


def graph(dag: Dag) -> tuple[dict[str, Shape], list[tuple[str, str]]]:
    """The drawing's nodes (id -> shape) and edges (from id, to id): every DAG node and
    one store node per output."""
    ids = {id(n): f"n{k}" for k, n in enumerate(dag.nodes)}
    shapes: dict[str, Shape] = {}
    edges: list[tuple[str, str]] = []
    for n in dag.nodes:
        shapes[ids[id(n)]] = Shape(_label(n), _kind(n))
        edges += [(ids[id(i)], ids[id(n)]) for i in n.inputs]
    for k, o in enumerate(dag.outputs):
        dtype = "not stored" if o.dtype is None else str(o.dtype).removeprefix("torch.")
        sid = f"out{k}"
        shapes[sid] = Shape(f"{o.name}\n{o.kind.value}, {dtype}", "store")
        edges.append((ids[id(o.node)], sid))
    return shapes, edges


def _kind(n: Node) -> str:
    return {NodeKind.ACCUM: "load", NodeKind.LOAD: "load", NodeKind.COMPUTE: "compute",
            NodeKind.REDUCE: "reduce", NodeKind.CONST: "const",
            NodeKind.INDEX: "const"}[n.kind]


def _label(n: Node) -> str:
    if n.kind is NodeKind.LOAD:
        return f"{n.operand.name}\n{n.operand.kind.value}"
    if n.kind is NodeKind.CONST:
        return f"{n.value:g}"
    if n.kind in (NodeKind.COMPUTE, NodeKind.REDUCE):
        params = ", ".join(f"{k}={v}" for k, v in n.params)
        return n.op + (f"({params})" if params else "") + (f"\n{n.var}" if n.var else "")
    return n.short()


_DOT_STYLE = {"load": "shape=box, style=filled, fillcolor=lightblue",
              "compute": "shape=ellipse",
              "reduce": "shape=diamond, style=filled, fillcolor=khaki",
              "const": "shape=plaintext",
              "store": "shape=box, peripheries=2, style=filled, fillcolor=palegreen"}


def to_dot(dag: Dag) -> str:
    """The DAG in Graphviz's language, left to right."""
    shapes, edges = graph(dag)
    lines = [f'digraph "{dag.name}" {{', "  rankdir=LR;"]
    for sid, s in shapes.items():
        label = s.label.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        lines.append(f'  {sid} [label="{label}", {_DOT_STYLE[s.kind]}];')
    lines += [f"  {a} -> {b};" for a, b in edges]
    return "\n".join(lines + ["}"]) + "\n"


def draw(dag: Dag, path: str | Path) -> str:
    """Write a drawing of ``dag`` to ``path`` (.png, .svg or .pdf); returns what drew it."""
    path = Path(path)
    if path.suffix not in FORMATS:
        raise ValueError(f"--png {path}: the drawing is written as {', '.join(FORMATS)}")
    dot = shutil.which("dot")
    if dot:
        subprocess.run([dot, f"-T{path.suffix[1:]}", "-o", str(path)], input=to_dot(dag),
                       text=True, check=True, capture_output=True)
        return "graphviz"
    _draw_matplotlib(dag, path)
    return "matplotlib"


def _levels(shapes: dict, edges: list) -> dict[str, int]:
    """Each node's column: one more than its deepest input's (inputs at 0)."""
    preds: dict[str, list[str]] = {s: [] for s in shapes}
    for a, b in edges:
        preds[b].append(a)
    level: dict[str, int] = {}
    for sid in shapes:  # graph() lists inputs before their users
        level[sid] = 1 + max((level[p] for p in preds[sid]), default=-1)
    return level


def _draw_matplotlib(dag: Dag, path: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError("drawing a DAG needs Graphviz's dot or matplotlib "
                           "(pip install matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes, edges = graph(dag)
    level = _levels(shapes, edges)
    columns: dict[int, list[str]] = {}
    for sid in shapes:
        columns.setdefault(level[sid], []).append(sid)
    pos = {sid: (2.2 * lv, -1.1 * row) for lv, ids in columns.items()
           for row, sid in enumerate(ids)}
    width = 2.2 * (max(columns) + 1) + 1
    height = 1.1 * max(len(v) for v in columns.values()) + 1
    fig, ax = plt.subplots(figsize=(max(4.0, width * 1.4), max(3.0, height * 1.1)))
    for a, b in edges:
        (x0, y0), (x1, y1) = pos[a], pos[b]
        ax.annotate("", xy=(x1 - 0.55, y1), xytext=(x0 + 0.55, y0),
                    arrowprops=dict(arrowstyle="->", color="gray", lw=0.8))
    box = {"load": dict(boxstyle="square", fc="lightblue"),
           "compute": dict(boxstyle="round", fc="white"),
           "reduce": dict(boxstyle="darrow", fc="khaki"),
           "const": dict(boxstyle="square", fc="none", ec="none"),
           "store": dict(boxstyle="round4", fc="palegreen", lw=2)}
    for sid, s in shapes.items():
        x, y = pos[sid]
        ax.text(x, y, s.label, ha="center", va="center", fontsize=8, bbox=box[s.kind])
    ax.set_xlim(-1.2, width - 0.5)
    ax.set_ylim(-height + 0.2, 0.8)
    ax.set_axis_off()
    ax.set_title(dag.name, fontsize=10)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)


__all__ = ["FORMATS", "draw", "graph", "to_dot"]
