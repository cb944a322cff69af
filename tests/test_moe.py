"""``evtfuse.nn.MoEExperts`` and ``evtfuse.runtime.moe`` (CPU, Triton's interpreter, fp32 and
one fp16 case): the output and every gradient (hidden states, routing weights, gate_up,
down) against a float64 per-expert loop in torch, for uniform and skewed routing, an expert
without tokens, k = 1 and k = 2, each activation; the backward's epilogue derived from the
activation; a Hugging Face experts module's state dict and output; torch.compile with no
graph break; the errors of bad arguments."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from evtfuse.dag_epilogue import DagEpilogue
from evtfuse.errors import EpilogueError
from evtfuse.nn import MoEExperts
from evtfuse.runtime import moe as moe_ops

ACTS = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu,
        "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}
E, H, I, T = 4, 16, 24, 12


def _def(epilogue) -> str:
    """``def <name>`` of an epilogue given as source text or as a DAG (``DagEpilogue``)."""
    return f"def {epilogue.name}" if isinstance(epilogue, DagEpilogue) else epilogue.split("(")[0]


def _reference(x, index, weights, gate_up, down, act):
    """The experts as a per-expert loop (transformers' eager forward, written out)."""
    out = torch.zeros_like(x)
    for e in range(gate_up.shape[0]):
        t, j = torch.where(index == e)
        if t.numel() == 0:
            continue
        gate, up = F.linear(x[t], gate_up[e]).chunk(2, dim=-1)
        h = F.linear(ACTS[act](gate) * up, down[e]) * weights[t, j, None]
        out = out.index_add(0, t, h)
    return out


def _routing(kind: str, tokens: int = T, k: int = 2, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    if kind == "uniform":  # every expert k * tokens / E pairs
        index = torch.stack([(torch.arange(tokens) + j) % E for j in range(k)], 1)
    elif kind == "skewed":  # most pairs on expert 0, none on expert 2
        first = torch.where(torch.rand(tokens, generator=g) < 0.75, 0, 3)
        index = torch.stack([first] + [(first + j) % E if j > 1 else
                                       torch.where(first == 0, 1, 0)
                                       for j in range(1, k)], 1)
    else:  # random
        index = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(tokens)])
    weights = torch.rand(tokens, k, generator=g) + 0.1
    return index, weights


def _check(block: MoEExperts, index, weights, dtype=torch.float32, tol=None,
           x=None):
    tol = tol or dict(rtol=2e-5, atol=2e-5)
    g = torch.Generator().manual_seed(7)
    if x is None:
        x = torch.randn(index.shape[0], block.hidden_size, generator=g)
    x = x.to(dtype).requires_grad_(True)
    w = weights.to(dtype).requires_grad_(True)
    y = block(x, index, w)
    dy = torch.randn(y.shape, generator=g).to(dtype)
    y.backward(dy)
    ref = [t.detach().double().requires_grad_(True)
           for t in (x, w, block.gate_up_proj, block.down_proj)]
    y_ref = _reference(ref[0], index, ref[1], ref[2], ref[3], block.activation)
    y_ref.backward(dy.double())
    torch.testing.assert_close(y.double(), y_ref, **tol)
    for name, got, want in zip(("x", "weights", "gate_up_proj", "down_proj"),
                               (x.grad, w.grad, block.gate_up_proj.grad, block.down_proj.grad),
                               ref):
        assert got is not None and got.dtype == dtype, name
        torch.testing.assert_close(got.double(), want.grad, **tol,
                                   msg=lambda m: f"{name}: {m}")
    return x, w


def _block(activation="silu", dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    block = MoEExperts(E, H, I, activation, dtype=torch.float32)
    with torch.no_grad():  # larger than the init: gradients well above rounding
        block.gate_up_proj.mul_(2.0)
    return block.to(dtype)


@pytest.mark.parametrize("routing, k", [("uniform", 2), ("skewed", 2), ("random", 1)])
@pytest.mark.parametrize("activation", sorted(ACTS))
@pytest.mark.cover
def test_matches_a_per_expert_loop(activation, routing, k):
    index, weights = _routing(routing, k=k)
    _check(_block(activation), index, weights)


def test_an_expert_without_tokens_gets_zero_gradients():
    index, weights = _routing("skewed")
    assert not (index == 2).any()
    block = _block("gelu_tanh")
    _check(block, index, weights)
    assert (block.gate_up_proj.grad[2] == 0).all() and (block.down_proj.grad[2] == 0).all()
    assert block.gate_up_proj.grad[0].abs().max() > 0


def test_one_expert_takes_every_token_and_int32_indices():
    index = torch.zeros(T, 1, dtype=torch.int32)
    _check(_block("relu"), index, torch.rand(T, 1) + 0.5)


def test_fp16_rounds_the_pre_activations_as_torch():
    """fp16: G and U are stored rounded as torch's Linear output is; the reference is
    float64 of the fp16 inputs: a tolerance of fp16's rounding of the intermediates."""
    index, weights = _routing("random", k=2, seed=3)
    _check(_block("silu", torch.float16), index, weights, torch.float16,
           dict(rtol=2e-2, atol=1e-2))


def test_only_the_gradients_asked_for():
    block = _block()
    block.gate_up_proj.requires_grad_(False)
    index, weights = _routing("uniform")
    x = torch.randn(T, H)  # no gradient for x nor the weights
    w = weights.clone().requires_grad_(True)
    block(x, index, w).sum().backward()
    assert block.gate_up_proj.grad is None and block.down_proj.grad is not None
    assert w.grad is not None and w.grad.shape == (T, 2)


def test_zero_tokens():
    block = _block()
    x = torch.randn(0, H, requires_grad=True)
    y = block(x, torch.zeros(0, 2, dtype=torch.long), torch.zeros(0, 2))
    assert y.shape == (0, H)
    y.sum().backward()
    assert (block.down_proj.grad == 0).all()


def test_backward_epilogue_is_derived_and_reads_the_accumulator():
    for activation in ACTS:
        epilogue, outputs = moe_ops.down_grad(activation)
        assert isinstance(epilogue, DagEpilogue)  # handed to grouped_gemm as a DAG
        source = epilogue.source
        assert source.startswith("def moe_down_grad(accum, G, U, s):"), source
        assert "grad_D" not in source and "sum(" in source, source
        assert dict(outputs).keys() == {"G", "U", "s"}


def test_one_grouped_gemm_each_way(monkeypatch):
    """Two evtfuse grouped GEMMs forward (the up projection's epilogue, the plain down
    projection), four backward (the derived epilogue, dx, dW_gate_up, dW_down)."""
    from evtfuse.runtime import calls as runtime_calls

    calls = []
    real = runtime_calls.plain_grouped_gemm

    def spy(A, B, offs, epilogue=None, **kw):
        calls.append((tuple(A.shape), tuple(B.shape),
                      "identity" if epilogue is None else _def(epilogue)))
        return real(A, B, offs, epilogue, **kw)

    monkeypatch.setattr(runtime_calls, "plain_grouped_gemm", spy)
    index, weights = _routing("uniform")
    x = torch.randn(T, H, requires_grad=True)
    y = _block()(x, index, weights.requires_grad_(True))
    rows = 2 * T
    assert calls == [((rows, H), (E, H, 2 * I), "def moe_up"), ((rows, I), (E, I, H), "identity")]
    y.sum().backward()
    assert calls[2:] == [((rows, H), (E, H, I), "def moe_down_grad"),
                         ((rows, 2 * I), (E, 2 * I, H), "identity"),
                         ((2 * I, rows), (rows, H), "identity"),
                         ((H, rows), (rows, I), "identity")]


@pytest.mark.slow
def test_compiled_has_no_graph_break():
    block = _block("silu", seed=5)
    index, weights = _routing("random", k=2, seed=5)
    x = torch.randn(T, H)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(block)(x, index, weights)
    assert explained.graph_break_count == 0, explained.break_reasons
    twin = _block("silu", seed=5)
    compiled = torch.compile(twin, fullgraph=True, backend="aot_eager")
    outs = []
    for m in (block, compiled):
        xi = x.clone().requires_grad_(True)
        wi = weights.clone().requires_grad_(True)
        y = m(xi, index, wi)
        y.backward(torch.ones_like(y))
        outs.append((y, xi.grad, wi.grad))
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    for p, q in zip(block.parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-6)


def test_loads_a_hugging_face_experts_state_dict():
    pytest.importorskip("transformers")
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    config = Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=I, num_experts=E,
                            hidden_act="silu")
    hf = Qwen3MoeExperts(config)
    torch.nn.init.normal_(hf.gate_up_proj, std=0.3)
    torch.nn.init.normal_(hf.down_proj, std=0.3)
    block = MoEExperts(E, H, I)
    block.load_state_dict(hf.state_dict())
    assert list(block.state_dict()) == ["gate_up_proj", "down_proj"]
    index, weights = _routing("random", k=2, seed=2)
    x = torch.randn(T, H)
    torch.testing.assert_close(block(x, index, weights), hf(x, index, weights),
                               rtol=1e-5, atol=1e-5)


def test_bad_arguments():
    block = _block()
    x, (index, weights) = torch.randn(T, H), _routing("uniform")
    before = [p.detach().clone() for p in block.parameters()]

    def fails(match, variable, *args):
        with pytest.raises(EpilogueError, match=match) as info:
            block(*args)
        assert info.value.variable == variable

    bad = index.clone()
    bad[3, 1] = E
    fails(r"top_k_index\[3, 1\] = 4 is out of range", "top_k_index", x, bad, weights)
    bad[3, 1] = -1
    fails("out of range", "top_k_index", x, bad, weights)
    fails("top_k_index must be torch.int64", "top_k_index", x, index.float(), weights)
    fails("top_k_weights .* must have top_k_index's shape", "top_k_weights", x, index,
          weights[:, :1])
    fails("top_k_index must be", "top_k_index", x, index[:5], weights[:5])
    fails("hidden_states has 8 features", "hidden_states", x[:, :8], index, weights)
    wide = torch.zeros(T, E + 1, dtype=torch.long)
    fails("picks k = 5 experts per token but there are 4", "top_k_index", x, wide,
          torch.rand(T, E + 1))
    fails("must be floating point", "top_k_weights", x, index, index)
    fails("top_k_weights is on meta but hidden_states is on cpu", "top_k_weights", x, index,
          weights.to("meta"))
    with pytest.raises(EpilogueError, match="down_proj is torch.float16") as info:
        moe_ops.moe_experts(x, index, weights, block.gate_up_proj, block.down_proj.half())
    assert info.value.variable == "down_proj"
    with pytest.raises(EpilogueError, match="does not match down_proj"):
        moe_ops.moe_experts(x, index, weights, block.gate_up_proj[:, :I], block.down_proj)
    with pytest.raises(EpilogueError, match="activation must be one of"):
        MoEExperts(E, H, I, "swish")
    for p, q in zip(block.parameters(), before):  # nothing written
        assert p.grad is None and torch.equal(p, q)


@pytest.mark.parametrize("k", [1, 2, 8])
def test_gather_sum_rounds_once_in_order(k):
    """``backends.triton.gather_sum`` (``moe.SUM_PAIRS``' default): each token's k
    rows, gathered by the inverse permutation, summed in fp32 in pair order and rounded
    once: within half a bf16 ulp (and fp32's own error) of the exact sum; rows and columns
    off the program's blocks; the same bits twice."""
    from evtfuse.backends.triton.gather_sum import gather_sum

    tokens, width = 37, 600  # 600: one full column block and a masked one
    g = torch.Generator().manual_seed(k)
    perm = torch.randperm(tokens * k, generator=g)
    rows = torch.randn(tokens * k, width, generator=g).bfloat16()
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.numel())
    got = gather_sum(rows, inverse, k)
    pairs = moe_ops._to_pairs(rows.double(), perm).view(tokens, k, -1)
    exact = pairs.sum(1)
    slack = pairs.abs().sum(1) * k * 2.0 ** -24
    bound = 0.5 * torch.finfo(torch.bfloat16).eps * (exact.abs() + slack) + slack + 2.0 ** -133
    assert got.dtype == torch.bfloat16 and got.shape == (tokens, width)
    assert bool(((got.double() - exact).abs() <= bound).all())
    # in pair order, in fp32: the same value a loop over the pairs gives
    want = pairs[:, 0].float()
    for j in range(1, k):
        want = want + pairs[:, j].float()
    assert torch.equal(got, want.bfloat16())
    assert torch.equal(gather_sum(rows, inverse, k), got)


def test_the_block_with_the_other_sum_over_k(monkeypatch):
    """The experts block forward and backward with ``SUM_PAIRS = "embedding_bag"`` (the
    default is evtfuse's ``gather_sum``; on the CPU this is a copy back to pair order and a
    sum) against the per-expert loop."""
    assert moe_ops.SUM_PAIRS == "gather_sum"
    monkeypatch.setattr(moe_ops, "SUM_PAIRS", "embedding_bag")
    index, weights = _routing("skewed", k=2)
    _check(_block(), index, weights)


_GATHER_SUM_OFFLINE = """
import json, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from evtfuse.backends.triton.gather_sum import BLOCK, ROWS, _gather_sum
out = {}
for dt in ("*bf16", "*fp16", "*fp32"):
    sig = {"src": dt, "index": "*i64", "out": dt, "rows": "i32", "width": "i32",
           "s_src": "i32", "s_out": "i32", "K": "constexpr", "ROWS": "constexpr",
           "BLOCK": "constexpr"}
    src = ASTSource(fn=_gather_sum, signature=sig, constexprs={(7,): 8, (8,): ROWS, (9,): BLOCK})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    out[dt] = len(k.asm["cubin"])
print("RESULT" + json.dumps(out))
"""


@pytest.mark.slow
def test_gather_sum_compiles_for_sm90():
    """``gather_sum``'s kernel compiles offline to sm_90 for 16-bit and fp32 rows (k = 8)."""
    from offline_run import run_offline

    got = run_offline(_GATHER_SUM_OFFLINE, timeout=600)
    assert len(got) == 3 and all(size > 0 for size in got.values()), got
