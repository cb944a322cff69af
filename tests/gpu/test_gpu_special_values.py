"""GPU tier: special floats (+-0, +-inf, NaN, denormals, the largest finite values) through
every row of the op table and every reduction, in every kernel family the GPU offers.

The same inputs and the same comparison with torch's own functions as the CPU tier's
``test_special_values.py`` (``special_values``), on the GPU spellings (``triton_cuda``):
the exceptions marked ``gpu_only`` there (fused multiply-add, subnormal results flushed by
MUFU.EX2/RCP) and ``GPU_RTOL``'s tolerances of approximate spellings (MUFU.TANH) apply.
torch's values are computed on the CPU, so that a difference of torch's CUDA kernels does
not hide one of ours. Run on the device machine:
``PYTHONPATH=src python3 -m pytest -m gpu tests/gpu/test_gpu_special_values.py``.
"""

from __future__ import annotations

import pytest
import torch

from epilogue_fuzz import pick  # tests/ is on the path (its conftest.py)
from evtfuse import EpilogueArguments, GemmArguments, explain
from evtfuse.optable import OPS
from special_values import (GPU_RTOL, LINES, RTOL, elementwise_rows, expected,
                            for_dtype, gemm_arguments, group_source, inputs_for, line,
                            line_matrix, mismatches, param_id, param_sets, reduction_rows,
                            report, run_kernel, vector_arguments)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

KINDS = [("gluon", "first"), ("gluon", "coop"), ("gluon", "wide"), ("hopper", "first"),
         ("portable", "first")]
KIND_IDS = [f"{f}-{w}" for f, w in KINDS]
GROUP = 6  # rows per kernel: one compile for several checks


def _groups() -> list[list]:
    """Every (row, parameters) case, in kernels of up to ``GROUP`` rows of one arity."""
    by_arity: dict[int, list] = {}
    for row in elementwise_rows():
        for p in param_sets(row):
            by_arity.setdefault(row.arity, []).append((row, p))
    return [cases[k:k + GROUP] for _, cases in sorted(by_arity.items())
            for k in range(0, len(cases), GROUP)]


GROUPS = _groups()
GROUP_IDS = ["+".join(f"{row.name}[{param_id(p)}]" for row, p in g) for g in GROUPS]


def _kernel(args, kind):
    family, which = kind
    if family == "gluon" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the gluon family runs on Hopper (sm_90)")
    kernel = pick(args, family, which)
    if kernel is None:  # a refusal the family states is not a wrong answer
        pytest.skip(f"{family} ({which}) refused:\n{explain(args)}")
    return kernel


def _dtype(kind) -> torch.dtype:
    """Operands and outputs of fp32, bf16 for the gluon family: its shared memory holds no
    fp32 tiles of a full operand and an output beside its stages (it says so)."""
    return torch.bfloat16 if kind[0] == "gluon" else torch.float32


def _tolerances(name: str, dtype: torch.dtype) -> dict:
    fin = torch.finfo(dtype)
    if dtype == torch.float32:
        return {"rtol": GPU_RTOL.get(name, RTOL)}
    # the output's rounding, and two of its smallest denormals
    return {"rtol": max(GPU_RTOL.get(name, 0.0), fin.eps), "atol": 2 * fin.tiny * fin.eps}


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("group", GROUPS, ids=GROUP_IDS)
def test_special_values_through_every_family(kind, group):
    """Every row and parameter set (a few rows per kernel) on operands and outputs of
    ``_dtype``, inputs rounded to it, torch's value rounded to it; rows of two and three
    arguments through a full, a per-row and a per-column operand (``vector_arguments``).
    A and B of bf16 (every family takes them), all zeros."""
    dtype = _dtype(kind)
    src, names = group_source(group)
    if group[0][0].arity > 1:
        args, D, ins = vector_arguments(src, group[0][0].arity, device="cuda", dtype=dtype,
                                        ab_dtype=torch.bfloat16, outputs=tuple(names))
    else:
        ins = [t.to(dtype).float() for t in inputs_for(group[0][0])]
        args, D = gemm_arguments(src, ins, device="cuda", dtype=dtype,
                                 ab_dtype=torch.bfloat16, outputs=tuple(names))
    got = run_kernel(_kernel(args, kind), args, D, ins[0].numel(), tuple(names))
    failures = []
    for out, (row, params) in zip(got, group):
        want, free = expected(row.name, ins, params, gpu=True)
        want = want.to(dtype).float()  # stored as the output's dtype, as torch rounds it
        bad = mismatches(out, want, free, **_tolerances(row.name, dtype))
        if bad.any():
            failures.append(report(f"{kind} {dtype} {row.name}({param_id(params)})", bad,
                                   out, want, ins))
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_special_values_of_16_bit_operands_and_outputs(kind, dtype):
    """One-argument rows on 16-bit operands stored as 16-bit outputs: their infinities,
    denormals and largest finite values, rounded as torch rounds the fp32 result."""
    fin = torch.finfo(dtype)
    specials = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"),
                             fin.smallest_normal / 4, -fin.smallest_normal / 4, fin.tiny,
                             fin.max, -fin.max, 1.5, -2.5, 20.0, -20.0]).to(dtype).float()
    cases = [(row, param_sets(row)[0]) for row in elementwise_rows() if row.arity == 1]
    failures = []
    for k in range(0, len(cases), GROUP):
        group = cases[k:k + GROUP]
        src, names = group_source(group)
        args, D = gemm_arguments(src, [specials], device="cuda", dtype=dtype,
                                 outputs=tuple(names))
        got = run_kernel(_kernel(args, kind), args, D, specials.numel(), tuple(names))
        for out, (row, params) in zip(got, group):
            want, free = expected(row.name, [specials], params, gpu=True)
            want = want.to(dtype).float()
            step = fin.smallest_normal * fin.eps  # the format's smallest denormal
            bad = mismatches(out, want, free, atol=2 * step,
                             rtol=max(GPU_RTOL.get(row.name, 0.0), fin.eps))
            if bad.any():
                failures.append(report(f"{kind} {dtype} {row.name}", bad, out, want, [specials]))
    assert not failures, "\n".join(failures)


OPS_R = [r.name for r in reduction_rows()]
REDUCE_ALL = ("def epi(accum, X):\n    D = X\n" + "".join(f"    R_{op} = {op}(X)\n" for op in OPS_R)
              + f"    return D, {', '.join(f'R_{op}' for op in OPS_R)}")


def _reduce(X, out_shape, kind) -> dict[str, torch.Tensor]:
    """Every reduction of X into fp32 outputs of ``out_shape``, in one kernel."""
    outs = {f"R_{op}": torch.full(out_shape, -1234.5, device="cuda") for op in OPS_R}
    A = torch.zeros(*X.shape[:-1], 16, dtype=torch.bfloat16, device="cuda")
    B = torch.zeros(16, X.shape[-1], dtype=torch.bfloat16, device="cuda")
    args = GemmArguments(A, B, None, torch.float32,
                         EpilogueArguments(REDUCE_ALL, X=X.cuda(), D=None, **outs))
    _kernel(args, kind).run(args)
    torch.cuda.synchronize()
    return {name[2:]: t.cpu() for name, t in outs.items()}


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("axis", ["row", "col", "all_batched"])
@pytest.mark.parametrize("length", [304, 1024], ids=["ragged", "even"])
def test_reductions_of_special_lines(kind, axis, length):
    """Lines of special values (in X of ``_dtype``, their largest finite values and
    denormals that dtype's) reduced per row, per column and per batch; ``even``: lines that
    fill whole tiles (no masked element, so a tile's tree of -0.0 terms shows)."""
    lines = line_matrix(length, _dtype(kind))
    count = lines.shape[0]
    if axis == "row":
        X, shape, dims = lines, (count, 1), (1,)
    elif axis == "col":
        X, shape, dims = lines.t().contiguous(), (count,), (0,)
    else:  # each batch one line: (19, 16) or (32, 32)
        cols = {304: 16, 1024: 32}[length]
        X, shape, dims = lines.reshape(count, -1, cols), (count, 1, 1), (1, 2)
    results = _reduce(X, shape, kind)
    names = [n for n, _, _ in LINES] + ["(copy)"] * count
    failures = []
    for op, got in results.items():
        got = got.flatten()
        want, free = expected(op, [X.float()], {}, gpu=True, dims=dims)
        bad = mismatches(got, want.flatten(), free.flatten())
        if bad.any():
            failures.append(f"{op} differs from torch on lines "
                            f"{[names[i] for i in bad.nonzero().flatten().tolist()]}: got "
                            f"{got[bad].tolist()}, torch {want.flatten()[bad].tolist()}")
    assert not failures, f"{kind} {axis} {length}:\n" + "\n".join(failures)


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_whole_output_reductions_of_special_lines(kind):
    """One (1,) result over a whole 512 x 256 output holding one line, for each line."""
    dtype = _dtype(kind)
    failures = []
    for name, values, pad in LINES:
        X = line(tuple(for_dtype(v, dtype) for v in values), for_dtype(pad, dtype),
                 512 * 256).reshape(512, 256).to(dtype)
        for op, got in _reduce(X, (1,), kind).items():
            want, free = expected(op, [X.float()], {}, gpu=True, dims=(0, 1))
            if mismatches(got, want.reshape(1), free.reshape(1)).any():
                failures.append(f"{op} of line {name!r}: got {got.item()}, torch {want.item()}")
    assert not failures, f"{kind}:\n" + "\n".join(failures)


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
@pytest.mark.parametrize("mn", [(0, 256), (256, 0)], ids=["M=0", "N=0"])
def test_reductions_over_an_empty_axis_give_the_identity(kind, mn):
    M, N = mn
    identity = {"sum": 0.0, "max": float("-inf"), "min": float("inf"),
                "logsumexp": float("-inf")}
    outs = {f"c_{op}": torch.full((N,), 7.0, device="cuda") for op in identity}
    outs.update({f"a_{op}": torch.full((1,), 7.0, device="cuda") for op in identity})
    body = "; ".join(f"{k} = {k[2:]}(accum)" for k in outs)
    src = f"def epi(accum): D = accum; {body}; return D, {', '.join(outs)}"
    A = torch.randn(M, 64, device="cuda", dtype=torch.bfloat16)
    B = torch.randn(64, N, device="cuda", dtype=torch.bfloat16)
    args = GemmArguments(A, B, None, torch.float32, EpilogueArguments(src, D=None, **outs))
    kernel = _kernel(args, kind)
    kernel.run(args)
    torch.cuda.synchronize()
    for name, t in outs.items():
        assert torch.equal(t, torch.full_like(t, identity[name[2:]])), (name, t)
    result = kernel.verify(args)
    assert result, result.report()
