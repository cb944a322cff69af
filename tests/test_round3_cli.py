"""Issue 46, round 3: the command line and the modules never answer with a traceback
(CPU tier, through Triton's interpreter).

* ``-f`` / ``-e`` text that is not UTF-8, an epilogue too deep for Python's parser (a
  20,000-term sum, 20,000 nested signs), a ``--mnkl`` whose tensors cannot be allocated,
  ``-f`` on a folder or a FIFO: one ``error:`` line naming the argument, status 2;
* ``evtfuse.nn.Linear``'s repr shows the epilogue itself (the library call that made it,
  else its source on one line);
* ``evtfuse cache list`` lists the kernel modules and tuning records the cache holds.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from evtfuse import EpilogueArguments, EpilogueError
from evtfuse.cli import app
from evtfuse.cli import problem as cli_problem

from blocking import finishes

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-interpreter tier")

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


@pytest.fixture(autouse=True)
def cpu(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("EVTFUSE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("EVTFUSE_LOG", raising=False)


def invoke(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def _refused(res, *phrases: str) -> str:
    """The command ended with status 2 and one ``error:`` message holding ``phrases``,
    without a traceback."""
    out = res.output
    assert res.exit_code == 2, out
    assert "Traceback" not in out and "error: " in out, out
    for phrase in phrases:
        assert phrase in out, (phrase, out)
    return out


RUN = ("--iterations", "0", "--no-eager")
SUM = "def epi(accum):\n    D = " + " + ".join(["accum"] * 20000) + "\n    return D\n"
SIGNS = "def epi(accum):\n    D = " + "- " * 20000 + "accum\n    return D\n"


# ------------------------------------------------------------------ text that is not UTF-8

def test_an_epilogue_file_that_is_not_utf8_is_refused_with_the_byte_and_line(tmp_path):
    path = tmp_path / "epi.py"
    path.write_bytes(b"def epi(accum):\n    D = accum  # \xff\xfe\n    return D\n")
    _refused(invoke("run", "-f", str(path), *RUN),
             f"epilogue file '{path}' is not UTF-8 text", "0xff", "line 2")
    # in the first two lines Python's own reading (its coding line) fails first
    path.write_bytes(b"\xff\ndef epi(accum):\n    D = accum\n    return D\n")
    _refused(invoke("run", "-f", str(path), *RUN), "is not UTF-8 text", "0xff", "line 1")


def test_an_epilogue_file_declaring_its_coding_is_read_in_it(tmp_path):
    path = tmp_path / "latin.py"
    path.write_bytes(b"# -*- coding: latin-1 -*-\ndef epi(accum):\n"
                     b"    D = relu(accum)  # \xe9\n    return D\n")
    res = invoke("run", "-f", str(path), *RUN)
    assert res.exit_code == 0, res.output


def test_an_epilogue_option_with_a_byte_that_is_not_utf8_is_refused():
    # Python hands a command line's byte 0xff to the program as '\udcff'
    src = "def epi(accum): D = accum\udcff; return D"
    _refused(invoke("run", "-e", src, *RUN), "--epilogue is not UTF-8 text", "0xff")
    _refused(invoke("show", src), "the epilogue argument is not UTF-8 text", "0xff")


@pytest.mark.slow
def test_a_real_command_line_byte_that_is_not_utf8_is_refused():
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), CUDA_VISIBLE_DEVICES="")
    res = subprocess.run([sys.executable.encode(), b"-m", b"evtfuse.cli", b"run", b"-e",
                          b"def epi(accum): D = accum\xff; return D", *map(str.encode, RUN)],
                         env=env, capture_output=True, timeout=300)
    err = res.stderr.decode("utf-8", "replace")
    assert res.returncode == 2, err
    assert "Traceback" not in err and "--epilogue is not UTF-8 text: the byte 0xff" in err, err


def test_the_library_refuses_a_lone_surrogate_as_an_epilogue_error():
    with pytest.raises(EpilogueError, match="not valid text: the byte 0xff") as info:
        EpilogueArguments("def epi(accum):\n    D = accum\udcff\n    return D",
                          D=torch.empty(4, 4))
    assert info.value.line == 2 and "\\xff" in str(info.value)
    errors_md = (ROOT / "docs" / "errors.md").read_text()
    assert info.value.bare_message in errors_md  # docs/errors.md explains it


# ------------------------------------------------------------------ too deep to parse

def test_run_f_on_a_20000_term_sum_gives_the_librarys_error(tmp_path):
    path = tmp_path / "deep.py"
    path.write_text(SUM)
    with pytest.raises(EpilogueError) as lib:  # what the library says for the same text
        EpilogueArguments(SUM, D=torch.empty(4, 4))
    out = _refused(invoke("run", "-f", str(path), *RUN),
                   f"line 2 of {path}: the value of 'D' is nested too deep")
    assert lib.value.bare_message in out
    assert len(out) < 1000  # the 160,000-character line is quoted shortened


def test_20000_nested_signs_are_an_epilogue_error_in_the_library_and_the_cli(tmp_path):
    """Python's parser raises MemoryError (not RecursionError) for thousands of signs."""
    with pytest.raises(EpilogueError, match="nested too deep") as info:
        EpilogueArguments(SIGNS, D=torch.empty(4, 4))
    assert (info.value.line, info.value.variable) == (2, "D")
    path = tmp_path / "signs.py"
    path.write_text(SIGNS)
    _refused(invoke("run", "-f", str(path), *RUN), "line 2 of", "'D' is nested too deep")
    _refused(invoke("run", "-e", SIGNS, *RUN), "'D' is nested too deep")


def test_the_library_refuses_a_too_deep_activation_expression():
    from evtfuse import library

    with pytest.raises(EpilogueError, match="nested too deep") as info:
        library.lin_comb_generic("- " * 20000 + "x")
    assert info.value.variable == "activation" and len(str(info.value)) < 400


# ------------------------------------------------------------------ --mnkl too large

def test_a_huge_mnkl_is_refused_before_anything_is_allocated(monkeypatch):
    def no_allocation(*a, **kw):
        raise AssertionError("allocated")

    monkeypatch.setattr(torch, "randn", no_allocation)
    monkeypatch.setattr(torch, "empty", no_allocation)
    out = _refused(invoke("run", "-e", "def epi(accum, C): D = accum + C; return D",
                          "--mnkl", "10000000x10000000x10000000", *RUN),
                   "--mnkl 10000000,10000000,10000000,1", "PiB", "available")
    assert "give smaller sizes" in out


def test_an_allocation_that_fails_anyway_names_mnkl(monkeypatch):
    """When the estimate lets a problem through (memory unknown) and the allocation fails,
    the error still names --mnkl."""
    monkeypatch.setattr(cli_problem, "host_available_bytes", lambda: None)
    _refused(invoke("run", "-e", "def epi(accum): D = accum; return D",
                    "--mnkl", "10000000x10000000x10000000", *RUN),
             "--mnkl 10000000,10000000,10000000,1: the problem does not fit in memory")


def test_the_estimate_counts_every_tensor():
    spec = cli_problem.ProblemSpec(64, 32, 16, 2, torch.float16, torch.float16, torch.float32,
                                   torch.float32, outputs={"m": ("row", None)})
    from evtfuse.frontend import parse_epilogue

    parsed = parse_epilogue("def epi(accum, C, bias, alpha): F = alpha * accum + C + bias; "
                            "D = relu(F); m = max(D); return D, m")
    on_device, staging = cli_problem.problem_bytes(spec, parsed)
    want = (2 * 64 * 16 + 2 * 16 * 32) * 2  # A and B, fp16
    want += 2 * 64 * 32 * 2 + 32 * 4  # C (full, fp16), bias (N,) fp32; alpha is a scalar
    want += 2 * 64 * 32 * 4 + 2 * 64 * 4  # D (fp32), m per row (fp32)
    assert on_device == want
    assert staging == 8 * 2 * 64 * 32  # the largest drawn (C), fp32 and scaled


# ------------------------------------------------------------------ -f on what is no file

def test_f_on_a_directory_says_so(tmp_path):
    _refused(invoke("run", "-f", str(tmp_path), *RUN), f"'{tmp_path}' is a directory")
    _refused(invoke("show", str(tmp_path)), "is a directory")


def test_f_on_a_fifo_says_so_and_never_blocks(tmp_path):
    fifo = tmp_path / "epi.py"
    os.mkfifo(fifo)
    res = finishes(lambda: invoke("run", "-f", str(fifo), *RUN), [fifo])
    _refused(res, f"'{fifo}' is not a regular file")
    res = finishes(lambda: invoke("run", "-f", f"{fifo}:epi", *RUN), [fifo])
    _refused(res, "is not a regular file")


def test_f_on_a_missing_file_still_says_it_does_not_exist(tmp_path):
    _refused(invoke("run", "-f", str(tmp_path / "nope.py"), *RUN), "does not exist")


# ------------------------------------------------------------------ evtfuse.nn reprs

def relu_bias(accum, bias):
    """A docstring the repr leaves out."""
    D = relu(accum + bias)  # noqa: F821 (read by evtfuse, never run)  a comment too
    return D


def test_linear_repr_shows_a_function_epilogue_as_its_source_on_one_line():
    from evtfuse.nn import Linear

    text = repr(Linear(4, 8, epilogue=relu_bias))
    assert 'epilogue="def relu_bias(accum, bias): D = relu(accum + bias); return D")' in text
    text = repr(Linear(4, 8, epilogue="def e(accum, bias, scale):\n    D = (accum + bias) * "
                       "scale\n    return D", scale=0.5, backward="save"))
    assert text.endswith('epilogue="def e(accum, bias, scale): D = (accum + bias) * scale; '
                         'return D", scale=0.5, backward=\'save\')'), text


def test_linear_repr_shows_a_library_epilogue_as_the_call_that_made_it():
    from evtfuse import library
    from evtfuse.nn import Linear, fuse_activations

    lin = Linear(4, 8, bias=False, epilogue=library.gated("swiglu", layout="concatenated"))
    assert 'epilogue=gated("swiglu", layout="concatenated"))' in repr(lin)
    lin = Linear(4, 8, epilogue=library.lin_comb_bias_elt_act("relu", "nothing"))
    assert 'epilogue=lin_comb_bias_elt_act("relu", "nothing"))' in repr(lin)
    lin = Linear(4, 8, bias=False, epilogue=library.SWIGLU)
    assert 'epilogue=gated("swiglu"))' in repr(lin)
    model = fuse_activations(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.SiLU()))
    assert 'epilogue=with_activation("silu"))' in repr(model)


def test_linear_repr_cuts_a_long_epilogue():
    from evtfuse.nn import Linear

    src = "def e(accum, bias):\n    D = " + " + ".join(["bias"] * 1500) + " + accum\n    return D"
    text = repr(Linear(4, 8, epilogue=src))
    assert 'epilogue="def e(accum, bias): D = bias + bias' in text and '...")' in text
    assert len(text) < 300


# ------------------------------------------------------------------ evtfuse cache list

@pytest.mark.usefixtures("own_cache")  # conftest.py: no kernel module loaded in this process
def test_cache_list_shows_the_kernel_modules_a_gemm_wrote_and_the_tuning_choices():
    import re

    import evtfuse
    from evtfuse.runtime import cache

    A, B = torch.randn(16, 8), torch.randn(8, 16)
    D = evtfuse.gemm(A, B, "def round3_epi(accum): D = relu(accum) * 3.25; return D")
    torch.testing.assert_close(D, torch.relu(A @ B) * 3.25, rtol=1e-4, atol=1e-4)
    modules = sorted((cache.cache_dir() / "kernels").glob("k*.py"))
    assert modules  # what the gemm compiled is on disk
    res = invoke("cache", "list")
    out = res.output
    assert res.exit_code == 0 and "no entries" not in out, out
    assert "kernel modules (kernels/):" in out
    for path in modules:
        size = path.stat().st_size
        shown = f"{size} bytes" if size < 1024 else f"{size / 1024:.1f} KiB"
        assert re.search(rf"{path.name}  portable  epilogue round3_epi  {re.escape(shown)}",
                         out), out
    n = len(modules)
    assert f"{n} entr{'y' if n == 1 else 'ies'}: {n} kernel module" in out, out

    problem = {"M": 16, "N": 16, "K": 8, "L": 1, "dtype": "torch.float32",
               "epilogue": "round3_epi", "tune": "fast", "device": "cpu"}
    cache.store_choice("t1", {"kernel": "portable_32x32x32", "ms": 0.25, **problem})
    out = invoke("cache", "list").output
    record = cache.cache_dir() / "tuning" / "t1.json"
    assert "tuning choices (tuning/):" in out and "portable_32x32x32  K=8" in out
    assert f"({record.stat().st_size} bytes)" in out
    assert f"{n + 1} entries: {n} kernel module" in out and "1 tuning choice" in out, out
    res = invoke("cache", "clear")
    assert f"removed {n + 1} files" in res.output
    assert "no entries" in invoke("cache", "list").output


@pytest.mark.usefixtures("own_cache")
def test_cache_list_skips_a_kernel_module_that_is_not_a_file_and_names_other_versions():
    from evtfuse.runtime import cache

    kernels = cache.cache_dir() / "kernels"
    kernels.mkdir(parents=True)
    os.mkfifo(kernels / "kfifo.py")
    (kernels / "kdir.py").mkdir()
    (kernels / "kplain.py").write_text("x = 1\n")  # not evtfuse's header: shown as '?'
    old = cache.cache_dir().parent / "v0.0.1-triton3.0.0-torch2.4.0" / "tuning"
    old.mkdir(parents=True)
    (old / "a.json").write_text("{}")
    res = finishes(lambda: invoke("cache", "list"), [kernels / "kfifo.py"])
    assert res.exit_code == 0, res.output
    assert "kplain.py  ?  epilogue ?  6 bytes" in res.output
    assert "kfifo" not in res.output and "kdir" not in res.output
    assert "other version v0.0.1-triton3.0.0-torch2.4.0: 1 file (2 bytes" in res.output
    assert "1 entry: 1 kernel module (6 bytes)" in res.output
