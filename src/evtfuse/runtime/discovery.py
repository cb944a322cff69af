"""Kernel discovery: ``get_kernels`` and ``explain``.

Layer: runtime.kernels, above ``runtime.kernel`` (whose ``kernels_for`` it re-exports) and
below ``runtime.tuner`` (which chooses among the kernels found here). ``get_kernels`` finds
the arguments' target and asks every family whether it supports them
(``kernel.kernels_for``: their configurations as ``Kernel`` objects, best first, one object
per family, config and target, kept for the process), with split-K kernels where
``runtime.split_k`` offers them; ``explain`` says why each family
does or does not. ``runtime.api`` re-exports the public
names (``evtfuse.get_kernels``, ``evtfuse.explain``).
"""

from __future__ import annotations

import warnings

from ..arguments import GemmArguments
from ..errors import UnsupportedError
from ..backends.triton.families import FAMILIES, INTERPRETER, Target
from .device import interpreter_enabled, sm_count, target_of
from .kernel import Kernel, alternate_families, kernels_for, order_by_fill  # noqa: F401
from .split_k import factors as split_k_factors, refusal as split_k_refusal, with_split_k
from .two_pass import judged, plan_name

def _target(args: GemmArguments, cc: int | None) -> Target:
    kind, cc_value = target_of(args.A.device, cc)
    if kind == INTERPRETER and not interpreter_enabled():
        kind = "none"
    return Target(kind, cc_value, args.A.device, sm_count(args.A.device))


NO_INTERPRETER = ("A is on the CPU and Triton's CPU interpreter is off, so no kernel can run "
                  "it: call evtfuse.runtime.device.use_interpreter() (or set "
                  "TRITON_INTERPRET=1 in the environment) before evtfuse compiles its first "
                  "kernel in the process, or use CUDA tensors")


def _no_target_reason(target: Target) -> str | None:
    if target.kind == "none":
        return NO_INTERPRETER
    return None


def no_device_error(args: GemmArguments, cc: int | None = None) -> UnsupportedError | None:
    """The error for arguments no kernel can run wherever they are (CPU tensors with Triton's
    interpreter off), saying what to do in its first line; None otherwise."""
    why = _no_target_reason(_target(args, cc))
    return None if why is None else UnsupportedError(why)


_warned_no_interpreter = False


def get_kernels(args: GemmArguments, cc: int | None = None) -> list[Kernel]:
    """Kernels that support ``args``, best first; ``[]`` when none does (see ``explain``).
    CPU tensors with Triton's interpreter off get ``[]`` and, once per process, a warning
    saying how to turn the interpreter on (``get_kernels(args)[0]`` fails next)."""
    global _warned_no_interpreter
    target = _target(args, cc)
    if _no_target_reason(target):
        if not _warned_no_interpreter:
            _warned_no_interpreter = True
            warnings.warn(f"evtfuse.get_kernels: {NO_INTERPRETER}", stacklevel=2)
        return []
    return with_split_k(args, target, kernels_for(args, target))


def explain(args: GemmArguments, cc: int | None = None) -> str:
    """Why each kernel family does or does not support ``args``."""
    target = _target(args, cc)
    lines = [f"target: {target.kind} (cc {target.cc}), problem L={args.L} M={args.M} "
             f"N={args.N} K={args.K}, A/B {args.A.dtype}"]
    why = _no_target_reason(target)
    if why:
        return "\n".join(lines + [f"no kernel can run: {why}"])
    for family in FAMILIES:
        status = family.supports(judged(family, args, target), target)
        verdict = "supported" if status else f"refused: {status.reason}"
        plan = plan_name(family, args, target) if status else None
        if plan == "one pass":
            verdict += " (one pass: a tile spans the row, its reductions computed in the tile)"
        elif plan is not None:
            verdict += (" (two passes: the GEMM stores the values the reductions feed, in fp32, "
                        "and the reductions; a second kernel over K = 0 computes the rest)")
        lines.append(f"{family.name}: {verdict}")
    why = split_k_refusal(args)
    offered = [] if why else split_k_factors(args, target)
    if why:
        lines.append(f"splitk: refused: {why}")
    elif offered:
        lines.append(f"splitk: offered with {' and '.join(map(str, offered))} slices of K "
                     "(the tuner keeps it where it measures faster)")
    else:
        lines.append(f"splitk: not offered (enough output tiles for the GPU's {target.sms} "
                     "SMs, or K not a multiple of slices of 256)")
    return "\n".join(lines)


__all__ = ["get_kernels", "explain", "no_device_error", "NO_INTERPRETER", "kernels_for", "order_by_fill", "alternate_families"]
