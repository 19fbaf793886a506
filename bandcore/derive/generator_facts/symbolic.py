r"""The bridge from the grammar to SymPy, and the facts of a generator that SymPy computes exactly.

:func:`generator` turns a :class:`~bandcore.divergences.Divergence`'s parsed formula into a SymPy expression in
:data:`U` (node by node; nothing is parsed or evaluated by SymPy).  :func:`facts` derives, once per divergence:

* :math:`f'(1)` (the mean of the one-sided slopes at a kink) and the normalised generator
  :math:`\tilde f(u) = f(u) - f'(1)(u - 1) \ge 0`, which has the same divergence and no cancellation;
* :math:`(f''(1), f'''(1), f''''(1))`; ``is_smooth_at_one`` (False for a kink such as total variation);
* :math:`\tilde f(0^+)` (``oo``: the lower bound never saturates) and
  :math:`\sigma_\infty = \lim_{u\to\infty} \tilde f(u)/u` (the cost per unit of mass moved onto one token).

This subpackage is the only code in bandcore that imports SymPy.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any

import mpmath as mp
import sympy as sp

from ...divergences import Divergence
from ...divergences.grammar import Node, evaluate
from .branches import DPS, active_branch, numeric_at_zero, numeric_slope_at_infinity
from .budget import bounded

__all__ = ["Facts", "U", "facts", "generator", "on_side", "to_sympy"]

#: The ratio variable u = π/π_old of every generator.
U = sp.Symbol("u", positive=True)


def _min(*args: sp.Expr) -> sp.Expr:
    return sp.Min(*args)


def _max(*args: sp.Expr) -> sp.Expr:
    return sp.Max(*args)


_NAMESPACE: dict[str, Any] = {
    "number": lambda x: sp.Rational(x.numerator, x.denominator) if isinstance(x, Fraction) else sp.Rational(x),
    "pi": sp.pi, "E": sp.E, "log": sp.log, "exp": sp.exp, "sqrt": sp.sqrt,
    "cbrt": lambda x: sp.Pow(x, sp.Rational(1, 3)), "abs": sp.Abs, "sinh": sp.sinh, "cosh": sp.cosh,
    "tanh": sp.tanh, "asinh": sp.asinh, "acosh": sp.acosh, "atanh": sp.atanh, "min": _min, "max": _max,
    "where": lambda c, a, b: sp.Piecewise((a, c), (b, True)),
    "lt": sp.Lt, "le": sp.Le, "gt": sp.Gt, "ge": sp.Ge,
}


def to_sympy(tree: Node) -> sp.Expr:
    """The SymPy expression of a parsed formula, in :data:`U`."""
    return sp.sympify(evaluate(tree, _NAMESPACE, U))  # sympify of a SymPy object: no parsing happens


def generator(div: Divergence) -> sp.Expr:
    """:math:`f(u)` of a divergence as a SymPy expression in :data:`U`."""
    return _generator(div)


@lru_cache(maxsize=256)
def _generator(div: Divergence) -> sp.Expr:
    return to_sympy(div.tree)


def on_side(expr: sp.Expr, sign: int) -> sp.Expr:
    """``expr`` restricted to u > 1 (``sign`` > 0) or 0 < u < 1: Abs, Min/Max and where() conditions resolved."""
    xs = sp.Symbol("xs", positive=True) if sign > 0 else sp.Symbol("xs", negative=True)
    return sp.piecewise_fold(expr).subs(U, 1 + xs).subs(xs, U - 1)


@dataclass(frozen=True)
class Facts:
    """What SymPy derives about one generator (see the module docstring); ``numeric`` says which facts came
    from the numeric route of :mod:`.branches` instead, and why."""

    f: sp.Expr
    f_prime_1: sp.Expr
    f_normalised: sp.Expr
    derivatives_at_one: tuple[sp.Expr, sp.Expr, sp.Expr]
    f_at_zero: sp.Expr
    slope_at_infinity: sp.Expr
    one_sided: tuple[tuple[sp.Expr, ...], tuple[sp.Expr, ...]] | None = None
    numeric: tuple[str, ...] = ()

    @property
    def f2(self) -> sp.Expr:
        """f''(1): the local curvature (0 for a kink); small-δ bounds are 1 ± sqrt(2δ(1-p)/(p f''(1)))."""
        return self.derivatives_at_one[0]

    @property
    def slopes_at_one(self) -> tuple[sp.Expr, sp.Expr]:
        """(f'(1-), f'(1+)): the one-sided slopes (equal unless f has a kink at u = 1)."""
        if self.one_sided is None:
            return self.f_prime_1, self.f_prime_1
        return self.one_sided[0][0], self.one_sided[1][0]

    @property
    def is_smooth_at_one(self) -> bool:
        """False for generators with a kink at u = 1 (total variation): the Band is then linear in δ; also False
        when f'' is not finite and positive at 1 or differs on the two sides."""
        if self.one_sided is not None and self.one_sided[0][:2] != self.one_sided[1][:2]:
            return False
        return not self.f2.has(sp.DiracDelta) and bool(self.f2.is_finite) and bool(self.f2 > 0)


def facts(div: Divergence) -> Facts:
    """The :class:`Facts` of a divergence; cached per divergence."""
    return _facts(div)


_FACT_SECONDS = 4.0
_X = sp.Symbol("x", positive=True)


def _number(value: sp.Expr | None) -> sp.Expr | None:
    """``value`` if it is a real number or ``oo`` (SymPy may answer a ``Limit``, ``AccumBounds``, ``nan``)."""
    if value is None or value.has(sp.Limit, sp.AccumBounds, sp.nan, sp.zoo, sp.I):
        return None
    if value in (sp.oo, -sp.oo):
        return value
    return value if value.is_number and value.is_real is not False else None


def _simplest(value: sp.Expr) -> sp.Expr:
    """``value`` simplified, unless it is a rational number already."""
    return value if value.is_Rational else sp.simplify(value)


def _side_derivatives(branch: sp.Expr | None, direction: str) -> tuple[sp.Expr, ...] | None:
    """(f', f'', f''', f'''') at u = 1 from one side, on the smooth ``branch`` active there (None: not found)."""
    if branch is None:
        return None
    found = []
    step = _X if direction == "+" else -_X  # u = 1 ± x, x → 0+ (SymPy's limit as u → 1- can get the sign wrong)
    for k in range(1, 5):
        derivative = bounded(lambda k=k: sp.diff(branch, U, k), _FACT_SECONDS)
        if derivative is None:
            return None
        value = _number(bounded(lambda d=derivative: _simplest(d.subs(U, 1)), _FACT_SECONDS))
        if value is None or value in (sp.oo, -sp.oo):
            near = derivative.subs(U, 1 + step)
            value = _number(bounded(lambda near=near: sp.limit(near, _X, 0, "+"), _FACT_SECONDS))
            if value is None:
                return None
            value = bounded(lambda v=value: sp.simplify(v), _FACT_SECONDS) or value
        found.append(value)
    return tuple(found)


def _numeric_derivatives(f: sp.Expr, sign: int) -> tuple[sp.Expr, ...]:
    """One-sided derivatives of f at u = 1 by one-sided finite differences at :data:`~.branches.DPS` digits."""
    fn = sp.lambdify(U, f, "mpmath")
    with mp.workdps(DPS):
        h = mp.mpf(10) ** -25
        values = [mp.re(fn(1 + sign * j * h)) for j in range(5)]
        found = []
        for k in range(1, 5):
            difference = sum((-1) ** (k - j) * mp.binomial(k, j) * values[j] for j in range(k + 1))
            found.append(sp.Float(mp.nstr(difference / (sign * h) ** k, 12), 12))
    return tuple(found)


def _mean(a: sp.Expr, b: sp.Expr) -> sp.Expr:
    """(a + b)/2 of two one-sided values (``oo`` when either is)."""
    if a == b:
        return a
    if sp.oo in (a, b) or -sp.oo in (a, b):
        return sp.oo if -sp.oo not in (a, b) else sp.nan
    return sp.simplify((a + b) / 2)


def _as_sympy(value: Any) -> sp.Expr:
    return sp.oo if value == mp.inf else sp.Float(mp.nstr(value, 30), 30)


def _limit_or_numeric(branch: sp.Expr | None, limit: Any, numeric: Any, what: str, how: str,
                      notes: list[str]) -> sp.Expr:
    """A limit from SymPy on the active ``branch`` (``limit(branch)``), else from ``numeric()`` with a note."""
    found = _number(bounded(lambda: sp.simplify(limit(branch)), _FACT_SECONDS)) if branch is not None else None
    if found is not None:
        return found
    value = numeric()
    if value is None:
        raise ValueError(f"{what} was found neither by SymPy nor numerically")
    why = "the branch active there could not be decided" if branch is None else "SymPy's limit failed or timed out"
    notes.append(f"{what} = {mp.nstr(value, 15)} is numeric ({how}, {DPS} digits): {why}")
    return _as_sympy(value)


@lru_cache(maxsize=256)
def _facts(div: Divergence) -> Facts:
    f = _generator(div)
    numeric: list[str] = []
    sides = []
    for sign, direction in ((-1, "-"), (1, "+")):
        if sides and not f.has(sp.Abs, sp.Min, sp.Max, sp.Piecewise) and not numeric:
            sides.append(sides[0])  # one analytic expression: the same derivatives from both sides
            continue
        derivatives = _side_derivatives(active_branch(f, U, f"1{direction}"), direction)
        if derivatives is None:
            derivatives = _numeric_derivatives(f, sign)
            numeric.append(
                f"the derivatives of f at u = 1{direction} are one-sided finite differences at {DPS} digits (SymPy "
                "could not find them on the branch active there within its time budget)"
            )
        sides.append(derivatives)
    left, right = sides
    f_prime_1 = _mean(left[0], right[0])
    f_normalised = sp.expand_log(f - f_prime_1 * (U - 1), force=True)
    derivatives = tuple(_mean(a, b) for a, b in zip(left[1:], right[1:], strict=True))
    f_tilde = sp.lambdify(U, f_normalised, "mpmath")
    f_at_zero = _limit_or_numeric(
        active_branch(f_normalised, U, "0+"), lambda b: sp.limit(b, U, 0, "+"),
        lambda: numeric_at_zero(f_tilde), "f̃(0+)", "f̃(10⁻ᵏ) at k = 40, 80, 160", numeric,
    )
    slope = _limit_or_numeric(
        active_branch(f_normalised, U, "inf"), lambda b: sp.limit(b / U, U, sp.oo),
        lambda: numeric_slope_at_infinity(f_tilde), "lim f̃(u)/u", "secant slopes of f̃ at u = 10ᵏ, k = 40, 80, 160",
        numeric,
    )
    return Facts(f, f_prime_1, f_normalised, derivatives, f_at_zero, slope, (left, right), tuple(numeric))
