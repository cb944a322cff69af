"""GPU tier: the cache on a GPU, where the tuner times candidates and stores its choice.

Kernel modules run from the generated source (``cache.import_source``, read by Triton's
JIT through ``inspect``), and the stored tuning record is one the cache reads back.
"""

from __future__ import annotations

import sys

import pytest
import torch

import evtfuse
from evtfuse.runtime import cache

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_tuned_call_from_a_fresh_cache(own_cache, monkeypatch):
    monkeypatch.setenv("EVTFUSE_TUNE_BUDGET_S", "20")
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    src = "def epi(accum, C): D = relu(accum) * 0.8125 + C; return D"  # an epilogue of its own
    A, B = torch.randn(512, 256, device="cuda").half(), torch.randn(256, 384, device="cuda").half()
    C = torch.randn(512, 384, device="cuda").half()
    out = evtfuse.gemm(A, B, src, C=C, tune="fast")
    ref = torch.relu(A.float() @ B.float()) * 0.8125 + C.float()
    torch.testing.assert_close(out.float(), ref, rtol=1e-2, atol=5e-2)
    kernels = cache.cache_dir() / "kernels"
    assert list(kernels.glob("k*.py")) and not (kernels / "__pycache__").exists()
    entries = cache.list_entries()
    assert len(entries) == 1 and entries[0]["M"] == 512 and entries[0]["epilogue"] == "epi"
    assert cache.record_problem({k: v for k, v in entries[0].items() if k != "file"}) is None
