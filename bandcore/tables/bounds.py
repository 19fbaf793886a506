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

import mpmath as mp
import numpy as np

from ..divergences import Divergence, resolve
from ..divergences.grammar import parse, to_text
from .evaluate import MAX_LEVEL, KernelBound, eval_log, octave_grid, octave_of, pack
from .formats import TableFileError
from .limits import L_RANGE, MAX_KNOTS
from .pieces import bisection_band_log, pieces, saturation_threshold
from .shape import LOG_NEG_LOG_R, LOG_R, LOG_R_LOWER, RATIO, lower_tail_kind, threshold_exponent
from .threshold import (
    DPS,
    SPLIT_LOWER,
    SPLIT_UPPER,
    TRUST,
    NearPart,
    SplitBound,
    gamma_of,
    near_exact,
    near_range,
    threshold_dd,
)  # fmt: skip

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
#: the same for a bound with a logarithmic left tail (grid down to L_MIN_LOG) or right tail
LEFT_TAIL_LOG = np.concatenate([LEFT_TAIL, [2.0**-1023, 1e-310, 1e-320]])
RIGHT_TAIL_LOG = np.array([690.0, 700.0, 1e3, 2e3])
#: where the grid of a bound with a logarithmic left tail starts (the smallest normal float64)
L_MIN_LOG = 2.0**-1022
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
    #: (C, beta): left of the first knot log r = C / (beta - log L) (a bound whose log r -> 0 like 1/log(1/L))
    left_tail: tuple[float, float] | None = None
    #: (K, nu): right of the last knot y + log(y + nu) = L + K (an upper bound with y = log r ~ L - log L)
    right_tail: tuple[float, float] | None = None

    @cached_property
    def kernel(self) -> KernelBound:
        """The arrays the evaluation kernels read (Horner cells, octave offsets)."""
        packed = pack(self.knots, self.values, self.slopes, self.levels, self.kind, self.saturated_left,
                      self.saturated_right)  # fmt: skip
        if self.left_tail is None and self.right_tail is None:
            return packed  # the four-entry imeta of the original kinds: no tail modes
        return KernelBound(fmeta=np.concatenate([packed.fmeta, self.tail_fmeta()]),
                           imeta=np.concatenate([packed.imeta, self.tail_imeta()]), off=packed.off,
                           levels=packed.levels, cells=packed.cells)  # fmt: skip

    def tail_fmeta(self) -> np.ndarray:
        """``(C, beta, F_r, F'_r)`` of the kernel's tail modes (zeros where unused; see :func:`tail_log`)."""
        c, beta = self.left_tail if self.left_tail is not None else (0.0, 0.0)
        k, nu = self.right_tail if self.right_tail is not None else (0.0, 0.0)
        return np.array([c, beta, k, nu], dtype=np.float64)

    def tail_imeta(self) -> np.ndarray:
        return np.array([self.left_tail is not None, self.right_tail is not None], dtype=np.int64)

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
        left = [] if self.saturated_left else LEFT_TAIL if self.left_tail is None else LEFT_TAIL_LOG
        right = [] if self.saturated_right else RIGHT_TAIL if self.right_tail is None else RIGHT_TAIL_LOG
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
    (:mod:`bandcore.tables.shape`): log r for an upper bound, and for a lower one that does not saturate
    log(-log r) or log r, whichever is linear as p -> 0.  A lower bound that saturates is split at its threshold
    (kind 4): its r falls to 0 there, so a cubic in L with a small *absolute* error has an unbounded error in
    log r next to L* (a plain table of r erred by 4.5e-6 at 1e-9 L* for TV, and gave -inf for Hellinger, against
    a certificate of 5e-8).  An upper bound that is not smooth at its threshold is split too
    (:func:`~bandcore.tables.shape.threshold_exponent`), before anything is built."""
    sat = saturation_threshold(div, delta, side, L_RANGE)
    if sat == "all":
        raise ValueError(
            f"the {side} bound of {div.name} at delta={delta} is saturated for every p: nothing to tabulate"
        )
    a, b = L_RANGE
    if sat is None:
        kind = LOG_R if side == "upper" else lower_tail_kind(div, delta)
        return kind, a, b, False
    a, b = (sat, b) if side == "upper" else (a, sat)
    if side == "lower":
        return SPLIT_LOWER, a, b, True
    try:
        threshold_exponent(div, delta, side, sat)
    except ValueError:
        return (SPLIT_UPPER if side == "upper" else SPLIT_LOWER), a, b, True
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
        if b >= math.ldexp(1.0, e + 1):
            j_max = n - 1  # the whole octave lies below b (no ldexp overflow for octaves far below b)
        else:
            j_max = min(n - 1, math.ceil((math.ldexp(b, -e) - 1.0) * n) - 1)  # grid points < b
        total += max(0, j_max - max(j_min, 0) + 1)
    return total


def cell_octaves(knots: np.ndarray) -> np.ndarray:
    """Octave index (from the first knot's) of every cell."""
    return np.frexp(knots[:-1])[1] - np.frexp(knots[0])[1]


class TargetNotReached(ValueError):
    """The octave refinement hit :data:`MAX_LEVEL` or :data:`MAX_KNOTS` before the target."""


def build_bound(div, delta, side, target, solve, bar) -> tuple[TabulatedBound | SplitBound, float, int]:
    """One certified bound: (bound, max error measured, number of points checked).

    A bound that saturates is first tabulated in L up to its threshold; where that cannot reach the target (a
    singular threshold, :mod:`bandcore.tables.shape`) it is split at the threshold
    (:mod:`bandcore.tables.threshold`)."""
    kind, a, b, saturated = bound_domain(div, delta, side)
    threshold = (b if side == "lower" else a) if saturated else None
    split = kind in (SPLIT_LOWER, SPLIT_UPPER)
    for tails in ((False, False), None):
        if tails is None:  # the end value / end tangent missed the target: logarithmic tails
            tails = tail_modes(div, delta, side, target)
        try:
            if not split:
                try:
                    return _build_plain(div, delta, side, target, solve, bar, kind, a, b, saturated, *tails)
                except TargetNotReached:
                    if not saturated:
                        raise
                    split = True
            return build_split_bound(div, delta, side, target, solve, bar, threshold, *tails)
        except TailError:
            if tails != (False, False):
                raise
    raise AssertionError("unreachable")


class TailError(ValueError):
    """The tails outside the grid miss the target."""


def tail_modes(div, delta, side, target) -> tuple[bool, bool]:
    """(logarithmic left tail, logarithmic right tail) that a bound needs, from the 50-digit oracle: on the left
    log r still moves between L = 2^-120 and 5e-324 (log r -> 0 like 1/log(1/L), a generator growing like
    u log u); on the right (upper bounds) log r is not linear in L between 680 and 1000 (log r ~ L - log L)."""
    from ..oracle import reference_band_log

    index = 1 if side == "upper" else 0
    y = reference_band_log(div, -np.array([2.0**-120, 5e-324, 680.0, 840.0, 1000.0]), delta)[index]
    with np.errstate(all="ignore"):
        left = bool(np.isfinite(y[0]) and abs(y[0] - y[1]) > target / 4)
        right = bool(side == "upper" and np.all(np.isfinite(y[2:]))
                     and abs(y[2] - 2 * y[3] + y[4]) > target / 4 * abs(y[4]))  # fmt: skip
    return left, right


def left_tail_fit(div, delta, index, a: float, y_a: float) -> tuple[float, float]:
    """(C, beta) with log r = C/(beta - log L) through (a, y_a) and the oracle at L = 5e-324."""
    from ..oracle import reference_band_log

    tiny = 5e-324
    y_s = float(reference_band_log(div, -np.array([tiny]), delta)[index][0])
    ell_a, ell_s = -math.log(a), -math.log(tiny)
    beta = (y_s * ell_s - y_a * ell_a) / (y_a - y_s)
    return y_a * (ell_a + beta), beta


def _build_plain(div, delta, side, target, solve, bar, kind, a, b, saturated, left_log=False,
                 right_log=False) -> tuple[TabulatedBound, float, int]:  # fmt: skip
    parts = pieces(div)
    index = 1 if side == "upper" else 0
    if left_log:
        a = L_MIN_LOG

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
            raise TargetNotReached(
                f"{div.name} {side} bound at delta={delta}: target {target:g} not reached with {MAX_KNOTS} "
                f"knots (max error {per_cell.max():.2e}); pass a larger target"
            )
        levels = grown
    bound = with_tails(bound, div, delta, index, left_log, right_log)
    tail = tail_error(bound, div, delta, index)
    if tail > target / 2:
        raise TailError(f"{div.name} {side} bound at delta={delta}: tail error {tail:.2e} above the target")
    return bound, max(float(per_cell.max()), tail), per_cell.size * len(CHECK_S) + len(bound.tails())


def with_tails(bound: TabulatedBound, div, delta, index, left_log: bool, right_log: bool) -> TabulatedBound:
    """``bound`` with its logarithmic tail modes (:func:`tail_modes`); the left one fitted here."""
    from dataclasses import replace

    if left_log:
        y_a = float(bound.log(np.array([bound.knots[0]]))[0])
        bound = replace(bound, left_tail=left_tail_fit(div, delta, index, float(bound.knots[0]), y_a))
    if right_log:
        bound = replace(bound, right_tail=right_tail_fit(div, delta, float(bound.knots[-1]), float(bound.values[-1])))
    return bound


def right_tail_fit(div, delta, b: float, y_b: float) -> tuple[float, float]:
    """(K, nu) with y + log(y + nu) = L + K through (b, y_b) and the oracle at L = 2000: the upper bound of a
    generator growing like k u log u + m u solves y - L + log(k y + m) = log(delta) + o(1), so nu = m/k."""
    from ..oracle import reference_band_log

    L_s = 2e3
    y_s = float(reference_band_log(div, -np.array([L_s]), delta)[1][0])
    nu = 0.0
    for _ in range(50):  # Newton on phi(nu) = 0, phi increasing (y_s > y_b)
        phi = (y_b - b + math.log(y_b + nu)) - (y_s - L_s + math.log(y_s + nu))
        step = phi / (1.0 / (y_b + nu) - 1.0 / (y_s + nu))
        nu -= step
        if abs(step) <= 1e-15 * max(1.0, abs(nu)):
            break
    return y_b - b + math.log(y_b + nu), nu


def exact_bound_log(bound, div, delta, index, L, solve=None, cache=None) -> np.ndarray:
    """Exact log r of one bound at float64 ``L``: the float64 solver, except within :data:`TRUST` L* of a split
    bound's threshold, where it is not exact, the 50-digit solve (:mod:`bandcore.tables.threshold`)."""
    solve = solve or exact_solver()
    L = np.asarray(L, dtype=np.float64)
    out = np.array(solve(-L, div, delta)[index], dtype=np.float64)
    if not isinstance(bound, SplitBound):
        return out
    side = "upper" if index else "lower"
    with np.errstate(all="ignore"):
        tight = np.flatnonzero((bound.lam_of(L) < TRUST * bound.star_hi) & (bound.lam_of(L) > 0))
    cache = {} if cache is None else cache
    todo = [i for i in tight if float(L[i]) not in cache]
    if todo:
        with np.errstate(all="ignore"):
            guess = out[todo] if side == "lower" else np.log(-np.expm1(out[todo] - L[todo]))
        t, _ = near_exact(div, delta, side, [float(L[i]) for i in todo], guess)
        for i, tv in zip(todo, t, strict=True):
            cache[float(L[i])] = tv if side == "lower" else float(L[i]) + math.log1p(-math.exp(tv))
    for i in tight:
        out[i] = cache[float(L[i])]
    return out


def near_samples(div, delta, side, star, b, gamma, lam, solve, cache) -> tuple[np.ndarray, np.ndarray]:
    r"""(G, dG/dλ) of a split bound's near part at the λ in ``lam`` (:mod:`bandcore.tables.threshold`), for the
    threshold ``star`` (mpf; ``b`` its saturated float): the float64 solver at :math:`L = L^* \mp \lambda`
    above λ = :data:`TRUST` b, the 50-digit solve below; ``cache`` maps λ to (log u, d log u/dλ) (nested grids
    share their knots)."""
    index = 1 if side == "upper" else 0
    sign = -1.0 if side == "lower" else 1.0  # d lambda / dL
    trust = TRUST * b
    parts = pieces(div)

    def float_y(L):
        return np.asarray(solve(-np.asarray(L, dtype=np.float64), div, delta)[index], dtype=np.float64)

    todo = np.array([x for x in lam if float(x) not in cache], dtype=np.float64)
    if todo.size:
        precise = todo < trust
        wide = todo[~precise]
        if wide.size:
            with mp.workdps(DPS):
                L = np.asarray([float(star + sign * mp.mpf(x)) for x in wide])
            y = float_y(L)
            with np.errstate(all="ignore"):
                dy = parts.slope_in_L(L, y)
                if side == "lower":
                    t, dt = y, dy
                else:
                    u = -np.expm1(y - L)
                    t, dt = np.log(u), -np.exp(y - L) * (dy - 1.0) / u
            for x, tv, dv in zip(wide, t, dt, strict=True):
                cache[float(x)] = (float(tv), float(dv))
        tight = todo[precise]
        if tight.size:
            with mp.workdps(DPS):
                L_mp = [star + sign * mp.mpf(x) for x in tight]
            L_f = np.array([float(x) for x in L_mp])
            y = float_y(L_f)
            with np.errstate(all="ignore"):
                guess = y if side == "lower" else np.log(-np.expm1(y - L_f))
            t, dt = near_exact(div, delta, side, L_mp, guess)
            for x, tv, dv in zip(tight, t, dt, strict=True):
                cache[float(x)] = (float(tv), float(dv))
    t = np.array([cache[float(x)][0] for x in lam])
    dt = np.array([cache[float(x)][1] for x in lam])
    return t - gamma * np.log(lam), sign * dt - gamma / lam


def build_split_bound(div, delta, side, target, solve, bar, threshold, left_log=False,
                      right_log=False) -> tuple[SplitBound, float, int]:  # fmt: skip
    """One bound split at its saturation threshold: far part in L, near part in lambda = |L - L*| (see
    :mod:`bandcore.tables.threshold`), each octave refined until its error is below half the target."""
    parts = pieces(div)
    index = 1 if side == "upper" else 0
    kind = SPLIT_LOWER if side == "lower" else SPLIT_UPPER
    star, star_lo, lam0 = threshold_dd(div, delta, side, threshold)
    gamma = gamma_of(div, delta, side, star)
    m, lam0, lam_m = near_range(kind, threshold, star_lo, lam0)
    far_a, far_b = (L_MIN_LOG if left_log else L_RANGE[0], m) if side == "lower" else (m, L_RANGE[1])
    far_kind = RATIO if side == "lower" else LOG_R
    near_cache: dict[float, tuple[float, float]] = {}
    exact_cache: dict[float, float] = {}

    def float_y(L):
        return np.asarray(solve(-np.asarray(L, dtype=np.float64), div, delta)[index], dtype=np.float64)

    def near_values(lam):
        return near_samples(div, delta, side, star, threshold, gamma, lam, solve, near_cache)

    def exact_at(L, bound):
        return exact_bound_log(bound, div, delta, index, L, solve, exact_cache)

    far_levels = np.zeros(n_octaves(far_a, far_b), dtype=np.int64)
    near_levels = np.zeros(n_octaves(lam0, lam_m), dtype=np.int64)
    while True:
        far_knots = octave_grid(far_a, far_b, far_levels)
        fv, fs = stored(far_kind, far_knots, float_y(far_knots), parts)
        far = TabulatedBound(far_knots, fv, fs, far_levels.copy(), far_kind)
        near_knots = octave_grid(lam0, lam_m, near_levels)
        nv, ns = near_values(near_knots)
        if not all(np.all(np.isfinite(v)) for v in (fv, fs, nv, ns)):
            raise ValueError(f"{div.name} {side} bound: non-finite value or slope near the threshold")
        bound = SplitBound(far, NearPart(near_knots, nv, ns, near_levels.copy()), kind, threshold, star_lo, gamma)
        xs = far.check_points(CHECK_S).ravel()
        far_err = rel_log_error(bound.log(xs), float_y(xs)).reshape(len(far_knots) - 1, -1).max(axis=1)
        lam = near_knots[:-1, None] + np.diff(near_knots)[:, None] * CHECK_S
        L = bound.to_L(lam.ravel())
        near_err = rel_log_error(bound.log(L), exact_at(L, bound)).reshape(len(near_knots) - 1, -1).max(axis=1)
        far_oct, near_oct = np.zeros(len(far_levels)), np.zeros(len(near_levels))
        np.maximum.at(far_oct, cell_octaves(far_knots), far_err)
        np.maximum.at(near_oct, cell_octaves(near_knots), near_err)
        worst = max(float(far_err.max()), float(near_err.max()))
        if bar is not None:
            bar.set_postfix_str(f"{side}: {len(far_knots)} + {len(near_knots)} knots, max err {worst:.1e}")
            bar.update(1)
        far_fail, near_fail = far_oct > target / 2, near_oct > target / 2
        if not (far_fail.any() or near_fail.any()):
            break
        far_levels, near_levels = far_levels + far_fail, near_levels + near_fail
        size = grid_size(far_a, far_b, far_levels) + grid_size(lam0, lam_m, near_levels)
        if max(far_levels.max(), near_levels.max()) > MAX_LEVEL or size > MAX_KNOTS:
            raise TargetNotReached(
                f"{div.name} {side} bound at delta={delta}: target {target:g} not reached with {MAX_KNOTS} "
                f"knots split at the threshold (max error {worst:.2e}); pass a larger target"
            )
    far = with_tails(far, div, delta, index, left_log, right_log)
    bound = SplitBound(far, bound.near, kind, threshold, star_lo, gamma)
    tail = tail_error(bound, div, delta, index)
    if tail > target / 2:
        raise TailError(f"{div.name} {side} bound at delta={delta}: tail error {tail:.2e} above the target")
    checked = (far_err.size + near_err.size) * len(CHECK_S) + len(bound.tails())
    return bound, max(worst, tail), checked


def tail_error(bound: TabulatedBound, div: Divergence, delta: float, index: int) -> float:
    """Max error on the tails outside the grid, against the 50-digit mpmath oracle (the bisection solver
    cannot represent p = 1 - 2^-1074 or p = 1: its x = logit p is infinite)."""
    from ..oracle import reference_band_log

    L = bound.tails()
    if not L.size:
        return 0.0
    exact = reference_band_log(div, -L, delta)[index]
    return float(rel_log_error(bound.log(L), exact).max())


def _edge(bound, side: str):
    if isinstance(bound, SplitBound):
        return bound.threshold
    if side == "lower":
        return bound.knots[-1] if bound.saturated_right else None
    return bound.knots[0] if bound.saturated_left else None


def bound_arrays(side: str, bound) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The arrays and the extra metadata of one bound (a split bound's near part and threshold; tail modes);
    a bound of the original kinds with no tail mode adds no metadata, so its file is unchanged."""
    far = bound.far if isinstance(bound, SplitBound) else bound
    arrays = {f"{side}_knots": far.knots, f"{side}_values": far.values, f"{side}_slopes": far.slopes,
              f"{side}_levels": far.levels.astype(np.float64)}  # fmt: skip
    meta: dict[str, Any] = {}
    if isinstance(bound, SplitBound):
        near = bound.near
        arrays.update({f"{side}_near_knots": near.knots, f"{side}_near_values": near.values,
                       f"{side}_near_slopes": near.slopes, f"{side}_near_levels": near.levels.astype(np.float64)})
        meta[f"{side}_threshold"] = [bound.star_hi, bound.star_lo]
        meta[f"{side}_gamma"] = bound.gamma
    if far.left_tail is not None:
        meta[f"{side}_left_tail"] = list(far.left_tail)
    if far.right_tail is not None:
        meta[f"{side}_right_tail"] = list(far.right_tail)
    if meta:
        meta["split_and_tails"] = SPLIT_DOC
    return arrays, meta


SPLIT_DOC = (
    "kinds 4/5: split at the saturation threshold L* = threshold[0] + threshold[1]: far part (knots, values, "
    "slopes, levels) in L storing r (lower) or log r (upper); near part (near_*) in lambda = |L - L*| storing "
    "G = log u - gamma log(lambda), u = r (lower) or 1 - p r (upper). left_tail (C, beta): left of the first knot "
    "log r = C / (beta - log L); right_tail (K, nu): right of the last knot log r + log(log r + nu) = L + K"
)


def bound_metadata(lower: TabulatedBound, upper: TabulatedBound) -> dict[str, Any]:
    """The metadata describing the grid, the stored functions and the saturation of both bounds."""
    return {
        "coordinate": "L = -log(p)",
        "method": METHOD,
        "grid": "octave [2^e, 2^(e+1)) of L cut into 2^level equal cells; knots = a, grid points inside, b",
        "lower_kind": lower.kind,
        "upper_kind": upper.kind,
        "kinds": "0: log r, 1: r, 2: log(-log r), 3: log r (a lower bound)",
        "lower_saturated_at_or_above_L": _edge(lower, "lower"),
        "upper_saturated_at_or_below_L": _edge(upper, "upper"),
        "L_range": list(L_RANGE),
        "outside_knots": "saturated side: exact; else left: first value; right: linear in L with the end slope",
    }


def split_from_arrays(side, arrays, meta):
    """Read one bound of a 1-D file: a split bound (kinds 4, 5) or one of the original kinds, with its tails."""
    kind = int(meta[f"{side}_kind"])
    left = meta.get(f"{side}_left_tail")
    right = meta.get(f"{side}_right_tail")
    tails = {}
    for key, value in (("left_tail", left), ("right_tail", right)):
        if value is not None:
            if not (isinstance(value, list) and len(value) == 2 and all(isinstance(v, (int, float)) for v in value)
                    and all(math.isfinite(v) for v in value)):  # fmt: skip
                raise TableFileError(f"{side} {key} must be two finite numbers")
            tails[key] = (float(value[0]), float(value[1]))
    if left is not None and side == "upper" and kind == SPLIT_UPPER:
        raise TableFileError("a split upper bound is saturated on the left: no left tail")
    if kind not in (SPLIT_LOWER, SPLIT_UPPER):
        bound = bound_from_arrays(side, arrays[f"{side}_knots"], arrays[f"{side}_values"], arrays[f"{side}_slopes"],
                                  arrays[f"{side}_levels"], meta, low=L_MIN_LOG if left is not None else None)
        from dataclasses import replace

        return replace(bound, **tails) if tails else bound
    if kind != (SPLIT_LOWER if side == "lower" else SPLIT_UPPER):
        raise TableFileError(f"{side} kind {kind} is not valid for this bound")
    threshold, gamma = meta.get(f"{side}_threshold"), meta.get(f"{side}_gamma")
    if not (isinstance(threshold, list) and len(threshold) == 2 and isinstance(gamma, (int, float))):
        raise TableFileError(f"{side}: a split bound needs its threshold (two numbers) and gamma")
    star_hi, star_lo = float(threshold[0]), float(threshold[1])
    if not (L_RANGE[0] <= star_hi <= L_RANGE[1] and abs(star_lo) <= 2 * np.spacing(star_hi) and 0 < gamma < 100):
        raise TableFileError(f"{side}: invalid threshold {threshold!r} or gamma {gamma!r}")
    sat = meta["lower_saturated_at_or_above_L" if side == "lower" else "upper_saturated_at_or_below_L"]
    if sat is None or float(sat) != star_hi:
        raise TableFileError(f"{side} saturation threshold {sat!r} is not the split bound's threshold")
    far_kind = RATIO if side == "lower" else LOG_R
    far_meta = {f"{side}_kind": far_kind, "lower_saturated_at_or_above_L": None,
                "upper_saturated_at_or_below_L": None}  # fmt: skip
    far = bound_from_arrays(side, arrays[f"{side}_knots"], arrays[f"{side}_values"], arrays[f"{side}_slopes"],
                            arrays[f"{side}_levels"], far_meta, low=L_MIN_LOG if left is not None else None)
    from dataclasses import replace

    far = replace(far, **tails) if tails else far
    nk = arrays[f"{side}_near_knots"]
    nl = check_near_grid(side, nk, arrays[f"{side}_near_levels"])
    nv, ns = arrays[f"{side}_near_values"], arrays[f"{side}_near_slopes"]
    if nv.shape != nk.shape or ns.shape != nk.shape:
        raise TableFileError(f"{side} near values/slopes do not match its near knots")
    m = far.knots[-1] if side == "lower" else far.knots[0]
    if m != (star_hi / 2 if side == "lower" else min(2 * star_hi, L_RANGE[1] / 2)):
        raise TableFileError(f"{side}: the far part does not end at the split point")
    return SplitBound(far, NearPart(nk, nv, ns, nl), kind, star_hi, star_lo, float(gamma))


def check_near_grid(side: str, nk: np.ndarray, nl: np.ndarray) -> np.ndarray:
    """Validate a near part's knots (in λ) and octave levels read from a file; the levels as integers."""
    if nk.ndim != 1 or len(nk) < 2 or np.any(np.diff(nk) <= 0) or not (0 < nk[0] and nk[-1] <= L_RANGE[1]):
        raise TableFileError(f"{side} near knots must be positive, strictly increasing and at most {L_RANGE[1]}")
    if nl.ndim != 1 or not (np.all(nl == np.round(nl)) and np.all((nl >= 0) & (nl <= MAX_LEVEL))):
        raise TableFileError(f"{side} near levels must be integers in [0, {MAX_LEVEL}]")
    nl = nl.astype(np.int64)
    if len(nl) != n_octaves(nk[0], nk[-1]) or grid_size(nk[0], nk[-1], nl) != len(nk):
        raise TableFileError(f"{side} near levels do not describe its near knots")
    if not np.array_equal(octave_grid(nk[0], nk[-1], nl), nk):
        raise TableFileError(f"{side} near knots are not the octave grid of their levels")
    return nl


def bound_from_arrays(side, knots, values, slopes, levels, meta, low=None) -> TabulatedBound:
    """Validate one bound read from a file (grid, shapes, kind, saturation) and rebuild it; the grid is
    counted before it is built, so no file can make the reader allocate more than its own size."""
    kind = int(meta[f"{side}_kind"])
    sat = meta["lower_saturated_at_or_above_L" if side == "lower" else "upper_saturated_at_or_below_L"]
    if knots.ndim != 1 or len(knots) < 2 or np.any(np.diff(knots) <= 0) or knots[0] <= 0:
        raise TableFileError(f"{side} knots must be positive and strictly increasing with at least 2 entries")
    if knots[0] < (L_RANGE[0] if low is None else low) or knots[-1] > L_RANGE[1]:
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
