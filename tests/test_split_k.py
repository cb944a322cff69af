"""Split-K kernels (``runtime.split_k``) on the CPU interpreter: every candidate offered
right against the reference evaluator for the suite's epilogues (reductions, operands,
several outputs), the same bits on every run, offered only where they can help, and the
refusals named."""

from __future__ import annotations

import pytest
import torch

import evtfuse
from evtfuse import EpilogueArguments, GemmArguments
from evtfuse.bench import workloads as W
from evtfuse.runtime import discovery, split_k

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-interpreter tier")

M, N, K = 40, 72, 1024  # one 128 x 128 tile: split-K offered on the interpreter's 4 "SMs"
EPI = "def e(accum, bias):\n    D = gelu_tanh(accum + bias)\n    return D"


def _args(m=M, n=N, k=K, dtype=torch.bfloat16, epi=EPI, seed=0):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(m, k, generator=g).to(dtype)
    B = torch.randn(k, n, generator=g).to(dtype)
    bias = torch.randn(n, generator=g).to(dtype)
    D = torch.empty(m, n, dtype=dtype)
    return GemmArguments(A, B, D, epilogue=EpilogueArguments(epi, bias=bias, D=D))


def _target(args):
    return discovery._target(args, None)


@pytest.mark.parametrize("workload", [w.name for w in W.WORKLOADS])
def test_every_candidate_matches_the_reference(workload):
    w = W.BY_NAME[workload]
    shape = (M, N, K)
    ins = W.make_inputs(w, shape, torch.bfloat16, "cpu", 0)
    outs = W.make_outputs(w, shape, torch.bfloat16, "cpu", poison=True)
    ops = {k: v for k, v in ins.items() if k not in ("A", "B")}
    args = GemmArguments(ins["A"], ins["B"], outs.get("D"),
                         epilogue=EpilogueArguments(w.epilogue, **w.epilogue_operands(ops),
                                                    **outs), **w.gemm_options())
    why = split_k.refusal(args)
    cands = split_k.candidates(args, _target(args))
    if why is not None:  # refused (fp8 inputs): none offered, the refusal says why
        assert cands == [] and "inputs" in why, why
        return
    assert [k.S for k in cands] == [4, 2]
    for k in cands:
        result = k.verify(args)
        assert result, (k.name, result.report())


def test_the_same_bits_on_every_run_and_as_evtfuse_gemm_gives_them():
    args = _args()
    (k4, _) = split_k.candidates(args, _target(args))
    k4.run(args)
    first = args.epilogue.values["D"].clone()
    for _ in range(2):
        args.epilogue.values["D"].fill_(float("nan"))
        k4.run(args)
        assert torch.equal(args.epilogue.values["D"], first)
    # the kernel's two passes: partial products per slice, then the epilogue over their sum
    A, B = args.A.float(), args.B.float()
    parts = [A[:, s * 256:(s + 1) * 256] @ B[s * 256:(s + 1) * 256] for s in range(4)]
    acc = parts[0] + parts[1] + parts[2] + parts[3]
    bias = args.epilogue.values["bias"].float()
    want = torch.nn.functional.gelu(acc + bias, approximate="tanh").bfloat16()
    torch.testing.assert_close(first, want, rtol=0, atol=0.02)


def test_a_split_k_plan_checks_its_arguments_again_after_a_change_in_place():
    """``Kernel.plan`` validates again the arguments whose tensors changed since they were
    (a split-K kernel's plans go through it): D set to a smaller view is refused before
    anything is written."""
    args = _args()
    (k4, _) = split_k.candidates(args, _target(args))
    k4.run(args)
    D = args.epilogue.values["D"]
    big = torch.full((M * N,), 7.0, dtype=D.dtype)
    D.set_(big.untyped_storage(), 0, (M // 2, N), (N, 1))
    with pytest.raises(evtfuse.EpilogueError):
        k4.run(args)
    assert bool((big == 7.0).all())


def test_offered_where_tiles_are_few_and_k_splits():
    args = _args()
    target = _target(args)
    assert split_k.factors(args, target) == [4, 2]
    # enough output tiles for the "GPU": none offered
    assert split_k.factors(_args(m=256, n=384), target) == []
    # K not a multiple of slices of 64, or slices under 256: fewer or none
    assert split_k.factors(_args(k=1000), target) == []
    assert split_k.factors(_args(k=512), target) == [2]
    assert split_k.factors(_args(k=256), target) == []
    names = [k.name for k in evtfuse.get_kernels(args)]
    # under the interpreter the families' kernels come first (its untimed choice), split-K last
    assert not names[0].startswith("splitk") and names[-2:] == [
        k.name for k in split_k.candidates(args, target)]
    assert "splitk: offered with 4 and 2 slices of K" in evtfuse.explain(args)


def test_on_a_gpu_split_k_candidates_follow_the_families_first():
    """Timed by a fast tuning (which times the first kernels), never "none"'s untimed pick."""
    from evtfuse.backends.triton.families import Target
    from evtfuse.runtime import tuner

    args = _args()
    gpu = Target("cuda", 90, args.A.device, 132, offline=True)
    families = discovery.kernels_for(args, gpu)
    kernels = split_k.with_split_k(args, gpu, families)
    assert [k.name.split("_")[0] for k in kernels[1:3]] == ["splitk4", "splitk2"]
    assert kernels[0] is families[0] and kernels[3:] == families[1:]
    assert tuner.candidates(args, kernels, "none")[0] is families[0]
    fast = tuner.candidates(args, kernels, "fast")[:tuner.FAST_CANDIDATES]
    assert {k.name for k in kernels[1:3]} <= {k.name for k in fast}


def test_small_m_offers_the_portable_inner_kernel_beside_the_families_first():
    """For M up to ``PORTABLE_INNER_M`` each slice count comes with two inner kernels, the
    families' first and the portable family's first (measured faster at M = 16-64 on an
    H200): the tuner times both; at larger M, and where the first is portable, one."""
    from evtfuse.backends.triton.families import Target

    def offered(m, n, k):
        args = _args(m=m, n=n, k=k)
        gpu = Target("cuda", 90, args.A.device, 132, offline=True)
        return [(c.S, c.inner.family.name) for c in split_k.candidates(args, gpu)]

    for m in (16, split_k.PORTABLE_INNER_M):
        got = offered(m, 4096, 4096)
        assert [s for s, _ in got] == [4, 4, 2, 2], got
        assert [f for _, f in got][1::2] == ["portable", "portable"], got
        assert "portable" not in [f for _, f in got][0::2], got
    assert offered(256, 4096, 14336) == [(2, "gluon")]
    assert offered(40, 72, 1024) == [(4, "portable"), (2, "portable")]  # first is portable


def test_compile_after_get_kernels_allocates_nothing(monkeypatch):
    """Background tuning generates code in worker threads, which must make no CUDA call: a
    split-K kernel's compile reads the partial products' arguments made when it was
    offered."""
    args = _args()
    cands = split_k.candidates(args, _target(args))
    assert split_k.partial_of(args, 4) is split_k.partial_of(args, 4)

    def no_allocation(*a, **k):
        raise AssertionError("allocated")

    monkeypatch.setattr(torch, "empty", no_allocation)
    for k in cands:
        assert k.compile(args) is not None


@pytest.mark.parametrize("case, match", [
    ("batched", "not batched"),
    ("int8", "inputs"),
    ("fp16_acc", "accumulator_type"),
    ("gated", "gated"),
])
def test_refusals_name_what(case, match):
    if case == "batched":
        A, B = torch.randn(2, M, K), torch.randn(2, K, N)
        D = torch.empty(2, M, N)
        args = GemmArguments(A, B, D, epilogue=EpilogueArguments(
            "def e(accum):\n    D = accum\n    return D", D=D))
    elif case == "int8":
        A = torch.randint(-5, 5, (M, K), dtype=torch.int8)
        B = torch.randint(-5, 5, (K, N), dtype=torch.int8)
        D = torch.empty(M, N, dtype=torch.int32)
        args = GemmArguments(A, B, D, epilogue=EpilogueArguments(
            "def e(accum):\n    D = accum\n    return D", D=D))
    elif case == "fp16_acc":
        A, B = torch.randn(M, K).half(), torch.randn(K, N).half()
        D = torch.empty(M, N).half()
        args = GemmArguments(A, B, D, torch.float16, EpilogueArguments(
            "def e(accum):\n    D = accum\n    return D", D=D))
    else:
        A, B = torch.randn(M, K).bfloat16(), torch.randn(K, 2 * N).bfloat16()
        D = torch.empty(M, N).bfloat16()
        args = GemmArguments(A, B, D, epilogue=EpilogueArguments(
            "def e(accum):\n    gate, up = pairs(accum)\n    D = silu(gate) * up\n    return D",
            D=D))
    assert match in split_k.refusal(args)
    assert split_k.candidates(args, _target(args)) == []
    assert "splitk: refused" in evtfuse.explain(args)
