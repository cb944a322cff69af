"""evtfuse's fused GEMM as PyTorch operators: ``torch.ops.evtfuse.gemm`` and ``grouped_gemm``.

Layer: runtime.ops, the bottom of the operators: the schemas, the fake implementations and
the ``layout`` format are defined here; a Python call becomes an operator call in
``runtime.calls`` (``api.gemm``, ``Fused``, ``evtfuse.nn`` through it), and the eager
implementation (``run.run_values``), which runs kernels, is registered by ``runtime.run``,
layers above. Schema::

    evtfuse::gemm(Tensor A, Tensor B, str epilogue, str layout, Tensor?[] tensors,
                  Scalar[]? scalars, Tensor(a!)[] outs) -> ()

``epilogue`` is the epilogue's source text on one line (``wire``: line breaks, other control
characters and non-ASCII escaped as Python's ``unicode_escape`` does): the user's, parsed
once, or the name of a DAG evtfuse derived (``register``: a backward, a forward with what
its backward keeps), never parsed in the process that registered it. ``layout`` says how
to read the rest (which name each tensor, scalar and output has, where the source came
from, the call's options): both are plain strings, so torch.compile, torch.export and the
dispatcher see hashable data and never a Python function to trace. Every output is passed
in ``outs`` (``gemm`` allocates the missing ones before the call, in traceable torch
code), so the operator only mutates its declared outputs and returns nothing: Inductor may
fuse around it but never inside it. The fake (meta) implementation checks the call's
shapes and runs nothing. This operator has no autograd formula: ``evtfuse.gemm`` calls
its functional form, ``evtfuse::gemm_functional`` (``runtime.autograd``), when an input
requires grad, and ``Kernel.run``, which writes its outputs in place, refuses such inputs
(``check_no_grad``) rather than return results detached from the graph.

``evtfuse::grouped_gemm`` (``api.grouped_gemm``) is the same with ``Tensor offs`` after B
(a grouped GEMM: A (T, K), B (G, K, N) over M, or A (M, T), B (T, N) over K; offs (G,)
int32 cumulative group ends); its functional, differentiable form over M is
``evtfuse::grouped_gemm_functional`` (``runtime.grouped_autograd``), and ``grouped_gemm``
refuses inputs that require grad over K.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from ..dag_epilogue import DagEpilogue
from ..errors import EpilogueError, scalar_value
from ..frontend import EpilogueText, parse_epilogue

def constant_result(fn):
    """``torch.compiler.assume_constant_result(fn)`` without importing ``torch._dynamo`` at
    ``import evtfuse`` (it takes about a second and imports Triton, which must wait until
    the CPU interpreter may be switched on: ``runtime.device.use_interpreter``): the mark
    that function sets (a test checks they agree). Under torch.compile a call of ``fn``
    with constant arguments is run while tracing and its result kept as a constant."""
    fn._dynamo_marked_constant = True
    return fn


SCHEMA = ("gemm(Tensor A, Tensor B, str epilogue, str layout, Tensor?[] tensors, "
          "Scalar[]? scalars, Tensor(a!)[] outs) -> ()")
_lib = torch.library.Library("evtfuse", "DEF")
_lib.define(SCHEMA)


@dataclass(frozen=True)
class Layout:
    """How an ``evtfuse::gemm`` call's lists map to the epilogue's names, and its options.

    ``tensors``: names of the tensor operands (and outputs passed as None, not stored:
    ``nones``), in the order of the op's ``tensors`` list; ``scalars``: names of the
    runtime scalars; ``outs``: names of the stored outputs, in the order of ``outs``;
    ``line``/``where``: the epilogue's first line in its file and its name (for error
    messages); ``kernel``: a kernel to run (``Kernel.run``), or "" to let the tuner pick.
    The differentiable operator (``evtfuse::gemm_functional``, ``runtime.autograd``) also
    reads ``grad``: the inputs that require grad ("A", "B", operand names), and ``alloc``:
    the outputs it allocates itself, as ``name:dtype`` (``outs`` then names the outputs
    whose tensors it is given as templates of their shape and dtype), and ``backward``:
    "save" (the forward stores the accumulator its backward reads), "recompute" (the
    backward recomputes ``A @ B``) or "auto" (chosen by cost: ``grad_plan.backward_mode``).
    """

    tensors: tuple[str, ...]
    nones: tuple[str, ...]
    scalars: tuple[str, ...]
    outs: tuple[str, ...]
    line: int = 0
    where: str = ""
    from_function: bool = False
    tune: str = "fast"
    allow_tf32: bool = False
    fp8_fast_accum: bool = True
    cc: int = -1
    kernel: str = ""
    grad: tuple[str, ...] = ()
    alloc: tuple[str, ...] = ()
    backward: str = "auto"
    acc16: bool = False  # accumulator_type=torch.float16

    def text(self) -> str:
        """The layout as the op's ``layout`` string (names are identifiers: no separators)."""
        extra = ([f"g={','.join(self.grad)}"] if self.grad else []) + \
            ([f"a={','.join(self.alloc)}"] if self.alloc else []) + \
            ([f"bw={self.backward}"] if self.backward != "auto" else []) + \
            (["acc=f16"] if self.acc16 else [])
        return ";".join([
            "v1", "t=" + ",".join(self.tensors), "n=" + ",".join(self.nones),
            "s=" + ",".join(self.scalars), "o=" + ",".join(self.outs), f"line={self.line}",
            f"where={self.where}", f"fn={int(self.from_function)}", f"tune={self.tune}", f"tf32={int(self.allow_tf32)}",
            f"fp8fast={int(self.fp8_fast_accum)}", f"cc={self.cc}", f"kernel={self.kernel}",
            *extra])


BACKWARD_MODES = ("auto", "save", "recompute")  # the layout's ``backward``


def check_backward(choice) -> None:
    """The ``backward`` option: "auto", "save" or "recompute" (an ``EpilogueError`` else)."""
    if choice not in BACKWARD_MODES:
        raise EpilogueError(f'backward must be "auto", "save" or "recompute", not {choice!r}',
                            variable="backward")


@functools.lru_cache(maxsize=4096)
def parse_layout(text: str) -> Layout:
    """The ``Layout`` of a ``layout`` string (cached: a loop passes the same string)."""
    parts = text.split(";")
    if not parts or parts[0] != "v1":
        raise ValueError(f"evtfuse::gemm: unknown layout {text[:60]!r}")
    f = dict(p.split("=", 1) for p in parts[1:])
    names = lambda k: tuple(n for n in f[k].split(",") if n)  # noqa: E731
    return Layout(names("t"), names("n"), names("s"), names("o"), int(f["line"]), f["where"],
                  f["fn"] == "1", f["tune"], f["tf32"] == "1", f["fp8fast"] == "1", int(f["cc"]),
                  f["kernel"], names("g") if "g" in f else (), names("a") if "a" in f else (),
                  f.get("bw", "auto"), f.get("acc") == "f16")


# an operator call's parsed epilogue, keyed (source, first line, where): ``evtfuse.gemm``
# puts each epilogue it checks here (``calls.epilogue_of``), the runtime each DAG it derives
# (``register``), and the runtime reads them back
parsed_cache: dict[tuple, Any] = {}


def register(epilogue: DagEpilogue) -> str:
    """Make ``epilogue`` what an operator call of its ``text`` runs (with a layout of line
    0 and its ``where``); returns that text, the call's ``epilogue`` argument. A DAG of
    that text registered before stays (its text says everything that shapes its code):
    the launch plans cached for it serve this one too."""
    parsed_cache.setdefault((epilogue.text, 0, epilogue.where), epilogue)
    return epilogue.text


def parsed_of(source: str, lay: Layout):
    """The parsed epilogue of an operator call's source (parsed once per source), or the
    DAG registered under it (``register``). A text no call of this process registered or
    parsed (a compiled graph from another process's cache) is parsed here."""
    key = (source, lay.line, lay.where)
    parsed = parsed_cache.get(key)
    if parsed is None:
        parsed = parsed_cache[key] = parse_epilogue(
            EpilogueText(source, lay.line, lay.where, lay.from_function))
    return parsed


@constant_result  # a constant under torch.compile: not traced
def layout_text(tensors: tuple, nones: tuple, scalars: tuple, outs: tuple, line: int,
                where: str, from_function: bool, options: tuple, kernel: str = "",
                grad: tuple = (), alloc: tuple = (), backward: str = "auto",
                acc16: bool = False) -> str:
    """The ``layout`` string for these names and options (cached per call structure)."""
    key = (tensors, nones, scalars, outs, line, where, from_function, options, kernel, grad,
           alloc, backward, acc16)
    hit = _layouts.get(key)
    if hit is None:
        if len(_layouts) > 4096:
            _layouts.clear()
        hit = _layouts[key] = _layout_text(*key)
    return hit


_layouts: dict[tuple, str] = {}


def _layout_text(tensors, nones, scalars, outs, line, where, from_function, options, kernel,
                 grad, alloc, backward, acc16):
    tune, allow_tf32, fp8_fast_accum, cc = options
    if not isinstance(tune, str) or any(c in tune for c in ";=,"):
        raise ValueError(f"tune must be \"fast\", \"exhaustive\" or \"none\", not {tune!r}")
    return Layout(tensors, nones, scalars, outs, line, where, bool(from_function), tune,
                  bool(allow_tf32), bool(fp8_fast_accum), -1 if cc is None else int(cc),
                  kernel, tuple(grad), tuple(alloc), backward, bool(acc16)).text()



def scalar_arg(name: str, value) -> Any:
    """A runtime scalar as the operators' ``scalars`` carry it: a number as the float a
    kernel is given (``errors.scalar_value``: an int past the largest double is an error
    naming it); a symbolic int (torch.compile with ``dynamic=True``) as it is, so that a new
    value recompiles nothing (a float passed to an operator is specialized)."""
    if isinstance(value, (torch.SymInt, torch.SymFloat)):
        return value
    return scalar_value(name, value)


def scalars_arg(scalars: list) -> list | None:
    """The operators' ``Scalar[]? scalars`` argument: None for no scalar. torch.export's
    serializer (``torch.export.save``) cannot write an empty ``Scalar[]`` (every call without
    a Python-number operand: every ``evtfuse.nn.Linear``) nor a list mixing ints and floats
    (``scalar_arg`` makes them floats)."""
    return scalars if scalars else None


def values_of(layout: Layout, tensors: list, scalars: list, outs: list) -> dict[str, Any]:
    """The epilogue's operands and outputs by name, as ``EpilogueArguments`` takes them."""
    values: dict[str, Any] = dict(zip(layout.tensors, tensors))
    values.update(zip(layout.scalars, scalars or ()))
    values.update(zip(layout.outs, outs))
    for name in layout.nones:
        values[name] = None
    return values


def check_no_grad(A: torch.Tensor, B: torch.Tensor, named: dict[str, Any]) -> None:
    """``Kernel.run`` writes its arguments' outputs in place and records nothing for autograd:
    a call that would need a gradient (grad mode on, an input that requires grad) raises
    instead of silently returning results detached from the graph. (``evtfuse.gemm`` is
    differentiable: ``runtime.autograd``.)"""
    if not torch.is_grad_enabled():
        return
    needs = [n for n, v in (("A", A), ("B", B), *named.items())
             if isinstance(v, torch.Tensor) and v.requires_grad]
    if needs:
        raise NotImplementedError(
            f"Kernel.run: {', '.join(needs)} require{'s' if len(needs) == 1 else ''} grad, and "
            "Kernel.run writes its outputs in place without recording anything for autograd: "
            "its results would be detached from the graph. Call evtfuse.gemm (differentiable) "
            "instead, or run it under torch.no_grad() (inference), or detach the inputs.")


def check_outputs_writable(outs: list, onames: list, call: str, recorded: bool = False) -> None:
    """Under grad mode, every output evtfuse writes in place may be: not a leaf tensor that
    requires grad, nor a view of one (torch refuses in-place writes to those too: "a leaf
    Variable that requires grad is being used in an in-place operation"); and, unless the
    write is ``recorded`` by autograd (``gemm`` with an input that requires grad copies its
    results in with ``copy_``), not a tensor that requires grad at all (its gradient would
    flow to what it held before). An ``EpilogueError`` naming the output, before anything
    is written. Eager only: under torch.compile, AOTAutograd checks such writes itself."""
    if not torch.is_grad_enabled() or torch.compiler.is_compiling():
        return
    for name, o in zip(onames, outs):
        if not isinstance(o, torch.Tensor) or not o.requires_grad:
            continue
        base = o._base
        if o.is_leaf or (base is not None and base.is_leaf):
            what = "a leaf tensor" if o.is_leaf else "a view of a leaf tensor"
            raise EpilogueError(
                f"{call}: output {name} is {what} that requires grad, and evtfuse writes its "
                f"outputs in place, which torch refuses for such a tensor (\"a leaf Variable "
                f"that requires grad is being used in an in-place operation\"): pass a buffer "
                f"that does not require grad ({name}.detach(), or one made under "
                f"torch.no_grad()), or call under torch.no_grad()", variable=name)
        if not recorded:
            raise EpilogueError(
                f"{call}: output {name} requires grad (it is the result of a computation "
                f"autograd recorded) but this call writes it in place without recording "
                f"anything for autograd: its gradient would flow to what it held before. "
                f"Pass {name}.detach() or a fresh buffer, or call under torch.no_grad()",
                variable=name)


@constant_result  # a constant under torch.compile: not traced
def wire(source: str) -> str:
    """An epilogue's source as the operators carry it: one line, exactly reversible
    (``unwire``). Inductor copies an extern call's arguments into comments of the module it
    generates, where a line break of a string argument ends the comment and breaks the
    module (``IndentationError``, seen with torch 2.11 compiling a backward on a GPU).
    Kept per source: every call of a loop passes the same one."""
    hit = _wired.get(source)
    if hit is None:
        if len(_wired) > 4096:
            _wired.clear()
        hit = _wired[source] = source.encode("unicode_escape").decode("ascii")
    return hit


_wired: dict[str, str] = {}


@functools.lru_cache(maxsize=4096)
def unwire(text: str) -> str:
    """The source text of an operator's ``epilogue`` argument (``wire``'s inverse)."""
    return text.encode("ascii").decode("unicode_escape")


def check_devices(A, B, tnames, tensors, onames, outs, offs=None, call: str = "") -> None:
    """B, every tensor operand and output (and ``offs``) on A's device, else an
    ``EpilogueError`` naming it (``call``: the function to name first), before anything is
    allocated or written. In the fake implementations too: a real call with one ``meta``
    tensor among CPU or CUDA ones is dispatched to them (the Meta key wins), which compute
    nothing. A call whose tensors are all on one device (all ``meta`` included, as
    torch.compile traces) passes."""
    named = [("", "B", B), *(("operand ", n, t) for n, t in zip(tnames, tensors)),
             *(("output ", n, t) for n, t in zip(onames, outs))]
    if offs is not None:
        named.append(("", "offs", offs))
    for what, name, t in named:
        if t is not None and t.device != A.device:
            raise EpilogueError(f"{call + ': ' if call else ''}{what}{name} is on {t.device} "
                                f"but A is on {A.device}; B, every tensor operand and output "
                                "(and offs) must be on A's device", variable=name)


def _check_one_device(A, B, layout, tensors, outs, offs=None) -> None:
    """``check_devices`` of an operator call, its names read from its layout."""
    lay = parse_layout(layout)
    check_devices(A, B, lay.tensors, tensors, lay.outs, outs, offs)


def _fake(A, B, epilogue, layout, tensors, scalars, outs) -> None:
    """Runs nothing: checks what can be checked of the call's shapes (fake and meta
    tensors have no memory, so no overlap check), as the real call would refuse it."""
    _check_one_device(A, B, layout, tensors, outs)
    if A.dim() not in (2, 3) or B.dim() not in (2, 3):
        raise EpilogueError(f"A and B must be 2-D or 3-D (batched); got A {tuple(A.shape)}, "
                            f"B {tuple(B.shape)}")
    torch._check(A.shape[-1] == B.shape[-2],
                 lambda: f"A @ B: A is {tuple(A.shape)} and B is {tuple(B.shape)}")
    return None


torch.library.register_fake("evtfuse::gemm", _fake, lib=_lib)


GROUPED_SCHEMA = ("grouped_gemm(Tensor A, Tensor B, Tensor offs, str epilogue, str layout, "
                  "Tensor?[] tensors, Scalar[]? scalars, Tensor(a!)[] outs) -> ()")
_lib.define(GROUPED_SCHEMA)


def _grouped_fake(A, B, offs, epilogue, layout, tensors, scalars, outs) -> None:
    """``_fake`` for ``evtfuse::grouped_gemm``: groups over M, A (T, K), B (G, K, N); or
    over K, A (M, T), B (T, N); offs (G,)."""
    _check_one_device(A, B, layout, tensors, outs, offs)
    if A.dim() != 2 or B.dim() not in (2, 3) or offs.dim() != 1:
        raise EpilogueError(f"grouped_gemm: A must be (T, K) and B (G, K, N), or A (M, T) and "
                            f"B (T, N), and offs (G,); got A {tuple(A.shape)}, B "
                            f"{tuple(B.shape)}, offs {tuple(offs.shape)}")
    torch._check(A.shape[-1] == B.shape[-2],
                 lambda: f"A @ B: A is {tuple(A.shape)} and B is {tuple(B.shape)}")
    if B.dim() == 3:
        torch._check(offs.shape[0] == B.shape[0],
                     lambda: f"offs has {offs.shape[0]} groups but B has {B.shape[0]}")
    return None


torch.library.register_fake("evtfuse::grouped_gemm", _grouped_fake, lib=_lib)


def call_grouped(A: torch.Tensor, B: torch.Tensor, offs: torch.Tensor, source: str, layout: str,
                 tensors: list, scalars: list, outs: list) -> None:
    """``torch.ops.evtfuse.grouped_gemm``: ``call`` for a grouped GEMM (``offs``)."""
    torch.ops.evtfuse.grouped_gemm.default(A, B, offs, wire(source), layout, tensors,
                                           scalars_arg(scalars), outs)


def call(A: torch.Tensor, B: torch.Tensor, source: str, layout: str, tensors: list,
         scalars: list, outs: list) -> None:
    """``torch.ops.evtfuse.gemm`` of an epilogue's source text (``wire``d here)."""
    torch.ops.evtfuse.gemm.default(A, B, wire(source), layout, tensors, scalars_arg(scalars),
                                   outs)
