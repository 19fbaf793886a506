r"""Lookup tables of the Band with a certified error: build, certify, save, load, evaluate.

A :class:`BandTable` holds, for one divergence and one :math:`\delta`, both bounds as cubic Hermite interpolants
in :math:`L = -\log p` on octave cells (:mod:`bandcore.tables.evaluate`: the cell of a token is read off the bits
of its log-probability), with slopes from implicit differentiation of :math:`g_f(p, r) = \delta`
(:mod:`bandcore.tables.pieces`), so a knot costs one exact solve and no finite differences.  Building:
:mod:`bandcore.tables.bounds`.

**Certificate.** The error measure is the numerical contract's,
:math:`e = |\Delta \log r| / \max(1, |\log r|)` — the relative error of the ratio bound wherever
:math:`e^{-1} \le r \le e` and the relative error of :math:`\log r` beyond.  ``max_rel_error`` is the largest
:math:`e` over the final check points, times 1.25 for the gaps between them (the Hermite error is a smooth
:math:`\propto s^2(1-s)^2` bump per cell, so 11 samples see its peak to within a few per cent), rounded up to
3 significant digits (:func:`~bandcore.tables.tabulated.certificate`).  The check
points include the tails outside the grid: :math:`L` from :math:`2^{-121}` down to 0 (:math:`p = 1`), where the
end value is used, and :math:`L = 690, 700, 1000`, where the end tangent is (the stored functions are linear in
:math:`L` up to :math:`O(p)`).

**Loading** checks the file (:mod:`bandcore.tables.formats`), the grid, that the label names the stored
generator, and re-evaluates :data:`SPOT_CHECKS` seeded points against the exact solver
(:func:`bandcore.band.band_log`): a table whose contents are not the Band it is labelled with does not load.

**Tables over δ** (:class:`~bandcore.tables.grid2d.BandTable2D`, from ``BandTable.build(div, delta=(lo, hi))``).

>>> table = BandTable.build("kl", 0.05)                         # doctest: +SKIP
>>> lower, upper = table(old_log_prob)                           # doctest: +SKIP
>>> table.save("kl_0.05.npz"); BandTable.load("kl_0.05.npz")     # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .._contract import LOG_P_TOLERANCE as _LOG_P_TOLERANCE
from .._contract import check_backend
from ..band import AUTO_NUMBA_MIN_SIZE, band_log
from ..divergences import Divergence, resolve_regions
from ..kernels.lookup_drivers import lookup_ready
from .bound_io import (
    bound_arrays,
    bound_metadata,
    builder_of,
    check_delta,
    check_target,
    divergence_of,
    split_doc,
    split_from_arrays,
)  # fmt: skip
from .bounds import build_bound
from .evaluate import eval_log, eval_log_torch
from .formats import SHIPPED_DIR, TableFileError, read_table, shipped_name, write_table
from .near import exact_bound_log
from .tabulated import BUILDER, DEFAULT_TARGET, ERROR_MEASURE, TabulatedBound, certificate, exact_solver, rel_log_error
from .tails import tail_error
from .threshold import SplitBound

__all__ = ["BUILDERS", "LOADERS", "SPOT_CHECKS", "BandTable", "spot_check"]

#: points per file re-evaluated with the exact solver on load
SPOT_CHECKS = 8
#: table kind in a file's metadata -> ``from_arrays(arrays, meta)`` (the 2-D module registers "2d")
LOADERS: dict[str, Callable[[dict[str, np.ndarray], dict[str, Any]], Any]] = {}
#: table kind -> ``build(divergence, delta, target=, progress=)`` for a ``delta`` that is a pair (2-D)
BUILDERS: dict[str, Callable[..., Any]] = {}
_SOLVER_SLACK = 1e-12  # the exact solver's own error, beyond the table's certificate


class BandTable:
    r"""The Band of one divergence at one :math:`\delta`, tabulated with a certified error.

    Build with :meth:`build`, evaluate with ``table(old_log_prob) -> (lower, upper)`` or
    :meth:`log` ``-> (log_lower, log_upper)``; NumPy in → NumPy out (Numba kernel, parallel), torch in → torch
    out on the same device and dtype (no host synchronisation).  Computation is in float64, rounded once to
    the input's floating dtype.  ``max_rel_error`` bounds :math:`|\Delta\log r|/\max(1,|\log r|)` against the
    exact solver for every ``old_log_prob``.
    """

    def __init__(self, *, divergence: str, generator: str, delta: float, lower: TabulatedBound,
                 upper: TabulatedBound, max_rel_error: float, target: float, checked_points: int,
                 builder: str) -> None:  # fmt: skip
        self.divergence_name = divergence
        self.generator = generator
        self.delta = float(delta)
        self.lower = lower
        self.upper = upper
        self.max_rel_error = float(max_rel_error)
        self.target = float(target)
        self.checked_points = int(checked_points)
        self.builder = builder
        self._torch_cache: dict[Any, tuple] = {}

    # ---- construction ----------------------------------------------------------------------------------
    @classmethod
    def build(cls, divergence: str | Divergence, delta: float | tuple[float, float], *,
              target: float = DEFAULT_TARGET, progress: bool = False):  # fmt: skip
        r"""Tabulate the Band of ``divergence`` at ``delta`` with certified error ≤ ``target``.

        ``divergence``: any spelling (name, alias, ``alpha(a)``, formula in u, :class:`~bandcore.Divergence`);
        ``delta``: :math:`\delta > 0`, or ``(lo, hi)`` for a :class:`~bandcore.tables.grid2d.BandTable2D` over
        :math:`\delta \in [lo, hi]`; ``target``: error target for :math:`|\Delta \log r| / \max(1, |\log r|)`
        (default 1e-7); ``progress``: a tqdm progress bar.
        """
        div, delta = resolve_regions(divergence, delta)  # a transform's radius is mapped here, once
        if isinstance(delta, (tuple, list)):
            return BUILDERS["2d"](div, tuple(delta), target=target, progress=progress)
        delta = check_delta(delta)
        check_target(target)
        solve = exact_solver()
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(desc=f"table {div.name} delta={delta:g}", unit="pass")
        try:
            lower, err_lo, n_lo = build_bound(div, delta, "lower", target, solve, bar)
            upper, err_up, n_up = build_bound(div, delta, "upper", target, solve, bar)
        finally:
            if bar is not None:
                bar.close()
        return cls(divergence=div.name, generator=div.formula, delta=delta, lower=lower, upper=upper,
                   max_rel_error=certificate(max(err_lo, err_up)), target=target, checked_points=n_lo + n_up,
                   builder=BUILDER)  # fmt: skip

    @property
    def divergence(self) -> Divergence:
        """The :class:`~bandcore.Divergence` (catalogue entry, or rebuilt from the stored generator)."""
        return divergence_of(self.divergence_name, self.generator)

    @property
    def n_knots(self) -> int:
        """Total number of knots (both bounds)."""
        return len(self.lower.knots) + len(self.upper.knots)

    # ---- evaluation --------------------------------------------------------------------------------------
    def log(self, old_log_prob, *, backend: str = "auto"):
        """(log_lower, log_upper) for ``old_log_prob`` (NumPy array, scalar, or torch tensor).

        One evaluation source (:mod:`bandcore.kernels.lookup`) on every backend: ``"auto"`` reads a CPU input
        with Numba where its lookup kernel for that size class, dtype and output is ready (it ran in this process
        or is in the cache on disk: no compile), else with Numba from :data:`bandcore.band.AUTO_NUMBA_MIN_SIZE`
        tokens on and with NumPy below (so a small lookup on a cold cache waits for no compile), a tensor on an
        accelerator with torch; ``"numpy"``, ``"numba"``, ``"torch"``
        force one.  A torch input never raises: log p above the tolerance gives NaN (no host synchronisation).
        """
        return self._bounds(old_log_prob, backend, False)

    def __call__(self, old_log_prob, *, backend: str = "auto"):
        """(lower, upper) ratio bounds: ``exp`` of :meth:`log` rounded once (lower 0 where saturated, upper 1/p);
        the Numba kernel takes the exp in its last loop, and reads the far part of a lower bound split at its
        threshold, which stores r, as the ratio itself (within 2 ulp of the exp of :meth:`log`)."""
        return self._bounds(old_log_prob, backend, True)

    def to_jax(self, *, log: bool = False) -> Callable:
        """A pure JAX function ``f(old_log_prob) -> (lower, upper)`` (``log=True``: log bounds): ``jax.jit``- and
        ``jax.vmap``-able, the lookup of :mod:`bandcore.kernels.lookup` in ``jax.numpy``
        (:mod:`bandcore.tables.jax_reader`).  In float64 with ``jax_enable_x64``, else in float32; NaN (not an
        error) for log p above the tolerance.  Imports jax."""
        from .jax_reader import check_log_flag, table_to_jax

        return table_to_jax(self.lower.kernel, self.upper.kernel, log=check_log_flag(log))

    def _bounds(self, old_log_prob, backend: str, ratios: bool):
        backend = check_backend(backend)
        if _is_torch(old_log_prob):
            import torch

            dtype = _torch_float_dtype(old_log_prob)
            # (the CPU path runs no torch op that autograd could record; each attribute read here costs ~0.1-0.5 us)
            tensor = old_log_prob.detach() if old_log_prob.requires_grad else old_log_prob
            on_cpu = tensor.is_cpu
            if backend == "torch" or (backend == "auto" and not on_cpu):
                with torch.no_grad():
                    lp = tensor.to(torch.float64)
                    lo, up = eval_log_torch(lp, *self._torch_arrays(lp.device), _LOG_P_TOLERANCE)
                    lo, up = (lo.exp(), up.exp()) if ratios else (lo, up)
                    return lo.to(dtype), up.to(dtype)
            return self._cpu_tensor(tensor if on_cpu else tensor.cpu(), dtype, backend, on_cpu, tensor.device, ratios)
        arr = np.asarray(old_log_prob)
        if arr.dtype not in (np.float16, np.float32, np.float64):
            raise TypeError(f"old_log_prob must hold float16/32/64 log-probabilities, got dtype {arr.dtype}")
        flat = np.ascontiguousarray(arr).reshape(-1)
        if flat.dtype == np.float16:
            flat = flat.astype(np.float32)  # Numba has no float16 arithmetic
        out_dtype = np.float32 if arr.dtype == np.float16 else arr.dtype
        lo, up, above = self._lookup(flat, out_dtype, backend, ratios)
        if above:
            raise ValueError(
                f"old_log_prob must be <= 0 (log-probabilities; values up to {_LOG_P_TOLERANCE:g} are read as 0), "
                f"got {above} value(s) above, max {np.nanmax(arr)!r}"
            )
        if lo.dtype == arr.dtype:
            return lo.reshape(arr.shape), up.reshape(arr.shape)
        with np.errstate(over="ignore"):  # float16 output: a ratio beyond its range is inf
            return lo.reshape(arr.shape).astype(arr.dtype), up.reshape(arr.shape).astype(arr.dtype)

    def _lookup(self, flat: np.ndarray, out_dtype, backend: str, ratios: bool):
        if backend == "torch":
            import torch

            lo, up = eval_log_torch(torch.from_numpy(flat.astype(np.float64)), *self._torch_arrays("cpu"),
                                    _LOG_P_TOLERANCE)  # fmt: skip
            lo, up = (lo.exp(), up.exp()) if ratios else (lo, up)
            return lo.numpy().astype(out_dtype), up.numpy().astype(out_dtype), int((flat > _LOG_P_TOLERANCE).sum())
        if backend == "auto":
            ready = flat.size >= AUTO_NUMBA_MIN_SIZE or lookup_ready(flat.size, flat.dtype, out_dtype, ratios)
            backend = "numba" if ready else "numpy"
        return eval_log(flat, self.lower.kernel, self.upper.kernel, out_dtype, _LOG_P_TOLERANCE, backend, ratios)

    def _cpu_tensor(self, tensor, dtype, backend: str, on_cpu: bool, device, ratios: bool):
        import torch

        if dtype not in (torch.float32, torch.float64):
            tensor = tensor.to(torch.float32)  # float16/bfloat16 are exact in float32
        array = tensor.contiguous().numpy()  # shapes are handled in NumPy (cheaper per call than torch reshapes)
        flat = array.reshape(-1)
        lo, up, above = self._lookup(flat, flat.dtype, backend, ratios)
        if above:  # as on a device: NaN, not an error
            lo[flat > _LOG_P_TOLERANCE] = np.nan
            up[flat > _LOG_P_TOLERANCE] = np.nan
        lower, upper = torch.from_numpy(lo.reshape(array.shape)), torch.from_numpy(up.reshape(array.shape))
        if lower.dtype != dtype or not on_cpu:
            lower, upper = lower.to(device=device, dtype=dtype), upper.to(device=device, dtype=dtype)
        return lower, upper

    def _torch_arrays(self, device):
        key = str(device)
        if key not in self._torch_cache:
            self._torch_cache[key] = (self.lower.kernel.torch_arrays(device), self.upper.kernel.torch_arrays(device))
        return self._torch_cache[key]

    # ---- certification -----------------------------------------------------------------------------------
    def recertify(self, points_per_interval: int = 11, *, seed: int | None = None) -> float:
        r"""Re-measure the max error against the exact solver; returns :math:`\max e` (without the margin).

        With ``seed=None`` the points are the interior points :math:`s = k/(m+1)` of every cell
        (``m = points_per_interval``); with a seed they are uniformly random in each cell.  The tails outside
        the grid are always included (against the mpmath oracle).
        """
        solve = exact_solver()
        rng = None if seed is None else np.random.default_rng(seed)
        div = self.divergence
        worst = 0.0
        for index, bound in ((0, self.lower), (1, self.upper)):
            m = points_per_interval
            s = np.arange(1, m + 1) / (m + 1) if rng is None else rng.random((len(bound.knots) - 1, m))
            L = bound.check_points(s).ravel()
            exact = exact_bound_log(bound, div, self.delta, index, L, solve)
            approx = self.log(-L)[index]
            worst = max(worst, float(rel_log_error(approx, exact).max()), tail_error(bound, div, self.delta, index))
        return worst

    # ---- files -------------------------------------------------------------------------------------------
    def to_arrays(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """(arrays, metadata) as stored in every file format."""
        arrays, extra = {}, {}
        for side, bound in (("lower", self.lower), ("upper", self.upper)):
            side_arrays, side_meta = bound_arrays(side, bound)
            arrays.update(side_arrays)
            extra.update(side_meta)
        if extra:  # a split bound or a tail: one description of them for both sides
            extra["split_and_tails"] = split_doc(any(key.endswith("_right_tail_mode") for key in extra),
                                                 any(key.endswith("_near_power") for key in extra))
        metadata = {
            "table": "1d",
            "divergence": self.divergence_name,
            "generator": self.generator,
            "delta": self.delta,
            **bound_metadata(self.lower, self.upper),
            "error_measure": ERROR_MEASURE,
            "max_rel_error": self.max_rel_error,
            "target": self.target,
            "checked_points": self.checked_points,
            "builder": self.builder,
            **extra,
        }
        return arrays, metadata

    def save(self, path: str | Path) -> Path:
        """Write the table; the format follows the suffix (``.npz``, ``.safetensors``, ``.json``, ``.csv``)."""
        arrays, metadata = self.to_arrays()
        return write_table(path, arrays, metadata)

    @classmethod
    def load(cls, path: str | Path):
        """Read a table written by :meth:`save` (or a 2-D table); refuses damaged files and files whose
        contents are not the Band they are labelled with (see the module docstring)."""
        arrays, meta = read_table(path, required=("table", "divergence", "generator", "max_rel_error"))
        loader = LOADERS.get(meta["table"]) if isinstance(meta["table"], str) else None
        if loader is None:
            raise TableFileError(f"{str(path)!r}: unknown table kind {meta['table']!r}")
        try:
            table = loader(arrays, meta)
        except TableFileError as err:
            raise TableFileError(f"{str(path)!r}: {err}") from None
        table.spot_check(path)
        return table

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> BandTable:
        """Rebuild from the content of a file (already verified)."""
        try:
            bounds = {side: split_from_arrays(side, arrays, meta) for side in ("lower", "upper")}
            table = cls(divergence=meta["divergence"], generator=meta["generator"], delta=check_delta(meta["delta"]),
                        lower=bounds["lower"], upper=bounds["upper"], max_rel_error=meta["max_rel_error"],
                        target=meta["target"], checked_points=meta["checked_points"],
                        builder=builder_of(meta))  # fmt: skip
        except KeyError as err:
            raise TableFileError(f"table lacks the field {err}") from None
        except (TypeError, ValueError) as err:
            if isinstance(err, TableFileError):
                raise
            raise TableFileError(f"invalid metadata: {err}") from None
        check_certificate(table)
        return table

    def spot_check(self, where: Any = "table", *, n: int = SPOT_CHECKS, seed: int = 0) -> None:
        """Refuse (:class:`TableFileError`) a table that disagrees with the exact solver beyond its certificate
        at ``n`` seeded points (see :func:`spot_check`)."""
        spot_check(self, where, n=n, seed=seed)

    @classmethod
    def shipped(cls, divergence: str | Divergence, delta: float | tuple[float, float]):
        """Load a table shipped with the package (``bandcore/tables/data``, listed in its ``manifest.json``).

        Refuses a file whose divergence (canonical formula) or δ is not the one asked for.  A transform
        (``renyi(2)``) asks for its f-divergence's table at the mapped radius.
        """
        div, delta = resolve_regions(divergence, delta)
        if isinstance(delta, (tuple, list)):
            wanted: Any = tuple(check_delta(d) for d in delta)
        else:
            wanted = check_delta(delta)
        path = SHIPPED_DIR / shipped_name(div.name, wanted)
        if not path.is_file():
            raise FileNotFoundError(f"no shipped table for {div.spelling!r} at delta={delta!r} ({path.name})")
        table = cls.load(path)
        got = getattr(table, "delta_range", None) if isinstance(wanted, tuple) else getattr(table, "delta", None)
        if table.divergence.formula != div.formula or got != wanted:
            raise TableFileError(f"{str(path)!r} holds {table!r}, not {div.spelling!r} at delta={wanted!r}")
        return table

    def __repr__(self) -> str:
        return (f"BandTable({self.divergence_name!r}, delta={self.delta:g}, knots={self.n_knots}, "
                f"max_rel_error={self.max_rel_error:.2e})")  # fmt: skip


def check_certificate(table) -> None:
    """A certificate a builder could have written: ``0 <= max_rel_error <= target < 1``."""
    check_target(table.target)
    if not 0 <= table.max_rel_error <= table.target:
        raise TableFileError(f"certified error {table.max_rel_error!r} is not in [0, target={table.target!r}]")


def spot_check(table: BandTable, where: Any = "table", *, n: int = SPOT_CHECKS, seed: int = 0) -> None:
    """Re-evaluate ``n`` seeded points of ``table`` (random cells, random position in the cell, half per
    bound) with :func:`bandcore.band.band_log`, both read with NumPy; raise :class:`TableFileError` naming
    ``where`` and the point where the table is off by more than its certified error."""
    rng = np.random.default_rng(seed)
    try:
        div = table.divergence
    except (ValueError, TypeError) as err:
        raise TableFileError(f"{str(where)!r}: {err}") from None
    tol = table.max_rel_error + _SOLVER_SLACK
    for index, bound in ((0, table.lower), (1, table.upper)):
        m = max(1, n // 2)
        cells = rng.integers(0, len(bound.knots) - 1, m)
        L = bound.knots[cells] + rng.random(m) * np.diff(bound.knots)[cells]
        exact = np.asarray(band_log(-L, div, table.delta, backend="numpy")[index], dtype=np.float64)
        if isinstance(bound, SplitBound):  # near the threshold the float64 solvers are not exact
            exact = exact_bound_log(bound, div, table.delta, index, L)
        approx = table.log(-L, backend="numpy")[index]  # loading a table imports no Numba
        err = rel_log_error(approx, exact)
        worst = int(np.argmax(err))
        if err[worst] > tol:
            side = ("lower", "upper")[index]
            raise TableFileError(
                f"{str(where)!r} does not hold the Band it is labelled with ({table.divergence_name}, "
                f"delta={table.delta:g}): at log p = {-L[worst]!r} its {side} log r is {approx[worst]!r}, the exact "
                f"solver gives {exact[worst]!r} (error {err[worst]:.2e} > certified {table.max_rel_error:.2e})"
            )


def _is_torch(value) -> bool:
    return type(value).__module__.startswith("torch")


def _torch_float_dtype(tensor):
    if not tensor.is_floating_point():
        raise TypeError(f"old_log_prob must be a floating tensor, got dtype {tensor.dtype}")
    return tensor.dtype


LOADERS["1d"] = BandTable.from_arrays
