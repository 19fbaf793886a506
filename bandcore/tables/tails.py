r"""Logarithmic tails of a bound outside its grid, fitted to the 50-digit oracle, and the tails' error.

Left of :math:`L = 2^{-120}` a generator growing like :math:`u\log u` keeps :math:`\log r` moving like
:math:`1/\log(1/L)`: the grid then starts at :data:`~bandcore.tables.tabulated.L_MIN_LOG` and
:math:`\log r = C/(\beta - \log L)` continues it.  Right of :math:`L = 680` an upper bound with
:math:`y = \log r \sim L - \log L` follows :math:`y + \log(y + \nu) = L + K`.  Everywhere else the kernel
keeps the first value on the left and extends the end tangent on the right.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from ..divergences import Divergence
from .tabulated import TabulatedBound, rel_log_error

__all__ = ["TailError", "left_tail_fit", "right_tail_fit", "tail_error", "tail_modes", "with_tails"]


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



def with_tails(bound: TabulatedBound, div, delta, index, left_log: bool, right_log: bool) -> TabulatedBound:
    """``bound`` with its logarithmic tail modes (:func:`tail_modes`); the left one fitted here."""
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



def tail_error(bound: TabulatedBound, div: Divergence, delta: float, index: int) -> float:
    """Max error on the tails outside the grid, against the 50-digit mpmath oracle (the bisection solver
    cannot represent p = 1 - 2^-1074 or p = 1: its x = logit p is infinite)."""
    from ..oracle import reference_band_log

    L = bound.tails()
    if not L.size:
        return 0.0
    exact = reference_band_log(div, -L, delta)[index]
    return float(rel_log_error(bound.log(L), exact).max())
