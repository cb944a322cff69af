"""The operators' eager implementation: ``run_values`` runs ``torch.ops.evtfuse.gemm`` (and
``run_grouped_values`` ``grouped_gemm``), registered here as their implementation.

Layer: runtime.run, above the tuner (``tuner.launch_plan``: the kernel and its launch plan
for a call structure) and below the autograd formulas, which run their forwards through
``run_values`` too (``runtime.autograd``, ``runtime.grouped_autograd``). Invariant: the
cached paths serve a call only after the memory checks of ``GemmArguments`` hold for the
call's tensors as they are now (``memory.tensor_state``): the same tensors as the last
call of its epilogue, unchanged (``_last_call``); or a structure validated before
(``_fast``: dtypes, shapes, strides, alignment, aliasing), whose outputs meet no other
tensor at their new addresses; else the call is validated from scratch
(``GemmArguments``), and raises what the first call would.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch

from ..arguments import OFFS_KEY, EpilogueArguments, GemmArguments
from ..errors import UnsupportedError
from ..memory import byte_span, tensor_state
from .calls import accumulator_dtype
from .device import device_guard
from .discovery import explain, get_kernels
from .torch_op import Layout, _lib, parse_layout, parsed_of, unwire, values_of
from .tuner import launch_plan


def run_values(A: torch.Tensor, B: torch.Tensor, source: str, lay: Layout,
               values: dict[str, Any]) -> None:
    """The eager implementation of ``torch.ops.evtfuse.gemm``: every output of the
    epilogue ``source`` in place, for ``values`` (every operand and output by name), on
    the tensors' device (and that device's current stream), whichever is current."""
    _on_device(A, _run_values, A, B, source, lay, values)


def run_grouped_values(A: torch.Tensor, B: torch.Tensor, offs: torch.Tensor, source: str,
                       lay: Layout, values: dict[str, Any]) -> None:
    """The eager implementation of ``torch.ops.evtfuse.grouped_gemm``: ``run_values`` with
    ``offs`` (the same cached paths: its structure and address are part of what they
    check), one launch of the chosen kernel's plan, no host synchronisation."""
    _on_device(A, _run_values, A, B, source, lay, values, offs)


def _on_device(A: torch.Tensor, run: Callable, *args) -> None:
    """``run(*args)`` with A's device current (``device_guard``; none where it is already)."""
    guard = device_guard(A)
    if guard is None:
        run(*args)
        return
    with guard:
        run(*args)


def _run_values(A, B, source: str, lay: Layout, values: dict[str, Any], offs=None) -> None:
    """``run_values``; with ``offs``, a grouped GEMM's (``run_grouped_values``): its launch
    values carry offs under ``OFFS_KEY``, so that every cached path keys on it and checks
    it as it checks the epilogue's tensors (structure, address, in-place changes, overlap
    with an output)."""
    key = (source, lay.line, lay.where)
    cc = None if lay.cc < 0 else lay.cc
    options = (lay.tune, lay.allow_tf32, lay.fp8_fast_accum, cc, lay.acc16)
    launch = values if offs is None else {**values, OFFS_KEY: offs}
    last = _last_call.get(key)
    if last is not None and last.options == options and A is last.A() and B is last.B() \
            and _same_objects(launch, last.given) \
            and [tensor_state(t()) for t in last.tensors] == last.state:
        # the same tensors as the last call with this epilogue, none of them changed in
        # place since (address, shape, strides, storage): launch at once
        last.plan(A, B, launch)
        return
    parsed = parsed_of(source, lay)
    if lay.kernel:  # (no grouped call names its kernel)
        _run_named(A, B, parsed, lay, values)
        return
    call_key, tensors, state = _call_key(A, B, launch)
    fast_key = (id(parsed), options, call_key)
    hit = _fast.get(fast_key)
    if hit is not None and hit.parsed is parsed and hit.disjoint(state):
        _last_call[key] = _LastCall(options, A, B, launch, hit.plan, tensors, state)
        hit.plan(A, B, launch)
        return
    # first call of this structure, or tensors that now overlap: validate everything
    # bound by GemmArguments, to the problem A and B make (not guessed from D's shape: a D
    # of the wrong shape is named as such; per-group operands of a grouped GEMM bind too)
    epi = EpilogueArguments.unbound(parsed, **values)
    args = GemmArguments(A, B, values.get("D"), accumulator_dtype(A, lay), epi,
                         allow_tf32=lay.allow_tf32, fp8_fast_accum=lay.fp8_fast_accum, offs=offs)
    plan = launch_plan(args, tune=lay.tune, cc=cc)  # tune="background": a SwitchingPlan
    plan(A, B, launch)
    if len(_fast) > 1024:
        _fast.clear()
    names = ["A", "B", *(n for n, v in launch.items() if isinstance(v, torch.Tensor))]
    _fast[fast_key] = _Structure(parsed, plan, _overlap_pairs(names, tensors, parsed.outputs))


def _run_named(A, B, parsed, lay: Layout, values: dict) -> None:
    """The operator's implementation for a call naming its kernel (``Kernel.run`` under
    torch.compile)."""
    args = GemmArguments(A, B, values.get("D"), accumulator_dtype(A, lay),
                         EpilogueArguments.unbound(parsed, **values), allow_tf32=lay.allow_tf32,
                         fp8_fast_accum=lay.fp8_fast_accum)
    for k in get_kernels(args, None if lay.cc < 0 else lay.cc):
        if k.name == lay.kernel:
            k.run(args)
            return
    raise UnsupportedError(f"kernel {lay.kernel} does not support these arguments:\n"
                           f"{explain(args)}")


_fast: dict[tuple, "_Structure"] = {}


# per epilogue, the last call's objects: a loop passing the same tensors again skips even
# the structure key (it keeps those tensors alive until the next call)
_last_call: dict[Any, "_LastCall"] = {}


class _Structure:
    """A validated call structure's plan and the memory checks a later call of the structure repeats: the byte spans of each given
    output and each other tensor at another address (``pairs``: positions in the call's
    tensors and their spans, fixed by the structure's shapes, strides and dtypes)."""

    __slots__ = ("parsed", "plan", "pairs")

    def __init__(self, parsed, plan, pairs: tuple):
        self.parsed, self.plan, self.pairs = parsed, plan, pairs

    def disjoint(self, state: list) -> bool:
        """Whether the call's tensors (their ``tensor_state``) pass ``GemmArguments``'s
        overlap checks as the structure's first call did: no given output meets another
        tensor (same-address pairs are part of the structure, checked when it was first
        seen). Else the call is validated from scratch, which says what overlaps."""
        for i, j, si, sj in self.pairs:  # memory.ranges_meet, inline: spans are nonzero here
            a, b = state[i][0], state[j][0]  # the addresses (``tensor_state``'s first)
            if a < b + sj and b < a + si:
                return False
        return True


def _overlap_pairs(names: list[str], tensors: list, outputs: tuple) -> tuple:
    """``_Structure.pairs`` for a validated call: each given output against every other
    tensor at another address (A and B first, then the keywords' tensors, as ``_call_key``
    lists them), with their byte spans; an empty tensor meets nothing."""
    spans = [byte_span(t) for t in tensors]
    ptrs = [t.data_ptr() for t in tensors]
    pairs = []
    for i, n in enumerate(names):
        if n not in outputs or not spans[i]:
            continue
        for j in range(len(tensors)):
            if j != i and spans[j] and ptrs[j] != ptrs[i] and (j > i or names[j] not in outputs):
                pairs.append((i, j, spans[i], spans[j]))
    return tuple(pairs)


class _LastCall:
    """The last call of an epilogue: its options and plan, weak references to its tensors
    (evtfuse keeps no tensor of a call alive: a CUDA graph pool's tensors must die with
    the graph) and the state of those tensors."""

    __slots__ = ("options", "A", "B", "given", "plan", "tensors", "state")

    def __init__(self, options, A, B, given, plan, tensors, state):
        self.options, self.A, self.B, self.plan = options, weakref.ref(A), weakref.ref(B), plan
        self.given = {n: weakref.ref(v) if isinstance(v, torch.Tensor) else v
                      for n, v in given.items()}
        self.tensors, self.state = [weakref.ref(t) for t in tensors], state


def _call_key(A: torch.Tensor, B: torch.Tensor, named: dict) -> tuple[tuple, list, list]:
    """What a cached launch plan depends on in a call's tensors and values, in one pass:
    each tensor's ``kernel.tensor_key`` (dtype, shape, strides, 16-byte alignment, device)
    and which tensors share an address (numbered by first appearance), each other value
    as None or "scalar" (``kernel.value_key``); with the call's tensors and their
    ``tensor_state`` (address, shape, strides, storage size), for the memory checks. Per
    call with new tensors, so kept lean (host time per ``gemm`` call, benchmarks/HISTORY.md
    thirteenth session)."""
    seen: dict[int, int] = {}
    parts = []
    tensors = []
    state = []
    for n, v in (("A", A), ("B", B), *named.items()):  # no keyword can be named A or B
        if isinstance(v, torch.Tensor):
            st = tensor_state(v)
            p, shape, strides, _storage = st
            parts.append((n, v.dtype, shape, strides, not p & 15, v.device,
                          seen.setdefault(p, len(seen))))
            tensors.append(v)
            state.append(st)
        else:
            parts.append((n, None if v is None else "scalar"))
    return tuple(parts), tensors, state


def _same_objects(now: dict, before: dict) -> bool:
    """Whether ``now`` passes the same tensors (and None values) as ``before`` (tensors
    held as weak references), scalars free to differ."""
    if now.keys() != before.keys():
        return False
    for name, v in now.items():
        w = before[name]
        if type(w) is weakref.ref:
            if v is not w():
                return False  # another tensor (or the last one is gone)
            continue
        if v is w:
            continue
        if isinstance(v, (torch.Tensor, torch.dtype)) or isinstance(w, torch.dtype) \
                or v is None or w is None:
            return False  # another tensor, dtype or None: check the structure
    return True


def _impl(A, B, epilogue, layout, tensors, scalars, outs) -> None:
    lay = parse_layout(layout)
    run_values(A, B, unwire(epilogue), lay, values_of(lay, tensors, scalars, outs))


def _grouped_impl(A, B, offs, epilogue, layout, tensors, scalars, outs) -> None:
    lay = parse_layout(layout)
    run_grouped_values(A, B, offs, unwire(epilogue), lay, values_of(lay, tensors, scalars, outs))


_lib.impl("gemm", _impl, "CompositeExplicitAutograd")
_lib.impl("grouped_gemm", _grouped_impl, "CompositeExplicitAutograd")

__all__ = ["run_values", "run_grouped_values"]
