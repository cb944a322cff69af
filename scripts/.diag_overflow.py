import sys, torch
sys.path.insert(0, "tests")
import evtfuse
from test_round3_torch import _special_case
from lce_reference import torch_lce
h, w, b, y = (t.cuda() for t in _special_case("overflowing_logits"))
print("h", h, "\nw", w, "\nb", b)
z = h @ w.T
print("torch logits\n", z)
print("evtfuse logits\n", evtfuse.gemm(h, w.t(), "def e(accum):\n    D = accum\n    return D", tune="none"))
zb = z + b
print("torch z+b\n", zb, "\ntorch lse", torch.logsumexp(zb, -1))
print("cpu lse", torch.logsumexp(zb.cpu(), -1))
loss, lse = evtfuse.linear_cross_entropy(h, w, y, bias=b, reduction="none", return_lse=True)
print("evtfuse lse", lse, "loss", loss)
print("torch_lce", torch_lce(h, w, y, bias=b, reduction="none"))
print("evtfuse lse no bias", evtfuse.linear_cross_entropy(h, w, y, reduction="none", return_lse=True))
print("torch lse no bias", torch.logsumexp(z, -1), torch.logsumexp(z.cpu(), -1))
