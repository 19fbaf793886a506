r"""Lookup tables of the Band with a certified error: build, certify, save, load, evaluate.

A :class:`BandTable` holds, for one divergence and one :math:`\delta`, both bounds as cubic Hermite interpolants
in :math:`x = \operatorname{logit} p = \log p - \log(1-p)` (:mod:`bandcore.table_eval`), with slopes from
implicit differentiation of :math:`g_f(p, r) = \delta` (:mod:`bandcore.table_math`), so a knot costs one exact
solve and no finite differences.

**Building.** Knots start on a grid (step ½ on :math:`|x| \le 40`, geometric beyond, to :math:`|x| = 680`)
plus the saturation kink :math:`x_t` where a bound reaches :math:`1/p` or 0 (found by 50-digit bisection; the
interpolant never crosses it and the saturated side returns the exact value).  Every interval is then checked
at :math:`s = k/12,\ k = 1..11` (midpoint included) against the exact solver, and intervals whose error exceeds
half the target are halved, until none does.

**Certificate.** The error measure is the numerical contract's,
:math:`e = |\Delta \log r| / \max(1, |\log r|)` — the relative error of the ratio bound wherever
:math:`e^{-1} \le r \le e` and the relative error of :math:`\log r` beyond.  ``max_rel_error`` is the largest
:math:`e` over the final check points, times 1.25 for the gaps between them (the Hermite error is a smooth
:math:`\propto s^2(1-s)^2` bump per interval, so 11 samples see its peak to within a few per cent).
Outside :math:`|x| \le 680` (:math:`p < e^{-680}` or :math:`1 - p < e^{-680}`) the stored functions are
extrapolated by their exact asymptotic forms (linear in :math:`x` on the left, constant on the right), with
errors of order :math:`e^{-680}`.

**Tables over δ** (:class:`BandTable2D`, from ``BandTable.build(div, delta=(lo, hi))``): bicubic Hermite in
:math:`(x, \log\delta)`, same certificate; see :mod:`bandcore.tables2d`.

>>> table = BandTable.build("kl", 0.05)                         # doctest: +SKIP
>>> lower, upper = table(old_log_prob)                           # doctest: +SKIP
>>> table.save("kl_0.05.npz"); BandTable.load("kl_0.05.npz")     # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .divergences import Divergence, get_divergence
from .table_formats import finite_or_none, read_table, write_table
from .table_math import log_p_of_x, pieces, saturation_threshold

__all__ = ["DEFAULT_TARGET", "X_RANGE", "BandTable", "TabulatedBound", "exact_solver"]

#: Tabulated range of x = logit p; outside it the asymptotic forms are exact to O(e^-680).
X_RANGE = (-680.0, 680.0)
#: Default certified error target, |Δ log r| / max(1, |log r|).
DEFAULT_TARGET = 1e-7
_CHECK_S = np.arange(1, 12) / 12.0  # check points per interval, midpoint included
_GAP_FACTOR = 1.25  # certificate margin for the gaps between check points
_MAX_KNOTS = 20_000
METHOD = "cubic Hermite in x = logit(p), slopes by implicit differentiation of g_f"
ERROR_MEASURE = "|Δ log r| / max(1, |log r|)"
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "tables"

# kinds of stored function (see bandcore.table_eval)
LOG_R, RATIO, LOG_NEG_LOG_R = 0, 1, 2


def exact_solver() -> Callable[[np.ndarray, Divergence, float], tuple[np.ndarray, np.ndarray]]:
    """The exact solver tables sample and certify against: :func:`bandcore.table_math.bisection_band_log`.

    It bisects the float64 bit patterns of :math:`\\pm\\log r` on the cancellation-free :math:`g_f` of
    :mod:`bandcore.table_math`: slow (128 evaluations of :math:`g_f`), obviously correct, independent of the
    fast backends it is used to check (tests compare it with the mpmath oracle).
    """
    from .table_math import bisection_band_log

    return bisection_band_log


@dataclass(frozen=True)
class TabulatedBound:
    """One bound: knots in x, stored values and slopes, the kind of stored function, the saturation kink.

    ``saturation_x``: the upper bound is saturated (r = 1/p) for x >= it, the lower (r = 0) for x <= it;
    ±inf when the bound never saturates.
    """

    knots: np.ndarray
    values: np.ndarray
    slopes: np.ndarray
    kind: int
    saturation_x: float


# --------------------------------------------------------------------------------------------------------
# Building and certifying one bound
# --------------------------------------------------------------------------------------------------------


def _initial_knots(a: float, b: float) -> np.ndarray:
    core = np.arange(-40.0, 40.0 + 0.25, 0.5)
    outer = 40.0 * 1.25 ** np.arange(1, 40)
    outer = outer[outer < 680.0]
    grid = np.concatenate([-outer[::-1], core, outer, [-680.0, 680.0]])
    grid = grid[(grid > a) & (grid < b)]
    return np.unique(np.concatenate([[a, b], grid]))


def _stored(kind: int, x: np.ndarray, y: np.ndarray, parts) -> tuple[np.ndarray, np.ndarray]:
    """Stored values and slopes from exact log-bounds y at x."""
    with np.errstate(all="ignore"):
        if kind == RATIO:
            return np.exp(y), parts.dr_dx(x, y)
        slope = parts.dy_dx(x, y)
        if kind == LOG_R:
            return y, slope
        return np.log(-y), slope / y  # d/dx log(-y) = y'/y


def _hermite_log(bound: TabulatedBound, x: np.ndarray) -> np.ndarray:
    """Interpolated log r at x strictly inside the knot range (NumPy reference of the kernel)."""
    k, v, d = bound.knots, bound.values, bound.slopes
    j = np.clip(np.searchsorted(k, x) - 1, 0, len(k) - 2)
    h = k[j + 1] - k[j]
    s = (x - k[j]) / h
    f = (
        (2 * s**3 - 3 * s**2 + 1) * v[j]
        + (s**3 - 2 * s**2 + s) * h * d[j]
        + (3 * s**2 - 2 * s**3) * v[j + 1]
        + (s**3 - s**2) * h * d[j + 1]
    )
    with np.errstate(divide="ignore"):
        if bound.kind == RATIO:
            return np.log(np.clip(f, 0.0, 1.0))
        if bound.kind == LOG_NEG_LOG_R:
            return -np.exp(f)
    return np.minimum(np.maximum(f, 0.0), -log_p_of_x(x))  # as the kernels: 0 <= log r_up <= -log p


def rel_log_error(approx: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """The certificate's measure :math:`|\\hat y - y| / \\max(1, |y|)` (0 where equal, inf for NaN)."""
    with np.errstate(invalid="ignore"):
        err = np.abs(approx - exact) / np.maximum(1.0, np.abs(exact))
    err = np.where(approx == exact, 0.0, err)
    return np.where(np.isnan(err), np.inf, err)


def _build_bound(div, delta, side, target, solve, bar) -> tuple[TabulatedBound, float, int]:
    parts = pieces(div)
    sat = saturation_threshold(div, delta, side, X_RANGE)
    if sat == "all":
        raise ValueError(
            f"the {side} bound of {div.name} at delta={delta} is saturated for every p: nothing to tabulate"
        )
    a, b = X_RANGE
    kind = LOG_R if side == "upper" else (LOG_NEG_LOG_R if sat is None else RATIO)
    if sat is not None:
        a, b = (a, sat) if side == "upper" else (sat, b)
    index = 1 if side == "upper" else 0

    def exact_log(x):
        return np.asarray(solve(log_p_of_x(x), div, delta)[index], dtype=np.float64)

    knots = _initial_knots(a, b)
    values, slopes = _stored(kind, knots, exact_log(knots), parts)
    while True:
        if not (np.all(np.isfinite(values)) and np.all(np.isfinite(slopes))):
            bad = knots[~(np.isfinite(values) & np.isfinite(slopes))]
            raise ValueError(f"{div.name} {side} bound: non-finite value or slope at x = {bad[:3]}")
        bound = TabulatedBound(knots, values, slopes, kind, sat if sat is not None else math.inf)
        h = np.diff(knots)
        xs = (knots[:-1, None] + h[:, None] * _CHECK_S[None, :]).ravel()
        err = rel_log_error(_hermite_log(bound, xs), exact_log(xs)).reshape(len(h), len(_CHECK_S))
        worst = err.max(axis=1)
        failing = worst > target / 2
        if bar is not None:
            bar.set_postfix_str(f"{side}: {len(knots)} knots, max err {worst.max():.1e}")
            bar.update(1)
        if not failing.any():
            break
        if len(knots) + failing.sum() > _MAX_KNOTS:
            raise ValueError(
                f"{div.name} {side} bound at delta={delta}: target {target:g} not reached with {_MAX_KNOTS} "
                f"knots (max error {worst.max():.2e}); pass a larger target"
            )
        new = knots[:-1][failing] + h[failing] / 2
        new_values, new_slopes = _stored(kind, new, exact_log(new), parts)
        order = np.argsort(np.concatenate([knots, new]), kind="stable")
        knots = np.concatenate([knots, new])[order]
        values = np.concatenate([values, new_values])[order]
        slopes = np.concatenate([slopes, new_slopes])[order]
    if side == "lower":
        bound = TabulatedBound(knots, values, slopes, kind, sat if sat is not None else -math.inf)
    return bound, float(err.max()), err.size


# --------------------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------------------


class BandTable:
    r"""The Band of one divergence at one :math:`\delta`, tabulated with a certified error.

    Build with :meth:`build`, evaluate with ``table(old_log_prob) -> (lower, upper)`` or
    :meth:`log` ``-> (log_lower, log_upper)``; NumPy in → NumPy out (Numba kernel, parallel), torch in → torch
    out on the same device and dtype (no host synchronisation).  Computation is in float64, rounded once to
    the input's floating dtype.  ``max_rel_error`` bounds :math:`|\Delta\log r|/\max(1,|\log r|)` against the
    exact solver for every ``old_log_prob``.
    """

    def __init__(
        self,
        *,
        divergence: str,
        generator: str,
        delta: float,
        lower: TabulatedBound,
        upper: TabulatedBound,
        max_rel_error: float,
        target: float,
        checked_points: int,
        bandcore_version: str,
    ) -> None:
        self.divergence_name = divergence
        self.generator = generator
        self.delta = float(delta)
        self.lower = lower
        self.upper = upper
        self.max_rel_error = float(max_rel_error)
        self.target = float(target)
        self.checked_points = int(checked_points)
        self.bandcore_version = bandcore_version
        self._torch_cache: dict[Any, tuple] = {}

    # ---- construction ----------------------------------------------------------------------------------
    @classmethod
    def build(
        cls,
        divergence: str | Divergence,
        delta: float | tuple[float, float],
        *,
        target: float = DEFAULT_TARGET,
        progress: bool = False,
    ) -> BandTable:
        r"""Tabulate the Band of ``divergence`` at ``delta`` with certified error ≤ ``target``.

        Parameters
        ----------
        divergence : str or Divergence
            Name, alias or :class:`~bandcore.Divergence`.
        delta : float or (float, float)
            Trust-region radius :math:`\delta > 0`; a pair ``(lo, hi)`` builds a :class:`BandTable2D` over
            :math:`\delta \in [lo, hi]`.
        target : float
            Error target for :math:`|\Delta \log r| / \max(1, |\log r|)` (default 1e-7).
        progress : bool
            Show a tqdm progress bar.
        """
        if isinstance(delta, (tuple, list)):
            from .tables2d import BandTable2D

            return BandTable2D.build(divergence, tuple(delta), target=target, progress=progress)
        div = get_divergence(divergence)
        delta = _check_delta(delta)
        if not (isinstance(target, (int, float)) and 1e-14 <= target < 1):
            raise ValueError(f"target must be a number in [1e-14, 1), got {target!r}")
        from . import __version__

        solve = exact_solver()
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(desc=f"table {div.name} delta={delta:g}", unit="pass")
        try:
            lower, err_lo, n_lo = _build_bound(div, delta, "lower", target, solve, bar)
            upper, err_up, n_up = _build_bound(div, delta, "upper", target, solve, bar)
        finally:
            if bar is not None:
                bar.close()
        return cls(
            divergence=div.name,
            generator=str(div.f),
            delta=delta,
            lower=lower,
            upper=upper,
            max_rel_error=_GAP_FACTOR * max(err_lo, err_up),
            target=target,
            checked_points=n_lo + n_up,
            bandcore_version=__version__,
        )

    @property
    def divergence(self) -> Divergence:
        """The :class:`~bandcore.Divergence` (catalogue entry, or rebuilt from the stored generator string)."""
        return _resolve_divergence(self.divergence_name, self.generator)

    @property
    def n_knots(self) -> int:
        """Total number of knots (both bounds)."""
        return len(self.lower.knots) + len(self.upper.knots)

    # ---- evaluation --------------------------------------------------------------------------------------
    def log(self, old_log_prob):
        """(log_lower, log_upper) for ``old_log_prob`` (NumPy array, scalar, or torch tensor)."""
        from .table_eval import eval_log_numba, eval_log_torch

        if _is_torch(old_log_prob):
            import torch

            with torch.no_grad():
                dtype = _torch_float_dtype(old_log_prob)
                lp = old_log_prob.detach().to(torch.float64)
                lo, up = eval_log_torch(lp, self.lower, self.upper, *self._torch_arrays(lp.device), _LOG_P_TOLERANCE)
                return lo.to(dtype), up.to(dtype)
        arr = np.asarray(old_log_prob)
        if arr.dtype not in (np.float16, np.float32, np.float64):
            raise TypeError(f"old_log_prob must hold float16/32/64 log-probabilities, got dtype {arr.dtype}")
        flat = np.ascontiguousarray(arr).reshape(-1)
        if flat.dtype == np.float16:
            flat = flat.astype(np.float32)  # Numba has no float16 arithmetic
        out_dtype = np.float32 if arr.dtype == np.float16 else arr.dtype
        lo, up, above = eval_log_numba(flat, self.lower, self.upper, out_dtype, _LOG_P_TOLERANCE)
        if above:
            raise ValueError(
                f"old_log_prob must be <= 0 (log-probabilities; values up to {_LOG_P_TOLERANCE:g} are read as 0), "
                f"got {above} value(s) above, max {np.nanmax(arr)!r}"
            )
        return lo.reshape(arr.shape).astype(arr.dtype, copy=False), up.reshape(arr.shape).astype(arr.dtype, copy=False)

    def __call__(self, old_log_prob):
        """(lower, upper) ratio bounds: ``exp`` of :meth:`log` (lower 0 where saturated, upper 1/p)."""
        lo, up = self.log(old_log_prob)
        if _is_torch(lo):
            return lo.exp(), up.exp()
        with np.errstate(over="ignore"):
            return np.exp(lo), np.exp(up)

    def _torch_arrays(self, device):
        if device not in self._torch_cache:
            import torch

            def move(b):
                arrays = (b.knots, b.values, b.slopes)
                return tuple(torch.as_tensor(a, dtype=torch.float64, device=device) for a in arrays)

            self._torch_cache[device] = (move(self.lower), move(self.upper))
        return self._torch_cache[device]

    # ---- certification -----------------------------------------------------------------------------------
    def recertify(self, points_per_interval: int = 11, *, seed: int | None = None) -> float:
        r"""Re-measure the max error against the exact solver; returns :math:`\max e` (without the margin).

        With ``seed=None`` the points are the interior points :math:`s = k/(m+1)` of every interval
        (``m = points_per_interval``); with a seed they are uniformly random in each interval.
        """
        solve = exact_solver()
        rng = None if seed is None else np.random.default_rng(seed)
        worst = 0.0
        for index, bound in ((0, self.lower), (1, self.upper)):
            h = np.diff(bound.knots)
            if rng is None:
                s = np.arange(1, points_per_interval + 1) / (points_per_interval + 1)
                xs = (bound.knots[:-1, None] + h[:, None] * s[None, :]).ravel()
            else:
                xs = (bound.knots[:-1, None] + h[:, None] * rng.random((len(h), points_per_interval))).ravel()
            exact = np.asarray(solve(log_p_of_x(xs), self.divergence, self.delta)[index], dtype=np.float64)
            approx = self.log(log_p_of_x(xs))[index]
            worst = max(worst, float(rel_log_error(approx, exact).max()))
        return worst

    # ---- files -------------------------------------------------------------------------------------------
    def to_arrays(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """(arrays, metadata) as stored in every file format."""
        arrays = {}
        for side, bound in (("lower", self.lower), ("upper", self.upper)):
            arrays[f"{side}_knots"] = bound.knots
            arrays[f"{side}_values"] = bound.values
            arrays[f"{side}_slopes"] = bound.slopes
        metadata = {
            "table": "1d",
            "divergence": self.divergence_name,
            "generator": self.generator,
            "delta": self.delta,
            "coordinate": "x = log(p) - log(1-p)",
            "method": METHOD,
            "lower_kind": self.lower.kind,
            "upper_kind": self.upper.kind,
            "kinds": "0: log r, 1: r, 2: log(-log r)",
            "lower_saturated_at_or_below_x": finite_or_none(self.lower.saturation_x),
            "upper_saturated_at_or_above_x": finite_or_none(self.upper.saturation_x),
            "x_range": list(X_RANGE),
            "outside_x_range": "left: linear extrapolation with the end slope; right: end value",
            "error_measure": ERROR_MEASURE,
            "max_rel_error": self.max_rel_error,
            "target": self.target,
            "checked_points": self.checked_points,
            "bandcore_version": self.bandcore_version,
        }
        return arrays, metadata

    def save(self, path: str | Path) -> Path:
        """Write the table; the format follows the suffix (``.npz``, ``.safetensors``, ``.json``, ``.csv``)."""
        arrays, metadata = self.to_arrays()
        return write_table(path, arrays, metadata)

    @classmethod
    def load(cls, path: str | Path) -> BandTable:
        """Read a table written by :meth:`save` (or a :class:`BandTable2D`); refuses damaged files."""
        arrays, meta = read_table(path, required=("table", "divergence", "generator", "max_rel_error"))
        if meta["table"] == "2d":
            from .tables2d import BandTable2D

            return BandTable2D.from_arrays(arrays, meta)
        return cls.from_arrays(arrays, meta)

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> BandTable:
        """Rebuild from the content of a file (already verified)."""
        from .table_formats import TableFileError

        try:
            bounds = {}
            for side, default in (("lower", -math.inf), ("upper", math.inf)):
                key = f"{side}_saturated_at_or_{'below' if side == 'lower' else 'above'}_x"
                sat = meta[key]
                knots = arrays[f"{side}_knots"]
                if knots.ndim != 1 or len(knots) < 2 or np.any(np.diff(knots) <= 0):
                    raise TableFileError(f"{side} knots must be strictly increasing with at least 2 entries")
                bounds[side] = TabulatedBound(
                    knots, arrays[f"{side}_values"], arrays[f"{side}_slopes"], int(meta[f"{side}_kind"]),
                    default if sat is None else float(sat),
                )  # fmt: skip
                if bounds[side].values.shape != knots.shape or bounds[side].slopes.shape != knots.shape:
                    raise TableFileError(f"{side} values/slopes do not match its knots")
            return cls(
                divergence=meta["divergence"],
                generator=meta["generator"],
                delta=meta["delta"],
                lower=bounds["lower"],
                upper=bounds["upper"],
                max_rel_error=meta["max_rel_error"],
                target=meta["target"],
                checked_points=meta["checked_points"],
                bandcore_version=meta["bandcore_version"],
            )
        except KeyError as err:
            raise TableFileError(f"table lacks the field {err}") from None

    @classmethod
    def shipped(cls, divergence: str | Divergence, delta: float | tuple[float, float]) -> BandTable:
        """Load a table shipped in ``tables/`` (see ``tables/manifest.json``)."""
        path = SHIPPED_DIR / shipped_name(get_divergence(divergence).name, delta)
        if not path.is_file():
            raise FileNotFoundError(f"no shipped table for {divergence!r} at delta={delta!r} ({path.name})")
        return cls.load(path)

    def __repr__(self) -> str:
        return (
            f"BandTable({self.divergence_name!r}, delta={self.delta:g}, knots={self.n_knots}, "
            f"max_rel_error={self.max_rel_error:.2e})"
        )


# --------------------------------------------------------------------------------------------------------
# Helpers shared with BandTable2D
# --------------------------------------------------------------------------------------------------------


def shipped_name(name: str, delta: float | tuple[float, float]) -> str:
    """File name of a shipped table: ``kl_delta0.05.npz``, ``kl_delta0.01-0.2.npz`` (2-D)."""
    if isinstance(delta, (tuple, list)):
        return f"{name}_delta{delta[0]:g}-{delta[1]:g}.npz"
    return f"{name}_delta{delta:g}.npz"


def _check_delta(delta) -> float:
    if isinstance(delta, bool) or not isinstance(delta, (int, float, np.floating, np.integer)):
        raise TypeError(f"delta must be a positive number, got {delta!r}")
    value = float(delta)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"delta must be finite and > 0, got {delta!r}")
    return value


def _resolve_divergence(name: str, generator: str) -> Divergence:
    try:
        div = get_divergence(name.split("(")[0], **_params(name))
        if str(div.f) == generator:
            return div
    except (ValueError, TypeError):
        pass
    return Divergence.from_expression(generator, name=name)  # the safe parser: no Python is evaluated


def _params(name: str) -> dict[str, float]:
    if name.startswith("alpha(") and name.endswith(")"):
        return {"alpha": float(name[6:-1])}
    return {}


def _is_torch(value) -> bool:
    return type(value).__module__.startswith("torch")


def _torch_float_dtype(tensor):
    if not tensor.is_floating_point():
        raise TypeError(f"old_log_prob must be a floating tensor, got dtype {tensor.dtype}")
    return tensor.dtype


_LOG_P_TOLERANCE = 1e-6
