r"""Logarithmic tails of a bound outside its grid, fitted to the 50-digit oracle, and the tails' error.

Left of :math:`L = 2^{-120}` a generator growing like :math:`u\log u` keeps :math:`\log r` moving like
:math:`1/\log(1/L)`: the grid then starts at :data:`~bandcore.tables.tabulated.L_MIN_LOG` and
:math:`\log r = C/(\beta - \log L)` continues it.  Right of :math:`L = 680` an upper bound with
:math:`y = \log r \sim L - \log L` follows :math:`y + \log(y + \nu) = L + K`; one of a generator growing like
:math:`e^{bu}` has :math:`r \approx (L + \log\delta)/b`, continued by :math:`r = K + \nu L`.  Everywhere else the
kernel keeps the first value on the left and extends the end tangent on the right.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from ..divergences import Divergence
from .tabulated import RIGHT_LINEAR, RIGHT_LOG, TabulatedBound, rel_log_error

__all__ = ["TailError", "left_tail_fit", "right_linear_fit", "right_tail_fit", "tail_error", "tail_modes",
           "with_tails"]  # fmt: skip


class TailError(ValueError):
    """The tails outside the grid miss the target."""


def tail_modes(div, delta, side, target) -> tuple[bool, int]:
    """(logarithmic left tail, right tail mode) that a bound needs, from the 50-digit oracle: on the left
    log r still moves between L = 2^-120 and 5e-324 (log r -> 0 like 1/log(1/L), a generator growing like
    u log u); on the right (upper bounds) log r is not linear in L between 680 and 1000: then r itself is
    (:data:`~bandcore.tables.tabulated.RIGHT_LINEAR`, a generator growing like e^(bu): r ~ (L + log delta)/b)
    or else log r ~ L - log L (:data:`~bandcore.tables.tabulated.RIGHT_LOG`); 0: no right tail mode."""
    from ..oracle import reference_band_log

    index = 1 if side == "upper" else 0
    y = reference_band_log(div, -np.array([2.0**-120, 5e-324, 680.0, 840.0, 1000.0]), delta)[index]
    with np.errstate(all="ignore"):
        left = bool(np.isfinite(y[0]) and abs(y[0] - y[1]) > target / 4)
        right = bool(side == "upper" and np.all(np.isfinite(y[2:]))
                     and abs(y[2] - 2 * y[3] + y[4]) > target / 4 * abs(y[4]))  # fmt: skip
        # r = e^y only where it is a float (y < 700): an r that grows like e^L is not linear in L
        r = np.exp(np.minimum(y[2:], 700.0))
        linear = bool(right and np.all(y[2:] < 700.0) and abs(r[0] - 2 * r[1] + r[2]) <= target / 4 * r[2])
    return left, (RIGHT_LINEAR if linear else RIGHT_LOG) if right else 0


def left_tail_fit(div, delta, index, a: float, y_a: float) -> tuple[float, float]:
    """(C, beta) with log r = C/(beta - log L) through (a, y_a) and the oracle at L = 5e-324."""
    from ..oracle import reference_band_log

    tiny = 5e-324
    y_s = float(reference_band_log(div, -np.array([tiny]), delta)[index][0])
    ell_a, ell_s = -math.log(a), -math.log(tiny)
    beta = (y_s * ell_s - y_a * ell_a) / (y_a - y_s)
    return y_a * (ell_a + beta), beta



def with_tails(bound: TabulatedBound, div, delta, index, left_log: bool, right_mode: int) -> TabulatedBound:
    """``bound`` with its tail modes (:func:`tail_modes`), fitted here."""
    if left_log:
        y_a = float(bound.log(np.array([bound.knots[0]]))[0])
        bound = replace(bound, left_tail=left_tail_fit(div, delta, index, float(bound.knots[0]), y_a))
    b, y_b = float(bound.knots[-1]), float(bound.values[-1])
    if right_mode == RIGHT_LINEAR:
        bound = replace(bound, right_tail=right_linear_fit(div, delta, b, y_b), right_linear=True)
    elif right_mode:
        bound = replace(bound, right_tail=right_tail_fit(div, delta, b, y_b))
    return bound


def right_linear_fit(div, delta, b: float, y_b: float) -> tuple[float, float]:
    """(K, nu) with r = K + nu L through (b, e^y_b) and the oracle at L = 2000 (:func:`tail_modes` chose this
    mode only where r < e^700 at L = 1000)."""
    from ..oracle import reference_band_log

    L_s = 2e3
    y_s = float(reference_band_log(div, -np.array([L_s]), delta)[1][0])
    if not (y_b < 700.0 and y_s < 700.0):
        raise TailError(f"{div.name} upper bound at delta={delta}: r is not linear in L beyond L = {b:g}")
    r_b, r_s = math.exp(y_b), math.exp(y_s)
    nu = (r_s - r_b) / (L_s - b)
    return r_b - nu * b, nu


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
