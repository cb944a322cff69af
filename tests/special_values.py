"""Special floats through every row of the op table, against torch's own functions.

Imported by ``test_special_values.py`` (CPU tier: the reference evaluator, constant folding
and the kernels under Triton's interpreter) and ``gpu/test_gpu_special_values.py`` (every
kernel family on a GPU). Everything here is driven by ``evtfuse.optable.OPS``: a new row
is run through the same checks without an edit here, except that it needs its entry in
``TORCH_OWN`` (torch's own function for it, the thing compared against), which
``missing_rows`` reports.

Inputs are made of ``SPECIAL`` values (+-0, +-inf, NaN, denormals, the smallest normal,
the largest finite values) and ``ORDINARY`` ones at the points where ops change form
(softplus's threshold 20, exp's overflow near 88, ...): every value for one-argument
rows, every pair for two, every triple of a smaller set for three. A result matches when
both are NaN, both are the same infinity, both are zeros of the same sign, or both are
finite within ``rtol`` of torch's value plus a few denormal steps.

Where evtfuse defines a value torch's own function does not give, for a reason the row
documents (its ``doc``, so docs/ops.md too), the rule is one entry of ``EXCEPTIONS``:
which elements it covers and the value evtfuse gives there (or "either zero" for a tie of
+0.0 and -0.0). Those elements are still checked, against that value: nothing is skipped.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

import evtfuse
from evtfuse.backends.triton import versions
from evtfuse.optable import (BINARY_OPERATORS, CALLABLE, CAST_TARGETS, COMPARE_OPERATORS,
                             FP8_DTYPES, OPERATOR_SYMBOLS, OPS, UNARY_OPERATORS, Category, OpDef,
                             f32, int_range)

FMAX = torch.finfo(torch.float32).max
TINY = torch.finfo(torch.float32).tiny  # smallest normal, 2^-126
DENORM = 2.0 ** -149  # smallest denormal

SPECIAL = (0.0, -0.0, math.inf, -math.inf, math.nan, DENORM, -DENORM, 1e-40, -3e-39, TINY,
           -TINY, FMAX, -FMAX)
ORDINARY = (1.0, -1.0, 0.5, -2.5, 3.0, 1e-20, -1e-20, 20.0, -20.0, -17.5, 30.0, 88.0, -88.0,
            100.0, -100.0, 1.5e38)
VALUES = SPECIAL + ORDINARY
VALUES3 = (0.0, -0.0, math.inf, -math.inf, math.nan, DENORM, -3e-39, FMAX, -FMAX, 1.5, -2.5,
           100.0)  # three-argument rows: every triple of these

RTOL = 2e-5  # the spellings' rounding (pow's exp/log path: ~|c log x| ulps, at most ~90)
ATOL = 4 * DENORM  # a denormal result may differ by a few of its steps


def inputs_for(row: OpDef) -> list[torch.Tensor]:
    """Flat fp32 tensors, one per argument: every combination of the values."""
    pool = VALUES if row.arity < 3 else VALUES3
    combos = list(itertools.product(pool, repeat=row.arity))
    return [torch.tensor(c, dtype=torch.float32) for c in zip(*combos)]


# ---------------------------------------------------------------- torch's own functions

def _cast_own(x: torch.Tensor, dtype: str) -> torch.Tensor:
    """torch's own conversion for float targets; for integers torch's own conversion of NaN,
    inf or an out-of-range value is undefined (C++), so the documented rule is spelled with
    torch's round (half to even) and clamp before it (an integer has no -0.0)."""
    dt = CAST_TARGETS[dtype].dtype
    if dt.is_floating_point:
        return x.to(dt).to(torch.float32)
    lo, hi = int_range(dt)
    return torch.where(torch.isnan(x), 0.0, torch.round(x).clamp(lo, hi)).to(dt).to(torch.float32)


TORCH_OWN: dict[str, Callable[..., torch.Tensor]] = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "neg": torch.neg,
    "pow": lambda x, exponent: torch.pow(x, exponent),
    "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge, "eq": torch.eq,
    "ne": torch.ne, "logical_and": torch.logical_and, "logical_or": torch.logical_or,
    "logical_not": torch.logical_not,
    "identity": lambda x: x.clone(), "relu": torch.relu,
    "leaky_relu": lambda x, slope: F.leaky_relu(x, slope),
    "sigmoid": torch.sigmoid, "log_sigmoid": F.logsigmoid, "tanh": torch.tanh, "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu,
    "hardswish": F.hardswish, "softplus": F.softplus, "exp": torch.exp, "log": torch.log,
    "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "abs": torch.abs, "sin": torch.sin,
    "log1p": torch.log1p, "expm1": torch.expm1, "floor": torch.floor, "ceil": torch.ceil,
    "round": torch.round, "sign": torch.sign,
    "cos": torch.cos, "tan": torch.tan, "erf": torch.erf, "maximum": torch.maximum,
    "minimum": torch.minimum,
    "clamp": lambda x, lo, hi: torch.clamp(x, lo, hi),
    "where": lambda c, a, b: torch.where(c != 0, a, b),
    "multiply_add": lambda a, b, c: a * b + c,
    "cast": _cast_own,
    # reductions: (x, dims) -> keepdim result
    "sum": lambda x, dims: x.sum(dim=dims, keepdim=True),
    "max": lambda x, dims: x.amax(dim=dims, keepdim=True),
    "min": lambda x, dims: x.amin(dim=dims, keepdim=True),
    "logsumexp": lambda x, dims: torch.logsumexp(x, dim=dims, keepdim=True),
    "mean": lambda x, dims: x.mean(dim=dims, keepdim=True),
    # torch's softmax denominator, as its softmax kernels form it
    "shifted_sumexp": lambda x, dims: torch.exp(x - x.amax(dim=dims, keepdim=True)).sum(
        dim=dims, keepdim=True),
    # row functions: (x,) -> over the last axis
    "softmax": lambda x: torch.softmax(x, dim=-1),
    "log_softmax": lambda x: torch.log_softmax(x, dim=-1),
}

# parameters tried besides each numeric default (a Choice: every name it allows)
EXTRA_PARAMS: dict[str, dict[str, tuple[float, ...]]] = {
    "pow": {"exponent": (0.0, -0.0, 1.0, 3.0, -1.0, -2.0, -3.0, 16.0, -16.0, 17.0, -17.0,
                         18.0, 0.5, -0.5, 1.7, -2.5, 1e10, 16777217.0, math.inf, -math.inf)},
    "leaky_relu": {"slope": (0.2, -0.5, 0.0)},
}


def missing_rows() -> set[str]:
    """Rows computed per element or reduced with no torch function to compare against
    (conditional stores store their value unchanged: tests/test_store_where_cpu.py)."""
    return {r.name for r in elementwise_rows() + reduction_rows() + rowwise_rows()} \
        - set(TORCH_OWN)


def param_sets(row: OpDef) -> list[dict]:
    """The parameter combinations a row is checked with."""
    sets = [dict(row.defaults)]
    for name, default in row.params:
        choice = row.choice(name)
        if choice is not None:
            sets = [{**s, name: c} for s in sets for c, _ in choice.names]
        else:
            sets += [{**sets[0], name: v} for v in EXTRA_PARAMS.get(row.name, {}).get(name, ())]
    return sets


def param_id(params: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in params.items()) or "-"


# ---------------------------------------------------------------- documented exceptions

@dataclass(frozen=True)
class Exception_:
    """Where evtfuse's value is not torch's own: the elements ``covers(inputs, params)``
    selects get ``value(inputs, params)`` (None: torch's value, either sign of zero)."""

    op: str
    covers: Callable[[list, dict], torch.Tensor]
    value: Callable[[list, dict], torch.Tensor] | None
    reason: str
    doc_says: str  # what the row's doc (and so docs/ops.md) says of it
    gpu_only: bool = False
    also: Callable[[], bool] | None = None  # a gpu_only rule that holds for interpreted kernels too when true


def _zero_tie(ins, params):
    zeros = sum((t == 0).int() for t in ins)
    return zeros >= 2


def _fused(ins, params):
    a, b, c = (t.double() for t in ins)
    return (a * b + c).float()


def _fp8_overflow(ins, params):
    """fp8 targets: the elements past the format's largest finite value."""
    dt = CAST_TARGETS[params["dtype"]].dtype
    if dt not in FP8_DTYPES:
        return torch.zeros_like(ins[0], dtype=torch.bool)
    return ins[0].abs() > torch.finfo(dt).max


def _fp8_sat(ins, params):
    dt = CAST_TARGETS[params["dtype"]].dtype
    if dt not in FP8_DTYPES:
        return ins[0]
    fmax = torch.finfo(dt).max
    return ins[0].clamp(-fmax, fmax)


def _exponent_not_fp32(ins, params):
    c = params["exponent"]
    return torch.full_like(ins[0], f32(c) != c and not math.isnan(c), dtype=torch.bool)


EXCEPTIONS: tuple[Exception_, ...] = (
    Exception_("gelu", lambda ins, p: ins[0] >= 2.0 ** 127, lambda ins, p: ins[0],
               "torch's CPU gelu gives NaN at +inf and overflows to inf above 2^127 (its "
               "intermediate x * (1 + erf)); evtfuse gives x * Phi(x) = x there, as torch's "
               "CUDA gelu does", "+inf"),
    Exception_("maximum", _zero_tie, None, "a tie of +0.0 and -0.0 may give either zero", "either zero"),
    Exception_("minimum", _zero_tie, None, "a tie of +0.0 and -0.0 may give either zero", "either zero"),
    Exception_("clamp", _zero_tie, None, "a tie of +0.0 and -0.0 may give either zero", "either zero"),
    # reductions: ``covers`` and ``value`` see the result (torch's own), not the inputs
    Exception_("max", lambda res, p: res[0] == 0, None,
               "a tie of +0.0 and -0.0 may give either zero", "either zero"),
    Exception_("min", lambda res, p: res[0] == 0, None,
               "a tie of +0.0 and -0.0 may give either zero", "either zero"),
    Exception_("pow", _exponent_not_fp32,
               lambda ins, p: torch.pow(ins[0], f32(p["exponent"])),
               "the exponent is rounded to fp32 as every literal (torch.pow of a float tensor "
               "uses it as given in some elements, rounded in others)", "rounded to fp32"),
    Exception_("cast", _fp8_overflow, _fp8_sat,
               "fp8 saturates to its largest finite value, inf included (CUTLASS's satfinite "
               "converters); torch's own conversion gives NaN", "inf included"),
    Exception_("multiply_add", lambda ins, p: torch.ones_like(ins[0], dtype=torch.bool),
               _fused, "on a GPU a * b + c is one fused multiply-add, rounded once: where "
               "a * b overflows and c brings the sum back in range it is finite",
               "rounded once", gpu_only=True,
               also=lambda: versions.is_new("interpreter_fma")),
    # the GPU spellings on MUFU.EX2 / MUFU.RCP without subnormal handling (triton_cuda)
    Exception_("sigmoid", lambda ins, p: torch.sigmoid(ins[0]) < TINY,
               lambda ins, p: torch.zeros_like(ins[0]),
               "on a GPU results below 2^-126 flush to 0", "flush to 0", gpu_only=True),
    Exception_("silu", lambda ins, p: torch.sigmoid(ins[0]) < TINY,
               lambda ins, p: ins[0] * 0.0,
               "on a GPU x * sigmoid(x) with sigmoid(x) flushed to 0 below 2^-126",
               "flush", gpu_only=True),
    Exception_("gelu_tanh", lambda ins, p: F.gelu(ins[0], approximate="tanh") == 0, None,
               "on a GPU h + h * tanh(..) (h = x / 2) is one fused multiply-add: where tanh "
               "is -1, h - h is +0.0, torch's h * (1 + tanh) -0.0", "may be +0.0",
               gpu_only=True),
    Exception_("log_sigmoid", lambda ins, p: ins[0] > 87.33,
               lambda ins, p: torch.zeros_like(ins[0]),
               "on a GPU exp(-|x|) below 2^-126 flushes to 0: log_sigmoid(x) is 0 where it "
               "is a denormal (x > 87.3)", "flush", gpu_only=True),
)

# relative tolerances of the GPU spellings that are approximations (triton_cuda)
GPU_RTOL = {"tanh": 1e-3, "gelu_tanh": 1e-3}  # MUFU.TANH: relative error about 2^-11


def expected(name: str, ins: list[torch.Tensor], params: dict, gpu: bool = False,
             dims=None, kernel: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's own value with the documented exceptions applied, and where either sign of
    zero is accepted."""
    own = TORCH_OWN[name]
    want = (own(ins[0], dims) if dims is not None else own(*ins, **params)).to(torch.float32)
    free = torch.zeros(want.shape, dtype=torch.bool)
    for e in EXCEPTIONS:
        if e.op != name or (e.gpu_only and not gpu and not (kernel and e.also and e.also())):
            continue
        if dims is not None:  # a reduction: the rule covers every result
            mask = e.covers([want], params).expand(want.shape)
            value = None if e.value is None else e.value([want], params)
        else:
            mask = e.covers(ins, params).expand(want.shape)
            value = None if e.value is None else e.value(ins, params)
        if value is None:
            free |= mask
        else:
            want = torch.where(mask, value.to(torch.float32), want)
    return want, free


def mismatches(got: torch.Tensor, want: torch.Tensor, free: torch.Tensor,
               rtol: float = RTOL, atol: float = ATOL) -> torch.Tensor:
    """Elements where ``got`` is not ``want``: NaN matches NaN, infinities and the sign of
    zero exactly (``free``: either zero), finite values within the tolerance."""
    got, want = got.double().cpu().flatten(), want.double().cpu().flatten()
    free = free.cpu().flatten()
    gn, wn = torch.isnan(got), torch.isnan(want)
    ok = gn & wn
    both = ~gn & ~wn
    inf = torch.isinf(got) | torch.isinf(want)
    ok |= both & inf & (got == want)
    fin = both & ~inf
    zero = fin & (got == 0) & (want == 0)
    same_sign = torch.signbit(got) == torch.signbit(want)
    ok |= zero & (same_sign | free)
    close = (got - want).abs() <= rtol * want.abs() + atol
    ok |= fin & ~((got == 0) & (want == 0)) & close
    return ~ok


def report(what: str, bad: torch.Tensor, got, want, ins) -> str:
    idx = bad.nonzero().flatten().tolist()
    lines = [f"{what}: {len(idx)} of {bad.numel()} elements differ from torch"]
    for i in idx[:12]:
        args = ", ".join(repr(float(t.flatten()[i])) for t in ins)
        lines.append(f"  ({args}) -> {float(got.flatten()[i])!r}, torch "
                     f"{float(want.flatten()[i])!r}")
    return "\n".join(lines)


def check(what: str, got, ins, name: str, params: dict, gpu: bool = False,
          rtol: float = RTOL, kernel: bool = True) -> None:
    """``got`` against ``expected``; ``kernel``: computed by a kernel (not the reference
    evaluator or constant folding)."""
    want, free = expected(name, ins, params, gpu, kernel=kernel)
    bad = mismatches(got, want, free, rtol=rtol)
    assert not bad.any(), report(what, bad, got, want, ins)


# ---------------------------------------------------------------- epilogue text of a row

ARGS = ("X", "Y", "Z")


def source_literal(v) -> str:
    """A number as epilogue source writes it (inf as 1e400, as Python reads it)."""
    if isinstance(v, str):
        return repr(v)
    if math.isinf(v):
        return "1e400" if v > 0 else "-1e400"
    assert not math.isnan(v), "NaN cannot be written as a literal"
    return repr(float(v))


def expression(row: OpDef, params: dict) -> str:
    """The epilogue expression applying ``row`` to X, Y, Z."""
    args = list(ARGS[: row.arity])
    for table in (BINARY_OPERATORS, COMPARE_OPERATORS):
        for py, op in table.items():
            if op == row.name:
                return f"({args[0]} {OPERATOR_SYMBOLS[py]} {args[1]})"
    for py, op in UNARY_OPERATORS.items():
        if op == row.name:
            return f"({OPERATOR_SYMBOLS[py]}{args[0]})"
    if row.name == "pow":
        return f"({args[0]} ** {source_literal(params['exponent'])})"
    assert row.name in CALLABLE, f"no way to write op {row.name} in an epilogue"
    extra = [f"{k}={source_literal(v)}" for k, v in params.items()]
    return f"{row.name}({', '.join(args + extra)})"


def epilogue_source(row: OpDef, params: dict) -> str:
    return (f"def epi(accum, {', '.join(ARGS[: row.arity])}):\n"
            f"    D = {expression(row, params)}\n    return D")


def group_source(cases: list[tuple[OpDef, dict]]) -> tuple[str, list[str]]:
    """One epilogue applying several rows of one arity to X, Y, Z: outputs D, D1, D2, ...
    (one kernel for several checks where compiling each is slow)."""
    names = ["D"] + [f"D{k}" for k in range(1, len(cases))]
    arity = cases[0][0].arity
    assert all(row.arity == arity for row, _ in cases)
    body = [f"    {n} = {expression(row, p)}" for n, (row, p) in zip(names, cases)]
    src = "\n".join([f"def epi(accum, {', '.join(ARGS[:arity])}):", *body,
                     f"    return {', '.join(names)}"])
    return src, names


def elementwise_rows() -> list[OpDef]:
    """Every row computed per element (conditional stores apart: tests/test_store_where_cpu.py)."""
    return [r for r in OPS.values()
            if r.category not in (Category.REDUCE, Category.STORE, Category.ROWWISE)]


def rowwise_rows() -> list[OpDef]:
    """Rows computed over each row of their input (softmax, log_softmax)."""
    return [r for r in OPS.values() if r.category is Category.ROWWISE]


def reduction_rows() -> list[OpDef]:
    return [r for r in OPS.values() if r.category is Category.REDUCE]


# ---------------------------------------------------------------- through a kernel

N_COLS = 32  # elements laid out as (M, 32) tiles


def gemm_arguments(source: str, ins: list[torch.Tensor], device="cpu", dtype=torch.float32,
                   ab_dtype: torch.dtype | None = None, outputs: tuple[str, ...] = ("D",)
                   ) -> tuple[evtfuse.GemmArguments, torch.Tensor]:
    """``GemmArguments`` that apply the epilogue to full operands X, Y, Z holding ``ins``
    (padded with 1.0), and the output D (fp32 unless ``dtype``; ``outputs``: all the
    epilogue's, like D, in the arguments' values); A and B (zeros, of ``ab_dtype``,
    default ``dtype``) only give the problem its shape."""
    n = ins[0].numel()
    M = max(1, -(-n // N_COLS))
    pad = lambda t: torch.cat([t, torch.ones(M * N_COLS - n)]).reshape(M, N_COLS)  # noqa: E731
    values = {a: pad(t).to(dtype).to(device) for a, t in zip(ARGS, ins)}
    D = torch.empty(M, N_COLS, dtype=dtype, device=device)
    A = torch.zeros(M, 16, dtype=ab_dtype or dtype, device=device)
    B = torch.zeros(16, N_COLS, dtype=ab_dtype or dtype, device=device)
    outputs = {name: D if name == "D" else torch.empty_like(D) for name in outputs}
    epi = evtfuse.EpilogueArguments(source, **outputs, **values)
    return evtfuse.GemmArguments(A, B, D, torch.float32, epi), D


def vector_arguments(source: str, arity: int, device="cpu", dtype=torch.float32,
                     ab_dtype: torch.dtype | None = None, outputs: tuple[str, ...] = ("D",)):
    """For two- and three-argument rows: X a full operand, Y a per-row one (M, 1), Z a
    per-column one (N,), still meeting every pair of ``VALUES`` (every triple of
    ``VALUES3``), rounded to ``dtype``. With n values: M = n; X[i, j] = pool[j % n] and
    Y[i] = pool[i]; two arguments: N = n rounded up to a multiple of 8 (16-byte rows);
    three: N = n^2, Z[j] = pool[j // n]. One full operand, not two or three (the gluon
    family's shared memory holds no more beside its stages). Returns the arguments, D and
    the inputs of each element, flat."""
    pool = VALUES if arity == 2 else VALUES3
    v = torch.tensor(pool, dtype=torch.float32).to(dtype).float()
    n = len(v)
    N = -(-n // 8) * 8 if arity == 2 else n * n
    X = v[torch.arange(N) % n].reshape(1, N).expand(n, N).contiguous()
    ops = {"X": X, "Y": v.reshape(n, 1)}
    ins = [X.flatten(), v.reshape(n, 1).expand(n, N).flatten()]
    if arity == 3:
        ops["Z"] = v.repeat_interleave(n)
        ins.append(ops["Z"].reshape(1, N).expand(n, N).flatten())
    D = torch.empty(n, N, dtype=dtype, device=device)
    outs = {name: D if name == "D" else torch.empty_like(D) for name in outputs}
    A = torch.zeros(n, 16, dtype=ab_dtype or dtype, device=device)
    B = torch.zeros(16, N, dtype=ab_dtype or dtype, device=device)
    epi = evtfuse.EpilogueArguments(source, **{k: t.to(dtype).to(device) for k, t in ops.items()},
                                    **outs)
    return evtfuse.GemmArguments(A, B, D, torch.float32, epi), D, ins


def for_dtype(v: float, dtype: torch.dtype) -> float:
    """A special value of fp32 as its counterpart in ``dtype``: the largest finite value, the
    smallest normal, and denormals scaled to stay denormals; other values as they are."""
    fi = torch.finfo(dtype)
    if abs(v) == FMAX:
        return math.copysign(fi.max, v)
    if abs(v) == TINY:
        return math.copysign(fi.tiny, v)
    if 0 < abs(v) < TINY:
        return v / TINY * fi.tiny
    return v


POISON = -1234.5  # outputs are filled with it first: an unwritten element shows


def run_kernel(kernel, args, D, n: int, outputs: tuple[str, ...] = ("D",)):
    """The first ``n`` elements of D after ``kernel`` ran on ``args`` (with several
    ``outputs``: a list of each one's)."""
    values = args.epilogue.values
    for name in outputs:
        values[name].fill_(POISON)
    kernel.run(args)
    if D.is_cuda:
        torch.cuda.synchronize()
    got = [values[name].float().flatten()[:n].cpu() for name in outputs]
    return got[0] if outputs == ("D",) else got


# ---------------------------------------------------------------- reductions

# lines reduced by sum / max / min / logsumexp: (name, values spread along the line, pad)
LINES = (
    ("ordinary", (0.5, 1.25, 2.0, 0.75, 1.5), 1.0),
    ("all -0", (), -0.0),
    ("+0 and -0", (0.0, -0.0, -0.0), -0.0),
    ("+inf", (math.inf, 2.0, -3.0), 0.5),
    ("-inf", (-math.inf, 2.0, -3.0), 0.5),
    ("+inf and -inf", (math.inf, -math.inf), 0.5),
    ("nan", (math.nan, 2.0), 0.5),
    ("nan and infs", (math.inf, math.nan, -math.inf), 0.5),
    ("all -inf", (), -math.inf),
    ("all +inf", (), math.inf),
    ("max and max", (FMAX, FMAX), 0.0),
    ("-max and -max", (-FMAX, -FMAX), 0.0),
    ("max and -max", (FMAX, -FMAX), 0.0),
    ("denormals", (DENORM, 1e-40, -3e-39, TINY, -DENORM), 0.0),
    ("largest", (FMAX,), 0.5),
    ("large exponents", (88.0, 89.0, 100.0), -100.0),
    ("-0 and +inf", (-0.0, math.inf), -0.0),
    ("-max alone", (-FMAX,), -math.inf),
)


def line(values: tuple, pad: float, length: int) -> torch.Tensor:
    """``values`` spread evenly along a line of ``length`` elements, ``pad`` elsewhere."""
    t = torch.full((length,), pad, dtype=torch.float32)
    for k, v in enumerate(values):
        t[(k * length) // max(len(values), 1)] = v
    return t


def line_matrix(length: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """One line per row (its values ``for_dtype``), then copies of the first line up to a
    multiple of 8 rows (rows of 16-byte multiples when the matrix is transposed, as TMA
    needs), in ``dtype``."""
    rows = [line(tuple(for_dtype(x, dtype) for x in v), for_dtype(p, dtype), length)
            for _, v, p in LINES]
    rows += [rows[0]] * (-len(rows) % 8)
    return torch.stack(rows).to(dtype)


def reduction_source(op: str) -> str:
    return f"def epi(accum, X):\n    D = X\n    R = {op}(X)\n    return D, R"
