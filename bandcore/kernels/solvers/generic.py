r"""The generic safeguarded Newton (:func:`generic_bounds`): the Band of any generator.

In the offset :math:`d` of the logit (package docstring), :math:`G(d) = q\,\Phi(r) + (1-p)\tilde f(s)`,
:math:`\Phi(u) = \tilde f(u)/u`, :math:`G'(d) = q[(1-q)\tilde f'(r) - (1-p)s\tilde f'(s)]`.

Saturation is decided first: :math:`r_{up} = 1/p` iff :math:`G(\infty) = \Phi(1/p) + (1-p)\tilde f(0) \le \delta`,
evaluated in floating point (so within a few ulp of :math:`\log p^*` the decision is that of a neighbouring input;
docs/math.md §3 states and tests/kernels/test_threshold_ties.py checks how close).  The start is the seed
(:mod:`.common`) where there is one, else the small-δ root of
:math:`G \approx p(1-p)(\kappa d + \tfrac12 \tilde f''(1) d^2)` (:math:`\kappa` a kink at 1).  Each step takes
the Newton variant (on :math:`G`, :math:`\log G`, or :math:`\log G` vs :math:`\log d`) whose local model best
predicts the previous point, kept inside the bracket of inside/outside points seen so far and required to halve
the step once bracketed, else a (geometric) bisection.  A token is converged when a step is below
``STEP_TOLERANCE`` relative (quadratic convergence then leaves ~1e-20) or the bracket is one ulp wide.  The
bisection halves the bracket's exponent range, so every token converges within ``MAX_ITERATIONS`` (the tests
check it on points 1e-10 from every saturation threshold).  A root must also satisfy G(d) = δ to 1e-6 relative;
a token that does not (its iteration ran out, or its bracket closed on an overflow of f) gets NaN and status
``NOT_CONVERGED``, never a silent value.

The generator's functions (``phi_r dphi_r f_s k_s`` and their logarithms) and constants come from :mod:`.generator`,
whose place a generic plan takes in every bound instance (:mod:`bandcore.kernels.vectorised`,
:mod:`bandcore.kernels.compiled`).
"""

from __future__ import annotations

from ..ops import numpy_ops as xp  # rebound per backend by ..sources
from .common import (
    CONVERGED,
    LOG_P_TINY,
    NOT_CONVERGED,
    SATURATED,
    _regular,
    finish,
    seed_offset,
)
from .generator import (  # the generator's functions and constants: a generic plan's in every bound instance
    F2,
    F_AT_ZERO,
    KINK,
    SLOPE_AT_INFINITY,
    dphi_r,
    f_s,
    k_s,
    log_dphi_r,
    log_f_s,
    log_k_s,
    log_phi_r,
    phi_r,
)

#: Iteration budget of the generic solver (every catalogue divergence needs <= 72 next to its thresholds).
MAX_ITERATIONS = 96
STEP_TOLERANCE = 1e-10
#: Newton steps below this (relative) skip the choice of model: all agree to second order there.
NEAR = 1e-6
#: A root must satisfy G(d) = delta to this (relative): far looser than the contract, so only an iteration that ran
#: out or a bracket that closed on an overflow of f fails it.
ROOT_TOLERANCE = 1e-6
#: Upper end of the offset bracket before any evaluation.
D_MAX = 1e308
#: The start is capped at logit q = 40 (q = 1 - 4e-18).
Q_NEAR_ONE = 40.0

def cells(lp, lq, p, pc, d, logs=True):
    """(x_r, log r, r, x_s, log s, s, q) at offset d, every quantity without cancellation (``logs=False``: only
    for p >= e^-700, the far-tail branches dropped)."""
    den = p + xp.exp(-d) / -xp.expm1(-d)  # (1 + pE)/E = p + 1/E, 1/E = e^-d/(1 - e^-d): no overflow
    x_r = pc / den  # r - 1 = (1-p)E/(1+pE)
    x_s = -p / den  # s - 1 = -pE/(1+pE)
    b = lp + d
    a = xp.logaddexp(lq, b)  # log(1 + pE) = log((1-p) + p e^d)
    log_r = xp.log1p(x_r)
    q = p * (1.0 + x_r)  # q = p r
    if logs:
        tiny = lp < LOG_P_TINY  # p (near-)subnormal: build r, s and q from logarithms
        # log r = d - a, without forming lp + d - lp when d >> |lp|
        log_r_tiny = xp.where(b > lq, -lp - xp.log1p(xp.exp(lq - b)), d - lq - xp.log1p(xp.exp(b - lq)))
        log_r = xp.where(tiny, log_r_tiny, log_r)
        x_r = xp.where(tiny, xp.expm1(log_r_tiny), x_r)
        x_s = xp.where(tiny, xp.expm1(-a), x_s)
        q = xp.where(tiny, xp.exp(lp + log_r), q)
    far = x_s < -0.5
    log_s = xp.where(far, -a, xp.log1p(x_s))  # log s = -log(1+pE)
    r = 1.0 + x_r
    s = xp.where(far, xp.exp(log_s), 1.0 + x_s)
    return x_r, log_r, r, x_s, log_s, s, q


def g_and_slope(lp, lq, p, pc, d, logs=True):
    """(G(d), G'(d), log r, log s, q) (``logs``: as in :func:`cells`)."""
    return g_and_slope_of(lp, lq, pc, cells(lp, lq, p, pc, d, logs), logs)


def g_and_slope_of(lp, lq, pc, cells, logs=True):
    """:func:`g_and_slope` at the point whose :func:`cells` are ``cells``."""
    x_r, log_r, r, x_s, log_s, s, q = cells
    rest_f = pc * f_s(x_s, log_s, s)
    rest_k = pc * k_s(x_s, log_s, s)
    head = q * phi_r(x_r, log_r, r)  # p f(r) = q Phi(r)
    lead = q * pc * s * dphi_r(x_r, log_r, r)  # q (1 - q) f'(r), 1 - q = (1-p) s
    if logs and F_AT_ZERO == xp.inf:
        # 1 - p < e^-700: (1-p) f(s) = exp(log(1-p) + log f(s)), as f(s) may overflow where the product does
        # not; s f'(s) <= 0 on the s side, so (1-p) s f'(s) = -exp(log(1-p) + log|s f'(s)|)
        tail = lq < LOG_P_TINY
        rest_f = xp.where(tail, xp.exp(lq + log_f_s(x_s, log_s, s)), rest_f)
        rest_k = xp.where(tail, -xp.exp(lq + log_k_s(x_s, log_s, s)), rest_k)
    if logs and SLOPE_AT_INFINITY == xp.inf:
        # p < e^-700 and r > 2 (superlinear f): q Phi(r) and q (1-q) f'(r) from logarithms (Phi(r) may
        # overflow, the product not)
        far = xp.logical_and(lp < LOG_P_TINY, x_r > 1.0)
        log_q = lp + log_r
        head = xp.where(far, xp.exp(log_q + log_phi_r(x_r, log_r, r)), head)
        lead = xp.where(far, xp.exp(log_q + lq + log_s + log_dphi_r(x_r, log_r, r)), lead)
    return head + rest_f, lead - q * rest_k, log_r, log_s, q


def g_at_infinity(lp, lq, pc):
    """G(d = inf) = Phi(1/p) + (1-p) f(0): the upper ratio saturates at 1/p iff this is <= delta.

    (1-p) f(0) is infinite for every p < 1 when f(0) is, even where 1 - p underflows (log(1-p) > -inf)."""
    normal = lp >= LOG_P_TINY
    x = xp.where(normal, xp.expm1(-xp.maximum(lp, LOG_P_TINY)), 0.0)  # 1/p - 1
    phi = xp.where(normal, phi_r(x, -lp, 1.0 + x), SLOPE_AT_INFINITY)
    inside = lq > -xp.inf
    rest = xp.where(inside, pc * F_AT_ZERO, 0.0) if F_AT_ZERO < xp.inf else xp.where(inside, xp.inf, 0.0)
    return phi + rest


def start(p, pc, lp, lq, delta, seed):
    """The seed where it is usable, else the small-delta root of G ~ p(1-p)(kink d + f''(1) d^2/2); capped at
    logit q = Q_NEAR_ONE."""
    c = p * pc
    if F2 > 0:
        d = (xp.sqrt(KINK * KINK + 2.0 * F2 * delta / c) - KINK) / F2
    elif KINK > 0:
        d = delta / (KINK * c)
    else:
        d = c * 0.0 + 1.0
    cap = xp.maximum(Q_NEAR_ONE + lq - lp, Q_NEAR_ONE)
    d = xp.where(xp.logical_and(seed > 0.0, seed < cap), seed, d)
    return xp.where(xp.logical_and(d > 0.0, d < cap), d, cap)


def model_step(g, slope, d, d_prev, g_prev, delta):
    """The Newton variant (on G, log G, or log G vs log d) whose local model best predicted the previous point."""
    rate = slope / g  # d log G / dd
    log_ratio = xp.log(delta / g)
    log_seen = xp.log(g_prev / g)
    error_linear = xp.abs(xp.log1p(rate * (d_prev - d)) - log_seen)
    error_exponential = xp.abs(rate * (d_prev - d) - log_seen)
    error_power = xp.abs(rate * d * xp.log(d_prev / d) - log_seen)
    error_linear = xp.where(xp.isnan(error_linear), xp.inf, error_linear)
    error_exponential = xp.where(xp.isnan(error_exponential), xp.inf, error_exponential)
    linear = d + (delta - g) / slope  # Newton on G
    exponential = d + log_ratio / rate  # Newton on log G
    power = d * xp.exp(log_ratio / (rate * d))  # Newton on log G vs log d
    candidate = xp.where(error_linear < error_exponential, linear, exponential)
    best = xp.minimum(error_linear, error_exponential)
    return xp.where(xp.logical_or(xp.isnan(error_power), error_power <= best), power, candidate)


def step(g, slope, d, lo, hi, d_prev, g_prev, delta):
    """One safeguarded step: (next d, lo, hi, converged); see the module docstring.  Within NEAR of the root
    (a Newton step below NEAR relative) every model agrees to second order and plain Newton is taken."""
    inside = g <= delta
    lo = xp.where(inside, xp.maximum(lo, d), lo)
    hi = xp.where(inside, hi, xp.minimum(hi, d))
    linear = d + (delta - g) / slope  # Newton on G
    near = xp.abs(linear - d) <= NEAR * d
    candidate = xp.where(near, linear, model_step(g, slope, d, d_prev, g_prev, delta))
    # a step from an overflowed G or slope (inf) says nothing about convergence
    converged = xp.logical_and(
        xp.abs(candidate - d) <= STEP_TOLERANCE * d, xp.logical_and(xp.isfinite(g), xp.isfinite(slope))
    )
    shrinking = xp.logical_or(hi >= D_MAX, xp.logical_not(xp.abs(candidate - d) > 0.5 * xp.abs(d - d_prev)))
    inside_bracket = xp.logical_and(xp.logical_and(candidate > lo, candidate < hi), shrinking)
    ok = xp.logical_or(converged, inside_bracket)
    floor = xp.where(lo > 0.0, lo, xp.minimum(0.125 * hi, 1.0))  # d ~ 1: the natural scale of a logit
    middle = xp.where(hi > 4.0 * floor, xp.sqrt(floor) * xp.sqrt(hi), 0.5 * (lo + hi))
    candidate = xp.where(ok, candidate, middle)
    converged = xp.logical_or(converged, hi - lo <= 4e-16 * hi)
    return candidate, lo, hi, converged


def upper_root(lp, lq, delta, seed):
    """(log r, log s, saturated, converged) at the upper root of each token (lp, lq), started from ``seed``
    (an offset d; NaN: none)."""
    p = xp.exp(lp)
    pc = xp.exp(lq)
    g_infinity = g_at_infinity(lp, lq, pc)
    saturated = g_infinity <= delta
    d = start(p, pc, lp, lq, delta, seed)
    lo = d * 0.0
    hi = lo + D_MAX
    d_prev = lo + xp.nan
    g_prev = lo + xp.nan
    done = saturated
    log_r = lo + xp.nan  # log r, log s and q at the last point evaluated
    log_s = log_r
    q = log_r
    for _ in range(MAX_ITERATIONS):
        g, slope, log_r_d, log_s_d, q_d = g_and_slope(lp, lq, p, pc, d)
        candidate, lo, hi, converged = step(g, slope, d, lo, hi, d_prev, g_prev, delta)
        d_prev = xp.where(done, d_prev, d)
        g_prev = xp.where(done, g_prev, g)
        log_r = xp.where(done, log_r, log_r_d)
        log_s = xp.where(done, log_s, log_s_d)
        q = xp.where(done, q, q_d)
        d = xp.where(done, d, candidate)
        done = xp.logical_or(done, converged)
        if xp.all_true(done):
            break
    # a root is a root: G = delta to ROOT_TOLERANCE at the last point evaluated (within 1e-10 or one ulp of d),
    # else at d itself (a bracket that closed on an overflow is not converged), and d is finite (next to a
    # threshold the rounded G can stay below delta all the way to d = inf)
    g = xp.where(xp.abs(g_prev - delta) <= ROOT_TOLERANCE * delta, g_prev, g_and_slope(lp, lq, p, pc, d)[0])
    root = xp.logical_and(xp.logical_and(done, xp.abs(g - delta) <= ROOT_TOLERANCE * delta), xp.isfinite(d))
    # p on its saturation threshold to rounding (G(inf) = delta): the root runs off to the boundary; the
    # saturated value is the answer there
    edge = xp.logical_and(xp.logical_not(root), xp.abs(g_infinity - delta) <= 1e-9 * delta)
    saturated = xp.logical_or(saturated, edge)
    done = xp.logical_or(saturated, root)
    # from the last point evaluated to d (|d - d_prev| <= 1e-10 d): d log r/dd = 1 - q, d log s/dd = -q, both
    # second derivatives -q(1 - q); the neglected third-order term is below 1e-30 d^3
    shift = d - d_prev
    one_minus_q = xp.exp(lq + log_s)  # (1 - p) s, exact where q rounds to 1 (d can be 1e17 there)
    half_square = 0.5 * (q * one_minus_q * shift) * shift
    return log_r + one_minus_q * shift - half_square, log_s - q * shift - half_square, saturated, done

def generic_bounds(lp, delta, lower_at_one, seed):
    """(log r_lo, log r_up, status) of the Band for any generator (module docstring)."""
    lps, lq = _regular(lp)
    log_r, _, up_saturated, up_done = upper_root(lps, lq, delta, seed_offset(-lps, seed))
    _, log_s, lo_saturated, lo_done = upper_root(lq, lps, delta, seed_offset(-lq, seed))  # mirror: p <-> 1 - p
    # 1 - p < e^-700: 1/p - r_up < 1e-300 s (f(s) ~ delta/(1-p) > 1e290), so log r_up = -log p to the last bit
    up_saturated = xp.logical_or(up_saturated, lq < LOG_P_TINY)
    upper = xp.where(up_saturated, -lps, xp.minimum(log_r, -lps))  # r_up <= 1/p (a rounding excess is cut)
    lower = xp.where(lo_saturated, -xp.inf, log_s)
    status = xp.where(xp.logical_or(up_saturated, lo_saturated), SATURATED, CONVERGED)
    status = xp.where(xp.logical_and(up_done, lo_done), status, NOT_CONVERGED)
    upper = xp.where(up_done, upper, xp.nan)  # never a silent value: NaN and status NOT_CONVERGED
    lower = xp.where(lo_done, lower, xp.nan)
    return finish(lp, lower, upper, status, lower_at_one)

