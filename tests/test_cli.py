"""The ``evtfuse`` command line, run in-process through typer's CliRunner on the CPU.

Kernels run through Triton's interpreter (the CLI turns it on when there is no GPU; the
``cpu`` fixture makes sure of it and restores the environment afterwards).
"""

from __future__ import annotations

import copy
import logging
import os
import stat
import sys
import types
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from evtfuse import cli
from evtfuse.cli import app

runner = CliRunner()


@pytest.fixture(autouse=True)
def cpu(request, monkeypatch, tmp_path):
    if request.node.get_closest_marker("gpu"):
        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA GPU")
        monkeypatch.setenv("EVTFUSE_CACHE_DIR", str(tmp_path / "cache"))
        return
    if torch.cuda.is_available():
        pytest.skip("these tests exercise the CPU path")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("EVTFUSE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("EVTFUSE_LOG", raising=False)


def invoke(*args: str, **kw):
    return runner.invoke(app, list(args), catch_exceptions=False, **kw)


# ---------------------------------------------------------------------------- help

@pytest.mark.parametrize("command", [[], ["demo"], ["run"], ["show"], ["profile"], ["bench"],
                                     ["cache"], ["cache", "list"], ["cache", "clear"]])
def test_every_command_has_help(command):
    res = invoke(*command, "--help")
    assert res.exit_code == 0, res.output
    assert "Usage: evtfuse" in res.output
    if not command:
        for name in ("demo", "run", "show", "profile", "bench", "cache"):
            assert name in res.output
    if command == ["run"]:
        for flag in ("--epilogue-file", "--mnkl", "--ab-dtype", "--c-dtype", "--d-dtype",
                     "--acc-dtype", "--a-major", "--b-major", "--scalar", "--alpha", "--beta",
                     "--verify", "--iterations"):
            assert flag in res.output


def test_no_arguments_prints_usage():
    res = runner.invoke(app, [])
    assert "Usage: evtfuse" in res.output


# ---------------------------------------------------------------------------- show

EPI_FILE = '''\
import pathlib
pathlib.Path(__file__).with_name("EXECUTED").write_text("the file was run")

def helper(x):
    return x


@some_decorator(never_evaluated=True)
def my_epi(accum, C, alpha, bias):
    F = alpha * accum + C + bias
    D = gelu(F)
    return D, F


def broken(accum, C):
    D = accum + C
    D = D * 2.0
    return D
'''


@pytest.fixture
def epi_file(tmp_path) -> Path:
    p = tmp_path / "epis.py"
    p.write_text(EPI_FILE)
    return p


def test_show_a_string_prints_dag_evt_and_kernel():
    res = invoke("show", "def epi(accum, C, alpha): F = alpha * accum + C; D = relu(F); return D, F",
                 "--alpha", "2.5", "--mnkl", "64,48,32,1")
    assert res.exit_code == 0, res.output
    out = res.output
    assert "== DAG ==" in out and "load alpha : runtime scalar" in out and "relu(" in out
    assert "== EVT ==" in out and "Sm90EVT<Sm90AuxStore<D>>" in out and "Sm90AccFetch" in out
    assert "Sm90Compute<ReLu>" in out
    assert "== kernel " in out and "@triton.jit" in out and "def evtfuse_kernel" in out
    assert "alpha: runtime scalar = 2.5" in out


def test_show_a_file_is_parsed_never_run(epi_file):
    res = invoke("show", f"{epi_file}:my_epi", "--mnkl", "64,48,32,1", "--no-source")
    assert res.exit_code == 0, res.output
    assert not (epi_file.parent / "EXECUTED").exists(), "the epilogue file must never be executed"
    assert "dag my_epi(C, alpha, bias)" in res.output
    assert "line 10" in res.output  # line numbers are the file's
    assert "bias: col (48,)" in res.output and "Sm90RowBroadcast<bias>" in res.output
    assert "== kernel" not in res.output


def test_show_file_errors_name_the_file_line(epi_file):
    res = invoke("show", f"{epi_file}:broken", "--no-source")
    assert res.exit_code == 2
    assert "Variable 'D' cannot be defined twice." in res.output
    res = invoke("show", f"{epi_file}:nope")
    assert res.exit_code == 2 and "no top-level function 'nope'" in res.output
    assert "helper, my_epi, broken" in res.output
    res = invoke("show", str(epi_file))  # two functions take accum: ambiguous
    assert res.exit_code == 2 and "my_epi, broken" in res.output
    res = invoke("show", str(epi_file.with_name("missing.py")) + ":f")
    assert res.exit_code == 2 and "does not exist" in res.output


def test_show_prints_the_backward_epilogue():
    res = invoke("show", "def e(accum, C, bias): F = accum * C; D = tanh(F + bias); "
                 "m = max(D); return D, m", "--mnkl", "32,16,8,2", "--output", "m=row",
                 "--no-source")
    assert res.exit_code == 0, res.output
    out = res.output
    assert "== backward: the gradients of A, B, C, bias from those of D, m ==" in out
    assert "# the forward keeps its argument for m's gradient (an extra output)" in out
    assert "def e_backward(accum, C, bias, grad_D, grad_saved_m_arg):" in out
    assert "grad_bias = sum(" in out and "tanh(" in out and "return D, grad_C, grad_bias" in out
    assert "== backward DAG ==" in out and "store grad_bias <-" in out
    assert "# backward mode: recompute (backward=\"auto\" saves when K >= 512 for float16 A " \
           "and B; here K = 8)" in out
    assert "== backward with backward=\"save\" ==" in out
    res = invoke("show", "def e(accum): D = cast(accum, 'int8') * 2.0; return D", "--no-source")
    assert res.exit_code == 0 and "not differentiable: line 1" in res.output
    res = invoke("show", "def e(accum): D = accum; return D", "--no-source", "--no-backward")
    assert res.exit_code == 0 and "== backward" not in res.output


def test_show_says_which_backward_mode_auto_picks():
    """Large K: "save" (the backward reads the saved accumulator, no accum); the recompute
    form follows. A linear layer's backward reads no accumulator in either mode."""
    gelu = "def e(accum, bias): D = gelu_tanh(accum + bias); return D"
    res = invoke("show", gelu, "--mnkl", "64,128,1024,1", "--ab-dtype", "f16", "--no-source")
    assert res.exit_code == 0, res.output
    out = res.output
    assert "# backward mode: save (backward=\"auto\" saves when K >= 512 for float16 A and B; " \
           "here K = 1024): the forward stores accum (float16" in out
    chosen, other = out.split("== backward with backward=\"recompute\" ==")
    assert "def e_backward(accum, bias, grad_D, saved_accum" in chosen
    assert "(accum + bias)" not in chosen and "(accum + bias)" in other
    res = invoke("show", "def e(accum, bias): D = accum + bias; return D", "--no-source")
    assert res.exit_code == 0 and "the backward reads no accumulator" in res.output
    assert "== backward with" not in res.output


def test_show_a_gated_epilogue_and_its_backward():
    """N is the output's width (B gets 2N columns); the recompute backward is itself gated,
    its operand gradients summed by torch, dAccum interleaved."""
    src = ("def e(accum, bias_gate):\n    gate, up = pairs(accum)\n"
           "    D = silu(gate + bias_gate) * up\n    return D")
    res = invoke("show", src, "--mnkl", "32,16,8,1", "--operand", "bias_gate=col", "--no-source")
    assert res.exit_code == 0, res.output
    chosen = res.output.split("== backward with")[0]
    assert "= pairs(accum)" in chosen and "gated: pairs(accum)" in chosen
    assert "grad_bias_gate: summed by torch" in chosen
    assert "the gradients of gate and up interleaved" in chosen


def test_show_operand_and_output_kinds():
    res = invoke("show", "def e(accum, s, r): D = accum * s + r; return D", "--mnkl",
                 "32,16,8,3", "--operand", "s=batch-scalar", "--operand", "r=row:f16",
                 "--no-source")
    assert res.exit_code == 0, res.output
    assert "s: batch-scalar (3, 1, 1) f32" in res.output
    assert "r: row (3, 32, 1) f16" in res.output
    assert "device scalar f32 per batch" in res.output and "per-row vector f16" in res.output


# ---------------------------------------------------------------------------- run

def test_run_verifies_on_the_cpu():
    res = invoke("run", "-e", "def epi(accum, C, alpha, bias): D = relu(alpha * accum + C + bias); "
                 "return D", "--mnkl", "48,40,24,2", "--alpha", "1.5", "--verify",
                 "--b-major", "k", "--a-major", "m")
    assert res.exit_code == 0, res.output
    out = res.output
    assert "Triton's CPU interpreter" in out
    assert "A f16 m-major, B f16 k-major" in out
    assert "kernel:   portable" in out and "verify:   PASSED" in out and "ok   D:" in out
    assert "C: full (2, 48, 40) f16" in out and "alpha: runtime scalar = 1.5" in out
    assert "timings are not meaningful" in out


def test_run_epilogue_file_scalars_dtypes_and_outputs(epi_file):
    res = invoke("run", "-f", f"{epi_file}:my_epi", "--mnkl", "32,24,16", "--ab-dtype", "f32",
                 "--c-dtype", "f16", "--d-dtype", "f32", "--scalar", "alpha=-0.5",
                 "--output", "F=full:f16", "--verify", "--iterations", "0")
    assert res.exit_code == 0, res.output
    assert not (epi_file.parent / "EXECUTED").exists()
    assert "alpha: runtime scalar = -0.5" in res.output
    assert "D: output full (32, 24) f32" in res.output and "F: output full (32, 24) f16" in res.output
    assert "ok   D:" in res.output and "ok   F:" in res.output
    assert "time:" not in res.output


def test_run_verification_failure_exits_1(monkeypatch):
    from evtfuse.runtime.kernel import Kernel

    class Broken(Kernel):
        def run(self, args):  # a kernel that writes a wrong D
            super().run(args)
            args.out.mul_(1.5)

    from evtfuse.cli import report

    real = report.choose_kernel

    def broken_choice(args, name_filter=None, tune="none"):
        k = copy.copy(real(args, name_filter, tune))
        k.__class__ = Broken
        return k

    monkeypatch.setattr(report, "choose_kernel", broken_choice)
    res = invoke("run", "-e", "def e(accum, C): D = accum + C; return D", "--mnkl", "32,32,16",
                 "--verify", "--iterations", "0")
    assert res.exit_code == 1, res.output
    assert "verify:   FAILED" in res.output and "FAIL D" in res.output
    res = invoke("demo", "--size", "32,32,16", "--iterations", "1")
    assert res.exit_code == 1 and "VERIFICATION FAILED" in res.output


def test_run_tune_modes():
    for mode in ("none", "exhaustive"):
        res = invoke("run", "-e", "def e(accum): D = accum * 0.5; return D", "--mnkl", "32,16,16",
                     "--tune", mode, "--iterations", "0", "--verify")
        assert res.exit_code == 0 and "verify:   PASSED" in res.output, res.output
    res = invoke("run", "-e", "def e(accum): D = accum; return D", "--tune", "slow")
    assert res.exit_code == 2 and "--tune is one of fast, exhaustive, none" in res.output
    res = invoke("run", "-e", "def e(accum): D = accum; return D", "--mnkl", "32,16,16",
                 "--kernel", "16x16x16", "--iterations", "0")
    assert res.exit_code == 0 and "kernel:   portable_16x16x16" in res.output
    res = invoke("run", "-e", "def e(accum): D = accum; return D", "--mnkl", "32,16,16",
                 "--kernel", "no-such-kernel")
    assert res.exit_code == 3 and "no kernel named like 'no-such-kernel'" in res.output


def test_run_unsupported_prints_explain_and_exits_3():
    res = invoke("run", "-e", "def e(accum): D = accum; return D", "--mnkl", "32,32,16",
                 "--ab-dtype", "e4m3")  # fp8 is refused under the CPU interpreter
    assert res.exit_code == 3, res.output
    assert "no kernel supports this problem" in res.output
    assert "portable: refused:" in res.output and "fp8 needs a GPU" in res.output


def test_run_with_a_reduction_output():
    res = invoke("run", "-e", "def e(accum): D = accum; m = max(abs(accum)); return D, m",
                 "--mnkl", "32,32,16", "--output", "m=row", "--verify", "--iterations", "0")
    assert "m: output row (32, 1) f32" in res.output
    if res.exit_code == 3:  # reductions not implemented by the kernels yet: explain says so
        assert "reduction" in res.output
    else:
        assert res.exit_code == 0 and "ok   m:" in res.output, res.output


@pytest.mark.parametrize("flag, fast", [([], True), (["--fp8-promote"], False),
                                        (["--fp8-fast-accum"], True)])
def test_run_fp8_accumulation_flag_reaches_the_arguments(monkeypatch, flag, fast):
    """``--fp8-promote`` / ``--fp8-fast-accum`` set ``GemmArguments.fp8_fast_accum`` (fp8
    itself is refused under the interpreter, exit 3, after the problem is built)."""
    from evtfuse.cli import commands

    built = []
    real = commands.build_problem
    monkeypatch.setattr(commands, "build_problem",
                        lambda *a: built.append(real(*a)) or built[-1])
    res = invoke("run", "-e", "def e(accum): D = accum; return D", "--mnkl", "32,32,32",
                 "--ab-dtype", "e4m3", "--d-dtype", "f32", "--b-major", "k", *flag)
    assert res.exit_code == 3 and "fp8 needs a GPU" in res.output, res.output
    assert built and built[0].args.fp8_fast_accum is fast
    assert built[0].args.A.dtype == torch.float8_e4m3fn


@pytest.mark.parametrize("args, message", [
    (["--mnkl", "1,2"], "--mnkl takes M,N,K[,L]"),
    (["--mnkl", "a,b,c"], "as integers"),
    (["--ab-dtype", "f7"], "unknown dtype 'f7'"),
    (["--scalar", "alpha"], "--scalar takes NAME=VALUE"),
    (["--scalar", "alpha=x"], "not a number"),
    (["--scalar", "gamma=1"], "'gamma' is not a parameter of e(accum, C, alpha)"),
    (["--operand", "C=diagonal"], "kind is one of full, row, col"),
    (["--output", "Z=full"], "'Z' is not an output of e"),
    (["--a-major", "n"], "--a-major is k"),
    (["--b-major", "m"], "--b-major is n"),
])
def test_run_bad_flags_exit_2(args, message):
    res = invoke("run", "-e", "def e(accum, C, alpha): D = alpha * accum + C; return D", *args)
    assert res.exit_code == 2, res.output
    assert message in res.output


def test_run_epilogue_errors_exit_2():
    res = invoke("run", "-e", "def e(accum):\n    D = softmin(accum)\n    return D")
    assert res.exit_code == 2 and "unknown function 'softmin'" in res.output
    assert "line 2" in res.output
    res = invoke("run")
    assert res.exit_code == 2 and "no epilogue" in res.output
    res = invoke("run", "-e", "def e(accum): D = accum; return D", "-f", "x.py:e")
    assert res.exit_code == 2 and "not both" in res.output


# ---------------------------------------------------------------------------- demo

def test_demo_on_the_cpu():
    res = invoke("demo")
    assert res.exit_code == 0, res.output
    out = res.output
    assert "Triton's CPU interpreter" in out and "M=128 N=96 K=64" in out
    assert "D = accum * alpha + C * beta + X * x_factor" in out and "Y = accum" in out
    assert "D = relu(F)" in out
    assert out.count("verify:   PASSED") == 2
    assert "ok   Y:" in out and "ok   F:" in out
    assert out.count("kernel:   ") == 2 and "time:     fused" in out and "eager torch" in out
    assert "demo: all outputs match the reference" in out


# ---------------------------------------------------------------------------- profile

NCU_CSV = '''==PROF== Connected to process 123
"ID","Kernel Name","launch__registers_per_thread","dram__bytes.sum.per_second","sm__throughput.avg.pct_of_peak_sustained_elapsed","launch__shared_mem_per_block_dynamic"
"","","register/thread","Tbyte/second","%","Kbyte/block"
"0","evtfuse_kernel","168","2.71","87.5","180.22"
'''


def _fake_ncu(folder: Path, body: str) -> None:
    script = folder / "ncu"
    script.write_text(f"#!/bin/sh\necho \"$@\" > {folder / 'ncu_args'}\ncat <<'EOF'\n{body}EOF\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_profile_without_ncu(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    res = invoke("profile", "-e", "def e(accum): D = accum; return D")
    assert res.exit_code == 4
    assert "`ncu` is not on PATH" in res.output


def test_profile_reads_ncu_metrics(monkeypatch, tmp_path):
    _fake_ncu(tmp_path, NCU_CSV)
    monkeypatch.setenv("PATH", str(tmp_path) + os.pathsep + os.environ["PATH"])
    res = invoke("profile", "-e", "def e(accum): D = accum; return D", "--mnkl", "64,64,64")
    assert res.exit_code == 0, res.output
    assert "kernel: evtfuse_kernel" in res.output
    assert "registers per thread" in res.output and "168 register/thread" in res.output
    assert "achieved DRAM bandwidth" in res.output and "2.71 Tbyte/second" in res.output
    assert "SM throughput (% of peak)" in res.output and "87.5 %" in res.output
    assert "kernel:   portable" in res.output  # the run before ncu, which tunes and caches
    forwarded = (tmp_path / "ncu_args").read_text()
    assert "-m evtfuse.cli run -e def e(accum)" in forwarded and "--mnkl 64,64,64" in forwarded
    assert "--metrics launch__registers_per_thread" in forwarded


@pytest.mark.slow
def test_profile_reports_input_errors_before_ncu(monkeypatch, tmp_path):
    _fake_ncu(tmp_path, NCU_CSV)
    monkeypatch.setenv("PATH", str(tmp_path) + os.pathsep + os.environ["PATH"])
    res = invoke("profile", "-e", "def e(accum): D = nope(accum); return D")
    assert res.exit_code == 2 and "unknown function 'nope'" in res.output
    assert not (tmp_path / "ncu_args").exists()


@pytest.mark.slow
def test_profile_reports_an_ncu_failure(monkeypatch, tmp_path):
    _fake_ncu(tmp_path, "==ERROR== no kernels were profiled\n")
    monkeypatch.setenv("PATH", str(tmp_path) + os.pathsep + os.environ["PATH"])
    res = invoke("profile", "-e", "def e(accum): D = accum; return D")
    assert res.exit_code != 0 and "no profiled kernel" in res.output


def test_parse_ncu_csv():
    rows = cli.parse_ncu_csv(NCU_CSV)
    assert rows == [{"ID": ("0", ""), "Kernel Name": ("evtfuse_kernel", ""),
                     "launch__registers_per_thread": ("168", "register/thread"),
                     "dram__bytes.sum.per_second": ("2.71", "Tbyte/second"),
                     "sm__throughput.avg.pct_of_peak_sustained_elapsed": ("87.5", "%"),
                     "launch__shared_mem_per_block_dynamic": ("180.22", "Kbyte/block")}]
    assert cli.parse_ncu_csv("nothing here") == []


# ---------------------------------------------------------------------------- bench

def test_bench_forwards_its_arguments(monkeypatch):
    seen = {}

    def fake_main(argv):
        seen["argv"] = argv
        return 0

    monkeypatch.setitem(sys.modules, "evtfuse.bench", types.SimpleNamespace(main=fake_main))
    res = invoke("bench", "--quick", "--out", "results.json", "--", "--help")
    assert res.exit_code == 0, res.output
    assert seen["argv"][:3] == ["--quick", "--out", "results.json"]
    assert "--help" in seen["argv"]


def test_bench_exit_status_is_the_benchmarks(monkeypatch):
    def fake_main(argv):
        raise SystemExit(2)

    monkeypatch.setitem(sys.modules, "evtfuse.bench", types.SimpleNamespace(main=fake_main))
    assert invoke("bench", "--bad").exit_code == 2


def test_bench_with_a_missing_dependency_says_so(monkeypatch):
    import importlib

    real = importlib.import_module

    def fake_import(name, *a, **kw):
        if name == "evtfuse.bench":
            raise ModuleNotFoundError("No module named 'matplotlib'", name="matplotlib")
        return real(name, *a, **kw)

    monkeypatch.setattr(importlib, "import_module", fake_import)
    res = invoke("bench")
    assert res.exit_code == 4 and "No module named 'matplotlib'" in res.output
    assert "pip install" in res.output


def test_bench_missing_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "evtfuse.bench", types.SimpleNamespace())
    res = invoke("bench")
    assert res.exit_code == 4
    assert "evtfuse.bench (with a main(argv) function) is not available" in res.output


# ---------------------------------------------------------------------------- cache

def test_cache_list_and_clear(tmp_path):
    from evtfuse.runtime import cache

    res = invoke("cache", "list")
    assert res.exit_code == 0 and "no entries" in res.output
    assert str(tmp_path / "cache") in res.output  # EVTFUSE_CACHE_DIR is honoured
    problem = {"M": 64, "N": 64, "K": 32, "L": 1, "dtype": "torch.float16", "epilogue": "epi",
               "tune": "fast", "device": "cpu"}  # what the tuner writes beside the kernel
    cache.store_choice("k1", {"kernel": "portable_32x32x32", "ms": 1.25, **problem})
    cache.store_choice("k2", {"kernel": "hopper_128x256x64", "ms": 0.5, **problem})
    res = invoke("cache", "list")
    assert res.exit_code == 0, res.output
    assert "portable_32x32x32  K=32, L=1, M=64" in res.output and "ms=1.25" in res.output
    assert "hopper_128x256x64" in res.output
    assert "2 entries" in res.output
    res = invoke("cache", "clear")
    assert res.exit_code == 0 and "removed 2 files" in res.output
    assert "no entries" in invoke("cache", "list").output


# ---------------------------------------------------------------------------- logging

def test_logging_is_quiet_by_default_and_env_controlled(monkeypatch):
    assert cli.setup_logging() == logging.WARNING
    monkeypatch.setenv("EVTFUSE_LOG", "debug")
    assert cli.setup_logging() == logging.DEBUG
    monkeypatch.setenv("EVTFUSE_LOG", "")
    assert cli.setup_logging(verbose=1) == logging.INFO
    assert cli.setup_logging(verbose=2) == logging.DEBUG
    handlers = [h for h in logging.getLogger("evtfuse").handlers if getattr(h, "_evtfuse_cli", 0)]
    assert len(handlers) == 1
    cli.setup_logging()


def test_debug_log_shows_kernel_decisions(monkeypatch):
    monkeypatch.setenv("EVTFUSE_LOG", "debug")
    res = invoke("run", "-e", "def e(accum): D = accum * 2.0; return D", "--mnkl", "32,32,16",
                 "--iterations", "0")
    assert res.exit_code == 0, res.output
    assert "evtfuse INFO: kernels offered: portable" in res.output
    quiet = invoke("-v", "run", "-e", "def e(accum): D = accum * 3.0; return D", "--mnkl",
                   "32,32,16", "--iterations", "0")
    assert "evtfuse INFO" in quiet.output
    monkeypatch.setenv("EVTFUSE_LOG", "")
    res = invoke("run", "-e", "def e(accum): D = accum * 4.0; return D", "--mnkl", "32,32,16",
                 "--iterations", "0")
    assert "evtfuse INFO" not in res.output and "evtfuse DEBUG" not in res.output
    cli.setup_logging()


# ---------------------------------------------------------------------------- GPU tier

@pytest.mark.gpu
def test_demo_on_a_gpu():
    res = invoke("demo", "--iterations", "10")
    assert res.exit_code == 0, res.output
    assert "CUDA GPU" in res.output and "M=4096 N=4096 K=4096, bf16" in res.output
    assert res.output.count("verify:   PASSED") == 2 and res.output.count("speedup") == 2


@pytest.mark.gpu
def test_run_and_show_on_a_gpu():
    res = invoke("run", "-e", "def e(accum, C, alpha, bias): D = gelu(alpha * accum + C + bias); "
                 "return D", "--mnkl", "2048,1024,512,2", "--alpha", "0.5", "--verify",
                 "--iterations", "5")
    assert res.exit_code == 0 and "verify:   PASSED" in res.output and "TFLOP/s" in res.output, \
        res.output
    res = invoke("show", "def e(accum, C): D = accum + C; return D", "--mnkl", "1024,1024,1024,1")
    # the first kernel on an H100 is a gluon one (@gluon.jit), elsewhere a Triton one
    assert res.exit_code == 0 and "def evtfuse_kernel(" in res.output, res.output
    assert "@triton.jit" in res.output or "@gluon.jit" in res.output, res.output


@pytest.mark.gpu
@pytest.mark.parametrize("inputs", [["--ab-dtype", "e4m3", "--fp8-promote"],
                                    ["--ab-dtype", "e4m3", "--mnkl", "1000,1000,1000,2"],
                                    ["--ab-dtype", "i8", "--acc-dtype", "i32"]],
                         ids=["fp8-promoted", "fp8-batched", "int8"])
def test_run_8bit_inputs_on_a_gpu(inputs):
    """8-bit inputs through ``evtfuse run``: verified, and timed beside eager PyTorch
    (``torch._scaled_mm`` / ``torch._int_mm``; fp32 where those refuse the shape)."""
    if "e4m3" in inputs and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 inputs need compute capability 8.9+")
    res = invoke("run", "-e", "def e(accum, s): D = accum * s; return D", "--mnkl",
                 "1024,1024,4096,1", "--d-dtype", "bf16", "--b-major", "k", "--scalar", "s=0.5",
                 "--verify", "--iterations", "3", "--tune", "none", *inputs)
    assert res.exit_code == 0 and "verify:   PASSED" in res.output, res.output
    assert "eager torch" in res.output, res.output


def test_verify_command_is_run_with_verification():
    res = invoke("verify", "-e", "def epi(accum, C, alpha): D = alpha * accum + C; return D",
                 "--mnkl", "40,32,16,1", "--alpha", "-2.0")
    assert res.exit_code == 0, res.output
    assert "verify:   PASSED" in res.output and "ok   D:" in res.output
    assert "time:" not in res.output


DRAWN = ("def e(accum, C, bias):\n    F = relu(accum + bias)\n    D = F * C\n"
         "    R = sum(F)\n    return D, F, R")


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_show_draws_the_dag(tmp_path, monkeypatch, suffix):
    """--png draws the DAG after the passes with matplotlib where Graphviz is absent."""
    from evtfuse.cli import draw

    monkeypatch.setattr(draw.shutil, "which", lambda name: None)
    out = tmp_path / f"dag{suffix}"
    res = invoke("show", DRAWN, "--operand", "bias=col", "--output", "R=row", "--no-source",
                 "--no-backward", "--png", str(out))
    assert res.exit_code == 0, res.output
    assert f"drawn to {out} by matplotlib" in res.output
    head = out.read_bytes()[:64]
    assert head.startswith(b"\x89PNG") if suffix == ".png" else b"<svg" in out.read_bytes()


def test_dag_in_graphviz_language_tells_node_kinds_apart():
    from evtfuse import EpilogueArguments
    from evtfuse.cli.draw import graph, to_dot

    M, N = 8, 6
    args = EpilogueArguments(DRAWN, C=torch.empty(M, N), bias=torch.empty(N),
                             D=torch.empty(M, N), F=torch.empty(M, N), R=torch.empty(M, 1))
    args.bind((1, M, N))
    shapes, edges = graph(args.dag)
    kinds = sorted(s.kind for s in shapes.values())
    assert kinds.count("store") == 3 and "reduce" in kinds and kinds.count("load") == 3
    dot = to_dot(args.dag)
    assert dot.startswith('digraph "e"') and "shape=diamond" in dot and "peripheries=2" in dot
    assert '"R\\nper-row reduction, float32"' in dot
    assert len(edges) == dot.count(" -> ")


def test_show_png_refuses_other_formats(tmp_path):
    res = invoke("show", DRAWN, "--operand", "bias=col", "--output", "R=row", "--no-source",
                 "--no-backward", "--png", str(tmp_path / "dag.jpg"))
    assert res.exit_code != 0 and "the drawing is written as .png, .svg, .pdf" in res.output
