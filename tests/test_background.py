"""Compiles ahead in the background (``runtime.background``): which kernels have another
``EVEN_MN`` variant a new M may need (``family_base.even_tiles_vary``), and that the
variant's compile starts once per process, in a thread of its own, from arguments the
caller fetched (so the thread makes no CUDA call that could disturb a graph capture)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
import torch

from evtfuse import EpilogueArguments, GemmArguments, get_kernels
from evtfuse.backends.triton.families import even_tiles_vary
from evtfuse.runtime import background

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-interpreter tier")


def _args(src: str, M: int = 64, N: int = 96, K: int = 16, **outs) -> GemmArguments:
    A, B = torch.randn(M, K), torch.randn(K, N)
    return GemmArguments(A, B, None, epilogue=EpilogueArguments(src, D=None, **outs))


@pytest.mark.parametrize("src,outs,varies", [
    ("def epi(accum): D = accum; return D", {}, False),
    ("def epi(accum): D = accum; r = sum(accum); return D, r", {"r": (64, 1)}, False),
    ("def epi(accum): D = accum; c = sum(accum); return D, c", {"c": (96,)}, True),
    ("def epi(accum): D = accum; t = sum(accum * accum); return D, t", {"t": (1,)}, True),
])
def test_which_kernels_have_another_variant(src, outs, varies):
    """Only a reduction across M (per-column, whole-output) makes ``EVEN_MN`` follow M; a
    per-row one reads N's edge alone, and no reduction reads nothing."""
    args = _args(src, **{n: torch.empty(*s) for n, s in outs.items()})
    k = get_kernels(args)[0]
    assert even_tiles_vary(args, k.config) is varies


def test_a_whole_output_reduction_with_n_uncovered_has_none():
    """A whole-output reduction also masks N's edge: with N not covered by the tiles,
    every M gives EVEN_MN = False, so there is no other variant to compile."""
    args = _args("def epi(accum): D = accum; t = sum(accum); return D, t", N=80,
                 t=torch.empty(1))
    k = get_kernels(args)[0]
    assert args.N % k.config.block_n != 0
    assert not even_tiles_vary(args, k.config)


class _Jit:
    def __init__(self):
        self.calls, self.threads = [], []

    def warmup(self, *pos, grid, **kw):
        self.calls.append((pos, kw))
        self.threads.append(threading.current_thread().name)


class _Plan:
    def __init__(self):
        self.jit, self.consts, self.grid, self.fetched_in = _Jit(), {"EVEN_MN": True, "X": 1}, (1,), []

    def positional(self, A, B, values):
        self.fetched_in.append(threading.current_thread().name)
        return [A, B]

    def warmup_positional(self, positional, **consts):
        self.jit.warmup(*positional, grid=self.grid, **{**self.consts, **consts})


def test_a_variant_compiles_once_in_a_thread(monkeypatch):
    monkeypatch.setattr(background, "_started", set())
    plan, A, B = _Plan(), torch.zeros(2), torch.zeros(2)
    assert background.compile_variant(plan, A, B, {}, EVEN_MN=False)
    assert not background.compile_variant(plan, A, B, {}, EVEN_MN=False)  # once per process
    background.wait(30)
    assert len(plan.jit.calls) == 1
    pos, kw = plan.jit.calls[0]
    assert kw == {"EVEN_MN": False, "X": 1}  # the other variant, the plan's other constants
    assert plan.jit.threads == ["evtfuse-background-compile"] or \
        plan.jit.threads[0].startswith("ThreadPoolExecutor")  # (under AsyncCompileMode)
    assert plan.fetched_in == [threading.current_thread().name]  # fetched by the caller


def test_it_can_be_turned_off(monkeypatch):
    monkeypatch.setattr(background, "_started", set())
    monkeypatch.setenv("EVTFUSE_BACKGROUND_COMPILE", "0")
    plan = _Plan()
    assert not background.compile_variant(plan, torch.zeros(2), torch.zeros(2), {}, EVEN_MN=False)
    assert plan.jit.calls == []


@pytest.mark.slow
def test_an_ending_process_waits_for_its_background_compiles(tmp_path):
    """A compile still running when the program ends finishes before the interpreter
    exits (a daemon thread stopped inside Triton's compiler aborted the exit on 3.9)."""
    done = tmp_path / "done"
    script = f"""
import time, torch
from evtfuse.runtime import background

class Jit:
    def warmup(self, *args, **kwargs):
        time.sleep(1.0)
        open({str(done)!r}, "w").write("compiled")

class Plan:
    jit, consts, grid = Jit(), {{"EVEN_MN": True}}, (1,)
    def positional(self, A, B, values):
        return [A, B]
    def warmup_positional(self, positional, **consts):
        self.jit.warmup(*positional, grid=self.grid, **consts)

assert background.compile_variant(Plan(), torch.zeros(2), torch.zeros(2), {{}}, EVEN_MN=False)
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert done.read_text() == "compiled"
