r"""The pieces a lookup table needs from a generator: a stable :math:`g_f`, the bounds' slopes, saturation.

The pieces live in the coordinate :math:`x = \operatorname{logit} p = \log p - \log(1-p)`, which stretches both
ends (:math:`x \approx \log p` for small :math:`p`, :math:`x \approx -\log(1-p)` near 1); then
:math:`\log p = -\operatorname{softplus}(-x)` and :math:`\log(1-p) = -\operatorname{softplus}(x)` exactly.

With :math:`y = \log r` and :math:`t_s = s - 1 = -e^{x}\,\mathrm{expm1}(y)` (since
:math:`s = (1-pr)/(1-p)` and :math:`p/(1-p) = e^x`),

.. math::  g_f = p\,A(y) + (1-p)\,T(t_s), \qquad A(y) = \tilde f(e^y), \quad T(t) = \tilde f(1+t),

where :math:`A`, :math:`T`, :math:`B(y) = e^y \tilde f'(e^y)` and :math:`T'(t) = \tilde f'(1+t)` are the
cancellation-free closed forms of :mod:`bandcore.derive.codegen.table_pieces` (where one of them fails a 50-digit probe,
the solvers' form instead: :func:`_accurate`).  Implicit differentiation of
:math:`g_f(p, r) = \delta` along the root gives the exact slope used by the Hermite interpolants,

.. math::  \frac{dy}{dx} = -\frac{(1-p)\,[A(y) - T(t_s)] - T'(t_s)\,\mathrm{expm1}(y)}{B(y) - e^{y}\,T'(t_s)},
           \qquad \frac{dr}{dx} = e^{y}\,\frac{dy}{dx},

from :math:`\partial_r g = p[\tilde f'(r) - \tilde f'(s)]`,
:math:`\partial_p g = \tilde f(r) - \tilde f(s) + \tilde f'(s)(1-r)/(1-p)` and :math:`dp/dx = p(1-p)`.
Tables interpolate in :math:`L = -\log p`; since :math:`dx/dL = -1/(1-p)`,

.. math::  \frac{dy}{dL} = -\frac{1}{1-p}\,\frac{dy}{dx}, \qquad 1 - p = -\mathrm{expm1}(-L).

**Above r = 1** (upper bounds) the token's term is evaluated as :math:`p\,A(y) = q\,\Phi(r)` with
:math:`q = e^{y + \log p} \le 1` and :math:`\Phi(u) = \tilde f(u)/u`, and the slope with numerator and
denominator divided by :math:`e^y`,

.. math::  \frac{dy}{dx} = -\frac{(1-p)\,[\Phi(r) - e^{-y}T(t_s)] + T'(t_s)\,\mathrm{expm1}(-y)}
           {\tilde f'(r) - T'(t_s)},

where :math:`\Phi` and :math:`\tilde f'` are the solvers' cancellation- and overflow-free forms
(:func:`bandcore.kernels.vectorised.generator_functions` of the generic plan, with a branch in :math:`1/u` for
:math:`u > 2`).
The closed form :math:`A(y)` overflows long before :math:`q\Phi(r)` does: Le Cam's
:math:`\mathrm{expm1}(y)^2/(e^y + 1)` is infinite for :math:`y > 355` although :math:`r_{up} \approx q_0/p`
needs :math:`y` up to 680, so a root there was found where :math:`g_f` read ``inf`` instead of :math:`\le\delta`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import mpmath as mp
import numpy as np

from ..derive.generator_facts.mpmath_g import g_mp, mp_generator
from ..divergences import Divergence, resolve

__all__ = ["GeneratorPieces", "bisection_band_log", "log_p_of_x", "pieces", "saturation_threshold", "x_of_log_p"]


def x_of_log_p(log_p: np.ndarray) -> np.ndarray:
    """:math:`x = \\log p - \\log(1-p)` with :math:`\\log(1-p) = \\log(-\\mathrm{expm1}(\\log p))`."""
    with np.errstate(divide="ignore"):
        return log_p - np.log(-np.expm1(log_p))


def log_p_of_x(x: np.ndarray) -> np.ndarray:
    """:math:`\\log p = -\\operatorname{softplus}(-x) = -\\mathrm{logaddexp}(0, -x)`."""
    return -np.logaddexp(0.0, -np.asarray(x, dtype=np.float64))


@dataclass(frozen=True)
class GeneratorPieces:
    r"""Vectorised :math:`A, B, T, T'` of one divergence (see the module docstring), :math:`\tilde f(0)`, and
    :math:`\Phi(u) = \tilde f(u)/u`, :math:`\tilde f'(u)` for :math:`u \ge 1` as functions of
    ``(u - 1, log u, u)``."""

    A: Callable
    B: Callable
    T: Callable
    Tp: Callable
    f_at_zero: float
    phi_r: Callable
    dphi_r: Callable

    def g(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        r""":math:`g_f(p, e^y)` at :math:`x = \operatorname{logit} p`; ``y = -inf`` is r = 0."""
        with np.errstate(all="ignore"):
            log_p = log_p_of_x(x)
            p, one_minus_p = np.exp(log_p), np.exp(log_p_of_x(-x))
            t_s = np.maximum(-np.exp(x) * np.expm1(y), -1.0)  # s - 1 = -(p/(1-p))·expm1(y), s >= 0
            below = p * np.where(np.isneginf(y), self.f_at_zero, self.A(np.minimum(y, 0.0)))
            above = np.exp(y + log_p) * self.phi_r(np.expm1(y), y, np.exp(y))  # p·A(y) = q·Φ(r)
            return np.where(y > 0, above, below) + one_minus_p * self.T(t_s)

    def dy_dx(self, x: np.ndarray, y: np.ndarray, kink: np.ndarray | bool = False) -> np.ndarray:
        r"""Slope of a root :math:`y = \log r(x)` of :math:`g_f = \delta` (implicit differentiation).

        Where ``kink`` is true the point is the saturation threshold itself and the slope is the unsaturated
        branch's (one-sided), not the saturated :math:`-(1-p)`.
        """
        with np.errstate(all="ignore"):
            one_minus_p = np.exp(log_p_of_x(-x))
            em1 = np.expm1(y)
            t_s = np.maximum(-np.exp(x) * em1, -1.0)
            tp = self.Tp(t_s)
            y0 = np.minimum(y, 0.0)
            below = -(one_minus_p * (self.A(y0) - self.T(t_s)) - tp * np.expm1(y0)) / (self.B(y0) - np.exp(y0) * tp)
            # above r = 1: numerator and denominator divided by e^y (no e^y·e^y overflow)
            e_neg = np.exp(-y)
            num = one_minus_p * (self.phi_r(em1, y, np.exp(y)) - e_neg * self.T(t_s)) + tp * np.expm1(-y)
            above = -num / (self.dphi_r(em1, y, np.exp(y)) - tp)
            # f'(s) -> -inf as s -> 0 (Hellinger, alpha < 1): the T' terms dominate, dy/dx -> expm1(-y)
            above = np.where(np.isinf(tp), np.expm1(-y), above)
            slope = np.where(y > 0, above, below)
            # s = 0 to double precision (t_s = -1): y = -log p to the last bit, so dy/dx = -(1-p)
            return np.where((t_s <= -1.0) & ~np.asarray(kink, dtype=bool), -one_minus_p, slope)

    def dr_dx(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        r"""Slope of a root in ratio form, :math:`dr/dx = -(1-p)\,\partial_p g / (p^{-1}\partial_r g)`; valid at
        r = 0 (``y = -inf``), with :math:`r - 1 = \mathrm{expm1}(y)` exact near r = 1 (lower bounds: r <= 1)."""
        with np.errstate(all="ignore"):
            one_minus_p = np.exp(log_p_of_x(-x))
            r_minus_1 = np.expm1(y)
            t_s = np.maximum(-np.exp(x) * r_minus_1, -1.0)
            tp = self.Tp(t_s)
            num = one_minus_p * (self.T(r_minus_1) - self.T(t_s)) - tp * r_minus_1
            return -num / (self.Tp(r_minus_1) - tp)

    def slope_in_L(self, L: np.ndarray, y: np.ndarray, ratio: bool = False, kink=False) -> np.ndarray:
        r""":math:`dy/dL` (or :math:`dr/dL` with ``ratio``) of a root at :math:`L = -\log p`, from the x-slopes
        (``kink``: see :meth:`dy_dx`)."""
        x = x_of_log_p(-np.asarray(L, dtype=np.float64))
        with np.errstate(all="ignore"):
            slope = self.dr_dx(x, y) if ratio else self.dy_dx(x, y, kink)
            return slope / np.expm1(-L)  # dx/dL = -1/(1-p) and 1 - p = -expm1(-L)


@lru_cache(maxsize=64)
def pieces(div: Divergence) -> GeneratorPieces:
    """The stable vectorised pieces of a divergence's normalised generator (cached)."""
    from ..derive import solver_plan  # SymPy: only when a table is built or checked
    from ..derive.codegen.table_pieces import table_pieces
    from ..kernels.ops import numpy_ops
    from ..kernels.vectorised import generator_functions

    side = generator_functions(solver_plan(div, generic=True), numpy_ops)
    closed = table_pieces(div)
    fallback = _solver_forms(side)
    chosen = []
    for name, form in zip("ABTP", closed[:4], strict=True):
        if not _accurate(name, form, div):
            form = fallback[name]
            if not _accurate(name, form, div):
                raise ValueError(
                    f"{div.name}: no float64 form of the table piece {name} (module docstring) agrees with the "
                    f"50-digit generator at t = s - 1 in {PROBE_T.tolist()} (overflow of an intermediate, e.g. "
                    "cosh(u - 1) "
                    "inside a logarithm at u > 711): the exact solver would be wrong there, so no table is built"
                )
        chosen.append(form)
    return GeneratorPieces(*chosen, closed[4], phi_r=side["phi_r"], dphi_r=side["dphi_r"])


#: where each piece is checked against the 50-digit generator: t = s - 1 (T, T'), and y = log(1 + t), t < 0 (A, B)
PROBE_T = np.array([-0.9, -0.3, -0.05, -1e-3, -1e-5, 1e-5, 1e-3, 0.05, 0.3, 2.0, 1e3])
#: relative error above which a closed form of :mod:`bandcore.derive.codegen.table_pieces` is replaced: a gross
#: failure (the catalogue's closed forms cancel to at most 2e-5 at t = 1e-5, and their tables certify; keeping
#: them keeps the shipped tables' bytes)
PROBE_TOLERANCE = 1e-3


def _solver_forms(side: dict[str, Callable]) -> dict[str, Callable]:
    r"""A, B, T, T' from the solvers' cancellation-free functions (Taylor branches near :math:`u = 1`):
    :math:`\tilde f = ` ``f_s`` and :math:`u\tilde f' = ` ``k_s`` for :math:`u \le 1`, :math:`u\Phi` and
    ``dphi_r`` above."""
    f_s, k_s, phi_r, dphi_r = side["f_s"], side["k_s"], side["phi_r"], side["dphi_r"]

    def T(t):
        t = np.asarray(t, dtype=np.float64)
        with np.errstate(all="ignore"):
            x, lu, u = t, np.log1p(t), 1.0 + t
            return np.where(t <= 0, f_s(x, lu, u), u * phi_r(x, lu, u))

    def P(t):
        t = np.asarray(t, dtype=np.float64)
        with np.errstate(all="ignore"):
            x, lu, u = t, np.log1p(t), 1.0 + t
            return np.where(t <= 0, k_s(x, lu, u) / u, dphi_r(x, lu, u))

    def A(y):
        y = np.asarray(y, dtype=np.float64)
        with np.errstate(all="ignore"):
            return f_s(np.expm1(y), y, np.exp(y)) * np.ones_like(y)

    def B(y):
        y = np.asarray(y, dtype=np.float64)
        with np.errstate(all="ignore"):
            return k_s(np.expm1(y), y, np.exp(y)) * np.ones_like(y)

    return {"A": A, "B": B, "T": T, "P": P}


def _accurate(name: str, fn: Callable, div: Divergence) -> bool:
    r"""Whether the closed form ``fn`` (A, B, T or T' = ``P``) agrees with the 50-digit :math:`\tilde f` to
    :data:`PROBE_TOLERANCE` at :data:`PROBE_T`.  SymPy's simplified closed forms may cancel near :math:`u = 1`
    (to about 1e-5 relative at :math:`t = 10^{-5}`: harmless, the tables certify), overflow
    (:math:`\log\cosh t` for :math:`t > 710`) or take the square root of a negative number
    (:math:`t/|\sqrt{t}|` for :math:`|u - 1|^{3/2}`: NaN for :math:`u < 1`); where one fails grossly, the
    solvers' form replaces it."""
    gen = mp_generator(div)
    t = PROBE_T if name in "TP" else PROBE_T[PROBE_T < 0]
    with np.errstate(all="ignore"):
        got = np.asarray(fn(t if name in "TP" else np.log1p(t)), dtype=np.float64)
    with mp.workdps(50):
        want = []
        for tv in t:
            u = 1 + mp.mpf(float(tv))
            if name in "AT":
                want.append(float(gen(u)))
            else:
                d = mp.re(mp.diff(gen.f_tilde, u))
                want.append(float(d * u if name == "B" else d))
    want = np.array(want)
    with np.errstate(all="ignore"):
        err = np.abs(got - want) / np.maximum(np.abs(want), 1e-300)
    # where f~ itself exceeds float64 (e^999), g_f is +inf or NaN and the solver's test g_f <= delta is false
    # either way, as it should be: only representable values are compared
    ok = ~np.isfinite(want) | (np.isfinite(got) & ((err <= PROBE_TOLERANCE) | (got == want)))
    return bool(np.all(ok))


def saturation_threshold(div: Divergence, delta: float, side: str, L_range: tuple[float, float]):
    """The :math:`L^* = -\\log p^*` where ``side`` (``"upper"``/``"lower"``) starts to saturate (50-digit bisection).

    The upper bound is saturated (:math:`r = 1/p`) iff :math:`g_f(p, 1/p) \\le \\delta`, for :math:`L \\le L^*`;
    the lower one (:math:`r = 0`) iff :math:`g_f(p, 0) \\le \\delta`, for :math:`L \\ge L^*`.  Returns ``None``
    when the side never saturates in ``L_range``, ``"all"`` when it saturates on all of it.
    """
    if pieces(div).f_at_zero == float("inf"):
        return None

    def saturated(L: float) -> bool:
        with mp.workdps(50):
            log_p = -mp.mpf(L)
            y = -log_p if side == "upper" else mp.ninf
            return bool(g_mp(div, log_p, y) <= mp.mpf(delta))

    lo, hi = L_range
    at_lo, at_hi = saturated(lo), saturated(hi)
    if at_lo == at_hi:
        return "all" if at_lo else None
    inside, outside = (lo, hi) if side == "upper" else (hi, lo)
    for _ in range(2000):
        mid = (inside + outside) / 2
        if mid in (inside, outside):
            break
        if saturated(mid):
            inside = mid
        else:
            outside = mid
    return inside


# --------------------------------------------------------------------------------------------------------
# The tables' exact solver
# --------------------------------------------------------------------------------------------------------


def _bisect_bits(inside_fn, n: int, upper_limit: np.ndarray) -> np.ndarray:
    """Largest m in [0, upper_limit] (float64, bit-exact) with inside_fn(m) true; inside_fn is monotone."""
    lo = np.zeros(n, dtype=np.int64)  # the bits of 0.0 (inside)
    hi = upper_limit.astype(np.float64).view(np.int64).copy()
    for _ in range(64):
        mid = lo + (hi - lo + 1) // 2
        ok = inside_fn(mid.view(np.float64))
        lo = np.where(ok, mid, lo)
        hi = np.where(ok, hi, mid - 1)
    return lo.view(np.float64)


def bisection_band_log(old_log_prob, divergence, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """(log r_lo, log r_up) by bisection on the float64 bit patterns of :math:`\\pm\\log r` (64 steps each).

    Exact to the last bit of the stable :math:`g_f` (:class:`GeneratorPieces`); slow (128 evaluations of
    :math:`g_f`) but vectorised.  Tables are built and certified against it: being a different algorithm from
    the fast backends, it also cross-checks them.  Catalogue generators whose :math:`\\tilde f` overflows in
    float64 at extreme :math:`s` (e.g. Neyman as :math:`p \\to 1`) are not supported here.
    """
    parts = pieces(resolve(divergence))  # a reference for tests: any spelling
    log_p = np.asarray(old_log_prob, dtype=np.float64)
    shape = log_p.shape
    log_p = log_p.ravel()
    x = x_of_log_p(log_p)
    n = log_p.size
    upper = _bisect_bits(lambda m: parts.g(x, m) <= delta, n, -log_p)
    lower = -_bisect_bits(lambda m: parts.g(x, -m) <= delta, n, np.full(n, np.inf))
    return lower.reshape(shape), upper.reshape(shape)
