"""The table of Triton differences (``backends/triton/versions.py``) against the installed
Triton: every spelling it gives exists there, the launcher conventions match what that
Triton's own code does, and a Triton outside the tested range gets a clear warning. CI
runs this file on the oldest and the newest supported Triton."""

import inspect
import warnings

import pytest

from evtfuse.backends.triton import versions


def _resolve(dotted: str):
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import tma

    root, attr = dotted.split(".")
    return getattr({"gl": gl, "tma": tma}[root], attr, None)


@pytest.mark.parametrize("name", ["tma_load", "tma_store", "cta_barrier"])
def test_gluon_spellings_exist_in_the_installed_triton(name):
    """The emitter's spelling is a Gluon builtin of the running Triton, not a stub that
    raises (3.9 keeps the old TMA names as functions that raise "has been removed")."""
    fn = _resolve(versions.spelling(name))
    assert fn is not None, versions.spelling(name)
    assert "has been removed" not in inspect.getsource(fn)


def test_descriptor_encoder_arity_matches_the_table():
    import triton.backends.nvidia.driver as nv

    params = inspect.signature(nv.make_tensordesc_arg).parameters
    assert (len(params) == 3) == versions.is_new("tensordesc_arg_base")


def test_launcher_convention_matches_tritons_launcher():
    """packed: Triton's CudaLauncher keeps the C function's per-kernel argument
    annotations (3.7+); flat: it does not."""
    import triton.backends.nvidia.driver as nv

    packed = "kernel_signature" in inspect.getsource(nv.CudaLauncher.__init__)
    assert packed == (versions.spelling("c_launcher") == "packed")


def test_spellings_by_release():
    assert versions.spelling("tma_load", (3, 6, 0)) == "tma.async_copy_global_to_shared"
    assert versions.spelling("tma_load", (3, 7, 1)) == "tma.async_copy_global_to_shared"
    assert versions.spelling("tma_load", (3, 9, 0)) == "tma.async_load"
    assert versions.spelling("cta_barrier", (3, 7, 1)) == "gl.barrier"
    assert versions.parse("3.7.1+git1234") == (3, 7, 1)
    assert versions.parse("3.10") == (3, 10, 0)


def test_installed_triton_is_a_tested_one():
    """CI installs tested releases only; a new one needs its row(s) and a CI run first."""
    import triton

    assert triton.__version__.split("+")[0] in versions.TESTED
    assert versions.check_installed() is None


def test_untested_triton_gets_a_warning_naming_the_range():
    with pytest.warns(RuntimeWarning, match=r"tested with triton>=3\.6,<3\.10"):
        text = versions.check_installed("3.5.0")
    assert "3.6.0, 3.7.1, 3.8.0, 3.9.0" in text and "3.5.0" in text
    with pytest.warns(RuntimeWarning):
        versions.check_installed("3.10.0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert versions.check_installed("3.9.0+git1234") is None


def test_pyproject_states_the_supported_range():
    from pathlib import Path

    text = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    assert f'"{versions.range_text()}"' in text


def test_interpreter_on_triton_36_refuses_numpy_23_with_the_fix(monkeypatch):
    """Triton 3.6's interpreter fails on numpy >= 2.3 deep inside a kernel; evtfuse's
    interpreter target says so up front, with the fix. Newer Tritons take any numpy."""
    import numpy

    monkeypatch.setattr(versions, "installed", lambda: (3, 6, 0))
    monkeypatch.setattr(numpy, "__version__", "2.4.6")
    why = versions.interpreter_refusal()
    assert "numpy<2.3" in why and "2.4.6" in why
    monkeypatch.setattr(numpy, "__version__", "2.2.6")
    assert versions.interpreter_refusal() is None
    monkeypatch.setattr(versions, "installed", lambda: (3, 9, 0))
    monkeypatch.setattr(numpy, "__version__", "2.4.6")
    assert versions.interpreter_refusal() is None


def test_interpreter_refusal_reaches_explain(monkeypatch):
    import torch

    from evtfuse import EpilogueArguments, GemmArguments, explain, get_kernels

    from evtfuse.backends.triton import family_base

    monkeypatch.setattr(family_base, "interpreter_refusal", lambda: "needs numpy<2.3 (test)")
    A, B, D = torch.randn(8, 8), torch.randn(8, 8), torch.empty(8, 8)
    epi = EpilogueArguments("def epi(accum): D = accum; return D", D=D)
    args = GemmArguments(A, B, D, epilogue=epi)
    assert get_kernels(args) == [] and "needs numpy<2.3 (test)" in explain(args)


def test_every_launch_asks_for_fp_fusion_whatever_the_default():
    """Triton 3.9 warns that 3.10 turns FMA contraction off by default; evtfuse's kernels
    are tuned and tested with it, so every launch passes ``versions.LAUNCH_OPTIONS``."""
    from evtfuse.runtime.kernel import LaunchPlan

    assert versions.LAUNCH_OPTIONS == {"enable_fp_fusion": True}
    seen = []

    class Jit:
        arg_names = ["x", "BLOCK"]

        def __getitem__(self, grid):
            return lambda *pos, **kw: seen.append(kw)

    LaunchPlan(Jit(), [1], {"BLOCK": 4}, (1,), None)(None, None, {})
    assert seen == [{"BLOCK": 4, "enable_fp_fusion": True}]


def test_importing_evtfuse_imports_neither_triton_nor_dynamo():
    """``use_interpreter()`` after ``import evtfuse`` (what ``evtfuse demo`` does without a
    GPU) needs Triton imported afterwards: imported before, its library functions are
    compiled ones, which the interpreter cannot call ("Cannot call @triton.jit'd outside
    of the scope of a kernel"). torch._dynamo would import it (and take a second)."""
    import subprocess
    import sys

    code = "import sys, evtfuse; print('triton' in sys.modules, 'torch._dynamo' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


def test_constant_result_marks_as_torch_compiler_does():
    import torch

    from evtfuse.runtime.torch_op import constant_result

    def f():
        return 1

    def g():
        return 1

    constant_result(f)
    torch.compiler.assume_constant_result(g)
    assert {k: v for k, v in vars(f).items()} == {k: v for k, v in vars(g).items()} != {}
