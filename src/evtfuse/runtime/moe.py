"""Mixture-of-experts experts fused forward and backward: the operators behind
``evtfuse.nn.MoEExperts`` (and the ``"evtfuse"`` experts implementation of ``evtfuse.hf``).

Layer: runtime.torch, beside ``runtime.mlp`` (same ``torch.library`` namespace, the same
machinery: an up projection whose epilogue stores the pre-activations and the activation's
output, a backward epilogue derived by ``autodiff`` whose upstream gradient is the
accumulator; its grouped GEMMs run below autograd: ``calls.plain_grouped_gemm``). The
experts of a sparse MoE block, in transformers 5.x's layout::

    y[t] = sum_j  w[t, j] * down[e] @ (act(G) * U),   e = index[t, j],
           G | U = gate_up[e] @ x[t]   (gate_up (E, 2I, H): gate's I rows first; down (E, H, I))

Schemas::

    evtfuse::moe_experts(Tensor x, Tensor index, Tensor weights, Tensor gate_up, Tensor down,
        str activation) -> (Tensor y, Tensor p, Tensor perm, Tensor offs)
    evtfuse::moe_experts_backward(Tensor dy, Tensor x, Tensor weights, Tensor gate_up,
        Tensor down, Tensor p, Tensor perm, Tensor offs, str activation, bool[4] need)
        -> (Tensor dx, Tensor dweights, Tensor dgate_up, Tensor ddown)

Forward. The T*k (token, expert) pairs are sorted by expert with a stable sort on the
device (``perm``); ``offs``, each expert's cumulative end row (int32), on the device too:
no host synchronisation anywhere (a searchsorted of the sorted ids, not ``bincount``).
``x_perm = x[perm // k]`` is a permuted copy of the tokens (a gather inside the GEMM's A
loads is a later kernel feature). Then two grouped GEMMs over M
(``evtfuse.grouped_gemm``): the up projection, whose epilogue (``up_source``, gate and up
read from ``gate_up`` as it is stored: ``pairs(accum, layout="concatenated")``) stores
``p = G | U`` (rows, 2I), the pre-activations rounded to the input dtype as torch's Linear
output is, and ``D = s * act(G) * U`` of those rounded values, ``s`` the pair's routing
weight (a per-row operand: s applied before the down projection, since
``s * (A @ W2.T) = (s * A) @ W2.T``); and the down projection, a plain grouped GEMM, giving
``y_perm``. Back to token order and the sum over k, deterministically, in one pass
(``_sum_pairs``): each token's k rows gathered by the inverse permutation and added in
order, in fp32 (``SUM_PAIRS``: evtfuse's ``gather_sum`` kernel, or ``embedding_bag``; not a
copy back to pair order and a sum after it, nor ``index_add_``, whose float atomics are not
deterministic on CUDA).

Backward, four grouped GEMMs: ``dY_perm = dy[perm // k]``; the first, ``dY_perm @ down_e``,
runs ``down_grad``'s epilogue, derived by ``autodiff`` from ``D = s * act(G) * U`` with
respect to G, U and s, its upstream gradient the accumulator (``passes.accumulate_operand``):
it reads ``p`` and ``s`` and writes ``dp`` (dG | dU, a new (rows, 2I) tensor), ``D`` again
(``s * A``, for dW_down) and ``ds`` (the per-row sum ``sum(accum * act(G) * U)``: a per-row
reduction of the grouped kernel, fp32). Then ``dX_perm = dp @ gate_up_e`` (grouped over M),
summed per token as ``y_perm`` is; ``dW_gate_up = dp.T @ x_perm`` and
``dW_down = dY_perm.T @ (s * A)`` (grouped over K: an expert without tokens gets zeros);
``d weights`` is ``ds`` in pair order, (T, k).
"""

from __future__ import annotations

import functools

import torch

from ..dag_epilogue import DagEpilogue
from ..errors import EpilogueError
from ..ir import rounding_of
from . import calls
from .mlp import backward_over_accumulator
from .torch_op import _lib

TUNE = "fast"  # the evtfuse.grouped_gemm calls' tuning
# the expert weights' gradients, plain GEMMs grouped over K (each expert's rows): "evtfuse"
# (evtfuse.grouped_gemm: its portable family, the TMA families group over M only) or
# "grouped_mm" (torch._grouped_mm on CUDA); benchmarks/moe.py --layer times both (its
# variant evtfuse_wgrad_mm), and the faster becomes the default
WEIGHT_GRADS = "evtfuse"
# the sum of each token's k rows: "gather_sum" (backends.triton.gather_sum: rows in
# blocks, on the CPU under the interpreter too) or "embedding_bag" (torch's on CUDA, one
# thread per output element; on the CPU a copy back to pair order and a sum); both add in
# pair order in fp32 and round once. scripts/moe_gemm_probe.py times both: Mixtral-like
# 16,384 tokens x 4096, k = 2, on an H200 0.112 ms against 0.988 (0.86x and 7.6x a copy)
SUM_PAIRS = "gather_sum"
ACTIVATIONS = ("silu", "gelu", "gelu_tanh", "relu")

_lib.define("moe_experts(Tensor x, Tensor index, Tensor weights, Tensor gate_up, Tensor down, "
            "str activation) -> (Tensor, Tensor, Tensor, Tensor)")
_lib.define("moe_experts_backward(Tensor dy, Tensor x, Tensor weights, Tensor gate_up, "
            "Tensor down, Tensor p, Tensor perm, Tensor offs, str activation, bool[4] need) "
            "-> (Tensor, Tensor, Tensor, Tensor)")


# ------------------------------------------------------------------ epilogues


@functools.lru_cache(maxsize=64)
def up_source(activation: str, dtype: torch.dtype) -> str:
    """The up projection's epilogue: G and U (the pre-activations) and
    ``D = s * act(G) * U`` of them rounded to ``dtype``."""
    rounding = rounding_of(dtype)

    def rounded(v: str) -> str:
        return f'cast({v}, "{rounding}")' if rounding else v

    return ("def moe_up(accum, s):\n"
            '    gate, up = pairs(accum, layout="concatenated")\n'
            "    G = gate\n    U = up\n"
            f"    D = s * {activation}({rounded('G')}) * {rounded('U')}\n"
            "    return D, G, U\n")


def act_source(activation: str) -> str:
    """The routed activation as a function of the stored pre-activations and the routing
    weight: what ``down_grad`` is derived from."""
    return f"def moe_act(accum, G, U, s):\n    D = s * {activation}(G) * U\n    return D\n"


@functools.lru_cache(maxsize=64)
def down_grad(activation: str) -> tuple[DagEpilogue, tuple[tuple[str, str], ...]]:
    """The epilogue of ``dA = dY_perm @ down_e``: the backward of ``act_source``
    (``autodiff``, with respect to G, U and s) with its upstream gradient read from the
    accumulator, and its forward value ``D`` (s * A, for dW_down) among its outputs.
    Returns the epilogue (a DAG: ``backward_over_accumulator``) and, per input (G, U, s),
    the output holding its gradient (s's: a per-row sum)."""
    return backward_over_accumulator(act_source(activation),
                                     {"G": (3, 5), "U": (3, 5), "s": (3, 1)}, {"G", "U", "s"},
                                     "moe_down_grad")


# ------------------------------------------------------------------ the operators


def _route(index: torch.Tensor, experts: int):
    """perm (the pairs sorted by expert, stable) and offs (int32 cumulative ends: the
    number of sorted ids <= e, a ``searchsorted`` of the sorted ids), on the device, no host
    read (``torch.bincount`` on a GPU reads the ids' max on the host)."""
    ids = index.reshape(-1).long()
    ordered, perm = torch.sort(ids, stable=True)
    bounds = torch.arange(experts, device=ids.device, dtype=ids.dtype)
    offs = torch.searchsorted(ordered, bounds, right=True, out_int32=True)
    return perm, offs


def _sum_pairs(t_perm: torch.Tensor, perm: torch.Tensor, tokens: int, k: int) -> torch.Tensor:
    """(tokens, width): each token's k rows of ``t_perm`` (rows in expert order) added in
    pair order, in fp32, rounded once, in one pass: the inverse permutation's rows of each
    token gathered and summed by evtfuse's ``gather_sum`` (``SUM_PAIRS``; on the CPU under
    the interpreter) or by ``embedding_bag`` on CUDA (one thread per output element;
    deterministic either way: tests/gpu/test_gpu_moe.py checks the rounding of both); with
    ``embedding_bag`` on the CPU (whose 16-bit sums round otherwise) back to pair order,
    then a sum."""
    if t_perm.device.type != "cuda" and SUM_PAIRS != "gather_sum":
        return _to_pairs(t_perm, perm).view(tokens, k, -1).sum(1)
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.numel(), device=perm.device)
    if SUM_PAIRS == "gather_sum":
        from ..backends.triton.gather_sum import gather_sum

        return gather_sum(t_perm.contiguous(), inverse, k)
    return torch.nn.functional.embedding_bag(inverse.view(tokens, k), t_perm, mode="sum")


def _to_pairs(t_perm: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """Rows in expert order back in pair order (token-major: pair t*k + j): an index_put of
    distinct rows, deterministic."""
    out = t_perm.new_empty(t_perm.shape)
    out[perm] = t_perm
    return out


def _forward(x, index, weights, gate_up, down, activation):
    grouped_gemm = calls.plain_grouped_gemm  # below autograd, on local tensors

    tokens, k = index.shape
    rows, width = tokens * k, down.shape[2]
    perm, offs = _route(index, gate_up.shape[0])
    with torch.no_grad():
        p = x.new_empty((rows, 2 * width))
        if rows == 0:
            return x.new_zeros(x.shape), p, perm, offs
        x_perm = x[perm // k]
        s = weights.reshape(-1)[perm].unsqueeze(1)
        a = x.new_empty((rows, width))
        grouped_gemm(x_perm, gate_up.mT, offs, up_source(activation, x.dtype), D=a,
                     G=p[:, :width], U=p[:, width:], s=s, tune=TUNE)
        y_perm = grouped_gemm(a, down.mT, offs, tune=TUNE)
        y = _sum_pairs(y_perm, perm, tokens, k)
    return y, p, perm, offs


def _forward_fake(x, index, weights, gate_up, down, activation):
    rows = index.shape[0] * index.shape[1]
    return (x.new_empty(x.shape), x.new_empty((rows, 2 * down.shape[2])),
            index.new_empty((rows,), dtype=torch.int64),
            index.new_empty((gate_up.shape[0],), dtype=torch.int32))


def _backward_op(dy, x, weights, gate_up, down, p, perm, offs, activation, need):
    grouped_gemm = calls.plain_grouped_gemm  # below autograd, on local tensors

    tokens, k = weights.shape
    rows, width = perm.numel(), down.shape[2]
    want_x, want_w, want_gu, want_down = need
    with torch.no_grad():
        if rows == 0:
            return (torch.zeros_like(x), torch.zeros_like(weights), torch.zeros_like(gate_up),
                    torch.zeros_like(down))
        token = perm // k
        s = weights.reshape(-1)[perm].unsqueeze(1)
        dy_perm = dy[token].contiguous()
        epilogue, outputs = down_grad(activation)
        grad = dict(outputs)
        dp = p.new_empty(p.shape)
        a = p.new_empty((rows, width))
        ds = torch.zeros((rows, 1), dtype=torch.float32, device=p.device)
        grouped_gemm(dy_perm, down, offs, epilogue, D=a, G=p[:, :width], U=p[:, width:], s=s,
                     tune=TUNE, **{grad["G"]: dp[:, :width], grad["U"]: dp[:, width:],
                                   grad["s"]: ds})
        dx = dweights = dgate_up = ddown = _empty(x)
        if want_x:
            dx_perm = grouped_gemm(dp, gate_up, offs, tune=TUNE)
            dx = _sum_pairs(dx_perm, perm, tokens, k)
        if want_w:
            dweights = _to_pairs(ds[:, 0], perm).view(tokens, k).to(weights.dtype)
        if want_gu:
            dgate_up = _over_k(dp.t(), x[token], offs)
        if want_down:
            ddown = _over_k(dy_perm.t(), a, offs)
    return dx, dweights, dgate_up, ddown


def _over_k(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """(E, a's rows, b's columns): per expert, ``a @ b`` over its rows' slice of K
    (``WEIGHT_GRADS`` says whose GEMM; an expert without rows gets zeros)."""
    if WEIGHT_GRADS == "grouped_mm" and a.is_cuda and hasattr(torch, "_grouped_mm"):
        return torch._grouped_mm(a, b, offs=offs)
    return calls.plain_grouped_gemm(a, b, offs, tune=TUNE)


def _backward_fake(dy, x, weights, gate_up, down, p, perm, offs, activation, need):
    return tuple(t.new_empty(t.shape) if want else _empty(t)
                 for t, want in zip((x, weights, gate_up, down), need))


def _empty(like: torch.Tensor) -> torch.Tensor:
    return like.new_empty((0,))


_lib.impl("moe_experts", _forward, "CompositeExplicitAutograd")
torch.library.register_fake("evtfuse::moe_experts", _forward_fake, lib=_lib)
_lib.impl("moe_experts_backward", _backward_op, "CompositeExplicitAutograd")
torch.library.register_fake("evtfuse::moe_experts_backward", _backward_fake, lib=_lib)


def _setup_context(ctx, inputs, output) -> None:
    x, index, weights, gate_up, down, activation = inputs
    _, p, perm, offs = output
    ctx.save_for_backward(x, weights, gate_up, down, p, perm, offs)
    ctx.activation = activation
    ctx.set_materialize_grads(False)


def _backward(ctx, dy, *unused):
    if dy is None:
        return (None,) * 6
    if torch.is_grad_enabled():
        raise NotImplementedError("evtfuse's MoE experts compute first-order gradients only "
                                  "(no create_graph=True)")
    x, weights, gate_up, down, p, perm, offs = ctx.saved_tensors
    need = ctx.needs_input_grad
    want = [bool(need[0]), bool(need[2]), bool(need[3]), bool(need[4])]
    dx, dw, dgu, dd = torch.ops.evtfuse.moe_experts_backward.default(
        dy, x, weights, gate_up, down, p, perm, offs, ctx.activation, want)
    return (dx if want[0] else None, None, dw if want[1] else None, dgu if want[2] else None,
            dd if want[3] else None, None)


torch.library.register_autograd("evtfuse::moe_experts", _backward,
                                setup_context=_setup_context, lib=_lib)


# ------------------------------------------------------------------ the call


def check_arguments(x, index, weights, gate_up, down, activation) -> None:
    """Raise ``EpilogueError`` naming the variable for arguments ``moe_experts`` cannot
    take (before anything runs). Indices out of range: a plain check on the CPU; on a GPU
    an asynchronous device assert (``torch._assert_async``: no host synchronisation), and
    the kernels never index memory with an expert id (offsets searched in the sorted ids,
    clamped by the kernels), so a bad one reads or writes nothing out of bounds before it fires."""
    if activation not in ACTIVATIONS:
        raise EpilogueError(f"activation must be one of {', '.join(ACTIVATIONS)}, not "
                            f"{activation!r}", variable="activation")
    for name, t in (("hidden_states", x), ("top_k_index", index), ("top_k_weights", weights),
                    ("gate_up_proj", gate_up), ("down_proj", down)):
        if not isinstance(t, torch.Tensor):
            raise EpilogueError(f"{name} must be a torch.Tensor, not {type(t).__name__}",
                                variable=name)
    if x.dim() != 2:
        raise EpilogueError(f"hidden_states must be (tokens, hidden), not {tuple(x.shape)}",
                            variable="hidden_states")
    if gate_up.dim() != 3 or down.dim() != 3:
        raise EpilogueError(f"gate_up_proj must be (experts, 2 * intermediate, hidden) and "
                            f"down_proj (experts, hidden, intermediate), not "
                            f"{tuple(gate_up.shape)} and {tuple(down.shape)}",
                            variable="gate_up_proj" if gate_up.dim() != 3 else "down_proj")
    experts, hidden, width = down.shape
    if tuple(gate_up.shape) != (experts, 2 * width, hidden):
        raise EpilogueError(f"gate_up_proj {tuple(gate_up.shape)} does not match down_proj "
                            f"{tuple(down.shape)}: gate_up_proj must be (experts, 2 * "
                            f"intermediate, hidden) = {(experts, 2 * width, hidden)}",
                            variable="gate_up_proj")
    if x.shape[1] != hidden:
        raise EpilogueError(f"hidden_states has {x.shape[1]} features but the experts take "
                            f"{hidden} (hidden_states {tuple(x.shape)}, down_proj "
                            f"{tuple(down.shape)})", variable="hidden_states")
    if index.dim() != 2 or index.shape[0] != x.shape[0]:
        raise EpilogueError(f"top_k_index must be (tokens, k) = ({x.shape[0]}, k), not "
                            f"{tuple(index.shape)}", variable="top_k_index")
    if index.dtype not in (torch.int64, torch.int32):
        raise EpilogueError(f"top_k_index must be torch.int64 or torch.int32, not "
                            f"{index.dtype}", variable="top_k_index")
    if tuple(weights.shape) != tuple(index.shape):
        raise EpilogueError(f"top_k_weights {tuple(weights.shape)} must have top_k_index's "
                            f"shape {tuple(index.shape)}", variable="top_k_weights")
    if not weights.is_floating_point():
        raise EpilogueError(f"top_k_weights must be floating point, not {weights.dtype}",
                            variable="top_k_weights")
    if index.shape[1] > experts:
        raise EpilogueError(f"top_k_index picks k = {index.shape[1]} experts per token but "
                            f"there are {experts}", variable="top_k_index")
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise EpilogueError(f"hidden_states must be float32, float16 or bfloat16, not "
                            f"{x.dtype}", variable="hidden_states")
    for name, t in (("gate_up_proj", gate_up), ("down_proj", down)):
        if t.dtype != x.dtype:
            raise EpilogueError(f"{name} is {t.dtype} but hidden_states is {x.dtype}: give "
                                "them one dtype", variable=name)
    for name, t in (("top_k_index", index), ("top_k_weights", weights),
                    ("gate_up_proj", gate_up), ("down_proj", down)):
        if t.device != x.device:
            raise EpilogueError(f"{name} is on {t.device} but hidden_states is on {x.device}",
                                variable=name)
    if index.numel() == 0:
        return
    if torch.compiler.is_compiling() or index.is_cuda:
        torch._assert_async(((index >= 0) & (index < experts)).all(),
                            f"top_k_index holds an expert id outside [0, {experts})")
        return
    bad = (index < 0) | (index >= experts)
    if bool(bad.any()):
        t, j = (int(v) for v in bad.nonzero()[0])
        raise EpilogueError(f"top_k_index[{t}, {j}] = {int(index[t, j])} is out of range: an "
                            f"expert id is in [0, {experts})", variable="top_k_index")


def moe_experts(x: torch.Tensor, index: torch.Tensor, weights: torch.Tensor,
                gate_up: torch.Tensor, down: torch.Tensor, activation: str = "silu"
                ) -> torch.Tensor:
    """The experts of a sparse MoE block, transformers 5.x's ``*Experts.forward``:
    ``x`` (T, H), ``index`` (T, k) expert ids, ``weights`` (T, k) routing weights,
    ``gate_up`` (E, 2I, H) (gate's rows first), ``down`` (E, H, I). Returns (T, H).
    Differentiable with respect to x, weights, gate_up and down."""
    check_arguments(x, index, weights, gate_up, down, activation)
    y, _, _, _ = torch.ops.evtfuse.moe_experts.default(x, index, weights, gate_up, down,
                                                      activation)
    return y


__all__ = ["up_source", "act_source", "down_grad", "moe_experts", "check_arguments",
           "ACTIVATIONS"]
