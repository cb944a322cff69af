"""Comparing kernel outputs with the reference evaluator, with tolerances per dtype.

Layer: runtime.host (read by ``Kernel.verify`` and background tuning). Two checks per
output: the relative error of the whole tensor (||out - ref|| / ||ref||), and an
elementwise bound |out - ref| <= atol + rtol * |ref| with atol scaled by the tensor's RMS,
so that a single wrong or unwritten element fails. NaN must sit exactly where the
reference has NaN (outputs are poisoned with NaN first, so an unwritten element shows as a
mismatch).

Tolerances (``TOLERANCES``): the output dtype's rounding dominates. fp32 outputs of
fp32 math differ from torch only by summation order: 1e-5 relative. fp16 rounds at
2^-11 (4.9e-4 relative, half an ulp); bf16 at 2^-8 (3.9e-3). The elementwise ``rtol`` is
about four half-ulps of the output dtype; the norm bound is tighter, since rounding
errors average out. TF32 inputs (10-bit mantissa) are allowed 5e-3. fp8: see
``FP8_TOLERANCES`` (outputs) and ``FP8_INPUT_TOLERANCE`` (inputs, by accumulation mode).

Those bounds are relative to each output's own scale. An output far smaller than the
accumulator it came from (``min(abs(accum))`` per column: the values nearest zero) carries
the accumulator's summation-order noise at the accumulator's scale, which they miss: every
family failed such an output while matching a float64 reference to 1.5e-6 (benchmarks/HISTORY.md,
twenty-first session). ``accumulation_slack`` measures how far each output moves when the
accumulator moves by that noise, and ``compare`` allows that much more.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..optable import round_to

# dtype -> (relative norm tolerance, elementwise rtol)
TOLERANCES = {
    torch.float64: (1e-10, 1e-8),  # fp64 math (fp64 inputs): ulps of 2^-53, many ops deep
    torch.float32: (1e-4, 1e-3),
    torch.float16: (2e-3, 4e-3),
    torch.bfloat16: (1.2e-2, 3.2e-2),
}
TF32_TOLERANCE = (5e-3, 2e-2)
# fp8 outputs: e4m3 rounds at 2^-4 relative (half an ulp), e5m2 at 2^-3; a value near a
# rounding boundary may land one ulp away (2^-3 / 2^-2 relative), hence rtol = two ulps.
# The absolute slack is not rtol * RMS (a quarter of the RMS would hide wrong elements)
# but 1% of the RMS plus the smallest subnormal. The kernel saturates to the largest
# finite value (satfinite), so the reference does too.
FP8_TOLERANCES = {torch.float8_e4m3fn: (7e-2, 0.25), torch.float8_e5m2: (0.14, 0.5)}
FP8_ATOL_RMS = 1e-2
TOLERANCES.update(FP8_TOLERANCES)
# fp8 inputs with wider outputs: Hopper's fp8 tensor cores add the products of each k-step
# with fewer than fp32's bits (H100, relative norm error 1.3e-4 with promotion to fp32
# every k-step, at any K). With fast accumulation (``fp8_fast_accum``, the default) that
# precision holds over the whole of K and the error grows about as sqrt(K): 2.1e-4 /
# 5.4e-4 / 1.3e-3 / 3.1e-3 at K = 256 / 1024 / 4096 / 16384, the largest element's error
# 3.6e-3 / 8.9e-3 / 2.4e-2 / 4.6e-2 of the accumulator's RMS (benchmarks/HISTORY.md, nineteenth
# session, fp8_accum_probe.py, since removed). So both bounds grow by sqrt(K / FP8_FAST_K0)
# past FP8_FAST_K0, keeping 3.5-10x over those errors (epilogues that cancel most of
# the accumulator, e.g. min(accum + c), amplify them relative to their outputs).
FP8_INPUT_TOLERANCE = (2e-3, 2e-2)
FP8_FAST_K0 = 256
# summation-order noise of an fp32 accumulator over K products, per element, in units of
# the accumulator's RMS and sqrt(K): one fp32 ulp (2^-23). Measured on an H100: bf16 inputs,
# K = 1000, |accum| RMS 1: the kernels' accumulators within 1.6e-6 of float64 (this gives
# 3.8e-6), cuBLAS's fp32 product within 6e-7
ACC_NOISE = 2.0 ** -23
F64_ACC_NOISE = 2.0 ** -52  # the same for a float64 accumulator (fp64 inputs): one ulp
SLACK_FACTOR = 2.0  # the slack allowed, in units of the outputs' measured movement
# fp16 accumulation (``accumulator_type=torch.float16``): the reference's accumulator is
# the exact product rounded once to fp16 (``reference.accumulator``); the kernel rounds
# its partial sums to fp16 on the way (unit roundoff u = 2^-11), at worst after every
# product. Rounding to nearest errs by at most half an ulp, uniformly: a standard
# deviation of at most 2^-10 / sqrt(12) = 0.58 u of the partial sum s_j, so the K
# roundings add up to 0.58 u sqrt(sum_j s_j^2). For zero-mean products s_j grows as
# sqrt(j), sum_j s_j^2 = K^2 sigma^2 / 2 with the accumulator's RMS sigma sqrt(K):
# 0.41 u sqrt(K) of the RMS; for products of one sign s_j grows as j: 0.33 u sqrt(K) of
# the element. So the slack moves each element by u sqrt(K) times the larger of the RMS
# and the element (``accumulation_slack``'s ``own_scale``), and allows SLACK_FACTOR times
# that: about 5 standard deviations of the worst case, one rounding per product (a
# kernel that rounds once per k-step or MMA errs less), plus the one-ulp difference of
# rounding the exact sum once. The error grows as sqrt(K), not as the worst-case bound
# K u (which no rounding of random data reaches): at K = 300 a standard deviation of at
# most 3.5e-3 of the RMS and a slack of 1.7e-2 of it, at K = 4096 1.3e-2 and 6.2e-2,
# far past an fp32 output's own 1e-3: the slack, not the dtype's bound, carries it.
FP16_ACC_NOISE = 2.0 ** -11


@dataclass
class OutputCheck:
    name: str
    ok: bool
    rel_error: float
    max_abs_error: float
    bad_elements: int
    unwritten: int
    tolerance: float

    def line(self) -> str:
        mark = "ok  " if self.ok else "FAIL"
        extra = f", {self.unwritten} unwritten" if self.unwritten else ""
        return (f"{mark} {self.name}: rel error {self.rel_error:.2e} (tol {self.tolerance:.1e}), "
                f"max abs {self.max_abs_error:.2e}, {self.bad_elements} elements out of bounds{extra}")


@dataclass
class VerifyResult:
    kernel: str
    checks: list[OutputCheck] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    @property
    def max_error(self) -> dict[str, float]:
        return {c.name: c.rel_error for c in self.checks}

    def report(self) -> str:
        head = f"verify {self.kernel}: {'PASSED' if self else 'FAILED'}"
        return "\n".join([head] + ["  " + c.line() for c in self.checks])


def _compare_int(name: str, out: torch.Tensor, ref: torch.Tensor, dtype) -> OutputCheck:
    """Integer outputs: the reference (float64) rounded as the kernel rounds; one unit of
    difference is allowed where the kernel's fp32 value sits on the other side of a .5."""
    want = round_to(ref.detach().to(torch.float64), dtype).to(torch.int64).reshape(-1).cpu()
    got = out.detach().to(torch.int64).reshape(-1).cpu()
    diff = (got - want).abs()
    bad = int((diff > 1).sum())
    max_abs = float(diff.max()) if diff.numel() else 0.0
    norm = float(want.double().norm())
    rel = float(diff.double().norm()) / norm if norm else float(diff.double().norm())
    return OutputCheck(name, bad == 0, rel, max_abs, bad, 0, 1.0)


def accumulation_slack(evaluate, accum: torch.Tensor, ref: dict[str, torch.Tensor], K: int,
                       names, noise: float = ACC_NOISE, own_scale: bool = False
                       ) -> dict[str, torch.Tensor]:
    """For each output in ``names``: how far it moves, element by element, when every
    accumulator element moves by ``noise * sqrt(K)`` of the accumulator's RMS with a
    random sign (``evaluate(accum)`` gives the reference outputs for an accumulator): the
    part of a kernel's difference from the reference that summation order alone explains.
    ``own_scale``: of the larger of the RMS and the element itself (fp16 accumulation,
    ``FP16_ACC_NOISE``: the rounding errors scale with the partial sums)."""
    acc = accum if accum.dtype == torch.float64 else accum.to(torch.float32)
    rms = float(acc.double().pow(2).mean().sqrt()) if acc.numel() else 0.0
    delta = noise * K ** 0.5 * rms
    if not (delta > 0 and math.isfinite(delta)):
        return {}
    g = torch.Generator(device="cpu").manual_seed(0)
    signs = torch.randint(0, 2, acc.shape, generator=g).to(acc.device, acc.dtype) * 2 - 1
    if own_scale:
        delta = noise * K ** 0.5 * torch.maximum(acc.abs(), torch.full_like(acc, rms))
    moved = evaluate(acc + delta * signs)
    out = {}
    for name in names:
        a, b = ref[name].detach().to(torch.float64), moved[name].detach().to(torch.float64)
        shift = (b - a).abs()
        out[name] = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
    return out


def tolerance_for(dtype: torch.dtype, tf32: bool = False) -> tuple[float, float]:
    base = TOLERANCES.get(dtype, TOLERANCES[torch.float32])
    if tf32:
        return max(base[0], TF32_TOLERANCE[0]), max(base[1], TF32_TOLERANCE[1])
    return base


def compare(name: str, out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype,
            tf32: bool = False, input_dtype: torch.dtype | None = None,
            fp8_fast_k: int = 0, slack: torch.Tensor | None = None) -> OutputCheck:
    """Check ``out`` against ``ref`` (both shaped like the output buffer). ``fp8_fast_k``:
    K of fp8 inputs accumulated fast over all of K (0: promoted, or not fp8). ``slack``
    (shaped like ``ref``): how far each element moves with the accumulator's summation
    noise (``accumulation_slack``); ``SLACK_FACTOR`` times it is allowed on top of the
    dtype's bounds, elementwise and in the norm."""
    if not dtype.is_floating_point:
        return _compare_int(name, out, ref, dtype)
    tol_norm, rtol = tolerance_for(dtype, tf32)
    if dtype == torch.float64 and input_dtype != torch.float64:
        tol_norm, rtol = TOLERANCES[torch.float32]  # computed in fp32, stored in fp64
    if input_dtype is not None and input_dtype != torch.float32 and dtype == torch.float32:
        # fp16/bf16 inputs, fp32 output: only accumulation order differs from the reference
        tol_norm, rtol = max(tol_norm, 1e-4), max(rtol, 1e-3)
    if input_dtype in FP8_TOLERANCES:
        grow = max(1.0, fp8_fast_k / FP8_FAST_K0) ** 0.5
        tol_norm = max(tol_norm, FP8_INPUT_TOLERANCE[0] * grow)
        rtol = max(rtol, FP8_INPUT_TOLERANCE[1] * grow)
    o = out.detach().to(torch.float64).reshape(-1).cpu()
    r = ref.detach().to(torch.float64).reshape(-1).cpu()
    if dtype in FP8_TOLERANCES:  # saturating stores: NaN stays NaN, +-inf become +-max
        fmax = torch.finfo(dtype).max
        r = torch.where(torch.isnan(r), r, r.clamp(-fmax, fmax))
    else:  # a finite reference past the dtype's range is stored as its infinity, as torch's
        # own conversion gives (-7e4 in fp16): the kernel's infinity is right there (and a
        # finite value within the tolerance too: just past the edge, noise may keep it)
        rounded = r.to(dtype).to(torch.float64)
        r = torch.where(torch.isfinite(r) & torch.isinf(rounded) & (o == rounded), o, r)
    extra = (torch.zeros_like(r) if slack is None
             else SLACK_FACTOR * slack.detach().to(torch.float64).reshape(-1).cpu())
    o_nan, r_nan = torch.isnan(o), torch.isnan(r)
    unwritten = int((o_nan & ~r_nan).sum())
    nan_mismatch = int((o_nan != r_nan).sum())
    both = ~(o_nan | r_nan)
    o_f, r_f = o[both], r[both]
    inf_mismatch = int(((torch.isinf(o_f) | torch.isinf(r_f)) & (o_f != r_f)).sum())
    finite = torch.isfinite(o_f) & torch.isfinite(r_f)
    o_f, r_f = o_f[finite], r_f[finite]
    extra = extra[both][finite]
    diff = (o_f - r_f).abs()
    ref_norm = float(r_f.norm()) if r_f.numel() else 0.0
    rel = float(diff.norm()) / ref_norm if ref_norm > 0 else float(diff.norm())
    tol_norm += float(extra.norm()) / (ref_norm if ref_norm > 0 else 1.0)  # the slack's size
    rms = ref_norm / max(r_f.numel(), 1) ** 0.5
    atol = rtol * max(rms, 1e-30)
    if dtype in FP8_TOLERANCES:
        info = torch.finfo(dtype)  # smallest subnormal: smallest normal * eps
        atol = FP8_ATOL_RMS * rms + info.smallest_normal * info.eps
    bad = int((diff > atol + rtol * r_f.abs() + extra).sum()) + nan_mismatch + inf_mismatch
    max_abs = float(diff.max()) if diff.numel() else 0.0
    ok = bad == 0 and rel <= tol_norm
    return OutputCheck(name, ok, rel, max_abs, bad, unwritten, tol_norm)
