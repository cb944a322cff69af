"""Losses fused into the GEMM that feeds them: ``evtfuse.linear_cross_entropy``.

Layer: library, above the runtime. ``linear_cross_entropy`` checks its arguments (errors
naming the argument, docs/errors.md) and calls one operator,
``torch.ops.evtfuse.linear_cross_entropy`` (``runtime.cross_entropy``), whose autograd
formula gives the gradients of hidden, weight and bias: torch.compile traces it without a
graph break. The (tokens, vocab) logits and their gradient never exist whole.
"""

from __future__ import annotations

import math
import numbers

import torch

from .errors import EpilogueError
from .runtime import cross_entropy as _ops  # noqa: F401  (defines the operators)
from .runtime.device import is_dtensor

REDUCTIONS = ("mean", "sum", "none")
_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
_TARGETS = (torch.int64, torch.int32)


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, *,
                         bias: torch.Tensor | None = None, ignore_index: int = -100,
                         reduction: str = "mean", label_smoothing: float = 0.0,
                         softcap: float | None = None, z_loss: float = 0.0,
                         return_lse: bool = False, process_group=None):
    """``torch.nn.functional.cross_entropy(logits.float(), target, ignore_index=,
    reduction=, label_smoothing=)`` of ``logits = hidden @ weight.T + bias`` (then
    ``softcap * tanh(logits / softcap)`` when ``softcap`` is given), plus ``z_loss *
    lse ** 2`` per row that is not ignored (PaLM's z-loss, as Liger-Kernel's
    ``lse_square_scale``; "mean" divides it by the same count), without the logits in memory.

    ``hidden``: (tokens, H) or (..., H), fp16 / bf16 / fp32; ``weight``: (vocab, H) as
    ``torch.nn.Linear`` keeps it, same dtype; ``target``: ``hidden.shape[:-1]`` (or flat),
    int64 or int32 class indices, ``ignore_index`` for rows without a loss; ``bias``:
    (vocab,). ``reduction``: "mean" (over rows not ignored; nan when all are, as torch),
    "sum", or "none" (the loss per row, 0 where ignored, shaped as ``target``). Returns the
    loss, fp32; with ``return_lse``, ``(loss, lse)``, the logsumexp of each row's
    (soft-capped) logits, fp32, shaped as ``target`` (differentiable too).

    ``process_group`` (a ``torch.distributed`` group): the vocabulary is sharded over its
    ranks (vocab parallel): ``weight`` (and ``bias``) hold this rank's rows, the ranks'
    shards one after the other in rank order, and ``hidden`` and ``target`` are the same on
    every rank; each rank computes its shard's logits, the row statistics are combined by
    two all-reduces of (tokens, 3) floats per chunk of rows, the logits are never gathered,
    and the loss, the lse and the gradient of hidden (all-reduced) are the whole
    vocabulary's on every rank, the weight's and bias's gradients this rank's shard's
    (docs/distributed.md). A ``DTensor`` weight sharded over the vocabulary (``Shard(0)``
    on a 1-D mesh) is the same, its mesh's group the process group.

    Differentiable with respect to hidden, weight and bias (docs/pytorch.md, "Linear
    cross-entropy"): for "mean" and "sum" the forward already computes the gradients,
    chunk by chunk of rows (the backward scales them by the upstream gradient, in place);
    for "none" and fp16 the backward recomputes the chunks. Under torch.compile the same
    operator runs: the same kernels, the same memory.
    """
    hidden, weight, target, bias, process_group = _local(hidden, weight, target, bias,
                                                         process_group)
    check_arguments(hidden, weight, target, bias, ignore_index, reduction, label_smoothing,
                    softcap, z_loss, return_lse)
    group = None if process_group is None else _group_name(process_group)
    flat = hidden.reshape(-1, hidden.shape[-1])
    # the gradients the forward computes ("mean", "sum"; runtime.cross_entropy.precomputes),
    # under torch.compile too: there the backward's scaling (evtfuse::scale_,
    # functionalized) runs in the saved gradients' memory after Inductor copies each onto
    # itself (it does not reinplace a mutation of a saved tensor; test
    # test_compiled_backward_scales_in_place reads the code it generates)
    grad = torch.is_grad_enabled()
    grads = [grad and hidden.requires_grad, grad and weight.requires_grad,
             grad and bias is not None and bias.requires_grad]
    loss, lse, *_ = torch.ops.evtfuse.linear_cross_entropy.default(
        flat, weight, target.reshape(-1), bias, int(ignore_index), reduction,
        float(label_smoothing), 0.0 if softcap is None else float(softcap), float(z_loss),
        grads, group)
    if reduction == "none":
        loss = loss.reshape(target.shape)
    return (loss, lse.reshape(target.shape)) if return_lse else loss


def _local(hidden, weight, target, bias, process_group):
    """A ``DTensor`` weight sharded over the vocabulary (``Shard(0)`` on a 1-D mesh, as
    ``ColwiseParallel`` shards an LM head) and replicated hidden, target and bias-or-shard:
    their local tensors (``to_local``, through which the gradients flow back as DTensors)
    and the mesh's group as ``process_group``; a replicated DTensor weight beside hidden
    and target split over the rows: the DTensors as they are (the operator's sharding
    rules place them); plain tensors as they are."""
    if not any(is_dtensor(t) for t in (weight, hidden, target, bias)):
        return hidden, weight, target, bias, process_group
    from torch.distributed.tensor import DTensor, Replicate, Shard

    if not isinstance(weight, DTensor):
        for name, t in (("hidden", hidden), ("target", target), ("bias", bias)):
            if isinstance(t, DTensor):
                raise EpilogueError(f"linear_cross_entropy: {name} is a DTensor and weight is "
                                    "not: pass weight as a DTensor sharded over the vocabulary "
                                    "(Shard(0)), or local tensors and process_group=",
                                    variable=name)
        return hidden, weight, target, bias, process_group
    mesh, placements = weight.device_mesh, tuple(weight.placements)
    if mesh.ndim != 1 or placements not in ((Shard(0),), (Replicate(),)):
        raise EpilogueError(f"linear_cross_entropy: weight is a DTensor placed {placements} on "
                            f"a {mesh.ndim}-D mesh; evtfuse takes one sharded over the "
                            "vocabulary, Shard(0), or replicated, on a 1-D mesh",
                            variable="weight")
    sharded = placements == (Shard(0),)
    if not sharded and any(isinstance(t, DTensor) and tuple(t.placements) != (Replicate(),)
                           for t in (hidden, target, bias)):
        # a replicated weight beside split rows: the operator on the DTensors, through its
        # sharding rules (runtime.sharding: each rank its rows for reduction="none", the
        # rows gathered for "mean" and "sum")
        if process_group is not None:
            raise EpilogueError("linear_cross_entropy: weight is a replicated DTensor: leave "
                                "process_group out", variable="process_group")
        for name, t in (("hidden", hidden), ("target", target), ("bias", bias)):
            if t is not None and not isinstance(t, DTensor):
                raise EpilogueError(f"linear_cross_entropy: the rows are split (a DTensor "
                                    f"argument is placed other than Replicate()) and {name} "
                                    "is not a DTensor: pass it as one on the weight's mesh",
                                    variable=name)
        return hidden, weight, target, bias, None
    if sharded and process_group is not None:
        raise EpilogueError("linear_cross_entropy: weight is a DTensor sharded over the "
                            "vocabulary, which names its group: leave process_group out",
                            variable="process_group")

    def local(name, t, want):
        if not isinstance(t, DTensor):
            return t
        if tuple(t.placements) != want:
            raise EpilogueError(f"linear_cross_entropy: {name} is a DTensor placed "
                                f"{tuple(t.placements)}; it must be {want} beside a weight "
                                f"placed {placements}", variable=name)
        return t.to_local()

    return (local("hidden", hidden, (Replicate(),)), weight.to_local(),
            local("target", target, (Replicate(),)), local("bias", bias, placements),
            mesh.get_group() if sharded else process_group)


def _group_name(group) -> str:
    """The registered name of a ``torch.distributed`` process group (what the operator
    takes: a group object cannot cross a ``torch.library`` schema)."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        raise EpilogueError("linear_cross_entropy: process_group is given but "
                            "torch.distributed is not initialized "
                            "(torch.distributed.init_process_group first)",
                            variable="process_group")
    name = getattr(group, "group_name", None)
    if not isinstance(name, str):
        raise EpilogueError(f"linear_cross_entropy: process_group must be a "
                            f"torch.distributed ProcessGroup, not {type(group).__name__}",
                            variable="process_group")
    return name


def _number(name: str, value, low: float, high: float = math.inf, low_open: bool = False):
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) \
        and (value > low if low_open else value >= low) and value <= high \
        and value < math.inf  # no math.isfinite: torch.compile cannot trace it
    if not ok:
        span = f"({low}, inf)" if low_open and high == math.inf else (
            f"[{low}, {high}]" if high != math.inf else f"[{low}, inf)")
        raise EpilogueError(f"linear_cross_entropy: {name} must be a finite number in {span}, "
                            f"not {value!r}", variable=name)


def check_arguments(hidden, weight, target, bias, ignore_index, reduction, label_smoothing,
                    softcap, z_loss, return_lse) -> None:
    """The arguments' errors, each naming its argument."""
    def fail(name: str, text: str):
        raise EpilogueError(f"linear_cross_entropy: {text}", variable=name)

    for name, t in (("hidden", hidden), ("weight", weight), ("target", target)):
        if not isinstance(t, torch.Tensor):
            fail(name, f"{name} must be a torch.Tensor, not {type(t).__name__}")
    if reduction not in REDUCTIONS:
        fail("reduction", f'reduction must be "mean", "sum" or "none", not {reduction!r}')
    _number("label_smoothing", label_smoothing, 0.0, 1.0)
    if softcap is not None:
        _number("softcap", softcap, 0.0, low_open=True)
    _number("z_loss", z_loss, 0.0)
    if not isinstance(ignore_index, numbers.Integral) or isinstance(ignore_index, bool):
        fail("ignore_index", f"ignore_index must be an int, not {ignore_index!r}")
    if not isinstance(return_lse, bool):
        fail("return_lse", f"return_lse must be True or False, not {return_lse!r}")
    if hidden.dtype not in _FLOATS:
        fail("hidden", f"hidden has dtype {hidden.dtype}; the kernels take float16, bfloat16 "
                       "and float32")
    if hidden.dim() < 2:
        fail("hidden", f"hidden has shape {tuple(hidden.shape)}; it must be (tokens, hidden) "
                       "or (..., hidden)")
    H = hidden.shape[-1]
    if weight.dim() != 2 or weight.shape[1] != H:
        fail("weight", f"weight has shape {tuple(weight.shape)}; it must be (vocab, {H}) "
                       f"(as torch.nn.Linear's weight) for hidden of shape "
                       f"{tuple(hidden.shape)}")
    if weight.shape[0] == 0:
        fail("weight", "weight has no rows: the vocabulary must have a class at least")
    if weight.dtype != hidden.dtype:
        fail("weight", f"weight is {weight.dtype} and hidden is {hidden.dtype}; they must "
                       "have one dtype")
    lead = tuple(hidden.shape[:-1])
    if target.dtype not in _TARGETS:
        fail("target", f"target has dtype {target.dtype}; it must hold class indices, int64 "
                       "or int32 (class probabilities are not supported)")
    if tuple(target.shape) not in (lead, (math.prod(lead),)):
        fail("target", f"target has shape {tuple(target.shape)}; it must be {lead} (one "
                       "class per row of hidden)")
    if bias is not None:
        if not isinstance(bias, torch.Tensor):
            fail("bias", f"bias must be a torch.Tensor or None, not {type(bias).__name__}")
        if tuple(bias.shape) != (weight.shape[0],):
            fail("bias", f"bias has shape {tuple(bias.shape)}; it must be "
                         f"({weight.shape[0]},), one per row of weight")
        if bias.dtype != weight.dtype:
            fail("bias", f"bias is {bias.dtype} and weight is {weight.dtype}; they must have "
                         "one dtype")
    for name, t in (("weight", weight), ("target", target), ("bias", bias)):
        if t is not None and t.device != hidden.device:
            fail(name, f"{name} is on {t.device} and hidden on {hidden.device}")


__all__ = ["linear_cross_entropy", "check_arguments", "REDUCTIONS"]
