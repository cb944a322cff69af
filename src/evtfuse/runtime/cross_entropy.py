"""Fused linear cross-entropy: the operators behind ``evtfuse.linear_cross_entropy``.

Layer: runtime.torch, beside ``runtime.autograd`` (same ``torch.library`` namespace); its
GEMMs run below autograd (``calls.plain_gemm``). Schemas::

    evtfuse::linear_cross_entropy(Tensor hidden, Tensor weight, Tensor target, Tensor? bias,
        int ignore_index, str reduction, float label_smoothing, float softcap, float z_loss,
        bool[] grads) -> (Tensor loss, Tensor lse, Tensor d_hidden, Tensor d_weight,
        Tensor d_bias)
    evtfuse::linear_cross_entropy_backward(Tensor hidden, Tensor weight, Tensor target,
        Tensor? bias, Tensor? row_grad, Tensor? lse_grad, int ignore_index,
        float label_smoothing, float softcap, float z_loss, bool[] grads)
        -> (Tensor d_hidden, Tensor d_weight, Tensor d_bias)
    evtfuse::scale_(Tensor(a!) x, Tensor g) -> ()    # x *= g, the backward's scaling

``hidden`` is (T, H), ``weight`` (V, H), ``target`` (T,); ``softcap`` 0.0 means none.
Per row of the logits z (``hidden @ weight.T + bias``, then ``softcap * tanh(z / softcap)``)
the kernels reduce ``lse = logsumexp(z)``, ``tgt = z[target]`` and, for label smoothing,
``zs = sum(z)``; a row that is not ignored has the loss ``(1 - ls) * (n - tgt) + ls * (n - zs
/ V) + z_loss * lse ** 2`` (torch's ``cross_entropy`` with ``label_smoothing``, plus PaLM's
z-loss), computed in torch from those (T,)-vectors, where ``n`` is log_softmax's normalizer
(``normalizer``: lse, NaN where it is infinite, as torch's x - max there).

Two epilogues, text built by ``logits_source`` and ``rows_source``: ``lce_logits`` over ``hidden @ weight.T`` reduces
the rows and, when gradients are wanted, stores the logits of a chunk of rows;
``lce_grad``, derived by ``autodiff`` from ``lce_rows`` (the same computation, of stored
logits ``X`` instead of the accumulator), takes the upstream gradients of lse, tgt and zs
per row and writes the gradient of the logits over them in place (and sums the bias's
gradient), over K = 0: no GEMM. Then ``d_hidden[rows] = dlogits @ weight`` and ``d_weight
+= dlogits.T @ hidden[rows]`` are torch matmuls. A chunk holds ``CHUNK_BYTES`` of logits at
most (its rows a multiple of 128 where that many fit), so the whole (T, V) logits or their
gradient never exist at once.

With gradients wanted and reduction "mean" or "sum", the forward computes them (the
loss's upstream gradient is one number, multiplied in by the backward, in place): three
GEMMs in all (logits, dX, dW). With "none" (a gradient per row), a gradient arriving at
lse or fp16 (``precomputes``), the backward recomputes the chunks with that gradient (``linear_cross_entropy_backward``):
one GEMM more, the forward's. Without gradients one ``lce_logits`` call per chunk stores
no logits.
"""

from __future__ import annotations

import functools
import math
import weakref
from typing import Optional

import torch

from .. import autodiff
from ..dag_epilogue import DagEpilogue
from ..errors import EpilogueError
from ..frontend import bind, parse_epilogue
from ..ir import rounding_of
from . import calls
from .device import interpreter_enabled
from .torch_op import _lib

# logits (and then their gradient) of one chunk of rows, at most. 192 MiB (768 rows at a
# vocabulary of 128256 in bf16; 188 MiB beyond the inputs): fewer, larger chunks than 128
# MiB (126 MiB) ran the 8192 x 4096 x 128256 step 2.6-3.8% faster in each of three H200 runs
# (BENCHMARKS.md, "Linear cross-entropy")
CHUNK_BYTES = 192 << 20
TUNE = "fast"  # the evtfuse.gemm calls' tuning ("none": the heuristic's first kernel)

_lib.define("linear_cross_entropy(Tensor hidden, Tensor weight, Tensor target, Tensor? bias, "
            "int ignore_index, str reduction, float label_smoothing, float softcap, "
            "float z_loss, bool[] grads, str? group=None) "
            "-> (Tensor, Tensor, Tensor, Tensor, Tensor)")
_lib.define("linear_cross_entropy_backward(Tensor hidden, Tensor weight, Tensor target, "
            "Tensor? bias, Tensor? row_grad, Tensor? lse_grad, int ignore_index, "
            "float label_smoothing, float softcap, float z_loss, bool[] grads, "
            "str? group=None) -> (Tensor, Tensor, Tensor)")



# ------------------------------------------------------------------ epilogues


def _body(x_from: str, bias: bool, cap: bool, smooth: bool) -> list[str]:
    return [f"    x = {x_from} + bias" if bias else f"    x = {x_from}",
            "    z = cap * tanh(x / cap)" if cap else "    z = x",
            "    lse = logsumexp(z)",
            "    tgt = sum(where(col_index() == y, z, 0.0))",
            *(["    zs = sum(z)"] if smooth else [])]


def _params(first: str, bias: bool, cap: bool) -> str:
    return first + (", bias" if bias else "") + (", cap" if cap else "")


def _returns(smooth: bool) -> str:
    return "    return D, lse, tgt" + (", zs" if smooth else "")


@functools.lru_cache(maxsize=64)
def logits_source(dtype: torch.dtype, bias: bool, cap: bool, smooth: bool) -> str:
    """The epilogue over ``hidden @ weight.T``: the row reductions, and ``D``, the logits
    before bias and softcap in ``dtype`` (stored for a chunk that needs its gradient; the
    reductions see them rounded to ``dtype``, as torch's logits are)."""
    rounding = rounding_of(dtype)
    a = f'cast(accum, "{rounding}")' if rounding else "accum"
    return "\n".join([f"def lce_logits({_params('accum, y', bias, cap)}):", f"    a = {a}",
                      *_body("a", bias, cap, smooth), "    D = a", _returns(smooth)]) + "\n"


def rows_source(bias: bool, cap: bool, smooth: bool) -> str:
    """``lce_logits``'s reductions as a function of stored logits ``X``: what the gradient
    epilogue is derived from."""
    return "\n".join([f"def lce_rows({_params('accum, X, y', bias, cap)}):",
                      *_body("X", bias, cap, smooth), "    D = z", _returns(smooth)]) + "\n"


@functools.lru_cache(maxsize=64)
def grad_epilogue(dtype: torch.dtype, bias: bool, cap: bool, smooth: bool, want_x: bool,
                  want_bias: bool) -> tuple[autodiff.BackwardPlan, DagEpilogue]:
    """The backward of ``lce_rows`` from the gradients of lse, tgt (and zs) to those of X
    (the logits) and the bias: ``autodiff.backward`` of its DAG, bound to placeholder
    sizes, and the epilogue its DAG runs as. Its operands: X, y, bias, cap,
    ``grad_<output>`` per row and ``saved_lse``."""
    parsed = parse_epilogue(rows_source(bias, cap, smooth))

    def meta(shape, dt):
        return torch.empty(shape, dtype=dt, device="meta")

    values = {"X": meta((3, 5), dtype), "y": meta((3, 1), torch.int64), "D": None,
              "lse": meta((3, 1), torch.float32), "tgt": meta((3, 1), torch.float32)}
    if bias:
        values["bias"] = meta((5,), dtype)
    if cap:
        values["cap"] = 1.0
    if smooth:
        values["zs"] = meta((3, 1), torch.float32)
    dag = bind(parsed, values, (1, 3, 5))
    wanted = {n for n, w in (("X", want_x), ("bias", want_bias)) if w}
    plan = autodiff.plan_forward(dag, wanted, parsed)
    graded = {"lse", "tgt", "zs"} if smooth else {"lse", "tgt"}
    bplan = autodiff.backward(plan, graded, wanted, name="lce_grad")
    return bplan, DagEpilogue(bplan.dag)


# ------------------------------------------------------------------ the chunks


def chunk_rows(tokens: int, vocab: int, itemsize: int) -> int:
    """Rows per chunk: ``CHUNK_BYTES`` of logits at most, a multiple of 128 where 128 fit."""
    rows = max(1, CHUNK_BYTES // max(1, vocab * itemsize))
    if rows >= 128:
        rows -= rows % 128
    return max(1, min(rows, tokens))


class _Options:
    """One call's options, read once. ``group``: the process group whose ranks hold the
    vocabulary's shards (``weight`` is this rank's rows, ``start`` the first of them, in
    rank order), or None: ``vocab`` is then the whole vocabulary's size, ``local`` this
    rank's."""

    def __init__(self, hidden, weight, bias, ignore_index, label_smoothing, softcap, z_loss,
                 group: Optional[str] = None):
        self.dtype = hidden.dtype
        self.local = weight.shape[0]
        self.group = None if group is None else _resolve_group(group)
        self.start, self.vocab = (0, self.local) if self.group is None else \
            vocab_shards(self.group, self.local)
        self.bias = bias is not None
        self.ignore = ignore_index
        self.ls = float(label_smoothing)
        self.cap = float(softcap)
        self.zl = float(z_loss)
        self.smooth = self.ls != 0.0

    def operands(self, y, bias) -> dict:
        ops = {"y": y if self.start == 0 else y - self.start}  # this shard's column of y
        if self.bias:
            ops["bias"] = bias
        if self.cap:
            ops["cap"] = self.cap
        return ops


def _stats_out(rows: int, o: _Options, like: torch.Tensor) -> dict:
    out = {n: like.new_empty((rows, 1), dtype=torch.float32) for n in ("lse", "tgt")}
    if o.smooth:
        out["zs"] = like.new_empty((rows, 1), dtype=torch.float32)
    return out


def row_stats(hidden, weight, target, bias, o: _Options) -> dict:
    """lse, tgt (and zs) of every row, (T, 1) fp32: ``lce_logits`` with no logits stored,
    over the same chunks of rows as ``chunked`` (not one call over all rows: a launch plan
    keeps its reductions' workspaces, fp32 per row and tile along the vocabulary, 4 x 32 MiB
    at 8192 x 128256, which would add to a chunk's logits in a later backward)."""
    gemm = calls.plain_gemm  # below autograd, on local tensors

    T = hidden.shape[0]
    stats = _stats_out(T, o, hidden)
    src = logits_source(o.dtype, o.bias, bool(o.cap), o.smooth)
    rows = chunk_rows(T, o.local, hidden.element_size())
    for s in range(0, T, rows):
        e = min(T, s + rows)
        gemm(hidden[s:e], weight.t(), src, D=None, tune=TUNE,
             **o.operands(target[s:e].view(-1, 1), bias), **{n: t[s:e] for n, t in stats.items()})
    combine_shards(stats, o)
    return stats


def chunked(hidden, weight, target, bias, o: _Options, row_w: Optional[torch.Tensor],
            lse_w: Optional[torch.Tensor], grads: tuple) -> tuple:
    """Row statistics (as ``row_stats``) and the gradients of hidden, weight and bias (those
    ``grads`` asks for, else None) of ``sum_i row_w[i] * loss_i + lse_w[i] * lse_i``
    (``row_w``, ``lse_w``: (T, 1) fp32 or None), one chunk of rows at a time."""
    gemm = calls.plain_gemm  # below autograd, on local tensors

    T, V = hidden.shape[0], o.local
    need_h, need_w, need_b = grads
    plan, epilogue = grad_epilogue(o.dtype, o.bias, bool(o.cap), o.smooth, need_h or need_w,
                                   need_b and o.bias)
    stats = _stats_out(T, o, hidden)
    dh = hidden.new_empty(hidden.shape) if need_h else None
    dw = weight.new_zeros(weight.shape) if need_w and T == 0 else (
        weight.new_empty(weight.shape) if need_w else None)
    db = hidden.new_zeros((V,), dtype=torch.float32) if need_b and o.bias else None
    db_part = torch.empty_like(db) if db is not None else None
    rows = chunk_rows(T, V, hidden.element_size())
    # rows padded to 16 bytes, as TMA needs (a vocabulary of 8003 would leave them unaligned)
    align = max(1, 16 // hidden.element_size())
    logits = hidden.new_empty((rows, -(-V // align) * align))[:, :V]
    src = logits_source(o.dtype, o.bias, bool(o.cap), o.smooth)
    grad_names = dict(plan.grads)
    outputs = dict(plan.outputs)
    saved = dict(plan.saved)
    for s in range(0, T, rows):
        e = min(T, s + rows)
        h, y, x = hidden[s:e], target[s:e].view(-1, 1), logits[:e - s]
        part = {n: t[s:e] for n, t in stats.items()}
        ops = o.operands(y, bias)
        gemm(h, weight.t(), src, D=x, tune=TUNE, **ops, **part)
        combine_shards(part, o)  # the whole vocabulary's lse, tgt and zs of these rows
        if plan.empty:
            continue
        coeff = _row_grads(part["lse"], y != o.ignore, None if row_w is None else row_w[s:e],
                           None if lse_w is None else lse_w[s:e], o)
        kw = dict(ops, X=x, D=None, **{grad_names[n]: coeff[n] for n in grad_names})
        kw.update({op: part[name] for name, op in saved.items()})
        if row_w is not None and "lse" in saved:
            # the loss's softmax: NaN over a row whose max is infinite, as torch's (``lse``
            # alone, the gradient of the lse returned, is torch.logsumexp's)
            kw[saved["lse"]] = normalizer(part["lse"])
        if "X" in outputs:
            kw[outputs["X"]] = x  # the gradient of the logits, over them
        if "bias" in outputs:
            kw[outputs["bias"]] = db_part
        # no accumulator: a GEMM over K = 0 runs the epilogue alone
        gemm(h.new_empty((e - s, 0)), h.new_empty((0, V)), epilogue, tune=TUNE, **kw)
        if need_h:
            torch.mm(x, weight, out=dh[s:e])
        if need_w:
            if s == 0:
                torch.mm(x.t(), h, out=dw)
            else:
                dw.addmm_(x.t(), h)
        if db is not None:
            db += db_part
    if dh is not None and o.group is not None:  # each shard's part of the rows' gradient
        torch.distributed.all_reduce(dh, group=o.group)
    return stats, dh, dw, None if db is None else db.to(bias.dtype)


def _resolve_group(name: str):
    import torch.distributed.distributed_c10d as c10d

    return c10d._resolve_process_group(name)


# group -> {local rows: (first row, vocabulary)}: weakly keyed, so a destroyed group is
# neither kept alive (a gloo group living on into interpreter shutdown aborts the process
# there) nor mistaken for a later group that reuses its address
_SHARDS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _all_gather(out: torch.Tensor, part: torch.Tensor, group) -> None:
    """``out`` = every rank's ``part``, in rank order: ``all_gather_single`` where torch has
    it (2.13 deprecates ``all_gather_into_tensor`` for it), else the older name."""
    gather = getattr(torch.distributed, "all_gather_single", None) \
        or torch.distributed.all_gather_into_tensor
    gather(out, part, group=group)


def vocab_shards(group, local: int) -> tuple[int, int]:
    """(this rank's first row of the vocabulary, the whole vocabulary's size) for a weight
    whose ``local`` rows are this rank's shard, the ranks' shards in rank order: one
    all-gather of the shard sizes the first time a group sees a size (kept after), so a
    training step makes no collective of its own for it."""
    known = _SHARDS.setdefault(group, {})
    hit = known.get(local)
    if hit is None:
        n = torch.distributed.get_world_size(group)
        device = "cuda" if torch.distributed.get_backend(group) == "nccl" else "cpu"
        sizes = torch.zeros(n, dtype=torch.int64, device=device)
        _all_gather(sizes, torch.tensor([local], dtype=torch.int64, device=device), group)
        sizes = sizes.tolist()
        rank = torch.distributed.get_rank(group)
        hit = known[local] = (sum(sizes[:rank]), sum(sizes))
    return hit


def combine_shards(stats: dict, o: _Options) -> None:
    """The whole vocabulary's row statistics from each rank's, in place: lse by
    logsumexp over the ranks (the max, one all-reduce, then the sum of exp(lse - max),
    another), tgt (the target's logit lies in one shard, 0 in the others) and zs by sums.
    A row whose largest lse is infinite keeps it (torch.logsumexp's: +inf for a row holding
    +inf, -inf for a row of -inf; NaN stays NaN)."""
    if o.group is None:
        return
    dist = torch.distributed
    lse = stats["lse"]
    top = lse.clone()
    dist.all_reduce(top, op=dist.ReduceOp.MAX, group=o.group)
    finite = torch.where(top.abs() == math.inf, 0.0, top)
    extra = [n for n in ("tgt", "zs") if n in stats]
    sums = torch.cat([torch.exp(lse - finite), torch.isnan(lse).to(lse.dtype)]
                     + [stats[n] for n in extra], dim=1)
    dist.all_reduce(sums, group=o.group)
    whole = torch.where(top.abs() == math.inf, top, finite + torch.log(sums[:, :1]))
    lse.copy_(torch.where(sums[:, 1:2] > 0, math.nan, whole))  # a NaN in any shard
    for k, n in enumerate(extra):
        stats[n].copy_(sums[:, k + 2:k + 3])


def _row_grads(lse, valid, row_w, lse_w, o: _Options) -> dict:
    """The upstream gradients of lse, tgt and zs of a chunk's rows, (rows, 1) fp32: a row's
    loss (``row_losses``) weighted by ``row_w`` where the row
    is not ignored, plus ``lse_w`` (the gradient of the lse returned). Without ``row_w``
    (the loss unused) the loss's terms are left out, not weighted by 0: 0 * lse ** 2's
    gradient would be NaN over a row whose lse is infinite."""
    if row_w is None:
        w = torch.zeros_like(lse)
        g_lse = w
    else:
        w = torch.where(valid, row_w, 0.0)
        g_lse = w * (1.0 + (2.0 * o.zl) * lse) if o.zl else w
    if lse_w is not None:
        g_lse = g_lse + lse_w
    out = {"lse": g_lse.contiguous(), "tgt": (w * -(1.0 - o.ls)).contiguous()}
    if o.smooth:
        out["zs"] = (w * -(o.ls / o.vocab)).contiguous()
    return out


def normalizer(lse: torch.Tensor) -> torch.Tensor:
    """log_softmax's normalizer of each row: its logsumexp where that is finite, NaN where
    it is +-inf. ``lse`` follows torch.logsumexp (+inf for a row holding +inf, -inf for a
    row of -inf), but torch's log_softmax, which cross_entropy reads, subtracts the row's
    max before its exp, and x - max is NaN when the max is infinite: such a row's loss is
    NaN, and so is its whole gradient (softmax NaN), weighted by zero or ignored included.
    lse is infinite exactly then: its sum of exp(x - max) lies in [1, V]."""
    return torch.where(lse.abs() == math.inf, math.nan, lse)


def row_losses(stats: dict, valid: torch.Tensor, o: _Options) -> torch.Tensor:
    """Each row's loss, (T,) fp32, 0 where ignored: as torch's cross_entropy forms it,
    ``(1 - ls) * nll + ls * smooth`` of -log_softmax at the target (``nll``) and its mean
    over the classes (``smooth``), so that special values give torch's (a 0 * inf where
    ``ls`` is 1 and a target's logit -inf is NaN, as torch's)."""
    lse, tgt = stats["lse"][:, 0], stats["tgt"][:, 0]
    norm = normalizer(lse)
    loss = norm - tgt
    if o.smooth:
        loss = (1.0 - o.ls) * loss + o.ls * (norm - stats["zs"][:, 0] / o.vocab)
    if o.zl:
        loss = loss + o.zl * lse * lse
    return torch.where(valid, loss, 0.0)


class TargetCheck:
    """Whether every target is a class (0 <= t < vocab) or ``ignore_index``, found without
    draining the GPU's queue: made before the forward queues its chunks, it queues the
    comparison, a copy of its answer to pinned host memory and an event; ``raise_if_bad``,
    called once the chunks are queued, waits for that event only (the GPU has passed the
    comparison; the chunks behind it keep running) and raises an error naming the first bad
    target. A sync before the chunks left the GPU idle while the host then queued the first
    one; one after them, while the host ran the backward (0.45 and 0.6 ms of a 44 ms step on
    an H200). The kernels compare targets with column indices and index nothing with them,
    so a bad target reads no memory out of bounds meanwhile. Inside a CUDA graph capture:
    an asynchronous device assert instead; on the CPU, a plain check."""

    def __init__(self, target: torch.Tensor, vocab: int, ignore_index: int):
        self.target, self.vocab, self.ignore = target, vocab, ignore_index
        self.bad = (target != ignore_index) & ((target < 0) | (target >= vocab))
        self.event = self.flag = None
        if target.is_cuda and torch.cuda.is_current_stream_capturing():
            torch._assert_async(~self.bad.any())
            self.bad = None
        elif target.is_cuda:
            self.flag = torch.empty((), dtype=torch.bool, pin_memory=True)
            self.flag.copy_(self.bad.any(), non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()

    def raise_if_bad(self) -> None:
        if self.bad is None:  # captured: the device assert checks
            return
        if self.event is not None:
            self.event.synchronize()
            found = bool(self.flag)
        else:
            found = bool(self.bad.any())
        if found:
            i = int(self.bad.nonzero()[0, 0])
            raise EpilogueError(f"target[{i}] = {int(self.target[i])} is out of bounds: a "
                                f"target is a class index in [0, {self.vocab}) (the rows of "
                                f"weight) or ignore_index = {self.ignore}", variable="target")


# ------------------------------------------------------------------ the operators


def precomputes(dtype: torch.dtype, reduction: str, grads) -> bool:
    """Whether the forward computes the gradients: for "mean" and "sum" (one upstream number,
    multiplied in by the backward) unless fp16, whose logits' gradient before that number
    (under a loss scaler, the number that keeps it above fp16's smallest values:
    p / tokens is often below them) would flush to zero: fp16 recomputes in the backward,
    as "none" does."""
    return any(grads) and reduction != "none" and dtype != torch.float16


def _empty(like: torch.Tensor) -> torch.Tensor:
    return like.new_empty((0,))


def _forward(hidden, weight, target, bias, ignore_index, reduction, label_smoothing, softcap,
             z_loss, grads, group=None):
    o = _Options(hidden, weight, bias, ignore_index, label_smoothing, softcap, z_loss, group)
    hidden, weight = hidden.contiguous(), weight.contiguous()
    target = target.contiguous()
    with torch.no_grad():
        check = TargetCheck(target, o.vocab, ignore_index)  # raises once the chunks are queued
        valid = target != ignore_index
        grads = tuple(bool(g) for g in grads)
        if precomputes(hidden.dtype, reduction, grads):
            row_w = valid.to(torch.float32).view(-1, 1)
            if reduction == "mean":
                row_w = row_w / valid.sum()
            stats, dh, dw, db = chunked(hidden, weight, target, bias, o, row_w, None, grads)
        else:
            stats, dh, dw, db = row_stats(hidden, weight, target, bias, o), None, None, None
        loss = row_losses(stats, valid, o)
        if reduction == "sum":
            loss = loss.sum()
        elif reduction == "mean":
            loss = loss.sum() / valid.sum()
        check.raise_if_bad()  # before any result is returned
    return (loss, stats["lse"].view(-1), _empty(hidden) if dh is None else dh,
            _empty(weight) if dw is None else dw, _empty(weight) if db is None else db)


def _forward_fake(hidden, weight, target, bias, ignore_index, reduction, label_smoothing,
                  softcap, z_loss, grads, group=None):
    T = hidden.shape[0]
    need = precomputes(hidden.dtype, reduction, grads)
    f32 = torch.float32
    loss = hidden.new_empty((T,) if reduction == "none" else (), dtype=f32)
    dh = hidden.new_empty(hidden.shape) if need and grads[0] else _empty(hidden)
    dw = weight.new_empty(weight.shape) if need and grads[1] else _empty(weight)
    db = bias.new_empty(bias.shape) if need and bias is not None and grads[2] else _empty(weight)
    return loss, hidden.new_empty((T,), dtype=f32), dh, dw, db


def _backward_op(hidden, weight, target, bias, row_grad, lse_grad, ignore_index,
                 label_smoothing, softcap, z_loss, grads, group=None):
    o = _Options(hidden, weight, bias, ignore_index, label_smoothing, softcap, z_loss, group)
    hidden, weight, target = hidden.contiguous(), weight.contiguous(), target.contiguous()
    grads = tuple(bool(g) for g in grads)

    def col(g):
        return None if g is None else g.to(torch.float32).reshape(-1, 1).contiguous()

    with torch.no_grad():
        _, dh, dw, db = chunked(hidden, weight, target, bias, o, col(row_grad), col(lse_grad),
                                grads)
    return (_empty(hidden) if dh is None else dh, _empty(weight) if dw is None else dw,
            _empty(weight) if db is None else db)


def _backward_op_fake(hidden, weight, target, bias, row_grad, lse_grad, ignore_index,
                      label_smoothing, softcap, z_loss, grads, group=None):
    return (hidden.new_empty(hidden.shape) if grads[0] else _empty(hidden),
            weight.new_empty(weight.shape) if grads[1] else _empty(weight),
            bias.new_empty(bias.shape) if bias is not None and grads[2] else _empty(weight))


_lib.impl("linear_cross_entropy", _forward, "CompositeExplicitAutograd")
torch.library.register_fake("evtfuse::linear_cross_entropy", _forward_fake, lib=_lib)
_lib.impl("linear_cross_entropy_backward", _backward_op, "CompositeExplicitAutograd")
torch.library.register_fake("evtfuse::linear_cross_entropy_backward", _backward_op_fake,
                            lib=_lib)


def _scale_impl(x: torch.Tensor, g: torch.Tensor) -> None:
    """``x *= g`` in place: ``backends.triton.scale``'s kernel where it applies (on the
    GPU, or on the CPU under Triton's interpreter), else ``x.mul_(g)``. Either way x's
    version counter moves, as an in-place torch op's does: a second backward through the
    graph that saved x then fails clearly instead of scaling twice."""
    from ..backends.triton import scale  # here: importing evtfuse imports no Triton

    if scale.applies(x, g) and (x.is_cuda or interpreter_enabled()):
        scale.scale_(x, g)
        torch.autograd.graph.increment_version(x)
    else:
        x.mul_(g)


_lib.define("scale_(Tensor(a!) x, Tensor g) -> ()")
_lib.impl("scale_", _scale_impl, "CompositeExplicitAutograd")
torch.library.register_fake("evtfuse::scale_", lambda x, g: None, lib=_lib)


def _setup_context(ctx, inputs, output) -> None:
    (hidden, weight, target, bias, ignore_index, reduction, ls, softcap, z_loss, grads,
     *group) = inputs
    _, _, dh, dw, db = output
    ctx.save_for_backward(hidden, weight, target, bias, dh, dw, db)
    ctx.options = (ignore_index, reduction, ls, softcap, z_loss)
    ctx.group = group[0] if group else None
    ctx.precomputed = precomputes(hidden.dtype, reduction, grads)
    ctx.set_materialize_grads(False)


def _backward(ctx, g_loss, g_lse, *unused):
    if torch.is_grad_enabled():  # create_graph=True: this backward would itself be recorded
        raise NotImplementedError(
            "evtfuse.linear_cross_entropy computes first-order gradients only: a gradient of "
            "its backward (autograd.grad(..., create_graph=True), then a second backward) is "
            "not supported")
    ignore_index, reduction, ls, softcap, z_loss = ctx.options
    try:
        hidden, weight, target, bias, dh, dw, db = ctx.saved_tensors
    except RuntimeError as exc:
        if "is output" not in str(exc):  # an input changed in place: torch's own message
            raise
        raise RuntimeError(
            f'evtfuse.linear_cross_entropy with reduction="{reduction}" computes its '
            "gradients in the forward and its backward scales them in place, so the backward "
            "runs once: a second backward through the same graph (retain_graph=True, "
            "gradcheck) is not supported; for that, use reduction=\"none\" (whose backward "
            "recomputes) and reduce the rows yourself") from exc
    need = (ctx.needs_input_grad[0], ctx.needs_input_grad[1],
            bias is not None and ctx.needs_input_grad[3])
    got = [None, None, None]
    row_grad = None
    # the forward computed them: scale. Not with a gradient at the lse too: the logits'
    # gradients of both must be summed before the matmuls, as torch's autograd sums them (an
    # inf in weight times a 0 of one and a finite value of the other is +-inf, not NaN)
    if g_loss is not None and ctx.precomputed and g_lse is None:
        for k, t in enumerate((dh, dw, db)):
            if need[k]:
                torch.ops.evtfuse.scale_.default(t, g_loss)  # in place: no copy of d_weight
                got[k] = t
    elif g_loss is not None:  # recompute with the upstream gradient of each row
        row_grad = g_loss
        if reduction != "none":
            n = (target != ignore_index).sum() if reduction == "mean" else 1
            row_grad = (g_loss / n).expand(target.shape[0])
    if (row_grad is not None or g_lse is not None) and any(need):
        more = torch.ops.evtfuse.linear_cross_entropy_backward.default(
            hidden, weight, target, bias, row_grad, g_lse, ignore_index, ls, softcap, z_loss,
            list(need), ctx.group)
        got = [m if g is None else g + m for g, m in zip(got, more)]
        got = [g if n else None for g, n in zip(got, need)]
    return got[0], got[1], None, got[2], None, None, None, None, None, None, None


torch.library.register_autograd("evtfuse::linear_cross_entropy", _backward,
                                setup_context=_setup_context, lib=_lib)


__all__ = ["CHUNK_BYTES", "chunk_rows", "logits_source", "rows_source", "grad_epilogue",
           "row_stats", "chunked", "row_losses", "TargetCheck"]
