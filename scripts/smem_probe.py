"""Shared memory of gluon kernels as compiled, against the family's estimate, without a GPU.

For each epilogue and each of the gluon family's configs (and every ping-pong config at
8 warps, with the stages ``GluonFamily.fit_stages`` gives it), an offline sm_90 compile (``runtime.offline.compile_for``) gives the bytes Triton
allocates; the family's estimate is its buffers plus the A/B ring (``GluonFamily._ring``
plans stages so that estimate plus the reserve fits ``SMEM_LIMIT``). Prints both, what
Triton adds beyond the estimate (mbarriers, reduction and layout-conversion scratch) and
what is left under the limit. Compiles run in parallel (``--jobs``). Usage:

    PYTHONPATH=src python3 scripts/smem_probe.py [--shape 1024x1024x1024] [--only colsum,rowmax] [--jobs 16]
"""

from __future__ import annotations

import argparse
import os
import sys
import multiprocessing
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402

from evtfuse import EpilogueArguments, GemmArguments  # noqa: E402
from evtfuse.backends.triton.families import SMEM_LIMIT, GluonFamily, Target  # noqa: E402

# name -> (source, {output: shape kind}); reductions' shapes: row (M, 1), col (N,), all (1,)
EPILOGUES = {
    "colsum": ("def e(accum): D = accum; R = sum(accum); return D, R", {"R": "col"}),
    "colmax": ("def e(accum): D = accum; R = max(accum); return D, R", {"R": "col"}),
    "colboth": ("def e(accum): D = accum; R = max(accum); S = sum(accum); return D, R, S",
                {"R": "col", "S": "col"}),
    "rowsum": ("def e(accum): D = accum; R = sum(accum); return D, R", {"R": "row"}),
    "rowmax": ("def e(accum): D = accum; R = max(accum); return D, R", {"R": "row"}),
    "rowlse": ("def e(accum): D = accum; R = logsumexp(accum); return D, R", {"R": "row"}),
    "allsum": ("def e(accum): D = accum; R = sum(accum); return D, R", {"R": "all"}),
    "allmax": ("def e(accum): D = accum; R = max(accum); return D, R", {"R": "all"}),
    "aux_colmin": ("def e(accum, C, bias): D = accum * C + bias; R = min(accum); return D, R",
                   {"R": "col"}),
    "two_tiles_colmax": ("def e(accum, bias): D = accum + bias; F = relu(accum); R = max(D); "
                         "return D, F, R", {"R": "col"}),
}
H100 = Target("cuda", 90, torch.device("cpu"), 132)


def _args(name: str, M: int, N: int, K: int) -> GemmArguments:
    src, kinds = EPILOGUES[name]
    bf = torch.bfloat16
    ops = {"D": torch.empty(M, N, dtype=bf)}
    if "C" in src.split(":")[0]:
        ops["C"] = torch.randn(M, N).to(bf)
    if "bias" in src.split(":")[0]:
        ops["bias"] = torch.randn(N).to(bf)
    if "F =" in src:
        ops["F"] = torch.empty(M, N, dtype=bf)
    for out, kind in kinds.items():
        ops[out] = torch.empty(*{"row": (M, 1), "col": (N,), "all": (1,)}[kind])
    A, B = torch.randn(M, K).to(bf), torch.randn(K, N).to(bf)
    return GemmArguments(A, B, ops["D"], epilogue=EpilogueArguments(src, **ops))


def _estimate(fam: GluonFamily, args: GemmArguments, cfg) -> int:
    """The family's buffers for ``cfg`` plus its A/B ring (what ``_ring`` plans with)."""
    dag, elt = args.optimized_dag, args.A.element_size()
    bn = fam.CO_BN if cfg.cooperative else fam.BN
    epi = fam._epilogue_smem(dag, cfg.epi_split, fam._config_direct(dag, cfg, elt),
                             cfg.cooperative, cfg.slots)
    return epi + cfg.num_stages * (fam.BM + bn) * fam.BK * elt


def _one(job) -> str:
    from evtfuse.runtime.offline import compile_for

    name, shape, cfg = job
    fam = GluonFamily()
    args = _args(name, *shape)
    est = _estimate(fam, args, cfg)
    try:
        got = compile_for(fam, cfg, args).shared_bytes
    except Exception as e:  # noqa: BLE001 - reported per job
        return f"{name:18s} {cfg.name:34s} est {est:7d}  compile failed: {str(e)[:100]}"
    flag = "  OVER THE LIMIT" if got > SMEM_LIMIT else ""
    return (f"{name:18s} {cfg.name:34s} est {est:7d} actual {got:7d} beyond est {got - est:5d} "
            f"spare {SMEM_LIMIT - got:6d}{flag}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", default="1024x1024x1024")
    p.add_argument("--only", default=",".join(EPILOGUES))
    p.add_argument("--jobs", type=int, default=os.cpu_count())
    a = p.parse_args()
    shape = tuple(int(x) for x in a.shape.split("x"))
    fam = GluonFamily()
    jobs = []
    for name in a.only.split(","):
        args = _args(name, *shape)
        cfgs = fam.configs(args, H100)
        wide = {replace(c, num_warps=8) for c in cfgs if not c.cooperative and c.num_warps == 4}
        wide = {replace(c, num_stages=fam.fit_stages(args, c)) for c in wide}
        every = cfgs + sorted(wide - set(cfgs), key=lambda c: c.name)
        once = {replace(c, group_m=8): c for c in every}  # the tile order changes no memory
        jobs += [(name, shape, c) for c in once.values()]
    # spawned workers: forked ones inherit Triton's and torch's threads and can hang
    with ProcessPoolExecutor(a.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        for done in as_completed([pool.submit(_one, j) for j in jobs]):
            print(done.result(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
