"""GPU tier: evtfuse inside PyTorch programs. torch.compile (static, dynamic, Inductor),
CUDA graph capture and replay (reductions included) and ``mode="reduce-overhead"``, two
streams running one epilogue at once, the tensors' device, ``evtfuse.nn.Linear``."""

from __future__ import annotations

import pytest
import torch

import evtfuse
from evtfuse.ops import relu

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

BF = torch.bfloat16


def epi(accum, C, alpha):
    F = alpha * accum + C
    D = relu(F)
    return D, F


ROW_SUM = "def rs(accum, C):\n    D = accum + C\n    R = sum(D)\n    return D, R"
REDUCTIONS = ("def red(accum, C):\n    D = accum * C\n    R = sum(D)\n    S = max(abs(accum))\n"
              "    Z = logsumexp(accum)\n    return D, R, S, Z")


def _data(M, N, K, dtype=BF, device="cuda", seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    A = torch.randn(M, K, device=device, generator=g).to(dtype)
    B = (torch.randn(K, N, device=device, generator=g) / K ** 0.5).to(dtype)
    C = torch.randn(M, N, device=device, generator=g).to(dtype)
    return A, B, C


def _rel(got, want):
    return ((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-30)).item()


def _want(A, B, C, alpha):
    F = alpha * (A.float() @ B.float()) + C.float()
    return torch.relu(F), F


def _f(A, B, C, alpha):
    D, F = evtfuse.gemm(A, B, epi, C=C, alpha=alpha)
    return D.float().sum(dim=1), F


@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_fullgraph_on_the_gpu_matches_eager(dynamic):
    torch._dynamo.reset()
    compiled = torch.compile(_f, fullgraph=True, dynamic=dynamic)
    for M in (512, 768, 1000):
        A, B, C = _data(M, 384, 256, seed=M)
        rows, F = compiled(A, B, C, 0.5)
        D, F0 = _want(A, B, C, 0.5)
        assert _rel(F, F0) < 1e-2 and _rel(rows, D.sum(dim=1)) < 1e-2


def test_cuda_graph_replays_reductions_with_new_inputs():
    M, N, K = 1024, 768, 512
    A, B, C = _data(M, N, K)
    D = torch.empty(M, N, device="cuda", dtype=BF)
    R = torch.empty(M, 1, device="cuda", dtype=torch.float32)
    S = torch.empty((), device="cuda", dtype=torch.float32)
    Z = torch.empty(M, 1, device="cuda", dtype=torch.float32)
    run = lambda: evtfuse.gemm(A, B, REDUCTIONS, C=C, D=D, R=R, S=S, Z=Z)  # noqa: E731
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (tune, compile, plan) off the capture
        for _ in range(2):
            run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    for seed in range(3):
        A2, B2, C2 = _data(M, N, K, seed=seed + 10)
        A.copy_(A2), B.copy_(B2), C.copy_(C2)
        for t in (D, R, S, Z):
            t.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        acc = A.float() @ B.float()
        want_D = acc * C.float()
        assert _rel(D, want_D) < 1e-2
        assert _rel(R, want_D.to(BF).float().sum(dim=1, keepdim=True)) < 1e-2
        assert _rel(S, acc.abs().max()) < 1e-2
        assert _rel(Z, torch.logsumexp(acc, dim=1, keepdim=True)) < 1e-3


def test_reduce_overhead_compile_replays_correctly(monkeypatch):
    torch._dynamo.reset()
    # a tensor left in the graph's pool is reported with the stack that allocated it
    import torch._inductor.config as inductor_config

    monkeypatch.setattr(inductor_config.triton, "cudagraph_trees_history_recording", True)

    def layer(x, W, C):
        D, R = evtfuse.gemm(x, W, ROW_SUM, C=C, R=torch.empty(x.shape[0], 1, device=x.device,
                                                                dtype=torch.float32))
        return D, R

    compiled = torch.compile(layer, mode="reduce-overhead", fullgraph=True)
    for step in range(4):
        x, W, C = _data(64, 1024, 512, seed=step)
        D, R = compiled(x, W, C)
        want = (x.float() @ W.float() + C.float())
        assert _rel(D, want) < 1e-2 and _rel(R, want.to(BF).float().sum(1, keepdim=True)) < 1e-2


def test_two_streams_running_one_epilogue_at_once_do_not_share_workspaces():
    M, N, K = 2048, 2048, 512
    sets = [_data(M, N, K, seed=s) for s in range(2)]
    outs = [(torch.empty(M, N, device="cuda", dtype=BF),
             torch.empty(M, 1, device="cuda", dtype=torch.float32)) for _ in range(2)]
    streams = [torch.cuda.Stream() for _ in range(2)]
    for (A, B, C), (D, R) in zip(sets, outs):  # warm up (tune) on the default stream
        evtfuse.gemm(A, B, ROW_SUM, C=C, D=D, R=R)
    torch.cuda.synchronize()
    for _ in range(20):
        for s, (A, B, C), (D, R) in zip(streams, sets, outs):
            with torch.cuda.stream(s):
                R.fill_(float("nan"))
                evtfuse.gemm(A, B, ROW_SUM, C=C, D=D, R=R)
        torch.cuda.synchronize()
        for (A, B, C), (D, R) in zip(sets, outs):
            want = (A.float() @ B.float() + C.float()).to(BF).float().sum(1, keepdim=True)
            assert _rel(R, want) < 1e-2


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_tensors_on_the_second_gpu_run_there():
    A, B, C = _data(512, 256, 128, device="cuda:1")
    torch.cuda.set_device(0)
    D, F = evtfuse.gemm(A, B, epi, C=C, alpha=1.0)
    assert D.device == torch.device("cuda:1")
    assert _rel(F, _want(A, B, C, 1.0)[1]) < 1e-2


def test_tensors_on_different_devices_get_a_clear_error():
    A, B, C = _data(256, 128, 64)
    with pytest.raises(evtfuse.EpilogueError, match="C is on cpu"):
        evtfuse.gemm(A, B, epi, C=C.cpu(), alpha=1.0)


def test_linear_module_matches_torch_linear_in_bf16():
    torch.manual_seed(0)
    ref = torch.nn.Linear(1024, 768, device="cuda", dtype=BF)
    lin = evtfuse.nn.Linear(1024, 768, device="cuda", dtype=BF)
    lin.load_state_dict(ref.state_dict())
    x = torch.randn(4, 100, 1024, device="cuda", dtype=BF)
    with torch.inference_mode():
        assert _rel(lin(x), ref(x)) < 1e-2
        compiled = torch.compile(lin, fullgraph=True)
        assert _rel(compiled(x), ref(x)) < 1e-2
