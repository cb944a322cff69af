"""The fenced code blocks of a docs page, and a page's python blocks run as one script (on
the CPU interpreter, or on the GPU for the GPU tier). Imported by name by the test modules
that run pages: tests/test_doc_blocks.py (which states the convention for blocks and checks
that every block is covered), tests/test_docs.py, tests/test_hf.py,
tests/test_distributed_lce.py, tests/test_round3_validation.py, tests/gpu/test_gpu_docs.py.

A block's info string says what happens to it: ``python`` runs in the CPU tier, ``python
gpu`` in the GPU tier, ``python no-run`` is shown only, ``pycon`` is a console session run
as a doctest."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.M | re.S)


class Block(NamedTuple):
    info: str  # the info string after the fence: "python", "python gpu", "bash", ...
    code: str
    line: int  # of the opening fence, 1-based


def page_path(page: str) -> Path:
    """``"quickstart.md"`` -> docs/quickstart.md; ``"README.md"``, ``"docs/x.md"`` -> as is."""
    return ROOT / page if (page == "README.md" or "/" in page) else ROOT / "docs" / page


def blocks(path: Path) -> list[Block]:
    text = path.read_text()
    return [Block(m.group(1).strip(), m.group(2), text.count("\n", 0, m.start()) + 1)
            for m in FENCE.finditer(text)]


def python_blocks(path: Path, info: str = "python") -> list[str]:
    """The code of the blocks tagged exactly ``info`` (``python``: the CPU tier's)."""
    return [b.code for b in blocks(path) if b.info == info]


def run_page(page: str, tmp_path: Path, must_hold: tuple[str, ...], tail: str = "",
             timeout: int = 600, setup: str = "", gpu: bool = False) -> str:
    """Run the page's ``python`` blocks (``python gpu`` ones with ``gpu=True``, on the GPU)
    as one script, after ``setup`` and before ``tail``; fail unless the page holds every
    string of ``must_hold`` and the script ends cleanly. Returns its stdout."""
    path = page_path(page)
    code = "\n".join(python_blocks(path, "python gpu" if gpu else "python"))
    assert code, f"{path.relative_to(ROOT)} has no block to run"
    for text in must_hold:
        assert text in code, f"{path.relative_to(ROOT)} lost {text!r}"
    script = tmp_path / (page.replace("/", "_").replace(".", "_") + ".py")
    script.write_text(setup + "\n" + code + "\n" + tail + "\nprint('PAGE OK')\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"),
               EVTFUSE_CACHE_DIR=str(tmp_path / "cache"))
    if not gpu:
        env.update(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    res = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                         timeout=timeout)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "PAGE OK" in res.stdout
    return res.stdout
