"""Fused linear cross-entropy, forward + backward, on a GPU: evtfuse against its peers
(issue 32, "Measure"; BENCHMARKS.md). Every peer in the same run, each in its own
try/except (a peer that fails is recorded with its error and the run goes on).

    PYTHONPATH=src python3 benchmarks/linear_cross_entropy.py --out bench_out/lce.json
    ... --tokens 8192 --hidden 4096 --vocab 128256 --dtype bf16 --chunk-mib 128,192
    ... --peers cublas,evtfuse,eager,compile,liger,cce

Peers:
- ``cublas``: the three bare GEMMs a linear cross-entropy needs, logits = h @ W.T,
  dX = G @ W and dW = G.T @ h (G a (tokens, vocab) gradient): each and their sum, the
  floor (the issue's target: evtfuse at most 1.05x the sum).
- ``evtfuse``: ``loss = evtfuse.linear_cross_entropy(h, W, y); loss.backward()``, once per
  chunk size of ``--chunk-mib`` (``runtime.cross_entropy.CHUNK_BYTES``); the best chunk
  size's step with the loss multiplied by 2 (``ms_upstream_grad_2``: the backward then
  scales the gradients in place); and its forward alone under ``torch.no_grad()`` (one
  GEMM per chunk, no logits stored).
- ``eager``: ``F.cross_entropy(F.linear(h, W).float(), y)`` and its backward.
- ``compile``: the same under ``torch.compile(mode="max-autotune-no-cudagraphs")``.
- ``evtfuse_compile``: evtfuse's step under ``torch.compile(fullgraph=True)`` (the same
  operator: three GEMMs, the backward's scaling reinplaced by Inductor).
- ``liger``: Liger-Kernel's ``LigerFusedLinearCrossEntropyLoss``; ``cce``: Apple's
  ``cut_cross_entropy.linear_cross_entropy`` (where installed).

Time: ``triton.testing.do_bench`` median of whole steps (L2 flushed before each; the
gradients set to None before each, so each step allocates them as a training step does);
``back_to_back_ms``: ten steps run back to back, L2 warm, the host free to run ahead, as a
training loop runs them, the median of three runs (``evtfuse.bench.timing.back_to_back_ms``;
the three cuBLAS GEMMs too, one after another): where the two differ for one peer and not
for cuBLAS, that peer's single step waits on the host or on something a warm L2 hides.
Memory: ``peak_beyond_mib``, the peak of one step after a warm-up step, minus what was
allocated before it (inputs, weight, anything the peer keeps between calls) and minus the
gradients' size; ``kept_mib``: what the warm-up step left allocated (workspaces a peer
keeps). Correctness: each peer's loss and gradients against eager's, as relative norms
(``rel_loss``, ``rel_dx``, ``rel_dw``), where eager ran. ``profile`` (evtfuse's best chunk
size, torch.compile): each kernel's GPU ms per step and the idle GPU between kernels
(``evtfuse.bench.timing.kernel_profile``; ``exposed``: each kernel's share of the busy GPU
time, an instant charged to the kernel that started first); ``syncs``: evtfuse's calls that
made the host wait for the whole queue (none: its check of the targets waits on an event
queued behind their comparison).
"""

from __future__ import annotations

import argparse
import json
import os
import time
import traceback

import torch
import torch.nn.functional as F
import triton
import triton.testing

import evtfuse
from evtfuse.bench.timing import back_to_back_ms, kernel_profile, synchronizing_calls
from evtfuse.runtime import cross_entropy

MIB = 1 << 20
DEV = "cuda"
DEFAULT_CHUNK_BYTES = cross_entropy.CHUNK_BYTES  # restored after the chunk sizes tried
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _ms(fn, grads=None) -> float:
    return triton.testing.do_bench(fn, warmup=100, rep=1000, grad_to_none=grads,
                                   return_mode="median")


def _rel(got, want) -> float:
    got, want = got.detach().double(), want.detach().double()
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


class Bench:
    def __init__(self, args):
        self.args = args
        dtype = DTYPES[args.dtype]
        T, H, V = args.tokens, args.hidden, args.vocab
        g = torch.Generator(device=DEV).manual_seed(0)
        self.h = torch.randn(T, H, device=DEV, generator=g).to(dtype).requires_grad_(True)
        self.W = (torch.randn(V, H, device=DEV, generator=g) / H ** 0.5).to(dtype)
        self.W.requires_grad_(True)
        self.y = torch.randint(0, V, (T,), device=DEV, generator=g)
        if args.ignore_frac > 0:
            self.y[torch.rand(T, device=DEV, generator=g) < args.ignore_frac] = -100
        self.ref = None  # eager's (loss, dX, dW)
        self.results: dict = {}

    # ---------------------------------------------------------------- one training step

    def step_result(self, name: str, step, check: bool = True) -> dict:
        """Time, peak memory and accuracy of ``step()`` (a forward + backward returning the
        loss, gradients into h.grad and W.grad)."""
        leaves = [self.h, self.W]
        for t in leaves:
            t.grad = None
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        loss = step()  # warm-up: compiles, tunes
        torch.cuda.synchronize()
        out = {"first_call_s": round(time.perf_counter() - t0, 2)}
        if check and self.ref is not None:
            out.update(rel_loss=_rel(loss.float(), self.ref[0]), rel_dx=_rel(self.h.grad, self.ref[1]),
                       rel_dw=_rel(self.W.grad, self.ref[2]))
        del loss
        for t in leaves:
            t.grad = None
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        out["kept_mib"] = round((base - before) / MIB, 1)
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        grads = sum(t.grad.nbytes for t in leaves if t.grad is not None)
        out["peak_beyond_mib"] = round((peak - base - grads) / MIB, 1)
        out["ms"] = _ms(step, leaves)
        out["back_to_back_ms"] = back_to_back_ms(step, leaves, steps=10)
        for t in leaves:
            t.grad = None
        print(f"  {name}: {out}", flush=True)
        return out

    def eager_step(self):
        loss = F.cross_entropy(F.linear(self.h, self.W).float(), self.y)
        loss.backward()
        return loss

    # ---------------------------------------------------------------- peers

    def cublas(self) -> dict:
        h, W = self.h.detach(), self.W.detach()
        T, V = self.args.tokens, self.args.vocab
        logits = torch.empty(T, V, device=DEV, dtype=h.dtype)
        G = torch.randn(T, V, device=DEV, dtype=h.dtype)
        dx, dw = torch.empty_like(h), torch.empty_like(W)
        out = {"logits_ms": _ms(lambda: torch.mm(h, W.t(), out=logits)),
               "dx_ms": _ms(lambda: torch.mm(G, W, out=dx)),
               "dw_ms": _ms(lambda: torch.mm(G.t(), h, out=dw))}
        out["ms"] = out["logits_ms"] + out["dx_ms"] + out["dw_ms"]

        def three():
            torch.mm(h, W.t(), out=logits)
            torch.mm(G, W, out=dx)
            torch.mm(G.t(), h, out=dw)

        out["back_to_back_ms"] = back_to_back_ms(three, steps=10)
        print(f"  cublas: {out}", flush=True)
        return out

    def eager(self) -> dict:
        for t in (self.h, self.W):
            t.grad = None
        loss = self.eager_step()
        self.ref = (loss.detach().float(), self.h.grad.detach().clone(), self.W.grad.detach().clone())
        return self.step_result("eager", self.eager_step, check=False)

    def compile(self) -> dict:
        fn = torch.compile(lambda h, W, y: F.cross_entropy(F.linear(h, W).float(), y),
                           mode="max-autotune-no-cudagraphs")
        step = _backward_step(lambda: fn(self.h, self.W, self.y))
        out = self.step_result("compile", step)
        try:
            out["profile"] = kernel_profile(step, [self.h, self.W], steps=3)
        except Exception as exc:  # noqa: BLE001  (the profile is extra; the times stand)
            out["profile"] = {"error": _error(exc)}
        return out

    def evtfuse(self) -> dict:
        out, timed = {}, []  # timed: (ms, chunk MiB) of each chunk size that ran
        step = _backward_step(lambda: evtfuse.linear_cross_entropy(self.h, self.W, self.y))
        for mib in self.args.chunk_mib:
            cross_entropy.CHUNK_BYTES = int(mib * MIB)
            try:
                out[f"chunk_{mib:g}_mib"] = r = self.step_result(f"evtfuse chunk {mib:g} MiB", step)
                timed.append((r["ms"], mib))
            except Exception as exc:  # noqa: BLE001  (one chunk size failing is a result)
                out[f"chunk_{mib:g}_mib"] = {"error": _error(exc)}
        if timed:
            ms, mib = min(timed)
            out["ms"], out["best"] = ms, f"chunk_{mib:g}_mib"
            out["peak_beyond_mib"] = out[out["best"]]["peak_beyond_mib"]
            cross_entropy.CHUNK_BYTES = int(mib * MIB)
            try:  # where the best step's time goes, kernel by kernel
                out["profile"] = kernel_profile(step, [self.h, self.W], steps=3)
                out["syncs"] = synchronizing_calls(step)
            except Exception as exc:  # noqa: BLE001  (the profile is extra; the times stand)
                out["profile"] = {"error": _error(exc)}
            # an upstream gradient other than 1 (a loss scaled by 2): the backward scales
            # d_hidden and d_weight in place, one more pass over them (evtfuse::scale_)
            scaled = _backward_step(
                lambda: evtfuse.linear_cross_entropy(self.h, self.W, self.y) * 2.0)
            scaled()
            out["ms_upstream_grad_2"] = _ms(scaled, [self.h, self.W])
            for t in (self.h, self.W):
                t.grad = None
        with torch.no_grad():  # the forward alone: no logits stored
            h, W = self.h.detach(), self.W.detach()
            evtfuse.linear_cross_entropy(h, W, self.y)
            out["forward_no_grad_ms"] = _ms(lambda: evtfuse.linear_cross_entropy(h, W, self.y))
        cross_entropy.CHUNK_BYTES = DEFAULT_CHUNK_BYTES
        return out

    def evtfuse_compile(self) -> dict:
        """evtfuse under torch.compile (Inductor): the eager kernels (docs/pytorch.md)."""
        fn = torch.compile(lambda h, W, y: evtfuse.linear_cross_entropy(h, W, y), fullgraph=True)
        step = _backward_step(lambda: fn(self.h, self.W, self.y))
        out = self.step_result("evtfuse_compile", step)
        try:  # the compiled step's kernels beside eager's (evtfuse's "profile")
            out["profile"] = kernel_profile(step, [self.h, self.W], steps=3)
        except Exception as exc:  # noqa: BLE001  (the profile is extra; the times stand)
            out["profile"] = {"error": _error(exc)}
        return out

    def liger(self) -> dict:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        lf = LigerFusedLinearCrossEntropyLoss()
        step = _backward_step(lambda: lf(self.W, self.h, self.y))
        return self.step_result("liger", step)

    def cce(self) -> dict:
        from cut_cross_entropy import linear_cross_entropy as cce
        step = _backward_step(lambda: cce(self.h, self.W, self.y))
        return self.step_result("cce", step)


def _backward_step(loss):
    """A training step: ``loss()``, then its backward; returns the loss."""
    def step():
        out = loss()
        out.backward()
        return out

    return step


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:2000]


def table(results: dict) -> str:
    floor = results.get("cublas", {}).get("ms")
    floor_b2b = results.get("cublas", {}).get("back_to_back_ms")
    rows = [f"{'peer':<26} {'ms':>9} {'x GEMMs':>8} {'b2b ms':>9} {'x GEMMs':>8} "
            f"{'peak MiB':>9} {'kept MiB':>9} {'rel dX':>9} {'rel dW':>9}"]

    def line(name, r):
        if "error" in r:
            return f"{name:<26} error: {r['error'][:90]}"
        ms, b2b = r.get("ms"), r.get("back_to_back_ms")
        ratio = f"{ms / floor:.3f}" if ms and floor else "-"
        ratio_b2b = f"{b2b / floor_b2b:.3f}" if b2b and floor_b2b else "-"

        def f(k, fmt):
            return format(r[k], fmt) if k in r else f"{'-':>9}"

        return (f"{name:<26} {f('ms', '9.2f')} {ratio:>8} {f('back_to_back_ms', '9.2f')} "
                f"{ratio_b2b:>8} {f('peak_beyond_mib', '9.0f')} "
                f"{f('kept_mib', '9.0f')} {f('rel_dx', '9.2e')} {f('rel_dw', '9.2e')}")

    for name, r in results.items():
        if name == "evtfuse" and "error" not in r:
            for k, v in r.items():
                if isinstance(v, dict):
                    rows.append(line(f"evtfuse {k}", v))
            if "forward_no_grad_ms" in r:
                rows.append(f"{'evtfuse forward, no grad':<26} {r['forward_no_grad_ms']:9.2f}")
            continue
        rows.append(line(name, r))
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench_out/linear_cross_entropy.json")
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    p.add_argument("--ignore-frac", type=float, default=0.0,
                   help="fraction of tokens whose target is ignore_index")
    p.add_argument("--chunk-mib", default="128,192",
                   help="evtfuse's chunk sizes to try (MiB of logits per chunk)")
    p.add_argument("--peers", default="cublas,eager,evtfuse,compile,evtfuse_compile,liger,cce",
                   help="run in this order, eager first (the others' accuracy is "
                        "measured against it)")
    args = p.parse_args()
    args.chunk_mib = [float(c) for c in args.chunk_mib.split(",") if c]
    bench = Bench(args)
    report = {"config": {k: v for k, v in vars(args).items() if k != "out"},
              "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": triton.__version__, "evtfuse": evtfuse.__version__,
              "results": bench.results}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    names = [p for p in args.peers.split(",") if p]
    names.sort(key=lambda n: n != "eager")  # eager first: the reference of every accuracy
    for name in names:
        print(f"{name} ...", flush=True)
        try:
            bench.results[name] = getattr(bench, name)()
        except Exception as exc:  # noqa: BLE001  (a peer that fails is a result)
            traceback.print_exc()
            bench.results[name] = {"error": _error(exc)}
        for t in (bench.h, bench.W):
            t.grad = None
        torch.cuda.empty_cache()
        with open(args.out, "w") as f:  # after every peer: a killed run keeps what it measured
            json.dump(report, f, indent=1)
    print(table(bench.results))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
