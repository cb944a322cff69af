"""A first call's cost: tuning by size class (``runtime.tuner.size_class``: a new M in a
known class reuses the class's choice, from this process or from the disk cache, and M
outside it does not) and the candidates' compiles at once (``tuner._precompile``; what
Triton does in its threads is checked on the GPU tier, here the tuner's side of it)."""

from __future__ import annotations

import pytest
import torch

import evtfuse
from evtfuse import EpilogueArguments, GemmArguments
from evtfuse.runtime import cache, tuner
from evtfuse.runtime.tuner import size_class

pytestmark = [pytest.mark.skipif(torch.cuda.is_available(),
                                 reason="CPU-interpreter tier (the tuner's keys are the same on a GPU)"),
              pytest.mark.usefixtures("own_cache")]  # conftest.py


def test_size_classes():
    assert [size_class(m) for m in (1, 16, 17, 32, 33, 64)] == [16, 16, 32, 32, 64, 64]
    previous = 64
    for m in range(65, 20000, 7):
        c = size_class(m)
        assert m <= c <= 1.25 * m + 1 and c >= previous  # tight, and monotonic
        assert size_class(c) == c  # a class's largest M is in it
        previous = c
    assert size_class(4096) == 4096 and size_class(4097) == 5120


def _args(M, N=24, K=16):
    A, B = torch.randn(M, K), torch.randn(K, N)
    D = torch.empty(M, N)
    return GemmArguments(A, B, D, epilogue=EpilogueArguments(
        "def e(accum, bias): D = relu(accum + bias); return D", bias=torch.randn(N), D=D))


def test_keys_follow_the_class_of_m_and_every_other_dimension():
    key = tuner.tuning_key(_args(1000), "fast", None)
    assert tuner.tuning_key(_args(1020), "fast", None) == key  # both in (896, 1024]
    assert tuner.tuning_key(_args(1100), "fast", None) != key
    assert tuner.tuning_key(_args(1000, N=32), "fast", None) != key
    assert tuner.tuning_key(_args(1000, K=32), "fast", None) != key


def test_a_new_m_in_a_known_class_reuses_the_stored_choice(monkeypatch):
    """A choice on disk for M = 1000 (the one a tuning made: here the heuristic's second
    candidate, so that reuse shows) serves M = 1010 in a fresh process (the in-memory table
    empty) without tuning; M = 1100, in the next class, takes its own (the first)."""
    first = _args(1000)
    kernels = evtfuse.get_kernels(first)
    assert len(kernels) >= 2
    picked = kernels[1]
    cache.store_choice(tuner.tuning_key(first, "fast", None),
                       tuner.tuning_record(first, picked, "fast"))
    assert tuner.choose_kernel(_args(1010)).name == picked.name
    assert tuner.choose_kernel(_args(1100)).name == kernels[0].name
    # the class's record is kept in memory once read: a third M of it reads no file
    monkeypatch.setattr(cache, "load_choice", lambda key: pytest.fail("read the disk again"))
    assert tuner.choose_kernel(_args(1020)).name == picked.name
    again = _args(1010)
    D = evtfuse.gemm(again.A, again.B, "def e(accum, bias): D = relu(accum + bias); return D",
                     bias=again.epilogue.values["bias"])
    torch.testing.assert_close(D, torch.relu(again.A @ again.B + again.epilogue.values["bias"]),
                               atol=1e-4, rtol=1e-4)


class _Plan:
    def __init__(self, log, name, fails):
        self.log, self.name, self.fails = log, name, fails

    def warmup(self, A, B, values):
        self.log.append(("warmup", self.name))
        if self.fails:
            raise RuntimeError("a compile error")


class _Kernel:
    def __init__(self, log, name, plan_fails=False, warmup_fails=False):
        self.log, self.name = log, name
        self.plan_fails, self.warmup_fails = plan_fails, warmup_fails

    def plan(self, args):
        self.log.append(("plan", self.name))
        if self.plan_fails:
            raise RuntimeError("unsupported")
        return _Plan(self.log, self.name, self.warmup_fails)


def test_precompile_warms_every_plan_inside_triton_s_async_mode(monkeypatch):
    """Every candidate's plan is built first, one by one, then warmed up inside the async
    compile mode with a pool of the configured size; a candidate whose plan or compile fails
    is left to the timing loop (no exception escapes)."""
    from evtfuse.backends.triton import versions

    log, modes = [], []

    class Mode:
        def __init__(self, pool, ignore_errors):
            modes.append((pool._max_workers, ignore_errors))

        def __enter__(self):
            log.append(("enter", None))

        def __exit__(self, *exc):
            log.append(("exit", None))

    monkeypatch.setattr(versions, "async_compile_mode", lambda: Mode)
    monkeypatch.setenv("EVTFUSE_COMPILE_WORKERS", "3")
    kernels = [_Kernel(log, "a"), _Kernel(log, "b", plan_fails=True),
               _Kernel(log, "c", warmup_fails=True), _Kernel(log, "d")]
    spent = tuner._precompile(kernels, _args(64))
    assert spent >= 0 and modes == [(3, True)]
    assert log == [("plan", "a"), ("plan", "b"), ("plan", "c"), ("plan", "d"), ("enter", None),
                   ("warmup", "a"), ("warmup", "c"), ("warmup", "d"), ("exit", None)]
    log.clear()
    monkeypatch.setenv("EVTFUSE_COMPILE_WORKERS", "1")  # one thread: compiles stay in the loop
    assert tuner._precompile(kernels, _args(64)) == 0.0 and log == []


def test_triton_s_async_compile_mode_is_found():
    """The tested releases all have it (versions.async_compile_mode); without it the
    tuner compiles one candidate at a time."""
    from evtfuse.backends.triton.versions import async_compile_mode

    mode = async_compile_mode()
    assert mode is not None and hasattr(mode, "__enter__") and hasattr(mode, "submit")


def test_no_precompile_inside_another_async_compile_mode():
    """Triton's modes do not nest: inside one (a caller's own), candidates compile one by
    one rather than fail."""
    from concurrent.futures import ThreadPoolExecutor

    from evtfuse.backends.triton.versions import async_compile_mode

    mode = async_compile_mode()
    with ThreadPoolExecutor(1) as pool, mode(pool):
        assert async_compile_mode() is None
    assert async_compile_mode() is mode


_SAME_CLASS = [(4096, 3680), (64, 56), (8192, 7368)]  # benchmarks/cold_start.py's new Ms
_NO_M_EDGE = {  # epilogues whose kernels no M of a class changes
    "alpha_beta": ("def e(accum, C): D = 0.5 * accum + C; return D", {"C": "full"}),
    "row_amax": ("def e(accum): D = accum; amax = max(abs(accum)); return D, amax",
                 {"amax": "row"}),
}


def _family_args(src, ops, M, N=2048, K=64, a_col=False):
    bf = torch.bfloat16
    A = torch.randn(K, M).to(bf).t() if a_col else torch.randn(M, K).to(bf)
    B = torch.randn(K, N).to(bf)
    D = torch.empty(M, N, dtype=bf)
    made = {"full": lambda: torch.randn(M, N).to(bf), "row": lambda: torch.empty(M, 1),
            "scalar": lambda: torch.empty(1)}
    return GemmArguments(A, B, D, epilogue=EpilogueArguments(
        src, D=D, **{k: made[v]() for k, v in ops.items()}))


@pytest.mark.parametrize("family", ["portable", "hopper", "gluon"])
@pytest.mark.parametrize("epi", list(_NO_M_EDGE))
@pytest.mark.cover
def test_a_new_m_of_a_class_reuses_the_compiled_kernel(family, epi):
    """Every candidate of each family, at two Ms of one size class, has the same module
    (spec key), the same constexprs and M unspecialised (``do_not_specialize``: Triton
    keys its compiled kernels on nothing else that M changes here), so the second M runs
    the first one's compiled kernel. Target: an H100 (132 SMs), offline."""
    from evtfuse.backends.triton.families import GluonFamily, HopperFamily, PortableFamily, Target

    fam = {"portable": PortableFamily, "hopper": HopperFamily, "gluon": GluonFamily}[family]()
    target = Target("cuda", 90, torch.device("cpu"), 132, offline=True)
    src, ops = _NO_M_EDGE[epi]
    # fewer tiles than SMs (1280 and 1100 rows: 80 and 72 tiles of 128x256): the hopper
    # family's programs follow the class, not the M, where no reduction needs one partial
    # per program launched
    few = [(1280, 1100)] if not epi.startswith("row_") else []
    for m1, m2 in _SAME_CLASS + few:
        a1, a2 = _family_args(src, ops, m1), _family_args(src, ops, m2)
        assert size_class(m1) == size_class(m2)
        assert fam.supports(a1, target) and fam.supports(a2, target)
        configs = fam.configs(a1, target)
        # the same candidates (their order may follow the shape): the class's tuned choice
        # is among the second M's own
        assert configs and {c.name for c in configs} == {c.name for c in fam.configs(a2, target)}
        for c in configs:
            s1, s2 = fam.spec(a1, c, target), fam.spec(a2, c, target)
            assert s1.key() == s2.key() and "do_not_specialize" in s1.jit_line(), c.name
            consts1, consts2 = (fam.plan(a, a.optimized_dag, c, target)[1] for a in (a1, a2))
            assert consts1 == consts2, (c.name, m1, m2)


def test_what_still_costs_a_compile_for_a_new_m():
    """A whole-output reduction's mask folds away only where the tiles cover M
    (``EVEN_MN``): an M of another remainder is another compile. A portable kernel keeps M
    specialised for an M-contiguous A (its loads vectorise on 16 | M)."""
    from evtfuse.backends.triton.families import PortableFamily, Target

    fam = PortableFamily()
    target = Target("cuda", 90, torch.device("cpu"), 132, offline=True)
    src = "def e(accum): D = accum; s = sum(accum); return D, s"
    a1, a2 = (_family_args(src, {"s": "scalar"}, m) for m in (4096, 3680))
    c = fam.configs(a1, target)[0]
    assert fam.plan(a1, a1.optimized_dag, c, target)[1]["EVEN_MN"]
    assert not fam.plan(a2, a2.optimized_dag, c, target)[1]["EVEN_MN"]
    col = _family_args(_NO_M_EDGE["alpha_beta"][0], {"C": "full"}, 4096, a_col=True)
    assert "do_not_specialize" not in fam.spec(col, c, target).jit_line()


def test_shipped_defaults_suggest_the_nearest_measured_shape():
    """``defaults.suggestions``: the kernels chosen at the nearest measured shape (within a
    factor of two over M, N and K together), for the same GPU or one of its kind, the most
    often chosen first; nothing for another dtype or a shape far from every entry."""
    from evtfuse.runtime.defaults import suggestions

    h100, bf = ("NVIDIA H100 80GB HBM3", "9.0", 132), "torch.bfloat16"
    entries = ({"gpu": h100[0], "cc": "9.0", "sms": 132, "dtype": bf, "shape": [4096] * 3,
                "kernels": ["a", "b"]},
               {"gpu": h100[0], "cc": "9.0", "sms": 132, "dtype": bf, "shape": [8192, 8192, 1024],
                "kernels": ["c"]})
    assert suggestions(*h100, bf, (4096, 4096, 4096), entries) == ["a", "b"]
    assert suggestions(*h100, bf, (3000, 4096, 4096), entries) == ["a", "b"]  # log2 0.45
    assert suggestions(*h100, bf, (8192, 8192, 1536), entries) == ["c"]
    assert suggestions(*h100, bf, (64, 4096, 4096), entries) == []  # too far from both
    assert suggestions(*h100, "torch.float16", (4096, 4096, 4096), entries) == []
    assert suggestions("NVIDIA H200", "9.0", 132, bf, (4096, 4096, 4096), entries) == ["a", "b"]
    assert suggestions("NVIDIA A100", "8.0", 108, bf, (4096, 4096, 4096), entries) == []


def test_shipped_defaults_name_kernels_the_families_offer():
    """The package's defaults.json (scripts/defaults_table.py over the suite's results):
    every entry is well formed, and at the suite's 4096^3 bf16 shape most suggestions are
    kernels an sm_90 GPU is offered today for the alpha-beta epilogue (a renamed config
    would silently stop being suggested)."""
    import json

    from evtfuse.runtime.defaults import DEFAULTS_FILE, FORMAT, suggestions
    from evtfuse.runtime.offline import offered

    data = json.loads(DEFAULTS_FILE.read_text())
    assert data["format"] == FORMAT and data["entries"]
    for e in data["entries"]:
        assert {"gpu", "cc", "sms", "dtype", "shape", "kernels"} <= set(e) and e["kernels"]
    bf = torch.bfloat16
    M = N = K = 4096
    A, B, C = torch.empty(M, K, dtype=bf), torch.empty(K, N, dtype=bf), torch.empty(M, N, dtype=bf)
    D = torch.empty(M, N, dtype=bf)
    args = GemmArguments(A, B, D, epilogue=EpilogueArguments(
        "def e(accum, C): D = 0.5 * accum + C; return D", C=C, D=D))
    names = {f"{f.name}_{c.name}" for f, c in offered(args)}
    hints = suggestions("NVIDIA H100 80GB HBM3", "9.0", 132, "torch.bfloat16", (M, N, K))
    assert hints and sum(h in names for h in hints) >= len(hints) // 2, (hints, names)


def test_hopper_launches_fewer_programs_than_its_class_constant():
    """The hopper family's persistent kernel at Ms of one class where a launch has fewer
    tiles than the class's largest M (each program then has one tile, or none beyond its
    own): every element right (interpreter, cc=90: 4 SMs)."""
    from evtfuse.runtime.discovery import get_kernels

    N, K = 32, 16
    B, bias = torch.randn(K, N), torch.randn(N)
    for m in (33, 40, 50, 64):  # class 64
        A = torch.randn(m, K)
        D = torch.empty(m, N)
        args = GemmArguments(A, B, D, epilogue=EpilogueArguments(
            "def e(accum, bias): D = relu(accum + bias); return D", bias=bias, D=D))
        hopper = [k for k in get_kernels(args, cc=90) if k.family.name == "hopper"]
        assert hopper
        for k in hopper:
            D.fill_(float("nan"))
            k.run(args)
            torch.testing.assert_close(D, torch.relu(A @ B + bias), atol=1e-4, rtol=1e-4)
