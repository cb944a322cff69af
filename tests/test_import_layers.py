"""The package's layers import downward only: every module of src/evtfuse belongs to one
layer of ``scripts/import_graph.py``'s ``LAYERS`` (the one place the order is written,
bottom to top), imports nothing of a higher layer (module-level and function-level
imports alike, relative or absolute), and no import chain comes back to where it started.
The checker itself is checked on a made-up package that breaks each rule, and the diagram
in docs/architecture.md must be the one the script draws from the import graph now.
CPU only; reads the source with ``ast``, imports none of it.
"""

from __future__ import annotations

import pytest
from script_module import load_script

ig = load_script("import_graph")


@pytest.fixture(scope="module")
def graph():
    return ig.imports()


def test_every_module_is_in_exactly_one_layer(graph):
    assert "evtfuse.runtime.api" in graph and "evtfuse" in graph  # the reader found them
    assert ig.unplaced(graph) == []


def test_no_import_climbs_the_layers(graph):
    assert ig.upward(graph) == []


def test_no_import_cycle(graph):
    assert ig.cycles(graph) == []


def test_the_allowed_upward_imports_are_real_and_explained(graph):
    """Each exception of ``ALLOWED`` is an import that exists and climbs (a stale one
    fails), with its reason; there are none today."""
    index = ig.layer_index(graph=graph)
    for (importer, imported), why in ig.ALLOWED.items():
        assert imported in graph.get(importer, {}), f"{importer} no longer imports {imported}"
        assert index[imported] > index[importer], f"{importer} -> {imported} does not climb"
        assert why.strip(), f"{importer} -> {imported}: say why"
    assert len(ig.ALLOWED) == 0


def test_the_checker_catches_what_it_must(tmp_path):
    """A made-up package with a lazy upward import, a cycle through a relative ``..`` import
    and an absolute one, an ``import_module`` call, an import under TYPE_CHECKING, a module in
    no layer and a table entry naming no module: each is found, and only those."""
    pkg = tmp_path / "fakepkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "from .top import run\n",
        "base.py": "",
        "low.py": "def f():\n    from .top import run  # lazy, and upward\n    return run\n",
        "typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .top import run\n",
        "mid.py": "from fakepkg.sub import leaf\n",
        "top.py": "import fakepkg.mid\n\ndef run():\n    return fakepkg.mid\n",
        "stray.py": "import os\n",
        "sub/__init__.py": "",
        "sub/leaf.py": ("import importlib\nfrom .. import mid\n\n"
                        "def g():\n    return importlib.import_module('fakepkg.base')\n"),
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    graph = ig.imports(tmp_path, "fakepkg")
    assert graph["fakepkg.low"] == {"fakepkg.top": 2}  # the function-level import
    assert set(graph["fakepkg.sub.leaf"]) == {"fakepkg.mid", "fakepkg.base"}
    assert set(graph["fakepkg.top"]) == {"fakepkg.mid"}
    assert set(graph["fakepkg"]) == {"fakepkg.top"}
    layers = (ig.Layer("bottom", "", ("base", "low", "typed", "gone")),
              ig.Layer("middle", "", ("mid", "sub.*")),
              ig.Layer("top", "", ("top", "")))
    found = ig.problems(graph, layers, "fakepkg", allowed={})
    assert len(found) == 5, found
    assert any(p.startswith("fakepkg.stray: in 0 layers") for p in found)
    assert any("names 'gone', which is no module" in p for p in found)
    assert any(p.startswith("fakepkg.low (bottom) line 2 imports fakepkg.top (top)")
               for p in found)
    assert any(p.startswith("fakepkg.typed (bottom) line 3 imports fakepkg.top") for p in found)
    cycle = [p for p in found if p.startswith("import cycle")]
    assert cycle == ["import cycle among fakepkg.mid, fakepkg.sub.leaf: fakepkg.mid -> "
                     "fakepkg.sub.leaf -> fakepkg.mid"]
    allowed = {("fakepkg.low", "fakepkg.top"): "a test"}
    assert len(ig.problems(graph, layers, "fakepkg", allowed=allowed)) == 4


def test_architecture_md_shows_the_layers_as_they_are(graph):
    drawn = ig.diagram(graph)
    assert ig.doc_copy(ig.DOC.read_text()) == drawn, \
        "docs/architecture.md's layer diagram is stale: run python3 scripts/import_graph.py --write"
    for layer in ig.LAYERS:
        assert f"\n{layer.name}: " in drawn
    assert ig.main(["--check"]) == 0
