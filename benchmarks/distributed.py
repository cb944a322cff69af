"""evtfuse on several GPUs (issue 50): the vocab-parallel LM-head loss and a tensor-parallel
Llama, every variant in the same run, on a host of N GPUs:

    PYTHONPATH=src torchrun --nproc-per-node 2 benchmarks/distributed.py --out dist.json
    PYTHONPATH=src TRITON_INTERPRET=1 python3 benchmarks/distributed.py --tiny  # CPU smoke run

``lce``: ``evtfuse.linear_cross_entropy`` of 8192 tokens x 4096 hidden x 128,256 vocabulary
(global, bf16), forward + backward: on one GPU (rank 0 alone, the whole weight, the others
waiting), then vocab-parallel on all N (each rank a slice of the weight's rows,
``process_group=``; the hidden states and targets the same on every rank). Per step: the
median of ``--rounds`` rounds of ``--steps`` steps timed with CUDA events (the slowest
rank's), peak memory beyond the inputs per GPU, and the loss and the gradients (hidden's,
each rank's weight rows) against the one-GPU run. Target: N=2 at most 0.55x one GPU's time.

``llama``: Hugging Face ``LlamaForCausalLM`` with Llama-3-8B's shapes (``--layers`` decoder
layers, random weights, batch ``--tokens``), saved once and loaded by every rank with
transformers' own tensor parallelism (``DistributedConfig(tp_size=N)``), the original
against the same model patched by ``evtfuse.hf.patch`` (its MLPs ``GatedMLP`` on each
rank's shards, its loss the vocab-parallel ``linear_cross_entropy``), eager and, with
``--compile``, under ``torch.compile``; per step the median of rounds, peak memory per GPU,
and the patched loss and gradients against the original's. Target: patched at most 0.95x
the original's step.

``--tiny``: two CPU processes (gloo, Triton's interpreter), tiny sizes, float32, torch.compile
with ``aot_eager``: it checks that the script runs (tests/test_distributed_hf.py); it
measures nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import traceback

import torch
import torch.distributed as dist
from models import Clock as OneClock  # (benchmarks/models.py: this script's folder is on the path)

MIB = 1 << 20
LLAMA = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
             num_key_value_heads=8, vocab_size=128256)
TINY_LLAMA = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=96, head_dim=8)


class Clock(OneClock):
    """ms per step of a block of steps (``models.Clock``: CUDA events on a GPU, perf_counter
    on the CPU), after a barrier, the slowest rank's."""

    def ms(self, fn, steps: int) -> float:
        dist.barrier()
        slowest = torch.tensor([super().ms(fn, steps)], dtype=torch.float64,
                               device="cuda" if self.cuda else "cpu")
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        return slowest.item()


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.detach().double(), want.detach().double()
    return ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


def _peak(step, cuda: bool) -> float | None:
    """Peak memory of one step beyond what was allocated before it (MiB), on this GPU."""
    if not cuda:
        return None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / MIB


def _timed(step, args, clock) -> list:
    return [clock.ms(step, args.steps) for _ in range(args.rounds)]


def bench_lce(args, clock, device, dtype) -> dict:
    import evtfuse

    rank, world = dist.get_rank(), dist.get_world_size()
    T, H, V = (64, 16, 96) if args.tiny else (8192, 4096, 128256)
    g = torch.Generator(device=device).manual_seed(0)
    hidden = torch.randn(T, H, device=device, generator=g).to(dtype)
    weight = (torch.randn(V, H, device=device, generator=g) / H ** 0.5).to(dtype)
    target = torch.randint(0, V, (T,), device=device, generator=g)
    rows = [V // world + (r < V % world) for r in range(world)]
    first = sum(rows[:rank])
    out: dict = {"shape": [T, H, V], "rows_per_rank": rows}

    def leaves(w):
        return hidden.clone().requires_grad_(True), w.clone().requires_grad_(True)

    one = {}
    if rank == 0:  # one GPU: the whole weight
        h1, w1 = leaves(weight)

        def single():
            h1.grad = w1.grad = None
            evtfuse.linear_cross_entropy(h1, w1, target).backward()
        single()
        loss = evtfuse.linear_cross_entropy(h1.detach(), w1.detach(), target)
        one = {"loss": loss, "dh": h1.grad.clone(), "dw": w1.grad.clone(),
               "peak_mib": _peak(single, clock.cuda)}
        ms = [OneClock(clock.cuda).ms(single, args.steps) for _ in range(args.rounds)]
        out["one_gpu"] = {"ms_rounds": ms, "ms": statistics.median(ms),
                          "peak_beyond_mib": one["peak_mib"]}
    dist.barrier()

    hp, wp = leaves(weight[first:first + rows[rank]])

    def parallel():
        hp.grad = wp.grad = None
        evtfuse.linear_cross_entropy(hp, wp, target, process_group=dist.group.WORLD).backward()
    parallel()
    loss = evtfuse.linear_cross_entropy(hp.detach(), wp.detach(), target,
                                        process_group=dist.group.WORLD)
    ms = _timed(parallel, args, clock)
    r = {"ms_rounds": ms, "ms": statistics.median(ms), "peak_beyond_mib": _peak(parallel, clock.cuda)}
    # accuracy against the one-GPU run: rank 0 compares its rows; the hidden gradient and
    # the loss are the same on every rank
    if rank == 0:
        r.update(loss_rel=_rel(loss.float(), one["loss"].float()),
                 dh_rel=_rel(hp.grad, one["dh"]), dw_rows_rel=_rel(wp.grad, one["dw"][:rows[0]]))
        r["x_one_gpu"] = r["ms"] / out["one_gpu"]["ms"]
    out[f"vocab_parallel_{world}"] = r
    return out


def bench_llama(args, clock, device, dtype) -> dict:
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.distributed import DistributedConfig

    import evtfuse.hf

    rank, world = dist.get_rank(), dist.get_world_size()
    sizes = TINY_LLAMA if args.tiny else LLAMA
    path = os.path.join(args.workdir, "llama")
    if rank == 0:
        torch.manual_seed(0)
        with torch.device(device):  # random init on the GPU: seconds, not a minute
            model = LlamaForCausalLM(LlamaConfig(num_hidden_layers=args.layers, **sizes))
        model.to(dtype).save_pretrained(path)
        del model
    dist.barrier()
    batch, seq = args.tokens
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, sizes["vocab_size"], (batch, seq), generator=g).to(device)
    labels = ids.clone()
    out: dict = {"layers": args.layers, "tokens": [batch, seq],
                 "transformers": transformers.__version__, "results": {}}
    def load():  # (a deep copy of a tensor-parallel model fails: each variant loads it)
        return LlamaForCausalLM.from_pretrained(
            path, dtype=dtype, distributed_config=DistributedConfig(tp_size=world)).train()

    variants = {"original": load(), "patched": evtfuse.hf.patch(load())}
    if args.compile:
        variants.update({f"{k}_compile": torch.compile(v, backend=args.compile_backend)
                         for k, v in list(variants.items())})
    ref = None
    for name, model in variants.items():
        r = out["results"][name] = {}
        try:
            def step(model=model):
                for p in model.parameters():
                    p.grad = None
                loss = model(input_ids=ids, labels=labels, use_cache=False).loss
                loss.backward()
                return loss
            for _ in range(2):  # warm-up: compiles, tunes
                loss = step()
            held = getattr(model, "_orig_mod", model)  # a compiled model's parameters
            grads = {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad)
                     for n, p in held.named_parameters()}
            if ref is None:
                ref = (loss.detach().float(), grads)
            else:
                r["loss_rel"] = _rel(loss.float(), ref[0])
                worst = max((((grads[n].float() - w.float()).abs().max()
                              / w.float().abs().max().clamp_min(1e-30)).item(), n)
                            for n, w in ref[1].items())
                r["grad_rel_worst"], r["grad_rel_at"] = worst
            r["peak_beyond_mib"] = _peak(step, clock.cuda)
            r["ms_rounds"] = _timed(step, args, clock)
            r["ms"] = statistics.median(r["ms_rounds"])
        except Exception as exc:  # noqa: BLE001  (a variant that fails is a result)
            traceback.print_exc()
            r["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    base = out["results"].get("original", {}).get("ms")
    for r in out["results"].values():
        if base and r.get("ms"):
            r["x_original"] = r["ms"] / base
    return out


def _tokens(text: str) -> tuple[int, int]:
    b, _, t = text.partition("x")
    return int(b), int(t)


def run(rank: int, world: int, args) -> dict:
    """One rank's part of the run (the process group initialised)."""
    cuda = not args.tiny
    device = f"cuda:{rank % torch.cuda.device_count()}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(device)
    dtype = torch.float32 if args.tiny else torch.bfloat16
    clock = Clock(cuda)
    report: dict = {"world": world, "device": torch.cuda.get_device_name() if cuda else "cpu",
                    "torch": torch.__version__}
    for part, fn in (("lce", bench_lce), ("llama", bench_llama)):
        if part not in args.parts:
            continue
        if rank == 0:
            print(f"{part} ...", flush=True)
        try:
            report[part] = fn(args, clock, device, dtype)
        except Exception as exc:  # noqa: BLE001  (a part that fails is a result)
            traceback.print_exc()
            report[part] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
        if cuda:
            torch.cuda.empty_cache()
    return report


def _spawned(rank: int, world: int, init: str, args) -> None:
    from evtfuse.runtime.device import use_interpreter

    use_interpreter()
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        report = run(rank, world, args)
        if rank == 0:
            _write(report, args.out)
    finally:
        dist.destroy_process_group()


def _write(report: dict, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report, indent=1)[:4000])
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="bench_out/distributed.json")
    p.add_argument("--parts", default="lce,llama", help="of lce, llama")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=3, help="steps timed in each round")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--tokens", type=_tokens, default=(4, 2048), help="BATCHxSEQ (llama)")
    p.add_argument("--compile", action="store_true", help="llama: also under torch.compile")
    p.add_argument("--compile-backend", default="inductor")
    p.add_argument("--workdir", default=None, help="where rank 0 saves the model (a temp dir)")
    p.add_argument("--tiny", action="store_true",
                   help="CPU smoke run: two gloo processes, the interpreter, tiny sizes")
    args = p.parse_args(argv)
    args.parts = [x for x in args.parts.split(",") if x]
    with tempfile.TemporaryDirectory() as tmp:
        args.workdir = args.workdir or tmp
        if args.tiny:
            import torch.multiprocessing as mp

            if args.tokens == (4, 2048):
                args.tokens = (2, 8)
            if args.compile_backend == "inductor":  # no C++ compiler needed
                args.compile_backend = "aot_eager"
            store = os.path.join(tmp, "store")
            mp.spawn(_spawned, args=(2, f"file://{store}", args), nprocs=2)
            return
        dist.init_process_group("nccl")
        try:
            report = run(dist.get_rank(), dist.get_world_size(), args)
            if dist.get_rank() == 0:
                _write(report, args.out)
        finally:
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
