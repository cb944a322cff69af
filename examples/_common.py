"""Plumbing shared by the examples: where to run, how big, how to check, how to finish.

Each example is a script (``python examples/<name>.py``) that computes its epilogue with
a fused evtfuse kernel, checks every output against plain PyTorch, and exits with status
1 on a mismatch. With a CUDA GPU it runs a larger problem in bf16; without one it runs a
small problem through Triton's CPU interpreter (turned on here, before any kernel is
generated). When no kernel supports an epilogue here, the example prints
``kernel not supported here: <what evtfuse.explain says>``, still checks the reference
evaluator against PyTorch, and exits 0: the reason came from ``explain``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"  # evtfuse.runtime.device.use_interpreter() does this too

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run from a checkout

import evtfuse  # noqa: E402
from evtfuse import EpilogueArguments, GemmArguments, explain, get_kernels  # noqa: E402,F401
from evtfuse.reference import evaluate  # noqa: E402,F401

DEVICE = torch.device("cuda" if ON_GPU else "cpu")
#: inputs and outputs: bf16 on a GPU; fp16 on the CPU (the interpreter mishandles bf16)
DTYPE = torch.bfloat16 if ON_GPU else torch.float16

_failures: list[str] = []
_unsupported: list[str] = []


def size(gpu: tuple[int, ...], cpu: tuple[int, ...]) -> tuple[int, ...]:
    """The problem size for this machine (the CPU interpreter needs small problems)."""
    return gpu if ON_GPU else cpu


def banner(title: str) -> None:
    where = (f"CUDA GPU {torch.cuda.get_device_name()}" if ON_GPU
             else "CPU through Triton's interpreter (no CUDA GPU)")
    print(f"== {title} -- {where}")


_gen = torch.Generator().manual_seed(2025)


def randn(*shape: int, dtype: torch.dtype = None, scale: float = 1.0) -> torch.Tensor:
    """Random normal values made on the CPU (same numbers everywhere), moved to DEVICE."""
    t = torch.randn(*shape, generator=_gen) * scale
    return t.to(dtype or DTYPE).to(DEVICE)


def empty(*shape: int, dtype: torch.dtype = None) -> torch.Tensor:
    """An output buffer filled with NaN, so that an element the kernel never wrote shows."""
    t = torch.empty(*shape, dtype=dtype or DTYPE, device=DEVICE)
    return t.fill_(float("nan")) if t.dtype.is_floating_point else t


def matmul(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """``A @ B`` in fp32 (what the kernel's fp32 accumulator holds)."""
    return torch.matmul(A.float(), B.float())


TOLERANCE = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 2e-2}


def check(name: str, got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype = None,
          tol: float | None = None) -> bool:
    """``got`` equals ``want`` up to the rounding of ``dtype`` (default: got's dtype), or up
    to ``tol`` when given.

    The error is the largest elementwise difference relative to the largest value of
    ``want``; NaN anywhere ``want`` has none (an unwritten element) fails.
    """
    dtype = dtype or got.dtype
    fp8 = "float8" in str(dtype)
    if tol is None:
        tol = 0.07 if fp8 else TOLERANCE.get(dtype, 1e-4)
    if tuple(got.shape) != tuple(want.shape):
        print(f"  FAIL {name}: shape {tuple(got.shape)}, expected {tuple(want.shape)}")
        _failures.append(name)
        return False
    g, w = got.detach().float().cpu(), want.detach().float().cpu()
    nan_bad = int((torch.isnan(g) & ~torch.isnan(w)).sum())
    scale = float(w.abs().max()) if w.numel() else 0.0
    diff = (g - w).abs().nan_to_num(float("inf"))
    err = float(diff.max()) / max(scale, 1e-6) if g.numel() else 0.0
    ok = nan_bad == 0 and err <= tol
    nan_note = f", {nan_bad} NaN (unwritten?)" if nan_bad else ""
    print(f"  {'ok  ' if ok else 'FAIL'} {name}: max error {err:.2e} of max |value| "
          f"{scale:.3g} (tol {tol:.0e}){nan_note}")
    if not ok:
        _failures.append(name)
    return ok


def fused(args: GemmArguments):
    """Run the best kernel for ``args`` (outputs written in place) and return it, or print
    why no kernel supports it (``kernel not supported here: ...``) and return None."""
    kernels = get_kernels(args)
    if not kernels:
        why = explain(args).strip()
        if not why:
            raise RuntimeError("get_kernels() found no kernel and explain() gave no reason")
        print("kernel not supported here: " + why.replace("\n", "\n    "))
        _unsupported.append(why)
        return None
    kernel = kernels[0]
    kernel.run(args)
    if ON_GPU:
        torch.cuda.synchronize()
    print(f"  kernel: {kernel.name}")
    return kernel


def check_reference(args_or_epi, accum: torch.Tensor | None, want: dict[str, torch.Tensor]) -> None:
    """The reference evaluator's reading of the epilogue against plain PyTorch (the part
    that can be verified when no kernel runs it yet)."""
    ref = evaluate(args_or_epi, accum) if accum is not None else evaluate(args_or_epi)
    for name, w in want.items():
        check(f"reference {name}", ref[name], w)


def finish() -> None:
    """Exit 1 if any check failed; say how the example ended."""
    if _failures:
        print(f"FAILED: {', '.join(_failures)}")
        sys.exit(1)
    if _unsupported:
        print("OK (reference verified; no fused kernel runs this here, see above)")
    else:
        print("OK")
    sys.exit(0)
