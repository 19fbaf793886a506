r"""Numeric validation of closed-form candidates against bracketed roots of :math:`g_f(p, r) = \delta`.

SymPy's root formulas come in branches (± of a square root, the three Cardano roots), and a branch can be right
on part of the :math:`(p, \delta)` plane only.  A candidate is accepted for one side of the Band when, at every
point of the grid :math:`p \in` :data:`P_GRID`, :math:`\delta \in` :data:`DELTA_GRID` where that side is not
saturated, its value *brackets* the root: :math:`g_f(p, \cdot)` is monotone on each side of :math:`r = 1`, so

.. math::  g_f(p, r e^{-\epsilon |\log r|}) < \delta < g_f(p, r e^{\epsilon |\log r|}), \qquad \epsilon = 10^{-12},

proves the root lies within a relative :math:`\epsilon` of the candidate in :math:`\log r`.  The arithmetic is
mpmath at :data:`DPS` digits with the one :math:`g_f` of :mod:`.mpmath_g`.  Saturation thresholds are validated
the same way against :math:`G(p) = \delta` (:func:`threshold_ok`).

Validation stops, and the candidate is not accepted, once the derivation's overall time budget has run out.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

import mpmath as mp
import sympy as sp

from ...divergences import Divergence
from ..generator_facts.budget import bounded, expired
from ..generator_facts.mpmath_g import g_boundary, g_ratio
from .reduction import DELTA, P

__all__ = [
    "DELTA_GRID",
    "DPS",
    "MATCH",
    "P_GRID",
    "boundary_root",
    "evaluate",
    "find_root",
    "lambdify_mp",
    "threshold_ok",
    "validate_branch",
]

DPS = 30  # digits of the numerical validation
P_GRID = (1e-6, 1e-4, 1e-2, 0.08, 0.3, 0.5, 0.7, 0.92, 0.99, 1 - 1e-4, 1 - 1e-6)
DELTA_GRID = (1e-4, 1e-2, 0.05, 0.3, 1.0, 5.0)
MATCH = 1e-12  # relative agreement (in log r) a branch needs at every validation point
_LAMBDIFY_SECONDS = 8.0


def lambdify_mp(args: Any, expr: sp.Expr) -> Callable[..., Any] | None:
    """``sympy.lambdify(args, expr, "mpmath")`` under a time budget (``None`` if it runs out or recurses)."""
    return bounded(lambda: sp.lambdify(args, expr, "mpmath"), _LAMBDIFY_SECONDS)


def find_root(h: Callable[[Any], Any], a: Any, b: Any) -> Any:
    """Root of ``h`` in the bracket [a, b] (h(a), h(b) of opposite signs): Illinois steps, bisection fallback."""
    fa, fb = h(a), h(b)
    tolerance = mp.mpf(10) ** (4 - mp.mp.dps)
    for _ in range(500):
        width = abs(b - a)
        c = (a + b) / 2
        if mp.isfinite(fa) and mp.isfinite(fb) and fa != fb:
            guess = b - fb * (b - a) / (fb - fa)
            if min(a, b) < guess < max(a, b):
                c = guess
        fc = h(c)
        if fc == 0:
            return c
        if (fc < 0) == (fa < 0):
            a, fa = c, fc
            fb = fb / 2 if mp.isfinite(fb) else fb  # Illinois: halve the stale end
        else:
            b, fb = c, fc
            fa = fa / 2 if mp.isfinite(fa) else fa
        if abs(b - a) > width / 2:  # slow progress: take a bisection step
            c = (a + b) / 2
            fc = h(c)
            if (fc < 0) == (fa < 0):
                a, fa = c, fc
            else:
                b, fb = c, fc
        if abs(b - a) <= tolerance * max(abs(a), abs(b)):
            break
    return (a + b) / 2


def evaluate(fn: Callable[..., Any], *args: float) -> Any:
    """Real value of a lambdified candidate at :data:`DPS` digits (None if complex, infinite or undefined)."""
    try:
        value = fn(*[mp.mpf(a) for a in args])
        value = mp.mpc(value)
    except (ZeroDivisionError, ValueError, TypeError, OverflowError, RecursionError):
        return None
    if not (mp.isfinite(value.real) and mp.isfinite(value.imag)):
        return None
    if abs(value.imag) > mp.mpf(10) ** (10 - DPS) * max(1, abs(value.real)):
        return None
    return value.real


def _classify(div: Divergence, side: str, p: float, delta: float) -> str:
    """``"saturated"``, ``"edge"`` (within 1e-9 relative of the threshold: neither answer is well-conditioned)
    or ``"root"`` (the side ends at a root of g_f(p, r) = δ)."""
    edge = g_boundary(div, mp.mpf(p), side)
    if abs(edge - delta) <= 1e-9 * delta:
        return "edge"
    return "saturated" if edge < delta else "root"


def _reference_log_root(div: Divergence, side: str, p: float, delta: float) -> Any:
    """log r of the bracketed root of g_f(p, r) = δ on ``side`` (the side must not be saturated)."""
    p, delta = mp.mpf(p), mp.mpf(delta)

    def h(y: Any) -> Any:
        return g_ratio(div, p, mp.exp(y)) - delta

    if side == "upper":
        return find_root(h, mp.mpf(0), -mp.log(p))
    outside = mp.mpf(-1)
    while h(outside) <= 0:  # the root lies further out: expand geometrically
        outside *= 2
    return find_root(h, mp.mpf(0), outside)


def _brackets_root(div: Divergence, side: str, p: float, delta: float, value: Any) -> bool:
    r"""True iff the root of g_f(p, r) = δ on ``side`` lies within a relative :data:`MATCH` of ``value`` in
    :math:`\log r` (a sign change of g_f - δ across :math:`[y(1 - \epsilon), y(1 + \epsilon)]`)."""
    y = mp.log(value)
    if (y > 0) != (side == "upper") or y == 0:
        return False
    p, delta = mp.mpf(p), mp.mpf(delta)
    inner, outer = y * (1 - MATCH), y * (1 + MATCH)
    return g_ratio(div, p, mp.exp(inner)) < delta < g_ratio(div, p, mp.exp(outer))


@lru_cache(maxsize=256)
def _grid(div: Divergence, side: str) -> dict[str, tuple[tuple[float, float], ...]]:
    """The validation grid split by what the side does there."""
    with mp.workdps(DPS):
        kinds = {(p, d): _classify(div, side, p, d) for p in P_GRID for d in DELTA_GRID}
    return {kind: tuple(pt for pt, k in kinds.items() if k == kind) for kind in ("root", "saturated")}


def _failure(div: Divergence, side: str, fn: Callable[..., Any], points: tuple) -> str | None:
    """Why ``fn`` misses the root somewhere on ``points`` (None: it brackets the root everywhere)."""
    for p, d in points:
        if expired():
            return "not checked to the end: the derivation's time budget ran out"
        value = evaluate(fn, p, d)
        if value is None or value <= 0:
            return f"not a positive real number at (p, δ) = ({p:g}, {d:g})"
        if not _brackets_root(div, side, p, d, value):
            root = mp.exp(_reference_log_root(div, side, p, d))
            where = "r > 1" if value > 1 else "r < 1"
            return (
                f"gives r = {mp.nstr(value, 6)} ({where}) at (p, δ) = ({p:g}, {d:g}) where the root is "
                f"r = {mp.nstr(root, 6)}"
            )
    return None


def validate_branch(div: Divergence, side: str, candidates: list[sp.Expr]) -> tuple[sp.Expr | None, list[str]]:
    """Keep the one candidate whose value brackets the root at every unsaturated grid point.

    Returns (the accepted candidate or None, notes on every candidate).
    """
    if not candidates:
        return None, []
    grid = _grid(div, side)
    notes: list[str] = []
    accepted = None
    with mp.workdps(DPS):
        for index, candidate in enumerate(candidates, 1):
            label = f"{side} bound: candidate {index} of {len(candidates)}"
            fn = lambdify_mp((P, DELTA), candidate)
            failure = "could not be compiled for mpmath" if fn is None else _failure(div, side, fn, grid["root"])
            if failure is not None:
                notes.append(f"{label} rejected: {failure}")
            elif accepted is not None:
                notes.append(f"{label} duplicates the accepted branch numerically")
            else:
                accepted = candidate
                notes.append(
                    f"{label} accepted: brackets the root to {MATCH:g} (relative, in log r) at all "
                    f"{len(grid['root'])} unsaturated grid points"
                )
                notes.extend(_outside_region(fn, side, grid["saturated"]))
    return accepted, notes


def _outside_region(fn: Callable[..., Any], side: str, saturated: tuple) -> list[str]:
    """What an accepted formula returns where the side saturates (so the caller knows why to clip)."""
    if not saturated:
        return []
    spurious, clipped = [], 0
    for p, d in saturated:
        value = evaluate(fn, p, d)
        inside = value is not None and (0 < value < 1 if side == "lower" else 1 < value < 1 / p)
        if inside:
            spurious.append((p, d, value))
        else:
            clipped += 1
    notes = []
    if spurious:
        p, d, value = spurious[0]
        notes.append(
            f"{side} bound: where it saturates the formula is a spurious root (e.g. r = {mp.nstr(value, 6)} at "
            f"(p, δ) = ({p:g}, {d:g}) instead of {'0' if side == 'lower' else f'1/p = {1 / p:g}'}); it holds only "
            "where the side is not saturated — apply the saturation test first"
        )
    if clipped:
        edge = "r <= 0 or not real" if side == "lower" else "r >= 1/p or not real"
        notes.append(
            f"{side} bound: at {clipped} of the {len(saturated)} saturated grid points the formula gives {edge}: "
            "clipping it to [0, 1/p] gives the saturated value"
        )
    return notes


def boundary_root(div: Divergence, side: str, delta: float) -> Any:
    """Numeric saturation threshold: the p in (0, 1) with G(p) = δ (G decreasing upper, increasing lower)."""
    with mp.workdps(DPS):
        sign = 1 if side == "upper" else -1

        def h(p: Any) -> Any:
            return sign * (g_boundary(div, p, side) - mp.mpf(delta))  # > 0 near p = 0 for both sides

        a, b = mp.mpf(10) ** (8 - DPS), 1 - mp.mpf(10) ** (8 - DPS)
        if h(a) <= 0:
            return mp.mpf(0)
        if h(b) >= 0:
            return mp.mpf(1)
        return find_root(lambda p: -h(p), a, b)


def threshold_ok(div: Divergence, side: str, candidate: sp.Expr, level: sp.Expr) -> bool:
    """True iff ``candidate(δ)`` brackets the root of G(p) = δ to :data:`MATCH` (relative to min(p, 1 - p)) on
    the δ grid below ``level`` (G is monotone in p, so a sign change across the bracket proves it)."""
    fn = lambdify_mp(DELTA, candidate)
    if fn is None:
        return False
    sign = 1 if side == "upper" else -1  # G_up decreases in p, G_lo increases
    with mp.workdps(DPS):
        for d in (d for d in DELTA_GRID if level == sp.oo or d < float(level) * (1 - 1e-9)):
            if expired():
                return False
            t = evaluate(fn, d)
            if t is None or not 0 < t < 1:
                return False
            eta = MATCH * min(t, 1 - t)
            if not sign * (g_boundary(div, t - eta, side) - d) > 0 > sign * (g_boundary(div, t + eta, side) - d):
                return False
    return True
