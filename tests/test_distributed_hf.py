"""A Hugging Face model under transformers' own tensor parallelism, patched by
``evtfuse.hf.patch``, on the CPU: two processes (gloo, Triton's interpreter). A tiny Llama
(random weights) saved once and loaded by both ranks with ``from_pretrained(...,
distributed_config=DistributedConfig(tp_size=2))`` (its ``base_model_tp_plan``: the
attention and MLP projections column- and row-parallel, the embedding and the LM head
sharded over the vocabulary), then patched: the MLP blocks run evtfuse's fused block on
each rank's shards (``runtime.mlp.tensor_parallel``), the loss evtfuse's vocab-parallel
cross-entropy on the LM head's DTensor weight. One training step (loss, every gradient,
an SGD step, the next loss) is the unsharded, unpatched model's."""

from __future__ import annotations

import tempfile

import pytest
import torch

transformers = pytest.importorskip("transformers")  # CI installs evtfuse[hf]

from distributed_helpers import run_ranks  # noqa: E402

VOCAB = 50
SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=VOCAB, head_dim=8)
TOL = dict(rtol=1e-4, atol=1e-5)


def _step(model, ids, labels):
    """Loss, then the gradients (full tensors by name), an SGD step, and the next loss."""
    loss = model(ids, labels=labels).loss
    loss.backward()
    grads = {n: p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad.clone()
             for n, p in model.named_parameters()}
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    with torch.no_grad():
        after = model(ids, labels=labels).loss
    return loss.detach(), grads, after


def _worker(rank: int, world: int, path: str) -> None:
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Shard
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.distributed import DistributedConfig

    import evtfuse.hf
    from evtfuse.nn import GatedMLP

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SMALL)).float()
    for p in model.parameters():  # larger than the init's 0.02: gradients well above rounding
        torch.nn.init.normal_(p, std=0.2)
    if rank == 0:
        model.save_pretrained(path)
    dist.barrier()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (2, 8), generator=g)
    labels = ids.clone()
    labels[0, :3] = -100
    want = _step(model, ids, labels)  # one process, unsharded, unpatched

    tp = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32,
                                          distributed_config=DistributedConfig(tp_size=world))
    head = tp.lm_head.weight
    assert isinstance(head, DTensor) and head.placements == (Shard(0),)
    evtfuse.hf.patch(tp)
    assert all(isinstance(layer.mlp, GatedMLP) for layer in tp.model.layers)
    assert isinstance(tp.model.layers[0].mlp.down_proj.weight, DTensor)
    got = _step(tp, ids, labels)
    torch.testing.assert_close(got[0], want[0], **TOL)
    assert got[1].keys() == want[1].keys()
    for name, grad in want[1].items():
        torch.testing.assert_close(got[1][name], grad, **TOL, msg=lambda m: f"{name}: {m}")
    torch.testing.assert_close(got[2], want[2], **TOL)


@pytest.mark.slow
def test_patched_llama_under_transformers_tensor_parallelism_trains_as_unsharded():
    with tempfile.TemporaryDirectory() as path:
        run_ranks(_worker, path)


@pytest.mark.slow
def test_distributed_benchmark_runs_tiny(tmp_path):
    """benchmarks/distributed.py --tiny (two CPU processes, the interpreter): the
    vocab-parallel loss against one process's, and the tensor-parallel Llama patched and
    not, eager and compiled, each with a time, the patched ones' loss and gradients as the
    original's."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "dist.json"
    cmd = [sys.executable, str(root / "benchmarks" / "distributed.py"), "--tiny", "--compile",
           "--rounds", "1", "--steps", "1", "--out", str(out)]
    env = dict(os.environ, PYTHONPATH=str(root / "src"), TRITON_INTERPRET="1",
               CUDA_VISIBLE_DEVICES="", EVTFUSE_CACHE_DIR=str(tmp_path / "cache"))
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    report = json.loads(out.read_text())
    lce = report["lce"]["vocab_parallel_2"]
    assert lce["ms"] > 0 and lce["loss_rel"] < 1e-6 and lce["dh_rel"] < 1e-5 \
        and lce["dw_rows_rel"] < 1e-5, lce
    results = report["llama"]["results"]
    assert list(results) == ["original", "patched", "original_compile", "patched_compile"]
    for name, r in results.items():
        assert "error" not in r and r["ms"] > 0, (name, r)
        if name != "original":
            assert r["loss_rel"] < 1e-5 and r["grad_rel_worst"] < 1e-4, (name, r)
