r"""Lookup tables of the Band with a certified error: build, certify, save, load, evaluate.

A :class:`BandTable` holds, for one divergence and one :math:`\delta`, both bounds as cubic Hermite interpolants
in :math:`L = -\log p` on octave cells (:mod:`bandcore.table_eval`: the cell of a token is read off the bits of
its log-probability), with slopes from implicit differentiation of :math:`g_f(p, r) = \delta`
(:mod:`bandcore.table_math`), so a knot costs one exact solve and no finite differences.

**Building.** Each octave :math:`[2^e, 2^{e+1})` of :math:`[2^{-120}, 680]` starts as one cell; the saturation
kink :math:`L^*` where a bound reaches :math:`1/p` or 0 (50-digit bisection) ends the tabulated range, so the
interpolant never crosses it and the saturated side returns the exact value.  Every cell is checked at
:math:`s = k/12,\ k = 1..11` (midpoint included) against the exact solver, *through the evaluation kernel
itself*, and every octave holding a cell whose error exceeds half the target is cut twice as finely, until none
does.

**Certificate.** The error measure is the numerical contract's,
:math:`e = |\Delta \log r| / \max(1, |\log r|)` — the relative error of the ratio bound wherever
:math:`e^{-1} \le r \le e` and the relative error of :math:`\log r` beyond.  ``max_rel_error`` is the largest
:math:`e` over the final check points, times 1.25 for the gaps between them (the Hermite error is a smooth
:math:`\propto s^2(1-s)^2` bump per cell, so 11 samples see its peak to within a few per cent).  The check
points include the tails outside the grid: :math:`L` from :math:`2^{-121}` down to 0 (:math:`p = 1`), where the
end value is used, and :math:`L = 690, 700`, where the end tangent is (the stored functions are linear in
:math:`L` up to :math:`O(p)`).

**Tables over δ** (:class:`BandTable2D`, from ``BandTable.build(div, delta=(lo, hi))``): see
:mod:`bandcore.tables2d`.

>>> table = BandTable.build("kl", 0.05)                         # doctest: +SKIP
>>> lower, upper = table(old_log_prob)                           # doctest: +SKIP
>>> table.save("kl_0.05.npz"); BandTable.load("kl_0.05.npz")     # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from .divergences import Divergence, get_divergence
from .table_eval import MAX_LEVEL, KernelBound, eval_log_numba, octave_grid, octave_of, pack
from .table_formats import read_table, write_table
from .table_math import pieces, saturation_threshold

__all__ = ["DEFAULT_TARGET", "L_RANGE", "BandTable", "TabulatedBound", "exact_solver"]

#: Tabulated range of L = -log p; outside it the end value (left) and end tangent (right) are exact to O(2^-120).
L_RANGE = (2.0**-120, 680.0)
#: Default certified error target, |Δ log r| / max(1, |log r|).
DEFAULT_TARGET = 1e-7
_CHECK_S = np.arange(1, 12) / 12.0  # check points per cell, midpoint included
_GAP_FACTOR = 1.25  # certificate margin for the gaps between check points
_MAX_KNOTS = 20_000
#: the tails outside L_RANGE that the certificate also measures (left: down to p = 1; right: p < e^-680)
LEFT_TAIL = np.array([2.0**-121, 2.0**-200, 1e-300, 5e-324, 0.0])
RIGHT_TAIL = np.array([690.0, 700.0])
METHOD = "cubic Hermite in L = -log(p) on octave cells, slopes by implicit differentiation of g_f"
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
    """One bound: knots in L, stored values and slopes dF/dL, octave levels, the kind of stored function.

    ``saturated_left``: an upper bound with :math:`r = 1/p` for :math:`L \\le` ``knots[0]``;
    ``saturated_right``: a lower bound with :math:`r = 0` for :math:`L \\ge` ``knots[-1]``.
    """

    knots: np.ndarray
    values: np.ndarray
    slopes: np.ndarray
    levels: np.ndarray
    kind: int
    saturated_left: bool = False
    saturated_right: bool = False

    @cached_property
    def kernel(self) -> KernelBound:
        """The arrays the evaluation kernels read (Horner cells, octave offsets)."""
        return pack(self.knots, self.values, self.slopes, self.levels, self.kind, self.saturated_left,
                    self.saturated_right)  # fmt: skip

    def log(self, L: np.ndarray) -> np.ndarray:
        """This bound's log r at float64 ``L`` through the Numba kernel (the build and certificate use it)."""
        log_p = -np.ascontiguousarray(L, dtype=np.float64)
        return eval_log_numba(log_p, self.kernel, self.kernel, np.float64, math.inf)[0]

    def check_points(self, per_cell: np.ndarray) -> np.ndarray:
        """Interior points ``knots[c] + s·w_c`` for ``s`` in ``per_cell`` (shape (n_cells, m) or (m,))."""
        w = np.diff(self.knots)
        s = per_cell if per_cell.ndim == 2 else np.broadcast_to(per_cell, (len(w), len(per_cell)))
        return self.knots[:-1, None] + w[:, None] * s

    def tails(self) -> np.ndarray:
        """The certificate's points outside the grid on the sides that are not saturated."""
        left = [] if self.saturated_left else LEFT_TAIL
        right = [] if self.saturated_right else RIGHT_TAIL
        return np.concatenate([left, right]).astype(np.float64)


# --------------------------------------------------------------------------------------------------------
# Building and certifying one bound
# --------------------------------------------------------------------------------------------------------


def _stored(kind: int, L: np.ndarray, y: np.ndarray, parts, kink: float | None = None):
    """Stored values and slopes dF/dL from exact log-bounds y at L; at ``L == kink`` (a saturation threshold,
    the end of the grid) the slope is the unsaturated side's."""
    with np.errstate(all="ignore"):
        if kind == RATIO:
            return np.exp(y), parts.slope_in_L(L, y, ratio=True)
        slope = parts.slope_in_L(L, y, kink=L == kink)
        if kind == LOG_R:
            return y, slope
        return np.log(-y), slope / y  # d/dL log(-y) = y'/y


def rel_log_error(approx: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """The certificate's measure :math:`|\\hat y - y| / \\max(1, |y|)` (0 where equal, inf for NaN)."""
    with np.errstate(invalid="ignore"):
        err = np.abs(approx - exact) / np.maximum(1.0, np.abs(exact))
    err = np.where(approx == exact, 0.0, err)
    return np.where(np.isnan(err), np.inf, err)


def bound_domain(div: Divergence, delta: float, side: str) -> tuple[int, float, float, bool]:
    """(kind, a, b, saturated) of one bound: the tabulated range [a, b] ends at a saturation kink."""
    sat = saturation_threshold(div, delta, side, L_RANGE)
    if sat == "all":
        raise ValueError(
            f"the {side} bound of {div.name} at delta={delta} is saturated for every p: nothing to tabulate"
        )
    a, b = L_RANGE
    kind = LOG_R if side == "upper" else (LOG_NEG_LOG_R if sat is None else RATIO)
    if sat is not None:
        a, b = (sat, b) if side == "upper" else (a, sat)
    return kind, a, b, sat is not None


def n_octaves(a: float, b: float) -> int:
    """Number of octaves from the one holding ``a`` to the one holding the last float below ``b``."""
    return octave_of(np.nextafter(b, 0.0)) - octave_of(a) + 1


def cell_octaves(knots: np.ndarray) -> np.ndarray:
    """Octave index (from the first knot's) of every cell."""
    return np.frexp(knots[:-1])[1] - np.frexp(knots[0])[1]


def _build_bound(div, delta, side, target, solve, bar) -> tuple[TabulatedBound, float, int]:
    parts = pieces(div)
    kind, a, b, saturated = bound_domain(div, delta, side)
    index = 1 if side == "upper" else 0

    def exact_log(L):
        return np.asarray(solve(-L, div, delta)[index], dtype=np.float64)

    levels = np.zeros(n_octaves(a, b), dtype=np.int64)
    while True:
        knots = octave_grid(a, b, levels)
        values, slopes = _stored(kind, knots, exact_log(knots), parts, kink=a if saturated else None)
        if not (np.all(np.isfinite(values)) and np.all(np.isfinite(slopes))):
            bad = knots[~(np.isfinite(values) & np.isfinite(slopes))]
            raise ValueError(f"{div.name} {side} bound: non-finite value or slope at L = {bad[:3]}")
        bound = TabulatedBound(knots, values, slopes, levels.copy(), kind, saturated and side == "upper",
                               saturated and side == "lower")  # fmt: skip
        xs = bound.check_points(_CHECK_S).ravel()
        per_cell = rel_log_error(bound.log(xs), exact_log(xs)).reshape(len(knots) - 1, len(_CHECK_S)).max(axis=1)
        per_octave = np.zeros(len(levels))
        np.maximum.at(per_octave, cell_octaves(knots), per_cell)
        failing = per_octave > target / 2
        if bar is not None:
            bar.set_postfix_str(f"{side}: {len(knots)} knots, max err {per_cell.max():.1e}")
            bar.update(1)
        if not failing.any():
            break
        grown = levels + failing
        if grown.max() > MAX_LEVEL or len(octave_grid(a, b, grown)) > _MAX_KNOTS:
            raise ValueError(
                f"{div.name} {side} bound at delta={delta}: target {target:g} not reached with {_MAX_KNOTS} "
                f"knots (max error {per_cell.max():.2e}); pass a larger target"
            )
        levels = grown
    tail = tail_error(bound, div, delta, index)
    if tail > target / 2:
        raise ValueError(f"{div.name} {side} bound at delta={delta}: tail error {tail:.2e} above the target")
    return bound, max(float(per_cell.max()), tail), per_cell.size * len(_CHECK_S) + len(bound.tails())


def tail_error(bound: TabulatedBound, div: Divergence, delta: float, index: int) -> float:
    """Max error on the tails outside the grid, against the 50-digit mpmath oracle (the bisection solver
    cannot represent p = 1 - 2^-1074 or p = 1: its x = logit p is infinite)."""
    from .oracle import reference_band_log

    L = bound.tails()
    if not L.size:
        return 0.0
    exact = reference_band_log(div, -L, delta)[index]
    return float(rel_log_error(bound.log(L), exact).max())


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
        _check_target(target)
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
        """(log_lower, log_upper) for ``old_log_prob`` (NumPy array, scalar, or torch tensor).

        A CPU tensor is evaluated by the Numba kernel on a zero-copy view (float16/bfloat16 through float32);
        on other devices by the torch kernel.  Either way a torch input never raises: log p above the tolerance
        gives NaN (no host synchronisation on a device).
        """
        if _is_torch(old_log_prob):
            import torch

            from .table_eval import eval_log_torch

            with torch.no_grad():
                dtype = _torch_float_dtype(old_log_prob)
                if old_log_prob.device.type == "cpu":
                    return self._log_cpu_tensor(old_log_prob.detach(), dtype)
                lp = old_log_prob.detach().to(torch.float64)
                lo, up = eval_log_torch(lp, *self._torch_arrays(lp.device), _LOG_P_TOLERANCE)
                return lo.to(dtype), up.to(dtype)
        arr = np.asarray(old_log_prob)
        if arr.dtype not in (np.float16, np.float32, np.float64):
            raise TypeError(f"old_log_prob must hold float16/32/64 log-probabilities, got dtype {arr.dtype}")
        flat = np.ascontiguousarray(arr).reshape(-1)
        if flat.dtype == np.float16:
            flat = flat.astype(np.float32)  # Numba has no float16 arithmetic
        out_dtype = np.float32 if arr.dtype == np.float16 else arr.dtype
        lo, up, above = eval_log_numba(flat, self.lower.kernel, self.upper.kernel, out_dtype, _LOG_P_TOLERANCE)
        if above:
            raise ValueError(
                f"old_log_prob must be <= 0 (log-probabilities; values up to {_LOG_P_TOLERANCE:g} are read as 0), "
                f"got {above} value(s) above, max {np.nanmax(arr)!r}"
            )
        return lo.reshape(arr.shape).astype(arr.dtype, copy=False), up.reshape(arr.shape).astype(arr.dtype, copy=False)

    def _log_cpu_tensor(self, tensor, dtype):
        import torch

        if dtype not in (torch.float32, torch.float64):
            tensor = tensor.to(torch.float32)  # float16/bfloat16 are exact in float32
        flat = tensor.contiguous().reshape(-1).numpy()
        lo, up, above = eval_log_numba(flat, self.lower.kernel, self.upper.kernel, flat.dtype, _LOG_P_TOLERANCE)
        if above:  # as on a device: NaN, not an error
            lo[flat > _LOG_P_TOLERANCE] = np.nan
            up[flat > _LOG_P_TOLERANCE] = np.nan
        shape = tensor.shape
        return torch.from_numpy(lo).reshape(shape).to(dtype), torch.from_numpy(up).reshape(shape).to(dtype)

    def __call__(self, old_log_prob):
        """(lower, upper) ratio bounds: ``exp`` of :meth:`log` (lower 0 where saturated, upper 1/p)."""
        lo, up = self.log(old_log_prob)
        if _is_torch(lo):
            return lo.exp(), up.exp()
        with np.errstate(over="ignore"):
            return np.exp(lo), np.exp(up)

    def _torch_arrays(self, device):
        if device not in self._torch_cache:
            from .table_eval import torch_arrays

            self._torch_cache[device] = (torch_arrays(self.lower.kernel, device),
                                         torch_arrays(self.upper.kernel, device))  # fmt: skip
        return self._torch_cache[device]

    # ---- certification -----------------------------------------------------------------------------------
    def recertify(self, points_per_interval: int = 11, *, seed: int | None = None) -> float:
        r"""Re-measure the max error against the exact solver; returns :math:`\max e` (without the margin).

        With ``seed=None`` the points are the interior points :math:`s = k/(m+1)` of every cell
        (``m = points_per_interval``); with a seed they are uniformly random in each cell.  The tails outside
        the grid are always included (against the mpmath oracle: see :func:`tail_error`).
        """
        solve = exact_solver()
        rng = None if seed is None else np.random.default_rng(seed)
        worst = 0.0
        for index, bound in ((0, self.lower), (1, self.upper)):
            m = points_per_interval
            s = np.arange(1, m + 1) / (m + 1) if rng is None else rng.random((len(bound.knots) - 1, m))
            L = bound.check_points(s).ravel()
            exact = np.asarray(solve(-L, self.divergence, self.delta)[index], dtype=np.float64)
            approx = self.log(-L)[index]
            worst = max(worst, float(rel_log_error(approx, exact).max()), tail_error(bound, self.divergence,
                                                                                     self.delta, index))
        return worst

    # ---- files -------------------------------------------------------------------------------------------
    def to_arrays(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """(arrays, metadata) as stored in every file format."""
        arrays = {}
        for side, bound in (("lower", self.lower), ("upper", self.upper)):
            arrays[f"{side}_knots"] = bound.knots
            arrays[f"{side}_values"] = bound.values
            arrays[f"{side}_slopes"] = bound.slopes
            arrays[f"{side}_levels"] = bound.levels.astype(np.float64)
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
            for side in ("lower", "upper"):
                bounds[side] = bound_from_arrays(
                    side, arrays[f"{side}_knots"], arrays[f"{side}_values"], arrays[f"{side}_slopes"],
                    arrays[f"{side}_levels"], meta,
                )  # fmt: skip
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


def bound_metadata(lower: TabulatedBound, upper: TabulatedBound) -> dict[str, Any]:
    """The metadata describing the grid, the stored functions and the saturation of both bounds."""
    return {
        "coordinate": "L = -log(p)",
        "method": METHOD,
        "grid": "octave [2^e, 2^(e+1)) of L cut into 2^level equal cells; knots = a, grid points inside, b",
        "lower_kind": lower.kind,
        "upper_kind": upper.kind,
        "kinds": "0: log r, 1: r, 2: log(-log r)",
        "lower_saturated_at_or_above_L": lower.knots[-1] if lower.saturated_right else None,
        "upper_saturated_at_or_below_L": upper.knots[0] if upper.saturated_left else None,
        "L_range": list(L_RANGE),
        "outside_knots": "saturated side: exact; else left: first value; right: linear in L with the end slope",
    }


def bound_from_arrays(side, knots, values, slopes, levels, meta) -> TabulatedBound:
    """Validate one bound read from a file (grid, shapes, kind, saturation) and rebuild it."""
    from .table_formats import TableFileError

    kind = int(meta[f"{side}_kind"])
    sat = meta["lower_saturated_at_or_above_L" if side == "lower" else "upper_saturated_at_or_below_L"]
    if knots.ndim != 1 or len(knots) < 2 or np.any(np.diff(knots) <= 0) or knots[0] <= 0:
        raise TableFileError(f"{side} knots must be positive and strictly increasing with at least 2 entries")
    if values.shape != knots.shape or slopes.shape != knots.shape:
        raise TableFileError(f"{side} values/slopes do not match its knots")
    if not (np.all(levels == np.round(levels)) and np.all((levels >= 0) & (levels <= MAX_LEVEL))):
        raise TableFileError(f"{side} levels must be integers in [0, {MAX_LEVEL}]")
    levels = levels.astype(np.int64)
    if len(levels) != n_octaves(knots[0], knots[-1]) or not np.array_equal(
        octave_grid(knots[0], knots[-1], levels), knots
    ):
        raise TableFileError(f"{side} knots are not the octave grid of their levels")
    if kind not in ((LOG_R,) if side == "upper" else (RATIO, LOG_NEG_LOG_R)):
        raise TableFileError(f"{side} kind {kind} is not valid for this bound")
    edge = knots[-1] if side == "lower" else knots[0]
    if sat is not None and float(sat) != edge:
        raise TableFileError(f"{side} saturation threshold {sat!r} is not the end of its knots")
    return TabulatedBound(knots, values, slopes, levels, kind, sat is not None and side == "upper",
                          sat is not None and side == "lower")  # fmt: skip


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


def _check_target(target) -> None:
    if not (isinstance(target, (int, float)) and 1e-14 <= target < 1):
        raise ValueError(f"target must be a number in [1e-14, 1), got {target!r}")


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
