"""Random epilogues (``epilogue_fuzz.cases``) through the kernel families, against the reference.

A differential test: hypothesis draws an epilogue (ops of the op table, operands of every
kind, stored, unstored and reduced outputs), the problem size, the dtype and the data; each
family's kernel runs it on NaN-poisoned outputs and ``Kernel.verify`` compares every stored
output with the reference evaluator. A failure prints the epilogue's source, and
hypothesis shrinks it to a small one first.

CPU tier: the portable and hopper families under Triton's interpreter, fp16, fp32 and int8
inputs, small ragged sizes. GPU tier (``gpu`` marker): every family the GPU offers, bf16 and
fp16, sizes of several tiles with ragged edges (up to several tiles per persistent
program); on Hopper the gluon family's ping-pong, cooperative and two-warpgroup configs
each get their own examples; the hopper and portable families also with fp32 (IEEE, TF32),
fp8 (fast and promoted accumulation) and int8 inputs. Examples are drawn from a fixed seed
per test variant (the same ones every run, so CI is repeatable); each CPU test runs as
``[quick]`` (a few examples, the quick tier) and ``[full]`` (its whole count, marked slow:
``epilogue_fuzz.tiers``); ``EVTFUSE_FUZZ_EXAMPLES`` and
``EVTFUSE_FUZZ_SEED`` draw more or other ones; ``scripts/fuzz_hunt.py`` reports every
failure of many fresh cases instead of shrinking the first.
"""

from __future__ import annotations

import os
import zlib

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from epilogue_fuzz import (CPU_SHAPES, GPU_SHAPES, INPUTS, SPECIAL_FRACTIONS, cases, drawn,
                           k16, k_major, laid_out_for, pick, tiers, with_special_values)
from evtfuse import explain


def _drawn(default_examples: int, salt: str):
    """``epilogue_fuzz.drawn`` with a seed of its own per test variant (``salt``)."""
    return drawn(default_examples, zlib.crc32(salt.encode()))


def _verify(kernel, args, case) -> None:
    result = kernel.verify(args)
    assert result, f"{case.source}\noutputs {case.outputs} names {dict(case.names)}\n{result.report()}"


# ------------------------------------------------------------------ CPU tier

def _interpreted(examples: int, salt: str, feeding: bool = False) -> None:
    """``examples`` drawn epilogues (``feeding``: with a reduction feeding computation),
    each verified in the portable family and, where it takes the case, the hopper one."""
    @_drawn(examples, salt=salt)
    @given(case=cases(feeding=feeding), shape=st.sampled_from(CPU_SHAPES),
           dtype=st.sampled_from([torch.float16, torch.float32]),
           data_seed=st.integers(0, 2 ** 16))
    def run(case, shape, dtype, data_seed):
        args = case.arguments(*shape, dtype, seed=data_seed)
        portable = pick(args, "portable", "first")
        assert portable is not None, explain(args)  # the portable family takes every case
        _verify(portable, args, case)
        hopper = pick(args, "hopper", "first", cc=90)  # None: TMA rows it states are misaligned
        if hopper is not None:
            _verify(hopper, args, case)

    run()


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-interpreter tier")
@tiers(quick=4, full=40)
def test_random_epilogues_interpreted(examples):
    _interpreted(examples, "interpreted")


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-interpreter tier")
@tiers(quick=3, full=12)
def test_random_epilogues_with_reductions_feeding_computation_interpreted(examples):
    """A per-row reduction feeding computation drawn in (an RMS norm, a softmax, a shift by
    a max): one pass where a tile spans the row, else two, in both families."""
    _interpreted(examples, "interpreted-feeding", feeding=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-interpreter tier")
@tiers(quick=3, full=12)
def test_random_epilogues_interpreted_int8_inputs(examples):
    """int8 A and B accumulated in int32, float epilogues and outputs: the portable
    family with the case's layouts, the hopper family with K-contiguous ones."""
    @_drawn(examples, salt="interpreted-int8")
    @given(case=cases(), shape=st.sampled_from(CPU_SHAPES),
           dtype=st.sampled_from([torch.float16, torch.float32]),
           data_seed=st.integers(0, 2 ** 16))
    def run(case, shape, dtype, data_seed):
        shape = k16(shape)
        args = case.arguments(*shape, dtype, seed=data_seed, inputs=torch.int8)
        portable = pick(args, "portable", "first")
        assert portable is not None, explain(args)
        _verify(portable, args, case)
        hopper_case = k_major(case)
        args = hopper_case.arguments(*shape, dtype, seed=data_seed, inputs=torch.int8)
        hopper = pick(args, "hopper", "first", cc=90)
        if hopper is not None:
            _verify(hopper, args, hopper_case)

    run()


def _verify_special(kernel, args, case) -> None:
    """``Kernel.verify`` (NaN and inf exactly where the reference has them), then a second run
    on outputs filled with another value, which must give the same bits: an element left
    unwritten where the reference is NaN would pass the first check alone."""
    _verify(kernel, args, case)
    values = args.epilogue.values
    stored = [o.name for o in args.dag.outputs if values.get(o.name) is not None]
    first = {n: values[n].clone() for n in stored}
    for n in stored:
        values[n].fill_(-1234.5)
    kernel.run(args)
    for n in stored:
        torch.testing.assert_close(values[n], first[n], rtol=0, atol=0, equal_nan=True,
                                   msg=lambda m: f"{case.source}\n{n}: {m}")


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-interpreter tier")
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on inf - inf, 0 * inf, ...
@tiers(quick=2, full=16)
def test_random_epilogues_interpreted_special_values(examples):
    """Random epilogues on inputs holding special floats (``with_special_values``): +-0,
    +-inf, NaN, denormals, large finite values in the operands, and an inf or NaN row or
    column of the accumulator."""
    @_drawn(examples, salt="interpreted-special-values")
    @given(case=cases(), shape=st.sampled_from(CPU_SHAPES),
           dtype=st.sampled_from([torch.float16, torch.float32]),
           data_seed=st.integers(0, 2 ** 16), fraction=st.sampled_from(SPECIAL_FRACTIONS))
    def run(case, shape, dtype, data_seed, fraction):
        args = with_special_values(case.arguments(*shape, dtype, seed=data_seed), data_seed,
                                   fraction)
        portable = pick(args, "portable", "first")
        assert portable is not None, explain(args)
        _verify_special(portable, args, case)
        hopper = pick(args, "hopper", "first", cc=90)
        if hopper is not None:
            _verify_special(hopper, args, case)

    run()


# ------------------------------------------------------------------ CPU tier: sm_90 compiles

_OFFLINE_SCRIPT = """
import json, sys, torch
sys.path.insert(0, {tests!r})
from hypothesis import given, strategies as st
from epilogue_fuzz import cases, drawn
from evtfuse.backends.triton.families import SMEM_LIMIT
from evtfuse.runtime.offline import compile_for, offered
found = {{"checked": 0, "over": []}}

@drawn(10, base_seed=11)  # reads EVTFUSE_FUZZ_EXAMPLES and _SEED itself
@given(case=cases(), bf16=st.booleans())
def run(case, bf16):
    args = case.arguments(2048, 2048, 256, torch.bfloat16 if bf16 else torch.float16)
    seen = set()
    for fam, cfg in offered(args):  # the first config of each structure
        kind = (fam.name, cfg.cooperative, cfg.num_warps, cfg.flatten)
        if kind not in seen:
            seen.add(kind)
            got = compile_for(fam, cfg, args).shared_bytes
            found["checked"] += 1
            if got > SMEM_LIMIT:
                found["over"].append([case.source, str(case.outputs), fam.name, cfg.name, got])

run()
print("RESULT" + json.dumps(found))
"""


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tier (the GPU tier launches them)")
def test_random_epilogues_kernels_fit_shared_memory_when_compiled():
    """What an sm_90 GPU would be offered for random epilogues (``runtime.offline.offered``:
    every family's refusals and orders), compiled without a GPU: the first config of each
    structure (family, cooperative or not, warps, flattened loop or not) within the
    232,448 bytes of shared memory. The families plan their stages and epilogue pieces
    from estimates; four configs past the limit, which failed only at launch, were found
    by the GPU fuzz tests before this check existed."""
    from offline_run import run_offline

    got = run_offline(_OFFLINE_SCRIPT.format(tests=os.path.dirname(__file__)), timeout=1200)
    assert got["checked"] >= 10, got
    assert not got["over"], got["over"]


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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kind", GPU_KINDS, ids=[f"{f}-{w}" for f, w in GPU_KINDS])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_random_epilogues_gpu_special_values(kind, dtype):
    """As ``test_random_epilogues_gpu`` on inputs holding special floats
    (``with_special_values``)."""
    family, which = kind
    if family == "gluon" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the gluon family runs on Hopper (sm_90)")

    @_drawn(6, salt=f"special-{family}-{which}-{dtype}")
    @given(case=cases(), shape=st.sampled_from(GPU_SHAPES), data_seed=st.integers(0, 2 ** 16),
           fraction=st.sampled_from(SPECIAL_FRACTIONS))
    def run(case, shape, data_seed, fraction):
        args = with_special_values(case.arguments(*shape, dtype, device="cuda", seed=data_seed),
                                   data_seed, fraction)
        kernel = pick(args, family, which)
        assume(kernel is not None)  # a stated refusal (explain) is not a failure
        _verify_special(kernel, args, case)

    run()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("family", ["hopper", "portable"])
@pytest.mark.parametrize("inputs", list(INPUTS))
def test_random_epilogues_gpu_other_inputs(family, inputs):
    """fp32 (IEEE and TF32), fp8 (fast and promoted accumulation) and int8 A and B with
    operands and outputs of bf16, fp16 or fp32; 8-bit inputs K-contiguous (the tensor
    cores' layout for them)."""
    in_dtype, options = INPUTS[inputs]
    if in_dtype is None:
        pytest.skip("torch without fp8")
    if in_dtype.itemsize == 1 and in_dtype != torch.int8 \
            and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 inputs need compute capability 8.9+")

    @_drawn(6, salt=f"{family}-{inputs}")
    @given(case=cases(), shape=st.sampled_from(GPU_SHAPES),
           dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]),
           data_seed=st.integers(0, 2 ** 16))
    def run(case, shape, dtype, data_seed):
        case, shape = laid_out_for(in_dtype, case, shape)
        args = case.arguments(*shape, dtype, device="cuda", seed=data_seed, inputs=in_dtype,
                              **options)
        kernel = pick(args, family, "first")
        assume(kernel is not None)  # a stated refusal (explain) is not a failure
        _verify(kernel, args, case)

    run()
