"""The cross-entropy tests' reference: torch's own loss of the whole logits. Imported by
test_round3_torch.py and gpu/test_gpu_linear_cross_entropy.py."""

from __future__ import annotations

import torch


def torch_lce(h, w, y, bias=None, reduction="mean", label_smoothing=0.0, softcap=None,
              z_loss=0.0):
    """torch's cross_entropy of the logits ``h @ w.T + bias`` (soft-capped, plus the
    z-loss), and their logsumexp."""
    z = h @ w.T
    if bias is not None:
        z = z + bias
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    loss = torch.nn.functional.cross_entropy(z, y, reduction=reduction,
                                             label_smoothing=label_smoothing)
    lse = torch.logsumexp(z, -1)
    if z_loss:
        valid = y != -100
        zl = torch.where(valid, z_loss * lse * lse, 0.0)
        loss = loss + (zl if reduction == "none" else
                       zl.sum() / valid.sum() if reduction == "mean" else zl.sum())
    return loss, lse
