"""First-call times of the suite's epilogues, measured on a GPU (BENCHMARKS.md, "First
calls"):

    PYTHONPATH=src python3 benchmarks/cold_start.py --out bench_out/cold.json

Per workload and shape (``--workloads``, ``--shapes``; the suite's definitions,
``evtfuse.bench.workloads``), each in processes of its own with evtfuse's and Triton's
caches in a fresh folder:

- ``fresh_s``: the first ``evtfuse.gemm`` call (in the row's ``tune`` mode) of a new
  process on empty caches (the first call after an install): code generation, compiles,
  tuning, and what Triton and evtfuse do once per install (Triton's driver stub built by
  the C compiler, Triton's key of its own sources: ``runtime.triton_key``);
- ``new_epilogue_s`` (``--install warm``, the default ``both``): the same first call in a
  new process whose caches hold what another epilogue's calls left (a ``prime`` process ran
  ``PRIME_EPILOGUE`` first): a new epilogue in a notebook or a training job, the issue's
  "first call of a new epilogue and shape in a fresh process";
- ``warm_ms``: a later call of that process (the median of five, synchronised);
- ``new_m_ms``: in the same process, the first call at another M of the same size class
  (``tuner.size_class``: M less a tenth, a multiple of 8), minus that M's warm call: what
  a new batch size costs;
- ``second_s``: the first call of a second process on the caches the first one left
  (tuning records and Triton's binaries hit);
- ``tuning``: where the fresh call's tuning went, from its tuning record (``candidates``
  timed, ``compile_s`` of the parallel compiles, ``timing_s`` of the timing windows); the
  rest of ``fresh_s`` is code generation, imports of Triton's compiler and the launch.

``--workloads`` also takes ``GROUPED``'s: ``evtfuse.grouped_gemm`` over ``GROUPS`` experts
(M rows split evenly, a shape's N and K per expert).

Each cell runs once per tuning mode of ``--tunes`` (default ``fast,background``), each
mode on empty caches of its own. With ``tune="background"`` the fresh process goes on
calling after its first call until the background tuning has switched (at most
``--switch-s`` seconds of back-to-back calls): ``switch_calls`` and ``switch_s`` (calls and
seconds from the end of the first call to the switch; where none came, ``states``, where
the class's tunings stood), ``tuning_call_ms`` (the slowest of those calls: one timing
window or check each), ``kernel`` (the class's choice, to compare with "fast"'s) and
``warm_ms`` after the switch.

Times are host wall-clock around a synchronised call (imports and input creation apart).
Python modules run from bytecode, as after ``pip install`` (which byte-compiles): every
process shares a ``PYTHONPYCACHEPREFIX`` folder that a first untimed process fills
(``--no-bytecode``: as the machine has them; a site-packages folder the user cannot write,
or ``PYTHONDONTWRITEBYTECODE``, then compiles Triton's sources in every process, 0.3 s).
``--workers N`` sets ``EVTFUSE_COMPILE_WORKERS`` (1: candidates compiled one at a time);
``--profile TOP`` records where each process's first call goes (cProfile, its TOP functions
by cumulative time).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

TARGETS = {"fresh_s": 5.0, "second_s": 1.5, "new_m_ms": 50.0}
# issue 52's targets for tune="background" (H200; the median over the dense cells)
BACKGROUND_TARGETS = {"fresh_s": 1.5, "second_s": 0.3}
TUNES = ("fast", "background")
INSTALLS = ("empty", "warm")
# the epilogue the "prime" process calls before a warm-install cell: none of the suite's
PRIME_EPILOGUE = "def prime(accum, C):\n    D = 0.5 * accum - C\n    return D"
PRIME_SHAPE = (256, 256, 256)
# grouped workloads (``--workloads grouped_identity,grouped_bias_silu --shapes 16384x4096x4096``):
# ``evtfuse.grouped_gemm`` over GROUPS experts, a mixture of experts' forward (issue 52:
# <= 2.5 s for a grouped GEMM's first call)
GROUPS = 8
GROUPED = {"grouped_identity": None,
           "grouped_bias_silu": "def expert(accum, bias):\n    D = silu(accum + bias)\n"
                                "    return D"}


def _until_switch(call, limit_s: float) -> dict:
    """``tune="background"``: call back to back until every background tuning of the process
    has switched (for at most ``limit_s`` seconds: a call lasts a fraction of a millisecond,
    the background compiles seconds); the calls, seconds and slowest call it took (none
    where no tuning was started: a class with one kernel), and where none switched, the
    state each tuning stood in."""
    from evtfuse.bench.timing import host_timed_s
    from evtfuse.runtime import tuner

    t0, slowest, n = time.perf_counter(), 0.0, 0
    while time.perf_counter() - t0 < limit_s:
        if all(s.done for s in tuner._sessions.values()):
            return {"switch_calls": n, "switch_s": time.perf_counter() - t0,
                    "tuning_call_ms": slowest * 1e3}
        slowest = max(slowest, host_timed_s(call)[0])
        n += 1
    return {"switch_calls": None, "switch_s": None, "tuning_call_ms": slowest * 1e3,
            "calls": n, "states": [repr(s) for s in tuner._sessions.values()]}


def _prime() -> dict:
    """Another epilogue's first call (``PRIME_EPILOGUE``, ``tune="none"``: one kernel),
    untimed: what it leaves in the caches (Triton's driver stub and key, a kernel of its
    own) and in the bytecode folder is what a warm install has."""
    import torch

    import evtfuse

    m, n, k = PRIME_SHAPE
    A = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    B = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    C = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    D = evtfuse.gemm(A, B, epilogue=PRIME_EPILOGUE, C=C, tune="none")
    torch.testing.assert_close(D.float(), 0.5 * (A.float() @ B.float()) - C.float(),
                               rtol=2e-2, atol=2e-1)
    return {"first_s": None}


def _dense_call(w, shape: tuple[int, int, int], tune: str):
    """``call_at(m)``: a no-argument ``evtfuse.gemm`` call of the suite's workload ``w`` at
    M = m (inputs made once)."""
    import torch

    import evtfuse
    from evtfuse.bench import workloads as W

    def call_at(m: int):
        s = (m, shape[1], shape[2])
        ins = W.make_inputs(w, s, torch.bfloat16, "cuda", 0)
        outs = W.make_outputs(w, s, torch.bfloat16, "cuda", poison=True)
        ops = {k: v for k, v in ins.items() if k not in ("A", "B")}

        def call():
            return evtfuse.gemm(ins["A"], ins["B"], epilogue=w.epilogue,
                                **{**w.gemm_options(), "tune": tune},
                                **w.epilogue_operands(ops), **outs)
        return call
    return call_at


def _grouped_call(workload: str, shape: tuple[int, int, int], tune: str):
    """``call_at(m)`` for a grouped workload (``GROUPED``): ``evtfuse.grouped_gemm`` over
    ``GROUPS`` experts' weights (G, K, N), m rows split evenly among them."""
    import torch

    import evtfuse

    _, n, k = shape
    g = torch.Generator(device="cuda").manual_seed(0)
    B = torch.randn(GROUPS, k, n, device="cuda", dtype=torch.bfloat16, generator=g) / k ** 0.5
    bias = torch.randn(GROUPS, 1, n, device="cuda", dtype=torch.bfloat16, generator=g)

    def call_at(m: int):
        A = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
        offs = torch.linspace(m / GROUPS, m, GROUPS, device="cuda").round().to(torch.int32)
        operands = {"bias": bias} if "bias" in (GROUPED[workload] or "") else {}

        def call():
            return evtfuse.grouped_gemm(A, B, offs, GROUPED[workload], tune=tune, **operands)
        return call
    return call_at


def _child(workload: str, shape: tuple[int, int, int], phase: str, tune: str = "fast",
           switch_s: float = 60.0) -> dict:
    if phase == "prime":
        return _prime()
    import torch  # noqa: F401  (imports before the timed call: "imports apart")

    import evtfuse  # noqa: F401
    from evtfuse.bench import workloads as W
    from evtfuse.bench.timing import host_timed_s
    from evtfuse.runtime.tuner import size_class

    if workload in GROUPED:
        call_at = _grouped_call(workload, shape, tune)
    else:
        call_at = _dense_call(W.BY_NAME[workload], shape, tune)
    call = call_at(shape[0])
    top = int(os.environ.get("COLD_START_PROFILE", "0"))
    if top:  # where the first call's time goes (cProfile's overhead included)
        import cProfile
        import io
        import pstats

        prof = cProfile.Profile()
        first_s, _ = host_timed_s(lambda: prof.runcall(call))
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(top)
        got: dict = {"first_s": first_s, "profile": text.getvalue().splitlines()}
    else:
        first_s, _ = host_timed_s(call)
        got = {"first_s": first_s}
    if phase == "fresh":
        from evtfuse.runtime import cache

        if tune == "background":
            got.update(_until_switch(call, switch_s))
        got["kernel"] = [e["kernel"] for e in cache.list_entries()]
        got["tuning"] = [{k: e[k] for k in ("candidates", "compile_s", "timing_s") if k in e}
                         for e in cache.list_entries()]
        got["warm_ms"] = statistics.median(host_timed_s(call)[0] for _ in range(5)) * 1e3
        m2 = (shape[0] - shape[0] // 10) // 8 * 8
        assert size_class(m2) == size_class(shape[0]), (m2, shape[0])
        other = call_at(m2)
        new_s, _ = host_timed_s(other)
        warm2 = statistics.median(host_timed_s(other)[0] for _ in range(5))
        got.update(new_m=m2, new_m_ms=(new_s - warm2) * 1e3, new_m_warm_ms=warm2 * 1e3)
    return got


def _run_child(workload: str, shape: str, phase: str, env: dict, tune: str = "fast",
               switch_s: float = 60.0) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", workload, shape, phase, tune,
                           str(switch_s)], env=env, capture_output=True, text=True,
                          timeout=600)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT"):
            return json.loads(line[len("RESULT"):])
    return {"error": (proc.stderr or proc.stdout).strip().splitlines()[-3:]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="bench_out/cold_start.json")
    p.add_argument("--workloads", default="identity,alpha_beta,bias_gelu_tanh,relu_aux,"
                   "row_amax,bce_loss")
    p.add_argument("--shapes", default="8192x8192x1024,4096x4096x4096,64x4096x4096")
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--tunes", default=",".join(TUNES),
                   help="tuning modes to measure, each on caches of its own (fast, background)")
    p.add_argument("--switch-s", type=float, default=60.0,
                   help="background: the most seconds of calls to wait for the switch")
    p.add_argument("--budget-s", type=float, default=540.0, help="start no cell after this")
    p.add_argument("--profile", type=int, default=0, metavar="TOP",
                   help="profile each process's first call (cProfile): its TOP functions by "
                        "cumulative time go into the row (fresh_profile, second_profile)")
    p.add_argument("--install", default="both", choices=("both",) + INSTALLS,
                   help="empty: caches empty (fresh_s, second_s); warm: caches another "
                        "epilogue's calls left (new_epilogue_s)")
    p.add_argument("--no-bytecode", action="store_true",
                   help="run Python modules as the machine has them (no shared bytecode)")
    p.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        workload, shape, phase, tune, limit = a.child
        m, n, k = (int(x) for x in shape.split("x"))
        print("RESULT" + json.dumps(_child(workload, (m, n, k), phase, tune, float(limit))),
              flush=True)
        return 0
    tunes = [t for t in a.tunes.split(",") if t]
    bad = [t for t in tunes if t not in TUNES]
    if bad:
        p.error(f"--tunes takes {', '.join(TUNES)}, not {bad[0]!r}")
    start = time.monotonic()
    if not a.no_bytecode:
        _bytecode()
    rows = []
    for shape in a.shapes.split(","):
        for workload in a.workloads.split(","):
            for tune in tunes:
                if time.monotonic() - start > a.budget_s:
                    rows.append({"workload": workload, "shape": shape, "tune": tune,
                                 "skipped": "budget"})
                    continue
                rows.append(_cell(workload, shape, tune, a))
                print(json.dumps(rows[-1]), flush=True)
                os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
                with open(a.out, "w") as f:
                    json.dump({"targets": TARGETS, "background_targets": BACKGROUND_TARGETS,
                               "bytecode": not a.no_bytecode, "rows": rows}, f, indent=1)
    _print_table(rows)
    return 0


def _bytecode() -> None:
    """Every child process from now on runs evtfuse's and Triton's modules from bytecode in
    a folder of its own (``PYTHONPYCACHEPREFIX``), compiled here as ``pip install`` does,
    and a prime process fills in the rest it imports (torch's lazily imported modules)."""
    import importlib.util

    folder = tempfile.mkdtemp(prefix="evtfuse-cold-pyc-")
    os.environ["PYTHONPYCACHEPREFIX"] = folder
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    packages = [os.path.dirname(importlib.util.find_spec(name).origin)
                for name in ("evtfuse", "triton")]
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", *packages],
                   check=False, capture_output=True, timeout=600)
    got = _run_child("identity", "x".join(map(str, PRIME_SHAPE)), "prime", _env(None), "none",
                     0.0)
    if "error" in got:
        print("cold_start.py: the bytecode's prime process failed:", *got["error"], sep="\n")


def _env(a) -> dict:
    """A child's environment: evtfuse's and Triton's caches in a new folder."""
    root = tempfile.mkdtemp(prefix="evtfuse-cold-")
    env = dict(os.environ, EVTFUSE_CACHE_DIR=os.path.join(root, "evtfuse"),
               TRITON_CACHE_DIR=os.path.join(root, "triton"), EVTFUSE_PROGRESS="0")
    if a is not None and a.workers is not None:
        env["EVTFUSE_COMPILE_WORKERS"] = str(a.workers)
    if a is not None and a.profile:
        env["COLD_START_PROFILE"] = str(a.profile)
    return env


def _cell(workload: str, shape: str, tune: str, a) -> dict:
    """One cell in one tuning mode: on empty caches a fresh process, then a second one on
    its caches; on caches of its own a prime process (another epilogue), then this
    epilogue's first call in a new process."""
    row: dict = {"workload": workload, "shape": shape, "tune": tune, "workers": a.workers}
    if a.install in ("both", "empty"):
        env = _env(a)
        fresh = _run_child(workload, shape, "fresh", env, tune, a.switch_s)
        second = _run_child(workload, shape, "second", env, tune, a.switch_s)
        row.update({"fresh_s": fresh.get("first_s"), "second_s": second.get("first_s"),
                    **{k: v for k, v in fresh.items() if k not in ("first_s", "profile")},
                    **({"fresh_profile": fresh["profile"],
                        "second_profile": second.get("profile")} if "profile" in fresh else {}),
                    **({"second_error": second["error"]} if "error" in second else {})})
    if a.install in ("both", "warm"):
        env = _env(a)
        prime = _run_child(workload, shape, "prime", env, tune, a.switch_s)
        first = _run_child(workload, shape, "first", env, tune, a.switch_s)
        row.update({"new_epilogue_s": first.get("first_s"),
                    **({"new_epilogue_profile": first["profile"]} if "profile" in first else {}),
                    **({"new_epilogue_error": first.get("error") or prime["error"]}
                       if "error" in first or "error" in prime else {})})
    return row


def _print_table(rows: list[dict]) -> None:
    nan = float("nan")
    print(f"{'workload':16} {'shape':16} {'tune':10} {'fresh s':>8} {'new epi s':>9} "
          f"{'second s':>9} {'new M ms':>9} {'warm ms':>8} {'switch':>7}")
    for r in rows:
        if r.get("fresh_s") is not None or r.get("new_epilogue_s") is not None:
            print(f"{r['workload']:16} {r['shape']:16} {r['tune']:10} "
                  f"{r.get('fresh_s') or nan:8.2f} {r.get('new_epilogue_s') or nan:9.2f} "
                  f"{r.get('second_s') or nan:9.2f} {r.get('new_m_ms', nan):9.1f} "
                  f"{r.get('warm_ms', nan):8.3f} {r.get('switch_calls') or '':>7}")
        else:
            print(f"{r['workload']:16} {r['shape']:16} {r.get('tune', ''):10} "
                  f"{r.get('error') or r.get('skipped')}")


if __name__ == "__main__":
    sys.exit(main())
