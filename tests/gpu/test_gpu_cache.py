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


def _compiles(call, m: int, monkeypatch) -> list:
    """What Triton compiled during ``call(m)``: ``jit_cache_hook`` runs on every in-memory
    miss of a JIT function, before it compiles."""
    from triton import knobs

    misses = []
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook",
                        lambda *a, **k: misses.append(k.get("repr", a)) and False)
    call(m)
    return misses


def test_a_new_m_of_a_known_size_class_compiles_nothing(own_cache, monkeypatch):
    """After a tuned call at M=1024, a call at M=920 (the same size class) takes the class's
    kernel and Triton compiles nothing (``_compiles``): M is unspecialised, the constexprs
    are the same."""
    monkeypatch.setenv("EVTFUSE_TUNE_BUDGET_S", "20")
    src = "def epi(accum, C): D = gelu_tanh(accum) * 0.5 + C; return D"
    N, K = 2048, 512
    B = torch.randn(K, N, device="cuda").to(torch.bfloat16)

    def call(m):
        A = torch.randn(m, K, device="cuda").to(torch.bfloat16)
        C = torch.randn(m, N, device="cuda").to(torch.bfloat16)
        out = evtfuse.gemm(A, B, src, C=C)
        ref = torch.nn.functional.gelu(A.float() @ B.float(), approximate="tanh") * 0.5 + C.float()
        torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=5e-2)

    call(1024)
    misses = _compiles(call, 920, monkeypatch)
    assert not misses, misses


def test_a_new_m_of_the_other_kind_is_compiled_ahead(own_cache, monkeypatch):
    """An epilogue with a whole-output reduction specialises on whether the tiles cover M
    (``EVEN_MN``): after a tuned call at M=1024 (covered) the other variant compiles in the
    background (``runtime.background``), so a call at M=920 (not covered), once that is
    done, compiles nothing, and its sum is right (rows past M not counted)."""
    from evtfuse.runtime import background

    monkeypatch.setenv("EVTFUSE_TUNE_BUDGET_S", "20")
    src = "def epi(accum, C): D = accum + C; t = sum(D * D); return D, t"
    N, K = 2048, 512
    B = torch.randn(K, N, device="cuda").to(torch.bfloat16)

    def call(m):
        A = torch.randn(m, K, device="cuda").to(torch.bfloat16)
        C = torch.randn(m, N, device="cuda").to(torch.bfloat16)
        t = torch.full((1,), float("nan"), device="cuda")
        D = evtfuse.gemm(A, B, src, C=C, t=t)[0]
        ref = A.float() @ B.float() + C.float()
        torch.testing.assert_close(D.float(), ref, rtol=2e-2, atol=5e-2)
        want = (D.float() ** 2).sum()
        torch.testing.assert_close(t[0], want, rtol=1e-3, atol=0)

    call(1024)
    background.wait(120)
    misses = _compiles(call, 920, monkeypatch)
    assert not misses, misses
