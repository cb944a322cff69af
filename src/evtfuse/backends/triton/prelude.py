"""Triton helper functions that op-table spellings call (layer: backends/triton).

Kept as source text, not imported objects: the emitter copies the helpers a kernel uses
into its generated module, so they are decorated the same way as the kernel (compiled on
a GPU, interpreted under ``TRITON_INTERPRET=1``). Names start with ``_ef_``. Each helper
matches its op-table row's torch meaning (NaN propagation included) to fp32 rounding.
"""

from __future__ import annotations

import re

def _fold(bits: int, comment: str) -> str:
    """``_ef_fold`` (float32 bits in an int32 workspace) or ``_ef_fold64`` (float64 in
    int64): one text, the integer width and NaN's bit pattern filled in."""
    name = "_ef_fold" if bits == 32 else f"_ef_fold{bits}"
    nan = "0x7FFFFFFF" if bits == 32 else "0x7FFFFFFFFFFFFFFF"
    return f'''
@triton.jit
def {name}(ws, x, mask, MAX: tl.constexpr):{comment}
    if MAX:
        b = tl.where(x != x, {nan}, x.to(tl.int{bits}, bitcast=True))
        tl.atomic_max(ws, b, mask=mask & (b >= 0), sem="relaxed", scope="gpu")
        tl.atomic_min(ws.to(tl.pointer_type(tl.uint{bits})), b.to(tl.uint{bits}, bitcast=True),
                      mask=mask & (b < 0), sem="relaxed", scope="gpu")
    else:
        b = tl.where(x != x, -1, x.to(tl.int{bits}, bitcast=True))
        tl.atomic_min(ws, b, mask=mask & (b >= 0), sem="relaxed", scope="gpu")
        tl.atomic_max(ws.to(tl.pointer_type(tl.uint{bits})), b.to(tl.uint{bits}, bitcast=True),
                      mask=mask & (b < 0), sem="relaxed", scope="gpu")
'''


HELPERS: dict[str, str] = {
    "_ef_ex2_ftz": '''
@triton.jit
def _ef_ex2_ftz(x):
    # 2^x on MUFU.EX2 without its subnormal handling: results below 2^-126 flush to 0
    return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x],
                                     dtype=tl.float32, is_pure=True, pack=1)
''',
    "_ef_launch_dependents": '''
@triton.jit
def _ef_launch_dependents():
    # griddepcontrol.launch_dependents: the launch after this kernel, where it is a
    # programmatic dependent launch (the combine step), may start once every program of
    # this one has passed here; it waits for this kernel's memory before reading any
    # (combine.combine_partials' gdc_wait). No effect on any other launch.
    tl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [],
                              dtype=tl.int32, is_pure=False, pack=1)
''',
    "_ef_log1p_series": '''
@triton.jit
def _ef_log1p_series(t):
    # log(1 + t) by its series up to t^6: relative error < 1e-8 for |t| < 1/16; in float64
    # up to t^13 (< 2e-17: the first term left out, |t|^13 / 14, relative)
    if t.dtype == tl.float64:
        r = t * (1.0 - t * (0.5 - t * (0.3333333333333333 - t * (0.25 - t * (0.2 - t * (
            0.16666666666666666 - t * (0.14285714285714285 - t * (0.125 - t * (
                0.1111111111111111 - t * (0.1 - t * (0.09090909090909091 - t * (
                    0.08333333333333333 - t * 0.07692307692307693))))))))))))
    else:
        r = t * (1.0 - t * (0.5 - t * (0.3333333333333333 - t * (0.25 - t * (0.2 - t * 0.16666666666666666)))))
    return r
''',
    "_ef_sqrt": '''
@triton.jit
def _ef_sqrt(x):
    # the IEEE-rounded square root: sqrt_rn in fp32 (tl.sqrt is approximate there), tl.sqrt
    # in float64 (IEEE-rounded already; sqrt_rn takes fp32 only)
    if x.dtype == tl.float64:
        r = tl.sqrt(x)
    else:
        r = tl.sqrt_rn(x)
    return r
''',
    "_ef_sigmoid": '''
@triton.jit
def _ef_sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))
''',
    "_ef_sigmoid_cuda": '''
@triton.jit
def _ef_sigmoid_cuda(x):
    # MUFU.EX2 and MUFU.RCP without their subnormal handling (5 instructions instead of 10):
    # results below 2^-126 (x < -87.3) flush to 0; inf, -inf and NaN as torch
    e = _ef_ex2_ftz(x * -1.4426950408889634)
    return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [1.0 + e],
                                     dtype=tl.float32, is_pure=True, pack=1)
''',
    "_ef_log_sigmoid": '''
@triton.jit
def _ef_log_sigmoid(x):
    # min(x, 0) - log1p(exp(-|x|)); log1p by its series below 1/16 (relative error < 1e-8),
    # where log(1 + e) would lose e's low bits
    e = tl.exp(-tl.abs(x))
    p = _ef_log1p_series(e)
    l1p = tl.where(e < 0.0625, p, tl.log(1.0 + e))
    return tl.where(x < 0.0, x, 0.0) - l1p
''',
    "_ef_log_sigmoid_cuda": '''
@triton.jit
def _ef_log_sigmoid_cuda(x):
    # as _ef_log_sigmoid with MUFU.EX2/MUFU.LG2 (1 + e is in [1, 2]: no subnormal handling)
    e = _ef_ex2_ftz(tl.abs(x) * -1.4426950408889634)
    l2 = tl.inline_asm_elementwise("lg2.approx.ftz.f32 $0, $1;", "=r,r", [1.0 + e],
                                   dtype=tl.float32, is_pure=True, pack=1)
    p = _ef_log1p_series(e)
    l1p = tl.where(e < 0.0625, p, l2 * 0.6931471805599453)
    return tl.where(x < 0.0, x, 0.0) - l1p
''',
    "_ef_tanh": '''
@triton.jit
def _ef_tanh(x):
    # exp-based, overflow-free: sign(x) * (1 - e) / (1 + e) with e = exp(-2|x|); below
    # |x| = 0.125, where 1 - e would lose x's low bits (tanh(1e-20) is 1e-20, not 0), the
    # series x (1 - x^2/3 + 2x^4/15 - 17x^6/315) (relative error < 4e-9), a product by x
    # that keeps -0.0 and denormals as torch does
    # (in float64 up to x^15: relative error < 3e-18)
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    x2 = x * x
    if x.dtype == tl.float64:
        s = x * (1.0 + x2 * (-0.3333333333333333 + x2 * (0.13333333333333333 + x2 * (
            -0.05396825396825397 + x2 * (0.021869488536155203 + x2 * (-0.008863235529902197 + x2 * (
                0.003592128036572481 + x2 * -0.0014558343870513183)))))))
    else:
        s = x * (1.0 + x2 * (-0.3333333333333333 + x2 * (0.13333333333333333 + x2 * -0.05396825396825397)))
    return tl.where(tl.abs(x) < 0.125, s, tl.where(x < 0.0, t * -1.0, t))
''',
    "_ef_tanh_cuda": '''
@triton.jit
def _ef_tanh_cuda(x):
    return tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [x],
                                     dtype=tl.float32, is_pure=True, pack=1)
''',
    "_ef_log_cuda": '''
@triton.jit
def _ef_log_cuda(x):
    # the hardware's log2 (MUFU.LG2: absolute error ~2^-22) times ln 2; near 1, where that
    # absolute error would be a large relative one, the series of log(1 + t) up to t^6
    # (relative error < 1e-8 for |t| < 1/16, t = x - 1 exact there). 0, < 0, inf and NaN
    # give -inf, NaN, inf and NaN as torch.log does. ~10 instructions instead of ~30.
    l2 = tl.inline_asm_elementwise("lg2.approx.f32 $0, $1;", "=r,r", [x],
                                   dtype=tl.float32, is_pure=True, pack=1)
    t = x - 1.0
    p = _ef_log1p_series(t)
    return tl.where(tl.abs(t) < 0.0625, p, l2 * 0.6931471805599453)
''',
    "_ef_sin_cuda": '''
@triton.jit
def _ef_sin_cuda(x):
    # CUDA's sinf (libdevice: full range reduction). Triton links libdevice with subnormals
    # flushed: below 2^-126, where sin(x) is x in fp32, x itself as torch gives
    return tl.where(tl.abs(x) < 1.1754943508222875e-38, x, tl.extra.cuda.libdevice.sin(x))
''',
    "_ef_tan_cuda": '''
@triton.jit
def _ef_tan_cuda(x):
    # CUDA's tanf; below 2^-126 x itself (as _ef_sin_cuda)
    return tl.where(tl.abs(x) < 1.1754943508222875e-38, x, tl.extra.cuda.libdevice.tan(x))
''',
    "_ef_erf_cuda": '''
@triton.jit
def _ef_erf_cuda(x):
    # CUDA's erff; below 2^-126, where libdevice flushes x, erf(x) = 2 x / sqrt(pi) (an
    # IEEE product: a subnormal result as torch gives)
    return tl.where(tl.abs(x) < 1.1754943508222875e-38, x * 1.1283791670955126,
                    tl.math.erf(x))
''',
    "_ef_gelu": '''
@triton.jit
def _ef_gelu(x):
    return 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
''',
    "_ef_gelu_tanh": '''
@triton.jit
def _ef_gelu_tanh(x):
    inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    return 0.5 * x * (1.0 + _ef_tanh(inner))
''',
    "_ef_gelu_tanh_cuda": '''
@triton.jit
def _ef_gelu_tanh_cuda(x):
    # sqrt(2/pi) * (x + 0.044715 x^3) as x * (c0 + c1 x^2), and 0.5 x (1 + t) as h + h t:
    # 5 instructions and MUFU.TANH instead of 8
    inner = x * (0.7978845608028654 + 0.035677408136300125 * (x * x))
    h = 0.5 * x
    return h + h * _ef_tanh_cuda(inner)
''',
    "_ef_softplus": '''
@triton.jit
def _ef_softplus(x):
    # torch: log1p(exp(x)), and x itself above the threshold 20; log1p by its series where
    # exp(x) < 1/16, where log(1 + e) would lose e (softplus(-20) is 2e-9, not 0). A select,
    # not tl.minimum(x, 20.0), which on a GPU turns NaN into 20
    e = tl.exp(tl.where(x > 20.0, 20.0, x))
    l1p = tl.where(e < 0.0625, _ef_log1p_series(tl.where(e < 0.0625, e, 0.0)), tl.log(1.0 + e))
    return tl.where(x > 20.0, x, l1p)
''',
    "_ef_softplus_beta": '''
@triton.jit
def _ef_softplus_beta(x, beta, threshold):
    # torch's softplus(x, beta, threshold): x where beta * x > threshold, else
    # log1p(exp(beta * x)) / beta, in that order of operations (torch's CPU and CUDA
    # kernels); log1p as _ef_softplus's. exp's argument is 0 where the result is x, so
    # that no inf is formed there (exp(beta * x) itself overflows above 88.7, as torch's)
    bx = x * beta
    e = tl.exp(tl.where(bx > threshold, 0.0, bx))
    l1p = tl.where(e < 0.0625, _ef_log1p_series(tl.where(e < 0.0625, e, 0.0)), tl.log(1.0 + e))
    return tl.where(bx > threshold, x, l1p / beta)
''',
    "_ef_maximum": '''
@triton.jit
def _ef_maximum(a, b):
    # NaN-propagating like torch.maximum. Two selects, not one of (a != a) | (a > b): the
    # interpreter cannot or a scalar's mask with a block's (maximum(alpha, accum))
    return tl.where(a != a, a, tl.where(a > b, a, b))
''',
    "_ef_minimum": '''
@triton.jit
def _ef_minimum(a, b):
    return tl.where(a != a, a, tl.where(a < b, a, b))
''',
    "_ef_maximum_nan": '''
@triton.jit
def _ef_maximum_nan(a, b):
    # torch.maximum's NaN rule (NaN wins) in one instruction on a GPU (max.NaN.f32,
    # sm_80+); under the interpreter the where-based helper stays
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)
''',
    "_ef_minimum_nan": '''
@triton.jit
def _ef_minimum_nan(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)
''',
    "_ef_fold": _fold(32, """
    # ws (int32) holds float32 bits: ws = max(ws, x) (MAX) or min(ws, x) by integer
    # atomics, exact and in any order the same result: bit patterns with the sign clear
    # order as int32, those with it set in reverse as uint32. NaN wins, as in torch.amax:
    # spelled 0x7FFFFFFF for max (above +inf as int32), 0xFFFFFFFF for min (below every
    # float as int32, above -inf as uint32)"""),
    "_ef_fold64": _fold(64, """
    # _ef_fold of float64 values: ws (int64) holds their bits, ordered the same way (sign
    # clear: as int64; set: in reverse, as uint64); NaN is 0x7FFF...F for max, -1 for min"""),
    "_ef_add": '''
@triton.jit
def _ef_add(a, b):
    return a + b
''',
    "_ef_lse_part": '''
@triton.jit
def _ef_lse_part(x, AXIS: tl.constexpr):
    # (running max, sum of exp(x - max)) along AXIS; an all -inf line gives (-inf, 0); a
    # line with +inf (-inf, +inf) is shifted by 0 instead (inf - inf would be NaN): its sum
    # is +inf, so is its logsumexp
    m = tl.reduce(x, AXIS, _ef_maximum)
    safe = tl.where(tl.abs(m) == float('inf'), 0.0, m)
    return m, tl.sum(tl.exp(x - tl.expand_dims(safe, AXIS)), axis=AXIS)
''',
    "_ef_lse_part_cuda": '''
@triton.jit
def _ef_lse_part_cuda(x, AXIS: tl.constexpr):
    # as _ef_lse_part, the max by max.NaN.f32 and exp(x - max) on MUFU.EX2 without
    # subnormal handling (terms <= 1)
    m = tl.reduce(x, AXIS, _ef_maximum_nan)
    safe = tl.where(tl.abs(m) == float('inf'), 0.0, m)
    d = (x - tl.expand_dims(safe, AXIS)) * 1.4426950408889634
    e = _ef_ex2_ftz(d)
    return m, tl.sum(e, axis=AXIS)
''',
    "_ef_lse_combine": '''
@triton.jit
def _ef_lse_combine(m1, s1, m2, s2):
    m = _ef_maximum(m1, m2)
    safe = tl.where(tl.abs(m) == float('inf'), 0.0, m)  # as _ef_lse_part
    return m, s1 * tl.exp(m1 - safe) + s2 * tl.exp(m2 - safe)
''',
    "_ef_lse_reduce": '''
@triton.jit
def _ef_lse_reduce(m, s):
    # combine a vector of (max, sum-exp) partials into one
    mm = tl.reduce(m, 0, _ef_maximum)
    safe = tl.where(tl.abs(mm) == float('inf'), 0.0, mm)  # as _ef_lse_part
    return mm, tl.sum(s * tl.exp(m - safe), axis=0)
''',
    "_ef_floor_cuda": '''
@triton.jit
def _ef_floor_cuda(x):
    # floor (cvt.rmi): Triton flushes a subnormal x to a zero of its sign first, so a
    # negative subnormal would give -0.0: -1.0 there, as torch gives
    f = tl.floor(x)
    return tl.where((x < 0.0) & (f == 0.0), -1.0, f)
''',
    "_ef_ceil_cuda": '''
@triton.jit
def _ef_ceil_cuda(x):
    # ceil (cvt.rpi): a positive subnormal x gives 1.0 (flushed, it would give +0.0)
    c = tl.ceil(x)
    return tl.where((x > 0.0) & (c == 0.0), 1.0, c)
''',
    "_ef_round": '''
@triton.jit
def _ef_round(x):
    # round half to even (torch.round), exact for every fp32 (x - floor(x) is exact; from
    # 2^23 on x is an integer); a zero keeps x's sign (round(-0.3) is -0.0); inf, NaN stay
    f = tl.floor(x)
    d = x - f
    odd = (f - 2.0 * tl.floor(f * 0.5)) == 1.0
    r = tl.where((d > 0.5) | ((d == 0.5) & odd), f + 1.0, f)
    return tl.where(r == 0.0, x * 0.0, r)
''',
    "_ef_round_sat": '''
@triton.jit
def _ef_round_sat(x, lo, hi):
    # round half to even, then saturate to [lo, hi] (exact for every finite fp32); NaN gives
    # 0 as CUTLASS's converters do, and zero is +0.0 (an integer has no signed zero)
    r = tl.minimum(tl.maximum(_ef_round(x), lo), hi)
    return tl.where((x != x) | (r == 0.0), 0.0, r)
''',
    "_ef_log1p": '''
@triton.jit
def _ef_log1p(x):
    # log(1 + x): its series where |x| < 1/16 (where 1 + x would lose x; a subnormal x gives
    # x), else log(1 + x); inf, -1 and below -1 give inf, -inf and NaN as torch.log1p does.
    # The series on 0 where it is not taken (it overflows for large |x|)
    small = tl.abs(x) < 0.0625
    return tl.where(small, _ef_log1p_series(tl.where(small, x, 0.0)), tl.log(1.0 + x))
''',
    "_ef_expm1": '''
@triton.jit
def _ef_expm1(x):
    # exp(x) - 1: its series up to x^7 where |x| < 1/16 (relative error < 1e-13; exp(x) - 1
    # would lose x there), else exp(x) - 1; -inf gives -1, inf inf, NaN NaN. In float64 up
    # to x^10 (relative error < 5e-18)
    if x.dtype == tl.float64:
        s = x * (1.0 + x * (0.5 + x * (0.16666666666666666 + x * (0.041666666666666664 + x * (
            0.008333333333333333 + x * (0.001388888888888889 + x * (0.0001984126984126984 + x * (
                2.48015873015873e-05 + x * (2.7557319223985893e-06 + x * 2.755731922398589e-07)))))))))
    else:
        s = x * (1.0 + x * (0.5 + x * (0.16666666666666666 + x * (0.041666666666666664 + x * (
            0.008333333333333333 + x * (0.001388888888888889 + x * 0.0001984126984126984))))))
    return tl.where(tl.abs(x) < 0.0625, s, tl.exp(x) - 1.0)
''',
    "_ef_sat": '''
@triton.jit
def _ef_sat(x, hi):
    # clamp to [-hi, hi], +-inf included; NaN kept (it compares false)
    return tl.where(x > hi, hi, tl.where(x < -hi, -hi, x))
''',
    "_ef_round_bf16": '''
@triton.jit
def _ef_round_bf16(x):
    # x rounded to bfloat16 (nearest even; overflow gives inf) in integer arithmetic, as fp32:
    # the CPU interpreter's own bf16 conversion is unreliable
    b = x.to(tl.uint32, bitcast=True)
    r = ((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
    return tl.where(x != x, x, r)
''',
    "_ef_round_fp8": '''
@triton.jit
def _ef_round_fp8(x, MBITS: tl.constexpr, EMIN: tl.constexpr, FMAX: tl.constexpr):
    # x rounded to an fp8 format with MBITS mantissa bits and smallest normal exponent EMIN,
    # saturating to FMAX (inf included, NaN kept), in fp32 arithmetic (Triton's own fp8
    # conversion is wrong under the interpreter, and miscompiled beside tl.dot on a GPU).
    # Scale |x| by the exact power of two that puts its last kept bit at 1.0 (subnormals:
    # at 2^(EMIN - MBITS)), round to an integer, scale back.
    a = tl.minimum(tl.abs(x), FMAX)
    e = tl.maximum(((a.to(tl.int32, bitcast=True) >> 23) & 255) - 127, EMIN)
    up = ((127 + MBITS - e) << 23).to(tl.float32, bitcast=True)
    down = ((127 - MBITS + e) << 23).to(tl.float32, bitcast=True)
    q = ((a * up + 8388608.0) - 8388608.0) * down  # to nearest even: exact below 2^23
    sign = x.to(tl.uint32, bitcast=True) & 0x80000000
    r = (q.to(tl.uint32, bitcast=True) | sign).to(tl.float32, bitcast=True)
    return tl.where(x != x, x, r)
''',
    "_ef_powi": '''
@triton.jit
def _ef_powi(x, N: tl.constexpr):
    # x ** N for an integer N >= 1: N - 1 products, left to right
    r = x
    for _ in tl.static_range(N - 1):
        r = r * x
    return r
''',
    "_ef_powf": '''
@triton.jit
def _ef_powf(x, c, ODD: tl.constexpr, INTEGER: tl.constexpr, INF: tl.constexpr):
    # x ** c for a constant c other than the small integers, as C's pow (torch.pow): |x| ** c
    # as exp(c log|x|) (log 0 = -inf and log inf = inf give 0 and inf as pow does); for
    # x < 0 (-0.0 included: its sign bit) negated where c is an odd integer (ODD), NaN where
    # c is no integer (INTEGER; +-inf and every float from 2^24 on are even integers) unless
    # x is -inf; for c = +-inf (INF) 1 where |x| is 1 (c log|x| is inf * 0 there)
    r = tl.exp(c * tl.log(tl.abs(x)))
    if ODD:
        if x.dtype == tl.float64:
            r = tl.where(x.to(tl.int64, bitcast=True) < 0, r * -1.0, r)
        else:
            r = tl.where(x.to(tl.uint32, bitcast=True) >= 0x80000000, r * -1.0, r)
    if not INTEGER:
        r = tl.where((x < 0.0) & (x != float('-inf')), float('nan'), r)
    if INF:
        r = tl.where(tl.abs(x) == 1.0, 1.0, r)
    return r
''',
}

_CALL = re.compile(r"\b(_ef_[a-z0-9_]+)\b")  # calls, and combine functions passed by name


def helpers_for(code: str) -> str:
    """The helper definitions that ``code`` calls, dependencies first."""
    needed: list[str] = []

    def visit(name: str) -> None:
        if name in needed:
            return
        body = HELPERS[name]
        for dep in _CALL.findall(body):
            if dep != name:
                visit(dep)
        needed.append(name)

    for name in _CALL.findall(code):
        if name in HELPERS:
            visit(name)
    return "".join(HELPERS[n] for n in needed)
