"""Generated names by construction (``backends/triton/names.py``): operand and output names
that look like the kernels' own identifiers must work like any others.

Before the namer, a kernel parameter or local was the user's name with a prefix and a
suffix (``u_x_ptr``, ``ve_u_x_0``, ``racc_u_r_s``), so ``x`` and ``x_0`` (or ``x_ptr``,
``r_ws``, ...) could meet: the hopper family's two-per-SM kernel gave a relative error of
0.99 for a per-column ``x`` beside a per-row ``x_0`` (one vector overwrote the other),
and other pairs gave a raw ``SyntaxError: duplicate argument`` whose module stayed in the
kernel cache. Here: those cases verified against the reference under the interpreter
(portable and hopper families), the gluon family's sources compiled by Python and, in a
subprocess, offline for sm_90; and the invariant itself: the generated code does not
depend on the user's names at all (only the header's table does).
"""

from __future__ import annotations

import ast
import io
import keyword
import os
import re
import tokenize

import pytest
import torch

from evtfuse import EpilogueArguments, GemmArguments, explain, get_kernels
from evtfuse.backends.triton.codegen import generate
from evtfuse.backends.triton.families import HopperFamily, TileConfig
from evtfuse.backends.triton.names import GENERATED, ROLES, Names
from evtfuse.runtime import cache
from evtfuse.runtime.kernel import Kernel
from evtfuse.runtime.offline import offered
from offline_run import run_offline
from tiers import quick

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tier")

M, N, K = 40, 72, 16  # ragged against the interpreter's 32-wide tiles: two pieces per tile


def _rand(*shape, seed, dtype=torch.float16):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _operand(kind: str, seed: int, dtype=torch.float16):
    """An operand of ``kind``: full, col (N,), row (M, 1), dev (a 0-d tensor), or a number."""
    if kind == "full":
        return _rand(M, N, seed=seed, dtype=dtype)
    if kind == "col":
        return _rand(N, seed=seed, dtype=dtype)
    if kind == "row":
        return _rand(M, 1, seed=seed, dtype=dtype)
    if kind == "dev":
        return torch.tensor(0.75)
    return float(kind)


def _args(src: str, dtype=torch.float16, **kinds) -> GemmArguments:
    """``src`` on fresh data: each keyword an operand kind (``_operand``) or, for outputs,
    "out" (M, N), "out_row" (M, 1), "out_one" (1,)."""
    A, B = _rand(M, K, seed=1, dtype=dtype), _rand(K, N, seed=2, dtype=dtype)
    values = {}
    for i, (name, kind) in enumerate(kinds.items()):
        if kind == "out":
            values[name] = torch.empty(M, N, dtype=dtype)
        elif kind == "out_row":
            values[name] = torch.empty(M, 1)
        elif kind == "out_one":
            values[name] = torch.empty(1)
        else:
            values[name] = _operand(kind, seed=10 + i, dtype=dtype)
    return GemmArguments(A, B, values.get("D"), epilogue=EpilogueArguments(src, **values))


def _interpreted_kernels(args) -> list[Kernel]:
    """Every kernel the interpreter offers for ``args`` (``cc=90``: the hopper family too),
    and the hopper family's two-per-SM config, which loads every piece's vectors at the
    top of the epilogue (``KernelSpec.early_vectors``; offered on GPUs at 2048^2)."""
    ks = get_kernels(args, cc=90)
    assert ks, explain(args, cc=90)
    hopper = [k for k in ks if k.family.name == "hopper"]
    if hopper:
        two = TileConfig(32, 32, 16, 2, 4, 2, epi_split=2, flatten=False, ctas_per_sm=2)
        ks.append(Kernel(HopperFamily(), two, hopper[0].target))
    return ks


def _verify_all(args) -> list[str]:
    names = []
    for k in _interpreted_kernels(args):
        result = k.verify(args)
        assert result, f"{k.name}:\n{result.report()}"
        names.append(k.name)
    return names


X_AND_X_0 = "def epi(accum, x, x_0): D = accum * x + x_0; return D"


def test_per_column_x_and_per_row_x_0():
    """The GPU finding: a per-column ``x`` and a per-row ``x_0`` loaded early by the
    two-per-SM hopper kernel went into one variable (``ve_u_x_0``)."""
    args = _args(X_AND_X_0, x="col", x_0="row", D="out")
    ran = _verify_all(args)
    assert any(n.endswith("_o2") for n in ran) and any(n.startswith("portable") for n in ran)
    spec = HopperFamily().spec(args, TileConfig(32, 32, 16, 2, 4, 2, epi_split=2, flatten=False,
                                                ctas_per_sm=2), _interpreted_kernels(args)[0].target)
    assert spec.early_vectors
    src = generate(spec)
    for name in (spec.names("x", "ve", 0), spec.names("x", "ve", 1), spec.names("x_0", "ve")):
        assert src.count(f"{name} = tl.load(") == 1, name


# operands and outputs named like the kernels' former parameters and locals of another
# operand or output: (source, kinds)
SUFFIX_CASES = {
    **{f"x_and_x_{s}": (f"def epi(accum, x, x_{s}): D = accum * x + x_{s}; return D",
                        dict(x="full", **{f"x_{s}": "0.5"}, D="out"))
       for s in ("ptr", "sl", "sm", "sn", "desc")},
    "row_x_and_x_sm": ("def epi(accum, x, x_sm, x_sl): D = accum * x + x_sm * x_sl; return D",
                       dict(x="row", x_sm="-1.5", x_sl="dev", D="out")),
    "device_scalar_x_and_x_ptr": ("def epi(accum, x, x_ptr): D = accum * x + x_ptr; return D",
                                  dict(x="dev", x_ptr="2.0", D="out")),
    "D_and_D_ptr_D_sm": ("def epi(accum, D_ptr, D_sm, D_sl, D_sn): "
                         "D = accum * D_ptr + D_sm - D_sl * D_sn; return D",
                         dict(D_ptr="0.5", D_sm="-1.0", D_sl="0.25", D_sn="2.0", D="out")),
    "D_and_D_desc": ("def epi(accum, D_desc): D = accum * D_desc; return D",
                     dict(D_desc="full", D="out")),
    "r_and_r_ws_r_cnt_r_out": ("def epi(accum, r_ws, r_cnt, r_out, r_osl, r_os): "
                               "D = accum * r_ws + r_cnt; r = sum(D * r_out + r_osl - r_os); "
                               "return D, r",
                               dict(r_ws="0.5", r_cnt="1.5", r_out="-0.75", r_osl="0.125",
                                    r_os="2.0", D="out", r="out_row")),
    "logsumexp_r_and_r_ws2": ("def epi(accum, r_ws2): D = accum * r_ws2; r = logsumexp(D); "
                              "return D, r", dict(r_ws2="0.5", D="out", r="out_row")),
    # a logsumexp's running sum of exp (racc_u_r_s) and another output's running partial
    "logsumexp_r_and_sum_r_s": ("def epi(accum): D = accum; r = logsumexp(accum); "
                                "r_s = sum(accum); return D, r, r_s",
                                dict(D="out", r="out_row", r_s="out_row")),
    "whole_logsumexp_r_and_sum_r_s": ("def epi(accum): D = accum; r = logsumexp(accum); "
                                      "r_s = max(accum); return D, r, r_s",
                                      dict(D="out", r="out_one", r_s="out_one")),
    "full_x_and_x_c": ("def epi(accum, x, x_c, x_c3): D = accum * x + x_c - x_c3; return D",
                       dict(x="full", x_c="full", x_c3="row", D="out")),
    "vector_x_and_x_c": ("def epi(accum, x, x_c): D = accum * x + x_c; return D",
                         dict(x="col", x_c="row", D="out")),
    "numbered_like_the_namer": ("def epi(accum, u0, u1_ptr, v0, s0): "
                                "D = accum * u0 + u1_ptr + v0 * s0; u1 = sum(D); return D, u1",
                                dict(u0="col", u1_ptr="full", v0="row", s0="0.5", D="out",
                                     u1="out_row")),
    "kernel_scope_names": ("def epi(accum, tl, M, BLOCK_M, pid_m, acc, rm, mask, bid64, triton, gl): "
                           "D = accum * tl + M * BLOCK_M + pid_m - acc + rm * mask + bid64 + triton * gl; "
                           "return D",
                           dict(tl="full", M="col", BLOCK_M="row", pid_m="0.5", acc="dev",
                                rm="row", mask="0.25", bid64="row", triton="1.5", gl="col",
                                D="out")),
}


@pytest.mark.parametrize("case", quick(list(SUFFIX_CASES), [
    "x_and_x_ptr", "row_x_and_x_sm", "device_scalar_x_and_x_ptr", "D_and_D_ptr_D_sm",
    "r_and_r_ws_r_cnt_r_out", "numbered_like_the_namer", "kernel_scope_names"]))
def test_names_that_meet_generated_suffixes(case):
    src, kinds = SUFFIX_CASES[case]
    _verify_all(_args(src, **kinds))


def _code(source: str) -> str:
    """A generated module without its header docstring (where the user's names appear)."""
    return source[source.index('"""', 3) + 3:]


def _gluon_refusal(args) -> str:
    from evtfuse.backends.triton.families import GluonFamily, Target

    return GluonFamily().supports(args, Target("cuda", 90, args.A.device, 132, offline=True)).reason


def _gluon_specs(args):
    """Every gluon kernel an sm_90 GPU would be offered for ``args``, as (config, spec)."""
    from evtfuse.backends.triton.families import Target

    target = Target("cuda", 90, args.A.device, 132, offline=True)
    return [(cfg, fam.spec(args, cfg, target)) for fam, cfg in offered(args)
            if fam.name == "gluon"]


@pytest.mark.parametrize("case", [c for c in SUFFIX_CASES if c != "full_x_and_x_c"] + ["x_and_x_0"])
def test_gluon_sources_of_suffix_names_compile(case):
    """The gluon family's kernels cannot run here: each one an sm_90 GPU would be offered
    is compiled as Python (no duplicate parameter, no syntax error), its identifiers are
    the namer's, and its code is that of the same epilogue with plain names (a staged
    vector ``x`` beside ``x_c`` once compiled with x's consumer buffer in x_c's place:
    ``vb_u_x_c``; ``test_generated_code_does_not_depend_on_user_names``); the offline
    sm_90 compile of a few is ``test_gluon_kernels_with_suffix_names_compile_for_sm_90``.
    (Two full bf16 tiles leave the gluon family too few stages: ``vector_x_and_x_c`` is its
    ``full_x_and_x_c``.)"""
    src, kinds = SUFFIX_CASES.get(case) or (X_AND_X_0, dict(x="col", x_0="row", D="out"))
    args = _args(src, dtype=torch.bfloat16, **kinds)
    # the same epilogue with plain names: the same code (a collision would show as a diff)
    plain = {name: f"n{i}" for i, name in enumerate(kinds) if name != "D"}
    neutral = _args(_renamed(src, plain), dtype=torch.bfloat16,
                    **{plain.get(k, k): v for k, v in kinds.items()})
    specs = _gluon_specs(args)
    assert specs, _gluon_refusal(args)
    for (cfg, spec), (_, other) in zip(specs, _gluon_specs(neutral), strict=True):
        source = generate(spec)
        compile(source, f"<{cfg.name}>", "exec")
        assert _code(source) == _code(generate(other)), cfg.name
        _check_identifiers(source, spec.names)


def _renamed(src: str, mapping: dict[str, str]) -> str:
    return re.sub(r"\b\w+\b", lambda m: mapping.get(m.group(0), m.group(0)), src)


RENAMING_CASES = {
    "x_and_x_0": (X_AND_X_0, dict(x="col", x_0="row", D="out"),
                  {"x": "bias", "x_0": "scale"}),
    "relu_aux_reductions": ("def epi(accum, C, alpha, s, rowv): F = alpha * accum + C * s; "
                            "D = relu(F) + rowv; r = logsumexp(F); m = max(D); t = sum(D); "
                            "return D, F, r, m, t",
                            dict(C="full", alpha="0.5", s="dev", rowv="row", D="out", F="out",
                                 r="out_row", m="out_row", t="out_one"),
                            {"C": "x_sm", "alpha": "C", "s": "u0", "rowv": "tl", "F": "u_C",
                             "r": "r_ws", "m": "M", "t": "pacc_u_r"}),
}


@pytest.mark.parametrize("case", list(RENAMING_CASES))
def test_generated_code_does_not_depend_on_user_names(case):
    """The invariant that makes collisions impossible: renaming every operand and output
    (but D) changes no line of any generated kernel below its header, in every family and
    config an sm_90 GPU (and the interpreter) would be offered; each identifier of the
    namer's forms is one it builds, and every other one (fixed text of the emitters) has
    none of those forms."""
    from evtfuse.backends.triton.families import Target

    src, kinds, mapping = RENAMING_CASES[case]
    for dtype in (torch.bfloat16, torch.float16):
        args = _args(src, dtype=dtype, **kinds)
        other = _args(_renamed(src, mapping), dtype=dtype,
                      **{mapping.get(k, k): v for k, v in kinds.items()})
        targets = [Target("cuda", 90, args.A.device, 132, offline=True)]
        if dtype == torch.float16:
            targets.append(get_kernels(args, cc=90)[0].target)  # the interpreter's
        seen = set()
        for target in targets:
            from evtfuse.runtime.api import kernels_for

            for k in kernels_for(args, target):
                spec = k.family.spec(args, k.config, target)
                renamed = k.family.spec(other, k.config, target)
                a, b = generate(spec), generate(renamed)
                assert _code(a) == _code(b), k.name
                assert a != b  # the header's table names them
                _check_identifiers(a, spec.names)
                seen.add(k.family.name)
        assert seen >= ({"hopper", "portable"} | ({"gluon"} if dtype == torch.bfloat16 else set()))


def _check_identifiers(source: str, names: Names) -> None:
    code = _code(source)
    idents = {t.string for t in tokenize.generate_tokens(io.StringIO(code).readline)
              if t.type == tokenize.NAME and not keyword.iskeyword(t.string)}
    for ident in idents:
        if GENERATED.match(ident):
            assert names.owns(ident), ident
    for fn in ast.walk(ast.parse(code)):  # one parameter list per function, no duplicates
        if isinstance(fn, ast.FunctionDef):
            params = [a.arg for a in fn.args.args]
            assert len(params) == len(set(params)), (fn.name, params)


def test_the_namer_builds_distinct_identifiers():
    dag = _args(X_AND_X_0, x="col", x_0="row", D="out").optimized_dag
    names = Names.of(dag)
    assert names.users == ("x", "x_0", "D")
    built = [names(n, r, p) for n in names.users for r in [None, *ROLES]
             for p in ([None] if r is None else [None, 0, 1, 10])]
    assert len(built) == len(set(built))
    assert all(GENERATED.match(b) and names.owns(b) for b in built)
    assert names("x", "ve", 0) == "u0_ve_0" and names("x_0", "ve") == "u1_ve"
    for bad in (lambda: names("y"), lambda: names("x", "nope"), lambda: names("x", "ve", "_0"),
                lambda: names("x", None, 0)):
        with pytest.raises((KeyError, ValueError)):
            bad()
    assert names.table()[1] == "u1 = x_0 (operand, per-row vector f16)"


def test_a_module_that_does_not_import_is_not_left_in_the_cache():
    key = "names-test-broken-module"
    path = cache.cache_dir() / "kernels" / f"k{key}.py"
    with pytest.raises(SyntaxError):
        cache.load_module(key, "def evtfuse_kernel(a, a):\n    pass\n")
    assert not path.exists()
    mod = cache.load_module(key, "def evtfuse_kernel(a, b):\n    return a + b\n")
    assert mod.evtfuse_kernel(1, 2) == 3 and path.exists()


_GLUON_SCRIPT = """
import json, sys, torch
sys.path.insert(0, {tests!r})
from test_names_cpu import SUFFIX_CASES, X_AND_X_0, _args, _gluon_specs
from evtfuse.backends.triton.families import GluonFamily
from evtfuse.runtime.offline import compile_for
out = {{}}
cases = {{"x_and_x_0": (X_AND_X_0, dict(x="col", x_0="row", D="out")),
          "vector_x_and_x_c": SUFFIX_CASES["vector_x_and_x_c"],
          "D_and_D_desc": SUFFIX_CASES["D_and_D_desc"]}}
for name, (src, kinds) in cases.items():
    args = _args(src, dtype=torch.bfloat16, **kinds)
    cfg = _gluon_specs(args)[0][0]
    out[name] = [cfg.name, compile_for(GluonFamily(), cfg, args).spills]
print("RESULT" + json.dumps(out))
"""


@pytest.mark.slow
def test_gluon_kernels_with_suffix_names_compile_for_sm_90():
    """The first gluon kernel of three cases compiled for sm_90 without a GPU
    (``runtime.offline``): x beside x_0, a staged vector x beside x_c (``vb_u_x_c`` was both
    x's consumer buffer and x_c's buffers) and D beside D_desc."""
    got = run_offline(_GLUON_SCRIPT.format(tests=os.path.dirname(__file__)), timeout=900)
    assert set(got) == {"x_and_x_0", "vector_x_and_x_c", "D_and_D_desc"}, got


def test_fuzzed_names_are_accepted_by_the_frontend():
    """Every name the fuzzer may draw (``epilogue_fuzz.NAME_POOL``) is one the frontend
    takes as an operand and as an output, so a fuzz case never fails for its names."""
    from epilogue_fuzz import NAME_POOL

    for name in NAME_POOL:
        src = f"def epi(accum, {name}): D = accum * {name}; return D"
        D = torch.empty(4, 16)
        args = GemmArguments(torch.randn(4, 8), torch.randn(8, 16), D,
                             epilogue=EpilogueArguments(src, **{name: 0.5, "D": D}))
        assert args.optimized_dag.used_operands[0].name == name
        src = f"def epi(accum): D = accum; {name} = sum(accum); return D, {name}"
        EpilogueArguments(src, D=torch.empty(4, 16), **{name: torch.empty(4, 1)}).bind((1, 4, 16))
