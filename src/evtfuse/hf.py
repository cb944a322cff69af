"""Hugging Face models through evtfuse: ``evtfuse.hf.patch(model)`` and ``unpatch(model)``.

Layer: library, above the runtime (it calls ``evtfuse.nn.GatedMLP``,
``evtfuse.linear_cross_entropy`` and ``evtfuse.runtime.moe``; nothing below imports it).
transformers is an optional extra (``pip install evtfuse[hf]``): this module imports it
inside the functions that need it, so ``import evtfuse`` and ``import evtfuse.hf`` work
without it.

Invariants: the model's source is never edited and its state dict keeps Hugging Face's keys
(the MLPs become ``GatedMLP`` blocks holding the very same ``Linear`` modules; the causal-LM
forward is wrapped on the instance, not on the class); a module is patched only when its
class's ``forward`` is, statement for statement, the one evtfuse reproduces (``LlamaMLP``'s,
``LlamaForCausalLM``'s, with ``final_logit_softcapping`` ``Gemma2ForCausalLM``'s, or, with
the router's auxiliary loss, ``Qwen3MoeForCausalLM``'s, read from the installed
transformers), everything else is left, with the reason in the report.
A mixture-of-experts model's experts (transformers 5.x's ``*Experts`` modules, dispatched
through transformers' ``ExpertsInterface``) run evtfuse's fused experts
(``evtfuse.runtime.moe``) as the experts implementation ``"evtfuse"``
(``register_experts``); an experts module it cannot compute exactly runs its eager forward.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
import types
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from .errors import EpilogueError
from .runtime.device import is_dtensor

# the model types the tests run (tests/test_hf.py); others are patched where their modules'
# forwards are the same statements as these
TESTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text",
                      "qwen3_moe", "mixtral", "qwen2_moe", "olmoe", "gpt_oss")
INSTALL = "pip install evtfuse[hf]"
_SLOT = "_evtfuse_head_slot"  # the lm_head attribute the capturing hook reads and writes
# the keywords of a model call that transformers' ForCausalLMLoss reads
_LOSS_KWARGS = ("num_items_in_batch", "ignore_index", "shift_labels")
# causal-LM forwards whose loss is the cross-entropy plus, where the call asks for router
# logits, ``router_aux_loss_coef`` times the load-balancing loss the forward returns as
# ``aux_loss`` (Mixtral, Qwen2/3-MoE, OLMoE, gpt-oss, ... share these statements)
_ROUTER_AUX_FORWARDS = (("qwen3_moe", "Qwen3MoeForCausalLM"), ("mixtral", "MixtralForCausalLM"))


@dataclass
class Patch:
    """What ``patch`` did (``model.evtfuse_patch``): ``mlps``, the names of the MLPs now
    ``evtfuse.nn.GatedMLP`` blocks (with their activation); ``loss``, the name of the module
    whose forward computes its loss with ``evtfuse.linear_cross_entropy`` (None when it does
    not); ``left``, (name, why) for each module left as it was. ``return_logits``: whether a
    call with labels also returns the logits (default False: ``logits`` is None, the point
    being never to hold them); a call's ``return_logits=`` keyword overrides it."""

    mlps: list[tuple[str, str]] = field(default_factory=list)
    loss: str | None = None
    experts: list[tuple[str, str]] = field(default_factory=list)
    left: list[tuple[str, str]] = field(default_factory=list)
    return_logits: bool = False
    _original_mlps: dict[str, torch.nn.Module] = field(default_factory=dict, repr=False)
    _softcap: float | None = None
    _router_aux: bool = False  # add the router's auxiliary loss (_ROUTER_AUX_FORWARDS)
    _experts_before: Any = None

    def __str__(self) -> str:
        mlps = ", ".join(f"{n} ({act})" for n, act in self.mlps)
        head = f"evtfuse.hf.patch: {len(self.mlps)} MLP(s) now evtfuse GatedMLP" + \
            (f": {mlps}" if mlps else "")
        loss = "the loss: evtfuse.linear_cross_entropy" + \
            (f" (softcap {self._softcap})" if self._softcap is not None else "") + \
            (" (plus the router's auxiliary loss)" if self._router_aux else "") + \
            (", no logits" if not self.return_logits else ", logits too") \
            if self.loss is not None else "the loss: left as it was"
        experts = [f"{len(self.experts)} experts module(s) now evtfuse's fused experts: " +
                   ", ".join(f"{n} ({act})" for n, act in self.experts)] if self.experts else []
        return "; ".join([head, loss] + experts +
                         [f"left {n or '(model)'}: {why}" for n, why in self.left])


def patch(model: torch.nn.Module, *, mlp: bool = True, loss: bool = True,
          experts: bool = True) -> torch.nn.Module:
    """Fuse a Hugging Face causal LM's MLPs and its loss with evtfuse, in place (the model is
    also returned); ``model.evtfuse_patch`` (a ``Patch``, printable) says what was patched
    and what was left, and why.

    ``mlp``: each ``LlamaMLP``-shaped block (``down_proj(act_fn(gate_proj(x)) *
    up_proj(x))``, SiLU, GELU, tanh-GELU or ReLU: Llama, Mistral, Qwen2/3, Gemma, ...)
    becomes ``evtfuse.nn.GatedMLP.adopt`` of its own Linears: same parameters, same state
    dict keys. ``experts``: a mixture-of-experts model's experts modules (Qwen3-MoE's,
    Mixtral's, ...: gated, ``gate_up_proj`` (E, 2I, H) and ``down_proj`` (E, H, I)) run
    evtfuse's fused experts, the model's experts implementation set to ``"evtfuse"``
    (``register_experts``; the modules and parameters are the model's own). ``loss``:
    ``model(input_ids, labels=...)`` computes transformers' causal-LM loss (labels shifted
    left, ``ignore_index`` -100, the mean over tokens not ignored, or
    the sum over ``num_items_in_batch`` as the Trainer passes it; ``shift_labels``) with
    ``evtfuse.linear_cross_entropy`` on the final hidden states and ``lm_head``'s weight,
    never holding the logits: the output's ``logits`` is None, unless the call passes
    ``return_logits=True`` or ``model.evtfuse_patch.return_logits`` is set. A call without
    labels is the original forward, untouched.

    Raises ``EpilogueError`` (variable "model") for a model patched already, and for one in
    which nothing could be patched (the message lists the model types evtfuse knows and why
    each candidate was left); an ImportError saying ``pip install evtfuse[hf]`` when
    transformers is not installed."""
    _transformers()
    if not isinstance(model, torch.nn.Module):
        raise EpilogueError(f"model must be a transformers model (a torch.nn.Module), not "
                            f"{type(model).__name__}", variable="model")
    if getattr(model, "evtfuse_patch", None) is not None:
        raise EpilogueError(f"model ({type(model).__name__}) is patched already "
                            "(model.evtfuse_patch); evtfuse.hf.unpatch(model) first to patch "
                            "it again", variable="model")
    for name, m in model.named_modules():
        if _SLOT in m.__dict__:
            raise EpilogueError(f"model ({type(model).__name__}) holds a module patched by "
                                f"evtfuse.hf.patch already ({name or 'the model'}); patch the "
                                "model that holds it, once", variable="model")
    report = Patch()
    if mlp:
        _patch_mlps(model, report)
    if loss:
        _patch_loss(model, report)
    if experts:
        _patch_experts(model, report)
    if not report.mlps and report.loss is None and not report.experts:
        raise EpilogueError(_nothing_to_patch(model, report, mlp, loss), variable="model")
    model.evtfuse_patch = report
    return model


def unpatch(model: torch.nn.Module) -> torch.nn.Module:
    """Undo ``patch``: the original MLP modules back in place (they hold the same Linears),
    the class's forward again, ``model.evtfuse_patch`` removed. Returns the model."""
    report = getattr(model, "evtfuse_patch", None)
    if report is None:
        raise EpilogueError(f"model ({type(model).__name__}) is not patched by evtfuse.hf.patch",
                            variable="model")
    for name, original in report._original_mlps.items():
        parent, _, child = name.rpartition(".")
        model.get_submodule(parent)._modules[child] = original
    if report.experts:
        model.set_experts_implementation(report._experts_before)
    if report.loss is not None:
        model.__dict__.pop("forward", None)
        head = model.get_submodule(report.loss)
        head._forward_pre_hooks.pop(head.__dict__.pop(_SLOT)["hook_id"], None)
    del model.evtfuse_patch
    return model


# ------------------------------------------------------------------------------ MLPs

def _patch_mlps(model: torch.nn.Module, report: Patch) -> None:
    from .nn import GatedMLP

    reference = _statements(_transformers_module("llama").LlamaMLP.forward)
    for name, module in list(model.named_modules()):
        if not _looks_gated(module):
            continue
        why, activation = _mlp_refusal(module, reference)
        if why is None:
            try:  # GatedMLP's own check of the shapes, its own message
                block = GatedMLP.adopt(module.gate_proj, module.up_proj, module.down_proj,
                                       activation)
            except EpilogueError as exc:
                why = str(exc)
        if why is not None:
            report.left.append((name, why))
            continue
        block.train(module.training)
        parent, _, child = name.rpartition(".")
        model.get_submodule(parent)._modules[child] = block
        report._original_mlps[name] = module
        report.mlps.append((name, activation))


def _looks_gated(module: torch.nn.Module) -> bool:
    return all(hasattr(module, a) for a in ("gate_proj", "up_proj", "down_proj"))


def _mlp_refusal(module: torch.nn.Module, reference) -> tuple[str | None, str | None]:
    """(None, activation) for an MLP that ``GatedMLP`` computes exactly; else (why, None)."""
    cls = type(module)
    if "forward" in module.__dict__ or module._forward_hooks or module._forward_pre_hooks:
        return f"{cls.__name__} has a forward or hooks of its own on this instance", None
    if _statements(cls.forward) != reference:
        return (f"{cls.__name__}.forward is not LlamaMLP's (down_proj(act_fn(gate_proj(x)) * "
                "up_proj(x))), so evtfuse cannot tell what it computes"), None
    for a in ("gate_proj", "up_proj", "down_proj"):
        lin = getattr(module, a)
        if type(lin) is not torch.nn.Linear or lin._forward_hooks or lin._forward_pre_hooks:
            return (f"its {a} is a {type(lin).__name__}" + (" with hooks" if type(lin) is
                    torch.nn.Linear else "") + ", not a plain torch.nn.Linear"), None
    extra = [n for n, _ in module.named_parameters(recurse=False)] + \
        [n for n, _ in module.named_buffers(recurse=False)] + \
        [n for n in module._modules if n not in ("gate_proj", "up_proj", "down_proj", "act_fn")]
    if extra:
        return f"{cls.__name__} holds more than gate_proj, up_proj, down_proj and act_fn: " \
            f"{', '.join(extra)}", None
    activation, why = _activation_of(getattr(module, "act_fn", None))
    return (why, None) if activation is None else (None, activation)


def _activation_of(act: Any) -> tuple[str | None, str]:
    """The op name of an HF activation module that computes exactly that op, else (None,
    why). ``gelu_new``, ``gelu_fast`` and ``gelu_pytorch_tanh`` are all the tanh
    approximation (``gelu_fast`` writes sqrt(2/pi) as 0.7978845608, exact to fp64's 1e-11);
    ``quick_gelu``, ``gelu_10`` (clipped), ``gelu_accurate`` are other functions."""
    from transformers import activations as A

    kind = type(act)
    if act is None:
        return None, "it has no act_fn"
    if "forward" in getattr(act, "__dict__", {}):
        return None, f"its activation {kind.__name__} has a forward of its own on this instance"
    if kind in (torch.nn.SiLU, getattr(A, "SiLUActivation", None)):
        return "silu", ""
    if kind is torch.nn.ReLU:
        return "relu", ""
    if kind is torch.nn.GELU:
        return ("gelu_tanh" if act.approximate == "tanh" else "gelu"), ""
    if kind in (getattr(A, "NewGELUActivation", None), getattr(A, "FastGELUActivation", None)):
        return "gelu_tanh", ""
    tanh = getattr(A, "GELUTanh", None) or getattr(A, "PytorchGELUTanh", None)
    inner = getattr(act, "act", None)
    if tanh is not None and kind is tanh:
        if isinstance(inner, functools.partial) and inner.func is F.gelu \
                and inner.keywords == {"approximate": "tanh"} and not inner.args:
            return "gelu_tanh", ""
        if getattr(inner, "__func__", None) is getattr(tanh, "_gelu_tanh_python", object()):
            return "gelu_tanh", ""
    if kind is getattr(A, "GELUActivation", None):
        if inner is F.gelu or getattr(inner, "__func__", None) is \
                getattr(A.GELUActivation, "_gelu_python", object()):
            return "gelu", ""
    return None, (f"its activation {kind.__name__} is none of the ones GatedMLP computes "
                  "(silu, gelu, gelu_tanh, relu)")


# ------------------------------------------------------------------------------ experts

EXPERTS = "evtfuse"  # the experts implementation's name in transformers' ExpertsInterface


def register_experts() -> str:
    """Register evtfuse's fused experts (``evtfuse.runtime.moe``) in transformers'
    ``ExpertsInterface`` as ``"evtfuse"`` (idempotent) and return that name: then
    ``from_pretrained(..., experts_implementation="evtfuse")`` or
    ``model.set_experts_implementation("evtfuse")`` runs them (``patch`` does the latter)."""
    _transformers()
    from transformers.integrations.moe import ExpertsInterface

    ExpertsInterface.register(EXPERTS, experts_forward)
    return EXPERTS


def experts_forward(self: torch.nn.Module, hidden_states: torch.Tensor,
                    top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
    """The ``"evtfuse"`` experts implementation: ``evtfuse.runtime.moe.moe_experts`` of the
    module's ``gate_up_proj`` and ``down_proj``, for an experts module whose eager forward
    it reproduces (``_experts_refusal``); any other runs its eager forward (a warning, once
    per class, says why)."""
    from .runtime.moe import moe_experts

    why, activation = _experts_decision(self)
    if why is not None:
        _warn_once(type(self), why)
        return _eager_experts(type(self))(self, hidden_states, top_k_index, top_k_weights)
    return moe_experts(hidden_states, top_k_index, top_k_weights, self.gate_up_proj,
                       self.down_proj, activation)


_DECISION = "_evtfuse_experts"  # an experts module's _experts_refusal, kept on the instance


def _experts_decision(module: torch.nn.Module) -> tuple[str | None, str | None]:
    """``_experts_refusal`` of the module, found once (at ``patch``, or at its first call)
    and kept on the instance: torch.compile reads it, never traces the inspection."""
    decision = module.__dict__.get(_DECISION)
    if decision is None:
        decision = _decide_experts(module)
    return decision


@torch.compiler.assume_constant_result
def _decide_experts(module: torch.nn.Module) -> tuple[str | None, str | None]:
    decision = _experts_refusal(module)
    module.__dict__[_DECISION] = decision
    return decision


def _eager_experts(cls: type):
    """The class's own forward, under ``use_experts_implementation``'s dispatching one."""
    return getattr(cls.forward, "__wrapped__", cls.forward)


@functools.lru_cache(maxsize=None)
def _warn_once(cls: type, why: str) -> None:
    import warnings

    warnings.warn(f"evtfuse experts: {cls.__name__} runs its eager forward: {why}",
                  stacklevel=3)


def _experts_refusal(module: torch.nn.Module) -> tuple[str | None, str | None]:
    """(None, activation) for an experts module whose forward evtfuse computes exactly
    (Qwen3MoeExperts' statements, gated, concatenated [gate; up] weights not transposed, no
    bias, no post-expert norm, not expert-parallel, a plain activation); else (why, None)."""
    from transformers.integrations.moe import _default_apply_gate

    cls = type(module)
    reference = _eager_experts(_transformers_module("qwen3_moe").Qwen3MoeExperts)
    if _statements(_eager_experts(cls)) != _statements(reference):
        return (f"{cls.__name__}'s forward is not Qwen3MoeExperts' (a per-expert "
                "act(gate) * up, down, routing weight), so evtfuse cannot tell what it "
                "computes"), None
    flags = {"has_gate": True, "is_concatenated": True, "has_bias": False,
             "is_transposed": False, "has_post_expert_norm": False,
             "_is_expert_parallel": False}
    off = [f"{k}={getattr(module, k, None)!r}" for k, v in flags.items()
           if getattr(module, k, v) != v]
    if off:
        return f"{cls.__name__} has {', '.join(off)}", None
    if getattr(cls, "_apply_gate", _default_apply_gate) is not _default_apply_gate:
        return f"{cls.__name__} has a gate of its own (_apply_gate)", None
    gu, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    if not isinstance(gu, torch.Tensor) or not isinstance(down, torch.Tensor) \
            or gu.dim() != 3 or down.dim() != 3:
        return f"{cls.__name__} has no 3-D gate_up_proj and down_proj", None
    activation, why = _activation_of(getattr(module, "act_fn", None))
    return (why, None) if activation is None else (None, activation)


def _patch_experts(model: torch.nn.Module, report: Patch) -> None:
    found = [(n, m) for n, m in model.named_modules()
             if hasattr(m, "gate_up_proj") and hasattr(m, "has_gate")
             and hasattr(type(m).forward, "__wrapped__")]
    if not found:
        return
    if not hasattr(model, "set_experts_implementation"):
        report.left.append(("", "the experts: the model has no set_experts_implementation"))
        return
    names = []
    for name, m in found:
        why, activation = _decide_experts(m)
        if why is None:
            names.append((name, activation))
        else:
            report.left.append((name, f"{why} (it runs its eager forward)"))
    if not names:
        return
    register_experts()
    before = model.config._experts_implementation
    model.set_experts_implementation(EXPERTS)
    report.experts, report._experts_before = names, before


# ------------------------------------------------------------------------------ loss

def _patch_loss(model: torch.nn.Module, report: Patch) -> None:
    why, softcap, router_aux = _loss_refusal(model)
    if why is not None:
        report.left.append(("", f"the loss: {why}"))
        return
    head = model.lm_head
    slot = {"armed": False, "keep_logits": False, "hidden": None}
    slot["hook_id"] = head.register_forward_pre_hook(_capture_head_input).id
    head.__dict__[_SLOT] = slot
    # a bound method in the instance's __dict__ (a deep copy of the model binds its copy),
    # showing the class's forward's signature to who inspects it (the Trainer, generate)
    model.__dict__["forward"] = types.MethodType(_forward_of(type(model)), model)
    report.loss, report._softcap, report._router_aux = "lm_head", softcap, router_aux


def _loss_refusal(model: torch.nn.Module) -> tuple[str | None, float | None, bool]:
    """Why the model's loss cannot be computed by evtfuse (None: it can), the logits'
    softcap and whether the router's auxiliary loss is added (``_ROUTER_AUX_FORWARDS``)."""
    cls = type(model)
    head = getattr(model, "lm_head", None)
    if not isinstance(head, torch.nn.Linear) or type(head).forward is not torch.nn.Linear.forward:
        return f"{cls.__name__} has no lm_head that is a torch.nn.Linear", None, False
    if "forward" in model.__dict__:
        return f"{cls.__name__} has a forward of its own on this instance", None, False
    if head._forward_pre_hooks or head._forward_hooks:
        return "its lm_head has hooks", None, False
    if getattr(model, "_loss_function", None) is not None or \
            getattr(model, "loss_type", "ForCausalLM") not in (None, "ForCausalLM"):
        return (f"its loss function is not transformers' ForCausalLMLoss (loss_type "
                f"{getattr(model, 'loss_type', None)!r}, or a loss_function set)"), None, False
    config = getattr(model, "config", None)
    mine = _statements(cls.forward)
    if mine == _statements(_transformers_module("llama").LlamaForCausalLM.forward):
        return None, None, False
    if mine == _statements(_transformers_module("gemma2").Gemma2ForCausalLM.forward):
        return None, getattr(config, "final_logit_softcapping", None), False
    for model_type, name in _ROUTER_AUX_FORWARDS:
        reference = getattr(_transformers_module(model_type), name, None)
        if reference is not None and mine == _statements(reference.forward):
            return None, None, True
    return (f"{cls.__name__}.forward is neither LlamaForCausalLM's, Gemma2ForCausalLM's nor "
            "Qwen3MoeForCausalLM's (a logit scale, another auxiliary loss, ...), so evtfuse "
            "cannot tell that its loss is the plain causal-LM cross-entropy"), None, False


def _capture_head_input(head: torch.nn.Module, args: tuple):
    """lm_head's forward pre-hook: when ``_forward`` armed it, keep lm_head's input (the
    hidden states its logits would be computed from) and, unless the logits are wanted, give
    lm_head none of its rows (its logits: an empty tensor, nothing computed). A head whose
    weight is a DTensor (transformers' tensor parallelism, which gathers the logits over the
    vocabulary) gets one row per sequence instead, whose logits are dropped: DTensor's view
    rule divides by a dimension's size, and fails on an empty one (torch 2.13)."""
    slot = head.__dict__[_SLOT]
    if not slot["armed"]:
        return None
    slot["armed"] = False
    hidden = args[0]
    slot["hidden"] = hidden
    if slot["keep_logits"]:
        return None
    rows = 1 if is_dtensor(head.weight) else 0
    return (hidden[..., :rows, :], *args[1:])


@functools.lru_cache(maxsize=None)
def _forward_of(cls: type):
    @functools.wraps(cls.forward)
    def forward(self, *args, **kwargs):
        return _forward(self, *args, **kwargs)
    return forward


def _forward(self, *args, **kwargs):
    """The patched causal LM's forward: without labels the original; with labels the
    original without them (lm_head given no rows), then the loss from lm_head's input."""
    report: Patch = self.evtfuse_patch
    inner = types.MethodType(type(self).forward, self)
    keep = kwargs.pop("return_logits", None)
    keep = report.return_logits if keep is None else bool(keep)
    labels = kwargs.pop("labels", None)
    if labels is None and len(args) > 1:  # labels given by position
        bound = inspect.signature(inner).bind(*args, **kwargs)
        labels = bound.arguments.get("labels")
        if labels is not None:
            bound.arguments["labels"] = None
            args, kwargs = bound.args, bound.kwargs
    if labels is None:
        return inner(*args, **kwargs)
    return_dict = kwargs.pop("return_dict", None)
    if return_dict is None:
        return_dict = getattr(self.config, "return_dict", True)
    head = self.lm_head
    slot = head.__dict__[_SLOT]
    slot.update(armed=True, keep_logits=keep, hidden=None)
    try:
        out = inner(*args, return_dict=True, **kwargs)
        hidden = slot["hidden"]
    finally:
        slot.update(armed=False, hidden=None)
    if hidden is None:
        raise RuntimeError(f"evtfuse.hf: {type(self).__name__}'s forward did not call lm_head, "
                           "so evtfuse has no hidden states to compute the loss from")
    loss = causal_lm_loss(hidden, head.weight, labels, bias=head.bias, softcap=report._softcap,
                          **{k: kwargs[k] for k in _LOSS_KWARGS if k in kwargs})
    if report._router_aux and out.get("aux_loss") is not None:  # as the original adds it
        loss = loss + self.router_aux_loss_coef * out["aux_loss"].to(loss.device)
    fields = {k: v for k, v in out.items() if k not in ("loss", "logits")}
    if keep:
        fields["logits"] = out["logits"]
    out = type(out)(loss=loss, **fields)
    return out if return_dict else out.to_tuple()


def causal_lm_loss(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *,
                   bias: torch.Tensor | None = None, softcap: float | None = None,
                   num_items_in_batch: torch.Tensor | int | None = None,
                   ignore_index: int = -100, shift_labels: torch.Tensor | None = None
                   ) -> torch.Tensor:
    """transformers' ``ForCausalLMLoss`` of ``logits = hidden @ weight.T + bias`` (soft-capped
    when ``softcap``), through ``evtfuse.linear_cross_entropy``: the labels padded with
    ``ignore_index`` on the right and shifted left by one (unless ``shift_labels`` is given),
    the mean over tokens not ignored, or the sum divided by ``num_items_in_batch`` when given
    (the Trainer's count over the whole, gradient-accumulated, batch)."""
    from .losses import linear_cross_entropy

    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    target = shift_labels.reshape(-1).to(hidden.device)
    if torch.is_autocast_enabled(hidden.device.type):  # as lm_head's F.linear would compute
        dtype = torch.get_autocast_dtype(hidden.device.type)
        hidden, weight = hidden.to(dtype), weight.to(dtype)
        bias = None if bias is None else bias.to(dtype)
    reduction = "mean" if num_items_in_batch is None else "sum"
    loss = linear_cross_entropy(hidden.reshape(-1, hidden.shape[-1]), weight, target, bias=bias,
                                ignore_index=ignore_index, reduction=reduction, softcap=softcap)
    if num_items_in_batch is not None:
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss = loss / num_items_in_batch
    return loss


# ------------------------------------------------------------------------------ helpers

def _transformers():
    try:
        import transformers
    except ImportError as exc:
        raise ImportError("evtfuse.hf needs transformers, an optional extra of evtfuse: "
                          f"{INSTALL}") from exc
    return transformers


def _transformers_module(model_type: str):
    import importlib

    return importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")


@functools.lru_cache(maxsize=None)
def _statements(fn) -> str | None:
    """A function's statements (its body without the docstring, its parameters, no
    decorators, no comments) as an AST dump: two forwards compare equal when they compute
    the same thing the same way. None when its source cannot be read."""
    fn = inspect.unwrap(fn)
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return None
    node = tree.body[0]
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    params = [a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]
    return repr(params) + "".join(ast.dump(s) for s in body)


def _nothing_to_patch(model: torch.nn.Module, report: Patch, mlp: bool, loss: bool) -> str:
    cls = type(model).__name__
    kind = getattr(getattr(model, "config", None), "model_type", None)
    asked = " and ".join(w for w, on in (("MLPs", mlp), ("loss", loss)) if on) or "nothing"
    why = "".join(f"; {n or '(model)'}: {w}" for n, w in report.left[:6])
    if len(report.left) > 6:
        why += f"; ... ({len(report.left) - 6} more)"
    return (f"evtfuse.hf.patch found nothing to patch in {cls} (model_type {kind!r}; asked "
            f"for: {asked}). It patches causal LMs of the model types "
            f"{', '.join(TESTED_MODEL_TYPES)}, and others whose MLPs' forward is LlamaMLP's "
            "and whose causal-LM forward is LlamaForCausalLM's (or Gemma2ForCausalLM's, or "
            "Qwen3MoeForCausalLM's), and mixture-of-experts models' experts modules"
            + (why or "; no module with gate_proj, up_proj and down_proj, and no lm_head"))
