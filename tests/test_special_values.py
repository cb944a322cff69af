"""Special floats (+-0, +-inf, NaN, denormals, the largest finite values) through every row
of the op table: the reference evaluator, constant folding and the kernels under Triton's
interpreter, each against torch's own function (``special_values.TORCH_OWN``), with the
exceptions the rows document (``special_values.EXCEPTIONS``) checked as stated.

Reductions: lines holding special values reduced per row, per column and over the whole
output (batched and not) by both interpreted families; and reductions over an empty axis
(M = 0 or N = 0), which give the reduction's identity as torch does (sum 0,
logsumexp -inf; max -inf and min +inf, where torch raises).
"""

from __future__ import annotations

import pytest
import torch

import evtfuse
from evtfuse import EpilogueArguments, GemmArguments, explain, get_kernels
from evtfuse import ir, passes
from evtfuse.ir import NodeKind, Output, OutputKind
from evtfuse.optable import OPS, Category
from evtfuse.reference import evaluate
from special_values import (EXCEPTIONS, LINES, check, elementwise_rows,
                            epilogue_source, expected, gemm_arguments, group_source,
                            inputs_for, line, line_matrix, mismatches, missing_rows,
                            param_id, param_sets, reduction_rows, reduction_source, report,
                            rowwise_rows, run_kernel, vector_arguments)

pytestmark = [
    pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-interpreter tier"),
    # numpy, which runs interpreted kernels, warns about inf - inf, 0 * inf, overflow, ...
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
]

CASES = [(row.name, p) for row in elementwise_rows() for p in param_sets(row)]
IDS = [f"{name}[{param_id(p)}]" for name, p in CASES]


def test_every_row_has_torch_counterpart():
    """A new row needs torch's own function in special_values.TORCH_OWN (then every check
    below covers it)."""
    assert not missing_rows(), f"rows without torch's own function: {sorted(missing_rows())}"


def test_exceptions_are_documented_by_their_rows():
    for e in EXCEPTIONS:
        assert e.op in OPS, e.op
        assert e.doc_says in OPS[e.op].doc, (e.op, e.doc_says, OPS[e.op].doc)


def _kernel(args, family):
    cc = 90 if family == "hopper" else None
    ks = [k for k in get_kernels(args, cc=cc) if k.family.name == family]
    assert ks, explain(args, cc=cc)
    return ks[0]


@pytest.mark.parametrize("name, params", CASES, ids=IDS)
def test_reference_evaluator(name, params):
    row = OPS[name]
    ins = inputs_for(row)
    args, _ = gemm_arguments(epilogue_source(row, params), ins)
    got = evaluate(args)["D"].flatten()[: ins[0].numel()]
    check(f"reference {name}({param_id(params)})", got, ins, name, params, kernel=False)


@pytest.mark.parametrize("name, params", CASES, ids=IDS)
def test_constant_folding(name, params):
    """Every combination of literals folded by ``passes.fold_constants``: elementwise rows
    become the constant torch gives; a ``where`` on a literal condition becomes the branch
    it picks; comparisons are not folded (their bool result is left to the kernel)."""
    row = OPS[name]
    ins = inputs_for(row)
    consts = [[ir.const_node(float(v)) for v in t.tolist()] for t in ins]
    nodes = [ir.compute_node(name, [c[k] for c in consts], tuple(params.items()))
             for k in range(ins[0].numel())]
    outs = tuple(Output(f"o{k}", n, OutputKind.FULL, torch.float32) for k, n in enumerate(nodes))
    folded = passes.fold_constants(ir.Dag(outs, ()))
    if row.category is Category.COMPARE:
        assert all(o.node.kind is NodeKind.COMPUTE for o in folded.outputs)
        return
    assert all(o.node.kind is NodeKind.CONST for o in folded.outputs), name
    got = torch.tensor([o.node.value for o in folded.outputs], dtype=torch.float32)
    check(f"folded {name}({param_id(params)})", got, ins, name, params, kernel=False)


@pytest.mark.parametrize("name, params", CASES, ids=IDS)
def test_portable_kernel(name, params):
    row = OPS[name]
    ins = inputs_for(row)
    args, D = gemm_arguments(epilogue_source(row, params), ins)
    got = run_kernel(_kernel(args, "portable"), args, D, ins[0].numel())
    check(f"portable kernel {name}({param_id(params)})", got, ins, name, params)


@pytest.mark.parametrize("name", [r.name for r in elementwise_rows()])
@pytest.mark.slow
def test_hopper_kernel(name):
    """The TMA family, each row with its first parameter set (loads and stores differ from
    the portable family's; the epilogue's code is the same emitter's)."""
    row = OPS[name]
    params = param_sets(row)[0]
    ins = inputs_for(row)
    args, D = gemm_arguments(epilogue_source(row, params), ins)
    got = run_kernel(_kernel(args, "hopper"), args, D, ins[0].numel())
    check(f"hopper kernel {name}({param_id(params)})", got, ins, name, params)


@pytest.mark.parametrize("family", ["portable", "hopper"])
@pytest.mark.parametrize("arity", [2, 3])
def test_rows_with_vector_operands(family, arity):
    """Every pair (triple) through a full, a per-row (and a per-column) operand: the
    vector loads, and the layout the GPU tier gives the gluon family."""
    cases = [(row, p) for row in elementwise_rows() if row.arity == arity
             for p in param_sets(row)]
    src, names = group_source(cases)
    args, D, ins = vector_arguments(src, arity, outputs=tuple(names))
    got = run_kernel(_kernel(args, family), args, D, ins[0].numel(), tuple(names))
    for out, (row, params) in zip(got, cases):
        check(f"{family} {row.name} (vectors)", out, ins, row.name, params)


def test_fp16_operands_and_outputs():
    """Special values of fp16 (its denormals, its largest finite value, inf past it)
    loaded, computed in fp32 and stored as fp16: one-argument rows."""
    specials = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 6e-8,
                             -6e-8, 3e-5, 65504.0, -65504.0, 1.5, -2.5, 20.0, -20.0])
    for row in elementwise_rows():
        if row.arity != 1:
            continue
        params = param_sets(row)[0]
        args, D = gemm_arguments(epilogue_source(row, params), [specials], dtype=torch.float16)
        got = run_kernel(_kernel(args, "portable"), args, D, specials.numel())
        ins = [specials.half().float()]
        want, free = expected(row.name, ins, params, kernel=True)
        want = want.half().float()  # stored as fp16, as torch would round it
        bad = mismatches(got, want, free, rtol=1e-3, atol=2 * 2.0 ** -24)  # fp16 denormal steps
        assert not bad.any(), report(f"fp16 {row.name}", bad, got, want, ins)


# ------------------------------------------------------------------ reductions

LENGTH = 300  # several tiles of every config along a line


def _reduce_args(op, X, out_shape):
    R = torch.full(out_shape, -1234.5)
    A = torch.zeros(*X.shape[:-1], 16)
    B = torch.zeros(16, X.shape[-1])
    epi = EpilogueArguments(reduction_source(op), X=X, D=None, R=R)
    return GemmArguments(A, B, None, torch.float32, epi), R


def _check_reduction(what, op, got, X, dims):
    want, free = expected(op, [X], {}, dims=dims)
    bad = mismatches(got, want.reshape(got.shape), free.reshape(got.shape))
    names = [n for n, _, _ in LINES]
    assert not bad.any(), f"{what}: {op} differs from torch on lines " \
        f"{[names[i % len(names)] for i in bad.nonzero().flatten().tolist()]}: " \
        f"got {got.flatten()[bad].tolist()}, torch {want.flatten()[bad.flatten()].tolist()}"


@pytest.mark.parametrize("family", ["portable", "hopper"])
@pytest.mark.parametrize("op", [r.name for r in reduction_rows()])
@pytest.mark.parametrize("axis", ["row", "col", "all_batched"])
@pytest.mark.cover("family", "axis")  # the quick tier: 3 of them
def test_reductions_of_special_lines(family, op, axis):
    """Each line of ``special_values.LINES`` reduced by one result: a row of X (per-row
    output), a column (per-column output), or a whole batch (an (L, 1, 1) output)."""
    lines = line_matrix(LENGTH)  # (lines, LENGTH)
    count = lines.shape[0]
    if axis == "row":
        X, shape, dims = lines, (count, 1), (1,)
    elif axis == "col":
        X, shape, dims = lines.t().contiguous(), (count,), (0,)  # result k: line k
    else:
        X, shape, dims = lines.reshape(count, 15, 20), (count, 1, 1), (1, 2)
    args, R = _reduce_args(op, X, shape)
    _kernel(args, family).run(args)
    _check_reduction(f"{family} {axis}", op, R.flatten(), X, dims)
    ref = evaluate(args)["R"].flatten()
    _check_reduction(f"reference {axis}", op, ref, X, dims)


@pytest.mark.parametrize("family", ["portable", "hopper"])
@pytest.mark.parametrize("op", [r.name for r in rowwise_rows()])
@pytest.mark.parametrize("length", [40, LENGTH])  # a row in one tile (portable), in several
@pytest.mark.cover
def test_row_functions_of_special_lines(family, op, length):
    """Each line of ``special_values.LINES`` as one row of a row function's input, against
    torch's own function over that row."""
    X = line_matrix(length)
    A, B = torch.zeros(X.shape[0], 16), torch.zeros(16, length)
    D = torch.full(X.shape, -1234.5)
    src = f"def epi(accum, X):\n    D = {op}(X)\n    return D"
    args = GemmArguments(A, B, D, torch.float32, EpilogueArguments(src, X=X, D=D))
    _kernel(args, family).run(args)
    want, free = expected(op, [X], {})
    bad = mismatches(D, want, free).reshape(X.shape).any(dim=1)
    names = [n for n, _, _ in LINES]
    assert not bad.any(), f"{family}: {op} differs from torch on lines " \
        f"{[names[i % len(names)] for i in bad.nonzero().flatten().tolist()]}"


@pytest.mark.parametrize("family", ["portable", "hopper"])
@pytest.mark.parametrize("op", [r.name for r in reduction_rows()])
@pytest.mark.cover("family")  # a launch per line: the quick tier runs 2 of them
def test_whole_output_reductions_of_special_lines(family, op):
    """One (1,) result over a whole (M, N) output holding one line, for each line."""
    for k, (name, values, pad) in enumerate(LINES):
        X = line(values, pad, 40 * 24).reshape(40, 24)
        args, R = _reduce_args(op, X, (1,))
        _kernel(args, family).run(args)
        want, free = expected(op, [X], {}, dims=(0, 1))
        bad = mismatches(R, want.reshape(1), free.reshape(1))
        assert not bad.any(), f"{family}: {op} of line {name!r}: got {R.item()}, torch {want.item()}"


# ------------------------------------------------------------------ empty axes

IDENTITY = {"sum": 0.0, "max": float("-inf"), "min": float("inf"), "logsumexp": float("-inf")}


@pytest.mark.parametrize("lmn", [(1, 0, 24), (1, 40, 0), (2, 0, 24), (1, 0, 0)],
                         ids=["M=0", "N=0", "M=0,L=2", "M=N=0"])
@pytest.mark.parametrize("family", ["portable", "hopper"])
def test_reductions_over_an_empty_axis_give_the_identity(lmn, family):
    """Outputs of a reduction over no element hold its identity (torch's for sum and
    logsumexp; -inf for max, +inf for min, where torch raises), also where the output
    itself has elements (a per-column result when M = 0); the reference evaluator and
    ``Kernel.verify`` agree."""
    L, M, N = lmn
    lead = (L,) if L != 1 else ()
    X = torch.randn(*lead, M, N)
    outs = {}
    for op in IDENTITY:
        outs[f"r_{op}"] = torch.full((*lead, M, 1), 7.0)
        outs[f"c_{op}"] = torch.full((*lead, 1, N) if lead else (N,), 7.0)
        outs[f"a_{op}"] = torch.full((1,), 7.0)
    body = "; ".join(f"{k} = {k[2:]}(x)" for k in outs)
    src = f"def epi(accum, X): x = accum + X; D = x; {body}; return D, {', '.join(outs)}"
    A, B = torch.randn(*lead, M, 16), torch.randn(16, N)
    D = torch.empty(*lead, M, N)
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(src, X=X, D=D, **outs))
    if family == "hopper" and N == 0:  # TMA rows of 0 bytes: refused, and explain says why
        assert not [k for k in get_kernels(args, cc=90) if k.family.name == "hopper"]
        assert "16-byte aligned rows" in explain(args, cc=90)
        return
    kernel = _kernel(args, family)
    kernel.run(args)
    assert outs["a_sum"].numel() == 1  # the whole-output results always have an element
    for name, t in outs.items():
        assert torch.equal(t, torch.full_like(t, IDENTITY[name[2:]])), (name, t)
    ref = evaluate(args)
    for name, t in outs.items():
        assert torch.equal(ref[name].reshape(t.shape), t), name
    result = kernel.verify(args)
    assert result, result.report()


def test_identities_are_the_rows_and_torchs():
    for op, value in IDENTITY.items():
        assert OPS[op].reduce_identity == value
    empty = torch.zeros(0)
    assert torch.sum(empty).item() == IDENTITY["sum"]
    assert torch.logsumexp(empty, 0).item() == IDENTITY["logsumexp"]
    with pytest.raises((IndexError, RuntimeError)):
        torch.amax(empty, 0)  # torch has no identity for max: evtfuse's is -inf


def test_k_zero_is_an_accumulator_of_zeros():
    """K = 0 is no empty axis of the output: the accumulator is 0 and reductions see it."""
    M, N = 24, 40
    A, B = torch.zeros(M, 0), torch.zeros(0, N)
    s, m = torch.empty(M, 1), torch.empty(N)
    args = GemmArguments(A, B, None, epilogue=EpilogueArguments(
        "def epi(accum): D = accum; s = sum(accum + 1.0); m = logsumexp(accum); return D, s, m",
        D=None, s=s, m=m))
    kernel = _kernel(args, "portable")
    result = kernel.verify(args)
    assert result, result.report()
    assert torch.equal(s, torch.full_like(s, float(N)))
    torch.testing.assert_close(m, torch.full_like(m, float(torch.log(torch.tensor(float(M))))))
