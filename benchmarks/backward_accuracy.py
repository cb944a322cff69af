"""How accurate and how costly evtfuse's backward is, in each backward mode, on a GPU
(BENCHMARKS.md, "Gradients"):

    PYTHONPATH=src python3 benchmarks/backward_accuracy.py --out bench_out/backward.json

Accuracy (issue 46's two cases, bf16): ``F = accum + bias; D = relu(F) * 2.0; return D, F``
at 1024x768x512 and ``D = softmax(accum)`` at 1024x768x512 with logits of about 20 (randn A and B), over
three seeds. Each gradient of A against torch.autograd in float64 at the same inputs, as
the largest error over the largest gradient (``max_rel``) and by norm (``norm_rel``), for
evtfuse's "save", "recompute" and "auto", beside torch's own bf16 path (``A @ B`` in bf16,
the epilogue's torch functions on bf16 tensors).

Cost: one training step (forward + backward, bf16, 8192 x 4096 -> 4096 with a bias) of
``relu(accum + bias)``, ``gelu_tanh(accum + bias)`` and ``softmax(accum)`` in each mode:
the median step time (``triton.testing.do_bench``, gradients reset between steps) and the
memory the forward keeps for the backward (``torch.cuda.memory_allocated`` after the
forward, beyond the inputs and the outputs).
"""

from __future__ import annotations

import argparse
import json

import torch
import triton.testing

import evtfuse

BF = torch.bfloat16
RELU = "def epi(accum, bias):\n    F = accum + bias\n    D = relu(F) * 2.0\n    return D, F"
SOFTMAX = "def epi(accum):\n    D = softmax(accum)\n    return D"


def _errors(got: torch.Tensor, want: torch.Tensor) -> dict:
    got, want = got.double(), want.double()
    return {"max_rel": float((got - want).abs().max() / want.abs().max()),
            "norm_rel": float((got - want).norm() / want.norm())}


def accuracy(source: str, scale: float, seed: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(seed)
    M, N, K = 1024, 768, 512
    A = (torch.randn(M, K, device="cuda", generator=g) * scale).to(BF)
    B = (torch.randn(K, N, device="cuda", generator=g) * scale).to(BF)
    bias = torch.randn(N, device="cuda", generator=g).to(BF)
    up = torch.randn(M, N, device="cuda", generator=g)
    has_bias = "bias" in source
    extra = {"bias": bias} if has_bias else {}

    def torch_fn(a, b, dtype):
        x = a @ b
        if has_bias:
            f = x + bias.to(dtype)
            return torch.relu(f) * 2.0
        return torch.softmax(x, -1)

    a64, b64 = A.double().requires_grad_(), B.double().requires_grad_()
    (torch_fn(a64, b64, torch.float64) * up.double()).sum().backward()
    out = {}
    for mode in ("save", "recompute", "auto"):
        a, b = A.clone().requires_grad_(), B.clone().requires_grad_()
        res = evtfuse.gemm(a, b, source, backward=mode, **extra)
        D = res[0] if isinstance(res, tuple) else res
        (D.float() * up).sum().backward()
        out[f"evtfuse_{mode}"] = _errors(a.grad, a64.grad)
    a, b = A.clone().requires_grad_(), B.clone().requires_grad_()
    (torch_fn(a, b, BF).float() * up).sum().backward()
    out["torch_bf16"] = _errors(a.grad, a64.grad)
    return out


def cost(source_body: str, mode: str) -> dict:
    M, N, K = 8192, 4096, 4096
    x = torch.randn(M, K, device="cuda", dtype=BF, requires_grad=True)
    w = (torch.randn(K, N, device="cuda") * K ** -0.5).to(BF).requires_grad_()
    bias = torch.randn(N, device="cuda", dtype=BF, requires_grad=True)
    up = torch.randn(M, N, device="cuda", dtype=BF)
    uses_bias = "bias" in source_body
    src = (f"def epi(accum{', bias' if uses_bias else ''}):\n    D = {source_body}\n"
           "    return D")
    extra = {"bias": bias} if uses_bias else {}
    params = [x, w] + ([bias] if uses_bias else [])

    def step():
        y = evtfuse.gemm(x, w, src, backward=mode, **extra)
        y.backward(up)

    step()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    y = evtfuse.gemm(x, w, src, backward=mode, **extra)
    kept = torch.cuda.memory_allocated() - before - y.numel() * y.element_size()
    del y
    ms = triton.testing.do_bench(step, warmup=25, rep=200, grad_to_none=params,
                                 return_mode="median")
    return {"step_ms": ms, "kept_mib": kept / 2 ** 20}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": triton.__version__, "accuracy": {}, "cost": {}}
    for name, src, scale in (("relu_aux", RELU, 1.0), ("softmax", SOFTMAX, 1.0)):
        result["accuracy"][name] = [accuracy(src, scale, seed) for seed in range(3)]
    for body in ("relu(accum + bias)", "gelu_tanh(accum + bias)", "softmax(accum)"):
        result["cost"][body] = {m: cost(body, m) for m in ("save", "recompute")}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
