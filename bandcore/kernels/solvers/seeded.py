r"""The seeded passes (:data:`.common.POLISHED`): :func:`kl_polished_bounds`, :func:`generic_polished_bounds`.

Each root starts from its seed table (:mod:`bandcore.kernels.seeds`, within ~1e-10 of the root away from
thresholds; :func:`.common.seed_pair`) and is finished by one Halley (KL) or Newton (generic) step, with no
branch, so that a compiler vectorises the pass; log r and log s are carried from the evaluated point to the root
by their Taylor expansions, so each root costs one evaluation.  A token the pass cannot finish to the contract
(no seed, a Newton step above ``POLISH_STEP``, p or 1 - p below e^-700) gets status NOT_CONVERGED.  Those are
next to a saturation threshold, where the seed (a cubic in L across a singularity of the root) errs by ~1e-7
typically: the backend first runs the pass again from seeds improved by one Newton step
(:func:`generic_refined_bounds`, :data:`.common.REFINED`: ~1e-7 becomes ~1e-14, and the pass finishes ~85 % of
them, at two evaluations per root), then the safeguarded solver (:data:`.common.ENTRY_POINTS`) on the rest.
"""

from __future__ import annotations

from ..ops import numpy_ops as xp  # rebound per backend by ..binding
from .common import CONVERGED, LOG_P_TINY, SATURATED, _mark_unseeded, _regular, finish, seed_pair
from .generic import g_and_slope, g_at_infinity
from .kl import _kl_finish, phi

#: The seeded pass finishes a root whose one Newton step is at most this (relative): its error is then below
#: ~1e-16 * d G''/G'
POLISH_STEP = 1e-8


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



def refined_log_w(lp, lq, p, pc, delta, log_w):
    """log w, w = 1/(e^d - 1), one Newton step in d on from the seed log w of the upper root (NaN where the step
    leaves d > 0 or there is no seed).  Only a start: :func:`polished_root` decides whether it is good enough."""
    d = xp.logaddexp(0.0, -log_w)
    g, slope = g_and_slope(lp, lq, p, pc, d, False)[:2]
    d = d + (delta - g) / slope
    return xp.where(d > 0.0, -d - xp.log(-xp.expm1(-d)), xp.nan)


def generic_refined_bounds(lp, delta, lower_at_one, seed):
    """:func:`generic_polished_bounds` from the seeds of ``seed`` (a seed table) improved by
    :func:`refined_log_w`; status NOT_CONVERGED where it could not finish a token (the caller then solves it with
    :func:`generic_bounds`)."""
    log_w_up, log_w_lo = seed_pair(lp, seed)
    lps, lq = _regular(lp)
    p = xp.exp(lps)
    pc = xp.exp(lq)
    log_w_up = refined_log_w(lps, lq, p, pc, delta, log_w_up)
    log_w_lo = refined_log_w(lq, lps, pc, p, delta, log_w_lo)
    return generic_polished_bounds(lp, delta, lower_at_one, log_w_up, log_w_lo)


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
