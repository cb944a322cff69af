"""Ping-pong consumers of two warpgroups each (GPU, development tool; not yet in the library).

The gluon ping-pong kernel's consumers are one warpgroup each (4 warps, a 128x128 tile,
128 accumulator registers per thread). Where the epilogue issues more instructions than
the other consumer's mainloop takes cycles (BCE at 8192x8192x1024: ~26 per element on one
warp per scheduler; BENCHMARKS.md, sixteenth session), the tensor pipes wait for it. This
probe edits the generated source so that each consumer is two warpgroups (8 warps, 64 rows
each, 64 accumulator registers): the accumulator layout's ``warps_per_cta`` [4, 1] ->
[8, 1], the consumer partitions' 4 warps -> 8, blocked layouts of 4 warps -> 8, and the
launch with ``num_warps=8`` (the default partition is consumer 0), ``CONSUMER_REGS``
``--regs`` (120: 16 consumer warps at 120 and two 1-warp partitions at 24 fit the 64K
registers) and ``PRODUCER_REGS`` 24. Offline sm_90 compiles of BCE, relu with an aux
output and alpha-beta at 8192x8192x1024 (quarters): no spills at 120.

Each variant is verified against the reference (NaN-poisoned outputs, ``Kernel.verify``),
then timed with the library's kernel and cuBLAS's ``A @ B``, every system once per round,
rounds interleaved (guarded timing).

    PYTHONPATH=src python3 scripts/wide_consumer_probe.py [--shape 8192x8192x1024]
        [--only bce,relu_aux,alpha_beta,silu_mul] [--regs 120] [--max-configs 2] [--rounds 5] [--show]
"""

from __future__ import annotations

import argparse
import re

from group_probe import CASES
from probe_common import (distinct_configs, epilogue_args, import_source, ping_pong, print_rounds,
                          time_rounds)

from evtfuse import get_kernels
from evtfuse.bench.timing import guarded_ms
from evtfuse.runtime.kernel import Kernel

_EDITS = (("warps_per_cta=[4, 1]", "warps_per_cta=[8, 1]"),
          ("gl.BlockedLayout([1], [32], [4], [0])", "gl.BlockedLayout([1], [32], [8], [0])"))
_PARTITIONS = re.compile(r"\], \[4, 1, 1\], \[CONSUMER_REGS")


def widened(src: str) -> str | None:
    """``src`` (a gluon ping-pong kernel) with consumers of 8 warps; None where the source
    has no 4-warp accumulator layout or partition list to edit (a cooperative kernel)."""
    if "warps_per_cta=[4, 1]" not in src or not _PARTITIONS.search(src):
        return None
    for old, new in _EDITS:
        src = src.replace(old, new)
    return _PARTITIONS.sub("], [8, 1, 1], [CONSUMER_REGS", src)


class Widened(Kernel):
    """``base`` launched from an edited source with other launch constants."""

    def __init__(self, base: Kernel, src: str, consts: dict):
        super().__init__(base.family, base.config, base.target)
        self.name = base.name + "_wide"
        self._mod = import_source(src)
        self._extra = consts

    def run(self, args) -> None:
        plan = self.plan(args)
        consts = {**plan.consts, **self._extra}
        self._mod.evtfuse_kernel[plan.grid](*plan.positional(args.A, args.B, args.epilogue.values),
                                            **consts)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="8192x8192x1024")
    p.add_argument("--only", default="bce,relu_aux,alpha_beta,silu_mul")
    p.add_argument("--regs", type=int, default=120, help="setmaxnreg of the consumer warps")
    p.add_argument("--max-configs", type=int, default=2,
                   help="ping-pong configs per case (tile orders of one config count once)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--show", action="store_true", help="print the first widened source")
    a = p.parse_args()
    M, N, K = (int(x) for x in a.shape.split("x"))
    extra = dict(num_warps=8, CONSUMER_REGS=a.regs, PRODUCER_REGS=24)
    shown = False
    for name in a.only.split(","):
        args = epilogue_args(CASES[name], M, N, K, labels=name == "bce")
        bases = distinct_configs(get_kernels(args), ping_pong)[: a.max_configs]
        systems = {"mm": lambda: args.A @ args.B}
        for base in bases:
            src = widened(base.source(args))
            if src is None:
                print(f"{name} {base.name}: nothing to widen", flush=True)
                continue
            if a.show and not shown:
                print(src)
                shown = True
            for k in (base, Widened(base, src, extra)):
                try:
                    ok = k.verify(args)
                except Exception as exc:  # a compile the edit breaks: say so, go on
                    print(f"{name} {k.name}: FAILED TO RUN {str(exc).splitlines()[0][:200]}",
                          flush=True)
                    continue
                print(ok.report(), flush=True)
                if ok:
                    systems[k.name] = lambda k=k: k.run(args)
        print_rounds(f"{name} {a.shape} ({a.rounds} rounds)",
                     time_rounds(systems, a.rounds, guarded_ms), by_time=True)


if __name__ == "__main__":
    main()
