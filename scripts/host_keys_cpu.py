"""Host time of ``evtfuse.gemm`` and ``Kernel.run`` per call on the CPU, with the launch
itself stubbed out: what is left is the keying, validation and plan look-up of the fast
paths (the same tensor objects again, rotating sets of new tensors of one structure, a
``GemmArguments`` run again). A development probe: numbers vary between hosts, so compare
runs on one machine (before / after a change).

    PYTHONPATH=src python3 scripts/host_keys_cpu.py [--workloads alpha_beta,bce_loss,relu_aux] [--calls 2000]
    PYTHONPATH=src python3 scripts/host_keys_cpu.py --training [--top 30]

``--training``: host time of one training step ``lin(x).backward(g)`` of
``evtfuse.nn.Linear(32, 48, epilogue=with_activation("gelu_tanh"))`` over 16 tokens (the
MLP step of benchmarks/training.py; host time does not depend on the sizes), in "save" and
"recompute" modes, the evtfuse launches stubbed out: what is left is the forward's and the
backward's Python, the operators' dispatch, the autograd engine and torch's two (tiny)
matmuls dA and dB; and the same epilogue as a grouped GEMM over 4 experts with a
per-expert bias (``evtfuse.grouped_gemm``, "save": its dA and dB are grouped GEMMs too).
Eager torch's step (``F.linear`` + ``F.gelu``, its compute as tiny) is
printed beside it for scale. fp32: a CPU computes a bf16 matmul slowly (13 us at these
sizes against 3 in fp32), time a GPU's enqueue does not take; the host path is the same
for bf16 but for the saved accumulator's dtype. One thread, measured in the thread's CPU
time (``time.thread_time``), so that a busy host's other processes add little. ``--top N``
prints each mode's N costliest functions (cProfile).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import tempfile
import time
import types

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("EVTFUSE_CACHE_DIR", tempfile.mkdtemp(prefix="evtfuse-host-keys-"))
os.environ.setdefault("EVTFUSE_PROGRESS", "0")

import torch  # noqa: E402

import evtfuse  # noqa: E402
from evtfuse.bench import workloads as W  # noqa: E402
from evtfuse.runtime import kernel as kernel_module  # noqa: E402


def per_call_us(fn, n: int, clock=time.perf_counter) -> float:
    for _ in range(200):
        fn(0)
    best = float("inf")
    for _ in range(25):  # the best of many short runs: a shared host's noise only adds
        t0 = clock()
        for k in range(n):
            fn(k)
        best = min(best, (clock() - t0) / n * 1e6)
    return best


def training(steps: int, top: int) -> None:
    """``--training`` (see the module's docstring)."""
    import torch.nn.functional as F

    # one thread: on a busy host a matmul's OpenMP team waits for a descheduled thread
    # (milliseconds for a 16 x 48 x 32 product), which a GPU's enqueue does not
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(16, 32).requires_grad_(True)
    g = torch.randn(16, 48)
    ref = torch.nn.Linear(32, 48)
    steps_of = {}
    for mode in ("save", "recompute"):
        lin = evtfuse.nn.Linear(32, 48, epilogue=evtfuse.nn.with_activation("gelu_tanh"),
                                backward=mode)
        steps_of[f"evtfuse {mode}"] = (lin, lambda k, lin=lin: lin(x).backward(g))
    # the same over 4 experts (groups over M: 4, 0, 7, 5 tokens): a mixture of experts' step
    experts = types.SimpleNamespace(weight=torch.randn(4, 32, 48).requires_grad_(True),
                                    bias=torch.randn(4, 1, 48).requires_grad_(True))
    offs = torch.tensor([4, 4, 11, 16], dtype=torch.int32)
    steps_of["evtfuse grouped save"] = (experts, lambda k: evtfuse.grouped_gemm(
        x, experts.weight, offs, evtfuse.nn.with_activation("gelu_tanh"), bias=experts.bias,
        backward="save").backward(g))
    steps_of["eager torch"] = (ref, lambda k: F.gelu(F.linear(x, ref.weight, ref.bias),
                                                    approximate="tanh").backward(g))
    for _, step in steps_of.values():  # compile and run for real once
        step(0)
    stubs = (kernel_module.LaunchPlan, kernel_module.Bf16AsFp32Plan)
    real = [cls.__call__ for cls in stubs]
    for cls in stubs:
        cls.__call__ = lambda self, A, B, values: None
    try:
        for name, (module, step) in steps_of.items():
            def timed(k, module=module, step=step):
                x.grad = module.weight.grad = module.bias.grad = None
                step(k)

            # the thread's CPU time: on a shared host, time descheduled is not the step's
            us = per_call_us(timed, steps, time.thread_time)
            print(f"{name}: {us:.1f} us host per training step (launches stubbed out)")
            if top:
                prof = cProfile.Profile()
                prof.runcall(lambda: [timed(k) for k in range(steps)])
                out = io.StringIO()
                pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
                print("\n".join(out.getvalue().splitlines()[:top + 9]))
    finally:
        for cls, fn in zip(stubs, real):
            cls.__call__ = fn


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workloads", default="alpha_beta,bce_loss,relu_aux")
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--training", action="store_true", help="time a training step instead")
    p.add_argument("--top", type=int, default=0, help="--training: cProfile's N costliest")
    a = p.parse_args()
    if a.training:
        training(min(a.calls, 200), a.top)
        return
    shape = (32, 32, 32)
    for w in W.select_workloads(a.workloads.split(",")):
        sets = [(W.make_inputs(w, shape, torch.float16, "cpu", seed),
                 W.make_outputs(w, shape, torch.float16, "cpu"))
                for seed in range(8)]

        def call(k: int) -> None:
            vals, outs = sets[k % len(sets)]
            evtfuse.gemm(vals["A"], vals["B"], epilogue=w.epilogue, tune="none",
                         **w.epilogue_operands(vals), **outs)

        for k in range(10):  # compile and run for real once per set
            call(k)
        vals, outs = sets[0]
        args = w.gemm_arguments(vals["A"], vals["B"], vals, outs)
        kern = evtfuse.get_kernels(args)[0]
        kern.run(args)
        real = kernel_module.LaunchPlan.__call__
        kernel_module.LaunchPlan.__call__ = lambda self, A, B, values: None
        try:
            same = per_call_us(lambda k: call(0), a.calls)
            rotating = per_call_us(call, a.calls)
            run = per_call_us(lambda k: kern.run(args), a.calls)
        finally:
            kernel_module.LaunchPlan.__call__ = real
        print(f"{w.name}: gemm same tensors {same:.2f} us, gemm 8 rotating sets {rotating:.2f} us, "
              f"Kernel.run same arguments {run:.2f} us (launch stubbed out)")


if __name__ == "__main__":
    main()
