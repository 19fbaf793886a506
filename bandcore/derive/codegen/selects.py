"""Piecewise generator functions as element-wise selects.

A generator written with ``max``, ``min``, ``abs`` or ``where`` is, on each side of u = 1, a SymPy ``Piecewise``
(Max, Min and Heaviside rewritten into one).  The solver functions evaluate every piece and choose, element by
element, the first whose condition holds, exactly as ``Piecewise`` does: conditions are written in x = u - 1
(the solvers' variable) and printed as ``xp.where`` / ``xp.logical_and`` / ``xp.logical_or``, so the choice is a
select that vectorises, never a branch.
"""

from __future__ import annotations

from collections.abc import Callable

import sympy as sp

from ..generator_facts.symbolic import U
from .overflow import LogicalAnd, LogicalOr, Select

#: the solvers' variable x = u - 1 (also :mod:`.kernel_functions`' x)
X = sp.Symbol("x", real=True)


def pieces_of(expr_u: sp.Expr) -> list[tuple[sp.Expr, sp.Basic]]:
    """(expression, condition in u) of each piece of a one-sided generator function (one piece, condition
    True, for an analytic one); Max, Min and Heaviside become pieces too."""
    expr_u = sp.piecewise_fold(expr_u.rewrite(sp.Piecewise))
    if not isinstance(expr_u, sp.Piecewise):
        return [(expr_u, sp.true)]
    return [(piece.expr, piece.cond) for piece in expr_u.args]


def condition_in_x(cond: sp.Basic) -> sp.Basic:
    """A piece's condition in x = u - 1, with element-wise and/or (printed as xp.logical_and/or)."""
    if isinstance(cond, sp.And):
        return LogicalAnd(*(condition_in_x(arg) for arg in cond.args))
    if isinstance(cond, sp.Or):
        return LogicalOr(*(condition_in_x(arg) for arg in cond.args))
    return cond.xreplace({U: 1 + X})


def selected(pieces: list[tuple[sp.Expr, sp.Basic]], build: Callable[[sp.Expr], sp.Expr]) -> sp.Expr:
    """``build`` of each piece, chosen by the pieces' conditions (the first that holds, as in Piecewise)."""
    value = build(pieces[-1][0])
    for expr, cond in reversed(pieces[:-1]):
        value = Select(condition_in_x(cond), build(expr), value)
    return value


def holds_near_one(cond: sp.Basic, sign: int, radius: float) -> bool:
    """Whether a piece's condition holds on the whole interval 0 < ±(u - 1) <= ``radius`` (side ``sign``)."""
    radius = sp.nsimplify(radius)
    points = [1 + sign * radius * sp.Rational(k, 100) for k in range(1, 101)]
    return all(bool(cond.subs(U, point)) for point in points)


def last_piece(pieces: list[tuple[sp.Expr, sp.Basic]]) -> sp.Expr:
    """The piece that holds as u -> oo."""
    return next(expr for expr, cond in pieces if bool(cond.subs(U, sp.Integer(10) ** 300)))
