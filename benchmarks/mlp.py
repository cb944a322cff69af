"""The gated MLP block, forward + backward, on the GPU: ``evtfuse.nn.GatedMLP`` against the
same block in torch (eager and torch.compile) and against the sum of its six cuBLAS GEMMs.

    PYTHONPATH=src python3 benchmarks/mlp.py --tokens 8192 --hidden 4096 --inter 14336 \\
        --out results.json

Variants, every one in the same run on the same weights and input: ``cublas6``, the six
GEMMs alone (``x @ W1.T``: (T, 2I), ``A @ W2.T``, ``dy @ W2``, ``dp @ W1``, ``dp.T @ x``,
``dy.T @ A``; the floor a fused block aims at); ``torch``, ``torch.nn`` Linears and
``F.silu(g) * u`` in eager; ``compile``, that block under ``torch.compile`` (Inductor,
default mode); ``evtfuse``, ``GatedMLP``; ``evtfuse_compile``, it under ``torch.compile``.
Time: the median of interleaved rounds, each round timing every variant once
(``triton.testing.do_bench``, median, gradients set to None between steps); peak memory
beyond the weights, input and gradients; each variant's output and gradients against
torch eager's (relative norms). ``kernels``: the block's two fused GEMMs each timed alone in
the same run (``do_bench`` medians: the up projection storing gate, up and the activation,
and the backward's ``dy @ W_down`` with the derived epilogue), beside cuBLAS's plain GEMMs
of the same shapes: which of the two holds the block's gap. Results: JSON (``--out``) and a
markdown table.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics

import torch
import torch.nn.functional as F
import triton
import triton.testing

from evtfuse.bench.timing import kernel_profile
from evtfuse.nn import GatedMLP
from evtfuse.runtime import mlp as mlp_ops

MIB = 1 << 20
DEV = "cuda"
ACTS = {"silu": F.silu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
        "gelu": F.gelu, "relu": F.relu}


class TorchGated(torch.nn.Module):
    """The same block as Hugging Face's LlamaMLP writes it."""

    def __init__(self, block: GatedMLP):
        super().__init__()
        self.gate_proj = copy.deepcopy(block.gate_proj)
        self.up_proj = copy.deepcopy(block.up_proj)
        self.down_proj = copy.deepcopy(block.down_proj)
        self.act = ACTS[block.activation]

    def forward(self, x):
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


def _rel(got, want) -> float:
    got, want = got.detach().double(), want.detach().double()
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


def _ms(fn, grads) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=200, grad_to_none=grads,
                                   return_mode="median")


def _fused_alone(block: GatedMLP, x, dy, w1, w2) -> dict:
    """``do_bench`` medians of the block's two fused GEMMs as its forward and backward call
    them, and of cuBLAS's plain GEMMs of the same shapes (``w1``, ``w2``: weights of those
    shapes)."""
    from evtfuse.runtime import calls

    act, width = block.activation, block.gate_proj.weight.shape[0]
    joined = mlp_ops._weight1(block.gate_proj.weight.detach(), block.up_proj.weight.detach())
    p = x.new_empty((x.shape[0], 2 * width))
    dp = torch.empty_like(p)
    a = x.new_empty((x.shape[0], width))
    up = mlp_ops.up_source(act, True, False, x.dtype)
    w_down = block.down_proj.weight.detach()

    def bench(fn):
        fn()
        return triton.testing.do_bench(fn, warmup=10, rep=200, return_mode="median")

    with torch.no_grad():
        return {
            "up_evtfuse": bench(lambda: calls.plain_gemm(x, joined.t(), up, D=a, G=p[:, :width],
                                                         U=p[:, width:], tune=mlp_ops.TUNE)),
            "up_cublas": bench(lambda: torch.mm(x, w1.t())),
            "down_grad_evtfuse": bench(lambda: torch.ops.evtfuse.mlp_down_grad.default(
                dy, w_down, p, dp, act, True, True)),
            "down_grad_cublas": bench(lambda: torch.mm(dy, w2))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--inter", type=int, default=14336)
    ap.add_argument("--activation", default="silu", choices=sorted(ACTS))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--variants", default="cublas6,torch,compile,evtfuse,evtfuse_compile")
    ap.add_argument("--tune", default=mlp_ops.TUNE, choices=["none", "fast", "exhaustive"],
                    help="the evtfuse GEMMs' tuning")
    ap.add_argument("--profile", default="torch,compile,evtfuse",
                    help="variants whose kernels are profiled (torch.profiler, warm L2)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    mlp_ops.TUNE = args.tune
    T, H, I = args.tokens, args.hidden, args.inter
    dt = torch.bfloat16
    torch.manual_seed(0)
    block = GatedMLP(H, I, args.activation, device=DEV, dtype=dt)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, H ** -0.5)
    ref_block = TorchGated(block)
    x = torch.randn(T, H, device=DEV, dtype=dt, requires_grad=True)
    dy = torch.randn(T, H, device=DEV, dtype=dt)

    # the six GEMMs, on the block's shapes
    w1 = torch.randn(2 * I, H, device=DEV, dtype=dt)
    w2 = torch.randn(H, I, device=DEV, dtype=dt)
    a = torch.randn(T, I, device=DEV, dtype=dt)
    dp = torch.randn(T, 2 * I, device=DEV, dtype=dt)
    xd = x.detach()

    def cublas6():
        torch.mm(xd, w1.t())
        torch.mm(a, w2.t())
        torch.mm(dy, w2)
        torch.mm(dp, w1)
        torch.mm(dp.t(), xd)
        torch.mm(dy.t(), a)

    steps = {}
    leaves = {}

    def add(name, module):
        params = list(module.parameters())

        def step():
            module(x).backward(dy)
        steps[name], leaves[name] = step, [x, *params]

    wanted = args.variants.split(",")
    if "torch" in wanted:
        add("torch", ref_block)
    if "compile" in wanted:
        add("compile", torch.compile(ref_block))
    if "evtfuse" in wanted:
        add("evtfuse", block)
    if "evtfuse_compile" in wanted:
        add("evtfuse_compile", torch.compile(copy.deepcopy(block)))
    if "cublas6" in wanted:
        steps["cublas6"], leaves["cublas6"] = cublas6, []

    results: dict = {"shape": dict(tokens=T, hidden=H, inter=I, activation=args.activation),
                     "tune": args.tune, "device": torch.cuda.get_device_name(),
                     "torch": torch.__version__, "triton": triton.__version__,
                     "flop": 6 * 2 * T * H * I * 1.5, "variants": {}}
    # warm-up (compiles, tunes), then correctness and memory of each variant
    grads = {}
    base = torch.cuda.memory_allocated()
    for name, step in steps.items():
        for t in leaves[name]:
            t.grad = None
        step()
        torch.cuda.synchronize()
        for t in leaves[name]:
            t.grad = None
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        got = [t.grad.detach().clone() for t in leaves[name] if t.grad is not None]
        kept = sum(t.grad.nbytes for t in leaves[name] if t.grad is not None)
        peak = (torch.cuda.max_memory_allocated() - before - kept) / MIB
        grads[name] = got
        results["variants"][name] = {"peak_beyond_mib": round(peak, 1), "ms": []}
        for t in leaves[name]:
            t.grad = None
    from evtfuse.runtime.tuner import chosen_kernels

    results["evtfuse_kernels"] = chosen_kernels()  # (M, kernel): which family ran each GEMM
    print("evtfuse kernels:", results["evtfuse_kernels"])
    if "torch" in grads:
        for name, got in grads.items():
            if got and len(got) == len(grads["torch"]):
                results["variants"][name]["rel_err"] = max(
                    _rel(g, w) for g, w in zip(got, grads["torch"]))
    for _ in range(args.rounds):
        for name, step in steps.items():
            results["variants"][name]["ms"].append(_ms(step, leaves[name]))
    if "evtfuse" in steps:
        results["kernels"] = _fused_alone(block, xd, dy, w1, w2)
        print("the fused GEMMs alone (ms):", results["kernels"])
    for name in args.profile.split(","):
        if name in steps:
            prof = kernel_profile(steps[name], leaves[name], steps=3)
            results["variants"][name]["profile"] = {
                "kernels": {k: round(v, 3) for k, v in prof["kernels"].items()},
                "kernel_sum": round(prof["kernel_sum"], 3), "idle": round(prof["idle"], 3)}
            print(f"{name} kernels (ms per step, warm L2):")
            for k, v in list(prof["kernels"].items())[:12]:
                print(f"  {v:7.3f}  {k}")
    for name, v in results["variants"].items():
        v["median_ms"] = statistics.median(v["ms"])
        v["tflops"] = results["flop"] / v["median_ms"] / 1e9
    floor = results["variants"].get("cublas6", {}).get("median_ms")
    lines = ["| variant | ms | TF/s | / cuBLAS six GEMMs | peak beyond (MiB) | rel. err vs torch |",
             "|---|---|---|---|---|---|"]
    for name, v in results["variants"].items():
        ratio = f"{v['median_ms'] / floor:.3f}" if floor else "-"
        err = f"{v['rel_err']:.1e}" if "rel_err" in v else "-"
        lines.append(f"| {name} | {v['median_ms']:.3f} | {v['tflops']:.0f} | {ratio} | "
                     f"{v['peak_beyond_mib']:.0f} | {err} |")
    print("\n".join(lines))
    print(f"(used before the steps: {base / MIB:.0f} MiB)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
