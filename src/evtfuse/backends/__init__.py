"""Kernel families (layer: backends). Each family says what it supports (a Status with a
reason) and emits code for an epilogue DAG; ``FAMILIES`` lists them, best first."""

from .triton.families import FAMILIES, KernelFamily, TileConfig

__all__ = ["FAMILIES", "KernelFamily", "TileConfig"]
