import time, torch, evtfuse
T, H, V = 8192, 4096, 128256
g = torch.Generator(device="cuda").manual_seed(0)
h = torch.randn(T, H, device="cuda", generator=g).bfloat16().requires_grad_(True)
W = (torch.randn(V, H, device="cuda", generator=g) / H ** 0.5).bfloat16().requires_grad_(True)
y = torch.randint(0, V, (T,), device="cuda", generator=g)
def step():
    h.grad = W.grad = None
    evtfuse.linear_cross_entropy(h, W, y).backward()
for _ in range(3): step()
torch.cuda.synchronize()
for _ in range(5):
    t0 = time.perf_counter(); step(); t1 = time.perf_counter(); torch.cuda.synchronize(); t2 = time.perf_counter()
    print(f"host enqueue {1e3*(t1-t0):.2f} ms, wall {1e3*(t2-t0):.2f} ms")
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    step(); torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25))
prof.export_chrome_trace("/root/out/lce_trace.json") if False else None
