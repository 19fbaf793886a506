r"""Closed forms of the Band for generators with kinks away from :math:`u = 1`, one piece at a time.

On the upper side :math:`r` moves from 1 to :math:`1/p` and :math:`s = (1 - pr)/(1 - p)` from 1 to 0; on the lower
side :math:`r` moves from 1 to 0 and :math:`s` from 1 to :math:`1/(1-p)`.  When :math:`\tilde f` switches branch
(``abs``, ``min``, ``max``, ``where``) at points :math:`b_1, b_2, \dots` of the half-line that :math:`r` (or
:math:`s`) crosses, and not on the other half-line, the path of :math:`r` is cut into cells on each of which
:math:`g_f = \delta` is one equation.  As :math:`g_f` grows along the path, the root lies in the first cell
whose far end :math:`r_i` has :math:`g_f(p, r_i) \ge \delta`; the Band is then

.. math::  r(p, \delta) = \begin{cases} \rho_1 & \text{if } r_1 \text{ is not reached or }
           \delta \le g_f(p, r_1) \\ \rho_2 & \text{if } \delta \le g_f(p, r_2) \\ \dots \end{cases}

with :math:`\rho_i` the validated root of cell :math:`i`.  A break :math:`c` of :math:`s` is crossed at
:math:`r = (1 - (1-p)c)/p`; a break :math:`b` of :math:`r` at :math:`r = b`.

Breakpoints are found where a switching quantity (an ``Abs`` argument, a ``Min``/``Max`` difference, a
``where`` condition) changes sign on a dense grid, each then solved exactly (SymPy, under a time budget).
Each cell's root is checked at points *inside* the cell — for a ratio :math:`r^*` in the cell,
:math:`\delta = g_f(p, r^*)` must give back :math:`r^*` — before the caller validates the whole formula.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from itertools import combinations
from typing import Any

import mpmath as mp
import numpy as np
import sympy as sp

from ...divergences import Divergence
from ..generator_facts.branches import active_branch_at
from ..generator_facts.budget import bounded, expired
from ..generator_facts.mpmath_g import g_ratio
from ..generator_facts.symbolic import U
from .reduction import DELTA, P, R, binary
from .roots import SOLVE_SECONDS, solve_closed, tidy
from .validate import DPS, evaluate, lambdify_mp

__all__ = ["breakpoints", "piecewise_bound"]

_GRID = {
    "gt": 1 + np.logspace(-6, 6, 1201),
    "lt": np.concatenate([np.logspace(-12, -1, 300), 1 - np.logspace(-1, -6, 600)]),
}
_P_CHECK = (0.01, 0.2, 0.5, 0.8, 0.99)
_MAX_BREAKS = 3


def _quantities(expr: sp.Expr) -> list[sp.Expr]:
    """The switching quantities of ``expr``: Abs arguments, Min/Max differences, where() condition sides."""
    found = []
    for node in sp.preorder_traversal(expr):
        if isinstance(node, sp.Abs):
            found.append(node.args[0])
        elif isinstance(node, (sp.Min, sp.Max)):
            found.extend(a - b for a, b in combinations(node.args, 2))
        elif isinstance(node, sp.Piecewise):
            found.extend(c.lhs - c.rhs for _, c in node.args if isinstance(c, sp.core.relational.Relational))
    return found


def _signs(quantity: sp.Expr, grid: np.ndarray) -> np.ndarray | None:
    fn = bounded(lambda: sp.lambdify(U, quantity, "numpy"), SOLVE_SECONDS)
    if fn is None:
        return None
    with np.errstate(all="ignore"):
        values = np.asarray(fn(grid), dtype=float) * np.ones_like(grid)
    return None if not np.all(np.isfinite(values)) else np.sign(values)


def breakpoints(expr: sp.Expr, side: str) -> list[sp.Expr] | None:
    """The exact points of u > 1 (``side="gt"``) or 0 < u < 1 (``"lt"``) where ``expr`` switches branch, in
    increasing order; None when they cannot all be found (or there are more than :data:`_MAX_BREAKS`)."""
    grid = _GRID[side]
    found: set[sp.Expr] = set()
    for quantity in _quantities(expr):
        signs = _signs(quantity, grid)
        if signs is None:
            return None
        for i in np.flatnonzero(signs[:-1] != signs[1:]):
            a, b = grid[i], grid[i + 1]
            if signs[i] == 0 and i > 0 and signs[i - 1] == signs[i + 1]:
                continue  # touches 0 without switching
            inner = active_branch_at(quantity, U, [sp.Float(x, 30) for x in (a, (a + b) / 2, b)])
            roots = None if inner is None else bounded(lambda inner=inner: sp.solve(inner, U), SOLVE_SECONDS)
            inside = [x for x in roots or [] if x.is_real and a <= float(x) <= b]
            if len(inside) != 1:
                return None
            found.add(sp.nsimplify(inside[0]) if inside[0].is_Float else inside[0])
    if len(found) > _MAX_BREAKS:
        return None
    return sorted(found, key=float)


def _branch_between(expr: sp.Expr, a: float, b: float) -> sp.Expr | None:
    """The branch of ``expr`` active on the whole open interval (a, b) (b may be inf)."""
    hi = b if math.isfinite(b) else a * 10 + 10
    points = [a + (hi - a) * t for t in (0.1, 0.5, 0.9)] if math.isfinite(b) else [a + 1, a * 10 + 10, a * 1e6 + 1e6]
    return active_branch_at(expr, U, [sp.Float(x, 30) for x in points])


def _cells(f_tilde: sp.Expr, side: str, breaks: list[sp.Expr]) -> list[tuple[sp.Expr, sp.Expr | None]] | None:
    """[(branch, far break or None)] along the path away from u = 1 on the half-line ``side``."""
    ends = list(breaks) if side == "gt" else list(reversed(breaks))
    edges = [1.0, *(float(b) for b in ends), math.inf if side == "gt" else 0.0]
    cells = []
    for i in range(len(edges) - 1):
        a, b = sorted((edges[i], edges[i + 1]))
        branch = _branch_between(f_tilde, a, b)
        if branch is None:
            return None
        cells.append((branch, ends[i] if i < len(ends) else None))
    return cells


def _checked(div: Divergence, side: str, fn: Callable[..., Any], r_inner: Callable[[float], list[float]]) -> bool:
    """``fn(p, g(p, r*)) = r*`` for ratios r* inside the cell (``r_inner(p)``), at 1e-12 relative in log r."""
    with mp.workdps(DPS):
        tried = 0
        for p in _P_CHECK:
            for r in r_inner(p):
                if expired():
                    return False
                delta = g_ratio(div, mp.mpf(p), mp.mpf(r))
                if not (0 < delta < mp.inf):
                    continue
                value = evaluate(fn, p, float(delta))
                if value is None or value <= 0 or abs(mp.log(value) - mp.log(r)) > 1e-12 * max(1, abs(mp.log(r))):
                    return False
                tried += 1
        return tried > 0


def piecewise_bound(div: Divergence, side: str, f_tilde: sp.Expr) -> tuple[sp.Expr | None, list[str]]:
    """A closed form of one side of the Band for ``f_tilde`` with kinks away from 1 (module docstring), or
    None with notes on why not."""
    r_half, s_half = ("gt", "lt") if side == "upper" else ("lt", "gt")
    r_breaks, s_breaks = breakpoints(f_tilde, r_half), breakpoints(f_tilde, s_half)
    if r_breaks is None or s_breaks is None:
        return None, [f"{side} bound: no closed form — the switch points of f could not all be found exactly"]
    if r_breaks and s_breaks:
        return None, [f"{side} bound: no closed form attempted — f switches branch on both sides of u = 1"]
    moving = "r" if r_breaks else "s"
    cells = _cells(f_tilde, r_half if r_breaks else s_half, r_breaks or s_breaks)
    fixed = _branch_between(f_tilde, *((1.0, math.inf) if (s_half if r_breaks else r_half) == "gt" else (0.0, 1.0)))
    if cells is None or fixed is None:
        return None, [f"{side} bound: no closed form — the branch on a piece of f could not be decided"]
    clauses: list[tuple[sp.Expr, Any]] = []
    notes: list[str] = []
    previous = 1.0
    for index, (branch, end) in enumerate(cells, 1):
        f_r, f_s = (branch, fixed) if moving == "r" else (fixed, branch)
        g = binary(f_r, f_s)
        at_end = None if end is None else (end if moving == "r" else (1 - (1 - P) * end) / P)
        start, previous = previous, at_end
        if at_end is not None and bounded(lambda g=g: sp.simplify(g), SOLVE_SECONDS) == 0:
            notes.append(f"{side} bound: g_f = 0 on piece {index} (f̃ = 0 there): the bound lies beyond it")
            continue
        candidates, _ = solve_closed(g - DELTA, R, f"{side} bound, piece {index}")

        def inner(p: float, start: Any = start, end: Any = at_end) -> list[float]:
            lo = _at(start, p)
            hi = (1 / p if side == "upper" else 0.0) if end is None else _at(end, p)
            hi = min(hi, 1 / p) if side == "upper" else max(hi, 0.0)
            if (hi <= lo) if side == "upper" else (hi >= lo):
                return []
            return [lo + (hi - lo) * t for t in (0.05, 0.5, 0.95)]

        root = None
        for candidate in candidates:
            fn = lambdify_mp((P, DELTA), candidate)
            if fn is not None and _checked(div, side, fn, inner):
                root = candidate
                break
        if root is None:
            return None, [f"{side} bound: no closed form — no root of piece {index} of g_f = δ checked out"]
        if at_end is None:
            clauses.append((root, True))
            break
        unreached = tidy(P * at_end - 1) >= 0 if side == "upper" else tidy(at_end) <= 0
        clauses += [(root, unreached), (root, DELTA <= tidy(g.subs(R, at_end)))]
        notes.append(f"{side} bound: piece {index} ends where {moving} = {sp.sstr(end)}")
    return sp.Piecewise(*clauses), notes


def _at(value: Any, p: float) -> float:
    """A cell end (a SymPy expression in p, or a number) at the probability ``p``."""
    return float(value.subs(P, p)) if isinstance(value, sp.Basic) else float(value)
