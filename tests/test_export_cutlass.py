"""CPU tier of ``evtfuse.export.cutlass`` (issue 53): the headers of the reference epilogues
(tests/export_cases.py) against their golden files, their structure, what they compute
and the refusals. No compiler is involved here: tests/gpu/test_gpu_export_cutlass.py
compiles the same headers with nvcc and runs them against evtfuse.gemm.

- golden: each header equals tests/golden/export/<case>.hpp byte for byte. After an
  intended change, ``EVTFUSE_REGEN_GOLDEN=1`` rewrites the files (and fails, so that a
  regenerating run never passes by itself); review the diff and commit it.
- structure: the ``using EVT = ...;`` text is parsed back (a small template parser) and
  must name, node for node, the plan's node ops; the ``Arguments`` initialiser is parsed
  back (braces) and must mirror the tree (a tree visitor: its children, then its op; a
  topological visitor: its ops in order), leaf for leaf.
- meaning: the plan is interpreted with torch (each node op as CUTLASS visits it: stores
  pass their input through, a topological visitor feeds each op the values its edge
  sequence names) and every output compared with ``evtfuse.reference`` on the same
  inputs: a tree that drops, reorders or mis-wires a node fails here.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from evtfuse import ir
from evtfuse.cli import EXIT_INPUT, EXIT_UNSUPPORTED, app
from evtfuse.export import ExportError, cutlass, walk
from evtfuse.export.cutlass_tree import Leaf, Topo, Tree
from evtfuse.optable import OPS
from evtfuse.reference import evaluate, torch_apply
from export_cases import CASES

GOLDEN = Path(__file__).parent / "golden" / "export"


def export(case: str):
    src, operands, outputs = CASES[case]
    return cutlass(src, operands=operands, outputs=outputs)


# ------------------------------------------------------------------ golden files

@pytest.mark.parametrize("case", sorted(CASES))
def test_header_matches_golden(case):
    text = export(case).header
    path = GOLDEN / f"{case}.hpp"
    if os.environ.get("EVTFUSE_REGEN_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        pytest.fail(f"regenerated {path}; review the diff, then run without EVTFUSE_REGEN_GOLDEN")
    assert path.exists(), f"{path} is missing (EVTFUSE_REGEN_GOLDEN=1 writes it)"
    assert text == path.read_text(), (
        f"the header of {case} differs from {path}; if intended, regenerate with "
        "EVTFUSE_REGEN_GOLDEN=1 and review the diff")


def test_every_golden_file_has_a_case():
    assert sorted(p.stem for p in GOLDEN.glob("*.hpp")) == sorted(CASES)


# ------------------------------------------------------------------ parsing the C++ back

def _strip_comments(text: str) -> str:
    return re.sub(r"//[^\n]*", "", text)


def _tokens(text: str) -> list[str]:
    return re.findall(r"[A-Za-z_][A-Za-z0-9_:]*(?:::[A-Za-z_][A-Za-z0-9_]*)*|\d+|[<>,]", text)


def parse_type(text: str):
    """A C++ template type as (name, [arguments]) (arguments None when it has none)."""
    toks = _tokens(text)
    pos = 0

    def one():
        nonlocal pos
        name = toks[pos]
        pos += 1
        if pos < len(toks) and toks[pos] == "<":
            pos += 1
            args = []
            while toks[pos] != ">":
                args.append(one())
                if toks[pos] == ",":
                    pos += 1
            pos += 1
            return name, args
        return name, None

    t = one()
    assert pos == len(toks), f"trailing tokens {toks[pos:]}"
    return t


def evt_text(header: str) -> str:
    body = _strip_comments(header)
    m = re.search(r"using EVT = (.*?);", body, re.S)
    assert m, "no `using EVT = ...;` in the header"
    return m.group(1)


def leaf_head(leaf: Leaf):
    return parse_type(leaf.alias or leaf.cpp)


def check_type(parsed, v) -> None:
    """``parsed`` (from the text) names what ``v`` (the plan) holds, node op for node op."""
    name, args = parsed
    if isinstance(v, Tree):
        assert name == "cutlass::epilogue::fusion::Sm90EVT", name
        assert len(args) == 1 + len(v.children)
        assert args[0] == leaf_head(v.op)
        for a, c in zip(args[1:], v.children):
            check_type(a, c)
    elif isinstance(v, Topo):
        assert name == "cutlass::epilogue::fusion::Sm90TopologicalVisitor", name
        assert args[0] == ("float", None)
        edges_name, seqs = args[1]
        assert edges_name == "cute::tuple" and len(seqs) == len(v.ops) == len(args) - 2
        for (seq_name, ints), e in zip(seqs, v.edges):
            assert seq_name == "cute::seq"
            assert tuple(int(i[0]) for i in ints or ()) == e
        for a, o in zip(args[2:], v.ops):
            check_type(a, o)
    else:
        assert parsed == leaf_head(v)


def parse_braces(text: str):
    """A brace initialiser as nested lists; the text between braces (a leaf's own
    initialiser, e.g. ``{bias, float(0), {}}``) is kept whole as a string."""
    pos = 0

    def item():
        nonlocal pos
        start = pos
        depth = 0
        while True:
            ch = text[pos]
            if ch == "{":
                depth += 1
            elif ch == "}":
                if depth == 0:
                    break
                depth -= 1
            elif ch == "," and depth == 0:
                break
            pos += 1
        return text[start:pos].strip()

    def group():
        nonlocal pos
        assert text[pos] == "{"
        pos += 1
        items = []
        while True:
            while text[pos].isspace():
                pos += 1
            if text[pos] == "}":
                pos += 1
                return items
            items.append(item())
            if text[pos] == ",":
                pos += 1

    return group()


def arguments_text(header: str) -> str:
    body = _strip_comments(header)
    m = re.search(r"typename EVT::Arguments fusion =\s*(\{.*?\});\n", body, re.S)
    assert m, "no fusion arguments in the header"
    return m.group(1)


def _norm(s: str) -> str:
    return re.sub(r"\s+", "", s)


def check_args(text: str, v) -> None:
    """``text`` (one initialiser) mirrors ``v``: CUTLASS reads a tree visitor's Arguments as
    its children's, then its op's; a topological visitor's as its ops' in order."""
    if isinstance(v, Leaf):
        assert _norm(text) == _norm(v.args), (text, v.args, v.role)
        return
    items = parse_braces(text)
    expect = [*v.children, v.op] if isinstance(v, Tree) else v.ops
    assert len(items) == len(expect), (text, [type(e).__name__ for e in expect])
    for t, e in zip(items, expect):
        check_args(t, e)


@pytest.mark.parametrize("case", sorted(CASES))
def test_type_tree_parses_as_the_plan(case):
    e = export(case)
    check_type(parse_type(evt_text(e.header)), e.plan.root)


@pytest.mark.parametrize("case", sorted(CASES))
def test_arguments_mirror_the_tree(case):
    e = export(case)
    check_args(arguments_text(e.header), e.plan.root)


def test_parsers_catch_a_reordered_tree():
    """The structural checks fail on a header whose tree or arguments are out of order."""
    e = export("relu_aux")
    swapped = e.header.replace("{{alpha}},  // ScalarBroadcast(alpha)\n            {},",
                               "{},\n            {{alpha}},")
    assert swapped != e.header
    with pytest.raises(AssertionError):
        check_args(arguments_text(swapped), e.plan.root)
    text = evt_text(e.header).replace("Sm90AccFetch", "Sm90SrcFetch<cutlass::half_t>", 1)
    with pytest.raises(AssertionError):
        check_type(parse_type(text), e.plan.root)


# ------------------------------------------------------------------ what the tree computes

M, N = 24, 40


def _values(e):
    g = torch.Generator().manual_seed(7)
    values = {}
    for name, kind, dtype in e.description.operands:
        if kind == "runtime":
            values[name] = 0.75
            continue
        shape = {"full": (M, N), "row": (M, 1), "col": (N,), "scalar": ()}[kind]
        values[name] = torch.randn(shape, generator=g).to(dtype)
    return values, torch.randn(M, N, generator=g)


def simulate(e, values, acc):
    """Every stored output as the plan's tree computes it (fp32), CUTLASS's visit order."""
    results = {}

    def operand(name):
        v = values[name]
        return torch.tensor(float(v)) if not isinstance(v, torch.Tensor) else \
            v.float().reshape((1, N) if v.dim() == 1 else v.shape)

    def visit(v, inputs=()):
        if isinstance(v, Tree):
            return visit(v.op, [visit(c) for c in v.children])
        if isinstance(v, Topo):
            done = []
            for op, edge in zip(v.ops, v.edges):
                assert all(i < len(done) for i in edge), "an edge to a later op"
                done.append(visit(op, [done[i] for i in edge]))
            return done[-1]
        src = v.source
        if isinstance(src, ir.Output):  # a store passes its input through
            x = inputs[0].expand(M, N)
            if src.kind is ir.OutputKind.FULL:
                results[src.name] = x
            else:
                dims = {ir.OutputKind.ROW: [1], ir.OutputKind.COL: [0],
                        ir.OutputKind.SCALAR: [0, 1]}[src.kind]
                results[src.name] = OPS[src.node.op].torch_fn(x, dims)
            return inputs[0]
        if v.role == "Compute(identity)" and src is None:
            return inputs[0]
        if src.kind is ir.NodeKind.COMPUTE:
            row = OPS[src.op]
            ins = list(inputs)
            if row.category.name == "SELECT":
                ins[0] = ins[0] != 0
            out = torch_apply(row, ins, src.param_dict)
            return out.float()
        if src.kind is ir.NodeKind.ACCUM:
            return acc
        if src.kind is ir.NodeKind.CONST:
            return torch.tensor(src.value)
        return operand(src.operand.name)

    results[e.plan.d_output.name] = visit(e.plan.root).expand(M, N)
    return results


@pytest.mark.parametrize("case", sorted(CASES))
def test_tree_computes_what_the_dag_computes(case):
    e = export(case)
    values, acc = _values(e)
    got = simulate(e, values, acc)
    want = evaluate(e.dag, acc.reshape(1, M, N), values, cast=False)
    stored = [o.name for o in e.dag.outputs if o.kind is not ir.OutputKind.NONE]
    assert sorted(got) == sorted(stored)
    for name in stored:
        torch.testing.assert_close(got[name].reshape(want[name].shape).float(),
                                   want[name].float(), rtol=1e-5, atol=1e-5, msg=name)


def test_the_simulation_catches_a_wrong_edge():
    e = export("shared")
    topo = e.plan.root
    assert isinstance(topo, Topo)
    values, acc = _values(e)
    good = simulate(e, values, acc)["D"]
    k = next(i for i, edge in enumerate(topo.edges) if len(edge) == 2)
    topo.edges[k] = topo.edges[k][::-1] if topo.edges[k][0] != topo.edges[k][1] else topo.edges[k]
    topo.edges[-1] = (topo.edges[-1][0], topo.edges[-1][0])  # relu(x) * relu(x)
    assert not torch.allclose(simulate(e, values, acc)["D"], good)


# ------------------------------------------------------------------ the shape of the trees

def test_a_shared_value_makes_a_topological_visitor():
    e = export("shared")
    topo = e.plan.root
    assert isinstance(topo, Topo)
    # x = accum * scale + C is computed once, as one closed Sm90EVT op fed no edges,
    # and read by relu and sigmoid; the last op (D) reads both
    assert isinstance(topo.ops[0], Tree) and topo.edges[0] == ()
    assert [o.role for o in topo.ops[1:]] == ["Compute(relu)", "Compute(sigmoid)", "Compute(mul)"]
    assert topo.edges[1:] == [(0,), (0,), (1, 2)]
    assert "Sm90TopologicalVisitor" in e.header and "cute::seq<1, 2>" in e.header


def test_trees_where_nothing_is_shared():
    for case in ("alpha_beta", "relu_aux", "bias_gelu", "reductions"):
        assert isinstance(export(case).plan.root, Tree), case
        assert "Sm90TopologicalVisitor" not in export(case).header


def test_cutlass_naming_of_vectors():
    """A per-row (M, 1) vector is CUTLASS's column broadcast/reduction, a per-column (N,)
    one its row broadcast/reduction."""
    roles = [leaf.role for leaf in walk(export("reductions").plan.root)]
    assert "ColReduction(max, row_max)" in roles and "RowReduction(sum, col_sum)" in roles
    assert "ScalarReduction(sum, total)" in roles and "RowBroadcast(bias)" in roles
    assert "ColBroadcast(scale)" in [leaf.role for leaf in walk(export("shared").plan.root)]


def test_emitted_functors_and_their_arguments():
    h = export("functors").header
    for fn in ("EvtfuseSoftplus", "EvtfuseGreater", "EvtfuseWhere", "EvtfuseExp", "EvtfuseAbs"):
        assert f"struct {fn} {{" in h and f"struct {fn}<cutlass::Array<T, N>> {{" in h
    assert "struct Arguments { float beta = 1.0f; float threshold = 20.0f; };" in h
    args = _norm(arguments_text(h))
    assert "{2.0f,20.0f}" in args  # softplus(beta=2.0): the op's Arguments, in the tree's
    assert "{0.2f}" in args  # leaky_relu(slope=0.2): LeakyReLU's leaky_alpha
    assert "cutlass::epilogue::thread::LeakyReLU" in h
    assert "Sm90AuxLoad" in h  # aux, read twice, shared through the topological visitor


def test_host_function_signature_follows_the_epilogue():
    e = export("relu_aux")
    assert e.parameters == (("C", "cutlass::half_t const*"), ("alpha", "float"),
                            ("beta", "float"), ("F", "cutlass::half_t*"),
                            ("D", "cutlass::half_t*"))
    assert ("inline cutlass::Status run(int M, int N, int K, ElementA const* A, ElementB const* "
            "B, cutlass::half_t const* C, float alpha, float beta, cutlass::half_t* F, "
            "ElementD* D, cudaStream_t stream = nullptr)") in e.header
    entry = e.c_entry("relu_aux.hpp")
    assert '#include "relu_aux.hpp"' in entry
    assert 'extern "C" int evtfuse_relu_aux_run(int M, int N, int K, void const* A' in entry


def test_dtypes_tile_and_layouts():
    src = CASES["alpha_beta"][0]
    h = cutlass(src, ab_dtype="bf16", d_dtype="f32", tile=(256, 128, 64), cluster=(2, 1, 1),
                b_major="k", name="ab_bf16").header
    assert "using ElementA = cutlass::bfloat16_t;" in h and "using ElementD = float;" in h
    assert "using ElementC = cutlass::bfloat16_t;" in h
    assert "cute::Shape<cute::_256, cute::_128, cute::_64>" in h
    assert "using ClusterShape = cute::Shape<cute::_2, cute::_1, cute::_1>;" in h
    assert "using LayoutB = cutlass::layout::ColumnMajor;" in h
    assert "namespace ab_bf16 {" in h


def test_no_c_operand_means_void_c():
    h = export("bias_gelu").header
    assert "using ElementC = void;" in h and "{fusion, nullptr, stride_C, D, stride_D}" in h


# ------------------------------------------------------------------ refusals

REFUSED = [
    ("def e(accum):\n    D = softmax(accum)\n    return D", None,
     "line 2 of e: cannot export to CUTLASS: the result of max() feeds computation"),
    ("def e(accum, C):\n    D = store_where(C > 0.0, accum)\n    return D", None,
     "line 2 of e: cannot export to CUTLASS: a conditional store (store_where)"),
    ("def e(accum):\n    gate, up = pairs(accum)\n    D = silu(gate) * up\n    return D", None,
     "line 2 of e: cannot export to CUTLASS: a gated pair (pairs(accum))"),
    ("def e(accum):\n    D = accum + col_index()\n    return D", None,
     "line 2 of e: cannot export to CUTLASS: col_index() has no Sm90 EVT node"),
    ("def e(accum):\n    D = accum\n    s = logsumexp(accum)\n    return D, s", {"s": "row"},
     "line 3 of e: cannot export to CUTLASS: a logsumexp reduction has no CUTLASS reduction"),
    ("def e(accum):\n    D = accum\n    s = min(accum)\n    return D, s", {"s": "scalar"},
     "cannot export to CUTLASS: output s is min() over the whole output"),
    ("def e(accum, bias):\n    D = accum\n    v = bias * 2.0\n    return D, v", {"v": "col"},
     "cannot export to CUTLASS: output v is a vector or scalar that is not a reduction"),
    ("def e(accum, C):\n    D = cast(accum, \"fp8\") + C\n    return D", None,
     "line 2 of e: cannot export to CUTLASS: cast to fp8e4m3"),
]


@pytest.mark.parametrize("src,outputs,message", REFUSED)
def test_refusals_name_the_reason_and_line(src, outputs, message):
    with pytest.raises(ExportError) as info:
        cutlass(src, outputs=outputs)
    assert message in str(info.value)


@pytest.mark.parametrize("kw,message", [
    (dict(ab_dtype="e4m3"), "fp8 with its scaling is not exported"),
    (dict(c_dtype="i8"), "an export loads and stores f16, bf16 and f32 only"),
    (dict(accumulator="f16"), "accumulator='f16': an export accumulates and computes in f32"),
    (dict(tile=(64, 128, 64)), "the cooperative SM90 kernel needs a tile M"),
    (dict(tile=(128, 128)), "tile takes three positive integers"),
    (dict(ab_dtype="f32"), "ab_dtype=f32"),
    (dict(name="not a name"), "is not a C++ identifier"),
    (dict(operands={"C": "vector"}), "operand C='vector': the kind is one of"),
    (dict(operands={"X": "full"}), "operands: 'X' is not a parameter of alpha_beta"),
])
def test_bad_choices_name_the_argument(kw, message):
    with pytest.raises(Exception) as info:
        cutlass(CASES["alpha_beta"][0], **kw)
    assert message in str(info.value)


@pytest.mark.parametrize("name", ["K", "stream", "Gemm", "stride_D", "double", "new"])
def test_names_clashing_with_the_generated_cpp_are_refused(name):
    src = f"def e(accum, {name}):\n    D = accum * {name}\n    return D"
    with pytest.raises(ExportError, match=f"'{name}' is a C\\+\\+ keyword or a name"):
        cutlass(src, operands={name: "runtime"})


def test_user_text_is_parsed_not_run(tmp_path):
    marker = tmp_path / "ran"
    src = f"import os\nos.mkdir({str(marker)!r})\ndef e(accum):\n    D = accum\n    return D\n"
    f = tmp_path / "epi.py"
    f.write_text(src)
    res = CliRunner().invoke(app, ["export", "cutlass", f"{f}:e"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert not marker.exists()


# ------------------------------------------------------------------ the CLI

def test_cli_writes_the_same_header(tmp_path):
    src, operands, outputs = CASES["reductions"]
    f = tmp_path / "epi.py"
    f.write_text(src)
    out = tmp_path / "r.hpp"
    res = CliRunner().invoke(app, ["export", "cutlass", f"{f}:reductions", "--output",
                                   "row_max=row", "--output", "col_sum=col", "--output",
                                   "total=scalar", "-o", str(out)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert out.read_text() == (GOLDEN / "reductions.hpp").read_text()


def test_cli_exit_status_of_refusals_and_bad_input():
    runner = CliRunner()
    res = runner.invoke(app, ["export", "cutlass", "def e(accum):\n    D = softmax(accum)\n"
                              "    return D"], catch_exceptions=False)
    assert res.exit_code == EXIT_UNSUPPORTED
    assert "cannot export to CUTLASS" in res.output
    res = runner.invoke(app, ["export", "cutlass", "def e(accum):\n    D = accum\n    return D",
                              "--tile", "128,128"], catch_exceptions=False)
    assert res.exit_code == EXIT_INPUT and "--tile takes three positive integers" in res.output


def test_export_md_shows_the_golden_header():
    """docs/export.md's complete example is the relu_aux header as exported today."""
    text = (Path(__file__).parents[1] / "docs" / "export.md").read_text()
    block = re.search(r"```cpp\n(.*?)```", text, re.S)
    assert block, "docs/export.md lost its cpp block"
    assert block.group(1) == export("relu_aux").header


@pytest.mark.parametrize("command", [["export"], ["export", "cutlass"]])
def test_export_commands_have_help(command):
    res = CliRunner().invoke(app, [*command, "--help"], catch_exceptions=False)
    assert res.exit_code == 0 and "Usage:" in res.output
    assert ("cutlass" in res.output) if command == ["export"] else ("--operand" in res.output)
