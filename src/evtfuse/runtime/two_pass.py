"""Running an epilogue whose reductions feed computation (layer: runtime.kernels, below
``runtime.kernel``, whose ``TwoPassPlan`` runs the two passes staged here).

Which plan a kernel gives such an epilogue (docs/performance.md, "Reductions feeding
computation"): **one pass** where its family computes the reductions inside a tile that
spans the row (``KernelFamily.one_pass``), else **two passes** (``staging.split``): the
kernel runs the first pass's epilogue (the GEMM, storing what the rest needs in fp32
workspaces, and the reductions), then an evtfuse kernel over K = 0 (no GEMM) runs the
second pass's. Each pass's epilogue is its DAG as ``staging.split`` built it, handed to the
arguments as it is (``dag_epilogue.DagEpilogue``: no source printed and parsed again).
``kernel.TwoPassPlan`` launches both with no host sync; its workspaces are kept per stream
(``StreamLocal``), as reduction workspaces are.
"""

from __future__ import annotations

import torch

from ..arguments import EpilogueArguments, GemmArguments
from ..dag_epilogue import DagEpilogue
from ..staging import Split, feeds_computation, split


def one_pass(family, args: GemmArguments, target) -> bool:
    """Whether ``family`` runs ``args`` (an epilogue whose reductions feed computation)
    in one pass."""
    check = getattr(family, "one_pass", None)
    return bool(check is not None and check(args, target))


def plan_name(family, args: GemmArguments, target) -> str | None:
    """"one pass" / "two passes" for such an epilogue; None for any other."""
    if not feeds_computation(args.optimized_dag):
        return None
    return "one pass" if one_pass(family, args, target) else "two passes"


class Staged:
    """The two passes of one ``GemmArguments``: the split, and each pass's arguments (its
    workspaces allocated here, for support checks and compiles)."""

    def __init__(self, args: GemmArguments):
        self.dag = args.optimized_dag
        # float64 inputs: the workspaces and the second pass in float64 too
        self.wdt = wdt = args.compute_dtype
        sp: Split = split(self.dag, wdt)
        self.split = sp
        self.problem = args.problem
        dev = args.A.device
        self.ws = {w.name: torch.empty(w.shape(args.problem), dtype=wdt, device=dev)
                   for w in sp.workspaces}
        values = args.epilogue.values
        params = args.epilogue.parsed.params
        self.params = params

        def buf(name):
            return values[name] if name in args.epilogue.parsed.outputs else self.ws[name]

        r1, r2 = sp.rename
        v1 = {p: values[p] for p in params}
        v1.update({k: buf(b) for k, b in r1.items()})
        where = args.epilogue.parsed.where
        self.parsed1 = DagEpilogue(sp.first, where=f"the first pass of {where}")
        self.args1 = GemmArguments(args.A, args.B, None, args.accumulator_type,
                                   EpilogueArguments.unbound(self.parsed1, **v1),
                                   allow_tf32=args.allow_tf32, fp8_fast_accum=args.fp8_fast_accum)
        self.A2, self.B2 = over_k0(args)
        v2 = {p: values[p] for p in params}
        v2.update(self.ws)
        v2.update({k: buf(b) for k, b in r2.items()})
        self.parsed2 = DagEpilogue(sp.second, where=f"the second pass of {where}")
        self.args2 = GemmArguments(self.A2, self.B2, None, wdt,
                                   EpilogueArguments.unbound(self.parsed2, **v2))


def over_k0(args: GemmArguments) -> tuple[torch.Tensor, torch.Tensor]:
    """A and B of ``args``' problem with K = 0 (no storage): what a pass that runs only an
    epilogue (no ``A @ B``) is given; floating-point inputs keep their dtype, others
    become float16."""
    A, B = args.A, args.B
    dt = A.dtype if A.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64) \
        else torch.float16
    return (torch.empty((*A.shape[:-1], 0), dtype=dt, device=A.device),
            torch.empty((*B.shape[:-2], 0, args.N), dtype=dt, device=A.device))


def staged(args: GemmArguments) -> Staged:
    """``args``'s two passes (built once per bound DAG of the arguments)."""
    got = getattr(args, "_ef_staged", None)
    if got is None or got.dag is not args.optimized_dag:
        got = Staged(args)
        args._ef_staged = got
    return got


def judged(family, args: GemmArguments, target) -> GemmArguments:
    """The arguments ``family`` checks, configures and emits for: ``args`` itself, or
    where it runs them in two passes, the first pass's."""
    if not feeds_computation(args.optimized_dag) or one_pass(family, args, target):
        return args
    return staged(args).args1


__all__ = ["one_pass", "plan_name", "staged", "judged", "Staged", "over_k0"]
