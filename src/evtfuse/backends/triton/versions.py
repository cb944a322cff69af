"""What differs between the Triton releases evtfuse supports, in one table.

Layer: backends/triton. Invariant: nothing else in evtfuse compares Triton version
numbers. When a release changes an API evtfuse uses, the change becomes one row of
``CHANGES`` (what it is, the first release with the new form, the form before and after),
and the emitter or launcher that needs it asks ``spelling(name)`` or ``has(name)``.
Behaviours that evtfuse works around the same way on every release (so no version test is
needed in the code) are listed in ``WORKAROUNDS``, so that whoever meets them in the code
finds the reason here. ``TESTED`` names the releases the test tiers run on; a Triton
outside ``SUPPORTED`` gets a warning at import (``check_installed``).

Sources: each release's ``triton/experimental/gluon/language`` and
``triton/backends/nvidia/driver.py`` (3.6.0, 3.7.1, 3.8.0, 3.9.0).
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from functools import lru_cache

# releases the CPU tier (CI) and the GPU tier run on; pyproject.toml's "triton>=3.6,<3.10"
TESTED = ("3.6.0", "3.7.1", "3.8.0", "3.9.0")
SUPPORTED = ((3, 6), (3, 10))  # first supported release, first release not supported


@dataclass(frozen=True)
class Change:
    """One API difference: ``before`` up to the release before ``since``, ``after`` from it."""

    since: tuple[int, int]
    before: str
    after: str
    what: str


CHANGES: dict[str, Change] = {
    # Gluon (the warp-specialized Hopper kernels, gluon_codegen.py)
    "tma_load": Change(
        (3, 8), "tma.async_copy_global_to_shared", "tma.async_load",
        "Gluon's TMA tile load, global -> shared memory; 3.8 added the new name, 3.9 "
        "removed the old one (same arguments)"),
    "tma_store": Change(
        (3, 8), "tma.async_copy_shared_to_global", "tma.async_store",
        "Gluon's TMA tile store, shared -> global memory; 3.8 added the new name, 3.9 "
        "removed the old one (same arguments)"),
    "cta_barrier": Change(
        (3, 7), "gl.thread_barrier", "gl.barrier",
        "Gluon's barrier of the warps that run the code (bar.sync); 3.7 renamed it and "
        "added barrier(cluster=True)"),
    # the compiled kernel's launcher (launch.py)
    "c_launcher": Change(
        (3, 7), "flat", "packed",
        "Triton's C launch function below CudaLauncher. flat (3.6): one module per kernel, "
        "launch(grid x3, stream, function, cooperative, pdl, global scratch, profile "
        "scratch, kernel metadata, launch metadata, enter hook, exit hook, *kernel args). "
        "packed (3.7+): one function for every kernel (driver.utils.launch): launch(grid "
        "x3, stream, function, cooperative, pdl, kernel metadata, launch metadata, enter "
        "hook, exit hook, global scratch, profile scratch, the launcher's arg_annotations, "
        "its kernel_signature, tuple of kernel args); TMA descriptors encoded by "
        "make_tensordesc_arg(desc, meta) (3.7) or make_tensordesc_arg(desc, meta, base "
        "args) (3.8+)"),
    "tensordesc_arg_base": Change(
        (3, 8), "no", "yes",
        "whether nvidia.driver.make_tensordesc_arg takes a third argument (the launch's "
        "base arguments, unused for tiled descriptors)"),
    # the CPU interpreter (CPU tests, `evtfuse demo` without a GPU)
    "interpreter_numpy": Change(
        (3, 7), "numpy<2.3", "any numpy",
        "the numpy Triton's CPU interpreter works with: 3.6's fails on numpy >= 2.3 "
        "('only 0-dimensional arrays can be converted to Python scalars'); the "
        "interpreter target refuses that pair with a message (interpreter_refusal)"),
    "interpreter_fma": Change(
        (3, 9), "a * b + c, rounded twice", "fused, rounded once",
        "tl.fma (the multiply_add row) under the CPU interpreter: 3.9 computes it fused, as "
        "a GPU does; earlier releases round the product first (the special-value tests "
        "expect the fused result where is_new says so)"),
}

# Compile options evtfuse passes on every launch, whatever the release's default:
# enable_fp_fusion (a * b + c contracted to FMA, what the kernels are tuned and tested
# with) was on by default through 3.9, which warns that 3.10 turns it off.
LAUNCH_OPTIONS = {"enable_fp_fusion": True}

# Behaviours handled the same way on every supported release (no version test needed).
WORKAROUNDS: dict[str, str] = {
    "interpreter_scalar_and": (
        "Triton 3.9's CPU interpreter gives `i1 tensor & i1 scalar` (a mask combined with a "
        "scalar loop condition) integer data that tl.load refuses as a mask ('mask has "
        "unsupported dtype'); the emitters write such masks as `(a & b) != 0`, which the "
        "GPU compiler folds away (epilogue_emit.py, the combine of reduction partials)"),
    "uint8_dot": (
        "tl.dot takes no unsigned 8-bit operands in any supported release (semantic.py's "
        "dot: 'only int8 supported!'; 3.6.0 and 3.9.0 read); fp16 and fp8 operands take "
        "out_dtype=tl.float16 in all of them. The portable kernel runs uint8 as int8 with "
        "offset sums (codegen._u8_lines)"),
    "gluon_multicast": (
        "3.7 added TMA multicast (async_load(..., multicast=True)) and cluster barriers to "
        "Gluon on Hopper: a mainloop sharing A/B tiles across a CTA cluster became "
        "expressible (not used yet; benchmarks/HISTORY.md)"),
}


def async_compile_mode():
    """Triton's ``AsyncCompileMode`` (a context in which a JIT function's ``warmup`` hands
    its compile to an executor: ``runtime.tuner`` compiles candidates in threads), or None.
    The same private module and constructor in every tested release (3.9 adds a cleanup
    step inside it); None where it is gone, or while another one is active (the caller's:
    they do not nest), and candidates compile one by one."""
    try:
        from triton.runtime._async_compile import AsyncCompileMode, active_mode
    except ImportError:
        return None
    return None if active_mode.get() is not None else AsyncCompileMode


def parse(version: str) -> tuple[int, int, int]:
    """``"3.7.1+git..."`` -> (3, 7, 1)."""
    parts = [int(p) for p in re.findall(r"\d+", version.split("+")[0])[:3]]
    return tuple(parts + [0] * (3 - len(parts)))  # type: ignore[return-value]


@lru_cache(maxsize=None)
def installed() -> tuple[int, int, int]:
    """The running Triton's version."""
    import triton

    return parse(triton.__version__)


def is_new(name: str, version: tuple[int, ...] | None = None) -> bool:
    """Whether ``version`` (default: the running Triton) has change ``name``'s new form."""
    return tuple((version or installed())[:2]) >= CHANGES[name].since


def spelling(name: str, version: tuple[int, ...] | None = None) -> str:
    """Change ``name``'s form for ``version`` (default: the running Triton)."""
    change = CHANGES[name]
    return change.after if is_new(name, version) else change.before


def gluon_names(version: tuple[int, ...] | None = None) -> dict[str, str]:
    """The Gluon spellings the emitter writes, by change name."""
    return {n: spelling(n, version) for n in ("tma_load", "tma_store", "cta_barrier")}


def interpreter_refusal() -> str | None:
    """Why Triton's CPU interpreter cannot run evtfuse's kernels here, or None."""
    if is_new("interpreter_numpy"):
        return None
    import numpy
    import triton

    if parse(numpy.__version__)[:2] < (2, 3):
        return None
    return (f"Triton {triton.__version__}'s CPU interpreter needs numpy<2.3 (installed: "
            f"numpy {numpy.__version__}): pip install 'numpy<2.3', or use Triton >= 3.7")


def supported(version: tuple[int, ...] | None = None) -> bool:
    lo, hi = SUPPORTED
    return lo <= tuple((version or installed())[:2]) < hi


def range_text() -> str:
    (a, b), (c, d) = SUPPORTED
    return f"triton>={a}.{b},<{c}.{d}"


def _installed_text() -> str | None:
    """The installed Triton's version as its package metadata says, without importing it
    (importing Triton before ``TRITON_INTERPRET`` is set would make its library functions
    compiled ones, which the CPU interpreter cannot call)."""
    from importlib import metadata

    for dist in ("triton", "pytorch-triton"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def check_installed(version: str | None = None) -> str | None:
    """A warning (also returned) when the installed Triton (or ``version``) is outside
    ``SUPPORTED``; runs at ``import evtfuse`` and does not import Triton."""
    import sys

    text = version or (sys.modules["triton"].__version__ if "triton" in sys.modules
                       else _installed_text())
    if text is None or supported(parse(text)):
        return None
    text = (f"evtfuse is tested with {range_text()} ({', '.join(TESTED)}); the installed "
            f"Triton is {text}: kernels may fail to compile or launch. "
            f"Install a tested release, e.g. the one your PyTorch pins.")
    warnings.warn(text, RuntimeWarning, stacklevel=3)
    return text
