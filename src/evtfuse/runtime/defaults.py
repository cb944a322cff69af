"""Shipped tuning defaults: the kernels the benchmark suite's tuning picked, per GPU and
shape, so that a first call times a few likely winners instead of every candidate.

Layer: runtime.host (imports nothing of evtfuse), read by ``tuner.choose_kernel``.
``defaults.json`` (package data, written by ``scripts/defaults_table.py`` from the suite's
results) holds, for each measured GPU, input dtype and problem shape, the kernels the
tuner chose for the suite's epilogues at that shape, most often chosen first.
``suggestions`` returns those of the nearest measured shape (M, N and K each within a
factor of two together: the sum of their log2 distances at most ``MAX_DISTANCE``), for the
same GPU (by name; else one of the same compute capability and SM count), or nothing. A
suggestion the families do not offer for the problem (another epilogue's tile variant) is
simply not used.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

DEFAULTS_FILE = Path(__file__).with_name("defaults.json")
MAX_DISTANCE = 1.0  # log2 units over M, N and K together
FORMAT = 1


@functools.lru_cache(maxsize=1)
def _entries() -> tuple[dict, ...]:
    try:
        data = json.loads(DEFAULTS_FILE.read_text())
    except (OSError, ValueError):
        return ()
    if data.get("format") != FORMAT:
        return ()
    return tuple(data.get("entries", ()))


def _distance(a: tuple[int, int, int], b: tuple[int, int, int]) -> float:
    return sum(abs(math.log2(max(x, 1)) - math.log2(max(y, 1))) for x, y in zip(a, b))


def suggestions(gpu: str, cc: str, sms: int, dtype: str, shape: tuple[int, int, int],
                entries: tuple[dict, ...] | None = None) -> list[str]:
    """The kernel names measured best nearest ``shape`` (M, N, K) on this GPU for inputs of
    ``dtype`` (e.g. "torch.bfloat16"), most often chosen first; [] where none is near."""
    entries = _entries() if entries is None else entries
    same = [e for e in entries if e["dtype"] == dtype and e["gpu"] == gpu]
    if not same:  # another GPU of the same kind (compute capability and SM count)
        same = [e for e in entries if e["dtype"] == dtype and e["cc"] == cc and e["sms"] == sms]
    best, best_d = None, MAX_DISTANCE
    for e in same:
        d = _distance(shape, tuple(e["shape"]))
        if d <= best_d:
            best, best_d = e, d
    return list(best["kernels"]) if best else []


__all__ = ["suggestions", "DEFAULTS_FILE", "MAX_DISTANCE", "FORMAT"]
