"""Printing a value from inside the epilogue (the CuTe DSL EFC debug example).

The EFC example calls ``cute.printf("Accumulator[0] = %f", accumulator[0])`` in its epilogue.
evtfuse's Triton backend has no print statement in generated code (and under
TRITON_INTERPRET=1 the generated kernel cannot print user values either), so this example
asks the kernel itself for the value another way: it adds the named intermediate(s) to
the epilogue's return (an ast rewrite of the source; nothing is executed), lets the fused
kernel store them as extra fp32 aux outputs, and prints the element asked for. The
reference evaluator's value of the same intermediate is printed next to it.

    python examples/debug_print.py                   # accum[0, 0]
    python examples/debug_print.py --print accum,D --at 3,5
"""

import argparse
import ast
import inspect
import textwrap

import torch

from _common import (EpilogueArguments, GemmArguments, banner, check, empty, evaluate, finish,
                     fused, matmul, randn, size)


def epilogue_debug(accum, C):
    D = accum + C
    return D


def with_extra_outputs(fn, names: list[str]) -> str:
    """The source of ``fn`` with ``names`` appended to its return (an ast rewrite)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    func = tree.body[0]
    params = [a.arg for a in func.args.args]
    assigned = {t.id for s in func.body if isinstance(s, ast.Assign) for t in s.targets
                if isinstance(t, ast.Name)}
    ret = func.body[-1]
    elts = list(ret.value.elts) if isinstance(ret.value, ast.Tuple) else [ret.value]
    returned = {e.id for e in elts if isinstance(e, ast.Name)}
    for name in names:
        if name != "accum" and name not in assigned:
            raise SystemExit(f"'{name}' is not an intermediate of {func.name} (it can print accum "
                             f"or one of {sorted(assigned)}; inputs {params[1:]} are known already)")
        if name not in returned:
            elts.append(ast.Name(name, ast.Load()))
    ret.value = ast.Tuple(elts, ast.Load())
    func.decorator_list = []
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--print", dest="names", default="accum",
                        help="comma-separated intermediates to print (default accum)")
    parser.add_argument("--at", default="0,0", help="row,column of the element (default 0,0)")
    opts = parser.parse_args()
    names = [n.strip() for n in opts.names.split(",") if n.strip()]
    i, j = (int(x) for x in opts.at.split(","))

    banner("printing a value from inside the epilogue")
    L, M, N, K = size((1, 1024, 1024, 1024), (1, 64, 48, 32))
    A, B = randn(M, K), randn(K, N, scale=K ** -0.5)
    C = randn(M, N)

    source = with_extra_outputs(epilogue_debug, names)
    print(source, end="")
    outputs = {name: empty(M, N, dtype=torch.float32) for name in names}
    D = outputs.get("D", empty(M, N))
    values = {"C": C, "D": D, **outputs}
    epi = EpilogueArguments(source, **values)
    args = GemmArguments(A=A, B=B, out=D, accumulator_type=torch.float32, epilogue=epi)

    ref = evaluate(args)
    kernel = fused(args)
    if kernel is not None:
        print("(the backend has no print in generated code: the kernel stored the value as an "
              "extra output, read back here)")
    for name in names:
        r = float(ref[name][i, j])
        if kernel is not None:
            print(f"{name}[{i}, {j}] = {float(outputs[name][i, j]):f}   (reference: {r:f})")
        else:
            print(f"{name}[{i}, {j}] = {r:f}   (reference evaluator)")

    want = {"accum": matmul(A, B)}
    want["D"] = want["accum"] + C.float()
    for name in names:
        check(f"reference {name}", ref[name], want[name].to(ref[name].dtype))
        if kernel is not None:
            check(name, outputs[name], want[name])
    if kernel is not None and "D" not in names:
        check("D", D, want["D"])
    finish()


if __name__ == "__main__":
    main()
