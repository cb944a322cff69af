"""Export an epilogue to other code bases: ``evtfuse.export.cutlass`` writes CUTLASS C++.

Layer: backends (the export, beside the Triton backend: parse -> bind to a description ->
passes -> emit; it never runs user text and never compiles anything). ``cutlass(epilogue,
...)`` takes the same checked, optimised DAG the Triton backend compiles and writes a
self-contained C++ header for CUTLASS 4.2 on SM90: the Sm90 epilogue visitor tree, its
``Arguments``, a ``GemmUniversal`` (TMA warp-specialised cooperative kernel) and
``run(...)`` on device pointers. What the Sm90 EVT cannot express is refused with
``ExportError`` (the reason, and the user's line). docs/export.md shows the whole path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from .. import ir
from .cutlass_emit import Config, c_entry, header
from .cutlass_tree import ELEMENTS, Choices, ExportError, Plan, build, element, walk
from .problem import Description, bind_description, describe

CUTLASS_VERSION = "4.2"  # the release whose headers the emitted code is written against


@dataclass(frozen=True)
class CutlassExport:
    """An exported epilogue: ``header`` (the C++ text; ``str()`` gives it too), the ``dag``
    it was written from, the ``plan`` (the EVT as data: ``walk(plan.root)`` lists its node
    ops in ``Arguments`` order) and ``name`` (its C++ namespace,
    ``evtfuse_export::<name>``)."""

    name: str
    header: str
    dag: ir.Dag
    plan: Plan
    config: Config
    description: Description

    def __str__(self) -> str:
        return self.header

    def c_entry(self, header_name: str) -> str:
        """A .cu source that includes the header (as ``header_name``) and defines
        ``extern "C" int evtfuse_<name>_run(M, N, K, A, B, <parameters>, <outputs>, stream)``
        over ``void*`` pointers and floats, returning ``int(cutlass::Status)`` (0: success):
        for ctypes, or any caller without the CUTLASS types."""
        return c_entry(self.plan, self.config, header_name)

    @property
    def parameters(self) -> tuple[tuple[str, str], ...]:
        """(name, C++ type) of ``run``'s parameters after M, N, K, A, B, in order (D last)."""
        d = self.plan.d_output.name
        ps = [(p.name, p.cpp_type) for p in self.plan.params if p.name != d]
        return tuple(ps) + ((d, next(p.cpp_type for p in self.plan.params if p.name == d)),)


def _elem(dtype_text: str, what: str) -> Any:
    dtype = ir.dtype_named(dtype_text) if isinstance(dtype_text, str) else dtype_text
    if dtype is None:
        raise ExportError(f"{what}: unknown dtype {dtype_text!r}; use f16, bf16 or f32",
                          variable=what)
    return dtype


def _triple(value, what: str) -> tuple[int, int, int]:
    try:
        t = tuple(int(v) for v in value)
    except (TypeError, ValueError):
        t = ()
    if len(t) != 3 or min(t) < 1:
        raise ExportError(f"{what} takes three positive integers (M, N, K), got {value!r}",
                          variable=what)
    return t  # type: ignore[return-value]


def cutlass(epilogue: Any, *, operands: Mapping[str, str] | None = None,
            outputs: Mapping[str, str] | None = None, ab_dtype: str = "f16",
            c_dtype: str | None = None, d_dtype: str | None = None,
            accumulator: str = "f32", compute: str = "f32",
            tile: tuple[int, int, int] = (128, 128, 64), cluster: tuple[int, int, int] = (1, 1, 1),
            a_major: str = "k", b_major: str = "n", name: str | None = None) -> CutlassExport:
    """Export ``epilogue`` (a function, its source text, or ``path``-less one-liner) as a
    CUTLASS 4.2 C++ header for SM90.

    ``operands``/``outputs``: each parameter's and output's kind, ``"KIND[:DTYPE]"`` -
    parameters ``runtime`` (a float argument), ``scalar`` (one value in device memory),
    ``row`` ((M, 1): per row), ``col`` ((N,): per column), ``full`` ((M, N)); outputs
    ``full``, ``row``/``col``/``scalar`` (reductions), ``none`` (not stored). Defaults as
    ``evtfuse run``'s: ``alpha``/``beta`` runtime, ``bias`` col, others full; outputs full.
    ``ab_dtype`` (A and B), ``c_dtype`` (full operands, default ab), ``d_dtype`` (full
    outputs, default c): f16, bf16 or f32. ``accumulator`` and ``compute``: f32 (the only
    ones exported). ``tile``: the CTA tile (M >= 128: the cooperative kernel splits it over
    two warp groups), ``cluster``: the cluster shape. ``a_major``: ``k`` (A row-major) or
    ``m``; ``b_major``: ``n`` (B (K, N) row-major, as evtfuse.gemm takes it) or ``k``.
    ``name``: the C++ namespace (default: the epilogue function's name).

    Raises ``ExportError`` (an ``EpilogueError``) for what cannot be expressed, naming the
    reason and the line."""
    ab = _elem(ab_dtype, "ab_dtype")
    c = _elem(c_dtype, "c_dtype") if c_dtype else ab
    d = _elem(d_dtype, "d_dtype") if d_dtype else c
    for what, dt in (("ab_dtype", ab), ("c_dtype", c), ("d_dtype", d)):
        element(dt, what)
    for what, text in (("accumulator", accumulator), ("compute", compute)):
        if _elem(text, what) != ELEMENTS_F32:
            raise ExportError(f"{what}={text!r}: an export accumulates and computes in f32 "
                              "only", variable=what)
    tile_t, cluster_t = _triple(tile, "tile"), _triple(cluster, "cluster")
    if tile_t[0] < 128 or tile_t[0] % 64 or tile_t[1] % 16 or tile_t[2] % 16:
        raise ExportError(f"tile={tile_t}: the cooperative SM90 kernel needs a tile M that is "
                          "a multiple of 64 and at least 128, N and K multiples of 16",
                          variable="tile")
    if a_major not in ("k", "m") or b_major not in ("n", "k"):
        raise ExportError(f"a_major is k or m, b_major n or k; got {a_major!r}, {b_major!r}",
                          variable="a_major" if a_major not in ("k", "m") else "b_major")
    if ab == ELEMENTS_F32:
        raise ExportError("ab_dtype=f32: SM90 tensor cores take f32 A and B as tf32, which "
                          "evtfuse.gemm does not; export f16 or bf16 A and B",
                          variable="ab_dtype")

    parsed, desc, dag = bind_description(
        epilogue, lambda p: describe(p, operands, outputs, c, d))
    ns = name or parsed.name
    if not ns.isidentifier() or not ns.isascii() or ns in CPP_KEYWORDS:
        raise ExportError(f"name {ns!r} is not a C++ identifier (the header's namespace)",
                          variable="name")
    _check_names(parsed)
    plan = build(dag, Choices(element_c=None, element_d=ELEMENTS[d]), parsed)
    c_op = plan.c_operand
    d_out = plan.d_output
    cfg = Config(ns, ELEMENTS[ab], ELEMENTS[c_op.dtype] if c_op else None, ELEMENTS[d_out.dtype],
                 a_major == "k", b_major == "n", tile_t, cluster_t)
    preamble = [f"Generated by evtfuse.export.cutlass for CUTLASS "
                f"{CUTLASS_VERSION}, SM90 (compile with -arch=sm_90a). Do not edit: export again.",
                "", "The epilogue:"]
    preamble += ["  " + ln for ln in parsed.source_lines if ln.strip()]
    preamble += ["", "Its DAG after evtfuse's passes (what the tree below computes):"]
    preamble += ["  " + ln for ln in ir.format_dag(dag).split("\n")]
    preamble += [""]
    text = header(plan, cfg, preamble)
    return CutlassExport(ns, text, dag, plan, cfg, desc)


# names the generated C++ declares (at namespace or function scope) and C++'s keywords:
# an epilogue parameter or output becomes a C++ parameter of the same name, so it may be
# none of these (nor start like the generated aliases and strides)
GENERATED_NAMES = frozenset("""
    M N K A B stream fusion args gemm status workspace workspace_size
    ElementA ElementB ElementC ElementD ElementAccumulator ElementCompute LayoutA LayoutB
    LayoutC LayoutD AlignmentA AlignmentB AlignmentC AlignmentD TileShape ClusterShape
    KernelSchedule EpilogueSchedule EpilogueTileType EpilogueDescriptor EVT
    CollectiveEpilogue CollectiveMainloop GemmKernel Gemm StrideA StrideB StrideC StrideD
    make_arguments run cutlass cute std evtfuse_export ns""".split())
GENERATED_PREFIXES = ("stride_", "AuxLoad", "AuxStore", "Evtfuse")
CPP_KEYWORDS = frozenset("""
    alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t
    char16_t char32_t class compl concept const consteval constexpr constinit const_cast
    continue co_await co_return co_yield decltype default delete do double dynamic_cast
    else enum explicit export extern false float for friend goto if inline int long mutable
    namespace new noexcept not not_eq nullptr operator or or_eq private protected public
    register reinterpret_cast requires return short signed sizeof static static_assert
    static_cast struct switch template this thread_local throw true try typedef typeid
    typename union unsigned using virtual void volatile wchar_t while xor xor_eq""".split())


def _check_names(parsed) -> None:
    for name in (*parsed.params, *parsed.outputs):
        clash = (name in GENERATED_NAMES or name in CPP_KEYWORDS or not name.isascii()
                 or name.startswith(GENERATED_PREFIXES))
        if clash:
            raise ExportError(f"cannot export to CUTLASS: '{name}' is a C++ keyword or a name "
                              "the generated C++ uses (M, N, K, A, B, stream, Gemm, EVT, "
                              "stride_..., ...); rename it in the epilogue", variable=name)


ELEMENTS_F32 = next(k for k, v in ELEMENTS.items() if v == "float")

__all__ = ["cutlass", "CutlassExport", "ExportError", "CUTLASS_VERSION", "walk"]
