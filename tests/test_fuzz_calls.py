"""Sequences of ``evtfuse.gemm`` calls, fuzzed: its caches must never serve a stale plan.

``gemm`` keeps, per epilogue, the last call's objects (the same tensors again: launch at
once) and, per call structure, a launch plan (``run._call_key``: dtypes, shapes, strides,
alignment, which tensors share memory, which values are numbers). hypothesis draws one
epilogue (``epilogue_fuzz.cases``) and a sequence of calls that each change something
the caches key on, or nothing: new data, the very same objects, new scalar values (ints
too), another M, a transposed A of the same shape, fp16 instead of fp32, an output
allocated by ``gemm`` instead of given, the C operand given per row instead of full, an
unaligned view, ``tune="fast"`` (on a GPU the tuner times candidates on scratch
outputs, then the winner runs on the call's), D written in place over C, int8 A and B,
and on a GPU fp8 A and B with fast or promoted accumulation. Operands are copied before
each call, so the reference reads them as the kernel found them. Every call's outputs are
compared with the reference evaluator. Both tiers (on a GPU later calls go through the
direct launcher); ``EVTFUSE_FUZZ_EXAMPLES`` and ``EVTFUSE_FUZZ_SEED`` as in
``test_fuzz_kernels.py``.
"""

from __future__ import annotations


import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import evtfuse
from epilogue_fuzz import cases, drawn, laid_out_for, tiers
from evtfuse.reference import evaluate
from evtfuse.runtime.verify import compare

CHANGES = ("new_data", "same_objects", "scalars", "int_scalar", "other_m", "a_transposed",
           "fp16", "allocate_outputs", "c_per_row", "unaligned_c", "tuned", "d_in_place",
           "int8_inputs", "fp8_inputs", "fp8_promoted")
# A and B of another dtype, K-contiguous (the layout 8-bit tensor-core kernels take); fp8
# only on a GPU (the interpreter refuses it: those steps draw new data instead)
EIGHT_BIT = {"int8_inputs": torch.int8, "fp8_inputs": torch.float8_e4m3fn,
             "fp8_promoted": torch.float8_e4m3fn}


def _call(case, M, N, K, dtype, change, state, seed_, device):
    """The keyword arguments of one call after ``change``; ``state`` carries the last
    call's objects (for "same_objects")."""
    if change == "same_objects" and state:
        return state["A"], state["B"], state["kw"]
    inputs = EIGHT_BIT.get(change)
    if device == "cpu" and inputs is not torch.int8:
        inputs = None  # fp8 needs a GPU
    case, (M, N, K) = laid_out_for(inputs, case, (M, N, K))
    args = case.arguments(M, N, K, dtype, device=device, seed=seed_, inputs=inputs)
    A, B = args.A, args.B
    if change == "a_transposed":
        A = A.T.contiguous().T  # same shape, column-major
    kw = dict(args.epilogue.values)
    if change in ("scalars", "int_scalar") and "alpha" in kw:
        kw["alpha"] = 3 if change == "int_scalar" else -0.25
    if change == "c_per_row" and "C" in kw:
        kw["C"] = kw["C"][:, :1].clone()
    if change == "unaligned_c" and "C" in kw:
        wide = torch.randn(M, N + 1, device=device).to(kw["C"].dtype)
        kw["C"] = wide[:, 1:]  # rows of N elements at an odd offset
    if change == "d_in_place" and isinstance(kw.get("D"), torch.Tensor) and "C" in kw \
            and kw["C"].dtype == kw["D"].dtype and kw["C"].shape == kw["D"].shape:
        kw["D"] = kw["C"]  # D written over C, each tile after reading it
    if change == "allocate_outputs":
        for name, kind in case.outputs:
            if kind in ("full", "full32") and name != "D":
                kw.pop(name)
                if kind == "full32":
                    kw[f"{name}_dtype"] = torch.float32
    return A, B, kw


def _sequence(case, changes, data_seed, device):
    if case.batch > 1 or case.a_col or case.b_col:
        case = type(case)(case.source, case.operands, case.outputs, case.c_fp32,
                          case.bias_fp32)  # layouts and batches change per call here
    state: dict = {}
    for step, change in enumerate(["new_data", *changes]):
        M = 24 if change == "other_m" else 16
        dtype = torch.float16 if change == "fp16" else torch.float32
        A, B, kw = _call(case, M, 24, 16, dtype, change, state, data_seed + step, device)
        inputs = {k: v.clone() if k in case.operands and isinstance(v, torch.Tensor) else v
                  for k, v in kw.items() if not k.endswith("_dtype")}  # before the call
        tune = "fast" if change == "tuned" else "none"
        out = evtfuse.gemm(A, B, case.source, tune=tune, fp8_fast_accum=change != "fp8_promoted",
                           **kw)
        outs = out if isinstance(out, tuple) else (out,)
        names = [n for n, _ in case.outputs]
        got = dict(zip(names, outs))
        operands = {k: v for k, v in inputs.items() if k not in names}
        for name, t in got.items():
            operands[name] = t
        ref = evaluate(evtfuse.GemmArguments(
            A, B, operands.get("D"), torch.float32,
            evtfuse.EpilogueArguments(case.source, **operands)), cast=False)
        for name, t in got.items():
            if t is None:
                continue
            check = compare(name, t, ref[name], t.dtype, input_dtype=A.dtype)
            assert check.ok, f"call {step} ({change}):\n{case.source}\n{check.line()}"
        state = {"A": A, "B": B, "kw": kw}


SEQUENCES = dict(case=cases(max_steps=2, reductions=True, named=False),  # values by canonical name
                 changes=st.lists(st.sampled_from(CHANGES), min_size=3, max_size=6),
                 data_seed=st.integers(0, 2 ** 16))


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tier")
@tiers(quick=5, full=25)
def test_call_sequences_match_the_reference(examples):
    @drawn(examples, base_seed=1123)
    @given(**SEQUENCES)
    def run(case, changes, data_seed):
        _sequence(case, changes, data_seed, "cpu")

    run()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@drawn(8, base_seed=1123)
@given(**SEQUENCES)
def test_call_sequences_match_the_reference_gpu(case, changes, data_seed):
    """The same on the GPU, where later calls go through the direct launcher."""
    _sequence(case, changes, data_seed, "cuda")
