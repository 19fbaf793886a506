r"""The slow, obviously-correct high-precision reference for the Band (mpmath).

For one token with old probability :math:`p` the Band is the set of ratios :math:`r` with

.. math::  g_f(p, r) = p\,\tilde f(r) + (1-p)\,\tilde f(s) \le \delta, \qquad s = \frac{1 - p r}{1 - p},

(:math:`\tilde f` the normalised generator).  :math:`g_f(p,\cdot)` is convex with :math:`g_f(p, 1) = 0`, so the
Band is an interval :math:`[r_{lo}, r_{up}] \ni 1`.  This module finds both ends by a bracketing search in
:math:`y = \log r` (bisection's bracket and stopping rule, Illinois steps inside it) at ``dps`` decimal digits
(default 50), with the saturated ends decided exactly: :math:`r_{up} = 1/p` iff
:math:`g_f(p, 1/p) \le \delta`, :math:`r_{lo} = 0` iff :math:`g_f(p, 0) \le \delta`.

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


#: the magnitude a halving takes for an end at 0 (below every float64, so no float root is skipped)
_TINY = mp.mpf(2) ** -1100


def _far_apart(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` share a sign and differ more than twofold (an end at 0 counts as :data:`_TINY`)."""
    small, large = sorted((abs(a), abs(b)))
    return a * b >= 0 and large > 2 * max(small, _TINY)


def _middle(a: Any, b: Any) -> Any:
    """A point halfway between ``a`` and ``b``: in magnitude (their geometric mean) when they are
    :func:`_far_apart`, else their arithmetic mean."""
    if _far_apart(a, b):
        sign = 1 if (a if a != 0 else b) > 0 else -1
        return sign * mp.sqrt(max(abs(a), _TINY) * max(abs(b), _TINY))
    return (a + b) / 2


def _bracketed_root(h: Callable[[Any], Any], inside: Any, outside: Any, rel_tol: Any) -> Any:
    """The root of a monotone ``h`` between ``inside`` (h <= 0) and ``outside`` (h > 0), as the midpoint of a
    bracket narrower than ``rel_tol`` (relative): bisection's result and stopping rule, in fewer evaluations.

    Each step is a regula-falsi step with the Illinois rule (the value kept at an end that held twice in a row
    is halved, so both ends move), kept a quarter of the stopping width away from either end (so a step next to
    the root crosses it and closes the bracket), or a halving (:func:`_middle`) when a secant has no finite
    ends or the bracket has not halved over three steps.  A secant held off an end (values orders of magnitude
    apart) starts halvings in magnitude until the ends are within a factor 2.  Every step keeps a sign change,
    so the result is as certain as bisection's."""
    h_in, h_out, kept, widths, in_magnitude = h(inside), h(outside), 0, [], False
    for _ in range(5000):
        width = abs(outside - inside)
        tol = rel_tol * max(abs(inside), abs(outside))
        if width <= tol:
            break
        widths.append(width)
        in_magnitude = in_magnitude and _far_apart(inside, outside)
        if in_magnitude or (len(widths) > 3 and width > widths[-4] / 2) or not mp.isfinite(h_in * h_out):
            point = _middle(inside, outside)
        else:
            q, t = tol / (4 * width), h_in / (h_in - h_out)  # h_in <= 0 < h_out: the secant's fraction in [0, 1)
            in_magnitude = not q < t < 1 - q
            point = inside + min(max(t, q), 1 - q) * (outside - inside)
        value = h(point)
        if value <= 0:
            inside, h_in = point, value
            h_out, kept = (h_out / 2 if kept == -1 else h_out), -1
        else:
            outside, h_out = point, value
            h_in, kept = (h_in / 2 if kept == 1 else h_in), 1
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
            upper = _bracketed_root(h, mp.mpf(0), y_max, rel_tol)
        if h(mp.ninf) <= 0:
            lower = mp.ninf
        elif log_p == 0 and mp_generator(div).slope_at_infinity == mp.inf:
            lower = mp.mpf(0)  # p = 1 and f̃ superlinear: any mass moved off the token costs infinitely much
        else:
            inside, outside = mp.mpf(0), mp.mpf(-1)
            while h(outside) <= 0:  # the root lies below: square the magnitude (-1, -2, -8, -128, ...)
                inside, outside = outside, 2 * outside * abs(outside)
            lower = _bracketed_root(h, inside, outside, rel_tol)
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
