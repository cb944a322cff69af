"""What the grouped GEMM tests share: ``offs`` from group sizes, the group layouts every
grouped path is checked on (each test file adds its own special cases), and the gradients a
loss gives its leaves (``grads_of``)."""

from __future__ import annotations

import torch


def offs_of(sizes) -> torch.Tensor:
    """``torch._grouped_mm``'s offsets: the cumulative end row of each group, int32."""
    return torch.tensor(sizes, dtype=torch.int32).cumsum(0).to(torch.int32)


def grads_of(loss, tensors: dict) -> dict:
    """The gradients ``loss.backward()`` gives ``tensors`` (cleared first; None where none
    reaches one)."""
    for t in tensors.values():
        t.grad = None
    loss.backward()
    return {k: (t.grad.clone() if t.grad is not None else None) for k, t in tensors.items()}


# name: (group sizes, T): ragged groups, empty ones at both ends, one group, groups smaller
# than a tile, rows past offs[-1] (in no group)
GROUP_CASES = {
    "ragged": ([7, 33, 1, 20], 61),
    "empty_first_last": ([0, 12, 0, 40, 0], 52),
    "one_group": ([45], 45),
    "smaller_than_tile": ([3, 5, 2, 1, 6], 17),
    "rows_past_end": ([9, 14], 30),
}
