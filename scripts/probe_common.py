"""What the GPU probes in ``scripts/`` share: the arguments of a probe's epilogue, and
timing several systems in interleaved rounds. Imported by the probes (their folder is on
``sys.path`` when one runs as ``python3 scripts/NAME.py``); not part of the library.
"""

from __future__ import annotations

import ast
import statistics
from typing import Any, Callable

import torch

from evtfuse import EpilogueArguments, GemmArguments

SCALARS = {"alpha": 1.5, "beta": 0.5}


def epilogue_args(src: str, M: int, N: int, K: int, device: str = "cuda",
                  labels: bool = False) -> GemmArguments:
    """bf16 A (M, K) and B (K, N) with every operand and output ``src`` names, by name: C a
    full tile (0/1 labels with ``labels``), bias a per-column vector, s a per-row fp32
    scale, alpha and beta runtime scalars; outputs D and F full tiles (D passed as None,
    not stored, when the epilogue returns a loss), amax and lse per row, loss one value."""
    fn = ast.parse(src).body[0]
    assert isinstance(fn, ast.FunctionDef)
    ins = [a.arg for a in fn.args.args[1:]]
    ret = fn.body[-1].value
    outs = [e.id for e in (ret.elts if isinstance(ret, ast.Tuple) else [ret])]
    dt = torch.bfloat16
    full = lambda: torch.empty(M, N, device=device, dtype=dt)  # noqa: E731
    vals: dict[str, Any] = {}
    for name in ins:
        if name == "C":
            vals[name] = (torch.rand(M, N, device=device).round().to(dt) if labels
                          else torch.randn(M, N, device=device, dtype=dt))
        elif name == "bias":
            vals[name] = torch.randn(N, device=device, dtype=dt)
        elif name == "s":
            vals[name] = torch.randn(M, 1, device=device)
        elif name in SCALARS:
            vals[name] = SCALARS[name]
        else:
            raise ValueError(f"no probe input for operand {name!r}")
    for name in outs:
        if name == "D":
            vals[name] = None if "loss" in outs else full()
        elif name == "F":
            vals[name] = full()
        elif name in ("amax", "lse"):
            vals[name] = torch.empty(M, 1, device=device)
        elif name == "loss":
            vals[name] = torch.empty(1, device=device)
        else:
            raise ValueError(f"no probe buffer for output {name!r}")
    A = torch.randn(M, K, device=device, dtype=dt)
    B = torch.randn(K, N, device=device, dtype=dt)
    return GemmArguments(A, B, vals["D"], epilogue=EpilogueArguments(src, **vals))


def import_source(src: str):
    """``src`` (an edited copy of a kernel's generated module) imported from a temporary
    file."""
    import importlib.util
    import tempfile

    f = tempfile.NamedTemporaryFile("w", suffix=".py", delete=False)
    f.write(src)
    f.close()
    spec = importlib.util.spec_from_file_location(f"ef_edited_{abs(hash(src))}", f.name)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def edited_launcher(kernel, args: GemmArguments, src: str) -> Callable[[], Any]:
    """A call of ``src`` (an edited copy of ``kernel``'s generated module) through Triton's
    JIT with ``kernel``'s launch plan for ``args``."""
    plan = kernel.plan(args)
    fn = import_source(src).evtfuse_kernel[plan.grid]
    return lambda: fn(*plan.positional(args.A, args.B, args.epilogue.values), **plan.consts)


def ping_pong(kernel) -> bool:
    """Whether ``kernel`` is a gluon ping-pong kernel (not a cooperative one)."""
    return kernel.family.name == "gluon" and not kernel.config.cooperative


def distinct_configs(kernels: list, keep: Callable[[Any], bool] = lambda k: True) -> list:
    """The first kernel of each config among ``kernels`` that ``keep`` takes, configs that
    differ only in their tile order (GROUP_M) counting as one, in the library's order."""
    from dataclasses import replace

    out, seen = [], set()
    for k in kernels:
        key = replace(k.config, group_m=0)
        if keep(k) and key not in seen:
            seen.add(key)
            out.append(k)
    return out


def time_rounds(systems: dict[str, Callable[[], Any]], rounds: int,
                timer: Callable[[Callable[[], Any]], float]) -> dict[str, list[float]]:
    """``timer(fn)`` of every system once per round, rounds in turn (the GPU's clock drifts
    over a probe: interleaving keeps that out of the ratios)."""
    times: dict[str, list[float]] = {s: [] for s in systems}
    for _ in range(rounds):
        for s, fn in systems.items():
            times[s].append(timer(fn))
    return times


def print_rounds(title: str, times: dict[str, list[float]], base: str = "mm",
                 by_time: bool = False) -> None:
    """Each system's median over its rounds, its ratio to ``base``'s and its range."""
    ref = statistics.median(times[base])
    print(f"== {title}", flush=True)
    rows = sorted(times.items(), key=lambda kv: statistics.median(kv[1])) if by_time \
        else times.items()
    for s, ts in rows:
        med = statistics.median(ts)
        print(f"   {s:40s} {med:.4f} ms  x{med / ref:.3f} of {base}  "
              f"[{min(ts):.4f}-{max(ts):.4f}]", flush=True)


def report_rounds(title: str, systems: dict[str, Callable[[], Any]], rounds: int,
                  guarded: bool, rep_ms: float) -> None:
    """Time ``systems`` in interleaved rounds (``guarded_ms``, or do_bench windows of
    ``rep_ms``) and print each one's median against cuBLAS's ("mm")."""
    import triton.testing

    from evtfuse.bench.timing import guarded_ms

    timer = guarded_ms if guarded else (lambda fn: triton.testing.do_bench(
        fn, warmup=25, rep=rep_ms, return_mode="median"))
    print_rounds(f"{title} ({rounds} rounds, median of round medians)",
                 time_rounds(systems, rounds, timer))
