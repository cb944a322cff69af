"""The python blocks of a docs page, run as one script on the CPU interpreter (imported by
name by the test modules that run a page: tests/test_docs.py, tests/test_hf.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


def run_page(page: str, tmp_path: Path, must_hold: tuple[str, ...], tail: str = "",
             timeout: int = 600) -> str:
    """Run docs/<page>'s blocks, after them ``tail``; fail unless the page holds every
    string of ``must_hold`` and the script ends cleanly. Returns its stdout."""
    code = "\n".join(python_blocks(ROOT / "docs" / page))
    for text in must_hold:
        assert text in code, f"docs/{page} lost {text!r}"
    script = tmp_path / (page.replace(".", "_") + ".py")
    script.write_text(code + "\n" + tail + "\nprint('PAGE OK')\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), TRITON_INTERPRET="1",
               CUDA_VISIBLE_DEVICES="", EVTFUSE_CACHE_DIR=str(tmp_path / "cache"))
    res = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                         timeout=timeout)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "PAGE OK" in res.stdout
    return res.stdout
