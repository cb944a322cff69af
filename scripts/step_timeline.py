"""Where a training step's wall time goes that its kernels' busy time does not show (GPU).

    PYTHONPATH=src python3 scripts/step_timeline.py --what lce [--steps 5] [--trace OUT.json]
    PYTHONPATH=src python3 scripts/step_timeline.py --what mlp

`benchmarks/linear_cross_entropy.py` found evtfuse's cross-entropy step at 43.2 ms
(`do_bench`, L2 flushed, a sync between steps) while its kernels' busy time in
`kernel_profile` (steps back to back) summed to 38.9 ms; torch.compile's loss showed 1 ms
between the two. This runs the step the ways the measurements differ, in one process:

- ``sync``: each step alone after a sync (wall time by host clock and CUDA events);
- ``flushed``: the same after writing 256 MiB (do_bench's L2 flush);
- ``back``: steps back to back, one sync at the end (per step);
- the profile of ``--steps`` flushed steps (torch.profiler, CPU and CUDA): each step's span
  from its first kernel's start to its last kernel's end, the idle GPU inside that span,
  and the gap before the first kernel (the host's start of the step); ``--trace`` writes
  the chrome trace to look at.

``--what lce``: 8192 x 4096 x 128256 bf16, ``loss.backward()``; ``--what mlp``:
``GatedMLP(4096, 14336)`` at 8192 tokens; ``--what torch_lce``: the unfused loss in eager
(a peer whose two measurements agree, to check the method).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def _lce_step():
    import evtfuse

    T, H, V = 8192, 4096, 128256
    g = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(T, H, device="cuda", generator=g).bfloat16().requires_grad_(True)
    W = (torch.randn(V, H, device="cuda", generator=g) / H ** 0.5).bfloat16()
    W.requires_grad_(True)
    y = torch.randint(0, V, (T,), device="cuda", generator=g)

    def step():
        h.grad = W.grad = None
        evtfuse.linear_cross_entropy(h, W, y).backward()
    return step


def _torch_lce_step():
    import torch.nn.functional as F

    T, H, V = 8192, 4096, 128256
    h = torch.randn(T, H, device="cuda").bfloat16().requires_grad_(True)
    W = (torch.randn(V, H, device="cuda") / H ** 0.5).bfloat16().requires_grad_(True)
    y = torch.randint(0, V, (T,), device="cuda")

    def step():
        h.grad = W.grad = None
        F.cross_entropy(F.linear(h, W).float(), y).backward()
    return step


def _mlp_step():
    from evtfuse.nn import GatedMLP

    block = GatedMLP(4096, 14336, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16)

    def step():
        x.grad = None
        for p in block.parameters():
            p.grad = None
        block(x).backward(dy)
    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--what", default="lce", choices=["lce", "mlp", "torch_lce"])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--trace", default=None)
    args = ap.parse_args()
    step = {"lce": _lce_step, "mlp": _mlp_step, "torch_lce": _torch_lce_step}[args.what]()
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    for _ in range(3):
        step()
    torch.cuda.synchronize()

    def timed(pre) -> tuple[float, float]:
        pre()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        a.record()
        step()
        b.record()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        return a.elapsed_time(b), (t1 - t0) * 1e3

    for name, pre in (("sync", lambda: None), ("flushed", flush.zero_)):
        runs = [timed(pre) for _ in range(args.steps)]
        print(f"{name:8s} events {statistics.median(r[0] for r in runs):7.2f} ms, host enqueue "
              f"{statistics.median(r[1] for r in runs):6.2f} ms")
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(args.steps):
        step()
    b.record()
    torch.cuda.synchronize()
    print(f"back     events {a.elapsed_time(b) / args.steps:7.2f} ms per step")

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            flush.zero_()
            torch.cuda.synchronize()
            with torch.profiler.record_function("step"):
                step()
            torch.cuda.synchronize()
    if args.trace:
        prof.export_chrome_trace(args.trace)
    kernels = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                     if e.device_type.name == "CUDA")
    steps = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                   if e.name == "step" and e.device_type.name == "CPU")
    for k, (s0, s1) in enumerate(steps):
        # a step's kernels: those starting after its host span began and before the next's
        end = steps[k + 1][0] if k + 1 < len(steps) else float("inf")
        mine = [kk for kk in kernels if s0 <= kk[0] < end and "zero" not in kk[2].lower()]
        if not mine:
            continue
        first, last = mine[0][0], max(kk[1] for kk in mine)
        busy, idle, reach = 0.0, 0.0, first
        for start, stop, _ in mine:
            if start > reach:
                idle += start - reach
            busy += max(0.0, stop - max(start, reach))
            reach = max(reach, stop)
        print(f"step {k}: host span {(s1 - s0) / 1e3:6.2f} ms; first kernel "
              f"{(first - s0) / 1e3:5.2f} ms after the host started; kernels' span "
              f"{(last - first) / 1e3:6.2f} ms = busy {busy / 1e3:6.2f} + idle {idle / 1e3:5.2f}"
              f" ({len(mine)} kernels)")


if __name__ == "__main__":
    main()
