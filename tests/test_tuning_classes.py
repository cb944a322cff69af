"""Tuning by size class (``runtime.tuner.size_class``): a new M in a known class reuses the
class's choice, from this process or from the disk cache, and M outside it does not."""

from __future__ import annotations

import pytest
import torch

import evtfuse
from evtfuse import EpilogueArguments, GemmArguments
from evtfuse.runtime import cache, tuner
from evtfuse.runtime.tuner import size_class

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="CPU-interpreter tier (the tuner's keys are the same on a GPU)")


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EVTFUSE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(tuner, "_memory", {})
    monkeypatch.setattr(cache, "_loaded", {})


def test_size_classes():
    assert [size_class(m) for m in (1, 16, 17, 32, 33, 64)] == [16, 16, 32, 32, 64, 64]
    previous = 64
    for m in range(65, 20000, 7):
        c = size_class(m)
        assert m <= c <= 1.25 * m + 1 and c >= previous  # tight, and monotonic
        assert size_class(c) == c  # a class's largest M is in it
        previous = c
    assert size_class(4096) == 4096 and size_class(4097) == 5120


def _args(M, N=24, K=16):
    A, B = torch.randn(M, K), torch.randn(K, N)
    D = torch.empty(M, N)
    return GemmArguments(A, B, D, epilogue=EpilogueArguments(
        "def e(accum, bias): D = relu(accum + bias); return D", bias=torch.randn(N), D=D))


def test_keys_follow_the_class_of_m_and_every_other_dimension():
    key = tuner.tuning_key(_args(1000), "fast", None)
    assert tuner.tuning_key(_args(1020), "fast", None) == key  # both in (896, 1024]
    assert tuner.tuning_key(_args(1100), "fast", None) != key
    assert tuner.tuning_key(_args(1000, N=32), "fast", None) != key
    assert tuner.tuning_key(_args(1000, K=32), "fast", None) != key


def test_a_new_m_in_a_known_class_reuses_the_stored_choice():
    """A choice on disk for M = 1000 (the one a tuning made: here the heuristic's second
    candidate, so that reuse shows) serves M = 1010 in a fresh process (the in-memory table
    empty) without tuning; M = 1100, in the next class, takes its own (the first)."""
    first = _args(1000)
    kernels = evtfuse.get_kernels(first)
    assert len(kernels) >= 2
    picked = kernels[1]
    cache.store_choice(tuner.tuning_key(first, "fast", None),
                       tuner.tuning_record(first, picked, "fast"))
    assert tuner.choose_kernel(_args(1010)).name == picked.name
    assert tuner.choose_kernel(_args(1100)).name == kernels[0].name
    again = _args(1010)
    D = evtfuse.gemm(again.A, again.B, "def e(accum, bias): D = relu(accum + bias); return D",
                     bias=again.epilogue.values["bias"])
    torch.testing.assert_close(D, torch.relu(again.A @ again.B + again.epilogue.values["bias"]),
                               atol=1e-4, rtol=1e-4)
