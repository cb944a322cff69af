"""Ahead-of-time compiles: ``evtfuse.precompile`` and ``evtfuse precompile`` on the CPU (the
interpreter's modules into the cache; the tuning path with the tuner's device check and
search replaced)."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

import evtfuse
from evtfuse import EpilogueArguments, GemmArguments
from evtfuse.cli import app
from evtfuse.errors import UnsupportedError
from evtfuse.runtime import cache, tuner

pytestmark = [pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-interpreter tier"),
              pytest.mark.usefixtures("own_cache")]  # conftest.py

RELU = "def relu_bias(accum, bias): D = relu(accum + bias); return D"
SCALE = "def scaled(accum, C, alpha): D = alpha * accum + C; return D"


def _args(src: str = RELU, M: int = 64, N: int = 96, K: int = 16) -> GemmArguments:
    D = torch.empty(M, N)
    values = {"bias": torch.randn(N)} if "bias" in src else {"C": torch.randn(M, N),
                                                              "alpha": 0.5}
    return GemmArguments(torch.randn(M, K), torch.randn(K, N), D,
                         epilogue=EpilogueArguments(src, D=D, **values))


def test_precompile_generates_each_problems_module_with_progress():
    seen = []
    results = evtfuse.precompile([_args(RELU), _args(SCALE, M=32)],
                                 progress=lambda i, n, r: seen.append((i, n, r.problem)))
    assert [r.how for r in results] == ["compiled", "compiled"]
    assert [r.kernel for r in results] == [evtfuse.get_kernels(_args(RELU))[0].name,
                                           evtfuse.get_kernels(_args(SCALE, M=32))[0].name]
    assert seen == [(1, 2, "relu_bias 64x96x16x1 f32"), (2, 2, "scaled 32x96x16x1 f32")]
    assert {k["epilogue"] for k in cache.list_kernels()} == {"relu_bias", "scaled"}
    assert results[0].line().startswith("relu_bias 64x96x16x1 f32: portable_")


def test_precompile_tunes_once_then_reads_the_choice(monkeypatch):
    """On a GPU (the device check replaced) a problem is tuned and its choice stored; a
    second precompile of its class finds it."""
    monkeypatch.setattr(tuner, "_times_on_device", lambda args: True)
    searched = []

    def search(args, cands, tune, cost=None):
        searched.append(tune)
        return cands[1]
    monkeypatch.setattr(tuner, "_search", search)
    args = _args()
    (first,) = evtfuse.precompile([args], tune="fast")
    assert first.how == "tuned" and searched == ["fast"]
    assert first.kernel == evtfuse.get_kernels(args)[1].name
    assert cache.load_choice(tuner.tuning_key(args, "fast", None))["kernel"] == first.kernel
    (again,) = evtfuse.precompile([_args(M=60)], tune="fast")  # same class, new M
    assert again.how == "cached" and again.kernel == first.kernel and searched == ["fast"]


def test_a_problem_no_kernel_runs_is_reported_and_the_others_go_on(monkeypatch):
    real = tuner.choose_kernel

    def choose(args, tune="fast", cc=None):
        if args.epilogue.parsed.name == "scaled":
            raise UnsupportedError("no evtfuse kernel supports these arguments:\n  ...")
        return real(args, tune, cc)
    monkeypatch.setattr(tuner, "choose_kernel", choose)
    bad, good = evtfuse.precompile([_args(SCALE), _args(RELU)])
    assert bad.kernel is None and bad.how == "failed"
    assert bad.error == "no evtfuse kernel supports these arguments:"
    assert bad.line() == "scaled 64x96x16x1 f32: failed: no evtfuse kernel supports these " \
        "arguments:"
    assert good.how == "compiled"


def test_precompile_refuses_bad_input():
    with pytest.raises(ValueError, match="not in the background|'background'"):
        evtfuse.precompile([_args()], tune="background")
    with pytest.raises(TypeError, match="problem 1 is a str"):
        evtfuse.precompile([_args(), "relu"])


# ---------------------------------------------------------------- the command

runner = CliRunner()


def _invoke(*args: str):
    return runner.invoke(app, ["precompile", *args], catch_exceptions=False)


def test_the_command_takes_a_file_and_flags(tmp_path):
    problems = tmp_path / "problems.json"
    problems.write_text(json.dumps([{"epilogue": RELU, "mnkl": "64,96,32"},
                                    {"epilogue": SCALE, "mnkl": "32,64,16,2",
                                     "ab_dtype": "f32", "scalar": ["alpha=2"]}]))
    res = _invoke(str(problems), "-e", "def e(accum): D = accum; return D",
                  "--mnkl", "32,32,16", "--mnkl", "48,32,16")
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert [line.split("]")[0] for line in lines if line.startswith("[")] == \
        ["[1/4", "[2/4", "[3/4", "[4/4"]
    assert "scaled 32x64x16x2 f32" in res.output and "e 48x32x16x1 f16" in res.output
    assert lines[-1].startswith("precompiled 4 of 4 problems into ")
    assert lines[-1].endswith("(4 compiled)")


@pytest.mark.parametrize("content,message", [
    ("{not json", "is not JSON"),
    ('{"epilogue": "x"}', "expected a JSON list"),
    ('[{"epilog": "x"}]', "entry 0: unknown key 'epilog'"),
    ('[{"epilogue": "def e(accum): D = accum; return D", "operand": "C=row"}]',
     "operand must be a list of strings"),
])
def test_a_bad_problems_file_is_bad_input(tmp_path, content, message):
    problems = tmp_path / "p.json"
    problems.write_text(content)
    res = _invoke(str(problems))
    assert res.exit_code == 2 and message in res.output, res.output


def test_nothing_to_do_or_a_bad_mode_is_bad_input(tmp_path):
    res = _invoke()
    assert res.exit_code == 2 and "nothing to precompile" in res.output
    res = _invoke("-e", RELU, "--tune", "background")
    assert res.exit_code == 2 and "--tune is one of fast, exhaustive, none" in res.output
    res = _invoke(str(tmp_path / "missing.json"))
    assert res.exit_code == 2 and "does not exist" in res.output


def test_an_unsupported_problem_exits_3_after_the_others(monkeypatch):
    real = tuner.choose_kernel

    def choose(args, tune="fast", cc=None):
        if args.M == 48:
            raise UnsupportedError("no evtfuse kernel supports these arguments:")
        return real(args, tune, cc)
    monkeypatch.setattr(tuner, "choose_kernel", choose)
    res = _invoke("-e", RELU, "--mnkl", "48,32,16", "--mnkl", "32,32,16")
    assert res.exit_code == 3, res.output
    assert "[1/2] relu_bias 48x32x16x1 f16: failed: no evtfuse kernel" in res.output
    assert "precompiled 1 of 2 problems" in res.output


def test_the_command_has_help():
    res = _invoke("--help")
    assert res.exit_code == 0 and "ahead of time" in res.output and "--mnkl" in res.output
