"""Which parametrisations of a test run in the quick tier (conftest.py: the rest are marked
``slow`` and run with ``--full`` or ``-m slow``)."""

from __future__ import annotations

import pytest


def quick(values, keep, ids=None, args=1):
    """``values`` as ``parametrize`` arguments, every one not in ``keep`` (values, or their
    ids when ``ids`` is given) marked ``slow``: for a list of cases of which a few stand for
    the rest in the quick tier (``pytest.mark.cover`` is for grids of several parameters).
    ``args`` > 1: each value is a tuple of that many arguments' values."""
    names = list(ids) if ids is not None else list(values)
    missing = [k for k in keep if k not in names]
    assert not missing, f"not among the values: {missing}"
    return [pytest.param(*(v if args > 1 else (v,)), id=None if ids is None else i,
                         marks=() if i in keep else pytest.mark.slow)
            for v, i in zip(values, names)]
