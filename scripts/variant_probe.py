"""Time epilogue variants on the GPU, gluon family against hopper family, to find which part
of an epilogue costs the time (a development tool; the benchmark suite is ``evtfuse bench``).

    PYTHONPATH=src python3 scripts/variant_probe.py [--shape 8192x8192x1024] [--only a,b] [--once NAME]
        [--family gluon] [--mem-first eager] [--no-piece-loop]

Each variant is an epilogue source with its operands; ``--once NAME`` runs the first gluon
kernel of one variant a few times and exits (for ``ncu``).
"""

from __future__ import annotations

import argparse
import ast

import torch
import triton.testing

from evtfuse import EpilogueArguments, GemmArguments, get_kernels

BCE = "t = (1.0 - C) * (-f) + log(clamp(sigmoid(f), 1e-3, 0.999))"
VARIANTS = {
    "bce": f"def epi(accum, bias, C): f = accum + bias; {BCE}; loss = sum(t); D = f; return D, loss",
    "bce_stored": f"def epi(accum, bias, C): f = accum + bias; {BCE}; D = t; return D",
    "sum_only": "def epi(accum, bias, C): f = accum + bias; t = (1.0 - C) * (-f); loss = sum(t); D = f; return D, loss",
    "no_log": "def epi(accum, bias, C): f = accum + bias; "
              "t = (1.0 - C) * (-f) + clamp(sigmoid(f), 1e-3, 0.999); loss = sum(t); D = f; return D, loss",
    "no_sigmoid": "def epi(accum, bias, C): f = accum + bias; "
                  "t = (1.0 - C) * (-f) + log(clamp(f, 1e-3, 0.999)); loss = sum(t); D = f; return D, loss",
    "exp_only": "def epi(accum, bias, C): f = accum + bias; "
                "t = (1.0 - C) * (-f) + exp(f); loss = sum(t); D = f; return D, loss",
    "row_sum": f"def epi(accum, bias, C): f = accum + bias; {BCE}; loss = sum(t); D = f; return D, loss",
    # the parts of "sum_only": the vector, the C tile, the whole-output sum, each alone
    "bias_only": "def epi(accum, bias): D = accum + bias; return D",
    "c_only": "def epi(accum, bias, C): f = accum + bias; D = (1.0 - C) * (-f); return D",
    "sum_acc": "def epi(accum): loss = sum(accum); D = accum; return D, loss",
    "identity": "def epi(accum): D = accum; return D",
    # the relu-aux epilogue and its parts: the C tile with both stores, the two stores
    # alone, the C tile with one store
    "relu_aux": "def epi(accum, C, alpha): F = alpha * accum + C * 2.0; D = relu(F); return D, F",
    "two_stores": "def epi(accum, alpha): F = alpha * accum; D = relu(F); return D, F",
    "c_one_store": "def epi(accum, C, alpha): F = alpha * accum + C * 2.0; D = relu(F); return D",
}
ROW_OUT = {"row_sum"}


def make_args(name: str, M: int, N: int, K: int) -> GemmArguments:
    dt = torch.bfloat16
    A = torch.randn(M, K, device="cuda", dtype=dt)
    B = torch.randn(K, N, device="cuda", dtype=dt)
    params = [x.arg for x in ast.parse(VARIANTS[name]).body[0].args.args]
    ops = {"bias": torch.randn(N, device="cuda", dtype=dt),
           "C": (torch.rand(M, N, device="cuda") > 0.5).to(dt)}
    ops = {k: v for k, v in ops.items() if k in params}
    if "alpha" in params:
        ops["alpha"] = 1.5
    if "return D, F" in VARIANTS[name]:
        ops["F"] = torch.empty(M, N, device="cuda", dtype=dt)
    if "loss" in VARIANTS[name]:  # D computed, not stored
        ops["loss"] = torch.empty(M, 1, device="cuda") if name in ROW_OUT \
            else torch.empty(1, device="cuda")
        ops["D"] = None
    else:
        ops["D"] = torch.empty(M, N, device="cuda", dtype=dt)
    return GemmArguments(A, B, ops["D"], epilogue=EpilogueArguments(VARIANTS[name], **ops))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="8192x8192x1024")
    p.add_argument("--only", default="")
    p.add_argument("--once", default="")
    p.add_argument("--family", default="", help="time only this family's first kernel")
    p.add_argument("--mem-first", default="", choices=("", "eager", "second"),
                   help="when the gluon family loads its first two tiles' aux tiles")
    p.add_argument("--no-piece-loop", action="store_true",
                   help="the gluon family's epilogue pieces unrolled (no runtime loop)")
    a = p.parse_args()
    from evtfuse.backends.triton import gluon_codegen, gluon_kernel

    gluon_codegen.PIECE_LOOP = not a.no_piece_loop
    gluon_kernel.MEM_FIRST = a.mem_first or gluon_kernel.MEM_FIRST
    M, N, K = (int(x) for x in a.shape.split("x"))
    if a.once:
        args = make_args(a.once, M, N, K)
        k = [k for k in get_kernels(args) if k.family.name == "gluon"][0]
        for _ in range(3):
            k.run(args)
        torch.cuda.synchronize()
        return
    names = a.only.split(",") if a.only else list(VARIANTS)
    for name in names:
        args = make_args(name, M, N, K)
        seen = set()
        for k in get_kernels(args):
            if k.family.name in seen or k.family.name == "portable" or (
                    a.family and k.family.name != a.family):
                continue
            seen.add(k.family.name)
            ok = k.verify(args)
            ms = triton.testing.do_bench(lambda: k.run(args), warmup=30, rep=200, return_mode="median")
            print(f"{name:12s} {k.name:40s} {ms:.4f} ms verify={'ok' if ok else 'FAIL'}", flush=True)


if __name__ == "__main__":
    main()
