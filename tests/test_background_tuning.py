"""Background tuning (``tune="background"``, ``runtime.background_tuning``) on the CPU: the
interpreter's kernels with the tuner's device check replaced (``tuner._times_on_device``),
a fake clock (``tuner._time_kernel``) and a stand-in compile job (Triton's interpreter has
no compiler to run), or stand-in kernels where threads launch at once (the interpreter is
not thread-safe). Counters and fakes, never wall time."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading

import pytest
import torch

import evtfuse
from evtfuse import EpilogueArguments, GemmArguments
from evtfuse.runtime import background, background_tuning as bt, cache, run, tuner
from evtfuse.runtime.kernel import Kernel

pytestmark = [pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-interpreter tier"),
              pytest.mark.usefixtures("own_cache")]  # conftest.py

EPI = "def e(accum, bias): D = relu(accum + bias); return D"
M, N, K = 64, 96, 16


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(M, K, generator=g), torch.randn(K, N, generator=g),
            torch.randn(N, generator=g))


def _args(A, B, bias) -> GemmArguments:
    D = torch.empty(M, N)
    return GemmArguments(A, B, D, epilogue=EpilogueArguments(EPI, bias=bias, D=D))


class _Clock:
    """``tuner._time_kernel``'s stand-in: a fixed time per kernel name (default 2 ms);
    counts the windows and notes whether any was opened while ``_busy``."""

    def __init__(self, ms: dict[str, float]):
        self.ms, self.windows, self.busy_windows = ms, [], 0

    def __call__(self, kernel, args) -> float:
        self.windows.append(kernel.name)
        self.busy_windows += bt._busy()
        return self.ms.get(kernel.name, 2.0)


class _Compiles:
    """``bt._prepare_compile``'s stand-in: the plan on the calling thread, as the real one;
    a job that notes its thread (or raises for the names in ``fail``)."""

    def __init__(self, fail=()):
        self.fail, self.prepared, self.ran = set(fail), [], []

    def __call__(self, kernel, args):
        kernel.plan(args)
        self.prepared.append((threading.current_thread().name, kernel.name))

        def job():
            self.ran.append((threading.current_thread().name, kernel.name))
            if kernel.name in self.fail:
                raise RuntimeError(f"compiler crashed on {kernel.name}")
        return job


@pytest.fixture
def tuning(monkeypatch):
    """Background tuning drivable on the CPU; short timing (two rounds, no duel)."""
    monkeypatch.setattr(tuner, "_times_on_device", lambda args: True)
    monkeypatch.setattr(tuner, "_sessions", {})
    monkeypatch.setattr(tuner, "ROUNDS", 2)
    monkeypatch.setattr(tuner, "DUEL_ROUNDS", 0)
    monkeypatch.setattr(run, "_fast", {})
    monkeypatch.setattr(run, "_last_call", {})
    compiles = _Compiles()
    monkeypatch.setattr(bt, "_prepare_compile", compiles)
    return compiles


def _session() -> bt.Session:
    (session,) = tuner._sessions.values()
    return session


def _call(A, B, bias):
    D = evtfuse.gemm(A, B, EPI, bias=bias, tune="background")
    torch.testing.assert_close(D, torch.relu(A @ B + bias), rtol=1e-5, atol=1e-5)
    return D


def _drive(A, B, bias, limit: int = 40) -> int:
    """Call until the session is done (waiting for its jobs between calls); the calls."""
    for n in range(1, limit + 1):
        _call(A, B, bias)
        session = _session()
        assert bt.wait(session, 60)
        if session.done:
            return n
    pytest.fail(f"the tuning did not end in {limit} calls: {_session()}")


def _plan_of_structure() -> bt.SwitchingPlan:
    (structure,) = run._fast.values()
    assert isinstance(structure.plan, bt.SwitchingPlan)
    return structure.plan


def test_first_call_compiles_one_kernel_then_the_others_in_the_background(tuning, monkeypatch):
    compiled = []
    real = Kernel.compile

    def spy(self, args):
        compiled.append((threading.current_thread().name, self.name))
        return real(self, args)
    monkeypatch.setattr(Kernel, "compile", spy)
    monkeypatch.setattr(tuner, "_time_kernel", _Clock({}))
    A, B, bias = _inputs()
    _call(A, B, bias)
    here = threading.current_thread().name
    session = _session()
    assert {k for t, k in compiled if t == here} == {session.first.name}
    assert session.first is evtfuse.get_kernels(_args(A, B, bias))[0]  # "none"'s pick
    assert tuning.prepared == []  # no plan of another candidate yet
    assert bt.wait(session, 60)
    others = {k.name for k in session.cands[1:]}
    assert others and {k for t, k in compiled if t != here} == others
    assert all(t == "evtfuse-background-tuning" for t, k in compiled if t != here)
    # the next call prepares the compiles (here), which run in the pool
    _call(A, B, bias)
    assert bt.wait(session, 60)
    assert {t for t, _ in tuning.prepared} == {here}
    assert {k for _, k in tuning.ran} == others
    assert {t for t, _ in tuning.ran} == {"evtfuse-background-tuning"}


@pytest.mark.slow
def test_windows_at_call_boundaries_never_in_a_capture_then_a_verified_switch(
        tuning, monkeypatch, tmp_path, caplog):
    A, B, bias = _inputs()
    kernels = evtfuse.get_kernels(_args(A, B, bias))
    assert len(kernels) >= 2
    winner = kernels[1]
    clock = _Clock({kernels[0].name: 1.0, winner.name: 0.5})
    monkeypatch.setattr(tuner, "_time_kernel", clock)
    checked = []
    real_match = bt.outputs_match
    monkeypatch.setattr(bt, "outputs_match", lambda k, r, a: checked.append(k.name) or
                        real_match(k, r, a))
    _call(A, B, bias)
    session = _session()
    assert bt.wait(session, 60) and clock.windows == []
    # a capture: nothing is timed, checked or prepared at its calls, and the user is told
    # once that the graph keeps the first kernel
    monkeypatch.setattr(bt, "_capturing", lambda: True)
    state, steps = session.state, session.steps
    with caplog.at_level("WARNING", logger="evtfuse"):
        for _ in range(3):
            _call(A, B, bias)
    said = [r.getMessage() for r in caplog.records if "CUDA graph" in r.getMessage()]
    assert len(said) == 1 and kernels[0].name in said[0] and "tune=\"fast\"" in said[0], said
    assert (session.state, session.steps, clock.windows) == (state, steps, [])
    monkeypatch.setattr(bt, "_capturing", lambda: False)
    before, calls = 0, 0
    while not session.done:
        _call(A, B, bias)
        calls += 1
        assert bt.wait(session, 60)
        assert len(clock.windows) - before <= 1  # one window per call at most
        before = len(clock.windows)
        assert calls < 40
    assert clock.busy_windows == 0
    # both candidates timed in the first round; the pruned first one no more
    assert sorted(clock.windows[:2]) == sorted([kernels[0].name, winner.name])
    assert session.winner is winner and checked == [winner.name]
    _call(A, B, bias)  # the next call switches
    plan = _plan_of_structure()
    assert plan.session is None and plan.plan in winner._plans.values()
    assert len(clock.windows) == before  # no more timing
    record = cache.load_choice(session.key)
    assert record["kernel"] == winner.name and record["tune"] == "fast"
    assert record["via"] == "background" and record["candidates"] == 2
    assert tuner.choose_kernel(_args(A, B, bias), "fast") is winner  # "fast" reuses it
    _second_process_reads(winner.name, tmp_path)


def _second_process_reads(name: str, tmp_path) -> None:
    """A new process on the same cache takes the winner from the disk, without tuning,
    with either mode."""
    script = f"""
import torch, evtfuse
from evtfuse import EpilogueArguments, GemmArguments
from evtfuse.runtime import tuner
tuner._times_on_device = lambda args: True
def no(*a, **k):
    raise SystemExit("tuned again")
tuner._search = no
g = torch.Generator().manual_seed(0)
A, B = torch.randn({M}, {K}, generator=g), torch.randn({K}, {N}, generator=g)
bias = torch.randn({N}, generator=g)
D = torch.empty({M}, {N})
args = GemmArguments(A, B, D, epilogue=EpilogueArguments({EPI!r}, bias=bias, D=D))
print("CHOSEN", tuner.choose_kernel(args, "background").name,
      tuner.choose_kernel(args, "fast").name)
print("SESSIONS", len(tuner._sessions))
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert f"CHOSEN {name} {name}" in run.stdout and "SESSIONS 0" in run.stdout


def test_a_crashed_background_compile_is_dropped_and_logged(tuning, monkeypatch, caplog):
    """A compile job that raises drops its candidate with a warning; the calls go on with
    the first kernel, the tuning ends on what is left, and the cache works."""
    A, B, bias = _inputs()
    kernels = evtfuse.get_kernels(_args(A, B, bias))
    broken = kernels[1].name
    tuning.fail.add(broken)
    monkeypatch.setattr(tuner, "_time_kernel", _Clock({broken: 0.1}))
    with caplog.at_level(logging.INFO, logger="evtfuse"):
        _drive(A, B, bias)
    session = _session()
    assert "compiler crashed" in session.dropped[broken]
    assert any(broken in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
    assert session.winner is session.first  # the only one left
    assert cache.load_choice(session.key)["kernel"] == session.first.name
    assert [e["kernel"] for e in cache.list_entries()] == [session.first.name]
    _call(A, B, bias)


class _Corrupt:
    """A real kernel whose outputs are off by one: what a miscompiled candidate gives."""

    def __init__(self, inner: Kernel):
        self.inner, self.name, self.target = inner, inner.name + "_corrupt", inner.target
        self.ran = 0

    def run(self, args) -> None:
        self.ran += 1
        self.inner.run(args)
        args.epilogue.values["D"].add_(1.0)

    def plan(self, args):
        return self.inner.plan(args)

    def compile(self, args):
        return self.inner.compile(args)

    def forget_plan(self, args) -> None:
        pass


def test_a_winner_whose_outputs_differ_is_never_switched_to(tuning, monkeypatch, caplog):
    """The fastest candidate computes wrong outputs: it is dropped after its check and the
    next best (checked too) wins; no call's result ever came from it."""
    A, B, bias = _inputs()
    k0, k1 = evtfuse.get_kernels(_args(A, B, bias))[:2]
    bad = _Corrupt(k1)
    monkeypatch.setattr(tuner, "get_kernels", lambda args, cc=None: [k0, bad, k1])
    monkeypatch.setattr(tuner, "_time_kernel", _Clock({bad.name: 0.2, k1.name: 0.5,
                                                        k0.name: 1.0}))
    with caplog.at_level(logging.WARNING, logger="evtfuse"):
        _drive(A, B, bias)  # every call's result checked against torch
    session = _session()
    assert "outputs differ" in session.dropped[bad.name]
    assert any("outputs differ" in r.getMessage() for r in caplog.records)
    assert session.winner is k1
    _call(A, B, bias)
    assert _plan_of_structure().plan in k1._plans.values()


def test_a_failing_switch_keeps_the_running_kernel(tuning, monkeypatch, caplog):
    """A switch that fails (here: the class's choice cannot be had) is logged; the call
    and the later ones run the first kernel, correctly."""
    A, B, bias = _inputs()
    k0, k1 = evtfuse.get_kernels(_args(A, B, bias))[:2]
    monkeypatch.setattr(tuner, "_time_kernel", _Clock({k0.name: 1.0, k1.name: 0.5}))
    real = tuner.choose_kernel

    def choose(args, tune="fast", cc=None):
        if _session().done:
            raise RuntimeError("no choice today")
        return real(args, tune, cc)
    monkeypatch.setattr(tuner, "choose_kernel", choose)
    _call(A, B, bias)
    first_plan = _plan_of_structure().plan
    with caplog.at_level(logging.WARNING, logger="evtfuse"):
        _drive(A, B, bias)
        _call(A, B, bias)
    assert "switch failed (RuntimeError: no choice today)" in caplog.text
    plan = _plan_of_structure()
    assert plan.session is None and plan.plan is first_plan
    _call(A, B, bias)


def test_outputs_match_compares_with_verify_tolerances():
    A, B, bias = _inputs()
    args = _args(A, B, bias)
    k0, k1 = evtfuse.get_kernels(args)[:2]
    assert bt.outputs_match(k1, k0, args) == (True, "")
    ok, why = bt.outputs_match(_Corrupt(k1), k0, args)
    assert not ok and "FAIL D" in why


def test_on_the_interpreter_background_takes_the_first_kernel_untimed(monkeypatch):
    """Without the device check replaced: CPU tensors time nothing, as "fast" there."""
    monkeypatch.setattr(tuner, "_sessions", {})
    A, B, bias = _inputs()
    _call(A, B, bias)
    assert tuner._sessions == {}
    assert tuner.choose_kernel(_args(A, B, bias), "background") is \
        evtfuse.get_kernels(_args(A, B, bias))[0]


def test_a_gpu_first_call_takes_the_family_quickest_to_compile():
    """On an sm_90 GPU (kernels offered offline), the starter is the first offered kernel
    of the family with the least ``compile_s``: the portable family's, else the hopper
    family's, else the gluon family's."""
    from evtfuse.backends.triton.families import Target
    from evtfuse.runtime.discovery import kernels_for

    bf = torch.bfloat16
    A, B = torch.randn(1024, 512, dtype=bf), torch.randn(512, 1024, dtype=bf)
    bias, D = torch.randn(1024, dtype=bf), torch.empty(1024, 1024, dtype=bf)
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(EPI, bias=bias, D=D))
    kernels = kernels_for(args, Target("cuda", 90, A.device, 132, offline=True))
    for family in ("portable", "hopper", "gluon"):
        assert family in {k.family.name for k in kernels}
        assert tuner._starter(args, kernels) is next(k for k in kernels
                                                     if k.family.name == family)
        kernels = [k for k in kernels if k.family.name != family]


def test_a_bad_tune_value_names_the_modes():
    A, B, bias = _inputs()
    with pytest.raises(ValueError, match="'background'"):
        tuner.choose_kernel(_args(A, B, bias), "later")


# ---------------------------------------------------------------- threads, stand-in kernels

class _Target:
    kind = "interpreter"


class _FakePlan:
    """Computes the epilogue with torch in two halves of rows (a switch in between would
    show as a mix), noting which kernel ran."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __call__(self, A, B, values) -> None:
        D = values["D"]
        half = D.shape[0] // 2
        D[:half] = torch.relu(A[:half] @ B + values["bias"])
        self.kernel.launches.append(threading.get_ident())
        D[half:] = torch.relu(A[half:] @ B + values["bias"])


class _FakeKernel:
    target = _Target()

    def __init__(self, name: str):
        self.name, self.launches = name, []
        self._plan = _FakePlan(self)

    def plan(self, args):
        return self._plan

    def run(self, args) -> None:
        self._plan(args.A, args.B, args.epilogue.values)

    def compile(self, args) -> None:
        pass

    def forget_plan(self, args) -> None:
        pass


def test_threads_calling_while_the_switch_happens_all_get_correct_results(tuning,
                                                                          monkeypatch):
    old, new, other = _FakeKernel("old"), _FakeKernel("new"), _FakeKernel("other")
    monkeypatch.setattr(tuner, "get_kernels", lambda args, cc=None: [old, new, other])
    monkeypatch.setattr(tuner, "_time_kernel", _Clock({"old": 1.0, "new": 0.5}))
    A, B, bias = _inputs()
    _call(A, B, bias)
    session = _session()
    assert session.first is old
    errors, barrier = [], threading.Barrier(4)

    def worker(seed: int) -> None:
        try:
            a, b, c = _inputs(seed)
            barrier.wait()
            for _ in range(25):
                _call(a, b, c)
                bt.wait(session, 60)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
    threads = [threading.Thread(target=worker, args=(s,)) for s in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    assert session.done and session.winner is new
    timed_launches = len(new.launches)
    for _ in range(3):
        _call(A, B, bias)
    assert len(new.launches) == timed_launches + 3  # every call after the switch: new
    assert old.launches  # and before it, the first kernel served calls


# ---------------------------------------------------------------- the pool's exit rule

@pytest.mark.slow
def test_an_exiting_process_drops_queued_jobs_and_waits_for_the_running_one(tmp_path):
    """At exit the pool's running job finishes (a compile is never stopped inside Triton)
    and its queued ones are dropped, not run."""
    script = f"""
import threading, time
from evtfuse.runtime import background
started = threading.Event()
def job(i):
    def run():
        started.set()
        time.sleep(0.5)
        open({str(tmp_path)!r} + f"/done{{i}}", "w").write("ok")
    return run
jobs = [background.submit(job(i), workers=1) for i in range(3)]
started.wait(60)
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["done0"]


def test_a_job_that_raises_keeps_its_error_and_the_pool_goes_on():
    def boom():
        raise RuntimeError("compile failed")
    failed = background.submit(boom, workers=2)
    seen = []
    fine = background.submit(lambda: seen.append(1), workers=2)
    assert failed.wait(60) and fine.wait(60)
    assert isinstance(failed.error, RuntimeError) and fine.error is None and seen == [1]
    with pytest.raises(ValueError, match="workers"):
        background.submit(lambda: None, workers=0)
