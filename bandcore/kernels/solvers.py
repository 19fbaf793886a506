r"""The Band solvers, written once against the element-wise namespace ``xp`` (see :mod:`.ops`).

This module is the single source of the solver arithmetic.  :mod:`.backends` binds it to NumPy arrays, torch
tensors, or Numba scalars (it compiles a generated copy of this file whose ``xp`` is :mod:`.numba_ops`); the
per-divergence globals (``phi_r dphi_r f_s k_s`` and the constants below) are bound per instance.

**Variables.**  For one token with :math:`\log p` and :math:`\log(1-p)` the upper root is found in the offset
:math:`d = \theta - \theta_p \ge 0` of the new logit :math:`\theta = \operatorname{logit} q` from the old one.
With :math:`E = e^d - 1`:

.. math::
    r - 1 = \frac{(1-p)E}{1 + pE}, \qquad s - 1 = -\frac{pE}{1 + pE}, \qquad
    \log s = -\operatorname{logaddexp}(\log(1-p), \log p + d),

and :math:`G(d) = g_f(p, r) = q\,\Phi(r) + (1-p)\tilde f(s)`, :math:`\Phi(u) = \tilde f(u)/u`,
:math:`G'(d) = q[(1-q)\tilde f'(r) - (1-p)s\tilde f'(s)]`.  The lower root is the upper root of the mirrored
token (swap :math:`\log p` and :math:`\log(1-p)`): :math:`\log r_{lo} = \log s` there.

**Generic safeguarded Newton** (:func:`generic_bounds`).  Saturation is decided first and exactly:
:math:`r_{up} = 1/p` iff :math:`G(\infty) = \Phi(1/p) + (1-p)\tilde f(0) \le \delta`.  The start is the
small-δ root of :math:`G \approx p(1-p)(\kappa d + \tfrac12 \tilde f''(1) d^2)` (:math:`\kappa` a kink at 1).
Each step takes the Newton variant (on :math:`G`, :math:`\log G`, or :math:`\log G` vs :math:`\log d`) whose
local model best predicts the previous point, kept inside the bracket of inside/outside points seen so far
and required to halve the step once bracketed, else a (geometric) bisection.  A token is converged when a
step is below ``STEP_TOLERANCE`` relative (quadratic convergence then leaves ~1e-20) or the bracket is one
ulp wide.  The bisection halves the bracket's exponent range, so every token converges within
``MAX_ITERATIONS`` (the tests check it on points 1e-10 from every saturation threshold).  A root must also
satisfy G(d) = δ to 1e-6 relative; a token that does not (its iteration ran out, or its bracket closed on an
overflow of f) gets NaN and status ``NOT_CONVERGED``, never a silent value.

**KL** (:func:`kl_bounds`, f = −log u): :math:`G(d) = \mathrm{kl}(p, q) = p\varphi(x) + (1-p)\varphi(y)`,
:math:`\varphi(x) = x - \log(1+x)`, :math:`G' = q - p`, :math:`G'' = q(1-q)`.  :math:`G` is convex, so
Halley/Newton from an outer start (the smallest of :math:`q - p \le \sqrt{\delta/2}`,
:math:`\sqrt{2p\delta} + \delta`, :math:`\sqrt{2(1-p)\delta}` and :math:`\log(1-q) \ge \log(1-p) +
(p\log p - \delta)/(1-p)`) decreases monotonically to the root: ``KL_STEPS`` = 4 steps reach the oracle to
~4e-14 over log p ∈ [-1e4, 0), δ ∈ [1e-8, 10].

**Seeded passes** (:data:`POLISHED`: :func:`kl_polished_bounds`, :func:`generic_polished_bounds`).  Each root
starts from its seed table (:mod:`.seeds`, within ~1e-10 of the root away from thresholds; :func:`seed_pair`)
and is finished by one Halley (KL) or Newton (generic) step, with no branch, so that a compiler vectorises the
pass; log r and log s are carried from the evaluated point to the root by their Taylor expansions, so each
root costs one evaluation.  A token the pass cannot finish to the contract (no seed, a Newton step above
``POLISH_STEP``, p or 1 - p below e^-700) gets status NOT_CONVERGED, and the backend solves it again with
the safeguarded solver (:data:`ENTRY_POINTS`).

**Closed forms** (:func:`tv_bounds`, :func:`pearson_bounds`): :math:`r = 1 \pm \delta/p` and
:math:`r = 1 \pm \sqrt{\delta(1-p)/p}`, written in logarithms so nothing overflows for any finite log p.

Every ``*_bounds(lp, delta, lower_at_one)`` returns ``(log_lower, log_upper, status)`` for any ``lp`` (NaN,
positive, 0, -inf included: :func:`finish` applies the conventions once), ``status`` as in
:class:`bandcore._contract.Status`.
"""

from __future__ import annotations

from .lookup import interpolate
from .ops import numpy_ops as xp  # rebound per backend by .backends

# per-divergence globals of the generic solver, bound by .backends
phi_r = dphi_r = f_s = k_s = log_f_s = log_k_s = log_phi_r = log_dphi_r = None
F_AT_ZERO = 0.0  # f̃(0+)  (inf: the lower bound never saturates)
SLOPE_AT_INFINITY = 0.0  # σ∞ = lim f̃(u)/u
F2 = 0.0  # f̃''(1) (0 for a kink)
KINK = 0.0  # f̃'(1+) - f̃'(1-)

#: Iteration budget of the generic solver (every catalogue divergence needs <= 72 next to its thresholds).
MAX_ITERATIONS = 96
STEP_TOLERANCE = 1e-10
#: Newton steps below this (relative) skip the choice of model: all agree to second order there.
NEAR = 1e-6
#: The seeded pass finishes a root whose one Newton step is at most this (relative): its error is then below
#: ~1e-16 * d G''/G'
POLISH_STEP = 1e-8
#: Upper end of the offset bracket before any evaluation.
D_MAX = 1e308
#: The start is capped at logit q = 40 (q = 1 - 4e-18).
Q_NEAR_ONE = 40.0
#: Below this log p, p is (near-)subnormal: r, s and q are built from logarithms.
LOG_P_TINY = -700.0
#: Fixed number of Halley steps of the KL solver.
KL_STEPS = 4
#: Taylor coefficients of phi(x) = x - log(1+x) = sum_{k>=2} (-1)^k x^k / k, |x| < 0.1 (error 1e-18).
PHI = (0.5, -1 / 3, 0.25, -0.2, 1 / 6, -1 / 7, 0.125, -1 / 9, 0.1, -1 / 11, 1 / 12, -1 / 13, 1 / 14, -1 / 15, 0.0625)

CONVERGED, SATURATED, NOT_CONVERGED, INVALID_INPUT = 0.0, 1.0, -2.0, -3.0


def finish(lp, lower, upper, status, lower_at_one):
    """The conventions, once: NaN or log p > 0 -> NaN (invalid); p = 1 -> (lower_at_one, 0); p = 0 -> (-inf, inf)."""
    invalid = xp.logical_not(lp <= 0.0)
    at_one = lp == 0.0
    at_zero = lp == -xp.inf
    special = xp.logical_or(at_one, at_zero)
    lower = xp.where(invalid, xp.nan, xp.where(at_one, lower_at_one, xp.where(at_zero, -xp.inf, lower)))
    upper = xp.where(invalid, xp.nan, xp.where(at_one, 0.0, xp.where(at_zero, xp.inf, upper)))
    status = xp.where(invalid, INVALID_INPUT, xp.where(special, SATURATED, status))
    return lower, upper, status


def _regular(lp):
    """(log p, log(1-p)) with the non-regular entries (0, -inf, NaN, > 0) replaced by p = e^-1."""
    lps = xp.where(xp.logical_and(lp < 0.0, lp > -xp.inf), lp, -1.0)
    return lps, xp.log(-xp.expm1(lps))  # log(1-p) = log(-expm1(log p)), exact near p = 1


# ------------------------------------------------------------------------------------------------------------
# The generic safeguarded Newton
# ------------------------------------------------------------------------------------------------------------


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
    x_r, log_r, r, x_s, log_s, s, q = cells(lp, lq, p, pc, d, logs)
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
    # a root is a root: G = delta to 1e-6 relative at the last point evaluated (within 1e-10 or one ulp of d),
    # else at d itself (a bracket that closed on an overflow is not converged)
    g = xp.where(xp.abs(g_prev - delta) <= 1e-6 * delta, g_prev, g_and_slope(lp, lq, p, pc, d)[0])
    root = xp.logical_and(done, xp.abs(g - delta) <= 1e-6 * delta)
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


def seed_log_w(L, seed):
    """log w, w = 1/(e^d - 1), at the upper root of the token p = e^-L from the seed table (:mod:`.seeds`);
    NaN outside its range."""
    fm = seed[0]
    inside = xp.logical_and(L >= fm[0], L <= fm[1])
    return xp.where(inside, interpolate(L, seed[0], seed[1], seed[2], seed[3], seed[4]), xp.nan)


def seed_offset(L, seed):
    """The offset d = log(1 + 1/w) of the seed at L (NaN where there is none)."""
    return xp.logaddexp(0.0, -seed_log_w(L, seed))


def seed_points(lp):
    """(L at which the upper root is read, L at which the lower root is read) from the seed table: -log p, and
    -log(1 - p), as the lower root is the upper root of the mirror token 1 - p."""
    lps, lq = _regular(lp)
    return -lps, -lq


def seed_pair(lp, seed):
    """(log w at the upper root, log w at the lower root) of each token from its seed table (NaN: no seed)."""
    L_up, L_lo = seed_points(lp)
    return seed_log_w(L_up, seed), seed_log_w(L_lo, seed)


def polished_root(lp, lq, p, pc, delta, log_w):
    """(log r, log s, saturated, finished) at the upper root from its seed log w by one Newton step, with no
    branch (a compiler vectorises it).  Finished where the root saturates, or where the step is below
    POLISH_STEP relative and G = delta to 1e-6 (the seed errs by ~1e-10, so the step's own error is ~1e-20);
    tokens not finished are left to :func:`upper_root`."""
    saturated = g_at_infinity(lp, lq, pc) <= delta
    d = xp.logaddexp(0.0, -log_w)
    g, slope, log_r, log_s, q = g_and_slope(lp, lq, p, pc, d, False)
    shift = (delta - g) / slope
    regular = xp.logical_and(lp >= LOG_P_TINY, lq >= LOG_P_TINY)
    small = xp.logical_and(xp.abs(shift) <= POLISH_STEP * d, xp.abs(g - delta) <= 1e-6 * delta)
    finished = xp.logical_or(saturated, xp.logical_and(regular, xp.logical_and(small, xp.isfinite(log_w))))
    one_minus_q = pc * xp.exp(log_s)
    half_square = 0.5 * (q * one_minus_q * shift) * shift
    return log_r + one_minus_q * shift - half_square, log_s - q * shift - half_square, saturated, finished


def generic_polished_bounds(lp, delta, lower_at_one, log_w_up, log_w_lo):
    """:func:`generic_bounds` with each root finished by :func:`polished_root` from its seed; status
    NOT_CONVERGED marks the tokens it could not finish (no seed, a rough seed next to a threshold, p or 1 - p
    below e^-700): the caller solves those with :func:`generic_bounds`."""
    lps, lq = _regular(lp)
    p = xp.exp(lps)
    pc = xp.exp(lq)
    log_r, _, up_saturated, up_done = polished_root(lps, lq, p, pc, delta, log_w_up)
    _, log_s, lo_saturated, lo_done = polished_root(lq, lps, pc, p, delta, log_w_lo)
    upper = xp.where(up_saturated, -lps, xp.minimum(log_r, -lps))
    lower = xp.where(lo_saturated, -xp.inf, log_s)
    status = xp.where(xp.logical_or(up_saturated, lo_saturated), SATURATED, CONVERGED)
    lower, upper, status = finish(lp, lower, upper, status, lower_at_one)
    return lower, upper, _mark_unseeded(lp, xp.logical_and(up_done, lo_done), status)


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


# ------------------------------------------------------------------------------------------------------------
# KL: Halley in the logit from an outer start
# ------------------------------------------------------------------------------------------------------------


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
    return _kl_finish(lp, lps, lq, log_r, log_s, delta, lower_at_one)


def _kl_finish(lp, lps, lq, log_r, log_s, delta, lower_at_one):
    # log r_lo <= -delta/p: below -DBL_MAX (so -inf, correctly rounded) once log p < log(delta) - log(DBL_MAX)
    log_s = xp.where(lps < xp.log(delta) - 709.782712893384, -xp.inf, log_s)
    # 1 - p < e^-700: r_up = 1/p to the last bit (KL: 1/p - r_up ~ e^{-delta/(1-p)}/p)
    upper = xp.where(lq < LOG_P_TINY, -lps, xp.minimum(log_r, -lps))
    status = xp.where(lq < LOG_P_TINY, SATURATED, CONVERGED)
    return finish(lp, log_s, upper, status, lower_at_one)


def kl_polish(lp, p, pc, log_w, delta):
    """(log r, log s) at the root from a start log w within ~1e-7 of it: one Halley correction in d, applied to
    log r and log s through their Taylor expansions (d log r/dd = 1-q, d log s/dd = -q, both second
    derivatives -q(1-q)): the cells are evaluated once."""
    den = p + xp.exp(log_w)  # (1 + pE)/E
    x = pc / den  # r - 1
    log_r = xp.log1p(x)
    z = lp - log_w  # log(pE)
    far = -p / den < -0.5
    log_s = xp.where(far, -(z + xp.log1p(xp.exp(-z))), xp.log1p(-p / den))  # -log(1 + pE)
    s = xp.where(far, xp.exp(log_s), 1.0 - p / den)
    h = p * phi(x, log_r) + pc * phi(s - 1.0, log_s) - delta
    one_minus_q = pc * s
    q = 1.0 - one_minus_q
    g2 = q * one_minus_q  # G''
    newton = h / (p * x)
    curvature = newton * (g2 / (p * x))  # h G''/G'^2 without underflowing G'^2
    halley = xp.logical_and(curvature >= 0.0, curvature <= 1.0)
    shift = -xp.where(halley, newton / (1.0 - 0.5 * curvature), newton)
    half_square = 0.5 * (g2 * shift) * shift
    return log_r + one_minus_q * shift - half_square, log_s - q * shift - half_square


def kl_polished_bounds(lp, delta, lower_at_one, log_w_up, log_w_lo):
    """:func:`kl_bounds` with each root started from its seed (:func:`seed_pair`) and finished by one Halley
    step, branch-free so that a compiler vectorises it; status NOT_CONVERGED marks a token a root of which has no
    seed (p below e^-704 or above 1 - 1e-12): the caller solves those with :func:`kl_bounds`."""
    lps, lq = _regular(lp)
    p = xp.exp(lps)
    pc = xp.exp(lq)
    seeded = xp.logical_and(xp.logical_and(xp.isfinite(log_w_up), lps >= LOG_P_TINY),
                            xp.logical_and(xp.isfinite(log_w_lo), lq >= LOG_P_TINY))  # fmt: skip
    log_r = kl_polish(lps, p, pc, log_w_up, delta)[0]
    log_s = kl_polish(lq, pc, p, log_w_lo, delta)[1]
    lower, upper, status = _kl_finish(lp, lps, lq, log_r, log_s, delta, lower_at_one)
    return lower, upper, _mark_unseeded(lp, seeded, status)


def _mark_unseeded(lp, seeded, status):
    """NOT_CONVERGED where a polished pass could not finish a regular token (NaN, p = 1, p = 0 are final)."""
    special = xp.logical_not(xp.logical_and(lp < 0.0, lp > -xp.inf))
    return xp.where(xp.logical_or(seeded, special), status, NOT_CONVERGED)


# ------------------------------------------------------------------------------------------------------------
# Closed forms: total variation and Pearson chi^2
# ------------------------------------------------------------------------------------------------------------


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


def log_of_sum(first, a, b, other, offset):
    """log(a + b) where ``first``, else log(other) + offset, with one log: a + b is rounded to u and its rounding
    error a + b - u (exact when |a| >= |b|) restored to first order as (a - u + b)/u, as in log1p."""
    u = xp.where(first, a + b, other)
    return xp.log(u) + xp.where(first, ((a - u) + b) / u, offset)


#: kind -> bounds function name (the entry points of a bound instance)
ENTRY_POINTS = {"generic": "generic_bounds", "kl": "kl_bounds", "tv": "tv_bounds", "pearson": "pearson_bounds"}
#: kind -> the branch-free seeded pass run before ENTRY_POINTS[kind] (which then solves only the tokens it marks
#: NOT_CONVERGED); the closed forms have none
POLISHED = {"generic": "generic_polished_bounds", "kl": "kl_polished_bounds"}
