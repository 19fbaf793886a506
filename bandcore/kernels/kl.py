r"""The KL Band (f = -log u, KL(π_old‖π)) solved by a fixed number of Halley steps from an outer bound.

MATH.md §5.  In the offset :math:`d = \theta - \theta_p` of the new logit from the old one, with
:math:`E = e^d - 1`, :math:`x = r - 1 = (1-p)E/(1+pE)`, :math:`y = s - 1 = -pE/(1+pE)`:

.. math::
    G(d) = \mathrm{kl}(p, q) = p\,\varphi(x) + (1-p)\,\varphi(y), \quad \varphi(x) = x - \log(1+x), \qquad
    G'(d) = q - p = p x, \qquad G''(d) = q(1-q).

:math:`G` is convex, so Newton from a point outside the root (:math:`G > \delta`) decreases monotonically to
it; Halley's step :math:`2hG'/(2G'^2 - hG'')`, :math:`h = G - \delta`, converges cubically and is taken while
:math:`hG'' \le G'^2` (else the Newton step).  The start is the smallest of the outer bounds of MATH.md §5,
mapped to :math:`d` without cancellation: :math:`q - p \le \min(\sqrt{\delta/2}, \sqrt{2p\delta} + \delta,
\sqrt{2(1-p)\delta})` gives :math:`d = \log(1 + \Delta/p) - \log(1 - \Delta/(1-p))`, and
:math:`\log(1-q) \ge \log(1-p) + (p\log p - \delta)/(1-p)` gives
:math:`d = \log q - \log p + (\delta - p\log p)/(1-p)`.  :data:`STEPS` iterations reach the oracle to
4e-14 relative over log p ∈ [-700, 0), δ ∈ [1e-8, 10] (tested).  :math:`\varphi` uses its Taylor series
for :math:`|x| < 0.1` (no cancellation) and :math:`\log(1+y) = \log s = -\log(1 + pE)` from a logaddexp when
:math:`s < 1/2` (exact when :math:`s` underflows: :math:`\log r_{lo} \approx -10^{302}` at :math:`\log p = -700`).

The lower root is the upper root of the mirrored token (swap :math:`\log p` and :math:`\log(1-p)`); KL never
saturates.  The same arithmetic is written three times: NumPy (:func:`band_log_numpy`), Numba (generated
module, :func:`band_log_numba`) and torch (:func:`band_log_torch`, float64, sync-free).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from ..divergences import Divergence, get_divergence

__all__ = ["STEPS", "band_log_numba", "band_log_numpy", "band_log_torch", "is_kl"]

#: Fixed number of Halley steps per root (2 steps leave 5e-12, 3 leave 4e-14 against the oracle).
STEPS = 3
#: Below this log p the solver's p is (near-)subnormal: r and q are built from logarithms.
LOG_P_TINY = -700.0
#: Taylor coefficients of phi(x) = x - log(1+x) = sum_{k>=2} (-1)^k x^k / k, |x| < 0.1: 16 terms (error 1e-18).
_PHI = tuple((-1) ** k / k for k in range(2, 18))


@lru_cache(maxsize=128)
def is_kl(divergence: str | Divergence) -> bool:
    """True for KL(π_old‖π) under any name (its normalised generator is u - 1 - log u)."""
    div = get_divergence(divergence)
    return div.f_normalised == get_divergence("kl").f_normalised


# ------------------------------------------------------------------------------------------------------------
# NumPy
# ------------------------------------------------------------------------------------------------------------


def _phi_np(x, log1p_x):
    """phi(x) = x - log(1+x), Taylor for |x| < 0.1; ``log1p_x`` is an accurate log(1+x)."""
    series = np.zeros_like(x)
    for c in reversed(_PHI):
        series = (series + c) * x
    return np.where(np.abs(x) < 0.1, series * x, x - log1p_x)


def _start_np(lp, lq, p, pc, delta):
    gap = np.minimum(np.minimum(np.sqrt(delta / 2), np.sqrt(2 * p * delta) + delta), np.sqrt(2 * pc * delta))
    d_gap = np.where(gap < pc, np.log1p(gap / p) - np.log1p(-gap / pc), np.inf)
    w = (delta - p * lp) / pc  # -log s >= w
    d_tail = np.log(-np.expm1(lq - w)) - lp + w  # log q - log p - log s, with 1 - q = (1-p) e^{-w}
    return np.minimum(d_gap, d_tail)


def _g_np(lp, lq, p, pc, d):
    """(G, G', G'', log r, log s) at offset d."""
    den = p + np.exp(-d) / -np.expm1(-d)  # (1 + pE)/E
    x = pc / den  # r - 1
    y = -p / den  # s - 1
    b = lp + d
    a = np.logaddexp(lq, b)  # log(1 + pE)
    tiny = lp < LOG_P_TINY
    y = np.where(tiny, np.expm1(-a), y)  # p subnormal: s from logs
    log_s = np.where(tiny | (y < -0.5), -a, np.log1p(y))
    log_r = np.where(tiny, np.where(b > lq, -lp - np.log1p(np.exp(lq - b)), d - a), np.log1p(x))
    q_minus_p = np.where(tiny, np.exp(lp + log_r) - p, p * x)
    g_r = np.where(tiny, q_minus_p - p * log_r, p * _phi_np(x, log_r))  # p phi(x) = (q - p) - p log r
    g = g_r + pc * _phi_np(np.where(y < -0.5, -1.0 + np.exp(log_s), y), log_s)
    q = p + q_minus_p
    one_minus_q = pc * np.where(y < -0.5, np.exp(log_s), 1.0 + y)  # 1 - q = (1-p) s
    return g, q_minus_p, q * one_minus_q, log_r, log_s


def _solve_np(lp, lq, delta, steps=STEPS):
    p, pc = np.exp(lp), np.exp(lq)
    d = _start_np(lp, lq, p, pc, delta)
    for _ in range(steps):
        g, g1, g2, _, _ = _g_np(lp, lq, p, pc, d)
        h = g - delta
        newton = h / g1
        curvature = newton * (g2 / g1)  # h G''/G'^2 without underflowing G'^2
        step = np.where((curvature >= 0) & (curvature <= 1.0), newton / (1.0 - 0.5 * curvature), newton)
        d = np.where(np.isfinite(step), d - step, d)
    return d, _g_np(lp, lq, p, pc, d)


def band_log_numpy(old_log_prob: np.ndarray, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """(log r_lo, log r_up) of the KL Band for a float64 array (kernel conventions of numpy_backend)."""
    lp_all = np.asarray(old_log_prob, dtype=np.float64)
    lower = np.full(lp_all.shape, np.nan)
    upper = np.full(lp_all.shape, np.nan)
    regular = (lp_all < 0) & (lp_all > -np.inf)
    with np.errstate(all="ignore"):
        lp = lp_all[regular]
        lq = np.log(-np.expm1(lp))  # log(1-p), exact near p = 1
        n = lp.size
        _, (_, _, _, log_r, log_s) = _solve_np(np.concatenate([lp, lq]), np.concatenate([lq, lp]), delta)
        # 1 - p < e^-700: r_up = 1/p to the last bit (KL: 1/p - r_up ~ e^{-delta/(1-p)}/p)
        upper[regular] = np.where(lq < LOG_P_TINY, -lp, np.minimum(log_r[:n], -lp))
        lower[regular] = log_s[n:]  # mirror: log r_lo = log s'
    lower[lp_all == 0] = -delta  # p = 1: r_lo = e^{-delta}
    upper[lp_all == 0] = 0.0
    lower[lp_all == -np.inf] = -np.inf
    upper[lp_all == -np.inf] = np.inf
    return lower, upper


# ------------------------------------------------------------------------------------------------------------
# Numba (source compiled through numba_backend's generated-module cache)
# ------------------------------------------------------------------------------------------------------------

NUMBA_SOURCE = f'''"""Generated by bandcore.kernels.kl: the KL Band kernel; do not edit."""
import math

from numba import njit, prange

FASTMATH = {{"nsz", "arcp", "contract"}}
STEPS = {STEPS}
LOG_P_TINY = {LOG_P_TINY!r}
PHI = {_PHI!r}


@njit(cache=True, fastmath=FASTMATH, error_model="numpy", inline="always")
def phi(x, log1p_x):
    """x - log(1+x); Taylor for |x| < 0.1."""
    if abs(x) < 0.1:
        series = 0.0
        for k in range(len(PHI) - 1, -1, -1):
            series = (series + PHI[k]) * x
        return series * x
    return x - log1p_x


@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def solve(lp, lq, delta):
    """(log r, log s) at the upper root of the token (lp, lq)."""
    p = math.exp(lp)
    pc = math.exp(lq)
    # outer start (MATH.md 5)
    gap = min(min(math.sqrt(delta / 2), math.sqrt(2 * p * delta) + delta), math.sqrt(2 * pc * delta))
    d = math.inf
    if gap < pc:
        d = math.log1p(gap / p) - math.log1p(-gap / pc)
    w = (delta - p * lp) / pc  # -log s >= w
    d = min(d, math.log(-math.expm1(lq - w)) - lp + w)
    log_r = 0.0
    log_s = 0.0
    for it in range(STEPS + 1):
        den = p + math.exp(-d) / -math.expm1(-d)  # (1 + pE)/E
        x = pc / den  # r - 1
        y = -p / den  # s - 1
        b = lp + d
        a = max(lq, b) + math.log1p(math.exp(-abs(lq - b)))  # log(1 + pE)
        if y < -0.5 or lp < LOG_P_TINY:  # s from logs (also when p is subnormal)
            log_s = -a
            s = math.exp(log_s)
            y = s - 1.0
        else:
            log_s = math.log1p(y)
            s = 1.0 + y
        if lp < LOG_P_TINY:
            if b > lq:
                log_r = -lp - math.log1p(math.exp(lq - b))
            else:
                log_r = d - a
            q_minus_p = math.exp(lp + log_r) - p
            g_r = q_minus_p - p * log_r
        else:
            log_r = math.log1p(x)
            q_minus_p = p * x
            g_r = p * phi(x, log_r)
        if it == STEPS:
            break
        h = g_r + pc * phi(y, log_s) - delta
        g1 = q_minus_p
        g2 = (p + q_minus_p) * pc * s  # q (1 - q)
        newton = h / g1
        curvature = newton * (g2 / g1)  # h G''/G'^2 without underflowing G'^2
        if curvature >= 0 and curvature <= 1.0:
            step = newton / (1.0 - 0.5 * curvature)  # Halley
        else:
            step = newton
        if math.isfinite(step):
            d -= step
    return log_r, log_s


@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def polish(lp, p, pc, log_w, delta):
    """(log r, log s) at the root from a start given as log w, w = 1/E = 1/(e^d - 1), within ~1e-6 of it.

    One Halley correction in d, applied to log r and log s through their Taylor expansions in d
    (d log r/dd = 1-q, d log s/dd = -q, both second derivatives -q(1-q)): the cells are evaluated once,
    with three transcendental calls (exp, log1p, log1p).
    """
    w = math.exp(log_w)
    den = p + w  # (1 + pE)/E
    x = pc / den  # r - 1
    y = -p / den  # s - 1
    log_r = math.log1p(x)
    if y >= -0.5:
        log_s = math.log1p(y)
        s = 1.0 + y
    else:
        z = lp - log_w  # log(pE)
        log_s = -(z + math.log1p(math.exp(-z)))  # -log(1 + pE)
        s = math.exp(log_s)
        y = s - 1.0
    q_minus_p = p * x
    h = p * phi(x, log_r) + pc * phi(y, log_s) - delta
    one_minus_q = pc * s
    q = 1.0 - one_minus_q
    g2 = q * one_minus_q  # G''
    newton = h / q_minus_p
    curvature = newton * (g2 / q_minus_p)  # h G''/G'^2 without underflowing G'^2
    if curvature >= 0 and curvature <= 1.0:
        shift = -newton / (1.0 - 0.5 * curvature)  # Halley
    else:
        shift = -newton
    half_square = 0.5 * (g2 * shift) * shift
    return log_r + one_minus_q * shift - half_square, log_s - q * shift - half_square


@njit(cache=True, fastmath=FASTMATH, error_model="numpy", inline="always")
def table_start(theta, theta0, step, values, slopes):
    """Cubic Hermite interpolant of log w(logit p) at theta (NaN outside the table or where it overflowed)."""
    position = (theta - theta0) / step
    j = int(math.floor(position)) if position >= 0 else -1
    if j < 0 or j >= values.size - 1:
        return math.nan
    t = position - j
    t2 = t * t
    t3 = t2 * t
    return (
        (2 * t3 - 3 * t2 + 1) * values[j]
        + (t3 - 2 * t2 + t) * step * slopes[j]
        + (-2 * t3 + 3 * t2) * values[j + 1]
        + (t3 - t2) * step * slopes[j + 1]
    )


@njit(cache=True, parallel=True, fastmath=FASTMATH, error_model="numpy")
def band_log_table_kernel(old_log_prob, delta, theta0, step, values, slopes, lower, upper):
    """As band_log_kernel, but each root starts from the table of log w(logit p) at this delta and is
    finished by one Halley correction (the Halley kernel takes over outside the table)."""
    for i in prange(old_log_prob.size):
        lp = old_log_prob[i]
        if lp < 0 and lp > -math.inf:
            pc = -math.expm1(lp)  # 1 - p
            lq = math.log(pc)  # log(1-p), exact near p = 1
            p = math.exp(lp)
            theta = lp - lq
            if lq < LOG_P_TINY:
                upper[i] = -lp  # 1/p - r_up ~ e^(-delta/(1-p))/p: r_up = 1/p to the last bit
            else:
                log_w = table_start(theta, theta0, step, values, slopes)
                if math.isfinite(log_w) and lp >= LOG_P_TINY:
                    upper[i] = min(polish(lp, p, pc, log_w, delta)[0], -lp)
                else:
                    upper[i] = min(solve(lp, lq, delta)[0], -lp)
            log_w = table_start(-theta, theta0, step, values, slopes)  # mirror: upper root at logit -theta
            if math.isfinite(log_w) and lq >= LOG_P_TINY:
                lower[i] = polish(lq, pc, p, log_w, delta)[1]
            else:
                lower[i] = solve(lq, lp, delta)[1]
        elif lp == 0:
            lower[i] = -delta  # p = 1: r_lo = e^(-delta)
            upper[i] = 0.0
        elif lp == -math.inf:
            lower[i] = -math.inf
            upper[i] = math.inf
        else:
            lower[i] = math.nan
            upper[i] = math.nan


@njit(cache=True, parallel=True, fastmath=FASTMATH, error_model="numpy")
def band_log_kernel(old_log_prob, delta, lower, upper):
    for i in prange(old_log_prob.size):
        lp = old_log_prob[i]
        if lp < 0 and lp > -math.inf:
            lq = math.log(-math.expm1(lp))  # log(1-p), exact near p = 1
            if lq < LOG_P_TINY:
                upper[i] = -lp  # 1/p - r_up ~ e^(-delta/(1-p))/p: r_up = 1/p to the last bit
            else:
                upper[i] = min(solve(lp, lq, delta)[0], -lp)
            lower[i] = solve(lq, lp, delta)[1]  # mirror: log r_lo = log s'
        elif lp == 0:
            lower[i] = -delta  # p = 1: r_lo = e^(-delta)
            upper[i] = 0.0
        elif lp == -math.inf:
            lower[i] = -math.inf
            upper[i] = math.inf
        else:
            lower[i] = math.nan
            upper[i] = math.nan
'''


#: The start table: log d_up as a function of logit p on [-TABLE_EDGE, TABLE_EDGE], spacing TABLE_STEP.
#: Cubic Hermite interpolation errs by ~1e-7 relative; one Halley step takes that below 1e-16.
TABLE_EDGE = 740.0
TABLE_STEP = 0.125
#: Below this many tokens the table is not worth building: the Halley kernel runs from the outer bound.
TABLE_MIN_TOKENS = 50_000


@lru_cache(maxsize=16)
def start_table(delta: float) -> tuple[float, float, np.ndarray, np.ndarray]:
    r"""(theta0, step, F, F') with :math:`F(\theta_p) = \log w`, :math:`w = 1/(e^{d_{up}} - 1)`, on a uniform
    grid of logit p (w gives the cells with one ``exp``: :math:`r - 1 = (1-p)/(p + w)`).

    :math:`dd/d\theta_p = d(1-p)/x - 1` by implicit differentiation of :math:`\mathrm{kl}(p, q) = \delta` at
    fixed δ (:math:`\partial G/\partial\theta_p = q - p - d\,p(1-p)`, :math:`\partial G/\partial d = q - p`),
    and :math:`d\log w/dd = -(1 + w)`.  Built with the Halley kernel plus one extra step (~2 ms; cached).
    """
    theta = np.arange(-TABLE_EDGE, TABLE_EDGE + TABLE_STEP / 2, TABLE_STEP)
    lp = -np.logaddexp(0.0, -theta)  # log sigma(theta)
    lq = -np.logaddexp(0.0, theta)  # log(1 - sigma(theta))
    with np.errstate(all="ignore"):
        d, (_, _, _, log_r, _) = _solve_np(lp, lq, delta, steps=STEPS + 1)
        log_w = -d - np.log(-np.expm1(-d))  # w = e^{-d}/(1 - e^{-d})
        slopes = -(1.0 + np.exp(log_w)) * (d * np.exp(lq) / np.expm1(log_r) - 1.0)
    return float(theta[0]), TABLE_STEP, log_w, slopes


def band_log_numba(old_log_prob: np.ndarray, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """(log r_lo, log r_up) of the KL Band, Numba parallel (kernel conventions of numpy_backend).

    Large arrays start each root from :func:`start_table` and finish with one Halley correction; small ones
    run the Halley kernel from the outer bound (no table to build).
    """
    from .numba_backend import import_generated

    module = import_generated("kl", NUMBA_SOURCE)
    lp = np.asarray(old_log_prob, dtype=np.float64)
    flat = np.ascontiguousarray(lp.reshape(-1))
    lower = np.empty_like(flat)
    upper = np.empty_like(flat)
    if flat.size >= TABLE_MIN_TOKENS:
        theta0, step, values, slopes = start_table(float(delta))
        module.band_log_table_kernel(flat, float(delta), theta0, step, values, slopes, lower, upper)
    else:
        module.band_log_kernel(flat, float(delta), lower, upper)
    return lower.reshape(lp.shape), upper.reshape(lp.shape)


# ------------------------------------------------------------------------------------------------------------
# Torch
# ------------------------------------------------------------------------------------------------------------


def _phi_torch(x, log1p_x):
    import torch

    series = torch.zeros_like(x)
    for c in reversed(_PHI):
        series = (series + c) * x
    return torch.where(x.abs() < 0.1, series * x, x - log1p_x)


def band_log_torch(old_log_prob, delta: float):
    """(log r_lo, log r_up) of the KL Band in float64 torch ops: fixed STEPS, no host synchronisation."""
    import torch

    lp_all = old_log_prob.to(torch.float64)
    regular = (lp_all < 0) & (lp_all > -math.inf)
    lp1 = torch.where(regular, lp_all, -1.0).reshape(-1)
    lq1 = torch.log(-torch.expm1(lp1))  # log(1-p), exact near p = 1
    n = lp1.numel()
    lp, lq = torch.cat([lp1, lq1]), torch.cat([lq1, lp1])
    p, pc = torch.exp(lp), torch.exp(lq)
    gap = torch.minimum(
        torch.minimum(torch.full_like(p, math.sqrt(delta / 2)), torch.sqrt(2 * p * delta) + delta),
        torch.sqrt(2 * pc * delta),
    )
    d = torch.where(gap < pc, torch.log1p(gap / p) - torch.log1p(-gap / pc), math.inf)
    w = (delta - p * lp) / pc  # -log s >= w
    d = torch.minimum(d, torch.log(-torch.expm1(lq - w)) - lp + w)
    tiny = lp < LOG_P_TINY
    for it in range(STEPS + 1):
        den = p + torch.exp(-d) / -torch.expm1(-d)  # (1 + pE)/E
        x = pc / den  # r - 1
        y = -p / den  # s - 1
        b = lp + d
        a = torch.logaddexp(lq, b)  # log(1 + pE)
        far = (y < -0.5) | tiny  # s from logs (also when p is subnormal)
        log_s = torch.where(far, -a, torch.log1p(y))
        s = torch.where(far, torch.exp(log_s), 1.0 + y)
        y = torch.where(far, s - 1.0, y)
        log_r_tiny = torch.where(b > lq, -lp - torch.log1p(torch.exp(lq - b)), d - a)
        log_r = torch.where(tiny, log_r_tiny, torch.log1p(x))
        q_minus_p = torch.where(tiny, torch.exp(lp + log_r) - p, p * x)
        if it == STEPS:
            break
        g_r = torch.where(tiny, q_minus_p - p * log_r, p * _phi_torch(x, log_r))  # p phi(x) = (q-p) - p log r
        h = g_r + pc * _phi_torch(y, log_s) - delta
        g2 = (p + q_minus_p) * pc * s  # q (1 - q)
        newton = h / q_minus_p
        curvature = newton * (g2 / q_minus_p)  # h G''/G'^2 without underflowing G'^2
        halley = (curvature >= 0) & (curvature <= 1.0)
        step = torch.where(halley, newton / (1.0 - 0.5 * curvature), newton)
        d = torch.where(torch.isfinite(step), d - step, d)
    upper = torch.where(lq1 < LOG_P_TINY, -lp1, torch.minimum(log_r[:n], -lp1))  # r_up <= 1/p
    lower = log_s[n:]  # mirror: log r_lo = log s'
    nan = torch.full_like(lp1, math.nan)
    flat = lp_all.reshape(-1)
    other_lower = torch.where(flat == 0, -delta, torch.where(flat == -math.inf, -math.inf, nan))  # p = 1: e^-delta
    other_upper = torch.where(flat == 0, 0.0, torch.where(flat == -math.inf, math.inf, nan))
    lower = torch.where(regular.reshape(-1), lower, other_lower)
    upper = torch.where(regular.reshape(-1), upper, other_upper)
    return lower.reshape(lp_all.shape), upper.reshape(lp_all.shape)
