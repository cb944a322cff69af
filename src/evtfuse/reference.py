"""Reference evaluator: computes every output of an epilogue DAG eagerly with torch.

Layer: reference. The oracle of every kernel test and of ``Kernel.verify``: it reads
the same DAG the backends read and the same op table, on any device. Values are held
as (L|1, M|1, N|1) tensors in ``compute_dtype`` (fp32 by default, as the kernels
compute; float64 for high-precision checks) and broadcast as NumPy does.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from .errors import scalar_value
from .ir import Dag, Node, NodeKind, OperandKind, OutputKind, Space, reduces_shared
from .optable import OPS, Category, round_to, torch_apply


def accumulator(args, compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``A @ B`` of ``GemmArguments`` as the reference takes it: in ``compute_dtype``, or in
    float64 for integer inputs (their products are exact there up to 2**53). With
    ``accumulator_type=torch.float16`` the kernel's accumulator is an fp16 value: the
    product rounded once to fp16 (to nearest even; past 65504 infinity), in
    ``compute_dtype``. The kernel's rounding of every partial sum on the way moves it
    further, by a summation error growing with K (``runtime.verify.FP16_ACC_NOISE``)."""
    if not args.A.dtype.is_floating_point or _f64(args):
        compute_dtype = torch.float64
    acc = torch.matmul(args.A.to(compute_dtype), args.B.to(compute_dtype))
    if getattr(args, "accumulator_type", None) == torch.float16:
        acc = acc.to(torch.float16).to(compute_dtype)
    return acc


def _f64(args) -> bool:
    """Whether ``args`` accumulate in float64 (float64 inputs): their kernel computes the
    epilogue in float64 too, and so does the reference."""
    return getattr(args, "accumulator_type", None) == torch.float64


def _as3d(t: torch.Tensor) -> torch.Tensor:
    return t.reshape((1,) * (3 - t.dim()) + tuple(t.shape))


def evaluate(dag_or_args: Any, accum: torch.Tensor | None = None,
             operands: Mapping[str, Any] | None = None, *, compute_dtype: torch.dtype = torch.float32,
             cast: bool = True) -> dict[str, torch.Tensor]:
    """Every stored output of the epilogue, by name, shaped like its output buffer.

    ``dag_or_args``: an ``ir.Dag``, an ``EpilogueArguments`` (then ``accum`` is needed) or a
    ``GemmArguments`` (``accum`` defaults to ``A @ B`` computed in ``compute_dtype``).
    ``operands``: values by name (default: those of the arguments). With ``cast`` the
    results are rounded to each output's dtype, as a kernel stores them. Outputs passed as
    ``None`` are returned too, uncast, as (L, M, N) tensors.
    """
    from .arguments import EpilogueArguments, GemmArguments  # user-facing objects

    shapes: dict[str, tuple[int, ...]] = {}
    if isinstance(dag_or_args, GemmArguments):
        args = dag_or_args
        dag = args.dag
        if not args.A.dtype.is_floating_point or _f64(args):
            # integer products: exact up to 2**53; float64 accumulates and computes in float64
            compute_dtype = torch.float64
        if accum is None:
            accum = accumulator(args, compute_dtype)
        values = args.epilogue.values
    elif isinstance(dag_or_args, EpilogueArguments):
        dag, values = dag_or_args.dag, dag_or_args.values
    elif isinstance(dag_or_args, Dag):
        dag, values = dag_or_args, {}
    else:
        raise TypeError(f"evaluate takes a Dag, EpilogueArguments or GemmArguments, "
                        f"not {type(dag_or_args).__name__}")
    if accum is None:
        raise TypeError("evaluate needs the accumulator (A @ B) for this argument")
    values = dict(values)
    if operands:
        values.update(operands)
    for o in dag.outputs:
        v = values.get(o.name)
        if isinstance(v, torch.Tensor):
            shapes[o.name] = tuple(v.shape)
    acc3 = _as3d(accum).to(compute_dtype)
    return _Evaluator(dag, acc3, values, compute_dtype).run(shapes, cast)


class _Evaluator:
    def __init__(self, dag: Dag, acc3: torch.Tensor, values: Mapping[str, Any], dtype: torch.dtype):
        self.dag, self.acc3, self.values, self.dtype = dag, acc3, values, dtype
        # the epilogue's (L, M, N): a gated one's N is half the accumulator's (its pairs)
        L, M, NA = acc3.shape
        self.shape = (L, M, NA // 2) if dag.gated else (L, M, NA)
        self.device = acc3.device
        self.cache: dict[int, torch.Tensor] = {}
        # whether each reduction keeps L is a property of the output it feeds (Output.batched),
        # not of the node: a per-batch sum of an operand shared by all batches is not batched
        # itself, yet must not be summed over L
        self.keep_batch = {id(o.node): o.batched for o in dag.outputs
                           if o.node.kind is NodeKind.REDUCE}

    def value(self, n: Node) -> torch.Tensor:
        v = self.cache.get(id(n))
        if v is None:
            # the nodes ``n`` depends on first, in the DAG's order (inputs before users): no
            # recursion, so a chain of thousands of assignments evaluates as a short one
            for m in self.dag.nodes:
                if id(m) not in self.cache:
                    self.cache[id(m)] = self._compute(m)
                if m is n:
                    break
            v = self.cache[id(n)]
        return v

    def _float(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.dtype) if t.dtype != self.dtype else t

    def _compute(self, n: Node) -> torch.Tensor:
        L, M, N = self.shape
        if n.kind is NodeKind.ACCUM:  # pairs(accum): gate = columns 0, 2, ..; up = 1, 3, ..
            if n.op is None:          # (concatenated: gate = columns 0 .. N-1; up = N .. 2N-1)
                return self.acc3
            if self.dag.concatenated:
                return self.acc3[..., :N] if n.op == "gate" else self.acc3[..., N:]
            return self.acc3[..., {"gate": 0, "up": 1}[n.op]::2]
        if n.kind is NodeKind.CONST:
            return torch.tensor(n.value, dtype=self.dtype, device=self.device)
        if n.kind is NodeKind.INDEX:
            size = M if n.op == "row" else N
            idx = torch.arange(size, device=self.device, dtype=self.dtype)
            return idx.view(1, size, 1) if n.op == "row" else idx.view(1, 1, size)
        if n.kind is NodeKind.LOAD:
            spec = n.operand
            if spec.name not in self.values:
                raise KeyError(f"no value for operand {spec.name}")
            raw = self.values[spec.name]
            if spec.kind is OperandKind.RUNTIME_SCALAR:
                return torch.tensor(scalar_value(spec.name, raw), dtype=self.dtype,
                                    device=self.device)
            return _as3d(raw.to(self.device).to(self.dtype))
        if n.kind is NodeKind.COMPUTE:
            row = OPS[n.op]
            ins = [self.value(i) for i in n.inputs]
            if row.category is Category.SELECT:
                cond = ins[0] if ins[0].dtype == torch.bool else ins[0] != 0
                ins = [cond, self._float(ins[1]), self._float(ins[2])]
            else:
                ins = [self._float(i) for i in ins]
            return torch_apply(row, ins, n.param_dict)
        if n.kind is NodeKind.REDUCE:
            # per batch where it reduces values the batches share (ir.reduces_shared; an
            # output of it lacking L sums their copies: ``run``)
            return self._reduce(n, reduces_shared(n)
                                or self.keep_batch.get(id(n), n.batched))
        raise NotImplementedError(n.kind)

    def _reduce(self, n: Node, keep_l: bool) -> torch.Tensor:
        """Reduction ``n`` over the dims its space lacks, and over L unless ``keep_l``;
        materialised first: torch sums a broadcast (stride-0) tensor in another order than a
        stored one, and the result must not depend on how the value was broadcast."""
        L, M, N = self.shape
        src = self._float(self.value(n.inputs[0])).expand(L, M, N).contiguous()
        dims = [] if keep_l else [0]
        if n.space in (Space.COL, Space.SCALAR):
            dims.append(1)
        if n.space in (Space.ROW, Space.SCALAR):
            dims.append(2)
        return OPS[n.op].torch_fn(src, dims) if dims else src

    def _stored(self, o) -> torch.Tensor:
        """What output ``o`` holds after the kernel: its node's value, or for a conditional
        store (``store_where(cond, value)``) the value where cond holds and the buffer's own
        elements (``values[o.name]``, as they are now) elsewhere."""
        n = o.node
        if not n.conditional_store:
            return self.value(n)
        cond, value = (self.value(i) for i in n.inputs)
        cond = cond if cond.dtype == torch.bool else cond != 0
        held = _as3d(self.values[o.name].to(self.device)).to(self.dtype)
        return torch.where(cond, self._float(value), held)

    def run(self, shapes: Mapping[str, tuple[int, ...]], cast: bool) -> dict[str, torch.Tensor]:
        L, M, N = self.shape
        result: dict[str, torch.Tensor] = {}
        for o in self.dag.outputs:
            n = o.node
            if reduces_shared(n) and not o.batched:
                v = _as3d(self._reduce(n, False))  # over the L batches' copies too
            else:
                v = _as3d(self._float(self._stored(o)))
            # keep the axes the output has; the value is constant along the others (a
            # reduction already collapsed them, anything else was checked by the frontend),
            # so one slice of them is the value, also where the problem has none (M = 0:
            # a per-column result still has N values)
            keep_l = o.batched or o.kind is OutputKind.NONE
            keep_m = o.kind in (OutputKind.FULL, OutputKind.NONE, OutputKind.ROW)
            keep_n = o.kind in (OutputKind.FULL, OutputKind.NONE, OutputKind.COL)
            keep = (keep_l, keep_m, keep_n)
            v = v[tuple(slice(None) if k else slice(0, 1) for k in keep)]
            v = v.expand(*(full if k else size for k, full, size in zip(keep, (L, M, N), v.shape)))
            if o.name in shapes:
                v = v.reshape(shapes[o.name])
            if cast and o.dtype is not None:
                v = round_to(v, o.dtype)  # as a kernel stores it
            result[o.name] = v.contiguous()
        return result


__all__ = ["evaluate"]


def evaluate_grouped(epilogue: Any, A: torch.Tensor, B: torch.Tensor, offs: torch.Tensor,
                     values: Mapping[str, Any], *, compute_dtype: torch.dtype = torch.float32
                     ) -> dict[str, torch.Tensor]:
    """A grouped GEMM's stored outputs (``evtfuse.grouped_gemm``), by name, shaped like
    their buffers, rounded to each output's dtype. ``values``: the operands and the output
    buffers (shapes and dtypes only). Groups over M (B (G, K, N)): ``evaluate`` once per
    group on the group's rows; a per-group operand (G, 1, N) or (G, 1, 1) gives the group
    its slice, a (T, N) or (T, 1) one its rows; rows at or past offs[-1] belong to no
    group: NaN (0 for integer outputs). Groups over K (A (M, T), B (T, N)): the batch g of
    the accumulator is A[:, offs[g-1]:offs[g]] @ B[offs[g-1]:offs[g]] (zero for an empty
    group), then ``evaluate`` of the batched (G, M, N) problem. Reads ``offs`` on the host
    (a reference, not a kernel)."""
    from .arguments import EpilogueArguments

    parsed = EpilogueArguments.unbound(epilogue, **values).parsed
    if B.dim() == 2:
        return _evaluate_k_grouped(epilogue, A, B, offs, values, parsed.gated, compute_dtype)
    # a gated epilogue's (pairs(accum)) N is half of B's columns
    G, T, N = B.shape[0], A.shape[0], B.shape[-1] // (2 if parsed.gated else 1)
    ends = [int(e) for e in offs.tolist()]
    outs = {}
    for name in parsed.outputs:
        buf = values[name]
        if isinstance(buf, torch.Tensor):
            outs[name] = torch.full_like(buf, float("nan") if buf.dtype.is_floating_point else 0)

    def part(v, g: int, s: int, e: int):
        if not isinstance(v, torch.Tensor) or v.dim() == 0:
            return v
        if v.dim() == 3 and v.shape[0] == G and G > 1:  # per group: (G, 1, N), (G, 1, 1)
            return v[g]
        if v.dim() >= 2 and v.shape[-2] == T and T > 1:  # rows: (T, N), (T, 1)
            return v[..., s:e, :]
        return v

    # reductions not per row: per group ((G, 1, N), (G, 1, 1)) or over every group's rows
    # ((N,), (1,)), each starting from its identity (a group without rows keeps it)
    reduced = {a.target: a.expr.op for a in parsed.assignments
               if a.expr.kind == "call" and OPS[a.expr.op].category is Category.REDUCE}
    per_group, overall = {}, {}
    for name, op in reduced.items():
        buf = values.get(name)
        if not isinstance(buf, torch.Tensor) or (buf.dim() >= 2 and buf.shape[-2] == T and T > 1):
            continue
        ident = torch.full(buf.shape, OPS[op].reduce_identity, dtype=compute_dtype,
                           device=buf.device)
        if buf.dim() == 3 and buf.shape[0] == G and G > 1:
            per_group[name] = ident
        else:
            overall[name] = ident
    start = 0
    for g, end in enumerate(ends):
        if end > start:
            sliced = {n: part(v, g, start, end) for n, v in values.items()}
            epi = EpilogueArguments(epilogue, **sliced)
            epi.bind((1, end - start, N))
            acc = torch.matmul(A[start:end].to(compute_dtype), B[g].to(compute_dtype))
            got = evaluate(epi, acc.unsqueeze(0), compute_dtype=compute_dtype)
            for name, r in got.items():
                if name in per_group:
                    per_group[name][g] = r.reshape(per_group[name][g].shape)
                elif name in overall:
                    overall[name] = _combined(reduced[name], overall[name],
                                              r.to(compute_dtype).reshape(overall[name].shape))
                elif name in outs:
                    outs[name][..., start:end, :] = r.reshape(outs[name][..., start:end, :].shape)
        start = max(start, end)
    for name, r in {**per_group, **overall}.items():
        outs[name] = r.to(outs[name].dtype)
    return outs


def _combined(op: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Two results of reduction ``op`` over disjoint rows, as one over both."""
    if op == "sum":
        return a + b
    if op == "max":
        return torch.maximum(a, b)
    if op == "min":
        return torch.minimum(a, b)
    return torch.logaddexp(a, b)


def _evaluate_k_grouped(epilogue, A, B, offs, values, gated: bool, compute_dtype) -> dict:
    from .arguments import EpilogueArguments

    G, M, N = offs.shape[0], A.shape[0], B.shape[-1]
    acc = torch.zeros(G, M, N, dtype=compute_dtype, device=A.device)
    start = 0
    for g, end in enumerate(int(e) for e in offs.tolist()):
        end = min(max(end, 0), A.shape[1])
        if end > start:
            acc[g] = torch.matmul(A[:, start:end].to(compute_dtype), B[start:end].to(compute_dtype))
        start = max(start, end)
    epi = EpilogueArguments(epilogue, **values)
    epi.bind((G, M, N // 2 if gated else N))
    return evaluate(epi, acc, compute_dtype=compute_dtype)
