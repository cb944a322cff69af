"""The Triton kernel families, best first (``FAMILIES``): the backend's public entry point.

Layer: backends/triton. A family answers ``supports(args, target)`` with a ``Status``
carrying the reason, lists ``configs`` best first (a heuristic; the tuner measures), and
turns ``GemmArguments`` into a launch plan for the generated kernel (``plan``). The code
lives in ``family_base`` (tile configs, targets, the base class, shared checks, tile
arithmetic), ``launch_items`` (the launch arguments the families share), and one module
per family (``portable_family``, ``hopper_family``, ``gluon_family``). Invariant: this
module only re-exports them and fixes the families' order; a module global read at call
time (``gluon_family.COOP_CHUNKS``, ``_sms``, ...) is patched where the code reading it
lives, not here.
"""

from __future__ import annotations

from .family_base import (FP8_MIN_CC, INTERPRETER, SMEM_BUDGET, SMEM_LIMIT, KernelFamily,
                          Target, TileConfig, even_tiles, even_tiles_vary, fill_rank,
                          fp8_promote, tile_count, tile_work, triton_cdiv)
from .gluon_family import GluonFamily
from .hopper_family import HopperFamily
from .portable_family import PortableFamily

FAMILIES: tuple[KernelFamily, ...] = (GluonFamily(), HopperFamily(), PortableFamily())

__all__ = ["FAMILIES", "KernelFamily", "TileConfig", "Target", "HopperFamily", "PortableFamily",
           "GluonFamily", "INTERPRETER", "SMEM_LIMIT", "SMEM_BUDGET", "FP8_MIN_CC", "fp8_promote",
           "triton_cdiv", "even_tiles", "even_tiles_vary", "tile_count", "fill_rank", "tile_work"]
