r"""Closed forms: total variation (:func:`tv_bounds`) and Pearson χ² (:func:`pearson_bounds`).

:math:`r = 1 \pm \delta/p` and :math:`r = 1 \pm \sqrt{\delta(1-p)/p}`, written in logarithms so nothing overflows
for any finite log p; :func:`tv_ratio_bounds` and :func:`pearson_ratio_bounds` give the ratios themselves (no
logarithm, no exp of a log bound: two transcendentals per token, and more accurate than ``exp`` of a log bound,
whose absolute error :math:`|\log r|\,\epsilon` becomes a relative one).
"""

from __future__ import annotations

from ..ops import numpy_ops as xp  # rebound per backend by ..sources
from .common import CONVERGED, LOG_P_TINY, SATURATED, finish, finish_ratio


def tv_bounds(lp, delta, lower_at_one, seed):
    """TV, g = p|r - 1|: r = 1 ± delta/p; upper saturates iff p >= 1 - delta, lower iff p <= delta (compared as
    log p with log(1 - delta) and log delta).  One exp and two logs per token."""
    lps = xp.minimum(lp, 0.0)
    p = xp.exp(lps)
    log_delta = xp.log(delta)
    ratio = delta / p
    # log(1 + delta/p); for delta/p > 1 as log(delta/p) + log1p(p/delta) (delta/p overflows for tiny p)
    big = ratio > 1.0
    upper = xp.log1p(xp.where(big, p / delta, ratio)) + xp.where(big, log_delta - lps, 0.0)
    upper_saturated = lps >= (xp.log1p(-delta) if delta < 1.0 else -xp.inf)
    upper = xp.where(upper_saturated, -lps, upper)
    # log(1 - delta/p): log1p(-delta/p) up to delta/p = 1/2, beyond as log(p - delta) - log p (p - delta exact,
    # Sterbenz); one log for both
    small = ratio <= 0.5
    lower = log_of_sum(small, 1.0, -ratio, p - delta, -lps)
    lower_saturated = lps <= log_delta
    lower = xp.where(lower_saturated, -xp.inf, lower)
    status = xp.where(xp.logical_or(upper_saturated, lower_saturated), SATURATED, CONVERGED)
    return finish(lp, lower, upper, status, lower_at_one)


def pearson_bounds(lp, delta, lower_at_one, seed):
    """Pearson, g = p(r-1)^2/(1-p): r = 1 ± t, t = sqrt(delta(1-p)/p); saturated iff delta p >= 1 - p (upper),
    delta(1 - p) >= p (lower).  t itself for p >= e^-700 (at most sqrt(10 e^700): no overflow); below, where
    1 - p = 1 and the lower bound is saturated, log r_up = log t = (log delta - log p)/2 to within 1/t < e^-340.
    One exp, one expm1, one sqrt and two logs per token."""
    lps = xp.minimum(lp, 0.0)
    p = xp.exp(lps)
    pc = -xp.expm1(lps)
    tiny = lps < LOG_P_TINY
    t = xp.sqrt(delta * pc / xp.where(tiny, 1.0, p))
    log1p_t = xp.log1p(t)
    upper_saturated = delta * p >= pc
    upper = xp.where(upper_saturated, -lps, xp.where(tiny, 0.5 * (xp.log(delta) - lps), log1p_t))
    # log(1 - t): log1p(-t) up to t = 1/2; beyond, 1 - t = (p - delta(1-p)) / (p(1 + t)); one log
    lower = log_of_sum(t <= 0.5, 1.0, -t, p - delta * pc, -lps - log1p_t)
    lower_saturated = delta * pc >= p
    lower = xp.where(lower_saturated, -xp.inf, lower)
    status = xp.where(xp.logical_or(upper_saturated, lower_saturated), SATURATED, CONVERGED)
    return finish(lp, lower, upper, status, lower_at_one)


def tv_ratio_bounds(lp, delta, lower_at_one, seed):
    """TV's ratios from x = log(delta/p) = log delta - log p: r_up = 1 + delta/p = 2 + expm1(x), or 1/p = e^-log p
    where saturated (p >= 1 - delta); r_lo = 1 - delta/p = -expm1(x), 0 where saturated (x >= 0).  log delta
    is carried in two parts (hi + lo, lo = (delta - e^hi)/delta), so x is exact to rounding next to p = delta
    (hi - log p is exact there: Sterbenz), where r_lo is small and only as good as x.  1/p = e^x/delta where
    the upper bound saturates (``exp_ratio``: no overflow of e^x for delta > 1), from the same reduction and
    polynomial as expm1(x) in the Numba kernel: one transcendental per token; relative error ~|x| ulp, as in the
    unsaturated bounds.  Both overflow exactly where the ratio does."""
    lps = xp.minimum(lp, 0.0)
    log_delta = xp.log(delta)
    x = (log_delta - lps) + (delta - xp.exp(log_delta)) / delta
    e = xp.expm1(x)
    upper_saturated = lps >= (xp.log1p(-delta) if delta < 1.0 else -xp.inf)
    upper = xp.where(upper_saturated, xp.exp_ratio(x, delta), 2.0 + e)  # 1/p = e^x/delta
    lower_saturated = x >= 0.0
    lower = xp.where(lower_saturated, 0.0, -e)
    status = xp.where(xp.logical_or(upper_saturated, lower_saturated), SATURATED, CONVERGED)
    return finish_ratio(lp, lower, upper, status, lower_at_one)


def pearson_ratio_bounds(lp, delta, lower_at_one, seed):
    """Pearson's ratios 1 ± t, t = sqrt(delta (1 - p)/p) = sqrt(delta m (m + 2)) with m = expm1(-log p / 2) (so
    (1 - p)/p = e^-log p - 1 = m(m + 2) has no cancellation near p = 1); for log p < -700, where m(m + 2) would
    overflow, t = e^u with u = (log delta - log p)/2 (dropping the -1 of e^-log p costs a relative e^-700).  One
    expm1 (its argument is selected, not the function), one sqrt, and e^-log p where the upper bound saturates
    (delta p >= 1 - p, i.e. t <= delta; exp of the log bound -log p, as there); the lower one iff t >= 1."""
    lps = xp.minimum(lp, 0.0)
    far = lps < LOG_P_TINY
    m = xp.expm1(xp.where(far, 0.5 * (xp.log(delta) - lps), -0.5 * lps))
    t = xp.where(far, m, xp.sqrt(delta * (m * (m + 2.0))))
    upper_saturated = t <= delta
    upper = xp.where(upper_saturated, xp.exp(-lps), 1.0 + t)
    lower_saturated = t >= 1.0
    lower = xp.where(lower_saturated, 0.0, 1.0 - t)
    status = xp.where(xp.logical_or(upper_saturated, lower_saturated), SATURATED, CONVERGED)
    return finish_ratio(lp, lower, upper, status, lower_at_one)


def log_of_sum(first, a, b, other, offset):
    """log(a + b) where ``first``, else log(other) + offset, with one log: a + b is rounded to u and its rounding
    error a + b - u (exact when |a| >= |b|) restored to first order as (a - u + b)/u, as in log1p."""
    u = xp.where(first, a + b, other)
    return xp.log(u) + xp.where(first, ((a - u) + b) / u, offset)
