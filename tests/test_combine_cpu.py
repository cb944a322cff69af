"""The post-kernel combine of reduction partials (``backends/triton/combine.py``) on its
own, through Triton's CPU interpreter: partials built from known data in several steps of
``PARTS`` (the kernels' tests mostly fit theirs in one step), special values included.
"""

from __future__ import annotations

import pytest
import torch

from evtfuse.backends.triton.combine import combine_partials, launch_shape

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="CPU-interpreter tier (the GPU tier runs the kernels)")


def _data(T, EXT, gen):
    """(T, W, EXT) values: T tiles of W columns for each of EXT results."""
    return torch.randn(T, 8, EXT, generator=gen, dtype=torch.float64) * 4.0


def _combine(op, ws, ws2, T, EXT, parts, block=16):
    out = torch.full((EXT,), float("nan"), dtype=torch.float32)
    grid = (-(-EXT // block), 1)
    combine_partials[grid](ws, ws2 if ws2 is not None else ws, out, T, EXT, 0, 1, OP=op,
                           BLOCK=block, PARTS=parts)
    return out


@pytest.mark.parametrize("parts", [2, 4, 16])
def test_logsumexp_over_several_steps(parts):
    gen = torch.Generator().manual_seed(7)
    T, EXT = 11, 20  # 11 partials: several steps, a ragged last one
    x = _data(T, EXT, gen)
    x[3, :, 1] += 30.0  # a later step raises result 1's max: its sum must be rescaled
    x[9, :, 2] += 50.0
    x[:, :, 4] = float("-inf")  # every partial empty: -inf, as torch.logsumexp
    x[5, 0, 6] = float("nan")  # NaN wins
    m = x.amax(dim=1)
    safe = torch.where(m == float("-inf"), torch.zeros_like(m), m)
    ws = m.to(torch.float32).contiguous()
    ws2 = torch.exp(x - safe[:, None, :]).sum(dim=1).to(torch.float32).contiguous()
    got = _combine("logsumexp", ws, ws2, T, EXT, parts)
    want = torch.logsumexp(x.permute(2, 0, 1).reshape(EXT, -1), dim=1)
    assert torch.isneginf(got[4]) and torch.isnan(got[6])
    ok = torch.ones(EXT, dtype=torch.bool)
    ok[[4, 6]] = False
    torch.testing.assert_close(got[ok].double(), want[ok], rtol=2e-6, atol=1e-5)


@pytest.mark.parametrize("parts", [2, 16])
def test_shifted_sumexp_over_several_steps(parts):
    """softmax's denominator: logsumexp's partials, finished as the sum of exp(x - max)
    alone (a max of 1e8 added back would round the sum away); NaN where the max is
    infinite or NaN, as torch's exp(x - max) gives."""
    gen = torch.Generator().manual_seed(9)
    T, EXT = 11, 20
    x = _data(T, EXT, gen).float().double()  # fp32 values
    x[3, :, 1] += 30.0  # a later step raises the max: the sum is rescaled
    x[:, :, 2] = (x[:, :, 2] + 1e8).float().double()  # fp32 values near 1e8 (steps of 8)
    x[:, :, 4] = float("-inf")
    x[5, 0, 6] = float("nan")
    x[7, 3, 8] = float("inf")
    m = x.amax(dim=1)
    safe = torch.where(m.abs() == float("inf"), torch.zeros_like(m), m)  # as _ef_lse_part
    ws = m.to(torch.float32).contiguous()
    ws2 = torch.exp(x - safe[:, None, :]).sum(dim=1).to(torch.float32).contiguous()
    got = _combine("shifted_sumexp", ws, ws2, T, EXT, parts)
    flat = x.permute(2, 0, 1).reshape(EXT, -1)
    want = torch.exp(flat - flat.amax(dim=1, keepdim=True)).sum(dim=1)
    assert got[[4, 6, 8]].isnan().all() and want[[4, 6, 8]].isnan().all()
    ok = torch.ones(EXT, dtype=torch.bool)
    ok[[4, 6, 8]] = False
    torch.testing.assert_close(got[ok].double(), want[ok], rtol=2e-6, atol=0)


@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_sum_max_min_over_several_steps(op):
    gen = torch.Generator().manual_seed(8)
    T, EXT = 13, 9
    x = _data(T, EXT, gen)
    part = {"sum": x.sum(dim=1), "max": x.amax(dim=1), "min": x.amin(dim=1)}[op]
    got = _combine(op, part.to(torch.float32).contiguous(), None, T, EXT, parts=4)
    flat = x.permute(2, 0, 1).reshape(EXT, -1)
    want = {"sum": flat.sum(dim=1), "max": flat.amax(dim=1), "min": flat.amin(dim=1)}[op]
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)


def test_launch_shape_takes_many_partials_per_step_for_few_results():
    # an M=64 problem's row logsumexp over 128 column tiles: four programs of 8 warps,
    # one step each
    assert launch_shape(128, 64) == (16, 128, 8)
    assert launch_shape(128, 8192) == (32, 128, 4)  # 8192 rows: 256 programs, one step
    assert launch_shape(64, 8192) == (32, 64, 4)
    assert launch_shape(16, 2048) == (16, 16, 4)  # 2048^3: 128 programs
    assert launch_shape(16, 16384) == (64, 16, 4)  # 256 programs already
    assert launch_shape(5, 8192) == (32, 8, 4)  # few partials: one step
    assert launch_shape(1000, 1) == (16, 256, 8)  # a whole-output result: four steps
    assert launch_shape(1, 3) == (16, 2, 8)


def test_pdl_only_on_hopper_and_later_unless_turned_off(monkeypatch):
    from evtfuse.backends.triton.combine import pdl_enabled

    monkeypatch.delenv("EVTFUSE_PDL", raising=False)
    assert pdl_enabled(9) and pdl_enabled(10)
    assert not pdl_enabled(8)  # Ampere has no griddepcontrol
    monkeypatch.setenv("EVTFUSE_PDL", "0")
    assert not pdl_enabled(9)


def test_combine_waits_for_the_kernel_only_as_a_dependent_launch():
    # the interpreter runs the combine without PDL (gdc_wait is inline PTX): the same
    # results as above; the GPU tier checks the PDL launch on back-to-back kernels
    import inspect

    src = inspect.getsource(combine_partials.fn)
    body = src[src.index('"""', src.index('"""') + 3):]
    assert body.index("if PDL:") < body.index("gdc_wait()") < body.index("tl.load")


def _lse_args(src, r_shape=(256, 1)):
    """256x512x64 bf16 arguments with output D and an fp32 ``r`` (output or operand)."""
    from evtfuse import EpilogueArguments, GemmArguments

    M, N, K = 256, 512, 64
    A, B = torch.randn(M, K).to(torch.bfloat16), torch.randn(K, N).to(torch.bfloat16)
    D = torch.empty(M, N, dtype=torch.bfloat16)
    return GemmArguments(A, B, D, epilogue=EpilogueArguments(src, D=D, r=torch.randn(r_shape)))


@pytest.mark.parametrize("family", ["hopper", "portable", "gluon"])
def test_a_kernel_lets_only_its_combine_launch_start_early(family, monkeypatch):
    """GPU kernels that a combine launch follows (logsumexp) open with
    ``_ef_launch_dependents()``; kernels without one (row max folds in the kernel, no
    reduction) and interpreted kernels do not; the plan's combine is a PDL launch exactly
    where the target is a Hopper GPU."""
    from evtfuse.backends.triton.codegen import generate
    from evtfuse.backends.triton.spec import combined_after
    from evtfuse.backends.triton.families import (GluonFamily, HopperFamily, PortableFamily,
                                                  Target, TileConfig)

    monkeypatch.delenv("EVTFUSE_PDL", raising=False)
    fam = {"hopper": HopperFamily(), "portable": PortableFamily(), "gluon": GluonFamily()}[family]
    gpu = Target("cuda", 90, torch.device("cpu"), 132)
    interp = Target("interpreter", 0, torch.device("cpu"), 4)
    srcs = {"lse": "def epi(accum): D = accum; r = logsumexp(accum); return D, r",
            "max": "def epi(accum): D = accum; r = max(accum); return D, r",
            "none": "def epi(accum, r): D = accum + 0.0 * r; return D"}
    for name, src in srcs.items():
        args = _lse_args(src)
        cfg = fam.configs(args, gpu)[0]
        spec = fam.spec(args, cfg, gpu)
        code = generate(spec)
        after = bool(combined_after(spec.dag, family))
        assert after == (name == "lse"), name
        assert ("_ef_launch_dependents()" in code) == after, name
        if family != "gluon":  # no interpreter spec for gluon (GPU only)
            assert "_ef_launch_dependents" not in generate(fam.spec(args, cfg, interp))
    args = _lse_args(srcs["lse"])
    ampere = Target("cuda", 80, torch.device("cpu"), 108)
    for target, want in [(gpu, True), (ampere, False), (interp, False)]:
        if family == "gluon" and target is not gpu:
            continue
        cfg = fam.configs(args, target)[0]
        post = fam.plan(args, args.optimized_dag, cfg, target)[3]
        assert len(post) == 1 and post[0].pdl is want, target
    monkeypatch.setenv("EVTFUSE_PDL", "0")
    cfg = fam.configs(args, gpu)[0]
    assert fam.plan(args, args.optimized_dag, cfg, gpu)[3][0].pdl is False
