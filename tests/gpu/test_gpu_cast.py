"""GPU tier: ``cast(x, dtype)`` to every target with both families, bf16 inputs.

On a GPU fp16 and bf16 use Triton's native conversions (``.to(tl.bfloat16)``), fp8 the
exact emulation ``_ef_round_fp8`` (Triton 3.6 miscompiles the native round trip next to
``tl.dot``); the reference is ``optable.round_to``. The inputs are small multiples of powers of two, so the
accumulator is exact in any summation order and every cast must match bit for bit; the
operand C is random normals (never zeros) with NaN, +-inf, -0.0 and exact ties of the
targets planted in it. Outputs are NaN-poisoned before each run (``Kernel.verify``).
"""

from __future__ import annotations

import math

import pytest
import torch

import evtfuse
from evtfuse import EpilogueArguments, GemmArguments, get_kernels
from evtfuse.optable import CAST_TARGETS
from evtfuse.reference import evaluate

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DEV = "cuda"
# C * 0.5 reaches each target's saturation or overflow; the specials land on ties
SCALE = {"fp32": 1.0, "fp16": 3e4, "bf16": 1.0, "fp8e4m3": 300.0, "fp8e5m2": 4e4,
         "int8": 100.0, "uint8": 150.0, "int32": 2e9}
SPECIAL = [math.nan, math.inf, -math.inf, -0.0, 5.0, 7.0, 34.0, 38.0, 2 * (1 + 2.0 ** -11),
           2 * (1 + 2.0 ** -8), 928.0, 122880.0, -929.0, 0.6]


def _exact_operands(M, N, K, gen):
    A = (torch.randint(-8, 8, (M, K), device=DEV, generator=gen) / 4).to(torch.bfloat16)
    B = (torch.randint(-8, 8, (K, N), device=DEV, generator=gen) / 8).to(torch.bfloat16)
    return A, B


def _same_bits(got: torch.Tensor, want: torch.Tensor) -> bool:
    got, want = got.float().cpu(), want.float().cpu()
    nan = torch.isnan(got)
    return bool(torch.equal(nan, torch.isnan(want)) and torch.equal(got[~nan], want[~nan])
                and torch.equal(torch.signbit(got[~nan]), torch.signbit(want[~nan])))


@pytest.mark.parametrize("family", ["hopper", "portable"])
@pytest.mark.parametrize("target", list(CAST_TARGETS))
@pytest.mark.parametrize("mnk", [(256, 384, 128), (1000, 776, 264)])
def test_cast_every_target(family, target, mnk):
    M, N, K = mnk
    gen = torch.Generator(device=DEV).manual_seed(list(CAST_TARGETS).index(target) * 10007 + M)
    A, B = _exact_operands(M, N, K, gen)
    C = torch.randn(M, N, device=DEV, generator=gen) * SCALE[target]
    C.view(-1)[: len(SPECIAL)] = torch.tensor(SPECIAL, device=DEV)
    src = (f'def epi(accum, C, s): E = cast(C * s, "{target}"); D = accum * 0.25 + E; '
           f'R = cast(accum * 0.375 + C, "{target}"); return D, E, R')
    D = torch.empty(M, N, device=DEV, dtype=torch.bfloat16)
    E, R = torch.empty(M, N, device=DEV), torch.empty(M, N, device=DEV)
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(src, C=C, s=0.5, D=D, E=E, R=R))
    ks = [k for k in get_kernels(args) if k.family.name == family]
    if not ks:
        pytest.fail(f"no {family} kernel for these arguments:\n{evtfuse.explain(args)}")
    for k in ks[:2]:
        result = k.verify(args)
        assert result, result.report()
        ref = evaluate(args)
        assert _same_bits(E, ref["E"]), f"{k.name}: E differs from the reference"
        assert _same_bits(R, ref["R"]), f"{k.name}: R differs from the reference"
