#!/usr/bin/env python3
"""Run the evtfuse benchmark suite from a source checkout: ``python benchmarks/run.py --help``.

A thin wrapper: puts ../src on sys.path and calls ``evtfuse.bench.main``.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "src"))

from evtfuse.bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
