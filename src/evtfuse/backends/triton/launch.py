"""Launching a compiled Triton kernel again without the JIT's per-call work.

Layer: backends/triton. Used by the runtime's launch plans (``runtime.kernel.LaunchPlan``)
and by the combine step after a kernel (``families``).
"""

from __future__ import annotations


def direct_launcher(compiled, jit_fn, grid: tuple, n_positional: int, consts: dict):
    """``launch(positional) -> bool`` calling Triton's compiled launcher without the JIT's
    per-call binding, specialisation and cache lookup (~20 us of host time per launch), as
    ``fn[grid]`` itself ends up calling it. Returns False (the caller then takes the JIT
    path) while a Triton launch hook is installed (profilers need the JIT's metadata).
    Under the CPU interpreter there is no compiled kernel: every launch goes through the
    JIT (returns a launcher that always says False)."""
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

    def launch(pos) -> bool:
        if _hooked(runtime.launch_enter_hook) or _hooked(runtime.launch_exit_hook):
            return False
        run(g0, g1, g2, get_stream(get_device()), function, metadata, None, None, None,
            *pos, *tail)
        return True

    return launch


def _hooked(hook) -> bool:
    """Whether a Triton launch hook is installed (Triton 3.6 keeps an always-present chain
    of hooks, empty by default; older versions use None)."""
    return hook is not None and bool(getattr(hook, "calls", True))
