"""The failure examples of the CUTLASS notebook: each prints the message users know.

Every one must raise ``EpilogueError`` with exactly the documented text (followed by its
location in the source, where it has one); the script exits 1 if one does not raise, or
raises with other words.
"""

import sys

import torch

from _common import EpilogueArguments, GemmArguments, banner, empty, randn
from evtfuse import EpilogueError

L, M, N, K = 1, 32, 16, 8
A, B = randn(L, M, K), randn(L, K, N)
C = randn(L, M, N)
D, F = empty(L, M, N), empty(L, M, N)
alpha, beta = 1.0, 0.5


# Epilogues must take in an accumulator
def fail_missing_accum(alpha, beta, C):
    D = (C * beta)
    return D


# Epilogues must return an output named D
def fail_missing_D(accum, alpha, beta, C):
    F = (accum * alpha) + (C * beta)
    return F


# Epilogues must use single-static assignment (SSA)
def fail_ssa(accum):
    tmp = accum * 2.0
    # Redefine tmp, which violates SSA form.
    tmp = tmp - 1.0
    D = tmp / 4.0
    return D, tmp


# Must provide all operands and outputs to EpilogueArguments
def my_epi(accum, alpha, beta, C):
    F = (accum * alpha) + (C * beta)
    D = relu(F)  # noqa: F821 (recognised by name; never called)
    return D


CASES = [
    ("missing accum", lambda: EpilogueArguments(fail_missing_accum, alpha=alpha, beta=beta, C=C, D=D),
     "accum must be an input to the epilogue function"),
    ("missing D", lambda: EpilogueArguments(fail_missing_D, alpha=alpha, beta=beta, C=C, F=F),
     "Output node D is not found in the epilogue function."),
    ("SSA", lambda: EpilogueArguments(fail_ssa, D=D, tmp=F),
     "Variable 'tmp' cannot be defined twice."),
    ("missing D argument", lambda: EpilogueArguments(my_epi, alpha=alpha, beta=beta, C=C),
     "Argument D is not provided in the kwargs of the EpilogueArguments constructor"),
    ("missing alpha argument", lambda: EpilogueArguments(my_epi, beta=beta, C=C, D=D),
     "Argument alpha is not provided in the kwargs of the EpilogueArguments constructor"),
]


def main():
    banner("failure examples")
    bad = 0
    for title, build, expected in CASES:
        try:
            epi_args = build()
            GemmArguments(A=A, B=B, out=D, accumulator_type=torch.float32, epilogue=epi_args)
        except EpilogueError as e:
            ok = e.bare_message == expected  # then its location, where it has one
            print(f"{'ok  ' if ok else 'FAIL'} {title}: {e}")
            if not ok:
                print(f"     expected: {expected}")
                bad += 1
        else:
            print(f"FAIL {title}: no error was raised")
            bad += 1
    print("OK" if not bad else f"FAILED: {bad} case(s)")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
