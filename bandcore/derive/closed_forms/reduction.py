r"""The binary reduction :math:`g_f(p, r)`, symbolically, and the symbols of every derivation.

For a token with old probability :math:`p` and ratio :math:`r`, Jensen's inequality on the other tokens
(they keep their old proportions, ratio :math:`s = (1 - pr)/(1 - p)`) reduces the trust region to

.. math::  g_f(p, r) = p\,\tilde f(r) + (1-p)\,\tilde f(s) \le \delta .

On the upper side :math:`r > 1 > s`, on the lower side :math:`r < 1 < s`; :func:`on_side` resolves every
``Abs`` of :math:`\tilde f` for one side of :math:`u = 1`, so that each side's equation
:math:`g_f = \delta` is free of absolute values.
"""

from __future__ import annotations

import numpy as np
import sympy as sp

from ..generator_facts.budget import bounded
from ..generator_facts.symbolic import Facts, U
from ..generator_facts.symbolic import on_side as symbolic_on_side

__all__ = ["DELTA", "P", "Q", "R", "binary", "display_g", "on_side", "transcendental_atoms"]

#: The old probability p, the trust-region radius δ and the ratio r of every derivation.
P, DELTA, R = sp.symbols("p delta r", positive=True)
#: The new probability of the token, q = p r (the p → 0 limit is an equation in q).
Q = sp.Symbol("q", positive=True)

_DISPLAY_SECONDS = 4.0


def transcendental_atoms(expr: sp.Expr, x: sp.Symbol) -> set[sp.Expr]:
    """Sub-expressions that make ``expr`` non-algebraic in ``x`` (log, exp, x-dependent exponents, ...)."""
    found = set()
    for node in sp.preorder_traversal(expr):
        if isinstance(node, sp.Function) and not isinstance(node, sp.Abs) and node.has(x):
            found.add(node)
        elif isinstance(node, sp.Pow) and node.exp.has(x):
            found.add(node)
    return found


def on_side(expr: sp.Expr, side: str) -> sp.Expr | None:
    """``expr`` (in u) with every ``Abs``, ``Min``, ``Max`` and ``where`` resolved for u > 1 (``side='gt'``) or
    0 < u < 1 (``'lt'``).

    Pieces that switch at u = 1 are resolved by :func:`~..generator_facts.symbolic.on_side`; the sign of each
    remaining ``Abs`` argument is read on a dense grid of that side.  ``None`` if one changes sign there (a kink
    away from u = 1), a piecewise part remains, or the expression cannot be evaluated.
    """
    if expr.has(sp.Abs, sp.Min, sp.Max, sp.Piecewise):
        resolved = bounded(lambda: symbolic_on_side(expr, 1 if side == "gt" else -1), _DISPLAY_SECONDS)
        if resolved is None or resolved.has(sp.Min, sp.Max, sp.Piecewise):
            return None
        expr = resolved
    grid = 1 + np.logspace(-6, 6, 61) if side == "gt" else np.logspace(-12, -1e-7, 61)
    replacements = {}
    for node in expr.atoms(sp.Abs):
        inner = node.args[0]
        function = bounded(lambda inner=inner: sp.lambdify(U, inner, "numpy"), _DISPLAY_SECONDS)
        if function is None:
            return None
        with np.errstate(all="ignore"):
            try:
                values = np.asarray(function(grid), dtype=float) * np.ones_like(grid)
            except (TypeError, ValueError, OverflowError, ZeroDivisionError):
                return None
        if np.all(values >= 0):
            replacements[node] = inner
        elif np.all(values <= 0):
            replacements[node] = -inner
        else:
            return None
    return expr.xreplace(replacements)


def binary(f_side_r: sp.Expr, f_side_s: sp.Expr) -> sp.Expr:
    r""":math:`p\,f_r(r) + (1-p)\,f_s(s)` with :math:`s = (1 - pr)/(1 - p)` (``f_r``, ``f_s`` in :data:`U`)."""
    s = (1 - P * R) / (1 - P)
    return P * f_side_r.subs(U, R) + (1 - P) * f_side_s.subs(U, s)


def display_g(fx: Facts, pieces: dict[str, sp.Expr | None]) -> sp.Expr:
    """:math:`g_f` in its shortest honest form: factored when rational in r, ``|r - 1|`` or ``Piecewise`` at a
    kink (each rewriting under a time budget; the plain definition when one runs out)."""

    def tidy(g: sp.Expr) -> sp.Expr:
        rational = not transcendental_atoms(g, R) and all(
            a.exp.is_integer for a in sp.preorder_traversal(g) if isinstance(a, sp.Pow)
        )
        if not rational:
            return g
        factored = bounded(lambda: sp.factor(sp.together(g)), _DISPLAY_SECONDS)
        return g if factored is None else factored

    if not fx.f_normalised.has(sp.Abs):
        return tidy(binary(fx.f, fx.f))  # p f(r) + (1-p) f(s): the linear part of f cancels
    if pieces["upper"] is None or pieces["lower"] is None:
        return binary(fx.f_normalised, fx.f_normalised)
    up, lo = tidy(pieces["upper"]), tidy(pieces["lower"])
    if bounded(lambda: sp.simplify(lo - up.subs(R, 2 - R)) == 0, _DISPLAY_SECONDS):
        factored = bounded(lambda: sp.factor(up), _DISPLAY_SECONDS)
        return (up if factored is None else factored).subs(R, 1 + sp.Abs(R - 1))  # g depends on |r - 1| only
    return sp.Piecewise((lo, R < 1), (up, True))
