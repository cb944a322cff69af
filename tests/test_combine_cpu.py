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
    # an M=64 problem's row logsumexp over 128 column tiles: two programs, one step each
    assert launch_shape(128, 64) == (32, 128)
    assert launch_shape(128, 8192) == (32, 128)  # 8192 rows: 256 programs, one step
    assert launch_shape(64, 8192) == (64, 64)
    assert launch_shape(5, 8192) == (64, 8)  # few partials: one step
    assert launch_shape(1000, 1) == (16, 256)  # a whole-output result: four steps
    assert launch_shape(1, 3) == (16, 2)
