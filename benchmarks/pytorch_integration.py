"""evtfuse inside PyTorch programs, measured on a GPU: three numbers, every peer in the
same run (BENCHMARKS.md, "Inside PyTorch").

    PYTHONPATH=src python3 benchmarks/pytorch_integration.py --out bench_out/pytorch.json

1. ``compiled``: a function calling ``evtfuse.gemm`` (alpha-beta, 4096^3 bf16) eager and
   under ``torch.compile(fullgraph=True)``: time per call (``do_bench``, median of five
   interleaved rounds) and the host time per call (back-to-back calls, wall clock over a
   synchronised loop), beside ``torch.addmm`` eager and compiled (torch.compile's own cost
   per call), and the compiled function's first call.
2. ``graphs``: a stack of 32 launch-bound layers (M=64, 4096x4096, bias + gelu_tanh)
   under ``torch.compile(mode="reduce-overhead")``, time per layer, against the evtfuse
   kernel's own GPU time (torch.profiler), beside torch.compile's own fusion of the same
   stack (reduce-overhead) and cuBLASLt (``torch._addmm_activation``, in a CUDA graph).
3. ``mlp``: Linear -> gelu_tanh -> Linear, 4096 -> 14336 -> 4096, 8192 tokens, bf16,
   inference: ``evtfuse.nn.Linear`` under torch.compile against the two bare cuBLAS GEMMs
   (``x @ W.T``) and ``torch.nn.Linear`` under
   ``torch.compile(mode="max-autotune-no-cudagraphs")``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import triton.testing

import evtfuse
from evtfuse.bench.timing import graph_replay

BF = torch.bfloat16
AB = "def ab(accum, C, alpha, beta):\n    D = alpha * accum + beta * C\n    return D"
GELU = "def layer(accum, bias):\n    D = gelu_tanh(accum + bias)\n    return D"


def _ms(fn) -> float:
    return triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")


def _host_us(fn, n=200) -> float:
    """Wall time per call of ``n`` back-to-back calls; the GPU is kept ahead by a sleep
    kernel so the host's enqueue cost is what is timed."""
    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e8))  # ~0.1-0.2 s of GPU work queued first
    t = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return host


def compiled_call(rounds: int = 5) -> dict:
    M = N = K = 4096
    A, B, C = (torch.randn(s, device="cuda", dtype=BF) for s in ((M, K), (K, N), (M, N)))
    D = torch.empty(M, N, device="cuda", dtype=BF)

    def f(A, B, C, D):
        return evtfuse.gemm(A, B, AB, C=C, alpha=1.0, beta=0.5, D=D)

    def addmm(A, B, C, D):  # torch.compile's own cost per call, beside a plain torch op
        return torch.addmm(C, A, B, beta=0.5)

    f(A, B, C, D)  # tune and compile evtfuse's kernel first
    torch._dynamo.reset()
    cf = torch.compile(f, fullgraph=True)
    t = time.perf_counter()
    cf(A, B, C, D)
    torch.cuda.synchronize()
    out = {"first_compiled_call_s": time.perf_counter() - t}
    peers = {"eager": f, "compiled": cf, "torch_addmm_eager": addmm,
             "torch_addmm_compiled": torch.compile(addmm, fullgraph=True)}
    times: dict = {name: [] for name in peers}
    hosts: dict = {name: [] for name in peers}
    for _ in range(rounds):  # interleaved: a drift of clocks falls on every peer alike
        for name, fn in peers.items():
            times[name].append(_ms(lambda: fn(A, B, C, D)))
            hosts[name].append(_host_us(lambda: fn(A, B, C, D)))
    for name in peers:
        out[f"{name}_ms"] = statistics.median(times[name])
        out[f"{name}_host_us"] = statistics.median(hosts[name])
    out["compiled_minus_eager_us"] = (out["compiled_ms"] - out["eager_ms"]) * 1e3
    return out


def _profiled_kernel_ms(fn, name_part: str, n=50) -> float:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    times = [e.device_time_total for e in prof.key_averages() if name_part in e.key]
    return sum(times) / n / 1e3


def graphs(layers: int = 32) -> dict:
    """A model of ``layers`` launch-bound layers (M=64, 4096x4096, bias + gelu_tanh, each its
    own weight, inference) in one graph: per-layer time = the stack's time / ``layers``, so
    the graph's own replay cost (tens of microseconds of Python in cudagraph trees) is
    spread as in a model, against the evtfuse kernel's GPU time per layer (torch.profiler).
    The weights are the modules' parameters, as in a model: cudagraph trees copy any other
    tensor input into the graph's pool at every replay."""
    M, N = 64, 4096
    x = torch.randn(M, N, device="cuda", dtype=BF)
    ref = torch.nn.Sequential(*(m for _ in range(layers) for m in (
        torch.nn.Linear(N, N, device="cuda", dtype=BF), torch.nn.GELU(approximate="tanh"))))
    ev = torch.nn.Sequential(*(
        evtfuse.nn.Linear(N, N, device="cuda", dtype=BF,
                          epilogue=evtfuse.nn.with_activation("gelu_tanh"))
        for _ in range(layers)))
    ev.load_state_dict({f"{i}.{p}": t for i in range(layers)
                        for p, t in ref[2 * i].state_dict().items()})
    ref.requires_grad_(False), ev.requires_grad_(False)
    linears = list(ref)[::2]

    def lt(x):
        for lin in linears:
            x = torch._addmm_activation(lin.bias, x, lin.weight.t(), use_gelu=True)
        return x

    ev(x)
    torch._dynamo.reset()
    ro = torch.compile(ev, mode="reduce-overhead", fullgraph=True)
    tc = torch.compile(ref, mode="reduce-overhead", fullgraph=True)
    for _ in range(3):
        ro(x), tc(x)
    want = ref(x).float()
    out = {"layers": layers,
           "rel_err": ((ro(x).float() - want).norm() / want.norm()).item(),
           "evtfuse_reduce_overhead_ms": _ms(lambda: ro(x)) / layers,
           "evtfuse_kernel_ms": _profiled_kernel_ms(lambda: ev(x), "evtfuse") / layers,
           "evtfuse_eager_ms": _ms(lambda: ev(x)) / layers,
           "torch_compile_reduce_overhead_ms": _ms(lambda: tc(x)) / layers}
    out["cublaslt_graph_ms"] = _ms(graph_replay(lambda: lt(x), warmups=1)) / layers
    out["ratio_reduce_overhead_to_kernel"] = (out["evtfuse_reduce_overhead_ms"]
                                              / out["evtfuse_kernel_ms"])
    return out


def mlp() -> dict:
    T, H, F = 8192, 4096, 14336
    x = torch.randn(T, H, device="cuda", dtype=BF)
    up = torch.nn.Linear(H, F, device="cuda", dtype=BF)
    down = torch.nn.Linear(F, H, device="cuda", dtype=BF)
    ref = torch.nn.Sequential(up, torch.nn.GELU(approximate="tanh"), down).requires_grad_(False)
    ev = torch.nn.Sequential(
        evtfuse.nn.Linear(H, F, epilogue=evtfuse.nn.with_activation("gelu_tanh"),
                          device="cuda", dtype=BF),
        evtfuse.nn.Linear(F, H, device="cuda", dtype=BF)).requires_grad_(False)
    ev.load_state_dict({"0.weight": up.weight, "0.bias": up.bias, "1.weight": down.weight,
                        "1.bias": down.bias})
    h = torch.empty(T, F, device="cuda", dtype=BF)
    with torch.inference_mode():
        ev(x)  # tune both GEMMs
        cev = torch.compile(ev, fullgraph=True)
        cref = torch.compile(ref, mode="max-autotune-no-cudagraphs")
        want = ref(x)
        err = ((cev(x).float() - want.float()).norm() / want.float().norm()).item()
        cref(x)
        W1, W2 = up.weight, down.weight
        out = {"rel_err": err,
               "evtfuse_compiled_ms": _ms(lambda: cev(x)),
               "two_cublas_gemms_ms": _ms(lambda: (torch.mm(x, W1.t(), out=h), h @ W2.t())),
               "torch_linear_max_autotune_ms": _ms(lambda: cref(x))}
    out["ratio_to_two_gemms"] = out["evtfuse_compiled_ms"] / out["two_cublas_gemms_ms"]
    out["ratio_to_max_autotune"] = out["evtfuse_compiled_ms"] / out["torch_linear_max_autotune_ms"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench_out/pytorch.json")
    p.add_argument("--only", default="compiled,graphs,mlp")
    a = p.parse_args()
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "triton": triton.__version__}
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    for name in a.only.split(","):
        try:
            results[name] = {"compiled": compiled_call, "graphs": graphs, "mlp": mlp}[name]()
        except Exception as e:  # one failed measurement does not lose the others
            results[name] = {"error": f"{type(e).__name__}: {str(e)[:2000]}"}
        print(name, json.dumps(results[name], indent=1), flush=True)
        with open(a.out, "w") as f:  # after each: a run stopped at its limit keeps the rest
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
