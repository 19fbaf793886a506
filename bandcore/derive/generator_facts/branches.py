r"""The branch of a piecewise generator that is active near one point, and numeric facts where SymPy fails.

A generator written with ``abs``, ``min``, ``max`` or ``where`` is smooth except at finitely many kinks, so near
each of the points the facts need — :math:`u \to 0^+`, :math:`u \to 1^-`, :math:`u \to 1^+`,
:math:`u \to \infty` — one branch of every piece is active.  :func:`active_branch` replaces each ``Abs``,
``Min``, ``Max`` and ``Piecewise`` by that branch, reading the sign of each switching quantity (an ``Abs``
argument, the differences of ``Min``/``Max`` arguments, a ``where`` condition) at three points that approach
the limit point geometrically (:data:`APPROACH`) at :data:`DPS` digits; the branch is accepted only when the
three agree.  SymPy's limits and series then see smooth expressions (its ``Piecewise``/``Max`` limits fail).

When SymPy still cannot find a fact within its time budget, :func:`numeric_at_zero` and
:func:`numeric_slope_at_infinity` compute it with mpmath from the generator itself:

* :math:`\tilde f(0^+)`: :math:`\tilde f` is convex, :math:`\ge 0` and decreasing on :math:`(0, 1)`, so the
  limit exists in :math:`[0, \infty]`; it is :math:`\tilde f(10^{-k})` once the values at
  :math:`k = 40, 80, 160` agree to :data:`AGREE` (relative), and ``oo`` when they keep growing;
* :math:`\sigma_\infty = \lim \tilde f(u)/u`: the secant slope :math:`(\tilde f(2u) - \tilde f(u))/u` increases
  to the same limit (convexity) and converges faster; read at :math:`u = 10^{k}` the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mpmath as mp
import sympy as sp

__all__ = [
    "APPROACH",
    "DPS",
    "active_branch",
    "active_branch_at",
    "numeric_at_zero",
    "numeric_slope_at_infinity",
    "one_sided",
]

#: Digits of the branch decisions and of the numeric facts.
DPS = 120
#: Exponents k of the approach points: 1 ± 10^-k, 10^-k and 10^k.
APPROACH = (20, 35, 50)
#: Relative agreement of successive numeric approximations for a numeric fact to be accepted as finite.
AGREE = mp.mpf(10) ** -15

_PIECES = (sp.Abs, sp.Min, sp.Max, sp.Piecewise)


def _points(where: str) -> list[sp.Float]:
    """The approach points of ``where`` in {"0+", "1-", "1+", "inf"} (as SymPy floats at :data:`DPS`)."""
    ten = sp.Integer(10)
    offsets = {"0+": lambda k: ten**-k, "1-": lambda k: 1 - ten**-k, "1+": lambda k: 1 + ten**-k}
    make = offsets.get(where, lambda k: ten**k)
    return [sp.Float(make(k), DPS) for k in APPROACH]


def _sign(expr: sp.Expr, u: sp.Symbol, points: list[sp.Float]) -> int | None:
    """The common sign (-1, 0, 1) of ``expr`` at ``points``; None if they differ or a value is not real."""
    signs = set()
    for x in points:
        value = sp.N(expr.subs(u, x), DPS)
        if not value.is_real or not value.is_finite:
            return None
        tiny = abs(value) <= sp.Float(10) ** (20 - DPS) * max(1, abs(x))  # rounding of a difference that is 0
        signs.add(0 if tiny else int(sp.sign(value)))
    return signs.pop() if len(signs) == 1 else None


def _condition(cond: Any, u: sp.Symbol, points: list[sp.Float]) -> bool | None:
    """Whether a ``where`` condition holds at every point (None: it is not constant there)."""
    if cond is sp.true or cond is sp.false:
        return bool(cond)
    if not isinstance(cond, sp.core.relational.Relational):
        return None
    difference = cond.lhs - cond.rhs
    sign = _sign(difference, u, points)
    if sign is None:
        return None
    return bool(cond.func(sign, 0))


def active_branch(expr: sp.Expr, u: sp.Symbol, where: str) -> sp.Expr | None:
    """``expr`` with each ``Abs``, ``Min``, ``Max``, ``Piecewise`` replaced by its branch active as u → ``where``
    ("0+", "1-", "1+", "inf"); None when a branch cannot be decided (the points disagree or a value is complex).
    """
    return active_branch_at(expr, u, _points(where))


def active_branch_at(expr: sp.Expr, u: sp.Symbol, points: list[sp.Float]) -> sp.Expr | None:
    """``expr`` with each piece replaced by the branch active at every one of ``points`` (None: they differ)."""

    def resolve(node: sp.Expr) -> sp.Expr | None:
        if not node.has(*_PIECES):
            return node
        if isinstance(node, sp.Piecewise):
            for branch, cond in node.args:
                holds = _condition(cond, u, points)
                if holds is None:
                    return None
                if holds:
                    return resolve(branch)
            return None
        args = [resolve(a) for a in node.args]
        if any(a is None for a in args):
            return None
        if isinstance(node, sp.Abs):
            sign = _sign(args[0], u, points)
            return None if sign is None else (args[0] if sign >= 0 else -args[0])
        if isinstance(node, (sp.Min, sp.Max)):
            best = args[0]
            for other in args[1:]:
                sign = _sign(other - best, u, points)
                if sign is None:
                    return None
                if (sign > 0) == isinstance(node, sp.Max) and sign != 0:
                    best = other
            return best
        return node.func(*args)

    return resolve(expr)


def one_sided(expr: sp.Expr, u: sp.Symbol) -> tuple[sp.Expr | None, sp.Expr | None]:
    """(the branch of ``expr`` active on the left of u = 1, the one on the right)."""
    return active_branch(expr, u, "1-"), active_branch(expr, u, "1+")


def _converged(values: list[Any]) -> bool:
    a, b = values[-2], values[-1]
    return abs(b - a) <= AGREE * max(1, abs(b))


def _limit(sequence: Callable[[int], Any]) -> Any:
    """The limit of ``sequence(k)`` for k = 40, 80, 160 (increasing to it): the last value once two successive
    ones agree, ``mp.inf`` when they keep growing, None when neither is clear."""
    with mp.workdps(DPS):
        values = [sequence(k) for k in (40, 80, 160)]
        if not all(mp.isfinite(v) for v in values):
            return mp.inf if any(v == mp.inf for v in values) else None
        if _converged(values):
            return values[-1]
        if values[0] < values[1] < values[2] and values[2] - values[1] >= (values[1] - values[0]) * (1 - AGREE):
            return mp.inf  # growing by at least as much per decade doubling: no finite limit (log, powers)
        return None


def numeric_at_zero(f_tilde: Callable[[Any], Any]) -> Any:
    r""":math:`\tilde f(0^+)` from mpmath values of ``f_tilde`` (mpf → mpf) at :math:`10^{-k}`; None if unclear."""
    return _limit(lambda k: mp.re(f_tilde(mp.mpf(10) ** -k)))


def numeric_slope_at_infinity(f_tilde: Callable[[Any], Any]) -> Any:
    r""":math:`\lim \tilde f(u)/u` from secant slopes of ``f_tilde`` at :math:`u = 10^{k}`; None if unclear."""

    def slope(k: int) -> Any:
        x = mp.mpf(10) ** k
        return mp.re(f_tilde(2 * x) - f_tilde(x)) / x

    return _limit(slope)
