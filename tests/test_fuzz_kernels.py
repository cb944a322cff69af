"""Random epilogues (``epilogue_fuzz.cases``) through the kernel families, against the reference.

A differential test: hypothesis draws an epilogue (ops of the op table, operands of every
kind, stored, unstored and reduced outputs), the problem size, the dtype and the data; each
family's kernel runs it on NaN-poisoned outputs and ``Kernel.verify`` compares every stored
output with the reference evaluator. A failure prints the epilogue's source, and
hypothesis shrinks it to a small one first.

CPU tier: the portable and hopper families under Triton's interpreter, fp16 and fp32, small
ragged sizes. GPU tier (``gpu`` marker): every family the GPU offers, bf16 and fp16, sizes
of several tiles with ragged edges; on Hopper the gluon family's ping-pong, cooperative and
two-warpgroup configs each get their own examples. Examples are drawn from a fixed seed per test
variant (the same ones every run, so CI is repeatable); ``EVTFUSE_FUZZ_EXAMPLES`` and
``EVTFUSE_FUZZ_SEED`` draw more or other ones; ``scripts/fuzz_hunt.py`` reports every
failure of many fresh cases instead of shrinking the first.
"""

from __future__ import annotations

import os
import zlib

import pytest
import torch
from hypothesis import HealthCheck, assume, given, seed, settings
from hypothesis import strategies as st

from epilogue_fuzz import CPU_SHAPES, GPU_SHAPES, cases, pick
from evtfuse import explain

EXAMPLES = int(os.environ.get("EVTFUSE_FUZZ_EXAMPLES", "0"))
SEED = int(os.environ.get("EVTFUSE_FUZZ_SEED", "0"))


def _drawn(default_examples: int, salt: str):
    """hypothesis settings for these tests: a fixed seed per test variant (``salt``; so CI
    runs the same examples every time, and each variant its own), shifted by
    ``EVTFUSE_FUZZ_SEED``; no example database."""
    conf = settings(max_examples=EXAMPLES or default_examples, deadline=None, database=None,
                    print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])
    return lambda fn: seed(SEED + zlib.crc32(salt.encode()))(conf(fn))


def _verify(kernel, args, case) -> None:
    result = kernel.verify(args)
    assert result, f"{case.source}\noutputs {case.outputs}\n{result.report()}"


# ------------------------------------------------------------------ CPU tier

@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-interpreter tier")
@_drawn(40, salt="interpreted")
@given(case=cases(), shape=st.sampled_from(CPU_SHAPES),
       dtype=st.sampled_from([torch.float16, torch.float32]), data_seed=st.integers(0, 2 ** 16))
def test_random_epilogues_interpreted(case, shape, dtype, data_seed):
    args = case.arguments(*shape, dtype, seed=data_seed)
    portable = pick(args, "portable", "first")
    assert portable is not None, explain(args)  # the portable family takes every case
    _verify(portable, args, case)
    hopper = pick(args, "hopper", "first", cc=90)  # None: TMA rows it states are misaligned
    if hopper is not None:
        _verify(hopper, args, case)


# ------------------------------------------------------------------ GPU tier

GPU_KINDS = [("gluon", "first"), ("gluon", "coop"), ("gluon", "wide"), ("hopper", "first"),
             ("portable", "first")]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kind", GPU_KINDS, ids=[f"{f}-{w}" for f, w in GPU_KINDS])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_random_epilogues_gpu(kind, dtype):
    family, which = kind
    if family == "gluon" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the gluon family runs on Hopper (sm_90)")

    @_drawn(8, salt=f"{family}-{which}-{dtype}")
    @given(case=cases(), shape=st.sampled_from(GPU_SHAPES), data_seed=st.integers(0, 2 ** 16))
    def run(case, shape, data_seed):
        args = case.arguments(*shape, dtype, device="cuda", seed=data_seed)
        kernel = pick(args, family, which)
        assume(kernel is not None)  # a stated refusal (explain) is not a failure
        _verify(kernel, args, case)

    run()
