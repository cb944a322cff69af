"""Runtime: kernel discovery, compile cache, autotuning with a persistent cache, launch.

Layer: runtime.api (the package's public names). Its layers, bottom to top: host, ops,
kernels, tuning, run, torch, api (docs/architecture.md; ``scripts/import_graph.py``).
"""

from .api import explain, fuse, gemm, get_kernels, grouped_gemm
from .kernel import Kernel
from .precompile import precompile
from .verify import VerifyResult

__all__ = ["get_kernels", "explain", "gemm", "grouped_gemm", "fuse", "Kernel", "VerifyResult",
           "precompile"]
