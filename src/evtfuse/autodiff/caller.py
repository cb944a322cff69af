"""What the caller of a backward computes in torch around it (``runtime.autograd``).

Layer: passes (core: ``derivative`` and the op table; torch tensors, no kernel). The shape
of an output evtfuse stores for a kind (``output_shape``) and the dims it reduces
(``reduced_dims``), the gradient of a max's or min's saved argument (``injected_gradient``:
the row's rule in torch, where the ties can be counted) and the value of a backward's
``first_batch`` operand.
"""

from __future__ import annotations

import torch

from ..derivative import Diff, apply_rule
from ..ir import OutputKind
from ..optable import OPS, TorchAlgebra
from .plans import Injected


def output_shape(kind: OutputKind, batched: bool, problem: tuple) -> tuple:
    """The shape of an output evtfuse stores for this kind (a hidden output's, a gradient's)."""
    L, M, N = problem
    lead = (L,) if batched else ()
    return {OutputKind.FULL: (*lead, M, N), OutputKind.ROW: (*lead, M, 1),
            OutputKind.COL: (L, 1, N) if batched else (N,),
            OutputKind.SCALAR: (L, 1, 1) if batched else (1,)}[kind]


def reduced_dims(kind: OutputKind, batched: bool) -> tuple[int, ...]:
    """The dims of (L, M, N) an output of this kind reduces (as the reference evaluator)."""
    dims = [] if batched else [0]
    if kind in (OutputKind.COL, OutputKind.SCALAR):
        dims.append(1)
    if kind in (OutputKind.ROW, OutputKind.SCALAR):
        dims.append(2)
    return tuple(dims)


def injected_gradient(inj: Injected, saved: torch.Tensor, grad: torch.Tensor,
                      problem: tuple[int, int, int]) -> torch.Tensor:
    """The gradient of a max's or min's saved argument (shaped as ``saved``) from the
    gradient ``grad`` of its result (shaped as the output): the reduction row's rule on the
    argument broadcast to (L, M, N), with its ties counted, summed back to its shape."""
    L, M, N = problem
    shape3 = (1,) * (3 - saved.dim()) + tuple(saved.shape)
    dtype = torch.promote_types(saved.dtype, torch.float32)
    x = saved.reshape(shape3).to(dtype).expand(L, M, N)
    row = OPS[inj.op]
    dims = reduced_dims(inj.kind, inj.batched)
    out = row.torch_fn(x, dims)
    ties = (x == out).sum(dim=dims, keepdim=True).to(x.dtype)
    g = grad.to(x.dtype).reshape(out.shape)
    d = Diff(TorchAlgebra(like=x), (x,), g.expand(L, M, N), {},
             out=lambda: out.expand(L, M, N), ties=lambda: ties.expand(L, M, N))
    (dx,) = apply_rule(row.grad, d)
    return dx.expand(L, M, N).sum_to_size(shape3).reshape(saved.shape)


def first_batch(batches, device) -> torch.Tensor:
    """The value of a backward's ``first_batch`` operand: (L, 1, 1), 1.0 at batch 0."""
    return (torch.arange(batches, device=device) == 0).to(torch.float32).reshape(-1, 1, 1)
