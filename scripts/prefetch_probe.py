"""Where does evtfuse lose its last microsecond at small M? (GPU, development tool.)

Times hopper- and portable-family kernels against cuBLAS's ``A @ B`` (and, with
``--compile``, torch.compile's max-autotune kernel), every system once per round, rounds
interleaved, so that a difference of ~0.5 us on a 60 us kernel stands out of the GPU's
drift. Variants: ``TileConfig.prefetch`` (full aux tiles requested before the mainloop),
and ``--shape-constants``: the same kernel recompiled with M, N and/or K as constexprs (as
torch.compile's templates are). ``--guarded`` keeps the GPU busy while each call is
enqueued, so that no host time can fall between the events. Verifies every kernel first.

    PYTHONPATH=src python3 scripts/prefetch_probe.py [--shape 64x8192x8192] [--rounds 5] \
        [--guarded] [--compile] [--general] [--shape-constants K,NK,MNK] \
        [--configs 64x64x128s5,p64x64x128s5]
"""

from __future__ import annotations

import argparse
import re

import torch

from probe_common import edited_launcher, epilogue_args, report_rounds

from evtfuse import GemmArguments
from evtfuse.backends.triton.families import HopperFamily, PortableFamily, TileConfig
from evtfuse.runtime.kernel import Kernel
from evtfuse.runtime.tuner import choose_kernel

CASES = {
    "bias_relu": "def epi(accum, bias): D = relu(accum + bias); return D",
    "relu_aux": "def epi(accum, C, alpha): F = alpha * accum + C * 2.0; D = relu(F); return D, F",
    "alpha_beta": "def epi(accum, C, alpha, beta): D = alpha * accum + beta * C; return D",
    "gelu_bias": "def epi(accum, bias): D = gelu_tanh(accum + bias); return D",
    "row_scale": "def epi(accum, s, bias): D = accum * s + bias; return D",
    "silu_mul": "def epi(accum, C): D = silu(accum) * C; return D",
    "bce": ("def epi(accum, bias, C): f = accum + bias; "
            "t = (1.0 - C) * (-f) + log(clamp(sigmoid(f), 1e-3, 0.999)); loss = sum(t); D = f; "
            "return D, loss"),  # D not stored, 0/1 labels, as in the suite (no --compile form)
}


def _eager(name: str, args: GemmArguments):
    """The epilogue in PyTorch for ``torch.compile`` (fp32 math, as the suite's)."""
    v = args.epilogue.values
    A, B = args.A, args.B
    if name == "bce":
        raise SystemExit("bce: no torch.compile form in this probe (the suite has one)")
    if name == "bias_relu":
        return lambda: torch.relu((A @ B).float() + v["bias"].float()).to(A.dtype)
    if name == "relu_aux":
        def f():
            F = 1.5 * (A @ B).float() + v["C"].float() * 2.0
            return torch.relu(F).to(A.dtype), F.to(A.dtype)
        return f
    if name == "alpha_beta":
        return lambda: (1.5 * (A @ B).float() + 0.5 * v["C"].float()).to(A.dtype)
    if name == "gelu_bias":
        return lambda: torch.nn.functional.gelu((A @ B).float() + v["bias"].float(),
                                                approximate="tanh").to(A.dtype)
    if name == "silu_mul":
        return lambda: (torch.nn.functional.silu((A @ B).float()) * v["C"].float()).to(A.dtype)
    return lambda: ((A @ B).float() * v["s"] + v["bias"].float()).to(A.dtype)


def _shape_constants(kernel: Kernel, args: GemmArguments, which: str = "MNK"):
    """``kernel`` recompiled with the sizes in ``which`` (of M, N, K) as compile-time
    constants (torch.compile's templates have all three), launched through Triton's JIT;
    None where the source does not match."""
    src = kernel.source(args)
    m = re.search(r"def evtfuse_kernel\((\w+), (\w+), M, N, K,", src)
    if m is None:
        return None
    sig = ", ".join(f"{d}: tl.constexpr" if d in which else d for d in "MNK")
    new = src[:m.start()] + f"def evtfuse_kernel({m.group(1)}, {m.group(2)}, {sig}," + src[m.end():]
    return edited_launcher(kernel, args, new)


def _general(kernel: Kernel, args: GemmArguments):
    """``kernel`` with its one-row / one-wave specializations off (the general path)."""
    plan = kernel.plan(args)
    fn = kernel.compile(args)[plan.grid]
    consts = {**plan.consts, "ONE_ROW": False}
    if "ONE_WAVE" in consts:
        consts["ONE_WAVE"] = False
    return lambda: fn(*plan.positional(args.A, args.B, args.epilogue.values), **consts)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="64x8192x8192")
    p.add_argument("--only", default=",".join(CASES))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--rep-ms", type=float, default=150)
    p.add_argument("--guarded", action="store_true",
                   help="time with the GPU kept busy while each call is enqueued (host cost "
                        "cannot show) instead of triton.testing.do_bench")
    p.add_argument("--shape-constants", default="",
                   help="also each kernel recompiled with these sizes as constexprs, e.g. "
                        "K,NK,MNK")
    p.add_argument("--general", action="store_true",
                   help="also each kernel with the one-row / one-wave paths off (ONE_ROW, "
                        "ONE_WAVE False: the grouped tile order's divisions and a runtime "
                        "loop end), launched through Triton's JIT")
    p.add_argument("--compile", action="store_true",
                   help="also torch.compile(mode='max-autotune-no-cudagraphs') of the epilogue")
    p.add_argument("--configs", default="64x64x128s5,64x64x64s6",
                   help="hopper tiles MxNxK with stage count (and warps, epilogue pieces and "
                        "two programs per SM: 64x64x128s5w4, 128x128x64s3w4e2o2; 'l2': aux tiles "
                        "asked into L2 over the mainloop, TileConfig.l2_spread), each "
                        "timed with and without prefetch; a leading 'p': the portable "
                        "family's (one program per tile, pointer loads, as torch.compile's mm "
                        "template)")
    a = p.parse_args()
    M, N, K = (int(x) for x in a.shape.split("x"))
    for name in a.only.split(","):
        args = epilogue_args(CASES[name], M, N, K, labels=name == "bce")
        target = choose_kernel(args).target
        systems = {"mm": lambda: args.A @ args.B}
        tuned = choose_kernel(args)
        systems[f"tuned {tuned.name}"] = lambda k=tuned: k.run(args)
        if a.general:
            systems["tuned general"] = _general(tuned, args)
        for which in a.shape_constants.split(",") if a.shape_constants else []:
            const = _shape_constants(tuned, args, which)
            if const is not None:
                systems[f"tuned {which} const"] = const
        for c in a.configs.split(","):
            m = re.fullmatch(r"(p?)(\d+)x(\d+)x(\d+)s(\d+)(?:w(\d+))?(?:e(\d+))?(o2)?(l2)?", c)
            if m is None:
                raise SystemExit(f"config {c!r}: expected [p]MxNxKsS[wW][eE][o2][l2]")
            portable = bool(m.group(1))
            bm, bn, bk, st = (int(m.group(i)) for i in range(2, 6))
            warps, split = int(m.group(6) or 4), int(m.group(7) or 1)
            two = dict(ctas_per_sm=2, flatten=False) if m.group(8) else {}
            if m.group(9):
                two["l2_spread"] = True
            for pf in ((False,) if portable or m.group(9) else (False, True)):
                fam = PortableFamily() if portable else HopperFamily()
                k = Kernel(fam, TileConfig(bm, bn, bk, 8, warps, st, epi_split=split,
                                           prefetch=pf, **two), target)
                ok = k.verify(args)
                if not ok:
                    print(f"{name} {k.name}: VERIFY FAILED {ok.report()}", flush=True)
                    continue
                systems[k.name] = lambda k=k: k.run(args)
                if a.general:
                    systems[f"{k.name} general"] = _general(k, args)
                for which in (a.shape_constants.split(",") if a.shape_constants and not pf
                              else []):
                    const = _shape_constants(k, args, which)
                    if const is not None:
                        systems[f"{k.name} {which} const"] = const
        if a.compile:
            comp = torch.compile(_eager(name, args), mode="max-autotune-no-cudagraphs")
            comp()
            systems["torch.compile"] = comp
        report_rounds(f"{name} {a.shape}", systems, a.rounds, a.guarded, a.rep_ms)

if __name__ == "__main__":
    main()
