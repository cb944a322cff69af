"""Weights for gated epilogues (``gate, up = pairs(accum)``): the interleaved layout.

Layer: library (plain torch; knows nothing of kernels). A gated epilogue reads the
accumulator's columns in pairs, column 2j is gate j and 2j + 1 is up j (docs/gated.md),
so the GEMM's B must hold gate and up columns alternately. ``interleave_gate_up`` builds
that from two ``nn.Linear``-style weights (N, K) (or biases (N,)): the result's rows
alternate gate and up, and ``x @ W.t()`` (or ``evtfuse.gemm(x, W.t(), ...)``) feeds
``pairs(accum)``; stacked experts' weights interleave along their N dimension
(``dim=1``) for ``grouped_gemm``. ``split_gate_up`` is its inverse. A concatenated
``[W_gate; W_up]`` weight needs neither: ``pairs(accum, layout="concatenated")`` reads it
as it is.
"""

from __future__ import annotations

import torch

from .errors import EpilogueError


def interleave_gate_up(W_gate: torch.Tensor, W_up: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """(N, ...) gate and up weights -> the interleaved (2N, ...) one: row 2j is
    ``W_gate[j]``, row 2j + 1 is ``W_up[j]`` (a new contiguous tensor). ``dim``: the
    dimension of the N outputs, for stacked weights: experts' (G, N, K) weights interleave
    along ``dim=1`` into (G, 2N, K), ready for ``grouped_gemm(x, W.mT, offs, ...)``."""
    for name, t in (("W_gate", W_gate), ("W_up", W_up)):
        if not isinstance(t, torch.Tensor) or t.dim() < 1:
            raise EpilogueError(f"{name} must be a tensor of at least 1 dimension ((N, K) "
                                f"weight or (N,) bias)", variable=name)
    if W_gate.shape != W_up.shape or W_gate.dtype != W_up.dtype \
            or W_gate.device != W_up.device:
        raise EpilogueError(f"W_gate {tuple(W_gate.shape)} {W_gate.dtype} and W_up "
                            f"{tuple(W_up.shape)} {W_up.dtype} must have one shape, dtype and "
                            f"device", variable="W_up")
    d = _dim(W_gate, dim, "W_gate")
    return torch.stack((W_gate, W_up), dim=d + 1).flatten(d, d + 1)


def split_gate_up(W: torch.Tensor, dim: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of ``interleave_gate_up``: (W_gate, W_up) from the interleaved
    (2N, ...) tensor (views of its even and odd rows along ``dim``)."""
    if not isinstance(W, torch.Tensor) or W.dim() < 1:
        raise EpilogueError("split_gate_up takes an interleaved (2N, ...) tensor", variable="W")
    d = _dim(W, dim, "W")
    if W.shape[d] % 2:
        raise EpilogueError(f"split_gate_up takes an interleaved tensor: an even number of "
                            f"rows along dim {dim}, not {W.shape[d]}", variable="W")
    gate, up = W.unflatten(d, (-1, 2)).unbind(d + 1)
    return gate, up


def _dim(t: torch.Tensor, dim: int, name: str) -> int:
    if not -t.dim() <= dim < t.dim():
        raise EpilogueError(f"dim {dim} is out of range for {name} of {t.dim()} dimensions",
                            variable=name)
    return dim % t.dim()


__all__ = ["interleave_gate_up", "split_gate_up"]
