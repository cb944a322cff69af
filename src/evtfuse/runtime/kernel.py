"""A concrete kernel: one family with one tile configuration, for one target; its launch
plans; the kernels every family offers for given arguments (``kernels_for``).

Layer: runtime.kernels, above ``runtime.two_pass`` (whose passes ``TwoPassPlan`` runs) and
below ``runtime.discovery``. ``supports`` -> ``Status``; ``compile`` generates (or reuses)
the module for the arguments' kernel spec and returns the Triton function; ``run``
launches on the current stream with no host sync and no allocation, so it can be captured
in a CUDA graph; ``verify`` runs on poisoned outputs and compares with the reference
evaluator.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import replace
from typing import Any

import torch

from ..arguments import GemmArguments
from ..backends.triton.codegen import generate
from ..backends.triton.families import (FAMILIES, INTERPRETER, KernelFamily, Target,
                                        TileConfig, even_tiles_vary, fill_rank, fp8_promote)
from ..backends.triton.launch import direct_launcher
from ..backends.triton.launch_items import StreamLocal
from ..backends.triton.versions import LAUNCH_OPTIONS
from ..errors import Status, UnsupportedError
from ..ir import OutputKind
from . import background, cache, triton_key
from .calls import run_kernel_through_op
from .device import device_guard, quiet_float_warnings
from .torch_op import check_no_grad, check_outputs_writable
from .two_pass import Staged, judged, staged
from .verify import F64_ACC_NOISE, FP16_ACC_NOISE, VerifyResult, accumulation_slack, compare

log = logging.getLogger("evtfuse")


class Kernel:
    def __init__(self, family: KernelFamily, config: TileConfig, target: Target):
        self.family = family
        self.config = config
        self.target = target
        self.name = f"{family.name}_{config.name}"
        self._fns: dict[str, Any] = {}
        self._plans: dict[tuple, LaunchPlan | EmptyProblemPlan | Bf16AsFp32Plan | TwoPassPlan] = {}
        # (a weak reference to the last arguments, their checked state, plan): no tensor of
        # a call is kept alive (a CUDA graph pool's tensors must die with the graph)
        self._last: tuple = (lambda: None, None, None)

    def forget_plans(self) -> None:
        """Drop every launch plan (the next run plans afresh)."""
        self._plans.clear()
        self._last = (lambda: None, None, None)

    def forget_plan(self, args: GemmArguments) -> None:
        """Drop the launch plan for problems shaped like ``args``, and with it the tensors
        it keeps (reduction workspaces): the tuner's candidates that lost."""
        plan = self._plans.pop(structure_key(args), None)
        if plan is not None and self._last[2] is plan:
            self._last = (lambda: None, None, None)

    def __repr__(self) -> str:
        return f"Kernel({self.name}, {self.target.kind} cc={self.target.cc})"

    def with_config(self, **fields: Any) -> "Kernel":
        """The same family's kernel for ``self.config`` with ``fields`` replaced (another
        tile order ``group_m``, 8-warp consumers ``num_warps``, ...)."""
        return Kernel(self.family, replace(self.config, **fields), self.target)

    def supports(self, args: GemmArguments) -> Status:
        return self.family.supports(judged(self.family, args, self.target), self.target)

    def source(self, args: GemmArguments) -> str:
        """The generated Triton module for these arguments (in two passes: the first's)."""
        args = judged(self.family, args, self.target)
        return generate(self.family.spec(args, self.config, self.target))

    def _require(self, args: GemmArguments) -> None:
        status = self.supports(args)
        if not status:
            raise UnsupportedError(f"{self.name}: {status.reason}")

    def compile(self, args: GemmArguments):
        """Generate and import the kernel module (once per spec); returns the Triton function."""
        self._require(args)
        args = judged(self.family, args, self.target)
        spec = self.family.spec(args, self.config, self.target)
        key = spec.key()
        fn = self._fns.get(key)
        if fn is None:
            if self.target.kind == "cuda":
                triton_key.install()  # before Triton's first cache lookup of the process
            module = cache.load_module(key, generate(spec))
            fn = module.evtfuse_kernel
            self._fns[key] = fn
            log.debug("kernel %s: module k%s loaded", self.name, key)
        return fn

    def plan(self, args: GemmArguments) -> "LaunchPlan | EmptyProblemPlan | Bf16AsFp32Plan":
        """The launch plan for problems shaped like ``args`` (checked, compiled, cached).

        ``args`` is validated again first when one of its tensors changed since it was
        (``GemmArguments.checked_state``): a plan is reused for the same arguments object
        only while its tensors are as they were."""
        state = args.checked_state()
        last = self._last
        if args is last[0]() and state is last[1]:  # the same arguments, unchanged, run again
            return last[2]
        key = structure_key(args)
        plan = self._plans.get(key)
        if plan is None or plan.parsed is not args.epilogue.parsed:
            plan = self._make_plan(args)
            if len(self._plans) > 512:
                self._plans.clear()
            self._plans[key] = plan
        self._last = (weakref.ref(args), state, plan)
        return plan

    def _make_plan(self, args: GemmArguments):
        """A new launch plan for ``args`` (``plan`` keeps it per structure; a kernel made of
        other kernels' plans, ``split_k.SplitKernel``, gives its own)."""
        if self.target.kind == INTERPRETER and Bf16AsFp32Plan.needed(args):
            return Bf16AsFp32Plan(self, args)
        if args.L * args.M * args.N == 0:
            self._require(args)
            return EmptyProblemPlan(args)
        if judged(self.family, args, self.target) is not args:
            self._require(args)
            return TwoPassPlan(self, args, staged(args))
        fn = self.compile(args)  # checks support first
        dag = args.optimized_dag
        items, consts, grid, post = self.family.plan(args, dag, self.config, self.target)
        return LaunchPlan(fn, items, consts, grid, args.epilogue.parsed, post)

    def compile_ahead(self, args: GemmArguments) -> None:
        """Start compiling, in the background, the variant of this kernel another M of
        ``args``'s problem would need (``family_base.even_tiles_vary``; the tuner calls this
        for the kernel it chose, not for every candidate)."""
        if self.target.kind == INTERPRETER or not even_tiles_vary(args, self.config):
            return
        plan = self.plan(args)
        if isinstance(plan, LaunchPlan) and "EVEN_MN" in plan.consts:
            background.compile_variant(plan, args.A, args.B, args.launch_values,
                                       EVEN_MN=not plan.consts["EVEN_MN"])

    def run(self, args: GemmArguments) -> None:
        """Compute every output of ``args`` in place (compiles on first use).

        Launches on the current stream; no host sync, no allocation. Arguments of a
        structure seen before (same epilogue, shapes, strides, dtypes, alignment) reuse
        their launch plan, so a re-run costs little more than Triton's own launch.
        """
        if torch.compiler.is_compiling():  # one opaque operator in the traced graph
            run_kernel_through_op(self, args)
            return
        if torch.is_grad_enabled():  # no silent detach: evtfuse.gemm is the differentiable call
            outs = args.epilogue.outputs()
            check_outputs_writable(list(outs.values()), list(outs), "Kernel.run")
            check_no_grad(args.A, args.B, args.epilogue.values)
        guard = device_guard(args.A)
        if guard is None:
            self.plan(args)(args.A, args.B, args.launch_values)
            return
        with guard:
            self.plan(args)(args.A, args.B, args.launch_values)

    def verify(self, args: GemmArguments, poison: bool = True) -> VerifyResult:
        """Run on NaN-poisoned outputs and compare every stored output with the reference."""
        from ..reference import accumulator, evaluate

        if args.offs is not None:
            raise UnsupportedError(f"{self.name}: verify does not take grouped GEMMs yet; "
                                   "compare with evtfuse.reference.evaluate_grouped")
        self.plan(args)  # validates (again, if a tensor changed) before anything is written
        values = args.epilogue.values
        stored = [o for o in args.dag.outputs if o.kind is not OutputKind.NONE]
        if poison:
            for o in stored:  # NaN; integers: the dtype's minimum (an unlikely result)
                t = values[o.name]
                t.fill_(float("nan") if t.dtype.is_floating_point else torch.iinfo(t.dtype).min)
        # a conditional store (store_where) keeps its buffer where its condition fails: the
        # reference reads the buffer as it was before the kernel
        before = {o: values[o].clone() for o in args.epilogue.parsed.conditional_outputs}
        self.run(args)
        if args.A.device.type == "cuda":
            torch.cuda.synchronize(args.A.device)
        accum = accumulator(args)
        ref = evaluate(args, accum, before, cast=False)
        # integer inputs accumulate exactly: no summation-order noise to allow for
        # fp16 accumulators round every partial sum: noise of fp16's unit roundoff
        acc16 = args.accumulator_type == torch.float16
        noise = dict(noise=FP16_ACC_NOISE, own_scale=True) if acc16 else (
            dict(noise=F64_ACC_NOISE) if args.accumulator_type == torch.float64 else {})
        slack = {} if not args.A.dtype.is_floating_point else accumulation_slack(
            lambda acc: evaluate(args, acc, before, cast=False), accum, ref, args.K,
            [o.name for o in stored], **noise)
        tf32 = args.allow_tf32 and args.A.dtype == torch.float32 and self.target.kind == "cuda"
        fast_k = 0 if fp8_promote(args, self.target) else args.K  # fp8 inputs only
        result = VerifyResult(self.name)
        for o in stored:
            result.checks.append(compare(o.name, values[o.name], ref[o.name], o.dtype, tf32,
                                         args.A.dtype, fp8_fast_k=fast_k,
                                         slack=slack.get(o.name)))
        return result


class LaunchPlan:
    """Positional arguments with the fixed ones (sizes, strides) filled in once; per call
    only tensors, descriptors and runtime scalars are fetched.

    The first call launches through Triton's ``fn[grid](...)``, which binds and specialises
    the arguments and compiles; later calls launch the compiled kernel directly (see
    ``backends.triton.launch.direct_launcher``): the plan's key fixes everything Triton specialises on (sizes,
    strides, dtypes, 16-byte alignment), so the compiled kernel is the same for every call.
    """

    __slots__ = ("jit", "fn", "template", "slots", "consts", "grid", "parsed", "post", "launch")

    def __init__(self, fn, items: list, consts: dict, grid: tuple, parsed, post=()):
        self.jit = fn
        self.fn = fn[grid]
        self.template = [None if callable(i) else i for i in items]
        self.slots = [(k, i) for k, i in enumerate(items) if callable(i)]
        self.consts = consts
        self.grid = grid
        self.parsed = parsed
        self.post = tuple(post)
        self.launch = None  # set after the first launch where direct launches are possible

    def __call__(self, A, B, values) -> None:
        pos = self.positional(A, B, values)
        if self.launch is None or not self.launch(pos):
            with quiet_float_warnings():  # the interpreter's numpy, quiet as a GPU is
                compiled = self.fn(*pos, **self.consts, **LAUNCH_OPTIONS)
            if self.launch is None:
                self.launch = direct_launcher(compiled, self.jit, self.grid, len(pos),
                                              self.consts)
        for step in self.post:
            step(values)

    def warmup(self, A, B, values) -> None:
        """Compile the kernel for these arguments without launching it (Triton's JIT warmup;
        under ``AsyncCompileMode`` the compile runs in its executor's thread)."""
        self.warmup_positional(self.positional(A, B, values))

    def warmup_positional(self, positional: list, **consts) -> None:
        """``warmup`` of arguments already fetched (``positional``: fetching may allocate a
        workspace, which another thread must not do during a CUDA graph capture);
        ``consts`` replace some of the plan's constants (another variant:
        ``runtime.background``)."""
        self.jit.warmup(*positional, grid=self.grid, **{**self.consts, **consts},
                        **LAUNCH_OPTIONS)

    def positional(self, A, B, values) -> list:
        pos = self.template.copy()
        for k, get in self.slots:
            pos[k] = get(A, B, values)
        return pos


def _fp32(v):
    return v.float() if isinstance(v, torch.Tensor) and v.dtype == torch.bfloat16 else v


class Bf16AsFp32Plan:
    """bf16 under Triton's CPU interpreter, which reads and writes bf16 memory wrongly
    (numpy has no bf16): every bf16 tensor goes to the kernel as an fp32 copy (exact), and
    every bf16 output is computed into an fp32 copy of it, then rounded to bf16 by torch
    (to nearest even, as a GPU kernel's store rounds; elements the kernel leaves alone come
    back as they were). On the GPU bf16 products are exact in the fp32 accumulator, so
    the results are the GPU's up to the order of the K sum. The inner plan is the kernel's
    own for the fp32 stand-ins' structure."""

    __slots__ = ("inner", "parsed", "outputs")

    @staticmethod
    def needed(args: GemmArguments) -> bool:
        return any(isinstance(v, torch.Tensor) and v.dtype == torch.bfloat16
                   for v in (args.A, args.B, *args.epilogue.values.values()))

    def __init__(self, kernel: "Kernel", args: GemmArguments):
        values = {k: _fp32(v) for k, v in args.epilogue.values.items()}
        stand_in = GemmArguments(_fp32(args.A), _fp32(args.B), values.get("D"),
                                 args.accumulator_type, args.epilogue.with_values(**values),
                                 allow_tf32=args.allow_tf32, fp8_fast_accum=args.fp8_fast_accum,
                                 offs=args.offs)
        self.inner = kernel.plan(stand_in)
        self.parsed = args.epilogue.parsed
        self.outputs = tuple(args.epilogue.parsed.outputs)

    def __call__(self, A, B, values) -> None:
        wide = {k: _fp32(v) for k, v in values.items()}
        self.inner(_fp32(A), _fp32(B), wide)
        for name in self.outputs:
            out = values.get(name)
            if isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16:
                out.copy_(wide[name])


class EmptyProblemPlan:
    """The plan of a problem with no output element (L, M or N is 0): no kernel launches (its
    grid would be empty, leaving every output unwritten), yet an output that is not a full
    tile may still hold values: a reduction over the empty axis holds the reduction's
    identity (sum 0, max -inf, min +inf, logsumexp -inf), a per-column vector of an M = 0
    problem its N values. They are computed by the reference evaluator (torch, on the
    outputs' device) and copied in, rounded as a kernel stores them. (K = 0 is no such
    case: the accumulator is then 0 and the kernel runs.)"""

    __slots__ = ("dag", "parsed", "problem")

    def __init__(self, args: GemmArguments):
        self.dag = args.optimized_dag
        self.parsed = args.epilogue.parsed
        self.problem = (args.L, args.M, args.N)

    def __call__(self, A, B, values) -> None:
        from ..reference import evaluate

        stored = [o for o in self.dag.outputs
                  if o.kind not in (OutputKind.NONE, OutputKind.FULL) and values[o.name].numel()]
        if not stored:
            return
        accum = torch.zeros(self.problem, dtype=torch.float32, device=A.device)
        results = evaluate(self.dag, accum, values)
        for o in stored:
            values[o.name].copy_(results[o.name].reshape(values[o.name].shape))


def tensor_key(t) -> tuple:
    """What a kernel's support and code depend on in a tensor (not its values or address,
    beyond 16-byte alignment)."""
    return (t.dtype, tuple(t.shape), t.stride(), t.data_ptr() % 16 == 0, t.device)


def value_key(v) -> object:
    if isinstance(v, torch.Tensor):
        return tensor_key(v)
    if v is None:
        return None
    return "scalar"


def structure_key(args: GemmArguments) -> tuple:
    values = args.epilogue.values
    return (id(args.epilogue.parsed), args.L, args.M, args.N, args.K, args.allow_tf32,
            args.fp8_fast_accum, args.accumulator_type, tensor_key(args.A), tensor_key(args.B),
            None if args.offs is None else tensor_key(args.offs),
            tuple((n, value_key(v)) for n, v in values.items()))


class TwoPassPlan:
    """The first pass's launch plan, then the second's, with this plan's workspaces."""

    __slots__ = ("parsed", "first", "second", "local", "names", "params", "outputs",
                 "rename", "A2", "B2")

    def __init__(self, kernel: "Kernel", args: GemmArguments, st: Staged):
        self.parsed = args.epilogue.parsed
        self.first = kernel.plan(st.args1)
        self.second = second_plan(kernel, st.args2)
        self.names = list(st.ws)
        self.local = StreamLocal(args.A.device, [(tuple(t.shape), t.dtype, None)
                                                 for t in st.ws.values()])
        self.params = st.params
        self.outputs = set(args.epilogue.parsed.outputs)
        self.rename = st.split.rename
        self.A2, self.B2 = st.A2, st.B2

    def __call__(self, A, B, values) -> None:
        ws = dict(zip(self.names, self.local.current()))
        r1, r2 = self.rename

        def buf(name):
            return values[name] if name in self.outputs else ws[name]

        v1 = {p: values[p] for p in self.params}
        v1.update({k: buf(b) for k, b in r1.items()})
        self.first(A, B, v1)
        v2 = {p: values[p] for p in self.params}
        v2.update(ws)
        v2.update({k: buf(b) for k, b in r2.items()})
        self.second(self.A2, self.B2, v2)


def second_kernel(args2: GemmArguments, target: Target) -> "Kernel | None":
    """The kernel of an epilogue's pass over K = 0 (``args2``: a two-pass epilogue's second
    pass, a split-K epilogue): the first that runs it on ``target``."""
    ks = kernels_for(args2, target)
    return ks[0] if ks else None


def second_plan(kernel: "Kernel", args2: GemmArguments):
    """The launch plan of the pass over K = 0 that ``kernel`` runs after its GEMM
    (``second_kernel`` on ``kernel``'s target)."""
    k2 = second_kernel(args2, kernel.target)
    if k2 is None:
        raise UnsupportedError(f"{kernel.name}: no kernel runs this epilogue over K = 0 "
                               "(evtfuse.explain says why)")
    return k2.plan(args2)


_kernel_objects: dict[tuple, Kernel] = {}


def kernels_for(args: GemmArguments, target: Target) -> list[Kernel]:
    """``get_kernels`` for a given target (``runtime.offline`` asks for an sm_90 GPU's)."""
    kernels: list[Kernel] = []
    for family in FAMILIES:
        judge = judged(family, args, target)  # in two passes: the first pass's arguments
        if not family.supports(judge, target):
            continue
        for config in family.configs(judge, target):
            key = (family.name, config, target)
            k = _kernel_objects.get(key)
            if k is None:
                k = _kernel_objects[key] = Kernel(family, config, target)
            kernels.append(k)
    ordered = order_by_fill(kernels, args, target)
    return alternate_families(ordered) if args.offs is not None and target.kind == "cuda" \
        else ordered


def alternate_families(kernels: list[Kernel]) -> list[Kernel]:
    """``kernels`` with the families' candidates taken in turn (each family's first, then
    each one's second, ...; families in the order of their first candidate): for a grouped
    GEMM the hopper family's persistent TMA kernel and the portable one each lead on some
    problems (few rows per group: the portable kernel's tiles waste less), and a fast
    tuning, which times only the first candidates (``tuner.FAST_CANDIDATES``), must time
    both."""
    by_family: dict[str, list[Kernel]] = {}
    for k in kernels:
        by_family.setdefault(k.family.name, []).append(k)
    turns = max((len(v) for v in by_family.values()), default=0)
    return [v[i] for i in range(turns) for v in by_family.values() if i < len(v)]


def order_by_fill(kernels: list[Kernel], args: GemmArguments, target: Target) -> list[Kernel]:
    """``kernels`` (in the families' order) with the configs whose tiles leave most of the
    GPU idle moved behind those that fill it (``family_base.fill_rank``; a stable sort, so
    problems that every config fills keep the families' order). At 64x8192x8192 the gluon
    family's 128-row tiles occupy 64 of 132 SMs (relu aux 0.070 ms) and the hopper family's
    64x64 ones 128 (0.0595): the fast tuning's budget must reach those first (a 12 s
    budget spent it on the gluon configs; benchmarks/HISTORY.md, fifteenth session). Under the
    interpreter the order is the families'."""
    if target.kind != "cuda":
        return kernels
    return sorted(kernels, key=lambda k: fill_rank(args, k.config, target.sms))


def scratch_arguments(args: GemmArguments) -> GemmArguments:
    """The same problem with fresh output buffers: the tuner, background tuning and
    precompiling run a kernel many times, which must not touch the user's outputs (an
    in-place D = C would be applied repeatedly)."""
    fresh = {n: torch.empty_like(v) for n, v in args.epilogue.outputs().items()
             if isinstance(v, torch.Tensor)}
    epi = args.epilogue.with_values(**fresh)
    return GemmArguments(args.A, args.B, fresh.get("D"), args.accumulator_type, epi,
                         allow_tf32=args.allow_tf32, fp8_fast_accum=args.fp8_fast_accum,
                         offs=args.offs)
