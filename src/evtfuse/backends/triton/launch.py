"""Launching a compiled Triton kernel again without the JIT's per-call work.

Layer: backends/triton. Used by the runtime's launch plans (``runtime.kernel.LaunchPlan``)
and by the combine step after a kernel (``launch_items._combiner``).
"""

from __future__ import annotations

from typing import Any, Callable

# distinct tensors whose encoded TMA descriptors one argument slot keeps (the suite
# rotates up to 8 input sets; a training loop reuses a few buffers)
DESCRIPTOR_CACHE = 16


def direct_launcher(compiled, jit_fn, grid: tuple, n_positional: int, consts: dict):
    """``launch(positional) -> bool`` calling Triton's compiled launcher without the JIT's
    per-call binding, specialisation and cache lookup (~20 us of host time per launch), as
    ``fn[grid]`` itself ends up calling it. Returns False (the caller then takes the JIT
    path) while a Triton launch hook is installed (profilers need the JIT's metadata).
    Under the CPU interpreter there is no compiled kernel: every launch goes through the
    JIT (returns a launcher that always says False).

    Where Triton's launcher is the one this module knows (``raw_launcher``), it is called
    below its Python wrapper, and each TMA descriptor argument is encoded once per tensor
    (``DescriptorCache``) instead of on every launch (~2.5 us each on an H100 host)."""
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
    raw = raw_launcher(run)

    if raw is None:
        def launch(pos) -> bool:
            if _hooked(runtime.launch_enter_hook) or _hooked(runtime.launch_exit_hook):
                return False
            run(g0, g1, g2, get_stream(get_device()), function, metadata, None, None, None,
                *pos, *tail)
            return True

        return launch

    c_launch, descriptors = raw
    if any(i >= n_positional for i in descriptors):
        return lambda pos: False  # a descriptor among the constexprs: not a plan's kernel
    expand = expander(descriptors)
    head = (run.launch_cooperative_grid, run.launch_pdl, None, None, metadata, None, None, None)

    def launch_raw(pos) -> bool:
        if _hooked(runtime.launch_enter_hook) or _hooked(runtime.launch_exit_hook):
            return False
        c_launch(g0, g1, g2, get_stream(get_device()), function, *head, *expand(pos), *tail)
        return True

    return launch_raw


def raw_launcher(run) -> tuple[Callable, dict[int, Any]] | None:
    """(Triton's C launch function, {argument position: its TMA descriptor metadata}) under
    ``run``, a compiled kernel's launcher (Triton 3.6 ``CudaLauncher``: its ``launch`` is the
    C function, or the ``inner`` wrapper of ``wrap_handle_tensordesc`` that encodes tensor
    descriptors on every call); None where it is not that shape (another Triton, scratch
    memory to allocate per launch): then the launcher is called as Triton calls it."""
    try:
        if run.global_scratch_size or run.profile_scratch_size:
            return None
        run.launch_cooperative_grid, run.launch_pdl  # noqa: B018 - both must exist
        wrapped = run.launch
    except AttributeError:
        return None
    code, closure = getattr(wrapped, "__code__", None), getattr(wrapped, "__closure__", None)
    if code is None:  # the C function itself: no descriptor arguments
        return (wrapped, {}) if callable(wrapped) else None
    if code.co_name != "inner" or closure is None:
        return None
    cells = dict(zip(code.co_freevars, (c.cell_contents for c in closure)))
    c_launch, where, meta = (cells.get(k) for k in ("launcher", "tensordesc_indices",
                                                    "tensordesc_meta"))
    if not callable(c_launch) or not isinstance(where, set) or not isinstance(meta, list) \
            or len(meta) != len(where) or any(m is None for m in meta):
        return None  # no per-descriptor metadata: the JIT passes descriptors decomposed
    return c_launch, dict(zip(sorted(where), meta))


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

    def get(self, desc) -> list:
        ptr = desc.base.data_ptr()
        hit = self.by_ptr.get(ptr)
        if hit is None:
            from triton.backends.nvidia import driver as nv

            if len(self.by_ptr) >= DESCRIPTOR_CACHE:
                self.by_ptr.clear()
            hit = self.by_ptr[ptr] = nv.make_tensordesc_arg(desc, self.meta)
        return hit


def _hooked(hook) -> bool:
    """Whether a Triton launch hook is installed (Triton 3.6 keeps an always-present chain
    of hooks, empty by default; older versions use None)."""
    return hook is not None and bool(getattr(hook, "calls", True))
