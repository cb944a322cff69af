"""evtfuse: custom GEMM epilogues, written as Python functions, fused into one GPU kernel.

Public API (docs/architecture.md): ``EpilogueArguments``, ``GemmArguments``, ``get_kernels``,
``explain``, ``gemm``, ``grouped_gemm``, ``fuse``, ``precompile``, ``linear_cross_entropy``,
``interleave_gate_up`` (gated epilogues); ``evtfuse.ops`` (relu, gelu, ...) and
``evtfuse.reference.evaluate``.

Layer: package, above everything it re-exports (the runtime, the library's modules); only
the tools (``evtfuse.cli``, ``evtfuse.bench``) import it (docs/architecture.md).
"""

from __future__ import annotations

from .version import __version__
from . import logs, ops, reference  # noqa: F401
from .arguments import EpilogueArguments, GemmArguments
from .backends.triton.versions import check_installed
from .errors import EpilogueError, Status, UnsupportedError
from .runtime import (Kernel, VerifyResult, explain, fuse, gemm, get_kernels, grouped_gemm,
                      precompile)
from .losses import linear_cross_entropy
from .gated import interleave_gate_up, split_gate_up
from . import nn  # noqa: E402,F401  (evtfuse.nn.Linear; needs the runtime above)

logs.setup_from_environment()
check_installed()  # a warning when the installed Triton is outside the tested range

__all__ = ["EpilogueArguments", "GemmArguments", "EpilogueError", "Status", "UnsupportedError",
           "Kernel", "VerifyResult", "get_kernels", "explain", "gemm", "grouped_gemm", "fuse",
           "precompile",
           "linear_cross_entropy", "interleave_gate_up", "split_gate_up", "ops",
           "reference", "nn", "__version__"]
