"""Vocab-parallel ``evtfuse.linear_cross_entropy`` (``process_group=``) on the CPU: two
processes (gloo, Triton's interpreter), the vocabulary split unevenly between them; the
loss, the lse and the gradient of hidden as the single-process call's on every rank, and
each rank's weight and bias gradients its rows of the single-process ones: every reduction,
label smoothing, softcap, z-loss, ignored rows, a gradient through the lse (the recomputing
backward), special values (a row holding +inf, a NaN), and the errors."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
import torch.distributed as dist

import evtfuse
from evtfuse.errors import EpilogueError
from evtfuse.runtime import cross_entropy
from distributed_helpers import run_ranks

T, H, V = 10, 8, 37  # 37 rows of weight: 19 on rank 0, 18 on rank 1
SPLIT = 19
CASES = [dict(reduction="mean"), dict(reduction="sum", label_smoothing=0.1),
         dict(reduction="none", softcap=3.0), dict(reduction="mean", z_loss=1e-2, bias=True),
         dict(reduction="mean", lse=True), dict(reduction="mean", special=True)]


def _inputs(case):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(T, H, generator=g)
    w = torch.randn(V, H, generator=g) * 0.5
    b = torch.randn(V, generator=g) if case.get("bias") else None
    y = torch.randint(0, V, (T,), generator=g)
    y[3] = -100
    y[5] = SPLIT  # the first row of rank 1's shard
    y[6] = SPLIT - 1  # the last of rank 0's
    if case.get("special"):
        h[2, 0] = float("inf")
        h[7, 1] = float("nan")
    return h, w, b, y


def _run(h, w, b, y, case, group=None):
    leaves = [t.clone().requires_grad_(True) if t is not None else None for t in (h, w, b)]
    opts = {k: v for k, v in case.items() if k in ("reduction", "label_smoothing", "softcap",
                                                   "z_loss")}
    loss, lse = evtfuse.linear_cross_entropy(leaves[0], leaves[1], y, bias=leaves[2],
                                             return_lse=True, process_group=group, **opts)
    weights = torch.linspace(0.5, 1.5, T)
    total = (loss * weights).sum() if case["reduction"] == "none" else loss * 1.3
    if case.get("lse"):
        total = total + 0.1 * lse.sum()
    total.backward()
    return loss.detach(), lse.detach(), *(t.grad if t is not None else None for t in leaves)


def _worker(rank: int, world: int) -> None:
    rows = slice(0, SPLIT) if rank == 0 else slice(SPLIT, V)
    for case in CASES:
        h, w, b, y = _inputs(case)
        want = _run(h, w, b, y, case)
        got = _run(h, w[rows], None if b is None else b[rows], y, case,
                   group=dist.group.WORLD)
        close = dict(rtol=1e-5, atol=1e-6, equal_nan=True)
        for what, a, e in zip(("loss", "lse", "d_hidden"), got[:3], want[:3]):
            torch.testing.assert_close(a, e, **close, msg=lambda m: f"{case} {what}: {m}")
        torch.testing.assert_close(got[3], want[3][rows], **close,
                                   msg=lambda m: f"{case} d_weight: {m}")
        if b is not None:
            torch.testing.assert_close(got[4], want[4][rows], **close,
                                       msg=lambda m: f"{case} d_bias: {m}")
    with pytest.raises(EpilogueError, match="process_group must be"):
        evtfuse.linear_cross_entropy(h, w[rows], y, process_group="world")


@pytest.mark.slow
def test_vocab_parallel_matches_one_process():
    run_ranks(_worker)


def test_process_group_needs_torch_distributed():
    h, w, _, y = _inputs({})
    if dist.is_initialized():
        pytest.skip("this process has a default group")
    with pytest.raises(EpilogueError, match="torch.distributed is not initialized"):
        evtfuse.linear_cross_entropy(h, w, y, process_group=object())


def test_shard_offsets_are_asked_once(monkeypatch):
    """The shards' first rows come from one all-gather per group and shard size, kept."""
    calls = []

    class FakeGroup:
        pass

    group = FakeGroup()
    monkeypatch.setattr(dist, "get_world_size", lambda g=None: 2)
    monkeypatch.setattr(dist, "get_rank", lambda g=None: 1)
    monkeypatch.setattr(dist, "get_backend", lambda g=None: "gloo")

    def gather(out, inp, group=None):
        calls.append(1)
        out.copy_(torch.tensor([19, 18]))
    monkeypatch.setattr(cross_entropy, "_all_gather", gather)
    monkeypatch.setattr(cross_entropy, "_SHARDS", weakref.WeakKeyDictionary())
    assert cross_entropy.vocab_shards(group, 18) == (19, 37)
    assert cross_entropy.vocab_shards(group, 18) == (19, 37)
    assert calls == [1]
    # the cache does not keep a group alive: a gloo group that outlives
    # destroy_process_group into interpreter shutdown aborts the process there
    alive = weakref.ref(group)
    del group
    gc.collect()
    assert alive() is None and len(cross_entropy._SHARDS) == 0


@pytest.mark.slow
def test_distributed_md_runs(tmp_path):
    """docs/distributed.md's examples: two processes, gloo, the interpreter (the
    vocab-parallel loss, then evtfuse.gemm on DTensors)."""
    from doc_blocks import run_page

    run_page("distributed.md", tmp_path, ("process_group=dist.group.WORLD", "mp.spawn",
                                          "evtfuse.gemm(xd, wd, GELU_BIAS, bias=bd)",
                                          "mp.spawn(columns"), timeout=300)


def _dtensor_worker(rank: int, world: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    case = dict(reduction="mean", label_smoothing=0.1)
    h, w, _, y = _inputs(case)
    w = w[:36]  # even shards: distribute_tensor splits as torch.chunk does
    y = torch.where(y >= 36, 0, y)
    want = _run(h, w, None, y, case)
    wd = distribute_tensor(w, mesh, [Shard(0)]).requires_grad_(True)
    hd = distribute_tensor(h, mesh, [Replicate()]).requires_grad_(True)
    loss = evtfuse.linear_cross_entropy(hd, wd, y, reduction="mean", label_smoothing=0.1)
    (loss * 1.3).backward()
    torch.testing.assert_close(loss, want[0])
    torch.testing.assert_close(hd.grad.full_tensor(), want[2])
    torch.testing.assert_close(wd.grad.full_tensor(), want[3])
    with pytest.raises(EpilogueError, match="leave process_group out"):
        evtfuse.linear_cross_entropy(hd, wd, y, process_group=dist.group.WORLD)
    with pytest.raises(EpilogueError, match="hidden is a DTensor placed"):
        evtfuse.linear_cross_entropy(distribute_tensor(h, mesh, [Shard(0)]), wd, y)
    with pytest.raises(EpilogueError, match="hidden is a DTensor and weight is not"):
        evtfuse.linear_cross_entropy(hd, w, y)


@pytest.mark.slow
def test_dtensor_weight_sharded_over_the_vocabulary():
    """A DTensor LM-head weight placed Shard(0) (as ColwiseParallel places it) and replicated
    hidden states: the same loss and gradients (DTensors) as one process."""
    run_ranks(_dtensor_worker)


def _rows_worker(rank: int, world: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    for case in (dict(reduction="none", bias=True, softcap=3.0, lse=True),
                 dict(reduction="mean", label_smoothing=0.1), dict(reduction="sum")):
        h, w, b, y = _inputs(case)
        want = _run(h, w, b, y, case)
        # the rows (tokens) split, the LM head replicated: the operator through its rules
        hd = distribute_tensor(h, mesh, [Shard(0)]).requires_grad_(True)
        wd = distribute_tensor(w, mesh, [Replicate()]).requires_grad_(True)
        bd = None if b is None else distribute_tensor(b, mesh, [Replicate()]).requires_grad_(True)
        yd = distribute_tensor(y, mesh, [Shard(0)])
        opts = {k: v for k, v in case.items() if k in ("reduction", "label_smoothing",
                                                       "softcap")}
        loss, lse = evtfuse.linear_cross_entropy(hd, wd, yd, bias=bd, return_lse=True, **opts)
        split = case["reduction"] == "none"  # each rank its rows' losses; else replicated
        assert loss.placements == ((Shard(0),) if split else (Replicate(),))
        weights = distribute_tensor(torch.linspace(0.5, 1.5, T), mesh, [Shard(0)])
        total = (loss * weights).sum() if split else loss * 1.3
        if case.get("lse"):
            total = total + 0.1 * lse.sum()
        total.full_tensor().backward()
        close = dict(rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(loss.full_tensor(), want[0], **close)
        torch.testing.assert_close(lse.full_tensor(), want[1], **close)
        torch.testing.assert_close(hd.grad.full_tensor(), want[2], **close)
        torch.testing.assert_close(wd.grad.full_tensor(), want[3], **close)
        if split:  # each rank's part of the weight's gradient: summed when read
            assert wd.grad.placements == (Partial(),)
        if b is not None:
            torch.testing.assert_close(bd.grad.full_tensor(), want[4], **close)
    with pytest.raises(EpilogueError, match="target is not a DTensor"):
        evtfuse.linear_cross_entropy(distribute_tensor(h, mesh, [Shard(0)]),
                                     distribute_tensor(w, mesh, [Replicate()]), y)


@pytest.mark.slow
def test_dtensor_rows_split_beside_a_replicated_weight():
    """Hidden states and targets split over the rows (tokens), the LM head's weight
    replicated: evtfuse::linear_cross_entropy through its DTensor sharding rules (each rank
    its rows for reduction="none", gathered for "mean" and "sum"); the loss, the lse and
    the gradients as one process's."""
    run_ranks(_rows_worker)
