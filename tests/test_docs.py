"""The documentation cannot drift: generated parts equal the generator's output, the
quick start runs, the library page shows real output, and the messages errors.md
explains are the messages the code raises."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import evtfuse
from evtfuse import EpilogueArguments, EpilogueError, GemmArguments, docgen, library
from doc_blocks import run_page

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def test_ops_md_is_generated_from_the_op_table():
    assert (DOCS / "ops.md").read_text() == docgen.render_ops(), \
        "docs/ops.md is stale: run `python -m evtfuse.docgen`"


def test_library_md_table_is_generated():
    text = (DOCS / "library.md").read_text()
    assert docgen.update_library(text) == text, \
        "the table in docs/library.md is stale: run `python -m evtfuse.docgen`"
    for entry in library.CUTLASS_MENU:
        assert f"`{entry.cutlass}`" in text


def test_ops_md_lists_every_row():
    from evtfuse.optable import OPS

    text = docgen.render_ops()
    for name in OPS:
        assert f"| `{name}` |" in text
    assert "`max(x, y)`" in text and "`x ** c`" in text and "`row_index()`" in text


def test_docgen_check_and_write(tmp_path, capsys):
    """``--check`` and a write through ``docgen.main`` in this process, then ``python -m
    evtfuse.docgen --check`` as a contributor runs it (one interpreter start, not three)."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "library.md").write_text(f"intro\n{docgen.LIBRARY_BEGIN}\nold\n{docgen.LIBRARY_END}\nend\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    cmd = [sys.executable, "-m", "evtfuse.docgen", "--docs", str(docs)]
    assert docgen.main(["--docs", str(docs), "--check"]) == 1
    assert "stale" in capsys.readouterr().out
    assert not (docs / "ops.md").exists()
    assert docgen.main(["--docs", str(docs)]) == 0
    assert (docs / "ops.md").read_text() == docgen.render_ops()
    lib = (docs / "library.md").read_text()
    assert lib.startswith("intro\n") and lib.endswith("\nend\n") and "old" not in lib
    assert library.menu_table() in lib
    assert subprocess.run(cmd + ["--check"], env=env).returncode == 0


def test_library_md_example_output_is_real():
    text = (DOCS / "library.md").read_text()
    assert library.lin_comb_bias_elt_act("relu", aux=True).rstrip() in text


def test_quickstart_runs(tmp_path):
    out = run_page("quickstart.md", tmp_path, ("evtfuse.gemm", "get_kernels"),
                   tail="print('QUICKSTART', D3.shape)")
    assert "QUICKSTART" in out


def test_links_between_docs_resolve():
    for page in DOCS.glob("*.md"):
        for target in re.findall(r"\]\(([^)#:]+\.md)\)", page.read_text()):
            assert (DOCS / target).exists(), f"{page.name} links to missing {target}"


def test_cli_md_covers_commands_and_exit_codes():
    from evtfuse import cli

    text = (DOCS / "cli.md").read_text()
    for cmd in ("demo", "run", "show", "profile", "bench", "cache list | clear",
                "export cutlass"):
        assert f"## `evtfuse {cmd}`" in text
    for code in (cli.EXIT_OK, cli.EXIT_VERIFY, cli.EXIT_INPUT, cli.EXIT_UNSUPPORTED,
                 cli.EXIT_MISSING):
        assert f"| {code} |" in text
    assert "EVTFUSE_CACHE_DIR" in text and "EVTFUSE_LOG=debug" in text


# ------------------------------------------------------------------ errors.md

ERRORS_MD = (DOCS / "errors.md").read_text() if (DOCS / "errors.md").exists() else ""
M, N, K = 8, 6, 4
A, B = torch.randn(M, K), torch.randn(K, N)


def full(dtype=torch.float32):
    return torch.zeros(M, N, dtype=dtype)


def epi(src, **values):
    values.setdefault("D", full())
    return EpilogueArguments(src, **values)


def _outputs_sharing_memory():
    d = full()
    return GemmArguments(A, B, d, epilogue=epi("def e(accum): D = accum; F = D; return D, F",
                                                D=d, F=d))


def _output_overlapping_input():
    buf = torch.zeros(M, N + 1)
    d = buf[:, :N]
    return GemmArguments(A, B, d, epilogue=epi("def e(accum, C): D = accum + C; return D",
                                                C=buf[:, 1:], D=d))


# (what to build, a phrase that must be in both the message and errors.md)
TRIGGERS = [
    (lambda: evtfuse.grouped_gemm(torch.zeros(4, 8), torch.zeros(2, 8, 4),
                                  torch.tensor([2, 4])), "offs must be torch.int32"),
    (lambda: evtfuse.grouped_gemm(torch.zeros(4, 8), torch.zeros(2, 8, 4),
                                  torch.tensor([4], dtype=torch.int32)), "groups but B"),
    (lambda: evtfuse.grouped_gemm(torch.zeros(4, 8), torch.zeros(2, 8, 4),
                                  torch.tensor([[2, 4]], dtype=torch.int32)), "offs must be 1-D (G,)"),
    (lambda: evtfuse.grouped_gemm(torch.zeros(4, 8), torch.zeros(1, 2, 8, 4),
                                  torch.tensor([2, 4], dtype=torch.int32)),
     "grouped_gemm: B must be (G, K, N)"),
    (lambda: evtfuse.grouped_gemm(torch.zeros(1, 4, 8), torch.zeros(8, 4),
                                  torch.tensor([2, 4], dtype=torch.int32)),
     "grouped_gemm: A must be (M, T)"),
    (lambda: evtfuse.grouped_gemm(torch.zeros(4, 8), torch.zeros(2, 8, 4),
                                  torch.tensor([2, 4], dtype=torch.int32),
                                  "def e(accum, C): D = accum + C; return D",
                                  C=torch.zeros(2, 4, 4)), "a tensor with rows has no group dimension"),
    (lambda: evtfuse.grouped_gemm(torch.zeros(4, 8), torch.zeros(2, 8, 4),
                                  torch.tensor([2, 4], dtype=torch.int32),
                                  "def e(accum): D = accum; R = sum(D); return D, R",
                                  R=torch.zeros(2, 4, 1)),
     "of a grouped GEMM has no group dimension, since a row belongs to one group"),
    (lambda: epi("def e(alpha): D = alpha; return D"),
     "accum must be an input to the epilogue function"),
    (lambda: epi("def e(accum): F = accum; return F", F=full()),
     "Output node D is not found in the epilogue function."),
    (lambda: epi("def e(accum):\n    tmp = accum\n    tmp = tmp * 2.0\n    D = tmp\n    return D"),
     "Variable 'tmp' cannot be defined twice."),
    (lambda: EpilogueArguments("def e(accum): D = accum; return D"),
     "Argument D is not provided in the kwargs of the EpilogueArguments constructor"),
    (lambda: epi("def e(accum): D = softmin(accum); return D"), "unknown function 'softmin'"),
    (lambda: epi("def e(accum): D = accum + x; return D"), "undefined name 'x'"),
    (lambda: epi("def e(accum): D = rellu(accum); return D"),
     "unknown function 'rellu' in the value of 'D'; did you mean relu?"),
    (lambda: epi(_uses_a_global),
     "evtfuse reads only the epilogue function's own source, not the names of its module or "
     "of an enclosing function"),
    (lambda: epi(lambda accum: accum * 2.0),
     "the epilogue is a lambda: evtfuse reads an epilogue's source (it never calls it) and "
     "does not read lambdas"),
    (lambda: evtfuse.gemm(A, B, epilog="def e(accum): D = accum; return D"),
     "gemm got epilog=, which is neither one of its keywords nor an operand or output of the "
     "epilogue identity(accum) -> D: did you mean epilogue=?"),
    (lambda: epi("def e(accum): D = accum[0]; return D"), "unsupported syntax (Subscript)"),
    (lambda: epi("def e(accum):\n    if accum:\n        D = accum\n    return D"),
     "unsupported statement (If)"),
    (lambda: epi("def e(accum):\n    a, D = accum, accum\n    return D"),
     "assign one value to one plain name per statement"),
    (lambda: epi("def e(accum): D = accum // 2.0; return D"), "unsupported operator"),
    (lambda: epi("def e(accum, y): D = accum ** y; return D", y=1.0),
     "the exponent of ** must be a numeric literal"),
    (lambda: epi("def e(accum): D = where(0.0 < accum < 1.0, accum, 0.0); return D"),
     "chained comparisons are not supported"),
    (lambda: epi("def e(accum): D = accum * 'x'; return D"), "only numbers are allowed"),
    (lambda: epi("def e(accum): D = relu(accum, accum); return D"), "relu() takes 1 positional"),
    (lambda: epi("def e(accum): D = leaky_relu(accum, alpha=0.1); return D"),
     "leaky_relu() got an unexpected keyword argument 'alpha'"),
    (lambda: epi("def e(accum, s): D = leaky_relu(accum, slope=s); return D", s=0.1),
     "leaky_relu() parameter 'slope' must be a numeric literal"),
    (lambda: epi("def e(accum): D = accum * row_index(1); return D"), "row_index() takes no arguments"),
    (lambda: epi("def e(accum): D = accum"), "the epilogue must end with a return of its outputs"),
    (lambda: epi("def e(accum):\n    D = accum\n    return D\n    return D"),
     "only one return is allowed, as the last statement"),
    (lambda: epi("def e(accum): D = accum; return D, relu(D)"), "return names only"),
    (lambda: epi("def e(accum, C): D = accum; return D, C", C=full()),
     "is an input of the epilogue and cannot also be returned as an output"),
    (lambda: epi("def e(accum): D = accum; return D, D"), "is returned twice"),
    (lambda: epi("def e(accum): D = accum; return D, Z"), "undefined name 'Z' in the return"),
    (lambda: epi("def e(accum, *rest): D = accum; return D"),
     "the epilogue function takes plain positional parameters only"),
    (lambda: epi("def e(accum, a=1.0): D = accum; return D"),
     "epilogue parameters cannot have default values"),
    (lambda: epi("x = 1\ndef e(accum): D = accum; return D\ndef f(accum): D = accum; return D"),
     "the epilogue must be exactly one function definition"),
    (lambda: epi("import torch\ndef e(accum): D = accum; return D"),
     "the epilogue source must hold only the function definition"),
    (lambda: epi("def e(accum): D = accum +; return D"), "the epilogue is not valid Python"),
    (lambda: epi(functools.partial(max)), "pass the epilogue as a string instead"),
    (lambda: epi("def e(accum):\n    D = accum * sum(accum - max(accum))\n    return D"),
     "sum(...) in the value of 'D' reduces a value computed from another reduction"),
    (lambda: epi("def e(accum):\n    D = accum - accum.sum(-1)\n    return D"),
     "accum.sum(-1) without keepdim=True has torch's shape (M,), which torch aligns from the "
     "right against the (M, N) output, along other axes than the ones it keeps"),
    (lambda: epi("def e(accum):\n    D = accum - accum.sum(0)\n    return D", D=torch.zeros(2, M, N)),
     "accum.sum(0): dim=0 reduces the batches (L) only, which no evtfuse reduction does"),
    (lambda: epi("def e(accum):\n    D = F.softmax(accum, dim=1)\n    return D", D=torch.zeros(2, M, N)),
     "F.softmax(accum, dim=1): evtfuse's softmax is over each row (dim=-1, the last dim)"),
    (lambda: epi("def e(accum):\n    D = F.softmax(accum)\n    return D"),
     "softmax() without dim: torch picks the dim from the input's rank"),
    (lambda: epi("def e(accum):\n    D = torch.logsumexp(accum)\n    return D"), "logsumexp() needs dim"),
    (lambda: epi("def e(accum):\n    D = accum.sum(0)\n    return D", D=torch.zeros(N)).bind((1, M, N)),
     "dim=0 means different axes for a 2-D (M, N) output and a batched (L, M, N) one"),
    (lambda: epi("def e(accum):\n    D = accum - accum.sum(2, keepdim=True)\n    return D"),
     "accum.sum(2, keepdim=True): dim=2 is out of range for the (M, N) output"),
    (lambda: epi("def e(accum):\n    D = accum - accum.sum((1, -1), keepdim=True)\n    return D"),
     "dim -1 appears more than once"),
    (lambda: epi("def e(accum, d):\n    D = accum - accum.sum(d)\n    return D", d=1.0),
     "dim must be an int literal, a tuple of them, or None"),
    (lambda: epi("def e(accum):\n    D = accum - accum.sum(-1, keepdim=1)\n    return D"),
     "keepdim must be True or False"),
    (lambda: epi("def e(accum):\n    D = accum\n    r = accum.sum(-1, keepdim=True)\n"
                 "    return D, r", r=torch.zeros(N)),
     "accum.sum(-1, keepdim=True) reduces each row, but output r has shape (6,), which holds a "
     "per-column reduction: give r the shape (M, 1)"),
    (lambda: epi("def e(accum):\n    D = accum - accum.max(-1).indices\n    return D"),
     "accum.max(-1).indices: evtfuse computes no indices (argmax, argmin)"),
    (lambda: epi("def e(accum):\n    m = max(accum)\n    s = sum(accum - m)\n    D = accum\n"
                 "    return D, s", s=torch.zeros(M, 1)),
     "reduces a value computed from another reduction"),
    (lambda: epi("def e(accum):\n    D = softmax(softmax(accum))\n    return D"),
     "of a value computed from a reduction: a reduction cannot reduce"),
    (lambda: epi("def e(accum):\n    m = max(accum)\n    D = accum\n    return D"),
     "is a reduction whose result is never returned or used"),
    (lambda: epi("def e(accum):\n    D = accum\n    m = sum(D)\n    return D, m", m=full()),
     "is a reduction, but output m has the full shape"),
    (lambda: epi("def e(accum):\n    D = accum\n    m = sum(D)\n    return D, m", m=None),
     "is a reduction; its output cannot be None"),
    (lambda: epi("def e(accum):\n    D = accum\n    m = D * 2.0\n    return D, m",
                 m=torch.zeros(M, 1)), "is not computed by sum/max/min"),
    (lambda: epi("def e(accum, bias): D = accum + bias; return D", bias=torch.zeros(7)),
     "which does not broadcast to the output (L, M, N)"),
    (lambda: epi("def e(accum, x): D = accum + x; return D", x=torch.zeros(1, 1, M, N)),
     "at most 3 (L, M, N) are allowed"),
    (lambda: epi("def e(accum, C): D = accum + C; return D", C=torch.zeros(M, N, dtype=torch.complex64)),
     "which an epilogue cannot load"),
    (lambda: epi("def e(accum, alpha): D = accum * alpha; return D", alpha=None),
     "must be a number or a tensor, not None"),
    (lambda: epi("def e(accum): D = accum; F = D; return D, F", F=3.0),
     "(or None to compute it without storing it)"),
    (lambda: epi("def e(accum): D = accum; return D", D=full(torch.int16)),
     "which an epilogue cannot store"),
    (lambda: epi("def e(accum, C): D = accum; return D", C=full(), Z=full()),
     "is not a parameter or an output of the epilogue function"),
    (lambda: EpilogueArguments("def e(accum): D = accum; return D", D=torch.zeros(M)).dag,
     "the problem shape is not known yet"),
    (lambda: GemmArguments(A, torch.randn(K + 1, N), full()), "differs from B's K"),
    (lambda: GemmArguments(A, B.half(), full()), "they must have one dtype"),
    (lambda: GemmArguments(A, B, full(), epilogue=epi("def e(accum): D = accum; return D")),
     "out and the epilogue's D are different tensors"),
    (lambda: _outputs_sharing_memory(), "share memory; each output needs its own buffer"),
    (lambda: _output_overlapping_input(),
     "only a full-shaped output may alias a full-shaped input exactly"),
    (lambda: GemmArguments(A, B, torch.zeros(1, N).expand(M, N)),
     "more than one element of the written-to tensor refers to a single memory location"),
    (lambda: evtfuse.gemm(A.clone().requires_grad_(True), B,
                          "def e(accum):\n    q = cast(accum, 'int8')\n    D = q * 2.0\n    return D"),
     "has no derivative"),
    (lambda: evtfuse.gemm(A, B, backward="keep"),
     'backward must be "auto", "save" or "recompute", not'),
    (lambda: evtfuse.gemm(torch.zeros(4, 8), torch.zeros(8, 7),
                          "def e(accum): gate, up = pairs(accum); D = gate * up; return D"),
     "B has an odd number of columns"),
    (lambda: EpilogueArguments("def e(accum): gate, up = pairs(accum); D = accum; return D",
                               D=full()), "accum cannot be used in a gated epilogue except as"),
    (lambda: EpilogueArguments("def e(accum): gate, up = pairs(accum + 1.0); D = gate; return D",
                               D=full()), "pairs() takes only accum"),
    (lambda: EpilogueArguments("def e(accum): g = pairs(accum); D = g; return D",
                               D=full()), "pairs(accum) gives two values"),
    (lambda: EpilogueArguments("def e(accum): g, u = pairs(accum, layout='cat'); D = g; return D",
                               D=full()), 'pairs(accum, layout=...) takes "interleaved"'),
    *[(functools.partial(lambda kw: _lce(**kw), kw), phrase) for kw, phrase in [
        (dict(reduction="avg"), 'reduction must be "mean", "sum" or "none"'),
        (dict(label_smoothing=1.5), "label_smoothing must be a finite number in [0.0, 1.0]"),
        (dict(softcap=0.0), "must be a finite number in (0.0, inf)"),
        (dict(ignore_index=1.5), "ignore_index must be an int"),
        (dict(return_lse="yes"), "return_lse must be True or False"),
        (dict(hidden=torch.randn(5, K).double()), "the kernels take float16, bfloat16 and float32"),
        (dict(hidden=torch.randn(K)), "it must be (tokens, hidden) or (..., hidden)"),
        (dict(weight=torch.randn(K, 7)), "(as torch.nn.Linear's weight)"),
        (dict(weight=torch.randn(0, K)), "the vocabulary must have a class at least"),
        (dict(weight=torch.randn(7, K).half()), "they must have one dtype"),
        (dict(target=torch.zeros(5)), "it must hold class indices, int64 or int32"),
        (dict(target=torch.zeros(3, dtype=torch.long)), "(one class per row of hidden)"),
        (dict(bias=torch.zeros(3)), "one per row of weight"),
        (dict(target=torch.full((5,), 7)), "is out of bounds: a target is a class index in"),
    ]],
]


SCALE = 2.0


def _uses_a_global(accum):
    D = accum * SCALE
    return D


def _lce(hidden=None, weight=None, target=None, **kw):
    """evtfuse.linear_cross_entropy of 5 tokens, hidden K, a vocabulary of 7, with a change."""
    hidden = torch.randn(5, K) if hidden is None else hidden
    weight = torch.randn(7, K) if weight is None else weight
    target = torch.zeros(5, dtype=torch.long) if target is None else target
    return evtfuse.linear_cross_entropy(hidden, weight, target, **kw)


@pytest.mark.parametrize("build, phrase", TRIGGERS, ids=[p for _, p in TRIGGERS])
def test_errors_md_explains_the_real_message(build, phrase):
    with pytest.raises(EpilogueError) as exc:
        build()
    assert phrase in str(exc.value), f"the code's message changed: {exc.value}"
    assert phrase in ERRORS_MD, f"docs/errors.md does not explain: {phrase}"


def test_errors_md_explains_explain_reasons(monkeypatch):
    from evtfuse import explain

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    args = GemmArguments(A.to(torch.bfloat16), B.to(torch.bfloat16), full())
    assert "portable: supported" in explain(args)  # bf16 through fp32 stand-ins
    D = torch.empty(M, N, dtype=torch.float8_e4m3fn)
    text = explain(GemmArguments(A, B, D, epilogue=EpilogueArguments(
        "def e(accum): D = accum; return D", D=D)))
    assert "fp8 needs a GPU (Triton's CPU interpreter converts fp8 wrongly" in text
    assert "fp8 needs a GPU (Triton's CPU interpreter converts fp8 wrongly" in ERRORS_MD
    D = torch.empty(M, N, dtype=torch.float64)  # a float64 output: stored since round 3
    text = explain(GemmArguments(A, B, D, epilogue=EpilogueArguments(
        "def e(accum): D = accum; return D", D=D)))
    assert "portable: supported" in text
    assert "the kernels store fp16, bf16, fp32, fp64, fp8 (e4m3fn, e5m2), int8, uint8 and int32" \
        in ERRORS_MD
    text = explain(GemmArguments(A.double(), B.double(), D))  # float64 asks for its accumulator
    assert "A and B are torch.float64: pass accumulator_type=torch.float64" in text
    assert "A and B are torch.float64: pass accumulator_type=torch.float64" in ERRORS_MD


def test_errors_md_explains_the_cache_folder_error(tmp_path, monkeypatch):
    from evtfuse.errors import ConfigError
    from evtfuse.runtime import cache

    afile = tmp_path / "afile"
    afile.write_text("")
    monkeypatch.setenv("EVTFUSE_CACHE_DIR", str(afile))
    with pytest.raises(ConfigError) as exc:
        cache.cache_dir()
    phrase = "is not a usable directory: it exists and is not a folder"
    assert phrase in str(exc.value) and phrase in ERRORS_MD
