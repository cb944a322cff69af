"""``evtfuse.gemm`` and ``grouped_gemm`` called with DTensors: where each tensor goes.

Layer: runtime.torch, under ``api`` (which makes one ``DTensorCall`` for a call whose
tensors are DTensors) and over ``runtime.sharding`` (the rules of the epilogue, and the
strategies registered for the operators). Two paths, one decision (``sharding.choose``:
per mesh dimension the mode that moves the fewest bytes, among those the epilogue allows):

- without gradients, ``api`` allocates the missing outputs as DTensors placed as the
  chosen modes place them (``allocate``) and calls the operator on the DTensors: DTensor
  dispatches it through the registered strategies, which keep every output where it is
  and redistribute the inputs;
- with gradients (an input requires grad), or with a row's logsumexp over column shards
  (``local_only``: combined after the run, ``_combined_logsumexp``, as no DTensor
  placement can), ``run_local`` redistributes each input to the
  chosen placements and takes its local shard (``to_local``, differentiable, told where
  each rank's gradient lies: ``sharding.grad_placements_of``, Partial() for an input the
  mode replicates), runs ``evtfuse.gemm`` on the shards (evtfuse's own backward, on local
  tensors) and wraps the results (``DTensor.from_local``, differentiable) in their global
  shapes; an output the caller gave is written by DTensor's ``copy_`` (recorded).

Every tensor of the call must be a DTensor on one mesh (as DTensor's own operators
require): a plain tensor among them is an ``EpilogueError`` naming it. A grouped GEMM's
``offs`` may be a plain tensor (the same on every rank): it is taken as replicated.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from ..errors import EpilogueError
from . import sharding
from .device import is_dtensor


class DTensorCall:
    """One ``gemm`` / ``grouped_gemm`` call whose tensors are DTensors: its rules, its
    modes (one per mesh dimension) and how each tensor is placed under them."""

    def __init__(self, call: str, A, B, offs, parsed, tensors: list, tnames: list,
                 scalars: dict, nones: list, outs: list, onames: list,
                 missing: dict[str, tuple], grad: bool = False):
        if torch.compiler.is_compiling() and not sharding.registered():
            raise NotImplementedError(
                f"{call} with DTensors under torch.compile: evtfuse registers its sharding "
                "rules with DTensor outside compiled code; call evtfuse.runtime.sharding."
                "register() (or evtfuse on DTensors once, eagerly) before compiling")
        api = sharding._torch_api()
        if not sharding.register():
            raise EpilogueError(f"{call}: A is a DTensor, but evtfuse's sharding rules could "
                                f"not be registered with this torch ({torch.__version__}): "
                                f"{sharding.failure()}; pass local tensors", variable="A")
        self.call, self.api = call, api
        named = [("A", A), ("B", B), *zip(tnames, tensors), *zip(onames, outs)]
        first = next((t for _, t in (*named, ("offs", offs)) if isinstance(t, api.DTensor)))
        self.mesh = mesh = first.device_mesh
        for name, t in named:
            if not isinstance(t, api.DTensor):
                what = "a plain tensor" if isinstance(t, torch.Tensor) else type(t).__name__
                raise EpilogueError(
                    f"{call}: some tensors of the call are DTensors and {name} is {what}: "
                    f"pass every tensor as a DTensor on one mesh (one every rank holds "
                    f"whole: distribute_tensor({name}, mesh, [Replicate()])), or local "
                    "tensors only", variable=name)
            if t.device_mesh != mesh:
                raise EpilogueError(f"{call}: {name} is a DTensor on {t.device_mesh}, another "
                                    f"mesh than {first.device_mesh}: every tensor of the call "
                                    "must be on one mesh", variable=name)
        if offs is not None and not isinstance(offs, api.DTensor):
            offs = api.DTensor.from_local(offs, mesh, [api.Replicate()] * mesh.ndim,
                                          run_check=False)
        self.offs = offs
        grouped = offs is not None and B.dim() == 3
        groups = offs.shape[0] if offs is not None and not grouped else None
        operands: dict[str, Any] = {n: (tuple(t.shape), t.dtype)
                                    for n, t in zip(tnames, tensors)}
        operands.update(scalars)
        outputs: dict[str, Any] = {n: (tuple(t.shape), t.dtype) for n, t in zip(onames, outs)}
        outputs.update(missing)
        outputs.update({n: None for n in nones})
        self.rules = sharding.rules_of(parsed, tuple(A.shape), tuple(B.shape), A.dtype,
                                       operands, outputs, grouped, groups)
        if grad:
            self.rules = sharding.for_gradients(self.rules)
        placed = {name: tuple(t.placements) for name, t in named}
        sizes = {name: t.numel() * t.element_size() for name, t in named}
        sizes.update({name: math.prod(int(d) for d in shape) * dtype.itemsize
                      for name, (shape, dtype) in missing.items()})
        fixed = {name: tuple(t.placements) for name, t in zip(onames, outs)}
        fits = sharding.fitting(call, self.rules, mesh, fixed)
        self.modes = sharding.choose(self.rules, mesh, placed, sizes, fits)
        self.parsed, self.missing = parsed, missing

    def placements(self, name: str) -> tuple:
        return sharding.placements_of(self.rules, self.modes, name)

    @property
    def local_only(self) -> bool:
        """Whether the call runs on the local shards even without gradients: an output
        (a row's logsumexp over column shards) that ``run_local`` combines itself."""
        return sharding.COLUMNS in self.modes and bool(self.rules.combined)

    def allocate(self, outs: list, onames: list) -> None:
        """Append the missing outputs to ``outs`` / ``onames``: DTensors in their global
        shapes, placed as the chosen modes place them (what the operator's strategies then
        keep)."""
        from torch.distributed.tensor import empty

        for name, (shape, dtype) in self.missing.items():
            outs.append(empty(shape, dtype=dtype, device_mesh=self.mesh,
                              placements=self.placements(name)))
            onames.append(name)

    def local(self, name: str, t):
        """Input ``name``'s shard under the chosen modes (differentiable: its gradient comes
        back placed as ``sharding.grad_placements_of`` says)."""
        want = self.placements(name)
        grads = list(sharding.grad_placements_of(self.rules, self.modes, name))
        # a part of a sum made of a tensor that is not one (a K split's summand): DTensor's
        # redistribute refuses to make a Partial, so the tensor goes replicated and the first
        # rank of each such mesh dimension keeps it, the others zeros (exact, where a
        # division would round); each rank's gradient is then its part of the sum
        made = [d for d, p in enumerate(want) if p.is_partial() and not t.placements[d].is_partial()]
        via = tuple(self.api.Replicate() if d in made else p for d, p in enumerate(want))
        for d in made:
            grads[d] = self.api.Partial()
        moved = t if tuple(t.placements) == via else t.redistribute(self.mesh, via)
        local = moved.to_local(grad_placements=tuple(grads))
        if any(self.mesh.get_coordinate()[d] for d in made):
            local = torch.where(torch.zeros((), dtype=torch.bool, device=local.device), local, 0)
        return local

    def run_local(self, run: Callable, A, B, named: dict, outputs: tuple, outs: list,
                  onames: list):
        """``run(a, b, [offs,] **operands_and_outputs)`` (``evtfuse.gemm`` or
        ``grouped_gemm`` with the call's options) on the shards, its results as DTensors,
        returned as ``gemm`` returns them (the outputs given are written, by ``copy_``)."""
        api = self.api
        given = dict(zip(onames, outs))
        args: dict[str, Any] = {}
        for name, v in named.items():
            if name in given:  # a template of its shard (a conditional store's holds its data)
                keep = name in self.parsed.conditional_outputs
                args[name] = self._shard_of_output(name, v, keep)
            elif isinstance(v, api.DTensor):
                args[name] = self.local(name, v)
            else:
                args[name] = v
        for name, (_, dtype) in self.missing.items():
            args[f"{name}_dtype"] = dtype
        first = [self.local("A", A), self.local("B", B)]
        if self.offs is not None:
            first.append(self.offs.to_local())
        got = run(*first, **args)
        got = got if isinstance(got, tuple) else (got,)
        results = []
        for name, r in zip(outputs, got):
            if r is None:
                results.append(None)
                continue
            if name in self.rules.combined:
                r = self._combined_logsumexp(name, r)
            shape = tuple(given[name].shape) if name in given else self.missing[name][0]
            wrapped = api.DTensor.from_local(r, self.mesh, self.placements(name),
                                             run_check=False, shape=torch.Size(shape),
                                             stride=_contiguous_stride(shape))
            if name in given:
                given[name].copy_(wrapped)
                wrapped = given[name]
            results.append(wrapped)
        return results[0] if len(outputs) == 1 else tuple(results)

    def _combined_logsumexp(self, name: str, r: torch.Tensor) -> torch.Tensor:
        """A row's logsumexp over the whole row from each column shard's (``r``): ``m +
        log(sum(exp(r - m)))`` with ``m`` the ranks' largest (held fixed: any m gives the
        same value), two all-reduces over the mesh dimensions that split the columns;
        differentiable (each rank's ``r`` gets its share of the gradient)."""
        api = self.api
        final = self.placements(name)
        split = [d for d, m in enumerate(self.modes) if m == sharding.COLUMNS]

        def all_reduce(local, op):
            placed = [api.Partial(op) if d in split else p for d, p in enumerate(final)]
            return api.DTensor.from_local(local, self.mesh, placed, run_check=False) \
                .redistribute(self.mesh, final).to_local()

        x = r.float()  # a 16-bit output's shards combined in fp32, rounded once
        m = all_reduce(x.detach(), "max")
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # rows of inf or -inf
        return (m + torch.log(all_reduce(torch.exp(x - m), "sum"))).to(r.dtype)

    def _shard_of_output(self, name: str, out, keep: bool) -> torch.Tensor:
        """A local tensor for the shard of a given output ``out``: a copy of its shard where
        ``keep`` (a conditional store keeps what its buffer holds), else a new one."""
        want = self.placements(name)
        if keep:
            moved = out if tuple(out.placements) == want else out.redistribute(self.mesh, want)
            return moved.to_local().detach().clone()
        from torch.distributed.tensor import empty

        # (a tensor of its own: to_local's result is a view made by an autograd Function,
        # which evtfuse's recorded copy into it would be refused)
        return torch.empty_like(empty(tuple(out.shape), dtype=out.dtype, device_mesh=self.mesh,
                                      placements=want).to_local())


def _contiguous_stride(shape: tuple) -> tuple:
    stride, step = [], 1
    for size in reversed(shape):
        stride.append(step)
        step *= max(int(size), 1)
    return tuple(reversed(stride))


def has_dtensor(*groups) -> bool:
    """Whether any tensor of ``groups`` (tensors or lists of them) is a DTensor (False at
    once while ``torch.distributed.tensor`` is not imported: none can exist)."""
    if not sharding.loaded():
        return False
    for g in groups:
        if isinstance(g, (list, tuple)):
            if any(is_dtensor(t) for t in g):
                return True
        elif is_dtensor(g):
            return True
    return False


__all__ = ["DTensorCall", "has_dtensor"]
