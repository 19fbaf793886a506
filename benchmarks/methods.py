r"""What ``bandcore bench`` times: one :class:`Method` per way of computing the Band of one divergence.

* ``published``: the published BandPO solver (:mod:`benchmarks.published`, torch; KL, TV and Pearson) on the
  float32 tensor, computing in float32 as trainers run it: **the baseline** of every speedup column;
* ``published-fp64``: the same solver on the log-probs as a float64 tensor (cast once, outside the timing), so
  computing in float64;
* ``auto``: ``band(x, div, delta)`` as a user calls it, the default backend (``"auto"``: Numba where its kernel
  is ready or the call is large, else NumPy; :meth:`bandcore.band.BoundBand.pick`), on the NumPy array; ``picks``
  says which backend a call on an input runs (a user's first call, in a fresh process, is measured apart:
  :mod:`benchmarks.first_call`);
* ``numpy``, ``numba``, ``torch``: the exact solver through the public function with the backend forced,
  ``band(x, div, delta, backend=b)`` (its argument checks included): ratio bounds, the published solver's
  output.  NumPy is single-threaded.  Torch on the CPU hands the few tokens its seeded pass leaves to the Numba
  kernel of log bounds once that is ready (:class:`bandcore.kernels.backends.TensorSolver`), else to NumPy; the
  row's first call, which is not timed, readies it (:func:`ready_leftover_kernels`), as on a machine where it
  has run before;
* ``table``, ``table-torch``: the certified lookup table (:class:`bandcore.BandTable`, the shipped one when
  there is one) on a NumPy array and on a CPU tensor, ``table(x, backend="numba")``: ratio bounds too; both run
  its Numba kernel.

Every method but ``numpy`` is ``threaded``: the benchmark times it on one thread and on the run's threads, torch
and Numba set to the same count (:mod:`benchmarks.threads`).

Each method has a timed callable (on the float32 input, or ``dtype``) and the same call on float64 points
(``values``; the float32 baseline on those points rounded to float32, which they are exactly, and its float32
bounds widened to float64: ratio bounds where ``ratios``, else log bounds), whose error against the mpmath
oracle is the row's accuracy, and the contract that error must meet: :data:`EXACT_CONTRACT` for the exact
backends, the table's certificate for a table, none for the published solver.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

__all__ = ["BACKENDS", "BASELINE", "EXACT_CONTRACT", "PUBLISHED_METHODS", "TABLE_METHODS", "Method", "method_count",
           "methods_for", "ready_leftover_kernels"]

#: The numerical contract of the exact solver (docs/math.md §9): |Δ log r| <= 1e-12 · max(1, |log r|).
EXACT_CONTRACT = 1e-12
BACKENDS = ("numpy", "numba", "torch")
#: the published solver's methods: name -> the dtype of its input (and of its arithmetic)
PUBLISHED_METHODS = {"published": "float32", "published-fp64": "float64"}
#: the method every speedup is measured against, and the dtype it computes in
BASELINE = ("published", PUBLISHED_METHODS["published"])
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
    dtype: str = "float32"  # of the timed call's input (the float32 log-probs, cast once before timing)
    picks: Callable[[np.ndarray], str] | None = None  # the backend a call picks on this input (None: fixed)


def _to_numpy(value: Any) -> np.ndarray:
    return value.numpy() if hasattr(value, "numpy") else np.asarray(value)


def _published(divergence: str, delta: float) -> list[Method]:
    import torch

    from .published import PUBLISHED_DIVERGENCES, published_band

    if divergence not in PUBLISHED_DIVERGENCES:
        return []

    def timed(x: Any) -> Any:
        return published_band(x, divergence, delta)

    methods = []
    for name, dtype in PUBLISHED_METHODS.items():

        def values(points: np.ndarray, dtype: str = dtype) -> tuple[np.ndarray, np.ndarray]:
            lower, upper = published_band(torch.from_numpy(points.astype(dtype)), divergence, delta)
            return lower.numpy().astype(np.float64), upper.numpy().astype(np.float64)

        methods.append(Method(name, "published", True, timed, values, True, None, True, dtype=dtype))
    return methods


def _default(divergence: str, delta: float) -> list[Method]:
    from bandcore.band import band, bind

    bound = bind(divergence, delta, log=False)  # reads which backend band()'s default picks, by the same rule

    def timed(x: Any) -> Any:
        return band(x, divergence, delta)

    def values(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        lower, upper = band(points, divergence, delta)
        return lower, upper

    def picks(x: np.ndarray) -> str:
        return bound.pick(x.size, x.dtype)

    return [Method("auto", "exact", True, timed, values, False, EXACT_CONTRACT, True, picks=picks)]


@cache
def ready_leftover_kernels(divergence: str, delta: float) -> None:
    """Compile, or load from the cache on disk, the Numba kernels to which torch on the CPU hands the tokens its
    seeded pass leaves (log bounds of float64 tokens, serial and parallel drivers), so that the ``torch`` row
    times torch's pass and those kernels, not a compile or NumPy's fallback for them."""
    from bandcore.band import band_log
    from bandcore.kernels.backends import SERIAL_MAX

    for size in (8, SERIAL_MAX + 1):
        band_log(np.full(size, -0.5), divergence, delta, backend="numba")


def _exact(divergence: str, delta: float) -> list[Method]:
    import torch

    from bandcore.band import band

    methods = []
    for backend in BACKENDS:
        torch_input = backend == "torch"

        def timed(x: Any, backend: str = backend) -> Any:
            if backend == "torch":
                ready_leftover_kernels(divergence, delta)  # once (cached); the first call is not timed
            return band(x, divergence, delta, backend=backend)

        def values(points: np.ndarray, backend: str = backend, torch_input: bool = torch_input):
            if backend == "torch":
                ready_leftover_kernels(divergence, delta)
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
    methods = _published(divergence, delta) + _default(divergence, delta) + _exact(divergence, delta)
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

    published = len(PUBLISHED_METHODS) if divergence in PUBLISHED_DIVERGENCES else 0
    return published + 1 + len(BACKENDS) + len(TABLE_METHODS)
