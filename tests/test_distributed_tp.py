"""Tensor parallelism of evtfuse's MLP blocks on the CPU: two processes (gloo, Triton's
interpreter); ``parallelize_module`` with ``ColwiseParallel`` on the up projections and
``RowwiseParallel`` on the down one (Megatron's MLP), the output and every gradient
(gathered from the shards) as the unsharded block's, ``GatedMLP`` (with biases) and
``MLP``, a plain and a replicated-DTensor input; and the error of a placement the block
cannot take."""

from __future__ import annotations

import copy

import pytest
import torch

from distributed_helpers import run_ranks
from evtfuse.errors import EpilogueError
from evtfuse.nn import MLP, GatedMLP


def _worker(rank: int, world: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 16, generator=g)
    dy = torch.randn(2, 5, 16, generator=g)
    for make, plan in (
            (lambda: GatedMLP(16, 24, "silu", bias=True),
             {"gate_proj": ColwiseParallel(), "up_proj": ColwiseParallel(),
              "down_proj": RowwiseParallel()}),
            (lambda: MLP(16, 32, activation="gelu_tanh"),
             {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})):
        torch.manual_seed(1)
        block = make()
        ref = copy.deepcopy(block)
        parallelize_module(block, mesh, plan)
        for as_dtensor in (False, True):
            for p in list(block.parameters()) + list(ref.parameters()):
                p.grad = None
            inp = distribute_tensor(x, mesh, [Replicate()]) if as_dtensor else x.clone()
            inp.requires_grad_(True)
            y = block(inp)
            y.backward(distribute_tensor(dy, mesh, [Replicate()]) if as_dtensor else dy)
            x2 = x.clone().requires_grad_(True)
            want = ref(x2)
            want.backward(dy)
            got = y.full_tensor() if as_dtensor else y
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            dx = inp.grad.full_tensor() if as_dtensor else inp.grad
            torch.testing.assert_close(dx, x2.grad, rtol=1e-5, atol=1e-5)
            for (name, p), q in zip(block.named_parameters(), ref.parameters()):
                torch.testing.assert_close(p.grad.full_tensor(), q.grad, rtol=1e-5, atol=1e-5,
                                           msg=lambda m: f"{name}: {m}")
    wrong = GatedMLP(16, 24, "silu")
    parallelize_module(wrong, mesh, {"gate_proj": ColwiseParallel(),
                                     "up_proj": RowwiseParallel(),
                                     "down_proj": RowwiseParallel()})
    with pytest.raises(EpilogueError, match="w1 \\(up\\) must be"):
        wrong(x)


@pytest.mark.slow
def test_colwise_rowwise_parallel_blocks_match_unsharded():
    run_ranks(_worker)


def _linear_worker(rank: int, world: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    import evtfuse

    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 4, 16, generator=g)
    # the row-parallel Linear: accum + bias, and an epilogue linear in accum and the bias
    # (each rank's epilogue of its partial sum, its part of the bias on the first rank)
    scaled = "def scaled(accum, bias, alpha):\n    D = alpha * (accum - bias)\n    return D"
    for second in ({}, {"epilogue": scaled, "alpha": 0.5}):
        torch.manual_seed(3)
        model = torch.nn.Sequential(
            evtfuse.nn.Linear(16, 32, epilogue=evtfuse.nn.with_activation("gelu_tanh")),
            evtfuse.nn.Linear(32, 16, **second))
        ref = copy.deepcopy(model)
        parallelize_module(model, mesh, {"0": ColwiseParallel(), "1": RowwiseParallel()})
        x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        y = model(x1)
        want = ref(x2)
        torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
        y.pow(2).sum().backward()
        want.pow(2).sum().backward()
        torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-5, atol=1e-5)
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad.full_tensor(), q.grad, rtol=1e-5, atol=1e-5,
                                       msg=lambda m: f"{second} {name}: {m}")
    softmax = evtfuse.nn.Linear(16, 32, epilogue="def e(accum, bias):\n"
                                "    D = softmax(accum + bias)\n    return D")
    parallelize_module(softmax, mesh, ColwiseParallel())
    with pytest.raises(EpilogueError, match="mixes columns"):
        softmax(x)
    relu = evtfuse.nn.Linear(16, 32, epilogue=evtfuse.nn.with_activation("relu"))
    parallelize_module(relu, mesh, RowwiseParallel())
    with pytest.raises(EpilogueError, match="partial sum"):
        relu(x.chunk(world, -1)[rank])


def test_colwise_rowwise_parallel_linears_match_unsharded():
    """evtfuse.nn.Linear under ColwiseParallel (a fused GELU on each rank's columns) then
    RowwiseParallel (accum + bias, or alpha * (accum - bias), on each rank's partial sum,
    then one all-reduce): output and gradients as unsharded; an epilogue that cannot be
    sharded is an error saying why."""
    run_ranks(_linear_worker)
