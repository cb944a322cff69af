"""GPU tier of ``evtfuse.export.cutlass`` (issue 53): each reference epilogue
(tests/export_cases.py) exported for fp16 and bf16, compiled with nvcc against CUTLASS
4.2's headers, run on random inputs and compared with ``evtfuse.gemm`` on the same inputs.

CUTLASS's headers come from the pinned wheel ``.vendor/nvidia_cutlass-4.2.0.0-py3-none-any.whl``
(git-ignored; the test downloads it with pip where a package index is reachable, else carry
``.vendor/`` to the GPU machine); it is unzipped into a temporary folder
and nvcc pointed at its ``include`` and ``tools/util/include``. Without the wheel, nvcc or
a GPU the tests skip, saying which. Each export's nvcc time is printed
(``nvcc <case> <dtype>: N s``; run with ``-s`` to see it) and the compiles run in parallel
(one per CPU, at most 8). Run: ``PYTHONPATH=src python3 -m pytest -m gpu -s
tests/gpu/test_gpu_export_cutlass.py`` (or the ``export`` shard of scripts/gpu_tier.sh).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

import evtfuse
from evtfuse.export import cutlass

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from export_cases import CASES  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

ROOT = Path(__file__).resolve().parents[2]
WHEEL = ROOT / ".vendor" / "nvidia_cutlass-4.2.0.0-py3-none-any.whl"
DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}
M, N, K = 512, 384, 256


def _nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    for cand in ("/usr/local/cuda/bin/nvcc", "/usr/local/cuda-13.0/bin/nvcc"):
        if os.path.exists(cand):
            return cand
    return None


def _fetch_wheel() -> bool:
    """Download the pinned wheel into .vendor/ (``pip download``, no dependencies) where
    a package index is reachable; False where it is not (the GPU machine has none: carry
    .vendor/ there)."""
    res = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                          "nvidia-cutlass==4.2.0.0", "-d", str(WHEEL.parent)],
                         capture_output=True, text=True, timeout=300)
    return res.returncode == 0 and WHEEL.exists()


@pytest.fixture(scope="module")
def cutlass_includes(tmp_path_factory) -> list[str]:
    if not WHEEL.exists() and not _fetch_wheel():
        pytest.skip(f"CUTLASS 4.2 headers: the wheel {WHEEL} is missing and pip could not "
                    "download it (no package index here): run `pip download --no-deps "
                    "nvidia-cutlass==4.2.0.0 -d .vendor` where one is, and carry .vendor/ "
                    "to the GPU machine")
    root = tmp_path_factory.mktemp("cutlass42")
    with zipfile.ZipFile(WHEEL) as z:
        for name in z.namelist():
            if name.startswith(("cutlass_library/source/include/",
                                "cutlass_library/source/tools/util/include/")):
                z.extract(name, root)
    src = root / "cutlass_library" / "source"
    return [str(src / "include"), str(src / "tools" / "util" / "include")]


@pytest.fixture(scope="module")
def built(cutlass_includes, tmp_path_factory) -> dict:
    """(case, dtype) -> (export, shared library path or the nvcc error, seconds)."""
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc is not on PATH (nor in /usr/local/cuda/bin)")
    out = tmp_path_factory.mktemp("exports")
    jobs = {}
    for case, (src, operands, outputs) in CASES.items():
        for dt in DTYPES:
            e = cutlass(src, operands=operands, outputs=outputs, ab_dtype=dt,
                        name=f"{case}_{dt}")
            hpp = out / f"{e.name}.hpp"
            hpp.write_text(e.header)
            cu = out / f"{e.name}.cu"
            cu.write_text(e.c_entry(hpp.name))
            jobs[(case, dt)] = (e, cu, out / f"lib{e.name}.so")

    def compile_one(job):
        e, cu, so = job
        cmd = [nvcc, "-std=c++17", "-arch=sm_90a", "--expt-relaxed-constexpr", "-O3",
               "-shared", "-Xcompiler", "-fPIC", "-DNDEBUG",
               *[f"-I{p}" for p in cutlass_includes], "-o", str(so), str(cu), "-lcuda"]
        t0 = time.perf_counter()
        res = subprocess.run(cmd, capture_output=True, text=True)
        took = time.perf_counter() - t0
        if res.returncode != 0:
            return e, (res.stderr or res.stdout)[-6000:], took
        return e, so, took

    workers = max(1, min(8, os.cpu_count() or 1))
    with ThreadPoolExecutor(workers) as pool:
        results = dict(zip(jobs, pool.map(compile_one, jobs.values())))
    for (case, dt), (_, _, took) in sorted(results.items()):
        print(f"nvcc {case} {dt}: {took:.1f} s")
    return results


def _inputs(e, dtype, gen):
    values = {}
    for name, kind, dt in e.description.operands:
        if kind == "runtime":
            values[name] = 0.75
            continue
        shape = {"full": (M, N), "row": (M, 1), "col": (N,), "scalar": ()}[kind]
        t = torch.randn(shape, generator=gen, device="cuda")
        values[name] = t.to(dtype if kind == "full" else dt)
    return values


def _outputs(e, dtype):
    outs = {}
    for name, kind, dt in e.description.outputs:
        if kind == "none":
            continue
        shape = {"full": (M, N), "row": (M, 1), "col": (N,), "scalar": (1,)}[kind]
        outs[name] = torch.full(shape, float("nan"), device="cuda",
                                dtype=dtype if kind == "full" else dt)
    return outs


@pytest.mark.parametrize("dt", sorted(DTYPES))
@pytest.mark.parametrize("case", sorted(CASES))
def test_export_compiles_runs_and_matches_evtfuse(built, case, dt):
    e, lib, took = built[(case, dt)]
    assert isinstance(lib, Path), f"nvcc failed on {case} ({dt}, {took:.0f} s):\n{lib}"
    dtype = DTYPES[dt]
    gen = torch.Generator(device="cuda").manual_seed(11)
    A = torch.randn(M, K, generator=gen, device="cuda").to(dtype)
    B = (torch.randn(K, N, generator=gen, device="cuda") * K ** -0.5).to(dtype)
    values = _inputs(e, dtype, gen)
    got = _outputs(e, dtype)
    fn = getattr(ctypes.CDLL(str(lib)), f"evtfuse_{e.name}_run")
    fn.restype = ctypes.c_int
    args = [ctypes.c_int(M), ctypes.c_int(N), ctypes.c_int(K),
            ctypes.c_void_p(A.data_ptr()), ctypes.c_void_p(B.data_ptr())]
    for name, _ in e.parameters:
        v = values.get(name, got.get(name))
        args.append(ctypes.c_float(v) if isinstance(v, float) else ctypes.c_void_p(v.data_ptr()))
    args.append(ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
    status = fn(*args)
    torch.cuda.synchronize()
    assert status == 0, f"cutlass::Status {status} (0 is kSuccess)"

    want = _outputs(e, dtype)
    res = evtfuse.gemm(A, B, epilogue=CASES[case][0], tune="none", **values, **want)
    res = res if isinstance(res, tuple) else (res,)
    names = [n for n, kind, _ in e.description.outputs if kind != "none"]
    tol = dict(rtol=1e-2, atol=1e-2) if dtype == torch.float16 else dict(rtol=2e-2, atol=2e-2)
    for name, ref in zip(names, res):
        ref = want[name] if ref is None else ref
        out = got[name]
        assert not torch.isnan(out).any(), f"{name}: not (fully) written by the CUTLASS kernel"
        # reductions sum hundreds of values: compare relative to their magnitude
        scale = 1.0 if out.numel() == M * N else max(1.0, float(ref.float().abs().max()))
        torch.testing.assert_close(out.float() / scale, ref.float().reshape(out.shape) / scale,
                                   **tol, msg=lambda m: f"{case} {dt} {name}: {m}")
