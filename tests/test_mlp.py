"""``evtfuse.nn.GatedMLP`` and ``evtfuse.nn.MLP`` (CPU, Triton's interpreter, fp32 and fp16):
outputs and every gradient against the same block in torch, for each activation, with and
without biases, leading batch dims; the backward's one epilogue derived from the
activation (its upstream gradient the accumulator: no pass of its own); gate and up weights
kept in one buffer (and a block whose weights lie apart, concatenated per call); HF's
parameter names; torch.compile with no graph break; the errors of bad arguments."""

from __future__ import annotations

import copy
import shutil

import pytest
import torch
import torch.nn.functional as F

from evtfuse.dag_epilogue import DagEpilogue
from evtfuse.errors import EpilogueError
from evtfuse.nn import GatedMLP, MLP
from evtfuse.runtime import mlp as mlp_ops

ACTS = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu,
        "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}
H, I = 16, 24


def _def(epilogue) -> str:
    """``def <name>`` of an epilogue given as source text or as a DAG (``DagEpilogue``)."""
    return f"def {epilogue.name}" if isinstance(epilogue, DagEpilogue) else epilogue.split("(")[0]


def _torch_gated(m: GatedMLP, x):
    act = ACTS[m.activation]
    return m.down_proj(act(m.gate_proj(x)) * m.up_proj(x))


def _torch_plain(m: MLP, x):
    return m.fc2(ACTS[m.activation](m.fc1(x)))


def _compare(block, reference, x, dtype, tol):
    ref = copy.deepcopy(block)
    x1 = x.detach().clone().requires_grad_(True)
    x2 = x.detach().clone().requires_grad_(True)
    y1, y2 = block(x1), reference(ref, x2)
    g = torch.randn(y1.shape, generator=torch.Generator().manual_seed(3)).to(dtype)
    y1.backward(g)
    y2.backward(g)
    torch.testing.assert_close(y1, y2, **tol)
    torch.testing.assert_close(x1.grad, x2.grad, **tol)
    for (name, p), q in zip(block.named_parameters(), ref.parameters()):
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, **tol, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("activation", sorted(ACTS))
def test_gated_mlp_matches_torch(activation, bias):
    torch.manual_seed(0)
    block = GatedMLP(H, I, activation, bias=bias)
    x = torch.randn(2, 5, H)
    _compare(block, _torch_gated, x, torch.float32, dict(rtol=1e-5, atol=1e-5))


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_plain_mlp_matches_torch(activation, bias):
    torch.manual_seed(1)
    block = MLP(H, I, activation=activation, bias=bias)
    x = torch.randn(7, H)
    _compare(block, _torch_plain, x, torch.float32, dict(rtol=1e-5, atol=1e-5))


def test_fp16_rounds_the_pre_activations_as_torch():
    """fp16: the stored gate and up are rounded as torch's Linear outputs are, and the
    activation is computed of those rounded values (torch's fp16 silu rounds its own
    result too: loose tolerance for that)."""
    torch.manual_seed(2)
    block = GatedMLP(H, I, "silu", dtype=torch.float16)
    x = torch.randn(9, H, dtype=torch.float16)
    _compare(block, _torch_gated, x, torch.float16, dict(rtol=2e-2, atol=2e-3))


def test_relu_decisions_follow_the_stored_pre_activation():
    """An exactly zero gate: relu's gradient there is torch's (0), as the stored value
    decides in the forward and the backward alike."""
    block = GatedMLP(4, 4, "relu")
    with torch.no_grad():
        block.gate_proj.weight.zero_()
    x = torch.randn(3, 4)
    _compare(block, _torch_gated, x, torch.float32, dict(rtol=1e-6, atol=1e-6))


def test_gate_and_up_weights_share_one_buffer():
    block = GatedMLP(H, I)
    g, u = block.gate_proj.weight, block.up_proj.weight
    assert u.data_ptr() == g.data_ptr() + g.numel() * g.element_size()
    assert mlp_ops._weight1(g, u) is not None
    params = list(block.parameters())
    block.to(torch.float16)  # new storage: packed again, the same Parameter objects
    assert list(block.parameters()) == params
    assert block.gate_proj.weight.dtype == torch.float16
    assert mlp_ops._weight1(block.gate_proj.weight, block.up_proj.weight) is not None
    assert list(block.state_dict()) == ["gate_proj.weight", "up_proj.weight",
                                        "down_proj.weight"]


def test_a_deep_copy_and_a_pickled_block_keep_one_buffer():
    """copy.deepcopy (how benchmarks and EMA copies make a twin) and pickling give each
    parameter storage of its own; the block packs them again, so a copy's steps read
    [W_gate; W_up] in place, as the original's do (and give its bits)."""
    import io
    import pickle

    torch.manual_seed(6)
    block = GatedMLP(H, I)
    for twin in (copy.deepcopy(block), pickle.load(io.BytesIO(pickle.dumps(block)))):
        g, u = twin.gate_proj.weight, twin.up_proj.weight
        assert mlp_ops._weight1(g, u) is not None
        assert torch.equal(g, block.gate_proj.weight) and torch.equal(u, block.up_proj.weight)
        assert g.data_ptr() != block.gate_proj.weight.data_ptr()
        x = torch.randn(5, H)
        assert torch.equal(twin(x), block(x))


def test_weights_apart_give_the_same_results():
    torch.manual_seed(4)
    block = GatedMLP(H, I, "gelu_tanh")
    block.up_proj.weight = torch.nn.Parameter(block.up_proj.weight.detach().clone())
    assert mlp_ops._weight1(block.gate_proj.weight, block.up_proj.weight) is None
    _compare(block, _torch_gated, torch.randn(6, H), torch.float32,
             dict(rtol=1e-5, atol=1e-5))


def test_dx_is_the_same_matmul_wherever_the_weights_lie():
    """dx = dp @ [W_gate; W_up] in one matmul of K = 2I whether the weights are packed or
    apart (a compiled backward may see them apart): bit for bit the same result, so eager
    and compiled blocks agree exactly."""
    torch.manual_seed(5)
    block = GatedMLP(64, 96, dtype=torch.bfloat16)
    g, u = block.gate_proj.weight.detach(), block.up_proj.weight.detach()
    dp = torch.randn(33, 192, dtype=torch.bfloat16)
    packed = torch.ops.evtfuse.mlp_dx.default(dp, g, u)
    apart = torch.ops.evtfuse.mlp_dx.default(dp, g.clone(), u.clone())
    assert torch.equal(packed, apart)
    torch.testing.assert_close(packed, dp @ torch.cat((g, u)), rtol=0, atol=0)


def test_adopt_shares_the_linears():
    gate, up, down = (torch.nn.Linear(H, I, bias=False), torch.nn.Linear(H, I, bias=False),
                      torch.nn.Linear(I, H, bias=False))
    block = GatedMLP.adopt(gate, up, down, "silu")
    assert block.gate_proj is gate and block.up_proj is up and block.down_proj is down
    _compare(block, _torch_gated, torch.randn(4, H), torch.float32,
             dict(rtol=1e-5, atol=1e-5))
    fc1, fc2 = torch.nn.Linear(H, I), torch.nn.Linear(I, H)
    plain = MLP.adopt(fc1, fc2, "relu")
    assert plain.fc1 is fc1 and plain.fc2 is fc2


def test_backward_epilogue_is_derived_and_reads_the_accumulator():
    """The backward's epilogue comes from the activation's expression through autodiff:
    its upstream gradient is the accumulator (no operand carries it: dA never exists) and
    it writes the gradients of gate and up and the activation's output again."""
    for activation in ACTS:
        epilogue, outputs = mlp_ops.down_grad(activation, True)
        assert isinstance(epilogue, DagEpilogue)  # handed to gemm as a DAG, never re-parsed
        source = epilogue.source
        assert "accum" in source.split("\n", 1)[1] and "grad_D" not in source, source
        assert source.startswith("def mlp_down_grad(accum, G, U):"), source
        assert dict(outputs).keys() == {"G", "U"}
        assert "D = " in source


def test_backward_runs_one_evtfuse_kernel(monkeypatch):
    """One evtfuse GEMM a direction (the up projection's, the down projection's dA), the
    rest torch matmuls: no kernel over the pre-activations alone."""
    from evtfuse.runtime import calls as runtime_calls

    calls = []
    real = runtime_calls.plain_gemm
    monkeypatch.setattr(runtime_calls, "plain_gemm", lambda A, B, epi, **kw: calls.append(
        (tuple(A.shape), tuple(B.shape), _def(epi))) or real(A, B, epi, **kw))
    block = GatedMLP(H, I, "silu")
    x = torch.randn(5, H, requires_grad=True)
    y = block(x)
    assert calls == [((5, H), (H, 2 * I), "def mlp_up")]
    y.sum().backward()
    assert calls[1:] == [((5, H), (H, I), "def mlp_down_grad")]


def test_compiled_block_has_no_graph_break():
    torch.manual_seed(5)
    block = GatedMLP(H, I, "silu")
    twin = copy.deepcopy(block)
    x = torch.randn(2, 3, H, requires_grad=True)
    torch._dynamo.reset()
    assert torch._dynamo.explain(block)(x).graph_break_count == 0
    compiled = torch.compile(twin, fullgraph=True, backend="aot_eager")
    x2 = x.detach().clone().requires_grad_(True)
    compiled(x2).sum().backward()
    block(x).sum().backward()
    torch.testing.assert_close(x2.grad, x.grad, rtol=1e-6, atol=1e-6)
    for (n, p), q in zip(block.named_parameters(), twin.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-6, atol=1e-6)


def test_bad_arguments():
    with pytest.raises(EpilogueError, match="activation must be one of"):
        GatedMLP(H, I, "swish")
    with pytest.raises(EpilogueError, match="do not make a gated MLP"):
        GatedMLP.adopt(torch.nn.Linear(H, I), torch.nn.Linear(H, I + 1), torch.nn.Linear(I, H))
    with pytest.raises(EpilogueError, match="must be a torch.nn.Linear"):
        GatedMLP.adopt(torch.nn.Linear(H, I), torch.nn.Identity(), torch.nn.Linear(I, H))
    with pytest.raises(EpilogueError, match="fc2 takes"):
        MLP.adopt(torch.nn.Linear(H, I), torch.nn.Linear(I + 1, H))


def test_second_backward_fails_clearly():
    """The backward writes d[gate|up] over the saved gate|up: a second backward through
    the same graph fails with a message saying so, instead of differentiating garbage."""
    block = GatedMLP(H, I, "silu")
    y = block(torch.randn(3, H, requires_grad=True)).sum()
    y.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="runs once"):
        y.backward()


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="Inductor's CPU code needs a C++ compiler (the GPU tier's "
                    "test_compiled_block_matches_eager compiles the block with Inductor)")
@pytest.mark.slow
# torch's notice that the test's own force_disable_caches turns its dynamo_pgo off
@pytest.mark.filterwarnings("ignore:dynamo_pgo force disabled:UserWarning")
def test_compiled_backward_runs_no_pass_of_its_own():
    """Under Inductor the backward is the fused op and torch matmuls: no kernel of
    Inductor's own (its d[gate|up] is a new tensor: a mutation of the saved gate|up would
    make Inductor copy it onto itself first)."""
    from torch._inductor.utils import run_and_get_code

    torch.manual_seed(6)
    block = GatedMLP(H, I, "silu")
    x = torch.randn(5, H, requires_grad=True)
    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True)
    with torch._inductor.config.patch(force_disable_caches=True):  # code, not a cache's
        _, codes = run_and_get_code(lambda: compiled(x).sum().backward())
    backward = [c for c in codes if "mlp_down_grad" in c]
    assert len(backward) == 1, codes
    body = backward[0].split("def call(", 1)[1]
    assert "cpp_fused" not in body.split("def benchmark_compiled_module", 1)[0], body


def test_inference_stores_no_pre_activations(monkeypatch):
    """Under no_grad (or with nothing requiring a gradient) the up projection stores only
    the activation's output: the same result, no (tokens, 2I) gate|up tensor."""
    from evtfuse.runtime import calls

    stored = []
    real = calls.plain_gemm
    monkeypatch.setattr(calls, "plain_gemm", lambda A, B, src, **kw: stored.append(
        {k: v is not None for k, v in kw.items() if k in ("G", "U")}) or real(A, B, src, **kw))
    block = GatedMLP(H, I, "gelu_tanh")
    x = torch.randn(4, H)
    with torch.no_grad():
        y = block(x)
    assert stored == [{"G": False, "U": False}]
    torch.testing.assert_close(y, _torch_gated(block, x), rtol=1e-5, atol=1e-5)
    block(x.requires_grad_(True))
    assert stored[-1] == {"G": True, "U": True}


_DOWN_GRAD_OFFLINE = """
import json, torch
from evtfuse import EpilogueArguments, GemmArguments
from evtfuse.backends.triton.hopper_family import _epilogue_registers, _full_tiles
from evtfuse.runtime import mlp
from evtfuse.runtime.offline import compile_for, offered
src, outputs = mlp.down_grad("silu", True)
grad = dict(outputs)
T, H, I = 8192, 4096, 14336
bf = torch.bfloat16
p, dp = torch.empty(T, 2 * I, dtype=bf), torch.empty(T, 2 * I, dtype=bf)
a = torch.empty(T, I, dtype=bf)
args = GemmArguments(torch.empty(T, H, dtype=bf), torch.empty(H, I, dtype=bf), a,
                     epilogue=EpilogueArguments(src, D=a, G=p[:, :I], U=p[:, I:],
                                                **{grad["G"]: dp[:, :I], grad["U"]: dp[:, I:]}))
out = []
for fam, cfg in offered(args):
    if fam.name == "hopper":
        c = compile_for(fam, cfg, args)
        out.append({"config": cfg.name, "spills": c.spills, "shared": c.shared_bytes,
                    "registers": _epilogue_registers(cfg, _full_tiles(args))})
print("RESULT" + json.dumps(out))
"""


@pytest.mark.slow
def test_the_blocks_backward_epilogue_compiles_without_spilled_tiles_for_sm90():
    """The SwiGLU block's dA epilogue (gate and up in; their gradients and the activation
    out: five full tiles) in the hopper family's candidates at Llama's sizes, offline to
    sm_90, within an H100/H200's shared memory: sub-tiles narrowed to ``EPILOGUE_REGISTERS``
    where they can be, and there no spilled tile (a few spilled scalars tolerated), the
    first candidate without any."""
    from offline_run import check_epilogue_registers, run_offline

    got = run_offline(_DOWN_GRAD_OFFLINE, timeout=900)
    assert len(got) >= 4 and all(0 < c["shared"] <= 232448 for c in got), got
    check_epilogue_registers(got)
