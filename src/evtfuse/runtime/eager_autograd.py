"""The differentiable operators in eager mode: one plain ``torch.autograd.Function`` each.

Layer: runtime.ops (imports nothing of evtfuse), below ``runtime.autograd`` and
``runtime.grouped_autograd``, which make one ``EagerFunctional`` per operator from the
autograd formula they register with ``torch.library.register_autograd`` (their
``setup_context`` and ``backward``): one formula, read by both paths.

Why: ``register_autograd`` wraps an operator that takes lists of tensors in an autograd
Function that flattens and unflattens its arguments, results, needs and gradients with
``torch.utils._pytree`` on every call, in the forward and in the backward: about a fifth
of an ``evtfuse.nn.Linear`` training step's host time (``scripts/host_keys_cpu.py
--training``). Outside torch.compile evtfuse calls the operator through ``apply`` instead:
the Function takes the call's tensors as flat arguments (A, B, a grouped GEMM's offs, then
the operands) and the rest as one constant; its forward runs the same operator below
autograd (the dispatcher still picks its eager, meta or fake implementation, so meta
tensors and ``FakeTensorMode`` work as before) and keeps what the registered
``setup_context`` keeps; its backward calls the registered ``backward`` with the needs in
the nested form it reads and flattens its gradients. Under torch.compile the operator is
called as it is (Dynamo and AOTAutograd trace the operator and its registered formula).
"""

from __future__ import annotations

from typing import Callable

import torch


class EagerFunctional(torch.autograd.Function):
    """Base of the per-operator Functions ``eager_function`` makes (their class attributes:
    ``op``, the operator's overload; ``first``, how many tensors precede its ``epilogue``
    argument; ``setup``, ``formula``: its registered ``setup_context`` and ``backward``)."""

    op: Callable
    first: int
    setup: Callable
    formula: Callable

    @staticmethod
    def forward(ctx, cls, constants: tuple, *flat):
        epilogue, layout, scalars, outs = constants
        inputs = (*flat[:cls.first], epilogue, layout, list(flat[cls.first:]), scalars, outs)
        with torch._C._AutoDispatchBelowAutograd():  # the operator's implementation itself
            output = cls.op(*inputs)
        cls.setup(ctx, inputs, output)
        ctx.cls = cls
        return tuple(output)

    @staticmethod
    def backward(ctx, *grads):
        cls = ctx.cls
        own = ctx.needs_input_grad
        needs = own[2:]  # after cls and constants
        # the needs as the formula reads them: (*first, epilogue, layout, [tensors], scalars,
        # outs), restored after it (a graph kept with retain_graph runs backward again);
        # the gradients it returns in that form, flattened back
        ctx.needs_input_grad = (*needs[:cls.first], False, False, list(needs[cls.first:]),
                                False, False)
        try:
            result = cls.formula(ctx, list(grads))  # the operator returns one list of tensors
        finally:
            ctx.needs_input_grad = own
        tgrads = result[cls.first + 2]
        return (None, None, *result[:cls.first], *tgrads)


def eager_function(name: str, op: Callable, first: int, setup: Callable,
                   formula: Callable) -> type:
    """An ``EagerFunctional`` for the operator ``op`` (its grad_fn is named
    ``evtfuse_<name>Backward``, as the operator's own would name it)."""
    return type(f"evtfuse_{name}", (EagerFunctional,),
                {"op": staticmethod(op), "first": first, "setup": staticmethod(setup),
                 "formula": staticmethod(formula)})


def apply(cls: type, first: tuple, epilogue: str, layout: str, tensors: list, scalars: list,
          outs: list) -> tuple:
    """The results of the operator ``cls`` wraps, differentiable (``first``: A, B and a
    grouped GEMM's offs; the rest its arguments as the operator takes them)."""
    return cls.apply(cls, (epilogue, layout, scalars, outs), *first, *tensors)


__all__ = ["EagerFunctional", "eager_function", "apply"]
