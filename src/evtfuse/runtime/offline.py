"""Offline compilation of a generated kernel for a GPU target, without a GPU.

Layer: runtime.kernels (beside ``Kernel.compile``, above ``runtime.discovery``). Triton
compiles for any NVIDIA target on a machine without one (``triton.compile`` with a
``GPUTarget``); this module does it for one kernel family and arguments, with the
signature Triton would derive from the real launch values. The CPU test tier uses it to
check that every generated Gluon kernel compiles to sm_90 SASS within its register and
shared-memory budget (no spills), which the interpreter cannot show. Arguments may hold
CPU tensors: only dtypes, shapes and strides matter here.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass

from ..arguments import GemmArguments
from ..backends.triton.codegen import generate
from ..backends.triton.families import KernelFamily, Target, TileConfig
from ..backends.triton.versions import LAUNCH_OPTIONS
from .cache import import_source
from .discovery import kernels_for
from .two_pass import judged


@dataclass(frozen=True)
class Compiled:
    """What an offline compile says about one kernel."""

    shared_bytes: int
    registers: int  # per thread, as ptxas allocated (cuobjdump -res-usage), -1 if unknown
    spills: int  # local-memory loads and stores in the SASS (LDL/STL)
    ptx: str
    sass: str = ""  # cuobjdump -sass of the cubin ("" without the tool)


def _cuobjdump() -> str | None:
    import triton

    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    return path if os.path.exists(path) else None


def offered(args: GemmArguments, cc: int = 90, sms: int = 132) -> list[tuple[KernelFamily, TileConfig]]:
    """The (family, config) pairs ``get_kernels`` would offer for ``args`` on a GPU of
    compute capability ``cc`` with ``sms`` SMs, best first (the families' refusals and
    ``order_by_fill`` included), for arguments on the CPU."""
    target = Target("cuda", cc, args.A.device, sms, offline=True)
    return [(k.family, k.config) for k in kernels_for(args, target)]


def compile_for(family: KernelFamily, config: TileConfig, args: GemmArguments,
                cc: int = 90, sms: int = 132) -> Compiled:
    """Generate and compile ``family``'s kernel for ``args`` to a ``cc`` cubin: where the
    family runs them in two passes (reductions feeding computation), the first pass's, the
    GEMM with ``config`` (``two_pass.judged``; the second pass is another kernel, over
    K = 0)."""
    target = Target("cuda", cc, args.A.device, sms, offline=True)
    args = judged(family, args, target)
    spec = family.spec(args, config, target)
    with tempfile.TemporaryDirectory() as tmp:
        fn = _compiled_kernel_fn(generate(spec), tmp)
        return _compile(fn, spec, family, config, args, target, cc)


def _compiled_kernel_fn(source: str, folder: str):
    """The module's ``evtfuse_kernel``, imported from ``folder`` (not registered in the
    runtime's module cache)."""
    from triton import knobs

    if knobs.runtime.interpret:
        raise RuntimeError("offline compiles need Triton's CPU interpreter off (TRITON_INTERPRET "
                           "unset): with it on, Triton's own library functions (tl.sum's "
                           "combine, ...) are interpreted ones that no compiled kernel can call")
    path = os.path.join(folder, "offline_kernel.py")
    with open(path, "w") as f:
        f.write(source)
    return import_source(f"evtfuse_offline_{abs(hash(source))}", path, source).evtfuse_kernel


def _specialized(fn, values: list) -> tuple[dict, dict, dict]:
    """Signature, constants and attributes as Triton's JIT derives them from the launch
    values: an integer equal to 1 becomes a constant, integers and data pointers divisible
    by 16 carry that divisibility (which widens loads and stores), as on the GPU; not for
    a parameter the kernel's decorator leaves unspecialised (``do_not_specialize``)."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    signature, constexprs, attrs = {}, {}, {}
    for i, (param, v) in enumerate(zip(fn.params, values)):
        name = param.name
        kind, attr = native_specialize_impl(BaseBackend, v, False, not param.do_not_specialize,
                                            not param.do_not_specialize_on_alignment)
        signature[name] = kind
        if kind == "constexpr":
            constexprs[(i,)] = v
        elif isinstance(attr, str) and attr:
            attrs[(i,)] = BaseBackend.parse_attr(attr)
    return signature, constexprs, attrs


def _compile(fn, spec, family, config, args, target, cc) -> Compiled:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    items, consts, _, _ = family.plan(args, args.optimized_dag, config, target)
    values = args.launch_values
    pos = [item(args.A, args.B, values) if callable(item) else item for item in items]
    names = list(fn.arg_names)
    consts = dict(consts)
    options = {k: consts.pop(k) for k in ("num_warps", "num_stages") if k in consts}
    options.update(LAUNCH_OPTIONS)  # as every launch passes them
    if spec.family == "gluon":  # Gluon pipelines explicitly; num_stages is a kernel constexpr
        options.pop("num_stages", None)
    signature, constexprs, attrs = _specialized(fn, pos)
    for name in names[len(pos):]:
        signature[name] = "constexpr"
    constexprs.update({(names.index(k),): v for k, v in consts.items()})
    if spec.family == "gluon":
        from triton.experimental.gluon._runtime import GluonASTSource

        src = GluonASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    else:
        src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", cc, 32), options=options)
    registers, spills, sass = -1, 0, ""
    tool = _cuobjdump()
    if tool:
        with tempfile.TemporaryDirectory() as tmp:
            cubin = os.path.join(tmp, "k.cubin")
            with open(cubin, "wb") as f:
                f.write(kernel.asm["cubin"])
            usage = subprocess.run([tool, "-res-usage", cubin], capture_output=True,
                                   text=True).stdout
            m = re.search(r"REG:(\d+)", usage)
            registers = int(m.group(1)) if m else -1
            sass = subprocess.run([tool, "-sass", cubin], capture_output=True, text=True).stdout
            spills = sum(1 for line in sass.splitlines() if "LDL" in line or "STL" in line)
    return Compiled(kernel.metadata.shared, registers, spills, kernel.asm["ptx"], sass)
