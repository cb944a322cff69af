"""Modules a PyTorch model can hold: ``evtfuse.nn.Linear``, ``fuse_activations``,
``LinearCrossEntropy``, the MLP blocks ``GatedMLP`` and ``MLP`` and the
mixture-of-experts experts ``MoEExperts``.

Layer: library, above the runtime (``evtfuse.gemm``, one ``torch.ops.evtfuse.gemm`` call a
forward). ``Linear`` is a ``torch.nn.Linear`` (same parameters, same state dict, same
initialisation) whose output goes through an epilogue: ``epilogue(x @ weight.T,
bias=bias, **operands)`` over any leading batch dimensions of ``x``, in one fused kernel.
The default epilogue is ``accum + bias`` (``accum`` without a bias).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch

from .errors import EpilogueError
from .frontend import EpilogueSource, one_line, parse_epilogue
from .library import call_of, remembered
from .losses import check_arguments, linear_cross_entropy
from .runtime.api import gemm
from .runtime.autograd import check_backward
from .runtime.device import is_dtensor
from .runtime.mlp import gated_mlp, mlp, pack_gate_up
from .runtime.moe import moe_experts

BIAS = "def linear(accum, bias):\n    D = accum + bias\n    return D"
NO_BIAS = "def linear(accum):\n    D = accum\n    return D"
# the activations fuse_activations folds into the Linear before them, by module type
_ACTIVATIONS = {torch.nn.ReLU: "relu", torch.nn.SiLU: "silu", torch.nn.Sigmoid: "sigmoid",
                torch.nn.Tanh: "tanh"}


@remembered  # its source shows in a repr as the call, with_activation("relu")
def with_activation(op: str, bias: bool = True) -> str:
    """The epilogue ``op(accum + bias)`` (``op(accum)`` without a bias), as source text."""
    if bias:
        return f"def linear_{op}(accum, bias):\n    D = {op}(accum + bias)\n    return D"
    return f"def linear_{op}(accum):\n    D = {op}(accum)\n    return D"


class Linear(torch.nn.Linear):
    """``torch.nn.Linear`` with a fused epilogue.

    ``Linear(in_features, out_features, bias=True, epilogue=None, device=None, dtype=None,
    backward="auto", **operands)``: the epilogue's first parameter is ``accum`` (``x @ weight.T``, fp32), a
    parameter named ``bias`` receives the module's bias, the others come from
    ``operands`` given here (numbers: runtime scalars) or to ``forward(x, **operands)``
    (tensors shaped for the flattened ``(tokens, out_features)`` output). It returns
    ``D`` (and any other outputs, in its return order), reshaped to ``x``'s leading
    dimensions when full-shaped. It is differentiable (``loss.backward()`` fills
    ``weight.grad`` and ``bias.grad``, and ``x.grad``): the backward is one more evtfuse
    kernel and two matmuls (docs/pytorch.md, "Gradients"); ``backward`` ("auto", "save",
    "recompute") says whether that kernel reads the accumulator the forward saved or
    recomputes it (``evtfuse.gemm``'s option).

    A gated epilogue (``gate, up = pairs(accum)``: ``evtfuse.library.gated``) makes it the
    two projections of a gated MLP in one: ``out_features`` is the gated width (the output's,
    as users read it), ``weight`` is ``(2 * out_features, in_features)``, the gate
    projection's rows then the up projection's for ``layout="concatenated"`` (``[W_gate;
    W_up]``), or interleaved row by row (``evtfuse.interleave_gate_up``), and ``bias`` (of
    ``2 * out_features``, laid out as the rows) feeds the epilogue's ``bias_gate`` and
    ``bias_up``.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 epilogue: EpilogueSource | None = None, device=None, dtype=None,
                 backward: str = "auto", **operands: Any):
        epilogue = epilogue if epilogue is not None else (BIAS if bias else NO_BIAS)
        parsed = parse_epilogue(epilogue)
        self._gated = parsed.gated
        rows = 2 * out_features if self._gated else out_features
        super().__init__(in_features, rows, bias, device=device, dtype=dtype)
        self.out_features = out_features  # the gated width for a gated epilogue
        check_backward(backward)
        self.backward_mode = backward
        self.epilogue = epilogue
        wanted = ("bias_gate", "bias_up") if self._gated else ("bias",)
        takes = [p for p in wanted if p in parsed.params]
        if takes and self.bias is None:
            what = "a bias" if takes == ["bias"] else " and ".join(takes)
            raise ValueError(f"the epilogue {parsed.name} takes {what}, and this Linear has "
                             "none (bias=False)")
        if self._gated and self.bias is not None and len(takes) != 2:
            raise ValueError(f"the gated epilogue {parsed.name} takes no bias_gate and bias_up, "
                             "and this Linear has a bias: pass bias=False, or an epilogue with "
                             "bias (evtfuse.library.gated(..., bias=True))")
        self._takes_bias = bool(takes)
        self._name = parsed.name
        # what tensor parallelism asks of the epilogue (_tensor_parallel), read once
        self._columnwise, self._outputs = parsed.columnwise, len(parsed.outputs)
        self._parsed = parsed
        self._epilogue_repr = describe_epilogue(self.epilogue, parsed)
        self.operands = operands

    def forward(self, x: torch.Tensor, **operands: Any):
        if is_dtensor(self.weight):
            return self._tensor_parallel(x, operands)
        lead = x.shape[:-1]
        # a 2-D x (tokens, in_features) is used as it is and its output returned as it is:
        # a reshape to the same shape would add a view node to the autograd graph, host time
        # in the forward and in the backward for nothing
        flat = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        if self._takes_bias and self._gated:
            n = self.out_features
            halves = (self.bias[:n], self.bias[n:]) if self._gated == "concatenated" else \
                (self.bias[0::2], self.bias[1::2])
            operands["bias_gate"], operands["bias_up"] = halves
        elif self._takes_bias:
            operands["bias"] = self.bias
        out = gemm(flat, self.weight.t(), self.epilogue, backward=self.backward_mode,
                   **self.operands, **operands)
        shape = (*lead, self.out_features)
        if isinstance(out, tuple):
            return tuple(_unflatten(o, flat, shape) for o in out)
        return _unflatten(out, flat, shape)

    def _tensor_parallel(self, x: torch.Tensor, operands: dict):
        """The forward of a Linear whose weight ``parallelize_module`` made a DTensor:
        ``ColwiseParallel`` (weight and bias ``Shard(0)``: each rank computes its columns of
        the output, the epilogue on them as it is, when each output column depends on its
        own column alone: ``ParsedEpilogue.columnwise``) or ``RowwiseParallel`` (weight
        ``Shard(1)``: each rank's product is a partial sum, so the epilogue runs on it where
        its output is linear in the accumulator and the bias, ``runtime.sharding``'s split of
        K, each rank's part then summed by one all-reduce). Operands other than the bias
        must be numbers. The result is a DTensor, placed ``Shard(-1)`` or ``Replicate()``, as the
        parallel styles' output hooks expect."""
        from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

        given = {**self.operands, **operands}
        w, mesh = self.weight, self.weight.device_mesh
        placement = tuple(w.placements)
        tensors = [n for n, v in given.items() if isinstance(v, torch.Tensor)]
        if mesh.ndim != 1 or placement not in ((Shard(0),), (Shard(1),)) or tensors \
                or self._outputs != 1:
            why = ("operands other than the bias must be numbers, not tensors "
                   f"({', '.join(tensors)})" if tensors else
                   "its epilogue must return D alone" if self._outputs != 1 else
                   f"its weight must be placed Shard(0) (ColwiseParallel) or Shard(1) "
                   f"(RowwiseParallel) on a 1-D mesh, not {placement}")
            raise EpilogueError(f"evtfuse.nn.Linear with a DTensor weight (tensor "
                                f"parallelism): {why}", variable="weight")
        bias = self.bias.to_local() if isinstance(self.bias, DTensor) else self.bias
        if placement == (Shard(0),):
            if not self._columnwise:
                raise EpilogueError(
                    f"evtfuse.nn.Linear under ColwiseParallel: the epilogue {self._name} "
                    "mixes columns (a reduction over the row, softmax, an element index, a "
                    "gated pair), so its columns cannot be computed shard by shard; "
                    "parallelize this Linear with RowwiseParallel or not at all",
                    variable="epilogue")
            xd = x if isinstance(x, DTensor) else DTensor.from_local(x, mesh, [Replicate()],
                                                                    run_check=False)
            local = xd.to_local(grad_placements=[Partial()])  # each rank's part of dx
            flat = local if local.dim() == 2 else local.reshape(-1, self.in_features)
            if self._takes_bias:
                given["bias"] = bias
            out = gemm(flat, w.to_local().t(), self.epilogue, backward=self.backward_mode,
                       **given)
            out = out.reshape(*local.shape[:-1], out.shape[-1])
            return DTensor.from_local(out, mesh, [Shard(out.dim() - 1)], run_check=False)
        xd = x if isinstance(x, DTensor) else DTensor.from_local(x, mesh, [Shard(x.dim() - 1)],
                                                                run_check=False)
        flat = xd if xd.dim() == 2 else xd.reshape(-1, xd.shape[-1])
        self._rowwise_check(flat, w, bias)
        if self._takes_bias:
            given["bias"] = self.bias if isinstance(self.bias, DTensor) else \
                DTensor.from_local(bias, mesh, [Replicate()], run_check=False)
        # D given placed Partial: each rank computes its part (never a gathered weight)
        D = DTensor.from_local(torch.empty(flat.shape[0], w.shape[0], dtype=flat.dtype,
                                           device=flat.device), mesh, [Partial()],
                               run_check=False)
        out = gemm(flat, w.t(), self.epilogue, backward=self.backward_mode, D=D, **given)
        y = out.redistribute(mesh, [Replicate()])  # the all-reduce of the ranks' parts
        return y if xd.dim() == 2 else y.reshape(*xd.shape[:-1], y.shape[-1])

    def _rowwise_check(self, flat, w, bias) -> None:
        """Under ``RowwiseParallel``: an ``EpilogueError`` where the epilogue's output is not
        linear in the accumulator and the bias (the rule's reason, naming the line)."""
        from .runtime import sharding

        operands: dict[str, Any] = {k: v for k, v in self.operands.items()}
        if self._takes_bias:
            operands["bias"] = (tuple(bias.shape), bias.dtype)
        rules = sharding.rules_of(self._parsed, tuple(flat.shape), (w.shape[1], w.shape[0]),
                                  flat.dtype, operands,
                                  {"D": ((flat.shape[0], w.shape[0]), flat.dtype)})
        if sharding.INNER in rules.refused:
            raise EpilogueError(
                f"evtfuse.nn.Linear under RowwiseParallel: each rank's product is a partial "
                f"sum, and {rules.refused[sharding.INNER]}; parallelize this Linear with "
                "ColwiseParallel, or apply the epilogue after the layer", variable="epilogue")

    def extra_repr(self) -> str:
        parts = [super().extra_repr(), f"epilogue={self._epilogue_repr}"]
        if self._gated:
            parts.insert(1, f"weight_rows={self.weight.shape[0]}")
        parts += [f"{k}={_operand_repr(v)}" for k, v in self.operands.items()]
        if self.backward_mode != "auto":
            parts.append(f"backward={self.backward_mode!r}")
        return ", ".join(parts)


def describe_epilogue(epilogue: Any, parsed: Any = None) -> str:
    """How a module's repr shows its epilogue: the call of ``evtfuse.library`` (or
    ``with_activation``) that made its source, ``gated("swiglu", layout="concatenated")``;
    else its source on one line in double quotes, cut when very long (``frontend.one_line``);
    else (no source to read) its name."""
    call = call_of(epilogue)
    if call is not None:
        return call
    try:
        line = one_line(epilogue)
    except (EpilogueError, StopIteration):  # a ParsedEpilogue, a source that cannot be read
        return getattr(parsed, "name", None) or type(epilogue).__name__
    return f'"{line}"' if '"' not in line else repr(line)


def _operand_repr(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor(shape={tuple(value.shape)}, dtype={value.dtype})"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _unflatten(out, flat: torch.Tensor, shape: tuple):
    full = isinstance(out, torch.Tensor) and out.dim() == 2 and out.shape[0] == flat.shape[0]
    return out.reshape(shape) if full and out.shape != shape else out


def fuse_activations(module: torch.nn.Module, *, report: bool = True) -> torch.nn.Module:
    """Replace, in every ``torch.nn.Sequential`` of ``module`` (in place; also returned), each
    ``torch.nn.Linear`` followed by a ReLU, SiLU, Sigmoid, Tanh or GELU module with one
    ``evtfuse.nn.Linear`` computing both (the same parameters, shared), and the activation
    with ``torch.nn.Identity``: the same outputs, one kernel instead of two.

    It says what it did: ``module.evtfuse_fusion`` (a ``Fusion``: the names of the Linears
    fused, and every Linear left with the reason), and, with ``report`` (the default), a
    ``UserWarning`` when it fused nothing or left a Linear beside an activation module (a
    module that applies its activation in ``forward``, as Hugging Face's MLPs do: evtfuse
    cannot see the order of calls in a forward it does not run)."""
    fusion = Fusion([], [])
    for parent_name, child in module.named_modules():
        prefix = f"{parent_name}." if parent_name else ""
        names = list(child._modules)
        if isinstance(child, torch.nn.Sequential):
            for first, second in zip(names, names[1:]):
                lin, act = child._modules[first], child._modules[second]
                op = _activation_op(act)
                if op is None or type(lin) is not torch.nn.Linear:
                    continue
                bias = lin.bias is not None
                fused = Linear(lin.in_features, lin.out_features, bias,
                               epilogue=with_activation(op) if bias else
                               with_activation(op, bias=False),
                               device=lin.weight.device, dtype=lin.weight.dtype)
                fused.weight, fused.bias = lin.weight, lin.bias
                child._modules[first] = fused
                child._modules[second] = torch.nn.Identity()
                fusion.fused.append(prefix + first)
            continue
        acts = [n for n in names if _activation_op(child._modules[n]) is not None]
        for n in names:
            if type(child._modules[n]) is torch.nn.Linear and acts:
                fusion.left.append((prefix + n, f"{type(child).__name__} holds it beside the "
                                    f"activation module {acts[0]!r} and applies them in its "
                                    "forward, whose order evtfuse cannot see (only "
                                    "torch.nn.Sequential's order is read)"))
    module.evtfuse_fusion = fusion
    if report and (fusion.left or not fusion.fused):
        warnings.warn(f"evtfuse.nn.fuse_activations: {fusion}", UserWarning, stacklevel=2)
    return module


@dataclass
class Fusion:
    """What ``fuse_activations`` did: ``fused``, the names of the Linears now fused with the
    activation after them; ``left``, (name, why) for each Linear left beside one."""

    fused: list[str]
    left: list[tuple[str, str]]

    def __str__(self) -> str:
        head = f"fused {len(self.fused)} Linear + activation pair(s)" + \
            (f" ({', '.join(self.fused)})" if self.fused else "")
        if not self.fused and not self.left:
            head += ": no torch.nn.Sequential holds a torch.nn.Linear followed by a ReLU, " \
                "SiLU, Sigmoid, Tanh or GELU module"
        return head + "".join(f"; left {n}: {why}" for n, why in self.left)


def _activation_op(act: torch.nn.Module) -> str | None:
    if isinstance(act, torch.nn.GELU):
        return "gelu_tanh" if act.approximate == "tanh" else "gelu"
    return _ACTIVATIONS.get(type(act))


class LinearCrossEntropy(torch.nn.Module):
    """``evtfuse.linear_cross_entropy`` as a module: ``LinearCrossEntropy(ignore_index=-100,
    reduction="mean", label_smoothing=0.0, softcap=None, z_loss=0.0, return_lse=False)``,
    then ``forward(hidden, weight, target, bias=None)`` (the LM head's weight and bias are
    the model's; this module holds no parameter)."""

    def __init__(self, ignore_index: int = -100, reduction: str = "mean",
                 label_smoothing: float = 0.0, softcap: float | None = None,
                 z_loss: float = 0.0, return_lse: bool = False):
        super().__init__()
        self.options = dict(ignore_index=ignore_index, reduction=reduction,
                            label_smoothing=label_smoothing, softcap=softcap, z_loss=z_loss,
                            return_lse=return_lse)
        h, w, y = torch.empty(1, 1, device="meta"), torch.empty(1, 1, device="meta"), \
            torch.empty(1, dtype=torch.int64, device="meta")
        check_arguments(h, w, y, None, **self.options)  # bad options fail here

    def forward(self, hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                bias: torch.Tensor | None = None):
        return linear_cross_entropy(hidden, weight, target, bias=bias, **self.options)

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.options.items())


# the activations the MLP blocks take (op-table names)
MLP_ACTIVATIONS = ("silu", "gelu", "gelu_tanh", "relu")


def _check_activation(activation: str) -> str:
    if activation not in MLP_ACTIVATIONS:
        raise EpilogueError(f"activation must be one of {', '.join(MLP_ACTIVATIONS)}, not "
                            f"{activation!r}", variable="activation")
    return activation


class GatedMLP(torch.nn.Module):
    """The gated MLP of Llama-family models, ``down_proj(act(gate_proj(x)) * up_proj(x))``,
    fused forward and backward (``evtfuse.runtime.mlp``).

    ``GatedMLP(hidden_size, intermediate_size, activation="silu", bias=False, device=None,
    dtype=None)``: ``gate_proj`` and ``up_proj`` (``torch.nn.Linear(hidden_size,
    intermediate_size)``) and ``down_proj`` (``torch.nn.Linear(intermediate_size,
    hidden_size)``), so its parameters and state dict are a Hugging Face ``LlamaMLP``'s.
    ``activation``: "silu" (SwiGLU), "gelu_tanh" (GeGLU as Gemma's), "gelu" or "relu".
    ``GatedMLP.adopt(gate_proj, up_proj, down_proj, activation)`` builds one around existing
    Linears (their parameters, shared). It keeps ``gate_proj.weight`` and ``up_proj.weight``
    one after the other in one buffer (the same Parameter objects; again after ``.to()``,
    ``copy.deepcopy`` and unpickling), so that the fused kernel reads them as ``[W_gate;
    W_up]`` with no copy; where something gives them separate storage again (FSDP,
    ``load_state_dict(assign=True)``), a step concatenates them, a copy of both, and gives
    the same results.

    Forward: one GEMM whose epilogue computes ``act(gate) * up`` (and keeps gate and up for
    the backward), then the down projection. Backward: the down projection's ``dy @ W``
    computes the activation's derivative in its epilogue (derived from the activation's
    expression by ``evtfuse.autodiff``) and writes d[gate|up] and the activation's output
    again, then three torch matmuls; no elementwise pass in either direction.
    """

    def __init__(self, hidden_size: int, intermediate_size: int, activation: str = "silu",
                 bias: bool = False, device=None, dtype=None):
        super().__init__()
        self.activation = _check_activation(activation)
        self.gate_proj = torch.nn.Linear(hidden_size, intermediate_size, bias, device, dtype)
        self.up_proj = torch.nn.Linear(hidden_size, intermediate_size, bias, device, dtype)
        self.down_proj = torch.nn.Linear(intermediate_size, hidden_size, bias, device, dtype)
        pack_gate_up(self.gate_proj, self.up_proj)

    @classmethod
    def adopt(cls, gate_proj: torch.nn.Linear, up_proj: torch.nn.Linear,
              down_proj: torch.nn.Linear, activation: str = "silu") -> "GatedMLP":
        """A ``GatedMLP`` holding these three Linears (their parameters, not copies)."""
        for name, lin in (("gate_proj", gate_proj), ("up_proj", up_proj),
                          ("down_proj", down_proj)):
            if not isinstance(lin, torch.nn.Linear):
                raise EpilogueError(f"{name} must be a torch.nn.Linear, not "
                                    f"{type(lin).__name__}", variable=name)
        if gate_proj.weight.shape != up_proj.weight.shape \
                or down_proj.weight.shape != gate_proj.weight.shape[::-1] \
                or (gate_proj.bias is None) != (up_proj.bias is None):
            raise EpilogueError(
                f"gate_proj {tuple(gate_proj.weight.shape)}, up_proj "
                f"{tuple(up_proj.weight.shape)} and down_proj {tuple(down_proj.weight.shape)}"
                " do not make a gated MLP: gate_proj and up_proj (intermediate, hidden), "
                "down_proj (hidden, intermediate)", variable="down_proj")
        block = cls.__new__(cls)
        torch.nn.Module.__init__(block)
        block.activation = _check_activation(activation)
        block.gate_proj, block.up_proj, block.down_proj = gate_proj, up_proj, down_proj
        pack_gate_up(gate_proj, up_proj)
        return block

    def _apply(self, fn, recurse=True):
        # .to(), .cuda(), .half() give the parameters new storage: one buffer again
        out = super()._apply(fn, recurse)
        pack_gate_up(self.gate_proj, self.up_proj)
        return out

    def __setstate__(self, state):
        # copy.deepcopy and unpickling copy each parameter to storage of its own: one buffer
        # again (else every step would concatenate them)
        super().__setstate__(state)
        pack_gate_up(self.gate_proj, self.up_proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gated_mlp(x, self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight,
                         self.activation, self.gate_proj.bias, self.up_proj.bias,
                         self.down_proj.bias)

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"


class MLP(torch.nn.Module):
    """``fc2(act(fc1(x)))``, the MLP of GPT-2/BERT-style models, fused forward and backward
    (``evtfuse.runtime.mlp``): ``MLP(in_features, hidden_features, out_features=None,
    activation="gelu", bias=True, device=None, dtype=None)``, parameters ``fc1`` and ``fc2``
    (``torch.nn.Linear``); ``MLP.adopt(fc1, fc2, activation)`` builds one around existing
    Linears."""

    def __init__(self, in_features: int, hidden_features: int, out_features: int | None = None,
                 activation: str = "gelu", bias: bool = True, device=None, dtype=None):
        super().__init__()
        self.activation = _check_activation(activation)
        out_features = in_features if out_features is None else out_features
        self.fc1 = torch.nn.Linear(in_features, hidden_features, bias, device, dtype)
        self.fc2 = torch.nn.Linear(hidden_features, out_features, bias, device, dtype)

    @classmethod
    def adopt(cls, fc1: torch.nn.Linear, fc2: torch.nn.Linear, activation: str = "gelu") -> "MLP":
        """An ``MLP`` holding these two Linears (their parameters, not copies)."""
        for name, lin in (("fc1", fc1), ("fc2", fc2)):
            if not isinstance(lin, torch.nn.Linear):
                raise EpilogueError(f"{name} must be a torch.nn.Linear, not "
                                    f"{type(lin).__name__}", variable=name)
        if fc2.in_features != fc1.out_features:
            raise EpilogueError(f"fc2 takes {fc2.in_features} features and fc1 gives "
                                f"{fc1.out_features}", variable="fc2")
        block = cls.__new__(cls)
        torch.nn.Module.__init__(block)
        block.activation = _check_activation(activation)
        block.fc1, block.fc2 = fc1, fc2
        return block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return mlp(x, self.fc1.weight, self.fc2.weight, self.activation, self.fc1.bias,
                   self.fc2.bias)

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"


class MoEExperts(torch.nn.Module):
    """The experts of a sparse mixture-of-experts block (Qwen3-MoE's, Mixtral's, ...: gated,
    transformers 5.x's ``*Experts`` modules), fused forward and backward
    (``evtfuse.runtime.moe``).

    ``MoEExperts(num_experts, hidden_size, intermediate_size, activation="silu",
    device=None, dtype=None)``: parameters ``gate_up_proj`` (num_experts, 2 *
    intermediate_size, hidden_size), each expert's gate rows then its up rows, and
    ``down_proj`` (num_experts, hidden_size, intermediate_size), named and shaped as
    transformers stores them, so an HF experts module's state dict loads as it is
    (initialised as a ``torch.nn.Linear``'s weights, uniform in +-1/sqrt(fan_in)).
    ``forward(hidden_states, top_k_index, top_k_weights)``: hidden_states (tokens,
    hidden_size), the router's top-k expert ids (tokens, k) (int64 or int32) and weights
    (tokens, k); returns (tokens, hidden_size), ``sum_j w[t, j] * down[e](act(gate[e](x)) *
    up[e](x))`` with e = top_k_index[t, j]. Differentiable with respect to hidden_states,
    top_k_weights and both parameters. Bad arguments raise ``EpilogueError`` naming the
    variable, before anything runs.

    Forward: two grouped GEMMs (``evtfuse.grouped_gemm``) over the token-expert pairs sorted
    by expert on the device (no host synchronisation), the first's epilogue computing
    ``w * act(gate) * up``; backward: four grouped GEMMs, the first's epilogue derived from
    the activation by ``evtfuse.autodiff`` (no elementwise pass of its own).
    """

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int,
                 activation: str = "silu", device=None, dtype=None):
        super().__init__()
        self.activation = _check_activation(activation)
        for name, v in (("num_experts", num_experts), ("hidden_size", hidden_size),
                        ("intermediate_size", intermediate_size)):
            if not isinstance(v, int) or v < 1:
                raise EpilogueError(f"{name} must be a positive int, not {v!r}", variable=name)
        self.num_experts = num_experts
        self.hidden_size, self.intermediate_size = hidden_size, intermediate_size
        kw = {"device": device, "dtype": dtype}
        self.gate_up_proj = torch.nn.Parameter(
            torch.empty(num_experts, 2 * intermediate_size, hidden_size, **kw))
        self.down_proj = torch.nn.Parameter(
            torch.empty(num_experts, hidden_size, intermediate_size, **kw))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            for w in (self.gate_up_proj, self.down_proj):
                bound = 1.0 / w.shape[-1] ** 0.5
                w.uniform_(-bound, bound)

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        return moe_experts(hidden_states, top_k_index, top_k_weights, self.gate_up_proj,
                           self.down_proj, self.activation)

    def extra_repr(self) -> str:
        return (f"num_experts={self.num_experts}, hidden_size={self.hidden_size}, "
                f"intermediate_size={self.intermediate_size}, activation={self.activation!r}")


__all__ = ["Linear", "fuse_activations", "Fusion", "with_activation", "LinearCrossEntropy",
           "GatedMLP", "MLP", "MLP_ACTIVATIONS", "MoEExperts"]
