"""Triton kernel families: a persistent tensor-descriptor (TMA) family for Hopper and a
portable pointer-based family for other GPUs and for Triton's CPU interpreter (layer:
backends)."""
