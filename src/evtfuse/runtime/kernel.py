"""A concrete kernel: one family with one tile configuration, for one target.

Layer: runtime. ``supports`` -> ``Status``; ``compile`` generates (or reuses) the module
for the arguments' kernel spec and returns the Triton function; ``run`` launches on the
current stream with no host sync and no allocation, so it can be captured in a CUDA
graph; ``verify`` runs on poisoned outputs and compares with the reference evaluator.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from ..arguments import GemmArguments
from ..backends.triton.codegen import generate
from ..backends.triton.families import KernelFamily, Target, TileConfig
from ..errors import Status, UnsupportedError
from ..ir import OutputKind
from . import cache
from .verify import VerifyResult, compare

log = logging.getLogger("evtfuse")


class Kernel:
    def __init__(self, family: KernelFamily, config: TileConfig, target: Target):
        self.family = family
        self.config = config
        self.target = target
        self.name = f"{family.name}_{config.name}"
        self._fns: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"Kernel({self.name}, {self.target.kind} cc={self.target.cc})"

    def supports(self, args: GemmArguments) -> Status:
        return self.family.supports(args, self.target)

    def source(self, args: GemmArguments) -> str:
        """The generated Triton module for these arguments."""
        return generate(self.family.spec(args, self.config, self.target))

    def _require(self, args: GemmArguments) -> None:
        status = self.supports(args)
        if not status:
            raise UnsupportedError(f"{self.name}: {status.reason}")

    def compile(self, args: GemmArguments):
        """Generate and import the kernel module (once per spec); returns the Triton function."""
        self._require(args)
        spec = self.family.spec(args, self.config, self.target)
        key = spec.key()
        fn = self._fns.get(key)
        if fn is None:
            module = cache.load_module(key, generate(spec))
            fn = module.evtfuse_kernel
            self._fns[key] = fn
            log.debug("kernel %s: module k%s loaded", self.name, key)
        return fn

    def launch_plan(self, args: GemmArguments):
        """(function, positional args, constexpr kwargs, grid) for one launch."""
        fn = self.compile(args)
        dag = self.family.optimized_dag(args)
        pos, consts, grid = self.family.pack(args, dag, self.config, self.target)
        return fn, pos, consts, grid

    def run(self, args: GemmArguments) -> None:
        """Compute every output of ``args`` in place (compiles on first use)."""
        fn, pos, consts, grid = self.launch_plan(args)
        fn[grid](*pos, **consts)

    def verify(self, args: GemmArguments, poison: bool = True) -> VerifyResult:
        """Run on NaN-poisoned outputs and compare every stored output with the reference."""
        from ..reference import evaluate

        values = args.epilogue.values
        stored = [o for o in args.dag.outputs if o.kind is not OutputKind.NONE]
        if poison:
            for o in stored:
                values[o.name].fill_(float("nan"))
        self.run(args)
        if args.A.device.type == "cuda":
            torch.cuda.synchronize(args.A.device)
        ref = evaluate(args, cast=False)
        tf32 = args.allow_tf32 and args.A.dtype == torch.float32 and self.target.kind == "cuda"
        result = VerifyResult(self.name)
        for o in stored:
            result.checks.append(compare(o.name, values[o.name], ref[o.name], o.dtype, tf32,
                                         args.A.dtype))
        return result
