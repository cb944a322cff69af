"""evtfuse.hf.patch on tiny Hugging Face models (CPU tier: the interpreter, float32): the
patched model's loss and every gradient are the original's, its state dict is the
original's, the Trainer's loss path works, and the errors say what is wrong."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")  # CI installs evtfuse[hf]

from evtfuse import EpilogueError  # noqa: E402
from evtfuse.hf import patch, unpatch  # noqa: E402
from evtfuse.nn import GatedMLP  # noqa: E402
from doc_blocks import run_page  # noqa: E402
from tiers import quick  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 96
SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=VOCAB, head_dim=8)


@pytest.fixture(autouse=True)
def _interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _model(kind: str, **extra):
    """A tiny causal LM of ``kind`` with random float32 weights (the seed fixed)."""
    from transformers import (Gemma2Config, Gemma2ForCausalLM, GemmaConfig, GemmaForCausalLM,
                              LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                              Qwen3Config, Qwen3ForCausalLM)

    config, cls = {"llama": (LlamaConfig, LlamaForCausalLM),
                   "qwen3": (Qwen3Config, Qwen3ForCausalLM),
                   "mistral": (MistralConfig, MistralForCausalLM),
                   "gemma": (GemmaConfig, GemmaForCausalLM),
                   "gemma2": (Gemma2Config, Gemma2ForCausalLM)}[kind]
    if kind == "gemma":
        extra.setdefault("hidden_act", "gelu_pytorch_tanh")
    torch.manual_seed(0)
    model = cls(config(**{**SMALL, **extra})).float()
    for p in model.parameters():  # larger than the init's 0.02: gradients well above rounding
        torch.nn.init.normal_(p, std=0.2)
    return model


def _batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (2, 8), generator=g)
    labels = ids.clone()
    labels[0, :3] = -100  # ignored tokens
    labels[1, 5] = -100
    return ids, labels


def _worst_grad_error(a: torch.nn.Module, b: torch.nn.Module) -> float:
    worst = 0.0
    pb = dict(b.named_parameters())
    for name, p in a.named_parameters():
        q = pb[name]
        assert p.grad is not None and q.grad is not None, name
        worst = max(worst, ((p.grad - q.grad).abs().max() / p.grad.abs().max()).item())
    return worst


CASES = [("llama", {}, "silu"), ("qwen3", {}, "silu"), ("mistral", {}, "silu"),
         ("gemma", {}, "gelu_tanh"), ("gemma2", {"final_logit_softcapping": 3.0}, "gelu_tanh")]


@pytest.mark.parametrize("kind, extra, act", quick(CASES, ["gemma2"],
                                                   ids=[c[0] for c in CASES], args=3))
def test_loss_and_gradients_match_the_original(kind, extra, act):
    model = _model(kind, **extra)
    patched = patch(copy.deepcopy(model))
    report = patched.evtfuse_patch
    assert report.mlps == [("model.layers.0.mlp", act)] and report.loss == "lm_head"
    assert isinstance(patched.model.layers[0].mlp, GatedMLP)
    assert type(model.model.layers[0].mlp) is not GatedMLP  # the deep copy was patched only
    ids, labels = _batch()
    for kw in ({}, {"num_items_in_batch": torch.tensor(7)}, {"num_items_in_batch": 7}):
        want = model(ids, labels=labels, **kw)
        got = patched(ids, labels=labels, **kw)
        assert got.logits is None and got["loss"] is got.loss
        torch.testing.assert_close(got.loss, want.loss, rtol=1e-5, atol=1e-6)
        want.loss.backward()
        got.loss.backward()
        assert _worst_grad_error(model, patched) < 1e-4, kw
        model.zero_grad()
        patched.zero_grad()
    # no labels: the original forward (its MLPs fused: the same logits up to rounding)
    torch.testing.assert_close(patched(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)
    loss_only = patch(copy.deepcopy(model), mlp=False)  # the original's modules: bit for bit
    assert torch.equal(loss_only(ids).logits, model(ids).logits)


def test_the_patched_loss_is_not_the_torch_one_by_accident():
    """The patched model's loss comes from evtfuse.linear_cross_entropy (the lm_head never
    runs on the rows), not from transformers' loss on logits."""
    model = patch(_model("llama"))
    ids, labels = _batch()
    calls = []
    model.lm_head.register_forward_hook(lambda m, a, out: calls.append(out.shape))
    out = model(ids, labels=labels)
    assert calls == [torch.Size([2, 0, VOCAB])] and out.logits is None


def test_shift_labels_and_a_custom_ignore_index():
    model = _model("llama")
    patched = patch(copy.deepcopy(model))
    ids, labels = _batch()
    shift = torch.roll(labels, -1, dims=1)
    shift[:, -1] = 7  # a target at the last position, which padding would have ignored
    want, got = model(ids, labels=labels, shift_labels=shift), \
        patched(ids, labels=labels, shift_labels=shift)
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-5, atol=1e-6)
    lab = labels.masked_fill(labels == -100, 5)
    want, got = model(ids, labels=lab, ignore_index=5), patched(ids, labels=lab, ignore_index=5)
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-5, atol=1e-6)


def test_logits_on_request_and_the_output_forms():
    model = _model("llama")
    patched = patch(copy.deepcopy(model), mlp=False)  # the original's logits, bit for bit
    ids, labels = _batch()
    want = model(ids, labels=labels)
    both = patched(ids, labels=labels, return_logits=True)
    assert torch.equal(both.logits, want.logits)
    torch.testing.assert_close(both.loss, want.loss, rtol=1e-5, atol=1e-6)
    patched.evtfuse_patch.return_logits = True  # the model's default
    assert patched(ids, labels=labels).logits is not None
    assert patched(ids, labels=labels, return_logits=False).logits is None
    patched.evtfuse_patch.return_logits = False
    # labels by position (after input_ids, attention_mask, position_ids, cache, inputs_embeds)
    out = patched(ids, None, None, None, None, labels)
    torch.testing.assert_close(out.loss, want.loss, rtol=1e-5, atol=1e-6)
    tup, want_tup = patched(ids, labels=labels, return_dict=False), \
        model(ids, labels=labels, return_dict=False)  # (loss, logits, cache): no logits
    assert isinstance(tup, tuple) and len(tup) == len(want_tup) - 1
    torch.testing.assert_close(tup[0], want.loss, rtol=1e-5, atol=1e-6)
    assert [type(x) for x in tup[1:]] == [type(x) for x in want_tup[2:]]
    # with a cache: the original's fields (the cache's name changed within transformers 5)
    mask = torch.ones_like(ids)
    a = model(ids, attention_mask=mask, labels=labels, use_cache=True)
    b = patched(ids, attention_mask=mask, labels=labels, use_cache=True)
    assert list(b.keys()) == [k for k in a.keys() if k != "logits"] and len(b) >= 2
    assert [type(v) for k, v in b.items()] == [type(v) for k, v in a.items() if k != "logits"]


def test_generate_is_the_original():
    model = _model("llama")
    patched = patch(copy.deepcopy(model))
    ids, _ = _batch()
    kw = dict(max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert torch.equal(model.generate(ids, **kw), patched.generate(ids, **kw))


def test_state_dict_round_trips_bit_for_bit(tmp_path):
    model = _model("gemma")
    patched = patch(copy.deepcopy(model))
    sd, psd = model.state_dict(), patched.state_dict()
    assert list(sd) == list(psd)
    assert all(torch.equal(sd[k], psd[k]) for k in sd)
    fresh = patch(_model("gemma", rms_norm_eps=1e-5))
    fresh.load_state_dict(sd)  # the original's checkpoint into a patched model
    assert all(torch.equal(v, fresh.state_dict()[k]) for k, v in sd.items())
    back = _model("gemma")
    with torch.no_grad():
        for p in back.parameters():
            p.zero_()
    back.load_state_dict(fresh.state_dict())  # and back
    assert all(torch.equal(v, back.state_dict()[k]) for k, v in sd.items())
    # save_pretrained from the patched model, from_pretrained into an original one
    patched.save_pretrained(tmp_path / "ckpt")
    loaded = type(model).from_pretrained(tmp_path / "ckpt")
    lsd = loaded.state_dict()
    assert all(torch.equal(v, lsd[k]) for k, v in sd.items())


def test_a_checkpoint_with_other_keys_names_them():
    model = patch(_model("llama"))
    sd = model.state_dict()
    sd["model.layers.0.mlp.gate_up_proj.weight"] = sd.pop("model.layers.0.mlp.gate_proj.weight")
    with pytest.raises(RuntimeError) as exc:
        model.load_state_dict(sd)
    text = str(exc.value)
    assert "model.layers.0.mlp.gate_proj.weight" in text and "gate_up_proj" in text


def test_report_and_unpatch():
    model = _model("llama", num_hidden_layers=2)
    original_mlps = [layer.mlp for layer in model.model.layers]
    ids, labels = _batch()
    want = model(ids, labels=labels).loss
    patch(model)
    text = str(model.evtfuse_patch)
    assert "2 MLP(s)" in text and "model.layers.1.mlp (silu)" in text and "no logits" in text
    unpatch(model)
    assert [layer.mlp for layer in model.model.layers] == original_mlps
    assert "forward" not in model.__dict__ and not hasattr(model, "evtfuse_patch")
    assert not model.lm_head._forward_pre_hooks
    out = model(ids, labels=labels)
    assert out.logits is not None and torch.equal(out.loss, want)
    patch(model)  # once unpatched, it patches again
    with pytest.raises(EpilogueError, match="is not patched"):
        unpatch(unpatch(model))


def test_a_deep_copy_of_a_patched_model_is_patched_on_its_own():
    model = patch(_model("llama"))
    twin = copy.deepcopy(model)
    assert twin.forward.__self__ is twin and twin.evtfuse_patch is not model.evtfuse_patch
    ids, labels = _batch()
    with torch.no_grad():
        twin.lm_head.weight.mul_(2.0)  # the twin's own weights, not the model's
    a, b = model(ids, labels=labels), twin(ids, labels=labels)
    assert a.logits is None and b.logits is None and not torch.equal(a.loss, b.loss)
    unpatch(twin)
    assert model(ids, labels=labels).logits is None  # the model is still patched


def test_only_what_was_asked():
    model = patch(_model("llama"), loss=False)
    assert model.evtfuse_patch.loss is None and "forward" not in model.__dict__
    assert "the loss: left as it was" in str(model.evtfuse_patch)
    model = patch(_model("llama"), mlp=False)
    assert model.evtfuse_patch.mlps == [] and model.evtfuse_patch.loss == "lm_head"


def test_modules_left_and_why():
    from transformers.activations import QuickGELUActivation

    model = _model("llama", num_hidden_layers=2)
    model.model.layers[1].mlp.act_fn = QuickGELUActivation()
    patch(model)
    report = model.evtfuse_patch
    assert [n for n, _ in report.mlps] == ["model.layers.0.mlp"]
    (name, why), = report.left
    assert name == "model.layers.1.mlp" and "QuickGELUActivation is none of" in why
    assert "left model.layers.1.mlp" in str(report)


def test_patched_twice_is_an_error():
    model = patch(_model("llama"))
    with pytest.raises(EpilogueError, match="is patched already") as exc:
        patch(model)
    assert exc.value.variable == "model"
    with pytest.raises(EpilogueError, match="patched by evtfuse.hf.patch already"):
        patch(torch.nn.Sequential(model))
    errors_md = (ROOT / "docs" / "errors.md").read_text()
    assert "is patched already (model.evtfuse_patch)" in str(exc.value) and \
        "is patched already (model.evtfuse_patch)" in errors_md


def test_an_unknown_model_lists_what_it_can_patch():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=VOCAB))
    with pytest.raises(EpilogueError) as exc:
        patch(model)
    text = str(exc.value)
    assert exc.value.variable == "model" and "found nothing to patch in GPT2LMHeadModel" in text
    assert "'gpt2'" in text and "llama, mistral, qwen2, qwen3, gemma" in text
    assert "GPT2LMHeadModel.forward is neither LlamaForCausalLM's" in text
    assert not hasattr(model, "evtfuse_patch")
    assert "found nothing to patch in GPT2LMHeadModel (model_type 'gpt2'" in \
        (ROOT / "docs" / "errors.md").read_text()
    with pytest.raises(EpilogueError, match="must be a transformers model"):
        patch("llama")


def test_a_forward_that_is_not_llamas_is_left():
    from transformers import GraniteConfig, GraniteForCausalLM

    model = GraniteForCausalLM(GraniteConfig(**SMALL, logits_scaling=4.0))
    patch(model)  # its MLP is LlamaMLP's; its forward divides the logits: left
    assert model.evtfuse_patch.loss is None and len(model.evtfuse_patch.mlps) == 1
    assert "GraniteForCausalLM.forward is neither" in str(model.evtfuse_patch)


@pytest.mark.slow
def test_trainer_loss_path(tmp_path):
    """transformers' Trainer, one step with gradient accumulation (it passes
    num_items_in_batch): the same loss and weights as the original model's."""
    from transformers import Trainer, TrainingArguments

    ids = torch.randint(0, VOCAB, (4, 8), generator=torch.Generator().manual_seed(3))
    data = [{"input_ids": r, "labels": r.masked_fill(torch.arange(8) < i, -100)}
            for i, r in enumerate(ids)]
    results = []
    for fuse in (False, True):
        model = _model("llama")
        if fuse:
            patch(model)
        args = TrainingArguments(output_dir=str(tmp_path / str(fuse)),
                                 per_device_train_batch_size=2,
                                 gradient_accumulation_steps=2, max_steps=1, learning_rate=0.1,
                                 optim="sgd",  # the weights after a step: 0.1 * gradients
                                 report_to=[], use_cpu=True, logging_steps=1, save_strategy="no",
                                 dataloader_num_workers=0, seed=0, data_seed=0)
        trainer = Trainer(model=model, args=args, train_dataset=data)
        out = trainer.train()
        results.append((out.training_loss, [p.detach().clone() for p in model.parameters()]))
    (loss_a, params_a), (loss_b, params_b) = results
    assert loss_b == pytest.approx(loss_a, rel=1e-5)
    for a, b in zip(params_a, params_b):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_compiled_training_step_gives_the_same_loss():
    model = _model("qwen3")
    patched = patch(copy.deepcopy(model))
    ids, labels = _batch()
    want = model(ids, labels=labels).loss
    want.backward()
    compiled = torch.compile(patched, backend="aot_eager")
    got = compiled(ids, labels=labels).loss
    got.backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert _worst_grad_error(model, patched) < 1e-4


def _moe_model(kind: str, **extra):
    """A tiny Qwen3-MoE or Mixtral causal LM (float32, random weights, experts_implementation
    "eager"): 4 experts, 2 per token; the Qwen3-MoE one's second layer a dense MLP."""
    from transformers import (MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig,
                              Qwen3MoeForCausalLM)

    if kind == "qwen3_moe":
        config = Qwen3MoeConfig(**{**SMALL, "num_hidden_layers": 2, "moe_intermediate_size": 24,
                                   "num_experts": 4, "num_experts_per_tok": 2,
                                   "mlp_only_layers": [1], "norm_topk_prob": True},
                                experts_implementation="eager", **extra)
        cls = Qwen3MoeForCausalLM
    else:
        config = MixtralConfig(**{**SMALL, "num_hidden_layers": 2, "intermediate_size": 24,
                                  "num_local_experts": 4,
                                  "num_experts_per_tok": 2}, experts_implementation="eager",
                               **extra)
        cls = MixtralForCausalLM
    torch.manual_seed(0)
    model = cls(config).float()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    return model


@pytest.mark.parametrize("kind", quick(["qwen3_moe", "mixtral"], ["qwen3_moe"]))
def test_moe_experts_match_the_original(kind, monkeypatch):
    """The experts of a mixture-of-experts model run evtfuse's fused experts (the experts
    implementation "evtfuse", registered in transformers' ExpertsInterface): the loss and
    every gradient are the original's ("eager"); unpatch restores "eager"."""
    from evtfuse.runtime import moe

    calls = []
    real = moe.moe_experts
    monkeypatch.setattr(moe, "moe_experts", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = _moe_model(kind)
    patched = patch(copy.deepcopy(model))
    report = patched.evtfuse_patch
    assert report.experts == [("model.layers.0.mlp.experts", "silu")] + \
        ([("model.layers.1.mlp.experts", "silu")] if kind == "mixtral" else [])
    assert report.mlps == ([("model.layers.1.mlp", "silu")] if kind == "qwen3_moe" else [])
    assert report.loss == "lm_head"  # the MoE causal-LM forward: its aux loss is added
    assert "experts module(s) now evtfuse's fused experts" in str(report)
    assert patched.config._experts_implementation == "evtfuse"
    assert model.config._experts_implementation == "eager"
    ids, labels = _batch()
    want, got = model(ids, labels=labels), patched(ids, labels=labels)
    assert len(calls) == len(report.experts)
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-5, atol=1e-6)
    want.loss.backward()
    got.loss.backward()
    assert _worst_grad_error(model, patched) < 1e-4
    assert patched.state_dict().keys() == model.state_dict().keys()
    unpatch(patched)
    assert patched.config._experts_implementation == "eager"


@pytest.mark.parametrize("kind", quick(["qwen3_moe", "mixtral"], ["mixtral"]))
def test_moe_loss_with_the_routers_auxiliary_loss_matches_the_original(kind):
    """A mixture-of-experts causal LM asked for its router logits adds
    ``router_aux_loss_coef`` times the load-balancing loss to the cross-entropy: the patched
    model (loss through evtfuse.linear_cross_entropy, no logits) adds the same, and its
    gradients (the router's included) are the original's; without router logits, none."""
    model = _moe_model(kind, output_router_logits=True, router_aux_loss_coef=0.5)
    patched = patch(copy.deepcopy(model), experts=False)
    report = patched.evtfuse_patch
    assert report.loss == "lm_head" and "plus the router's auxiliary loss" in str(report)
    ids, labels = _batch()
    want, got = model(ids, labels=labels), patched(ids, labels=labels)
    assert got.logits is None and got.aux_loss is not None
    torch.testing.assert_close(got.aux_loss, want.aux_loss)
    assert abs(want.aux_loss.item()) * 0.5 > 1e-3  # the term the patched loss must add
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-5, atol=1e-6)
    want.loss.backward()
    got.loss.backward()
    assert _worst_grad_error(model, patched) < 1e-4
    plain = model(ids, labels=labels, output_router_logits=False).loss
    torch.testing.assert_close(patched(ids, labels=labels, output_router_logits=False).loss,
                               plain, rtol=1e-5, atol=1e-6)
    assert abs(plain.item() - want.loss.item()) > 1e-3


# other mixture-of-experts families whose causal-LM forward is Qwen3-MoE's: (config, model
# class, sizes, what patch makes of the experts: None where they are left, as gpt-oss's
# biased, clamped experts are)
OTHER_MOE = {
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                  dict(moe_intermediate_size=24, shared_expert_intermediate_size=40,
                       num_experts=4, num_experts_per_tok=2), "silu"),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM",
              dict(intermediate_size=24, num_experts=4, num_experts_per_tok=2), "silu"),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM",
                dict(intermediate_size=24, num_local_experts=4, num_experts_per_tok=2,
                     layer_types=["full_attention", "full_attention"]), None),
}


@pytest.mark.parametrize("kind", quick(sorted(OTHER_MOE), ["qwen2_moe"]))
def test_other_moe_families_match_the_original(kind):
    """Qwen2-MoE (a shared expert beside the routed ones: a LlamaMLP-shaped block, patched),
    OLMoE and gpt-oss share Qwen3-MoE's causal-LM forward: their loss (the router's term
    included) runs through linear_cross_entropy and their experts through evtfuse's where
    it computes them exactly; loss and every gradient as the original's."""
    import transformers

    config_name, model_name, sizes, act = OTHER_MOE[kind]
    config = getattr(transformers, config_name)(**{**SMALL, "num_hidden_layers": 2, **sizes},
                                                output_router_logits=True)
    torch.manual_seed(0)
    model = getattr(transformers, model_name)(config).float()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    model.set_experts_implementation("eager")
    patched = patch(copy.deepcopy(model))
    report = patched.evtfuse_patch
    assert report.loss == "lm_head" and "plus the router's auxiliary loss" in str(report)
    want_experts = [] if act is None else [(f"model.layers.{i}.mlp.experts", act)
                                           for i in range(2)]
    assert report.experts == want_experts, report
    if kind == "qwen2_moe":
        assert [n for n, _ in report.mlps] == [f"model.layers.{i}.mlp.shared_expert"
                                               for i in range(2)]
    ids, labels = _batch()
    want, got = model(ids, labels=labels), patched(ids, labels=labels)
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-5, atol=1e-6)
    want.loss.backward()
    got.loss.backward()
    assert _worst_grad_error(model, patched) < 1e-4


def test_moe_experts_left_run_their_eager_forward():
    """An experts module whose activation evtfuse does not compute is left (the report
    says why) and runs its eager forward under "evtfuse" (a warning says why)."""
    from evtfuse.hf import register_experts

    model = _moe_model("mixtral")
    model.model.layers[0].mlp.experts.act_fn = torch.nn.Tanh()
    patched = patch(copy.deepcopy(model), mlp=False, loss=False)
    report = patched.evtfuse_patch
    assert report.experts == [("model.layers.1.mlp.experts", "silu")]
    assert report.left[0][0] == "model.layers.0.mlp.experts" and "Tanh" in report.left[0][1]
    ids, _ = _batch()
    with pytest.warns(UserWarning, match="MixtralExperts runs its eager forward"):
        got = patched(ids).logits
    torch.testing.assert_close(got, model(ids).logits, rtol=1e-5, atol=1e-5)
    assert register_experts() == "evtfuse"
    model.set_experts_implementation("evtfuse")  # the user's way, without patch


@pytest.mark.slow
def test_moe_block_compiles_without_a_graph_break():
    """A Qwen3-MoE sparse block (router and experts) with experts_implementation "evtfuse"
    traces with no graph break (the check of what the experts module computes runs once,
    outside the graph) and gives the eager results."""
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    from evtfuse.hf import register_experts

    register_experts()
    config = Qwen3MoeConfig(hidden_size=16, moe_intermediate_size=24, num_experts=4,
                            num_experts_per_tok=2)
    config._experts_implementation = "evtfuse"
    torch.manual_seed(0)
    block = Qwen3MoeSparseMoeBlock(config)
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.3)
    x = torch.randn(1, 6, 16)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(copy.deepcopy(block))(x)
    assert explained.graph_break_count == 0, explained.break_reasons
    compiled = torch.compile(copy.deepcopy(block), fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), block(x), rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_import_evtfuse_does_not_import_transformers():
    code = ("import sys, evtfuse, evtfuse.hf; "
            "print('transformers' in sys.modules)")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"


@pytest.mark.slow
def test_patch_without_transformers_says_how_to_install():
    code = ("import sys; sys.modules['transformers'] = None\n"
            "import torch, evtfuse.hf\n"
            "try:\n    evtfuse.hf.patch(torch.nn.Linear(2, 2))\n"
            "except ImportError as e:\n    print(e)\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "pip install evtfuse[hf]" in res.stdout


@pytest.mark.slow
def test_models_md_runs(tmp_path):
    """Every python block of docs/models.md, in one script, on the CPU interpreter."""
    run_page("models.md", tmp_path, ("evtfuse.hf.patch", "GatedMLP", "linear_cross_entropy"),
             timeout=300)


@pytest.mark.slow
def test_models_benchmark_runs_tiny(tmp_path):
    """benchmarks/models.py --tiny (the CPU smoke run): every variant asked for gets a time,
    a loss and the gradients' error against the original's, in the JSON and the table; a
    mixture-of-experts model too (its experts and its loss patched)."""
    import json

    out = tmp_path / "models.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "models.py"), "--tiny", "--models",
           "llama,qwen3_moe",
           "--variants", "patched,original,patched_compile", "--rounds", "1", "--steps", "1",
           "--warmup", "1", "--out", str(out)]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), TRITON_INTERPRET="1",
               CUDA_VISIBLE_DEVICES="", EVTFUSE_CACHE_DIR=str(tmp_path / "cache"))
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    results = json.loads(out.read_text())["models"]["llama"]["results"]
    assert list(results) == ["original", "patched", "patched_compile"]  # the reference first
    for variant in ("patched", "patched_compile"):
        r = results[variant]
        assert "error" not in r and r["ms"] > 0 and len(r["ms_rounds"]) == 1
        assert r["loss_rel"] < 1e-5 and r["grad_rel_worst"] < 1e-4
        assert "MLP(s) now evtfuse GatedMLP" in r["patch"]
    assert "| llama | patched_compile |" in res.stdout
    moe = json.loads(out.read_text())["models"]["qwen3_moe"]["results"]  # experts and loss
    assert moe["patched"]["loss_rel"] < 1e-5 and moe["patched"]["grad_rel_worst"] < 1e-4
    assert "experts module(s) now evtfuse's fused experts" in moe["patched"]["patch"]
    assert "the loss: evtfuse.linear_cross_entropy" in moe["patched"]["patch"]
