"""evtfuse's GEMM operators on DTensors (``runtime.sharding``, ``runtime.dtensor_call``) on
the CPU: two processes (gloo, Triton's interpreter). ``evtfuse.gemm`` and ``grouped_gemm``
called with DTensors, without and with gradients: the outputs placed as the epilogue allows
(columns, rows, batches, else replicated after DTensor's redistribution) and equal, with
every gradient, to one process's results; ``torch.ops.evtfuse.gemm`` itself dispatched by
DTensor through the registered rules (an output given where the epilogue cannot compute it
is an error naming it, and nothing is written); a plain tensor among DTensors is named."""

from __future__ import annotations

import pytest
import torch

from distributed_helpers import run_ranks
from evtfuse.errors import EpilogueError

TOL = dict(rtol=1e-5, atol=1e-5)
M, K, N = 7, 16, 11  # uneven shards over two ranks
RELU = "def e(accum, bias):\n    D = relu(accum + bias)\n    return D"
SOFTMAX = "def e(accum, bias):\n    D = softmax(accum + bias)\n    return D"
ROWS = ("def e(accum, scale, bias):\n    D = gelu(accum * scale + bias)\n"
        "    s = logsumexp(D)\n    return D, s")


def _inputs():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(M, K, generator=g), torch.randn(K, N, generator=g),
            torch.randn(N, generator=g), torch.randn(M, 1, generator=g))


def _forward_worker(rank: int, world: int) -> None:
    import evtfuse
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    R = [Replicate()]

    def dt(t, *placements):
        return distribute_tensor(t, mesh, list(placements))

    A, B, bias, scale = _inputs()
    with torch.no_grad():
        # columns: A replicated, B and the bias sharded on N alike; the output stays so
        D = evtfuse.gemm(dt(A, *R), dt(B, Shard(1)), RELU, bias=dt(bias, Shard(0)))
        assert D.placements == (Shard(1),)
        torch.testing.assert_close(D.full_tensor(), evtfuse.gemm(A, B, RELU, bias=bias), **TOL)
        # rows: A and a per-row operand sharded on M, with a reduction over each row
        D, s = evtfuse.gemm(dt(A, Shard(0)), dt(B, *R), ROWS, scale=dt(scale, Shard(0)),
                            bias=dt(bias, *R), s=dt(torch.empty(M, 1), Shard(0)))
        want_d, want_s = evtfuse.gemm(A, B, ROWS, scale=scale, bias=bias, s=torch.empty(M, 1))
        assert D.placements == (Shard(0),) and s.placements == (Shard(0),)
        torch.testing.assert_close(D.full_tensor(), want_d, **TOL)
        torch.testing.assert_close(s.full_tensor(), want_s, **TOL)
        # softmax mixes the columns: B gathered, computed replicated
        D = evtfuse.gemm(dt(A, *R), dt(B, Shard(1)), SOFTMAX, bias=dt(bias, Shard(0)))
        assert D.placements == (Replicate(),)
        torch.testing.assert_close(D.full_tensor(), evtfuse.gemm(A, B, SOFTMAX, bias=bias),
                                   **TOL)
        # K sharded (partial sums): redistributed first, never summed after the epilogue
        D = evtfuse.gemm(dt(A, Shard(1)), dt(B, Shard(0)), RELU, bias=dt(bias, *R))
        torch.testing.assert_close(D.full_tensor(), evtfuse.gemm(A, B, RELU, bias=bias), **TOL)
        # batches: A and B sharded on L
        g = torch.Generator().manual_seed(1)
        A3, B3 = torch.randn(4, M, K, generator=g), torch.randn(4, K, N, generator=g)
        D = evtfuse.gemm(dt(A3, Shard(0)), dt(B3, Shard(0)), RELU, bias=dt(bias, *R))
        assert D.placements == (Shard(0),)
        torch.testing.assert_close(D.full_tensor(), evtfuse.gemm(A3, B3, RELU, bias=bias), **TOL)
        # an output given where the epilogue cannot compute it: named, nothing written
        given = dt(torch.full((M, N), 7.0), Shard(1))
        with pytest.raises(EpilogueError, match=r"gemm: output D is a DTensor placed "
                           r"\(Shard\(dim=1\),\), but the epilogue e: line 2: softmax"):
            evtfuse.gemm(dt(A, *R), dt(B, Shard(1)), SOFTMAX, bias=dt(bias, Shard(0)), D=given)
        assert bool((given.to_local() == 7.0).all())
        # a plain tensor among DTensors
        with pytest.raises(EpilogueError, match="some tensors of the call are DTensors and "
                                                "bias is a plain tensor") as info:
            evtfuse.gemm(dt(A, *R), dt(B, Shard(1)), RELU, bias=bias)
        assert info.value.variable == "bias"


@pytest.mark.slow
def test_gemm_on_dtensors_places_outputs_as_the_epilogue_allows():
    run_ranks(_forward_worker)


ROW_STATS = ("def e(accum, bias):\n    D = relu(accum + bias)\n    s = sum(D)\n"
             "    m = max(accum)\n    return D, s, m")


def _partial_worker(rank: int, world: int) -> None:
    import evtfuse
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    A, B, bias, _ = _inputs()

    def rows(*names):  # one process's (M, 1) buffers of the row reductions
        return {n: torch.empty(M, 1) for n in names}

    def placed(placements):  # the same buffers as DTensors placed as the call computes them
        return {n: DTensor.from_local(torch.empty(M, 1), mesh, [p], run_check=False)
                for n, p in placements.items()}

    want = evtfuse.gemm(A, B, ROW_STATS, bias=bias, **rows("s", "m"))
    # without gradients: the columns split, each rank's row sum and max its shard's part
    with torch.no_grad():
        got = evtfuse.gemm(distribute_tensor(A, mesh, [Replicate()]),
                           distribute_tensor(B, mesh, [Shard(1)]), ROW_STATS,
                           bias=distribute_tensor(bias, mesh, [Shard(0)]),
                           **placed({"s": Partial("sum"), "m": Partial("max")}))
    assert [x.placements for x in got] == [(Shard(1),), (Partial("sum"),), (Partial("max"),)]
    for x, w in zip(got, want):  # full_tensor: the one all-reduce of each partial
        torch.testing.assert_close(x.full_tensor(), w, **TOL)
    # with gradients: a partial sum keeps the split (each rank's share of the gradient is
    # the whole row's), a partial max does not (computed replicated)
    src = "def e(accum, bias):\n    D = relu(accum + bias)\n    s = sum(D)\n    return D, s"
    for src, outs in ((src, {"s": Partial("sum")}),
                      (ROW_STATS, {"s": Replicate(), "m": Replicate()})):
        ref = [t.clone().requires_grad_(True) for t in (A, B, bias)]
        want = evtfuse.gemm(ref[0], ref[1], src, bias=ref[2], **rows(*outs))
        g = torch.Generator().manual_seed(9)
        ups = [torch.randn(w.shape, generator=g) for w in want]
        torch.autograd.backward(want, ups)
        mine = [distribute_tensor(t, mesh, [p]).requires_grad_(True)
                for t, p in zip((A, B, bias), (Replicate(), Shard(1), Shard(0)))]
        got = evtfuse.gemm(mine[0], mine[1], src, bias=mine[2], **placed(outs))
        split = outs["s"] != Replicate()
        assert got[0].placements == ((Shard(1),) if split else (Replicate(),)), src
        assert [x.placements for x in got[1:]] == [(p,) for p in outs.values()], src
        for x, w in zip(got, want):
            torch.testing.assert_close(x.full_tensor(), w.detach(), **TOL)
        torch.autograd.backward([x.full_tensor() for x in got], ups)
        for name, t, r in zip(("A", "B", "bias"), mine, ref):
            torch.testing.assert_close(t.grad.full_tensor(), r.grad, **TOL,
                                       msg=lambda m: f"{src!r} d{name}: {m}")


LSE = ("def e(accum, bias):\n    D = accum + bias\n    s = logsumexp(D)\n"
       "    return D, s")


def _lse_worker(rank: int, world: int) -> None:
    import evtfuse
    from evtfuse.runtime import torch_op
    from evtfuse.runtime.calls import epilogue_of
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    A, B, bias, _ = _inputs()

    def call(b, *args, **kw):
        return evtfuse.gemm(distribute_tensor(A, mesh, [Replicate()]),
                            distribute_tensor(B, mesh, [Shard(1)]), LSE,
                            bias=distribute_tensor(b, mesh, [Shard(0)]), *args, **kw)

    # without gradients: the columns split, each rank's logsumexp of its shard combined
    # (max, then the sum of exponentials: two all-reduces), a row of -inf too
    for b in (bias, torch.full((N,), float("-inf"))):
        want = evtfuse.gemm(A, B, LSE, bias=b, s=torch.empty(M, 1))
        with torch.no_grad():
            got = call(b, s=DTensor.from_local(torch.empty(M, 1), mesh, [Replicate()],
                                               run_check=False))
        assert [x.placements for x in got] == [(Shard(1),), (Replicate(),)]
        for x, w in zip(got, want):
            torch.testing.assert_close(x.full_tensor(), w, **TOL)
    # with gradients: through the combine, every gradient as one process's
    ref = [t.clone().requires_grad_(True) for t in (A, B, bias)]
    want = evtfuse.gemm(ref[0], ref[1], LSE, bias=ref[2], s=torch.empty(M, 1))
    g = torch.Generator().manual_seed(12)
    ups = [torch.randn(w.shape, generator=g) for w in want]
    torch.autograd.backward(want, ups)
    mine = [distribute_tensor(t, mesh, [p]).requires_grad_(True)
            for t, p in zip((A, B, bias), (Replicate(), Shard(1), Shard(0)))]
    got = evtfuse.gemm(mine[0], mine[1], LSE, bias=mine[2],
                       s=DTensor.from_local(torch.empty(M, 1), mesh, [Replicate()],
                                            run_check=False))
    assert [x.placements for x in got] == [(Shard(1),), (Replicate(),)]
    torch.autograd.backward([x.full_tensor() for x in got], ups)
    for name, t, r in zip(("A", "B", "bias"), mine, ref):
        torch.testing.assert_close(t.grad.full_tensor(), r.grad, **TOL,
                                   msg=lambda m: f"d{name}: {m}")
    # the operator itself cannot combine them: DTensor gathers B, computed replicated
    D = DTensor.from_local(torch.zeros(M, N), mesh, [Replicate()], run_check=False)
    s = DTensor.from_local(torch.zeros(M, 1), mesh, [Replicate()], run_check=False)
    layout = torch_op.layout_text(("bias",), (), (), ("D", "s"), 0, epilogue_of(LSE).where,
                                  False, ("none", False, True, None))
    torch_op.call(distribute_tensor(A, mesh, [Replicate()]),
                  distribute_tensor(B, mesh, [Shard(1)]), LSE, layout,
                  [distribute_tensor(bias, mesh, [Shard(0)])], [], [D, s])
    want = evtfuse.gemm(A, B, LSE, bias=bias, s=torch.empty(M, 1))
    torch.testing.assert_close(D.full_tensor(), want[0], **TOL)
    torch.testing.assert_close(s.full_tensor(), want[1], **TOL)


@pytest.mark.slow
def test_row_logsumexp_over_sharded_columns_is_combined():
    """A row's logsumexp over column shards (B and the bias sharded on N): each rank's
    result for its shard, combined by evtfuse.gemm (the ranks' max, then the sum of
    exponentials), equals one process's, rows of -inf too, with every gradient; the
    operator on DTensors, which cannot combine it, computes it replicated."""
    run_ranks(_lse_worker)


@pytest.mark.slow
def test_row_reductions_over_sharded_columns_stay_partial():
    """A row's sum, max and min over column shards (A replicated, B and the bias sharded on
    N): each rank stores its shard's part, a Partial(op) output one all-reduce combines
    (``full_tensor``), equal to one process's; with gradients a partial sum keeps the
    split and every gradient matches, a max is computed replicated."""
    run_ranks(_partial_worker)


def _grad_worker(rank: int, world: int) -> None:
    import evtfuse
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    A, B, bias, scale = _inputs()
    g = torch.Generator().manual_seed(5)
    for src, placed, out_placement, given in (
            (RELU, {"A": Replicate(), "B": Shard(1), "bias": Shard(0)}, Shard(1), {}),
            (ROWS, {"A": Shard(0), "B": Replicate(), "bias": Replicate(), "scale": Shard(0)},
             Shard(0), {"s": torch.empty(M, 1)}),
            (SOFTMAX, {"A": Replicate(), "B": Shard(1), "bias": Shard(0)}, Replicate(), {})):
        full = {"A": A, "B": B, "bias": bias, "scale": scale}
        ref = {k: full[k].clone().requires_grad_(True) for k in placed}
        ops = {k: v for k, v in ref.items() if k not in ("A", "B")}
        want = evtfuse.gemm(ref["A"], ref["B"], src, **ops,
                            **{k: v.clone() for k, v in given.items()})
        want = want if isinstance(want, tuple) else (want,)
        ups = [torch.randn(w.shape, generator=g) for w in want]
        torch.autograd.backward(want, ups)
        mine = {k: distribute_tensor(full[k], mesh, [p]).requires_grad_(True)
                for k, p in placed.items()}
        outs = {k: distribute_tensor(v, mesh, [out_placement]) for k, v in given.items()}
        got = evtfuse.gemm(mine["A"], mine["B"], src, **outs,
                           **{k: v for k, v in mine.items() if k not in ("A", "B")})
        assert all(got[-1] is outs[k] for k in outs)  # an output given is written, returned
        got = got if isinstance(got, tuple) else (got,)
        assert got[0].placements == (out_placement,), (src, got[0].placements)
        for x, w in zip(got, want):
            torch.testing.assert_close(x.full_tensor(), w.detach(), **TOL)
        torch.autograd.backward(got, [distribute_tensor(u, mesh, [Replicate()]).redistribute(
            mesh, x.placements) for u, x in zip(ups, got)])
        for k, t in mine.items():
            # a sharded input's gradient is its own shard's; a replicated one's, each
            # rank's part of the sum (Partial) where the call was split, whole where not
            expect = placed[k] if placed[k].is_shard() or out_placement.is_replicate() \
                else Partial()
            assert t.grad.placements == (expect,), (src, k, t.grad.placements)
            torch.testing.assert_close(t.grad.full_tensor(), ref[k].grad, **TOL,
                                       msg=lambda m: f"{src!r} d{k}: {m}")


@pytest.mark.slow
def test_gemm_on_dtensors_backward_matches_one_process():
    run_ranks(_grad_worker)


LINEAR = ("def e(accum, scale, C, alpha):\n    D = alpha * accum * scale + C\n"
          "    s = sum(D)\n    return D, s")


def _inner_worker(rank: int, world: int) -> None:
    import evtfuse
    from evtfuse.runtime import sharding, torch_op
    from evtfuse.runtime.calls import epilogue_of
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    A, B, _, scale = _inputs()
    C = torch.randn(M, N, generator=torch.Generator().manual_seed(4))
    R = Replicate()

    def partial_rows():
        return DTensor.from_local(torch.empty(M, 1), mesh, [Partial()], run_check=False)

    want = evtfuse.gemm(A, B, LINEAR, scale=scale, C=C, alpha=0.5, s=torch.empty(M, 1))
    # K sharded (A's columns, B's rows) and an epilogue linear in accum and C: each rank
    # computes its part (C's part DTensor's redistribution gives it), Partial outputs
    with torch.no_grad():
        got = evtfuse.gemm(distribute_tensor(A, mesh, [Shard(1)]),
                           distribute_tensor(B, mesh, [Shard(0)]), LINEAR,
                           scale=distribute_tensor(scale, mesh, [R]),
                           C=distribute_tensor(C, mesh, [R]), alpha=0.5, s=partial_rows())
    assert [x.placements for x in got] == [(Partial(),), (Partial(),)]
    assert not torch.equal(got[0].to_local(), want[0])  # each rank's is a part
    for x, w in zip(got, want):  # full_tensor: the all-reduce of the parts
        torch.testing.assert_close(x.full_tensor(), w, **TOL)
    # with gradients: A's and B's shards', scale's and C's (each rank's part of their sums:
    # C's whole on the rank that held it, the others' zero) gradients match one process's
    ref = {k: t.clone().requires_grad_(True) for k, t in
           (("A", A), ("B", B), ("scale", scale), ("C", C))}
    want = evtfuse.gemm(ref["A"], ref["B"], LINEAR, scale=ref["scale"], C=ref["C"], alpha=0.5,
                        s=torch.empty(M, 1))
    g = torch.Generator().manual_seed(8)
    ups = [torch.randn(w.shape, generator=g) for w in want]
    torch.autograd.backward(want, ups)
    placed = {"A": Shard(1), "B": Shard(0), "scale": R, "C": R}
    mine = {k: distribute_tensor(t.detach(), mesh, [placed[k]]).requires_grad_(True)
            for k, t in ref.items()}
    got = evtfuse.gemm(mine["A"], mine["B"], LINEAR, scale=mine["scale"], C=mine["C"],
                       alpha=0.5, s=partial_rows())
    assert [x.placements for x in got] == [(Partial(),), (Partial(),)]
    for x, w in zip(got, want):
        torch.testing.assert_close(x.full_tensor(), w.detach(), **TOL)
    torch.autograd.backward([x.full_tensor() for x in got], ups)
    for k, t in mine.items():
        expect = {"scale": Partial(), "C": Partial()}.get(k, placed[k])
        assert t.grad.placements == (expect,), (k, t.grad.placements)
        torch.testing.assert_close(t.grad.full_tensor(), ref[k].grad, **TOL,
                                   msg=lambda m: f"d{k}: {m}")
    # the operator dispatched by DTensor: an output given Partial keeps the split
    src = "def e(accum, C):\n    D = accum + C\n    return D"
    D = DTensor.from_local(torch.zeros(M, N), mesh, [Partial()], run_check=False)
    epi = epilogue_of(src)
    layout = torch_op.layout_text(("C",), (), (), ("D",), 0, epi.where, False,
                                  ("none", False, True, None))
    sharding.register()
    torch_op.call(distribute_tensor(A, mesh, [Shard(1)]), distribute_tensor(B, mesh, [Shard(0)]),
                  src, layout, [distribute_tensor(C, mesh, [R])], [], [D])
    assert D.placements == (Partial(),)
    torch.testing.assert_close(D.full_tensor(), A @ B + C, **TOL)
    # a grouped GEMM over M, each expert's K split, a per-expert bias added
    G, T = 3, 9
    g = torch.Generator().manual_seed(6)
    x, w, gb = (torch.randn(T, K, generator=g), torch.randn(G, K, N, generator=g),
                torch.randn(G, 1, N, generator=g))
    offs = torch.tensor([2, 6, 9], dtype=torch.int32)
    grouped = "def e(accum, bias):\n    D = 2.0 * accum - bias\n    return D"
    with torch.no_grad():
        got = evtfuse.grouped_gemm(distribute_tensor(x, mesh, [Shard(1)]),
                                   distribute_tensor(w, mesh, [Shard(1)]), offs, grouped,
                                   bias=distribute_tensor(gb, mesh, [R]))
    assert got.placements == (Partial(),)
    torch.testing.assert_close(got.full_tensor(),
                               evtfuse.grouped_gemm(x, w, offs, grouped, bias=gb), **TOL)


@pytest.mark.slow
def test_k_sharded_calls_of_linear_epilogues_stay_partial():
    """A K-sharded call (A's columns, B's rows: partial sums) of an epilogue linear in the
    accumulator and in the operand added to it stays split: each rank's outputs are its
    parts (Partial), whose sum equals one process's result, with every gradient; through
    ``evtfuse.gemm``, the operator's registered rule and ``grouped_gemm`` over M."""
    run_ranks(_inner_worker)


def _op_worker(rank: int, world: int) -> None:
    import evtfuse
    from evtfuse.runtime import sharding, torch_op
    from evtfuse.runtime.calls import epilogue_of
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    sharding.register()  # a program calling the operator before any evtfuse call
    mesh = init_device_mesh("cpu", (world,))
    A, B, bias, _ = _inputs()
    dA = distribute_tensor(A, mesh, [Replicate()])
    dB = distribute_tensor(B, mesh, [Shard(1)])
    db = distribute_tensor(bias, mesh, [Shard(0)])

    def op(src, D):
        epi = epilogue_of(src)
        layout = torch_op.layout_text(("bias",), (), (), ("D",), 0, epi.where, False,
                                      ("none", False, True, None))
        torch_op.call(dA, dB, src, layout, [db], [], [D])

    # an output given replicated stays where it is: B gathered (a strategy that moved D
    # would write a copy and leave D as it was)
    D = distribute_tensor(torch.zeros(M, N), mesh, [Replicate()])
    op(RELU, D)
    assert D.placements == (Replicate(),)
    torch.testing.assert_close(D.full_tensor(), evtfuse.gemm(A, B, RELU, bias=bias), **TOL)
    D = distribute_tensor(torch.zeros(M, N), mesh, [Shard(1)])
    op(RELU, D)
    torch.testing.assert_close(D.full_tensor(), evtfuse.gemm(A, B, RELU, bias=bias), **TOL)
    # the same placements, another epilogue: its own rule (the sharding cache keys on the
    # epilogue), which cannot compute D sharded over N
    D.to_local().fill_(7.0)
    with pytest.raises(RuntimeError, match=r"evtfuse::gemm: output D is a DTensor placed "
                                           r"\(Shard\(dim=1\),\), but the epilogue e"):
        op(SOFTMAX, D)
    assert bool((D.to_local() == 7.0).all())

    # a 2-D mesh: every combination of splits over its dimensions keeps D where it is.
    # Here the cheapest combination for the inputs (B left as it is: columns on dimension
    # 0) would move D, whose placement needs replicated on dimension 0
    mesh2 = init_device_mesh("cpu", (world, 1), mesh_dim_names=("a", "b"))
    dA = distribute_tensor(A, mesh2, [Replicate(), Replicate()])
    dB = distribute_tensor(B, mesh2, [Shard(1), Replicate()])
    db = distribute_tensor(bias, mesh2, [Shard(0), Replicate()])
    D = distribute_tensor(torch.zeros(M, N), mesh2, [Replicate(), Shard(1)])
    op(RELU, D)
    assert D.placements == (Replicate(), Shard(1))
    torch.testing.assert_close(D.full_tensor(), evtfuse.gemm(A, B, RELU, bias=bias), **TOL)

    # grouped GEMM over M, each expert's columns sharded (B (G, K, N) on N, a per-group
    # bias alike); offs a plain tensor (taken as replicated)
    G, T = 3, 9
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(T, K, generator=g), torch.randn(G, K, N, generator=g)
    gb = torch.randn(G, 1, N, generator=g)
    offs = torch.tensor([2, 6, 9], dtype=torch.int32)
    grouped = "def e(accum, bias):\n    D = silu(accum + bias)\n    return D"
    want = evtfuse.grouped_gemm(x, w, offs, grouped, bias=gb)
    with torch.no_grad():
        got = evtfuse.grouped_gemm(distribute_tensor(x, mesh, [Replicate()]),
                                   distribute_tensor(w, mesh, [Shard(2)]), offs, grouped,
                                   bias=distribute_tensor(gb, mesh, [Shard(2)]))
    assert got.placements == (Shard(1),)
    torch.testing.assert_close(got.full_tensor(), want, **TOL)
    xs, ws, bs = (t.clone().requires_grad_(True) for t in (x, w, gb))
    evtfuse.grouped_gemm(xs, ws, offs, grouped, bias=bs).sum().backward()
    dx = distribute_tensor(x, mesh, [Replicate()]).requires_grad_(True)
    dw = distribute_tensor(w, mesh, [Shard(2)]).requires_grad_(True)
    dgb = distribute_tensor(gb, mesh, [Shard(2)]).requires_grad_(True)
    out = evtfuse.grouped_gemm(dx, dw, offs, grouped, bias=dgb)
    out.sum().backward()
    torch.testing.assert_close(out.full_tensor(), want, **TOL)
    for name, mine, ref in (("x", dx, xs), ("w", dw, ws), ("bias", dgb, bs)):
        torch.testing.assert_close(mine.grad.full_tensor(), ref.grad, **TOL,
                                   msg=lambda m: f"d{name}: {m}")


@pytest.mark.slow
def test_operators_dispatched_by_dtensor_through_the_rules():
    run_ranks(_op_worker)
