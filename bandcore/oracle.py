r"""The slow, obviously-correct high-precision reference for the Band (mpmath).

For one token with old probability :math:`p` the Band is the set of ratios :math:`r` with

.. math::  g_f(p, r) = p\,\tilde f(r) + (1-p)\,\tilde f(s) \le \delta, \qquad s = \frac{1 - p r}{1 - p},

(:math:`\tilde f` the normalised generator).  :math:`g_f(p,\cdot)` is convex with :math:`g_f(p, 1) = 0`, so the
Band is an interval :math:`[r_{lo}, r_{up}] \ni 1`.  This module finds both ends by plain bisection in
:math:`y = \log r` at ``dps`` decimal digits (default 50), with the saturated ends decided exactly:
:math:`r_{up} = 1/p` iff :math:`g_f(p, 1/p) \le \delta`, :math:`r_{lo} = 0` iff :math:`g_f(p, 0) \le \delta`.

:math:`g_f` is the one mpmath implementation of :mod:`bandcore.derive.generator_facts.mpmath_g` (re-exported here as
:func:`g_mp`).  At :math:`p = 1` it uses the perspective convention :math:`0\cdot f(x/0) = x \lim_{u\to\infty}
f(u)/u`, which makes every bound continuous as :math:`p \to 1` (e.g. KL: :math:`[e^{-\delta}, 1]`).

Used by the tests, the benchmark and table certification; never on a hot path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mpmath as mp
import numpy as np

from .derive.generator_facts.mpmath_g import g_mp, mp_generator
from .divergences import Divergence, resolve

__all__ = ["band_log_mp", "g_mp", "reference_band_log"]


def _bisect(h: Callable[[Any], Any], inside: Any, outside: Any, rel_tol: Any) -> Any:
    """Bisection on h(y) <= 0 (inside) vs h(y) > 0 (outside) until relative width < rel_tol."""
    for _ in range(5000):
        mid = (inside + outside) / 2
        if h(mid) <= 0:
            inside = mid
        else:
            outside = mid
        if abs(outside - inside) <= rel_tol * max(abs(inside), abs(outside)):
            break
    return (inside + outside) / 2


def band_log_mp(divergence: str | Divergence, log_p: Any, delta: Any, *, dps: int = 50) -> tuple[mp.mpf, mp.mpf]:
    """(log r_lo, log r_up) of the Band at ``log_p`` (<= 0) and ``delta`` (> 0) to about ``dps - 10`` digits.

    ``log_p`` and ``delta`` may be floats, strings or mpf.  A saturated lower bound is ``-inf``; a saturated
    upper bound is exactly ``-log_p``.
    """
    div = resolve(divergence)
    with mp.workdps(dps):
        log_p, delta = mp.mpf(log_p), mp.mpf(delta)
        if log_p > 0 or delta <= 0:
            raise ValueError(f"need log_p <= 0 and delta > 0, got log_p={log_p}, delta={delta}")
        rel_tol = mp.mpf(10) ** (-(dps - 12))

        def h(y):
            return g_mp(div, log_p, y) - delta

        y_max = -log_p
        if h(y_max) <= 0:
            upper = y_max
        else:
            upper = _bisect(h, mp.mpf(0), y_max, rel_tol)
        if h(mp.ninf) <= 0:
            lower = mp.ninf
        elif log_p == 0 and mp_generator(div).slope_at_infinity == mp.inf:
            lower = mp.mpf(0)  # p = 1 and f̃ superlinear: any mass moved off the token costs infinitely much
        else:
            outside = mp.mpf(-1)
            while h(outside) <= 0:  # the root lies below: expand geometrically
                outside *= 2
            inside = outside / 2 if outside < -1 else mp.mpf(0)
            lower = _bisect(h, inside, outside, rel_tol)
        return +lower, +upper


def reference_band_log(
    divergence: str | Divergence, old_log_prob: Any, delta: float, *, dps: int = 50
) -> tuple[np.ndarray, np.ndarray]:
    """Element-wise :func:`band_log_mp` on an array of float64 log-probabilities, rounded once to float64."""
    flat = np.asarray(old_log_prob, dtype=np.float64).ravel()
    lower = np.empty_like(flat)
    upper = np.empty_like(flat)
    for i, x in enumerate(flat):
        lo, up = band_log_mp(divergence, x, delta, dps=dps)
        lower[i], upper[i] = float(lo), float(up)
    shape = np.shape(old_log_prob)
    return lower.reshape(shape), upper.reshape(shape)
