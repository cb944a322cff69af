"""GPU tier: the cached paths of ``evtfuse.gemm`` and ``Kernel.run`` re-check memory on a GPU.

On a GPU those paths launch through the compiled launcher directly and reuse TMA
descriptors by tensor address (``backends/triton/launch.py``), so a stale plan there
would write through descriptors of the old shape. The CPU tier (``test_call_safety_cpu``)
covers the same findings under the interpreter.
"""

from __future__ import annotations

import pytest
import torch

import evtfuse
from evtfuse import EpilogueArguments, EpilogueError, GemmArguments, get_kernels

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DEV = "cuda"
S = 256  # M == N == K: every operand is S x S, so an in-place transpose keeps its shape
ADD_C = "def epi(accum, C): D = accum + C; return D"


def _rand(*shape):
    return torch.randn(*shape, device=DEV).to(torch.float16)


def _close(out, A, B, C):
    ref = A.float() @ B.float() + C.float()
    torch.testing.assert_close(out.float(), ref, rtol=1e-2, atol=5e-2)


@pytest.mark.parametrize("victim", ["C", "A", "B"])
def test_structure_hit_refuses_partial_overlap_on_gpu(victim):
    evtfuse.gemm(_rand(S, S), _rand(S, S), ADD_C, C=_rand(S, S), D=_rand(S, S), tune="none")
    buf = _rand(S * S + 8 * S)
    t = {"A": _rand(S, S), "B": _rand(S, S), "C": _rand(S, S)}
    t[victim] = buf[8 * S:].view(S, S)
    before = buf.clone()
    with pytest.raises(EpilogueError, match=f"output D overlaps input {victim}"):
        evtfuse.gemm(t["A"], t["B"], ADD_C, C=t["C"], D=buf[:S * S].view(S, S), tune="none")
    torch.cuda.synchronize()
    assert torch.equal(buf, before)


def test_same_objects_path_after_in_place_changes_on_gpu():
    A, B, C, D = _rand(S, S), _rand(S, S), _rand(S, S), torch.empty(S, S, device=DEV,
                                                                  dtype=torch.float16)
    for _ in range(3):
        evtfuse.gemm(A, B, ADD_C, C=C, D=D, tune="none")
    A.t_()
    _close(evtfuse.gemm(A, B, ADD_C, C=C, D=D, tune="none"), A, B, C)
    B.t_()
    _close(evtfuse.gemm(A, B, ADD_C, C=C, D=D, tune="none"), A, B, C)
    big = torch.full((S * S,), 7.0, device=DEV, dtype=torch.float16)
    D.set_(big.untyped_storage(), 0, (S // 2, S), (S, 1))
    with pytest.raises(EpilogueError):
        evtfuse.gemm(A, B, ADD_C, C=C, D=D, tune="none")
    D.set_(torch.empty(4, device=DEV, dtype=torch.float16).untyped_storage())
    with pytest.raises(EpilogueError):
        evtfuse.gemm(A, B, ADD_C, C=C, D=D, tune="none")
    torch.cuda.synchronize()
    assert bool((big == 7.0).all())


@pytest.mark.parametrize("family", ["gluon", "hopper", "portable"])
def test_kernel_run_after_in_place_transpose_on_gpu(family):
    A, B, C = _rand(S, S), _rand(S, S), _rand(S, S)
    D = torch.empty(S, S, device=DEV, dtype=torch.float16)
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(ADD_C, C=C, D=D))
    # a config that takes A in both layouts (the gluon cooperative ones refuse column-major A)
    later = GemmArguments(A.t(), B, D, epilogue=EpilogueArguments(ADD_C, C=C, D=D))
    ks = [k for k in get_kernels(args) if k.family.name == family and k.supports(later)]
    assert ks, evtfuse.explain(args)  # every family runs fp16 S^3 on a Hopper GPU
    k = ks[0]
    k.run(args)
    k.run(args)
    A.t_()  # column-major now: another structure, another plan (and descriptors)
    k.run(args)
    torch.cuda.synchronize()
    _close(D, A, B, C)
    result = k.verify(args)
    assert result, result.report()


def test_self_overlapping_output_refused_on_gpu():
    base = torch.full((1, S), 7.0, device=DEV, dtype=torch.float16)
    with pytest.raises(EpilogueError, match="output D: more than one element"):
        evtfuse.gemm(_rand(S, S), _rand(S, S), ADD_C, C=_rand(S, S), D=base.expand(S, S),
                     tune="none")
    torch.cuda.synchronize()
    assert bool((base == 7.0).all())
