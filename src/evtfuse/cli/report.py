"""Running a problem for the cli: choosing the kernel, running, verifying, timing, reporting.

Layer: cli. Reaches the runtime only through the public API (``get_kernels``, ``explain``,
the tuner's ``choose_kernel``, ``Kernel.compile/run/verify``, ``evtfuse.reference``);
``format_report`` is the text ``run`` and ``demo`` print.
"""

from __future__ import annotations

import functools
import textwrap
from dataclasses import dataclass
from typing import Any, Callable

from .base import EXIT_MISSING, EXIT_UNSUPPORTED, CliError, log
from .device import Device, time_ms


def _api():
    """The evtfuse runtime API (get_kernels, explain); a clear error when it is not there."""
    import evtfuse

    missing = [n for n in ("get_kernels", "explain") if not hasattr(evtfuse, n)]
    if missing:
        raise CliError("the kernel runtime is not available in this evtfuse "
                       f"(evtfuse.{missing[0]} is missing); only the reference evaluator can run",
                       EXIT_MISSING)
    return evtfuse


@dataclass
class RunReport:
    kernel: str
    ok: bool | None
    verify_text: str
    fused_ms: float | None
    eager_ms: float | None

    @property
    def speedup(self) -> float | None:
        if self.fused_ms and self.eager_ms:
            return self.eager_ms / self.fused_ms
        return None


TUNE_MODES = ("fast", "exhaustive", "none")


def choose_kernel(args: Any, name_filter: str | None = None, tune: str = "none"):
    """The kernel to run: the first ``get_kernels`` offers whose name contains
    ``name_filter``; else, with ``tune`` "fast"/"exhaustive", the autotuner's choice (timed
    once per problem and kept in the cache, as ``evtfuse.gemm`` does); else the first."""
    api = _api()
    if tune not in TUNE_MODES:
        raise CliError(f"--tune is one of {', '.join(TUNE_MODES)}, not '{tune}'")
    kernels = api.get_kernels(args)
    if name_filter:
        kernels = [k for k in kernels if name_filter in k.name]
    if not kernels:
        why = api.explain(args)
        extra = f" named like '{name_filter}'" if name_filter else ""
        raise CliError(f"no kernel{extra} supports this problem:\n{textwrap.indent(why, '  ')}",
                       EXIT_UNSUPPORTED)
    log.info("kernels offered: %s", ", ".join(k.name for k in kernels))
    if tune != "none" and not name_filter:
        from ..runtime.tuner import choose_kernel as tuned_choice

        kernel = tuned_choice(args, tune=tune)
        log.info("tuner (%s) chose %s", tune, kernel.name)
        return kernel
    return kernels[0]


def run_and_report(args: Any, kernel: Any, device: Device, *, eager: Callable[[], Any] | None,
                   verify: bool, iterations: int, warmup: int) -> RunReport:
    """Run ``kernel`` on ``args`` (timed), verify against the reference, time ``eager``."""
    kernel.compile(args)
    verify_text, ok = "", None
    if verify:
        result = kernel.verify(args)
        ok = bool(result)
        verify_text = result.report()
    fused_ms = eager_ms = None
    if iterations > 0:
        fused_ms = time_ms(lambda: kernel.run(args), device, iterations, warmup)
        if eager is not None:
            eager_ms = time_ms(eager, device, iterations, warmup)
    return RunReport(kernel.name, ok, verify_text, fused_ms, eager_ms)


def format_report(rep: RunReport, flops: float | None, device: Device) -> list[str]:
    lines = [f"kernel:   {rep.kernel}"]
    if rep.ok is not None:
        lines.append("verify:   " + ("PASSED" if rep.ok else "FAILED") + " against evtfuse.reference")
        lines += ["          " + ln.strip() for ln in rep.verify_text.splitlines()[1:]]
    if rep.fused_ms is not None:
        t = f"time:     fused {rep.fused_ms:.3f} ms"
        if flops and not device.interpreter:
            t += f" ({flops / rep.fused_ms / 1e9:.1f} TFLOP/s)"
        if rep.eager_ms is not None:
            t += f" | eager torch {rep.eager_ms:.3f} ms"
            if not device.interpreter:
                t += f" | speedup {rep.speedup:.2f}x"
        lines.append(t)
        if device.interpreter:
            lines.append("          (Triton's CPU interpreter: timings are not meaningful and no "
                         "speedup is reported; run on a CUDA GPU)")
    return lines


def eager_of(args: Any) -> Callable[[], Any]:
    """Unfused PyTorch: ``A @ B`` in its dtype, then the epilogue op by op (reference
    evaluator). ``torch.matmul`` has no fp8 and no CUDA int8 form: fp8 goes through
    ``torch._scaled_mm`` (fp32 out, the same accumulation mode), CUDA int8 through
    ``torch._int_mm``, as a PyTorch user writes them; shapes those refuse (batches, sizes
    off their multiples of 16 / 8) through fp32."""
    import torch

    from ..optable import FP8_DTYPES
    from ..reference import evaluate

    A, B = args.A, args.B
    if A.dtype in FP8_DTYPES:
        one = torch.ones((), device=A.device)
        product = functools.partial(torch._scaled_mm, A, B, scale_a=one, scale_b=one,
                                    out_dtype=torch.float32, use_fast_accum=args.fp8_fast_accum)
    elif A.dtype == torch.int8 and A.is_cuda:
        product = functools.partial(torch._int_mm, A, B)
    else:
        product = functools.partial(torch.matmul, A, B)
    try:
        product()
    except (RuntimeError, NotImplementedError):  # a form the special kernels refuse
        wide = torch.float32 if A.dtype.itemsize == 1 else A.dtype

        def product():  # the conversion is part of what eager PyTorch does per call
            return torch.matmul(A.to(wide), B.to(wide))

    def eager():
        return evaluate(args, accum=product())

    return eager
