r"""Tables over :math:`(p, \delta)`, so a trainer can anneal :math:`\delta` without rebuilding.

Each bound is a tensor product: cubic Hermite in :math:`L = -\log p` on the octave grid of the 1-D tables
(:mod:`bandcore.tables.evaluate`), times a Chebyshev series in

.. math::  u = \frac{2\log\delta - \log\delta_{lo} - \log\delta_{hi}}{\log\delta_{hi} - \log\delta_{lo}} \in [-1, 1].

At every :math:`L`-knot :math:`L_j` the stored function :math:`F` and its slope :math:`F_L` are sampled at the
:math:`n` Chebyshev–Lobatto points :math:`u_i = \cos(\pi i/(n-1))` (exact solves, slopes by implicit
differentiation) and stored as Chebyshev coefficients,
:math:`F(L_j, u) = \sum_{k<n} a_{kj} T_k(u)`, :math:`F_L(L_j, u) = \sum_{k<n} b_{kj} T_k(u)`.  The bounds are
analytic in :math:`\log\delta`, so the series converge geometrically and :math:`n` stays small; coefficients
below :math:`\tau = \mathrm{target}/64` (for :math:`b_{kj}`: :math:`\tau/w_j`, :math:`w_j` the widest cell at
:math:`L_j`) are stored as exact zeros and the others rounded to a multiple of the power of two below
:math:`\tau/16`, so the compressed file pays neither for the zeros nor for the low mantissa bits.

Evaluating at one :math:`\delta` is exact in two steps: the series at :math:`u(\delta)` gives every knot's value
and slope, i.e. a 1-D table (:meth:`BandTable2D.at`, O(knots)), evaluated by the 1-D kernels.

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

**Building and certificate.** Octaves are refined (as for 1-D tables) where the error at the Chebyshev nodes
exceeds 40 % of the target, and :math:`n` grows (:math:`n \to 2n - 1`, nested nodes) while the error
between nodes exceeds half of it.  The certificate is measured as for 1-D tables (11 points per cell and the
tails) at every node and at :math:`\delta` a quarter, half and three quarters of the way (in angle) between
neighbouring nodes, times 1.25; for a split bound each piece is refined the same way (its far and near octaves
separately), and at each of those :math:`\delta` the tails and the two floats next to :math:`L^*(\delta)` are
also measured, against the 50-digit oracle.  A build whose certificate exceeds the target is refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import mpmath as mp
import numpy as np
from numpy.polynomial import chebyshev

from ..divergences import Divergence, resolve_regions
from .bounds import (
    BUILDER,
    CHECK_S,
    ERROR_MEASURE,
    L_MIN_LOG,
    L_RANGE,
    LOG_NEG_LOG_R,
    LOG_R,
    LOG_R_LOWER,
    RATIO,
    TabulatedBound,
    TargetNotReached,
    bound_from_arrays,
    bound_metadata,
    builder_of,
    cell_octaves,
    certificate,
    check_delta,
    check_near_grid,
    check_target,
    divergence_of,
    exact_bound_log,
    exact_solver,
    grid_size,
    n_octaves,
    near_samples,
    rel_log_error,
    stored,
    tail_error,
    tail_modes,
    with_tails,
)  # fmt: skip
from .evaluate import octave_grid, octave_of
from .formats import TableFileError, write_table
from .limits import MAX_KNOTS, MAX_KNOTS_2D, MAX_NODES, MAX_PIECES
from .pieces import pieces, saturation_threshold
from .shape import lower_tail_kind
from .table import BUILDERS, LOADERS, SPOT_CHECKS, BandTable, check_certificate
from .threshold import SPLIT_LOWER, SPLIT_UPPER, NearPart, SplitBound, gamma_of, threshold_dd

__all__ = ["BandTable2D"]

THRESHOLD = 1 / 64  # coefficients below target/64 are stored as zeros
#: a lower bound's far part ends at SPLIT_FRACTION L*_min, and its δ-pieces each span thresholds within
#: PIECE_RATIO, so its near grid (up to L*_max - SPLIT_FRACTION L*_min) stays in L >= 0.1 L*_min for every δ
SPLIT_FRACTION, PIECE_RATIO = 0.6, 1.5
#: a split bound's near grid starts this many octaves below the float64 spacing of its smallest threshold
NEAR_OCTAVES_BELOW = 30


def lobatto(n: int) -> np.ndarray:
    """The n Chebyshev–Lobatto nodes cos(pi i/(n-1))."""
    return np.cos(np.pi * np.arange(n) / (n - 1))


class Surface:
    """One bound over (L, u): knots, octave levels, and Chebyshev coefficients of shape (n, n_knots)."""

    def __init__(self, knots, levels, coef_values, coef_slopes, kind, tails=(False, False)):
        self.knots, self.levels, self.kind = knots, levels, kind
        self.coef_values, self.coef_slopes = coef_values, coef_slopes
        self.tails = tails  # (logarithmic left tail, logarithmic right tail), fitted at each delta

    def at(self, u: float) -> TabulatedBound:
        """The 1-D bound at ``u`` in [-1, 1]."""
        t = chebyshev.chebvander(np.clip([u], -1.0, 1.0), len(self.coef_values) - 1)[0]
        return TabulatedBound(self.knots, t @ self.coef_values, t @ self.coef_slopes, self.levels, self.kind)


def tailed(bound, tails: tuple[bool, bool], div: Divergence, delta: float, index: int):
    """``bound`` (a 1-D bound at ``delta``) with the logarithmic tail modes ``tails``, fitted at that δ to the
    50-digit oracle as for 1-D tables (:func:`~bandcore.tables.bounds.with_tails`)."""
    if isinstance(bound, SplitBound):
        return replace(bound, far=tailed(bound.far, tails, div, delta, index))
    return with_tails(bound, div, delta, index, *tails) if any(tails) else bound


def _coefficients(samples: np.ndarray, cutoff: np.ndarray) -> np.ndarray:
    """Chebyshev coefficients (n, m) interpolating ``samples`` (n Lobatto nodes, m knots), |c| < cutoff → 0,
    and rounded to a multiple of the power of two below cutoff/16 (low mantissa bits zero: they compress)."""
    n = len(samples)
    coef = np.linalg.solve(chebyshev.chebvander(lobatto(n), n - 1), samples)
    quantum = np.exp2(np.floor(np.log2(cutoff / 16)))
    return np.where(np.abs(coef) < cutoff, 0.0, np.round(coef / quantum) * quantum)


def _build_surface(div, ell_range, side, target, solve, bar):
    parts = pieces(div)
    index = 1 if side == "upper" else 0
    kind = LOG_R if side == "upper" else lower_tail_kind(div, math.exp(sum(ell_range) / 2))
    tails = tail_modes(div, math.exp(sum(ell_range) / 2), side, target)
    a, b = (L_MIN_LOG if tails[0] else L_RANGE[0]), L_RANGE[1]
    lo, hi = ell_range

    def delta_of(u):
        return math.exp((lo + hi) / 2 + u * (hi - lo) / 2)

    def exact(L, u):
        return np.asarray(solve(-L, div, delta_of(u))[index], dtype=np.float64)

    def cell_errors(surface, u):
        bound = surface.at(u)
        xs = bound.check_points(CHECK_S).ravel()
        return rel_log_error(bound.log(xs), exact(xs, u)).reshape(len(bound.knots) - 1, -1).max(axis=1)

    def per_octave(err, knots, n_oct):
        out = np.zeros(n_oct)
        np.maximum.at(out, np.frexp(knots[:-1])[1] - np.frexp(knots[0])[1], err)
        return out

    n, levels = 5, np.zeros(n_octaves(a, b), dtype=np.int64)
    while True:
        knots = octave_grid(a, b, levels)
        rows = [stored(kind, knots, exact(knots, u), parts) for u in lobatto(n)]
        values, slopes = np.array([r[0] for r in rows]), np.array([r[1] for r in rows])
        if not (np.all(np.isfinite(values)) and np.all(np.isfinite(slopes))):
            raise ValueError(f"{div.name} {side} bound: non-finite node data in the 2-D table")
        w = np.maximum(np.diff(knots, prepend=knots[0]), np.diff(knots, append=knots[-1]))
        tau = target * THRESHOLD
        surface = Surface(knots, levels.copy(), _coefficients(values, tau), _coefficients(slopes, tau / w), kind,
                          tails)  # fmt: skip
        theta = np.pi * np.arange(n) / (n - 1)
        node_err = per_octave(np.max([cell_errors(surface, math.cos(t)) for t in theta], axis=0), knots, len(levels))
        mid_err = per_octave(
            np.max([cell_errors(surface, math.cos(t)) for t in (theta[:-1] + theta[1:]) / 2], axis=0),
            knots, len(levels),
        )  # fmt: skip
        if bar is not None:
            worst = max(mid_err.max(), node_err.max())
            bar.set_postfix_str(f"2-D {side}: {len(knots)} knots x {n} deltas, max err {worst:.1e}")
            bar.update(1)
        refine = node_err > target / 2.5
        if refine.any():
            levels = levels + refine
            if levels.max() > 23 or grid_size(a, b, levels) * n > MAX_KNOTS * 8:
                raise ValueError(f"{div.name} 2-D {side} bound: target {target:g} not reached")
        elif mid_err.max() > target / 2:
            n = 2 * n - 1  # nested Lobatto nodes
            if n > MAX_NODES:
                raise ValueError(f"{div.name} 2-D {side} bound: target {target:g} not reached with {n} deltas")
        else:
            break
    # certificate: nodes, and a quarter, half and three quarters between them (in angle); tails at the nodes
    gaps = np.concatenate([theta[:-1] + f * np.diff(theta) for f in (0.25, 0.5, 0.75)])
    us = np.cos(np.concatenate([theta, gaps]))
    worst = max(float(cell_errors(surface, u).max()) for u in us)
    tail = max(tail_error(tailed(surface.at(u), tails, div, delta_of(u), index), div, delta_of(u), index)
               for u in (-1.0, 0.0, 1.0))  # fmt: skip
    checked = len(us) * (len(knots) - 1) * len(CHECK_S) + 3 * len(tailed(surface.at(0.0), tails, div, delta_of(0.0),
                                                                          index).tails())  # fmt: skip
    return surface, max(worst, tail), checked


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


def _piece_of(side: tuple[SplitSurface, ...], u: float) -> SplitSurface:
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
        parts.append(Surface(knots, lev.copy(), _coefficients(values, tau), _coefficients(slopes, tau / w), far_kind,
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
    exceeds 40 % of the target, n grown while it exceeds half of it between nodes (as :func:`_build_surface`);
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


def _build_split_side(div, ell_range, side, target, solve, bar):
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


class BandTable2D:
    r"""The Band over :math:`\delta \in [\delta_{lo}, \delta_{hi}]` and all :math:`p`, for annealing δ.

    ``table(old_log_prob, delta)`` / ``table.log(old_log_prob, delta)`` behave like a :class:`BandTable` at
    that δ; :meth:`at` returns that 1-D table (O(knots), plus for a saturating divergence the exact thresholds
    at that δ: about a second, cached for the last δ).  ``max_rel_error`` is certified over the whole
    rectangle, next to the moving thresholds included.  ``lower``/``upper``: a :class:`Surface`, or for a
    saturating bound a tuple of :class:`SplitSurface` δ-pieces.
    """

    def __init__(self, *, divergence, generator, delta_range, lower, upper, max_rel_error, target, checked_points,
                 builder):  # fmt: skip
        self.divergence_name = divergence
        self.generator = generator
        self.delta_range = (float(delta_range[0]), float(delta_range[1]))
        self.lower, self.upper = lower, upper
        self.max_rel_error = float(max_rel_error)
        self.target = float(target)
        self.checked_points = int(checked_points)
        self.builder = builder
        self._last: tuple[float, BandTable] | None = None

    @classmethod
    def build(cls, divergence: str | Divergence, delta_range: tuple[float, float], *, target: float = 1e-7,
              progress: bool = False) -> BandTable2D:  # fmt: skip
        """Tabulate ``divergence`` (any spelling) over ``delta_range = (lo, hi)`` (0 < lo < hi) with certified
        error ≤ target."""
        div, delta_range = resolve_regions(divergence, delta_range)  # a transform's range is mapped, once
        lo, hi = _check_range(delta_range)
        check_target(target)
        build_side = _build_split_side if math.isfinite(pieces(div).f_at_zero) else _build_surface
        solve = exact_solver()
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(desc=f"2-D table {div.name} delta in [{lo:g}, {hi:g}]", unit="pass")
        try:
            ell_range = (math.log(lo), math.log(hi))
            lower, err_lo, n_lo = build_side(div, ell_range, "lower", target, solve, bar)
            upper, err_up, n_up = build_side(div, ell_range, "upper", target, solve, bar)
        finally:
            if bar is not None:
                bar.close()
        max_rel_error = certificate(max(err_lo, err_up))
        if max_rel_error > target:
            raise ValueError(f"{div.name} 2-D table: certified error {max_rel_error:.2e} above the target {target:g}")
        return cls(divergence=div.name, generator=div.formula, delta_range=(lo, hi), lower=lower, upper=upper,
                   max_rel_error=max_rel_error, target=target, checked_points=n_lo + n_up,
                   builder=BUILDER)  # fmt: skip

    @property
    def divergence(self) -> Divergence:
        return divergence_of(self.divergence_name, self.generator)

    @property
    def n_knots(self) -> int:
        """Total number of stored (knot, δ-coefficient) pairs, both bounds."""
        return sum(_size(s) for s in (self.lower, self.upper))

    def _u(self, delta: float) -> float:
        lo, hi = (math.log(d) for d in self.delta_range)
        return (2 * math.log(delta) - lo - hi) / (hi - lo)

    def at(self, delta: float) -> BandTable:
        """The 1-D table at ``delta`` (within the table's range), exact restriction of the tensor product."""
        delta = check_delta(delta)
        lo, hi = self.delta_range
        if not lo * (1 - 1e-12) <= delta <= hi * (1 + 1e-12):
            raise ValueError(f"delta={delta!r} is outside this table's range [{lo:g}, {hi:g}]")
        if self._last is None or self._last[0] != delta:
            u = self._u(delta)
            lower, upper = (self._bound(s, side, u, delta) for s, side in ((self.lower, "lower"),
                                                                            (self.upper, "upper")))
            table = BandTable(divergence=self.divergence_name, generator=self.generator, delta=delta,
                              lower=lower, upper=upper, max_rel_error=self.max_rel_error,
                              target=self.target, checked_points=self.checked_points,
                              builder=self.builder)  # fmt: skip
            self._last = (delta, table)
        return self._last[1]

    def _bound(self, surface, side: str, u: float, delta: float):
        """One bound at ``u``; a saturating one split at its threshold, computed exactly for ``delta``."""
        index = 1 if side == "upper" else 0
        if isinstance(surface, Surface):
            return tailed(surface.at(u), surface.tails, self.divergence, delta, index)
        piece = _piece_of(surface, u)
        _, b, lo = exact_threshold(self.divergence, delta, side)
        return tailed(piece.bound(piece.local(u), b, lo), piece.far.tails, self.divergence, delta, index)

    def log(self, old_log_prob, delta: float):
        """(log_lower, log_upper) at ``delta``; see :meth:`BandTable.log`."""
        return self.at(delta).log(old_log_prob)

    def __call__(self, old_log_prob, delta: float):
        """(lower, upper) at ``delta``; see :meth:`BandTable.__call__`."""
        return self.at(delta)(old_log_prob)

    def recertify(self, points_per_interval: int = 11, *, seed: int = 0, n_deltas: int = 5) -> float:
        """Max error against the exact solver at ``n_deltas`` random δ in the range (random L points)."""
        rng = np.random.default_rng(seed)
        lo, hi = self.delta_range
        deltas = np.exp(rng.uniform(math.log(lo), math.log(hi), n_deltas))
        return max(self.at(float(d)).recertify(points_per_interval, seed=seed) for d in deltas)

    def spot_check(self, where: Any = "table", *, n: int = SPOT_CHECKS, seed: int = 0) -> None:
        """:meth:`BandTable.spot_check` at two seeded δ of the range (its ends' geometric mean and a random one)."""
        rng = np.random.default_rng(seed)
        lo, hi = self.delta_range
        for delta in (math.sqrt(lo * hi), math.exp(rng.uniform(math.log(lo), math.log(hi)))):
            self.at(delta).spot_check(where, n=n, seed=seed)

    def to_arrays(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays, split = {}, {}
        for side, s in (("lower", self.lower), ("upper", self.upper)):
            tails = s.tails if isinstance(s, Surface) else s[0].far.tails
            if any(tails):
                split[f"{side}_tails"] = list(tails)
            if isinstance(s, Surface):
                arrays.update(_surface_arrays(side, s))
            else:
                arrays.update(_surface_arrays(side, *(p.far for p in s)))
                arrays.update(_surface_arrays(f"{side}_near", *(p.near for p in s)))
                split[f"{side}_pieces"] = [[*p.u_range, len(p.far.coef_values), len(p.far.knots), len(p.near.knots)]
                                           for p in s]  # fmt: skip
                split[f"{side}_gamma"] = s[0].gamma
        middle = self.at(math.sqrt(self.delta_range[0] * self.delta_range[1]))
        grid = bound_metadata(middle.lower, middle.upper)
        if split:
            split["split_and_tails"] = SPLIT_2D_DOC
            grid["lower_saturated_at_or_above_L"] = "L*(delta)" if "lower_pieces" in split else None
            grid["upper_saturated_at_or_below_L"] = "L*(delta)" if "upper_pieces" in split else None
        metadata = {
            "table": "2d",
            "divergence": self.divergence_name,
            "generator": self.generator,
            "delta_range": list(self.delta_range),
            **grid,
            **split,
            "delta_coordinate": "u = (2 log(delta) - log(lo) - log(hi)) / (log(hi) - log(lo))",
            "node_arrays": "coef_values[k, j], coef_slopes[k, j]: Chebyshev T_k(u) coefficients of F and dF/dL at "
            "knot j",
            "coefficient_threshold": self.target * THRESHOLD,
            "error_measure": ERROR_MEASURE,
            "max_rel_error": self.max_rel_error,
            "target": self.target,
            "checked_points": self.checked_points,
            "builder": self.builder,
        }
        return arrays, metadata

    def save(self, path):
        arrays, metadata = self.to_arrays()
        return write_table(path, arrays, metadata)

    @classmethod
    def load(cls, path) -> BandTable2D:
        """:meth:`BandTable.load`, refusing a 1-D file."""
        table = BandTable.load(path)
        if not isinstance(table, cls):
            raise TableFileError(f"{str(path)!r} holds a 1-D table, not a table over delta")
        return table

    @classmethod
    def from_arrays(cls, arrays, meta) -> BandTable2D:
        try:
            surfaces = {}
            for side, kinds in (("lower", (LOG_NEG_LOG_R, LOG_R_LOWER)), ("upper", (LOG_R,))):
                kind = int(meta[f"{side}_kind"])
                if kind in (SPLIT_LOWER, SPLIT_UPPER):
                    surfaces[side] = _split_from_arrays(side, kind, arrays, meta)
                    continue
                if kind not in kinds:
                    raise TableFileError(f"{side} kind {meta[f'{side}_kind']} is not valid for a 2-D table")
                surfaces[side] = _surface_from_arrays(side, arrays[f"{side}_knots"], arrays[f"{side}_levels"],
                                                      arrays[f"{side}_coef_values"], arrays[f"{side}_coef_slopes"],
                                                      meta, kind, _tails_of(side, meta))  # fmt: skip
            table = cls(divergence=meta["divergence"], generator=meta["generator"],
                        delta_range=_check_range(meta["delta_range"]), lower=surfaces["lower"],
                        upper=surfaces["upper"], max_rel_error=meta["max_rel_error"], target=meta["target"],
                        checked_points=meta["checked_points"], builder=builder_of(meta))  # fmt: skip
        except KeyError as err:
            raise TableFileError(f"table lacks the field {err}") from None
        except (TypeError, ValueError) as err:
            if isinstance(err, TableFileError):
                raise
            raise TableFileError(f"invalid metadata: {err}") from None
        check_certificate(table)
        return table

    def __repr__(self) -> str:
        lo, hi = self.delta_range
        return (f"BandTable2D({self.divergence_name!r}, delta=[{lo:g}, {hi:g}], coefficients={self.n_knots}, "
                f"max_rel_error={self.max_rel_error:.2e})")  # fmt: skip


SPLIT_2D_DOC = (
    "kinds 4/5: a saturating bound in delta-pieces; pieces[i] = (u0, u1, n, far knots, near knots): on u in [u0, u1] "
    "the Chebyshev variable is v = (2u - u0 - u1) / (u1 - u0), its far part (knots, levels, coef_*: next far-knots "
    "columns, first n rows) in L stores r (lower) or log r (upper), its near part (near_*) in lambda = |L - L*(delta)| "
    "stores G = log u - gamma log(lambda) (u = r or 1 - p r); L*(delta) is recomputed for each delta (50 digits). "
    "tails (left, right): logarithmic tail modes, fitted at each delta to the 50-digit oracle as in 1-D tables"
)


def _size(surface) -> int:
    return surface.coef_values.size if isinstance(surface, Surface) else sum(p.size for p in surface)


def _surface_arrays(prefix: str, *surfaces: Surface) -> dict[str, np.ndarray]:
    """The arrays of one or more surfaces, concatenated along the knots (coefficients padded with zero rows)."""
    n = max(len(s.coef_values) for s in surfaces)

    def padded(c):
        return np.concatenate([c, np.zeros((n - len(c), c.shape[1]))])

    return {f"{prefix}_knots": np.concatenate([s.knots for s in surfaces]),
            f"{prefix}_levels": np.concatenate([s.levels for s in surfaces]).astype(np.float64),
            f"{prefix}_coef_values": np.concatenate([padded(s.coef_values) for s in surfaces], axis=1),
            f"{prefix}_coef_slopes": np.concatenate([padded(s.coef_slopes) for s in surfaces], axis=1)}  # fmt: skip


def _tails_of(side: str, meta) -> tuple[bool, bool]:
    """A bound's logarithmic tail modes (left, right) from a file's metadata (absent: none)."""
    tails = meta.get(f"{side}_tails", [False, False])
    if not (isinstance(tails, list) and len(tails) == 2 and all(isinstance(t, bool) for t in tails)):
        raise TableFileError(f"{side} tails must be two booleans")
    if tails[1] and side == "lower":
        raise TableFileError("a lower bound has no right tail mode")
    return bool(tails[0]), bool(tails[1])


def _surface_from_arrays(side, knots, levels, cv, cs, meta, kind, tails=(False, False), near=False) -> Surface:
    """One surface read from a file: its grid validated (a near part's in λ), coefficients matching the knots."""
    if cv.ndim != 2 or cv.shape != cs.shape or cv.shape[1] != len(knots) or not 2 <= len(cv) <= MAX_NODES:
        raise TableFileError(f"{side}: coefficient arrays do not match the knots")
    if near:
        return Surface(knots, check_near_grid(side, knots, levels), cv, cs, kind)
    bound = bound_from_arrays(side, knots, cv[0], cs[0], levels, meta, low=L_MIN_LOG if tails[0] else None)
    return Surface(bound.knots, bound.levels, cv, cs, kind, tails)


def _split_from_arrays(side: str, kind: int, arrays, meta) -> tuple[SplitSurface, ...]:
    """The δ-pieces of a saturating bound read from a file (:data:`SPLIT_2D_DOC`)."""
    if kind != (SPLIT_LOWER if side == "lower" else SPLIT_UPPER):
        raise TableFileError(f"{side} kind {kind} is not valid for this bound")
    rows, gamma = meta.get(f"{side}_pieces"), meta.get(f"{side}_gamma")
    if not (isinstance(rows, list) and rows and all(isinstance(r, list) and len(r) == 5 for r in rows)
            and isinstance(gamma, (int, float)) and 0 < gamma < 100):  # fmt: skip
        raise TableFileError(f"{side}: a split 2-D bound needs its pieces (5 numbers each) and gamma")
    far_kind = RATIO if side == "lower" else LOG_R
    far_meta = {f"{side}_kind": far_kind, "lower_saturated_at_or_above_L": None, "upper_saturated_at_or_below_L": None}
    start = {side: [0, 0], f"{side}_near": [0, 0]}  # next knot and next level of each concatenation
    out, u_end = [], -1.0
    for u0, u1, n, *counts in rows:
        if not (u0 == u_end and u0 < u1 <= 1.0):
            raise TableFileError(f"{side}: the delta-pieces do not tile [-1, 1]")
        parts = []
        for prefix, count in zip(start, counts, strict=True):
            k, lev = start[prefix]
            cols = slice(k, k + int(count))
            knots = arrays[f"{prefix}_knots"][cols]
            if len(knots) < 2 or not np.all(knots > 0):
                raise TableFileError(f"{prefix}: a piece needs at least 2 positive knots")
            levels = arrays[f"{prefix}_levels"][lev:lev + n_octaves(knots[0], knots[-1])]
            cv, cs = arrays[f"{prefix}_coef_values"][: int(n), cols], arrays[f"{prefix}_coef_slopes"][: int(n), cols]
            tails = _tails_of(side, meta) if prefix == side else (False, False)
            parts.append(_surface_from_arrays(side, knots, levels, cv, cs, far_meta, far_kind, tails, prefix != side))
            start[prefix] = [k + int(count), lev + len(levels)]
        out.append(SplitSurface(parts[0], parts[1], kind, float(gamma), (float(u0), float(u1))))
        u_end = u1
    if u_end != 1.0 or any([len(arrays[f"{p}_knots"]), len(arrays[f"{p}_levels"])] != start[p] for p in start):
        raise TableFileError(f"{side}: the delta-pieces do not cover the stored arrays")
    return tuple(out)

def _check_range(delta_range) -> tuple[float, float]:
    if not isinstance(delta_range, (tuple, list)) or len(delta_range) != 2:
        raise ValueError(f"delta range must be (lo, hi), got {delta_range!r}")
    lo, hi = (check_delta(d) for d in delta_range)
    if not lo < hi:
        raise ValueError(f"delta range must have lo < hi, got {delta_range!r}")
    return lo, hi


LOADERS["2d"] = BandTable2D.from_arrays
BUILDERS["2d"] = BandTable2D.build
