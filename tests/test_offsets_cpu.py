"""64-bit element offsets where a tensor reaches past 2^31 elements (issue 30).

Triton computes ``index * stride`` in int32 where both are int32 (strides below 2^31
arrive as int32), so an offset of 2^31 elements or more wrapped: on an H200 an fp32 D of
16384 x 152064 (an LM head's logits), an int8 C of more than 2^31 elements and a C with a
row stride of 2^30 each ended in an illegal memory access in every portable kernel. Now a
kernel spec says ``int64`` when a tensor the family addresses through pointers (or a
reduction workspace) has an element past 2^31 - 1 (``launch_items.needs_int64``), and its
strides are then int64 at the top of each function that uses them; TMA descriptors take
such tensors as they are (strides below 2^40 bytes, else the TMA families refuse).

Big tensors here are views of sparse files (``torch.from_file``): no memory is committed
and only the pages a test touches are written. Kernels run under the interpreter in a
subprocess (a wrapped offset read outside the buffer and crashed the process); the GPU
tier runs the findings at full size (``tests/gpu/test_gpu_offsets.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from evtfuse import EpilogueArguments, GemmArguments
from evtfuse.backends.triton.codegen import generate
from evtfuse.backends.triton.families import FAMILIES, Target, TileConfig
from evtfuse.backends.triton.family_base import _size_refusal
from evtfuse.backends.triton.launch_items import _tma_ok, needs_int64
from offline_run import run_offline

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tier")

H100 = Target("cuda", 90, torch.device("cpu"), 132, offline=True)  # CPU tensors stand in
_files = [0]


def sparse(folder, shape, strides=None, dtype=torch.float32) -> torch.Tensor:
    """A tensor of ``shape`` (and ``strides``: contiguous by default) over a sparse file in
    ``folder``: no memory committed, nothing written until touched."""
    if strides is None:
        strides = torch.empty(shape, device="meta").stride()
    numel = 1 + sum((n - 1) * st for n, st in zip(shape, strides))
    _files[0] += 1
    path = os.path.join(str(folder), f"sparse{_files[0]}.bin")
    return torch.from_file(path, shared=True, size=numel, dtype=dtype).as_strided(shape, strides)


def specs(args):
    """{family: [spec of each config]} for every family that supports ``args`` on an H100."""
    out = {}
    for fam in FAMILIES:
        if fam.supports(args, H100):
            out[fam.name] = [fam.spec(args, c, H100) for c in fam.configs(args, H100)]
    return out


def lm_head(folder):
    """Logits of a 152064-word vocabulary for 16384 tokens, fp32, and their per-row
    logsumexp: D has 2.49e9 elements (10 GB)."""
    M, N, K = 16384, 152064, 64
    A = torch.empty(M, K, dtype=torch.bfloat16)
    B = sparse(folder, (N, K), dtype=torch.bfloat16).T  # column-major (the weight, K-contiguous)
    D, r = sparse(folder, (M, N)), torch.empty(M, 1)
    return GemmArguments(A, B, D, epilogue=EpilogueArguments(
        "def epi(accum, bias): D = accum + bias; r = logsumexp(D); return D, r",
        bias=torch.empty(N), D=D, r=r))


def test_lm_head_logits_take_64_bit_offsets_where_stored_through_pointers(tmp_path):
    args = lm_head(tmp_path)
    got = specs(args)
    assert set(got) == {"portable", "hopper", "gluon"}
    assert all(s.int64 for s in got["portable"])  # D through pointers: row offsets past 2^31
    # the TMA families store D by descriptor (its strides are far below 2^40 bytes) and
    # address only the bias and the per-row results through pointers: int32 stays, but
    # where a gluon config stores D from registers (``KernelSpec.direct``)
    assert not any(s.int64 for s in got["hopper"])
    assert [s.int64 for s in got["gluon"]] == [bool(s.direct) for s in got["gluon"]]
    assert any(s.direct for s in got["gluon"]) and not all(s.direct for s in got["gluon"])
    src = generate(got["portable"][0])
    nm = got["portable"][0].names
    for stride in ("sa_k", "sb_k", nm("D", "sm"), nm("D", "sn"), nm("bias", "sn")):
        assert f"    {stride} = tl.cast({stride}, tl.int64)" in src, stride
    assert "tl.cast(" not in generate(got["hopper"][0])


def test_small_problems_keep_32_bit_offsets():
    n = 2048
    C, D = torch.empty(n, n, dtype=torch.bfloat16), torch.empty(n, n, dtype=torch.bfloat16)
    args = GemmArguments(torch.empty(n, n, dtype=torch.bfloat16), torch.empty(n, n, dtype=torch.bfloat16),
                         D, epilogue=EpilogueArguments(
                             "def epi(accum, C, s): D = accum * s + C; r = sum(D); return D, r",
                             C=C, s=torch.empty(n, 1), D=D, r=torch.empty(n, 1)))
    got = specs(args)
    assert len(got) == 3 and not any(s.int64 for ss in got.values() for s in ss)
    assert all("tl.cast(" not in generate(ss[0]) for ss in got.values())


def test_row_stride_of_2_30_and_int8_of_more_than_2_31_elements(tmp_path):
    """The H200 findings' tensors: an int8 C with rows 2^30 elements apart (4 rows), and
    an int8 C of 16384 x 152064; both through pointers in the portable family (int64),
    by TMA in the hopper family (its row stride, 2^30 bytes, is within TMA's limits)."""
    M, N, K = 4, 256, 64
    wide = sparse(tmp_path, (M, N), (2 ** 30, 1), dtype=torch.int8)
    for C in (wide, sparse(tmp_path, (16384, 152064), dtype=torch.int8)):
        M, N = C.shape
        D = sparse(tmp_path, (M, N), dtype=torch.bfloat16) if M > 4 else torch.empty(M, N, dtype=torch.bfloat16)
        args = GemmArguments(torch.empty(M, K, dtype=torch.bfloat16), torch.empty(K, N, dtype=torch.bfloat16),
                             D, epilogue=EpilogueArguments("def epi(accum, C): D = accum + C; return D",
                                                           C=C, D=D))
        got = specs(args)
        assert all(s.int64 for s in got["portable"]) and got["hopper"]
        assert not any(s.int64 for s in got["hopper"])


def test_vector_operands_and_reduction_outputs_of_wide_tensors(tmp_path):
    """A per-row vector read from a column of a wide tensor, and a per-row result written
    into one, are addressed through pointers by every family: int64 in each, the gluon
    family's consumers included (an int8 vector is read from global memory there)."""
    M, N, K = 256, 512, 64
    s = sparse(tmp_path, (M, 1), (2 ** 24, 1), dtype=torch.int8)  # 255 * 2^24 > 2^31
    r = sparse(tmp_path, (M, 1), (2 ** 24, 1))
    D = torch.empty(M, N, dtype=torch.bfloat16)
    args = GemmArguments(torch.empty(M, K, dtype=torch.bfloat16), torch.empty(K, N, dtype=torch.bfloat16),
                         D, epilogue=EpilogueArguments(
                             "def epi(accum, s): D = accum * s; r = sum(D); return D, r", s=s, D=D, r=r))
    got = specs(args)
    assert set(got) == {"portable", "hopper", "gluon"}
    assert all(spec.int64 for ss in got.values() for spec in ss)
    spec = got["gluon"][0]
    consumer = generate(spec).split("def _ef_consumer(")[1].split("\n\n\n")[0]
    assert f"{spec.names('s', 'sm')} = tl.cast(" in consumer


def test_reduction_workspaces_of_2_31_partials():
    """A per-row sum of a 2^20 x 2^20 problem without a stored D: 2^33 partials of 128-wide
    tiles (the workspace's offsets), nothing else near 2^31."""
    n = 2 ** 20
    args = GemmArguments(torch.empty(n, 16, dtype=torch.bfloat16), torch.empty(16, n, dtype=torch.bfloat16),
                         None, epilogue=EpilogueArguments(
                             "def epi(accum): D = accum; r = sum(accum); return D, r",
                             D=None, r=torch.empty(n, 1)))
    assert needs_int64(args, "portable", TileConfig(128, 128, 64))
    small = GemmArguments(torch.empty(4096, 16, dtype=torch.bfloat16),
                          torch.empty(16, 4096, dtype=torch.bfloat16), None,
                          epilogue=EpilogueArguments("def epi(accum): D = accum; r = sum(accum); "
                                                     "return D, r", D=None, r=torch.empty(4096, 1)))
    assert not needs_int64(small, "portable", TileConfig(128, 128, 64))


def test_sizes_past_int32_indices_are_refused():
    ok = SimpleNamespace(M=2 ** 31 - 1, N=8, K=8, L=1)
    assert _size_refusal(ok) is None
    assert "below 2^31" in _size_refusal(SimpleNamespace(M=2 ** 31, N=8, K=8, L=1))
    assert "below 2^31" in _size_refusal(SimpleNamespace(M=8, N=8, K=2 ** 31, L=1))
    assert "split the batch" in _size_refusal(SimpleNamespace(M=2 ** 20, N=8, K=8, L=2 ** 11))


class _View:
    """What ``_tma_ok`` reads of a tensor, for strides no buffer here could back."""

    def __init__(self, shape, strides, elt=4):
        self.shape, self._strides, self._elt = shape, strides, elt

    def stride(self):
        return self._strides

    def element_size(self):
        return self._elt

    def data_ptr(self):
        return 0

    def dim(self):
        return len(self.shape)


def test_tma_limits():
    assert _tma_ok(_View((4, 64), (2 ** 30, 1)), "C") is None
    assert "2^40 bytes" in _tma_ok(_View((4, 64), (2 ** 38, 1)), "C")  # 2^40 bytes apart
    assert "dimension of 2^31" in _tma_ok(_View((2, 2 ** 31), (2 ** 31, 1)), "C")


_RUN_SCRIPT = """
import json, sys, torch
sys.path.insert(0, {tests!r})
from test_offsets_cpu import sparse
from test_names_cpu import _interpreted_kernels
from evtfuse import EpilogueArguments, GemmArguments
folder = {folder!r}
M, N, K = 3, 40, 16
g = torch.Generator().manual_seed(0)
A, B = torch.randn(M, K, generator=g).half(), torch.randn(K, N, generator=g).half()
C = sparse(folder, (M, N), (2 ** 30, 1), dtype=torch.int8)  # row 2 at 2^31
C.copy_(torch.randint(-3, 4, (M, N), generator=g))
s = sparse(folder, (M, 1), (2 ** 30, 1), dtype=torch.int8)
s.copy_(torch.randint(1, 4, (M, 1), generator=g))
D = sparse(folder, (M, N), (2 ** 30, 1), dtype=torch.int8)
r = sparse(folder, (M, 1), (2 ** 30, 1))
m = sparse(folder, (M, 1), (2 ** 30, 1))
args = GemmArguments(A, B, D, epilogue=EpilogueArguments(
    "def epi(accum, C, s): F = accum * s + C; D = F; r = sum(F); m = max(F); return D, r, m",
    C=C, s=s, D=D, r=r, m=m))
out = {{}}
for k in _interpreted_kernels(args):
    spec = k.family.spec(args, k.config, k.target)
    result = k.verify(args)
    out[k.name] = [spec.int64, bool(result), "" if result else result.report()]
print("RESULT" + json.dumps(out))
"""


def test_kernels_run_where_offsets_pass_2_31_through_strides(tmp_path):
    """Under the interpreter (in a subprocess: a wrapped offset read far outside the
    buffer and crashed it): an int8 C, an int8 per-row scale, an int8 D and per-row sum
    and max outputs, each with rows 2^30 elements apart (the third row at 2^31), on every
    kernel the interpreter offers, against the reference."""
    script = _RUN_SCRIPT.format(tests=os.path.dirname(__file__), folder=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=600, env=dict(os.environ))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")]
    assert lines, f"rc {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    got = json.loads(lines[-1][len("RESULT"):])
    assert {k.split("_")[0] for k in got} == {"portable", "hopper"}, got
    assert all(ok for _, ok, _ in got.values()), got
    assert all(int64 for name, (int64, _, _) in got.items()), got  # every family: s, r, m by pointer


_OFFLINE_SCRIPT = """
import json, sys, torch
sys.path.insert(0, {tests!r})
from test_offsets_cpu import H100, lm_head, sparse
from evtfuse import EpilogueArguments, GemmArguments
from evtfuse.backends.triton.families import FAMILIES
from evtfuse.runtime.offline import compile_for
folder = {folder!r}
M, N, K = 256, 512, 64
s = sparse(folder, (M, 1), (2 ** 24, 1), dtype=torch.int8)
r = sparse(folder, (M, 1), (2 ** 24, 1))
m = sparse(folder, (M, 1), (2 ** 24, 1))
D = torch.empty(M, N, dtype=torch.bfloat16)
vectors = GemmArguments(torch.empty(M, K, dtype=torch.bfloat16), torch.empty(K, N, dtype=torch.bfloat16),
                        D, epilogue=EpilogueArguments(
                            "def epi(accum, s): D = accum * s; r = sum(D); m = max(D); return D, r, m",
                            s=s, D=D, r=r, m=m))
out = {{}}
for label, args in (("lm_head", lm_head(folder)), ("vectors", vectors)):
    for fam in FAMILIES:
        if label == "lm_head" and fam.name != "portable":
            continue
        cfg = fam.configs(args, H100)[0]
        spec = fam.spec(args, cfg, H100)
        compile_for(fam, cfg, args)
        out[f"{{label}} {{fam.name}}"] = spec.int64
print("RESULT" + json.dumps(out))
"""


@pytest.mark.slow
def test_int64_kernels_compile_for_sm_90(tmp_path):
    """The first kernel of each family with 64-bit offsets compiled for sm_90 without a
    GPU: the portable LM head, and every family's with a wide per-row scale and per-row
    sum (combined in the kernel or after it) and max (atomic folds) of wide tensors."""
    got = run_offline(_OFFLINE_SCRIPT.format(tests=os.path.dirname(__file__), folder=str(tmp_path)),
                      timeout=900)
    assert set(got) == {"lm_head portable", "vectors portable", "vectors hopper", "vectors gluon"}, got
    assert all(got.values()), got
