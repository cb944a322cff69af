"""Runtime: kernel discovery, compile cache, autotuning with a persistent cache, launch."""

from .api import explain, fuse, gemm, get_kernels, grouped_gemm
from .kernel import Kernel
from .precompile import precompile
from .verify import VerifyResult

__all__ = ["get_kernels", "explain", "gemm", "grouped_gemm", "fuse", "Kernel", "VerifyResult",
           "precompile"]
