"""The sharding rules of evtfuse's GEMM operators (``runtime.sharding``), one process: which
ways of splitting a call the epilogue's DAG allows and why not the others, where each
tensor goes under each, which one a call chooses, and that importing evtfuse (or calling it
without DTensors) leaves ``torch.distributed.tensor`` unimported. The operators on DTensors
themselves: tests/test_distributed_sharding.py."""

from __future__ import annotations

import functools
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from evtfuse.errors import EpilogueError
from evtfuse.frontend import parse_epilogue
from evtfuse.runtime import sharding
from evtfuse.runtime.sharding import BATCHES, COLUMNS, INNER, REPLICATE, ROWS

F32 = torch.float32
M, K, N = 6, 8, 10


def rules(src: str, operands=None, outputs=None, A=(M, K), B=(K, N), **kw):
    outputs = {"D": ((M, N), F32)} if outputs is None else outputs
    return sharding.rules_of(parse_epilogue(src), A, B, F32, operands or {}, outputs, **kw)


def test_an_elementwise_epilogue_splits_over_rows_and_columns():
    r = rules("def e(accum, bias, scale, alpha):\n    D = relu(accum * scale + bias) * alpha\n"
              "    return D", {"bias": ((N,), F32), "scale": ((M, 1), F32), "alpha": 2.0})
    assert set(r.refused) == {INNER} and r.problem == (1, M, N)
    assert r.refused[INNER].endswith("line 2: relu(...) is not linear in the accumulator and "
                                     "the operands added to it, so the parts of K cannot be "
                                     "summed after it")
    assert r.allows(COLUMNS, 2) and r.allows(ROWS, 2) and r.allows(REPLICATE, 2)
    assert not r.allows(BATCHES, 2)  # L = 1: nothing to split
    assert r.dims == {"A": (None, 0, None), "B": (None, None, 1), "offs": (None, None, None),
                      "bias": (None, None, 0), "scale": (None, 0, None), "D": (None, 0, 1)}


@pytest.mark.parametrize("src,outputs,mode,words", [
    ("def e(accum):\n    D = softmax(accum)\n    return D", None, COLUMNS,
     "line 2: softmax or log_softmax (a function of the whole row) reduces over the columns"),
    ("def e(accum):\n    s = logsumexp(accum)\n    D = accum - s\n    return D, s",
     {"D": ((M, N), F32), "s": ((M, 1), F32)}, COLUMNS, "line 2: s = logsumexp(...) reduces "
     "over the columns"),
    ("def e(accum):\n    D = accum\n    c = sum(accum)\n    return D, c",
     {"D": ((M, N), F32), "c": ((N,), F32)}, ROWS, "reduces over the rows"),
    ("def e(accum):\n    D = accum * col_index()\n    return D", None, COLUMNS, "col_index()"),
    ("def e(accum):\n    D = accum * row_index()\n    return D", None, ROWS, "row_index()"),
    ("def e(accum):\n    gate, up = pairs(accum)\n    D = silu(gate) * up\n    return D",
     {"D": ((M, N // 2), F32)}, COLUMNS, "pairs(accum)"),
])
def test_what_mixes_columns_or_rows_refuses_that_split(src, outputs, mode, words):
    r = rules(src, outputs=outputs)
    assert set(r.refused) - {INNER} == {mode}, r.refused
    assert words in r.refused[mode]
    assert not r.allows(mode, 1) and r.allows({COLUMNS: ROWS, ROWS: COLUMNS}[mode], 2)


def test_a_whole_problem_reduction_refuses_both():
    r = rules("def e(accum):\n    D = accum\n    t = sum(accum)\n    return D, t",
              outputs={"D": ((M, N), F32), "t": ((1,), F32)})
    assert set(r.refused) == {COLUMNS, ROWS}


def test_batches_split_where_every_output_keeps_them():
    L = 4
    ok = rules("def e(accum, bias):\n    D = accum + bias\n    return D",
               {"bias": ((L, 1, N), F32)}, {"D": ((L, M, N), F32)}, A=(L, M, K), B=(K, N))
    assert ok.refused == {} and ok.allows(BATCHES, 4) and not ok.allows(BATCHES, 5)
    assert ok.dims["A"] == (0, 1, None) and ok.dims["B"] == (None, None, 1)
    assert ok.dims["bias"] == (0, None, 2) and ok.dims["D"] == (0, 1, 2)
    summed = rules("def e(accum):\n    D = accum\n    c = sum(accum)\n    return D, c",
                   outputs={"D": ((L, M, N), F32), "c": ((N,), F32)}, A=(L, M, K), B=(L, K, N))
    assert set(summed.refused) == {BATCHES, ROWS}
    assert "line 3: c = sum(...) reduces over the batches" in summed.refused[BATCHES]
    per_batch = rules("def e(accum):\n    D = accum\n    c = sum(accum)\n    return D, c",
                      outputs={"D": ((L, M, N), F32), "c": ((L, 1, N), F32)}, A=(L, M, K),
                      B=(L, K, N))
    assert set(per_batch.refused) == {ROWS} and per_batch.dims["c"] == (0, None, 2)


def test_grouped_gemms_split_over_columns_only_over_m():
    G, T = 3, 9
    over_m = rules("def e(accum, bias):\n    D = accum + bias\n    return D",
                   {"bias": ((G, 1, N), F32)}, {"D": ((T, N), F32)}, A=(T, K), B=(G, K, N),
                   grouped=True)
    assert set(over_m.refused) == {ROWS, BATCHES} and "offs cuts" in over_m.refused[ROWS]
    assert over_m.dims["B"] == (None, None, 2) and over_m.dims["bias"][2] == 2
    over_k = rules("def e(accum):\n    D = accum\n    return D", outputs={"D": ((G, M, N), F32)},
                   A=(M, T), B=(T, N), groups=G)
    assert set(over_k.refused) == {BATCHES, INNER} and "cut K" in over_k.refused[INNER]
    assert over_k.dims["A"] == (None, 0, None) and over_k.dims["D"] == (0, 1, 2)


def test_placements_and_gradient_placements():
    from torch.distributed.tensor import Partial, Replicate, Shard

    r = rules("def e(accum, bias, s):\n    D = accum * s + bias\n    return D",
              {"bias": ((N,), F32), "s": ((), F32)})
    cols = [COLUMNS]
    assert sharding.placements_of(r, cols, "A") == (Replicate(),)
    assert sharding.placements_of(r, cols, "B") == (Shard(1),)
    assert sharding.placements_of(r, cols, "bias") == (Shard(0),)
    assert sharding.placements_of(r, cols, "D") == (Shard(1),)
    # a replicated input of a split call: each rank has its part of the gradient's sum
    assert sharding.grad_placements_of(r, cols, "A") == (Partial(),)
    assert sharding.grad_placements_of(r, cols, "s") == (Partial(),)
    assert sharding.grad_placements_of(r, cols, "bias") == (Shard(0),)
    assert sharding.grad_placements_of(r, [REPLICATE], "A") == (Replicate(),)
    assert sharding.placements_of(r, [COLUMNS, ROWS], "D") == (Shard(1), Shard(0))


@pytest.mark.parametrize("src,operands,summands,words", [
    ("def e(accum, C, alpha, beta):\n    D = alpha * accum + beta * C\n    return D",
     {"C": ((M, N), F32), "alpha": 2.0, "beta": 0.5}, {"C"}, None),
    ("def e(accum, scale, bias):\n    D = (accum - bias) / scale\n    s = sum(D)\n"
     "    return D, s", {"scale": ((M, 1), F32), "bias": ((N,), F32)}, {"bias"}, None),
    ("def e(accum):\n    D = -accum * col_index()\n    return D", {}, set(), None),
    ("def e(accum):\n    D = accum + 1.0\n    return D", {}, set(),
     "line 2: D = add(...) is not linear in the accumulator, so"),
    ("def e(accum, C):\n    D = accum + C * C\n    return D", {"C": ((M, N), F32)}, set(),
     "line 2: mul(...) is not linear in the accumulator and the operands added to it"),
    ("def e(accum, C):\n    D = accum * C + C\n    return D", {"C": ((M, N), F32)}, set(),
     "line 2: mul(...) is not linear"),
    ("def e(accum):\n    D = accum\n    m = max(accum)\n    return D, m", {}, set(),
     "line 3: m = max(...) is not linear"),
    ("def e(accum, bias):\n    D = relu(accum + bias)\n    return D", {"bias": ((N,), F32)},
     set(), "line 2: D = relu(...) is not linear in the accumulator and the operands added"),
])
def test_k_splits_where_every_output_is_linear_in_the_partial_sums(src, operands, summands,
                                                                    words):
    """K (A's columns, B's rows) splits where each rank's epilogue of its partial sums is
    its part of the whole: outputs linear in the accumulator and in the tensor operands
    added to it (placed Partial too); a constant added, a product of two summands, a max,
    a nonlinear function refuse it, naming the line."""
    outputs = {"D": ((M, N), F32)}
    if "s = sum" in src:
        outputs["s"] = ((M, 1), F32)
    if "m = max" in src:
        outputs["m"] = ((M, 1), F32)
    r = rules(src, operands, outputs)
    if words is not None:
        assert words in r.refused[INNER], r.refused
        assert not r.allows(INNER, 2)
        return
    assert INNER not in r.refused and r.allows(INNER, 2) and r.summands == summands | set(outputs)
    assert not r.allows(INNER, K + 1)  # a rank with no index of K


def test_a_stored_row_logsumexp_splits_the_columns_combined_by_gemm():
    from torch.distributed.tensor import Replicate, Shard

    r = rules("def e(accum):\n    D = accum\n    s = logsumexp(accum)\n    return D, s",
              outputs={"D": ((M, N), F32), "s": ((M, 1), F32)})
    assert COLUMNS not in r.refused and r.combined == {"s"}
    assert sharding.placements_of(r, [COLUMNS], "s") == (Replicate(),)  # after the combine
    assert sharding.placements_of(r, [COLUMNS], "D") == (Shard(1),)
    assert COLUMNS not in sharding.for_gradients(r).refused  # its gradient flows back


def test_placements_under_a_k_split():
    from torch.distributed.tensor import Partial, Replicate, Shard

    r = rules("def e(accum, bias, s):\n    D = accum * s + bias\n    return D",
              {"bias": ((N,), F32), "s": ((), F32)})
    inner = [INNER]
    assert sharding.placements_of(r, inner, "A") == (Shard(1),)
    assert sharding.placements_of(r, inner, "B") == (Shard(0),)
    assert sharding.placements_of(r, inner, "s") == (Replicate(),)  # a factor: whole
    assert sharding.placements_of(r, inner, "bias") == (Partial(),)  # a summand: parts
    assert sharding.placements_of(r, inner, "D") == (Partial(),)
    assert sharding.grad_placements_of(r, inner, "A") == (Shard(1),)
    assert sharding.grad_placements_of(r, inner, "s") == (Partial(),)  # sum of each K part's
    assert sharding.grad_placements_of(r, inner, "bias") == (Replicate(),)  # each part's: all
    batched = rules("def e(accum):\n    D = accum\n    return D", outputs={"D": ((3, M, N), F32)},
                    A=(3, M, K), B=(3, K, N))
    assert sharding.placements_of(batched, inner, "A") == (Shard(2),)
    assert sharding.placements_of(batched, inner, "B") == (Shard(1),)


def _mesh(*sizes):
    return SimpleNamespace(ndim=len(sizes), size=lambda d: sizes[d])


def test_choose_moves_the_fewest_bytes():
    from torch.distributed.tensor import Partial, Replicate, Shard

    R, S0, S1 = (Replicate(),), (Shard(0),), (Shard(1),)
    r = rules("def e(accum, bias):\n    D = accum + bias\n    return D", {"bias": ((N,), F32)})
    sizes = {"A": 100, "B": 200, "bias": 10}
    mesh = _mesh(2)

    def choose(placed, fixed=None):
        return sharding.choose(r, mesh, placed, sizes, sharding.fitting("t", r, mesh, fixed or {}))

    assert choose({"A": R, "B": S1, "bias": S0}) == [COLUMNS]
    assert choose({"A": S0, "B": R, "bias": R}) == [ROWS]
    assert choose({"A": R, "B": R, "bias": R}) == [REPLICATE]  # all replicated stays so
    assert choose({"A": (Partial(),), "B": S1, "bias": S0}) == [COLUMNS]
    # K sharded (A's columns, B's rows) under an epilogue linear in accum and bias: kept
    # split (each rank's output its part of the sum), unless the output's all-reduce, which
    # reading it takes, costs more than gathering A and B
    assert choose({"A": S1, "B": S0, "bias": R}) == [INNER]
    assert choose({"A": S1, "B": R, "bias": R}) == [INNER]
    sizes["D"] = 1000
    assert choose({"A": S1, "B": S0, "bias": R}) == [REPLICATE]
    del sizes["D"]
    # an output given replicated fixes the split
    assert choose({"A": R, "B": S1, "bias": S0}, {"D": R}) == [REPLICATE]
    softmax = rules("def e(accum):\n    D = softmax(accum)\n    return D")
    got = sharding.choose(softmax, mesh, {"A": R, "B": S1}, {"A": 100, "B": 200},
                          sharding.fitting("t", softmax, mesh, {}))
    assert got == [REPLICATE]  # columns refused: gathering B, then replicated (tie with rows)


def test_an_output_placed_where_the_epilogue_cannot_compute_it_is_named():
    from torch.distributed.tensor import Replicate, Shard

    softmax = rules("def e(accum):\n    D = softmax(accum)\n    return D")
    with pytest.raises(EpilogueError, match=r"gemm: output D is a DTensor placed "
                       r"\(Shard\(dim=1\),\), but the epilogue e.*softmax.*whole row.*"
                       r"columns \(N\) cannot be computed apart") as info:
        sharding.fitting("gemm", softmax, _mesh(2), {"D": (Shard(1),)})
    assert info.value.variable == "D"
    assert sharding.fitting("gemm", softmax, _mesh(2), {"D": (Replicate(),)}) == [[REPLICATE]]
    with pytest.raises(EpilogueError, match="fewer indices than mesh dimension 0"):
        sharding.fitting("gemm", rules("def e(accum):\n    D = accum\n    return D"),
                         _mesh(16), {"D": (Shard(1),)})


@pytest.mark.slow
def test_import_and_plain_calls_leave_torch_distributed_tensor_unimported():
    code = ("import sys, torch, evtfuse\nfrom evtfuse.runtime.device import is_dtensor\n"
            "is_dtensor(torch.ones(1))\n"
            "print('torch.distributed.tensor' in sys.modules)\n"
            "import torch.distributed.tensor\n"
            "from evtfuse.runtime import sharding\n"
            "print(is_dtensor(torch.ones(1)), sharding._state)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split("\n")
    assert out[0] == "False"
    assert out[1] == "False {'done': True}"  # registered once the module is there


@pytest.mark.slow
def test_a_compiled_call_registers_nothing_inside_its_trace():
    """evtfuse's first look for the DTensor class inside torch.compile's trace (here
    torch.distributed.tensor is imported before, and evtfuse has not looked yet; torch.compile
    itself may import it while it traces): the rules are not registered in the trace (Dynamo
    cannot trace register_sharding), the graph stays whole (fullgraph=True), and they are
    registered at the next eager look."""
    code = (
        "import sys, torch, evtfuse\n"
        "import torch.distributed.tensor\n"
        "from evtfuse.runtime import sharding\n"
        "from evtfuse.runtime.device import is_dtensor, use_interpreter\n"
        "use_interpreter()\n"
        "A, B = torch.randn(8, 16, requires_grad=True), torch.randn(16, 12)\n"
        "epi = 'def e(accum):\\n    D = relu(accum)\\n    return D'\n"
        "step = torch.compile(lambda a, b: evtfuse.gemm(a, b, epi).sum(), fullgraph=True,\n"
        "                     backend='aot_eager')\n"
        "step(A, B).backward()\n"
        "print(sharding.registered(), is_dtensor(A), sharding.registered())\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split("\n")[-2] == "False False True"


# ------------------------------------------------------------------ the K split, drawn

_CONSTS = ("C", "bias", "rowv", "alpha", "2.0", "-0.5")


def _drawn_expr(draw, depth: int, linear: bool = True) -> str:
    """An expression linear in ``accum`` and in the operands added to it where ``linear``
    (a constant where not), but for the nonlinear turns a fifth of the draws take."""
    from hypothesis import strategies as st

    if not linear:  # a constant: operands, literals and any function of them
        if depth == 0 or draw(st.integers(0, 2)) == 0:
            return draw(st.sampled_from(_CONSTS))
        op = draw(st.sampled_from(("({} * {})", "({} + {})", "relu({})", "sigmoid({})")))
        return op.format(*(_drawn_expr(draw, depth - 1, False) for _ in range(op.count("{}"))))
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        return "accum"
    kind = draw(st.integers(0, 9))
    sub = functools.partial(_drawn_expr, draw, depth - 1)
    if kind == 0:  # nonlinear: a function, a product of two, a literal added
        return draw(st.sampled_from(("relu({0})", "({0} * {1})", "({0} + 1.0)",
                                     "maximum({0}, {1})"))).format(sub(), sub())
    if kind in (1, 2):
        return f"({sub()} {draw(st.sampled_from('+-'))} {sub()})"
    if kind in (3, 4):
        return f"({sub()} {draw(st.sampled_from('+-'))} {draw(st.sampled_from(('C', 'bias', 'rowv')))})"
    if kind == 5:
        return f"({sub(linear=False)} * {sub()})"
    if kind == 6:
        return f"({sub()} / (abs({sub(linear=False)}) + 1.0))"
    if kind == 7:
        return f"(-{sub()})"
    if kind == 8:
        return f"multiply_add({sub(linear=False)}, {sub()}, {sub()})"
    return f"({sub()} - {sub(linear=False)} * {draw(st.sampled_from(('C', 'bias', 'rowv')))})"


def _k_split_case():
    from hypothesis import strategies as st

    @st.composite
    def case(draw):
        d = _drawn_expr(draw, 3)
        reduce = draw(st.sampled_from(("", "sum", "max")))
        body = f"    D = {d}\n" + (f"    r = {reduce}(D)\n    return D, r\n" if reduce
                                   else "    return D\n")
        return "def e(accum, C, bias, rowv, alpha):\n" + body, bool(reduce)
    return case()


def test_a_k_split_allowed_is_the_sum_of_its_parts():
    """Drawn epilogues linear in the accumulator and the operands added to it (sums,
    products and quotients by constants, negations, multiply_add, over a full, a per-column
    and a per-row operand, a scalar and literals), a fifth of their turns nonlinear (relu, a
    product of two, a literal added, a maximum), a row's sum or max beside: wherever the
    rules allow K to split, the epilogue of two partial accumulators,
    the summands' parts given to the first and zeros to the second, adds up to the
    epilogue of the whole (the reference evaluator, float64); and where they refuse it the
    reason names a line."""
    from hypothesis import given

    from epilogue_fuzz import drawn
    from evtfuse import reference
    from evtfuse.frontend import bind

    F64 = torch.float64
    shapes = {"C": (M, N), "bias": (N,), "rowv": (M, 1)}

    @drawn(200, 5150)
    @given(_k_split_case())
    def check(case):
        src, reduced = case
        outputs = {"D": ((M, N), F64), **({"r": ((M, 1), F64)} if reduced else {})}
        operands = {**{k: (v, F64) for k, v in shapes.items()}, "alpha": 0.75}
        r = sharding.rules_of(parse_epilogue(src), (M, K), (K, N), F64, operands, outputs)
        if INNER in r.refused:
            assert "line " in r.refused[INNER] or "does not depend" in r.refused[INNER], \
                r.refused[INNER]
            return
        g = torch.Generator().manual_seed(len(src))
        vals = {k: torch.randn(v, generator=g, dtype=F64) for k, v in shapes.items()}
        vals["alpha"] = 0.75
        outs = {k: torch.empty(v[0], dtype=F64) for k, v in outputs.items()}
        dag = bind(parse_epilogue(src), {**vals, **outs}, (1, M, N))
        a1, a2 = (torch.randn(M, N, generator=g, dtype=F64) for _ in range(2))
        whole = reference.evaluate(dag, a1 + a2, vals, compute_dtype=F64, cast=False)
        first = reference.evaluate(dag, a1, vals, compute_dtype=F64, cast=False)
        zeros = {k: (torch.zeros_like(v) if k in r.summands else v) for k, v in vals.items()}
        second = reference.evaluate(dag, a2, zeros, compute_dtype=F64, cast=False)
        for name in outputs:
            torch.testing.assert_close(first[name] + second[name], whole[name],
                                       rtol=1e-9, atol=1e-9, msg=lambda m: f"{src}\n{m}")

    check()
