"""Does a 2-CTA cluster sharing B by TMA multicast make a Gluon GEMM faster on Hopper?
``scripts/multicast_gemm.py``'s prototype, every variant against its controls (the same
kernel on 2-CTA clusters without multicast, and on one CTA), cuBLAS and evtfuse's own
identity GEMM (issue 48). Triton 3.7+ (multicast in Gluon's ``tma.async_load``).

    PYTHONPATH=src python3 scripts/multicast_probe.py --compile     # offline sm_90, no GPU
    PYTHONPATH=src python3 scripts/multicast_probe.py [--timeout 120] [--shapes ...]  # GPU

``--compile``: each variant compiled for sm_90: registers, spills (LDL/STL in the SASS),
shared memory, TMA boxes, and the multicast copies and cluster directive in the PTX.
On a GPU: each variant at each shape in a subprocess of its own with a timeout (a
synchronisation bug shows as a hang), against an fp32 reference, and 50 repeated launches
bit-identical; then TF/s at 8192x8192x1024 and 4096^3 (``do_bench``, medians) of every
variant, ``torch.matmul`` (cuBLAS) and ``evtfuse.gemm``'s identity (tuned), and each again
with D = gelu_tanh(acc + bias) (against cuBLASLt's ``_addmm_activation`` and evtfuse's). The useful
comparisons: mc_mbar / cl2_nomc (multicast alone), cl2_nomc / cta1 (clusters alone),
mc_mbar / mc_clbar (remote arrives against a cluster barrier per k-step).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import multicast_gemm as mg  # noqa: E402

CHECK_SHAPES = [(8192, 8192, 1024), (4096, 4096, 4096), (384, 512, 64), (1000, 1000, 200),
                (256, 256, 128), (640, 384, 4096)]
EPI_SHAPES = [(8192, 8192, 1024), (1000, 1000, 200), (640, 384, 4096)]  # with the epilogue
TIME_SHAPES = [(8192, 8192, 1024), (4096, 4096, 4096)]
IDENTITY = "def identity(accum):\n    D = accum\n    return D\n"
BIAS_GELU = "def bias_gelu(accum, bias):\n    D = gelu_tanh(accum + bias)\n    return D\n"


def _tensors(M, N, K, device):
    g = torch.Generator(device=device).manual_seed(0)
    A = torch.randn(M, K, device=device, generator=g).to(torch.bfloat16)
    B = torch.randn(N, K, device=device, generator=g).to(torch.bfloat16)
    return A, B, torch.empty(M, N, device=device, dtype=torch.bfloat16)


def _launch(name, A, B, C, bias=None):
    nc, bn, st, mc, sync = mg.VARIANTS[name]
    mg.launch(A, B, C, num_ctas=nc, block_n=bn, stages=st, multicast=mc, sync=sync, bias=bias)


def compile_offline(name: str, epilogue: bool = False) -> dict:
    """``name`` compiled for sm_90 (no GPU): resources and the PTX's cluster evidence
    (``epilogue``: with the bias + gelu_tanh epilogue)."""
    import triton
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend, GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from evtfuse.runtime.offline import _cuobjdump

    nc, bn, st, mc, sync = mg.VARIANTS[name]
    A, B, C = _tensors(8192, 8192, 1024, "cpu")
    bias = torch.empty(8192, dtype=torch.bfloat16) if epilogue else None
    values = mg.make_args(A, B, C, num_ctas=nc, block_n=bn, stages=st, multicast=mc, sync=sync,
                          bias=bias)
    fn = mg.mc_gemm_kernel
    signature, constexprs, attrs = {}, {}, {}
    for i, (p, v) in enumerate(zip(fn.params, values)):
        if p.is_constexpr:
            signature[p.name], constexprs[(i,)] = "constexpr", v
            continue
        kind, attr = native_specialize_impl(BaseBackend, v, False, True, True)
        signature[p.name] = kind
        if kind == "constexpr":
            constexprs[(i,)] = v
        elif isinstance(attr, str) and attr:
            attrs[(i,)] = BaseBackend.parse_attr(attr)
    src = GluonASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    ck = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                        options={"num_warps": 8, "num_ctas": nc})
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(ck.asm["cubin"])
        usage = subprocess.run([_cuobjdump(), "-res-usage", path], capture_output=True,
                               text=True).stdout
        sass = subprocess.run([_cuobjdump(), "-sass", path], capture_output=True,
                              text=True).stdout
    regs = re.search(r"REG:(\d+)", usage)
    ptx = ck.asm["ptx"]
    return {"name": name + ("+bias_gelu" if epilogue else ""), "num_ctas": ck.metadata.num_ctas, "shared": ck.metadata.shared,
            "registers": int(regs.group(1)) if regs else -1,
            "spills": sum(1 for ln in sass.splitlines() if re.search(r"\b(LDL|STL)\b", ln)),
            "tma_boxes": [d["block_size"] for d in ck.metadata.tensordesc_meta],
            "multicast_copies": ptx.count("multicast::cluster"),
            "cluster": re.findall(r"\.reqnctapercluster.*", ptx)}


def check_one(name: str, M: int, N: int, K: int, reps: int = 50, epilogue: bool = False) -> bool:
    A, B, C = _tensors(M, N, K, "cuda")
    bias = torch.randn(N, device="cuda").to(torch.bfloat16) if epilogue else None
    _launch(name, A, B, C, bias)
    torch.cuda.synchronize()
    ref = A.float() @ B.float().T
    if epilogue:
        ref = torch.nn.functional.gelu(ref + bias.float(), approximate="tanh")
    err = (C.float() - ref).abs().max().item()
    tol = 2e-2 * ref.abs().max().item() + 1e-2
    first, same = C.clone(), True
    for _ in range(reps):
        _launch(name, A, B, C, bias)
        same &= torch.equal(C, first)
    torch.cuda.synchronize()
    print(f"{name}{'+bias_gelu' if epilogue else ''} {M}x{N}x{K}: max error {err:.3g} (tolerance {tol:.3g}), "
          f"{'right' if err <= tol else 'WRONG'}, "
          f"{'bit-identical' if same else 'NOT bit-identical'} over {reps} launches")
    return err <= tol and same


def time_all(rounds: int, variants: list[str]) -> list[dict]:
    import triton.testing

    import evtfuse

    rows = []
    for M, N, K in TIME_SHAPES:
        A, B, C = _tensors(M, N, K, "cuda")
        bias = torch.randn(N, device="cuda").to(torch.bfloat16)
        Bt = B.T
        systems = {"cublas": lambda: A @ Bt,
                   "evtfuse_identity": lambda: evtfuse.gemm(A, Bt, IDENTITY, D=C),
                   "cublaslt_bias_gelu": lambda: torch._addmm_activation(bias, A, Bt,
                                                                         use_gelu=True),
                   "evtfuse_bias_gelu": lambda: evtfuse.gemm(A, Bt, BIAS_GELU, bias=bias, D=C)}
        for name in variants:  # those that passed every check (a hang would hang here)
            systems[name] = (lambda n: lambda: _launch(n, A, B, C))(name)
            systems[name + "+bias_gelu"] = (lambda n: lambda: _launch(n, A, B, C, bias))(name)
        for fn in systems.values():
            fn()
        ms = {n: [] for n in systems}
        for _ in range(rounds):  # interleaved rounds
            for n, fn in systems.items():
                ms[n].append(triton.testing.do_bench(fn, warmup=25, rep=200,
                                                     return_mode="median"))
        for n, times in ms.items():
            t = sorted(times)[len(times) // 2]
            rows.append({"shape": f"{M}x{N}x{K}", "system": n, "ms": t,
                         "tflops": 2 * M * N * K / t / 1e9})
            print(f"{M}x{N}x{K} {n:18s} {t:.4f} ms {rows[-1]['tflops']:6.0f} TF/s "
                  f"({rows[-1]['tflops'] / 989 * 100:.0f}% of 989)", flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compile", action="store_true", help="offline sm_90 compiles only")
    ap.add_argument("--one", nargs=4, metavar=("NAME", "M", "N", "K"), help=argparse.SUPPRESS)
    ap.add_argument("--timeout", type=int, default=120, help="seconds per checked case")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=8, help="checks run at once")
    ap.add_argument("--out", default=None, help="JSON of the checks and timings")
    a = ap.parse_args()
    if a.compile:
        for name in mg.VARIANTS:
            for epilogue in (False, True):
                print(json.dumps(compile_offline(name, epilogue)), flush=True)
        return 0
    if a.one:
        name, epilogue = a.one[0].removesuffix("+bias_gelu"), a.one[0].endswith("+bias_gelu")
        return 0 if check_one(name, *map(int, a.one[1:]), epilogue=epilogue) else 1
    cases = [[name, str(M), str(N), str(K)]
             for name in [v + e for v in mg.VARIANTS for e in ("", "+bias_gelu")]
             for M, N, K in (CHECK_SHAPES if not name.endswith("+bias_gelu") else EPI_SHAPES)]

    def check(case):  # in a subprocess of its own: a hang is cut, not the probe
        try:
            r = subprocess.run([sys.executable, __file__, "--one", *case],
                               timeout=a.timeout, capture_output=True, text=True)
            return case, r.returncode, r.stdout.strip() or r.stderr.strip()[-2000:]
        except subprocess.TimeoutExpired:
            return case + ["hang"], 1, f"{' '.join(case)}: HANG (no end in {a.timeout} s)"

    failures = []
    with ThreadPoolExecutor(a.jobs) as pool:  # compiles are CPU-bound: several at once
        for case, rc, text in pool.map(check, cases):
            print(text, flush=True)
            if rc:
                failures.append(case)
    print("failures:", failures or "none", flush=True)
    # a variant is timed where it and its epilogue passed every check
    rows = time_all(a.rounds, [n for n in mg.VARIANTS
                               if all(f[0].removesuffix("+bias_gelu") != n for f in failures)])
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"failures": failures, "timings": rows,
                       "device": torch.cuda.get_device_name()}, f, indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
