"""The hopper family's grouped GEMMs over M (``grouped_gemm``) on the CPU tier: every hopper
candidate under Triton's interpreter (asked for with cc=90) against a per-group loop of the
reference evaluator (``reference.evaluate_grouped``): ragged, empty and single groups, rows
past offs[-1], sizes off the tiles, every operand kind, gated epilogues in both layouts;
its refusals, the tuner's candidate order, and an offline sm_90 compile (wgmma)."""

from __future__ import annotations

import pytest
import torch

import evtfuse
from evtfuse import EpilogueArguments, GemmArguments, library
from evtfuse.reference import evaluate_grouped
from grouped_cases import GROUP_CASES, offs_of
from offline_run import check_epilogue_registers, run_offline

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="CPU-interpreter tier; tests/gpu/test_gpu_grouped.py on a GPU")

GEN = torch.Generator().manual_seed(35)


def rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=GEN).to(dtype)


def hopper_kernels(args):
    ks = [k for k in evtfuse.get_kernels(args, cc=90) if k.family.name == "hopper"]
    assert ks, evtfuse.explain(args, cc=90)
    return ks


def check_every_hopper_kernel(src, A, B, offs, dtype, outputs, kernels=hopper_kernels,
                              **operands):
    """Run every hopper candidate (``kernels(args)``) on NaN-filled ``outputs`` and compare
    each with the reference over the rows of some group; rows past offs[-1] stay NaN."""
    D = outputs["D"]
    args = GemmArguments(A, B, D, offs=offs,
                         epilogue=EpilogueArguments.unbound(src, **operands, **outputs))
    end = int(offs[-1])
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.float16 else dict(atol=1e-4, rtol=1e-4)
    names = []
    for k in kernels(args):
        for t in outputs.values():
            if t is not None:
                t.fill_(float("nan"))
        k.run(args)
        ref = evaluate_grouped(src, A, B, offs, {**operands, **outputs})
        for name, t in outputs.items():
            if t is None:
                continue
            torch.testing.assert_close(t[:end].float(), ref[name][:end].float(), **tol,
                                       msg=lambda m: f"{k.name} {name}: {m}")
            assert t[end:].isnan().all(), f"{k.name} wrote {name}'s rows past offs[-1]"
        names.append(k.name)
    return names


MOE = """def moe(accum, bias, w, s, C, cb, alpha):
    F = silu(accum + bias) * s
    D = F * w + alpha * C + cb
    R = w * 2.0
    return D, F, R"""

CASES = {**GROUP_CASES,  # and:
    "one_row": ([0, 1, 0], 1),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.cover
def test_every_operand_kind(case, dtype):
    """Per-group (G, 1, N) and (G, 1, 1), per-row (T, 1), full (T, N), shared (N,) and
    runtime-scalar operands; a full output, an unstored one and a per-row (T, 1) one. N and
    K are no multiples of the tiles (TMA still needs 16-byte rows of A, B and C)."""
    sizes, T = CASES[case]
    G, K, N = len(sizes), 40, 40
    A, B = rand(T, K, dtype=dtype), rand(G, K, N, dtype=dtype)
    ops = dict(bias=rand(G, 1, N, dtype=dtype), w=rand(T, 1), s=rand(G, 1, 1).abs(),
               C=rand(T, N, dtype=dtype), cb=rand(N), alpha=0.5)
    outs = dict(D=torch.empty(T, N, dtype=dtype), F=None, R=torch.empty(T, 1))
    names = check_every_hopper_kernel(MOE, A, B, offs_of(sizes), dtype, outs, **ops)
    assert len(names) == 2  # both interpreter configs, one of them prefetching C


@pytest.mark.parametrize("op", ["sum", "max", "min", "logsumexp"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_per_row_reductions(op, dtype):
    """Per-row (T, 1) reductions (grouped_reduce's partials along N, a ticket per row
    tile, the last column tile combining in ascending order) in every hopper candidate,
    over every group case: rows past offs[-1] stay unwritten. Before, the family refused
    every grouped reduction (the MoE backward's routing-weight gradient ran portable).
    (T = 1 makes a (1, 1) output a whole-output reduction: portable.)"""
    for case, (sizes, T) in GROUP_CASES.items():
        G, K, N = len(sizes), 24, 72  # three column tiles of the 32-wide interpreter config
        A, B, C = rand(T, K, dtype=dtype), rand(G, K, N, dtype=dtype), rand(T, N, dtype=dtype)
        src = f"def e(accum, C):\n    D = accum + C\n    R = {op}(D * 2.0)\n    return D, R"
        outs = dict(D=torch.empty(T, N, dtype=dtype), R=torch.empty(T, 1))
        assert len(check_every_hopper_kernel(src, A, B, offs_of(sizes), dtype, outs, C=C)) == 2


def test_other_grouped_reductions_stay_portable():
    """Per group, per column or over every group: refused by name, run by the portable
    kernel."""
    A, B, offs = rand(8, 16), rand(2, 16, 12), offs_of([4, 4])
    D = torch.empty(8, 12)
    for shape in ((2, 1, 12), (2, 1, 1), (12,), (1,)):
        epi = EpilogueArguments.unbound("def e(accum):\n    D = accum\n    S = sum(D)\n"
                                        "    return D, S", D=D, S=torch.empty(shape))
        text = evtfuse.explain(GemmArguments(A, B, D, offs=offs, epilogue=epi), cc=90)
        assert ("hopper: refused: grouped GEMMs with per-column, per-group or whole-output "
                "reductions run in the portable family only") in text, (shape, text)
        assert "portable: supported" in text


def check_moe_down_grad(I, kernels=hopper_kernels):
    """The MoE layer's dX epilogue (``moe.down_grad``) over three experts (15, 0 and 20 of 37
    rows), intermediate width ``I``, in each of ``kernels(args)`` against the reference;
    their names."""
    from evtfuse.runtime import moe

    src, outputs = moe.down_grad("silu")
    grad = dict(outputs)
    T, H = 37, 24
    outs = {"D": torch.empty(T, I, dtype=torch.float16),
            grad["G"]: torch.empty(T, I, dtype=torch.float16),
            grad["U"]: torch.empty(T, I, dtype=torch.float16), grad["s"]: torch.empty(T, 1)}
    return check_every_hopper_kernel(
        src, rand(T, H, dtype=torch.float16), rand(3, H, I, dtype=torch.float16),
        offs_of([15, 0, 20]), torch.float16, outs, kernels=kernels,
        G=rand(T, I, dtype=torch.float16), U=rand(T, I, dtype=torch.float16),
        s=rand(T, 1, dtype=torch.float16))


def test_moe_down_projection_backward_in_every_hopper_kernel():
    """The MoE layer's dX epilogue (``moe.down_grad``: SwiGLU's and the routing weight's
    derivatives from the saved gate and up, the routing weight's gradient a per-row sum)
    in every hopper candidate, against the reference."""
    assert len(check_moe_down_grad(40)) == 2


def test_epilogues_in_eighths():
    """Sub-tiles of an eighth of the tile's columns (``EPI_SPLIT`` 8: what the hopper family
    takes for epilogues of ``HEAVY_TILES`` full tiles or more on a GPU, where quarters
    spill) under the interpreter, 64-column tiles: the MoE dX epilogue grouped (outputs
    through pointers) and a dense epilogue of two tiles in and three out (TMA loads and
    stores), each against the reference evaluator."""
    from evtfuse.backends.triton import hopper_family

    eighths = dict(block_m=32, block_n=64, epi_split=8)

    def in_eighths(args):
        assert hopper_family._full_tiles(args) >= hopper_family.HEAVY_TILES
        return [hopper_kernels(args)[0].with_config(**eighths)]

    names = check_moe_down_grad(72, in_eighths)
    assert "_e8" in names[0], names
    heavy = ("def e(accum, C, E):\n    F = relu(accum + C)\n    G = F * E\n"
             "    D = G + accum\n    return D, F, G")
    M, N, K = 40, 136, 48
    dense_out = {n: torch.empty(M, N, dtype=torch.float16) for n in ("D", "F", "G")}
    dense = GemmArguments(rand(M, K, dtype=torch.float16), rand(K, N, dtype=torch.float16),
                          dense_out["D"], epilogue=EpilogueArguments(
                              heavy, C=rand(M, N, dtype=torch.float16),
                              E=rand(M, N, dtype=torch.float16), **dense_out))
    k = in_eighths(dense)[0]
    assert "_e8" in k.name, k.name
    result = k.verify(dense)
    assert result, (k.name, result.report())


def test_transposed_expert_weight_and_column_major_a():
    """B as ``W.mT`` of an expert weight W (G, N, K), read K-major through a 3-D
    descriptor over W; A column-major, read through its transpose's descriptor."""
    G, T, K, N = 3, 52, 24, 40  # T: A's transpose has 16-byte rows
    W, A = rand(G, N, K), rand(K, T).t()
    check_every_hopper_kernel("def epi(accum, bias): D = relu(accum + bias); return D",
                              A, W.mT, offs_of([20, 0, 30]), torch.float32,
                              dict(D=torch.empty(T, N)), bias=rand(G, 1, N))


def test_many_groups_and_bad_offsets():
    """More groups than the table's smallest size (GROUPS 16 -> 64); and offsets past T or
    below 0, clamped on the device: nothing outside D is written."""
    G, K, N = 40, 16, 24
    sizes = [(g * 7) % 4 for g in range(G)]
    T = sum(sizes)
    check_every_hopper_kernel("def epi(accum, bias): D = accum + bias; return D",
                              rand(T, K), rand(G, K, N), offs_of(sizes), torch.float32,
                              dict(D=torch.empty(T, N)), bias=rand(G, 1, N))
    A, B = rand(20, 16), rand(3, 16, 16)
    buf = torch.full((60, 16), 7.0)
    D = buf[20:40]
    offs = torch.tensor([-8, 10, 50], dtype=torch.int32)
    args = GemmArguments(A, B, D, offs=offs, epilogue=EpilogueArguments.unbound(
        "def e(accum): D = accum; return D", D=D))
    for k in hopper_kernels(args):
        buf.fill_(7.0)
        k.run(args)
        assert (buf[:20] == 7.0).all() and (buf[40:] == 7.0).all(), k.name
        torch.testing.assert_close(D[:10], A[:10] @ B[1], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(D[10:], A[10:] @ B[2], atol=1e-4, rtol=1e-4)


GATED = """def e(accum, bias_gate, bias_up, w, C):
    gate, up = pairs(accum, layout="LAYOUT")
    D = silu(gate + bias_gate) * (up + bias_up) * w + C
    E = gate
    return D, E"""


@pytest.mark.parametrize("layout", ["interleaved", "concatenated"])
@pytest.mark.parametrize("sizes,T", [([7, 0, 20, 1], 31), ([0, 0, 13], 13), ([3], 5)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.cover
def test_gated_both_layouts(layout, sizes, T, dtype):
    """A mixture of experts' SwiGLU up-projection: experts' weights (G, 2N, K) passed as
    W.mT, interleaved or concatenated; per-group biases of gate and up, routing weights,
    a full operand, two full outputs (one of them gate itself); N = 24 is no multiple of
    the tiles' output columns (16)."""
    G, K, N = len(sizes), 24, 24
    A, W = rand(T, K, dtype=dtype), rand(G, 2 * N, K, dtype=dtype) / K ** 0.5
    ops = dict(bias_gate=rand(G, 1, N, dtype=dtype), bias_up=rand(G, 1, N, dtype=dtype),
               w=rand(T, 1), C=rand(T, N, dtype=dtype))
    outs = dict(D=torch.empty(T, N, dtype=dtype), E=torch.empty(T, N, dtype=dtype))
    check_every_hopper_kernel(GATED.replace("LAYOUT", layout), A, W.mT, offs_of(sizes),
                              dtype, outs, **ops)


def test_gated_library_source_row_major_weights():
    """library.SWIGLU over B (G, K, 2N) stored row-major (N contiguous)."""
    G, T, K, N = 2, 19, 16, 20
    check_every_hopper_kernel(library.SWIGLU, rand(T, K), rand(G, K, 2 * N), offs_of([11, 8]),
                              torch.float32, dict(D=torch.empty(T, N)))


def test_refusals_and_explain():
    """Groups over K, and grouped problems under the interpreter without cc=90, are refused
    with a reason; groups over M are offered with cc=90."""
    A, B, offs = rand(8, 16), rand(2, 16, 12), offs_of([4, 4])
    D = torch.empty(8, 12)
    epi = EpilogueArguments.unbound("def e(accum): D = accum; return D", D=D)
    args = GemmArguments(A, B, D, offs=offs, epilogue=epi)
    assert "hopper: supported" in evtfuse.explain(args, cc=90)
    assert "hopper: refused: TMA kernels run under the interpreter only" in evtfuse.explain(args)
    dW = torch.empty(2, 16, 12)  # groups over K: A (M, T), B (T, N), offs over T
    args = GemmArguments(rand(16, 8), rand(8, 12), dW, offs=offs,
                         epilogue=EpilogueArguments.unbound("def e(accum): D = accum; return D",
                                                            D=dW))
    text = evtfuse.explain(args, cc=90)
    assert "hopper: refused: grouped GEMMs over K" in text and "portable: supported" in text


def test_a_gpu_offers_both_families_in_turn():
    """On an sm_90 GPU (offline: the offer, nothing runs) a grouped problem's candidates
    alternate between the hopper and portable families, so that a fast tuning times both;
    hopper's pointer-stored outputs need no TMA alignment (N = 2044: rows of 4088 bytes)."""
    from evtfuse.runtime.offline import offered

    G, T, K, N = 8, 4096, 1024, 2044
    A, W = torch.empty(T, K, dtype=torch.bfloat16), torch.empty(G, N, K, dtype=torch.bfloat16)
    D = torch.empty(T, N, dtype=torch.bfloat16)
    args = GemmArguments(A, W.mT, D, offs=torch.zeros(G, dtype=torch.int32),
                         epilogue=EpilogueArguments.unbound("def e(accum): D = accum; return D",
                                                            D=D))
    fams = [f.name for f, _ in offered(args)]
    assert fams[:4] == ["hopper", "portable", "hopper", "portable"], fams


_OFFLINE_SCRIPT = """
import json, torch
from evtfuse import EpilogueArguments, GemmArguments, library
from evtfuse.backends.triton.families import HopperFamily
from evtfuse.runtime.offline import compile_for, offered
G, T, K, N = 8, 4096, 1024, 2048
dt = torch.bfloat16
A = torch.empty(T, K, dtype=dt)
offs = torch.zeros(G, dtype=torch.int32)
bias, w = torch.empty(G, 1, N, dtype=dt), torch.empty(T, 1, dtype=torch.float32)
D = torch.empty(T, N, dtype=dt)
problems = {
    "plain": (torch.empty(G, N, K, dtype=dt).mT,
              "def e(accum, bias, w): D = silu(accum + bias) * w; return D", dict(bias=bias, w=w)),
    "interleaved": (torch.empty(G, 2 * N, K, dtype=dt).mT,
                    library.gated("swiglu", bias=True), dict(bias_gate=bias, bias_up=bias)),
    "concatenated": (torch.empty(G, 2 * N, K, dtype=dt).mT,
                     library.gated("swiglu", layout="concatenated"), {}),
}
out = {}
for name, (B, src, ops) in problems.items():
    args = GemmArguments(A, B, D, offs=offs, epilogue=EpilogueArguments.unbound(src, D=D, **ops))
    configs = [c for f, c in offered(args) if f.name == "hopper"][:2]
    for c in configs:
        got = compile_for(HopperFamily(), c, args)
        out[name + "/" + c.name] = {"shared": got.shared_bytes, "spills": got.spills,
                                    "wgmma": got.ptx.count("wgmma.mma_async")}
print("RESULT" + json.dumps(out))
"""


@pytest.mark.slow
def test_grouped_hopper_kernels_compile_for_sm90():
    """The grouped hopper kernel (bf16, expert weights as W.mT: a routing-weighted bias +
    silu, SwiGLU interleaved with biases, SwiGLU concatenated) compiles offline to an sm_90
    cubin with warpgroup MMAs (wgmma) and no spills, in the two configs a GPU is offered
    first."""
    got = run_offline(_OFFLINE_SCRIPT, timeout=900)
    assert len(got) == 6, got
    for name, c in got.items():
        assert c["shared"] > 0 and c["wgmma"] > 0 and c["spills"] == 0, (name, c)


_DOWN_GRAD_OFFLINE = """
import json, torch
import evtfuse
from evtfuse import EpilogueArguments, GemmArguments
from evtfuse.runtime import moe
from evtfuse.runtime.offline import compile_for, offered
from evtfuse.backends.triton.hopper_family import _epilogue_registers, _full_tiles
src, outputs = moe.down_grad("silu")
grad = dict(outputs)
E, H, I, T = 8, 4096, 14336, 4096
bf = torch.bfloat16
offs = torch.zeros(E, dtype=torch.int32)
p = torch.empty(T, 2 * I, dtype=bf)
outs = {"D": torch.empty(T, I, dtype=bf), grad["G"]: torch.empty(T, I, dtype=bf),
        grad["U"]: torch.empty(T, I, dtype=bf), grad["s"]: torch.empty(T, 1)}
args = GemmArguments(torch.empty(T, H, dtype=bf), torch.empty(E, H, I, dtype=bf), outs["D"],
                     offs=offs, epilogue=EpilogueArguments.unbound(
                         src, G=p[:, :I], U=p[:, I:], s=torch.empty(T, 1, dtype=bf), **outs))
out = []
for fam, cfg in offered(args):
    if fam.name == "hopper":
        c = compile_for(fam, cfg, args)
        out.append({"config": cfg.name, "spills": c.spills, "wgmma": c.ptx.count("wgmma.mma_async"),
                    "flatten": cfg.flatten, "registers": _epilogue_registers(cfg, _full_tiles(args))})
print("RESULT" + json.dumps(out))
"""


@pytest.mark.slow
def test_moe_down_projection_backward_compiles_for_sm90():
    """The MoE dX epilogue's hopper candidates (Mixtral's sizes) compile offline to sm_90
    cubins with warpgroup MMAs, on every supported Triton (CI runs this file on 3.6.0 too,
    where a flattened tile loop around grouped_reduce's combine failed to compile: the
    candidates loop unflattened); no spilled tile wherever the epilogue's sub-tiles could be
    narrowed to ``EPILOGUE_REGISTERS`` (five full tiles: quarters of a 128x256 tile in
    eight warps spilled, 276 local-memory accesses; a few spilled scalars, 6-39 on Triton
    3.6.0, are tolerated), the first candidate among them, without any."""
    got = run_offline(_DOWN_GRAD_OFFLINE, timeout=900)
    assert len(got) >= 6 and all(c["wgmma"] > 0 and not c["flatten"] for c in got), got
    check_epilogue_registers(got)
