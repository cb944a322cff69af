"""The ``cast(x, dtype)`` op: x rounded to a dtype as a kernel stores it, used on as fp32.

The rounding (``optable.round_to``) against independent computations (the nearest fp8
value with ties to even, Python's ``round``); the frontend's spellings and errors; constant
folding; the eager function; the reference; and the Triton spellings bit for bit under
Triton's CPU interpreter, which converts to fp8 and bf16 wrongly and so runs emulations
(``_ef_round_fp8``, ``_ef_round_bf16`` of the prelude), both as helpers and in kernels.
"""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from evtfuse import EpilogueArguments, EpilogueError, GemmArguments, explain, get_kernels, ir, ops
from evtfuse.backends.triton.prelude import HELPERS, helpers_for
from evtfuse.frontend import parse_epilogue
from evtfuse.ir import NodeKind
from evtfuse.optable import CAST_DTYPE, CAST_TARGETS, OPS, round_to
from evtfuse.passes import optimize
from evtfuse.reference import evaluate

GEN = torch.Generator().manual_seed(77)
FP8 = {"fp8e4m3": torch.float8_e4m3fn, "fp8e5m2": torch.float8_e5m2}
SPELLINGS = {  # the brief: every name a user may write, canonical first
    "fp32": ("fp32", "float32", "f32"),
    "fp16": ("fp16", "float16", "half", "f16"),
    "bf16": ("bf16", "bfloat16"),
    "fp8e4m3": ("fp8e4m3", "float8_e4m3fn", "e4m3", "fp8"),
    "fp8e5m2": ("fp8e5m2", "float8_e5m2", "e5m2"),
    "int8": ("int8", "i8"),
    "uint8": ("uint8", "u8"),
    "int32": ("int32", "i32"),
}
NAMES = '"fp32", "fp16", "bf16", "fp8e4m3", "fp8e5m2", "int8", "uint8", "int32"'


def same_bits(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal as fp32 values, NaN where NaN, and the same sign of zero."""
    got, want = got.float(), want.float()
    nan = torch.isnan(got)
    return bool(torch.equal(nan, torch.isnan(want)) and torch.equal(got[~nan], want[~nan])
                and torch.equal(torch.signbit(got[~nan]), torch.signbit(want[~nan])))


def hard_values() -> torch.Tensor:
    """Random normals at many scales, subnormals, exact ties of every target, +-0, +-inf, NaN,
    values either side of the fp8 maxima and of the integer ranges."""
    parts = [torch.randn(4000, generator=GEN) * s
             for s in (1e-8, 1e-4, 1e-2, 0.3, 1.0, 7.0, 100.0, 1e3, 3e4, 1e5, 1e9)]
    for dt in FP8.values():  # every fp8 value, the midpoints between them, and their neighbours
        table = torch.arange(256, dtype=torch.uint8).view(dt).float()
        table = table[torch.isfinite(table)].unique()
        mids = ((table[:-1].double() + table[1:].double()) / 2).float()
        up, down = torch.tensor(math.inf), torch.tensor(-math.inf)
        parts += [table, mids, torch.nextafter(mids, up), torch.nextafter(mids, down)]
    for dt, bits in ((torch.bfloat16, 8), (torch.float16, 11)):  # midpoints: v + half an ulp
        v = torch.randn(2000, generator=GEN).to(dt).float()
        parts.append(v + torch.ldexp(torch.ones_like(v), torch.frexp(v).exponent - 1 - bits))
    parts.append(torch.tensor([
        0.0, -0.0, math.inf, -math.inf, math.nan, -math.nan, 1e-45, -1e-45, 1e-40, 2.0 ** -126,
        447.9, 448.0, 449.0, 464.0, 464.1, 480.0, 500.0, -464.0, -465.0, 57343.0, 57344.0,
        61439.0, 61440.0, 61441.0, 65504.0, 65519.0, 65520.0, -65520.0, 3.4e38, -3.4e38,
        0.5, -0.5, 1.5, 2.5, -2.5, 3.5, 126.5, 127.5, 128.5, -128.5, -129.0, 254.5, 255.5,
        256.0, -0.4, 2147483520.0, 2147483648.0, -2147483648.0, -3e9, 3e9]))
    x = torch.cat(parts).contiguous()
    assert torch.isnan(x).any() and torch.isinf(x).any() and (x != 0).float().mean() > 0.99
    return x


# ------------------------------------------------------------------ the table and round_to

def test_targets_and_spellings():
    assert tuple(CAST_TARGETS) == tuple(SPELLINGS)
    for name, spellings in SPELLINGS.items():
        for s in spellings:
            assert CAST_DTYPE.canonical(s) == name, s
    assert CAST_DTYPE.canonical("fp9") is None and CAST_DTYPE.canonical("float64") is None
    assert OPS["cast"].required == ("dtype",) and OPS["cast"].defaults == {}
    assert CAST_TARGETS["fp8e4m3"].triton == "_ef_round_fp8({0}, 3, -6, 448.0)"
    assert CAST_TARGETS["fp8e5m2"].triton == "_ef_round_fp8({0}, 2, -14, 57344.0)"
    assert CAST_TARGETS["int32"].triton == "_ef_round_sat({0}, -2147483648.0, 2147483520.0)"


def test_reference_output_rounding_is_the_one_function():
    """The reference rounds stored outputs with optable.round_to (as cast() and verify do):
    fp8 saturating, integers half to even and saturating."""
    M, N, K = 8, 12, 4
    A, B = torch.randn(M, K, generator=GEN), torch.randn(K, N, generator=GEN)
    for dtype in (torch.float8_e4m3fn, torch.int8, torch.float16):
        D = torch.empty(M, N, dtype=dtype)
        args = GemmArguments(A, B, D, epilogue=EpilogueArguments(
            "def e(accum): D = accum * 300.0; return D", D=D))
        raw = evaluate(args, cast=False)["D"]
        assert torch.equal(evaluate(args)["D"].float(), round_to(raw, dtype).float())


def _nearest_fp8(x: torch.Tensor, dtype) -> torch.Tensor:
    """The fp8 value nearest |x| clamped to the largest finite one, ties to the even code,
    with x's sign; NaN kept. Independent of torch's conversion."""
    codes = torch.arange(128, dtype=torch.uint8)
    table = codes.view(dtype).double()
    keep = torch.isfinite(table)
    table, codes = table[keep], codes[keep].long()
    a = x.double().abs().clamp(max=float(table[-1]))
    hi = torch.searchsorted(table, a).clamp(max=len(table) - 1)
    lo = (hi - 1).clamp(min=0)
    d_lo, d_hi = a - table[lo], table[hi] - a
    up = (d_hi < d_lo) | ((d_hi == d_lo) & (codes[hi] % 2 == 0))
    r = torch.copysign(torch.where(up, table[hi], table[lo]), x.double())
    return torch.where(torch.isnan(x), x.double(), r).float()


@pytest.mark.parametrize("name", sorted(FP8))
def test_fp8_rounds_to_nearest_even_and_saturates(name):
    x = hard_values()
    got = round_to(x, FP8[name]).float()
    assert same_bits(got, _nearest_fp8(x, FP8[name]))
    fmax = torch.finfo(FP8[name]).max
    big = torch.tensor([math.inf, -math.inf, 1e30, -1e30, fmax * 1.1, math.nan])
    assert same_bits(round_to(big, FP8[name]).float(),
                     torch.tensor([fmax, -fmax, fmax, -fmax, fmax, math.nan]))


def test_fp16_bf16_round_to_nearest_and_overflow_to_inf():
    x = torch.tensor([1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, 65520.0, -1e6, math.nan])
    assert same_bits(round_to(x, torch.float16).float(),
                     torch.tensor([1.0, 1.0 + 2.0 ** -9, math.inf, -math.inf, math.nan]))
    y = torch.tensor([1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, 3.4e38, -3.4e38])
    assert same_bits(round_to(y, torch.bfloat16).float(),
                     torch.tensor([1.0, 1.0 + 2.0 ** -6, math.inf, -math.inf]))


@pytest.mark.parametrize("name", ["int8", "uint8", "int32"])
def test_integers_round_half_to_even_saturate_and_nan_is_zero(name):
    dtype = CAST_TARGETS[name].dtype
    x = hard_values()
    got = round_to(x, dtype)
    assert got.dtype == dtype
    lo, hi = (-128, 127) if dtype == torch.int8 else (0, 255) if dtype == torch.uint8 else \
        (-2 ** 31, 2147483520)
    want = [0 if math.isnan(v) else max(lo, min(hi, v if math.isinf(v) else round(v)))
            for v in x.double().tolist()]  # Python's round: half to even
    assert got.long().tolist() == [int(max(lo, min(hi, w))) for w in want]
    # no signed zero in an integer, NaN gives 0
    assert same_bits(ops.cast(torch.tensor([-0.3, -0.0, math.nan]), name), torch.zeros(3))


# ------------------------------------------------------------------ the frontend

def _parse_cast(arg: str):
    p = parse_epilogue(f"def epi(accum):\n    D = cast(accum, {arg})\n    return D")
    e = p.assignments[0].expr
    assert e.op == "cast"
    return e.params


@pytest.mark.parametrize("name", list(SPELLINGS))
def test_every_spelling_parses_to_the_canonical_name(name):
    for s in SPELLINGS[name]:
        assert _parse_cast(f'"{s}"') == (("dtype", name),), s
        assert _parse_cast(f"dtype='{s}'") == (("dtype", name),), s
    torch_names = [s for s in SPELLINGS[name] if isinstance(getattr(torch, s, None), torch.dtype)]
    assert torch_names  # every target has a torch dtype spelling
    for s in torch_names:
        assert _parse_cast(f"torch.{s}") == (("dtype", name),), s
        assert _parse_cast(f"dtype=th.{s}") == (("dtype", name),), s


def bad_cast_fn(accum, C):
    x = accum + C
    D = cast(x, "fp9")  # noqa: F821 - recognised by name, never executed
    return D


BAD = [
    ('"fp9"', '(got "fp9")'),
    ("'FP16'", '(got "FP16")'),
    ("torch.float64", "(got torch.float64)"),
    ("torch.f16", "(got torch.f16)"),  # not a torch dtype, though an alias of fp16
    ("3", "(got 3)"),
    ("fp16", "(got fp16)"),  # a name, not a string
    ('dtype="int4"', '(got "int4")'),
]


@pytest.mark.parametrize("arg, got", BAD, ids=[a for a, _ in BAD])
def test_a_bad_dtype_names_function_parameter_choices_and_line(arg, got):
    src = f"def epi(accum):\n    x = accum * 2.0\n    D = cast(x, {arg})\n    return D"
    with pytest.raises(EpilogueError) as exc:
        parse_epilogue(src)
    e = exc.value
    assert e.line == 3 and e.variable == "D"
    assert e.bare_message == f"cast() parameter 'dtype' must be one of {NAMES} {got}"
    assert str(e).startswith("line 3 of the epilogue string: cast() parameter 'dtype'")
    assert str(e).endswith(f"D = cast(x, {arg})")


def test_bad_dtype_in_a_function_gives_its_file_line():
    import inspect

    lines, start = inspect.getsourcelines(bad_cast_fn)
    with pytest.raises(EpilogueError) as exc:
        parse_epilogue(bad_cast_fn)
    assert exc.value.line == start + 2 and '(got "fp9")' in str(exc.value)


def test_missing_and_extra_arguments():
    for call in ("cast(x)", "cast(x, slope=0.5)"):
        with pytest.raises(EpilogueError) as exc:
            parse_epilogue(f"def epi(accum):\n    x = accum\n    D = {call}\n    return D")
        if call == "cast(x)":
            assert exc.value.bare_message == f"cast() needs its parameter 'dtype': one of {NAMES}"
        else:
            assert "cast() got an unexpected keyword argument 'slope'" in str(exc.value)
        assert exc.value.line == 3
    with pytest.raises(EpilogueError, match=r"cast\(\) takes 1 to 2 positional argument"):
        parse_epilogue('def epi(accum): D = cast(accum, "fp16", "bf16"); return D')


def test_numeric_parameters_still_need_numbers():
    with pytest.raises(EpilogueError, match="only numbers are allowed"):
        parse_epilogue('def epi(accum): D = leaky_relu(accum, "fp16"); return D')


# ------------------------------------------------------------------ IR, folding, signature

def _dag(src: str, M=4, N=6):
    return EpilogueArguments(src, D=torch.empty(M, N)).dag


def test_constant_folding_rounds_like_the_kernel():
    cases = {'"fp8e4m3"': (1000.0, 448.0), '"e5m2"': (-1e9, -57344.0), '"fp16"': (0.1, None),
             '"bf16"': (0.1, None), '"int8"': (2.5, 2.0), '"u8"': (-7.0, 0.0),
             '"int32"': (3e9, 2147483520.0), "torch.float32": (0.1, None)}
    for arg, (value, want) in cases.items():
        dag = optimize(_dag(f"def epi(accum): D = accum + cast({value!r}, {arg}); return D"))
        consts = [n for n in dag.nodes if n.kind is NodeKind.CONST]
        assert len(consts) == 1 and not any(n.op == "cast" for n in dag.nodes), arg
        name = CAST_DTYPE.canonical(arg.strip('"').removeprefix("torch."))
        if want is None:
            want = round_to(torch.tensor(value), CAST_TARGETS[name].dtype).item()
        assert consts[0].value == want, arg
    dag = optimize(_dag('def epi(accum): D = accum + cast(-0.25, "int8"); return D'))
    zero = [n for n in dag.nodes if n.kind is NodeKind.CONST][0]
    assert zero.value == 0.0 and math.copysign(1.0, zero.value) == 1.0  # +0.0


def test_signature_and_cse_tell_dtypes_apart():
    sig = {s: ir.signature(_dag(f"def epi(accum): D = cast(accum, {s}); return D"))
           for s in ('"fp16"', '"half"', "torch.float16", '"bf16"', '"fp8"', '"fp8e5m2"')}
    assert sig['"fp16"'] == sig['"half"'] == sig["torch.float16"]
    assert len({sig[k] for k in ('"fp16"', '"bf16"', '"fp8"', '"fp8e5m2"')}) == 4
    assert "cast(%0;dtype=fp16)" in sig['"fp16"']
    # equal casts are computed once, different ones are not merged
    dag = optimize(_dag('def epi(accum): a = cast(accum, "fp16"); b = cast(accum, "half"); '
                        'c = cast(accum, "bf16"); D = a + b + c; return D'))
    assert sorted(n.param_dict["dtype"] for n in dag.nodes if n.op == "cast") == ["bf16", "fp16"]
    assert "cast(%0, dtype='fp16')" in str(dag)


# ------------------------------------------------------------------ eager ops and reference

def test_eager_cast():
    x = hard_values()
    for name, spellings in SPELLINGS.items():
        want = round_to(x, CAST_TARGETS[name].dtype).float()
        for s in spellings:
            assert same_bits(ops.cast(x, s), want), s
        assert same_bits(ops.cast(x, dtype=CAST_TARGETS[name].dtype), want)
    assert ops.cast(x, "fp16").dtype == torch.float32
    assert ops.cast(2.7, "int8").item() == 3.0
    with pytest.raises(ValueError, match=r'must be one of "fp32".*\(got "fp9"\)'):
        ops.cast(x, "fp9")
    with pytest.raises(ValueError, match=r"\(got torch.float64\)"):
        ops.cast(x, torch.float64)
    with pytest.raises(TypeError, match="needs its parameter 'dtype'"):
        ops.cast(x)
    with pytest.raises(TypeError, match="unexpected keyword argument 'to'"):
        ops.cast(x, to="fp16")


def test_reference_evaluates_cast():
    M, N = 16, 24
    acc = torch.randn(M, N, generator=GEN) * 600
    C = torch.randn(M, N, generator=GEN) * 100
    src = ('def epi(accum, C): D = cast(accum, "fp8e4m3") + cast(C, "int8"); '
           'E = cast(accum * 100.0, torch.float16); return D, E')
    D, E = torch.empty(M, N), torch.empty(M, N)
    out = evaluate(EpilogueArguments(src, C=C, D=D, E=E), accum=acc)
    want_d = round_to(acc, torch.float8_e4m3fn).float() + round_to(C, torch.int8).float()
    assert torch.equal(out["D"], want_d) and (out["D"].abs() >= 448).any()
    assert torch.isinf(out["E"]).any() and torch.equal(out["E"], (acc * 100).half().float())
    assert torch.equal(out["D"], ops.cast(acc, "fp8") + ops.cast(C, "i8"))  # the eager meaning


# ------------------------------------------------------------------ Triton, under the interpreter

def _run_expr(expr: str, x: torch.Tensor, tmp_path) -> torch.Tensor:
    import triton

    src = ("import triton\nimport triton.language as tl\n" + helpers_for(expr) + f"""
@triton.jit
def kernel(X, Y, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + o, mask=o < n)
    tl.store(Y + o, {expr}, mask=o < n)
""")
    path = tmp_path / f"cast_{abs(hash(expr))}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    y = torch.full_like(x, 12345.0)
    module.kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    return y


needs_interpreter = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-interpreter tier")


@needs_interpreter
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on inf - inf, fp16 overflow
@pytest.mark.parametrize("name", list(CAST_TARGETS))
def test_interpreter_spelling_is_bit_exact(name, tmp_path):
    x = hard_values()
    expr = OPS["cast"].spell(["x"], {"dtype": name})
    assert same_bits(_run_expr(expr, x, tmp_path), ops.cast(x, name)), expr


@needs_interpreter
def test_sat_helper(tmp_path):
    assert "def _ef_sat(x, hi):" in HELPERS["_ef_sat"]
    x = torch.tensor([math.inf, -math.inf, math.nan, 500.0, -500.0, 448.0, -0.0, 1.5])
    got = _run_expr("_ef_sat(x, 448.0)", x, tmp_path)
    assert same_bits(got, torch.tensor([448.0, -448.0, math.nan, 448.0, -448.0, 448.0, -0.0, 1.5]))


def test_gpu_spellings():
    spell = {n: OPS["cast"].spell(["x"], {"dtype": n}, cuda=True) for n in CAST_TARGETS}
    assert spell["fp32"] == "x"
    assert spell["fp16"] == "(x).to(tl.float16).to(tl.float32)"
    assert spell["bf16"] == "(x).to(tl.bfloat16).to(tl.float32)"
    # Triton 3.6 miscompiles fp32 -> fp8 -> fp32 next to tl.dot on an H100: emulated there too
    assert spell["fp8e4m3"] == "_ef_round_fp8(x, 3, -6, 448.0)"
    assert spell["fp8e5m2"] == "_ef_round_fp8(x, 2, -14, 57344.0)"
    assert spell["int8"] == "_ef_round_sat(x, -128.0, 127.0)"
    for name in ("bf16", "fp8e4m3", "fp8e5m2"):  # the interpreter converts these wrongly
        assert ".to(" not in OPS["cast"].spell(["x"], {"dtype": name})


# ------------------------------------------------------------------ kernels, both families

# y = C * s exactly (s a power of two); the special values sit at ties of the targets
SCALE = {"fp32": 1.0, "fp16": 3e4, "bf16": 1.0, "fp8e4m3": 300.0, "fp8e5m2": 4e4,
         "int8": 100.0, "uint8": 150.0, "int32": 2e9}
SPECIAL = [math.nan, math.inf, -math.inf, -0.0, 5.0, 7.0, 34.0, 38.0, 2 * (1 + 2.0 ** -11),
           2 * (1 + 2.0 ** -8), 928.0, 122880.0, -929.0, 0.6]


def _exact_inputs(M, N, K, dtype):
    """Small multiples of powers of two: every product and sum exact, so the accumulator
    (and each cast of it) is the same in any summation order."""
    A = (torch.randint(-8, 8, (M, K), generator=GEN) / 4).to(dtype)
    B = (torch.randint(-8, 8, (K, N), generator=GEN) / 8).to(dtype)
    assert (A != 0).any() and (B != 0).any()
    return A, B


def _special_c(M, N, scale):
    C = torch.randn(M, N, generator=GEN) * scale
    C.view(-1)[: len(SPECIAL)] = torch.tensor(SPECIAL)
    return C


def _check_kernel(args, family, exact: tuple[str, ...]):
    cc = 90 if family == "hopper" else None
    ks = [k for k in get_kernels(args, cc=cc) if k.family.name == family]
    assert ks, explain(args, cc=cc)
    result = ks[0].verify(args)  # outputs poisoned with NaN first
    assert result, result.report()
    ref = evaluate(args)
    for name in exact:
        assert same_bits(args.epilogue.values[name], ref[name]), name


@needs_interpreter
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("family", ["portable", "hopper"])
@pytest.mark.parametrize("target", list(CAST_TARGETS))
def test_kernel_cast_each_target(target, family):
    M, N, K = 24, 40, 16
    A, B = _exact_inputs(M, N, K, torch.float16)
    C = _special_c(M, N, SCALE[target])
    src = (f'def epi(accum, C, s): E = cast(C * s, "{target}"); D = accum * 0.25 + E; '
           f'R = cast(accum, "{target}"); return D, E, R')
    D, E, R = torch.empty(M, N), torch.empty(M, N), torch.empty(M, N, dtype=torch.float16)
    args = GemmArguments(A, B, D, torch.float32,
                         EpilogueArguments(src, C=C, s=0.5, D=D, E=E, R=R))
    _check_kernel(args, family, ("D", "E"))
    want = ops.cast(C * 0.5, target)
    assert same_bits(E, want) and not torch.equal(E, torch.zeros_like(E))


@needs_interpreter
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("family", ["portable", "hopper"])
def test_kernel_every_target_at_once_fp32(family):
    M, N, K = 16, 32, 16
    A, B = _exact_inputs(M, N, K, torch.float32)
    C = _special_c(M, N, 500.0)
    names = list(CAST_TARGETS)
    body = "; ".join(f'E{k} = cast(C * s + accum, "{t}")' for k, t in enumerate(names))
    outs = ", ".join(f"E{k}" for k in range(len(names)))
    src = f"def epi(accum, C, s): {body}; D = accum; return D, {outs}"
    bufs = {f"E{k}": torch.empty(M, N) for k in range(len(names))}
    D = torch.empty(M, N)
    args = GemmArguments(A, B, D, torch.float32,
                         EpilogueArguments(src, C=C, s=0.5, D=D, **bufs))
    _check_kernel(args, family, tuple(bufs))
