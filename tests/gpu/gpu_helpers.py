"""Helpers shared by the GPU-tier test modules (imported by name: pytest puts this folder
on ``sys.path`` for the test modules beside it)."""

from __future__ import annotations

import pytest

import evtfuse
from evtfuse import get_kernels


def family_kernels(args, family):
    """The kernels of one family for ``args``, best first; fails with ``explain`` if none."""
    ks = [k for k in get_kernels(args) if k.family.name == family]
    if not ks:
        pytest.fail(f"no {family} kernel for these arguments:\n{evtfuse.explain(args)}")
    return ks


def check(args, family, n_configs=2):
    """Verify the first ``n_configs`` kernels of ``family`` (poisoned outputs, reference)."""
    for k in family_kernels(args, family)[:n_configs]:
        result = k.verify(args)
        assert result, result.report()
