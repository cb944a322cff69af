"""FSDP2 (``torch.distributed.fsdp.fully_shard``) of models holding evtfuse's modules, on the
CPU: two processes (gloo, Triton's interpreter), each training on its half of a batch; every
parameter's gradient (gathered from its shards) is the unsharded model's on the whole batch
(FSDP2 averages over the ranks), for ``evtfuse.nn.Linear`` with a fused epilogue,
``GatedMLP``, ``MLP`` and ``linear_cross_entropy`` as the head's loss; and a Hugging Face
Llama patched by ``evtfuse.hf.patch`` (with transformers installed)."""

from __future__ import annotations

import copy

import pytest
import torch

import evtfuse
from distributed_helpers import run_ranks


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = evtfuse.nn.Linear(16, 24, epilogue=evtfuse.nn.with_activation("relu"))
        self.gated = evtfuse.nn.GatedMLP(24, 32, "silu")
        self.plain = evtfuse.nn.MLP(24, 40, activation="gelu_tanh")
        self.head = torch.nn.Linear(24, 29, bias=False)

    def forward(self, x, y):
        h = self.plain(self.gated(self.inp(x)))
        return evtfuse.linear_cross_entropy(h, self.head.weight, y, reduction="sum")


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    import evtfuse.hf

    config = LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=64)
    model = LlamaForCausalLM(config)
    ref = copy.deepcopy(model)
    evtfuse.hf.patch(model)
    return model, ref


def _check(model, ref, parts, full_loss, world, rank, what):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    for m in parts(model):
        fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    full_loss(model, rank).backward()
    full_loss(ref, None).backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        got = p.grad.full_tensor() * world  # FSDP2 averages the ranks' gradients
        torch.testing.assert_close(got, q.grad, rtol=1e-4, atol=1e-5,
                                   msg=lambda m: f"{what} {name}: {m}")


def _worker(rank: int, world: int, with_hf: bool) -> None:
    torch.manual_seed(0)
    model = _Model()
    ref = copy.deepcopy(model)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 16, generator=g), torch.randint(0, 29, (8,), generator=g)

    def loss(m, r):
        return m(x, y) if r is None else m(x.chunk(world)[r], y.chunk(world)[r])

    _check(model, ref, lambda m: [m.inp, m.gated, m.plain], loss, world, rank, "modules")
    if with_hf:
        model, ref = _llama()
        ids = torch.randint(0, 64, (4, 8), generator=g)

        def lm_loss(m, r):
            batch = ids if r is None else ids.chunk(world)[r]
            # sum over the tokens, as the FSDP2 average times world is the whole batch's
            out = m(batch, labels=batch, num_items_in_batch=1)
            return out.loss
        _check(model, ref, lambda m: list(m.model.layers), lm_loss, world, rank, "llama")


@pytest.mark.slow
def test_fully_shard_matches_unsharded():
    try:
        import transformers  # noqa: F401
        with_hf = True
    except ImportError:  # the [hf] extra: CI installs it; the modules' part runs anyway
        with_hf = False
    run_ranks(_worker, with_hf)
