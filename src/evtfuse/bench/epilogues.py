"""The benchmark workloads' epilogues, written as a user writes them for evtfuse.

Layer: bench (data). Each function here is handed to ``evtfuse.gemm`` as is; its source
is parsed by the frontend, never run by it. The names it calls come from
``evtfuse.ops`` (this module shadows the builtins ``abs``, ``max`` and ``sum`` with them,
so that every elementwise epilogue here also runs eagerly on torch tensors). Functions
the op table does not have yet (``logsumexp`` before the reductions issue lands) are
still referenced by name: the frontend then rejects the epilogue, and the suite records
the cell as unsupported.

The plain-torch forms the peers run live in ``workloads.py``; a CPU test checks that
each one equals the reference evaluator's reading of the function here.
"""

from __future__ import annotations

from evtfuse import ops
from evtfuse.ops import abs, clamp, gelu_tanh, log, max, relu, sigmoid, silu, sum, where  # noqa: A004

# not in the op table until the reductions issue lands; referenced by name only
logsumexp = getattr(ops, "logsumexp", None)


def col_index():  # recognised by the frontend by name; defined here for linters only
    raise TypeError("col_index() only has a meaning inside a fused epilogue")


def identity(accum):
    D = accum
    return D


def alpha_beta(accum, C, alpha, beta):
    D = alpha * accum + beta * C
    return D


def bias_relu(accum, bias):
    D = relu(accum + bias)
    return D


def bias_gelu_tanh(accum, bias):
    D = gelu_tanh(accum + bias)
    return D


def relu_aux(accum, C, alpha):
    F = alpha * accum + 2.0 * C
    D = relu(F)
    return D, F


def silu_mul(accum, X):
    D = silu(accum) * X
    return D


def row_amax(accum):
    D = accum
    amax = max(abs(accum))
    return D, amax


def bce_loss(accum, bias, C):
    D = accum + bias
    t = (1.0 - C) * (-D) + log(clamp(sigmoid(D), 1e-3, 0.999))
    loss = sum(t)
    return D, loss


def fp8_scale_amax(accum, scale):
    D = accum * scale
    amax = max(abs(D))
    return D, amax


def row_logsumexp(accum):
    D = accum
    lse = logsumexp(accum)
    return D, lse


def lmhead_ce(accum, y):
    D = accum
    lse = logsumexp(D)
    tgt = sum(where(col_index() == y, D, 0.0))
    return D, lse, tgt
