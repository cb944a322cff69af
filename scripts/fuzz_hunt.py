"""Hunt for kernel bugs with random epilogues, reporting every failure instead of the first.

The CPU and GPU tiers' ``tests/test_fuzz_kernels.py`` run a fixed set of examples and stop
(and shrink) at the first failure; this draws ``--count`` fresh cases from the same
generator (``tests/epilogue_fuzz.py``), runs each through the chosen kernels, and prints
every case that fails or raises, with its source, shape and dtype. Usage, from the
repository root:

    TRITON_INTERPRET=1 PYTHONPATH=src python3 scripts/fuzz_hunt.py --count 500            # CPU
    PYTHONPATH=src python3 scripts/fuzz_hunt.py --count 100 --kinds gluon:first,gluon:wide  # GPU
    PYTHONPATH=src python3 scripts/fuzz_hunt.py --count 40 --kinds hopper:first,portable:first \
        --inputs fp32,tf32,e4m3,int8 --shapes 2600x2056x328                                  # GPU

Kinds are ``family:which`` with which = first (the family's first config), coop (gluon's
first cooperative config) or wide (gluon's first ping-pong config at 8 warps). Inputs are
A's and B's dtype (``same``: the dtype drawn for operands and outputs; or one of
``epilogue_fuzz.INPUTS``: fp32, tf32, e4m3, e4m3_promoted, e5m2, int8; 8-bit ones
K-contiguous with K rounded up to 16, as the GPU tests draw them).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from epilogue_fuzz import CPU_SHAPES, GPU_SHAPES, INPUTS, cases, laid_out_for, pick  # noqa: E402


def main() -> int:
    gpu = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--count", type=int, default=200)
    p.add_argument("--seed", type=int, default=0, help="sizes and dtypes (cases draw their own)")
    p.add_argument("--kinds", default="gluon:first,gluon:coop,gluon:wide,hopper:first" if gpu
                   else "portable:first,hopper:first")
    p.add_argument("--dtypes", default="bf16,fp16" if gpu else "fp16,fp32")
    p.add_argument("--inputs", default="same",
                   help="A/B dtypes: same, " + ", ".join(INPUTS))
    p.add_argument("--shapes", default="", help="MxNxK,... (default: the tests' shapes)")
    a = p.parse_args()
    warnings.filterwarnings("ignore")  # hypothesis: .example() outside a test
    dtypes = [{"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[d]
              for d in a.dtypes.split(",")]
    kinds = [tuple(k.split(":")) for k in a.kinds.split(",")]
    shapes, device = (GPU_SHAPES, "cuda") if gpu else (CPU_SHAPES, "cpu")
    if a.shapes:
        shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
    inputs = a.inputs.split(",")
    rng = random.Random(a.seed)
    fails, refused, t0 = 0, 0, time.time()
    for i in range(a.count):
        case = cases().example()
        shape, dtype, given = rng.choice(shapes), rng.choice(dtypes), rng.choice(inputs)
        in_dtype, options = INPUTS[given] if given != "same" else (None, {})
        case, shape = laid_out_for(in_dtype, case, shape)
        for family, which in kinds:
            try:
                args = case.arguments(*shape, dtype, device=device, seed=i, inputs=in_dtype,
                                      **options)
                kernel = pick(args, family, which, cc=None if gpu or family != "hopper" else 90)
                if kernel is None:  # the family states why (explain); not a failure
                    refused += 1
                    continue
                result = kernel.verify(args)
                if result:
                    continue
                err = result.report()
            except Exception as e:  # noqa: BLE001 - every failure is reported
                err = f"{type(e).__name__}: {str(e)[:800]}"
            fails += 1
            print(f"===== case {i}: {family}:{which} shape={shape} dtype={dtype} inputs={given}\n"
                  f"{case.source}\n"
                  f"outputs {case.outputs} names {dict(case.names)} C fp32={case.c_fp32} "
                  f"bias fp32={case.bias_fp32}\n{err}",
                  flush=True)
    print(f"{a.count} cases x {len(kinds)} kinds in {time.time() - t0:.0f} s: {fails} failures, "
          f"{refused} refused by their family")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
