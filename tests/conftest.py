"""Test set-up shared by both tiers.

Without a CUDA GPU, kernels run through Triton's CPU interpreter: it must be switched on
before any kernel module is generated, so it is set here, before tests import evtfuse.
The kernel cache goes to a per-session temporary folder so tests never touch ~/.cache.
``--shard I/N`` keeps every N-th selected test from the I-th (1-based): the GPU tier splits
its longest shards over several processes with it (scripts/gpu_tier.sh).

The CPU tests come in two parts: the quick tier (``python3 -m pytest -q``, the README's
command: every layer, a few minutes) and the tests marked ``slow`` (long fuzz runs,
offline sm_90 compiles, float64 gradchecks, every parametrisation of the large grids),
which run with ``--full`` (everything) or ``-m slow`` (only them; CI runs the quick tier,
then these). A test marked ``cover`` runs in the quick tier only as many of its
parametrisations as it takes for each value of each parameter to appear once (chosen
greedily, the same every run; ``cover("family")``: each value of the parameters named),
its other parametrisations are marked ``slow``. A slow test
named on the command line by its node id runs without ``--full``.
"""

import os
import tempfile

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("EVTFUSE_CACHE_DIR", tempfile.mkdtemp(prefix="evtfuse-test-cache-"))
os.environ.setdefault("EVTFUSE_PROGRESS", "0")


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """A cache folder of the test's own; the tuner's in-memory choices, the loaded kernel
    modules and the kernel objects (which keep their compiled functions) start empty (all
    restored after the test)."""
    from evtfuse.runtime import cache, kernel, tuner

    monkeypatch.setenv("EVTFUSE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(tuner, "_records", {})
    monkeypatch.setattr(tuner, "_chosen", {})
    monkeypatch.setattr(cache, "_loaded", {})
    monkeypatch.setattr(kernel, "_kernel_objects", {})


@pytest.fixture(autouse=os.environ.get("EVTFUSE_TEST_FAST_AS") == "background")
def fast_as_background(monkeypatch):
    """``EVTFUSE_TEST_FAST_AS=background``: every ``tune="fast"`` call (the default) tunes
    in the background instead: the GPU tier run as it would run with "background" as the
    default (issue 52), its first calls on the starter kernel and switching mid-test."""
    from evtfuse.runtime import tuner

    choose = tuner._choose
    monkeypatch.setattr(tuner, "_choose", lambda args, tune, cc: choose(
        args, tuner.BACKGROUND if tune == "fast" else tune, cc))


def pytest_addoption(parser):
    parser.addoption("--shard", default=None, metavar="I/N",
                     help="run every N-th selected test, from the I-th (1 <= I <= N)")
    parser.addoption("--full", action="store_true", default=False,
                     help="the whole CPU tier: the quick tier and the tests marked slow")


def _covering(items, names):
    """The items of one parametrised test that the quick tier keeps: greedily, the item
    that shows the most (parameter, value) pairs of the parameters ``names`` (all when
    empty) not yet shown, then of the others, until every pair of ``names`` is shown."""
    def pairs(t):
        return {(k, repr(v)) for k, v in t.callspec.params.items()}
    every = {id(t): pairs(t) for t in items}
    chosen = {id(t): {p for p in every[id(t)] if not names or p[0] in names} for t in items}
    left, seen, kept = set().union(*chosen.values()), set(), []
    while left:
        best = max(items, key=lambda t: (len(chosen[id(t)] & left),
                                         len(every[id(t)] - seen)))  # the first of equals
        kept.append(best)
        left -= chosen[id(best)]
        seen |= every[id(best)]
    return kept


def _named(item, args) -> bool:
    """Whether the command line names this test by its node id (with or without its
    parameters)."""
    return any(a == item.nodeid or a == item.nodeid.split("[")[0] for a in args)


@pytest.hookimpl(tryfirst=True)  # before -m reads the slow marks added here
def pytest_collection_modifyitems(config, items):
    _tiers(config, items)
    _shard(config, items)


def _tiers(config, items):
    groups = {}
    for t in items:
        mark = t.get_closest_marker("cover")
        if mark is not None and hasattr(t, "callspec"):
            groups.setdefault((t.parent.nodeid, t.originalname, mark.args), []).append(t)
    for (_, _, names), group in groups.items():
        kept = {id(t) for t in _covering(group, names)}
        for t in group:
            if id(t) not in kept:
                t.add_marker(pytest.mark.slow)
    if config.getoption("--full") or "slow" in (config.getoption("markexpr") or ""):
        return
    args = [a.replace("\\", "/") for a in config.args]
    slow = [t for t in items if t.get_closest_marker("slow") is not None and not _named(t, args)]
    if slow:
        config.stash[_SLOW_LEFT] = len(slow)
        config.hook.pytest_deselected(items=slow)
        gone = {id(t) for t in slow}
        items[:] = [t for t in items if id(t) not in gone]


_SLOW_LEFT = pytest.StashKey[int]()


def pytest_terminal_summary(terminalreporter, config):
    left = config.stash.get(_SLOW_LEFT, 0)
    if left:
        terminalreporter.write_line(
            f"quick tier: {left} tests marked slow not run (the whole CPU tier: "
            "python3 -m pytest -q --full; only those: -m slow)")


def _shard(config, items):
    spec = config.getoption("--shard")
    if not spec:
        return
    try:
        i, n = (int(p) for p in spec.split("/"))
        assert 1 <= i <= n
    except (ValueError, AssertionError):
        raise pytest.UsageError(f"--shard: expected I/N with 1 <= I <= N, got {spec!r}") from None
    gone = [t for k, t in enumerate(items) if k % n != i - 1]
    if gone:
        config.hook.pytest_deselected(items=gone)
        items[:] = [t for k, t in enumerate(items) if k % n == i - 1]
