"""fp16 accumulation on the GPU against the exact product: the error of the portable and
hopper kernels (``accumulator_type=torch.float16``) for fp16 and fp8 inputs, zero-mean and
one-sign data, by K, in units of u sqrt(K) (u = 2^-11) of max(RMS, |element|): what
``runtime.verify.FP16_ACC_NOISE`` allows SLACK_FACTOR = 2 of. Also whether verify passes.

    PYTHONPATH=src python3 scripts/fp16_acc_probe.py
"""
import torch

from evtfuse import GemmArguments, get_kernels

u = 2.0 ** -11
torch.manual_seed(0)
for dt in (torch.float16, torch.float8_e4m3fn):
    for sign in ("zero-mean", "one-sign"):
        for K in (256, 1024, 4096, 16384):
            M = N = 512
            A = torch.randn(M, K, device="cuda")
            B = torch.randn(N, K, device="cuda")
            if sign == "one-sign":
                A, B = A.abs(), B.abs()
            A, B = A.to(dt), B.to(dt).T
            exact = A.double() @ B.double()
            rms = exact.pow(2).mean().sqrt()
            for fam in ("portable", "hopper"):
                D = torch.empty(M, N, device="cuda")
                args = GemmArguments(A, B, D, torch.float16)
                ks = [k for k in get_kernels(args) if k.family.name == fam]
                if not ks:
                    print(dt, sign, K, fam, "no kernel"); continue
                k = ks[0]
                ok = bool(k.verify(args))
                err = (D.double() - exact).abs()
                scale = torch.maximum(exact.abs(), rms) * u * K ** 0.5
                ratio = float((err / scale).max())
                rel = float(err.norm() / exact.norm())
                print(f"{str(dt):22s} {sign:9s} K={K:6d} {fam:8s} {k.config.name:28s} "
                      f"rel {rel:.2e} max err/(u sqrt(K) scale) {ratio:.3f} verify {ok}", flush=True)
