"""A training step through evtfuse, measured on a GPU, every peer in the same run
(BENCHMARKS.md, "Training"):

    PYTHONPATH=src python3 benchmarks/training.py --out bench_out/training.json

MLP up-projection with bias and gelu_tanh, forward + backward (8192 tokens, 4096 -> 14336,
bf16; the upstream gradient a fixed random tensor): ``evtfuse.nn.Linear`` eager
(``backward="auto"``, which saves the accumulator at this K, and ``backward="recompute"``)
against the sum of its three bare cuBLAS GEMMs (forward ``x @ W.T``, ``dX = g @ W``,
``dW = g.T @ x``, each timed alone), eager torch (``F.linear`` + ``F.gelu``) and
``torch.compile(mode="max-autotune-no-cudagraphs")`` of the same step. Times are medians of
``triton.testing.do_bench`` with the gradients reset between steps, every peer timed once in
each of ``ROUNDS`` rounds in turn and the median of its rounds kept (``*_ms_rounds``: all);
peak memory is ``torch.cuda.max_memory_allocated`` during one step beyond what was
allocated before it;
``*_kernels_ms``: each kernel's GPU time per step (torch.profiler,
``evtfuse.bench.timing.kernel_profile``), ``*_kernel_sum_ms`` their sum, ``*_exposed_ms``
each kernel's share of the busy GPU time (an instant charged to the kernel that started
first), ``*_host_ms`` the
host's time to enqueue a step (a step's time above its kernels' sum is idle GPU:
host-bound where ``*_host_ms`` reaches it; ``*_syncs``: the calls in a step that made the
host wait for the GPU, ``evtfuse.bench.timing.synchronizing_calls``), ``*_loop_ms`` a
step's time in a run of back-to-back steps, as a training loop runs them (no L2 flush, no
gap between steps: the GPU idles only where a step synchronises or the host falls behind).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
import torch.nn.functional as F
import triton.testing

import evtfuse
from evtfuse.bench.timing import back_to_back_ms, kernel_profile, synchronizing_calls

BF = torch.bfloat16
ROUNDS = 5  # rounds of timing, every peer once per round


def _ms(fn, grads) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=200, grad_to_none=grads,
                                   return_mode="median")


def _host_ms(fn, grads, steps: int = 10) -> float:
    """Host time to enqueue one step, nothing synchronised inside the loop: at or above the
    step's GPU time, the step is bound by the host (or something in it synchronises)."""
    import time

    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        for p in grads:
            p.grad = None
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / steps * 1e3


def _peak_mib(fn) -> float:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2 ** 20


def mlp_step(tokens: int = 8192, d_in: int = 4096, d_out: int = 14336) -> dict:
    torch.manual_seed(0)
    x = (torch.randn(tokens, d_in, device="cuda") * d_in ** -0.5).to(BF).requires_grad_(True)
    ref = torch.nn.Linear(d_in, d_out, device="cuda", dtype=BF)
    lin = evtfuse.nn.Linear(d_in, d_out, device="cuda", dtype=BF,
                            epilogue=evtfuse.nn.with_activation("gelu_tanh"))
    lin.load_state_dict(ref.state_dict())
    lin_r = evtfuse.nn.Linear(d_in, d_out, device="cuda", dtype=BF, backward="recompute",
                              epilogue=evtfuse.nn.with_activation("gelu_tanh"))
    lin_r.load_state_dict(ref.state_dict())
    g = torch.randn(tokens, d_out, device="cuda", dtype=BF)

    def ev():
        lin(x).backward(g)

    def ev_recompute():
        lin_r(x).backward(g)

    def eager():
        F.gelu(F.linear(x, ref.weight, ref.bias), approximate="tanh").backward(g)

    compiled_fwd = torch.compile(lambda x, w, b: F.gelu(F.linear(x, w, b), approximate="tanh"),
                                 mode="max-autotune-no-cudagraphs")

    def compiled():
        compiled_fwd(x, ref.weight, ref.bias).backward(g)

    W = ref.weight.detach()
    xd = x.detach()
    out: dict = {"shape": [tokens, d_in, d_out]}
    params = [x, lin.weight, lin.bias, lin_r.weight, lin_r.bias, ref.weight, ref.bias]

    def grads_of(fn) -> list:
        for t in params:
            t.grad = None
        fn()
        return [t.grad.float() for t in params if t.grad is not None]

    ev()  # tune and compile evtfuse's forward and backward kernels
    ev_recompute()
    got, want = grads_of(ev), grads_of(eager)  # (dX, dW, db) each
    out["rel_err"] = {n: float((a - b).norm() / b.norm())
                      for n, a, b in zip(("dX", "dW", "db"), got, want)}
    got = grads_of(ev_recompute)
    out["rel_err_recompute"] = {n: float((a - b).norm() / b.norm())
                                for n, a, b in zip(("dX", "dW", "db"), got, want)}
    compiled()
    grads = params
    # every peer timed in each of ROUNDS rounds, in turn, and the median of its rounds kept
    # (``*_ms_rounds``): a card's state drifts over a run (on an H200 evtfuse's do_bench step
    # took 4.675 and 5.327 ms in two runs whose back-to-back steps agreed), and timing the
    # peers one after another lets that drift into their ratios
    steps = {"evtfuse": ev, "evtfuse_recompute": ev_recompute, "eager": eager,
             "compiled": compiled}
    timed = {"fwd_gemm": (lambda: xd @ W.T, None), "dx_gemm": (lambda: g @ W, None),
             "dw_gemm": (lambda: g.T @ xd, None),
             **{name: (fn, grads) for name, fn in steps.items()}}
    rounds: dict = {name: [] for name in timed}
    for _ in range(ROUNDS):
        for name, (fn, reset) in timed.items():
            if f"{name}_error" in out:
                continue
            try:
                rounds[name].append(_ms(fn, reset))
            except Exception as e:  # one peer's failure does not lose the others
                out[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:500]}"
    for name, got in rounds.items():
        if got:
            out[f"{name}_ms"] = statistics.median(got)
            out[f"{name}_ms_rounds"] = got
    if all(f"{n}_gemm_ms" in out for n in ("fwd", "dx", "dw")):
        out["three_gemms_ms"] = out["fwd_gemm_ms"] + out["dx_gemm_ms"] + out["dw_gemm_ms"]
    for name, fn in steps.items():
        if f"{name}_ms" in out:
            for p in grads:
                p.grad = None
            out[f"{name}_peak_mib"] = _peak_mib(fn)
    for name, fn in steps.items():
        try:
            prof = kernel_profile(fn, grads)
            out[f"{name}_kernels_ms"] = prof["kernels"]
            out[f"{name}_kernel_sum_ms"] = prof["kernel_sum"]
            out[f"{name}_exposed_ms"] = prof["exposed"]
            out[f"{name}_host_ms"] = _host_ms(fn, grads)
            out[f"{name}_idle_before_ms"] = prof["idle_before"]
            out[f"{name}_syncs"] = synchronizing_calls(fn)
            out[f"{name}_loop_ms"] = back_to_back_ms(fn, grads)
        except Exception as e:  # noqa: BLE001  (the profile is extra; the times stand)
            out[f"{name}_kernels_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    if "evtfuse_ms" in out and "three_gemms_ms" in out:
        out["ratio_to_three_gemms"] = out["evtfuse_ms"] / out["three_gemms_ms"]
        # the same ratio within each round (the step and its GEMMs timed moments apart)
        out["ratio_to_three_gemms_rounds"] = [
            e / (f + x + w) for e, f, x, w in zip(*(out[f"{n}_ms_rounds"] for n in (
                "evtfuse", "fwd_gemm", "dx_gemm", "dw_gemm")))]
        if "compiled_ms" in out:
            out["ratio_to_compiled"] = out["evtfuse_ms"] / out["compiled_ms"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench_out/training.json")
    a = p.parse_args()
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "triton": triton.__version__}
    try:
        results["mlp"] = mlp_step()
    except Exception as e:
        results["mlp"] = {"error": f"{type(e).__name__}: {str(e)[:2000]}"}
    print(json.dumps(results, indent=1), flush=True)
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
