r"""One tabulated bound: its data, how it is built and certified, and how it is checked when read from a file.

Each octave :math:`[2^e, 2^{e+1})` of :math:`[2^{-120}, 680]` starts as one cell; the saturation kink
:math:`L^*` where a bound reaches :math:`1/p` or 0 (50-digit bisection) ends the tabulated range, so the
interpolant never crosses it and the saturated side returns the exact value.  Every cell is checked at
:math:`s = k/12,\ k = 1..11` (midpoint included) against the exact solver, *through the evaluation kernel
itself*, and every octave holding a cell whose error exceeds half the target is cut twice as finely, until none
does.  See :mod:`bandcore.tables.table` for the certificate; a bound that a cubic in L cannot follow to its
threshold is split there (:mod:`bandcore.tables.near`), and tails outside the grid are :mod:`bandcore.tables.tails`.
"""

from __future__ import annotations

import numpy as np

from ..divergences import Divergence
from .evaluate import MAX_LEVEL, octave_grid
from .limits import L_RANGE, MAX_KNOTS
from .near import build_split_bound
from .pieces import pieces, saturation_threshold
from .shape import lower_tail_kind, threshold_exponent
from .tabulated import (
    CHECK_S,
    L_MIN_LOG,
    LOG_R,
    RATIO,
    TabulatedBound,
    TargetNotReached,
    cell_octaves,
    grid_size,
    n_octaves,
    rel_log_error,
    stored,
)  # fmt: skip
from .tails import TailError, tail_error, tail_modes, with_tails
from .threshold import SPLIT_LOWER, SPLIT_UPPER, SplitBound

__all__ = ["bound_domain", "build_bound"]


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



def _build_plain(div, delta, side, target, solve, bar, kind, a, b, saturated, left_log=False,
                 right_mode=0) -> tuple[TabulatedBound, float, int]:  # fmt: skip
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
    bound = with_tails(bound, div, delta, index, left_log, right_mode)
    tail = tail_error(bound, div, delta, index)
    if tail > target / 2:
        raise TailError(f"{div.name} {side} bound at delta={delta}: tail error {tail:.2e} above the target")
    return bound, max(float(per_cell.max()), tail), per_cell.size * len(CHECK_S) + len(bound.tails())

