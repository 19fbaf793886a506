r"""KL (:func:`kl_bounds`, f = −log u): Halley in the logit from an outer start.

:math:`G(d) = \mathrm{kl}(p, q) = p\varphi(x) + (1-p)\varphi(y)`, :math:`\varphi(x) = x - \log(1+x)`,
:math:`G' = q - p`, :math:`G'' = q(1-q)`.  :math:`G` is convex, so Halley/Newton from an outer start (the
smallest of :math:`q - p \le \sqrt{\delta/2}`, :math:`\sqrt{2p\delta} + \delta`, :math:`\sqrt{2(1-p)\delta}` and
:math:`\log(1-q) \ge \log(1-p) + (p\log p - \delta)/(1-p)`) decreases monotonically to the root: ``KL_STEPS`` = 4
steps reach the oracle to within 1e-14 over log p ∈ [-1e4, 0), δ ∈ [1e-8, 10] (docs/math.md §7 says where that is
tested).  KL never saturates.
"""

from __future__ import annotations

from ..ops import numpy_ops as xp  # rebound per backend by ..sources
from .common import CONVERGED, LOG_P_TINY, SATURATED, _regular, finish, finish_ratio

#: Fixed number of Halley steps of the KL solver.
KL_STEPS = 4
#: Taylor coefficients of phi(x) = x - log(1+x) = sum_{k>=2} (-1)^k x^k / k, |x| < 0.1 (error 1e-18).
PHI = (0.5, -1 / 3, 0.25, -0.2, 1 / 6, -1 / 7, 0.125, -1 / 9, 0.1, -1 / 11, 1 / 12, -1 / 13, 1 / 14, -1 / 15, 0.0625)


def phi(x, log1p_x):
    """phi(x) = x - log(1+x); Taylor for |x| < 0.1 (no cancellation); ``log1p_x`` an accurate log(1+x)."""
    series = x * 0.0
    for k in range(len(PHI) - 1, -1, -1):
        series = (series + PHI[k]) * x
    return xp.where(xp.abs(x) < 0.1, series * x, x - log1p_x)


def kl_upper_root(lp, lq, delta):
    """(log r, log s) at the upper root of the KL Band of each token (lp, lq); KL never saturates."""
    p = xp.exp(lp)
    pc = xp.exp(lq)
    tiny = lp < LOG_P_TINY
    gap = xp.minimum(xp.minimum(p * 0.0 + (delta / 2) ** 0.5, xp.sqrt(2 * p * delta) + delta), xp.sqrt(2 * pc * delta))
    d = xp.where(gap < pc, xp.log1p(gap / p) - xp.log1p(-gap / pc), xp.inf)
    w = (delta - p * lp) / pc  # -log s >= w
    d = xp.minimum(d, xp.log(-xp.expm1(lq - w)) - lp + w)
    log_r = d * 0.0
    log_s = d * 0.0
    for it in range(KL_STEPS + 1):
        den = p + xp.exp(-d) / -xp.expm1(-d)  # (1 + pE)/E
        b = lp + d
        a = xp.logaddexp(lq, b)  # log(1 + pE)
        far = xp.logical_or(-p / den < -0.5, tiny)  # s from logs (also when p is subnormal)
        log_s = xp.where(far, -a, xp.log1p(-p / den))
        s = xp.where(far, xp.exp(log_s), 1.0 - p / den)
        y = s - 1.0
        log_r = xp.where(tiny, xp.where(b > lq, -lp - xp.log1p(xp.exp(lq - b)), d - a), xp.log1p(pc / den))
        q_minus_p = xp.where(tiny, xp.exp(lp + log_r) - p, p * (pc / den))
        if it == KL_STEPS:
            break
        g_r = xp.where(tiny, q_minus_p - p * log_r, p * phi(pc / den, log_r))  # p phi(x) = (q - p) - p log r
        h = g_r + pc * phi(y, log_s) - delta
        g2 = (p + q_minus_p) * pc * s  # G'' = q (1 - q)
        newton = h / q_minus_p
        curvature = newton * (g2 / q_minus_p)  # h G''/G'^2 without underflowing G'^2
        halley = xp.logical_and(curvature >= 0.0, curvature <= 1.0)
        shift = xp.where(halley, newton / (1.0 - 0.5 * curvature), newton)
        d = xp.where(xp.isfinite(shift), d - shift, d)
    return log_r, log_s


def kl_bounds(lp, delta, lower_at_one, seed):
    """(log r_lo, log r_up, status) of the KL Band (module docstring)."""
    lps, lq = _regular(lp)
    log_r, _ = kl_upper_root(lps, lq, delta)
    _, log_s = kl_upper_root(lq, lps, delta)  # mirror: log r_lo = log s'
    return _kl_finish(lp, lps, lq < LOG_P_TINY, log_r, log_s, delta, lower_at_one)


def _kl_finish(lp, lps, pc_tiny, log_r, log_s, delta, lower_at_one):
    """The conventions of KL's log bounds (log r_up = log r, log r_lo = log s); ``pc_tiny``: 1 - p < e^-700."""
    # log r_lo <= -delta/p: below -DBL_MAX (so -inf, correctly rounded) once log p < log(delta) - log(DBL_MAX)
    log_s = xp.where(lps < xp.log(delta) - 709.782712893384, -xp.inf, log_s)
    # 1 - p < e^-700: r_up = 1/p to the last bit (KL: 1/p - r_up ~ e^{-delta/(1-p)}/p)
    upper = xp.where(pc_tiny, -lps, xp.minimum(log_r, -lps))
    status = xp.where(pc_tiny, SATURATED, CONVERGED)
    return finish(lp, log_s, upper, status, lower_at_one)


def _kl_finish_ratio(lp, lps, pc_tiny, one_over_p, r, s, delta, lower_at_one):
    """:func:`_kl_finish` for the ratios r_up = r, r_lo = s (the seeded ratio pass): r_up <= 1/p, r_lo = 0 where
    its logarithm is below -DBL_MAX."""
    s = xp.where(lps < xp.log(delta) - 709.782712893384, 0.0, s)
    upper = xp.where(pc_tiny, one_over_p, xp.minimum(r, one_over_p))
    status = xp.where(pc_tiny, SATURATED, CONVERGED)
    return finish_ratio(lp, s, upper, status, lower_at_one)
