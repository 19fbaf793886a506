r"""What a 2-D table's JAX reader needs beyond the table: the thresholds :math:`L^*(\delta)` and the tails' oracle
points as series in δ, fitted once at 50 digits (host side, mpmath; :mod:`bandcore.tables.jax_grid2d` evaluates
them in JAX).

**Thresholds.** :meth:`BandTable2D.at` finds :math:`L^*(\delta)` by a 50-digit bisection for each δ; a traced δ
cannot call mpmath, so :func:`threshold_series` tabulates it: on every dyadic interval
:math:`[2^k, 2^{k+1}]` that meets the table's range, a Chebyshev series in :math:`t = \delta 2^{1-k} - 3` (an
exact float: a power-of-two scaling and a subtraction Sterbenz makes exact), interpolating the 50-digit roots of
:math:`g_f(e^{-L}, 0) = \delta` (lower) or :math:`g_f(e^{-L}, e^{L}) = \delta` (upper) at Chebyshev points.
:math:`L^*` is analytic in δ but for a logarithmic singularity at δ = 0, a ratio 2 away from each interval: the
coefficients fall by about 5.8 a term, and :data:`THRESHOLD_TERMS` = 48 of them leave :math:`10^{-34}`, checked
on every build (:func:`chebyshev_fit` refuses a series whose last coefficients are not below it).  The
coefficients are stored as double-doubles (pairs of float64, or of float32 for a float32 reader) and summed in
that arithmetic (:mod:`bandcore.tables.jax_dd`), so :math:`L^*` is known to about :math:`10^{-31}` relative — what
λ = |L − L*| needs at the float next to the threshold.

**Tails.** A logarithmic tail is fitted for each δ through the 50-digit oracle at one far point
(:mod:`bandcore.tables.tails`: :math:`L = 5\cdot10^{-324}` on the left, :math:`L = 2000` on the right);
:func:`tail_series` tabulates that oracle value as a Chebyshev series in the table's own
:math:`u = (2\log\delta - \log\delta_{lo} - \log\delta_{hi})/(\log\delta_{hi} - \log\delta_{lo})` to float64
accuracy, and the reader repeats the fit in JAX.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mpmath as mp
import numpy as np

from ..derive.generator_facts.mpmath_g import g_mp
from ..divergences import Divergence

__all__ = ["THRESHOLD_TERMS", "SeriesPieces", "chebyshev_fit", "dd_split", "tail_series", "threshold_series"]

#: Chebyshev terms of the threshold on one dyadic δ interval
THRESHOLD_TERMS = 48
#: decimal digits of the threshold fits
DPS = 60
#: a fitted series is accepted when its last coefficients are below this (relative to its largest)
THRESHOLD_TOLERANCE = mp.mpf(10) ** -33
#: terms and tolerance of a tail's oracle series in u
TAIL_TERMS, TAIL_TOLERANCE = 33, 1e-15


@dataclass(frozen=True)
class SeriesPieces:
    """Chebyshev series on the dyadic δ intervals ``[2^(k0 + i), 2^(k0 + i + 1)]``, coefficients ``coef[i, j]``
    (mpf) of :math:`T_j(t)`, :math:`t = \\delta 2^{1-k} - 3`."""

    k0: int
    coef: tuple

    def arrays(self, dtype) -> tuple[np.ndarray, np.ndarray]:
        """(hi, lo) coefficient arrays in ``dtype``: each coefficient as an unevaluated sum of two floats."""
        return dd_split(self.coef, dtype)


def dd_split(values, dtype) -> tuple[np.ndarray, np.ndarray]:
    """(hi, lo) arrays of ``dtype`` with hi + lo the mpf ``values`` (nested lists) to twice its precision."""
    shape = np.shape(np.array(values, dtype=object))
    flat = np.array(values, dtype=object).ravel()
    hi = np.array([float(v) for v in flat], dtype=dtype)
    lo = np.array([float(v - mp.mpf(float(h))) for v, h in zip(flat, hi, strict=True)], dtype=dtype)
    return hi.reshape(shape), lo.reshape(shape)


def chebyshev_fit(fn, n: int, tolerance) -> list:
    """Coefficients c_j (mpf) of the degree n-1 interpolant of ``fn`` on [-1, 1] at the Chebyshev points
    cos(π(i + 1/2)/n); raises ``ValueError`` unless the last two are below ``tolerance`` × the largest."""
    with mp.workdps(DPS):
        theta = [mp.pi * (i + mp.mpf(1) / 2) / n for i in range(n)]
        values = [fn(mp.cos(t)) for t in theta]
        coef = [2 * mp.fsum(v * mp.cos(j * t) for v, t in zip(values, theta, strict=True)) / n for j in range(n)]
        coef[0] /= 2
        scale = max(abs(c) for c in coef)
        if max(abs(coef[-1]), abs(coef[-2])) > tolerance * scale:
            raise ValueError(f"the series does not converge to {mp.nstr(tolerance, 3)} with {n} terms (last "
                             f"coefficients {mp.nstr(coef[-2], 3)}, {mp.nstr(coef[-1], 3)})")  # fmt: skip
    return coef


def _threshold(div: Divergence, delta, side: str, guess):
    """L* at ``delta`` (mpf) to DPS digits: the root of g_f(e^-L, r) = delta with r = 0 (lower) or 1/p (upper),
    by the secant method from ``guess`` (a bracketing bisection first when no guess is given)."""

    def h(L):
        return g_mp(div, -L, mp.ninf if side == "lower" else L) - delta

    # saturated (h <= 0) for L >= L* (lower) or L <= L* (upper): h increases with L for the upper side
    sign = -1 if side == "lower" else 1
    if guess is None:
        lo, hi = mp.mpf(2) ** -120, mp.mpf(680)
        with mp.workdps(20):
            for _ in range(200):
                mid = mp.sqrt(lo * hi)
                if sign * h(mid) > 0:
                    hi = mid
                else:
                    lo = mid
        guess = mp.sqrt(lo * hi)
    root = mp.findroot(h, (guess, guess * (1 + mp.mpf(10) ** -6)), solver="secant", tol=mp.mpf(10) ** (-2 * DPS + 10))
    step = abs(root) * mp.mpf(10) ** -40
    if not (sign * h(root - step) <= 0 < sign * h(root + step)):
        raise ValueError(f"{div.name} {side} threshold at delta={mp.nstr(delta, 17)}: no sign change at the root")
    return root


def threshold_series(div: Divergence, side: str, delta_range: tuple[float, float]) -> SeriesPieces:
    """:math:`L^*(\\delta)` of ``side`` on every dyadic interval meeting ``delta_range`` (module docstring)."""
    lo, hi = delta_range
    k0 = math.floor(math.log2(lo * (1 - 1e-12)))
    k1 = math.floor(math.log2(hi * (1 + 1e-12)))
    pieces = []
    with mp.workdps(DPS):
        for k in range(k0, k1 + 1):
            guess = None  # each interval starts from a bisection; its nodes (t decreasing) from their neighbour

            def star(t, k=k):
                nonlocal guess
                guess = _threshold(div, (t + 3) * mp.mpf(2) ** (k - 1), side, guess)
                return guess

            pieces.append(tuple(chebyshev_fit(star, THRESHOLD_TERMS, THRESHOLD_TOLERANCE)))
    return SeriesPieces(k0, tuple(pieces))


def tail_series(oracle, delta_range: tuple[float, float]) -> np.ndarray:
    """Chebyshev coefficients (float64) in the table's u of ``oracle(delta)`` (a float: the 50-digit log bound at a
    tail's far point), to :data:`TAIL_TOLERANCE` relative."""
    lo, hi = (math.log(d) for d in delta_range)

    def value(u):
        return mp.mpf(oracle(math.exp((lo + hi) / 2 + float(u) * (hi - lo) / 2)))

    return np.array([float(c) for c in chebyshev_fit(value, TAIL_TERMS, TAIL_TOLERANCE)])
