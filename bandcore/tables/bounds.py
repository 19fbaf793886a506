r"""One tabulated bound: its data, how it is built and certified, and how it is checked when read from a file.

Each octave :math:`[2^e, 2^{e+1})` of :math:`[2^{-120}, 680]` starts as one cell; the saturation kink
:math:`L^*` where a bound reaches :math:`1/p` or 0 (50-digit bisection) ends the tabulated range, so the
interpolant never crosses it and the saturated side returns the exact value.  Every cell is checked at
:math:`s = k/12,\ k = 1..11` (midpoint included) against the exact solver, *through the evaluation kernel
itself*, and every octave holding a cell whose error exceeds half the target is cut twice as finely, until none
does.  See :mod:`bandcore.tables.table` for the certificate.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from ..divergences import Divergence, resolve
from ..divergences.grammar import parse, to_text
from .evaluate import MAX_LEVEL, KernelBound, eval_log, octave_grid, octave_of, pack
from .formats import TableFileError
from .limits import L_RANGE, MAX_KNOTS
from .pieces import bisection_band_log, pieces, saturation_threshold
from .shape import LOG_NEG_LOG_R, LOG_R, LOG_R_LOWER, RATIO, lower_tail_kind, threshold_exponent

__all__ = ["BUILDER", "DEFAULT_TARGET", "LOG_NEG_LOG_R", "LOG_R", "LOG_R_LOWER", "L_RANGE", "RATIO", "TabulatedBound",
           "build_bound", "builder_of", "certificate", "exact_solver", "rel_log_error"]  # fmt: skip

#: Default certified error target, |Δ log r| / max(1, |log r|).
DEFAULT_TARGET = 1e-7
#: Written into every table as ``builder``: identifies the building and certifying code, not the package version
#: (a release that does not change them must not change a table's bytes).  Bump it when a change to this package
#: changes any table's content.
BUILDER = "bandcore.tables 3"
CHECK_S = np.arange(1, 12) / 12.0  # check points per cell, midpoint included
GAP_FACTOR = 1.25  # certificate margin for the gaps between check points
#: the tails outside L_RANGE that the certificate also measures (left: down to p = 1; right: p < e^-680)
LEFT_TAIL = np.array([2.0**-121, 2.0**-200, 1e-300, 5e-324, 0.0])
RIGHT_TAIL = np.array([690.0, 700.0, 1e3])
METHOD = "cubic Hermite in L = -log(p) on octave cells, slopes by implicit differentiation of g_f"
ERROR_MEASURE = "|Δ log r| / max(1, |log r|)"



def exact_solver() -> Callable[[np.ndarray, Divergence, float], tuple[np.ndarray, np.ndarray]]:
    """The exact solver tables sample and certify against: :func:`bandcore.tables.pieces.bisection_band_log`.

    It bisects the float64 bit patterns of :math:`\\pm\\log r` on the cancellation-free :math:`g_f` of
    :mod:`bandcore.tables.pieces`: slow (128 evaluations of :math:`g_f`), obviously correct, independent of the
    fast backends it is used to check (tests compare it with the mpmath oracle).
    """
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
        """This bound's log r at float64 ``L`` through the evaluation kernel (the build and certificate use it).

        The kernel's NumPy binding: the same source as the Numba and torch ones (:mod:`bandcore.kernels.lookup`),
        element by element with no threads and no fast-math contraction, so a build cannot depend on the thread
        count or on how Numba vectorises (the compiled bindings agree with it to a few ulps, far inside the
        certificate's margin)."""
        log_p = -np.ascontiguousarray(L, dtype=np.float64).ravel()
        out = eval_log(log_p, self.kernel, self.kernel, np.float64, math.inf, backend="numpy")[0]
        return out.reshape(np.shape(L))

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


def stored(kind: int, L: np.ndarray, y: np.ndarray, parts, kink: float | None = None):
    """Stored values and slopes dF/dL from exact log-bounds y at L; at ``L == kink`` (a saturation threshold,
    the end of the grid) the slope is the unsaturated side's."""
    with np.errstate(all="ignore"):
        if kind == RATIO:
            return np.exp(y), parts.slope_in_L(L, y, ratio=True)
        slope = parts.slope_in_L(L, y, kink=L == kink)
        if kind in (LOG_R, LOG_R_LOWER):
            return y, slope
        return np.log(-y), slope / y  # d/dL log(-y) = y'/y


def certificate(measured: float) -> float:
    """``GAP_FACTOR × measured``, rounded *up* to 3 significant digits (still a bound, and its digits do not
    carry the last bits of a measurement)."""
    value = GAP_FACTOR * float(measured)
    if not (math.isfinite(value) and value > 0):
        return value
    exponent = math.floor(math.log10(value)) - 2
    digits = math.ceil(round(value / 10.0**exponent, 9))
    return float(f"{digits}e{exponent}")


def builder_of(meta: dict[str, Any]) -> str:
    """The ``builder`` of a file's metadata (files written before it was recorded name the package version)."""
    if "builder" in meta:
        return str(meta["builder"])
    return f"bandcore {meta['bandcore_version']}"  # KeyError when neither: the readers report a missing field


def rel_log_error(approx: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """The certificate's measure :math:`|\\hat y - y| / \\max(1, |y|)` (0 where equal, inf for NaN)."""
    with np.errstate(invalid="ignore"):
        err = np.abs(approx - exact) / np.maximum(1.0, np.abs(exact))
    err = np.where(approx == exact, 0.0, err)
    return np.where(np.isnan(err), np.inf, err)


def bound_domain(div: Divergence, delta: float, side: str) -> tuple[int, float, float, bool]:
    """(kind, a, b, saturated) of one bound: the tabulated range [a, b] ends at a saturation kink.

    The kind is the stored function that is smooth on [a, b] and linear in L beyond 680
    (:mod:`bandcore.tables.shape`): log r for an upper bound, r for a lower bound that saturates, and for one
    that does not, log(-log r) or log r, whichever is linear as p -> 0.  A bound that is not smooth at its
    threshold is refused here, before anything is built (:func:`~bandcore.tables.shape.threshold_exponent`)."""
    sat = saturation_threshold(div, delta, side, L_RANGE)
    if sat == "all":
        raise ValueError(
            f"the {side} bound of {div.name} at delta={delta} is saturated for every p: nothing to tabulate"
        )
    a, b = L_RANGE
    if sat is None:
        kind = LOG_R if side == "upper" else lower_tail_kind(div, delta)
        return kind, a, b, False
    threshold_exponent(div, delta, side, sat)
    a, b = (sat, b) if side == "upper" else (a, sat)
    return (LOG_R if side == "upper" else RATIO), a, b, True


def n_octaves(a: float, b: float) -> int:
    """Number of octaves from the one holding ``a`` to the one holding the last float below ``b``."""
    return octave_of(np.nextafter(b, 0.0)) - octave_of(a) + 1


def grid_size(a: float, b: float, levels: np.ndarray) -> int:
    """``len(octave_grid(a, b, levels))``, counted without building the grid (exact: powers of 2 only)."""
    e_a, total = octave_of(a), 2
    for o, k in enumerate(np.asarray(levels, dtype=np.int64).tolist()):
        e, n = e_a + o, 2**k
        j_min = math.floor((math.ldexp(a, -e) - 1.0) * n) + 1 if o == 0 else 0  # grid points > a
        t_b = (math.ldexp(b, -e) - 1.0) * n
        j_max = min(n - 1, math.ceil(t_b) - 1)  # grid points < b
        total += max(0, j_max - max(j_min, 0) + 1)
    return total


def cell_octaves(knots: np.ndarray) -> np.ndarray:
    """Octave index (from the first knot's) of every cell."""
    return np.frexp(knots[:-1])[1] - np.frexp(knots[0])[1]


def build_bound(div, delta, side, target, solve, bar) -> tuple[TabulatedBound, float, int]:
    """One certified bound: (bound, max error measured, number of points checked)."""
    parts = pieces(div)
    kind, a, b, saturated = bound_domain(div, delta, side)
    index = 1 if side == "upper" else 0

    def exact_log(L):
        return np.asarray(solve(-L, div, delta)[index], dtype=np.float64)

    levels = np.zeros(n_octaves(a, b), dtype=np.int64)
    while True:
        knots = octave_grid(a, b, levels)
        values, slopes = stored(kind, knots, exact_log(knots), parts, kink=a if saturated else None)
        if not (np.all(np.isfinite(values)) and np.all(np.isfinite(slopes))):
            bad = knots[~(np.isfinite(values) & np.isfinite(slopes))]
            raise ValueError(f"{div.name} {side} bound: non-finite value or slope at L = {bad[:3]}")
        bound = TabulatedBound(knots, values, slopes, levels.copy(), kind, saturated and side == "upper",
                               saturated and side == "lower")  # fmt: skip
        xs = bound.check_points(CHECK_S).ravel()
        per_cell = rel_log_error(bound.log(xs), exact_log(xs)).reshape(len(knots) - 1, len(CHECK_S)).max(axis=1)
        per_octave = np.zeros(len(levels))
        np.maximum.at(per_octave, cell_octaves(knots), per_cell)
        failing = per_octave > target / 2
        if bar is not None:
            bar.set_postfix_str(f"{side}: {len(knots)} knots, max err {per_cell.max():.1e}")
            bar.update(1)
        if not failing.any():
            break
        grown = levels + failing
        if grown.max() > MAX_LEVEL or grid_size(a, b, grown) > MAX_KNOTS:
            raise ValueError(
                f"{div.name} {side} bound at delta={delta}: target {target:g} not reached with {MAX_KNOTS} "
                f"knots (max error {per_cell.max():.2e}); pass a larger target"
            )
        levels = grown
    tail = tail_error(bound, div, delta, index)
    if tail > target / 2:
        raise ValueError(f"{div.name} {side} bound at delta={delta}: tail error {tail:.2e} above the target")
    return bound, max(float(per_cell.max()), tail), per_cell.size * len(CHECK_S) + len(bound.tails())


def tail_error(bound: TabulatedBound, div: Divergence, delta: float, index: int) -> float:
    """Max error on the tails outside the grid, against the 50-digit mpmath oracle (the bisection solver
    cannot represent p = 1 - 2^-1074 or p = 1: its x = logit p is infinite)."""
    from ..oracle import reference_band_log

    L = bound.tails()
    if not L.size:
        return 0.0
    exact = reference_band_log(div, -L, delta)[index]
    return float(rel_log_error(bound.log(L), exact).max())


def bound_metadata(lower: TabulatedBound, upper: TabulatedBound) -> dict[str, Any]:
    """The metadata describing the grid, the stored functions and the saturation of both bounds."""
    return {
        "coordinate": "L = -log(p)",
        "method": METHOD,
        "grid": "octave [2^e, 2^(e+1)) of L cut into 2^level equal cells; knots = a, grid points inside, b",
        "lower_kind": lower.kind,
        "upper_kind": upper.kind,
        "kinds": "0: log r, 1: r, 2: log(-log r), 3: log r (a lower bound)",
        "lower_saturated_at_or_above_L": lower.knots[-1] if lower.saturated_right else None,
        "upper_saturated_at_or_below_L": upper.knots[0] if upper.saturated_left else None,
        "L_range": list(L_RANGE),
        "outside_knots": "saturated side: exact; else left: first value; right: linear in L with the end slope",
    }


def bound_from_arrays(side, knots, values, slopes, levels, meta) -> TabulatedBound:
    """Validate one bound read from a file (grid, shapes, kind, saturation) and rebuild it; the grid is
    counted before it is built, so no file can make the reader allocate more than its own size."""
    kind = int(meta[f"{side}_kind"])
    sat = meta["lower_saturated_at_or_above_L" if side == "lower" else "upper_saturated_at_or_below_L"]
    if knots.ndim != 1 or len(knots) < 2 or np.any(np.diff(knots) <= 0) or knots[0] <= 0:
        raise TableFileError(f"{side} knots must be positive and strictly increasing with at least 2 entries")
    if knots[0] < L_RANGE[0] or knots[-1] > L_RANGE[1]:
        raise TableFileError(f"{side} knots leave the tabulated range L in {list(L_RANGE)}")
    if values.shape != knots.shape or slopes.shape != knots.shape:
        raise TableFileError(f"{side} values/slopes do not match its knots")
    if levels.ndim != 1 or not (np.all(levels == np.round(levels)) and np.all((levels >= 0) & (levels <= MAX_LEVEL))):
        raise TableFileError(f"{side} levels must be integers in [0, {MAX_LEVEL}]")
    levels = levels.astype(np.int64)
    if len(levels) != n_octaves(knots[0], knots[-1]):
        raise TableFileError(f"{side} has {len(levels)} octave levels for {n_octaves(knots[0], knots[-1])} octaves")
    if grid_size(knots[0], knots[-1], levels) != len(knots):
        raise TableFileError(f"{side} levels describe a grid of {grid_size(knots[0], knots[-1], levels)} knots, "
                             f"the file holds {len(knots)}")  # fmt: skip
    if not np.array_equal(octave_grid(knots[0], knots[-1], levels), knots):
        raise TableFileError(f"{side} knots are not the octave grid of their levels")
    if kind not in ((LOG_R,) if side == "upper" else (RATIO, LOG_NEG_LOG_R, LOG_R_LOWER)):
        raise TableFileError(f"{side} kind {kind} is not valid for this bound")
    edge = knots[-1] if side == "lower" else knots[0]
    if sat is not None and float(sat) != edge:
        raise TableFileError(f"{side} saturation threshold {sat!r} is not the end of its knots")
    return TabulatedBound(knots, values, slopes, levels, kind, sat is not None and side == "upper",
                          sat is not None and side == "lower")  # fmt: skip


def check_delta(delta) -> float:
    if isinstance(delta, bool) or not isinstance(delta, (int, float, np.floating, np.integer)):
        raise TypeError(f"delta must be a positive number, got {delta!r}")
    value = float(delta)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"delta must be finite and > 0, got {delta!r}")
    return value


def check_target(target) -> None:
    if not (isinstance(target, (int, float)) and 1e-14 <= target < 1):
        raise ValueError(f"target must be a number in [1e-14, 1), got {target!r}")


def canonical_formula(generator: str) -> str:
    """The grammar's canonical spelling of a stored generator (files before the grammar wrote ``Abs``)."""
    return to_text(parse(generator.replace("Abs(", "abs(")))


def divergence_of(name: str, generator: str) -> Divergence:
    """The divergence a file describes: its name when that names the stored generator, else the generator
    itself (parsed by the safe grammar: no Python is evaluated).  A catalogue name over another generator is
    refused: the label and the contents disagree."""
    formula = canonical_formula(generator)
    try:
        div = resolve(name)
    except (ValueError, TypeError):
        div = None
    if div is not None and div.formula == formula:
        return div
    if div is not None and div.is_catalogue:
        raise TableFileError(f"the table is labelled {name!r} (f = {div.formula}) but stores the generator {formula}")
    return Divergence.from_expression(formula, name=name)
