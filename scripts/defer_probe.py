"""Does the ping-pong consumer's last store wait cost its next mainloop? (GPU, development tool.)

A gluon ping-pong consumer ends each tile's epilogue with ``tma.store_wait(pendings=0)``
and then frees its buffers to the epilogue-memory warp (``d_ready``), which loads the
consumer's next aux tiles into them. Where the epilogue is longer than the other
consumer's mainloop (relu with an aux output at 8192x8192x1024), that wait sits on the
critical path. The ``deferred`` variant waits and frees the buffers after its next tile's
first k-step is issued instead (and once more after the loop), so the stores drain while
the tensor cores work. Both variants (and ``--groups`` tile orders) are timed against
cuBLAS's ``A @ B``, every system once per round, rounds interleaved; every variant is
verified against PyTorch first.

    PYTHONPATH=src python3 scripts/defer_probe.py [--shape 8192x8192x1024] [--only relu_aux,alpha_beta]
        [--groups 8,16] [--rounds 5] [--max-configs 2]
"""

from __future__ import annotations

import argparse
import re

import torch
from group_probe import CASES
from probe_common import (distinct_configs, edited_launcher, epilogue_args, ping_pong, print_rounds,
                          time_rounds)

from evtfuse import get_kernels
from evtfuse.bench.timing import guarded_ms

_TAIL = re.compile(r"\n( +)tma\.store_wait\(pendings=0\)  # the buffers are free again\n"
                   r"\1fence_async_shared\(\)\n\1mbarrier\.arrive\(d_ready\.index\(WHICH\)\)\n")
_STEP = re.compile(r"\n( +)(acc = _ef_mma_step\(i0 \+ kk, kk, [^\n]*\))\n")


def deferred(src: str) -> str | None:
    """``src`` with the consumer's end-of-tile store wait and buffer release moved after its
    next tile's first k-step (and after the loop for the last tile); None where the source
    has no such wait (no consumer-stored outputs)."""
    tail = _TAIL.search(src)
    step = _STEP.search(src)
    if tail is None or step is None:
        return None
    ind = tail.group(1)
    out = src[:tail.start()] + "\n" + src[tail.end():]
    step = _STEP.search(out)
    sind = step.group(1)
    release = (f"\n{sind}{step.group(2)}\n{sind}if kk == 0:\n{sind}    if r > 0:\n"
               f"{sind}        tma.store_wait(pendings=0)  # the last tile's stores have left\n"
               f"{sind}        fence_async_shared()\n"
               f"{sind}        mbarrier.arrive(d_ready.index(WHICH))\n")
    out = out[:step.start()] + release + out[step.end():]
    # after the tile loop: the last tile's release (the loop's body is indented by ``ind``)
    loop = re.search(r"\n( +)for r in range\(\(my_tiles - WHICH \+ 1\) // 2\):\n", out)
    if loop is None:
        return None
    lind = loop.group(1)
    # the consumer function ends at the next top-level definition
    end = out.index("\n\n\n@gluon.jit", loop.end())
    tail_lines = (f"\n{lind}if (my_tiles - WHICH + 1) // 2 > 0:\n"
                  f"{lind}    tma.store_wait(pendings=0)\n{lind}    fence_async_shared()\n"
                  f"{lind}    mbarrier.arrive(d_ready.index(WHICH))")
    assert len(ind) > len(lind)
    return out[:end] + tail_lines + out[end:]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="8192x8192x1024")
    p.add_argument("--only", default="relu_aux,alpha_beta")
    p.add_argument("--groups", default="8")
    p.add_argument("--max-configs", type=int, default=2, help="ping-pong candidates per case")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--show", action="store_true", help="print the first deferred source")
    a = p.parse_args()
    M, N, K = (int(x) for x in a.shape.split("x"))
    shown = False
    for name in a.only.split(","):
        args = epilogue_args(CASES[name], M, N, K, labels=name == "bce")
        bases = distinct_configs(get_kernels(args), ping_pong)
        systems = {"mm": lambda: args.A @ args.B}
        for base in bases[: a.max_configs]:
            for g in a.groups.split(","):
                k = base.with_config(group_m=int(g))
                src = deferred(k.source(args))
                if src is None:
                    print(f"{name} {k.name}: no end-of-tile store wait", flush=True)
                    continue
                if a.show and not shown:
                    print(src)
                    shown = True
                fn = edited_launcher(k, args, src)
                for label, run in ((k.name, lambda k=k: k.run(args)), (k.name + "+defer", fn)):
                    outs = {n: v for n, v in args.epilogue.outputs().items()
                            if isinstance(v, torch.Tensor)}
                    for v in outs.values():
                        v.fill_(float("nan"))
                    run()
                    torch.cuda.synchronize()
                    ok = k.verify(args) if label == k.name else _check(k, args, outs)
                    if not ok:
                        print(f"{name} {label}: VERIFY FAILED", flush=True)
                        continue
                    systems[label] = run
        print_rounds(f"{name} {a.shape} ({a.rounds} rounds)",
                     time_rounds(systems, a.rounds, guarded_ms), by_time=True)


def _check(kernel, args, outs) -> bool:
    """The edited kernel's outputs (just written) against the library kernel's."""
    got = {n: v.clone() for n, v in outs.items()}
    kernel.run(args)
    torch.cuda.synchronize()
    return all(torch.equal(got[n], outs[n]) for n in outs)


if __name__ == "__main__":
    main()
