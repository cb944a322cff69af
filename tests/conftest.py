"""Test set-up shared by both tiers.

Without a CUDA GPU, kernels run through Triton's CPU interpreter: it must be switched on
before any kernel module is generated, so it is set here, before tests import evtfuse.
The kernel cache goes to a per-session temporary folder so tests never touch ~/.cache.
``--shard I/N`` keeps every N-th selected test from the I-th (1-based): the GPU tier splits
its longest shards over several processes with it (scripts/gpu_tier.sh).
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
    from evtfuse.runtime import cache, discovery, tuner

    monkeypatch.setenv("EVTFUSE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(tuner, "_records", {})
    monkeypatch.setattr(tuner, "_chosen", {})
    monkeypatch.setattr(cache, "_loaded", {})
    monkeypatch.setattr(discovery, "_kernel_objects", {})


def pytest_addoption(parser):
    parser.addoption("--shard", default=None, metavar="I/N",
                     help="run every N-th selected test, from the I-th (1 <= I <= N)")


def pytest_collection_modifyitems(config, items):
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
