"""MLP blocks fused forward and backward (work in progress: a torch placeholder while the
fused operators land)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

_ACT = {"silu": F.silu, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
        "relu": F.relu}


def gated_mlp(x, w_gate, w_up, w_down, activation, b_gate=None, b_up=None, b_down=None):
    a = _ACT[activation](F.linear(x, w_gate, b_gate)) * F.linear(x, w_up, b_up)
    return F.linear(a, w_down, b_down)


def mlp(x, w1, w2, activation, b1=None, b2=None):
    return F.linear(_ACT[activation](F.linear(x, w1, b1)), w2, b2)
