import torch, copy
from evtfuse.nn import GatedMLP
torch.manual_seed(0)
b = GatedMLP(1024, 2816, "silu", device="cuda", dtype=torch.bfloat16)
x = torch.randn(2048, 1024, device="cuda", dtype=torch.bfloat16)
dy = torch.randn(2048, 1024, device="cuda", dtype=torch.bfloat16)
def run(fn, m):
    xx = x.clone().requires_grad_(True)
    for p in m.parameters(): p.grad = None
    y = fn(xx); y.backward(dy)
    return [y.detach().clone(), xx.grad.clone(), *(p.grad.clone() for p in m.parameters())]
e1 = run(b, b); e2 = run(b, b)
print("eager twice equal:", [torch.equal(a, c) for a, c in zip(e1, e2)])
t = copy.deepcopy(b)
print("deepcopy packed:", t.up_proj.weight.data_ptr() - t.gate_proj.weight.data_ptr(), t.gate_proj.weight.nbytes)
c = torch.compile(t, fullgraph=True)
c1 = run(c, t)
print("compiled equal eager:", [torch.equal(a, c) for a, c in zip(e1, c1)])
print("max diff:", [(a.float() - c.float()).abs().max().item() for a, c in zip(e1, c1)])
