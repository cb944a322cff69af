"""Small M on a GPU (issue 48's decode and few-token shapes): evtfuse's split-K kernels
(``runtime.split_k``) and its families' first kernels against cuBLAS, for the identity
epilogue and bias + gelu_tanh.

    PYTHONPATH=src python3 scripts/small_m_probe.py [--ms 1,16,64,256]
        [--shapes 4096x4096,14336x4096,4096x14336] [--rounds 5] [--families 4] [--json J]

Per M and N x K (bf16), each timed in interleaved rounds against "mm" (cuBLAS: ``A @ B``
for identity, cuBLASLt's ``torch._addmm_activation(bias, A, B, use_gelu=True)`` for bias +
gelu): ``evtfuse`` (``evtfuse.gemm``, tuned: the kernel it kept is printed),
``mm_graph`` and ``evtfuse_graph`` (the same two calls replayed from CUDA graphs: no host
work per call), each split-K
candidate alone (``splitkS_...``), the same slice counts with each family's first kernel
for the slices (which inner kernel split-K should take), and the first ``--families``
kernels of the families (what a tuning without split-K would choose among).
"""

from __future__ import annotations

import argparse
import json

import torch

import evtfuse
from evtfuse import EpilogueArguments, GemmArguments
from evtfuse.bench.timing import graph_replay
from evtfuse.runtime import discovery, split_k, tuner
from probe_common import print_rounds, time_rounds

EPIS = {"identity": "def e(accum):\n    D = accum\n    return D",
        "bias_gelu": "def e(accum, bias):\n    D = gelu_tanh(accum + bias)\n    return D"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ms", default="1,16,64,256")
    ap.add_argument("--shapes", default="4096x4096,14336x4096,4096x14336", help="NxK")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--families", type=int, default=4)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    from triton.testing import do_bench

    timer = lambda fn: do_bench(fn, warmup=25, rep=100, return_mode="median")  # noqa: E731
    rows = []
    for nk in a.shapes.split(","):
        N, K = (int(v) for v in nk.split("x"))
        B = (torch.randn(K, N, device="cuda") * K ** -0.5).to(torch.bfloat16)
        bias = torch.randn(N, device="cuda").to(torch.bfloat16)
        for m in (int(v) for v in a.ms.split(",")):
            A = torch.randn(m, K, device="cuda").to(torch.bfloat16)
            for name, src in EPIS.items():
                D = torch.empty(m, N, device="cuda", dtype=torch.bfloat16)
                named = {"D": D, **({"bias": bias} if "bias" in src else {})}
                args = GemmArguments(A, B, D, epilogue=EpilogueArguments(src, **named))
                extra = {k: v for k, v in named.items() if k != "D"}
                systems = {
                    "mm": (lambda: A @ B) if name == "identity" else
                    (lambda: torch._addmm_activation(bias, A, B, use_gelu=True)),
                    "evtfuse": lambda: evtfuse.gemm(A, B, src, D=D, tune="fast", **extra),
                }
                kernels = evtfuse.get_kernels(args)
                split = [k for k in kernels if isinstance(k, split_k.SplitKernel)]
                others = [k for k in kernels if not isinstance(k, split_k.SplitKernel)]
                # beside the offered split-K kernels, the same slices run by each family's
                # first kernel (which inner kernel a split-K candidate should take)
                target = discovery._target(args, None)
                more = []
                for S in split_k.factors(args, target):
                    W = torch.empty((S, m, N), device="cuda")
                    inner = discovery.kernels_for(split_k.partial_arguments(args, S, W), target)
                    firsts = {k.family.name: k for k in reversed(inner)}
                    more += [split_k.split_kernel(k, S, target) for k in firsts.values()]
                for k in split + [k for k in more if k not in split] + others[:a.families]:
                    systems[k.name] = (lambda kk: lambda: kk.run(args))(k)
                for fn in systems.values():
                    fn()
                torch.cuda.synchronize()
                # cuBLAS and the tuned evtfuse call replayed from CUDA graphs: the GPU's time
                # without the host's per-call work (decode loops capture their steps)
                systems["mm_graph"] = graph_replay(systems["mm"])
                systems["evtfuse_graph"] = graph_replay(systems["evtfuse"])
                chosen = tuner.choose_kernel(args, "fast").name
                title = f"{name} M={m} N={N} K={K} (evtfuse kept {chosen})"
                got = time_rounds(systems, a.rounds, timer)
                print_rounds(title, got)
                rows.append({"epilogue": name, "M": m, "N": N, "K": K, "chosen": chosen,
                             "factors": split_k.factors(args, discovery._target(args, None)),
                             "ms": got})
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
