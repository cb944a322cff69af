"""Ahead-of-time compiles and tunings: ``evtfuse.precompile(problems)`` (and the
``evtfuse precompile`` command, which builds the problems from its flags or a file).

Layer: runtime.tuning, above ``runtime.tuner``. For each problem (``GemmArguments``): on a GPU the
tuner's choice is made as a first ``evtfuse.gemm`` call would make it (``tune``: "fast",
"exhaustive" or "none"; stored in the cache, so that a later process or rank reads it), and
the chosen kernel is compiled and run once on scratch outputs, which puts its binary in
Triton's cache; under Triton's CPU interpreter nothing is timed and the first kernel's
module is generated into the cache. A problem no kernel supports is reported, not raised,
so that one bad entry does not stop the others.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterable

import torch

from ..arguments import GemmArguments
from ..errors import EpilogueError, UnsupportedError
from ..ir import dtype_name
from . import cache, tuner
from .kernel import scratch_arguments

PRECOMPILE_MODES = ("fast", "exhaustive", "none")


@dataclass(frozen=True)
class Precompiled:
    """What ``precompile`` did for one problem: its ``kernel`` (None if it failed) and
    ``how``: "cached" (the class's choice was on disk or in this process), "tuned" (timed
    now and stored), "compiled" (no timing: "none", one kernel, or the interpreter) or
    "failed" (``error`` says why)."""

    problem: str
    kernel: str | None
    how: str
    seconds: float
    error: str | None = None

    def line(self) -> str:
        if self.kernel is None:
            return f"{self.problem}: failed: {self.error}"
        return f"{self.problem}: {self.kernel} ({self.how}) in {self.seconds:.2f} s"


def describe(args: GemmArguments) -> str:
    """A problem in a few words: epilogue, M x N x K x L, input dtype (grouped: G groups)."""
    where = "" if args.offs is None else f", {args.offs.shape[0]} groups over {args.group_dim}"
    return (f"{args.epilogue.parsed.name} {args.M}x{args.N}x{args.K}x{args.L} "
            f"{dtype_name(args.A.dtype)}{where}")


def precompile(problems: Iterable[GemmArguments], tune: str = "fast", cc: int | None = None,
               progress: Callable[[int, int, Precompiled], None] | None = None
               ) -> list[Precompiled]:
    """Choose (on a GPU: tune) and compile each problem's kernel into the caches, in order;
    ``progress(i, n, result)`` after each (1-based). Returns one ``Precompiled`` each."""
    if tune not in PRECOMPILE_MODES:
        raise ValueError(f"precompile's tune must be 'fast', 'exhaustive' or 'none' (the "
                         f"tuning is done now, not in the background), not {tune!r}")
    problems = list(problems)
    for i, p in enumerate(problems):
        if not isinstance(p, GemmArguments):
            raise TypeError(f"precompile takes GemmArguments; problem {i} is a "
                            f"{type(p).__name__}")
    results = []
    for i, args in enumerate(problems, 1):
        results.append(_one(args, tune, cc))
        if progress is not None:
            progress(i, len(problems), results[-1])
    return results


def _one(args: GemmArguments, tune: str, cc) -> Precompiled:
    t0 = time.perf_counter()
    name = describe(args)
    key = tuner.tuning_key(args, tune, cc)
    had = tune != "none" and (key in tuner._records or cache.load_choice(key) is not None)
    try:
        kernel = tuner.choose_kernel(args, tune, cc)
        _compile(kernel, args)
    except (UnsupportedError, EpilogueError) as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        return Precompiled(name, None, "failed", time.perf_counter() - t0, first)
    if had:
        how = "cached"
    elif tune != "none" and key in tuner._records:
        how = "tuned"
    else:
        how = "compiled"
    return Precompiled(name, kernel.name, how, time.perf_counter() - t0)


def _compile(kernel, args: GemmArguments) -> None:
    """On a GPU: one run on scratch outputs (Triton compiles the binary into its cache;
    the user's outputs are not touched); under the interpreter: the generated module."""
    if args.A.device.type == "cuda":
        kernel.run(scratch_arguments(args))
        torch.cuda.synchronize(args.A.device)
    else:
        kernel.compile(args)


__all__ = ["precompile", "Precompiled", "describe", "PRECOMPILE_MODES"]
