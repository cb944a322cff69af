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

    def forget_plan(self, args) -> None:
        self.forgot = True

    def run(self, args) -> None:
        if self.fails:
            raise RuntimeError("out of resources: shared memory")
        self.calls += 1
        time.sleep(self.first if self.calls <= 2 else self.seconds)


@pytest.fixture(autouse=True)
def _declared_times(monkeypatch):
    """A stand-in's timing reads its declared time (it still runs, and sleeps it): a
    ranking by the host's clock of sleeps 15% apart flipped on a loaded 2-core machine."""
    real = tuner._time_kernel

    def timed(kernel, args):
        if not isinstance(kernel, _Stand):
            return real(kernel, args)
        kernel.run(args)
        return (kernel.first if kernel.calls <= 2 else kernel.seconds) * 1e3

    monkeypatch.setattr(tuner, "_time_kernel", timed)


def _args() -> GemmArguments:
    A, B, D = torch.randn(8, 4), torch.randn(4, 8), torch.empty(8, 8)
    return GemmArguments(A, B, D, epilogue=EpilogueArguments("def epi(accum): D = accum; return D", D=D))


def test_search_takes_the_fastest_and_skips_failures():
    slow, fast, broken = _Stand("slow", 0.004), _Stand("fast", 0.001), _Stand("broken", 0, True)
    best = tuner._search(_args(), [slow, broken, fast], "fast")
    assert best is fast
    # a first run (compile), then one timed call per round; the slow one, 4x the best
    # after its first sustained round, is timed no more (PRUNE_MARGIN)
    assert fast.calls == 1 + tuner.ROUNDS
    assert slow.calls == 1 + 2


def test_search_drops_the_plans_of_every_candidate_but_the_pick():
    """A candidate's plan keeps its reduction workspaces: the tuner drops the plans of
    every candidate but the one it picks, those that failed or were never timed too."""
    slow, fast, broken = _Stand("slow", 0.004), _Stand("fast", 0.001), _Stand("broken", 0, True)
    assert tuner._search(_args(), [slow, broken, fast], "fast") is fast
    assert slow.forgot and broken.forgot and not hasattr(fast, "forgot")


def test_forget_plan_drops_one_problems_plan():
    """``Kernel.forget_plan``: the plan of that problem goes (the next run plans afresh),
    another problem's stays (the kernel object is the process's: earlier tests' plans may
    be there too)."""
    from evtfuse.runtime.discovery import get_kernels
    from evtfuse.runtime.kernel import structure_key

    D = torch.empty(16, 8)
    b = GemmArguments(torch.randn(16, 4), torch.randn(4, 8), D,
                      epilogue=EpilogueArguments("def epi(accum): D = accum; return D", D=D))
    a = _args()
    k = get_kernels(a)[0]
    plan_b = k.plan(b)
    k.plan(a)
    assert structure_key(a) in k._plans and structure_key(b) in k._plans
    k.forget_plan(a)
    assert structure_key(a) not in k._plans
    assert k._plans[structure_key(b)] is plan_b and k.plan(a) is not None


def test_search_times_every_round_of_a_contender(monkeypatch):
    """Candidates within ``PRUNE_MARGIN`` of the best are all timed in every round; one
    beyond it after the first sustained round is not, and cannot be picked."""
    monkeypatch.setattr(tuner, "ROUNDS", 4)
    monkeypatch.setattr(tuner, "DUEL_ROUNDS", 0)
    best, near, far = _Stand("best", 0.010), _Stand("near", 0.0115), _Stand("far", 0.020)
    assert tuner._search(_args(), [far, near, best], "fast") is best
    assert best.calls == near.calls == 1 + 4
    assert far.calls == 1 + 2


def test_search_reports_where_its_time_went():
    """The cost a search reports (kept in the tuning record, shown by ``evtfuse cache list``):
    the candidates that ran, and the seconds of compiles and of timing."""
    cost: dict = {}
    tuner._search(_args(), [_Stand("a", 0.0012), _Stand("b", 0, True), _Stand("c", 0.001)],
                  "fast", cost)
    assert cost["candidates"] == 2  # the failure is not counted
    # stand-ins have no plan to precompile: the field is the precompile step's own time, a
    # few milliseconds at most (its exact value is the machine's, not asserted)
    assert 0.0 <= cost["compile_s"] < cost["timing_s"] + 0.1
    # the sleeps of both stand-ins, less the half millisecond timing_s may lose to rounding
    assert cost["timing_s"] >= (1 + tuner.ROUNDS) * 0.0022 - 0.0005


def test_search_judges_the_rounds_after_the_first():
    """A candidate fast only in its first round (timed on a GPU cooled by its compile)
    loses to one that is faster in the later, back-to-back rounds."""
    cool = _Stand("cool", 0.006, first=0.0005)
    steady = _Stand("steady", 0.003)
    assert tuner._search(_args(), [cool, steady], "fast") is steady
    assert tuner._sustained([1.0, 5.0, 3.0, 4.0, 9.0]) == 4.5  # median of 5, 3, 4, 9
    assert tuner._sustained([2.0]) == 2.0


def test_budget_keeps_room_for_the_later_rounds(monkeypatch):
    """With 100 ms windows and four rounds, each candidate that runs costs ~0.36 s more
    after the first round: a 0.9 s budget takes two candidates (0.73 s), not three (1.09 s)
    or four."""
    monkeypatch.setenv("EVTFUSE_TUNE_BUDGET_S", "0.9")
    monkeypatch.setattr(tuner, "REP_MS", 100)
    monkeypatch.setattr(tuner, "ROUNDS", 4)
    monkeypatch.setattr(tuner, "DUEL_ROUNDS", 0)  # its reserve: test_duel_reserve_in_the_budget
    # the host's own time (a loaded CI machine) out of the arithmetic: the clock stands still
    monkeypatch.setattr(tuner.time, "perf_counter", lambda: 0.0)
    cands = [_Stand(f"k{i}", 0.001) for i in range(4)]
    tuner._search(_args(), cands, "fast")
    assert [c.calls > 0 for c in cands] == [True, True, False, False]
    every = [_Stand(f"e{i}", 0.001) for i in range(4)]
    tuner._search(_args(), every, "exhaustive")  # times every candidate, budget or not
    assert all(c.calls == 1 + tuner.ROUNDS for c in every)


def test_duel_reserve_in_the_budget(monkeypatch):
    """The budget keeps room for the duel as well: 1.8 s holds the later rounds of two
    candidates and their duel of eight 100 ms windows (1.70 s) and would hold the later
    rounds of three (1.09 s), but not three and the duel (2.06 s)."""
    monkeypatch.setenv("EVTFUSE_TUNE_BUDGET_S", "1.8")
    monkeypatch.setattr(tuner, "REP_MS", 100)
    monkeypatch.setattr(tuner, "ROUNDS", 4)
    monkeypatch.setattr(tuner, "DUEL_ROUNDS", 4)
    # the host's own time (a loaded CI machine) out of the arithmetic: the clock stands still
    monkeypatch.setattr(tuner.time, "perf_counter", lambda: 0.0)
    cands = [_Stand(f"k{i}", 0.001) for i in range(3)]
    tuner._search(_args(), cands, "fast")
    assert [c.calls > 0 for c in cands] == [True, True, False]


def test_search_with_nothing_that_runs_says_so():
    with pytest.raises(UnsupportedError, match="every candidate kernel failed"):
        tuner._search(_args(), [_Stand("a", 0, True), _Stand("b", 0, True)], "fast")


class _Scripted:
    """A stand-in whose timed rounds read from a list (``tuner._time_kernel`` patched)."""

    def __init__(self, name: str, rounds: list[float]):
        self.name, self.rounds, self.timed = name, list(rounds), 0

    def run(self, args) -> None:  # the compile run
        pass

    def forget_plan(self, args) -> None:
        pass


def _scripted_timer(monkeypatch):
    def fake(kernel, args):
        kernel.timed += 1
        return kernel.rounds[kernel.timed - 1]
    monkeypatch.setattr(tuner, "_time_kernel", fake)


def test_duel_of_close_leaders_decides_on_more_rounds(monkeypatch):
    """Two leaders within DUEL_MARGIN get DUEL_ROUNDS more rounds each and the pick is
    made on all their later rounds: a leader ahead by 1% over three rounds and behind in
    the next four loses; the third candidate, 50% behind after its first sustained round,
    is timed no more after it."""
    _scripted_timer(monkeypatch)
    monkeypatch.setattr(tuner, "ROUNDS", 4)
    monkeypatch.setattr(tuner, "DUEL_ROUNDS", 4)
    lucky = _Scripted("lucky", [1.0, 1.00, 1.00, 1.00, 1.05, 1.05, 1.05, 1.05])
    steady = _Scripted("steady", [1.0, 1.01, 1.01, 1.01, 1.01, 1.01, 1.01, 1.01])
    third = _Scripted("third", [1.0, 1.5, 1.5, 1.5])
    assert tuner._search(_args(), [lucky, third, steady], "fast") is steady
    assert (lucky.timed, steady.timed, third.timed) == (8, 8, 2)


def test_no_duel_when_the_leader_is_clear(monkeypatch):
    _scripted_timer(monkeypatch)
    monkeypatch.setattr(tuner, "ROUNDS", 4)
    clear = _Scripted("clear", [1.0, 1.0, 1.0, 1.0])
    behind = _Scripted("behind", [1.0, 1.1, 1.1, 1.1])  # 10% behind: past DUEL_MARGIN
    assert tuner._search(_args(), [behind, clear], "fast") is clear
    assert (clear.timed, behind.timed) == (4, 4)


class _Compiling(_Scripted):
    def run(self, args) -> None:  # a 0.3 s compile
        time.sleep(0.3)


def test_budget_counts_the_next_candidates_compile(monkeypatch):
    """A candidate is taken only if its compile (the mean of those so far) fits too: with
    0.3 s compiles and ~0.03 s of later rounds each, a 0.8 s budget takes two (0.66 s with
    the second) but not a third (0.99 s), which the time spent alone (0.6 s) would allow."""
    _scripted_timer(monkeypatch)
    for name, value in (("ROUNDS", 4), ("DUEL_ROUNDS", 0), ("REP_MS", 0), ("WARMUP_MS", 0)):
        monkeypatch.setattr(tuner, name, value)
    monkeypatch.setenv("EVTFUSE_TUNE_BUDGET_S", "0.8")
    cands = [_Compiling(f"c{i}", [0.001] * 4) for i in range(4)]
    tuner._search(_args(), cands, "fast")
    assert [c.timed for c in cands] == [4, 4, 0, 0]


def _h100_kernels(M, N, K):
    """Every family's kernels for an M x N x K bf16 relu-with-aux problem on an H100
    target (CPU tensors: only shapes and dtypes matter), in the families' order."""
    from evtfuse.backends.triton.families import FAMILIES, Target
    from evtfuse.runtime.kernel import Kernel

    h100 = Target("cuda", 90, torch.device("cpu"), 132)
    A, B = torch.empty(M, K, dtype=torch.bfloat16), torch.empty(K, N, dtype=torch.bfloat16)
    C, D, F = (torch.empty(M, N, dtype=torch.bfloat16) for _ in range(3))
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(
        "def epi(accum, C, alpha): F = alpha * accum + C * 2.0; D = relu(F); return D, F",
        C=C, alpha=0.5, D=D, F=F))
    return args, h100, [Kernel(f, c, h100) for f in FAMILIES for c in f.configs(args, h100)]


def test_candidates_that_leave_the_gpu_idle_go_last():
    """``api.order_by_fill``: at 64x8192x8192 the gluon family's 128-row tiles (64 of 132
    SMs) go behind every config that fills the GPU, the hopper 64x64 tiles among the first
    fast-tuning candidates; where every config fills the GPU (8192x8192x1024) the
    families' order stays; the interpreter's order is the families'."""
    from evtfuse.backends.triton.families import Target, tile_count
    from evtfuse.runtime.api import order_by_fill

    args, h100, ks = _h100_kernels(64, 8192, 8192)
    ordered = order_by_fill(ks, args, h100)
    assert sorted(k.name for k in ordered) == sorted(k.name for k in ks)
    fills = [tile_count(args, k.config) >= 0.9 * 132 for k in ordered]
    assert fills == sorted(fills, reverse=True) and any(fills) and not all(fills)
    assert ks[0].family.name == "gluon" and ordered[0].family.name == "hopper"
    first = [k.name for k in ordered[:tuner.FAST_CANDIDATES]]
    assert "hopper_64x64x128_w4_s5_g8" in first
    assert all(k.family.name != "gluon" for k in ordered if tile_count(args, k.config) >= 0.9 * 132)
    args, h100, ks = _h100_kernels(8192, 8192, 1024)
    assert order_by_fill(ks, args, h100) == ks
    interp = Target("interpreter", 90, torch.device("cpu"), 4)
    assert order_by_fill(list(reversed(ks)), args, interp) == list(reversed(ks))


def test_exhaustive_tuning_tries_the_pick_at_other_tile_orders(monkeypatch):
    """``_refine_tile_order``: the exhaustive search's pick is timed again beside its
    variants at the ``TILE_ORDERS`` that are not candidates already, and a faster variant
    wins; a pick whose variants are all candidates (or that has none) stays, untimed."""
    _scripted_timer(monkeypatch)
    monkeypatch.setattr(tuner, "ROUNDS", 4)
    monkeypatch.setattr(tuner, "DUEL_ROUNDS", 0)
    pick = _Scripted("k_g8", [1.0] * 8)
    other = _Scripted("k_g4", [1.2] * 4)  # a candidate already: not timed again
    wider = _Scripted("k_g16", [0.9] * 4)
    variants = lambda k, args: [other, wider]  # noqa: E731
    assert tuner._refine_tile_order(_args(), pick, [pick, other], variants) is wider
    assert (pick.timed, other.timed, wider.timed) == (4, 0, 4)
    slower = _Scripted("k_g16", [1.3] * 4)
    again = _Scripted("k_g8", [1.0] * 4)
    assert tuner._refine_tile_order(_args(), again, [again], lambda k, a: [slower]) is again
    alone = _Scripted("k_g8", [])
    assert tuner._refine_tile_order(_args(), alone, [alone, other], lambda k, a: [other]) is alone
    assert alone.timed == 0


def test_tile_order_variants_of_a_real_kernel():
    """Variants at every ``TILE_ORDERS`` value but the kernel's own, same family and
    config otherwise; none for a problem of one row of tiles."""
    args, h100, ks = _h100_kernels(8192, 8192, 1024)
    k = next(k for k in ks if k.family.name == "gluon" and k.config.group_m == 8)
    vs = tuner._tile_order_variants(k, args)
    assert sorted(v.config.group_m for v in vs) == sorted(g for g in tuner.TILE_ORDERS if g != 8)
    assert all(v.family is k.family and v.target is k.target for v in vs)
    assert {v.name.replace(f"_g{v.config.group_m}_", "_g8_") for v in vs} == {k.name}
    args, h100, ks = _h100_kernels(64, 8192, 8192)
    small = next(k for k in ks if k.config.block_m >= 64)
    assert tuner._tile_order_variants(small, args) == []


def test_cached_exhaustive_choice_at_another_tile_order_is_found(monkeypatch):
    """A cached exhaustive choice that is a candidate at another tile order (not in the
    candidate list) is rebuilt from the cache, not tuned again."""
    args, h100, ks = _h100_kernels(8192, 8192, 1024)
    coop = next(k for k in ks if k.config.cooperative)
    name = coop.name.replace(f"_g{coop.config.group_m}_", "_g16_")
    assert name not in {k.name for k in ks}
    monkeypatch.setattr(tuner, "get_kernels", lambda a, cc=None: ks)
    monkeypatch.setattr(tuner.cache, "load_choice", lambda key: {"kernel": name})
    monkeypatch.setattr(tuner, "_search", lambda *a: pytest.fail("tuned again"))
    monkeypatch.setattr(tuner, "_records", {})
    monkeypatch.setattr(tuner, "_chosen", {})
    chosen = tuner.choose_kernel(args, "exhaustive")
    assert chosen.name == name and chosen.config.group_m == 16 and chosen.config.cooperative


def test_fast_and_none_start_from_the_shipped_defaults():
    """Near a shape the suite measured on this kind of GPU (the shipped defaults), "fast"
    times the suggested kernels this problem is offered, then the heuristic's first two;
    "none" takes the first suggestion; "exhaustive" keeps every candidate; far from every
    measured shape the families' order stands."""
    args, _, ks = _h100_kernels(4096, 4096, 4096)  # relu aux, as the suite's relu_aux cell
    hints = tuner.hinted(args, ks)
    assert hints and all(k in ks for k in hints)
    fast = tuner.candidates(args, ks, "fast")
    assert fast[:len(hints)] == hints and len(fast) <= len(hints) + tuner.FROM_HEURISTIC
    assert set(ks[:tuner.FROM_HEURISTIC]) <= set(fast)
    assert len(fast) < tuner.FAST_CANDIDATES  # fewer compiles and timing windows
    assert tuner.candidates(args, ks, "none")[0] is hints[0]
    assert tuner.candidates(args, ks, "exhaustive") is ks
    far, _, far_ks = _h100_kernels(300, 5000, 700)
    assert tuner.hinted(far, far_ks) == [] and tuner.candidates(far, far_ks, "fast") is far_ks
