"""Split-K kernels for problems of few output tiles (small M: decode, MoE experts with few
tokens; issue 48): the K dimension cut into S slices computed in parallel, then the
epilogue over their sum, once.

Layer: runtime.kernels, above ``runtime.kernel`` (whose ``Kernel`` a ``SplitKernel`` is)
and below ``runtime.discovery`` (``get_kernels`` offers these where ``factors`` does,
``with_split_k``; the tuner keeps one only where it measures faster). Two launches,
no host sync, no atomics:

1. the partial products: a batched GEMM of the S slices, ``A[:, s Ks:(s+1) Ks] @
   B[s Ks:(s+1) Ks, :]`` (strided views of A and B, no copy), identity epilogue, into an
   fp32 workspace W (S, M, N) kept per stream (``StreamLocal``), run by the first kernel
   the families offer for it (``inner``), and for M up to ``PORTABLE_INNER_M`` also by the
   portable family's first (two candidates per slice count: the tuner times both);
2. the epilogue over K = 0, its accumulator the sum W[0] + W[1] + ... in that order
   (``passes.read_split_accumulator``: the same sum on every run, deterministic), run by
   the first kernel offered for it (in two passes itself where its reductions feed
   computation).

Offered (``factors``) for one problem (L = 1, not grouped, not gated) of 16- or 32-bit
floating-point inputs and an fp32 accumulator, whose 128 x 128 tiles would leave more than
half of the GPU's SMs idle, with K a multiple of S * 64 and at least 256 per slice.
"""

from __future__ import annotations

import functools

import torch

from ..arguments import EpilogueArguments, GemmArguments
from ..backends.triton.families import KernelFamily, Target
from ..backends.triton.launch_items import StreamLocal
from ..dag_epilogue import DagEpilogue
from ..errors import Status
from ..frontend.source import parse_epilogue
from ..ir import OperandKind, OperandSpec
from ..passes import read_split_accumulator
from ..staging import fresh_names
from .kernel import Kernel, kernels_for, second_plan
from .two_pass import over_k0

FACTORS = (8, 4, 2)  # slices of K tried, most first
OFFERED = 2  # slice counts offered per problem (the two with most slices that fit)
MIN_SLICE = 256  # K per slice at least
TILE = 128  # the tile side by which "few output tiles" is judged
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# M up to this: the portable family's first kernel (64-row tiles or smaller) is offered for
# the partial products beside the families' first. scripts/small_m_probe.py on an H200
# (BENCHMARKS.md, "Small M"): with 4 slices at M = 16-64 it ran 0.98-1.31x cuBLAS where the
# gluon 128 x 128 kernel ran 1.12-1.78x, faster in each of the 8 cells; at M = 256 (2
# slices) the other way round (1.48-1.57x against 1.03-1.24x)
PORTABLE_INNER_M = 64


def _tiles(args: GemmArguments) -> int:
    """The problem's output tiles of TILE x TILE."""
    return -(-args.M // TILE) * -(-args.N // TILE)


def refusal(args: GemmArguments) -> str | None:
    """Why no split-K kernel takes ``args`` (whatever its size); None where one can."""
    if args.offs is not None or args.L != 1:
        return "split-K takes one problem (not batched, not grouped)"
    if args.A.dtype not in DTYPES or args.B.dtype != args.A.dtype:
        return f"split-K takes float16, bfloat16 or float32 inputs, not {args.A.dtype}"
    if args.accumulator_type != torch.float32:
        return "split-K sums float32 partial products (accumulator_type float32)"
    if args.optimized_dag.gated:
        return "split-K does not take a gated epilogue (pairs(accum))"
    if args.M * args.N == 0:
        return "an empty output"
    return None


def factors(args: GemmArguments, target: Target) -> list[int]:
    """The slice counts offered for ``args`` on ``target`` (none where split-K would not
    help or cannot run: ``refusal``, or tiles enough to fill half the SMs)."""
    tiles = _tiles(args)
    if refusal(args) is not None or 2 * tiles > target.sms:
        return []
    fit = [s for s in FACTORS if args.K % (s * 64) == 0 and args.K // s >= MIN_SLICE]
    filling = [s for s in fit if s * tiles <= target.sms]
    return (filling or fit[-1:])[:OFFERED]


def slices(A: torch.Tensor, B: torch.Tensor, S: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A (M, K) and B (K, N) as S batches of K / S: strided views, no copy."""
    M, K = A.shape
    N = B.shape[1]
    ks = K // S
    sa, sb = A.stride(), B.stride()
    return (A.as_strided((S, M, ks), (ks * sa[1], sa[0], sa[1])),
            B.as_strided((S, ks, N), (ks * sb[0], sb[0], sb[1])))


class SplitKFamily(KernelFamily):
    """The pseudo-family of ``SplitKernel`` (its name and compile cost, for the tuner and
    the background starter); not among ``FAMILIES``: the kernels come from ``factors``."""

    name = "splitk"
    description = ("split-K: S slices of K in parallel into an fp32 workspace, then the "
                   "epilogue over their sum (two launches; few output tiles)")
    compile_s = 3.0  # two kernels: never a background starter

    def supports(self, args, target):
        why = refusal(args)
        return Status.fail(why) if why else Status.success()


FAMILY = SplitKFamily()


class Staged:
    """A split-K problem's two passes: the partial products' arguments (over the slices of
    ``args``' A and B, into ``W``) and the epilogue's over K = 0."""

    def __init__(self, args: GemmArguments, S: int, W: torch.Tensor):
        dag = args.optimized_dag
        taken = {o.name for o in dag.operands} | {o.name for o in dag.outputs} | {"accum"}
        names = fresh_names(taken, "ef_part")
        self.names = [next(names) for _ in range(S)]
        self.args1 = partial_arguments(args, S, W)
        parts = tuple(OperandSpec(n, OperandKind.FULL, torch.float32) for n in self.names)
        self.parsed2 = DagEpilogue(read_split_accumulator(dag, parts),
                                   where=f"the split-K epilogue of {args.epilogue.parsed.where}")
        values = dict(args.epilogue.values)
        values.update({n: W[i] for i, n in enumerate(self.names)})
        self.A2, self.B2 = over_k0(args)
        self.args2 = GemmArguments(self.A2, self.B2, None, torch.float32,
                                   EpilogueArguments.unbound(self.parsed2, **values))


def partial_arguments(args: GemmArguments, S: int, W: torch.Tensor) -> GemmArguments:
    """The partial products' problem: the S slices of ``args``' A and B into ``W``."""
    As, Bs = slices(args.A, args.B, S)
    return GemmArguments(As, Bs, W, epilogue=EpilogueArguments(_partial(), D=W),
                         allow_tf32=args.allow_tf32)


def partial_of(args: GemmArguments, S: int) -> GemmArguments:
    """``partial_arguments`` of ``args`` into a workspace of its own, made once per
    arguments object and kept on it (as ``two_pass.staged`` keeps its passes): support
    checks and code generation read its dtypes, shapes and strides, and a worker thread
    asking again allocates nothing."""
    made = args.__dict__.setdefault("_ef_split_k", {})
    got = made.get(S)
    if got is None:
        W = torch.empty((S, args.M, args.N), dtype=torch.float32, device=args.A.device)
        got = made[S] = partial_arguments(args, S, W)
    return got


@functools.lru_cache(maxsize=1)
def _partial():
    """The partial products' epilogue, parsed once (plans are kept per parsed epilogue)."""
    return parse_epilogue("def split_k_partial(accum):\n    D = accum\n    return D\n")


class SplitKPlan:
    """The partial products' launch plan, then the epilogue's, with this plan's workspace."""

    __slots__ = ("parsed", "S", "first", "second", "local", "names", "keys", "A2", "B2")

    def __init__(self, kernel: "SplitKernel", args: GemmArguments):
        self.parsed = args.epilogue.parsed
        self.S = kernel.S
        shape = (kernel.S, args.M, args.N)
        self.local = StreamLocal(args.A.device, [(shape, torch.float32, None)])
        (W,) = self.local.current()
        st = Staged(args, kernel.S, W)
        self.first = kernel.inner.plan(st.args1)
        self.second = second_plan(kernel, st.args2)
        self.names = st.names
        self.keys = list(args.epilogue.values)
        self.A2, self.B2 = st.A2, st.B2

    def _values(self, values, W) -> dict:
        v2 = {k: values[k] for k in self.keys}
        v2.update({n: W[i] for i, n in enumerate(self.names)})
        return v2

    def __call__(self, A, B, values) -> None:
        (W,) = self.local.current()
        As, Bs = slices(A, B, self.S)
        self.first(As, Bs, {"D": W})
        self.second(self.A2, self.B2, self._values(values, W))

    def warmup(self, A, B, values) -> None:
        """Compile both passes' kernels without launching them (the tuner's precompile)."""
        (W,) = self.local.current()
        As, Bs = slices(A, B, self.S)
        for plan, a, b, v in ((self.first, As, Bs, {"D": W}),
                              (self.second, self.A2, self.B2, self._values(values, W))):
            if hasattr(plan, "warmup"):
                plan.warmup(a, b, v)


class SplitKernel(Kernel):
    """A split-K candidate: S slices, the partial products run by ``inner``."""

    def __init__(self, inner: Kernel, S: int, target: Target):
        super().__init__(FAMILY, inner.config, target)
        self.inner, self.S = inner, S
        self.name = f"splitk{S}_{inner.name}"

    def __repr__(self) -> str:
        return f"SplitKernel({self.name}, {self.target.kind} cc={self.target.cc})"

    def with_config(self, **fields) -> "SplitKernel":
        return split_kernel(self.inner.with_config(**fields), self.S, self.target)

    def supports(self, args: GemmArguments) -> Status:
        why = refusal(args)
        if why is None and args.K % (self.S * 64):
            why = f"K = {args.K} is not a multiple of {self.S} slices of 64"
        return Status.fail(why) if why else Status.success()

    def source(self, args: GemmArguments) -> str:
        """The partial products' kernel module."""
        self._require(args)
        return self.inner.source(partial_of(args, self.S))

    def compile(self, args: GemmArguments):
        """Generate and import the partial products' kernel module; returns its function
        (the epilogue's kernel is generated with the plan). Background tuning calls this in
        a worker thread, which must make no CUDA call: the partial products' arguments
        come from ``partial_of``, made on the calling thread when ``get_kernels`` offered
        this kernel."""
        self._require(args)
        return self.inner.compile(partial_of(args, self.S))

    def _make_plan(self, args: GemmArguments):
        """Its two passes' plans (``Kernel.plan`` keeps it per structure, after checking
        the arguments again where a tensor changed)."""
        self._require(args)
        return SplitKPlan(self, args)


_objects: dict[tuple, SplitKernel] = {}


def split_kernel(inner: Kernel, S: int, target: Target) -> SplitKernel:
    """The one ``SplitKernel`` object of (inner, S, target) in the process (the tuner keeps
    choices by kernel object and name)."""
    key = (inner.name, S, target)
    k = _objects.get(key)
    if k is None:
        k = _objects[key] = SplitKernel(inner, S, target)
    return k


def candidates(args: GemmArguments, target: Target) -> list[SplitKernel]:
    """The split-K kernels offered for ``args`` (``factors``), each with the first kernel
    the families offer for its partial products and, for M up to ``PORTABLE_INNER_M``, the
    portable family's first too (where that is another)."""
    out = []
    for S in factors(args, target):
        inner = kernels_for(partial_of(args, S), target)
        if not inner:
            continue
        out.append(split_kernel(inner[0], S, target))
        if args.M <= PORTABLE_INNER_M:
            portable = next((k for k in inner if k.family.name == "portable"), None)
            if portable is not None and portable is not inner[0]:
                out.append(split_kernel(portable, S, target))
    return out


def with_split_k(args: GemmArguments, target: Target, kernels: list[Kernel]) -> list[Kernel]:
    """``kernels`` with the split-K candidates for ``args``: on a GPU right after the
    families' first kernel (a fast tuning times the first ones, ``tuner.FROM_HEURISTIC``
    of them beside the shipped defaults' suggestions: it must time these where they are
    offered, while ``tune="none"``, which takes the first untimed, keeps the families'
    pick), last under the interpreter (whose choice is untimed too)."""
    if not kernels:
        return kernels
    split = candidates(args, target)
    return [kernels[0], *split, *kernels[1:]] if target.kind == "cuda" else [*kernels, *split]


__all__ = ["SplitKernel", "SplitKPlan", "factors", "refusal", "candidates", "with_split_k",
           "slices", "partial_arguments", "partial_of", "split_kernel", "FAMILY"]
