r"""Limits of the Band as :math:`p \to 0, 1` at fixed δ, and its small-δ series.

**Limits.**  For fixed :math:`r`, :math:`g_f(p, r) \to 0` as :math:`p \to 0`, so every :math:`r > 1` is eventually
feasible: :math:`r_{up} \to \infty`, :math:`r_{lo} \to 0` (or both sides saturate).  The new probability
:math:`q_{up} = p\,r_{up}` tends to the root :math:`q_0` of

.. math::  q\,\sigma_\infty + \tilde f(1 - q) = \delta, \qquad \sigma_\infty = \lim_{u\to\infty} \tilde f(u)/u,

and :math:`r_{up} \le 1/p` gives :math:`r_{up} \to 1` as :math:`p \to 1`; the mirror symmetry
:math:`q_{lo}(p) = 1 - q_{up}(1 - p)` gives :math:`r_{lo}(1^-) = 1 - q_0`.

**Series** (reversion of :math:`g_f(p, 1 + x) = \delta`, :math:`f_k = f^{(k)}(1)`):

.. math::  r = 1 + t + a_2 t^2 + a_3 t^3 + O(t^4), \quad t = \pm\sqrt{\frac{2\delta(1-p)}{p f_2}}, \quad
           a_2 = -\frac{f_3 (1-2p)}{6 f_2 (1-p)}, \quad
           a_3 = \frac{5 f_3^2 (1-2p)^2 - 3 f_2 f_4 (1 - 3p + 3p^2)}{72 f_2^2 (1-p)^2}.

A kink at :math:`u = 1` (total variation) makes :math:`f''(1) = 0`; the Band is then linear in δ,
:math:`r = 1 \pm \delta/(pJ)` with the slope jump :math:`J = f'(1^+) - f'(1^-)`.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import mpmath as mp
import sympy as sp

from ..generator_facts.budget import bounded
from ..generator_facts.symbolic import Facts, U
from .reduction import DELTA, P, Q, on_side
from .roots import SIMPLIFY_SECONDS, SOLVE_SECONDS, solve_closed, tidy
from .validate import DELTA_GRID, DPS, MATCH, evaluate, find_root, lambdify_mp

__all__ = ["LIMIT_KEYS", "asymptotic_root", "limits", "series", "series_coefficients"]

#: The limits a :class:`~bandcore.derive.Derivation` reports.
LIMIT_KEYS = ("upper_p0", "q_upper_p0", "upper_p1", "lower_p0", "lower_p1")
_LIMIT_SECONDS = 4.0


def asymptotic_root(equation: sp.Expr, delta: float) -> Any:
    """q in (0, 1) solving the p → 0 equation q·σ∞ + f̃(1 - q) - δ = 0 (``equation``, increasing in q)."""
    with mp.workdps(DPS):
        fn = lambdify_mp((Q, DELTA), equation)
        if fn is None:
            raise ValueError("the p → 0 equation could not be compiled for mpmath")
        d = mp.mpf(delta)
        return find_root(lambda q: mp.re(fn(q, d)), mp.mpf(0), 1 - mp.mpf(10) ** (8 - DPS))


def _close(a: sp.Expr, b: sp.Expr) -> bool:
    for d in (sp.Rational(1, 100), sp.Rational(3, 10)):
        x, y = complex(sp.N(a.subs(DELTA, d), 30)), complex(sp.N(b.subs(DELTA, d), 30))
        if abs(x - y) > 1e-20 * max(1.0, abs(y)):
            return False
    return True


def _matches_everywhere(candidate: sp.Expr, equation: sp.Expr, level: sp.Expr) -> bool:
    fn = lambdify_mp(DELTA, candidate)
    if fn is None:
        return False
    with mp.workdps(DPS):
        for d in (d for d in DELTA_GRID if d < float(level) * (1 - 1e-9)):
            value, root = evaluate(fn, d), asymptotic_root(equation, d)
            if value is None or abs(value - root) > MATCH * abs(root):
                return False
    return True


def limits(
    fx: Facts, upper: sp.Expr | None, lower: sp.Expr | None, level: sp.Expr
) -> tuple[dict[str, sp.Expr], sp.Expr | None, list[str]]:
    """(limits by key, the p → 0 equation q·σ∞ + f̃(1 - q) - δ (None when σ∞ = ∞ or not derived), notes)."""
    notes: list[str] = []
    found: dict[str, sp.Expr] = {"upper_p0": sp.oo, "upper_p1": sp.Integer(1), "lower_p0": sp.Integer(0)}
    slope = fx.slope_at_infinity
    below = on_side(fx.f_normalised, "lt")
    equation = None
    q0 = None
    if slope == sp.oo:
        q0 = sp.Integer(0)
        notes.append("p → 0: lim f̃(u)/u = oo, so q_up = p r_up → 0 (while r_up → oo)")
    elif below is not None:
        equation = bounded(lambda: sp.expand(Q * slope + below.subs(U, 1 - Q) - DELTA), SOLVE_SECONDS)
    else:  # piecewise on 0 < u < 1: the equation is solved numerically only
        equation = Q * slope + fx.f_normalised.subs(U, 1 - Q) - DELTA
        notes.append(
            "p → 0: q_up → q₀ with q₀σ∞ + f̃(1 − q₀) = δ; f is piecewise below u = 1, so q₀ is computed "
            "numerically (Derivation.limit_value)"
        )
    if equation is not None and below is not None:
        candidates, solve_notes = solve_closed(equation, Q, "limit q_up(p → 0)")
        for candidate in candidates:
            if _matches_everywhere(candidate, equation, level):
                q0 = tidy(candidate)
                break
        if q0 is None:
            notes.extend(solve_notes)
            notes.append(
                f"p → 0: q_up → q₀ with {sp.sstr(sp.Eq(equation + DELTA, DELTA))}; no closed form, computed "
                "numerically (Derivation.limit_value)"
            )
    if upper is not None and q0 is not None:
        from_closed = bounded(lambda: sp.limit(P * upper, P, 0, "+"), _LIMIT_SECONDS)
        if from_closed is not None and bounded(lambda: _close(from_closed, q0), SIMPLIFY_SECONDS):
            notes.append("p → 0 limit of p·r_up from the closed form agrees with the asymptotic equation")
        elif from_closed is not None:
            notes.append(f"p → 0 limit of p·r_up from the closed form is {sp.sstr(from_closed)} (check)")
    if q0 is not None:
        found["q_upper_p0"] = q0
        found["lower_p1"] = tidy(1 - q0)
        if lower is not None:
            from_closed = bounded(lambda: sp.limit(lower, P, 1, "-"), _LIMIT_SECONDS)
            if from_closed is not None and not bounded(lambda: _close(from_closed, 1 - q0), SIMPLIFY_SECONDS):
                notes.append(f"p → 1 limit of r_lo from the closed form is {sp.sstr(from_closed)} (check)")
    return found, equation, notes


@lru_cache(maxsize=1)
def series_coefficients() -> tuple[sp.Expr, sp.Expr]:
    r"""(a₂, a₃) of :math:`r = 1 + t + a_2 t^2 + a_3 t^3`, :math:`t^2 = 2\delta(1-p)/(p f_2)`, in ``P`` and the
    symbols ``f_2, f_3, f_4``, found by reverting the Taylor series of :math:`g_f(p, 1 + x) = \delta`.

    With :math:`\tilde f(1 + z) = \sum_k f_k z^k/k!` and :math:`s - 1 = -p x/(1 - p)`,
    :math:`g_f(p, 1 + x) = \sum_k c_k x^k`, :math:`c_k = \frac{f_k}{k!}\,[p + (1-p)(-p/(1-p))^k]`.
    """
    c2, c3, c4, t, a2, a3 = sp.symbols("c_2 c_3 c_4 t a_2 a_3")
    x = t + a2 * t**2 + a3 * t**3
    residual = sp.expand(c2 * x**2 + c3 * x**3 + c4 * x**4 - c2 * t**2)  # δ = c₂ t²
    solution = sp.solve([residual.coeff(t, 3), residual.coeff(t, 4)], [a2, a3], dict=True)[0]
    fs = sp.symbols("f_2 f_3 f_4")
    c = {
        ck: fk / sp.factorial(k) * (P + (1 - P) * (-P / (1 - P)) ** k)
        for k, ck, fk in zip((2, 3, 4), (c2, c3, c4), fs, strict=True)
    }
    return sp.factor(solution[a2].subs(c)), sp.factor(solution[a3].subs(c))


_NOT_DERIVED = (sp.nan, sp.nan, sp.nan)


def _flat_note(fx: Facts) -> str:
    """Why a generator without a kink at u = 1 and without a finite positive f''(1) has no small-δ series."""
    sides = fx.one_sided or ((fx.f_prime_1, fx.f2), (fx.f_prime_1, fx.f2))
    curvatures = sides[0][1], sides[1][1]
    if curvatures[0] != curvatures[1]:
        return (
            f"f''(1-) = {sp.sstr(curvatures[0])} and f''(1+) = {sp.sstr(curvatures[1])} differ: the Band's small-δ "
            "expansion differs on the two sides of r = 1; the small-δ series was not derived"
        )
    if all(d == 0 for d in (*fx.derivatives_at_one, *(x for side in sides for x in side[1:]))):
        return (
            "f̃ and its derivatives vanish at u = 1 (f is affine around u = 1, e.g. on [0, γ] for E_γ): g_f = 0 on "
            "an interval around r = 1, so the Band does not shrink to r = 1 as δ → 0; no small-δ series"
        )
    return (
        f"f''(1) = {sp.sstr(fx.f2)} and f has no kink at u = 1: g_f is not quadratic at r = 1, so the Band is "
        "not a series in √δ; the small-δ series was not derived"
    )


def series(fx: Facts) -> tuple[tuple[sp.Expr, sp.Expr, sp.Expr], list[str]]:
    """:math:`(t, a_2, a_3)` of the small-δ series (``nan`` where not derived), with a note."""
    f2, f3, f4 = fx.derivatives_at_one
    if fx.is_smooth_at_one:
        a2, a3 = series_coefficients()
        values = dict(zip(sp.symbols("f_2 f_3 f_4"), (f2, f3, f4), strict=True))
        t = sp.sqrt(2 * DELTA * (1 - P) / (P * f2))
        coefficients = bounded(lambda: (sp.factor(a2.subs(values)), sp.factor(a3.subs(values))), SOLVE_SECONDS)
        if coefficients is None:
            return _NOT_DERIVED, ["small δ: the series coefficients ran past their time budget; not derived"]
        return (t, *coefficients), [
            "small δ: r = 1 + t + a₂t² + a₃t³ + O(t⁴), t = +√(2δ(1−p)/(p f''(1))) for the upper bound, "
            "−√(…) for the lower"
        ]
    left, right = fx.slopes_at_one
    jump = bounded(lambda: sp.simplify(right - left), _LIMIT_SECONDS)
    if jump is None:
        return _NOT_DERIVED, ["small δ: the slope jump of f at u = 1 ran past its time budget; series not derived"]
    if jump == 0:
        return _NOT_DERIVED, [_flat_note(fx)]
    t = DELTA / (P * jump)
    above, below = on_side(fx.f_normalised, "gt"), on_side(fx.f_normalised, "lt")
    linear = above is not None and below is not None and sp.diff(above, U, 2) == 0 and sp.diff(below, U, 2) == 0
    if linear:
        return (t, sp.Integer(0), sp.Integer(0)), [
            f"f''(1) = 0: f has a kink at u = 1 with slope jump J = {sp.sstr(jump)} and is linear on each side, "
            f"so g_f = pJ|r − 1| near 1 and the Band is exactly r = 1 ± δ/(pJ) (no higher terms)"
        ]
    return (t, sp.nan, sp.nan), [
        f"kink at u = 1 with slope jump J = {sp.sstr(jump)}; to first order r = 1 ± δ/(pJ); "
        "the higher coefficients differ on the two sides of the kink and were not derived"
    ]
