"""Row amax through the gluon family: the library's atomic folds (``codegen.atomic_folded``),
and the designs before them: per-tile partials combined after the kernel, or inside it by
the tile that completes each row block (a ticket per row block), with variants of that
ticket. Timings, and ``--once VARIANT`` for Nsight Compute. A development probe for the
in-kernel combine's cost at many tiles per row (BENCHMARKS.md, runs N-O and the fifth
session's notes).

Variants (``--variants``, comma-separated):

* ``fold``: the library's default (atomic folds, one ticket per program);
* ``post``: partials combined by torch after the kernel (the fourth session's default);
* ``acq_rel``: in-kernel, the ticket as the library emits it (release fence = MEMBAR.GPU
  with the consumer's partial and TMA stores in flight, acquire = L1 invalidation);
* ``relaxed``: in-kernel with a relaxed ticket (no fence; timing only, the combine may
  read stale partials);
* ``no_ticket``: partials stored, no ticket and no combine (the output is not written;
  timing only);
* ``ticket_only``: the ticket (and its reset), no combine loads (timing only);
* ``combine_only``: no ticket, the tile of the last column combines (timing only);
* ``both``: the ticket (and its reset) and, independently of it, the tile of the last
  column combines (timing only).

    PYTHONPATH=src python3 scripts/combine_probe.py [--once] [--shape 8192x8192x1024]
"""

from __future__ import annotations

import argparse

import torch
import triton.testing

import evtfuse.backends.triton.codegen as cg
import evtfuse.backends.triton.gluon_family as gf
import evtfuse.backends.triton.launch_items as li
from evtfuse import EpilogueArguments, GemmArguments, get_kernels

_DEFAULT = cg.combined_in_kernel
_FOLDED = cg.atomic_folded
_VERSION = cg.GENERATOR_VERSION
_TICKET = cg._Epilogue._ticket
_COMBINE = cg._Epilogue._combine


def _forced(o, family):
    if family == "gluon":
        return o.node.kind is cg.NodeKind.REDUCE and o.node.op != "logsumexp"
    return _DEFAULT(o, family)


def _relaxed_ticket(self, o, group, count, barrier, indent):
    return [line.replace('sem="acq_rel"', 'sem="relaxed"')
            for line in _TICKET(self, o, group, count, barrier, indent)]


def _no_combine(self, o, sub, indent):
    return []


def _ticket_only(self, o, sub, indent):
    lines = _COMBINE(self, o, sub, indent)
    return lines[:5]  # barrier, atomic, if, reset (+ the first load, kept as the body)


def _untaken_ticket(self, o, group, count, barrier, indent):
    return [f"{indent}if pid_n_c == num_pid_n - 1:"]


def _combine_only(self, o, sub, indent):
    cg._Epilogue._ticket = _untaken_ticket
    try:
        return _COMBINE(self, o, sub, indent)
    finally:
        cg._Epilogue._ticket = _TICKET


def _both(self, o, sub, indent):
    return _ticket_only(self, o, sub, indent)[:4] + _combine_only(self, o, sub, indent)


def _set(variant: str) -> None:
    in_kernel = variant not in ("post", "fold")
    # every module that imported them by name: the plan's workspaces (launch_items) and
    # the cooperative tiles' refusal (gluon_family) read their own copies
    cg.atomic_folded = li.atomic_folded = gf.atomic_folded = (
        _FOLDED if variant == "fold" else (lambda o: False))
    cg.combined_in_kernel = li.combined_in_kernel = _forced if in_kernel else _DEFAULT
    cg._Epilogue._ticket = _relaxed_ticket if variant == "relaxed" else _TICKET
    cg._Epilogue._combine = {"no_ticket": _no_combine, "ticket_only": _ticket_only,
                             "combine_only": _combine_only, "both": _both}.get(variant, _COMBINE)
    cg.GENERATOR_VERSION = f"{_VERSION}-{variant}"  # its own cache key


def kernel_and_args(shape, variant: str, store_d: bool = True, family: str = "gluon",
                    config: str = ""):
    _set(variant)
    M, N, K = shape
    A = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    B = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    D = torch.empty(M, N, device="cuda", dtype=torch.bfloat16) if store_d else None
    src = "def epi(accum): D = accum; amax = max(abs(accum)); return D, amax"
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(src, D=D, amax=torch.empty(M, 1, device="cuda")))
    ks = [k for k in get_kernels(args) if k.family.name == family and config in k.name]
    assert ks, f"no {family} kernel named *{config}*"
    k = ks[0]
    return k, args


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="8192x8192x1024")
    p.add_argument("--variants", default="fold,post,acq_rel")
    p.add_argument("--family", default="gluon", help="gluon or hopper (in-kernel variants: gluon)")
    p.add_argument("--config", default="", help="the first kernel whose name contains this")
    p.add_argument("--no-d", action="store_true", help="D=None (D computed, not stored)")
    p.add_argument("--once", default="", help="run this variant 3 times (for ncu)")
    a = p.parse_args()
    shape = tuple(int(x) for x in a.shape.split("x"))
    if a.once:
        k, args = kernel_and_args(shape, a.once, not a.no_d, a.family, a.config)
        for _ in range(3):
            k.run(args)
        torch.cuda.synchronize()
        return
    for variant in a.variants.split(","):
        k, args = kernel_and_args(shape, variant, not a.no_d, a.family, a.config)
        ok = bool(k.verify(args)) if variant in ("fold", "post", "acq_rel") else "n/a"
        ms = triton.testing.do_bench(lambda: k.run(args), warmup=30, rep=200, return_mode="median")
        print(f"{a.shape} D={'none' if a.no_d else 'stored'} {variant:9s} {k.name} {ms:.4f} ms "
              f"post steps {len(k.plan(args).post)} verify={ok}", flush=True)


if __name__ == "__main__":
    main()
