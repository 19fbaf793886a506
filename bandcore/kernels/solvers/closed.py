r"""Closed forms: total variation (:func:`tv_bounds`) and Pearson χ² (:func:`pearson_bounds`).

:math:`r = 1 \pm \delta/p` and :math:`r = 1 \pm \sqrt{\delta(1-p)/p}`, written in logarithms so nothing overflows
for any finite log p, with saturation decided exactly at every float log p: the thresholds' logarithms come as
double-doubles from :mod:`bandcore.kernels.thresholds` in the ``seed`` argument, and the lower bounds next to
them are computed from the exact distance :math:`\log p - \log p^*`.  :func:`tv_ratio_bounds` and
:func:`pearson_ratio_bounds` give the ratios themselves (no logarithm, no exp of a log bound: few
transcendentals per token, and more accurate than ``exp`` of a log bound, whose absolute error
:math:`|\log r|\,\epsilon` becomes a relative one).
"""

from __future__ import annotations

from ..ops import numpy_ops as xp  # rebound per backend by ..sources
from .common import CONVERGED, LOG_P_TINY, SATURATED, finish, finish_ratio


def threshold_logs(seed):
    """(lower_hi, lower_lo, upper_hi, upper_lo): log p* of each side's saturation threshold as a double-double,
    from the closed form's threshold table (:func:`bandcore.kernels.thresholds.threshold_seed`, passed as
    ``seed``)."""
    fm = seed[0]
    return fm[0], fm[1], fm[2], fm[3]


def tv_bounds(lp, delta, lower_at_one, seed):
    """TV, g = p|r - 1|: r = 1 ± delta/p; upper saturates iff p >= 1 - delta, lower iff p <= delta, both decided
    exactly from log p and the thresholds' double-double logarithms (:func:`threshold_logs`).  With
    x = log(delta/p) = (log delta - log p) exact to rounding next to p = delta: log r_lo = log1p(-delta/p) up to
    delta/p = 1/2, beyond log(-expm1(x)).  One exp and two logs per token."""
    lps = xp.minimum(lp, 0.0)
    p = xp.exp(lps)
    ld_hi, ld_lo, lu_hi, lu_lo = threshold_logs(seed)  # log delta, log(1 - delta)
    x = (ld_hi - lps) + ld_lo
    ratio = delta / p
    # log(1 + delta/p); for delta/p > 1 as log(delta/p) + log1p(p/delta) (delta/p overflows for tiny p)
    big = ratio > 1.0
    upper = xp.log1p(xp.where(big, p / delta, ratio)) + xp.where(big, ld_hi - lps, 0.0)
    upper_saturated = (lps - lu_hi) - lu_lo >= 0.0
    upper = xp.where(upper_saturated, -lps, upper)
    lower = log_of_sum(ratio <= 0.5, 1.0, -ratio, -xp.expm1(x), 0.0)  # one log for both
    lower_saturated = x >= 0.0
    lower = xp.where(lower_saturated, -xp.inf, lower)
    status = xp.where(xp.logical_or(upper_saturated, lower_saturated), SATURATED, CONVERGED)
    return finish(lp, lower, upper, status, lower_at_one)


def pearson_bounds(lp, delta, lower_at_one, seed):
    """Pearson, g = p(r-1)^2/(1-p): r = 1 ± t, t = sqrt(delta(1-p)/p) = sqrt(delta expm1(-log p)); saturated iff
    delta p >= 1 - p (upper), delta(1 - p) >= p (lower), decided exactly from log p and the thresholds'
    double-double logarithms (:func:`threshold_logs`).  Where t > 1/2 (:func:`pearson_near_lower`), t and
    1 - t come from y = log p - log(delta/(1 + delta)), exact to rounding next to the threshold
    (:func:`pearson_near`); below log p = -700, where 1 - p = 1, log r_up = log t = (log delta - log p)/2
    to within 1/t < e^-340.  One expm1 (its argument is selected, not the function), one sqrt and two logs per
    token."""
    lps = xp.minimum(lp, 0.0)
    ll_hi, ll_lo, lu_hi, lu_lo = threshold_logs(seed)  # log(delta/(1 + delta)), -log(1 + delta)
    y = (lps - ll_hi) - ll_lo
    near = lps < pearson_near_lower(delta)
    e = xp.expm1(xp.where(near, -0.5 * y, -lps))
    t_squared, one_minus_t_squared = pearson_near(e, delta)
    t = xp.sqrt(xp.where(near, t_squared, delta * e))  # else t^2 = delta (1 - p)/p = delta expm1(-log p)
    log1p_t = xp.log1p(t)
    upper_saturated = (lps - lu_hi) - lu_lo >= 0.0
    tiny = lps < LOG_P_TINY
    upper = xp.where(upper_saturated, -lps, xp.where(tiny, 0.5 * (xp.log(delta) - lps), log1p_t))
    lower = log_of_sum(xp.logical_not(near), 1.0, -t, one_minus_t_squared, -log1p_t)  # one log
    lower_saturated = y <= 0.0
    lower = xp.where(lower_saturated, -xp.inf, lower)
    status = xp.where(xp.logical_or(upper_saturated, lower_saturated), SATURATED, CONVERGED)
    return finish(lp, lower, upper, status, lower_at_one)


def pearson_near_lower(delta):
    """log p below which Pearson's t = sqrt(delta (1 - p)/p) exceeds 1/2: log(delta/(delta + 1/4))."""
    return xp.log(delta / (delta + 0.25))


def pearson_near(e, delta):
    """(t^2, 1 - t^2) of Pearson from e = expm1(-y/2), y = log p - log(delta/(1 + delta)) the distance from the
    lower threshold: t^2 = (1 + delta) e^-y - delta and 1 - t^2 = -(1 + delta) e (2 + e), without cancellation
    as t -> 1 (used where t > 1/2)."""
    return (1.0 + delta) * ((1.0 + e) * (1.0 + e)) - delta, -(1.0 + delta) * (e * (2.0 + e))


def tv_ratio_bounds(lp, delta, lower_at_one, seed):
    """TV's ratios from x = log(delta/p) = (log delta - log p), log delta a double-double (:func:`threshold_logs`),
    so x is exact to rounding next to p = delta (hi - log p is exact there: Sterbenz), where r_lo is small and only
    as good as x: r_up = 1 + delta/p = 2 + expm1(x), or 1/p = e^-log p where saturated (p >= 1 - delta);
    r_lo = 1 - delta/p = -expm1(x), 0 where saturated (x >= 0); both decisions exact.  1/p = e^x/delta where the
    upper bound saturates (``exp_ratio``: no overflow of e^x for delta > 1), from the same reduction and
    polynomial as expm1(x) in the Numba kernel: one transcendental per token; relative error ~|x| ulp, as in the
    unsaturated bounds.  Both overflow exactly where the ratio does."""
    lps = xp.minimum(lp, 0.0)
    ld_hi, ld_lo, lu_hi, lu_lo = threshold_logs(seed)  # log delta, log(1 - delta)
    x = (ld_hi - lps) + ld_lo
    e = xp.expm1(x)
    upper_saturated = (lps - lu_hi) - lu_lo >= 0.0
    upper = xp.where(upper_saturated, xp.exp_ratio(x, delta), 2.0 + e)  # 1/p = e^x/delta
    lower_saturated = x >= 0.0
    lower = xp.where(lower_saturated, 0.0, -e)
    status = xp.where(xp.logical_or(upper_saturated, lower_saturated), SATURATED, CONVERGED)
    return finish_ratio(lp, lower, upper, status, lower_at_one)


def pearson_ratio_bounds(lp, delta, lower_at_one, seed):
    """Pearson's ratios 1 ± t.  Where t <= 1/2, t = sqrt(delta m (m + 2)) with m = expm1(-log p / 2) (so
    (1 - p)/p = e^-log p - 1 = m(m + 2) has no cancellation near p = 1); where t > 1/2, t and
    1 - t = (1 - t^2)/(1 + t) from e = expm1(-y/2), y the exact distance from the lower threshold
    (:func:`pearson_near`); for log p < -700, where m(m + 2) would overflow, t = e^u with
    u = (log delta - log p)/2 (dropping the -1 of e^-log p costs a relative e^-700).  Saturation is decided
    exactly (:func:`threshold_logs`): e^-log p where the upper bound saturates (p >= 1/(1 + delta); exp of the log
    bound -log p, as there), 0 where the lower one does (p <= delta/(1 + delta)).  One expm1 (its argument is
    selected, not the function), one sqrt, and e^-log p."""
    lps = xp.minimum(lp, 0.0)
    ll_hi, ll_lo, lu_hi, lu_lo = threshold_logs(seed)  # log(delta/(1 + delta)), -log(1 + delta)
    y = (lps - ll_hi) - ll_lo
    far = lps < LOG_P_TINY
    near = xp.logical_and(lps < pearson_near_lower(delta), xp.logical_not(far))
    e = xp.expm1(xp.where(far, 0.5 * (xp.log(delta) - lps), xp.where(near, -0.5 * y, -0.5 * lps)))
    t_squared, one_minus_t_squared = pearson_near(e, delta)
    t = xp.where(far, e, xp.sqrt(xp.where(near, t_squared, delta * (e * (e + 2.0)))))
    upper_saturated = (lps - lu_hi) - lu_lo >= 0.0
    upper = xp.where(upper_saturated, xp.exp(-lps), 1.0 + t)
    lower_saturated = y <= 0.0
    lower = xp.where(lower_saturated, 0.0, xp.where(near, one_minus_t_squared / (1.0 + t), 1.0 - t))
    status = xp.where(xp.logical_or(upper_saturated, lower_saturated), SATURATED, CONVERGED)
    return finish_ratio(lp, lower, upper, status, lower_at_one)


def log_of_sum(first, a, b, other, offset):
    """log(a + b) where ``first``, else log(other) + offset, with one log: a + b is rounded to u and its rounding
    error a + b - u (exact when |a| >= |b|) restored to first order as (a - u + b)/u, as in log1p."""
    u = xp.where(first, a + b, other)
    return xp.log(u) + xp.where(first, ((a - u) + b) / u, offset)
