"""The MoE experts layer's kernels one by one (GPU): each of `evtfuse.nn.MoEExperts`' six
grouped GEMMs against `torch._grouped_mm` of the same shape, and the layer's memory passes
(the token gathers, the sum over k), so that the layer's time (`benchmarks/moe.py --layer`)
can be split into what each kernel costs.

    PYTHONPATH=src python3 scripts/moe_gemm_probe.py [--experts 8 --hidden 4096 --inter 14336
        --tokens 16384 --top-k 2] [--rounds 5] [--tune fast|exhaustive|none] [--guarded]
        [--down-grad-candidates N]

Rows (each timed in interleaved rounds against "mm", `torch._grouped_mm` of that GEMM with
no epilogue; uniform routing, `benchmarks/moe.py`'s `layer_routing`):

- up projection, rows x 2I x H over M: `evtfuse_up` (the layer's epilogue: G, U and
  s * act(G) * U), `evtfuse_identity` (the GEMM core alone);
- down projection, rows x H x I over M: `evtfuse` (plain);
- the backward's dA, rows x I x H over M: `evtfuse_down_grad` (the derived epilogue: reads
  G, U and s; writes dG, dU, s * A and the per-row ds), `evtfuse_identity`;
- dx, rows x H x 2I over M: `evtfuse`;
- the weights' gradients, grouped over K (each expert's rows): dW_gate_up (E x 2I x H) and
  dW_down (E x H x I): `evtfuse`;
- with ``--down-grad-candidates N``: the backward's dA with its derived epilogue in each of
  the first N kernels ``get_kernels`` offers for it, each alone (their outputs checked
  against the tuned call's first: bf16 tolerances), so the tuner's pick can be judged;
- memory passes: `gather` (x[perm // k], the permuted copy), `sum_pairs` (each token's k
  rows added back by embedding_bag) and `gather_sum` (the same by evtfuse's Triton kernel:
  ``moe.SUM_PAIRS``), against "mm" = a copy of the same bytes (`clone` of the rows).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

import evtfuse
from evtfuse.runtime import cache
from evtfuse.runtime import moe as moe_ops
from probe_common import report_rounds

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
from moe import layer_routing  # noqa: E402

IDENTITY = "def identity(accum):\n    D = accum\n    return D\n"


def summed(way: str, rows, perm, tokens: int, k: int):
    """``moe._sum_pairs`` with ``moe.SUM_PAIRS`` set to ``way`` for the call."""
    def run():
        kept, moe_ops.SUM_PAIRS = moe_ops.SUM_PAIRS, way
        try:
            return moe_ops._sum_pairs(rows, perm, tokens, k)
        finally:
            moe_ops.SUM_PAIRS = kept
    return run


def down_grad_candidates(n: int, groups: dict, dy_perm, down, offs, src, grad: dict, a, p, s,
                         dp, ds) -> dict:
    """{"mm": the plain grouped GEMM, kernel name: that kernel's run} for the first ``n``
    kernels offered for the backward's dA with its epilogue, each checked first against
    the tuned call's outputs (a candidate that differs is reported and left out)."""
    from evtfuse import EpilogueArguments, GemmArguments

    I = p.shape[1] // 2
    dA = next(v for t, v in groups.items() if t.startswith("backward dA"))
    dA["evtfuse_down_grad"]()
    want = [t.clone() for t in (a, dp, ds)]
    outs = {"D": a, grad["G"]: dp[:, :I], grad["U"]: dp[:, I:], grad["s"]: ds}
    args = GemmArguments(dy_perm, down, a, offs=offs, epilogue=EpilogueArguments.unbound(
        src, G=p[:, :I], U=p[:, I:], s=s, **outs))
    systems = {"mm": lambda: torch._grouped_mm(dy_perm, down, offs=offs)}
    for kern in evtfuse.get_kernels(args)[:n]:
        for t in (a, dp, ds):
            t.fill_(float("nan"))
        try:
            kern.run(args)
            for got, exp in zip((a, dp, ds), want):
                torch.testing.assert_close(got.float(), exp.float(), rtol=2e-2, atol=2e-2)
        except Exception as exc:  # noqa: BLE001  (reported, not timed)
            print(f"candidate {kern.name}: {type(exc).__name__}: {str(exc).splitlines()[0]}")
            continue
        systems[kern.name] = lambda kern=kern: kern.run(args)
    return systems


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--inter", type=int, default=14336)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tune", default="fast", choices=["none", "fast", "exhaustive"])
    ap.add_argument("--guarded", action="store_true")
    ap.add_argument("--down-grad-candidates", type=int, default=0, metavar="N")
    args = ap.parse_args()
    E, H, I, T, k = args.experts, args.hidden, args.inter, args.tokens, args.top_k
    bf, dev, tune = torch.bfloat16, "cuda", args.tune
    index, weights = layer_routing(T, E, k, skewed=False, device=dev)
    index, weights = index.to(dev), weights.to(dev)
    perm, offs = moe_ops._route(index, E)
    rows = T * k
    x = torch.randn(T, H, device=dev, dtype=bf)
    gate_up = torch.randn(E, 2 * I, H, device=dev, dtype=bf) * H ** -0.5
    down = torch.randn(E, H, I, device=dev, dtype=bf) * I ** -0.5
    x_perm = x[perm // k]
    s = weights.reshape(-1)[perm].unsqueeze(1)
    p = torch.randn(rows, 2 * I, device=dev, dtype=bf)
    dp = torch.empty_like(p)
    a = torch.empty(rows, I, device=dev, dtype=bf)
    full = torch.empty(rows, 2 * I, device=dev, dtype=bf)
    dy_perm = torch.randn(rows, H, device=dev, dtype=bf)
    y_perm = torch.randn(rows, H, device=dev, dtype=bf)
    ds = torch.zeros(rows, 1, device=dev, dtype=torch.float32)
    gg = evtfuse.grouped_gemm
    up_src = moe_ops.up_source("silu", bf)
    grad_src, outputs = moe_ops.down_grad("silu")
    grad = dict(outputs)
    gm = torch._grouped_mm

    groups = {
        f"up projection {rows}x{2 * I}x{H} over M": {
            "mm": lambda: gm(x_perm, gate_up.mT, offs=offs),
            "evtfuse_up": lambda: gg(x_perm, gate_up.mT, offs, up_src, D=a, G=p[:, :I],
                                     U=p[:, I:], s=s, tune=tune),
            "evtfuse_identity": lambda: gg(x_perm, gate_up.mT, offs, IDENTITY, D=full,
                                           tune=tune),
        },
        f"down projection {rows}x{H}x{I} over M": {
            "mm": lambda: gm(a, down.mT, offs=offs),
            "evtfuse": lambda: gg(a, down.mT, offs, tune=tune),
        },
        f"backward dA {rows}x{I}x{H} over M": {
            "mm": lambda: gm(dy_perm, down, offs=offs),
            "evtfuse_down_grad": lambda: gg(dy_perm, down, offs, grad_src, D=a, G=p[:, :I],
                                            U=p[:, I:], s=s, tune=tune,
                                            **{grad["G"]: dp[:, :I], grad["U"]: dp[:, I:],
                                               grad["s"]: ds}),
            "evtfuse_identity": lambda: gg(dy_perm, down, offs, IDENTITY, D=a, tune=tune),
        },
        f"backward dx {rows}x{H}x{2 * I} over M": {
            "mm": lambda: gm(p, gate_up, offs=offs),
            "evtfuse": lambda: gg(p, gate_up, offs, tune=tune),
        },
        f"dW_gate_up {E}x{2 * I}x{H} over K": {
            "mm": lambda: gm(p.t(), x_perm, offs=offs),
            "evtfuse": lambda: gg(p.t(), x_perm, offs, tune=tune),
        },
        f"dW_down {E}x{H}x{I} over K": {
            "mm": lambda: gm(dy_perm.t(), a, offs=offs),
            "evtfuse": lambda: gg(dy_perm.t(), a, offs, tune=tune),
        },
        f"memory passes over {rows} rows of {H}": {
            "mm": lambda: y_perm.clone(),
            "gather": lambda: x[perm // k],
            "sum_pairs": summed("embedding_bag", y_perm, perm, T, k),
            "gather_sum": summed("gather_sum", y_perm, perm, T, k),
        },
    }
    if args.down_grad_candidates:
        groups[f"backward dA {rows}x{I}x{H}: each candidate alone"] = down_grad_candidates(
            args.down_grad_candidates, groups, dy_perm, down, offs, grad_src, grad, a, p, s,
            dp, ds)
    for systems in groups.values():
        for fn in systems.values():  # compile and tune outside the timing
            fn()
    torch.cuda.synchronize()
    for rec in cache.list_entries():  # which kernel each evtfuse GEMM kept
        print(f"kept: {rec['epilogue']} {rec['M']}x{rec['N']}x{rec['K']}x{rec['L']}: {rec['kernel']}")
    f = 2 * rows * H * I
    print(f"{E} experts, H {H}, I {I}, {T} tokens, top-{k}: a forward {3 * f / 1e12:.2f} "
          f"TFLOP (up {2 * f / 1e12:.2f}, down {f / 1e12:.2f}); tune={tune}")
    for title, systems in groups.items():
        report_rounds(title, systems, args.rounds, args.guarded, 200)


if __name__ == "__main__":
    main()
