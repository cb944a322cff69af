"""The runtime hands DAGs on (CPU, Triton's interpreter): a DAG a pass built (a two-pass
plan's stages, a forward with what its backward keeps, a backward, an MLP block's derived
backward) runs as it is (``dag_epilogue.DagEpilogue``), never printed and parsed again.
Each call below parses the user's source once and nothing else (``frontend._Parser`` counts
what is parsed). ``DagEpilogue.bind`` gives the DAG the frontend gives the DAG's printed
source bound to the same values (the old way, the oracle here only), with other dtypes,
one batch and reductions into per-row outputs included."""

from __future__ import annotations

import pytest
import torch

import evtfuse
from evtfuse import frontend, ir
from evtfuse.dag_epilogue import DagEpilogue
from evtfuse.passes import optimize
from evtfuse.runtime import two_pass


@pytest.fixture
def parsed(monkeypatch):
    """The names of the functions the frontend parses during the test, in order."""
    names: list[str] = []
    real = frontend._Parser.parse_function

    def counting(self, fn):
        names.append(fn.name)
        return real(self, fn)

    monkeypatch.setattr(frontend._Parser, "parse_function", counting)
    return names


@pytest.fixture
def stages(monkeypatch):
    """The two-pass plans staged during the test (``two_pass.Staged``)."""
    made: list[two_pass.Staged] = []
    real = two_pass.Staged.__init__

    def spy(self, args):
        real(self, args)
        made.append(self)

    monkeypatch.setattr(two_pass.Staged, "__init__", spy)
    return made


def _rand(*shape, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def test_two_passes_parse_only_the_users_source(parsed, stages):
    source = "def handoff_softmax(accum, C):\n    D = softmax(accum * 0.75 + C)\n    return D\n"
    A, B, C = _rand(24, 16), _rand(16, 272, seed=1), _rand(24, 272, seed=2)
    D = evtfuse.gemm(A, B, source, C=C)
    torch.testing.assert_close(D, torch.softmax((A @ B) * 0.75 + C, -1), rtol=1e-5, atol=1e-6)
    assert stages, "the interpreter's kernel ran it in one pass: widen N"
    assert all(isinstance(st.args1.epilogue.parsed, DagEpilogue)
               and isinstance(st.args2.epilogue.parsed, DagEpilogue) for st in stages)
    assert parsed == ["handoff_softmax"]


@pytest.mark.parametrize("mode", ["recompute", "save"])
def test_gated_backward_parses_only_the_users_source(parsed, mode):
    name = f"handoff_gated_{mode}"
    source = (f"def {name}(accum, b):\n    gate, up = pairs(accum)\n"
              "    D = silu(gate) * up + b\n    return D\n")
    A = _rand(20, 16).requires_grad_(True)
    B = _rand(16, 24, seed=1).requires_grad_(True)
    b = _rand(12, seed=2).requires_grad_(True)
    D = evtfuse.gemm(A, B, source, b=b, backward=mode)
    D.sum().backward()
    A2, B2, b2 = (t.detach().requires_grad_(True) for t in (A, B, b))
    acc = A2 @ B2
    (torch.nn.functional.silu(acc[:, 0::2]) * acc[:, 1::2] + b2).sum().backward()
    for got, want in ((D, None), (A.grad, A2.grad), (B.grad, B2.grad), (b.grad, b2.grad)):
        if want is not None:
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert parsed == [name]


@pytest.mark.parametrize("mode", ["recompute", "save"])
def test_backward_parses_only_the_users_source(parsed, mode):
    name = f"handoff_grad_{mode}"
    source = (f"def {name}(accum, C, bias):\n    m = max(accum)\n"
              "    D = relu(accum + bias) * C - m\n    return D, m\n")
    A = _rand(2, 12, 8).requires_grad_(True)
    B = _rand(8, 10, seed=1).requires_grad_(True)
    C = _rand(2, 12, 10, seed=2).requires_grad_(True)
    bias = _rand(10, seed=3).requires_grad_(True)
    D, m = evtfuse.gemm(A, B, source, C=C, bias=bias, m=torch.empty(2, 12, 1),
                        backward=mode)
    D.sum().backward()
    assert all(t.grad is not None for t in (A, B, C, bias))
    assert parsed == [name]


def test_mlp_backward_parses_no_derived_epilogue(parsed):
    block = evtfuse.nn.GatedMLP(16, 8, "silu")
    x = _rand(5, 16).requires_grad_(True)
    block(x).sum().backward()
    assert x.grad is not None
    assert not [n for n in parsed if n.endswith(("_down_grad", "_backward", "_grad"))]


def _values(specs: dict, outs: dict) -> dict:
    return {**{n: torch.empty(s, dtype=dt) for n, (s, dt) in specs.items()},
            **{n: None if s is None else torch.empty(s, dtype=dt)
               for n, (s, dt) in outs.items()}}


CASES = [  # (source, operands, outputs, problem): bound once to build the DAG, then bound
    #        again as a DagEpilogue to other values (below) against its source's binding
    ("def e(accum, C, bias):\n    m = mean(accum * C)\n    D = accum * rsqrt(m + 1.0) + bias"
     "\n    return D, m\n",
     {"C": ((12, 10), torch.float32), "bias": ((10,), torch.float32)},
     {"D": ((12, 10), torch.float32), "m": ((12, 1), torch.float32)}, (1, 12, 10)),
    ("def e(accum, s):\n    D = softmax(accum) * s\n    t = logsumexp(accum)\n    return D, t\n",
     {"s": ((2, 12, 1), torch.float32)},
     {"D": ((2, 12, 10), torch.float32), "t": ((2, 1, 1), torch.float32)}, (2, 12, 10)),
    ("def e(accum, G):\n    gate, up = pairs(accum)\n    D = gelu(gate) * up * G + 2.0 * G"
     "\n    return D\n",
     {"G": ((12, 10), torch.float32)}, {"D": ((12, 10), torch.float32)}, (1, 12, 10)),
]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dag_binds_as_its_source_would(case, dtype):
    source, ops, outs, problem = CASES[case]
    dag = frontend.bind(frontend.parse_epilogue(source), _values(ops, outs), problem)
    epi = DagEpilogue(optimize(dag))
    other = {n: (s, dtype) for n, (s, _) in ops.items()}
    other_outs = {n: (s, dtype if n == "D" else dt) for n, (s, dt) in outs.items()}
    values = _values(other, other_outs)
    got = epi.bind(values, problem)
    want = frontend.bind(frontend.parse_epilogue(epi.source), values, problem)
    assert ir.signature(got) == ir.signature(want)
    if dtype == torch.float32:
        assert got is epi.bind(values, problem) is epi.dag  # the values say what it says


def test_text_names_the_dag():
    """Two DAGs of one source (operands of other dtypes) have two texts, which parse as
    the source (a comment holds the hash)."""
    source = "def e(accum, C):\n    D = accum * C\n    return D\n"
    parsed = frontend.parse_epilogue(source)
    texts = []
    for dt in (torch.float32, torch.float16):
        dag = frontend.bind(parsed, {"C": torch.empty(4, 6, dtype=dt),
                                     "D": torch.empty(4, 6)}, (1, 4, 6))
        epi = DagEpilogue(dag)
        assert epi.text.startswith(epi.source) and "# evtfuse dag " in epi.text
        assert frontend.parse_epilogue(epi.text).params == ("C",)
        texts.append(epi.text)
    assert texts[0] != texts[1]
