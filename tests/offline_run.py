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


def check_epilogue_registers(got: list[dict]) -> None:
    """Offline compiles of a heavy epilogue's hopper candidates (each a dict with its
    ``registers``, ``hopper_family._epilogue_registers``, and ``spills``, local-memory
    accesses), in the order offered: the first within ``EPILOGUE_REGISTERS`` and without
    spills, and no spilled tile (100 accesses or more) in any candidate within the count."""
    from evtfuse.backends.triton.hopper_family import EPILOGUE_REGISTERS

    assert got[0]["registers"] <= EPILOGUE_REGISTERS and got[0]["spills"] == 0, got
    assert all(c["spills"] < 100 for c in got if c["registers"] <= EPILOGUE_REGISTERS), got
