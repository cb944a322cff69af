"""GPU tier: split-K kernels (``runtime.split_k``) at small M: every candidate offered right
(its partial products run by whichever family the GEMM of the slices gets), the same bits
on every run, inside a CUDA graph, and chosen by the tuner only among verified kernels."""

from __future__ import annotations

import pytest
import torch

import evtfuse
from evtfuse import EpilogueArguments, GemmArguments
from evtfuse.runtime import discovery, split_k

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

EPIS = {
    "identity": "def e(accum):\n    D = accum\n    return D",
    "bias_gelu": "def e(accum, bias):\n    D = gelu_tanh(accum + bias)\n    return D",
    "row_lse": "def e(accum, bias):\n    z = accum + bias\n    D = z\n    lse = logsumexp(z)\n"
               "    return D, lse",
}


def _args(m, n, k, epi, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    A = torch.randn(m, k, device="cuda", generator=g).to(dtype)
    B = (torch.randn(k, n, device="cuda", generator=g) * k ** -0.5).to(dtype)
    bias = torch.randn(n, device="cuda", generator=g).to(dtype)
    D = torch.empty(m, n, device="cuda", dtype=dtype)
    named = {"D": D}
    if "bias" in EPIS[epi]:
        named["bias"] = bias
    if "lse" in EPIS[epi]:
        named["lse"] = torch.empty(m, 1, device="cuda", dtype=torch.float32)
    return GemmArguments(A, B, D, epilogue=EpilogueArguments(EPIS[epi], **named))


@pytest.mark.parametrize("epi", sorted(EPIS))
@pytest.mark.parametrize("m, n, k", [(16, 4096, 4096), (64, 4096, 14336), (200, 4096, 4096),
                                     (1, 4096, 14336)])
def test_every_split_k_candidate_is_right(m, n, k, epi):
    args = _args(m, n, k, epi)
    target = discovery._target(args, None)
    cands = split_k.candidates(args, target)
    assert cands, split_k.factors(args, target)
    assert evtfuse.get_kernels(args)[1:1 + len(cands)] == cands  # after the families' first
    for kern in cands:
        result = kern.verify(args)
        assert result, (kern.name, result.report())
        D = args.epilogue.values["D"]
        first = D.clone()
        kern.run(args)
        assert torch.equal(D, first), kern.name  # the same bits again


def test_split_k_in_a_cuda_graph_and_the_tuner():
    args = _args(64, 4096, 14336, "bias_gelu")
    kern = split_k.candidates(args, discovery._target(args, None))[0]
    D = args.epilogue.values["D"]
    kern.run(args)  # compiled outside the capture
    torch.cuda.synchronize()
    want = D.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kern.run(args)
    D.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(D, want)
    # evtfuse.gemm tunes among the split-K and the families' kernels: whichever it keeps
    # gives the reference's result
    A, B, bias = args.A, args.B, args.epilogue.values["bias"]
    out = evtfuse.gemm(A, B, EPIS["bias_gelu"], bias=bias, tune="fast")
    ref = torch.nn.functional.gelu(A.float() @ B.float() + bias.float(), approximate="tanh")
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)
