"""Fingerprints of every kernel evtfuse would generate for a fixed set of problems, without
a GPU: for a refactor of the backend that must not change what runs on the GPU.

    TRITON_INTERPRET= python3 scripts/source_hashes.py [--examples N] > before.txt
    ... refactor ...
    TRITON_INTERPRET= python3 scripts/source_hashes.py [--examples N] > after.txt
    diff before.txt after.txt      # empty: the same kernels, the same launches

The problems: every benchmark workload at the suite's shapes but the LM head (CPU tensors;
only shapes, dtypes and strides matter), fp16 and fp8 variants of a few, and ``N`` random
epilogues of the fuzz generator (``tests/epilogue_fuzz.py``, fixed seed) at two shapes, batched
and column-major operands included. For each, every (family, config) pair an sm_90 GPU with
132 SMs would be offered (``runtime.offline.offered``: refusals and order included) gives
one line: problem, family, config name, a hash of the generated source (its code: the
header docstring, a printout of the DAG for people, left out), and a hash of the
launch plan's constants and non-tensor arguments (the grid, sizes, strides, flags). Also
the explanations of refused problems, so a changed refusal shows.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "src"), os.path.join(HERE, "..", "tests")]

import torch  # noqa: E402

import evtfuse  # noqa: E402
from evtfuse.backends.triton.codegen import generate  # noqa: E402
from evtfuse.backends.triton.families import Target  # noqa: E402
from evtfuse.runtime.offline import offered  # noqa: E402
from evtfuse.runtime.two_pass import judged  # noqa: E402

SHAPES = ("2048", "4096", "8192x8192x1024", "64x8192x8192", "16384x4096x4096")
FUZZ_SHAPES = ((300, 264, 72), (2048, 2048, 256))


def _short(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _code(module: str) -> str:
    """A generated module without its header docstring (the DAG printed for people, whose
    variable names and line numbers follow how the DAG was built, not what runs)."""
    if module.startswith('"""'):
        return module[module.index('"""', 3) + 3:]
    return module


def _plan_text(args, family, config, target) -> str:
    """The launch plan's constants and every argument that is not a tensor getter."""
    items, consts, grid, _post = family.plan(args, args.optimized_dag, config, target)
    plain = [_plain(i) for i in items if not callable(i)]
    return repr((sorted(consts.items()), plain, repr(grid) if not callable(grid) else "fn",
                 len(items)))


def _plain(item) -> str:
    if isinstance(item, torch.Tensor):  # a workspace: its contents are not part of the plan
        return f"tensor{tuple(item.shape)}:{item.dtype}"
    return repr(item)


def fingerprint(label: str, args) -> list[str]:
    lines = []
    pairs = offered(args)
    if not pairs:
        return [f"{label}\trefused\t{_short(str(evtfuse.explain(args)))}"]
    target = Target("cuda", 90, args.A.device, 132, offline=True)
    for fam, cfg in pairs:
        # what the family runs: reductions feeding computation staged in two passes, the
        # first pass's kernel here (as runtime.offline.compile_for builds it)
        staged = judged(fam, args, target)
        spec = fam.spec(staged, cfg, target)
        lines.append(f"{label}\t{fam.name}\t{cfg.name}\t{_short(_code(generate(spec)))}\t"
                     f"{_short(_plan_text(staged, fam, cfg, target))}")
    return lines


def bench_problems():
    from evtfuse.bench import workloads as W

    for w in W.select_workloads(None):
        if w.name == "lmhead_ce":
            continue
        dtypes = [torch.bfloat16] + ([torch.float16] if w.name in ("alpha_beta", "relu_aux",
                                                                    "bce_loss") else [])
        for text in SHAPES:
            shape = W.parse_shape(text)
            for dt in dtypes:
                values = W.make_inputs(w, shape, dt)
                outs = W.make_outputs(w, shape, dt)
                A, B = values.pop("A"), values.pop("B")
                yield f"{w.name}@{text}/{W.dtype_name(dt)}", w.gemm_arguments(A, B, values, outs)


def fuzz_problems(examples: int):
    from hypothesis import HealthCheck, given, seed, settings

    from epilogue_fuzz import cases

    drawn = []

    @seed(1234)
    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=cases())
    def collect(case):
        drawn.append(case)

    collect()
    for i, case in enumerate(drawn):
        for M, N, K in FUZZ_SHAPES:
            for dt in (torch.bfloat16, torch.float32):
                yield f"fuzz{i}@{M}x{N}x{K}/{dt}", case.arguments(M, N, K, dt)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--examples", type=int, default=40, help="random epilogues (default 40)")
    p.add_argument("--no-bench", action="store_true", help="only the random epilogues")
    a = p.parse_args()
    problems = [] if a.no_bench else list(bench_problems())
    problems += list(fuzz_problems(a.examples))
    for label, args in problems:
        for line in fingerprint(label, args):
            print(line)


if __name__ == "__main__":
    main()
