"""User-facing epilogue functions (layer: frontend).

``from evtfuse.ops import relu, gelu, sum`` lets an epilogue written for evtfuse run in
plain torch too (``import *`` takes every name but those of Python's builtins, ``sum``,
``max``, ``min``, ``abs``, ``round``, which it leaves alone: ``BUILTIN_NAMES``): each name
here applies its row of the op table (``evtfuse.optable``), so the eager meaning and the
fused meaning are the same text. Inside an epilogue the
frontend recognises these names by the AST; it never calls these functions.

Reductions in plain torch: ``sum``/``max``/``min`` reduce over every element unless
``dim`` is given (in a fused epilogue the output's shape picks the axes); ``max(a, b)`` and
``min(a, b)`` with two values are elementwise, as in an epilogue (``dim`` is keyword-only).
Parameters are numbers, or a name from a fixed set: ``cast(x, "fp16")`` (also
``cast(x, torch.float16)``) rounds x as a kernel would and keeps x's dtype.
"""

from __future__ import annotations

import builtins

import torch

from .optable import CALLABLE, Category, OpDef, ParamValue, torch_apply

# ``from evtfuse.ops import *`` leaves Python's own sum, max, min, abs, round alone (shadowing
# them would change code around the epilogue); import those by name
# (``from evtfuse.ops import sum``) or write ``ops.sum``
BUILTIN_NAMES = frozenset(n for n in CALLABLE if hasattr(builtins, n))
__all__ = sorted(set(CALLABLE) - BUILTIN_NAMES)


def _as_tensor(x):
    return x if isinstance(x, torch.Tensor) else torch.tensor(float(x))


def _param(op: OpDef, name: str, value) -> ParamValue:
    """A number, or for a Choice one of its names (``"fp16"``, ``"half"``, ``torch.float16``)."""
    choice = op.choice(name)
    if choice is None:
        return float(value)
    spelling = str(value).removeprefix("torch.") if isinstance(value, torch.dtype) else value
    canonical = choice.canonical(spelling) if isinstance(spelling, str) else None
    if canonical is None:
        got = f'"{value}"' if isinstance(value, str) else repr(value)
        raise ValueError(op.param_error(name, got))
    return canonical


def _make(op: OpDef):
    param_names = [p for p, _ in op.params]

    def fn(*args, **kwargs):
        tensors = list(args[: op.arity])
        extra = list(args[op.arity:])
        if len(tensors) != op.arity:
            raise TypeError(f"{op.name}() takes {op.arity} tensor argument(s), got {len(tensors)}")
        params: dict[str, ParamValue] = op.defaults
        for name, value in zip(param_names, extra):
            params[name] = _param(op, name, value)
        for name, value in kwargs.items():
            if name not in param_names:
                raise TypeError(f"{op.name}() got an unexpected keyword argument '{name}'")
            params[name] = _param(op, name, value)
        for name in op.required:
            if name not in params:
                raise TypeError(op.param_error(name))
        return torch_apply(op, [_as_tensor(t) for t in tensors], params)

    fn.__name__ = op.name
    fn.__doc__ = op.doc
    return fn


_NO_OTHER = object()


def _make_reduction(op: OpDef):
    pairwise = {"max": torch.maximum, "min": torch.minimum}.get(op.name)

    def fn(x, other=_NO_OTHER, *, dim=None, keepdim: bool = False):
        x = _as_tensor(x)
        if other is not _NO_OTHER:
            # max(a, b) / min(a, b) are elementwise in an epilogue (the frontend reads them
            # as maximum/minimum); keep the same meaning here. sum(x, dim) stays a reduction.
            if pairwise is None:
                dim = other
            else:
                return pairwise(x, _as_tensor(other))
        if dim is None:
            dims = list(range(x.dim()))
        else:
            # (this module's globals shadow max/min/sum with the epilogue functions)
            dims = [d % builtins.max(x.dim(), 1) for d in ([dim] if isinstance(dim, int) else dim)]
        r = op.torch_fn(x, dims) if dims else x
        return r if keepdim or not dims else r.squeeze(tuple(dims))

    fn.__name__ = op.name
    fn.__doc__ = (f"{op.doc} over every element (or over ``dim``); fused: over the axes the "
                  "output lacks")
    return fn


for _name, _op in CALLABLE.items():
    globals()[_name] = _make_reduction(_op) if _op.category is Category.REDUCE else _make(_op)
del _name, _op
