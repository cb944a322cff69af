"""GPU tier: ``evtfuse.linear_cross_entropy`` on a real GPU, bf16 and fp32.

The loss, the lse and the gradients of hidden, weight and bias against torch's
``cross_entropy`` of ``hidden.float() @ weight.float().T`` (fp32 on the GPU) by relative
norm, at a moderate size run as several chunks of rows (a vocabulary of 8003: rows of
logits that TMA can only reach padded); a compiled training step (Inductor); and the point
of it all, peak memory: at 8192 tokens x 1024 hidden x 64000 vocabulary in bf16 the
logits alone would be 1000 MiB, and a training step holds at most 256 MiB beyond its
inputs, weight and gradients (``torch.cuda.max_memory_allocated``).
"""

from __future__ import annotations

import pytest
import torch

import evtfuse
from evtfuse.runtime import cross_entropy

from lce_reference import torch_lce

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DEV = "cuda"
MIB = 1 << 20
# relative-norm tolerance against fp32 torch, by the run's dtype (bf16: our logits are
# rounded to bf16 as torch's bf16 logits would be; the reference's are not)
REL = {torch.bfloat16: 3e-2, torch.float32: 2e-3}


@pytest.fixture
def quick_tuning(monkeypatch):
    """The heuristic's kernel for every call (no tuning), chunks of ~1 MiB of logits."""
    monkeypatch.setattr(cross_entropy, "TUNE", "none")
    monkeypatch.setattr(cross_entropy, "CHUNK_BYTES", 2 * MIB)


def _inputs(t, h, v, dtype, seed=0, ignored=0.1):
    g = torch.Generator(device=DEV).manual_seed(seed)
    hidden = torch.randn(t, h, device=DEV, generator=g).to(dtype)
    weight = (torch.randn(v, h, device=DEV, generator=g) / h ** 0.5).to(dtype)
    bias = (torch.randn(v, device=DEV, generator=g) * 0.1).to(dtype)
    target = torch.randint(0, v, (t,), device=DEV, generator=g)
    target[torch.rand(t, device=DEV, generator=g) < ignored] = -100
    return hidden, weight, bias, target


def _rel(got, want) -> float:
    got, want = got.double(), want.double()
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


CASES = {
    "mean": dict(reduction="mean"),
    "sum_all_options": dict(reduction="sum", label_smoothing=0.1, softcap=15.0, z_loss=1e-4),
    "none_softcap": dict(reduction="none", softcap=30.0),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no_bias"])
def test_matches_torch(quick_tuning, dtype, case, with_bias):
    hidden, weight, bias, target = _inputs(1000, 512, 8003, dtype)
    bias = bias if with_bias else None
    opts = CASES[case]
    leaves = [t.detach().clone().requires_grad_(True) if t is not None else None
              for t in (hidden, weight, bias)]
    ref = [t.detach().float().requires_grad_(True) if t is not None else None
           for t in (hidden, weight, bias)]
    loss, lse = evtfuse.linear_cross_entropy(leaves[0], leaves[1], target, bias=leaves[2],
                                             return_lse=True, **opts)
    want, want_lse = torch_lce(ref[0], ref[1], target, bias=ref[2], **opts)
    assert _rel(loss.detach(), want.detach()) < REL[dtype] / 3
    assert _rel(lse.detach(), want_lse.detach()) < REL[dtype] / 3
    g = torch.rand(loss.shape, device=DEV) if loss.dim() else torch.tensor(0.5, device=DEV)
    (loss * g).sum().backward()
    (want * g).sum().backward()
    for name, got, w in zip(("hidden", "weight", "bias"), leaves, ref):
        if got is not None:
            assert got.grad.dtype == dtype
            assert _rel(got.grad, w.grad) < REL[dtype], name
    with torch.no_grad():
        again = evtfuse.linear_cross_entropy(hidden, weight, target, bias=bias, **opts)
    assert _rel(again, loss.detach()) < 1e-5  # no logits stored


def test_compiled_training_step_with_inductor(quick_tuning):
    hidden, weight, bias, target = _inputs(600, 256, 4000, torch.bfloat16, seed=3)

    def step(h, w, b, y):
        loss, lse = evtfuse.linear_cross_entropy(h, w, y, bias=b, z_loss=1e-4, return_lse=True)
        return loss + 1e-3 * lse.mean()

    def grads(fn):
        leaves = [t.detach().clone().requires_grad_(True) for t in (hidden, weight, bias)]
        fn(*leaves, target).backward()
        return [t.grad for t in leaves]

    eager = grads(step)
    torch._dynamo.reset()
    compiled = grads(torch.compile(step, fullgraph=True))
    # compiled, the same kernels in the same order: the same gradients
    for got, want in zip(compiled, eager):
        assert _rel(got, want) < 1e-6


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_peak_memory_stays_under_the_bound(dtype, compiled):
    """A training step at 8192 x 1024 x 64000 (default chunks and tuning) keeps at most
    256 MiB beyond its inputs, weight and gradients, and less than a quarter of what its
    logits alone would take, eager and under torch.compile (whose backward's scaling
    Inductor reinplaces: no copy of d_weight)."""
    T, Hd, V = 8192, 1024, 64000
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()  # what earlier tests left
    hidden, weight, _, target = _inputs(T, Hd, V, dtype, seed=5)
    hidden.requires_grad_(True)
    weight.requires_grad_(True)
    inputs = hidden.nbytes + weight.nbytes + target.nbytes

    loss = evtfuse.linear_cross_entropy
    if compiled:
        torch._dynamo.reset()
        loss = torch.compile(loss, fullgraph=True)

    def step():
        loss(hidden, weight, target).backward()

    step()  # the first call tunes and compiles; later calls reuse what it built
    hidden.grad = weight.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    grads = hidden.grad.nbytes + weight.grad.nbytes
    # beyond: the chunk of logits, reduction workspaces and anything else evtfuse keeps
    # (made by the first step), cuBLAS's workspace
    beyond = (peak - before - inputs - grads) / MIB
    logits = T * V * hidden.element_size() / MIB
    print(f"peak beyond inputs and gradients: {beyond:.0f} MiB (logits: {logits:.0f} MiB)")
    assert beyond <= 256 and beyond < logits / 4


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32],
                         ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("g", [1.0, 1.7, 1 / 3, float("inf"), float("nan")])
def test_backward_scale_rounds_once(dtype, g):
    """The backward's in-place scaling (``evtfuse::scale_``) is the float32 product of x and
    g rounded once to x's dtype, exactly, special values included, over a tensor of more
    blocks than the persistent grid has programs (4001 blocks of 4096 elements) with a
    ragged end."""
    x = torch.randn(4000, 4097, device=DEV).to(dtype)
    x[0, :4] = torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0])
    gt = torch.tensor(g, device=DEV)
    want = (x.float() * gt).to(dtype)
    torch.ops.evtfuse.scale_.default(x, gt)
    torch.testing.assert_close(x, want, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_a_bad_target_raises_after_the_chunks_are_queued(quick_tuning, reduction):
    """On the GPU the targets' check waits for an event queued before the chunks (no sync of
    the whole queue): a bad target in the last chunk still raises, naming the first one, no
    gradient reaches the leaves, and the next call with good targets runs and is right."""
    hidden, weight, _, target = _inputs(1024, 256, 8003, torch.bfloat16)
    hidden.requires_grad_(True)
    weight.requires_grad_(True)
    bad = target.clone()
    bad[1000], bad[1020] = 8003, -7
    with pytest.raises(evtfuse.EpilogueError) as exc:
        evtfuse.linear_cross_entropy(hidden, weight, bad, reduction=reduction).sum().backward()
    assert exc.value.variable == "target"
    assert "target[1000] = 8003 is out of bounds" in str(exc.value), str(exc.value)
    assert hidden.grad is None and weight.grad is None
    loss = evtfuse.linear_cross_entropy(hidden, weight, target, reduction=reduction)
    want = torch_lce(hidden.float(), weight.float(), target, reduction=reduction)[0]
    assert _rel(loss.detach(), want.detach()) < REL[torch.bfloat16]
