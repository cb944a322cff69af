"""Every script in examples/ runs on the CPU (Triton's interpreter) and verifies itself.

Each example is run as a subprocess the way a user runs it (``python examples/x.py``) with
TRITON_INTERPRET=1 and no visible GPU; it must exit 0 and print what it checked. The
examples run concurrently (they are independent processes) to keep the suite fast.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tiers import quick

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"

# example -> texts its output must contain; a tuple means "one of these"
EXPECTED: dict[str, list] = {
    "alpha_beta_xy": ["kernel: ", "ok   D:", "ok   Y:", "ok   reference D"],
    "relu_aux_store": ["kernel: ", "ok   D:", "ok   F:"],
    "relu_scale_return_acc": ["kernel: ", "ok   D:", "ok   F:", "ok   accum:"],
    "string_epilogue": ["kernel: ", "ok   D:", "ok   F:"],
    "failure_examples": [
        "accum must be an input to the epilogue function",
        "Output node D is not found in the epilogue function.",
        "Variable 'tmp' cannot be defined twice.",
        "Argument D is not provided in the kwargs of the EpilogueArguments constructor",
        "Argument alpha is not provided in the kwargs of the EpilogueArguments constructor",
    ],
    "multiple_outputs": ["kernel: ", "ok   D:", "ok   D_squared:"],
    "complex_expression": ["kernel: ", "ok   D:"],
    "bce_loss": ["ok   reference loss", "ok   loss:"],
    # the CPU interpreter converts fp8 wrongly: the kernel is refused there, with that reason
    "fp8_amax": ["ok   reference amax", "kernel not supported here: ", "fp8 needs a GPU"],
    "per_channel_scaling": ["ok   D (per column)", "ok   D (per row)"],
    "debug_print": ["accum[0, 0] = ", "(reference: ", "ok   accum:"],
}


def _env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="", EVTFUSE_CACHE_DIR=str(tmp),
               PYTHONPATH=str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", ""))
    return env


@pytest.fixture(scope="module")
def results(request, tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """The examples this run tests (the quick tier: two of them), run at once."""
    env = _env(tmp_path_factory.mktemp("cache"))
    names = [t.callspec.params["name"] for t in request.session.items
             if t.module is request.module and t.originalname == "test_example_runs_and_verifies"]
    procs = {name: subprocess.Popen([sys.executable, str(EXAMPLES / f"{name}.py")], env=env,
                                    cwd=str(ROOT), stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
             for name in names}
    out = {}
    for name, p in procs.items():
        text, _ = p.communicate(timeout=600)
        out[name] = subprocess.CompletedProcess(p.args, p.returncode, text)
    return out


def test_every_example_is_listed():
    scripts = {p.stem for p in EXAMPLES.glob("*.py") if not p.stem.startswith("_")}
    assert scripts == set(EXPECTED)


@pytest.mark.parametrize("name", quick(sorted(EXPECTED), ["alpha_beta_xy", "failure_examples"]))
def test_example_runs_and_verifies(results, name):
    res = results[name]
    assert res.returncode == 0, res.stdout
    lines = res.stdout.strip().splitlines()
    assert lines[0].startswith("== ") and "CPU through Triton's interpreter" in lines[0]
    assert lines[-1].startswith("OK"), res.stdout
    assert "FAIL" not in res.stdout
    for want in EXPECTED[name]:
        options = want if isinstance(want, tuple) else (want,)
        assert any(w in res.stdout for w in options), (want, res.stdout)
    if "kernel not supported here: " in res.stdout:
        # only allowed with a reason from evtfuse.explain (one line per kernel family)
        after = res.stdout.split("kernel not supported here: ", 1)[1]
        assert "refused: " in after, res.stdout


@pytest.mark.slow
def test_debug_example_prints_other_values_when_asked(tmp_path):
    res = subprocess.run([sys.executable, str(EXAMPLES / "debug_print.py"), "--print", "accum,D",
                          "--at", "3,5"], env=_env(tmp_path), cwd=str(ROOT),
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "accum[3, 5] = " in res.stdout and "D[3, 5] = " in res.stdout
    bad = subprocess.run([sys.executable, str(EXAMPLES / "debug_print.py"), "--print", "C"],
                         env=_env(tmp_path), cwd=str(ROOT), capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode != 0 and "'C' is not an intermediate" in bad.stderr


@pytest.fixture
def common(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.syspath_prepend(str(EXAMPLES))
    spec = importlib.util.spec_from_file_location("_examples_common", EXAMPLES / "_common.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_check_fails_on_a_mismatch_and_finish_exits_1(common, capsys):
    want = torch.linspace(-3, 5, 40).reshape(5, 8)
    assert common.check("same", want.clone(), want)
    wrong = want.clone()
    wrong[2, 3] += 0.5
    assert not common.check("wrong", wrong, want)
    unwritten = want.clone()
    unwritten[0, 0] = float("nan")
    assert not common.check("unwritten", unwritten, want)
    assert not common.check("shape", want[:4], want)
    with pytest.raises(SystemExit) as exc:
        common.finish()
    assert exc.value.code == 1
    out = capsys.readouterr().out
    assert "FAIL wrong" in out and "NaN" in out and "FAILED: wrong, unwritten, shape" in out


def test_not_supported_needs_a_reason_from_explain(common, monkeypatch):
    monkeypatch.setattr(common, "get_kernels", lambda args: [])
    monkeypatch.setattr(common, "explain", lambda args: "   ")
    with pytest.raises(RuntimeError, match="no reason"):
        common.fused(object())
    monkeypatch.setattr(common, "explain", lambda args: "portable: refused: because")
    assert common.fused(object()) is None
    with pytest.raises(SystemExit) as exc:
        common.finish()
    assert exc.value.code == 0


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_on_a_gpu(name, tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    env = dict(os.environ, EVTFUSE_CACHE_DIR=str(tmp_path),
               PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TRITON_INTERPRET", None)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    res = subprocess.run([sys.executable, str(EXAMPLES / f"{name}.py")], env=env, cwd=str(ROOT),
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "CUDA GPU" in res.stdout.splitlines()[0] and res.stdout.strip().endswith(
        ("OK", "see above)")), res.stdout
