"""The IR: printers (format_dag, format_evt), the verifier, and space/batch/dtype inference."""

from __future__ import annotations

import re

import pytest
import torch

from evtfuse import EpilogueArguments
from evtfuse.ir import (Dag, IRError, Node, NodeKind, OperandKind, OperandSpec, Output,
                        OutputKind, Space, accum_node, compute_node, const_node, format_dag,
                        format_evt, index_node, load_node, reduce_node, verify, with_inputs)

L, M, N = 3, 5, 7


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _empty(*shape):
    return torch.full(shape, float("nan"))


def _dag(src, **values):
    return EpilogueArguments(src, **values).dag


# ------------------------------------------------------------------ the notebook examples

FIGURE = "def epi(accum, alpha, beta, C): D = (accum * alpha) + (beta * C); return D"

MY_EPILOGUE = """
def my_epilogue(accum, C, alpha, beta, extra_scalar):
    Aux = (alpha * accum) + (beta * C)
    D = extra_scalar * Aux
    return D, Aux
"""

RELU_AUX_STORE = """
def relu_aux_store(accum, alpha, C):
  F = (accum * alpha) + (C * 2.0) # Constant beta
  D = relu(F)
  return D, F
"""

RELU_SCALE_RETURN_ACC = """
def relu_scale_return_acc(accum, alpha, beta, C, scale):
  F = relu((accum * alpha) + (C * beta))
  D = F * scale
  return D, F, accum
"""

BCE = """
def bce(accum, bias, C):
    f = accum + bias
    t = (1 - C) * (-f) + log(clamp(sigmoid(f), 1e-3, 0.999))
    loss = sum(t)
    D = f
    return D, loss
"""


def test_evt_plain_tree_for_the_figure():
    dag = _dag(FIGURE, alpha=1.0, beta=2.0, C=_randn(M, N), D=_empty(M, N))
    assert format_evt(dag) == "\n".join([
        "Sm90EVT<Sm90AuxStore<D>>",
        "  Sm90Compute<plus>",
        "    Sm90Compute<multiplies>",
        "      Sm90AccFetch",
        "      Sm90ScalarBroadcast<alpha>",
        "    Sm90Compute<multiplies>",
        "      Sm90ScalarBroadcast<beta>",
        "      Sm90AuxLoad<C>",
    ])


def test_evt_topological_visitor_for_my_epilogue():
    dag = _dag(MY_EPILOGUE, C=_randn(M, N), alpha=1.0, beta=2.0, extra_scalar=0.5,
               D=_empty(M, N), Aux=_empty(M, N))
    assert format_evt(dag) == "\n".join([
        "Sm90TopologicalVisitor: values computed once and shared",
        "  node 0:",
        "    Sm90Compute<plus>",
        "      Sm90Compute<multiplies>",
        "        Sm90ScalarBroadcast<alpha>",
        "        Sm90AccFetch",
        "      Sm90Compute<multiplies>",
        "        Sm90ScalarBroadcast<beta>",
        "        Sm90AuxLoad<C>",
        "Sm90EVT<Sm90AuxStore<D>>",
        "  Sm90Compute<multiplies>",
        "    Sm90ScalarBroadcast<extra_scalar>",
        "    -> node 0",
        "Sm90EVT<Sm90AuxStore<Aux>>",
        "  -> node 0",
    ])


def test_evt_relu_aux_store_constant_and_shared_F():
    dag = _dag(RELU_AUX_STORE, alpha=3.0, C=_randn(M, N), D=_empty(M, N), F=_empty(M, N))
    text = format_evt(dag)
    assert text.startswith("Sm90TopologicalVisitor")
    assert "Sm90ScalarBroadcast<2.0>" in text
    assert text.count("Sm90AccFetch") == 1  # F is computed once
    assert text.endswith("Sm90EVT<Sm90AuxStore<D>>\n  Sm90Compute<ReLu>\n    -> node 0\n"
                         "Sm90EVT<Sm90AuxStore<F>>\n  -> node 0")


def test_evt_returning_accum():
    dag = _dag(RELU_SCALE_RETURN_ACC, alpha=1.0, beta=2.0, C=_randn(M, N), scale=0.5,
               D=_empty(M, N), F=_empty(M, N), accum=_empty(M, N))
    text = format_evt(dag)
    lines = text.splitlines()
    assert lines[:3] == ["Sm90TopologicalVisitor: values computed once and shared", "  node 0:",
                         "    Sm90Compute<ReLu>"]
    assert lines[-2:] == ["Sm90EVT<Sm90AuxStore<accum>>", "  Sm90AccFetch"]
    assert "node 1" not in text  # accum is fetched, not shared


def test_evt_bce_scalar_reduction():
    dag = _dag(BCE, bias=_randn(M, 1), C=_randn(M, N), D=_empty(M, N), loss=_empty(1))
    lines = format_evt(dag).splitlines()
    assert lines[:5] == ["Sm90TopologicalVisitor: values computed once and shared",
                         "  node 0:", "    Sm90Compute<plus>", "      Sm90AccFetch",
                         "      Sm90ColBroadcast<bias>"]
    k = lines.index("Sm90EVT<Sm90ScalarReduction<plus, loss>>")
    assert lines[5:k] == ["Sm90EVT<Sm90AuxStore<D>>", "  -> node 0"]
    # the reduction is the store; its input t is a tree over the shared f
    assert lines[k + 1:] == [
        "  Sm90Compute<plus>",
        "    Sm90Compute<multiplies>",
        "      Sm90Compute<minus>",
        "        Sm90ScalarBroadcast<1.0>",
        "        Sm90AuxLoad<C>",
        "      Sm90Compute<negate>",
        "        -> node 0",
        "    Sm90Compute<log>",
        "      Sm90Compute<Clamp>",
        "        Sm90Compute<Sigmoid>",
        "          -> node 0",
        "        Sm90ScalarBroadcast<0.001>",
        "        Sm90ScalarBroadcast<0.999>",
    ]


def test_evt_broadcasts_indices_reductions_and_unstored():
    src = """
def e(accum, r, c, s, X):
    v = accum * r + c * s + X + row_index() - col_index()
    D = v
    m = max(v)
    n = min(v)
    u = relu(v)
    return D, m, n, u
"""
    dag = _dag(src, r=_randn(M, 1), c=_randn(N), s=torch.tensor(2.0), X=_randn(M, N),
               D=_empty(M, N), m=_empty(M, 1), n=_empty(1, N), u=None)
    text = format_evt(dag)
    for piece in ["Sm90ColBroadcast<r>", "Sm90RowBroadcast<c>", "Sm90ScalarBroadcast<s>",
                  "Sm90AuxLoad<X>", "Sm90RowIndex", "Sm90ColIndex",
                  "Sm90EVT<Sm90ColReduction<maximum, m>>", "Sm90EVT<Sm90RowReduction<minimum, n>>",
                  "Sm90EVT<(unstored u)>"]:
        assert piece in text, piece
    assert text.startswith("Sm90TopologicalVisitor")  # v feeds D, m, n and u


def test_evt_value_used_twice_by_one_consumer():
    dag = _dag("def e(accum):\n    a = exp(accum)\n    D = a * a\n    return D", D=_empty(M, N))
    assert format_evt(dag).splitlines()[-3:] == ["  Sm90Compute<multiplies>", "    -> node 0",
                                                 "    -> node 0"]
    # the accumulator read by two computations is one shared fetch
    dag = _dag("def e(accum):\n    D = exp(accum) * accum\n    return D", D=_empty(M, N))
    assert format_evt(dag).splitlines()[:3] == [
        "Sm90TopologicalVisitor: values computed once and shared", "  node 0:", "    Sm90AccFetch"]
    # without sharing there is no topological visitor (an operand read twice is just loaded)
    dag = _dag("def e(accum, C):\n    D = exp(accum) * C + C\n    return D", C=_randn(M, N),
               D=_empty(M, N))
    assert "Topological" not in format_evt(dag)
    assert format_evt(dag).count("Sm90AuxLoad<C>") == 2


# ------------------------------------------------------------------ format_dag

_LINE = re.compile(r"^  %(\d+) = (.*?) : (\w+) (scalar|row|col|full)( batched)?( \[\w+\])?(  # line \d+)?$")


def _parse_dag_text(text):
    rows, stores = [], []
    lines = text.splitlines()
    for line in lines[1:]:
        if line.startswith("  store "):
            stores.append(line)
            continue
        m = _LINE.match(line)
        assert m, line
        rows.append(m)
    return lines[0], rows, stores


def test_format_dag_my_epilogue():
    dag = _dag(MY_EPILOGUE, C=_randn(L, M, N), alpha=1.0, beta=2.0, extra_scalar=0.5,
               D=_empty(L, M, N), Aux=_empty(L, M, N))
    text = format_dag(dag)
    assert str(dag) == text
    head, rows, stores = _parse_dag_text(text)
    assert head == "dag my_epilogue(C, alpha, beta, extra_scalar)"
    assert len(rows) == len(dag.nodes)
    for k, (m, node) in enumerate(zip(rows, dag.nodes)):
        assert int(m.group(1)) == k
        label = m.group(2)
        if node.kind is NodeKind.COMPUTE:
            # inputs are printed by their number, and were printed before
            refs = [int(x) for x in re.findall(r"%(\d+)", label)]
            assert refs == [dag.nodes.index(i) for i in node.inputs]
            assert all(r < k for r in refs)
            assert label.startswith(f"{node.op}(")
        assert m.group(4) == node.space.name.lower()
        assert bool(m.group(5)) == node.batched
    assert "load C : full tensor f32 per batch" in text
    assert "load alpha : runtime scalar" in text
    # user variables and their source lines (line 3: Aux, line 4: D of the string)
    aux = [m for m in rows if m.group(6) == " [Aux]"]
    d = [m for m in rows if m.group(6) == " [D]"]
    assert len(aux) == 1 and aux[0].group(7) == "  # line 3" and aux[0].group(2).startswith("add(")
    assert len(d) == 1 and d[0].group(7) == "  # line 4" and d[0].group(2).startswith("mul(")
    assert stores == [f"  store D <- %{dag.nodes.index(dag.output('D').node)} : aux store, f32 per batch",
                      f"  store Aux <- %{dag.nodes.index(dag.output('Aux').node)} : aux store, f32 per batch"]


def test_format_dag_kinds_constants_reductions():
    src = """
def e(accum, r, h):
    t = accum * r + 2.5
    c = t > h
    s = sum(t)
    D = where(c, t, h)
    return D, s
"""
    dag = _dag(src, r=_randn(L, M, 1), h=torch.tensor(0.5, dtype=torch.float16),
               D=_empty(L, M, N).half(), s=_empty(M, 1))
    text = format_dag(dag)
    assert "load r : per-row vector f32 per batch : f32 row batched" in text
    assert "load h : device scalar f16 : f32 scalar" in text
    assert "const 2.5 : f32 scalar" in text
    assert re.search(r"gt\(%\d+, %\d+\) : bool full batched \[c\]  # line 4", text)
    assert re.search(r"sum\(%\d+\) : f32 row \[s\]  # line 5", text)
    assert text.splitlines()[-2:] == [
        f"  store D <- %{len(dag.nodes) - 2} : aux store, f16 per batch",
        f"  store s <- %{len(dag.nodes) - 1} : per-row reduction, f32"]


# ------------------------------------------------------------------ Dag accessors

def test_dag_nodes_users_loads():
    src = "def e(accum, a, b, unused):\n    t = accum * a\n    D = t + t * b\n    return D"
    dag = _dag(src, a=1.0, b=_randn(N), unused=3.0, D=_empty(M, N))
    pos = {id(n): k for k, n in enumerate(dag.nodes)}
    for n in dag.nodes:
        assert all(pos[id(i)] < pos[id(n)] for i in n.inputs)
    assert [o.name for o in dag.operands] == ["a", "b", "unused"]
    assert [o.name for o in dag.used_operands] == ["a", "b"]
    assert sorted(n.operand.name for n in dag.loads) == ["a", "b"]
    t = next(n for n in dag.nodes if n.var == "t")
    assert len(dag.users[id(t)]) == 2
    assert dag.reductions == ()
    with pytest.raises(KeyError):
        dag.output("nope")


# ------------------------------------------------------------------ inference

def _spec(name, kind, batched=False):
    return OperandSpec(name, kind, None if kind is OperandKind.RUNTIME_SCALAR else torch.float32,
                       batched)


SCALAR = load_node(_spec("s", OperandKind.RUNTIME_SCALAR))
ROWV = load_node(_spec("r", OperandKind.PER_ROW))
COLV = load_node(_spec("c", OperandKind.PER_COL))
FULLV = load_node(_spec("X", OperandKind.FULL))
ROWB = load_node(_spec("rb", OperandKind.PER_ROW, batched=True))


@pytest.mark.parametrize("a,b,space", [
    (SCALAR, SCALAR, Space.SCALAR), (SCALAR, ROWV, Space.ROW), (ROWV, SCALAR, Space.ROW),
    (SCALAR, COLV, Space.COL), (ROWV, ROWV, Space.ROW), (COLV, COLV, Space.COL),
    (ROWV, COLV, Space.FULL), (COLV, ROWV, Space.FULL), (FULLV, SCALAR, Space.FULL),
    (ROWV, FULLV, Space.FULL),
])
def test_space_join(a, b, space):
    assert a.space.join(b.space) is space
    for op in ("add", "mul", "maximum"):
        assert compute_node(op, (a, b)).space is space


def test_batch_and_dtype_inference():
    assert compute_node("add", (ROWV, COLV)).batched is False
    assert compute_node("add", (ROWB, COLV)).batched is True
    assert compute_node("relu", (ROWB,)).batched is True
    assert accum_node().batched is True and accum_node().space is Space.FULL
    assert const_node(2).value == 2.0 and const_node(2).space is Space.SCALAR
    assert index_node("row").space is Space.ROW and index_node("col").space is Space.COL
    for op in ("lt", "le", "gt", "ge", "eq", "ne"):
        n = compute_node(op, (ROWV, SCALAR))
        assert n.dtype is torch.bool and n.space is Space.ROW
    cond = compute_node("gt", (ROWV, COLV))
    sel = compute_node("where", (cond, SCALAR, ROWB))
    assert sel.dtype is torch.float32 and sel.space is Space.FULL and sel.batched
    assert compute_node("sigmoid", (SCALAR,)).dtype is torch.float32
    # with_inputs re-infers
    n = compute_node("add", (SCALAR, SCALAR))
    m = with_inputs(n, (ROWB, COLV))
    assert (m.space, m.batched, m.op) == (Space.FULL, True, "add")
    assert n.space is Space.SCALAR and not n.batched  # the old node is untouched


def test_operand_and_output_kind_spaces():
    assert OperandKind.RUNTIME_SCALAR.space is Space.SCALAR
    assert OperandKind.DEVICE_SCALAR.space is Space.SCALAR
    assert OperandKind.PER_ROW.space is Space.ROW
    assert OperandKind.PER_COL.space is Space.COL
    assert OperandKind.FULL.space is Space.FULL
    assert OutputKind.ROW.space is Space.ROW and OutputKind.COL.space is Space.COL
    assert OutputKind.SCALAR.space is Space.SCALAR and OutputKind.FULL.space is Space.FULL


def test_inference_through_the_frontend():
    src = """
def e(accum, r, c, s):
    rc = r + c
    rs = r * s
    cmp = c > s
    D = accum + rc
    return D
"""
    P = EpilogueArguments(src, r=_randn(L, M, 1), c=_randn(N), s=2.0, D=_empty(L, M, N))
    # rc, rs, cmp are not all reachable from D: only what D needs is in the DAG
    names = {n.var: n for n in P.dag.nodes if n.var}
    assert names["rc"].space is Space.FULL and names["rc"].batched
    assert "rs" not in names and "cmp" not in names
    src2 = "def e(accum, r, s):\n    D = accum\n    k = r * s\n    q = r > s\n    return D, k, q"
    dag = _dag(src2, r=_randn(M, 1), s=2.0, D=_empty(M, N), k=None, q=None)
    k, q = dag.output("k").node, dag.output("q").node
    assert (k.space, k.batched, k.dtype) == (Space.ROW, False, torch.float32)
    assert (q.space, q.dtype) == (Space.ROW, torch.bool)


# ------------------------------------------------------------------ verify

def _good_dag():
    acc = accum_node()
    x = load_node(_spec("x", OperandKind.PER_ROW))
    t = compute_node("add", (acc, x), var="t")
    red = reduce_node("sum", t, Space.ROW, keep_batch=False, var="s")
    return Dag((Output("D", t, OutputKind.FULL, torch.float32),
                Output("s", red, OutputKind.ROW, torch.float32)), (x.operand,)), acc, x, t, red


def test_verify_accepts_frontend_dags():
    verify(_good_dag()[0])
    for src, kw in [(MY_EPILOGUE, dict(C=_randn(M, N), alpha=1.0, beta=2.0, extra_scalar=0.5,
                                       D=_empty(M, N), Aux=_empty(M, N))),
                    (BCE, dict(bias=_randn(N), C=_randn(M, N), D=_empty(M, N), loss=_empty(1)))]:
        verify(_dag(src, **kw))


def test_verify_reduce_used_by_compute():
    dag, acc, x, t, red = _good_dag()
    bad = compute_node("mul", (red, acc))
    broken = Dag((Output("D", bad, OutputKind.FULL, torch.float32),
                  Output("s", red, OutputKind.ROW, torch.float32)), dag.operands)
    verify(broken)  # a reduction's result feeds computation (issue 35)
    # ... but not a second reduction
    again = reduce_node("sum", bad, Space.ROW, True)
    broken = Dag((Output("D", bad, OutputKind.FULL, torch.float32),
                  Output("r", again, OutputKind.ROW, torch.float32)), dag.operands)
    with pytest.raises(IRError, match="reduction of a value computed from a reduction"):
        verify(broken)
    # reduction of a reduction
    red2 = reduce_node("max", red, Space.SCALAR, keep_batch=False)
    broken = Dag((Output("D", t, OutputKind.FULL, torch.float32),
                  Output("s", red, OutputKind.ROW, torch.float32),
                  Output("z", red2, OutputKind.SCALAR, torch.float32)), dag.operands)
    with pytest.raises(IRError):
        verify(broken)


def test_verify_stale_inference():
    dag, acc, x, t, red = _good_dag()
    stale_dtype = Node(NodeKind.COMPUTE, (acc, x), "lt", space=Space.FULL, batched=True,
                       dtype=torch.float32)
    with pytest.raises(IRError, match="stale"):
        verify(Dag((Output("D", stale_dtype, OutputKind.FULL, torch.float32),), dag.operands))
    stale_space = Node(NodeKind.COMPUTE, (acc, x), "add", space=Space.ROW, batched=True)
    with pytest.raises(IRError, match="stale"):
        verify(Dag((Output("D", stale_space, OutputKind.FULL, torch.float32),), dag.operands))
    stale_batch = Node(NodeKind.COMPUTE, (x, x), "add", space=Space.ROW, batched=True)
    with pytest.raises(IRError, match="stale"):
        verify(Dag((Output("D", stale_batch, OutputKind.FULL, torch.float32),), dag.operands))


def test_verify_other_invariants():
    dag, acc, x, t, red = _good_dag()
    ops_ = dag.operands
    wrong_arity = Node(NodeKind.COMPUTE, (acc,), "add", space=Space.FULL, batched=True)
    with pytest.raises(IRError, match="takes 2 inputs"):
        verify(Dag((Output("D", wrong_arity, OutputKind.FULL, torch.float32),), ops_))
    reduce_as_compute = Node(NodeKind.COMPUTE, (acc,), "sum", space=Space.FULL, batched=True)
    with pytest.raises(IRError, match="compute node with op 'sum'"):
        verify(Dag((Output("D", reduce_as_compute, OutputKind.FULL, torch.float32),), ops_))
    compute_as_reduce = Node(NodeKind.REDUCE, (acc,), "add", space=Space.ROW)
    with pytest.raises(IRError, match="bad reduce node"):
        verify(Dag((Output("D", compute_as_reduce, OutputKind.ROW, torch.float32),), ops_))
    with pytest.raises(IRError, match="undeclared operand x"):
        verify(Dag((Output("D", t, OutputKind.FULL, torch.float32),), ()))
    with pytest.raises(IRError, match="duplicate output names"):
        verify(Dag((Output("D", t, OutputKind.FULL, torch.float32),
                    Output("D", acc, OutputKind.FULL, torch.float32)), ops_))
    no_value = Node(NodeKind.CONST, space=Space.SCALAR)
    with pytest.raises(IRError, match="constant without a value"):
        verify(Dag((Output("D", compute_node("add", (acc, no_value)), OutputKind.FULL,
                           torch.float32),), ops_))


def test_nodes_are_immutable():
    n = compute_node("add", (SCALAR, ROWV))
    with pytest.raises(Exception):
        n.op = "mul"  # type: ignore[misc]
    assert compute_node("add", (SCALAR, ROWV)) != n  # compared by identity
