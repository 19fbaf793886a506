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

import sympy as sp

from ..divergences import Divergence, resolve
from ..divergences.grammar import Node, evaluate

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


def generator(divergence: str | Divergence) -> sp.Expr:
    """:math:`f(u)` of a divergence (any spelling) as a SymPy expression in :data:`U`."""
    return _generator(resolve(divergence))


@lru_cache(maxsize=256)
def _generator(div: Divergence) -> sp.Expr:
    return to_sympy(div.tree)


def on_side(expr: sp.Expr, sign: int) -> sp.Expr:
    """``expr`` restricted to u > 1 (``sign`` > 0) or 0 < u < 1: Abs, Min/Max and where() conditions resolved."""
    xs = sp.Symbol("xs", positive=True) if sign > 0 else sp.Symbol("xs", negative=True)
    return sp.piecewise_fold(expr).subs(U, 1 + xs).subs(xs, U - 1)


def _at_one(expr: sp.Expr) -> sp.Expr:
    value = expr.subs(U, 1)
    if value.has(sp.nan, sp.zoo) or value.has(sp.sign, sp.Abs, sp.DiracDelta, sp.Piecewise, sp.Heaviside,
                                               sp.Min, sp.Max):
        value = (sp.limit(on_side(expr, 1), U, 1, "+") + sp.limit(on_side(expr, -1), U, 1, "-")) / 2
    return sp.simplify(value)


@dataclass(frozen=True)
class Facts:
    """What SymPy derives exactly about one generator (see the module docstring)."""

    f: sp.Expr
    f_prime_1: sp.Expr
    f_normalised: sp.Expr
    derivatives_at_one: tuple[sp.Expr, sp.Expr, sp.Expr]
    f_at_zero: sp.Expr
    slope_at_infinity: sp.Expr

    @property
    def f2(self) -> sp.Expr:
        """f''(1): the local curvature (0 for a kink); small-δ bounds are 1 ± sqrt(2δ(1-p)/(p f''(1)))."""
        return self.derivatives_at_one[0]

    @property
    def is_smooth_at_one(self) -> bool:
        """False for generators with a kink at u = 1 (total variation): the Band is then linear in δ."""
        return not self.f2.has(sp.DiracDelta) and bool(self.f2.is_finite) and bool(self.f2 > 0)


def facts(divergence: str | Divergence) -> Facts:
    """The exact :class:`Facts` of a divergence (any spelling); cached per divergence."""
    return _facts(resolve(divergence))


@lru_cache(maxsize=256)
def _facts(div: Divergence) -> Facts:
    f = _generator(div)
    f_prime_1 = _at_one(sp.diff(f, U))
    f_normalised = sp.expand_log(f - f_prime_1 * (U - 1), force=True)
    derivatives = tuple(sp.simplify(_at_one(sp.diff(f, U, k))) for k in (2, 3, 4))
    f_at_zero = sp.simplify(sp.limit(on_side(f_normalised, -1), U, 0, "+"))
    slope = sp.simplify(sp.limit(on_side(f_normalised, 1) / U, U, sp.oo))
    return Facts(f, f_prime_1, f_normalised, derivatives, f_at_zero, slope)
