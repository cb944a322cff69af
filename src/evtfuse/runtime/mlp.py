"""MLP blocks fused forward and backward: the operators behind ``evtfuse.nn.GatedMLP`` and
``evtfuse.nn.MLP``.

Layer: runtime.torch, beside ``runtime.cross_entropy`` (same ``torch.library`` namespace;
its GEMMs run below autograd: ``calls.plain_gemm``). A block is
``y = act_part(x @ W1.T + b1) @ W2.T + b2``, where ``act_part`` is ``act(G) * U`` of the
two halves ``G | U`` of a gated MLP's up projection (W1 = ``[W_gate; W_up]``, SwiGLU,
GeGLU) or ``act(P)`` of a plain one. Schemas::

    evtfuse::mlp(Tensor x, Tensor w1a, Tensor? w1b, Tensor w2, str activation,
        Tensor? b1a, Tensor? b1b, Tensor? b2, bool keep=True) -> (Tensor y, Tensor p)
    evtfuse::mlp_down_grad(Tensor dy, Tensor w2, Tensor p, Tensor(a!) dp, str activation,
        bool gated, bool keep_a) -> Tensor a

(``w1b``/``b1b``: a gated block's up projection; None for a plain one.)

Forward, two GEMMs: the up projection's epilogue (``up_source``) stores ``p``, the
pre-activations (``G | U``, (tokens, 2I), or ``P``), rounded to the input dtype as torch's
Linear output is, and the activation's output ``A`` computed from those rounded values
(what the backward differentiates: a decision such as relu's sign is the same in both);
then ``y = A @ W2.T`` (torch, cuBLAS). ``A`` is not kept.

Backward, four GEMMs and no elementwise pass: the down projection's ``dA = dy @ W2`` runs
``down_grad``'s epilogue, derived by ``autodiff`` from the activation's expression over
stored pre-activations (``act_source``), whose upstream gradient is the accumulator
(``passes.accumulate_operand``): it reads ``p`` and writes ``dp`` (``dG | dU``) and ``A``
again (for dW2), in the GEMM that produces ``dA``, which never exists. In eager ``dp`` is
``p`` itself (written in place: no second (tokens, 2I) tensor; the backward then runs once,
and a second one fails clearly). Under torch.compile it is a new tensor: Inductor does not
reinplace a mutation of a tensor the forward saved (a graph input of the backward), and
would copy ``p`` onto itself first, a pass over it; a new ``dp`` costs its memory instead. Then ``dx = dp @
W1``, ``dW1 = dp.T @ x`` and ``dW2 = dy.T @ A`` are torch matmuls in the autograd formula
(``dp`` is one (tokens, 2I) tensor; dx, ``evtfuse::mlp_dx``, one matmul over ``[W_gate;
W_up]`` where they lie one after the other, else its two halves times W_gate and W_up,
summed by the second matmul). The forward reads W1 as one (2I, H) view where gate and up weights lie
one after the other in memory, as ``evtfuse.nn.GatedMLP`` keeps them (concatenated per
call otherwise).
"""

from __future__ import annotations

import functools
from typing import Optional

import torch

from .. import autodiff, passes
from ..dag_epilogue import DagEpilogue
from ..errors import EpilogueError
from ..frontend import bind, parse_epilogue
from ..ir import Output, OutputKind, rounding_of
from . import calls
from .device import is_dtensor
from .torch_op import _lib

TUNE = "fast"  # the evtfuse.gemm calls' tuning

_lib.define("mlp(Tensor x, Tensor w1a, Tensor? w1b, Tensor w2, str activation, Tensor? b1a, "
            "Tensor? b1b, Tensor? b2, bool keep=True) -> (Tensor, Tensor)")
_lib.define("mlp_down_grad(Tensor dy, Tensor w2, Tensor p, Tensor(a!) dp, str activation, "
            "bool gated, bool keep_a) -> Tensor")
_lib.define("mlp_dx(Tensor dp, Tensor w1a, Tensor w1b) -> Tensor")


# ------------------------------------------------------------------ epilogues


def _stored(gated: bool) -> tuple[str, ...]:
    return ("G", "U") if gated else ("P",)


def _act_expr(activation: str, gated: bool, g: str, u: str = "") -> str:
    return f"{activation}({g}) * {u}" if gated else f"{activation}({g})"


@functools.lru_cache(maxsize=64)
def up_source(activation: str, gated: bool, bias: bool, dtype: torch.dtype) -> str:
    """The up projection's epilogue: the pre-activations (outputs G and U, or P, each
    ``accum`` plus its bias) and D, the activation's output, of them rounded to ``dtype``."""
    rounding = rounding_of(dtype)

    def rounded(v: str) -> str:
        return f'cast({v}, "{rounding}")' if rounding else v

    if gated:
        params = "accum, bias_gate, bias_up" if bias else "accum"
        body = ['    gate, up = pairs(accum, layout="concatenated")',
                "    G = gate + bias_gate" if bias else "    G = gate",
                "    U = up + bias_up" if bias else "    U = up",
                f"    D = {_act_expr(activation, True, rounded('G'), rounded('U'))}",
                "    return D, G, U"]
    else:
        params = "accum, bias" if bias else "accum"
        body = ["    P = accum + bias" if bias else "    P = accum",
                f"    D = {_act_expr(activation, False, rounded('P'))}", "    return D, P"]
    return "\n".join([f"def mlp_up({params}):", *body]) + "\n"


def act_source(activation: str, gated: bool) -> str:
    """The activation as a function of stored pre-activations: what ``down_grad`` is
    derived from."""
    names = _stored(gated)
    return (f"def mlp_act(accum, {', '.join(names)}):\n"
            f"    D = {_act_expr(activation, gated, *names)}\n    return D\n")


def backward_over_accumulator(source: str, shapes: dict, wrt: set, name: str
                              ) -> tuple[DagEpilogue, tuple[tuple[str, str], ...]]:
    """The backward of the epilogue ``source`` (a function of stored values, no
    accumulator) from the gradient of its output D to those of ``wrt``, derived by
    ``autodiff``, as an epilogue that reads that gradient from its accumulator
    (``passes.accumulate_operand``: it runs over the GEMM that produces the gradient) and
    returns D itself again as its output D. ``shapes``: each operand's placeholder shape.
    Returns the epilogue (its DAG, named ``name``, bound to the call's tensors as it is
    run) and, per name of ``wrt``, the output holding its gradient (one of a per-row
    operand: a per-row sum)."""
    parsed = parse_epilogue(source)
    values = {n: torch.empty(s, dtype=torch.float32, device="meta") for n, s in shapes.items()}
    values["D"] = torch.empty((3, 5), dtype=torch.float32, device="meta")
    dag = bind(parsed, values, (1, 3, 5))
    plan = autodiff.plan_forward(dag, wrt, parsed)
    bwd = autodiff.backward(plan, {"D"}, wrt, name=name)
    # a pointwise function of its operands: nothing saved, injected or left to the caller
    assert not (bwd.saved or bwd.injected or bwd.scratch or bwd.caller_sums), bwd
    fused = passes.accumulate_operand(bwd.dag, dict(bwd.grads)["D"])
    a = plan.dag.output("D")
    outs = [Output("D", a.node, OutputKind.FULL, a.dtype, a.batched) if o.name == "D" else o
            for o in fused.outputs]
    fused = passes.optimize(fused.replace_outputs(outs))
    return DagEpilogue(fused, name), bwd.outputs


@functools.lru_cache(maxsize=64)
def down_grad(activation: str, gated: bool) -> tuple[DagEpilogue, tuple[tuple[str, str], ...]]:
    """The epilogue of ``dA = dy @ W2``: the backward of ``act_source`` with its upstream
    gradient read from the accumulator, and its forward value ``D`` (A, for dW2) among its
    outputs (``backward_over_accumulator``). Returns the epilogue and, per stored
    pre-activation, the output holding its gradient."""
    names = _stored(gated)
    return backward_over_accumulator(act_source(activation, gated),
                                     {n: (3, 5) for n in names}, set(names), "mlp_down_grad")


# ------------------------------------------------------------------ the operators


def _weight1(w1a: torch.Tensor, w1b: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """W1 as one (rows, H) tensor without a copy: w1a itself, or a gated block's [W_gate;
    W_up] where W_up lies right after W_gate in memory; None where it does not."""
    if w1b is None:
        return w1a
    n = w1a.numel()
    if (w1a.is_contiguous() and w1b.is_contiguous() and w1a.dtype == w1b.dtype
            and w1a.shape == w1b.shape and w1a.untyped_storage().data_ptr()
            == w1b.untyped_storage().data_ptr()
            and w1b.data_ptr() == w1a.data_ptr() + n * w1a.element_size()):
        return w1a.as_strided((2 * w1a.shape[0], w1a.shape[1]), (w1a.shape[1], 1))
    return None


def _parts(t: torch.Tensor, gated: bool, width: int) -> dict:
    return {"G": t[:, :width], "U": t[:, width:]} if gated else {"P": t}


def _forward(x, w1a, w1b, w2, activation, b1a, b1b, b2, keep=True):
    gemm = calls.plain_gemm  # below autograd, on local tensors

    gated = w1b is not None
    width = w1a.shape[0]
    w1 = _weight1(w1a, w1b)
    if w1 is None:
        w1 = torch.cat((w1a, w1b))
    bias = b1a is not None
    ops = ({"bias_gate": b1a, "bias_up": b1b} if gated else {"bias": b1a}) if bias else {}
    with torch.no_grad():
        # keep: a backward will read the pre-activations; else they are not stored
        p = x.new_empty((x.shape[0], w1.shape[0]) if keep else (0,))
        stored = _parts(p, gated, width) if keep else dict.fromkeys(_stored(gated))
        a = x.new_empty((x.shape[0], width))
        gemm(x, w1.t(), up_source(activation, gated, bias, x.dtype), D=a, tune=TUNE,
             **stored, **ops)
        y = torch.nn.functional.linear(a, w2, b2)
    return y, p


def _forward_fake(x, w1a, w1b, w2, activation, b1a, b1b, b2, keep=True):
    rows = w1a.shape[0] * (2 if w1b is not None else 1)
    return (x.new_empty((x.shape[0], w2.shape[0])),
            x.new_empty((x.shape[0], rows) if keep else (0,)))


def _empty(like: torch.Tensor) -> torch.Tensor:
    return like.new_empty((0,))


def _down_grad_op(dy, w2, p, dp, activation, gated, keep_a):
    gemm = calls.plain_gemm  # below autograd, on local tensors

    width = p.shape[1] // 2 if gated else p.shape[1]
    epilogue, outputs = down_grad(activation, gated)
    grad_out = dict(outputs)
    with torch.no_grad():
        a = p.new_empty((p.shape[0], width)) if keep_a else None
        # dp may be p: each element's gradient where the element was
        kw = {grad_out[n]: t for n, t in _parts(dp, gated, width).items()}
        gemm(dy.contiguous(), w2, epilogue, D=a, tune=TUNE, **_parts(p, gated, width), **kw)
        torch.autograd.graph.increment_version(dp)  # as an in-place torch op does
    return _empty(p) if a is None else a


def _dx_op(dp, w1a, w1b):
    """dx of a gated block, ``dp @ [W_gate; W_up]``: one matmul of K = 2I, over the two
    weights in place where they lie one after the other (``_weight1``), else over their
    concatenation (as the forward does): the same matmul either way, so eager and compiled
    backwards agree bit for bit whatever the weights' placement (two matmuls of K = I
    summed would round differently). An operator of its own, so that a compiled backward
    (whose traced tensors have no data pointers) takes the one matmul too."""
    w1 = _weight1(w1a, w1b)
    return dp @ (torch.cat((w1a, w1b)) if w1 is None else w1)


def _dx_fake(dp, w1a, w1b):
    return dp.new_empty((dp.shape[0], w1a.shape[1]))


def _down_grad_fake(dy, w2, p, dp, activation, gated, keep_a):
    width = p.shape[1] // 2 if gated else p.shape[1]
    return p.new_empty((p.shape[0], width)) if keep_a else _empty(p)


_lib.impl("mlp", _forward, "CompositeExplicitAutograd")
torch.library.register_fake("evtfuse::mlp", _forward_fake, lib=_lib)
_lib.impl("mlp_down_grad", _down_grad_op, "CompositeExplicitAutograd")
torch.library.register_fake("evtfuse::mlp_down_grad", _down_grad_fake, lib=_lib)
_lib.impl("mlp_dx", _dx_op, "CompositeExplicitAutograd")
torch.library.register_fake("evtfuse::mlp_dx", _dx_fake, lib=_lib)


def _setup_context(ctx, inputs, output) -> None:
    x, w1a, w1b, w2, activation, b1a, b1b, b2, *_ = inputs
    ctx.save_for_backward(x, w1a, w1b, w2, output[1])
    ctx.activation = activation
    ctx.set_materialize_grads(False)


def _backward(ctx, dy, unused_dp):
    if dy is None:
        return (None,) * 9
    if torch.is_grad_enabled():
        raise NotImplementedError("evtfuse's MLP blocks compute first-order gradients only "
                                  "(no create_graph=True)")
    try:
        x, w1a, w1b, w2, p = ctx.saved_tensors
    except RuntimeError as exc:
        if "inplace operation" not in str(exc):
            raise
        raise RuntimeError(
            "an evtfuse MLP block's backward writes the gradient of its pre-activations over "
            "them (no second copy), so it runs once: a second backward through the same graph "
            "(retain_graph=True) is not supported") from exc
    need = ctx.needs_input_grad
    gated = w1b is not None
    width = w1a.shape[0]
    want_x, want_w1 = need[0], need[1] or (gated and need[2])
    want_b1 = need[5] or (gated and need[6])
    # d[gate|up] (dP): over the saved pre-activations in eager, a new tensor under compile
    dp = torch.empty_like(p) if torch.compiler.is_compiling() else p
    a = torch.ops.evtfuse.mlp_down_grad.default(dy, w2, p, dp, ctx.activation, gated, need[3])
    dx = dw1 = db1 = None
    if want_x:  # dp @ [W_gate; W_up]
        dx = torch.ops.evtfuse.mlp_dx.default(dp, w1a, w1b) if gated else dp @ w1a
    if want_w1:
        dw1 = dp.t() @ x
    if want_b1:
        db1 = dp.sum(0)

    def halves(t):
        if t is None:
            return None, None
        return (t[:width], t[width:]) if gated else (t, None)

    dw1a, dw1b = halves(dw1)
    db1a, db1b = halves(db1)
    dw2 = dy.t() @ a if need[3] else None
    db2 = dy.sum(0) if need[7] else None
    got = (dx, dw1a, dw1b, dw2, None, db1a, db1b, db2)
    return (*(g if k else None for g, k in zip(got, need)), None)


torch.library.register_autograd("evtfuse::mlp", _backward, setup_context=_setup_context,
                                lib=_lib)


# ------------------------------------------------------------------ the calls


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x if x.dim() == 2 else x.reshape(-1, x.shape[-1])


def _shaped(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    # a 2-D x: y as the operator returned it, not a view of it (FSDP2 warns of a module
    # returning a view: an in-place op on it would drop its pre-backward hook)
    return y if x.dim() == 2 else y.reshape(*x.shape[:-1], y.shape[-1])


def gated_mlp(x, w_gate, w_up, w_down, activation, b_gate=None, b_up=None, b_down=None):
    """``down(act(gate(x)) * up(x))`` of Linear weights (out, in) and biases, x (..., H);
    DTensor weights sharded for tensor parallelism: ``tensor_parallel``."""
    if is_dtensor(w_down):
        return tensor_parallel(x, w_gate, w_up, w_down, activation, b_gate, b_up, b_down)
    y, _ = torch.ops.evtfuse.mlp.default(
        _flat(x), w_gate, w_up, w_down, activation, b_gate, b_up, b_down,
        _backward_ahead(x, w_gate, w_up, w_down, b_gate, b_up, b_down))
    return _shaped(y, x)


def mlp(x, w1, w2, activation, b1=None, b2=None):
    """``fc2(act(fc1(x)))`` of Linear weights (out, in) and biases, x (..., H); DTensor
    weights sharded for tensor parallelism: ``tensor_parallel``."""
    if is_dtensor(w2):
        return tensor_parallel(x, w1, None, w2, activation, b1, None, b2)
    y, _ = torch.ops.evtfuse.mlp.default(_flat(x), w1, None, w2, activation, b1, None, b2,
                                         _backward_ahead(x, w1, w2, b1, b2))
    return _shaped(y, x)


def _backward_ahead(*tensors) -> bool:
    """Whether a backward may follow (grad mode on, a tensor that requires a gradient):
    else the forward stores no pre-activations (inference: two (tokens, I) tensors less)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def tensor_parallel(x, w1a, w1b, w2, activation, b1a=None, b1b=None, b2=None):
    """A block whose weights are DTensors placed as Megatron's tensor parallelism places an
    MLP (``parallelize_module`` with ``ColwiseParallel`` on the up projections and
    ``RowwiseParallel`` on the down one): W1's rows (and b1) ``Shard(0)``, W2's columns
    ``Shard(1)``, b2 replicated, on one 1-D mesh. Each rank runs the fused block on its
    shards (its slice of the intermediate width: no collective inside), and one all-reduce
    sums the ranks' partial outputs (``Partial`` -> ``Replicate``); the gradient of x is
    all-reduced in the backward (declared ``Partial``), the weights' gradients stay
    sharded. x: a plain tensor (the same on every rank) or a replicated DTensor; the
    result is of the same kind. Other placements are an error naming the weight."""
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    mesh = w2.device_mesh
    want = [("w1", w1a, (Shard(0),)), ("w1 (up)", w1b, (Shard(0),)), ("w2", w2, (Shard(1),)),
            ("b1", b1a, (Shard(0),)), ("b1 (up)", b1b, (Shard(0),)), ("b2", b2, (Replicate(),))]
    for name, t, placements in want:
        if t is None:
            continue
        if not isinstance(t, DTensor) or t.device_mesh != mesh or mesh.ndim != 1 \
                or tuple(t.placements) != placements:
            got = tuple(t.placements) if isinstance(t, DTensor) else "a plain tensor"
            raise EpilogueError(
                f"an evtfuse MLP block with DTensor weights takes them as tensor parallelism "
                f"places them (ColwiseParallel up projections, RowwiseParallel down "
                f"projection) on one 1-D mesh: {name} must be {placements}, not {got}",
                variable=name)
    dtensor_in = isinstance(x, DTensor)
    if dtensor_in and tuple(x.placements) != (Replicate(),):
        raise EpilogueError(f"x is a DTensor placed {tuple(x.placements)}; the block takes it "
                            "replicated (Replicate())", variable="x")
    xd = x if dtensor_in else DTensor.from_local(x, mesh, [Replicate()], run_check=False)
    local = xd.to_local(grad_placements=[Partial()])  # each rank's part of dx, summed

    def loc(t):
        return None if t is None else t.to_local()

    if w1b is None:
        part = mlp(local, w1a.to_local(), w2.to_local(), activation, loc(b1a))
    else:
        part = gated_mlp(local, w1a.to_local(), w1b.to_local(), w2.to_local(), activation,
                         loc(b1a), loc(b1b))
    y = DTensor.from_local(part, mesh, [Partial()], run_check=False).redistribute(
        mesh, [Replicate()])
    if b2 is not None:
        y = y + b2
    return y if dtensor_in else y.to_local()


def pack_gate_up(gate: torch.nn.Linear, up: torch.nn.Linear) -> None:
    """Put ``gate.weight`` and ``up.weight`` one after the other in one new buffer, keeping
    the Parameter objects (an optimizer holding them still does): the forward then reads
    ``[W_gate; W_up]`` as one tensor, no copy a step. DTensor weights (tensor parallelism)
    are left as they are (each rank's block runs on its local shards: ``tensor_parallel``)."""
    a, b = gate.weight, up.weight
    if is_dtensor(a) or is_dtensor(b):
        return
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device \
            or _weight1(a, b) is not None:
        return
    with torch.no_grad():
        both = torch.cat((a.detach(), b.detach()))
        a.data, b.data = both[:a.shape[0]], both[a.shape[0]:]


__all__ = ["up_source", "act_source", "down_grad", "gated_mlp", "mlp", "pack_gate_up"]
