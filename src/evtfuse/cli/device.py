"""Where the cli runs a problem, and how it times it.

Layer: cli. A CUDA GPU if there is one, else the CPU through Triton's interpreter (turned on
before any kernel module is generated); ``time_ms`` is the median of CUDA-event timings on
a GPU and of wall-clock timings on the CPU.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable


@dataclass
class Device:
    torch_device: Any
    interpreter: bool
    description: str


def pick_device() -> Device:
    """A CUDA GPU if there is one, else the CPU through Triton's interpreter (turned on here,
    before any kernel module is generated)."""
    import torch

    if torch.cuda.is_available():
        dev = torch.device("cuda")
        return Device(dev, False, f"CUDA GPU: {torch.cuda.get_device_name(dev)}")
    try:
        from ..runtime.device import use_interpreter
    except ImportError:
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        use_interpreter()
    return Device(torch.device("cpu"), True,
                  "no CUDA GPU found: running through Triton's CPU interpreter (TRITON_INTERPRET=1)")


def _synchronize(device: Device) -> None:
    if not device.interpreter:
        import torch

        torch.cuda.synchronize(device.torch_device)


def time_ms(fn: Callable[[], Any], device: Device, iterations: int, warmup: int) -> float:
    """Median milliseconds per call (CUDA events on a GPU, wall clock on the CPU)."""
    import torch

    for _ in range(warmup):
        fn()
    _synchronize(device)
    times = []
    if device.interpreter:
        for _ in range(max(iterations, 1)):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    else:
        for _ in range(max(iterations, 1)):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    return statistics.median(times)
