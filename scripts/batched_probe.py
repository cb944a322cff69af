"""Batched problems (L > 1) on the gluon and hopper families: each family's first
configs verified and timed, the best of each reported beside cuBLAS's batched GEMM alone
(``torch.bmm``/``torch.matmul``, the mainloop's floor) and eager PyTorch (the GEMM, then
the epilogue's kernels). A development probe for the gluon family's batched kernels
(BENCHMARKS.md, twentieth session); not part of the library.

    PYTHONPATH=src python3 scripts/batched_probe.py [--configs 4] [--cases NAME ...]
"""

from __future__ import annotations

import argparse

import torch
import triton.testing

from evtfuse import EpilogueArguments, GemmArguments, get_kernels

BF = torch.bfloat16


def _rand(*shape, dtype=BF):
    return torch.randn(*shape, device="cuda").to(dtype)


def alpha_beta(L, M, N, K):
    """Per-batch A, B and C (a batched residual update)."""
    A, B, C = _rand(L, M, K), _rand(L, K, N), _rand(L, M, N)
    D = torch.empty(L, M, N, device="cuda", dtype=BF)
    src = "def epi(accum, C, alpha, beta): D = alpha * accum + beta * C; return D"
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(src, C=C, alpha=1.5, beta=0.5, D=D))
    return args, lambda: 1.5 * torch.matmul(A, B) + 0.5 * C


def shared_weight_gelu(L, M, N, K):
    """Per-batch activations, one weight and bias for every batch (a batched linear)."""
    A, B, bias = _rand(L, M, K), _rand(K, N) * 0.05, _rand(N)
    D = torch.empty(L, M, N, device="cuda", dtype=BF)
    src = "def epi(accum, bias): D = gelu_tanh(accum + bias); return D"
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(src, bias=bias, D=D))
    return args, lambda: torch.nn.functional.gelu(torch.matmul(A, B) + bias, approximate="tanh")


def relu_aux(L, M, N, K):
    """Per-batch C in, D and F out."""
    A, B, C = _rand(L, M, K), _rand(L, K, N) * 0.05, _rand(L, M, N)
    D = torch.empty(L, M, N, device="cuda", dtype=BF)
    F = torch.empty(L, M, N, device="cuda", dtype=BF)
    src = "def epi(accum, C, alpha): F = alpha * accum + C * 2.0; D = relu(F); return D, F"
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(src, C=C, alpha=0.5, D=D, F=F))

    def eager():
        f = 0.5 * torch.matmul(A, B) + C * 2.0
        return torch.relu(f), f
    return args, eager


def row_lse(L, M, N, K):
    """Per-batch, per-row logsumexp with D stored (attention-like scores)."""
    A, B = _rand(L, M, K), _rand(L, K, N) * 0.05
    D = torch.empty(L, M, N, device="cuda", dtype=BF)
    lse = torch.empty(L, M, 1, device="cuda")
    src = "def epi(accum): D = accum; lse = logsumexp(accum); return D, lse"
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(src, D=D, lse=lse))

    def eager():
        s = torch.matmul(A, B)
        return s, torch.logsumexp(s.float(), dim=-1, keepdim=True)
    return args, eager


CASES = {
    "alpha_beta_8x2048x2048x1024": (alpha_beta, (8, 2048, 2048, 1024)),
    "alpha_beta_4x4096x4096x1024": (alpha_beta, (4, 4096, 4096, 1024)),
    "gelu_shared_w_16x1024x4096x1024": (shared_weight_gelu, (16, 1024, 4096, 1024)),
    "relu_aux_8x2048x2048x1024": (relu_aux, (8, 2048, 2048, 1024)),
    "row_lse_32x1024x1024x128": (row_lse, (32, 1024, 1024, 128)),
}


def _ms(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", type=int, default=4, help="configs timed per family")
    p.add_argument("--cases", nargs="*", default=list(CASES))
    a = p.parse_args()
    print("| case | gluon ms (config) | hopper ms (config) | gluon/hopper | GEMM alone ms | eager ms |")
    print("|---|---|---|---|---|---|")
    for name in a.cases:
        make, shape = CASES[name]
        args, eager = make(*shape)
        ks = get_kernels(args)
        best = {}
        for fam in ("gluon", "hopper"):
            for k in [k for k in ks if k.family.name == fam][:a.configs]:
                result = k.verify(args)
                assert result, f"{k.name}: {result.report()}"
                t = _ms(lambda: k.run(args))
                print(f"  {name} {k.name} {t:.4f} ms", flush=True)
                if fam not in best or t < best[fam][0]:
                    best[fam] = (t, k.config.name)
        A, B = args.A, args.B
        gemm = _ms(lambda: torch.matmul(A, B))
        eag = _ms(eager)
        g, h = best.get("gluon", (float("nan"), "-")), best.get("hopper", (float("nan"), "-"))
        print(f"| {name} | {g[0]:.4f} ({g[1]}) | {h[0]:.4f} ({h[1]}) | {g[0] / h[0]:.3f} | "
              f"{gemm:.4f} | {eag:.4f} |", flush=True)


if __name__ == "__main__":
    main()
