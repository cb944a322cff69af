"""Random epilogues for differential tests of the kernels against the reference evaluator.

Imported by ``test_fuzz_kernels.py`` (both tiers). ``cases()`` is a hypothesis strategy
of :class:`Case`: an epilogue's source, which operands it reads (a full tile ``C``, a
per-column ``bias``, a per-row ``rowv``, a runtime scalar ``alpha``, a device scalar
``sdev``) and which outputs it returns (full tiles of the run's dtype or fp32, per-row,
per-column and whole-problem reductions of sum, max, min, logsumexp, mean and
shifted_sumexp, the accumulator
itself, outputs passed as ``None``, per-row and per-column vectors of broadcast values). ``Case.arguments`` builds ``GemmArguments`` on fresh
random data for any M, N, K, dtype and device.

Problems are batched (L = 2, B and C shared by the batches or not) in a quarter of the
cases, and A or B column-major in a quarter each.

The operands and outputs (all but ``D``) take drawn names (``user_names``): kept, taken
from ``NAME_POOL`` (names of the generated kernels' own identifiers, Triton's, Python's
builtins, op names), or built from another drawn name with one of evtfuse's suffixes or
prefixes (``x`` and ``x_0``, ``C`` and ``C_ptr``, ``u_C``), so that no user name can meet
a generated one (``backends/triton/names.py``). ``Case.source`` is the renamed source;
``Case.operands`` and ``Case.outputs`` keep the canonical names, and ``Case.arguments``
passes the values under the drawn ones (``Case.names``).

The epilogues are numerically tame on purpose, so that a kernel may differ from the
reference only by what ``runtime.verify``'s tolerances allow and a larger difference is a
bug: every op is continuous with a bounded slope on the values it sees (no comparison of
a computed value, whose outcome flips with the accumulation order; ``exp``, ``log``,
``sqrt`` and division only where their argument is kept from overflow, zero and sign
changes; no casts, which round differently after a different summation order), and the
inputs are scaled so that nothing overflows fp16. ``where`` selects on comparisons of
operands only (exact in both readings).
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis import strategies as st

import evtfuse
from evtfuse import get_kernels
from evtfuse.optable import OPS
from evtfuse.runtime.two_pass import judged

# more examples, or other ones, when hunting (every fuzz test reads these)
EXAMPLES = int(os.environ.get("EVTFUSE_FUZZ_EXAMPLES", "0"))
SEED = int(os.environ.get("EVTFUSE_FUZZ_SEED", "0"))
# EVTFUSE_FUZZ_SHRINK=0: report a failing example as drawn, unshrunk (the GPU tier: a
# shrink there can spend a device call's minutes; the example is then reproduced on the CPU)
SHRINK = os.environ.get("EVTFUSE_FUZZ_SHRINK", "1") != "0"


@dataclass(frozen=True)
class Examples:
    """How many examples one run of a fuzz test draws (``tiers``), from which seed shift."""
    count: int
    shift: int = 0


def tiers(quick: int, full: int):
    """The two runs of a CPU fuzz test, as its ``examples`` parameter: ``[quick]`` with
    ``quick`` examples in the quick tier, ``[full]`` with ``full`` other ones (another seed)
    marked ``slow`` (conftest.py); the test draws them with ``drawn(examples, seed)``.
    hypothesis's first example is always the simplest one (``D = accum``), so ``quick``
    counts it: 2 is one drawn epilogue."""
    return pytest.mark.parametrize("examples", [
        pytest.param(Examples(quick, shift=1), id="quick"),
        pytest.param(Examples(full), id="full", marks=pytest.mark.slow)])


def drawn(default_examples: int | Examples, base_seed: int):
    """hypothesis settings of the fuzz tests: ``default_examples`` (``EVTFUSE_FUZZ_EXAMPLES``
    instead when set) from the fixed seed ``base_seed`` shifted by ``EVTFUSE_FUZZ_SEED``, so
    CI runs the same examples every time; no example database."""
    if isinstance(default_examples, Examples):
        default_examples, base_seed = default_examples.count, base_seed + default_examples.shift
    phases = [p for p in Phase if SHRINK or p.name not in ("shrink", "explain")]
    conf = settings(max_examples=EXAMPLES or default_examples, deadline=None, database=None,
                    print_blob=True, phases=phases,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])
    return lambda fn: seed(base_seed + SEED)(conf(fn))


# unary patterns: continuous with a bounded slope where their argument lives (|x| < ~50)
UNARY = ("relu({})", "leaky_relu({}, 0.1)", "sigmoid({})", "tanh({})", "gelu({})",
         "gelu_tanh({})", "silu({})", "hardswish({})", "softplus({})", "abs({})", "(-{})",
         "sin({})", "cos({})", "log_sigmoid({})", "log(abs({}) + 1.0)", "sqrt(abs({}) + 0.25)",
         "rsqrt(abs({}) + 1.0)", "exp(tanh({}))", "exp(-abs({}))", "clamp({}, -2.0, 2.0)",
         "({} * 0.5)", "({} + 1.5)", "log(clamp(sigmoid({}), 0.001, 0.999))")
BINARY = ("({} + {})", "({} - {})", "({} * {})", "({} / (abs({}) + 1.0))", "maximum({}, {})",
          "minimum({}, {})")
TERNARY = ("multiply_add({}, {}, {})",)
# decisions on computed values (``cases(deciding=True)``: the GPU gradient fuzz, where a
# backward must take each as the forward did; a float64 oracle may take one otherwise
# near its boundary, so the fp32 kernel tiers leave them out)
DECIDING = ("where({0} > 0.0, {0}, {0} * 0.25)", "({0} * sign({0}))", "({0} * floor({0}))",
            "relu({0} - 0.125)", "clamp({0}, -0.5, 0.5)", "maximum({0}, 0.0)", "abs({0})",
            "hardswish({0} * 4.0)", "where(({0} > -0.25) & ({0} < 0.25), {0}, 0.0)")
# selections on exact operands (never on computed values)
CONDITIONS = {"C": "C > 0.0", "bias": "bias > 0.25", "rowv": "rowv < 0.0"}
LITERALS = ("0.5", "2.0", "-1.5", "3.0")
OPERANDS = ("C", "bias", "rowv", "alpha", "sdev")
REDUCTIONS = ("sum", "max", "min", "logsumexp", "mean", "shifted_sumexp")
# those with a derivative in the op table (``cases(differentiable=True)``: the gradient
# fuzzers)
DIFFERENTIABLE = tuple(r for r in REDUCTIONS if OPS[r].differentiable)
# a per-row reduction feeding computation (``cases(feeding=True)``): {x} a drawn value,
# {q} the reduction's name, {u} the value computed from it
FEEDING_DIFFERENTIABLE = (
    ("{q} = mean({x} * {x})", "{u} = {x} * rsqrt({q} + 1.0)"),  # an RMS norm
    ("{q} = logsumexp({x})", "{u} = exp({x} - {q})"),  # softmax, written with a logsumexp
    ("{q} = sum({x})", "{u} = {x} - {q} * 0.0625"),
    ("{u} = softmax({x})",),
    ("{u} = log_softmax({x} * 0.5)",),
    ("{q} = max({x})", "{u} = {x} - {q}"),  # its ties: the mask the forward kept
    ("{q} = min(relu({x}))", "{u} = {x} * {q}"),  # ties: rows of zeros
)
FEEDING = FEEDING_DIFFERENTIABLE
# problem sizes: ragged against every tile size, rows of 16-byte multiples (TMA)
CPU_SHAPES = ((33, 40, 24), (64, 64, 32), (17, 24, 8), (70, 72, 40), (1, 16, 16))
# (the last: more tiles than two per SM of an H100 at 128x128 and 128x256, so persistent
# programs and ping-pong consumers each run several tiles)
GPU_SHAPES = ((300, 264, 72), (520, 384, 200), (129, 136, 64), (1024, 1000, 136),
              (2600, 2056, 328))
AXES = ("row", "col", "all")  # per-row (M, 1), per-column (N,), whole problem (1,)
# A and B of the dtypes the gluon family does not take: name -> (A/B dtype, GemmArguments
# options)
_E4M3, _E5M2 = getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None)
INPUTS = {"fp32": (torch.float32, {}), "tf32": (torch.float32, {"allow_tf32": True}),
          "e4m3": (_E4M3, {}), "e4m3_promoted": (_E4M3, {"fp8_fast_accum": False}),
          "e5m2": (_E5M2, {}), "int8": (torch.int8, {})}


@dataclass(frozen=True)
class Case:
    source: str
    operands: tuple[str, ...]  # parameter names after accum, in order
    # (name, kind): full / full32 (a tile of the run's dtype / fp32), acc (the accumulator,
    # fp32), none (not stored), row / col / all (reductions), vrow / vcol (stored vectors)
    outputs: tuple[tuple[str, str], ...]
    c_fp32: bool = False  # C stored in fp32 instead of the run's dtype
    bias_fp32: bool = False
    a_col: bool = False  # A column-major (a transposed (K, M) tensor)
    b_col: bool = False
    batch: int = 1  # L; with 2, B and C are shared by the batches or not
    b_shared: bool = False
    c_shared: bool = False
    names: tuple[tuple[str, str], ...] = ()  # canonical name -> the name in ``source``

    def arguments(self, M: int, N: int, K: int, dtype: torch.dtype, device="cpu",
                  seed: int = 0, inputs: torch.dtype | None = None,
                  **options) -> evtfuse.GemmArguments:
        """``GemmArguments`` on fresh random data: operands and full outputs of ``dtype``,
        A and B of ``inputs`` (default ``dtype``), scaled so |accum| stays ~1; int8 A and B
        hold -1, 0 and 1 (accumulated in int32: |accum| ~ 0.8 sqrt(K), exact). ``options``:
        GemmArguments' keywords (allow_tf32, fp8_fast_accum)."""
        g = torch.Generator(device="cpu").manual_seed(seed)
        L = self.batch
        lead = (L,) if L > 1 else ()
        inputs = inputs or dtype

        def rnd(*shape, dt=dtype, scale=1.0):
            return (torch.randn(*shape, generator=g) * scale).to(dt).to(device)

        def ab(*shape):
            if inputs == torch.int8:
                return torch.randint(-1, 2, shape, generator=g, dtype=torch.int8).to(device)
            return rnd(*shape, dt=inputs, scale=K ** -0.25)

        def operand(rows, cols, col_major, shared):
            dims = () if shared else lead
            if col_major:
                return ab(*dims, cols, rows).transpose(-1, -2)
            return ab(*dims, rows, cols)

        A = operand(M, K, self.a_col, False)
        B = operand(K, N, self.b_col, self.b_shared)
        values: dict = {}
        for name in self.operands:
            if name == "C":
                values[name] = rnd(*(() if self.c_shared else lead), M, N,
                                   dt=torch.float32 if self.c_fp32 else dtype)
            elif name == "bias":
                values[name] = rnd(N, dt=torch.float32 if self.bias_fp32 else dtype)
            elif name == "rowv":
                values[name] = rnd(*lead, M, 1)
            elif name == "alpha":
                values[name] = 0.75
            elif name == "sdev":
                values[name] = torch.tensor(-1.25, device=device)
        shapes = {"row": (*lead, M, 1), "col": (*lead, 1, N) if L > 1 else (N,), "all": (1,),
                  "all_b": (L, 1, 1) if L > 1 else (1,), "vrow": (*lead, M, 1), "vcol": (N,)}
        out = None
        for name, kind in self.outputs:
            if kind == "none":
                t = None
            elif kind in ("full", "full32", "acc"):
                dt = dtype if kind == "full" else torch.float32
                t = torch.empty(*lead, M, N, dtype=dt, device=device)
            else:
                t = torch.empty(*shapes[kind], dtype=torch.float32, device=device)
            values[name] = t
            if name == "D":
                out = t
        values = {dict(self.names).get(k, k): v for k, v in values.items()}
        epi = evtfuse.EpilogueArguments(self.source, **values)
        acc = torch.int32 if inputs == torch.int8 else torch.float32
        return evtfuse.GemmArguments(A, B, out, acc, epi, **options)


@st.composite
def _expr(draw, names: list[str], depth: int, deciding: bool = False) -> str:
    if depth == 0 or draw(st.integers(0, 4)) == 0:
        # the accumulator and earlier values more often than operands and literals
        return draw(st.sampled_from(names + names + list(LITERALS)))
    kinds = ("unary", "unary", "binary", "binary", "ternary", "where")
    kind = draw(st.sampled_from(kinds + (("decide", "decide") if deciding else ())))
    sub = lambda: draw(_expr(names, depth - 1, deciding))  # noqa: E731
    if kind == "decide":
        return draw(st.sampled_from(DECIDING)).format(sub())
    if kind == "unary":
        return draw(st.sampled_from(UNARY)).format(sub())
    if kind == "binary":
        return draw(st.sampled_from(BINARY)).format(sub(), sub())
    if kind == "ternary":
        return draw(st.sampled_from(TERNARY)).format(sub(), sub(), sub())
    conds = [CONDITIONS[n] for n in names if n in CONDITIONS]
    if not conds:
        return draw(st.sampled_from(UNARY)).format(sub())
    return f"where({draw(st.sampled_from(conds))}, {sub()}, {sub()})"


# names operands and outputs may take besides the canonical ones (``user_names``): the
# identifiers generated kernels use or used (parameters, locals, helpers, the namer's own
# forms), Triton's and Gluon's module names, Python builtins, op names, non-ASCII names
NAME_POOL = (
    "x", "x_0", "x_1", "u0", "u1", "u2", "u0_ptr", "u1_sm", "u2_ve_0", "v0", "v1_0", "s0",
    "u_C", "ve_u_x_0", "pf_u_C_0", "lb_u_C_c", "racc_u_R0_s", "pacc_u_R0", "hold_u_F_0",
    "x_ptr", "x_sm", "D_ptr", "D_sm", "D_desc", "R_ws", "R_ws2", "R_cnt", "R_out", "R_os",
    "tl", "triton", "gl", "gluon", "tma", "mbarrier", "math", "M", "N", "K", "L", "A", "B",
    "BLOCK_M", "BLOCK_N", "BLOCK_K", "SUB_N", "EPI_M", "GROUP_M", "EVEN_MN", "NUM_SMS",
    "pid", "pid_m", "pid_n", "pid_m_c", "off_m_c", "acc", "acc_l0", "rm", "rn", "rn0",
    "rk", "mask", "mask0", "bid", "bid64", "num_pid_m", "a_desc", "b_desc", "sa_m", "sb_k",
    "k", "ki", "i", "j0", "f0", "pc", "PL", "WHICH", "row0", "col0", "start", "tile",
    "tile_c", "mma_layout", "dtype", "ready", "order", "evtfuse_kernel", "_ef_sigmoid",
    "_ef_fold_finish", "pf_steps", "pf_r", "range", "float", "int", "min", "max", "print",
    "relu", "exp", "where", "sum", "α", "x_α",  # non-ASCII: the header's table holds them
)
# suffixes and prefixes of the kernels' former identifiers, built onto another drawn name
NAME_SUFFIXES = ("_0", "_1", "_s", "_c", "_c3", "_ptr", "_sl", "_sm", "_sn", "_desc", "_ws",
                 "_ws2", "_cnt", "_out", "_osl", "_os")
NAME_PREFIXES = ("u_", "ve_", "pf_", "lb_", "vb_", "ob_", "rv_", "racc_", "pacc_", "pm_", "st_")
# names a drawn one must not take: the epilogue's own, and its intermediate values (t0,
# and q2, u2 of a reduction feeding computation: ``_INTERMEDIATE``)
_TAKEN = {"accum", "D", "epi"}
_INTERMEDIATE = re.compile(r"[tqu]\d+")


@st.composite
def user_names(draw, canonical: list[str]) -> dict[str, str]:
    """New names for ``canonical`` (operands and outputs, D and accum aside), in order:
    each kept, drawn from ``NAME_POOL``, or an earlier one's new name with one of
    ``NAME_SUFFIXES`` or ``NAME_PREFIXES``; all distinct."""
    out: dict[str, str] = {}
    for name in canonical:
        taken = _TAKEN | set(canonical) - {name} | set(out.values())
        how = draw(st.sampled_from(("keep", "pool", "pool", "derived", "derived")))
        if how == "derived" and out:
            base = draw(st.sampled_from(sorted(out.values())))
            if draw(st.booleans()):
                new = base + draw(st.sampled_from(NAME_SUFFIXES))
            else:
                new = draw(st.sampled_from(NAME_PREFIXES)) + base
        elif how in ("pool", "derived"):
            new = draw(st.sampled_from(NAME_POOL))
        else:
            new = name
        if new in taken or _INTERMEDIATE.fullmatch(new):
            new = name
        out[name] = new
    return {k: v for k, v in out.items() if k != v}


def _renamed(src: str, names: dict[str, str]) -> str:
    """``src`` with each identifier in ``names`` replaced (one pass: no chains)."""
    if not names:
        return src
    return re.sub(r"\b[A-Za-z_]\w*\b", lambda m: names.get(m.group(0), m.group(0)), src)


@st.composite
def cases(draw, max_steps: int = 3, reductions: bool = True, named: bool = True,
          differentiable: bool = False, feeding: bool = False, deciding: bool = False) -> Case:
    """An epilogue of 1-``max_steps`` assignments and one to four outputs; ``named``: its
    operands and outputs take drawn names (``user_names``); ``feeding``: sometimes a
    reduction feeding computation too (``FEEDING``: per row, or returned per row, column,
    for the whole of each batch or of all; with ``differentiable``, those gradients
    pass); ``deciding``: decisions on computed values too (``DECIDING``)."""
    operands = [n for n in OPERANDS if draw(st.booleans())]
    names = ["accum", *operands]
    body: list[str] = []
    values = ["accum"]  # computed values an output may take
    def on_product(e: str) -> str:  # every computed value depends on the product
        return e if any(v in e for v in values) else f"({e} + accum)"

    for k in range(draw(st.integers(1, max_steps))):
        body.append(f"t{k} = {on_product(draw(_expr(names, 2, deciding)))}")
        names.append(f"t{k}")
        values.append(f"t{k}")
    reducible = list(values)  # what a returned reduction may take: none computed from one
    fed: list[tuple[str, str]] = []  # a reduction feeding computation, also returned
    if feeding and draw(st.booleans()):
        form = draw(st.sampled_from(FEEDING_DIFFERENTIABLE if differentiable else FEEDING))
        x = draw(st.sampled_from(values))
        k = len(body)
        body += [line.format(x=x, q=f"q{k}", u=f"u{k}") for line in form]
        names.append(f"u{k}")
        values.append(f"u{k}")
        if "{q}" in form[0] and draw(st.integers(0, 2)) == 0:  # its axes: the output's shape
            fed.append((f"q{k}", draw(st.sampled_from(("row", "col", "all_b", "all")))))
    outputs: list[tuple[str, str]] = []
    last = values[-1]
    d_kind = draw(st.sampled_from(("full", "full", "full32", "none") if reductions
                                  else ("full", "full", "full32")))
    body.append(f"D = {last}")
    outputs.append(("D", d_kind))
    outputs += fed
    if draw(st.booleans()):
        body.append(f"F = {on_product(draw(_expr(names, 1)))}")
        outputs.append(("F", draw(st.sampled_from(("full", "full32")))))
    if reductions and (d_kind == "none" or draw(st.booleans())):
        for r in range(draw(st.integers(1, 2))):
            red = draw(st.sampled_from(DIFFERENTIABLE if differentiable else REDUCTIONS))
            body.append(f"R{r} = {red}({draw(st.sampled_from(reducible))})")
            outputs.append((f"R{r}", draw(st.sampled_from(AXES))))
    # stored vectors: values constant along a row (per-row operands) or a column
    vectors = [(n, k) for n, k in (("rowv", "vrow"), ("bias", "vcol")) if n in operands]
    for k, (name, kind) in enumerate(vectors):
        if draw(st.booleans()):
            pool = [name] + [n for n in ("alpha", "sdev") if n in operands]
            body.append(f"V{k} = {draw(_expr(pool, 1))}")
            if name not in body[-1]:
                body[-1] += f" + {name}"
            outputs.append((f"V{k}", kind))
    if draw(st.integers(0, 5)) == 0:
        outputs.append(("accum", "acc"))
    ret = ", ".join(n for n, _ in outputs)
    used = [n for n in operands if any(n in line for line in body)]
    src = "\n".join([f"def epi({', '.join(['accum', *used])}):", *(f"    {b}" for b in body),
                     f"    return {ret}"])
    batch = draw(st.sampled_from((1, 1, 1, 2)))
    renamed = draw(user_names([*used, *(n for n, _ in outputs if n not in ("D", "accum"))])) \
        if named else {}
    return Case(_renamed(src, renamed), tuple(used), tuple(outputs), c_fp32=draw(st.booleans()),
                bias_fp32=draw(st.booleans()), a_col=draw(st.integers(0, 3)) == 0,
                b_col=draw(st.integers(0, 3)) == 0, batch=batch,
                b_shared=batch > 1 and draw(st.booleans()),
                c_shared=batch > 1 and draw(st.booleans()), names=tuple(renamed.items()))


def tensor_operands(args: evtfuse.GemmArguments) -> list[str]:
    """The names (as drawn) of a case's floating-point tensor operands: what a gradient can
    reach besides A and B (``test_fuzz_grads.py``); Python numbers get none."""
    values = args.epilogue.values
    return [n for n in args.epilogue.parsed.params
            if isinstance(values[n], torch.Tensor) and values[n].dtype.is_floating_point]


def k_major(case: Case) -> Case:
    """``case`` with A row-major and B column-major: both K-contiguous, as 8-bit inputs on
    the tensor cores need (the hopper family refuses other layouts, saying so)."""
    return dataclasses.replace(case, a_col=False, b_col=True)


def k16(shape: tuple[int, int, int]) -> tuple[int, int, int]:
    """``shape`` with K a multiple of 16: rows of 8-bit A and B in 16-byte multiples (TMA)."""
    M, N, K = shape
    return M, N, -(-K // 16) * 16


def laid_out_for(inputs: torch.dtype | None, case: Case, shape: tuple[int, int, int]
                 ) -> tuple[Case, tuple[int, int, int]]:
    """``case`` and ``shape`` as A and B of dtype ``inputs`` take them on the tensor cores:
    8-bit ones K-contiguous (``k_major``) with K a multiple of 16 (``k16``), others as
    drawn."""
    if inputs is not None and inputs.itemsize == 1:
        return k_major(case), k16(shape)
    return case, shape


def pick(args: evtfuse.GemmArguments, family: str, which: str, cc: int | None = None):
    """The kernel a fuzz case runs, or None where the family offers none for it (a
    refusal ``explain`` states: shared memory, per-column sums on cooperative tiles, ...):
    ``family``'s first config (``which`` = "first"), or the gluon family's first
    cooperative one ("coop"), or its first ping-pong config with two-warpgroup consumers
    ("wide": ``with_config(num_warps=8)`` and the stages that fit; the tuner offers those
    only for some epilogues, the fuzz tries them on all)."""
    ks = [k for k in get_kernels(args, cc=cc) if k.family.name == family]
    if which == "coop":
        ks = [k for k in ks if k.config.cooperative]
    elif which == "wide":
        ks = [k for k in ks if not k.config.cooperative]
    else:
        assert which == "first", which
    if not ks:
        return None
    k = ks[0]
    if which != "wide" or k.config.num_warps == 8:
        return k
    wide = k.with_config(num_warps=8)  # 8 warps may need more scratch: fewer stages, fit
    # to what the kernel emits (in two passes: the first pass's epilogue, with workspaces)
    emitted = judged(k.family, args, k.target)
    return wide.with_config(num_stages=k.family.fit_stages(emitted, wide.config))


# ------------------------------------------------------------------ special floats

SPECIAL_FRACTIONS = (1 / 64, 1 / 8)  # of each operand tensor's elements


def special_floats(dtype: torch.dtype) -> tuple[float, ...]:
    """What a special-value case puts into inputs of ``dtype``: +-0, +-inf, NaN, the smallest
    denormal and a larger one, and a large finite value: fp16's largest (65504); for wider
    formats 1e30, not their largest (3.4e38), which a sum of a few of them overflows or not
    depending on the order of the sum (a reduction's, or the tiles')."""
    fi = torch.finfo(dtype)
    tiny = fi.smallest_normal
    large = min(fi.max, 1e30)
    return (0.0, -0.0, float("inf"), float("-inf"), float("nan"), tiny * fi.eps,
            -tiny * fi.eps, tiny / 3, large, -large)


def with_special_values(args: evtfuse.GemmArguments, seed: int,
                        fraction: float) -> evtfuse.GemmArguments:
    """``args`` with special floats (``special_floats``) in place of ``fraction`` of each
    floating operand tensor's elements (at least one), a device scalar or a runtime scalar
    one time in four, and one element of A and of B one time in two each (an inf or NaN
    there spreads over a row or column of the accumulator; more would leave nothing
    ordinary). Each tensor takes one, two or all of the special values (a row with +inf and
    no NaN is worth checking, and rare among all ten). Chosen from ``seed``; changed in
    place, returned."""
    g = torch.Generator(device="cpu").manual_seed(seed)

    def draw(dtype, count):
        pool = torch.tensor(special_floats(dtype), dtype=torch.float32)
        pool = pool[torch.randperm(len(pool), generator=g)]
        pool = pool[: (1, 2, len(pool))[int(torch.randint(0, 3, (1,), generator=g))]]
        return pool[torch.randint(0, len(pool), (count,), generator=g)]

    def coin(n):
        return int(torch.randint(0, n, (1,), generator=g)) == 0

    def spoil(t: torch.Tensor, count: int) -> None:
        idx = tuple(torch.randint(0, s, (count,), generator=g).to(t.device) for s in t.shape)
        t[idx] = draw(t.dtype, count).to(t.dtype).to(t.device)

    floating = (torch.float16, torch.bfloat16, torch.float32)
    values = args.epilogue.values
    for name in args.epilogue.parsed.params:
        v = values[name]
        if isinstance(v, torch.Tensor) and v.dtype in floating:
            if v.numel() == 1:
                if coin(4):
                    v.fill_(float(draw(v.dtype, 1)))
            elif v.numel():
                spoil(v, max(1, round(v.numel() * fraction)))
        elif isinstance(v, float) and coin(4):
            values[name] = float(draw(torch.float32, 1))
    for t in (args.A, args.B):
        if t.dtype in floating and t.numel() and coin(2):
            spoil(t, 1)
    return args
