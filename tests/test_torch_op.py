"""evtfuse inside PyTorch programs (CPU, Triton's interpreter): the ``torch.ops.evtfuse.gemm``
operator, torch.compile with no graph break (static and dynamic shapes), torch.export,
meta and fake tensors, and which operator a call that needs a gradient goes through."""

from __future__ import annotations

import pytest
import torch

import evtfuse
from evtfuse.ops import relu

M, N, K = 32, 16, 24


def _data(m=M, dtype=torch.float32):
    g = torch.Generator().manual_seed(m)
    A = torch.randn(m, K, generator=g, dtype=dtype)
    B = torch.randn(K, N, generator=g, dtype=dtype) / K ** 0.5
    C = torch.randn(m, N, generator=g, dtype=dtype)
    return A, B, C


def epi(accum, C, alpha):
    F = alpha * accum + C
    D = relu(F)
    return D, F


def _eager(A, B, C, alpha):
    F = alpha * (A.double() @ B.double()) + C.double()
    return torch.relu(F), F


def _close(got, want):
    for g, w in zip(got, want):
        assert g.shape == w.shape and torch.allclose(g.double(), w, atol=1e-4, rtol=1e-4)


def test_the_operator_is_registered_with_its_schema():
    schema = str(torch.ops.evtfuse.gemm.default._schema)
    assert schema.startswith("evtfuse::gemm(Tensor A, Tensor B, str epilogue, str layout")
    assert "Tensor(a!)[] outs" in schema and schema.endswith("-> ()")


def test_the_operator_called_directly_writes_its_outputs():
    from evtfuse.runtime.torch_op import layout_text, wire

    A, B, C = _data()
    D = torch.full((M, N), float("nan"))
    layout = layout_text(("C",), (), ("alpha",), ("D",), 0, "the epilogue string", False,
                         ("fast", False, True, None))
    src = "def e(accum, C, alpha):\n    D = alpha * accum + C\n    return D"
    torch.ops.evtfuse.gemm(A, B, wire(src), layout, [C], [2.0], [D])
    _close([D], [2.0 * (A.double() @ B.double()) + C.double()])


def test_the_source_crosses_the_operator_on_one_line():
    """Inductor copies an extern call's string arguments into comments of its generated
    module: a line break there broke the module (a compiled backward, torch 2.11 on a GPU).
    Every string argument of the traced graph, forward and backward, is one line, and the
    wire form gives back the exact source (tabs, a backslash continuation, non-ASCII)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from evtfuse.runtime.torch_op import unwire, wire

    odd = "def e(accum, C):\n\tD = accum + \\\n        C  # é, \\n\n\treturn D\r\n"
    assert "\n" not in wire(odd) and unwire(wire(odd)) == odd
    A, B, C = _data()
    A.requires_grad_(True)

    def step(A, B, C):
        D = evtfuse.gemm(A, B, "def e(accum, C):\n    D = tanh(accum) + C\n    return D", C=C)
        (g,) = torch.autograd.grad(D.sum(), A)
        return D, g

    graph = make_fx(step)(A, B, C).graph
    strings = [a for n in graph.nodes for a in n.args if isinstance(a, str)]
    assert len(strings) >= 2 and not any("\n" in s for s in strings)  # forward and backward


def _f(A, B, C, alpha):
    D, F = evtfuse.gemm(A, B, epi, C=C, alpha=alpha, F_dtype=torch.float32)
    return D * 2.0, F


def test_compile_fullgraph_matches_eager_without_graph_breaks():
    A, B, C = _data()
    explained = torch._dynamo.explain(_f)(A, B, C, 1.5)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    compiled = torch.compile(_f, fullgraph=True, backend="aot_eager")
    D2, F = compiled(A, B, C, 1.5)
    D, F0 = _eager(A, B, C, 1.5)
    _close([D2, F], [2.0 * D, F0])


@pytest.mark.slow
def test_compile_with_inductor_gives_eager_results():
    torch._dynamo.reset()
    A, B, C = _data()
    D2, F = torch.compile(_f, fullgraph=True)(A, B, C, 0.5)
    D, F0 = _eager(A, B, C, 0.5)
    _close([D2, F], [2.0 * D, F0])


def test_dynamic_shapes_compile_once_for_every_m():
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(_f, fullgraph=True, dynamic=True, backend=counter)
    for m in (32, 48, 80):
        A, B, C = _data(m)
        D2, F = compiled(A, B, C, 1.0)
        D, F0 = _eager(A, B, C, 1.0)
        _close([D2, F], [2.0 * D, F0])
    assert counter.frame_count == 1


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.W = torch.nn.Parameter(torch.randn(K, N) / K ** 0.5, requires_grad=False)
        self.C = torch.nn.Buffer(torch.randn(1, N).expand(M, N).contiguous())

    def forward(self, x):
        D, F = evtfuse.gemm(x, self.W, epi, C=self.C, alpha=1.0)
        return D + 1.0


def test_export_runs_and_matches_eager():
    block = _Block()
    x = _data()[0]
    exported = torch.export.export(block, (x,))
    assert any("evtfuse.gemm" in str(n.target) for n in exported.graph.nodes)
    got = exported.module()(x)
    want = _eager(x, block.W.detach(), block.C, 1.0)[0] + 1.0
    _close([got], [want])


def test_meta_tensors_get_outputs_of_the_right_shapes_without_running():
    A, B, C = (torch.empty(s, device="meta") for s in ((M, K), (K, N), (M, N)))
    D, F = evtfuse.gemm(A, B, epi, C=C, alpha=1.0, F_dtype=torch.float16)
    assert D.device.type == "meta" and D.shape == (M, N) and D.dtype == torch.float32
    assert F.shape == (M, N) and F.dtype == torch.float16


def test_fake_tensors_trace_without_a_misleading_overlap_error():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        A, B, C = torch.randn(M, K), torch.randn(K, N), torch.randn(M, N)
        D, F = evtfuse.gemm(A, B, epi, C=C, alpha=1.0)
    assert D.shape == (M, N) and F.shape == (M, N)


def test_fake_implementation_refuses_mismatched_inner_dimensions():
    A, B, C = torch.empty(M, K, device="meta"), torch.empty(K + 1, N, device="meta"), None
    with pytest.raises(RuntimeError, match="A @ B"):
        evtfuse.gemm(A, B, "def e(accum):\n    D = accum\n    return D")


@pytest.mark.parametrize("which", ["A", "B", "C"])
def test_inputs_requiring_grad_go_through_the_differentiable_operator(which):
    """A call needing a gradient is one call of ``evtfuse::gemm_functional`` (the autograd
    formula's operator, tests/test_autograd.py checks its gradients); without grad mode it
    is the plain operator, with the same results."""
    A, B, C = _data()
    leaf = dict(A=A, B=B, C=C)[which].requires_grad_(True)
    D, F = evtfuse.gemm(A, B, epi, C=C, alpha=1.0)
    assert "gemm_functional" in type(D.grad_fn).__name__ and F.grad_fn is D.grad_fn
    (D.sum() + F.sum()).backward()
    assert leaf.grad is not None and leaf.grad.shape == leaf.shape
    with torch.no_grad():
        D2, F2 = evtfuse.gemm(A, B, epi, C=C, alpha=1.0)
    assert D2.grad_fn is None
    _close([D, F], _eager(A.detach(), B.detach(), C.detach(), 1.0))
    _close([D2, F2], _eager(A.detach(), B.detach(), C.detach(), 1.0))


def test_fused_and_unstored_outputs_go_through_the_operator():
    A, B, C = _data()
    f = evtfuse.fuse(epi)
    D, F = torch.compile(lambda a, b, c: f(a, b, C=c, alpha=2.0, F=None), fullgraph=True,
                         backend="aot_eager")(A, B, C)
    assert F is None
    _close([D], [_eager(A, B, C, 2.0)[0]])


def test_argument_errors_keep_their_messages():
    A, B, C = _data()
    with pytest.raises(evtfuse.EpilogueError, match="Argument alpha is not provided"):
        evtfuse.gemm(A, B, epi, C=C)
    with pytest.raises(evtfuse.EpilogueError, match="Argument alpha must be a number"):
        evtfuse.gemm(A, B, epi, C=C, alpha="2")
    with pytest.raises(evtfuse.EpilogueError, match="Argument beta is not a parameter"):
        evtfuse.gemm(A, B, epi, C=C, alpha=1.0, beta=2.0)


def test_kernel_run_under_compile_is_one_operator_naming_its_kernel():
    from evtfuse import EpilogueArguments, GemmArguments, get_kernels

    A, B, C = _data()
    D, F = torch.empty(M, N), torch.empty(M, N)
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(epi, C=C, alpha=1.5, D=D, F=F))
    kernel = get_kernels(args)[-1]  # not the first: the named one must be the one that runs

    def f(scale):  # the arguments, built outside, reach the compiled code as a closure
        kernel.run(args)
        return D * scale

    gm = []

    def backend(graph, inputs):
        gm.append(graph)
        return graph.forward

    D.fill_(float("nan"))
    got = torch.compile(f, fullgraph=True, backend=backend)(torch.ones(()))
    _close([got, F], _eager(A, B, C, 1.5))
    calls = [n for n in gm[0].graph.nodes if "evtfuse.gemm" in str(n.target)]
    assert len(calls) == 1 and f"kernel={kernel.name}" in str(calls[0].args)


def test_each_stream_gets_its_own_workspaces(monkeypatch):
    """Two CUDA streams running one launch plan at once must not share its reduction
    workspaces and ticket counters: a plan keeps one set per stream, made on first use
    (and, under CUDA graph capture, in the graph's pool). Streams stubbed on the CPU."""
    from evtfuse.backends.triton.launch_items import StreamLocal

    stream = [11]
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: stream[0],
                        raising=False)
    made = []
    monkeypatch.setattr(StreamLocal, "_make", lambda self: made.append(1) or [torch.zeros(3)])
    local = StreamLocal(torch.device("cuda", 0), [((3,), torch.float32, 0)])
    first = local.getter(0)(None, None, None)
    assert local.getter(0)(None, None, None) is first and len(made) == 1
    stream[0] = 22
    second = local.getter(0)(None, None, None)
    assert second is not first and len(made) == 2
    stream[0] = 11
    assert local.getter(0)(None, None, None) is first


def test_device_guard_switches_to_the_tensors_device(monkeypatch):
    from types import SimpleNamespace

    from evtfuse.runtime.device import device_guard

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    on1 = SimpleNamespace(is_cuda=True, device=torch.device("cuda", 1))
    guard = device_guard(on1)
    assert isinstance(guard, torch.cuda.device) and guard.idx == 1
    assert device_guard(SimpleNamespace(is_cuda=True, device=torch.device("cuda", 0))) is None
    assert device_guard(torch.empty(1)) is None


def test_no_tensor_of_a_call_is_kept_alive():
    """evtfuse's caches (the last call's objects, a kernel's last arguments, the tuner's
    scratch copies) hold no strong reference to a call's tensors: under
    torch.compile(mode="reduce-overhead") a tensor of a CUDA graph's pool that outlives its
    call makes the graph refuse to run ("tensor(s) in the cudagraph pool not tracked as
    outputs")."""
    import gc
    import weakref

    from evtfuse import EpilogueArguments, GemmArguments, get_kernels

    refs = []
    for _ in range(2):  # the second call takes the cached paths
        A, B, C = _data()
        D, F = evtfuse.gemm(A, B, epi, C=C, alpha=1.0)
        refs += [weakref.ref(t) for t in (A, B, C, D, F)]
        del A, B, C, D, F
    A, B, C = _data()
    D, F = torch.empty(M, N), torch.empty(M, N)
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(epi, C=C, alpha=1.0, D=D, F=F))
    for k in get_kernels(args):
        k.run(args)
        k.run(args)
    refs += [weakref.ref(t) for t in (A, B, C, D, F)]
    del A, B, C, D, F, args
    gc.collect()
    assert [r() is None for r in refs] == [True] * len(refs)


class _Desc:
    def __init__(self, t):
        self.base, self.shape = t, list(t.shape)


def test_tma_descriptors_keep_no_tensor_alive():
    """A TMA family's descriptor getter (``_rebased``) keeps no tensor between calls (the
    TMA families do not run under the interpreter, so the test above cannot see them)."""
    import gc
    import weakref

    from evtfuse.backends.triton.launch_items import _rebased

    make = _rebased(_Desc)
    refs = []
    for _ in range(3):
        t = torch.empty(4, 8)
        d, again = make(t), make(t)
        assert d.base is t and again.base is t and again.shape == [4, 8]
        refs.append(weakref.ref(t))
        del t, d, again
    gc.collect()
    assert [r() is None for r in refs] == [True] * 3
