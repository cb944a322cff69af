"""A mixture of experts' up-projection with a SwiGLU epilogue and routing weights, measured
on a GPU, every peer in the same run (BENCHMARKS.md, "Mixture of experts"):

    PYTHONPATH=src python3 benchmarks/moe.py --out bench_out/moe.json

16384 routed tokens, bf16, two configurations: 8 experts of 4096 -> 2 x 14336 (Mixtral-like)
and 64 experts of 2048 -> 2 x 1408 (fine-grained), each with uniform routing and with
skewed routing (one expert a quarter of the tokens, a few experts empty). Group sizes are
multiples of 16 (what ``torch._grouped_mm`` asks of its offsets). Per cell:

- ``grouped_mm``: ``torch._grouped_mm(x, W.mT, offs)`` alone, no epilogue (the floor);
- ``grouped_mm_eager``: the same, then the epilogue in eager torch
  (``silu(gate) * up * w`` over the concatenated [gate | up] halves);
- ``grouped_mm_compile``: ``torch.compile`` of that pair;
- ``evtfuse``: ``evtfuse.grouped_gemm`` with the epilogue fused (gate and up interleaved,
  ``interleave_gate_up(..., dim=1)``), its first call (tuning included) and its error
  against the eager pair;
- ``evtfuse_concat``: the same on the peers' own concatenated [gate; up] weights
  (``pairs(accum, layout="concatenated")``: no interleaved copy of the weights).

Times are medians of ``triton.testing.do_bench``; TFLOP/s count 2 * T * K * 2N; ``dense_mm``
is one plain (T, K) @ (K, 2N) GEMM of the same FLOPs, the throughput a grouped GEMM aims at.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.nn.functional as F
import triton.testing

import evtfuse

BF = torch.bfloat16
TOKENS = 16384
CONFIGS = {"8x4096x14336": (8, 4096, 14336), "64x2048x1408": (64, 2048, 1408)}
EPILOGUE = """def moe_swiglu(accum, w):
    gate, up = pairs(accum)
    D = silu(gate) * up * w
    return D"""
EPILOGUE_CONCAT = EPILOGUE.replace("pairs(accum)", 'pairs(accum, layout="concatenated")')


def _ms(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def group_sizes(G: int, T: int, skewed: bool, multiple: int = 16) -> list[int]:
    """Rows per expert summing to T, each a multiple of ``multiple``: uniform, or one
    expert a quarter of T, every eighth expert empty and the rest uneven."""
    units = T // multiple
    if skewed:
        big = units // 4
        weights = [0 if g % 8 == 7 else 1 + (g * 5) % 7 for g in range(G)]
        weights[0] = 0
        rest = units - big
        sizes = [rest * w // sum(weights) for w in weights]
        sizes[0] = big
    else:
        sizes = [units // G] * G
    sizes[-1 if not skewed else 1] += units - sum(sizes)
    return [s * multiple for s in sizes]


def cell(G: int, K: int, N: int, skewed: bool) -> dict:
    torch.manual_seed(0)
    T = TOKENS
    x = torch.randn(T, K, device="cuda", dtype=BF)
    Wg = (torch.randn(G, N, K, device="cuda") * K ** -0.5).to(BF)
    Wu = (torch.randn(G, N, K, device="cuda") * K ** -0.5).to(BF)
    W_cat = torch.cat((Wg, Wu), dim=1)                        # (G, 2N, K): [gate; up]
    W_int = evtfuse.interleave_gate_up(Wg, Wu, dim=1)         # (G, 2N, K): interleaved
    w = torch.rand(T, 1, device="cuda", dtype=torch.float32)
    sizes = group_sizes(G, T, skewed)
    offs = torch.tensor(sizes, device="cuda", dtype=torch.int32).cumsum(0).to(torch.int32)
    D = torch.empty(T, N, device="cuda", dtype=BF)

    def grouped_mm():
        return torch._grouped_mm(x, W_cat.mT, offs=offs)

    def eager_pair(x, W_cat, offs, w):
        h = torch._grouped_mm(x, W_cat.mT, offs=offs)
        return (F.silu(h[:, :N]) * h[:, N:] * w).to(BF)

    def eager():
        return eager_pair(x, W_cat, offs, w)

    compiled_pair = torch.compile(eager_pair, mode="max-autotune-no-cudagraphs")

    def compiled():
        return compiled_pair(x, W_cat, offs, w)

    def ev():
        return evtfuse.grouped_gemm(x, W_int.mT, offs, EPILOGUE, w=w, D=D)

    def ev_concat():
        return evtfuse.grouped_gemm(x, W_cat.mT, offs, EPILOGUE_CONCAT, w=w, D=D)

    flop = 2 * T * K * 2 * N
    out: dict = {"experts": G, "K": K, "N": N, "tokens": T,
                 "routing": "skewed" if skewed else "uniform", "largest_group": max(sizes),
                 "empty_groups": sum(s == 0 for s in sizes)}
    t = time.perf_counter()
    ev()
    torch.cuda.synchronize()
    out["evtfuse_first_call_s"] = time.perf_counter() - t
    want = eager().float()
    got = ev().float()
    out["evtfuse_rel_err"] = float((got - want).norm() / want.norm())
    ev_concat()  # tuning
    got = ev_concat().float()
    out["evtfuse_concat_rel_err"] = float((got - want).norm() / want.norm())
    from evtfuse.runtime import cache  # the kernels the tuner chose (this shape's records)

    out["evtfuse_kernels"] = sorted({e["kernel"] for e in cache.list_entries()
                                     if e.get("epilogue") == "moe_swiglu" and e.get("K") == K})
    xd, Wd = x, W_cat[0].mT  # one (K, 2N) column-major B, as each group's
    peers = {"dense_mm": lambda: xd @ Wd, "grouped_mm": grouped_mm, "grouped_mm_eager": eager,
             "grouped_mm_compile": compiled, "evtfuse": ev, "evtfuse_concat": ev_concat}
    for name, fn in peers.items():
        try:
            ms = _ms(fn)
            out[f"{name}_ms"] = ms
            out[f"{name}_tflops"] = flop / ms / 1e9
        except Exception as e:  # noqa: BLE001  (one peer's failure does not lose the others)
            out[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:500]}"
    for peer in ("grouped_mm", "grouped_mm_eager", "grouped_mm_compile"):
        for ev_name in ("evtfuse", "evtfuse_concat"):
            if f"{ev_name}_ms" in out and f"{peer}_ms" in out:
                out[f"{ev_name}_over_{peer}"] = out[f"{ev_name}_ms"] / out[f"{peer}_ms"]
    return out


def table(cells: list) -> str:
    rows = ["| experts x K x N | routing | grouped_mm ms (TFLOP/s) | + eager epilogue | "
            "torch.compile | evtfuse | evtfuse / grouped_mm | / eager | / compile |",
            "|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        if "error" in c:
            rows.append(f"| {c['name']} | | error: {c['error'][:80]} |||||||")
            continue

        def ms(p):
            return f"{c[p + '_ms']:.3f} ({c[p + '_tflops']:.0f})" if p + "_ms" in c else "error"

        def ratio(p):
            return f"{c['evtfuse_over_' + p]:.3f}" if "evtfuse_over_" + p in c else "-"

        rows.append(f"| {c['experts']}x{c['K']}x{c['N']} | {c['routing']} | {ms('grouped_mm')} | "
                    f"{ms('grouped_mm_eager')} | {ms('grouped_mm_compile')} | {ms('evtfuse')} | "
                    f"{ratio('grouped_mm')} | {ratio('grouped_mm_eager')} | "
                    f"{ratio('grouped_mm_compile')} |")
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench_out/moe.json")
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--routing", default="uniform,skewed")
    a = p.parse_args()
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "triton": triton.__version__, "cells": []}
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    for name in a.configs.split(","):
        for routing in a.routing.split(","):
            try:
                c = cell(*CONFIGS[name], skewed=routing == "skewed")
            except Exception as e:  # noqa: BLE001  (a failed cell is a result)
                c = {"error": f"{type(e).__name__}: {str(e)[:1000]}"}
            c["name"] = f"{name} {routing}"
            results["cells"].append(c)
            print(json.dumps(c), flush=True)
            with open(a.out, "w") as f:  # after each: a run stopped at its limit keeps the rest
                json.dump(results, f, indent=1)
    print(table(results["cells"]))


if __name__ == "__main__":
    main()
