"""Ping-pong consumers of two warpgroups each against one (GPU, development tool).

The gluon ping-pong kernel's consumers are one warpgroup each by default (4 warps, a
128x128 tile, 128 accumulator registers per thread). Where the epilogue issues more
instructions than the other consumer's mainloop takes cycles (BCE at 8192x8192x1024: ~26
per element on one warp per scheduler; BENCHMARKS.md, sixteenth session), the tensor
pipes wait for it. A config with ``num_warps=8`` makes each consumer two warpgroups (64
rows each, 64 accumulator registers; ``GluonFamily.REGS``). For each case this probe takes
the family's first ping-pong configs of 4-warp consumers, the same configs at 8 warps
(``--families hopper``: the hopper family's 4-warp configs at 8 warps; ``--edits``: other
variants of the configs, such as 128x64 tiles; ``--reference hopper``: that family's first
kernel as it is, alongside), verifies each against
the reference (NaN-poisoned outputs, ``Kernel.verify``) and times them with cuBLAS's
``A @ B``, every system once per round, rounds interleaved (guarded timing).

    PYTHONPATH=src python3 scripts/wide_consumer_probe.py [--shapes 8192x8192x1024,4096x4096x4096]
        [--only bce,relu_aux,alpha_beta,silu_mul] [--max-configs 2] [--rounds 5] [--families gluon,hopper]
        [--edits 'num_warps=8;block_n=64'] [--reference hopper]
"""

from __future__ import annotations

import argparse

from group_probe import CASES
from probe_common import distinct_configs, epilogue_args, ping_pong, print_rounds, time_rounds

from evtfuse import get_kernels
from evtfuse.bench.timing import guarded_ms


def _edit(text: str) -> dict:
    """'num_warps=8,block_n=64' -> {'num_warps': 8, 'block_n': 64} (ints and booleans)."""
    out = {}
    for item in text.split(","):
        field, value = item.split("=")
        out[field.strip()] = value.strip() == "True" if value.strip() in ("True", "False") \
            else int(value)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="8192x8192x1024", help="comma-separated MxNxK")
    p.add_argument("--only", default="bce,relu_aux,alpha_beta,silu_mul")
    p.add_argument("--max-configs", type=int, default=2,
                   help="ping-pong configs per case (tile orders of one config count once)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--families", default="gluon",
                   help="whose 4-warp configs to take (gluon: ping-pong ones; hopper: any)")
    p.add_argument("--edits", default="num_warps=8",
                   help="variants of each config, ';'-separated, each 'field=value[,field=value]' "
                        "of TileConfig (e.g. 'num_warps=8;block_n=64,epi_split=1')")
    p.add_argument("--reference", default="",
                   help="also time the first kernel of this family as it is (e.g. hopper)")
    a = p.parse_args()
    edits = [_edit(e) for e in a.edits.split(";") if e]
    for name, shape in ((n, s) for s in a.shapes.split(",") for n in a.only.split(",")):
        M, N, K = (int(x) for x in shape.split("x"))
        args = epilogue_args(CASES[name], M, N, K, labels=name == "bce")
        families = a.families.split(",")
        bases = distinct_configs(get_kernels(args), lambda k: (
            k.config.num_warps == 4 and k.family.name in families
            and (k.family.name != "gluon" or ping_pong(k))))[: a.max_configs]
        systems = {"mm": lambda: args.A @ args.B}
        refs = [k for k in get_kernels(args) if k.family.name == a.reference][:1]
        for base in bases:
            variants = [base.with_config(**e) for e in edits]
            for k in (base, *variants, *refs):
                try:
                    ok = k.verify(args)
                except Exception as exc:  # a compile that fails: say so, go on
                    print(f"{name} {k.name}: FAILED TO RUN {str(exc).splitlines()[0][:200]}",
                          flush=True)
                    continue
                print(ok.report(), flush=True)
                if ok:
                    systems[k.name] = lambda k=k: k.run(args)
        print_rounds(f"{name} {shape} ({a.rounds} rounds)",
                     time_rounds(systems, a.rounds, guarded_ms), by_time=True)


if __name__ == "__main__":
    main()
