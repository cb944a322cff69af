"""Whole Hugging Face models, one training step, original against ``evtfuse.hf.patch``
(issue 47), every variant in the same run:

    PYTHONPATH=src python3 benchmarks/models.py --out bench_out/models.json
    ... --models llama,qwen3,gemma2 --variants original,patched,original_compile,patched_compile
    ... --rounds 7 --layers 2 --tokens 4x2048
    PYTHONPATH=src TRITON_INTERPRET=1 python3 benchmarks/models.py --tiny --out /tmp/m.json  # CPU

Models (random weights, ``--dtype`` bf16, ``--layers`` decoder layers): ``llama``
(Llama-3-8B's shapes: hidden 4096, intermediate 14336, 32 heads / 8 KV heads, vocab
128256), ``qwen3`` (Qwen3-8B's: hidden 4096, intermediate 12288, 32 / 8 heads of 128,
vocab 151936), ``gemma2`` (Gemma-2-9B's: hidden 3584, intermediate 14336, 16 / 8 heads of
256, vocab 256000, tanh-GELU, final logit softcap 30); mixture-of-experts models (issue 49; run
them with ``--tokens 8x2048``, the issue's 16384 tokens): ``qwen3_moe`` (Qwen3-30B-A3B's
widths: hidden 2048, 128 experts of 768, top-8, 32 / 4 heads of 128, vocab 151936) and
``mixtral`` (Mixtral-8x7B's: hidden 4096, 8 experts of 14336, top-2, 32 / 8 heads, vocab
32000), every layer's MLP sparse, the original's experts through transformers'
``grouped_mm`` implementation (``--experts``). The patched model is a deep copy of the
original (the same weights), then ``evtfuse.hf.patch`` (its experts ``"evtfuse"``).

Variants: ``original`` (transformers' model, eager), ``patched`` (its MLPs
``evtfuse.nn.GatedMLP``, its loss ``evtfuse.linear_cross_entropy`` without logits),
``patched_mlp`` and ``patched_loss`` (``patch(loss=False)``: MLPs and experts, and
``patch(mlp=False, experts=False)``: where the gain comes from), and ``<variant>_compile``: ``torch.compile(model)`` of any of them
(``--compile-backend``, Inductor by default; the compile happens in the warm-up).

A step is ``model(input_ids, labels=labels, use_cache=False).loss.backward()`` with the
gradients set to None before it (so each step allocates its gradients, as a training step
does); no optimizer: its cost is the same for every variant and would only dilute the
difference. Time: each of ``--rounds`` rounds runs every variant once, in turn, for
``--steps`` steps timed with CUDA events (ms per step); a variant's time is the median of its
rounds (``ms_rounds``: all). Memory: ``peak_beyond_mib``, ``torch.cuda.max_memory_allocated``
during one step (the peak reset before it) minus what was allocated before it: activations,
logits where a variant makes them, gradients, workspaces. Accuracy: one step on the same batch
for every variant, its loss and its gradients against ``original``'s, per parameter the
largest difference over the largest magnitude of the original's gradient
(``grad_rel_worst`` and the parameter it is at); ``original_compile``'s errors show the
bf16 noise floor. With ``--tiny`` (CPU: the interpreter), tiny models in float32, times from
``time.perf_counter`` and no memory; it checks that the script runs, it measures nothing.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time
import traceback

import torch

import evtfuse
import evtfuse.hf

MIB = 1 << 20
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
BASE_VARIANTS = ("original", "patched", "patched_mlp", "patched_loss")
DEFAULT_VARIANTS = "original,patched,original_compile,patched_compile"

# (transformers config class, model class, the config's sizes)
MODELS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM",
              dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                   num_key_value_heads=8, vocab_size=128256)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM",
              dict(hidden_size=4096, intermediate_size=12288, num_attention_heads=32,
                   num_key_value_heads=8, head_dim=128, vocab_size=151936,
                   tie_word_embeddings=False)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
               dict(hidden_size=3584, intermediate_size=14336, num_attention_heads=16,
                    num_key_value_heads=8, head_dim=256, vocab_size=256000,
                    hidden_activation="gelu_pytorch_tanh", final_logit_softcapping=30.0)),
}
MODELS.update({  # mixture-of-experts models (issue 49): every decoder layer's MLP sparse
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(hidden_size=2048, moe_intermediate_size=768, num_experts=128,
                       num_experts_per_tok=8, norm_topk_prob=True, num_attention_heads=32,
                       num_key_value_heads=4, head_dim=128, vocab_size=151936,
                       tie_word_embeddings=False)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                dict(hidden_size=4096, intermediate_size=14336, num_local_experts=8,
                     num_experts_per_tok=2, num_attention_heads=32, num_key_value_heads=8,
                     vocab_size=32000)),
})
TINY = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
            head_dim=8, vocab_size=128)
TINY_MOE = {"qwen3_moe": dict(moe_intermediate_size=24, num_experts=4, num_experts_per_tok=2),
            "mixtral": dict(num_local_experts=4, num_experts_per_tok=2)}


def build(name: str, layers: int, dtype: torch.dtype, device: str, tiny: bool,
          experts: str = "grouped_mm"):
    """The model ``name`` with random weights (seed 0), in training mode; a mixture-of-experts
    model's experts run transformers' implementation ``experts``."""
    import transformers

    config_cls, model_cls, sizes = MODELS[name]
    sizes = {**sizes, **TINY, **TINY_MOE.get(name, {})} if tiny else dict(sizes)
    config = getattr(transformers, config_cls)(num_hidden_layers=layers, **sizes)
    config.use_cache = False
    torch.manual_seed(0)
    with torch.device(device):
        model = getattr(transformers, model_cls)(config)
    if name in TINY_MOE and hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation(experts)
    return model.to(dtype).train()


def variant_model(original: torch.nn.Module, variant: str, backend: str):
    """The module a variant runs (and the module holding its parameters)."""
    base = variant.removesuffix("_compile")
    if base not in BASE_VARIANTS:
        raise ValueError(f"unknown variant {variant!r}: one of {', '.join(BASE_VARIANTS)}, "
                         "each optionally with _compile")
    model = original
    if base != "original":
        model = evtfuse.hf.patch(copy.deepcopy(original), mlp=base != "patched_loss",
                                 loss=base != "patched_mlp", experts=base != "patched_loss")
    runs = torch.compile(model, backend=backend) if variant.endswith("_compile") else model
    return runs, model


class Clock:
    """Elapsed ms of a block of steps: CUDA events on a GPU, perf_counter on the CPU."""

    def __init__(self, cuda: bool):
        self.cuda = cuda

    def ms(self, fn, steps: int) -> float:
        if not self.cuda:
            t0 = time.perf_counter()
            for _ in range(steps):
                fn()
            return (time.perf_counter() - t0) * 1e3 / steps
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(steps):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / steps


def batch(vocab: int, shape: tuple[int, int], ignore_frac: float, device: str):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, shape, generator=g)
    labels = ids.clone()
    labels[:, :int(shape[1] * ignore_frac)] = -100  # a prompt whose tokens have no loss
    return ids.to(device), labels.to(device)


def run_model(name: str, args, clock: Clock) -> dict:
    device = "cpu" if args.tiny else "cuda"
    dtype = torch.float32 if args.tiny else DTYPES[args.dtype]
    original = build(name, args.layers, dtype, device, args.tiny, args.experts)
    ids, labels = batch(original.config.vocab_size, args.tokens, args.ignore_frac, device)
    results: dict = {v: {} for v in args.variants}
    steps: dict = {}
    holders: dict = {}

    for variant in args.variants:
        try:
            runs, holder = variant_model(original, variant, args.compile_backend)
        except Exception as exc:  # noqa: BLE001  (a variant that fails is a result)
            traceback.print_exc()
            results[variant] = {"error": _error(exc)}
            continue
        params = list(holder.parameters())

        def step(runs=runs, params=params):
            for p in params:
                p.grad = None
            loss = runs(input_ids=ids, labels=labels, use_cache=False).loss
            loss.backward()
            return loss

        steps[variant], holders[variant] = step, holder
        if getattr(holder, "evtfuse_patch", None) is not None:
            results[variant]["patch"] = str(holder.evtfuse_patch)

    reference = None
    for variant in list(steps):  # warm-up (compiles, tunes), accuracy, memory
        r = results[variant]
        print(f"{name} {variant}: warm-up, accuracy, memory ...", flush=True)
        try:
            t0 = time.perf_counter()
            for _ in range(args.warmup):
                steps[variant]()
            r["warmup_s"] = time.perf_counter() - t0
            loss = steps[variant]().detach().float()
            grads = {n: p.grad for n, p in holders[variant].named_parameters()}
            r["loss"] = loss.item()
            if variant == "original":
                reference = (loss, {n: g.detach().clone() for n, g in grads.items()})
            elif reference is not None:
                r.update(_errors(loss, grads, *reference))
            if not args.tiny:
                r.update(_memory(steps[variant]))
        except Exception as exc:  # noqa: BLE001
            traceback.print_exc()
            r["error"] = _error(exc)
            steps.pop(variant)
        for p in holders[variant].parameters():
            p.grad = None

    for rnd in range(args.rounds):  # timing: every variant once a round, in turn
        print(f"{name}: round {rnd + 1} of {args.rounds}", flush=True)
        for variant, step in list(steps.items()):
            try:
                results[variant].setdefault("ms_rounds", []).append(clock.ms(step, args.steps))
            except Exception as exc:  # noqa: BLE001
                traceback.print_exc()
                results[variant]["error"] = _error(exc)
                steps.pop(variant)
    for r in results.values():
        if r.get("ms_rounds"):
            r["ms"] = statistics.median(r["ms_rounds"])
    base = results.get("original", {}).get("ms")
    for r in results.values():
        if base and r.get("ms"):
            r["x_original"] = r["ms"] / base
    for holder in holders.values():
        for p in holder.parameters():
            p.grad = None
    return {"config": original.config.to_dict(), "tokens": list(args.tokens),
            "results": results}


def _errors(loss, grads, ref_loss, ref_grads) -> dict:
    worst, where = 0.0, None
    for n, want in ref_grads.items():
        got = grads.get(n)
        if got is None:
            return {"loss_rel": _rel(loss, ref_loss), "grad_rel_worst": float("inf"),
                    "grad_rel_at": f"{n}: no gradient"}
        scale = want.float().abs().max().clamp_min(1e-30)
        err = ((got.float() - want.float()).abs().max() / scale).item()
        if err > worst or where is None:
            worst, where = err, n
    return {"loss_rel": _rel(loss, ref_loss), "grad_rel_worst": worst, "grad_rel_at": where}


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return (abs(got - want) / abs(want).clamp_min(1e-30)).item()


def _memory(step) -> dict:
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    return {"peak_beyond_mib": (peak - before) / MIB, "peak_mib": peak / MIB}


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:2000]


def table(report: dict) -> str:
    """The markdown table of a run's results."""
    rows = ["| model | variant | ms / step | x original | peak beyond MiB | loss | loss rel "
            "| worst grad rel (parameter) |", "|---|---|---:|---:|---:|---:|---:|---|"]

    def f(r, k, fmt):
        return format(r[k], fmt) if r.get(k) is not None else "-"

    for name, m in report["models"].items():
        if "error" in m:
            rows.append(f"| {name} | - | error: {m['error'][:120]} | | | | | |")
            continue
        for variant, r in m["results"].items():
            if "error" in r and "ms" not in r:
                rows.append(f"| {name} | {variant} | error: {r['error'][:120]} | | | | | |")
                continue
            at = f" ({r['grad_rel_at']})" if r.get("grad_rel_at") else ""
            rows.append(f"| {name} | {variant} | {f(r, 'ms', '.2f')} | {f(r, 'x_original', '.3f')} "
                        f"| {f(r, 'peak_beyond_mib', '.0f')} | {f(r, 'loss', '.5f')} "
                        f"| {f(r, 'loss_rel', '.1e')} | {f(r, 'grad_rel_worst', '.1e')}{at} |")
    return "\n".join(rows)


def _tokens(text: str) -> tuple[int, int]:
    b, _, t = text.partition("x")
    if not t:
        raise argparse.ArgumentTypeError(f"--tokens must be BATCHxSEQ (4x2048), not {text!r}")
    return int(b), int(t)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench_out/models.json")
    p.add_argument("--models", default="llama,qwen3", help=f"of {', '.join(MODELS)}")
    p.add_argument("--variants", default=DEFAULT_VARIANTS,
                   help=f"of {', '.join(BASE_VARIANTS)}, each also as <variant>_compile")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=3, help="steps timed in each round")
    p.add_argument("--warmup", type=int, default=2, help="steps before measuring")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--tokens", type=_tokens, default=(4, 2048), help="BATCHxSEQ")
    p.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    p.add_argument("--ignore-frac", type=float, default=0.0,
                   help="fraction of each sequence, from its start, whose labels are -100")
    p.add_argument("--compile-backend", default="inductor")
    p.add_argument("--experts", default="grouped_mm",
                   help="transformers' experts implementation of the original MoE models")
    p.add_argument("--tiny", action="store_true",
                   help="CPU smoke run: tiny models, float32, the interpreter, aot_eager")
    args = p.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    args.variants = [v for v in args.variants.split(",") if v]
    for m in args.models:
        if m not in MODELS:
            p.error(f"--models: unknown model {m!r}; one of {', '.join(MODELS)}")
    if "original" in args.variants:  # first: the reference of every accuracy
        args.variants.remove("original")
        args.variants.insert(0, "original")
    if args.tiny:
        from evtfuse.runtime.device import use_interpreter

        use_interpreter()
        if args.tokens == (4, 2048):
            args.tokens = (2, 8)
        if args.compile_backend == "inductor":
            args.compile_backend = "aot_eager"
    elif not torch.cuda.is_available():
        p.error("no CUDA GPU: run with --tiny (a CPU smoke run) or on a GPU")
    import transformers
    import triton

    report = {"config": {k: v for k, v in vars(args).items() if k != "out"},
              "device": "cpu (interpreter)" if args.tiny else torch.cuda.get_device_name(),
              "torch": torch.__version__, "triton": triton.__version__,
              "transformers": transformers.__version__, "evtfuse": evtfuse.__version__,
              "models": {}}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    clock = Clock(cuda=not args.tiny)
    for name in args.models:
        try:
            report["models"][name] = run_model(name, args, clock)
        except Exception as exc:  # noqa: BLE001  (a model that fails is a result)
            traceback.print_exc()
            report["models"][name] = {"error": _error(exc)}
        if not args.tiny:
            torch.cuda.empty_cache()
        from evtfuse.runtime.tuner import chosen_kernels

        report["evtfuse_kernels"] = chosen_kernels()  # (M, kernel) of every evtfuse GEMM so far
        with open(args.out, "w") as f:  # after every model: a killed run keeps what it measured
            json.dump(report, f, indent=1)
    print(table(report))
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
