"""Never a wrong answer, round 3 (issue 46): what evtfuse reads by pointer is read by its
strides or refused, every tensor on A's device, scalars and dtypes checked with errors
naming the argument, outputs torch would not let be written in place refused, and CPU
tensors without Triton's interpreter told what to do. Whatever is refused, nothing is
written. (CPU tier: kernels under Triton's interpreter, tiny sizes.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import evtfuse
from evtfuse import EpilogueArguments, EpilogueError, GemmArguments, UnsupportedError
from evtfuse.reference import evaluate_grouped
from evtfuse.runtime.torch_op import layout_text, wire

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="CPU-interpreter tier (the gpu-marked tests run on a GPU)")

ROOT = Path(__file__).resolve().parents[1]
GEN = torch.Generator().manual_seed(46)
ADD_C = "def e(accum, C):\n    D = accum + C\n    return D"
SCALE = "def e(accum, alpha):\n    D = alpha * accum\n    return D"


def rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=GEN).to(dtype)


def strided(t: torch.Tensor, k: int = 2) -> torch.Tensor:
    """``t``'s values in a view whose every stride is k times a packed tensor's (the
    elements in between NaN): a tensor read as if packed gives NaN or wrong rows."""
    big = torch.full(tuple(s * k for s in t.shape), float("nan"), dtype=t.dtype)
    view = big[tuple(slice(None, None, k) for _ in t.shape)]
    view.copy_(t)
    return view


def nan(*shape):
    return torch.full(shape, float("nan"))


# ------------------------------------------------------------------ offs, by its strides

G, T, K, N = 4, 40, 8, 16
OFFS_STRIDED = torch.tensor([10, 0, 30, 0, 31, 0, 40, 0], dtype=torch.int32)[::2]


def test_grouped_gemm_reads_a_strided_offs_by_its_values():
    """offs[::2] of [10, 0, 30, 0, 31, 0, 40, 0] is [10, 30, 31, 40]: read packed it was
    [10, 0, 30, 0], every row past 10 in the wrong group. grouped_gemm copies it."""
    A, B = rand(T, K), rand(G, K, N)
    assert not OFFS_STRIDED.is_contiguous()
    got = evtfuse.grouped_gemm(A, B, OFFS_STRIDED)
    want = evaluate_grouped("def e(accum):\n    D = accum\n    return D", A, B,
                            OFFS_STRIDED.contiguous(), {"D": torch.empty(T, N)})["D"]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert OFFS_STRIDED.tolist() == [10, 30, 31, 40]  # the caller's offs untouched


def test_grouped_gemm_expanded_offs_is_read_by_its_values():
    """An expanded offs (stride 0: one int32 for G groups) is copied: [5, 5, 5, 5], rows 0-4
    in group 0, the others empty, rows from 5 on in no group (not written). Read packed, it
    was the int32s after it in memory, here [5, 40, 40, 40]: rows 5-39 written by group 1."""
    A, B = rand(T, K), rand(G, K, N)
    memory = torch.tensor([5, T, T, T], dtype=torch.int32)
    offs = memory[:1].expand(G)
    D = nan(T, N)
    evtfuse.grouped_gemm(A, B, offs, D=D)
    torch.testing.assert_close(D[:5], A[:5] @ B[0], atol=1e-4, rtol=1e-4)
    assert D[5:].isnan().all()


def test_grouped_gemm_over_k_reads_a_strided_offs():
    """Groups over K (A (M, T), B (T, N)): batch g sums over its range of T."""
    M = 8
    A, B = rand(M, T), rand(T, N)
    got = evtfuse.grouped_gemm(A, B, OFFS_STRIDED)
    ends = OFFS_STRIDED.tolist()
    for g, (s, e) in enumerate(zip([0] + ends[:-1], ends)):
        torch.testing.assert_close(got[g], A[:, s:e] @ B[s:e], atol=1e-4, rtol=1e-4)


def test_strided_offs_is_refused_where_it_is_not_copied():
    """GemmArguments and the operator itself refuse a strided offs, naming it (the error
    says .contiguous()), also after a plan of the same structure with a contiguous offs was
    cached; nothing is written."""
    A, B = rand(T, K), rand(G, K, N)
    D = nan(T, N)
    with pytest.raises(EpilogueError, match=r"offs is not contiguous.*offs\.contiguous\(\)") as e:
        GemmArguments(A, B, D, offs=OFFS_STRIDED)
    assert e.value.variable == "offs"
    src = "def identity(accum):\n    D = accum\n    return D"
    layout = layout_text((), (), (), ("D",), 0, "identity", False, ("none", False, True, None))
    contiguous = OFFS_STRIDED.contiguous()
    torch.ops.evtfuse.grouped_gemm.default(A, B, contiguous, wire(src), layout, [], [], [D])
    assert not D.isnan().any()  # a plan for the contiguous structure is cached now
    D2 = nan(T, N)
    with pytest.raises(EpilogueError, match="offs is not contiguous") as e:
        torch.ops.evtfuse.grouped_gemm.default(A, B, OFFS_STRIDED, wire(src), layout, [], [],
                                               [D2])
    assert e.value.variable == "offs" and D2.isnan().all()
    # the same offs object as a cached call's, made strided in place since: refused too
    memory = torch.tensor([10, 30, 31, 40, 0, 0, 0, 0], dtype=torch.int32)
    offs = memory[:4]
    torch.ops.evtfuse.grouped_gemm.default(A, B, offs, wire(src), layout, [], [], [D])
    offs.as_strided_((4,), (2,))  # now [10, 31, 0, 0]
    with pytest.raises(EpilogueError, match="offs is not contiguous"):
        torch.ops.evtfuse.grouped_gemm.default(A, B, offs, wire(src), layout, [], [], [D2])
    assert D2.isnan().all()


def test_hopper_family_gets_the_copied_offs():
    """The hopper family (cc=90 under the interpreter) reads the same offs: grouped_gemm's
    copy, and GemmArguments' refusal before any family is asked."""
    A, B = rand(T, K), rand(G, K, N)
    args = GemmArguments(A, B, nan(T, N), offs=OFFS_STRIDED.contiguous())
    hopper = [k for k in evtfuse.get_kernels(args, cc=90) if k.family.name == "hopper"]
    assert hopper, evtfuse.explain(args, cc=90)
    got = evtfuse.grouped_gemm(A, B, OFFS_STRIDED, cc=90, tune="none")
    ref = evtfuse.grouped_gemm(A, B, OFFS_STRIDED.contiguous())
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------------ the rest, by strides

def test_strided_vectors_and_reduction_outputs_are_read_by_their_strides():
    """Audit: per-row and per-column vectors, a device scalar and a full operand that are
    views with strides 2x a packed tensor's, and full, per-row and per-column outputs
    likewise (the portable family, every element strided; the hopper family's TMA tiles
    need packed full tensors, its vectors and reductions strided)."""
    M = 12
    A, B = rand(M, K), rand(K, N)
    src = ("def e(accum, r, c, s, X):\n    D = accum * r + c * s + X\n    R = sum(D)\n"
           "    Cm = max(D)\n    return D, R, Cm")
    r, c, s, X = rand(M, 1), rand(N), rand(1), rand(M, N)
    want = (A @ B) * r + c * s + X
    for family, cc in (("portable", None), ("hopper", 90)):
        D = strided(torch.zeros(M, N)) if family == "portable" else torch.zeros(M, N)
        R, Cm = strided(torch.zeros(M, 1)), strided(torch.zeros(N))
        x = strided(X) if family == "portable" else X
        args = GemmArguments(A, B, D, epilogue=EpilogueArguments(
            src, r=strided(r), c=strided(c), s=strided(s), X=x, D=D, R=R, Cm=Cm))
        kernel = next(k for k in evtfuse.get_kernels(args, cc=cc) if k.family.name == family)
        kernel.run(args)
        torch.testing.assert_close(D, want, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(R, want.sum(1, keepdim=True), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(Cm, want.amax(0), atol=1e-4, rtol=1e-4)


def test_grouped_strided_operands_and_outputs():
    """Audit, grouped over M: a per-group bias (G, 1, N), routing weights (T, 1), a
    per-group scale (G, 1, 1), D and a per-row sum, all strided, through grouped_gemm."""
    A, B = rand(T, K), rand(G, K, N)
    offs = OFFS_STRIDED.contiguous()
    src = ("def e(accum, bias, w, g):\n    D = (accum + bias) * w * g\n    R = sum(D)\n"
           "    return D, R")
    ops = dict(bias=rand(G, 1, N), w=rand(T, 1), g=rand(G, 1, 1))
    D, R = strided(nan(T, N)), strided(nan(T, 1))
    evtfuse.grouped_gemm(A, B, offs, src, **{k: strided(v) for k, v in ops.items()}, D=D, R=R)
    ref = evaluate_grouped(src, A, B, offs, {**ops, "D": torch.empty(T, N),
                                             "R": torch.empty(T, 1)})
    torch.testing.assert_close(D, ref["D"], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(R, ref["R"], atol=1e-4, rtol=1e-4)


def test_linear_cross_entropy_strided_and_expanded_targets_and_bias():
    """Targets are copied packed, the bias read by its stride: as torch computes them."""
    Tn, H, V = 6, 8, 5
    hidden, weight, bias = rand(Tn, H), rand(V, H), rand(V)
    base = torch.randint(0, V, (2 * Tn,), generator=GEN)
    for target in (base[::2], torch.tensor(3).expand(Tn)):
        logits = hidden @ weight.T + bias
        want = torch.nn.functional.cross_entropy(logits, target, reduction="none")
        got = evtfuse.linear_cross_entropy(hidden, weight, target, bias=strided(bias),
                                           reduction="none")
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------------ devices

def _meta(*shape):
    return torch.empty(*shape, device="meta")


@pytest.mark.parametrize("where", ["operand", "output", "B"])
def test_gemm_refuses_a_meta_tensor_among_cpu_ones(where):
    """A meta tensor among CPU ones sent the call to the operator's fake implementation:
    no error, D never computed. Now an error naming it, nothing written."""
    M = 8
    A, B, C, D = rand(M, K), rand(K, N), rand(M, N), nan(M, N)
    kw = {"operand": dict(C=_meta(M, N), D=D), "output": dict(C=C, D=_meta(M, N)),
          "B": dict(C=C, D=D)}[where]
    b = _meta(K, N) if where == "B" else B
    name = {"operand": "C", "output": "D", "B": "B"}[where]
    with pytest.raises(EpilogueError, match=f"{name} is on meta but A is on cpu") as e:
        evtfuse.gemm(A, b, ADD_C, **kw)
    assert e.value.variable == name and D.isnan().all()


def test_grouped_gemm_refuses_meta_operand_and_offs():
    A, B, D = rand(T, K), rand(G, K, N), nan(T, N)
    offs = OFFS_STRIDED.contiguous()
    with pytest.raises(EpilogueError, match="w is on meta but A is on cpu") as e:
        evtfuse.grouped_gemm(A, B, offs, "def e(accum, w):\n    D = accum * w\n    return D",
                             w=_meta(T, 1), D=D)
    assert e.value.variable == "w" and D.isnan().all()
    with pytest.raises(EpilogueError, match="offs is on meta but A is on cpu"):
        evtfuse.grouped_gemm(A, B, offs.to("meta"), D=D)
    assert D.isnan().all()


def test_operator_and_gemm_arguments_refuse_a_meta_tensor():
    """The operator called directly (its fake implementation is what a mixed call reaches)
    and GemmArguments name the tensor; an all-meta call (as tracing makes) runs nothing and
    returns meta outputs."""
    M = 8
    A, B, D = rand(M, K), rand(K, N), nan(M, N)
    layout = layout_text(("C",), (), (), ("D",), 0, "e", False, ("none", False, True, None))
    with pytest.raises(EpilogueError, match="C is on meta but A is on cpu"):
        torch.ops.evtfuse.gemm.default(A, B, wire(ADD_C), layout, [_meta(M, N)], [], [D])
    assert D.isnan().all()
    with pytest.raises(EpilogueError, match="C is on meta") as e:
        GemmArguments(A, B, D, epilogue=EpilogueArguments(ADD_C, C=_meta(M, N), D=D))
    assert e.value.variable == "C"
    out = evtfuse.gemm(_meta(M, K), _meta(K, N), ADD_C, C=_meta(M, N))
    assert out.device.type == "meta" and out.shape == (M, N)


def test_linear_cross_entropy_refuses_meta_tensors():
    hidden, weight, target = rand(4, 8), rand(5, 8), torch.zeros(4, dtype=torch.long)
    for name, kw in (("target", dict(target=target.to("meta"))),
                     ("weight", dict(weight=weight.to("meta")))):
        args = {**dict(hidden=hidden, weight=weight, target=target), **kw}
        with pytest.raises(EpilogueError, match=f"{name} is on meta and hidden on cpu") as e:
            evtfuse.linear_cross_entropy(**args)
        assert e.value.variable == name


# ------------------------------------------------------------------ scalars, types, dtypes

def test_huge_int_scalar_is_named_and_a_large_one_is_a_float():
    A, B = rand(8, K), rand(K, N)
    with pytest.raises(EpilogueError, match="Argument alpha = an int of 401 digits does not "
                                            "fit a float") as e:
        evtfuse.gemm(A, B, SCALE, alpha=10 ** 400)
    assert e.value.variable == "alpha"
    got = evtfuse.gemm(A, B, SCALE, alpha=2 ** 70)  # past int64: passed as its float
    torch.testing.assert_close(got, (A @ B) * float(2 ** 70), rtol=1e-4, atol=0.0)


@pytest.mark.parametrize("call", ["gemm", "grouped_gemm", "GemmArguments"])
def test_numpy_input_is_named(call):
    A, B = rand(T, K), rand(G, K, N)
    offs = OFFS_STRIDED.contiguous()
    run = {"gemm": lambda a: evtfuse.gemm(a, B[0]),
           "grouped_gemm": lambda a: evtfuse.grouped_gemm(a, B, offs),
           "GemmArguments": lambda a: GemmArguments(a, B[0], torch.empty(T, N))}[call]
    with pytest.raises(EpilogueError, match="A must be a torch.Tensor, not ndarray") as e:
        run(A.numpy())
    assert e.value.variable == "A"


def test_output_dtype_by_name():
    A, B = rand(8, K), rand(K, N)
    for name, dtype in (("float16", torch.float16), ("bf16", torch.bfloat16),
                        ("torch.float32", torch.float32), (torch.float16, torch.float16)):
        assert evtfuse.gemm(A, B, D_dtype=name).dtype == dtype
    for bad in ("float17", 3, "tensor"):
        with pytest.raises(EpilogueError, match="D_dtype must be a torch.dtype") as e:
            evtfuse.gemm(A, B, D_dtype=bad)
        assert e.value.variable == "D_dtype"


def test_wrongly_shaped_d_is_named_not_c():
    """D (4, 8) for A @ B (8, 8): gemm names D (it bound the problem of A and B first);
    EpilogueArguments alone, which knows the problem from D only, says so."""
    A, B, C = rand(8, 8), rand(8, 8), rand(8, 8)
    D = nan(4, 8)
    with pytest.raises(EpilogueError, match=r"Output 'D' has shape \(4, 8\)") as e:
        evtfuse.gemm(A, B, ADD_C, C=C, D=D)
    assert e.value.variable == "D" and D.isnan().all()
    with pytest.raises(EpilogueError, match=r"taken from D's shape \(4, 8\) here.*fix D"):
        EpilogueArguments(ADD_C, C=C, D=D)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int16, torch.complex64])
def test_unsupported_input_dtype_names_a_and_b(dtype):
    A, B = torch.ones(8, 8, dtype=dtype), torch.ones(8, 8, dtype=dtype)
    for run in (lambda: evtfuse.gemm(A, B), lambda: GemmArguments(A, B, torch.empty(8, 8))):
        with pytest.raises(EpilogueError) as e:
            run()
        text = str(e.value)
        assert text.startswith(f"A and B are {dtype}; evtfuse multiplies float16, bfloat16, "
                               "float32"), text
        assert "int8 and uint8 inputs" in text and e.value.variable == "A"


# ------------------------------------------------------------------ outputs autograd owns

@pytest.mark.parametrize("call", ["gemm", "grouped_gemm", "Kernel.run"])
def test_leaf_output_requiring_grad_is_refused(call):
    A, B = rand(T, K), rand(G, K, N)
    offs = OFFS_STRIDED.contiguous()
    D = nan(T, N).requires_grad_()
    with pytest.raises(EpilogueError, match=f"{re.escape(call)}: output D is a leaf tensor "
                                            "that requires grad") as e:
        if call == "gemm":
            evtfuse.gemm(A, B[0], D=D)
        elif call == "grouped_gemm":
            evtfuse.grouped_gemm(A, B, offs, D=D)
        else:
            args = GemmArguments(A, B[0], D)
            evtfuse.get_kernels(args)[0].run(args)
    assert e.value.variable == "D" and D.isnan().all()
    with torch.no_grad():  # as torch: an in-place write to such a leaf is fine there
        evtfuse.gemm(A, B[0], D=D)
    torch.testing.assert_close(D.detach(), A @ B[0], atol=1e-4, rtol=1e-4)


def test_views_and_recorded_outputs_requiring_grad():
    """A view of such a leaf is refused too; a non-leaf output that requires grad is refused
    when the call records nothing (no input requires grad: its gradient would reach what it
    held), and written through autograd when an input requires grad."""
    A, B = rand(8, K), rand(K, N)
    leaf = nan(16, N).requires_grad_()
    with pytest.raises(EpilogueError, match="output D is a view of a leaf tensor"):
        evtfuse.gemm(A, B, D=leaf[:8])
    assert leaf.isnan().all()
    x = rand(8, N).requires_grad_()
    D = x * 2.0
    with pytest.raises(EpilogueError, match="output D requires grad .* without recording"):
        evtfuse.gemm(A, B, D=D)
    Ag = A.clone().requires_grad_()
    out = evtfuse.gemm(Ag, B, D=x * 2.0)
    out.sum().backward()
    assert x.grad is not None and not x.grad.any()  # overwritten: no gradient to x
    torch.testing.assert_close(Ag.grad, torch.ones(8, N) @ B.T, atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------------ the interpreter

def _script_env(tmp_path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), CUDA_VISIBLE_DEVICES="",
               EVTFUSE_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("TRITON_INTERPRET", None)
    return env


@pytest.mark.slow
def test_cpu_tensors_without_the_interpreter_say_what_to_do(tmp_path):
    script = tmp_path / "off.py"
    script.write_text(
        "import warnings, torch, evtfuse\n"
        "A = torch.ones(8, 8)\n"
        "try:\n"
        "    evtfuse.gemm(A, A)\n"
        "except evtfuse.UnsupportedError as e:\n"
        "    print('GEMM:', str(e).splitlines()[0])\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    ks = evtfuse.get_kernels(evtfuse.GemmArguments(A, A, torch.empty(8, 8)))\n"
        "print('KERNELS:', ks, [str(x.message) for x in w])\n"
        "from evtfuse.runtime.device import use_interpreter\n"
        "use_interpreter()\n"
        "print('AFTER:', bool((evtfuse.gemm(A, A) == 8).all()))\n")
    res = subprocess.run([sys.executable, str(script)], env=_script_env(tmp_path),
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "GEMM: A is on the CPU and Triton's CPU interpreter is off" in res.stdout
    assert "use_interpreter()" in res.stdout.split("KERNELS:")[0]
    kernels = res.stdout.split("KERNELS:")[1]
    assert kernels.startswith(" [] [") and "evtfuse.get_kernels: A is on the CPU" in kernels
    assert "AFTER: True" in res.stdout


def test_readme_use_runs_on_a_cpu_machine(tmp_path):
    """README's code blocks, as one script, without TRITON_INTERPRET in the environment and
    no GPU: the "Use" block turns the interpreter on itself."""
    from doc_blocks import python_blocks

    code = "\n".join(python_blocks(ROOT / "README.md"))
    assert "get_kernels(args)[0].run(args)" in code
    script = tmp_path / "readme.py"
    script.write_text(code + "\nprint('README OK', tuple(D.shape))\n")
    res = subprocess.run([sys.executable, str(script)], env=_script_env(tmp_path),
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "README OK" in res.stdout
