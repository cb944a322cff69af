"""fp8 accumulation: error and time of fast accumulation against promotion every k-step.

On Hopper the tensor cores add fp8 products in a reduced precision; ``fp8_fast_accum=True``
keeps that over the whole of K (Triton's default on sm_90), the default promotes each
k-step's partial sum to the fp32 accumulator (``max_num_imprecise_acc = BLOCK_K``). This
probe measures, per K and family, the error of both against an exact reference (fp8
products are exact in fp64), as the relative norm error and the largest error over the
accumulator's RMS, and their times beside ``torch._scaled_mm`` with and without its fast
accumulation (GPU, development tool):

    PYTHONPATH=src python3 scripts/fp8_accum_probe.py [--ks 256,1024,4096,16384] \
        [--time-shapes 4096x4096x4096,8192x8192x8192] [--rounds 5] [--every-config] [--tuned]
"""

from __future__ import annotations

import argparse

import torch
from triton.testing import do_bench

from evtfuse import EpilogueArguments, GemmArguments, get_kernels
from evtfuse.runtime.tuner import choose_kernel

E4M3 = torch.float8_e4m3fn
COPY = "def epi(accum): D = accum; return D"
SCALE_AMAX = "def epi(accum, scale): D = accum * scale; amax = max(abs(D)); return D, amax"


def operands(M, N, K, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    A = torch.randn(M, K, device="cuda", generator=g).to(E4M3)
    B = torch.randn(N, K, device="cuda", generator=g).to(E4M3).T  # K-contiguous
    return A, B


def kernel_for(args, family):
    ks = [k for k in get_kernels(args) if k.family.name == family]
    return ks[0] if ks else None


def errors(M, N, K, families):
    A, B = operands(M, N, K, seed=K)
    exact = A.double() @ B.double()
    rms = float(exact.pow(2).mean().sqrt())
    rows = []
    for family in families:
        for fast in (True, False):
            D = torch.full((M, N), float("nan"), device="cuda")
            args = GemmArguments(A, B, D, epilogue=EpilogueArguments(COPY, D=D),
                                 fp8_fast_accum=fast)
            k = kernel_for(args, family)
            if k is None:
                continue
            k.run(args)
            torch.cuda.synchronize()
            diff = (D.double() - exact).abs()
            rows.append((K, family, "fast" if fast else "promoted", k.name,
                         float(diff.norm() / exact.norm()), float(diff.max()) / rms))
    return rows


def timings(M, N, K, rounds, every_config=False, tuned=False):
    A, B = operands(M, N, K)
    one = torch.ones((), device="cuda")
    scale = torch.full((), 0.5, device="cuda")
    cases = {}
    for fast in (True, False):
        cases[f"_scaled_mm fast={fast}"] = (
            lambda fast=fast: torch._scaled_mm(A, B, scale_a=scale, scale_b=one,
                                               out_dtype=E4M3, use_fast_accum=fast))
        D = torch.empty(M, N, device="cuda", dtype=E4M3)
        amax = torch.empty(1, device="cuda")
        args = GemmArguments(A, B, D, epilogue=EpilogueArguments(SCALE_AMAX, scale=0.5, D=D,
                                                                 amax=amax),
                             fp8_fast_accum=fast)
        kernels = [kernel_for(args, f) for f in ("hopper", "portable")]
        if every_config and not fast:  # which tiles promotion suits (its registers)
            kernels = [k for k in get_kernels(args) if k.family.name == "hopper"]
        if tuned:  # the tuner's pick (tune="fast"), as evtfuse.gemm would run
            kernels.insert(0, choose_kernel(args, tune="fast"))
        for k in kernels:
            if k is not None:
                label = f"{k.name} fast={fast}{' (tuned)' if tuned and k is kernels[0] else ''}"
                cases.setdefault(label, lambda k=k, args=args: k.run(args))
    times = {name: [] for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            times[name].append(do_bench(fn, warmup=25, rep=100, return_mode="median"))
    return [(f"{M}x{N}x{K}", name, sorted(t)[len(t) // 2], min(t), max(t))
            for name, t in times.items()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ks", default="256,1024,4096,16384")
    p.add_argument("--size", type=int, default=2048, help="M = N of the error runs")
    p.add_argument("--families", default="hopper,portable")
    p.add_argument("--time-shapes", default="4096x4096x4096,8192x8192x8192")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--every-config", action="store_true",
                   help="time every hopper config with promotion")
    p.add_argument("--tuned", action="store_true", help="also time the tuner's pick")
    a = p.parse_args()
    print("K | family | accumulation | kernel | rel norm error | max error / RMS")
    for K in (int(k) for k in a.ks.split(",")):
        for row in errors(a.size, a.size, K, a.families.split(",")):
            print(f"{row[0]} | {row[1]} | {row[2]} | {row[3]} | {row[4]:.2e} | {row[5]:.2e}",
                  flush=True)
    if a.time_shapes:
        print("\nshape | system | median ms | min | max")
        for shape in a.time_shapes.split(","):
            M, N, K = (int(v) for v in shape.split("x"))
            for row in timings(M, N, K, a.rounds, a.every_config, a.tuned):
                print(f"{row[0]} | {row[1]} | {row[2]:.4f} | {row[3]:.4f} | {row[4]:.4f}",
                      flush=True)


if __name__ == "__main__":
    main()
