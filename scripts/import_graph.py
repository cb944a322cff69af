"""The layers of src/evtfuse, bottom to top, and the import graph that must respect them.

    python3 scripts/import_graph.py            # print the layers as the imports make them
    python3 scripts/import_graph.py --write    # rewrite docs/architecture.md's copy
    python3 scripts/import_graph.py --check    # exit 1 on a broken rule or a stale copy

``LAYERS`` is the one place the order is written: every module of the package belongs to
exactly one layer, and a module imports only modules of its own layer or of layers below
it. Every import counts, as the package's source says it: at module level or inside a
function (a lazy import is still an import), relative or absolute, ``import evtfuse.x``,
``from . import x`` (the module x where it is one, else the package), and
``importlib.import_module("evtfuse.x")`` with a literal name; an import under ``if
TYPE_CHECKING:`` too (a reader follows it the same way). Beyond the order, no import chain
leads back to where it started: no cycle, within a layer either. ``ALLOWED`` lists the
upward imports accepted, each with why (none today). The package's ``__init__`` modules
run before any module below them whatever it imports: that is Python's import machinery,
not an import the source states, and not counted.

tests/test_import_layers.py holds the package to these rules (and checks that the checker
catches a cycle and an upward import of a small made-up package), and that the diagram in
docs/architecture.md (between the ``BEGIN GENERATED: layers`` markers) is this script's.
A contributor tool that reads the source with ``ast``; it imports nothing of evtfuse.
"""

from __future__ import annotations

import argparse
import ast
import sys
import textwrap
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
DOC = ROOT / "docs" / "architecture.md"
BEGIN = "<!-- BEGIN GENERATED: layers (scripts/import_graph.py --write) -->"
END = "<!-- END GENERATED: layers -->"


class Layer(NamedTuple):
    name: str
    what: str  # what the layer is, in a few words
    modules: tuple[str, ...]  # dotted names below ``evtfuse``; "x.*": package x and all below


# bottom to top
LAYERS: tuple[Layer, ...] = (
    Layer("base", "errors, logging, memory spans, M's size classes, the version",
          ("errors", "logs", "memory", "sizes", "version")),
    Layer("ir", "the op table and its derivatives' language, the DAG and its printers",
          ("derivative", "optable", "ir", "unparse")),
    Layer("passes", "DAG to DAG: the rewrite pipeline, the two-pass split, differentiation",
          ("passes", "staging", "autodiff.*")),
    Layer("frontend", "source text to a checked, bound DAG; the arguments; the eager ops",
          ("axes", "spellings", "ops", "frontend.*", "dag_epilogue", "arguments")),
    Layer("reference", "the eager torch evaluation of a DAG: the oracle",
          ("reference",)),
    Layer("backends", "kernel families and their generated Triton; the CUTLASS export",
          ("backends.*", "export.*")),
    Layer("runtime.host", "the device, the disk cache, background compiles, tolerances, "
                          "shipped defaults, Triton's key kept on disk",
          ("runtime.device", "runtime.cache", "runtime.background", "runtime.verify",
           "runtime.defaults", "runtime.triton_key")),
    Layer("runtime.ops", "the PyTorch operators' schemas and layouts; a call's arguments "
                         "read and sorted into one operator call",
          ("runtime.torch_op", "runtime.eager_autograd", "runtime.calls")),
    Layer("runtime.kernels", "concrete kernels, their launch plans (two passes, split-K), "
                             "discovery, offline compiles",
          ("runtime.two_pass", "runtime.kernel", "runtime.split_k", "runtime.discovery",
           "runtime.offline")),
    Layer("runtime.tuning", "the tuner, background tuning, precompiling",
          ("runtime.background_tuning", "runtime.tuner", "runtime.precompile")),
    Layer("runtime.run", "the operators' eager implementation: cached plans per call",
          ("runtime.run",)),
    Layer("runtime.torch", "autograd formulas, the block operators (MLP, MoE, cross "
                           "entropy), DTensor sharding",
          ("runtime.grad_plan", "runtime.autograd", "runtime.grouped_autograd",
           "runtime.cross_entropy", "runtime.mlp", "runtime.moe", "runtime.splits",
           "runtime.sharding",
           "runtime.dtensor_call")),
    Layer("runtime.api", "gemm, grouped_gemm, fuse: the one-call API",
          ("runtime.api", "runtime")),
    Layer("library", "PyTorch modules, losses, Hugging Face patching, ready epilogues",
          ("gated", "library", "losses", "nn", "hf")),
    Layer("package", "evtfuse itself: the public names",
          ("",)),
    Layer("tools", "the evtfuse command, the benchmark suite, generated docs",
          ("cli.*", "bench.*", "docgen")),
)

# (importer, imported) -> why this upward import is accepted
ALLOWED: dict[tuple[str, str], str] = {}


# ------------------------------------------------------------------ reading the source


def modules(src: Path = SRC, package: str = "evtfuse") -> dict[str, Path]:
    """{dotted name: file} of every module of ``package`` under ``src`` (a package by its
    own name, its ``__init__.py``)."""
    out = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _targets(node: ast.AST, module: str, is_package: bool, known: dict,
             package: str) -> list[str]:
    """The dotted names an import statement (or a literal ``import_module`` call) of
    ``module`` names, within ``package``."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[:len(base) - (node.level - 1)]
            origin = ".".join(base + ([node.module] if node.module else []))
        else:
            origin = node.module or ""
        return [f"{origin}.{a.name}" if f"{origin}.{a.name}" in known else origin
                for a in node.names]
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
            and isinstance(node.args[0].value, str):
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        if name == "import_module" and node.args[0].value.split(".")[0] == package:
            return [node.args[0].value]
    return []


def imports(src: Path = SRC, package: str = "evtfuse") -> dict[str, dict[str, int]]:
    """The import graph: {module: {module it imports: the line of the first such import}},
    over every import the source states (see the module's docstring)."""
    known = modules(src, package)
    graph: dict[str, dict[str, int]] = {}
    for name, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        edges = graph.setdefault(name, {})
        for node in ast.walk(tree):
            for target in _targets(node, name, path.name == "__init__.py", known, package):
                if target.split(".")[0] != package:
                    continue
                while target not in known and "." in target:  # an attribute's module
                    target = target.rsplit(".", 1)[0]
                if target in known and target != name:
                    line = edges.get(target)
                    edges[target] = node.lineno if line is None else min(line, node.lineno)
    return graph


# ------------------------------------------------------------------ the rules


def _matches(pattern: str, module: str, package: str) -> bool:
    full = f"{package}.{pattern}".rstrip(".") if pattern else package
    if full.endswith(".*"):
        base = full[:-2]
        return module == base or module.startswith(base + ".")
    return module == full


def layer_index(layers=LAYERS, package: str = "evtfuse", graph=None) -> dict[str, int]:
    """{module: its layer's position in ``layers``} for the modules of ``graph``."""
    graph = imports() if graph is None else graph
    out = {}
    for m in graph:
        for k, layer in enumerate(layers):
            if any(_matches(p, m, package) for p in layer.modules):
                out.setdefault(m, k)
    return out


def unplaced(graph: dict, layers=LAYERS, package: str = "evtfuse") -> list[str]:
    """Modules in no layer, or in more than one; table entries matching no module."""
    problems = []
    for m in sorted(graph):
        homes = [layer.name for layer in layers
                 if any(_matches(p, m, package) for p in layer.modules)]
        if len(homes) != 1:
            problems.append(f"{m}: in {len(homes)} layers ({', '.join(homes) or 'none'}); "
                            "add it to exactly one of LAYERS (scripts/import_graph.py)")
    for layer in layers:
        for p in layer.modules:
            if not any(_matches(p, m, package) for m in graph):
                problems.append(f"LAYERS[{layer.name!r}] names {p!r}, which is no module")
    return problems


def upward(graph: dict, layers=LAYERS, package: str = "evtfuse",
           allowed: dict | None = None) -> list[str]:
    """Every import of a module of a higher layer (less those ``allowed``), as
    ``importer (layer) line N -> imported (layer)``."""
    allowed = ALLOWED if allowed is None else allowed
    index = layer_index(layers, package, graph)
    out = []
    for m, edges in sorted(graph.items()):
        for t, line in sorted(edges.items()):
            if m in index and t in index and index[t] > index[m] and (m, t) not in allowed:
                out.append(f"{m} ({layers[index[m]].name}) line {line} imports {t} "
                           f"({layers[index[t]].name}), a higher layer")
    return out


def cycles(graph: dict) -> list[list[str]]:
    """The import cycles: each strongly connected set of two or more modules, sorted."""
    order, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):  # Tarjan's algorithm, iterative (no recursion limit to meet)
        work = [(v, iter(sorted(graph.get(v, ()))))]
        order[v] = low[v] = len(order)
        stack.append(v)
        on.add(v)
        while work:
            node, children = work[-1]
            for w in children:
                if w not in order:
                    order[w] = low[w] = len(order)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on:
                    low[node] = min(low[node], order[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == order[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))

    for v in sorted(graph):
        if v not in order:
            visit(v)
    return sorted(found)


def problems(graph: dict | None = None, layers=LAYERS, package: str = "evtfuse",
             allowed: dict | None = None) -> list[str]:
    """Every broken rule, one line each (none: the package is layered)."""
    graph = imports() if graph is None else graph
    out = unplaced(graph, layers, package)
    out += upward(graph, layers, package, allowed)
    out += [f"import cycle among {', '.join(c)}: {' -> '.join(loop(graph, c))}"
            for c in cycles(graph)]
    return out


def loop(graph: dict, members: list[str]) -> list[str]:
    """A shortest import chain from the first of ``members`` (a cycle) back to it."""
    start, inside = members[0], set(members)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph.get(v, ())):
                if w == start:
                    return paths[v] + [start]
                if w in inside and w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    return members


# ------------------------------------------------------------------ the diagram


def _file(m: str, packages: set[str]) -> str:
    """A module as its file is named below src/evtfuse: ``runtime/api``, a package's
    ``runtime/__init__``."""
    return "/".join(m.split(".")[1:] + (["__init__"] if m in packages else []))


def diagram(graph: dict | None = None, layers=LAYERS, package: str = "evtfuse") -> str:
    """The layers top to bottom, each with what it is, its modules (as files below
    src/evtfuse; a subpackage as ``name/``) and the layers its modules import, as the
    import graph has them."""
    graph = imports() if graph is None else graph
    packages = {m for m in graph if any(o.startswith(m + ".") for o in graph)}
    index = layer_index(layers, package, graph)
    lines = textwrap.wrap("bottom to top: " + " < ".join(layer.name for layer in layers), 88,
                          subsequent_indent="    ") + [""]
    for k in range(len(layers) - 1, -1, -1):
        layer = layers[k]
        members = sorted(m for m, i in index.items() if i == k)
        shown = []
        for p in layer.modules:
            if p.endswith(".*"):
                shown.append(p[:-2].replace(".", "/") + "/")
            else:
                shown.extend(_file(m, packages) for m in members if _matches(p, m, package))
        targets = {index[t] for m in members for t in graph[m] if t in index}
        below = sorted(targets - {k}, reverse=True)
        if below:
            uses = "imports " + ", ".join(layers[i].name for i in below)
        else:
            uses = "imports its own layer only" if targets else "imports nothing of evtfuse"
        lines += textwrap.wrap(f"{layer.name}: {layer.what}", 88, subsequent_indent="    ")
        lines += textwrap.wrap(" ".join(shown), 88, initial_indent="    ",
                               subsequent_indent="    ")
        lines += textwrap.wrap(uses, 88, initial_indent="    -> ", subsequent_indent="       ")
    return "\n".join(lines) + "\n"


def doc_copy(text: str) -> str | None:
    """The diagram docs/architecture.md holds (inside its ```text fence), or None."""
    if BEGIN not in text or END not in text:
        return None
    inner = text.split(BEGIN, 1)[1].split(END, 1)[0]
    return inner.strip("\n").removeprefix("```text\n").removesuffix("```") if inner else None


def with_diagram(text: str, drawn: str) -> str:
    """``text`` (docs/architecture.md) with the part between the markers replaced."""
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    return f"{head}{BEGIN}\n```text\n{drawn}```\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true",
                   help="exit 1 on a broken rule or a stale copy in docs/architecture.md")
    p.add_argument("--write", action="store_true",
                   help="rewrite the diagram in docs/architecture.md")
    a = p.parse_args(argv)
    graph = imports()
    drawn = diagram(graph)
    broken = problems(graph)
    for line in broken:
        print(line)
    if a.write:
        DOC.write_text(with_diagram(DOC.read_text(), drawn))
    elif a.check:
        if doc_copy(DOC.read_text()) != drawn:
            print(f"{DOC.relative_to(ROOT)}: the layer diagram is stale: run "
                  "python3 scripts/import_graph.py --write")
            return 1
    else:
        print(drawn, end="")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
