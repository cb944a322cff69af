"""DTensor sharding rules of evtfuse's GEMM operators, derived from the epilogue's DAG.

Layer: runtime.torch, above ``runtime.torch_op`` (the operators),
``runtime.cross_entropy`` and ``runtime.grad_plan``, below ``runtime.dtensor_call`` and
``api`` (which call them on DTensors). Invariant: a rule offers a sharding of the problem
only where every rank's epilogue, run on its own shard as it is, computes exactly its
shard of the whole call's outputs; everything else is computed replicated, after DTensor
has redistributed the inputs (correct before fast). A K-sharded input (partial sums of the
accumulator) stays so only where the epilogue is linear in it (``inner``); elsewhere it is
redistributed first.

A call of ``evtfuse::gemm`` (``evtfuse::grouped_gemm``) is split, on each dimension of the
device mesh, in one of these *modes*:

- ``columns``: B's columns (N) sharded, A replicated; each operand and output spanning N
  sharded on it alike (a bias (N,), a full (M, N) tensor), the others replicated. Allowed
  when no output column depends on another column: no reduction to a value lacking N (a
  row's ``logsumexp`` read by another node, softmax's max) but a row's ``sum``, ``max``,
  ``min`` or ``logsumexp`` that is only stored (``Rules.partial``: each rank's is its
  shard's part, placed ``Partial(op)``, a logsumexp combined by ``dtensor_call`` and placed
  ``Replicate()``, ``Rules.combined``; with gradients a sum or a logsumexp only,
  ``for_gradients``), no row function (``softmax``), no
  ``col_index()`` (a shard's column 0 is not the problem's), not gated (``pairs(accum)``).
- ``rows``: A's rows (M) sharded, B replicated; operands and outputs spanning M sharded on
  it. Allowed when no value lacking M is reduced from the rows (a column's or the whole
  problem's ``sum``) and no ``row_index()``; not for a grouped GEMM over M (its rows belong
  to the groups ``offs`` cuts).
- ``batches``: the batch L (A's or B's dim 0, where 3-D) sharded, with every batched
  operand and output; allowed when every stored output keeps L (no sum over the batches);
  not for grouped GEMMs.
- ``inner``: K sharded (A's columns, B's rows: each rank's accumulator is its part of the
  sum), every output placed ``Partial("sum")``. Allowed when every stored output is linear
  in the accumulator and in the tensor operands added to it (``alpha * accum + beta * C``,
  ``accum * scale + bias``, a row's ``sum`` of such: ``OpDef.degree``), those operands
  placed ``Partial("sum")`` too (DTensor's redistribution hands each rank its part of a
  replicated one) and the others replicated: each rank's epilogue of its partial sums is
  its part of the whole call's. Not for a grouped GEMM over K, nor gated.
- ``replicate``: everything replicated: always allowed.

A rule is read off the DAG the frontend binds for the call's global shapes (``rules_of``,
cached per structure); the epilogue crosses the operator as its source text and is parsed,
never run. The same ``Rules`` serve two callers: the strategies registered for the
operators (``register``), through which DTensor dispatches ``torch.ops.evtfuse.gemm`` on
DTensors (it redistributes the inputs to the cheapest strategy), and ``api.gemm`` with
DTensors (``choose``: the mode per mesh dimension; a differentiable call runs on the
local shards with DTensor's differentiable ``redistribute``/``to_local``/``from_local``
at the boundary, ``grad_placements``).

The rules are registered with torch's ``register_sharding``, adjusted twice (``_register``):
its sharding cache is keyed on the arguments from the epilogue's source on (it keys from
an operator's first int argument, which these lack: a second epilogue with the placements
of a first got the first one's cached strategy), and the operators write their outputs in
place (``Tensor(a!)[] outs``), so a strategy that moved an output (redistributed it) would
write a copy and lose the result: every strategy keeps each output where it is
(``_pin_outputs``), and an output placed where the epilogue cannot compute it is an
``EpilogueError`` naming the output, its placement and why. The cross-entropy operators'
rules (the rows split for ``reduction="none"``) go through ``register_sharding`` as it is.

Registration is lazy: ``import evtfuse`` never imports ``torch.distributed.tensor`` (0.7
s); ``runtime.device.is_dtensor`` registers the rules the first time it finds that module
loaded (``device.on_first_dtensor``), outside torch.compile's tracing (every evtfuse entry
point asks it), and ``register()`` does it for a program that calls
``torch.ops.evtfuse.gemm`` on DTensors before any of them. What this module takes of
torch's DTensor is looked up in ``_torch_api`` (and the strategies' fields read in
``_pin_outputs`` and ``_children``): the places to change for another torch version.
"""

from __future__ import annotations

import functools
import logging
import sys
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from ..errors import EpilogueError
from ..frontend import bind
from . import cross_entropy  # noqa: F401  (defines the operators whose rules _register_ce adds)
from . import device
from .grad_plan import full_shape, problem_of
from .splits import (BATCHES, COLUMNS, COMBINED_OPS, INNER, MODES, PARTIAL_OPS,  # noqa: F401
                     REPLICATE, ROWS, mixing, row_partials, summands)
from .torch_op import parse_layout, parsed_of, unwire

log = logging.getLogger("evtfuse")

# the problem's (L, M, N, K) axis a mode shards
_AXIS = {BATCHES: 0, ROWS: 1, COLUMNS: 2, INNER: 3}
_AXIS_NAME = {0: "the batches (L)", 1: "the rows (M)", 2: "the columns (N)",
              3: "the inner dimension (K)"}


@dataclass(frozen=True)
class Rules:
    """What one call structure allows: ``refused`` {mode: why not} (the modes it lacks are
    allowed), ``problem`` (L, M, N), and ``dims``: for every tensor of the call by name
    ("A", "B", "offs", operands, outputs) the dim of each of (L, M, N) it spans, or None."""

    problem: tuple[int, int, int]
    refused: dict[str, str]
    dims: dict[str, tuple[int | None, int | None, int | None]]
    # outputs that are a sum, max or min over each row and nothing else: under ``columns``
    # each rank's is its shard's partial result, Partial(op), which one all-reduce combines
    # where the caller redistributes it ({output: "sum" | "max" | "min"})
    partial: dict[str, str] = field(default_factory=dict)
    # ``inner``: K, A's and B's dims spanning it, and the tensors it places Partial("sum"):
    # every output and the operands added to the accumulator
    k: int = 0
    kdims: dict[str, int] = field(default_factory=dict)
    summands: frozenset = frozenset()
    outputs: frozenset = frozenset()  # the stored outputs' names

    @property
    def combined(self) -> frozenset:
        """The outputs of ``partial`` that no Partial placement combines (a row's
        ``logsumexp``): ``evtfuse.gemm`` combines each rank's after the local run
        (``dtensor_call``); the operator itself cannot, so its strategies refuse the columns."""
        return frozenset(n for n, op in self.partial.items() if op in COMBINED_OPS)

    def allows(self, mode: str, parts: int = 1) -> bool:
        """Whether ``mode`` is allowed over a mesh dimension of ``parts`` ranks (each rank
        gets at least one index of the axis it shards)."""
        if mode in self.refused:
            return False
        return mode == REPLICATE or (*self.problem, self.k)[_AXIS[mode]] >= parts

    def placement(self, mode: str, name: str):
        """Where ``mode`` puts tensor ``name`` on one mesh dimension: Shard(its dim of the
        sharded axis) or Replicate()."""
        Replicate, Shard = _torch_api().Replicate, _torch_api().Shard
        if mode == REPLICATE:
            return Replicate()
        if mode == COLUMNS and name in self.partial:
            if name in self.combined:  # combined by evtfuse.gemm after the shards' run
                return Replicate()
            return _torch_api().Partial(self.partial[name])
        if mode == INNER:
            if name in self.kdims:
                return Shard(self.kdims[name])
            return _torch_api().Partial("sum") if name in self.summands else Replicate()
        dim = self.dims[name][_AXIS[mode]]
        return Replicate() if dim is None else Shard(dim)


def _meta(shape, dtype) -> torch.Tensor:
    return torch.empty(tuple(shape), dtype=dtype, device="meta")


def _spans(shape: tuple, problem: tuple) -> tuple[int | None, int | None, int | None]:
    """Which dim of ``shape`` (right-aligned with (L, M, N), as the frontend reads operands)
    spans each of L, M and N: where its size is the problem's (L only where L > 1)."""
    out: list[int | None] = [None, None, None]
    nd = len(shape)
    for axis in range(3):
        i = nd - 3 + axis
        if i >= 0 and int(shape[i]) == int(problem[axis]) and (axis or problem[0] > 1):
            out[axis] = i
    return out[0], out[1], out[2]


def rules_of(parsed, A_shape: tuple, B_shape: tuple, dtype: torch.dtype,
             operands: dict[str, Any], outputs: dict[str, Any], grouped: bool = False,
             groups: int | None = None) -> Rules:
    """The ``Rules`` of a call: ``parsed`` its epilogue, A's and B's global shapes (and
    their dtype), ``operands`` {name: (shape, dtype), or a number}, ``outputs`` {name:
    (shape, dtype), or None: not stored}; ``grouped``: a grouped GEMM over M; ``groups``:
    G of one over K. Binds the epilogue to meta tensors of those shapes (the frontend's
    errors for shapes that do not fit), cached per structure."""
    key = (id(parsed), tuple(A_shape), tuple(B_shape), dtype,
           tuple(sorted((k, _key(v)) for k, v in operands.items())),
           tuple(sorted((k, _key(v)) for k, v in outputs.items())), grouped, groups)
    hit = _rules.get(key)
    if hit is not None and hit[0] is parsed:
        return hit[1]
    rules = _derive(parsed, A_shape, B_shape, dtype, operands, outputs, grouped, groups)
    if len(_rules) > 1024:
        _rules.clear()
    _rules[key] = (parsed, rules)  # (the parsed epilogue held: its id is not reused)
    return rules


def _key(v):
    return v if v is None or isinstance(v, (int, float)) else (tuple(v[0]), v[1])


_rules: dict[tuple, tuple] = {}


def _derive(parsed, A_shape, B_shape, dtype, operands, outputs, grouped, groups) -> Rules:
    A, B = _meta(A_shape, dtype), _meta(B_shape, dtype)
    problem = tuple(int(d) for d in problem_of(A, B, grouped, parsed.gated, groups))
    rank = len(full_shape(A, B, grouped, parsed.gated, groups))
    values: dict[str, Any] = {}
    for name, v in operands.items():
        values[name] = v if isinstance(v, (int, float)) else _meta(*v)
    for name, v in outputs.items():
        values[name] = None if v is None else _meta(*v)
    dag = bind(parsed, values, problem, grouped, rank=rank)
    partial = row_partials(dag)
    refused = mixing(dag, problem, parsed.name,
                      {id(o.node) for o in dag.outputs if o.name in partial})
    if grouped:
        refused.setdefault(ROWS, "it is a grouped GEMM over M, whose rows belong to the "
                                 "groups offs cuts")
    if grouped or groups is not None:
        refused.setdefault(BATCHES, "it is a grouped GEMM, whose groups are not batches "
                                    "of A and B")
    tensors = {n for n, v in operands.items() if not isinstance(v, (int, float))}
    why_not, parts = summands(dag, tensors)
    if groups is not None:
        why_not = "it is a grouped GEMM over K, whose groups cut K"
    if why_not:
        refused[INNER] = f"the epilogue {parsed.name}: {why_not}"
    dims: dict[str, tuple] = {
        "A": (0 if len(A_shape) == 3 and not grouped else None, len(A_shape) - 2, None),
        "B": (0 if len(B_shape) == 3 and not grouped else None, None, len(B_shape) - 1),
        "offs": (None, None, None)}
    for name, v in (*operands.items(), *outputs.items()):
        if v is None or isinstance(v, (int, float)):
            continue
        dims[name] = _spans(tuple(v[0]), problem)
    if problem[0] > 1 and not grouped and groups is None:
        # a batch index of A or B that the other lacks: the batches share it (replicated)
        dims["A"] = (dims["A"][0] if len(A_shape) == 3 and A_shape[0] == problem[0] else None,
                     *dims["A"][1:])
        dims["B"] = (dims["B"][0] if len(B_shape) == 3 and B_shape[0] == problem[0] else None,
                     *dims["B"][1:])
    kdims = {"A": len(A_shape) - 1, "B": len(B_shape) - 2}
    stored = frozenset(n for n, v in outputs.items() if v is not None)
    return Rules(problem, refused, dims, partial, int(A_shape[-1]), kdims,  # type: ignore[arg-type]
                 parts | stored, stored)




def for_gradients(rules: Rules) -> Rules:
    """``rules`` for a differentiable call: a partial ``max`` or ``min`` refuses the columns
    (its gradient belongs to the rank whose shard held the extreme, where DTensor hands
    every rank the whole gradient of a Partial output); a partial ``sum``'s gradient is
    each rank's as it is."""
    other = sorted(n for n, op in rules.partial.items() if op not in ("sum", *COMBINED_OPS))
    if not other:
        return rules
    refused = {**rules.refused, COLUMNS: f"its output {other[0]} is the {rules.partial[other[0]]} "
               "of each row, whose gradient the column shards cannot split"}
    return replace(rules, refused=refused)


# ------------------------------------------------------------------ choosing


def fitting(call: str, rules: Rules, mesh, fixed: dict[str, tuple]) -> list[list[str]]:
    """For each dimension of ``mesh``, the allowed modes that leave every output of
    ``fixed`` {name: its placements} where it is (an output evtfuse writes in place, given
    by the caller); an ``EpilogueError`` naming an output that no allowed mode computes
    where it is placed (``call``: the function or operator to name)."""
    per_dim = []
    for d in range(mesh.ndim):
        fits = [m for m in MODES if rules.allows(m, mesh.size(d)) and all(
            rules.placement(m, n) == p[d] for n, p in fixed.items())]
        if not fits:
            raise _misplaced(call, rules, fixed, mesh, d)
        per_dim.append(fits)
    return per_dim


def _misplaced(call: str, rules: Rules, fixed: dict[str, tuple], mesh,
               d: int) -> EpilogueError:
    """``fitting``'s error for mesh dimension ``d``: names the first output whose placement
    no allowed mode gives it, and why the mode that would is not allowed."""
    for name, placements in fixed.items():
        p = placements[d]
        makers = [m for m in MODES if rules.placement(m, name) == p]
        if any(rules.allows(m, mesh.size(d)) for m in makers):
            continue
        refused = [m for m in makers if m in rules.refused]
        if refused:
            why = (f"{rules.refused[refused[0]]}, so its shards over "
                   f"{_AXIS_NAME[_AXIS[refused[0]]]} cannot be computed apart")
        elif makers:
            why = (f"{_AXIS_NAME[_AXIS[makers[0]]]} has fewer indices than mesh dimension "
                   f"{d} has ranks")
        else:
            why = f"no split of the call computes an output placed {p} on a mesh dimension"
        return EpilogueError(f"{call}: output {name} is a DTensor placed {placements}, but "
                             f"{why}; evtfuse writes its outputs in place, so it cannot move "
                             f"one: pass {name} replicated (Replicate()) or leave it out "
                             "(evtfuse.gemm allocates it where it computes it)", variable=name)
    return EpilogueError(f"{call}: the outputs' placements "
                         f"{ {n: p for n, p in fixed.items()} } match no one split of the call "
                         f"on mesh dimension {d}: pass them replicated (Replicate())",
                         variable=next(iter(fixed), None))


def choose(rules: Rules, mesh, placed: dict[str, tuple], sizes: dict[str, int],
           fits: list[list[str]]) -> list[str]:
    """The mode for each dimension of ``mesh``, among ``fits`` (``fitting``'s), that moves
    the fewest bytes: ``placed`` {tensor name: its placements now}, ``sizes`` {name:
    bytes}. A tensor already where a mode wants it costs nothing, and so does a replicated
    one the mode shards (each rank keeps its part); every other move (gathering a shard,
    summing partials) costs its size; ``inner`` also costs its outputs' sizes (the
    all-reduce that reading a Partial output takes; ``sizes`` has them). Ties go to the
    first of replicate, columns, rows, batches, inner (an all-replicated call stays
    replicated)."""
    modes = []
    for d in range(mesh.ndim):
        best, best_cost = None, None
        for mode in fits[d]:
            cost = sum(sizes.get(o, 0) for o in rules.outputs) if mode == INNER else 0
            for name, placements in placed.items():
                want, now = rules.placement(mode, name), placements[d]
                if now != want and not (now.is_replicate()
                                        and (want.is_shard() or want.is_partial())):
                    cost += sizes[name]
            if best_cost is None or cost < best_cost:
                best, best_cost = mode, cost
        modes.append(best)
    return modes


def placements_of(rules: Rules, modes: list[str], name: str) -> tuple:
    """Tensor ``name``'s placements on the mesh under ``modes`` (one per mesh dim)."""
    return tuple(rules.placement(m, name) for m in modes)


def grad_placements_of(rules: Rules, modes: list[str], name: str) -> tuple:
    """The placements of the gradient each rank computes for input ``name`` from its shard:
    its own where the input is sharded (or all is replicated), Partial() where it is
    replicated under a sharding mode (each rank's part of a sum over the sharded axis),
    Replicate() where it is one rank's part of a sum (``inner``'s summands: the whole
    gradient is each part's)."""
    api = _torch_api()
    out = []
    for m in modes:
        p = rules.placement(m, name)
        if p.is_partial():
            out.append(api.Replicate())
        else:
            out.append(api.Partial() if m != REPLICATE and p.is_replicate() else p)
    return tuple(out)


# ------------------------------------------------------------------ the operators' strategies


def _spec_shape(spec) -> tuple:
    return tuple(spec.tensor_meta.shape)


def _call_rules(A, B, epilogue: str, layout: str, tensors, scalars, outs, offs=None) -> tuple:
    """(Rules, layout) of an operator call whose tensors are DTensorSpecs."""
    lay = parse_layout(layout)
    parsed = parsed_of(unwire(epilogue), lay)
    dtype = A.tensor_meta.dtype
    operands: dict[str, Any] = {n: (_spec_shape(t), t.tensor_meta.dtype)
                                for n, t in zip(lay.tensors, tensors)}
    operands.update({n: 1.0 for n in lay.scalars})
    outputs: dict[str, Any] = {n: (_spec_shape(t), t.tensor_meta.dtype)
                               for n, t in zip(lay.outs, outs)}
    outputs.update({n: None for n in lay.nones})
    grouped = offs is not None and len(_spec_shape(B)) == 3
    groups = _spec_shape(offs)[0] if offs is not None and not grouped else None
    return rules_of(parsed, _spec_shape(A), _spec_shape(B), dtype, operands, outputs,
                    grouped, groups), lay


def _strategies(call: str, A, B, epilogue, layout, tensors, scalars, outs, offs=None) -> list:
    """The single-mesh-dimension strategies of an operator call (``register_sharding``'s
    form: (output placements, input placements) with the inputs A, B, [offs], the tensor
    operands, then the outputs): the allowed modes that keep every output where it is on
    some mesh dimension (``fitting``; ``_pin_outputs`` drops their combinations that would
    move one)."""
    rules, lay = _call_rules(A, B, epilogue, layout, tensors, scalars, outs, offs)
    if rules.combined:  # a logsumexp of column shards: only evtfuse.gemm combines them
        name = sorted(rules.combined)[0]
        rules = replace(rules, refused={**rules.refused, COLUMNS: (
            f"its output {name} is the logsumexp of each row, which the operator cannot "
            "combine over column shards (evtfuse.gemm on DTensors does)")})
    names = ["A", "B", *(["offs"] if offs is not None else []), *lay.tensors, *lay.outs]
    fixed = {n: tuple(t.placements) for n, t in zip(lay.outs, outs)}
    keep: list[str] = []
    for fits in fitting(call, rules, A.mesh, fixed):
        keep += [m for m in fits if m not in keep]
    return [([], [rules.placement(m, n) for n in names]) for m in keep]


def _gemm_sharding(A, B, epilogue, layout, tensors, scalars, outs):
    return _strategies("evtfuse::gemm", A, B, epilogue, layout, _seq(tensors), scalars,
                       _seq(outs))


def _grouped_sharding(A, B, offs, epilogue, layout, tensors, scalars, outs):
    return _strategies("evtfuse::grouped_gemm", A, B, epilogue, layout, _seq(tensors),
                       scalars, _seq(outs), offs)


def _seq(x) -> list:
    """A ``Tensor[]`` argument as the sharding function gets it (a tuple of specs; an empty
    list stays a list)."""
    return list(x) if x else []


# ------------------------------------------------------------------ the cross-entropy operators
#
# ``evtfuse::linear_cross_entropy`` (hidden (T, H), weight (V, H), target (T,), bias (V,)):
# each row's loss is its own, so the rows (tokens) split: hidden and target Shard(0),
# weight and bias replicated; the per-row loss ("none") and lse Shard(0). A "sum" or
# "mean" loss, and the gradients the forward computes for them, are computed replicated
# (a mean of each rank's rows is no part of the whole mean). The vocabulary never splits
# here: a weight sharded over it is gathered (``evtfuse.linear_cross_entropy`` takes such
# a weight itself, vocab-parallel, before the operator). Its backward operator splits the
# same way, the weight's and bias's gradients then each rank's part (Partial()).


def _ce_rows_ok(group, call: str) -> None:
    if group is not None:
        raise EpilogueError(f"{call}: group= (a vocab-parallel call on each rank's shard of "
                            "the weight) with DTensor arguments: pass the local tensors, or "
                            "a DTensor weight placed Shard(0) to evtfuse.linear_cross_entropy",
                            variable="group")


def _ce_sharding(hidden, weight, target, bias, ignore_index, reduction, label_smoothing,
                 softcap, z_loss, grads, group=None):
    _ce_rows_ok(group, "evtfuse::linear_cross_entropy")
    api = _torch_api()
    R, S0 = api.Replicate(), api.Shard(0)
    has_bias = [R] if bias is not None else [None]
    every = [([R] * 5, [R, R, R, *has_bias])]
    if reduction == "none":  # (precomputes nothing: dh, dw, db are empty, replicated)
        every.append(([S0, S0, R, R, R], [S0, R, S0, *has_bias]))
    return every


def _ce_backward_sharding(hidden, weight, target, bias, row_grad, lse_grad, ignore_index,
                          label_smoothing, softcap, z_loss, grads, group=None):
    _ce_rows_ok(group, "evtfuse::linear_cross_entropy_backward")
    api = _torch_api()
    R, S0, P = api.Replicate(), api.Shard(0), api.Partial()

    def given(t, p):
        return [p] if t is not None else [None]

    rows_out = [S0 if grads[0] else R, P if grads[1] else R,
                P if bias is not None and grads[2] else R]
    return [([R] * 3, [R, R, R, *given(bias, R), *given(row_grad, R), *given(lse_grad, R)]),
            (rows_out, [S0, R, S0, *given(bias, R), *given(row_grad, S0),
                        *given(lse_grad, S0)])]


def _scale_sharding(x, g):
    """``x *= g`` in place (g a replicated number): x stays where it is, a Partial() sum
    too (scaling each rank's part scales the sum)."""
    R = _torch_api().Replicate()
    return [([], [p, R]) for p in dict.fromkeys(x.placements)]


# ------------------------------------------------------------------ registration


class _Api:
    """What this module takes of torch's DTensor: the public placements and
    ``register_sharding``, and the sharding propagator's two tables it adjusts (see
    ``_register``). Looked up once, here only."""

    def __init__(self):
        from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
        from torch.distributed.tensor.experimental import register_sharding
        from torch.distributed.tensor._op_schema import RuntimeSchemaInfo

        self.DTensor, self.Partial, self.Replicate, self.Shard = DTensor, Partial, Replicate, Shard
        self.register_sharding = register_sharding
        self.RuntimeSchemaInfo = RuntimeSchemaInfo
        self.propagator = DTensor._op_dispatcher.sharding_propagator


@functools.lru_cache(maxsize=None)
def _torch_api() -> _Api:
    return _Api()


def _children(arg) -> list:
    """The strategies of a list argument (TupleStrategy's ``children``; ``childs`` in older
    torch), or [] for an empty list."""
    kids = getattr(arg, "children", None)
    if kids is None:
        kids = getattr(arg, "childs", None)
    return list(kids) if kids is not None else []


def _pin_outputs(strategy_fn, outs_index: int):
    """``strategy_fn`` (as ``register_sharding`` registered it) keeping only the strategies
    under which every output (the list argument at ``outs_index``, the last of the inputs)
    stays where it is: ``register_sharding`` expands the single-dimension strategies to
    every combination over the mesh's dimensions, and an operator that writes its outputs
    in place must not be handed a redistributed copy of one."""

    def pinned(*args):
        op_schema = args[-1]  # (op_schema); older torch passes (mesh, op_schema)
        strategy = strategy_fn(*args)
        given = op_schema.args_schema
        outs = given[outs_index] if len(given) > outs_index else \
            op_schema.kwargs_schema.get("outs")  # (passed by name)
        now = [s.strategies[0].output_spec.placements for s in _children(outs)]
        if now:
            n = len(now)
            strategy.strategies = [
                s for s in strategy.strategies
                if all(spec.placements == p for spec, p in zip(s.input_specs[-n:], now))]
        return strategy

    return pinned


def _register(op, fn, static_argnum: int) -> None:
    """``register_sharding(op)(fn)``, then: the sharding cache keyed on the arguments from
    ``static_argnum`` on (the epilogue's source and the layout: ``register_sharding`` keys
    only from the first int argument, which these operators lack, so a second epilogue
    with the same placements would get the first one's cached strategy), and the
    outputs pinned (``_pin_outputs``)."""
    api = _torch_api()
    api.register_sharding(op)(fn)
    prop = api.propagator
    prop.op_to_schema_info[op] = api.RuntimeSchemaInfo(static_argnum, needs_pytree=True)
    outs_index = len(op._schema.arguments) - 1
    prop.op_strategy_funcs[op] = _pin_outputs(prop.op_strategy_funcs[op], outs_index)


def _register_ce() -> None:
    """The cross-entropy operators' rules, through ``register_sharding`` as it is: their
    schemas' first int argument (``ignore_index``) starts its cache key, which then holds
    every option; they write nothing they are given (``scale_`` writes x, in place: a rule
    for an in-place operator keeps it where it is)."""
    reg = _torch_api().register_sharding
    reg(torch.ops.evtfuse.linear_cross_entropy.default)(_ce_sharding)
    reg(torch.ops.evtfuse.linear_cross_entropy_backward.default)(_ce_backward_sharding)
    reg(torch.ops.evtfuse.scale_.default)(_scale_sharding)


_state: dict[str, Any] = {}  # "done": True once registered; "failed": why it could not be


def register() -> bool:
    """Register the sharding rules of ``evtfuse::gemm``, ``evtfuse::grouped_gemm`` and the
    cross-entropy operators with DTensor (once; imports ``torch.distributed.tensor``).
    False where this torch has no DTensor or ``register_sharding``, or its internals
    differ from what ``_register`` adjusts (``failure()`` says why; ``evtfuse.gemm`` on
    DTensors then raises it)."""
    if "done" in _state or "failed" in _state:
        return "done" in _state
    try:
        _register(torch.ops.evtfuse.gemm.default, _gemm_sharding, 2)
        _register(torch.ops.evtfuse.grouped_gemm.default, _grouped_sharding, 3)
        _register_ce()
    except Exception as exc:  # noqa: BLE001 - whatever this torch's internals raise, a
        # call without DTensors must never fail for it
        _state["failed"] = f"{type(exc).__name__}: {exc}"
        log.warning("evtfuse: DTensor sharding rules not registered (torch %s): %s",
                    torch.__version__, _state["failed"])
        return False
    _state["done"] = True
    return True


device.on_first_dtensor(register)  # the first time a DTensor can exist


def registered() -> bool:
    return "done" in _state


def failure() -> str | None:
    """Why ``register`` could not register the rules, or None."""
    return _state.get("failed")


def loaded() -> bool:
    """Whether ``torch.distributed.tensor`` is imported (no DTensor exists before)."""
    return "torch.distributed.tensor" in sys.modules


__all__ = ["MODES", "REPLICATE", "COLUMNS", "ROWS", "BATCHES", "Rules", "rules_of", "fitting",
           "choose", "placements_of", "grad_placements_of", "register", "registered",
           "failure", "loaded"]
