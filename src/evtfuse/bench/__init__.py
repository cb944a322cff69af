"""Benchmark suite: evtfuse against cuBLAS, cuBLASLt, eager PyTorch and torch.compile.

Layer: tools (bench, outside the compile pipeline; it only calls the public API). Modules:
``workloads`` (what is measured, pure), ``epilogues`` (the epilogue functions),
``timing`` (GPU measurement), ``runner`` (one cell: every system on one workload and
shape), ``report`` (floor, ratios, targets, JSON, Markdown, chart; pure), ``cli``
(``main``). Run it with ``python benchmarks/run.py`` or ``python -m evtfuse.bench``.
"""

from __future__ import annotations

from .cli import build_parser, main

__all__ = ["main", "build_parser"]
