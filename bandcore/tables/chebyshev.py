r"""One bound over :math:`(p, \delta)` that does not saturate: cubic Hermite in L times a Chebyshev series in log δ.

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

The series are refined as described in :mod:`bandcore.tables.grid2d`; a saturating bound is split at its moving
threshold instead (:mod:`bandcore.tables.split2d`).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from numpy.polynomial import chebyshev

from ..divergences import Divergence
from .evaluate import octave_grid
from .limits import L_RANGE, MAX_KNOTS, MAX_NODES
from .pieces import pieces
from .shape import lower_tail_kind
from .tabulated import CHECK_S, L_MIN_LOG, LOG_R, TabulatedBound, grid_size, n_octaves, rel_log_error, stored
from .tails import tail_error, tail_modes, with_tails
from .threshold import SplitBound

__all__ = ["THRESHOLD", "Surface", "build_surface", "coefficients", "lobatto", "tailed"]

THRESHOLD = 1 / 64  # coefficients below target/64 are stored as zeros


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
    50-digit oracle as for 1-D tables (:func:`~bandcore.tables.tails.with_tails`)."""
    if isinstance(bound, SplitBound):
        return replace(bound, far=tailed(bound.far, tails, div, delta, index))
    return with_tails(bound, div, delta, index, *tails) if any(tails) else bound


def coefficients(samples: np.ndarray, cutoff: np.ndarray) -> np.ndarray:
    """Chebyshev coefficients (n, m) interpolating ``samples`` (n Lobatto nodes, m knots), |c| < cutoff → 0,
    and rounded to a multiple of the power of two below cutoff/16 (low mantissa bits zero: they compress)."""
    n = len(samples)
    coef = np.linalg.solve(chebyshev.chebvander(lobatto(n), n - 1), samples)
    quantum = np.exp2(np.floor(np.log2(cutoff / 16)))
    return np.where(np.abs(coef) < cutoff, 0.0, np.round(coef / quantum) * quantum)


def build_surface(div, ell_range, side, target, solve, bar):
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
        surface = Surface(knots, levels.copy(), coefficients(values, tau), coefficients(slopes, tau / w), kind,
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

