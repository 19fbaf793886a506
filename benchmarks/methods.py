r"""What ``bandcore bench`` times: one :class:`Method` per way of computing the Band of one divergence.

* ``published``: the published BandPO solver (:mod:`benchmarks.published`, torch; KL, TV and Pearson);
* ``numpy``, ``numba``, ``torch``: the exact solver through the public function, ``band(x, div, delta,
  backend=b)`` (its argument checks included): ratio bounds, the published solver's output.  NumPy is
  single-threaded;
* ``table``, ``table-torch``: the certified lookup table (:class:`bandcore.BandTable`, the shipped one when
  there is one) on a NumPy array and on a CPU tensor, ``table(x, backend="numba")``: ratio bounds too; both run
  its Numba kernel.

Every method but ``numpy`` is ``threaded``: the benchmark times it on one thread and on the run's threads, torch
and Numba set to the same count (:mod:`benchmarks.threads`).

Each method has a timed callable (float32 input) and the same call on float64 points (``values``, ratio bounds
where ``ratios``, else log bounds), whose error against the mpmath oracle is the row's accuracy, and the
contract that error must meet: :data:`EXACT_CONTRACT` for the exact backends, the
table's certificate for a table, none for the published solver.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["BACKENDS", "EXACT_CONTRACT", "TABLE_METHODS", "Method", "method_count", "methods_for"]

#: The numerical contract of the exact solver (docs/math.md §9): |Δ log r| <= 1e-12 · max(1, |log r|).
EXACT_CONTRACT = 1e-12
BACKENDS = ("numpy", "numba", "torch")
TABLE_METHODS = ("table", "table-torch")


@dataclass(frozen=True)
class Method:
    """One timed way of computing the Band (see the module docstring for the names)."""

    name: str
    kind: str  # "published", "exact" or "table"
    threaded: bool  # runs on the threads set (False: NumPy, single-threaded)
    timed: Callable[[Any], Any]  # on the float32 input (a tensor when torch_input)
    values: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]  # (lower, upper) on float64 points
    torch_input: bool
    contract: float | None  # the largest error allowed (None: no contract)
    ratios: bool  # values (and the timed call) are ratio bounds; else log bounds


def _to_numpy(value: Any) -> np.ndarray:
    return value.numpy() if hasattr(value, "numpy") else np.asarray(value)


def _published(divergence: str, delta: float) -> list[Method]:
    import torch

    from .published import PUBLISHED_DIVERGENCES, published_band

    if divergence not in PUBLISHED_DIVERGENCES:
        return []

    def timed(x: Any) -> Any:
        return published_band(x, divergence, delta)

    def values(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        lower, upper = published_band(torch.from_numpy(points), divergence, delta)
        return lower.numpy(), upper.numpy()

    return [Method("published", "published", True, timed, values, True, None, True)]


def _exact(divergence: str, delta: float) -> list[Method]:
    import torch

    from bandcore.band import band

    methods = []
    for backend in BACKENDS:
        torch_input = backend == "torch"

        def timed(x: Any, backend: str = backend) -> Any:
            return band(x, divergence, delta, backend=backend)

        def values(points: np.ndarray, backend: str = backend, torch_input: bool = torch_input):
            arg = torch.from_numpy(points) if torch_input else points
            lower, upper = band(arg, divergence, delta, backend=backend)
            return _to_numpy(lower), _to_numpy(upper)

        methods.append(Method(backend, "exact", backend != "numpy", timed, values, torch_input, EXACT_CONTRACT,
                              True))  # fmt: skip
    return methods


def _tables(divergence: str, delta: float) -> tuple[list[Method], dict[str, Any]]:
    import torch

    from bandcore.tables import BandTable

    start = time.perf_counter()
    try:
        table, origin = BandTable.shipped(divergence, delta), "shipped"
    except FileNotFoundError:
        table, origin = BandTable.build(divergence, delta), "built"
    info = {
        "origin": origin,
        "seconds": time.perf_counter() - start,
        "knots": int(table.n_knots),
        "certified_max_rel_error": table.max_rel_error,
    }

    def numba_ratio(x: Any) -> Any:  # the Numba kernel at every size ("auto" reads small inputs with NumPy)
        return table(x, backend="numba")

    def values_torch(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        lower, upper = numba_ratio(torch.from_numpy(points))
        return lower.numpy(), upper.numpy()

    certified = table.max_rel_error
    methods = [
        Method("table", "table", True, numba_ratio, numba_ratio, False, certified, True),
        Method("table-torch", "table", True, numba_ratio, values_torch, True, certified, True),
    ]
    return methods, info


def methods_for(divergence: str, delta: float) -> tuple[list[Method], dict[str, Any] | None, dict[str, str]]:
    """(methods, table info or None, unavailable: what could not be set up and why) for one divergence."""
    unavailable: dict[str, str] = {}
    methods = _published(divergence, delta) + _exact(divergence, delta)
    info = None
    try:
        tables, info = _tables(divergence, delta)
        methods += tables
    except Exception as err:  # no table for this divergence here (the run goes on without it)
        unavailable[f"table:{divergence}"] = f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"
    return methods, info, unavailable


def method_count(divergence: str) -> int:
    """How many methods :func:`methods_for` returns for ``divergence`` when every one is available."""
    from .published import PUBLISHED_DIVERGENCES

    return (divergence in PUBLISHED_DIVERGENCES) + len(BACKENDS) + len(TABLE_METHODS)
