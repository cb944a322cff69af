"""``benchmarks/moe.py --layer --tiny`` end to end on the CPU (Triton's interpreter): the
script runs in a subprocess without a GPU and writes a JSON with every variant that can run
here timed, and evtfuse's output and gradients equal to transformers' eager experts (nothing
timed is asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _grouped_mm_on_cpu() -> bool:
    if not hasattr(torch, "_grouped_mm"):
        return False
    try:
        torch._grouped_mm(torch.zeros(16, 16), torch.zeros(1, 16, 16),
                          offs=torch.tensor([16], dtype=torch.int32))
        return True
    except Exception:  # noqa: BLE001
        return False


@pytest.mark.slow
def test_moe_layer_tiny(tmp_path):
    pytest.importorskip("transformers")
    out = tmp_path / "moe_layer.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TRITON_INTERPRET": "1",
           "CUDA_VISIBLE_DEVICES": "", "EVTFUSE_CACHE_DIR": str(tmp_path / "cache"),
           "EVTFUSE_PROGRESS": "0", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "moe.py"), "--layer",
                           "--tiny", "--out", str(out)], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    took = time.perf_counter() - t
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())
    assert results["device"] == "cpu" and results["tiny"]
    assert results["compile_backend"] == "aot_eager"  # inductor's cold C++ build: ~15 s
    assert "| evtfuse |" in proc.stdout  # the markdown table
    cells = results["cells"]
    assert [c["routing"] for c in cells] == ["uniform", "skewed"]
    must_run = ["evtfuse", "hf_eager", "hf_grouped_mm", "hf_grouped_mm_compile"]
    if _grouped_mm_on_cpu():
        must_run.append("reference")
    for c in cells:
        assert "error" not in c, c["error"]
        assert c["top_k"] == 2 and c["tokens"] == 32
        assert c["flop_step"] == 3 * 2 * 32 * 2 * 16 * 3 * 24  # 3 x 2 x T x k x H x 3I
        for v in must_run:
            assert f"{v}_error" not in c, c[f"{v}_error"]
            assert c[f"{v}_step_ms"] > 0 and c[f"{v}_fwd_ms"] > 0, v
            assert len(c[f"{v}_rounds_step_ms"]) == results["rounds"]
        for v in must_run:
            if v != "hf_eager":
                for n in ("out", "x", "weights", "gate_up", "down"):
                    assert c[f"{v}_rel_err_{n}"] < 1e-4, (v, n, c[f"{v}_rel_err_{n}"])
        if "reference" not in must_run:
            assert "reference_skipped" in c
    uniform, skewed = cells
    assert uniform["largest_group"] == 32 * 2 // 4 and uniform["empty_groups"] == 0
    assert skewed["empty_groups"] >= 1 and skewed["largest_group"] >= 32 * 2 // 4
    print(f"benchmarks/moe.py --layer --tiny: {took:.1f} s")  # reported, not asserted


def test_layer_routing_shapes():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import moe
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    for E, k in ((8, 2), (64, 8), (4, 2)):
        for skewed in (False, True):
            index, weights = moe.layer_routing(256, E, k, skewed)
            assert index.shape == weights.shape == (256, k)
            assert index.dtype == torch.int64 and 0 <= int(index.min()) and int(index.max()) < E
            assert all(len(set(row)) == k for row in index.tolist())  # distinct per token
            torch.testing.assert_close(weights.sum(-1), torch.ones(256))
            counts = torch.bincount(index.reshape(-1), minlength=E)
            if not skewed:
                assert counts.tolist() == [256 * k // E] * E
            else:
                assert int(counts[0]) == min(256, 256 * k // 4)
                assert int((counts == 0).sum()) >= 1
