"""Run a script with Triton's CPU interpreter off and read back its JSON result, for the
CPU tier's offline sm_90 compiles (``runtime.offline``): under the interpreter, which the
tier switches on, Triton's own library functions cannot be compiled."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def run_offline(script: str, timeout: int = 900) -> dict:
    """Run ``script`` (it prints ``RESULT`` + a JSON object) in a fresh interpreter without
    ``TRITON_INTERPRET``; the object, or an assertion naming what the script printed."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")]
    assert lines, f"offline compile script failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT"):])
