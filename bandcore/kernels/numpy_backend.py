r"""NumPy reference solver of the Band for any divergence: vectorised, safeguarded Newton.

For one token with :math:`\log p` and :math:`\log(1-p)` the upper root is found in the offset
:math:`d = \theta - \theta_p \ge 0` of the new logit :math:`\theta = \operatorname{logit} q` from the old one.
With :math:`E = e^d - 1`:

.. math::
    r - 1 = \frac{(1-p)E}{1 + pE}, \qquad s - 1 = -\frac{pE}{1 + pE}, \qquad
    \log s = -\log(1 + pE) = -\operatorname{logaddexp}(\log(1-p), \log p + d),

(no cancellation anywhere) and :math:`G(d) = g_f(p, r) = q\,\Phi(r) + (1-p)\tilde f(s)`,
:math:`G'(d) = q[(1-q)\tilde f'(r) - (1-p)s\tilde f'(s)]` (see :mod:`.generic`).  The lower root is the upper
root of the mirrored token (swap :math:`\log p` and :math:`\log(1-p)`): :math:`\log r_{lo} = \log s` there.

Saturation is decided first and exactly: :math:`r_{up} = 1/p` iff
:math:`G(\infty) = \Phi(1/p) + (1-p)\tilde f(0) \le \delta`, and then :math:`\log r_{up} = -\log p` exactly;
likewise :math:`\log r_{lo} = -\infty` iff the mirrored :math:`G(\infty) \le \delta`.

The root is polished by Newton steps chosen by side: from inside (:math:`G \le \delta`) a plain Newton step on
:math:`G - \delta`, from outside a Newton step on :math:`\log G - \log\delta` (exact for exponential growth,
and lands inside when :math:`\log G` is concave); every step is kept inside the bracket of the inside and
outside points seen so far, else replaced by bisection (geometric when the bracket spans a factor > 4, and
by quadrupling while no outside point is known).  Iteration stops once a step is below ``1e-10`` relative
(Newton's quadratic convergence then leaves ~1e-20).  The start is the small-δ root of
:math:`G \approx p(1-p)(\kappa d + \tfrac12 \tilde f''(1) d^2)` (:math:`\kappa` the kink of TV).

At :math:`p = 1` the perspective convention of :mod:`bandcore.oracle` gives :math:`\log r_{up} = 0` and the
lower root of :math:`\tilde f(s) + (1-s)\sigma_\infty = \delta` (:math:`\sigma_\infty = \Phi(\infty)`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import sympy as sp

from ..divergences import Divergence
from .generic import FAR_X, TAYLOR_RADIUS, UU, GeneratorFunctions, L, SideFunction, T, X, Y, generator_functions

__all__ = ["MAX_ITERATIONS", "band_log", "p_one_lower"]

#: Cap on Newton/bisection iterations (the solver stops each token as soon as it has converged).
MAX_ITERATIONS = 200
#: Relative size of the last Newton step at which a token is converged.
STEP_TOLERANCE = 1e-10
#: Upper end of the bracket of the offset d before any evaluation.
D_MAX = 1e308
#: The start is capped at logit q = Q_NEAR_ONE (q = 1 - 4e-18).
Q_NEAR_ONE = 40.0
#: Below this log p the solver's p is (near-)subnormal: r, s and q are then built from logarithms.
LOG_P_TINY = -700.0


@dataclass(frozen=True)
class NumpyFunctions:
    gf: GeneratorFunctions
    phi_r: Callable
    dphi_r: Callable
    f_s: Callable
    k_s: Callable


def _vectorise(fn: SideFunction) -> Callable:
    closed = sp.lambdify((X, L, UU), fn.closed, "numpy", cse=True)
    taylor = None if fn.taylor is None else sp.lambdify(X, fn.taylor, "numpy")
    far = None if fn.far is None else sp.lambdify((T, Y, L), fn.far, "numpy", cse=True)

    def evaluate(x: np.ndarray, log_u: np.ndarray, u: np.ndarray) -> np.ndarray:
        value = closed(x, log_u, u) + np.zeros_like(x)  # broadcast constants
        if taylor is not None:
            value = np.where(np.abs(x) < TAYLOR_RADIUS, taylor(x), value)
        if far is not None:
            value = np.where(x > FAR_X, far(1.0 / u, 1.0 - 1.0 / u, log_u), value)
        if fn.at_infinity is not None:
            value = np.where((u == np.inf) & np.isnan(value), fn.at_infinity, value)  # e.g. 0*log(inf)
        return value

    return evaluate


@lru_cache(maxsize=128)
def numpy_functions(divergence: str | Divergence) -> NumpyFunctions:
    """The divergence's four functions vectorised with NumPy (cached)."""
    gf = generator_functions(divergence)
    return NumpyFunctions(gf, *(_vectorise(fn) for fn in gf.functions))


# ------------------------------------------------------------------------------------------------------------
# G(d) and G'(d)
# ------------------------------------------------------------------------------------------------------------


def _cells(lp, lq, p, pc, d):
    """(x_r, L_r, r, x_s, L_s, s, q) at offset d; every quantity without cancellation."""
    den = p + np.exp(-d) / -np.expm1(-d)  # (1 + pE)/E = p + 1/E, 1/E = e^{-d}/(1 - e^{-d}): no overflow
    x_r = pc / den  # r - 1 = (1-p)E/(1+pE)
    x_s = -p / den  # s - 1 = -pE/(1+pE)
    b = lp + d
    a = np.logaddexp(lq, b)  # log(1 + pE) = log((1-p) + p e^d)
    tiny = (lp < LOG_P_TINY) & (b > -40.0)  # p subnormal: build from logs
    # log r = d - a, without forming lp + d - lp when d >> |lp|
    log_r_tiny = np.where(b > lq, -lp - np.log1p(np.exp(lq - b)), d - lq - np.log1p(np.exp(b - lq)))
    x_r = np.where(tiny, np.expm1(log_r_tiny), x_r)
    x_s = np.where(tiny, np.expm1(-a), x_s)
    log_r = np.where(tiny, log_r_tiny, np.log1p(x_r))
    far = x_s < -0.5
    log_s = np.where(far, -a, np.log1p(x_s))  # log s = -log(1+pE)
    r = 1.0 + x_r
    s = np.where(far, np.exp(log_s), 1.0 + x_s)
    q = np.where(lp < LOG_P_TINY, np.exp(lp + log_r), p * r)  # q = p r
    return x_r, log_r, r, x_s, log_s, s, q


def _g_and_slope(fns: NumpyFunctions, lp, lq, p, pc, d):
    x_r, log_r, r, x_s, log_s, s, q = _cells(lp, lq, p, pc, d)
    one_minus_q = pc * s  # 1 - q = (1-p) s
    g = q * fns.phi_r(x_r, log_r, r) + pc * fns.f_s(x_s, log_s, s)  # p f(r) = q f(r)/r
    slope = q * (one_minus_q * fns.dphi_r(x_r, log_r, r) - pc * fns.k_s(x_s, log_s, s))
    return g, slope


def _g_saturated(fns: NumpyFunctions, lp, pc):
    """G(d = inf) = Phi(1/p) + (1-p) f(0): the upper ratio saturates at 1/p iff this is <= delta."""
    gf = fns.gf
    normal = lp >= LOG_P_TINY
    with np.errstate(all="ignore"):
        x = np.where(normal, np.expm1(-lp), 0.0)  # 1/p - 1
        phi = np.where(normal, fns.phi_r(x, -lp, 1.0 + x), gf.slope_at_infinity)
    rest = pc * gf.f_at_zero if np.isfinite(gf.f_at_zero) else np.where(pc > 0, np.inf, 0.0)
    return phi + rest


def _start(gf: GeneratorFunctions, p, pc, delta):
    """Small-δ root of G ≈ p(1-p)(κ d + f''(1) d²/2)."""
    c = p * pc
    if gf.f2 > 0:
        return (np.sqrt(gf.kink**2 + 2.0 * gf.f2 * delta / c) - gf.kink) / gf.f2
    if gf.kink > 0:
        return delta / (gf.kink * c)
    return np.ones_like(p)


def _solve_offset(fns: NumpyFunctions, lp, lq, delta):
    """Root d of G(d) = delta for each (lp, lq) (all non-saturated); returns (d, iterations used)."""
    p, pc = np.exp(lp), np.exp(lq)
    with np.errstate(all="ignore"):
        d = _start(fns.gf, p, pc, delta)
    d_cap = np.maximum(Q_NEAR_ONE + lq - lp, Q_NEAR_ONE)  # theta = 40: q = 1 - 4e-18, G ~ G(inf)
    d = np.where(np.isfinite(d) & (d > 0), np.minimum(d, d_cap), d_cap)
    state = (np.zeros_like(d), np.full_like(d, D_MAX), np.full_like(d, np.nan), np.full_like(d, np.nan))
    result = d.copy()
    active = np.arange(d.size)
    iterations = 0
    while active.size and iterations < MAX_ITERATIONS:
        iterations += 1
        with np.errstate(all="ignore"):
            g, slope = _g_and_slope(fns, lp, lq, p, pc, d)
            d, state, converged = _step(g, slope, d, state, delta)
        result[active] = d
        keep = ~converged
        active = active[keep]
        lp, lq, p, pc, d = (v[keep] for v in (lp, lq, p, pc, d))
        state = tuple(v[keep] for v in state)
    return result, iterations


def _step(g, slope, d, state, delta):
    """One safeguarded step for arrays; returns (next d, next state, converged).

    ``state = (lo, hi, d_prev, g_prev)``: the bracket [lo, hi] (G(lo) <= delta < G(hi)) and the previous
    point.  Three Newton variants are exact for three shapes of G: plain Newton on G (G linear in d), on
    log G (G exponential in d), on log G vs log d (G a power of d).  The one whose local model best
    predicts G at the previous point is taken (the power one on the first step); a candidate outside the
    bracket, or one that does not shrink the step once bracketed, is replaced by a (geometric) bisection.
    """
    lo, hi, d_prev, g_prev = state
    inside = g <= delta
    lo = np.where(inside, np.maximum(lo, d), lo)
    hi = np.where(inside, hi, np.minimum(hi, d))
    rate = slope / g  # d log G / dd
    log_ratio = np.log(delta / g)
    linear = d + (delta - g) / slope
    exponential = d + log_ratio / rate
    power = d * np.exp(log_ratio / (rate * d))
    # how well each local model through (d, g) predicts the previous point
    log_seen = np.log(g_prev / g)
    error_linear = np.abs(np.log1p(rate * (d_prev - d)) - log_seen)
    error_exponential = np.abs(rate * (d_prev - d) - log_seen)
    error_power = np.abs(rate * d * np.log(d_prev / d) - log_seen)
    error_linear = np.where(np.isnan(error_linear), np.inf, error_linear)
    error_exponential = np.where(np.isnan(error_exponential), np.inf, error_exponential)
    candidate = np.where(error_linear < error_exponential, linear, exponential)
    best = np.minimum(error_linear, error_exponential)
    candidate = np.where(np.isnan(error_power) | (error_power <= best), power, candidate)
    # False for NaN; a step from an overflowed G or slope (inf) says nothing about convergence
    converged = (np.abs(candidate - d) <= STEP_TOLERANCE * d) & np.isfinite(g) & np.isfinite(slope)
    shrinking = (hi >= D_MAX) | ~(np.abs(candidate - d) > 0.5 * np.abs(d - d_prev))
    ok = converged | ((candidate > lo) & (candidate < hi) & shrinking)
    floor = np.where(lo > 0, lo, np.minimum(1.0, 0.125 * hi))  # d ~ 1 is the natural scale of a logit
    middle = np.where(hi > 4.0 * floor, np.sqrt(floor) * np.sqrt(hi), 0.5 * (lo + hi))
    candidate = np.where(ok, candidate, middle)
    converged |= (hi - lo) <= 4e-16 * hi
    return candidate, (lo, hi, d, g), converged


def _upper_root(fns: NumpyFunctions, lp, lq, delta, exact_one_over_p):
    """(root offset d, saturated mask) of the upper root for each (lp, lq); d = inf where saturated.

    ``exact_one_over_p`` marks tokens whose r_up is taken as 1/p without solving: those with
    1 - p < e^-700, where 1/p - r_up = (1-q)/p is below 1e-300 * s with f(s) ~ delta/(1-p) > 1e290, so
    log r_up = -log p to the last bit.
    """
    saturated = exact_one_over_p | (_g_saturated(fns, lp, np.exp(lq)) <= delta)
    d = np.full_like(lp, np.inf)
    solve = ~saturated
    d[solve], _ = _solve_offset(fns, lp[solve], lq[solve], delta)
    return d, saturated


def _log_ratios(lp, lq, d):
    """(log r, log s) at offset d."""
    p = np.exp(lp)
    with np.errstate(all="ignore"):
        _, log_r, _, _, log_s, _, _ = _cells(lp, lq, p, np.exp(lq), d)
    return log_r, log_s


@lru_cache(maxsize=256)
def p_one_lower(divergence: str | Divergence, delta: float) -> float:
    r"""log r_lo at p = 1: the root of :math:`\tilde f(s) + (1-s)\sigma_\infty = \delta`, s < 1.

    In :math:`w = -\log s`: :math:`G_1(w) = \tilde f(s) + (1-s)\sigma_\infty`,
    :math:`G_1'(w) = -s\tilde f'(s) + s\sigma_\infty`; same safeguarded Newton as the main solver.
    ``-inf`` when it saturates (:math:`\tilde f(0) + \sigma_\infty \le \delta`), 0 when
    :math:`\sigma_\infty = \infty` (no ratio below 1 is reachable: e.g. reverse KL).
    """
    fns = numpy_functions(divergence)
    gf = fns.gf
    sigma = gf.slope_at_infinity
    if not np.isfinite(sigma):
        return 0.0
    if gf.f_at_zero + sigma <= delta:
        return -np.inf

    def g_and_slope(w: float) -> tuple[float, float]:
        x, log_s = np.array([np.expm1(-w)]), np.array([-w])
        s = np.exp(log_s)
        g = fns.f_s(x, log_s, s)[0] - x[0] * sigma
        return g, -fns.k_s(x, log_s, s)[0] + s[0] * sigma

    w = np.sqrt(2.0 * delta / gf.f2) if gf.f2 > 0 else delta / max(gf.kink, 1.0)
    lo, hi = 0.0, np.inf
    with np.errstate(all="ignore"):
        for _ in range(MAX_ITERATIONS):
            g, slope = g_and_slope(w)
            if g <= delta:
                lo, step = w, (delta - g) / slope
            else:
                hi, step = w, -np.log(g / delta) * g / slope
            candidate = w + step
            if abs(step) <= STEP_TOLERANCE * candidate and np.isfinite(g) and np.isfinite(slope):
                return -float(candidate)
            if not np.isfinite(candidate) or not lo < candidate < hi:
                candidate = (lo + hi) / 2 if np.isfinite(hi) else 4 * max(w, 1.0)
            w = candidate
    return -float(w)


def band_log(divergence: str | Divergence, old_log_prob: np.ndarray, delta: float) -> tuple[np.ndarray, np.ndarray]:
    r"""(log r_lo, log r_up) of the Band for a float64 array of log-probabilities (NumPy reference).

    KL goes to the specialised kernel :func:`.kl.band_log_numpy`, TV and Pearson to their closed forms
    (:mod:`.closed`), every other divergence to the solver above.

    Kernel conventions (the public :func:`bandcore.band_log` checks its inputs before calling this):
    NaN or :math:`\log p > 0` in → NaN out; :math:`\log p = -\infty` → :math:`(-\infty, +\infty)`;
    :math:`\log p = 0` → :math:`(\log r_{lo}(1), 0)` with :func:`p_one_lower`.
    """
    from . import closed, kl

    if kl.is_kl(divergence):  # the specialised Halley kernel
        return kl.band_log_numpy(old_log_prob, delta)
    kind = closed.closed_form_kind(divergence)
    if kind is not None:  # tv, pearson: closed forms
        return closed.band_log_numpy(kind, old_log_prob, delta)
    with np.errstate(all="ignore"):
        return _band_log(numpy_functions(divergence), old_log_prob, delta)


def _band_log(fns: NumpyFunctions, old_log_prob, delta):
    lp_all = np.asarray(old_log_prob, dtype=np.float64)
    shape = lp_all.shape
    lp_all = lp_all.ravel()
    lower = np.full(lp_all.shape, np.nan)
    upper = np.full(lp_all.shape, np.nan)
    regular = (lp_all < 0) & (lp_all > -np.inf)
    lp = lp_all[regular]
    lq = np.log(-np.expm1(lp))  # log(1-p) = log(-expm1(log p)), exact near p = 1
    # one solve for both roots: rows [0, n) are the tokens, rows [n, 2n) their mirrors (p <-> 1-p)
    both_lp = np.concatenate([lp, lq])
    both_lq = np.concatenate([lq, lp])
    n = lp.size
    force = np.concatenate([lq < LOG_P_TINY, np.zeros(n, dtype=bool)])  # only upper roots (first half)
    d, saturated = _upper_root(fns, both_lp, both_lq, delta, force)
    log_r, log_s = _log_ratios(both_lp, both_lq, d)
    # saturated: r_up = 1/p exactly; else r_up <= 1/p (a rounding excess near q = 1 is cut)
    upper[regular] = np.where(saturated[:n], -lp, np.minimum(log_r[:n], -lp))
    lower[regular] = np.where(saturated[n:], -np.inf, log_s[n:])  # mirror: log r_lo = log s'
    lower[lp_all == -np.inf] = -np.inf
    upper[lp_all == -np.inf] = np.inf
    at_one = lp_all == 0
    if at_one.any():
        lower[at_one] = p_one_lower(fns.gf.divergence, float(delta))
        upper[at_one] = 0.0
    return lower.reshape(shape), upper.reshape(shape)
