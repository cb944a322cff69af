"""``evtfuse.linear_cross_entropy`` (CPU, Triton's interpreter, fp32 and fp16): the loss, the
lse and the gradients of hidden, weight and bias against ``torch.nn.functional.cross_entropy``
of ``hidden @ weight.T (+ bias)`` in float64, for every reduction, ignored rows (some, all),
label smoothing, softcap, z-loss, bias on and off, several chunks of rows (a tiny
``CHUNK_BYTES``), a vocabulary that is no multiple of a tile, leading batch dims, a gradient
through the returned lse; gradcheck; torch.compile (fullgraph, aot_eager) with no graph
break; ``evtfuse.nn.LinearCrossEntropy``; the errors of bad arguments."""

from __future__ import annotations

import shutil

import pytest
import torch

import evtfuse
from evtfuse.errors import EpilogueError
from evtfuse.runtime import cross_entropy

T, H, V = 11, 8, 37  # tokens, hidden, vocabulary (37: no multiple of any tile)
F64 = torch.float64
TOL = dict(rtol=2e-5, atol=2e-5)  # fp32 kernels against float64 torch


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    """4 rows of fp32 logits per chunk: 11 tokens run as chunks of 4, 4 and 3."""
    monkeypatch.setattr(cross_entropy, "CHUNK_BYTES", 4 * V * 4)


def _rand(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed * 131 + sum(shape))
    return torch.randn(shape, generator=g).to(dtype)


def _inputs(t=T, v=V, seed=0, ignored=(2, 7), lead=None, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    hidden = _rand(t, H, seed=seed, dtype=dtype)
    weight = (_rand(v, H, seed=seed + 1) * 0.5).to(dtype)
    bias = _rand(v, seed=seed + 2, dtype=dtype)
    target = torch.randint(0, v, (t,), generator=g)
    for i in ignored:
        target[i] = -100
    if lead is not None:
        hidden, target = hidden.reshape(*lead, H), target.reshape(lead)
    return hidden, weight, bias, target


def torch_loss(hidden, weight, target, bias=None, ignore_index=-100, reduction="mean",
               label_smoothing=0.0, softcap=None, z_loss=0.0):
    """The oracle: torch's cross_entropy (plus the z-loss) of the logits; returns (loss, lse)."""
    logits = hidden @ weight.T
    if bias is not None:
        logits = logits + bias
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    flat, y = logits.reshape(-1, weight.shape[0]), target.reshape(-1)
    loss = torch.nn.functional.cross_entropy(flat, y, ignore_index=ignore_index,
                                             reduction=reduction, label_smoothing=label_smoothing)
    lse = torch.logsumexp(flat, dim=-1)
    if z_loss:
        valid = y != ignore_index
        z = torch.where(valid, z_loss * lse * lse, 0.0)
        loss = loss + (z if reduction == "none" else
                       z.sum() / valid.sum() if reduction == "mean" else z.sum())
    if reduction == "none":
        loss = loss.reshape(target.shape)
    return loss, lse.reshape(target.shape)


def _leaves(ts, dtype=None):
    return [None if t is None else t.detach().clone().to(dtype or t.dtype).requires_grad_(True)
            for t in ts]


def compare(hidden, weight, bias, target, lse_grad=False, tol=TOL, **options):
    """Ours against the float64 oracle: loss, lse and the gradients of a random weighting of
    the loss (and of the lse where ``lse_grad``)."""
    ours = _leaves((hidden, weight, bias))
    ref = _leaves((hidden, weight, bias), F64)
    loss, lse = evtfuse.linear_cross_entropy(ours[0], ours[1], target, bias=ours[2],
                                             return_lse=True, **options)
    want_loss, want_lse = torch_loss(ref[0], ref[1], target, bias=ref[2], **options)
    assert loss.dtype == torch.float32 and lse.dtype == torch.float32
    assert loss.shape == want_loss.shape and lse.shape == target.shape
    torch.testing.assert_close(loss.double(), want_loss.detach(), equal_nan=True, **tol)
    torch.testing.assert_close(lse.double(), want_lse.detach(), **tol)
    g = _rand(*loss.shape, seed=9) if loss.dim() else torch.tensor(1.7)
    total = (loss * g).sum()
    want_total = (want_loss * g.double()).sum()
    if lse_grad:
        g2 = _rand(*lse.shape, seed=10)
        total = total + (lse * g2).sum()
        want_total = want_total + (want_lse * g2.double()).sum()
    total.backward()
    want_total.backward()
    for name, got, want in zip(("hidden", "weight", "bias"), ours, ref):
        if got is None:
            continue
        assert got.grad is not None, f"no gradient for {name}"
        assert got.grad.dtype == got.dtype
        torch.testing.assert_close(got.grad.double(), want.grad, equal_nan=True, **tol,
                                   msg=lambda m: f"{name}: {m}")
    return loss


OPTIONS = {
    "plain": {},
    "label_smoothing": dict(label_smoothing=0.2),
    "softcap": dict(softcap=2.5),
    "z_loss": dict(z_loss=1e-2),
    "all": dict(label_smoothing=0.1, softcap=4.0, z_loss=1e-3),
}


@pytest.mark.cover("reduction", "with_bias")  # the quick tier: 3 of them (conftest.py)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no_bias"])
def test_loss_and_gradients_match_torch(reduction, option, with_bias):
    hidden, weight, bias, target = _inputs()
    compare(hidden, weight, bias if with_bias else None, target, reduction=reduction,
            **OPTIONS[option])


@pytest.mark.parametrize("reduction", ["mean", pytest.param("sum", marks=pytest.mark.slow),
                                       pytest.param("none", marks=pytest.mark.slow)])
def test_every_row_ignored(reduction):
    """mean: nan, as torch (0 / 0); sum: 0; none: zeros; gradients zero (torch's too)."""
    hidden, weight, bias, target = _inputs(ignored=range(T))
    loss = compare(hidden, weight, bias, target, reduction=reduction, label_smoothing=0.1,
                   z_loss=1e-2)
    if reduction == "mean":
        assert torch.isnan(loss)


def test_another_ignore_index_and_label_smoothing_of_one():
    hidden, weight, bias, target = _inputs(ignored=())
    target[3] = target[5] = 0  # class 0 ignored: rows whose class is 0 have no loss
    compare(hidden, weight, bias, target, ignore_index=0, label_smoothing=1.0)


@pytest.mark.slow
def test_gradient_through_the_lse_alone_and_with_the_loss():
    hidden, weight, bias, target = _inputs()
    for reduction in ("mean", "none"):
        compare(hidden, weight, bias, target, lse_grad=True, reduction=reduction, z_loss=1e-2)
    ours = _leaves((hidden, weight, bias))
    ref = _leaves((hidden, weight, bias), F64)
    _, lse = evtfuse.linear_cross_entropy(ours[0], ours[1], target, bias=ours[2],
                                          return_lse=True, softcap=3.0)
    _, want = torch_loss(ref[0], ref[1], target, bias=ref[2], softcap=3.0)
    lse.sum().backward()  # the loss unused: only the lse's gradient
    want.sum().backward()
    for got, w in zip(ours, ref):
        torch.testing.assert_close(got.grad.double(), w.grad, **TOL)


@pytest.mark.slow
def test_leading_batch_dims_and_a_flat_target():
    hidden, weight, bias, target = _inputs(lead=(2, 5), t=10)
    loss = compare(hidden, weight, bias, target, reduction="none")
    assert loss.shape == (2, 5)
    compare(hidden, weight, bias, target.reshape(-1), reduction="sum")


@pytest.mark.parametrize("vocab", [pytest.param(1, marks=pytest.mark.slow), 5,
                                   pytest.param(130, marks=pytest.mark.slow)])
def test_vocabulary_sizes_and_one_chunk_or_many(vocab, monkeypatch):
    hidden, weight, bias, target = _inputs(v=vocab, ignored=(1,))
    compare(hidden, weight, bias, target, label_smoothing=0.1)
    monkeypatch.setattr(cross_entropy, "CHUNK_BYTES", 1)  # a row per chunk
    compare(hidden, weight, bias, target, reduction="none", softcap=3.0)


def test_chunk_rows(monkeypatch):
    monkeypatch.setattr(cross_entropy, "CHUNK_BYTES", 128 << 20)
    assert cross_entropy.chunk_rows(8192, 128256, 2) == 512  # 128 MiB: 523 rows, to 128s
    assert cross_entropy.chunk_rows(100, 128256, 2) == 100
    monkeypatch.setattr(cross_entropy, "CHUNK_BYTES", 4 * 37 * 4)
    assert cross_entropy.chunk_rows(10, 37, 4) == 4
    assert cross_entropy.chunk_rows(3, 37, 4) == 3
    assert cross_entropy.chunk_rows(10, 10 ** 9, 4) == 1


def test_fp16():
    hidden, weight, bias, target = _inputs(dtype=torch.float16)
    compare(hidden, weight, bias, target, tol=dict(rtol=2e-2, atol=2e-2), softcap=5.0,
            label_smoothing=0.1)
    hidden, weight, bias, target = _inputs(dtype=torch.float16, ignored=range(T))
    compare(hidden, weight, bias, target, tol=dict(rtol=2e-2, atol=2e-2))  # nan, zero grads


@pytest.mark.slow
def test_fp16_computes_gradients_in_the_backward(monkeypatch):
    """fp16's gradient of the logits before the upstream (a loss scaler's) factor would
    flush to zero: its forward computes no gradient, the backward recomputes with it."""
    calls = []
    real = cross_entropy.chunked
    monkeypatch.setattr(cross_entropy, "chunked", lambda *a: calls.append(1) or real(*a))
    for dtype, in_forward in ((torch.float16, 0), (torch.float32, 1)):
        hidden, weight, bias, target = _inputs(dtype=dtype)
        calls.clear()
        loss = evtfuse.linear_cross_entropy(hidden, weight.requires_grad_(True), target)
        assert len(calls) == in_forward
        (loss * 1024.0).backward()
        assert len(calls) == 1


def test_the_forwards_gradients_become_grad_without_a_copy(monkeypatch):
    """"mean" in eager: the backward scales the forward's gradients in place and autograd
    takes them as .grad (no second weight-sized tensor)."""
    made = []
    real = cross_entropy.chunked

    def spy(*a):
        out = real(*a)
        made.extend(t.data_ptr() for t in out[1:])
        return out

    monkeypatch.setattr(cross_entropy, "chunked", spy)
    leaves = _leaves(_inputs()[:3])
    evtfuse.linear_cross_entropy(leaves[0], leaves[1], _inputs()[3], bias=leaves[2]).backward()
    assert made == [t.grad.data_ptr() for t in leaves]


def test_no_tokens():
    hidden, weight, bias, target = _inputs(t=0, ignored=())
    for reduction in ("mean", "sum", "none"):
        compare(hidden, weight, bias, target, reduction=reduction)


def test_without_grad_the_same_loss_and_only_the_frozen_part():
    hidden, weight, bias, target = _inputs()
    with torch.no_grad():
        a = evtfuse.linear_cross_entropy(hidden, weight, target, bias=bias, z_loss=1e-2)
    b = evtfuse.linear_cross_entropy(hidden, weight.requires_grad_(True), target, bias=bias,
                                     z_loss=1e-2)
    torch.testing.assert_close(a, b.detach(), rtol=1e-6, atol=1e-6)
    b.backward()
    assert weight.grad is not None and hidden.grad is None and bias.grad is None


@pytest.mark.filterwarnings("ignore:Input #:UserWarning")  # gradcheck prefers float64
@pytest.mark.parametrize("wrt", [pytest.param(None, id="fast_mode"), *(
    pytest.param(i, id=name, marks=pytest.mark.slow)
    for i, name in enumerate(("hidden", "weight", "bias")))])
def test_gradcheck_in_fp32(wrt):
    """Finite differences; fp32 (the kernels take no float64 hidden and weight), so with
    loose tolerances. reduction="none" and the lse: their backward recomputes, so it runs as
    often as gradcheck asks ("mean" and "sum" scale the forward's gradients in place, once:
    ``test_a_second_backward_of_mean_is_refused_clearly``). The quick tier: gradcheck's
    fast mode (a random projection of the Jacobian) of all three; the full tier: the whole
    Jacobian of each, one test per input (each under a minute)."""
    hidden, weight, bias, target = _inputs(t=5, v=6, ignored=(1,))
    leaves = _leaves((hidden, weight, bias))
    wrt = range(3) if wrt is None else (wrt,)

    def f(*ts):
        h, w, b = (ts[list(wrt).index(k)] if k in wrt else leaves[k].detach() for k in range(3))
        return evtfuse.linear_cross_entropy(h, w, target, bias=b, reduction="none",
                                            label_smoothing=0.1, softcap=3.0, z_loss=0.1,
                                            return_lse=True)

    assert torch.autograd.gradcheck(f, tuple(leaves[k] for k in wrt), eps=1e-3, atol=1e-2,
                                    rtol=1e-2, fast_mode=len(wrt) == 3)


@pytest.mark.slow
def test_a_second_backward_of_mean_is_refused_clearly():
    hidden, weight, bias, target = _inputs()
    h = hidden.clone().requires_grad_(True)
    loss = evtfuse.linear_cross_entropy(h, weight, target, bias=bias)
    loss.backward(retain_graph=True)
    first = h.grad.clone()
    with pytest.raises(RuntimeError, match="a second backward through the same graph"):
        loss.backward()
    torch.testing.assert_close(h.grad, first)  # nothing added
    h.grad = None
    rows = evtfuse.linear_cross_entropy(h, weight, target, bias=bias, reduction="none")
    mean = rows.sum() / (target != -100).sum()
    mean.backward(retain_graph=True)
    mean.backward()  # "none" recomputes: twice the gradient
    torch.testing.assert_close(h.grad, 2 * first, rtol=1e-5, atol=1e-6)


def _step(hidden, weight, bias, target):
    loss, lse = evtfuse.linear_cross_entropy(hidden, weight, target, bias=bias, softcap=4.0,
                                             z_loss=1e-3, return_lse=True)
    rows = evtfuse.linear_cross_entropy(hidden, weight, target, reduction="none",
                                        label_smoothing=0.1)
    return loss + 0.1 * lse.mean() + (rows * rows).mean()


def _eager_grads(ts, target):
    leaves = _leaves(ts)
    _step(*leaves, target).backward()
    return [t.grad for t in leaves]


@pytest.mark.slow  # torch.compile of the op: tests/test_autograd.py's in the quick tier
def test_compiled_training_step_has_no_graph_break(monkeypatch):
    """Under torch.compile the operators run as in eager: the forward computes the
    gradients of "mean" and "sum" and the backward recomputes only what eager's does (the
    lse's gradient, "none")."""
    hidden, weight, bias, target = _inputs()
    torch._dynamo.reset()
    leaves = _leaves((hidden, weight, bias))
    assert torch._dynamo.explain(_step)(*leaves, target).graph_break_count == 0
    calls = []
    real = cross_entropy.chunked
    monkeypatch.setattr(cross_entropy, "chunked", lambda *a: calls.append(1) or real(*a))
    counts = []
    for step in (_step, torch.compile(_step, fullgraph=True, backend="aot_eager")):
        calls.clear()
        leaves = _leaves((hidden, weight, bias))
        loss = step(*leaves, target)
        forward = len(calls)
        loss.backward()
        counts.append((forward, len(calls)))
    assert counts[0] == counts[1] == (1, 3), counts
    for got, want in zip(leaves, _eager_grads((hidden, weight, bias), target)):
        torch.testing.assert_close(got.grad, want, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="Inductor's CPU code needs a C++ compiler (the GPU tier's "
                    "test_peak_memory_stays_under_the_bound[compiled] checks the same on CUDA)")
# torch's notice that the test's own force_disable_caches turns its dynamo_pgo off
@pytest.mark.filterwarnings("ignore:dynamo_pgo force disabled:UserWarning")
def test_compiled_backward_scales_in_place():
    """Under Inductor the backward scales the gradients the forward saved in their own
    memory (no new d_weight is allocated): Inductor does not reinplace a mutation of a
    saved tensor (a graph input of the backward), so it first copies each onto itself (one
    pass, its buffer reused: docs/pytorch.md); and the gradients are right."""
    from torch._inductor.utils import run_and_get_code

    hidden, weight, bias, target = _inputs()
    torch._dynamo.reset()
    leaves = _leaves((hidden, weight, bias))

    def mean_loss(hidden, weight, bias, target):
        return evtfuse.linear_cross_entropy(hidden, weight, target, bias=bias, softcap=4.0)

    def train():
        torch.compile(mean_loss, fullgraph=True)(*leaves, target).backward()

    with torch._inductor.config.patch(force_disable_caches=True):  # code, not a cache's
        _, codes = run_and_get_code(train)
    backward = [c for c in codes if "evtfuse.scale_" in c]
    assert len(backward) == 1, codes
    code = backward[0]
    assert code.count("torch.ops.evtfuse.scale_.default(") == 3  # dh, dw, db
    body = code.split("def call(", 1)[1]
    assert "empty_strided" not in body and "# reuse" in body, code
    want = _leaves((hidden, weight, bias))
    mean_loss(*want, target).backward()
    for got, ref in zip(leaves, want):
        torch.testing.assert_close(got.grad, ref.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # torch.compile of the op: tests/test_autograd.py's in the quick tier
def test_compiled_forward_and_backward_traced_together():
    if not hasattr(torch._dynamo.config, "trace_autograd_ops"):
        pytest.skip("this torch's Dynamo cannot trace Tensor.backward()")
    hidden, weight, bias, target = _inputs()
    torch._dynamo.reset()

    def train(hidden, weight, bias, target):
        loss = _step(hidden, weight, bias, target)
        loss.backward()
        return loss.detach()

    leaves = _leaves((hidden, weight, bias))
    with torch._dynamo.config.patch(trace_autograd_ops=True):
        torch.compile(train, fullgraph=True, backend="aot_eager")(*leaves, target)
    for got, want in zip(leaves, _eager_grads((hidden, weight, bias), target)):
        torch.testing.assert_close(got.grad, want, rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # torch.compile of the op: tests/test_autograd.py's in the quick tier
def test_compiled_with_dynamic_shapes_compiles_once():
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(_step, fullgraph=True, dynamic=True, backend=counter)
    for t in (11, 14, 6):
        hidden, weight, bias, target = _inputs(t=t, ignored=(1,))
        leaves = _leaves((hidden, weight, bias))
        compiled(*leaves, target).backward()
        for got, want in zip(leaves, _eager_grads((hidden, weight, bias), target)):
            torch.testing.assert_close(got.grad, want, rtol=1e-5, atol=1e-6)
    assert counter.frame_count == 1


@pytest.mark.parametrize("reduction, grads", [
    pytest.param("mean", False, marks=pytest.mark.slow),
    pytest.param("sum", True, marks=pytest.mark.slow), ("none", True)])
def test_opcheck(reduction, grads):
    """torch.library.opcheck of the operators: schema, fake tensors, autograd registration,
    AOT dispatch (not for a forward that computes gradients, which only eager calls make:
    its backward scales them in place)."""
    hidden, weight, bias, target = _inputs(t=6, v=13, ignored=(1,))
    leaves = _leaves((hidden, weight, bias))
    args = (*leaves[:2], target, leaves[2], -100, reduction, 0.1, 3.0, 0.01, [grads] * 3)
    tests = ("test_schema", "test_autograd_registration", "test_faketensor") + \
        (() if grads and reduction != "none" else ("test_aot_dispatch_dynamic",))
    torch.library.opcheck(torch.ops.evtfuse.linear_cross_entropy.default, args,
                          test_utils=tests)
    torch.library.opcheck(torch.ops.evtfuse.linear_cross_entropy_backward.default,
                          (hidden, weight, target, bias, _rand(6), None, -100, 0.1, 3.0, 0.01,
                           [True, True, True]))


def test_module_form():
    hidden, weight, bias, target = _inputs(lead=(1, 11))
    module = evtfuse.nn.LinearCrossEntropy(reduction="sum", label_smoothing=0.1, softcap=3.0)
    assert "reduction='sum'" in repr(module)
    leaves = _leaves((hidden, weight, bias))
    loss = module(leaves[0], leaves[1], target, bias=leaves[2])
    want, _ = torch_loss(hidden.double(), weight.double(), target, bias.double(), reduction="sum",
                         label_smoothing=0.1, softcap=3.0)
    torch.testing.assert_close(loss.double(), want, **TOL)
    loss.backward()
    assert all(t.grad is not None for t in leaves)
    with pytest.raises(EpilogueError, match="reduction"):
        evtfuse.nn.LinearCrossEntropy(reduction="avg")


def test_double_backward_is_refused():
    hidden, weight, bias, target = _inputs()
    h = hidden.clone().requires_grad_(True)
    loss = evtfuse.linear_cross_entropy(h, weight, target)
    (g,) = torch.autograd.grad(loss, h, create_graph=False)
    assert g.shape == h.shape
    loss = evtfuse.linear_cross_entropy(h, weight, target)
    with pytest.raises(NotImplementedError, match="first-order gradients only"):
        torch.autograd.grad(loss, h, create_graph=True)


# ------------------------------------------------------------------ errors

_H, _W, _B, _Y = _inputs()

BAD = [
    (dict(reduction="avg"), "reduction", 'reduction must be "mean", "sum" or "none"'),
    (dict(label_smoothing=1.5), "label_smoothing", "label_smoothing must be a finite number in"),
    (dict(softcap=0.0), "softcap", "softcap must be a finite number in (0.0, inf)"),
    (dict(z_loss=-1.0), "z_loss", "z_loss must be a finite number in [0.0, inf)"),
    (dict(ignore_index=1.5), "ignore_index", "ignore_index must be an int"),
    (dict(return_lse=1), "return_lse", "return_lse must be True or False"),
    (dict(hidden=_H.double()), "hidden", "the kernels take float16, bfloat16 and float32"),
    (dict(hidden=_H[0]), "hidden", "it must be (tokens, hidden) or (..., hidden)"),
    (dict(weight=_W.T), "weight", "it must be (vocab, 8) (as torch.nn.Linear's weight)"),
    (dict(weight=_W[:0], bias=None), "weight", "the vocabulary must have a class at least"),
    (dict(weight=_W.half()), "weight", "they must have one dtype"),
    (dict(target=_Y.float()), "target", "it must hold class indices, int64 or int32"),
    (dict(target=_Y[:5]), "target", "one class per row of hidden"),
    (dict(bias=_B[:5]), "bias", "one per row of weight"),
    (dict(bias=_B.half()), "bias", "bias is torch.float16 and weight is torch.float32"),
    (dict(target=torch.full((T,), V)), "target", "is out of bounds: a target is a class index"),
]


@pytest.mark.parametrize("change, variable, phrase", BAD, ids=[b[1] + ":" + b[2][:30] for b in BAD])
def test_bad_arguments_raise_errors_naming_them(change, variable, phrase):
    args = dict(hidden=_H, weight=_W, target=_Y, bias=_B)
    args.update(change)
    with pytest.raises(EpilogueError) as exc:
        evtfuse.linear_cross_entropy(args.pop("hidden"), args.pop("weight"), args.pop("target"),
                                     **args)
    assert exc.value.variable == variable
    assert phrase in str(exc.value), str(exc.value)


@pytest.mark.cover("grad")
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no_grad"])
def test_a_bad_target_in_a_later_chunk_raises_and_leaves_no_gradient(reduction, grad):
    """The targets are checked after the chunks are queued (no host sync before them): a
    bad one in the last chunk, past good ones and an ignored one, still raises naming the
    first bad target, and no gradient reaches the leaves."""
    hidden, weight = _H.clone().requires_grad_(grad), _W.clone().requires_grad_(grad)
    target = _Y.clone()
    target[9], target[10] = -3, V + 4
    with pytest.raises(EpilogueError) as exc:
        loss = evtfuse.linear_cross_entropy(hidden, weight, target, reduction=reduction)
        loss.sum().backward()
    assert exc.value.variable == "target"
    assert "target[9] = -3 is out of bounds" in str(exc.value), str(exc.value)
    assert hidden.grad is None and weight.grad is None


# inf * 0 is NaN, as torch's mul gives (what the test checks): numpy says so under the
# interpreter, for the special values put in on purpose
@pytest.mark.filterwarnings("ignore:invalid value encountered in multiply:RuntimeWarning")
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
@pytest.mark.parametrize("g", [1.0, 1.7, 0.3, -2.0, 0.0, float("inf"), float("nan")])
def test_backward_scale_matches_mul(dtype, g):
    """The backward's in-place scaling (``evtfuse::scale_``, a Triton kernel here under the
    interpreter) gives ``x.mul_(g)``'s values exactly, special values of g and x too, and
    leaves x as it was where g is 1; non-contiguous tensors take ``mul_`` itself. 27,000
    elements: 7 blocks over the interpreter's 4 programs, so programs stride past their
    first block and the last block is partial."""
    x = _rand(3, 9000, seed=3).to(dtype)
    x[0, :4] = torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0])
    gt = torch.tensor(g)
    for t in (x, x.t()):
        want = t.clone().mul_(gt)
        got = t.clone() if t.is_contiguous() else t.clone().t().contiguous().t()
        torch.ops.evtfuse.scale_.default(got, gt)
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
