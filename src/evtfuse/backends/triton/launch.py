"""Launching a compiled Triton kernel again without the JIT's per-call work.

Layer: backends/triton. Used by the runtime's launch plans (``runtime.kernel.LaunchPlan``)
and by the combine step after a kernel (``launch_items._combiner``).

Three paths, fastest first; a launch never fails where a slower path works:
1. *raw*: Triton's C launch function, below its Python launcher, called in the convention
   of the running Triton (``versions.CHANGES["c_launcher"]``), each TMA descriptor encoded
   once per tensor address (``DescriptorCache``);
2. *launcher*: the compiled kernel's own launcher (``CompiledKernel.run``), as Triton's JIT
   calls it (the same call on every supported release);
3. *JIT*: ``fn[grid](...)`` (the caller's path whenever ``launch`` returns False).
The first call of each path is its check against the running Triton: a path whose call
raises ``TypeError``/``ValueError``/``SystemError`` (arguments that do not match what
that Triton's launcher takes; nothing was launched) is dropped for that kernel, the next
path is taken, and it is logged once per process.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from . import versions

log = logging.getLogger("evtfuse")

# distinct tensors whose encoded TMA descriptors one argument slot keeps (the suite
# rotates up to 8 input sets; a training loop reuses a few buffers)
DESCRIPTOR_CACHE = 16
# errors a launcher raises before launching anything when its arguments do not fit
_MISMATCH = (TypeError, ValueError, SystemError)
_logged: set[str] = set()


def direct_launcher(compiled, jit_fn, grid: tuple, n_positional: int, consts: dict):
    """``launch(positional) -> bool``: launches ``compiled`` on the current stream without
    the JIT's per-call binding, specialisation and cache lookup (~20 us of host time per
    launch), or returns False, and the caller takes the JIT path: while a Triton launch hook
    is installed (profilers need the JIT's metadata), under the CPU interpreter (no compiled
    kernel), and once both direct paths failed their check."""
    try:
        from triton import knobs
        from triton.runtime.driver import driver

        run = compiled.run  # loads the module and sets compiled.function
        function, metadata = compiled.function, compiled.packed_metadata
        names = list(jit_fn.arg_names)
        tail = [consts[name] for name in names[n_positional:]]  # the constexprs, in order
    except (AttributeError, KeyError, TypeError):
        return lambda pos: False
    g0, g1, g2 = (tuple(grid) + (1, 1))[:3]
    runtime = knobs.runtime
    get_device, get_stream = driver.active.get_current_device, driver.active.get_current_stream

    def via_launcher(pos) -> None:  # path 2: as Triton's JIT calls the compiled kernel
        run(g0, g1, g2, get_stream(get_device()), function, metadata, None, None, None,
            *pos, *tail)

    paths: list[tuple[str, Callable]] = [("launcher", via_launcher)]
    raw = raw_launcher(run, _signature(compiled), _descriptor_metas(compiled))
    if raw is not None and all(i < n_positional for i in raw[1]):
        paths.insert(0, ("raw", _raw_call(raw, run, (g0, g1, g2), function, metadata, tail,
                                          get_device, get_stream)))
    checked: set[str] = set()

    def launch(pos, _owner=compiled) -> bool:
        # ``_owner`` keeps the compiled kernel, and so ``function``'s module, alive: Triton
        # 3.9 unloads the module when its ``CompiledKernel`` is collected, which happens
        # while the JIT's cache still has an entry for the key (two threads compiling one
        # key: the second result replaces the first) and a launch would then hand CUDA a
        # handle of an unloaded module ("invalid resource handle")
        if _hooked(runtime.launch_enter_hook) or _hooked(runtime.launch_exit_hook):
            return False
        while paths:
            name, call = paths[0]
            if name in checked:
                call(pos)
                return True
            try:
                call(pos)
            except _MISMATCH as exc:  # this Triton's launcher takes other arguments
                paths.pop(0)
                _log_once(name, exc)
                continue
            checked.add(name)
            return True
        return False

    return launch


def _raw_call(raw, run, grid: tuple, function, metadata, tail: list, get_device, get_stream):
    """Path 1 in the running Triton's convention (``versions.CHANGES["c_launcher"]``)."""
    c_launch, descriptors = raw
    expand = expander(descriptors)
    g0, g1, g2 = grid
    coop, pdl = run.launch_cooperative_grid, run.launch_pdl
    if versions.spelling("c_launcher") == "packed":
        head = (coop, pdl, metadata, None, None, None, None, None, run.arg_annotations,
                run.kernel_signature)

        def call(pos) -> None:
            c_launch(g0, g1, g2, get_stream(get_device()), function, *head,
                     (*expand(pos), *tail))
    else:
        head = (coop, pdl, None, None, metadata, None, None, None)

        def call(pos) -> None:
            c_launch(g0, g1, g2, get_stream(get_device()), function, *head, *expand(pos),
                     *tail)

    return call


def raw_launcher(run, signature: list[str], metas: list | None
                 ) -> tuple[Callable, dict[int, Any]] | None:
    """(Triton's C launch function, {argument position: its TMA descriptor metadata}) for
    ``run``, a compiled kernel's launcher (``CudaLauncher``) whose ``launch`` is the C
    function or Triton's ``inner`` wrapper around it that encodes tensor descriptors on
    every call; ``signature``: the kernel's argument types in order, ``metas``: the
    compiler's metadata of its descriptors. None where the raw call cannot stand for the
    launcher: scratch memory to allocate per launch, a sanitizer's extra arguments, an
    attribute the running Triton's convention needs missing, a descriptor without
    metadata (the JIT passes those decomposed) or a launcher of another shape."""
    packed = versions.spelling("c_launcher") == "packed"
    try:
        if run.global_scratch_size or run.profile_scratch_size or getattr(run, "gsan_enabled", False):
            return None
        run.launch_cooperative_grid, run.launch_pdl  # noqa: B018 - both must exist
        if packed:
            run.arg_annotations, run.kernel_signature  # noqa: B018
        wrapped = run.launch
    except AttributeError:
        return None
    where = [i for i, t in enumerate(signature) if str(t).startswith("tensordesc")]
    code, closure = getattr(wrapped, "__code__", None), getattr(wrapped, "__closure__", None)
    if code is None:  # the C function itself: no descriptor arguments
        return (wrapped, {}) if callable(wrapped) and not where else None
    if code.co_name != "inner" or closure is None or not where:
        return None
    c_launch = dict(zip(code.co_freevars, (c.cell_contents for c in closure))).get("launcher")
    if not callable(c_launch) or not isinstance(metas, (list, tuple)) \
            or len(metas) != len(where) or any(m is None for m in metas):
        return None
    return c_launch, dict(zip(where, metas))


def _signature(compiled) -> list[str]:
    src = getattr(compiled, "src", None)
    sig = getattr(src, "signature", None)
    return [str(t) for t in sig.values()] if isinstance(sig, dict) else []


def _descriptor_metas(compiled) -> list | None:
    return getattr(getattr(compiled, "metadata", None), "tensordesc_meta", None)


def expander(descriptors: dict[int, Any]) -> Callable[[list], list]:
    """``expand(args)``: the kernel's arguments as Triton's C launcher takes them, each
    TMA descriptor argument replaced by its encoding (``DescriptorCache``) as Triton's
    ``make_tensordesc_arg`` makes it."""
    if not descriptors:
        return lambda args: args
    # (start of the plain run before the descriptor, its position, its cache), in order
    steps, start = [], 0
    for i in sorted(descriptors):
        steps.append((start, i, DescriptorCache(descriptors[i])))
        start = i + 1

    def expand(args: list) -> list:
        out: list = []
        for begin, i, cache in steps:  # one step per descriptor, not per argument
            out += args[begin:i]
            out += cache.get(args[i])
        out += args[start:]
        return out

    return expand


class DescriptorCache:
    """One argument slot's encoded TMA descriptors (``make_tensordesc_arg``'s list: the
    CUtensorMap, shape, strides), by the described tensor's address. A launch plan fixes
    the shape, strides, dtype and block of every descriptor it passes, so the address is
    all that varies between its calls, and an encoding made for an address is the same
    whatever tensor has it later."""

    def __init__(self, meta: Any):
        self.meta = meta
        self.by_ptr: dict[int, list] = {}
        # 3.8+ passes the launch's base arguments too (unused for tiled descriptors)
        self.extra = (None,) if versions.is_new("tensordesc_arg_base") else ()

    def get(self, desc) -> list:
        ptr = desc.base.data_ptr()
        hit = self.by_ptr.get(ptr)
        if hit is None:
            from triton.backends.nvidia import driver as nv

            if len(self.by_ptr) >= DESCRIPTOR_CACHE:
                self.by_ptr.clear()
            hit = self.by_ptr[ptr] = list(nv.make_tensordesc_arg(desc, self.meta, *self.extra))
        return hit


def _log_once(path: str, exc: BaseException) -> None:
    if path in _logged:
        return
    _logged.add(path)
    import triton

    nxt = "Triton's launcher" if path == "raw" else "Triton's JIT"
    log.warning("evtfuse: the %s launch path does not fit Triton %s (%s: %s); launching "
                "through %s instead (slower host side; please report this)", path,
                triton.__version__, type(exc).__name__, str(exc).splitlines()[0][:160], nxt)


def _hooked(hook) -> bool:
    """Whether a Triton launch hook is installed (Triton 3.6 keeps an always-present chain
    of hooks, empty by default; older versions use None)."""
    return hook is not None and bool(getattr(hook, "calls", True))
