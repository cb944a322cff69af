"""GPU tier: ``evtfuse.nn.MoEExperts`` in bf16 at moderate sizes: the output and the
gradients of the input, the routing weights and both expert weights against the per-expert
loop in float64, no further from it than the same loop in bf16 is (uniform, skewed with an
empty expert, random top-1; silu and gelu_tanh); no host synchronisation in a step
(``torch.cuda.set_sync_debug_mode("error")``); the sum over k deterministic (two steps bit
for bit); under torch.compile the eager results; an index out of range fails on the device.
Run with ``PYTHONPATH=src python3 -m pytest -m gpu tests/gpu/test_gpu_moe.py``.
"""

from __future__ import annotations

import pytest
import torch

from evtfuse.nn import MoEExperts
from test_moe import _reference

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

E, H, I, T = 8, 512, 704, 1536


def _routing(kind, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    if kind == "uniform":
        index = torch.stack([(torch.arange(T) + j) % E for j in range(k)], 1)
    elif kind == "skewed":  # a quarter of the pairs on expert 0, none on expert 5
        index = torch.stack([torch.randperm(E - 1, generator=g)[:k] for _ in range(T)])
        index = torch.where(index >= 5, index + 1, index)
        index[: T // 4, 0] = 0
        index[: T // 4, 1:] = torch.where(index[: T // 4, 1:] == 0, 1, index[: T // 4, 1:])
    else:
        index = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)])
    return index.cuda(), (torch.rand(T, k, generator=g) + 0.1).cuda()


def _run(fn, x, index, weights, gate_up, down, dy):
    leaves = [t.detach().clone().requires_grad_(True) for t in (x, weights, gate_up, down)]
    y = fn(leaves[0], index, leaves[1], leaves[2], leaves[3])
    y.backward(dy.to(y.dtype))
    return [y.detach(), *(t.grad for t in leaves)]


def _rel(got, want) -> float:
    return ((got.double() - want).norm() / want.norm()).item()


def _inputs(seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(T, H, device="cuda", generator=g).bfloat16()
    gate_up = (torch.randn(E, 2 * I, H, device="cuda", generator=g) * H ** -0.5).bfloat16()
    down = (torch.randn(E, H, I, device="cuda", generator=g) * I ** -0.5).bfloat16()
    dy = torch.randn(T, H, device="cuda", generator=g).bfloat16()
    return x, gate_up, down, dy


@pytest.mark.parametrize("weight_grads", ["evtfuse", "grouped_mm"])
@pytest.mark.parametrize("routing,k", [("uniform", 2), ("skewed", 2), ("random", 1)])
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_moe_experts_bf16(activation, routing, k, weight_grads, monkeypatch):
    """Either GEMM for the expert weights' gradients (``moe.WEIGHT_GRADS``; skewed routing
    leaves an expert without rows: its gradients zeros)."""
    from evtfuse.runtime import moe as moe_ops

    monkeypatch.setattr(moe_ops, "WEIGHT_GRADS", weight_grads)
    x, gate_up, down, dy = _inputs(1)
    index, weights = _routing(routing, k)
    block = MoEExperts(E, H, I, activation, device="cuda", dtype=torch.bfloat16)

    def ours(x, index, weights, gate_up, down):  # the block with these leaves as parameters
        return torch.func.functional_call(block, {"gate_up_proj": gate_up, "down_proj": down},
                                          (x, index, weights))

    def loop(x, index, weights, gate_up, down):
        return _reference(x, index, weights, gate_up, down, activation)

    got = _run(ours, x, index, weights.bfloat16(), gate_up, down, dy)
    bf16 = _run(loop, x, index, weights.bfloat16(), gate_up, down, dy)
    exact = _run(loop, x.double(), index, weights.double(), gate_up.double(), down.double(),
                 dy.double())
    for name, a, b, w in zip(("y", "dx", "d_weights", "d_gate_up", "d_down"), got, bf16, exact):
        assert _rel(a, w) <= max(1.5 * _rel(b, w), 4e-3), (name, _rel(a, w), _rel(b, w))


def _loaded(gate_up, down):
    block = MoEExperts(E, H, I, "silu", device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        block.gate_up_proj.copy_(gate_up)
        block.down_proj.copy_(down)
    return block


@pytest.mark.parametrize("way", ["embedding_bag", "gather_sum"])
@pytest.mark.parametrize("k", [2, 8])
def test_sum_over_k_rounds_once(k, way, monkeypatch):
    """The sum of each token's k rows (``moe._sum_pairs``: embedding_bag on CUDA, or
    evtfuse's ``gather_sum``: ``moe.SUM_PAIRS``) is the fp32 sum rounded once to bf16:
    within half a bf16 ulp (and fp32's own error) of the exact sum everywhere, as the CPU's
    two-pass path is; a sum rounded at every step would not be."""
    from evtfuse.runtime import moe
    from evtfuse.runtime.moe import _sum_pairs, _to_pairs

    monkeypatch.setattr(moe, "SUM_PAIRS", way)

    tokens, width = 4096, 1024
    g = torch.Generator(device="cuda").manual_seed(k)
    perm = torch.randperm(tokens * k, device="cuda", generator=g)
    rows = torch.randn(tokens * k, width, device="cuda", generator=g).bfloat16()
    got = _sum_pairs(rows, perm, tokens, k)
    exact = _to_pairs(rows.double(), perm).view(tokens, k, -1).sum(1)
    assert got.dtype == torch.bfloat16 and got.shape == (tokens, width)
    # fp32's error over k terms, then one rounding to bf16: at most half of bf16's eps
    # relative to the value (its ulp is at most eps times it)
    slack = _to_pairs(rows.double().abs(), perm).view(tokens, k, -1).sum(1) * k * 2.0 ** -24
    bound = 0.5 * torch.finfo(torch.bfloat16).eps * (exact.abs() + slack) + slack + 2.0 ** -133
    assert bool(((got.double() - exact).abs() <= bound).all())
    assert torch.equal(_sum_pairs(rows, perm, tokens, k), got)  # deterministic


def test_no_host_sync_and_deterministic():
    x, gate_up, down, dy = _inputs(2)
    index, weights = _routing("skewed", 2)
    block = _loaded(gate_up, down)

    def step():
        xx = x.clone().requires_grad_(True)
        for p in block.parameters():
            p.grad = None
        y = block(xx, index, weights)
        y.backward(dy)
        return [y.detach(), xx.grad, *(p.grad for p in block.parameters())]

    first = step()  # compiles and tunes (its host reads are the tuner's)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        second = step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def test_compiled_matches_eager():
    x, gate_up, down, dy = _inputs(3)
    index, weights = _routing("uniform", 2)
    block = _loaded(gate_up, down)
    eager = block(x, index, weights)
    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True)(x, index, weights)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)


def test_index_out_of_range_fails_on_the_device(tmp_path):
    """A device-side assert ends the process's CUDA context: in a process of its own."""
    import os
    import subprocess
    import sys

    script = tmp_path / "bad_index.py"
    script.write_text(
        "import torch\n"
        "from evtfuse.nn import MoEExperts\n"
        f"block = MoEExperts({E}, {H}, {I}, 'silu', device='cuda', dtype=torch.bfloat16)\n"
        f"x = torch.randn({T}, {H}, device='cuda', dtype=torch.bfloat16)\n"
        f"index = torch.zeros({T}, 2, dtype=torch.int64, device='cuda')\n"
        f"index[:, 1] = 1\n"
        f"index[7, 1] = {E}\n"
        f"weights = torch.rand({T}, 2, device='cuda')\n"
        "block(x, index, weights)\n"
        "torch.cuda.synchronize()\n"
        "print('NO ERROR')\n")
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ))
    assert res.returncode != 0 and "NO ERROR" not in res.stdout, res.stdout + res.stderr
