"""Never a wrong answer from a cached plan: memory checks on every path of a call (CPU tier).

``evtfuse.gemm`` serves repeated calls from caches (the same tensor objects again: the
last call's plan; new tensors of one structure: that structure's plan) and
``Kernel.run`` reuses the last plan of an arguments object. Those paths skip the
validation of a first call, so they must notice what it checked: outputs that overlap an
input or each other when tensors move (partly overlapping views of one buffer), and
tensors changed in place since (``A.t_()``, ``D.set_(...)``). Outputs whose own elements
share memory (``expand``, stride 0) are refused like torch refuses such in-place writes.
Whatever is refused, nothing is written to any output.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import evtfuse
from evtfuse import EpilogueArguments, EpilogueError, GemmArguments, get_kernels

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="CPU-interpreter tier (the gpu-marked tests run on a GPU)")

GEN = torch.Generator().manual_seed(4321)
M = N = K = 16
ADD_C = "def epi(accum, C): D = accum + C; return D"
TWO_OUT = "def epi(accum, C): F = accum * 2.0; D = F + C; return D, F"


def rand(*shape):
    return torch.randn(*shape, generator=GEN)


def seed_structure(src=ADD_C, calls=1, **kw):
    """Valid calls with fresh, separate tensors: the structure's plan is cached."""
    for _ in range(calls):
        evtfuse.gemm(rand(M, K), rand(K, N), src, C=rand(M, N), D=torch.empty(M, N), **kw)


# ------------------------------------------------------- new tensors, a cached structure

@pytest.mark.parametrize("victim", ["C", "A", "B"])
def test_structure_hit_refuses_an_output_partly_overlapping_an_input(victim):
    """After one valid call, a call of the same structure (shapes, strides, alignment)
    whose D partly overlaps C, A or B (two views of one buffer, 4 rows apart) is refused
    as the first call would be; the buffer is untouched."""
    seed_structure()
    buf = rand(M * N + 4 * N)
    tensors = {"A": rand(M, K), "B": rand(K, N), "C": rand(M, N)}
    tensors[victim] = buf[4 * N:].view(M, N)  # M == K == N: every operand is 16 x 16
    D = buf[:M * N].view(M, N)
    before = buf.clone()
    with pytest.raises(EpilogueError, match=f"output D overlaps input {victim}") as e:
        evtfuse.gemm(tensors["A"], tensors["B"], ADD_C, C=tensors["C"], D=D)
    assert e.value.variable == "D"
    assert torch.equal(buf, before)


def test_structure_hit_refuses_outputs_partly_sharing_memory():
    A, B, C = rand(M, K), rand(K, N), rand(M, N)
    evtfuse.gemm(A, B, TWO_OUT, C=C, D=torch.empty(M, N), F=torch.empty(M, N))
    buf = torch.full((M * N + 4 * N,), 7.0)
    with pytest.raises(EpilogueError, match="outputs D and F share memory"):
        evtfuse.gemm(A, B, TWO_OUT, C=C, D=buf[:M * N].view(M, N), F=buf[4 * N:].view(M, N))
    assert bool((buf == 7.0).all())


def test_structure_hit_still_serves_an_exact_in_place_output():
    """D written over C exactly (same address, shape and strides) stays allowed on the
    cached path, with new tensors each call."""
    seed_structure()
    for _ in range(3):
        A, B, C = rand(M, K), rand(K, N), rand(M, N)
        expected = A @ B + C
        out = evtfuse.gemm(A, B, ADD_C, C=C, D=C)
        assert out is C
        torch.testing.assert_close(C, expected, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------- grouped GEMMs, a cached structure

G_SIZES = (5, 0, 11)  # G = 3 groups over T = 16 rows
BIAS = "def epi(accum, bias): D = accum + bias; return D"


def _grouped_want(A, B, offs, bias):
    ends = [0, *offs.tolist()]
    return torch.cat([A[a:b] @ B[g] + bias[g] for g, (a, b) in enumerate(zip(ends, ends[1:]))])


def _offs(sizes):
    return torch.tensor(sizes, dtype=torch.int32).cumsum(0).to(torch.int32)


def test_grouped_calls_of_a_cached_structure_read_each_calls_tensors_and_offsets():
    """Grouped calls share ``gemm``'s cached paths (``offs`` part of what they key on and
    check): calls of one structure with new tensors and other group sizes each get their
    own result (a plan holding the first call's offs would give the first call's groups),
    the same objects again too; another G, offs' dtype, B's strides after them are a new
    structure: a correct result or the first call's error (int64 offs)."""
    for sizes in (G_SIZES, (16, 0, 0), (1, 7, 8), (1, 7, 8)):
        A, B, bias = rand(M, K), rand(3, K, N), rand(3, 1, N)
        offs = _offs(sizes)
        for _ in range(2):  # new tensors, then the same objects again
            D = evtfuse.grouped_gemm(A, B, offs, BIAS, bias=bias)
            torch.testing.assert_close(D, _grouped_want(A, B, offs, bias), rtol=1e-4,
                                       atol=1e-4)
    A, W, bias = rand(M, K), rand(4, N, K), rand(4, 1, N)  # G = 4, B = W.mT (K-contiguous)
    offs = _offs((2, 5, 0, 9))
    D = evtfuse.grouped_gemm(A, W.mT, offs, BIAS, bias=bias)
    torch.testing.assert_close(D, _grouped_want(A, W.mT, offs, bias), rtol=1e-4, atol=1e-4)
    with pytest.raises(EpilogueError, match="offs must be torch.int32"):
        evtfuse.grouped_gemm(A, W.mT, offs.long(), BIAS, bias=bias)


@pytest.mark.parametrize("cached", [False, True])
def test_grouped_output_overlapping_offs_is_refused(cached):
    """An output whose memory holds offs (read by the kernel while the output is written)
    is refused, on the first call of a structure and on a cached one alike (a cached
    path that left offs out of its overlap checks would launch); nothing is written."""
    if cached:  # the same structure: D 8 bytes into its buffer (16-byte alignment is keyed)
        evtfuse.grouped_gemm(rand(M, K), rand(3, K, N), _offs(G_SIZES), BIAS,
                             bias=rand(3, 1, N), D=torch.empty(M * N + 2)[2:].view(M, N))
    buf = torch.full((M * N + 2,), 7.0)
    offs = buf[:3].view(torch.int32)  # the first three floats' bits hold valid group
    offs.copy_(_offs(G_SIZES))  # ends, the third one also D's first element
    D = buf[2:].view(M, N)
    before = buf.clone()
    with pytest.raises(EpilogueError, match="output D overlaps input offs"):
        evtfuse.grouped_gemm(rand(M, K), rand(3, K, N), offs, BIAS, bias=rand(3, 1, N), D=D)
    assert torch.equal(buf, before)


# ------------------------------------------------------- the same objects, changed in place

def test_same_objects_path_sees_an_in_place_transpose():
    A, B, C, D = rand(M, K), rand(K, N), rand(M, N), torch.empty(M, N)
    for _ in range(3):  # the slow path, the structure hit, then the same-objects path
        evtfuse.gemm(A, B, ADD_C, C=C, D=D)
    A.t_()  # same object, same shape (square), other strides
    out = evtfuse.gemm(A, B, ADD_C, C=C, D=D)
    torch.testing.assert_close(out, A @ B + C, rtol=1e-4, atol=1e-4)


def test_same_objects_path_refuses_an_output_set_to_a_smaller_view():
    """``D.set_`` to a smaller view of a buffer: the plan of D's old shape would write
    past it (past the allocation for a smaller storage); the call is refused and the
    buffer untouched."""
    A, B, C, D = rand(M, K), rand(K, N), rand(M, N), torch.empty(M, N)
    for _ in range(3):
        evtfuse.gemm(A, B, ADD_C, C=C, D=D)
    big = torch.full((M * N,), 7.0)
    D.set_(big.untyped_storage(), 0, (M // 2, N), (N, 1))
    with pytest.raises(EpilogueError):
        evtfuse.gemm(A, B, ADD_C, C=C, D=D)
    assert bool((big == 7.0).all())


def test_same_objects_path_refuses_an_output_moved_onto_an_input():
    Cbuf = rand(M * N + 4 * N)
    A, B, C, D = rand(M, K), rand(K, N), Cbuf[:M * N].view(M, N), torch.empty(M, N)
    for _ in range(3):
        evtfuse.gemm(A, B, ADD_C, C=C, D=D)
    D.set_(Cbuf.untyped_storage(), 4 * N, (M, N), (N, 1))  # same shape, strides, alignment
    before = Cbuf.clone()
    with pytest.raises(EpilogueError, match="output D overlaps input C"):
        evtfuse.gemm(A, B, ADD_C, C=C, D=D)
    assert torch.equal(Cbuf, before)


def test_same_objects_path_sees_a_resized_storage():
    """The storage under D swapped for a new one in place (its address moves): the call
    writes to the new memory, never the old."""
    A, B, C, D = rand(M, K), rand(K, N), rand(M, N), torch.empty(M, N)
    for _ in range(3):
        evtfuse.gemm(A, B, ADD_C, C=C, D=D)
    old = D.data_ptr()
    D.untyped_storage().resize_(M * N * 4 + 64)  # a new allocation, same tensor metadata
    assert D.data_ptr() != old
    D.fill_(float("nan"))
    evtfuse.gemm(A, B, ADD_C, C=C, D=D)
    torch.testing.assert_close(D, A @ B + C, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_set_to_a_much_smaller_storage_does_not_crash_the_process(tmp_path):
    """The finding as reported: after three calls, ``D.set_(4-element storage)`` aborted
    the process ("double free or corruption"); it must raise an EpilogueError instead."""
    script = tmp_path / "set_smaller.py"
    script.write_text(textwrap.dedent(f"""
        import torch, evtfuse
        A, B, C, D = torch.randn(64, 64), torch.randn(64, 64), torch.randn(64, 64), torch.empty(64, 64)
        for _ in range(3):
            evtfuse.gemm(A, B, {ADD_C!r}, C=C, D=D)
        D.set_(torch.empty(4).untyped_storage())
        try:
            evtfuse.gemm(A, B, {ADD_C!r}, C=C, D=D)
        except evtfuse.EpilogueError as exc:
            print("refused:", exc)
        else:
            print("ran")
    """))
    src = os.path.dirname(os.path.dirname(evtfuse.__file__))
    env = dict(os.environ, PYTHONPATH=src, TRITON_INTERPRET="1")
    res = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "refused:" in res.stdout


# ------------------------------------------------------- Kernel.run with one arguments object

def _args(A, B, C, D):
    return GemmArguments(A, B, D, epilogue=EpilogueArguments(ADD_C, C=C, D=D))


def test_kernel_run_sees_an_in_place_transpose():
    A, B, C, D = rand(M, K), rand(K, N), rand(M, N), torch.empty(M, N)
    args = _args(A, B, C, D)
    k = get_kernels(args)[0]
    k.run(args)
    k.run(args)  # the kernel's last plan for this very object
    A.t_()
    k.run(args)
    torch.testing.assert_close(D, A @ B + C, rtol=1e-4, atol=1e-4)


def test_kernel_run_refuses_tensors_changed_into_a_bad_problem():
    A, B, C, D = rand(M, K + 8), rand(K + 8, N), rand(M, N), torch.full((M, N), 7.0)
    args = _args(A, B, C, D)
    k = get_kernels(args)[0]
    k.run(args)
    A.t_()  # (K + 8, M): its K no longer matches B's
    D.fill_(7.0)
    with pytest.raises(EpilogueError, match="differs from B's K"):
        k.run(args)
    assert bool((D == 7.0).all())


def test_kernel_run_refuses_an_output_set_to_a_smaller_view():
    A, B, C, D = rand(M, K), rand(K, N), rand(M, N), torch.empty(M, N)
    args = _args(A, B, C, D)
    k = get_kernels(args)[0]
    k.run(args)
    k.run(args)
    big = torch.full((M * N,), 7.0)
    D.set_(big.untyped_storage(), 0, (M // 2, N), (N, 1))
    with pytest.raises(EpilogueError):
        k.run(args)
    assert bool((big == 7.0).all())
    with pytest.raises(EpilogueError):  # still refused: the arguments stay unvalidated
        k.run(args)


def test_kernel_run_refuses_an_output_moved_onto_an_input():
    Cbuf = rand(M * N + 4 * N)
    A, B, C, D = rand(M, K), rand(K, N), Cbuf[:M * N].view(M, N), torch.empty(M, N)
    args = _args(A, B, C, D)
    k = get_kernels(args)[0]
    k.run(args)
    D.set_(Cbuf.untyped_storage(), 4 * N, (M, N), (N, 1))
    before = Cbuf.clone()
    with pytest.raises(EpilogueError, match="output D overlaps input C"):
        k.run(args)
    assert torch.equal(Cbuf, before)


def test_verify_poisons_nothing_when_the_arguments_became_invalid():
    Cbuf = rand(M * N + 4 * N)
    A, B, C, D = rand(M, K), rand(K, N), Cbuf[:M * N].view(M, N), torch.empty(M, N)
    args = _args(A, B, C, D)
    k = get_kernels(args)[0]
    assert k.verify(args)
    D.set_(Cbuf.untyped_storage(), 4 * N, (M, N), (N, 1))
    before = Cbuf.clone()
    with pytest.raises(EpilogueError, match="overlaps"):
        k.verify(args)
    assert torch.equal(Cbuf, before)


# ------------------------------------------------------- outputs whose elements share memory

def test_expanded_output_is_refused_by_name():
    base = torch.full((1, N), 7.0)
    D = base.expand(M, N)  # stride 0: every row is the same memory
    with pytest.raises(EpilogueError, match="more than one element") as e:
        evtfuse.gemm(rand(M, K), rand(K, N), ADD_C, C=rand(M, N), D=D)
    assert e.value.variable == "D" and "output D" in str(e.value)
    assert bool((base == 7.0).all())


def test_self_overlapping_second_output_leaves_the_first_untouched():
    D = torch.full((M, N), 7.0)
    fbase = torch.full((M, 1), 7.0)
    for F in (fbase.expand(M, N), torch.full((M * N,), 7.0).as_strided((M, N), (1, 1))):
        with pytest.raises(EpilogueError, match="output F") as e:
            evtfuse.gemm(rand(M, K), rand(K, N), TWO_OUT, C=rand(M, N), D=D, F=F)
        assert e.value.variable == "F"
        with pytest.raises(EpilogueError, match="output F"):
            GemmArguments(rand(M, K), rand(K, N), D,
                          epilogue=EpilogueArguments(TWO_OUT, C=rand(M, N), D=D, F=F))
        assert bool((D == 7.0).all()) and bool((F == 7.0).all())


def test_self_overlap_refused_where_torch_only_says_too_hard():
    # torch's own check cannot decide this layout (it answers TOO_HARD and lets the write
    # through); element (0, 1) and (1, 0) are the same memory
    D = torch.full((M * N,), 7.0).as_strided((M, N), (1, 1))
    assert torch._debug_has_internal_overlap(D) == 2
    with pytest.raises(EpilogueError, match="more than one element"):
        GemmArguments(rand(M, K), rand(K, N), D)


def test_batched_output_shared_by_every_batch_is_refused():
    L = 3
    D = torch.full((M, N), 7.0).expand(L, M, N)
    with pytest.raises(EpilogueError, match="output D"):
        evtfuse.gemm(rand(L, M, K), rand(L, K, N), ADD_C, C=rand(M, N), D=D)
    assert bool((D == 7.0).all())


def test_reduction_output_expanded_from_one_element_is_refused():
    src = "def epi(accum): D = accum; s = sum(D); return D, s"
    s = torch.zeros(1).expand(N)  # a per-column result whose N elements are one
    with pytest.raises(EpilogueError, match="output s"):
        GemmArguments(rand(M, K), rand(K, N), epilogue=EpilogueArguments(
            src, D=torch.empty(M, N), s=s))
    # small reduction outputs are fine: (M, 1), (1,) and a 0-d one
    for shape in ((M, 1), (1,), (N,)):
        GemmArguments(rand(M, K), rand(K, N), epilogue=EpilogueArguments(
            src, D=torch.empty(M, N), s=torch.empty(shape)))


def test_interleaved_output_without_shared_elements_runs():
    """Strides that interleave dimensions without two elements meeting (rows 3 apart,
    columns 4 apart over (4, 6): no offset repeats) are not self-overlapping."""
    m, n, k = 4, 6, 8
    mem = torch.full((64,), float("nan"))
    D = mem.as_strided((m, n), (3, 4))
    A, B, C = rand(m, k), rand(k, n), rand(m, n)
    out = evtfuse.gemm(A, B, ADD_C, C=C, D=D)
    torch.testing.assert_close(out, A @ B + C, rtol=1e-4, atol=1e-4)


def _brute_force_overlap(shape, strides) -> bool:
    offsets = [0]
    for size, stride in zip(shape, strides):
        offsets = [o + i * stride for o in offsets for i in range(size)]
    return len(offsets) != len(set(offsets))


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 14)), min_size=0, max_size=3))
def test_internal_overlap_matches_brute_force(dims):
    from evtfuse.memory import has_internal_overlap

    shape = [d[0] for d in dims]
    strides = [d[1] for d in dims]
    assert has_internal_overlap(shape, strides) == _brute_force_overlap(shape, strides)


def test_column_halves_of_one_tensor_are_separate_outputs():
    """p[:, :n] and p[:, n:] interleave in memory without meeting: two outputs may be
    them (an MLP block's gate and up halves), while halves that do meet are refused; the
    exact answer matches a brute-force one over small views."""
    from evtfuse.memory import overlap

    p = torch.empty(6, 8)
    assert not overlap(p[:, :4], p[:, 4:])
    assert overlap(p[:, :5], p[:, 3:]) and overlap(p[:, :4], p[:, 1:5])
    base = torch.arange(48.0)
    for off in range(0, 10):
        for width in (2, 3, 4):
            a = base.as_strided((4, width), (8, 1), 0)
            b = base.as_strided((4, width), (8, 1), off)
            brute = bool(set(a.flatten().tolist()) & set(b.flatten().tolist()))
            assert overlap(a, b) == brute, (off, width)
    A, B = torch.randn(5, 3), torch.randn(3, 8)
    out = torch.empty(5, 8)
    src = ("def e(accum):\n    gate, up = pairs(accum, layout=\"concatenated\")\n"
           "    D = gate\n    F = up\n    return D, F")
    evtfuse.gemm(A, B, src, D=out[:, :4], F=out[:, 4:])
    acc = A @ B
    torch.testing.assert_close(out[:, :4], acc[:, :4], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out[:, 4:], acc[:, 4:], rtol=1e-5, atol=1e-5)
    with pytest.raises(EpilogueError, match="share memory"):
        evtfuse.gemm(A, B, src, D=out[:, :4], F=out[:, 3:7])
