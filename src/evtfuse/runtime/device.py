"""Where kernels run: a CUDA GPU (its compute capability) or Triton's CPU interpreter.

Layer: runtime.host (imports nothing of evtfuse). ``use_interpreter()`` turns the
interpreter on for this process (it must be on before any kernel module is generated);
with it, CPU tensors run through Triton's interpreter, which is how CI tests kernels.

Why not per call: ``triton.jit`` reads ``TRITON_INTERPRET`` when it decorates a function
(``knobs.runtime.interpret``, Triton 3.6 to 3.9 alike), so the setting counts for the kernel
modules evtfuse generates (and loads) after it changes, and for every other Triton function
decorated afterwards, torch.compile's included. evtfuse therefore never switches it itself
(turning it on in a process with a GPU would interpret later GPU kernels): CPU tensors with
the interpreter off get an error saying to call ``use_interpreter()`` first
(``discovery.NO_INTERPRETER``). No evtfuse kernel module is generated while it is off for
CPU tensors, so turning it on after that error works.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys

import torch

INTERPRETER = "interpreter"


_DTENSOR: list = []  # the DTensor class, once found
_ON_FIRST_DTENSOR: list = []  # what runs when it is found (``on_first_dtensor``)


def on_first_dtensor(fn) -> None:
    """Run ``fn()`` the first time the DTensor class is found outside torch.compile's
    tracing: ``runtime.sharding``, above this layer, registers its rules with DTensor so
    (when it is imported, as ``import evtfuse`` imports it)."""
    _ON_FIRST_DTENSOR.append(fn)


def _dtensor_type():
    """The DTensor class, or None while ``torch.distributed.tensor`` is not imported (no
    DTensor exists before it is: ``import evtfuse`` and a call without DTensors never
    import it, 0.7 s) or where torch has no distributed support. The first time it is
    found outside torch.compile's tracing, evtfuse's sharding rules are registered with
    DTensor (``on_first_dtensor``: ``runtime.sharding.register``)."""
    if _DTENSOR:
        return _DTENSOR[0]
    if "torch.distributed.tensor" not in sys.modules:
        return None
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch without distributed (or one importing it right now)
        return None
    if torch.compiler.is_compiling():  # (torch.compile imports it): registered when eager
        return DTensor
    for fn in _ON_FIRST_DTENSOR:
        fn()
    _DTENSOR.append(DTensor)
    return DTensor


def is_dtensor(t) -> bool:
    """Whether ``t`` is a ``torch.distributed`` DTensor (the class looked up once it can
    exist: this is asked on every forward of the modules and every cross-entropy call)."""
    cls = _DTENSOR[0] if _DTENSOR else _dtensor_type()
    return cls is not None and isinstance(t, cls)


def interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")


def quiet_float_warnings():
    """A context for a kernel's launch: under Triton's CPU interpreter its arithmetic runs in
    numpy, which warns where a GPU's IEEE arithmetic quietly gives inf or NaN (exp
    overflowing in the branch a ``where`` does not take, as softplus past its threshold;
    0/0 and inf * 0 in the lanes past M and N that are never stored; a cast past fp16's
    range): the interpreter's launches keep as quiet as the GPU. Results are unchanged;
    on a GPU it does nothing."""
    if not interpreter_enabled():
        return contextlib.nullcontext()
    import numpy as np

    return np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore")


def use_interpreter() -> None:
    """Run Triton kernels on the CPU from now on (CPU tensors only)."""
    os.environ["TRITON_INTERPRET"] = "1"


def device_guard(A: torch.Tensor):
    """``torch.cuda.device(A.device)`` where A is on a CUDA device other than the current
    one (Triton launches on the current device and its current stream), else None."""
    if A.is_cuda and A.device.index != torch.cuda.current_device():
        return torch.cuda.device(A.device)
    return None


def target_of(device: torch.device, cc: int | None = None) -> tuple[str, int]:
    """(kind, cc): ("cuda", 90) for an H100, (INTERPRETER, cc or 0) for CPU tensors."""
    if device.type == "cuda":
        return "cuda", cc if cc is not None else cuda_cc(device.index or 0)
    return INTERPRETER, cc or 0


@functools.lru_cache(maxsize=None)
def cuda_cc(index: int) -> int:
    major, minor = torch.cuda.get_device_capability(index)
    return major * 10 + minor


@functools.lru_cache(maxsize=None)
def sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # the interpreter: a few programs are enough to exercise persistence


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "triton-cpu-interpreter"
