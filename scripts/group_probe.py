"""Tile order (GROUP_M) of the library's gluon candidates, timed (GPU, development tool).

How many row-tiles a band of the persistent tile order spans decides how much of A and B
one wave of tiles touches, and so how often B's lines come back from DRAM instead of L2
while the output's writes stream through it. This probe takes the first gluon candidates
of each case, reorders each at several GROUP_M values, and times them against cuBLAS's
``A @ B`` (and cuBLASLt's fused epilogue where PyTorch reaches one): every system once per round, rounds interleaved, each time the median of
``bench.timing.guarded_ms`` (L2 flushed, no host time between the events). Verifies every
kernel first.

    PYTHONPATH=src python3 scripts/group_probe.py [--shape 8192x8192x1024] [--groups 1,2,4,8,16]
        [--only identity,row_amax] [--max-configs 4] [--rounds 3] [--families gluon,hopper]
"""

from __future__ import annotations

import argparse

from probe_common import distinct_configs, epilogue_args, print_rounds, time_rounds

from evtfuse import get_kernels
from evtfuse.bench.timing import guarded_ms

CASES = {
    "identity": "def epi(accum): D = accum; return D",
    "row_amax": "def epi(accum): D = accum; amax = max(abs(accum)); return D, amax",
    "bce": ("def epi(accum, bias, C): f = accum + bias; "
            "t = (1.0 - C) * (-f) + log(clamp(sigmoid(f), 1e-3, 0.999)); loss = sum(t); D = f; "
            "return D, loss"),  # D not stored (passed as None), as in the suite
    "alpha_beta": "def epi(accum, C, alpha, beta): D = alpha * accum + beta * C; return D",
    "bias_relu": "def epi(accum, bias): D = relu(accum + bias); return D",
    "gelu_bias": "def epi(accum, bias): D = gelu_tanh(accum + bias); return D",
    "relu_aux": "def epi(accum, C, alpha): F = alpha * accum + C * 2.0; D = relu(F); return D, F",
    "silu_mul": "def epi(accum, C): D = silu(accum) * C; return D",
    "row_lse": "def epi(accum): D = accum; lse = logsumexp(accum); return D, lse",
    # many-op epilogues that store their result (WIDE_WORK's threshold; BCE stores nothing)
    "eight_ops": ("def epi(accum, bias): f = accum + bias; "
                  "D = tanh(f) * sigmoid(f) + exp(-abs(f)); return D"),
    "six_ops": ("def epi(accum, bias, alpha): "
                "D = clamp(gelu_tanh(alpha * accum + bias), -1.0, 1.0) * 2.0 + 1.0; return D"),
}


def _lt(name: str, args):
    """cuBLASLt's fused epilogue for ``name`` where PyTorch reaches one (as the suite's)."""
    import torch

    A, B, v = args.A, args.B, args.epilogue.values
    if name == "bias_relu":
        return lambda: torch._addmm_activation(v["bias"], A, B)
    if name == "gelu_bias":
        return lambda: torch._addmm_activation(v["bias"], A, B, use_gelu=True)
    if name == "alpha_beta":
        return lambda: torch.addmm(v["C"], A, B, beta=0.5, alpha=1.5)
    return None


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="8192x8192x1024")
    p.add_argument("--only", default="identity,row_amax")
    p.add_argument("--groups", default="1,2,4,8,16")
    p.add_argument("--max-configs", type=int, default=4, help="gluon candidates per case")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--families", default="gluon",
                   help="families whose candidates are taken (e.g. gluon,hopper)")
    a = p.parse_args()
    M, N, K = (int(x) for x in a.shape.split("x"))
    groups = [int(g) for g in a.groups.split(",")]
    for name in a.only.split(","):
        args = epilogue_args(CASES[name], M, N, K, labels=name == "bce")  # BCE: 0/1 labels
        bases = distinct_configs(get_kernels(args), lambda k: k.family.name in a.families.split(","))
        systems = {"mm": lambda: args.A @ args.B}
        if _lt(name, args) is not None:
            systems["cuBLASLt"] = _lt(name, args)
        for base in bases[: a.max_configs]:
            for g in groups:
                k = base.with_config(group_m=g)
                ok = k.verify(args)
                if not ok:
                    print(f"{name} {k.name}: VERIFY FAILED {ok.report()}", flush=True)
                    continue
                systems[k.name] = lambda k=k: k.run(args)
        print_rounds(f"{name} {a.shape} ({a.rounds} rounds)",
                     time_rounds(systems, a.rounds, guarded_ms), by_time=True)

if __name__ == "__main__":
    main()
