"""The fast tier's samples: a parametrized check keeps a few of its cases in plain ``pytest`` and runs the rest
only in the full suite (``-m "slow or not slow"``), so no case is dropped and no assertion changes."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
from _pytest.mark.structures import ParameterSet


def sampled(values: Iterable[Any], fast: Iterable[Any]) -> list[Any]:
    """``values`` as parameters, every one not in ``fast`` marked slow (a ``pytest.param`` is matched by its id,
    or by its single value)."""
    fast = list(fast)
    out = []
    for value in values:
        if isinstance(value, ParameterSet):
            key = value.id if value.id is not None else value.values[0]
            out.append(value if key in fast else pytest.param(*value.values, id=value.id,
                                                               marks=[*value.marks, pytest.mark.slow]))
        else:
            out.append(value if value in fast else pytest.param(value, marks=pytest.mark.slow))
    missing = [f for f in fast if f not in [v.id if isinstance(v, ParameterSet) else v for v in values]
               and f not in [v.values[0] for v in values if isinstance(v, ParameterSet)]]
    if missing:
        raise ValueError(f"fast samples {missing} are not among the parameters")
    return out


def crossed(cases: Iterable[Any], backends: Iterable[str], fast_numba: Iterable[Any]) -> list[ParameterSet]:
    """Every (case, backend) as parameters ``(*case, backend)`` (a case that is not a tuple is one value): on
    Numba, whose first call compiles a module per generator (~10 s on a cold cache), only the cases whose first
    value is in ``fast_numba`` stay in the fast tier; the others are marked slow and run in the full suite."""
    rows, fast_numba = [case if isinstance(case, tuple) else (case,) for case in cases], list(fast_numba)
    out = []
    for values in rows:
        for backend in backends:
            slow = backend == "numba" and values[0] not in fast_numba
            out.append(pytest.param(*values, backend, marks=[pytest.mark.slow] if slow else []))
    missing = [f for f in fast_numba if f not in {values[0] for values in rows}]
    if missing:
        raise ValueError(f"fast Numba samples {missing} are not among the cases")
    return out
