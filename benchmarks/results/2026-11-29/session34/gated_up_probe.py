"""Ad-hoc GPU probe (session 34, run with PYTHONPATH=src): every gluon candidate of GatedMLP's up projection (gated, three outputs) against the reference at two shapes, then gluon configs timed at 8192 x 28672 x 4096 beside cuBLAS's plain GEMM. Output: gluon_gated_probe_call6.txt."""
import time, sys, torch, triton
t0 = time.time()
import evtfuse
from evtfuse import EpilogueArguments, GemmArguments
from evtfuse.reference import evaluate
from evtfuse.runtime.mlp import _parts, up_source
def log(*a): print(f"[{time.time()-t0:6.1f}s]", *a, flush=True)
bf = torch.bfloat16
def make(M, K, N, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(M, K, device="cuda", generator=g) * 0.5).to(bf)
    W = (torch.randn(2 * N, K, device="cuda", generator=g) * 0.05).to(bf)
    p = torch.empty(M, 2 * N, device="cuda", dtype=bf); D = torch.empty(M, N, device="cuda", dtype=bf)
    outs = dict(D=D, **_parts(p, True, N))
    return GemmArguments(x, W.t(), D, epilogue=EpilogueArguments(up_source("silu", True, False, bf), **outs)), outs
for shape in [(1000, 512, 1400), (777, 256, 600)]:
  args, outs = make(*shape)
  want = evaluate(args)
  ks = evtfuse.get_kernels(args)
  log("families", shape, sorted({k.family.name for k in ks}))
  for k in [k for k in ks if k.family.name == "gluon"]:
    for t in outs.values(): t.fill_(float("nan"))
    k.run(args); torch.cuda.synchronize()
    errs = {n: (t.float() - want[n].float()).abs().max().item() for n, t in outs.items()}
    ok = all(torch.allclose(t.float(), want[n].float(), atol=2e-2, rtol=2e-2) for n, t in outs.items())
    log("CHECK", k.name, "ok" if ok else "WRONG", errs)
args, outs = make(8192, 4096, 14336)
ks = evtfuse.get_kernels(args)
pick = [k for k in ks if k.name in ("gluon_128x128x64_w4_s5_g8_e2", "gluon_128x128x64_w4_s5_g8_e4", "gluon_128x128x64_w4_s5_g16_e2")]
x, B = args.A, args.B
for k in pick:
    k.run(args); torch.cuda.synchronize()
    ms = triton.testing.do_bench(lambda: k.run(args), warmup=5, rep=50)
    log("TIME", k.name, f"{ms:.3f} ms")
ms = triton.testing.do_bench(lambda: x @ B, warmup=5, rep=50)
log("TIME cublas x @ W.t()", f"{ms:.3f} ms")
