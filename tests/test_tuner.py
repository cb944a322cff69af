"""The tuner's search (``runtime.tuner._search``) with stand-in kernels on the CPU: the
lowest sustained time (the median of the rounds after the first) wins, a candidate that
fails is skipped, and every candidate that ran is timed in every round."""

from __future__ import annotations

import time

import pytest
import torch

from evtfuse import EpilogueArguments, GemmArguments
from evtfuse.errors import UnsupportedError
from evtfuse.runtime import tuner


class _Stand:
    def __init__(self, name: str, seconds: float, fails: bool = False, first: float | None = None):
        self.name, self.seconds, self.fails, self.calls = name, seconds, fails, 0
        self.first = seconds if first is None else first  # its compile run and first round

    def run(self, args) -> None:
        if self.fails:
            raise RuntimeError("out of resources: shared memory")
        self.calls += 1
        time.sleep(self.first if self.calls <= 2 else self.seconds)


def _args() -> GemmArguments:
    A, B, D = torch.randn(8, 4), torch.randn(4, 8), torch.empty(8, 8)
    return GemmArguments(A, B, D, epilogue=EpilogueArguments("def epi(accum): D = accum; return D", D=D))


def test_search_takes_the_fastest_and_skips_failures():
    slow, fast, broken = _Stand("slow", 0.004), _Stand("fast", 0.001), _Stand("broken", 0, True)
    best = tuner._search(_args(), [slow, broken, fast], "fast")
    assert best is fast
    # a first run (compile), then one timed call per round
    assert slow.calls == fast.calls == 1 + tuner.ROUNDS


def test_search_judges_the_rounds_after_the_first():
    """A candidate fast only in its first round (timed on a GPU cooled by its compile)
    loses to one that is faster in the later, back-to-back rounds."""
    cool = _Stand("cool", 0.006, first=0.0005)
    steady = _Stand("steady", 0.003)
    assert tuner._search(_args(), [cool, steady], "fast") is steady
    assert tuner._sustained([1.0, 5.0, 3.0, 4.0, 9.0]) == 4.5  # median of 5, 3, 4, 9
    assert tuner._sustained([2.0]) == 2.0


def test_budget_keeps_room_for_the_later_rounds(monkeypatch):
    """With 100 ms windows and four rounds, each candidate that ran costs ~0.33 s more
    after the first round: a 0.5 s budget takes two candidates, not all four."""
    monkeypatch.setenv("EVTFUSE_TUNE_BUDGET_S", "0.5")
    monkeypatch.setattr(tuner, "REP_MS", 100)
    monkeypatch.setattr(tuner, "ROUNDS", 4)
    cands = [_Stand(f"k{i}", 0.001) for i in range(4)]
    tuner._search(_args(), cands, "fast")
    assert [c.calls > 0 for c in cands] == [True, True, False, False]
    every = [_Stand(f"e{i}", 0.001) for i in range(4)]
    tuner._search(_args(), every, "exhaustive")  # times every candidate, budget or not
    assert all(c.calls == 1 + tuner.ROUNDS for c in every)


def test_search_with_nothing_that_runs_says_so():
    with pytest.raises(UnsupportedError, match="every candidate kernel failed"):
        tuner._search(_args(), [_Stand("a", 0, True), _Stand("b", 0, True)], "fast")
