r"""The SymPy part of the lookup tables' pieces: stable closed forms of :math:`A, B, T, T'`, as NumPy callables.

With :math:`y = \log r` and :math:`t = s - 1`, the tables (:mod:`bandcore.tables.pieces`) write

.. math::  g_f = p\,A(y) + (1-p)\,T(t_s), \qquad A(y) = \tilde f(e^y), \quad T(t) = \tilde f(1+t),

with :math:`B(y) = e^y \tilde f'(e^y)` and :math:`T'(t) = \tilde f'(1+t)` for the implicit slopes.  Each
expression is rewritten with ``expm1``/``log1p`` (no cancellation near :math:`r = 1`, no overflow of
:math:`e^y` in :math:`A`) and turned into a vectorised float64 function.  This module is the only place the
tables touch SymPy; it returns numbers and callables only.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import numpy as np
import sympy as sp
from sympy.codegen.rewriting import optimize, optims_c99

from ...divergences import Divergence
from ..generator_facts.symbolic import U, facts

__all__ = ["TablePieces", "table_pieces"]

_Y = sp.Symbol("y", real=True)
_T = sp.Symbol("t", real=True)

#: (A, B, T, T', f~(0)): four vectorised float64 functions and the normalised generator at 0 (may be inf)
TablePieces = tuple[Callable, Callable, Callable, Callable, float]


def _lambdify(expr: sp.Expr, var: sp.Symbol) -> Callable:
    fn = sp.lambdify(var, optimize(expr, optims_c99), "numpy")

    def vectorised(v):
        v = np.asarray(v, dtype=np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):  # a piecewise form evaluates its unused branches too
            return np.asarray(fn(v), dtype=np.float64) * np.ones_like(v)

    return vectorised


def table_pieces(div: Divergence) -> TablePieces:
    """``(A, B, T, Tp, f_at_zero)`` of a divergence (cached per divergence)."""
    return _table_pieces(div)


def _simplify(expr: sp.Expr, var: sp.Symbol) -> sp.Expr:
    """``simplify(expr)`` unless, for a piecewise ``expr`` (abs, min, max, where), the simplified form differs
    from it at a point of either sign of ``var``: simplify can write ``sign(t)·sqrt(|t|)`` as ``t/|sqrt(t)|``,
    which is complex for t < 0."""
    simpler = sp.simplify(expr)
    if not expr.has(sp.Abs, sp.Min, sp.Max, sp.Piecewise, sp.sign):
        return simpler
    points = np.array([-0.75, -0.3, 0.3, 0.75, 2.5])
    a, b = (_lambdify(e, var)(points) for e in (expr, simpler))  # in float64, as the tables evaluate them
    return simpler if np.allclose(a, b, rtol=1e-12, atol=0.0) else expr


@lru_cache(maxsize=64)
def _table_pieces(div: Divergence) -> TablePieces:
    fx = facts(div)
    ft = fx.f_normalised
    dft = sp.diff(ft, U)
    a = sp.expand_log(_simplify(ft.subs(U, sp.exp(_Y)), _Y), force=True)
    b = _simplify((U * dft).subs(U, sp.exp(_Y)), _Y)
    f0 = fx.f_at_zero
    return (
        _lambdify(a, _Y),
        _lambdify(b, _Y),
        _lambdify(_simplify(ft.subs(U, 1 + _T), _T), _T),
        _lambdify(_simplify(dft.subs(U, 1 + _T), _T), _T),
        float("inf") if f0 == sp.oo else float(f0),
    )
