"""GPU tier: the docs' ``python gpu`` blocks (device="cuda", 4096-wide shapes), each page's
blocks as one script after its GPU setup and before its checks (``GPU_PAGES`` in
tests/test_doc_blocks.py, which states the convention for blocks). Run with
``PYTHONPATH=src python3 -m pytest -m gpu``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from doc_blocks import run_page  # noqa: E402
from test_doc_blocks import GPU_PAGES  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("page", sorted(GPU_PAGES))
def test_gpu_blocks_run(page, tmp_path):
    spec = GPU_PAGES[page]
    run_page(page, tmp_path, spec.must_hold, tail=spec.tail, setup=spec.setup, gpu=True,
             timeout=900)
