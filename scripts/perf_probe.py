"""Quick performance probe on the GPU: every candidate config of a few epilogues, timed
against cuBLAS (and torch.compile with --compile). A development tool, not the benchmark
suite (``evtfuse bench``): it prints per-config times so tile choices can be tuned.

    PYTHONPATH=src python3 scripts/perf_probe.py [--compile] [--only identity,alpha_beta]
"""

from __future__ import annotations

import argparse
import time

import torch
import triton.testing
from probe_common import epilogue_args

import evtfuse
from evtfuse import get_kernels

CASES = {
    "identity": "def epi(accum): D = accum; return D",
    "alpha_beta": "def epi(accum, C, alpha, beta): D = alpha * accum + beta * C; return D",
    "relu_aux": "def epi(accum, C, alpha): F = alpha * accum + C * 2.0; D = relu(F); return D, F",
    "gelu_bias": "def epi(accum, bias): D = gelu_tanh(accum + bias); return D",
    "bias_relu": "def epi(accum, bias): D = relu(accum + bias); return D",
    "silu_mul": "def epi(accum, C): D = silu(accum) * C; return D",
    "row_amax": "def epi(accum): D = accum; amax = max(abs(accum)); return D, amax",
    "bce": ("def epi(accum, bias, C): f = accum + bias; "
            "t = (1.0 - C) * (-f) + log(clamp(sigmoid(f), 1e-3, 0.999)); loss = sum(t); D = f; "
            "return D, loss"),
}
SHAPES = {"identity": [(4096, 4096, 4096), (8192, 8192, 8192)],
          "alpha_beta": [(8192, 8192, 1024), (4096, 4096, 4096)],
          "relu_aux": [(8192, 8192, 1024)],
          "gelu_bias": [(8192, 8192, 1024)], "silu_mul": [(8192, 8192, 1024)],
          "row_amax": [(8192, 8192, 1024), (4096, 4096, 4096)],
          "bce": [(8192, 8192, 1024), (4096, 4096, 4096)]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--compile", action="store_true")
    p.add_argument("--only", default="")
    p.add_argument("--max-configs", type=int, default=20)
    p.add_argument("--sweep", action="store_true", help="time a wide grid of hopper configs")
    p.add_argument("--gluon", action="store_true",
                   help="time gluon variants (epilogue split x GROUP_M) and the best hopper config")
    p.add_argument("--block-n", default="128", help="gluon variants' tile widths, e.g. 128,64")
    p.add_argument("--groups", default="8,4", help="gluon variants' GROUP_M values")
    p.add_argument("--shape", default="", help="MxNxK instead of the cases' shapes")
    p.add_argument("--stages", default="", help="gluon variants at these A/B stage counts "
                   "(e.g. 3,4,5) instead of as many as shared memory leaves")
    p.add_argument("--direct", choices=("auto", "all", "none"), default="auto",
                   help="gluon variants' outputs stored from registers: the family's choice, "
                   "every full output, or none")
    p.add_argument("--coop-chunks", action="store_true",
                   help="gluon cooperative tiles store tile-staged outputs by chunk from the "
                        "consumer too (gluon_family.COOP_CHUNKS)")
    p.add_argument("--small-m", action="store_true",
                   help="time hopper variants for small M instead of the library's candidates")
    p.add_argument("--portable", action="store_true",
                   help="also time the portable (non-persistent, plain tl.dot) family at tile "
                   "sizes that fit two CTAs per SM, as torch.compile's mm template does")
    p.add_argument("--coop-stages", default="",
                   help="also time the gluon family's cooperative 128x256 tiles at these A/B "
                   "stage counts (e.g. 3,4), in 4 and 2 column pieces")
    p.add_argument("--coop-eager", action="store_true",
                   help="cooperative tiles load the first tile's aux halves at once instead of "
                   "after the ring's first fill (``gluon_codegen.COOP_GO``); use its own "
                   "EVTFUSE_CACHE_DIR")
    p.add_argument("--loop-direct", action="store_true",
                   help="gluon quarters in the runtime piece loop with register-stored outputs too "
                   "(the generator keeps those unrolled)")
    a = p.parse_args()
    if a.coop_eager:
        from evtfuse.backends.triton import gluon_codegen

        gluon_codegen.COOP_GO = False
    if a.coop_chunks:
        from evtfuse.backends.triton import gluon_family
        gluon_family.COOP_CHUNKS = True
    if a.loop_direct:
        from evtfuse.backends.triton import gluon_codegen

        gluon_codegen.LOOP_DIRECT = True
    only = set(a.only.split(",")) if a.only else set(CASES)
    for name, src in CASES.items():
        if name not in only:
            continue
        shapes = [tuple(int(x) for x in a.shape.split("x"))] if a.shape else SHAPES[name]
        for (M, N, K) in shapes:
            args = epilogue_args(src, M, N, K)
            A, B, vals = args.A, args.B, args.epilogue.values
            mm = triton.testing.do_bench(lambda: A @ B, warmup=50, rep=300, return_mode="median")
            flops = 2 * M * N * K
            print(f"== {name} {M}x{N}x{K}: cuBLAS mm {mm:.4f} ms ({flops / mm / 1e9:.0f} TFLOP/s)",
                  flush=True)
            results = []
            every = get_kernels(args)
            kernels = every[: a.max_configs]
            if a.sweep:
                kernels = _sweep(every[0], name)
            if a.gluon:
                widths = [int(w) for w in a.block_n.split(",")]
                stages = [int(x) for x in a.stages.split(",")] if a.stages else None
                variants = _gluon_variants(every[0], args, widths, stages, a.direct,
                                           [int(g) for g in a.groups.split(",")])
                names = {k.name for k in variants}
                kernels = variants + [k for k in kernels if k.family.name == "gluon"
                                      and k.name not in names] + [
                    k for k in kernels if k.family.name == "hopper"][:2]
            if a.portable:
                kernels = kernels + _portable(every[0])
            if a.small_m:
                kernels = _small_m(every[0])
            if a.coop_stages:
                kernels = kernels + _coop(every[0], [int(x) for x in a.coop_stages.split(",")])
            for k in kernels:
                t0 = time.time()
                try:
                    ok = k.verify(args)
                    ms = triton.testing.do_bench(lambda: k.run(args), warmup=50, rep=300,
                                                 return_mode="median")
                except Exception as exc:  # noqa: BLE001 - probe reports and goes on
                    print(f"   {k.name:45s} FAILED {str(exc).splitlines()[0][:150]}", flush=True)
                    continue
                results.append((ms, k.name))
                print(f"   {k.name:45s} {ms:.4f} ms  x{ms / mm:.3f} of mm  "
                      f"verify={'ok' if ok else 'FAIL ' + ok.report()} ({time.time() - t0:.1f}s)",
                      flush=True)
            if a.compile:
                fn = _eager(name, vals)
                comp = torch.compile(fn, mode="max-autotune-no-cudagraphs")
                comp(A, B)
                cms = triton.testing.do_bench(lambda: comp(A, B), warmup=50, rep=300,
                                              return_mode="median")
                print(f"   torch.compile max-autotune: {cms:.4f} ms", flush=True)
            if results:
                best = min(results)
                print(f"   BEST {best[1]} {best[0]:.4f} ms = x{best[0] / mm:.3f} of mm", flush=True)


def _sweep(base, name):
    """Hopper variants: 128x256 at one CTA per SM against two smaller CTAs per SM, whose
    epilogues can overlap each other's mainloops."""
    import itertools

    from evtfuse.backends.triton.families import HopperFamily, TileConfig
    from evtfuse.runtime.kernel import Kernel

    configs = [TileConfig(128, 256, 64, 8, 8, 3, epi_split=2)]
    for g, fl in itertools.product((8, 16), (True, False)):
        configs.append(TileConfig(128, 128, 64, g, 8, 3, epi_split=2, flatten=fl, ctas_per_sm=2))
        configs.append(TileConfig(128, 128, 64, g, 4, 3, epi_split=2, flatten=fl, ctas_per_sm=2))
        configs.append(TileConfig(128, 128, 64, g, 4, 3, epi_split=1, flatten=fl, ctas_per_sm=2))
        configs.append(TileConfig(64, 256, 64, g, 4, 3, epi_split=2, flatten=fl, ctas_per_sm=2))
    # aux tiles loaded before the mainloop (one tile per SM at 2048^3 hides their load)
    configs.append(TileConfig(128, 256, 64, 8, 8, 3, epi_split=2, prefetch=True))
    configs.append(TileConfig(128, 256, 64, 8, 8, 3, epi_split=4, prefetch=True))
    configs.append(TileConfig(128, 128, 64, 8, 4, 3, epi_split=2, flatten=False, ctas_per_sm=2,
                              prefetch=True))
    configs.append(TileConfig(128, 128, 64, 8, 8, 2, epi_split=2, ctas_per_sm=2))
    configs.append(TileConfig(128, 256, 64, 8, 8, 2, epi_split=4, ctas_per_sm=2))
    return [Kernel(HopperFamily(), c, base.target) for c in configs]


def _small_m(base):
    """Hopper variants for small M (64x8192x8192: B's read is the cost): 64-row tiles with
    128-deep k-steps at several stage counts, the aux tiles loaded before the mainloop or
    after it, and narrower tiles at two programs per SM."""
    from evtfuse.backends.triton.families import HopperFamily, TileConfig
    from evtfuse.runtime.kernel import Kernel

    configs = [TileConfig(64, 64, 128, 8, 4, st, epi_split=1, prefetch=pf)
               for st in (4, 5, 6) for pf in (False, True)]
    configs += [TileConfig(64, 128, 128, 8, 4, 4, epi_split=1),
                TileConfig(64, 64, 256, 8, 4, 3, epi_split=1),
                TileConfig(64, 32, 128, 8, 4, 4, epi_split=1, ctas_per_sm=2)]
    return [Kernel(HopperFamily(), c, base.target) for c in configs]


def _coop(base, stage_counts):
    """Gluon cooperative 128x256 kernels at the given A/B stage counts (a count whose
    buffers do not fit shared memory fails to compile and is reported)."""
    from evtfuse.backends.triton.families import GluonFamily, TileConfig
    from evtfuse.runtime.kernel import Kernel

    fam = GluonFamily()
    return [Kernel(fam, TileConfig(fam.BM, fam.CO_BN, fam.BK, 8, 4, st, epi_split=sp,
                                   cooperative=True), base.target)
            for st in stage_counts for sp in (4, 2)]


def _portable(base):
    """Portable-family kernels (one CTA per tile, no TMA, no warp specialisation)."""
    from evtfuse.backends.triton.families import PortableFamily, TileConfig
    from evtfuse.runtime.kernel import Kernel

    configs = [TileConfig(128, 128, 64, 8, 4, 3), TileConfig(128, 128, 64, 8, 4, 4),
               TileConfig(128, 128, 64, 8, 8, 3), TileConfig(128, 128, 64, 8, 8, 4),
               TileConfig(128, 256, 64, 8, 8, 3), TileConfig(128, 64, 64, 8, 4, 4)]
    return [Kernel(PortableFamily(), c, base.target) for c in configs]


def _gluon_variants(base, args, widths=(128,), stage_counts=None, direct="auto", groups=(8, 4)):
    """The gluon family with its epilogue in 1, 2 or 4 column pieces, GROUP_M 4 and 8, tiles
    128 x each of ``widths`` (each with as many A/B stages as shared memory leaves, at
    least 4, at most 5 (6 for narrower tiles)), or at each of ``stage_counts``; ``direct``
    "all"/"none": every/no full output stored from registers (``KernelSpec.direct``)."""
    from evtfuse.backends.triton.spec import full_outputs
    from evtfuse.backends.triton.families import SMEM_LIMIT, GluonFamily, TileConfig
    from evtfuse.backends.triton.gluon_buffers import buffers
    from evtfuse.runtime.kernel import Kernel

    dag = args.optimized_dag
    fam = GluonFamily()
    if direct != "auto":
        stored = tuple(o.name for o in full_outputs(dag)) if direct == "all" else ()

        class Direct(GluonFamily):
            def _direct(self, dag, split, elt, stages=None):
                return stored

        fam = Direct()
    out = []
    for bn in widths:
        for sp in (1, 2, 4):
            out_direct = fam._direct(dag, sp, args.A.element_size())
            epi = buffers(dag, out_direct).smem_bytes(128, bn, bn // sp)
            stages = min(6 if bn < 128 else 5, (SMEM_LIMIT - GluonFamily.SMEM_RESERVE - epi) // ((128 + bn) * 64 * args.A.element_size()))
            for g in groups:
                for st in stage_counts or ([stages] if stages >= 4 else []):
                    out.append(Kernel(fam, TileConfig(128, bn, 64, g, 4, st, epi_split=sp),
                                      base.target))
    return out


def _eager(name, vals):
    C, bias = vals.get("C"), vals.get("bias")
    if name == "identity":
        return lambda A, B: A @ B
    if name == "alpha_beta":
        return lambda A, B: (1.5 * (A @ B).float() + 0.5 * C.float()).to(A.dtype)
    if name == "relu_aux":
        def f(A, B):
            F = 1.5 * (A @ B).float() + C.float() * 2.0
            return torch.relu(F).to(A.dtype), F.to(A.dtype)
        return f
    return lambda A, B: torch.nn.functional.gelu((A @ B).float() + bias.float(),
                                                 approximate="tanh").to(A.dtype)


if __name__ == "__main__":
    evtfuse.runtime  # noqa: B018
    main()
