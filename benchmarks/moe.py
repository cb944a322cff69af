"""A mixture of experts' up-projection with a SwiGLU epilogue and routing weights, measured
on a GPU, every peer in the same run (BENCHMARKS.md, "Mixture of experts"):

    PYTHONPATH=src python3 benchmarks/moe.py --out bench_out/moe.json

16384 routed tokens, bf16, two configurations: 8 experts of 4096 -> 2 x 14336 (Mixtral-like)
and 64 experts of 2048 -> 2 x 1408 (fine-grained), each with uniform routing and with
skewed routing (one expert a quarter of the tokens, a few experts empty). Group sizes are
multiples of 16 (what ``torch._grouped_mm`` asks of its offsets). Per cell:

- ``grouped_mm``: ``torch._grouped_mm(x, W.mT, offs)`` alone, no epilogue (the floor);
- ``grouped_mm_eager``: the same, then the epilogue in eager torch
  (``silu(gate) * up * w`` over the concatenated [gate | up] halves);
- ``grouped_mm_compile``: ``torch.compile`` of that pair;
- ``evtfuse``: ``evtfuse.grouped_gemm`` with the epilogue fused (gate and up interleaved,
  ``interleave_gate_up(..., dim=1)``), its first call (tuning included) and its error
  against the eager pair;
- ``evtfuse_concat``: the same on the peers' own concatenated [gate; up] weights
  (``pairs(accum, layout="concatenated")``: no interleaved copy of the weights).

Times are medians of ``triton.testing.do_bench``; TFLOP/s count 2 * T * K * 2N; ``dense_mm``
is one plain (T, K) @ (K, 2N) GEMM of the same FLOPs, the throughput a grouped GEMM aims at.

``--layer``: the whole experts layer (up-projection, SwiGLU, down-projection, routing weight,
sum over the top-k), FORWARD + BACKWARD, issue 49 item 3:

    PYTHONPATH=src python3 benchmarks/moe.py --layer --out bench_out/moe_layer.json
    PYTHONPATH=src TRITON_INTERPRET=1 python3 benchmarks/moe.py --layer --tiny  # CPU smoke test

Same 16384 tokens, bf16 and configurations (experts x hidden H x intermediate I), with top-k
2 for 8x4096x14336 and 8 for 64x2048x1408 (``--top-k`` overrides both). Routing is (T, k)
expert ids, distinct per token, and weights (a softmax over k random logits, differentiated):
uniform (every expert exactly T * k / E assignments, tokens shuffled) or skewed (expert 0 a
quarter of the T * k assignments, or every token where k > 4 makes a quarter impossible;
every eighth expert, and the last one when E < 8, none; the rest uneven); each cell records
the largest group, its share and the empty groups. Every variant uses the SAME parameter
tensors (gate_up_proj (E, 2I, H), down_proj (E, H, I)), input, routing and fixed upstream
gradient; a step is ``out = layer(x, index, weights); out.backward(g)`` with x, weights and
both parameters requiring grad (their grads reset to None before each step):

- ``evtfuse``: ``evtfuse.nn.MoEExperts`` (fused grouped GEMMs forward and backward);
- ``evtfuse_wgrad_mm``: the same with the expert weights' gradients (plain GEMMs grouped
  over K) by ``torch._grouped_mm`` instead of evtfuse's (``runtime.moe.WEIGHT_GRADS``);
- ``hf_eager``: transformers' ``Qwen3MoeExperts`` with ``config._experts_implementation =
  "eager"`` (its per-expert loop; the accuracy baseline);
- ``hf_grouped_mm``: the same module with ``"grouped_mm"`` (transformers'
  ``grouped_mm_experts_forward``: sort by expert, ``torch._grouped_mm``);
- ``hf_grouped_mm_compile``: ``torch.compile`` of that module (inductor, ``--compile-mode``
  default max-autotune-no-cudagraphs on CUDA; the first step, compilation included, is
  recorded as ``_first_step_s``, as evtfuse's, tuning included);
- ``reference``: plain torch: sort the token-expert pairs by expert, ``torch._grouped_mm``
  for gate_up, eager SwiGLU times the routing weight, ``torch._grouped_mm`` for down,
  scatter-sum (``index_add``) back to tokens; skipped, with the reason, where
  ``torch._grouped_mm`` is missing or fails on the device.

A variant that cannot run records ``<variant>_skipped`` (or ``_error``) and the others go on.
Numbers per variant: ``_fwd_ms`` (the forward alone, autograd recording, output dropped) and
``_step_ms`` (forward + backward), each the median over ``--rounds`` interleaved rounds (every
variant once per round, in turn) of ``triton.testing.do_bench``'s median on CUDA, or of
``time.perf_counter`` around one call on the CPU; ``_bwd_ms`` = step - forward. TF/s count
the issue's FLOPs: step 3 x 2 x T x k x H x 3I (forward 1/3 of it, backward 2/3), as
``_step_tflops``, ``_fwd_tflops`` and ``_bwd_tflops``. ``_peak_mib`` (CUDA only): the peak
allocated during one step above what was allocated before it (the shared weights, inputs and
other variants' state are not counted). ``_rel_err_<out|x|weights|gate_up|down>``: relative
norm ||v - hf_eager|| / ||hf_eager|| of the output and each gradient, in float32.

``--tiny``: 4 experts, H=16, I=24, 32 tokens, top-2, float32, on the CPU (through Triton's
interpreter for evtfuse), 2 rounds: a smoke test of the script, its times meaningless. There
``hf_grouped_mm_compile`` compiles with ``backend="aot_eager"`` (dynamo and AOT autograd, no
inductor code generation: inductor's cold C++ build of the forward and backward takes ~15 s
on a CPU, more than the smoke test's budget); ``--compile-backend inductor`` puts it back.
On the CPU a variant's time is one call per round, so ``_bwd_ms`` can come out negative
(noise; ``_bwd_tflops`` is then null).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F
import triton.testing

import evtfuse
import evtfuse.nn

BF = torch.bfloat16
TOKENS = 16384
CONFIGS = {"8x4096x14336": (8, 4096, 14336), "64x2048x1408": (64, 2048, 1408),
           "128x2048x768": (128, 2048, 768)}  # Mixtral-8x7B's, fine-grained, Qwen3-30B-A3B's
DEFAULT_CONFIGS = "8x4096x14336,64x2048x1408"
EPILOGUE = """def moe_swiglu(accum, w):
    gate, up = pairs(accum)
    D = silu(gate) * up * w
    return D"""
EPILOGUE_CONCAT = EPILOGUE.replace("pairs(accum)", 'pairs(accum, layout="concatenated")')


def _ms(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def group_sizes(G: int, T: int, skewed: bool, multiple: int = 16) -> list[int]:
    """Rows per expert summing to T, each a multiple of ``multiple``: uniform, or one
    expert a quarter of T, every eighth expert empty and the rest uneven."""
    units = T // multiple
    if skewed:
        big = units // 4
        weights = [0 if g % 8 == 7 else 1 + (g * 5) % 7 for g in range(G)]
        weights[0] = 0
        rest = units - big
        sizes = [rest * w // sum(weights) for w in weights]
        sizes[0] = big
    else:
        sizes = [units // G] * G
    sizes[-1 if not skewed else 1] += units - sum(sizes)
    return [s * multiple for s in sizes]


def cell(G: int, K: int, N: int, skewed: bool) -> dict:
    torch.manual_seed(0)
    T = TOKENS
    x = torch.randn(T, K, device="cuda", dtype=BF)
    Wg = (torch.randn(G, N, K, device="cuda") * K ** -0.5).to(BF)
    Wu = (torch.randn(G, N, K, device="cuda") * K ** -0.5).to(BF)
    W_cat = torch.cat((Wg, Wu), dim=1)                        # (G, 2N, K): [gate; up]
    W_int = evtfuse.interleave_gate_up(Wg, Wu, dim=1)         # (G, 2N, K): interleaved
    w = torch.rand(T, 1, device="cuda", dtype=torch.float32)
    sizes = group_sizes(G, T, skewed)
    offs = torch.tensor(sizes, device="cuda", dtype=torch.int32).cumsum(0).to(torch.int32)
    D = torch.empty(T, N, device="cuda", dtype=BF)

    def grouped_mm():
        return torch._grouped_mm(x, W_cat.mT, offs=offs)

    def eager_pair(x, W_cat, offs, w):
        h = torch._grouped_mm(x, W_cat.mT, offs=offs)
        return (F.silu(h[:, :N]) * h[:, N:] * w).to(BF)

    def eager():
        return eager_pair(x, W_cat, offs, w)

    compiled_pair = torch.compile(eager_pair, mode="max-autotune-no-cudagraphs")

    def compiled():
        return compiled_pair(x, W_cat, offs, w)

    def ev():
        return evtfuse.grouped_gemm(x, W_int.mT, offs, EPILOGUE, w=w, D=D)

    def ev_concat():
        return evtfuse.grouped_gemm(x, W_cat.mT, offs, EPILOGUE_CONCAT, w=w, D=D)

    flop = 2 * T * K * 2 * N
    out: dict = {"experts": G, "K": K, "N": N, "tokens": T,
                 "routing": "skewed" if skewed else "uniform", "largest_group": max(sizes),
                 "empty_groups": sum(s == 0 for s in sizes)}
    t = time.perf_counter()
    ev()
    torch.cuda.synchronize()
    out["evtfuse_first_call_s"] = time.perf_counter() - t
    want = eager().float()
    got = ev().float()
    out["evtfuse_rel_err"] = float((got - want).norm() / want.norm())
    ev_concat()  # tuning
    got = ev_concat().float()
    out["evtfuse_concat_rel_err"] = float((got - want).norm() / want.norm())
    from evtfuse.runtime import cache  # the kernels the tuner chose (this shape's records)

    out["evtfuse_kernels"] = sorted({e["kernel"] for e in cache.list_entries()
                                     if e.get("epilogue") == "moe_swiglu" and e.get("K") == K})
    xd, Wd = x, W_cat[0].mT  # one (K, 2N) column-major B, as each group's
    peers = {"dense_mm": lambda: xd @ Wd, "grouped_mm": grouped_mm, "grouped_mm_eager": eager,
             "grouped_mm_compile": compiled, "evtfuse": ev, "evtfuse_concat": ev_concat}
    for name, fn in peers.items():
        try:
            ms = _ms(fn)
            out[f"{name}_ms"] = ms
            out[f"{name}_tflops"] = flop / ms / 1e9
        except Exception as e:  # noqa: BLE001  (one peer's failure does not lose the others)
            out[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:500]}"
    for peer in ("grouped_mm", "grouped_mm_eager", "grouped_mm_compile"):
        for ev_name in ("evtfuse", "evtfuse_concat"):
            if f"{ev_name}_ms" in out and f"{peer}_ms" in out:
                out[f"{ev_name}_over_{peer}"] = out[f"{ev_name}_ms"] / out[f"{peer}_ms"]
    return out


def table(cells: list) -> str:
    rows = ["| experts x K x N | routing | grouped_mm ms (TFLOP/s) | + eager epilogue | "
            "torch.compile | evtfuse | evtfuse / grouped_mm | / eager | / compile |",
            "|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        if "error" in c:
            rows.append(f"| {c['name']} | | error: {c['error'][:80]} |||||||")
            continue

        def ms(p):
            return f"{c[p + '_ms']:.3f} ({c[p + '_tflops']:.0f})" if p + "_ms" in c else "error"

        def ratio(p):
            return f"{c['evtfuse_over_' + p]:.3f}" if "evtfuse_over_" + p in c else "-"

        rows.append(f"| {c['experts']}x{c['K']}x{c['N']} | {c['routing']} | {ms('grouped_mm')} | "
                    f"{ms('grouped_mm_eager')} | {ms('grouped_mm_compile')} | {ms('evtfuse')} | "
                    f"{ratio('grouped_mm')} | {ratio('grouped_mm_eager')} | "
                    f"{ratio('grouped_mm_compile')} |")
    return "\n".join(rows)

# ------------------------------------------------------------------------ --layer: the experts


LAYER_TOPK = {"8x4096x14336": 2, "64x2048x1408": 8, "128x2048x768": 8}
TINY = {"experts": 4, "H": 16, "I": 24, "tokens": 32, "top_k": 2}
LAYER_VARIANTS = ("evtfuse", "evtfuse_wgrad_mm", "hf_eager", "hf_grouped_mm",
                  "hf_grouped_mm_compile", "reference")
# module settings a variant runs under (set around each of its calls, forward and backward)
SETTINGS = {"evtfuse_wgrad_mm": ("WEIGHT_GRADS", "grouped_mm")}


@contextlib.contextmanager
def _setting(variant: str):
    """``variant``'s setting of ``evtfuse.runtime.moe`` (``SETTINGS``) while it runs."""
    from evtfuse.runtime import moe as moe_ops

    if variant not in SETTINGS:
        yield
        return
    name, value = SETTINGS[variant]
    before = getattr(moe_ops, name)
    setattr(moe_ops, name, value)
    try:
        yield
    finally:
        setattr(moe_ops, name, before)


def layer_routing(T: int, E: int, k: int, skewed: bool, seed: int = 0, device="cpu"):
    """(T, k) int64 expert ids, distinct within a token, and (T, k) float32 routing weights
    (a softmax over k random logits). Uniform: every expert exactly T * k / E assignments
    (when E divides T * k), tokens shuffled. Skewed: expert 0 in min(T, T * k / 4) tokens (a
    quarter of the assignments where k <= 4 allows it), experts e % 8 == 7 (and the last
    one when E < 8) in none, the others drawn without replacement with uneven weights."""
    if k > E:
        raise ValueError(f"top-k {k} > experts {E}")
    g = torch.Generator().manual_seed(seed)
    if not skewed:
        stride = max(E // k, 1)
        start = torch.randperm(T, generator=g) % E
        index = torch.stack([(start + j * stride) % E for j in range(k)], 1)
        if E % k:  # stride * j wraps onto an earlier pick: fall back to k consecutive ids
            index = torch.stack([(start + j) % E for j in range(k)], 1)
    else:
        empty = {e for e in range(E) if e % 8 == 7} | ({E - 1} if E < 8 else set())
        others = [e for e in range(1, E) if e not in empty]
        if len(others) < k:
            raise ValueError(f"skewed routing needs {k} experts besides 0 and the empty ones")
        p = torch.tensor([1.0 + (e * 5) % 7 for e in others])
        n_hot = min(T, T * k // 4)
        hot = torch.zeros(T, dtype=torch.bool)
        hot[torch.randperm(T, generator=g)[:n_hot]] = True
        picks = torch.multinomial(p.expand(T, -1), k, replacement=False, generator=g)
        index = torch.tensor(others)[picks]
        index[hot, 0] = 0  # the hot expert replaces one of that token's picks
    logits = torch.randn(T, k, generator=g)
    weights = torch.softmax(logits, dim=-1)
    return index.to(device), weights.to(device)


def reference_experts(x, index, weights, gate_up, down):
    """Plain torch with ``torch._grouped_mm``: the (T * k) token-expert pairs sorted by
    expert, one grouped GEMM for [gate; up], SwiGLU and the routing weight in eager torch, one
    grouped GEMM for down, then summed back onto the tokens."""
    T, k = index.shape
    E, I2 = gate_up.shape[0], gate_up.shape[1]
    flat = index.reshape(-1)
    order = torch.argsort(flat, stable=True)
    token = order // k
    counts = torch.bincount(flat, minlength=E)
    offs = counts.cumsum(0).to(torch.int32)
    xs = x[token]
    h = torch._grouped_mm(xs, gate_up.mT, offs=offs)                 # (T k, 2I)
    a = F.silu(h[:, : I2 // 2]) * h[:, I2 // 2:]
    a = a * weights.reshape(-1)[order, None].to(a.dtype)
    y = torch._grouped_mm(a, down.mT, offs=offs)                      # (T k, H)
    return torch.zeros_like(x).index_add(0, token, y.to(x.dtype))


def _hf_experts(E: int, H: int, I: int, k: int, implementation: str):
    """transformers' Qwen3-MoE experts module, its implementation picked as transformers 5.x
    does for a standalone module: ``config._experts_implementation`` (read on every forward by
    the ``@use_experts_implementation`` wrapper; "eager" is the class's own loop)."""
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    config = Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=I, num_experts=E,
                            num_experts_per_tok=k, hidden_act="silu")
    config._experts_implementation = implementation
    with torch.device("meta"):
        module = Qwen3MoeExperts(config)
    assert module.config._experts_implementation == implementation
    return module


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


class _Timer:
    """One measurement of fn: do_bench's median on CUDA, one perf_counter call on the CPU."""

    def __init__(self, cuda: bool):
        self.cuda = cuda

    def __call__(self, fn) -> float:
        if self.cuda:
            return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3


def layer_cell(E: int, H: int, I: int, T: int, k: int, skewed: bool, dtype, device: str,
               rounds: int, variants: list[str], compile_mode: str | None,
               compile_backend: str | None = None) -> dict:
    torch.manual_seed(0)
    cuda = device == "cuda"
    index, weights = layer_routing(T, E, k, skewed, device=device)
    sizes = torch.bincount(index.reshape(-1).cpu(), minlength=E).tolist()
    out: dict = {"experts": E, "H": H, "I": I, "tokens": T, "top_k": k, "dtype": str(dtype),
                 "routing": "skewed" if skewed else "uniform", "largest_group": max(sizes),
                 "largest_group_share": max(sizes) / (T * k),
                 "empty_groups": sum(s == 0 for s in sizes)}
    flop_step = 3 * 2 * T * k * H * 3 * I
    out["flop_step"] = flop_step
    x = torch.randn(T, H, device=device, dtype=dtype, requires_grad=True)
    w = weights.to(dtype).requires_grad_(True)
    gate_up = torch.nn.Parameter((torch.randn(E, 2 * I, H, device=device) * H ** -0.5).to(dtype))
    down = torch.nn.Parameter((torch.randn(E, H, I, device=device) * I ** -0.5).to(dtype))
    grad_out = torch.randn(T, H, device=device, dtype=dtype)
    leaves = {"x": x, "weights": w, "gate_up": gate_up, "down": down}

    def share(module):  # every variant on the same parameter tensors
        module.gate_up_proj = gate_up
        module.down_proj = down
        return module

    forwards: dict = {}
    skipped: dict = {}
    ev = evtfuse.nn.MoEExperts(E, H, I, device="meta", dtype=dtype)
    forwards["evtfuse"] = share(ev)
    forwards["evtfuse_wgrad_mm"] = share(evtfuse.nn.MoEExperts(E, H, I, device="meta",
                                                               dtype=dtype))
    try:
        forwards["hf_eager"] = share(_hf_experts(E, H, I, k, "eager"))
        hf_g = share(_hf_experts(E, H, I, k, "grouped_mm"))
        forwards["hf_grouped_mm"] = hf_g
        backend = compile_backend or "inductor"
        out["compile_backend"] = backend
        if backend == "inductor":
            mode = compile_mode or ("max-autotune-no-cudagraphs" if cuda else "default")
            out["compile_mode"] = mode
            forwards["hf_grouped_mm_compile"] = torch.compile(hf_g, mode=mode)
        else:
            forwards["hf_grouped_mm_compile"] = torch.compile(hf_g, backend=backend)
    except ImportError as e:
        for v in ("hf_eager", "hf_grouped_mm", "hf_grouped_mm_compile"):
            skipped[v] = f"transformers: {e}"
    if not hasattr(torch, "_grouped_mm"):
        skipped["reference"] = "torch._grouped_mm does not exist in this torch"
    else:
        try:  # a grouped GEMM of the cell's dtype on the device, the smallest
            torch._grouped_mm(torch.zeros(16, 16, device=device, dtype=dtype),
                              torch.zeros(1, 16, 16, device=device, dtype=dtype),
                              offs=torch.tensor([16], device=device, dtype=torch.int32))
            forwards["reference"] = lambda x, i, w: reference_experts(x, i, w, gate_up, down)
        except Exception as e:  # noqa: BLE001
            skipped["reference"] = f"torch._grouped_mm fails on {device}: {type(e).__name__}: {e}"
    if "hf_eager" in forwards and "hf_eager" not in variants:
        variants = ["hf_eager", *variants]
    for v in variants:
        if v not in forwards and v not in skipped:
            skipped[v] = "not built"
    for v, why in skipped.items():
        if v in variants:
            out[f"{v}_skipped"] = why[:500]
    run = [v for v in variants if v in forwards]

    def reset():
        for t in leaves.values():
            t.grad = None

    def fwd_fn(v):
        f = forwards[v]

        def fwd():
            with _setting(v):
                return f(x, index, w)
        return fwd

    def step_fn(v):
        f = forwards[v]

        def step():
            reset()
            with _setting(v):
                f(x, index, w).backward(grad_out)
        return step

    # first call of each (evtfuse's tuning, torch.compile's compilation), outputs and grads
    results = {}
    for v in list(run):
        try:
            reset()
            t = time.perf_counter()
            with _setting(v):
                y = forwards[v](x, index, w)
                y.backward(grad_out)
            if cuda:
                torch.cuda.synchronize()
            out[f"{v}_first_step_s"] = time.perf_counter() - t
            results[v] = {"out": y.detach().clone(),
                          **{n: leaf.grad.detach().clone() for n, leaf in leaves.items()}}
        except Exception as e:  # noqa: BLE001  (one variant's failure does not lose the others)
            out[f"{v}_error"] = f"{type(e).__name__}: {str(e)[:500]}"
            run.remove(v)
    base = results.get("hf_eager")
    for v, r in results.items():
        if base is not None and v != "hf_eager":
            for n in r:
                out[f"{v}_rel_err_{n}"] = _rel(r[n], base[n])
    del results, base
    reset()

    if cuda:  # peak memory of one step above what is allocated before it
        for v in list(run):
            try:
                torch.cuda.synchronize()
                reset()
                torch.cuda.reset_peak_memory_stats()
                before = torch.cuda.memory_allocated()
                step_fn(v)()
                torch.cuda.synchronize()
                out[f"{v}_peak_mib"] = (torch.cuda.max_memory_allocated() - before) / 2 ** 20
            except Exception as e:  # noqa: BLE001
                out[f"{v}_error"] = f"{type(e).__name__}: {str(e)[:500]}"
                run.remove(v)
        reset()

    timer = _Timer(cuda)
    fwd_ms: dict = {v: [] for v in run}
    step_ms: dict = {v: [] for v in run}
    for _ in range(rounds):  # interleaved: every variant once per round, in turn
        for v in list(run):
            try:
                fwd_ms[v].append(timer(fwd_fn(v)))
                step_ms[v].append(timer(step_fn(v)))
            except Exception as e:  # noqa: BLE001
                out[f"{v}_error"] = f"{type(e).__name__}: {str(e)[:500]}"
                run.remove(v)
    reset()
    for v in run:
        f, s = statistics.median(fwd_ms[v]), statistics.median(step_ms[v])
        out[f"{v}_fwd_ms"], out[f"{v}_step_ms"], out[f"{v}_bwd_ms"] = f, s, s - f
        out[f"{v}_step_tflops"] = flop_step / s / 1e9
        out[f"{v}_fwd_tflops"] = flop_step / 3 / f / 1e9
        out[f"{v}_bwd_tflops"] = 2 * flop_step / 3 / (s - f) / 1e9 if s > f else None
        out[f"{v}_rounds_step_ms"] = step_ms[v]
    for v in run:
        for peer in ("hf_eager", "hf_grouped_mm", "hf_grouped_mm_compile", "reference"):
            if v == "evtfuse" and f"{peer}_step_ms" in out:
                out[f"evtfuse_over_{peer}_step"] = out["evtfuse_step_ms"] / out[f"{peer}_step_ms"]
    return out


def layer_table(cells: list, variants: list[str]) -> str:
    rows = ["| experts x H x I | k | routing | variant | step ms | fwd ms | bwd ms | step TF/s | "
            "fwd TF/s | bwd TF/s | peak MiB | rel err out / x / w / gate_up / down |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def num(c, key, fmt):
        v = c.get(key)
        return format(v, fmt) if isinstance(v, (int, float)) else "-"

    for c in cells:
        if "error" in c:
            rows.append(f"| {c['name']} | | | | error: {c['error'][:80]} ||||||||")
            continue
        head = f"| {c['experts']}x{c['H']}x{c['I']} | {c['top_k']} | {c['routing']}"
        for v in variants:
            if f"{v}_step_ms" not in c:
                why = c.get(f"{v}_skipped") or c.get(f"{v}_error") or "not run"
                rows.append(f"{head} | {v} | {why[:60]} ||||||||")
                continue
            errs = " / ".join(num(c, f"{v}_rel_err_{n}", ".1e")
                              for n in ("out", "x", "weights", "gate_up", "down"))
            if v == "hf_eager":
                errs = "(baseline)"
            rows.append(f"{head} | {v} | {num(c, v + '_step_ms', '.3f')} | "
                        f"{num(c, v + '_fwd_ms', '.3f')} | {num(c, v + '_bwd_ms', '.3f')} | "
                        f"{num(c, v + '_step_tflops', '.1f')} | "
                        f"{num(c, v + '_fwd_tflops', '.1f')} | "
                        f"{num(c, v + '_bwd_tflops', '.1f')} | {num(c, v + '_peak_mib', '.0f')} | "
                        f"{errs} |")
    return "\n".join(rows)


def layer_main(a) -> None:
    cuda = torch.cuda.is_available() and not a.tiny
    device = "cuda" if cuda else "cpu"
    dtype = BF if cuda else torch.float32
    rounds = a.rounds or (2 if a.tiny else 3 if not cuda else 5)
    variants = [v for v in a.variants.split(",") if v]
    for v in variants:
        if v not in LAYER_VARIANTS:
            raise SystemExit(f"unknown variant {v!r}: {', '.join(LAYER_VARIANTS)}")
    out_path = a.out or "bench_out/moe_layer.json"
    compile_backend = a.compile_backend or ("aot_eager" if a.tiny else "inductor")
    results = {"mode": "layer", "tiny": a.tiny, "device": torch.cuda.get_device_name() if cuda
               else "cpu", "torch": torch.__version__, "triton": triton.__version__,
               "triton_interpret": os.environ.get("TRITON_INTERPRET", ""), "rounds": rounds,
               "variants": variants, "compile_backend": compile_backend, "cells": []}
    try:
        import transformers

        results["transformers"] = transformers.__version__
    except ImportError:
        results["transformers"] = None
    if a.tiny:
        cfgs = [("tiny", TINY["experts"], TINY["H"], TINY["I"], a.top_k or TINY["top_k"])]
        tokens = a.tokens or TINY["tokens"]
    else:
        if not cuda:
            print("no CUDA device: the layer runs on the CPU at full size (slow); --tiny?",
                  flush=True)
        cfgs = [(n, *CONFIGS[n], a.top_k or LAYER_TOPK[n]) for n in a.configs.split(",")]
        tokens = a.tokens or TOKENS
    os.makedirs(os.path.dirname(out_path) or ".", exist_ok=True)
    for name, E, H, I, k in cfgs:
        for routing in a.routing.split(","):
            try:
                c = layer_cell(E, H, I, tokens, k, routing == "skewed", dtype, device, rounds,
                               variants, a.compile_mode, compile_backend)
            except Exception as e:  # noqa: BLE001  (a failed cell is a result)
                c = {"error": f"{type(e).__name__}: {str(e)[:1000]}"}
            c["name"] = f"{name} top-{k} {routing}"
            results["cells"].append(c)
            print(json.dumps(c), flush=True)
            with open(out_path, "w") as f:  # after each: a run stopped at its limit keeps the rest
                json.dump(results, f, indent=1)
            if cuda:
                torch.cuda.empty_cache()
    shown = variants if "hf_eager" in variants else ["hf_eager", *variants]
    print(layer_table(results["cells"], shown))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None,
                   help="JSON path (bench_out/moe.json, or bench_out/moe_layer.json with --layer)")
    p.add_argument("--configs", default=DEFAULT_CONFIGS, help=f"of {', '.join(CONFIGS)}")
    p.add_argument("--routing", default="uniform,skewed")
    p.add_argument("--layer", action="store_true",
                   help="the whole experts layer, forward + backward, against transformers")
    p.add_argument("--tiny", action="store_true", help="with --layer: tiny sizes on the CPU")
    p.add_argument("--top-k", type=int, default=None, help="with --layer: k for every config")
    p.add_argument("--tokens", type=int, default=None, help="with --layer: tokens (T)")
    p.add_argument("--rounds", type=int, default=None, help="with --layer: interleaved rounds")
    p.add_argument("--variants", default=",".join(LAYER_VARIANTS),
                   help="with --layer: which variants (hf_eager is always run: the baseline)")
    p.add_argument("--compile-mode", default=None,
                   help="with --layer: torch.compile mode for hf_grouped_mm_compile")
    p.add_argument("--compile-backend", default=None,
                   help="with --layer: its torch.compile backend (inductor; aot_eager with --tiny)")
    a = p.parse_args()
    if a.layer:
        layer_main(a)
        return
    a.out = a.out or "bench_out/moe.json"
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "triton": triton.__version__, "cells": []}
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    for name in a.configs.split(","):
        for routing in a.routing.split(","):
            try:
                c = cell(*CONFIGS[name], skewed=routing == "skewed")
            except Exception as e:  # noqa: BLE001  (a failed cell is a result)
                c = {"error": f"{type(e).__name__}: {str(e)[:1000]}"}
            c["name"] = f"{name} {routing}"
            results["cells"].append(c)
            print(json.dumps(c), flush=True)
            with open(a.out, "w") as f:  # after each: a run stopped at its limit keeps the rest
                json.dump(results, f, indent=1)
    print(table(results["cells"]))


if __name__ == "__main__":
    main()
