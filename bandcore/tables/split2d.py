r"""Saturating bounds over :math:`(p, \delta)`: δ-pieces, each split at the moving threshold :math:`L^*(\delta)`.

**Saturating divergences** (:math:`\tilde f(0) < \infty`: tv, Hellinger, js, ...).  A bound saturates beyond a
threshold :math:`L^*(\delta)` that moves with :math:`\delta`, so no grid fixed in :math:`L` can follow it.  Each
saturating bound is stored as a split bound (:mod:`bandcore.tables.threshold`, kinds 4 and 5) whose coordinates
pin the kink: a *near* part in :math:`\lambda = |L - L^*(\delta)|`, where the kink sits at :math:`\lambda = 0`
for every :math:`\delta`, and a *far* part in :math:`L` that stays a fixed fraction of :math:`L^*` away from it,

.. math::  \text{lower: far } L \in [2^{-120}, m],\ m = 0.6 L^*_{min};\qquad
           \text{upper: far } L \in [m, 680],\ m = 2L^*_{max},

with :math:`L^*_{min}, L^*_{max}` the extreme thresholds over the :math:`\delta` it covers; the near grid (octave
cells of :math:`\lambda`) runs from :data:`NEAR_OCTAVES_BELOW` octaves below the float64 spacing of
:math:`L^*_{min}` up to :math:`L^*_{max} - m` (lower) or :math:`m - L^*_{min}` (upper).  At fixed :math:`\lambda`
or :math:`L` every stored value is then analytic in :math:`\log\delta`.  A lower bound is unsaturated on
:math:`0 < L < L^*`, so its near grid must stay inside :math:`L > 0`:
:math:`L^*_{max} - m < L^*_{min}`.  Its :math:`\delta` range is therefore cut into pieces in :math:`u` whose
thresholds stay within a ratio :data:`PIECE_RATIO` = 1.5 (then :math:`L \ge 0.1 L^*_{min}` on the near grid),
each with its own grids and Chebyshev series in the piece's variable :math:`v \in [-1, 1]`; an upper bound has
no such limit and takes one piece.  :meth:`BandTable2D.at` recomputes :math:`L^*(\delta)` for the requested
:math:`\delta` (50-digit bisection to a double-double, :func:`exact_threshold`, cached), and the kernel forms
:math:`\lambda` from it, so the float next to :math:`L^*` reads the near part at its exact distance.  Values and
check points within :math:`2^{-24}L^*` of the threshold come from the 50-digit solve, as for 1-D split
tables.  The exponent :math:`\gamma` of :math:`G = \log u - \gamma\log\lambda` is measured once, at the
middle :math:`\delta`.  A bound that needs logarithmic tail modes (reverse KL, :math:`(u-1)\log u`; split or
not) gets them as a 1-D table does, fitted to the 50-digit oracle at each requested :math:`\delta`
(:func:`tailed`).

Refinement and certificate: :mod:`bandcore.tables.grid2d`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import mpmath as mp
import numpy as np

from ..divergences import Divergence
from .chebyshev import THRESHOLD, Surface, coefficients, lobatto, tailed
from .evaluate import octave_grid, octave_of
from .limits import L_RANGE, MAX_KNOTS, MAX_KNOTS_2D, MAX_NODES, MAX_PIECES
from .near import exact_bound_log, near_samples
from .pieces import pieces, saturation_threshold
from .tabulated import (
    CHECK_S,
    L_MIN_LOG,
    LOG_R,
    RATIO,
    TargetNotReached,
    cell_octaves,
    grid_size,
    n_octaves,
    rel_log_error,
    stored,
)  # fmt: skip
from .tails import tail_error, tail_modes
from .threshold import SPLIT_LOWER, SPLIT_UPPER, NearPart, SplitBound, gamma_of, threshold_dd

__all__ = ["SplitSurface", "build_split_side", "exact_threshold", "piece_of"]

#: a lower bound's far part ends at SPLIT_FRACTION L*_min, and its δ-pieces each span thresholds within
#: PIECE_RATIO, so its near grid (up to L*_max - SPLIT_FRACTION L*_min) stays in L >= 0.1 L*_min for every δ
SPLIT_FRACTION, PIECE_RATIO = 0.6, 1.5
#: a split bound's near grid starts this many octaves below the float64 spacing of its smallest threshold
NEAR_OCTAVES_BELOW = 30


@lru_cache(maxsize=256)
def exact_threshold(div: Divergence, delta: float, side: str) -> tuple[mp.mpf, float, float]:
    r"""(L*, b, L* - b) of ``side`` at ``delta``: the threshold to ~40 digits, the saturated float64 ``b``
    next to it (:func:`~bandcore.tables.pieces.saturation_threshold`) and the double-double remainder
    (:func:`~bandcore.tables.threshold.threshold_dd`)."""
    b = saturation_threshold(div, delta, side, L_RANGE)
    if not isinstance(b, float):
        what = "on all of" if b == "all" else "nowhere in"
        raise ValueError(f"the {side} bound of {div.name} at delta={delta:g} saturates {what} L in {list(L_RANGE)}")
    star, lo, _ = threshold_dd(div, delta, side, b)
    return star, b, lo


@dataclass(frozen=True)
class SplitSurface:
    r"""A saturating bound over one δ-piece :math:`u \in` ``u_range``: a far part in L and a near part in
    :math:`\lambda = |L - L^*(\delta)|` (both :class:`Surface` in the piece's own Chebyshev variable
    :math:`v \in [-1, 1]`), the split kind (4 lower, 5 upper) and the exponent γ of :math:`G`."""

    far: Surface
    near: Surface
    kind: int
    gamma: float
    u_range: tuple[float, float]

    def local(self, u: float) -> float:
        """The piece's Chebyshev variable v of the table's u."""
        u0, u1 = self.u_range
        return (2 * u - u0 - u1) / (u1 - u0)

    def bound(self, v: float, b: float, lo: float) -> SplitBound:
        """The 1-D split bound at local ``v`` with threshold ``b + lo`` (that δ's exact threshold)."""
        far, near = self.far.at(v), self.near.at(v)
        return SplitBound(far, NearPart(near.knots, near.values, near.slopes, near.levels), self.kind, b, lo,
                          self.gamma)  # fmt: skip

    @property
    def size(self) -> int:
        return self.far.coef_values.size + self.near.coef_values.size


def piece_of(side: tuple[SplitSurface, ...], u: float) -> SplitSurface:
    return next((s for s in side if u <= s.u_range[1]), side[-1])


def _delta_pieces(div, delta_of, side) -> list[tuple[float, float, float, float]]:
    """(u0, u1, L*_min, L*_max) of every δ-piece: one for an upper bound; for a lower bound (L* decreasing in
    δ) pieces from u = -1 on, each ending at the largest u (to 2^-12, by bisection) whose threshold is still
    within :data:`PIECE_RATIO` of the piece's first."""

    def star(u: float) -> float:
        return exact_threshold(div, delta_of(u), side)[1]

    if side == "upper":
        return [(-1.0, 1.0, min(star(-1.0), star(1.0)), max(star(-1.0), star(1.0)))]

    def too_many() -> ValueError:
        return ValueError(f"{div.name} lower bound: its threshold moves too far over this delta range for "
                          f"{MAX_PIECES} pieces (by {star(-1.0) / star(1.0):.3g}x); build narrower ranges")

    if star(-1.0) > PIECE_RATIO**MAX_PIECES * star(1.0):
        raise too_many()
    out, u0 = [], -1.0
    while u0 < 1.0:
        first, good, bad = star(u0), 1.0, 1.0
        if first > PIECE_RATIO * star(1.0):
            good = u0
            for _ in range(12):
                mid = (good + bad) / 2
                good, bad = (mid, bad) if first <= PIECE_RATIO * star(mid) else (good, mid)
            if good == u0:
                raise ValueError(f"{div.name} lower threshold moves too fast in delta at {delta_of(u0):g}")
        out.append((u0, good, star(good), first))
        u0 = good
        if len(out) == MAX_PIECES and u0 < 1.0:
            raise too_many()
    return out


def _geometry(side: str, star_min: float, star_max: float, left_log: bool) -> tuple[tuple, tuple]:
    r"""(far range in L, near range in λ) of a piece whose thresholds lie in [star_min, star_max].

    Lower (unsaturated for :math:`L < L^*`): far :math:`[2^{-120}, m]`, :math:`m = 0.6 L^*_{min}`, near up to
    :math:`L^*_{max} - m`; upper (unsaturated for :math:`L > L^*`): far :math:`[m, 680]`,
    :math:`m = 2L^*_{max}`, near up to :math:`m - L^*_{min}`.  The near grid starts :data:`NEAR_OCTAVES_BELOW`
    octaves below the spacing of :math:`L^*_{min}`: below every λ the kernel reads next to a threshold
    unless :math:`L^*` lies within :math:`2^{-30}` ulp of a float."""
    lam0 = 2.0 ** (octave_of(float(np.spacing(star_min))) - NEAR_OCTAVES_BELOW)
    if side == "lower":
        m = SPLIT_FRACTION * star_min
        return (L_MIN_LOG if left_log else L_RANGE[0], m), (lam0, float(np.nextafter(star_max - m, math.inf)))
    m = min(2 * star_max, L_RANGE[1] / 2)
    return (m, L_RANGE[1]), (lam0, float(np.nextafter(m - star_min, math.inf)))


class _PieceSampler:
    """Exact data of one δ-piece: thresholds, far values (float64 solver), near values (:func:`near_samples`)
    and the certificate's exact log r (:func:`exact_bound_log`), cached per δ."""

    def __init__(self, div, side, solve, delta_of, stars, gamma):
        self.div, self.side, self.solve, self.delta_of = div, side, solve, delta_of
        self.index = 1 if side == "upper" else 0
        self.stars, self.gamma = stars, gamma
        self.near_cache: dict[float, dict] = {}
        self.exact_cache: dict[float, dict] = {}

    def threshold(self, v: float) -> tuple[float, mp.mpf, float, float]:
        delta = self.delta_of(v)
        star, b, lo = exact_threshold(self.div, delta, self.side)
        if not self.stars[0] <= b <= self.stars[1]:
            raise ValueError(f"{self.div.name} {self.side} threshold {b} at delta={delta:g} leaves the piece's "
                             f"range {list(self.stars)}: not monotone in delta")  # fmt: skip
        return delta, star, b, lo

    def samples(self, far_knots, near_knots, v, far_kind):
        delta, star, b, _ = self.threshold(v)
        y = np.asarray(self.solve(-far_knots, self.div, delta)[self.index], dtype=np.float64)
        fv, fs = stored(far_kind, far_knots, y, pieces(self.div))
        cache = self.near_cache.setdefault(delta, {})
        nv, ns = near_samples(self.div, delta, self.side, star, b, self.gamma, near_knots, self.solve, cache)
        return fv, fs, nv, ns

    def errors(self, piece: SplitSurface, v: float) -> tuple[np.ndarray, np.ndarray, SplitBound, float]:
        """(far cell errors, near cell errors, the bound, δ) at local ``v``."""
        delta, _, b, lo = self.threshold(v)
        bound = piece.bound(v, b, lo)
        xs = bound.far.check_points(CHECK_S).ravel()
        far = np.asarray(self.solve(-xs, self.div, delta)[self.index], dtype=np.float64)
        far_err = rel_log_error(bound.log(xs), far).reshape(len(bound.far.knots) - 1, -1).max(axis=1)
        near_knots = bound.near.knots
        L = bound.to_L((near_knots[:-1, None] + np.diff(near_knots)[:, None] * CHECK_S).ravel())
        # below the spacing of L* many check points round to the same float L: solve each float once
        unique, back = np.unique(L, return_inverse=True)
        exact = exact_bound_log(bound, self.div, delta, self.index, unique, self.solve,
                                self.exact_cache.setdefault(delta, {}))[back]  # fmt: skip
        # λ below that δ's closest float rounds L onto the saturated side, exact by the threshold's definition
        # (the float64 solver's own saturation test may differ there by its rounding)
        saturated = L >= b if self.side == "lower" else L <= b
        exact = np.where(saturated, -math.inf if self.side == "lower" else L, exact)
        near_err = rel_log_error(bound.log(L), exact).reshape(len(near_knots) - 1, -1).max(axis=1)
        return far_err, near_err, bound, delta


def _split_surface(sampler, far_range, near_range, levels, n, kind, target, u_range, tails) -> SplitSurface:
    far_kind = RATIO if kind == SPLIT_LOWER else LOG_R
    far_knots, near_knots = octave_grid(*far_range, levels[0]), octave_grid(*near_range, levels[1])
    rows = [sampler.samples(far_knots, near_knots, float(v), far_kind) for v in lobatto(n)]
    data = [np.array([r[i] for r in rows]) for i in range(4)]
    if not all(np.all(np.isfinite(d)) for d in data):
        raise ValueError(f"{sampler.div.name} {sampler.side} bound: non-finite node data in the 2-D table")
    tau = target * THRESHOLD
    parts = []
    for knots, lev, values, slopes, t in ((far_knots, levels[0], *data[:2], tails),
                                          (near_knots, levels[1], *data[2:], (False, False))):  # fmt: skip
        w = np.maximum(np.diff(knots, prepend=knots[0]), np.diff(knots, append=knots[-1]))
        parts.append(Surface(knots, lev.copy(), coefficients(values, tau), coefficients(slopes, tau / w), far_kind,
                             t))  # fmt: skip
    return SplitSurface(parts[0], parts[1], kind, sampler.gamma, u_range)


def _octave_errors(sampler, piece, vs, levels) -> tuple[np.ndarray, np.ndarray]:
    """Per-octave max error of the far and the near grid over the local δ-points ``vs``."""
    out = (np.zeros(len(levels[0])), np.zeros(len(levels[1])))
    for v in vs:
        errs = sampler.errors(piece, float(v))[:2]
        for acc, err, knots in zip(out, errs, (piece.far.knots, piece.near.knots), strict=True):
            np.maximum.at(acc, cell_octaves(knots), err)
    return out


def _build_split_piece(div, side, target, solve, bar, delta_of, piece_range, gamma, tails):
    """One δ-piece of a saturating bound: octaves of both grids refined where the error at the Chebyshev nodes
    exceeds 40 % of the target, n grown while it exceeds half of it between nodes (as :func:`build_surface`);
    certificate at nodes, a quarter, half and three quarters between them, and the tails plus the two floats
    next to the threshold (50-digit oracle) at each of those δ."""
    u0, u1, star_min, star_max = piece_range
    kind = SPLIT_LOWER if side == "lower" else SPLIT_UPPER

    def local_delta(v):
        return delta_of((u0 + u1) / 2 + v * (u1 - u0) / 2)

    sampler = _PieceSampler(div, side, solve, local_delta, (star_min, star_max), gamma)
    far_range, near_range = _geometry(side, star_min, star_max, tails[0])
    n = 5
    levels = [np.zeros(n_octaves(*far_range), dtype=np.int64), np.zeros(n_octaves(*near_range), dtype=np.int64)]
    while True:
        piece = _split_surface(sampler, far_range, near_range, levels, n, kind, target, (u0, u1), tails)
        theta = np.pi * np.arange(n) / (n - 1)
        node = _octave_errors(sampler, piece, np.cos(theta), levels)
        mid = _octave_errors(sampler, piece, np.cos((theta[:-1] + theta[1:]) / 2), levels)
        worst = max(float(e.max()) for e in (*node, *mid))
        if bar is not None:
            bar.set_postfix_str(f"2-D {side} [{u0:+.2f}, {u1:+.2f}]: {piece.far.knots.size} + "
                                f"{piece.near.knots.size} knots x {n} deltas, max err {worst:.1e}")  # fmt: skip
            bar.update(1)
        refine = [e > target / 2.5 for e in node]
        if any(r.any() for r in refine):
            levels = [lev + r for lev, r in zip(levels, refine, strict=True)]
            size = grid_size(*far_range, levels[0]) + grid_size(*near_range, levels[1])
            if max(lev.max() for lev in levels) > 23 or size * n > MAX_KNOTS * 8:
                raise ValueError(f"{div.name} 2-D {side} bound: target {target:g} not reached")
        elif max(float(e.max()) for e in mid) > target / 2:
            n = 2 * n - 1
            if n > MAX_NODES:
                raise ValueError(f"{div.name} 2-D {side} bound: target {target:g} not reached with {n} deltas")
        else:
            break
    gaps = np.concatenate([theta[:-1] + f * np.diff(theta) for f in (0.25, 0.5, 0.75)])
    worst, checked = 0.0, 0
    for v in np.cos(np.concatenate([theta, gaps])):
        far_err, near_err, bound, delta = sampler.errors(piece, float(v))
        bound = tailed(bound, tails, div, delta, sampler.index)
        worst = max(worst, float(far_err.max()), float(near_err.max()), tail_error(bound, div, delta, sampler.index))
        checked += (far_err.size + near_err.size) * len(CHECK_S) + len(bound.tails())
    return piece, worst, checked


def build_split_side(div, ell_range, side, target, solve, bar):
    """A saturating bound over the δ range: its δ-pieces (:func:`_delta_pieces`), each split at the exact
    threshold; γ is measured once, at the middle δ."""
    lo, hi = ell_range

    def delta_of(u):
        return math.exp((lo + hi) / 2 + u * (hi - lo) / 2)

    middle = delta_of(0.0)
    tails = tail_modes(div, middle, side, target)
    gamma = gamma_of(div, middle, side, exact_threshold(div, middle, side)[0])
    out, worst, checked = [], 0.0, 0
    for piece_range in _delta_pieces(div, delta_of, side):
        piece, err, count = _build_split_piece(div, side, target, solve, bar, delta_of, piece_range, gamma, tails)
        out.append(piece)
        worst, checked = max(worst, err), checked + count
        knots = max(sum(len(p.far.knots) for p in out), sum(len(p.near.knots) for p in out))
        if knots > MAX_KNOTS_2D:
            raise TargetNotReached(f"{div.name} {side} bound: its delta-pieces need more than {MAX_KNOTS_2D} knots "
                                   f"for the target {target:g}; build narrower delta ranges or a larger target")
    return tuple(out), worst, checked

