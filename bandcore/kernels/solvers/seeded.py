r"""The seeded passes (:data:`.common.POLISHED`): :func:`kl_polished_bounds`, :func:`generic_polished_bounds`.

Each root starts from its seed table (:mod:`bandcore.kernels.seeds`, within ~1e-10 of the root away from
thresholds; :func:`.common.seed_pair`) and is finished by one Newton step, with no
branch, so that a compiler vectorises the pass; log r and log s are carried from the evaluated point to the root
by their Taylor expansions, so each root costs one evaluation.  A token the pass cannot finish to the contract
(no seed, a Newton step above ``POLISH_STEP``, p or 1 - p below e^-700) gets status NOT_CONVERGED.  Those are
next to a saturation threshold, where the seed (a cubic in L across a singularity of the root) errs by ~1e-7
typically.  The generic pass also returns each root's next offset (d plus its Newton step); the backends run
:func:`generic_refined_bounds` from those on the tokens left (:data:`.common.REFINED`), up to
``REFINE_PASSES`` times, each pass from the offsets the last returned, then the safeguarded solver
(:data:`.common.ENTRY_POINTS`) on the rest.  On 500k mid tokens (log p = -2 Exp(1)) at δ = 0.05 js leaves 15674
tokens after the polished pass, 1527 / 775 / 456 / 112 after 1 / 2 / 3 / 4 refined passes (the last: no seed).

KL's roots are solved in log s (:func:`kl_polish`: one expm1 and one log per root), from a seed table that holds
both roots of a token in the cell of L = -log p (:func:`.common.kl_seed_pair`), so a token costs no log(1 - p).
The generic root is evaluated from the seed's log w itself (:func:`seeded_cells`: 3 transcendentals where
the offset d took 7), and saturation is read off the seed table (log w = -inf, :func:`.common.seed_start`)
instead of evaluating G(∞) = Φ(1/p) + (1-p)f̃(0) per root (the speed-up measured: ``docs/kernel_measurements.md``).
"""

from __future__ import annotations

from ..ops import numpy_ops as xp  # rebound per backend by ..sources
from .common import (
    CONVERGED,
    LOG_P_TINY,
    P_TINY,
    SATURATED,
    _mark_unseeded,
    _regular,
    finish,
    finish_ratio,
    p_and_pc,
    regular_log_p,
)
from .generic import g_and_slope_of
from .kl import _kl_finish, _kl_finish_ratio

#: The seeded pass finishes a root whose one Newton step is at most this (relative): its error is then below
#: ~1e-16 * d G''/G'
POLISH_STEP = 1e-8
#: How many times the backends run :func:`generic_refined_bounds` on the tokens the polished pass left, before
#: the safeguarded solver takes the rest
REFINE_PASSES = 4


def seeded_cells(p, pc, log_w):
    """(:func:`.generic.cells` at the seed log w, d) for p, 1 - p >= e^-700: with w = 1/E = 1/(e^d - 1),
    r - 1 = (1-p)/(p + w), s = w/(p + w) (both without cancellation) and d = log r - log s, so the point
    costs three transcendentals (w, log r, log s) where :func:`.generic.cells` from d takes seven."""
    w = xp.exp(log_w)
    den = p + w  # (1 + pE)/E
    x_r = pc / den
    x_s = -p / den
    s = w / den
    far = x_s < -0.5
    # log s = log1p(x_s), compensated as in log1p; far (s < 1/2): log w - log(p + w), which stays finite where
    # w = e^log_w underflows (log w < -708: the upper root of a token near p = 1 under a generator growing
    # like u log u); one log either way
    u = xp.where(far, den, 1.0 + x_s)
    log_s = xp.where(far, log_w - xp.log(u), xp.log(u) + (x_s - (u - 1.0)) / u)
    log_r = xp.log1p(x_r)
    r = 1.0 + x_r
    return (x_r, log_r, r, x_s, log_s, s, p * r), log_r - log_s


def polished_root(lp, lq, p, pc, delta, log_w):
    """(log r, log s, saturated, finished, next d, step) at the upper root from its seed log w by one Newton step,
    with no branch (a compiler vectorises it).  Finished where the root saturates, or where the step is below
    POLISH_STEP relative and G = delta to 1e-6 (the seed errs by ~1e-10, so the step's own error is ~1e-20);
    next d = d + the step: the start of :func:`generic_refined_bounds` where the root is not finished.  ``step``:
    (r, log w, up, down), from which the ratio passes form r and s (:func:`ratio_up`, :func:`ratio_down`)."""
    saturated = log_w == -xp.inf  # the seed table's verdict (w = 0: d = inf), exact away from the threshold
    start = xp.where(saturated, 0.0, log_w)
    point, d = seeded_cells(p, pc, start)
    g, slope, log_r, log_s, q = g_and_slope_of(lp, lq, pc, point, False)
    shift = (delta - g) / slope
    regular = xp.logical_and(lp >= LOG_P_TINY, lq >= LOG_P_TINY)
    small = xp.logical_and(xp.abs(shift) <= POLISH_STEP * d, xp.abs(g - delta) <= 1e-6 * delta)
    finished = xp.logical_or(saturated, xp.logical_and(regular, xp.logical_and(small, xp.isfinite(d))))
    one_minus_q = pc * point[5]  # (1 - p) s
    half_square = 0.5 * (q * one_minus_q * shift) * shift
    up, down = one_minus_q * shift - half_square, -q * shift - half_square  # the steps of log r and log s
    next_d = xp.where(saturated, xp.inf, d + shift)
    return log_r + up, log_s + down, saturated, finished, next_d, (point[2], start, up, down)


def ratio_up(step):
    """r e^up at the root from the ``step`` (r, start, up, down) of :func:`polished_root` or :func:`kl_polish`:
    the ratio at the seed's point corrected by the Taylor step of its logarithm, with no exp of a log bound.  The
    steps are a Newton correction from a seed within ~1e-7 (a token whose step is larger is not finished, and solved
    again), so e^z is its Taylor polynomial to z^4 (error < |z|^5/120 < 1e-37)."""
    return step[0] * exp_small(step[2])


def ratio_down(p, step):
    """s e^down at the root from the same ``step`` (:func:`ratio_up`), s = w/(p + w), w = e^log_w: formed as
    exp_ratio(log w, (p + w) e^-down), so the division comes before the scaling by 2^n and a subnormal s is
    rounded once, where w/(p + w) would round w first."""
    return xp.exp_ratio(step[1], (p + xp.exp(step[1])) * exp_small(-step[3]))


def exp_small(z):
    """e^z for the tiny z of a Newton correction (|z| < 1e-7 where the result is kept): Taylor to z^4."""
    return 1.0 + z * (1.0 + z * (0.5 + z * (1.0 / 6.0 + z * (1.0 / 24.0))))


def generic_polished_bounds(lp, delta, lower_at_one, log_w_up, log_w_lo, lq=None, p=None, pc=None):
    """(log r_lo, log r_up, status, next d of the upper root, next d of the lower root): :func:`generic_bounds`
    with each root finished by :func:`polished_root` from its seed; status NOT_CONVERGED marks the tokens it
    could not finish (no seed, a rough seed next to a threshold, p or 1 - p below e^-700): the caller runs
    :func:`generic_refined_bounds` from the next offsets on those, then :func:`generic_bounds` on the rest.
    ``lq``, ``p``, ``pc``: log(1 - p), p and 1 - p as the seed loop computed them (:func:`.common.regular_point`),
    else computed here."""
    lps, _, _, up, lo, status = _generic_roots(lp, delta, log_w_up, log_w_lo, lq, p, pc)
    upper = xp.where(up[2], -lps, xp.minimum(up[0], -lps))
    lower = xp.where(lo[2], -xp.inf, lo[1])
    lower, upper, status = finish(lp, lower, upper, status, lower_at_one)
    return lower, upper, _mark_unseeded(lp, xp.logical_and(up[3], lo[3]), status), up[4], lo[4]


def generic_polished_ratios(lp, delta, lower_at_one, log_w_up, log_w_lo, lq=None, p=None, pc=None):
    """:func:`generic_polished_bounds` returning the ratios (r_lo, r_up, ...) themselves (:func:`ratio_up`,
    :func:`ratio_down`: no exp of a log bound); saturated: r_up = 1/p, r_lo = 0."""
    _, p, pc, up, lo, status = _generic_roots(lp, delta, log_w_up, log_w_lo, lq, p, pc)
    one_over_p = 1.0 / p
    upper = xp.where(up[2], one_over_p, xp.minimum(ratio_up(up[5]), one_over_p))
    lower = xp.where(lo[2], 0.0, ratio_down(pc, lo[5]))
    lower, upper, status = finish_ratio(lp, lower, upper, status, lower_at_one)
    return lower, upper, _mark_unseeded(lp, xp.logical_and(up[3], lo[3]), status), up[4], lo[4]


def _generic_roots(lp, delta, log_w_up, log_w_lo, lq, p, pc):
    """(log p, p, 1 - p, upper root, lower root, status) of both polished passes: each root as
    :func:`polished_root` returns it (the lower one that of the mirrored token), status SATURATED where either
    saturates, else CONVERGED."""
    lps, lq = _regular(lp, lq)
    p, pc = p_and_pc(lps, p, pc)
    up = polished_root(lps, lq, p, pc, delta, log_w_up)
    lo = polished_root(lq, lps, pc, p, delta, log_w_lo)
    return lps, p, pc, up, lo, xp.where(xp.logical_or(up[2], lo[2]), SATURATED, CONVERGED)


def offset_log_w(d):
    """log w = -d - log(1 - e^-d) of an offset d > 0 (NaN for any other d: no start)."""
    return xp.where(d > 0.0, -d - xp.log(-xp.expm1(-d)), xp.nan)


def generic_refined_bounds(lp, delta, lower_at_one, d_up, d_lo):
    """:func:`generic_polished_bounds` started from the offsets d of both roots (the next offsets a previous
    pass returned: one Newton step on from its start).  The backends run it up to REFINE_PASSES times on the
    tokens still NOT_CONVERGED, each pass from the offsets the last returned."""
    return generic_polished_bounds(lp, delta, lower_at_one, offset_log_w(d_up), offset_log_w(d_lo))


def generic_refined_ratios(lp, delta, lower_at_one, d_up, d_lo):
    """:func:`generic_refined_bounds` returning the ratios (:func:`generic_polished_ratios`)."""
    return generic_polished_ratios(lp, delta, lower_at_one, offset_log_w(d_up), offset_log_w(d_lo))


def kl_cells(p, pc, log_s):
    """(q - p, r - 1, log r, phi(r - 1), s - 1, phi(s - 1)) at the point log s of the upper root of (p, 1 - p),
    phi(x) = x - log(1 + x): s - 1 and phi(s - 1) = s - 1 - log s from one expm1 (``xp.expm1_phi``), q - p =
    (1 - p)(1 - s) and r - 1 = (q - p)/p (neither cancels), log r and phi(r - 1) from one log (``xp.log1p_phi``): two
    transcendentals per root.  log s is the variable itself, so it stays finite where s underflows."""
    s_minus_one, phi_s = xp.expm1_phi(log_s)
    gap = -pc * s_minus_one  # q - p
    x_r = gap / p
    log_r, phi_r = xp.log1p_phi(x_r, 1.0 + x_r)
    return gap, x_r, log_r, phi_r, s_minus_one, phi_s


def kl_polish(p, pc, log_s, delta):
    r"""(log r, log s, step) at the upper root of (p, 1 - p) from a start log s within ~1e-9 of it: one Newton step
    in :math:`\sigma = \log s`, applied to log r through its Taylor expansion.  With q = 1 - (1-p)e^σ,
    dG/dσ = -(q - p)/q, so the step is Δσ = q t with t = (G - δ)/(q - p); d log r/dσ = 1 - 1/q and d²log r/dσ² =
    -(1-q)/q², so Δ log r = -(1 - q) t (1 + t/2): one division per root.  ``step`` = (r, log s, Δ log r, Δσ), from
    which the ratio passes form r and s (:func:`ratio_up`, :func:`kl_ratio_down`).  The cells are evaluated once,
    from log s (:func:`kl_cells`: two transcendentals where a start in log w took three, and about half the
    divisions: ``docs/kernel_measurements.md``)."""
    gap, x_r, log_r, phi_r, s_minus_one, phi_s = kl_cells(p, pc, log_s)
    t = (p * phi_r + pc * phi_s - delta) / gap
    down = (p + gap) * t
    up = -(pc + pc * s_minus_one) * t * (1.0 + 0.5 * t)
    return log_r + up, log_s + down, (1.0 + x_r, log_s, up, down)


def kl_ratio_down(step):
    """s e^Δσ at the root from the ``step`` (r, log s, Δ log r, Δσ) of :func:`kl_polish`: exp_ratio(log s,
    e^-Δσ), so a subnormal s is rounded once."""
    return xp.exp_ratio(step[1], exp_small(-step[3]))


def kl_polished_bounds(lp, delta, lower_at_one, log_s_up, log_r_lo, p=None, pc=None):
    """:func:`kl_bounds` with each root started from its seed (:func:`.common.kl_seed_pair`: log s at the upper
    root, and log r_lo, the log s at the mirror's) and finished by one Newton step in log s
    (:func:`kl_polish`), branch-free so that a compiler vectorises it; status NOT_CONVERGED marks a token a root of
    which has no seed (p below e^-704 or above 1 - 1e-12): the caller solves those with :func:`kl_bounds`.  ``p``,
    ``pc``: p and 1 - p where the caller has them (the Numba blocks' first loop); no log(1 - p) is computed."""
    lps, p, pc, seeded = _kl_start(lp, log_s_up, log_r_lo, p, pc)
    log_r = kl_polish(p, pc, log_s_up, delta)[0]
    log_s = kl_polish(pc, p, log_r_lo, delta)[1]
    lower, upper, status = _kl_finish(lp, lps, pc < P_TINY, log_r, log_s, delta, lower_at_one)
    return lower, upper, _mark_unseeded(lp, seeded, status)


def kl_polished_ratios(lp, delta, lower_at_one, log_s_up, log_r_lo, p=None, pc=None):
    """:func:`kl_polished_bounds` returning the ratios (r_lo, r_up, status) themselves (:func:`ratio_up`,
    :func:`kl_ratio_down`: no exp of a log bound)."""
    lps, p, pc, seeded = _kl_start(lp, log_s_up, log_r_lo, p, pc)
    r = ratio_up(kl_polish(p, pc, log_s_up, delta)[2])
    s = kl_ratio_down(kl_polish(pc, p, log_r_lo, delta)[2])
    lower, upper, status = _kl_finish_ratio(lp, lps, pc < P_TINY, 1.0 / p, r, s, delta, lower_at_one)
    return lower, upper, _mark_unseeded(lp, seeded, status)


def _kl_start(lp, log_s_up, log_r_lo, p, pc):
    """(log p, p, 1 - p, seeded) of KL's polished passes: seeded where both roots have a seed and p, 1 - p >=
    e^-700."""
    lps = regular_log_p(lp)
    p, pc = p_and_pc(lps, p, pc)
    seeded = xp.logical_and(xp.logical_and(xp.isfinite(log_s_up), p >= P_TINY),
                            xp.logical_and(xp.isfinite(log_r_lo), pc >= P_TINY))  # fmt: skip
    return lps, p, pc, seeded
