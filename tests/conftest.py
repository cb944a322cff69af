"""Test set-up shared by both tiers.

Without a CUDA GPU, kernels run through Triton's CPU interpreter: it must be switched on
before any kernel module is generated, so it is set here, before tests import evtfuse.
The kernel cache goes to a per-session temporary folder so tests never touch ~/.cache.
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
    """A cache folder of the test's own; the tuner's in-memory choices and the loaded
    kernel modules start empty (all restored after the test)."""
    from evtfuse.runtime import cache, tuner

    monkeypatch.setenv("EVTFUSE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(tuner, "_records", {})
    monkeypatch.setattr(tuner, "_chosen", {})
    monkeypatch.setattr(cache, "_loaded", {})
