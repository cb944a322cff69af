"""Every code block of README.md and docs/*.md is tagged, and every Python block runs in a
test or is marked as not run on purpose: the docs' code cannot drift from the code.

The convention, by the info string after a block's opening fence:
- ```` ```python ````: runs in the CPU tier (Triton's interpreter, small sizes). A page's
  ``python`` blocks run in order as one script, after the page's setup (``PAGES`` below, or
  the test that ``RUN_ELSEWHERE`` names): the setup defines the names a fragment uses (A, W,
  offs, x, ...) at CPU sizes, so the blocks run as written; its tail checks what the blocks
  claim (shapes in comments, values) where that is cheap.
- ```` ```python gpu ````: needs a CUDA GPU (``device="cuda"``, 4096-wide shapes); runs in the
  GPU tier, tests/gpu/test_gpu_docs.py, after the page's GPU setup (``GPU_PAGES``), as is.
- ```` ```python no-run ````: shown, not run, on purpose (output, or a fragment of a larger
  source); say why in the text around it.
- ```` ```pycon ````: a console session (``>>>`` lines and their output), run as a doctest
  here, its output compared.
- every other block (``bash``, ``sh``, ``text``, ...) has a tag too: an untagged block
  could hide Python.
``test_every_block_is_covered`` fails on a python block of a page nothing runs, so a new
page's block (or a new page) cannot escape.
"""

from __future__ import annotations

import ast
import doctest
from pathlib import Path
from typing import NamedTuple

import pytest

from doc_blocks import ROOT, blocks, page_path, run_page
from tiers import quick


class Page(NamedTuple):
    setup: str  # runs before the page's blocks
    tail: str  # runs after them: checks what the blocks claim
    must_hold: tuple[str, ...] = ()  # strings the blocks must keep (what the tail relies on)


_GEMM_SETUP = """
import torch, evtfuse
import torch.nn.functional as F_
from evtfuse import EpilogueArguments, GemmArguments, get_kernels
torch.manual_seed(0)
M, N, K = 16, 24, 32
A, B, C = torch.randn(M, K), torch.randn(K, N), torch.randn(M, N)
D, F = torch.empty(M, N), torch.empty(M, N)
close = lambda a, b: torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
"""

# docs page -> its CPU setup and checks; the page's ``python`` blocks run between them
PAGES: dict[str, Page] = {
    "docs/architecture.md": Page(
        _GEMM_SETUP + "from evtfuse.optable import OpDef\n",
        """
ref = 1.0 * (A @ B) + 0.5 * C
close(F, ref); close(D, ref.relu())
from evtfuse.backends.triton.prelude import HELPERS
assert {"_ef_tanh", "_ef_softplus"} <= set(HELPERS)   # the helpers the mish row's spelling calls
""", ("OpDef(\"mish\"", "kernels[0].run(args)")),
    "docs/gated.md": Page(
        _GEMM_SETUP + """
x = torch.randn(M, K)
W_gate, W_up = torch.randn(N, K), torch.randn(N, K)
b_gate, b_up = torch.randn(N), torch.randn(N)
""", """
g, u = x @ W_gate.T, x @ W_up.T
assert D.shape == (M, N)
close(D, F_.silu(g) * u)       # the last D: library.gated("swiglu", layout="concatenated")
close(evtfuse.gemm(x, W.t(), swiglu_concat, bias_gate=b_gate, bias_up=b_up),
      F_.silu(g + b_gate) * (u + b_up))
""", ("def swiglu_concat",)),
    "docs/grouped.md": Page(
        _GEMM_SETUP + """
G, T = 3, 20
offs = torch.tensor([4, 12, 20], dtype=torch.int32)   # groups of 4, 8 and 8 rows
A, W = torch.randn(T, K), torch.randn(G, N, K)
bias = torch.randn(G, 1, N)                           # one bias per expert
routing_weights = torch.rand(T, 1)
x, dY = A, torch.randn(T, N)
W_gate, W_up = torch.randn(G, N, K), torch.randn(G, N, K)
groups = [slice(0, 4), slice(4, 12), slice(12, 20)]
""", """
assert D.shape == (T, N) and dW.shape == (G, K, N)
for g, rows in enumerate(groups):
    close(dW[g], x[rows].T @ dY[rows])
    close(D[rows], F_.silu(A[rows] @ W_gate[g].T) * (A[rows] @ W_up[g].T))
""", ("dW = evtfuse.grouped_gemm(x.t(), dY, offs)",)),
    "docs/export.md": Page("", """
assert "using EVT = cutlass::epilogue::fusion::Sm90EVT<" in header
assert exported.parameters[-1] == ("D", "cutlass::half_t*")
""", ("evtfuse.export.cutlass(relu_aux",)),
    "docs/library.md": Page(
        _GEMM_SETUP + """
from evtfuse import library
alpha, beta = 1.0, 0.5
bias = torch.randn(N)
alpha_n, beta_n = torch.randn(N), torch.randn(N)
D_fp8 = torch.empty(M, N, dtype=torch.float8_e4m3fn)
sa, sb, sd = torch.tensor(1.0), torch.tensor(1.0), torch.tensor(1.0)
amax = torch.empty(())
""", """
close(D, F_.gelu(A @ B + 0.5 * C, approximate="tanh"))
assert isinstance(epi, EpilogueArguments)
""", ("library.lin_comb_elt_act(\"gelu_tanh\")",)),
    "docs/operands.md": Page(
        _GEMM_SETUP + "scale = torch.rand(M, 1)\n", """
D, amax = evtfuse.gemm(A, B, row_amax, scale=scale, amax=torch.empty(M, 1))
close(D, (A @ B) * scale)
assert amax.shape == (M, 1)               # "amax: a (M, 1) buffer -> one value per row"
close(amax, D.abs().amax(1, keepdim=True))
""", ("def row_amax(accum, scale)",)),
    "docs/pytorch.md": Page(
        _GEMM_SETUP + """
def my_epi(accum, C, alpha):
    D = alpha * accum + C
    return D

H, V, tokens = 32, 48, 12
lm_head = torch.nn.Linear(H, V, bias=False)
W, b = lm_head.weight, torch.randn(V, requires_grad=True)
hidden = torch.randn(tokens, H, requires_grad=True)
target = torch.randint(0, V, (tokens,))
""", """
assert loss.shape == () and lse.shape == (tokens,)
assert hidden.grad.shape == hidden.shape and lm_head.weight.grad.shape == W.shape
close(loss, F_.cross_entropy(hidden @ W.T + b, target, reduction="sum"))
y, cap = target[:, None].to(torch.int32), 30.0
logits, lse, tgt, zs = evtfuse.gemm(hidden.detach(), W.detach().T, lce_logits, y=y, bias=b.detach(),
                                    cap=cap, lse=torch.empty(tokens, 1), tgt=torch.empty(tokens, 1),
                                    zs=torch.empty(tokens, 1))
z = cap * torch.tanh(((hidden @ W.T).detach().bfloat16().float() + b.detach()) / cap)
near = lambda a, b: torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2)  # bf16 roundings
near(lse, torch.logsumexp(z, 1, keepdim=True)); near(tgt, z.gather(1, target[:, None]))
near(zs, z.sum(1, keepdim=True))
""", ("def lce_logits", "evtfuse.nn.LinearCrossEntropy")),
}

# pages whose ``python`` blocks another test runs (it has more to set up or check):
# page -> (test file, test function); the function must call run_page / python_blocks on it
RUN_ELSEWHERE: dict[str, tuple[str, str]] = {
    "README.md": ("tests/test_round3_validation.py", "test_readme_use_runs_on_a_cpu_machine"),
    "docs/quickstart.md": ("tests/test_docs.py", "test_quickstart_runs"),
    "docs/models.md": ("tests/test_hf.py", "test_models_md_runs"),
    "docs/distributed.md": ("tests/test_distributed_lce.py", "test_distributed_md_runs"),
}

# pages with ``python gpu`` blocks: their GPU setup and checks (tests/gpu/test_gpu_docs.py)
GPU_PAGES: dict[str, Page] = {
    "docs/pytorch.md": Page("""
import torch, evtfuse
import torch.nn.functional as F_
torch.manual_seed(0)
torch_linear = torch.nn.Linear(4096, 14336, device="cuda", dtype=torch.bfloat16)
x = x_given = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16)
model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.GELU(approximate="tanh"),
                            torch.nn.Linear(4096, 1024)).to("cuda", torch.bfloat16)
""", """
torch.testing.assert_close(y, F_.gelu(torch_linear(x_given), approximate="tanh"),
                           rtol=2e-2, atol=2e-2)
assert y.shape == (8192, 14336)
assert len(model.evtfuse_fusion.fused) == 1, model.evtfuse_fusion
assert lin.weight.grad.shape == (14336, 4096) and lin.bias.grad.shape == (14336,)
assert x.grad.shape == x.shape
""", ("evtfuse.nn.fuse_activations(model)", "loss.backward()")),
}

DOC_PAGES = ["README.md"] + sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))
PYTHON_TAGS = {"python", "py", "python3", "pycon", "ipython"}


@pytest.mark.parametrize("page", quick(sorted(PAGES), ["docs/operands.md"]))  # a process each
def test_page_blocks_run(page, tmp_path):
    spec = PAGES[page]
    run_page(page, tmp_path, spec.must_hold, tail=spec.tail, setup=spec.setup, timeout=900)


def _doctests():
    return [(page, b) for page in DOC_PAGES for b in blocks(page_path(page)) if b.info == "pycon"]


@pytest.mark.parametrize("page,block", _doctests(),
                         ids=[f"{p}:{b.line}" for p, b in _doctests()])
def test_console_blocks_give_the_output_they_show(page, block):
    test = doctest.DocTestParser().get_doctest(block.code, {}, f"{page}:{block.line}", page,
                                               block.line)
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    assert test.examples and runner.failures == 0, f"{page}:{block.line}: see the output above"


def _calls_on_page(file: str, function: str, page: str) -> bool:
    """Whether ``function`` in ``file`` calls run_page or python_blocks with ``page``'s name."""
    tree = ast.parse((ROOT / file).read_text())
    fn = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
               and n.name == function), None)
    if fn is None:
        return False
    for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
        name = getattr(call.func, "id", getattr(call.func, "attr", None))
        if name in ("run_page", "python_blocks") and any(
                isinstance(c, ast.Constant) and c.value in (page, Path(page).name)
                for arg in call.args for c in ast.walk(arg)):
            return True
    return False


def test_every_block_is_covered():
    problems = []
    for page in DOC_PAGES:
        for b in blocks(page_path(page)):
            where = f"{page}:{b.line}"
            words = b.info.split()
            if not words:
                problems.append(f"{where}: untagged block (tag it: python, bash, text, ...)")
            elif words[0] not in PYTHON_TAGS or b.info in ("python no-run", "pycon"):
                continue
            elif b.info == "python":
                if page not in PAGES and page not in RUN_ELSEWHERE:
                    problems.append(f"{where}: a python block of a page no test runs: give "
                                    "the page a setup in PAGES (or tag the block)")
            elif b.info == "python gpu":
                if page not in GPU_PAGES:
                    problems.append(f"{where}: a python gpu block without a GPU_PAGES setup")
            else:
                problems.append(f"{where}: unknown tag {b.info!r}: python, python gpu, "
                                "python no-run or pycon")
    assert not problems, "\n".join(problems)


def test_registered_pages_exist_and_their_runners_run_them():
    for page in PAGES.keys() | GPU_PAGES.keys() | RUN_ELSEWHERE.keys():
        assert page in DOC_PAGES, f"{page}: no such page"
    for page in PAGES:
        assert page not in RUN_ELSEWHERE, f"{page} is run twice"
        assert any(b.info == "python" for b in blocks(page_path(page))), \
            f"{page} has no python block left: drop it from PAGES"
    for page in GPU_PAGES:
        assert any(b.info == "python gpu" for b in blocks(page_path(page))), page
    for page, (file, function) in RUN_ELSEWHERE.items():
        assert _calls_on_page(file, function, page), \
            f"{file}::{function} does not run {page}'s blocks (run_page / python_blocks)"


def test_the_coverage_check_catches_an_uncovered_block(tmp_path, monkeypatch):
    """A python block on a page no setup runs, an unknown tag and an untagged block are each
    reported; a marked one is not."""
    page = tmp_path / "new.md"
    page.write_text("```python\nx = 1\n```\n\n```python maybe\ny\n```\n\n```\nz\n```\n\n"
                    "```python no-run\nw\n```\n")
    monkeypatch.setitem(globals(), "DOC_PAGES", [str(page)])
    with pytest.raises(AssertionError) as info:
        test_every_block_is_covered()
    text = str(info.value)
    assert f"{page}:1: a python block of a page no test runs" in text
    assert f"{page}:5: unknown tag 'python maybe'" in text
    assert f"{page}:9: untagged block" in text
    assert ":13" not in text
