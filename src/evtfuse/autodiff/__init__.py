"""Reverse-mode differentiation of an epilogue DAG (layer: passes).

Two named steps, pure functions of immutable DAGs:

* ``plan_forward(dag, wrt)``: which nodes a gradient reaches (those depending on ``wrt``:
  ``"accum"`` when A or B needs one, and the names of operands that do), an
  ``EpilogueError`` naming the op, its variable and line where a gradient must flow through
  an op without derivative, and what the backward will need from the forward beyond what it
  recomputes: a logsumexp's result in fp32 (the output itself when it is fp32) and a max's
  or min's argument (stored, so that the backward sees exactly the elements the forward
  compared), the result of a per-row reduction feeding computation and, for a max or min
  among those, the mask of its ties (uint8: where its argument equals it, as the forward
  compared them; the backward counts them in the kernel). A row function's
  max (softmax's: ``ir.is_shift``) passes no gradient; shifted_sumexp's rule holds it
  fixed. And the forward's *decisions*: every comparison the backward evaluates on values
  computed from the accumulator (relu's ``x > 0``, where's condition, clamp's bounds, a
  maximum's side, abs's sign), as a uint8 mask, and every step function's value it reads
  (floor, sign, a cast to an integer), in fp32: a recomputed or saved-and-rounded
  accumulator differs from the forward's in its last bits, and a decision taken on it can
  flip, so the backward would differentiate another function. Those are hidden outputs of
  the ``augmented`` forward DAG. In "save" mode (``save_accum``: a dtype), where the
  backward still reads the accumulator, the accumulator itself too, in that dtype (fp32
  where the backward combines it with a reduction the forward computed in fp32, such as
  softmax's logsumexp: a rounded copy there moves ``exp(x - lse)`` by |x| ulps, and where
  a scalar operand's gradient sums it over the whole problem, ``_sums_accumulator``): the
  backward then reads it instead of recomputing ``A @ B``.
* ``backward(plan, graded, wanted)``: the backward DAG, a new epilogue of the same GEMM.
  Its operands are the forward's, the gradients of the outputs in ``graded`` (shaped as
  the outputs: a per-row reduction's gradient is a per-row vector), and the saved values;
  it recomputes every forward value it needs from ``accum`` (from the saved accumulator in
  "save" mode: ``passes.read_saved_accumulator``, so no GEMM) and returns ``D`` (dAccum, the
  accumulator's gradient) and the gradient of each operand in ``wanted``, reduced in the
  same epilogue to the operand's shape (a bias's over the rows, a per-row vector's over the
  columns, a scalar's over everything, each keeping its own batches). Each node's gradient
  comes from its op-table row's rule (``optable``: ``OpDef.grad``); the result is simplified
  by the ordinary pass pipeline (``passes.optimize``): an epilogue DAG like any other, so it
  runs wherever an epilogue runs (``dag_epilogue.DagEpilogue``); ``BackwardPlan.source``
  prints it (``unparse.to_source``) for people.

What is left to the caller (``runtime.autograd``): dA = dAccum @ B^T and dB = A^T @ dAccum,
the sum over L of the gradient of a full operand shared by all batches (an epilogue output
cannot reduce over L alone), and the gradient of a max's or min's saved argument (``Injected``:
the row's rule evaluated in torch, where the ties can be counted).

The package's modules, each in the passes layer (core: ``ir``, ``derivative``, the op
table, ``passes`` and ``unparse``, never a backend or the runtime): ``plans`` (the plans
and ``Saved``, ``Injected``), ``analysis`` (what a gradient reaches, probes of the rules,
the errors for ops without derivative, decisions), ``forward_step`` (``plan_forward``,
``reads_accumulator``, ``wrt_of_dag``), ``backward_step`` (``backward``) and ``caller``
(what the caller computes in torch: ``injected_gradient``, ``output_shape``, ...).
Everything is importable from ``evtfuse.autodiff`` as it was from the one module this
package was.
"""

from __future__ import annotations

from .analysis import decision_key
from .backward_step import backward
from .caller import first_batch, injected_gradient, output_shape, reduced_dims
from .forward_step import plan_forward, reads_accumulator, wrt_of_dag
from .plans import (ACCUM, ACCUM_TARGETS, BackwardPlan, ForwardPlan, Injected, Saved,
                    accum_target, differentiable_dtype)

__all__ = ["ACCUM", "ACCUM_TARGETS", "accum_target", "Saved", "ForwardPlan", "Injected",
           "BackwardPlan", "plan_forward", "decision_key", "backward", "reads_accumulator",
           "output_shape", "reduced_dims", "first_batch", "injected_gradient", "wrt_of_dag",
           "differentiable_dtype"]
