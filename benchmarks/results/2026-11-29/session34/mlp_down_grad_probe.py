"""Ad-hoc GPU probe (session 34, run with PYTHONPATH=src): the hopper candidates of GatedMLP's backward GEMM (dy @ W_down with the derived epilogue: gate and up read, their gradients and the activation written) timed against cuBLAS's plain dy @ W_down. Output: mlp_down_grad_probe.txt."""
import time, torch, triton
t0 = time.time()
import evtfuse
from evtfuse import EpilogueArguments, GemmArguments
from evtfuse.runtime.mlp import _parts, down_grad
def log(*a): print(f"[{time.time()-t0:6.1f}s]", *a, flush=True)
bf = torch.bfloat16
M, H, I = 8192, 4096, 14336
g = torch.Generator(device="cuda").manual_seed(0)
dy = (torch.randn(M, H, device="cuda", generator=g)).to(bf)
w2 = (torch.randn(H, I, device="cuda", generator=g) * 0.02).to(bf)
p = torch.randn(M, 2 * I, device="cuda", generator=g).to(bf)
a = torch.empty(M, I, device="cuda", dtype=bf)
epi, outs = down_grad("silu", True)
kw = {dict(outs)[n]: t for n, t in _parts(p.clone(), True, I).items()}
args = GemmArguments(dy, w2, a, epilogue=EpilogueArguments(epi, D=a, **_parts(p, True, I), **kw))
ks = evtfuse.get_kernels(args)
log([k.name for k in ks])
ms = triton.testing.do_bench(lambda: dy @ w2, warmup=5, rep=50)
log("TIME cublas dy @ w2", f"{ms:.3f} ms")
# (session 34 timed the first six hopper candidates; with the gluon-direct-loads branch
# merged, the gluon candidates come first: time those and the best hopper one)
for k in [k for k in ks if k.family.name == "gluon"] + [k for k in ks if k.family.name == "hopper"][:6]:
    k.run(args); torch.cuda.synchronize()
    ms = triton.testing.do_bench(lambda: k.run(args), warmup=5, rep=50)
    log("TIME", k.name, f"{ms:.3f} ms")
