"""The C++ text of an export: a self-contained header for CUTLASS 4.2 (Sm90).

Layer: export. Writes a ``cutlass_tree.Plan`` out: the element types, the functors evtfuse
emits, the ``using`` declarations of the aux load/store nodes, the EVT type (nested as the
tree is, each node op commented with the DAG node it computes), a ``GemmUniversal`` built
with the ``CollectiveBuilder`` (``KernelTmaWarpSpecializedCooperative`` and the matching
``TmaWarpSpecializedCooperative`` epilogue), ``make_arguments`` (the EVT's ``Arguments``,
children before each op, as CUTLASS reads them) and ``run``, which runs the GEMM on device
pointers. ``c_entry`` adds an ``extern "C"`` function over ``void*`` for ctypes & co.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import functors
from .cutlass_tree import FUSION, Leaf, Plan, Tree, Visitor


@dataclass(frozen=True)
class Config:
    """The GEMM around the epilogue: element types and layouts of A, B, C, D, the tile."""

    name: str
    element_ab: str
    element_c: str | None
    element_d: str
    a_row_major: bool  # A (M, K) with K contiguous
    b_row_major: bool  # B (K, N) with N contiguous
    tile: tuple[int, int, int]
    cluster: tuple[int, int, int]


def _type(v: Visitor, ind: str) -> list[str]:
    """``v``'s C++ type, one node op per line, each with its comment."""
    if isinstance(v, Leaf):
        return [f"{ind}{v.alias or v.cpp}" + (f"  // {v.comment}" if v.comment else "")]
    if isinstance(v, Tree):
        lines = [f"{ind}{FUSION}Sm90EVT<"]
        lines += _type(v.op, ind + "  ")
        for c in v.children:
            lines += _type(c, ind + "  ")
        lines.append(f"{ind}>")
        return _commas(lines)
    seqs = ", ".join(f"cute::seq<{', '.join(map(str, e))}>" for e in v.edges)
    lines = [f"{ind}{FUSION}Sm90TopologicalVisitor<", f"{ind}  float,",
             f"{ind}  cute::tuple<{seqs}>,"]
    body: list[str] = []
    for k, o in enumerate(v.ops):
        body += [f"{ind}  // op {k}"] + _type(o, ind + "  ")
    lines += body
    lines.append(f"{ind}>")
    return _commas(lines)


def _commas(lines: list[str]) -> list[str]:
    """Put the commas between the sibling items of one template argument list: after each
    item's last line but the last item's (an item's lines are indented deeper)."""
    head, tail = lines[0], lines[-1]
    inner = lines[1:-1]
    depth = len(head) - len(head.lstrip()) + 2
    starts = [k for k, ln in enumerate(inner)
              if len(ln) - len(ln.lstrip()) == depth and not ln.strip().startswith("//")
              and not ln.strip().startswith(">")]
    ends = []
    for j, s in enumerate(starts):
        nxt = starts[j + 1] if j + 1 < len(starts) else len(inner)
        e = nxt - 1
        while e > s and inner[e].strip().startswith("// op"):
            e -= 1
        ends.append(e)
    out = list(inner)
    for e in ends[:-1]:
        ln = out[e]
        if ln.rstrip().endswith(","):
            continue
        code, sep, comment = ln.partition("  //")
        out[e] = code.rstrip() + "," + (f"  //{comment}" if sep else "")
    return [head] + out + [tail]


def _args(v: Visitor, ind: str) -> list[str]:
    """``v``'s ``Arguments`` initialiser: a tree's children, then its op; a topological
    visitor's ops in order; a leaf's own."""
    if isinstance(v, Leaf):
        return [f"{ind}{v.args}  // {v.role}"]
    items = ([*v.children, v.op] if isinstance(v, Tree) else v.ops)
    what = f"Sm90EVT: {v.op.role}" if isinstance(v, Tree) else "Sm90TopologicalVisitor"
    lines = [f"{ind}{{  // {what}"]
    for k, c in enumerate(items):
        sub = _args(c, ind + "  ")
        if k < len(items) - 1:
            last = sub[-1]
            code, sep, comment = last.partition("  //")
            sub[-1] = code + "," + (f"  //{comment}" if sep else "")
        lines += sub
    lines.append(f"{ind}}}")
    return lines


def header(plan: Plan, cfg: Config, preamble: list[str]) -> str:
    """The whole header: the includes and element types, the EVT, the GEMM built around it,
    ``make_arguments`` and ``run``."""
    sig = _signature(plan)
    lines = [f"// {ln}" if ln else "//" for ln in preamble]
    lines += _INCLUDES
    lines += [
        "namespace evtfuse_export {",
        f"namespace {cfg.name} {{",
        "",
    ]
    lines += _types(cfg)
    lines += _evt(plan)
    lines += _GEMM
    lines += _make_arguments(plan, sig)
    lines += _run(plan, sig)
    lines += [
        f"}}  // namespace {cfg.name}",
        "}  // namespace evtfuse_export",
        "",
    ]
    return "\n".join(lines)


_INCLUDES = (
    "#pragma once",
    "",
    "#include <cuda_runtime.h>",
    "",
    '#include "cutlass/cutlass.h"',
    '#include "cute/tensor.hpp"',
    '#include "cutlass/numeric_types.h"',
    '#include "cutlass/epilogue/thread/activation.h"',
    '#include "cutlass/epilogue/collective/collective_builder.hpp"',
    '#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"',
    '#include "cutlass/gemm/collective/collective_builder.hpp"',
    '#include "cutlass/gemm/device/gemm_universal_adapter.h"',
    '#include "cutlass/gemm/kernel/gemm_universal.hpp"',
    '#include "cutlass/util/packed_stride.hpp"',
    "",
)


def _types(cfg: Config) -> list[str]:
    """The element types, layouts, alignments, tile and schedules of ``cfg``."""
    el_c = cfg.element_c or "void"
    return [
        f"using ElementA = {cfg.element_ab};",
        f"using ElementB = {cfg.element_ab};",
        f"using ElementC = {el_c};" + ("  // no source tensor: C is not loaded"
                                      if cfg.element_c is None else ""),
        f"using ElementD = {cfg.element_d};",
        "using ElementAccumulator = float;",
        "using ElementCompute = float;",
        f"using LayoutA = cutlass::layout::{'RowMajor' if cfg.a_row_major else 'ColumnMajor'};"
        f"  // A: (M, K), {'K' if cfg.a_row_major else 'M'} contiguous",
        f"using LayoutB = cutlass::layout::{'RowMajor' if cfg.b_row_major else 'ColumnMajor'};"
        f"  // B: (K, N), {'N' if cfg.b_row_major else 'K'} contiguous",
        "using LayoutC = cutlass::layout::RowMajor;",
        "using LayoutD = cutlass::layout::RowMajor;",
        "constexpr int AlignmentA = 128 / cutlass::sizeof_bits<ElementA>::value;",
        "constexpr int AlignmentB = 128 / cutlass::sizeof_bits<ElementB>::value;",
        "constexpr int AlignmentD = 128 / cutlass::sizeof_bits<ElementD>::value;",
        ("constexpr int AlignmentC = 128 / cutlass::sizeof_bits<ElementC>::value;"
         if cfg.element_c else "constexpr int AlignmentC = AlignmentD;"),
        "",
        "using TileShape = cute::Shape<" + ", ".join(f"cute::_{t}" for t in cfg.tile) + ">;",
        "using ClusterShape = cute::Shape<" + ", ".join(f"cute::_{t}" for t in cfg.cluster)
        + ">;",
        "using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;",
        "using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;",
        "using EpilogueTileType = cutlass::epilogue::collective::EpilogueTileAuto;",
        "// what the aux load/store nodes' template arguments are derived from",
        "using EpilogueDescriptor = cutlass::epilogue::collective::detail::EpilogueDescriptor<",
        "    TileShape, EpilogueTileType, ElementC, ElementD, EpilogueSchedule>;",
        "",
    ]


def _evt(plan: Plan) -> list[str]:
    """The functors the plan uses, its aux nodes' declarations and the ``EVT`` type."""
    lines: list[str] = []
    for name in plan.functors:
        lines += functors.definition(name).rstrip("\n").split("\n") + [""]
    for decl in plan.aliases:
        lines += decl.split("\n") + [""]
    lines.append("// the epilogue visitor tree: its root's value is D")
    tree = _type(plan.root, "")
    tree[0] = "using EVT = " + tree[0]
    tree[-1] += ";"
    return lines + tree


_GEMM = (
    "",
    "using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<",
    "    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,",
    "    TileShape, ClusterShape, EpilogueTileType,",
    "    ElementAccumulator, ElementCompute,",
    "    ElementC, LayoutC, AlignmentC,",
    "    ElementD, LayoutD, AlignmentD,",
    "    EpilogueSchedule, EVT>::CollectiveOp;",
    "",
    "using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<",
    "    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,",
    "    ElementA, LayoutA, AlignmentA,",
    "    ElementB, LayoutB, AlignmentB,",
    "    ElementAccumulator, TileShape, ClusterShape,",
    "    cutlass::gemm::collective::StageCountAutoCarveout<",
    "        static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,",
    "    KernelSchedule>::CollectiveOp;",
    "",
    "using GemmKernel = cutlass::gemm::kernel::GemmUniversal<",
    "    cute::Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue>;",
    "using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;",
    "",
)


def _signature(plan: Plan) -> str:
    """The host functions' parameters: the problem, A, B, the epilogue's operands, D."""
    params = [f"{p.cpp_type} {p.name}" for p in plan.params if p.name != plan.d_output.name]
    return ", ".join(["int M", "int N", "int K", "ElementA const* A", "ElementB const* B",
                      *params, f"ElementD* {plan.d_output.name}"])


def _make_arguments(plan: Plan, sig: str) -> list[str]:
    """``make_arguments``: the strides, the EVT's ``Arguments`` and the GEMM's."""
    d = plan.d_output.name
    c = plan.c_operand.name if plan.c_operand else None
    lines = ["// the epilogue's parameters and outputs, in the order the epilogue names them:"]
    for p in plan.params:
        lines.append(f"//   {p.name}: {p.what}")
    lines += [
        f"inline typename Gemm::Arguments make_arguments({sig}) {{",
        "  using StrideA = typename Gemm::GemmKernel::StrideA;",
        "  using StrideB = typename Gemm::GemmKernel::StrideB;",
        "  using StrideC = typename Gemm::GemmKernel::StrideC;",
        "  using StrideD = typename Gemm::GemmKernel::StrideD;",
        "  auto stride_A = cutlass::make_cute_packed_stride(StrideA{}, cute::make_shape(M, K, 1));",
        "  auto stride_B = cutlass::make_cute_packed_stride(StrideB{}, cute::make_shape(N, K, 1));",
        "  auto stride_C = cutlass::make_cute_packed_stride(StrideC{}, cute::make_shape(M, N, 1));",
        "  auto stride_D = cutlass::make_cute_packed_stride(StrideD{}, cute::make_shape(M, N, 1));",
    ]
    for var, st in plan.strides:
        lines.append(f"  auto {var} = cutlass::make_cute_packed_stride({st}{{}}, "
                     "cute::make_shape(M, N, 1));")
    lines.append("  typename EVT::Arguments fusion =")
    fa = _args(plan.root, "    ")
    fa[-1] += ";"
    lines += fa
    lines += [
        "  return typename Gemm::Arguments{",
        "      cutlass::gemm::GemmUniversalMode::kGemm,",
        "      {M, N, K, 1},",
        "      {A, stride_A, B, stride_B},",
        f"      {{fusion, {c if c else 'nullptr'}, stride_C, {d}, stride_D}}}};",
        "}",
        "",
    ]
    return lines


def _run(plan: Plan, sig: str) -> list[str]:
    """``run``: the GEMM on device pointers, its workspace allocated and freed around it."""
    d = plan.d_output.name
    return [
        "// Runs D = epilogue(A @ B, ...) on device pointers (row-major (M, N) tensors, the",
        "// vectors and scalars as the comment above says); the workspace (reductions' partial",
        "// results) is allocated and freed here. Returns kSuccess or the first failure.",
        f"inline cutlass::Status run({sig}, cudaStream_t stream = nullptr) {{",
        "  typename Gemm::Arguments args = make_arguments(" + ", ".join(
            ["M", "N", "K", "A", "B", *[p.name for p in plan.params if p.name != d], d]) + ");",
        "  Gemm gemm;",
        "  cutlass::Status status = gemm.can_implement(args);",
        "  if (status != cutlass::Status::kSuccess) return status;",
        "  size_t workspace_size = Gemm::get_workspace_size(args);",
        "  void* workspace = nullptr;",
        "  if (workspace_size > 0 && cudaMalloc(&workspace, workspace_size) != cudaSuccess) {",
        "    return cutlass::Status::kErrorWorkspaceNull;",
        "  }",
        "  status = gemm.initialize(args, workspace, stream);",
        "  if (status == cutlass::Status::kSuccess) status = gemm.run(stream);",
        "  if (workspace != nullptr) {",
        "    cudaStreamSynchronize(stream);",
        "    cudaFree(workspace);",
        "  }",
        "  return status;",
        "}",
        "",
    ]


def c_entry(plan: Plan, cfg: Config, header_name: str) -> str:
    """A .cu file that includes the header and exports ``evtfuse_<name>_run`` with C linkage
    over ``void*`` pointers and floats (for ctypes): it returns ``int(cutlass::Status)``."""
    d = plan.d_output.name
    ps = [p for p in plan.params if p.name != d]
    sig = ["int M", "int N", "int K", "void const* A", "void const* B"]
    call = ["M", "N", "K", "static_cast<ns::ElementA const*>(A)",
            "static_cast<ns::ElementB const*>(B)"]
    for p in ps:
        if p.cpp_type == "float":
            sig.append(f"float {p.name}")
            call.append(p.name)
        else:
            const = "const" in p.cpp_type
            sig.append(f"void{' const' if const else ''}* {p.name}")
            call.append(f"static_cast<{p.cpp_type}>({p.name})")
    sig.append(f"void* {d}")
    call.append(f"static_cast<ns::ElementD*>({d})")
    sig.append("void* stream")
    call.append("static_cast<cudaStream_t>(stream)")
    return "\n".join([
        f'#include "{header_name}"',
        "",
        f"namespace ns = evtfuse_export::{cfg.name};",
        "",
        f'extern "C" int evtfuse_{cfg.name}_run({", ".join(sig)}) {{',
        f"  return static_cast<int>(ns::run({', '.join(call)}));",
        "}",
        "",
    ])


__all__ = ["Config", "header", "c_entry"]
