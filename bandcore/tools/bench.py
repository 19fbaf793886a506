r"""``bandcore bench``: our Band solvers side by side with the published solver and a memory copy.

One process, one run.  On :math:`n` float32 log-probabilities drawn like LLM tokens (:func:`llm_like_log_probs`)
it times, best of ``repeats`` calls with the first call (imports, Numba compilation or cache load) excluded and
reported separately:

* the published BandPO solver (:mod:`bandcore.tools.published`: bisection, 50 iterations, host-side checks);
* each backend of the one solver through the public function, ``band_log(x, div, delta, backend=b)`` for
  ``b`` in ``numpy``, ``numba``, ``torch``, and the lookup-table path (:class:`bandcore.BandTable`,
  NumPy/Numba and torch) for each divergence;
* a plain copy of the input (the memory roofline).  A Band evaluation must read the input and write two
  outputs, so at the copy's bandwidth :math:`B` (bytes moved per second, read + write) it can reach at most
  :math:`B / (3 \cdot \mathrm{itemsize})` tokens per second; ``roofline_fraction`` is the measured rate over
  that bound.

Accuracy is measured on a subsample (quantiles of the input plus log-uniform points over its range) against
the 50-digit mpmath oracle, always with float64 inputs so the solver's error is not hidden by float32
rounding, as :math:`|\Delta \log r| / \max(1, |\log r|)` (the numerical contract's measure; it is the
relative error of the ratio whenever :math:`e^{-1} \le r \le e`).

Threads: torch (the published solver, the torch backend, the torch table path, the copy) and Numba run with
the same number of threads, the machine's cores unless ``threads`` is given, so the comparison with the
published solver is like for like.  The count is in the report (``threads``) and restored afterwards.

Peak memory is measured in a fresh subprocess per (method, size): ``/proc/self/clear_refs`` resets the
resident-set high-water mark after the input is built and the method warmed up, and the peak of ``VmHWM``
over the resident size before the call is what the call allocated (tracemalloc cannot see Numba's or
torch's allocations).  Tests never assert a time; they run ``--quick``.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..tables import rel_log_error
from .bench_memory import _get_threads, _measure_memory, _resolve_threads, _set_threads
from .bench_report import format_report

__all__ = ["format_report", "llm_like_log_probs", "rel_log_error", "run_bench"]

_DEFAULT_DIVERGENCES = ("kl", "tv", "pearson", "hellinger", "js")
_BACKENDS = ("numpy", "numba", "torch")
_MEMORY_METHODS = ("numba", "torch", "table")
_TABLE_METHODS = ("table", "table-torch")


# --------------------------------------------------------------------------------------------------------
# Inputs and the error measure
# --------------------------------------------------------------------------------------------------------


def llm_like_log_probs(n: int, seed: int = 0) -> np.ndarray:
    r"""``n`` float32 log-probabilities distributed like sampled LLM tokens (deterministic in ``seed``).

    A three-part mixture, each part log-uniform:

    * 75 % confident tokens: :math:`1 - p \in [10^{-7}, 10^{-1}]` (so :math:`p > 0.9`),
      :math:`\log p = \mathrm{log1p}(-(1-p))`;
    * 20 % middle: :math:`p \in [10^{-3}, 0.9]`;
    * 5 % heavy tail: :math:`p \in [10^{-10}, 10^{-3}]`.

    Drawn with ``numpy.random.default_rng(seed)``, computed in float64 and rounded once to float32.
    """
    rng = np.random.default_rng(seed)
    part = rng.choice(3, size=n, p=[0.75, 0.20, 0.05])
    u = rng.random(n)
    log10_bounds = np.array([[-7.0, -1.0], [-3.0, np.log10(0.9)], [-10.0, -3.0]])
    lo, hi = log10_bounds[part, 0], log10_bounds[part, 1]
    value = 10.0 ** (lo + (hi - lo) * u)
    log_p = np.where(part == 0, np.log1p(-value), np.log(value))
    return np.minimum(log_p, 0.0).astype(np.float32)


def _accuracy_points(x: np.ndarray, m: int, seed: int) -> np.ndarray:
    """``m`` float64 points: quantiles of ``x`` and log-uniform p over its range (float32-representable)."""
    rng = np.random.default_rng(seed + 1)
    quantiles = np.quantile(x.astype(np.float64), np.linspace(0.0, 1.0, m - m // 2))
    log10_p = np.log10(np.exp(np.array([x.min(), min(x.max(), -1e-7)], dtype=np.float64)))
    spread = np.log(10.0 ** rng.uniform(log10_p[0], log10_p[1], m // 2))
    return np.sort(np.concatenate([quantiles, spread]).astype(np.float32).astype(np.float64))


# --------------------------------------------------------------------------------------------------------
# Methods: name -> (callable on the float32 input returning two arrays/tensors, one on float64 points -> logs)
# --------------------------------------------------------------------------------------------------------


def _to_numpy(value) -> np.ndarray:
    return value.numpy() if hasattr(value, "numpy") else np.asarray(value)


def _published_methods(divergence: str, delta: float) -> dict[str, tuple[Callable, Callable]]:
    import torch

    from .published import PUBLISHED_DIVERGENCES, published_band

    if divergence not in PUBLISHED_DIVERGENCES:
        return {}

    def timed(x):
        return published_band(x, divergence, delta)

    def logs(points):
        lower, upper = published_band(torch.from_numpy(points), divergence, delta)
        with np.errstate(divide="ignore"):  # a lower bound of 0 is log r = -inf
            return np.log(lower.numpy()), np.log(upper.numpy())

    return {"published": (timed, logs, "torch")}


def _backend_methods(divergence: str, delta: float, backends) -> dict[str, tuple[Callable, Callable, str]]:
    """``band_log(..., backend=b)`` for each backend: the public function, its checks included."""
    import torch

    from ..band import band_log

    methods = {}
    for backend in backends:
        kind = "torch" if backend == "torch" else "numpy"

        def timed(x, backend=backend):
            return band_log(x, divergence, delta, backend=backend)

        def logs(points, backend=backend, kind=kind):
            arg = torch.from_numpy(points) if kind == "torch" else points
            return tuple(_to_numpy(v) for v in band_log(arg, divergence, delta, backend=backend))

        methods[backend] = (timed, logs, kind)
    return methods


def _table_methods(divergence: str, delta: float) -> tuple[dict[str, tuple[Callable, Callable, str]], dict]:
    import torch

    from ..tables import BandTable

    start = time.perf_counter()
    try:
        table = BandTable.shipped(divergence, delta)
        origin = "shipped"
    except FileNotFoundError:
        table = BandTable.build(divergence, delta)
        origin = "built"
    info = {
        "origin": origin,
        "seconds": time.perf_counter() - start,
        "knots": int(table.n_knots),
        "certified_max_rel_error": table.max_rel_error,
    }

    def logs_numpy(points):
        return table.log(points)

    def logs_torch(points):
        return tuple(v.numpy() for v in table.log(torch.from_numpy(points)))

    paths = ((table.log, logs_numpy, "numpy"), (table.log, logs_torch, "torch"))
    methods = dict(zip(_TABLE_METHODS, paths, strict=True))
    return methods, info


# --------------------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------------------


def _time(fn: Callable, arg, repeats: int) -> tuple[float, float]:
    """(first call seconds, best of ``repeats`` further calls)."""
    start = time.perf_counter()
    fn(arg)
    first = time.perf_counter() - start
    best = np.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn(arg)
        best = min(best, time.perf_counter() - start)
    return first, best


def _copy_roofline(x: np.ndarray, x_torch, repeats: int) -> dict[str, Any]:
    """Bandwidth of a plain allocating copy (NumPy and torch); the faster sets the roofline."""
    out: dict[str, Any] = {}
    moved = 2 * x.nbytes  # read + write
    for name, fn, arg in (("numpy", np.copy, x), ("torch", lambda t: t.clone(), x_torch)):
        _, best = _time(fn, arg, max(repeats, 5))
        out[name] = {"seconds": best, "gb_per_s": moved / best / 1e9}
    bandwidth = max(out["numpy"]["gb_per_s"], out["torch"]["gb_per_s"]) * 1e9
    out["bytes_per_token"] = 3 * x.itemsize  # input + two outputs
    out["roofline_mtok_s"] = bandwidth / out["bytes_per_token"] / 1e6
    return out


# --------------------------------------------------------------------------------------------------------
# Peak memory (fresh subprocess per measurement)
# --------------------------------------------------------------------------------------------------------


class _Progress:
    """A tqdm bar on stderr (when ``enabled`` and tqdm is installed), otherwise nothing."""

    def __init__(self, total: int, enabled: bool | None):
        if enabled is None:
            enabled = sys.stderr.isatty()
        self._bar = None
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self._bar = tqdm(total=total, desc="bench", unit="step", file=sys.stderr, leave=False)

    def step(self, message: str, count: int = 1) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(message, refresh=False)
            self._bar.update(count)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


# --------------------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------------------


def run_bench(
    n: int = 1_000_000,
    *,
    divergences: tuple[str, ...] = _DEFAULT_DIVERGENCES,
    delta: float = 0.05,
    repeats: int = 5,
    oracle_points: int = 256,
    memory_sizes: tuple[int, ...] = (1_000_000, 10_000_000),
    seed: int = 0,
    threads: int | None = None,
    progress: bool | None = None,
) -> dict[str, Any]:
    """Run the benchmark and return everything as a JSON-serialisable dict (see the module docstring).

    ``threads``: torch and Numba threads (default: the machine's cores).  ``progress``: a tqdm bar on stderr;
    ``None`` shows it when stderr is a terminal, ``False`` never.
    """
    threads = _resolve_threads(threads)
    saved = _get_threads()
    from .published import PUBLISHED_DIVERGENCES

    per_divergence = [1 + (d in PUBLISHED_DIVERGENCES) + len(_BACKENDS) + len(_TABLE_METHODS) for d in divergences]
    steps = sum(per_divergence) + len(memory_sizes) * len(_MEMORY_METHODS)
    bar = _Progress(steps, progress)
    try:
        _set_threads(threads)
        return _run(n, divergences, delta, repeats, oracle_points, memory_sizes, seed, threads, bar)
    finally:
        bar.close()
        _set_threads(*saved)


def _run(n, divergences, delta, repeats, oracle_points, memory_sizes, seed, threads, bar) -> dict[str, Any]:
    import torch

    from .. import __version__
    from ..oracle import reference_band_log

    torch_threads, numba_threads = _get_threads()
    x = llm_like_log_probs(n, seed)
    x_torch = torch.from_numpy(x)
    points = _accuracy_points(x, oracle_points, seed)
    report: dict[str, Any] = {
        "bandcore_version": __version__,
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpu_count": os.cpu_count(),
            "torch": torch.__version__,
            "torch_threads": torch_threads,
            "numba_threads": numba_threads,
            "numpy": np.__version__,
            "gpu": "not used (CPU run)",
        },
        "n_tokens": n,
        "dtype": "float32",
        "delta": delta,
        "seed": seed,
        "repeats": repeats,
        "threads": threads,
        "generator": llm_like_log_probs.__doc__.strip().splitlines()[0],
        "accuracy_points": len(points),
        "accuracy_measure": "max |Δ log r| / max(1, |log r|) vs the mpmath oracle (50 digits), float64 inputs",
        "copy": _copy_roofline(x, x_torch, repeats),
        "results": [],
        "tables": {},
        "unavailable": {},
    }
    roofline = report["copy"]["roofline_mtok_s"]
    for divergence in divergences:
        exact_lo, exact_up = reference_band_log(divergence, points, delta)
        bar.step(f"{divergence}: oracle")
        methods: dict[str, tuple[Callable, Callable, str]] = {}
        methods.update(_published_methods(divergence, delta))
        methods.update(_backend_methods(divergence, delta, _BACKENDS))
        try:
            table_methods, info = _table_methods(divergence, delta)
            methods.update(table_methods)
            report["tables"][divergence] = info
        except (ImportError, ValueError) as err:
            report["unavailable"][f"table:{divergence}"] = str(err)
            bar.step(f"{divergence}: no table", len(_TABLE_METHODS))
        published_seconds = None
        for name, (timed, logs, kind) in methods.items():
            bar.step(f"{divergence}: {name}")
            try:
                first, best = _time(timed, x_torch if kind == "torch" else x, repeats)
                approx_lo, approx_up = logs(points)
            except (ImportError, ValueError, TypeError) as err:  # a backend not (yet) available
                report["unavailable"][f"{divergence}:{name}"] = f"{type(err).__name__}: {err}"
                continue
            err_lo = rel_log_error(approx_lo, exact_lo)
            err_up = rel_log_error(approx_up, exact_up)
            if name == "published":
                published_seconds = best
            mtok_s = n / best / 1e6
            report["results"].append(
                {
                    "divergence": divergence,
                    "method": name,
                    "seconds": best,
                    "first_call_seconds": first,
                    "mtok_s": mtok_s,
                    "speedup_vs_published": None if published_seconds is None else published_seconds / best,
                    "roofline_fraction": mtok_s / roofline,
                    "max_rel_err_lower": float(err_lo.max()),
                    "max_rel_err_upper": float(err_up.max()),
                    "max_rel_err": float(max(err_lo.max(), err_up.max())),
                }
            )
    report["memory"] = []
    for size in memory_sizes:
        for method in _MEMORY_METHODS:
            bar.step(f"memory: {method} at {size:,}")
            report["memory"].append(_measure_memory(method, "kl", delta, size, threads))
    return report
