"""Clocks, power and throttle reasons while one kernel runs back to back (GPU, development
tool): whether an epilogue's extra memory traffic costs time through the power limit (the
SM clock falls under sustained load) rather than through bandwidth.

For each case, the named candidates (``--kernels``, default the first ``--max-configs``;
``--groups``: each at these tile orders), cuBLAS's ``A @ B`` and, where PyTorch reaches
one, cuBLASLt's fused epilogue each run back to back for ``--seconds`` after a warm-up,
while a thread samples NVML every 10 ms: SM clock, power draw, and the share of samples with the
software power cap or a hardware slowdown among the clock-throttle reasons. The time per
call is the mean over the window (CUDA events around it; inputs not rotated). Verifies
every kernel first.

    PYTHONPATH=src python3 scripts/power_probe.py [--shape 8192x8192x1024] [--only identity,relu_aux]
        [--kernels NAME,...] [--max-configs 2] [--seconds 2] [--groups 8,16]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import torch
from group_probe import CASES, _lt
from probe_common import epilogue_args

from evtfuse import get_kernels


def _sampler(stop: threading.Event, out: list[tuple[float, float, int]]) -> None:
    import pynvml

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    while not stop.is_set():
        clock = pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
        power = pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0
        reasons = pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h)
        out.append((clock, power, reasons))
        time.sleep(0.01)


def sustained(fn, seconds: float) -> dict[str, float]:
    """``fn`` back to back for ``seconds`` (after a 0.3 s warm-up): ms per call and the
    NVML samples' medians."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.3:
        fn()
    torch.cuda.synchronize()
    samples: list[tuple[float, float, int]] = []
    stop = threading.Event()
    th = threading.Thread(target=_sampler, args=(stop, samples), daemon=True)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    th.start()
    start.record()
    calls = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(20):
            fn()
        calls += 20
        torch.cuda.synchronize()  # keep the host within one batch of the GPU
    end.record()
    torch.cuda.synchronize()
    stop.set()
    th.join()
    sw_cap, hw_slow = 0x4, 0x8 | 0x40 | 0x80
    return {"ms": start.elapsed_time(end) / calls,
            "mhz": statistics.median(s[0] for s in samples),
            "watts": statistics.median(s[1] for s in samples),
            "power_capped": sum(bool(s[2] & sw_cap) for s in samples) / len(samples),
            "hw_slowdown": sum(bool(s[2] & hw_slow) for s in samples) / len(samples)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="8192x8192x1024")
    p.add_argument("--only", default="identity,relu_aux")
    p.add_argument("--kernels", default="", help="comma-separated kernel names (default: the first --max-configs)")
    p.add_argument("--max-configs", type=int, default=2)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--groups", default="", help="each kernel at these GROUP_M values too")
    a = p.parse_args()
    M, N, K = (int(x) for x in a.shape.split("x"))
    print(f"{'case':<12} {'system':<44} {'ms':>8} {'MHz':>6} {'W':>6} {'capped':>7} {'hw':>5}")
    for name in a.only.split(","):
        args = epilogue_args(CASES[name], M, N, K, labels=name == "bce")
        kernels = get_kernels(args)
        if a.kernels:
            kernels = [k for k in kernels if k.name in a.kernels.split(",")]
        else:
            kernels = kernels[: a.max_configs]
        if a.groups:
            kernels = [k.with_config(group_m=int(g)) for k in kernels for g in a.groups.split(",")]
        systems = {"mm": lambda: args.A @ args.B}
        if _lt(name, args) is not None:
            systems["cuBLASLt"] = _lt(name, args)
        for k in kernels:
            ok = k.verify(args)
            if not ok:
                print(f"{name} {k.name}: VERIFY FAILED {ok.report()}", flush=True)
                continue
            systems[k.name] = lambda k=k: k.run(args)
        for label, fn in systems.items():
            r = sustained(fn, a.seconds)
            print(f"{name:<12} {label:<44} {r['ms']:8.4f} {r['mhz']:6.0f} {r['watts']:6.0f} "
                  f"{r['power_capped']:7.2f} {r['hw_slowdown']:5.2f}", flush=True)


if __name__ == "__main__":
    main()
