r"""SymPy derivation of the Band of an f-divergence: closed forms, saturation, limits, small-δ series.

For a token with old probability :math:`p` and ratio :math:`r = \pi/\pi_{old}` the trust region
:math:`D_f(\pi\|\pi_{old}) \le \delta` reduces (Jensen on the other tokens) to the binary condition

.. math::  g_f(p, r) = p\,\tilde f(r) + (1-p)\,\tilde f\!\left(\frac{1 - p r}{1 - p}\right) \le \delta,

with :math:`\tilde f(u) = f(u) - f'(1)(u - 1)` (the linear part cancels: :math:`p(r-1) + (1-p)(s-1) = 0`).
:math:`g_f(p,\cdot)` is convex with :math:`g_f(p, 1) = 0`, so the Band is :math:`[r_{lo}, r_{up}] \ni 1` where

* :math:`r_{up} = 1/p` (upper saturation) iff :math:`g_f(p, 1/p) = p\tilde f(1/p) + (1-p)\tilde f(0) \le \delta`,
  otherwise :math:`r_{up}` is the root of :math:`g_f(p, r) = \delta` with :math:`r > 1`;
* :math:`r_{lo} = 0` (lower saturation) iff :math:`g_f(p, 0) \le \delta`, otherwise the root with :math:`r < 1`.

:func:`derive` finds closed-form roots with SymPy in a way that cannot run away: radicals are cleared
(``unrad``), the numerator is factored, and only factors of degree :math:`\le 4` are solved (``roots``);
equations that mix transcendental terms (``log r`` with ``log(1 - pr)``, Lambert-W type) are not handed to a
solver at all.  Every SymPy call runs under a time limit.  Each candidate branch is then **validated
numerically** against a bracketed root (Illinois/bisection in :math:`\log r` at 30 digits) on a grid of
:math:`(p, \delta)`, :math:`p \in [10^{-6}, 1 - 10^{-6}]`, :math:`\delta \in [10^{-4}, 5]`, wherever that side is
not saturated; branches that miss anywhere are rejected, and the reason is recorded in ``notes``.

Small-δ series (reversion of :math:`g_f(p, 1 + x) = \delta`, :math:`f_k = f^{(k)}(1)`):

.. math::  r = 1 + t + a_2 t^2 + a_3 t^3 + O(t^4), \quad t = \pm\sqrt{\frac{2\delta(1-p)}{p f_2}}, \quad
           a_2 = -\frac{f_3 (1-2p)}{6 f_2 (1-p)}, \quad
           a_3 = \frac{5 f_3^2 (1-2p)^2 - 3 f_2 f_4 (1 - 3p + 3p^2)}{72 f_2^2 (1-p)^2}.

(:func:`series_coefficients` re-derives :math:`a_2, a_3` symbolically.)  A kink at :math:`u = 1` (total
variation) makes :math:`f''(1) = 0`; the Band is then linear in δ, :math:`r = 1 \pm \delta/(pJ)` with the
slope jump :math:`J = f'(1^+) - f'(1^-)`.
"""

from __future__ import annotations

import argparse
import math
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import import_module
from pathlib import Path

import mpmath as mp
import numpy as np
import sympy as sp
from sympy.solvers.solvers import unrad

from .divergences import Divergence, GeneratorError, U, get_divergence, list_divergences

__all__ = [
    "DELTA",
    "Derivation",
    "P",
    "R",
    "Saturation",
    "catalogue",
    "derive",
    "register_cli",
    "render_derivations",
    "resolve",
    "series_coefficients",
    "write_derivations",
]

#: The old probability p, the trust-region radius δ and the ratio r of every derivation.
P, DELTA, R = sp.symbols("p delta r", positive=True)
_Q = sp.Symbol("q", positive=True)  # new probability of the token, q = p r

_DPS = 30  # digits of the numerical validation
_P_GRID = (1e-6, 1e-4, 1e-2, 0.08, 0.3, 0.5, 0.7, 0.92, 0.99, 1 - 1e-4, 1 - 1e-6)
_DELTA_GRID = (1e-4, 1e-2, 0.05, 0.3, 1.0, 5.0)
_MATCH = 1e-12  # relative agreement (in log r) a branch needs at every validation point
_MAX_DEGREE = 4  # polynomial factors above this degree are not handed to SymPy
_SOLVE_SECONDS = 8.0
_SIMPLIFY_SECONDS = 2.0
_SIMPLIFY_MAX_OPS = 80
_ALPHA_EXTRA = (2.0, -1.0, 0.5)  # the α-family members derived beside the default α = 3


# --------------------------------------------------------------------------------------------------------
# Public objects
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Saturation:
    r"""When one side of the Band sits on the simplex boundary.

    Upper side: :math:`r_{up} = 1/p` iff :math:`p \ge` ``threshold(δ)``; lower side: :math:`r_{lo} = 0` iff
    :math:`p \le` ``threshold(δ)``.  ``boundary`` is :math:`G(p)`, the value of :math:`g_f` on the boundary
    (:math:`g_f(p, 1/p)` or :math:`g_f(p, 0)`); ``level`` is :math:`\sup_p G` — for δ at or above it the side
    saturates for every p.

    Parameters
    ----------
    never : bool
        The side never saturates (:math:`\tilde f(0) = \infty`).
    threshold : sympy.Expr or None
        Closed form of the threshold in :data:`DELTA` (valid for δ below ``level``), or None when SymPy found
        none (the call then solves :math:`G(p) = \delta` numerically).
    """

    never: bool
    threshold: sp.Expr | None
    side: str = "upper"
    boundary: sp.Expr | None = None
    level: sp.Expr = sp.oo
    divergence: Divergence | None = field(default=None, repr=False, compare=False)

    def __call__(self, delta: float) -> float:
        """Numeric threshold on p at ``delta``; ``inf`` (upper) / ``0.0`` (lower) when the side never saturates."""
        delta = float(delta)
        if not delta > 0:
            raise ValueError(f"delta must be > 0, got {delta!r}")
        if self.never:
            return math.inf if self.side == "upper" else 0.0
        if self.level != sp.oo and delta >= float(self.level):
            return 0.0 if self.side == "upper" else 1.0
        if self.threshold is not None:
            value = complex(sp.lambdify(DELTA, self.threshold, "mpmath")(mp.mpf(delta)))
            return min(1.0, max(0.0, value.real))
        return float(_boundary_root(self.divergence, self.side, delta))


@dataclass(frozen=True)
class Derivation:
    r"""Everything SymPy derives about the Band of one divergence (see the module docstring for the maths).

    Attributes
    ----------
    divergence : Divergence
    g : sympy.Expr
        :math:`g_f(p, r)` in :data:`P`, :data:`R` (a ``Piecewise`` at :math:`r = 1` for kinked generators).
    f_normalised : sympy.Expr
        :math:`\tilde f(u)`.
    f2 : sympy.Expr
        :math:`f''(1)` (0 for a kink at 1).
    upper, lower : sympy.Expr or None
        Closed forms :math:`r_{up}(p, \delta)`, :math:`r_{lo}(p, \delta)`, valid wherever that side is not
        saturated (None: no validated closed form; ``notes`` says why).  Evaluate them in complex arithmetic
        when they contain cube roots (Cardano); the value is real.
    saturation_upper, saturation_lower : Saturation
    limits : dict
        ``"upper_p0"``, ``"upper_p1"``, ``"lower_p0"``, ``"lower_p1"`` (limits of the ratio bounds as
        :math:`p \to 0, 1` at fixed δ below the saturation level) and ``"q_upper_p0"`` (:math:`\lim p\,r_{up}`).
        A key is absent when the limit has no closed form; :meth:`limit_value` then computes it numerically.
    series : tuple
        :math:`(t, a_2, a_3)`; for a kinked generator ``t = δ/(pJ)`` and the coefficients are 0 when the Band
        is exactly linear (``nan`` when they were not derived).
    notes : tuple of str
        Plain statements of what was found, rejected or not attempted, and why.
    """

    divergence: Divergence
    g: sp.Expr
    f_normalised: sp.Expr
    f2: sp.Expr
    upper: sp.Expr | None
    lower: sp.Expr | None
    saturation_upper: Saturation
    saturation_lower: Saturation
    limits: dict[str, sp.Expr]
    series: tuple[sp.Expr, sp.Expr, sp.Expr]
    notes: tuple[str, ...]
    limit_equation: sp.Expr | None = field(default=None, repr=False)

    def limit_value(self, key: str, delta: float) -> float:
        """The limit ``key`` at ``delta`` as a float: from ``limits`` when closed, else solved numerically."""
        if key not in _LIMIT_KEYS:
            raise ValueError(f"key must be one of {_LIMIT_KEYS}, got {key!r}")
        if not float(delta) > 0:
            raise ValueError(f"delta must be > 0, got {delta!r}")
        level = self.saturation_upper.level
        q0_saturated = not self.saturation_upper.never and level != sp.oo and float(delta) >= float(level)
        if key in ("q_upper_p0", "lower_p1") and q0_saturated:
            return 1.0 if key == "q_upper_p0" else 0.0  # q_up → 1: all mass moves onto the token
        if key in self.limits:
            return float(sp.N(self.limits[key].subs(DELTA, sp.Float(delta, 30)), 20))
        q0 = _asymptotic_root(self.limit_equation, delta)
        return float(q0) if key == "q_upper_p0" else float(1 - q0)

    def to_markdown(self, *, verified: bool = True) -> str:
        """A readable report with LaTeX formulas (deterministic: no timings, no dates).

        With ``verified`` the report carries ``bandcore.verify.summary_line`` (a CVXPY check, seconds) between
        its ``verified`` markers when that function exists; otherwise the place stays empty.
        """
        return _markdown(self, verified)

    def to_text(self, delta: float = 0.05) -> str:
        """The same report for a terminal, with numbers evaluated at ``delta``."""
        return _text(self, delta)


_LIMIT_KEYS = ("upper_p0", "q_upper_p0", "upper_p1", "lower_p0", "lower_p1")


def derive(divergence: str | Divergence, **params: float) -> Derivation:
    """Derive the Band of ``divergence`` (a name, alias or :class:`Divergence`); cached per divergence.

    >>> d = derive("pearson")
    >>> d.upper
    sqrt(delta)*sqrt(1 - p)/sqrt(p) + 1
    """
    return _derive(get_divergence(divergence, **params))


def catalogue() -> list[Divergence]:
    """The divergences reported in ``derivations/``: the catalogue (α = 3) plus α ∈ {2, −1, ½}."""
    named = [get_divergence(name) for name in list_divergences()]
    return named + [get_divergence("alpha", alpha=a) for a in _ALPHA_EXTRA]


# --------------------------------------------------------------------------------------------------------
# Bounded SymPy calls
# --------------------------------------------------------------------------------------------------------


class _OutOfTime(Exception):
    """A SymPy call ran past its time limit."""


@contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """Interrupt the block after ``seconds`` (SIGALRM; only in the main thread — elsewhere the degree bound
    of :func:`_solve` is what keeps calls finite)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def _alarm(signum, frame):
        raise _OutOfTime

    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _bounded(fn: Callable[[], sp.Expr], seconds: float = _SOLVE_SECONDS):
    """``fn()`` or None if it runs past ``seconds`` or SymPy gives up."""
    try:
        with _time_limit(seconds):
            return fn()
    except (_OutOfTime, NotImplementedError, sp.PolynomialError, ValueError, TypeError, ZeroDivisionError):
        return None


def _tidy(expr: sp.Expr) -> sp.Expr:
    """A shorter equivalent form when SymPy finds one quickly (small expressions only)."""
    if sp.count_ops(expr) > _SIMPLIFY_MAX_OPS:
        return expr
    simpler = _bounded(lambda: sp.simplify(expr), _SIMPLIFY_SECONDS)
    return simpler if simpler is not None and sp.count_ops(simpler) <= sp.count_ops(expr) else expr


def _transcendental_atoms(expr: sp.Expr, x: sp.Symbol) -> set[sp.Expr]:
    """Sub-expressions that make ``expr`` non-algebraic in ``x`` (log, exp, x-dependent exponents, ...)."""
    found = set()
    for node in sp.preorder_traversal(expr):
        if isinstance(node, sp.Function) and not isinstance(node, sp.Abs) and node.has(x):
            found.add(node)
        elif isinstance(node, sp.Pow) and node.exp.has(x):
            found.add(node)
    return found


def _degenerate_points(factor: sp.Expr, variable: sp.Symbol, what: str) -> list[str]:
    """Note where the leading coefficient of a solved factor vanishes for p in (0, 1): the root formulas are
    singular there and the valid branch may change across such a point."""
    if sp.degree(factor, variable) < 2:
        return []
    leading = sp.factor(sp.Poly(factor, variable).LC())
    if leading.free_symbols != {P}:
        return []
    zeros = _bounded(lambda: [z for z in sp.solve(leading, P) if z.is_real and 0 < z < 1], _SIMPLIFY_SECONDS)
    if not zeros:
        return []
    return [
        f"{what}: the leading coefficient {sp.sstr(leading)} of the degree-{sp.degree(factor, variable)} "
        f"equation vanishes at p = {', '.join(map(sp.sstr, zeros))}; the root formulas are singular there and "
        "the valid branch can change across it"
    ]


def _solve(expr: sp.Expr, x: sp.Symbol, what: str) -> tuple[list[sp.Expr], list[str]]:
    """Candidate closed-form roots of ``expr = 0`` in ``x``, found by calls that cannot run away.

    Algebraic equations: clear denominators and radicals (``unrad``), factor, solve factors of degree ≤ 4
    with ``roots``.  One transcendental generator (``log(1 - q) = -δ``): SymPy's ``solve`` under a time
    limit.  Several generators, or one mixed with x outside it (Lambert-W type): no solver is run.
    Returns (candidates, notes); candidates are unvalidated.
    """
    expr = sp.expand(expr)
    atoms = _transcendental_atoms(expr, x)
    if atoms:
        marker = sp.Dummy("z")
        if len(atoms) > 1 or expr.subs(next(iter(atoms)), marker).has(x):
            shown = ", ".join(sorted(sp.sstr(a) for a in atoms))
            return [], [
                f"{what}: no closed form — the equation is transcendental in {x} (terms {shown}); it has no "
                "elementary solution in general, so no solver was run on it"
            ]
        found = _bounded(lambda: sp.solve(expr, x))
        if not found:
            return [], [f"{what}: no closed form — SymPy's solve returned no root (or ran past its time limit)"]
        return list(found), []
    numerator = sp.fraction(sp.together(expr))[0]
    cleared = None
    if any(isinstance(a, sp.Pow) and a.has(x) and not a.exp.is_integer for a in sp.preorder_traversal(numerator)):
        try:
            with _time_limit(_SOLVE_SECONDS):
                cleared = unrad(numerator, x)
        except (_OutOfTime, NotImplementedError) as err:
            return [], [f"{what}: no closed form — its radicals could not be cleared ({type(err).__name__})"]
    polynomial, cov = (numerator, []) if cleared is None else cleared
    variable = cov[0] if cov else x
    factored = _bounded(lambda: sp.factor_list(sp.expand(polynomial), variable))
    if factored is None:
        return [], [f"{what}: no closed form — SymPy could not factor the {variable}-polynomial in time"]
    candidates, notes = [], []
    for factor, _ in factored[1]:
        degree = sp.degree(factor, variable)
        if degree == 0:
            continue
        if degree > _MAX_DEGREE:
            notes.append(
                f"{what}: a factor of degree {degree} in {variable} was not solved (no general formula above "
                f"degree {_MAX_DEGREE})"
            )
            continue
        found = _bounded(lambda factor=factor: sp.roots(sp.Poly(factor, variable), multiple=True))
        if not found:
            notes.append(f"{what}: SymPy's roots found no formula for a degree-{degree} factor")
            continue
        candidates.extend(found)
        notes.extend(_degenerate_points(factor, variable, what))
    if cov and candidates:
        back = _bounded(lambda: sp.solve(cov[1], x))
        if not back or len(back) != 1:
            return [], [f"{what}: no closed form — the change of variable {sp.sstr(cov[1])} = 0 has no single inverse"]
        candidates = [back[0].subs(variable, c) for c in candidates]
    return sorted(set(candidates), key=sp.default_sort_key), notes


# --------------------------------------------------------------------------------------------------------
# Numerics for validation (mpmath, 30 digits)
# --------------------------------------------------------------------------------------------------------


@lru_cache(maxsize=64)
def _mp_generator(div: Divergence) -> tuple[Callable, mp.mpf]:
    f_tilde = sp.lambdify(U, div.f_normalised, "mpmath")
    f0 = div.f_at_zero
    return f_tilde, (mp.inf if f0 == sp.oo else mp.mpf(str(sp.N(f0, 40))))


def _g_mp(div: Divergence, p: mp.mpf, r: mp.mpf) -> mp.mpf:
    """:math:`g_f(p, r)` straight from the definition (not from the simplified ``g``)."""
    f_tilde, f0 = _mp_generator(div)
    s = (1 - p * r) / (1 - p)
    if s < 0:
        return mp.inf
    fr = f0 if r == 0 else mp.re(f_tilde(r))
    fs = f0 if s == 0 else mp.re(f_tilde(s))
    return p * fr + (1 - p) * fs


def _find_root(h: Callable, a: mp.mpf, b: mp.mpf) -> mp.mpf:
    """Root of h in the bracket [a, b] (h(a), h(b) of opposite signs): Illinois steps, bisection fallback."""
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


def _g_edge(div: Divergence, p: mp.mpf, side: str) -> mp.mpf:
    r""":math:`G(p)`: :math:`g_f(p, 1/p) = p\tilde f(1/p) + (1-p)\tilde f(0)` (upper) or
    :math:`g_f(p, 0) = p\tilde f(0) + (1-p)\tilde f(1/(1-p))` (lower), without forming 1 - p·(1/p)."""
    f_tilde, f0 = _mp_generator(div)
    if side == "upper":
        return p * mp.re(f_tilde(1 / p)) + (1 - p) * f0
    return p * f0 + (1 - p) * mp.re(f_tilde(1 / (1 - p)))


def _classify(div: Divergence, side: str, p: float, delta: float) -> str:
    """``"saturated"``, ``"edge"`` (within 1e-9 relative of the threshold: neither answer is well-conditioned)
    or ``"root"`` (the side ends at a root of g_f(p, r) = δ)."""
    edge = _g_edge(div, mp.mpf(p), side)
    if abs(edge - delta) <= 1e-9 * delta:
        return "edge"
    return "saturated" if edge < delta else "root"


def _reference_log_root(div: Divergence, side: str, p: float, delta: float) -> mp.mpf:
    """log r of the bracketed root of g_f(p, r) = δ on ``side`` (the side must not be saturated)."""
    p, delta = mp.mpf(p), mp.mpf(delta)

    def h(y):
        return _g_mp(div, p, mp.exp(y)) - delta

    if side == "upper":
        return _find_root(h, mp.mpf(0), -mp.log(p))
    outside = mp.mpf(-1)
    while h(outside) <= 0:  # the root lies further out: expand geometrically
        outside *= 2
    return _find_root(h, mp.mpf(0), outside)


def _brackets_root(div: Divergence, side: str, p: float, delta: float, value: mp.mpf) -> bool:
    r"""True iff the root of g_f(p, r) = δ on ``side`` lies within a relative :data:`_MATCH` of ``value`` in
    :math:`\log r`: g_f(p, ·) is monotone on each side of r = 1, so a sign change of g_f - δ across
    :math:`[y(1 - \epsilon), y(1 + \epsilon)]` brackets the (unique) root."""
    y = mp.log(value)
    if (y > 0) != (side == "upper") or y == 0:
        return False
    p, delta = mp.mpf(p), mp.mpf(delta)
    inner, outer = y * (1 - _MATCH), y * (1 + _MATCH)
    return _g_mp(div, p, mp.exp(inner)) < delta < _g_mp(div, p, mp.exp(outer))


def _evaluate(fn: Callable, *args: float) -> mp.mpf | None:
    """Real value of a lambdified candidate at 30 digits (None if complex, infinite or undefined)."""
    try:
        value = fn(*[mp.mpf(a) for a in args])
    except (ZeroDivisionError, ValueError, TypeError, OverflowError):
        return None
    value = mp.mpc(value)
    if not (mp.isfinite(value.real) and mp.isfinite(value.imag)):
        return None
    if abs(value.imag) > mp.mpf(10) ** (10 - _DPS) * max(1, abs(value.real)):
        return None
    return value.real


@lru_cache(maxsize=256)
def _grid(div: Divergence, side: str) -> dict[str, tuple[tuple[float, float], ...]]:
    """The validation grid split by what the side does there."""
    with mp.workdps(_DPS):
        kinds = {(p, d): _classify(div, side, p, d) for p in _P_GRID for d in _DELTA_GRID}
    return {kind: tuple(pt for pt, k in kinds.items() if k == kind) for kind in ("root", "saturated")}


def _validate_branch(div: Divergence, side: str, candidates: list[sp.Expr]) -> tuple[sp.Expr | None, list[str]]:
    """Keep the one candidate whose value brackets the root at every unsaturated grid point."""
    if not candidates:
        return None, []
    grid = _grid(div, side)
    notes, accepted = [], None
    with mp.workdps(_DPS):
        for index, candidate in enumerate(candidates, 1):
            fn = sp.lambdify((P, DELTA), candidate, "mpmath")
            label = f"{side} bound: candidate {index} of {len(candidates)}"
            failure = None
            for p, d in grid["root"]:
                value = _evaluate(fn, p, d)
                if value is None or value <= 0:
                    failure = f"not a positive real number at (p, δ) = ({p:g}, {d:g})"
                    break
                if not _brackets_root(div, side, p, d, value):
                    root = mp.exp(_reference_log_root(div, side, p, d))
                    where = "r > 1" if value > 1 else "r < 1"
                    failure = (
                        f"gives r = {mp.nstr(value, 6)} ({where}) at (p, δ) = ({p:g}, {d:g}) where the root is "
                        f"r = {mp.nstr(root, 6)}"
                    )
                    break
            if failure is not None:
                notes.append(f"{label} rejected: {failure}")
            elif accepted is not None:
                notes.append(f"{label} duplicates the accepted branch numerically")
            else:
                accepted = candidate
                notes.append(
                    f"{label} accepted: brackets the root to {_MATCH:g} (relative, in log r) at all "
                    f"{len(grid['root'])} unsaturated grid points"
                )
                notes.extend(_outside_region(fn, side, grid["saturated"]))
    return accepted, notes


def _outside_region(fn: Callable, side: str, saturated: list[tuple[float, float]]) -> list[str]:
    """What an accepted formula returns where the side saturates (so the caller knows why to clip)."""
    if not saturated:
        return []
    spurious, clipped = [], 0
    for p, d in saturated:
        value = _evaluate(fn, p, d)
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


# --------------------------------------------------------------------------------------------------------
# The derivation
# --------------------------------------------------------------------------------------------------------


def _on_side(expr: sp.Expr, side: str) -> sp.Expr | None:
    """``expr`` (in u) with every Abs resolved for u > 1 (``side='gt'``) or 0 < u < 1 (``'lt'``).

    The sign of each Abs argument is read on a dense grid of that side; None if it changes sign there
    (a kink away from u = 1).
    """
    grid = 1 + np.logspace(-6, 6, 61) if side == "gt" else np.logspace(-12, -1e-7, 61)
    replacements = {}
    for node in expr.atoms(sp.Abs):
        inner = node.args[0]
        with np.errstate(all="ignore"):
            values = np.asarray(sp.lambdify(U, inner, "numpy")(grid), dtype=float) * np.ones_like(grid)
        if np.all(values >= 0):
            replacements[node] = inner
        elif np.all(values <= 0):
            replacements[node] = -inner
        else:
            return None
    return expr.xreplace(replacements)


def _binary(f_side_r: sp.Expr, f_side_s: sp.Expr) -> sp.Expr:
    s = (1 - P * R) / (1 - P)
    return P * f_side_r.subs(U, R) + (1 - P) * f_side_s.subs(U, s)


def _display_g(div: Divergence, pieces: dict[str, sp.Expr | None]) -> sp.Expr:
    """g_f in its shortest honest form: factored when rational in r, |r - 1| or Piecewise at a kink."""
    def tidy(g):
        rational = not _transcendental_atoms(g, R) and all(
            a.exp.is_integer for a in sp.preorder_traversal(g) if isinstance(a, sp.Pow)
        )
        return sp.factor(sp.together(g)) if rational else g

    if not div.f_normalised.has(sp.Abs):
        return tidy(_binary(div.f, div.f))  # p f(r) + (1-p) f(s): the linear part of f cancels
    if pieces["upper"] is None or pieces["lower"] is None:
        return _binary(div.f_normalised, div.f_normalised)
    up, lo = tidy(pieces["upper"]), tidy(pieces["lower"])
    if sp.simplify(lo - up.subs(R, 2 - R)) == 0:
        return sp.factor(up).subs(R, 1 + sp.Abs(R - 1))  # g depends on |r - 1| only
    return sp.Piecewise((lo, R < 1), (up, True))


def _boundary_values(div: Divergence) -> tuple[sp.Expr | None, sp.Expr | None, sp.Expr]:
    r"""G_up(p) = g(p, 1/p) = p f̃(1/p) + (1-p) f̃(0) and G_lo(p) = g(p, 0); and their common sup level."""
    f0 = div.f_at_zero
    level = sp.simplify(div.slope_at_infinity + f0)  # G_up(0+) = G_lo(1-)
    if f0 == sp.oo:
        return None, None, sp.oo
    above = _on_side(div.f_normalised, "gt")
    if above is None:
        return None, None, level
    g_up = _tidy(P * above.subs(U, 1 / P) + (1 - P) * f0)
    g_lo = _tidy(P * f0 + (1 - P) * above.subs(U, 1 / (1 - P)))
    return g_up, g_lo, level


def _boundary_root(div: Divergence, side: str, delta: float) -> mp.mpf:
    """Numeric threshold: the p in (0, 1) with G(p) = δ (G decreasing for the upper side, increasing lower)."""
    with mp.workdps(_DPS):
        sign = 1 if side == "upper" else -1

        def h(p):
            return sign * (_g_edge(div, p, side) - mp.mpf(delta))  # > 0 near p = 0 for both sides

        a, b = mp.mpf(10) ** (8 - _DPS), 1 - mp.mpf(10) ** (8 - _DPS)
        if h(a) <= 0:
            return mp.mpf(0)
        if h(b) >= 0:
            return mp.mpf(1)
        return _find_root(lambda p: -h(p), a, b)


def _threshold_ok(div: Divergence, side: str, candidate: sp.Expr, level: sp.Expr) -> bool:
    """True iff ``candidate(δ)`` brackets the root of G(p) = δ to :data:`_MATCH` (relative to min(p, 1 - p)) on
    the δ grid below ``level`` (G is monotone in p, so a sign change across the bracket proves it)."""
    fn = sp.lambdify(DELTA, candidate, "mpmath")
    sign = 1 if side == "upper" else -1  # G_up decreases in p, G_lo increases
    with mp.workdps(_DPS):
        for d in (d for d in _DELTA_GRID if level == sp.oo or d < float(level) * (1 - 1e-9)):
            t = _evaluate(fn, d)
            if t is None or not 0 < t < 1:
                return False
            eta = _MATCH * min(t, 1 - t)
            if not sign * (_g_edge(div, t - eta, side) - d) > 0 > sign * (_g_edge(div, t + eta, side) - d):
                return False
    return True


def _saturation(div: Divergence, side: str, boundary: sp.Expr | None, level: sp.Expr) -> tuple[Saturation, list[str]]:
    if div.f_at_zero == sp.oo:
        edge = "1/p" if side == "upper" else "0"
        return Saturation(True, None, side, None, sp.oo), [
            f"{side} bound never saturates (never reaches {edge}): f̃(0) = oo"
        ]
    if boundary is None:
        return Saturation(False, None, side, None, level), [
            f"{side} saturation: f has a kink away from u = 1; threshold not derived"
        ]
    candidates, notes = _solve(boundary - DELTA, P, f"{side} saturation threshold")
    accepted = None
    for candidate in candidates:
        if _threshold_ok(div, side, candidate, level):
            tidy = _tidy(candidate)
            accepted = tidy if tidy is candidate or _threshold_ok(div, side, tidy, level) else candidate
            break
    if candidates and accepted is None:
        notes.append(f"{side} saturation threshold: no SymPy root matched the numeric threshold; solved numerically")
    word = "p ≥" if side == "upper" else "p ≤"
    if accepted is not None:
        valid = "" if level == sp.oo else f" (for δ < {sp.sstr(level)})"
        notes.append(f"{side} bound saturates iff {word} {sp.sstr(accepted)}{valid}")
    if level != sp.oo:
        notes.append(f"{side} bound saturates for every p once δ ≥ {sp.sstr(level)}")
    return Saturation(False, accepted, side, boundary, level, div), notes


def _asymptotic_root(equation: sp.Expr, delta: float) -> mp.mpf:
    """q in (0, 1) solving the p → 0 equation q·slope + f̃(1 - q) = δ (increasing in q)."""
    with mp.workdps(_DPS):
        fn = sp.lambdify((_Q, DELTA), equation, "mpmath")
        d = mp.mpf(delta)
        return _find_root(lambda q: mp.re(fn(q, d)), mp.mpf(0), 1 - mp.mpf(10) ** (8 - _DPS))


def _limits(div: Divergence, upper, lower, level) -> tuple[dict[str, sp.Expr], sp.Expr | None, list[str]]:
    r"""Limits of the bounds as p → 0 and p → 1 at fixed δ below the saturation level.

    For fixed r, g_f(p, r) → 0 as p → 0, so every r > 1 is eventually feasible: r_up → ∞, r_lo → 0
    (or both sides saturate).  q_up(0+) solves q·lim f̃(u)/u + f̃(1 - q) = δ.  r_up ≤ 1/p gives
    r_up → 1 as p → 1, and mirror symmetry q_lo(p) = 1 - q_up(1 - p) gives r_lo(1-) = 1 - q_up(0+).
    """
    notes = []
    limits = {"upper_p0": sp.oo, "upper_p1": sp.Integer(1), "lower_p0": sp.Integer(0)}
    slope = div.slope_at_infinity
    below = _on_side(div.f_normalised, "lt")
    equation = None
    if slope == sp.oo:
        q0 = sp.Integer(0)
        notes.append("p → 0: lim f̃(u)/u = oo, so q_up = p r_up → 0 (while r_up → oo)")
    elif below is None:
        q0 = None
    else:
        equation = sp.expand(_Q * slope + below.subs(U, 1 - _Q) - DELTA)
        candidates, solve_notes = _solve(equation, _Q, "limit q_up(p → 0)")
        q0 = None
        with mp.workdps(_DPS):
            for candidate in candidates:
                fn = sp.lambdify(DELTA, candidate, "mpmath")
                deltas = [d for d in _DELTA_GRID if d < float(level) * (1 - 1e-9)]
                if all(
                    (v := _evaluate(fn, d)) is not None
                    and abs(v - _asymptotic_root(equation, d)) <= _MATCH * abs(_asymptotic_root(equation, d))
                    for d in deltas
                ):
                    q0 = _tidy(candidate)
                    break
        if q0 is None:
            notes.extend(solve_notes)
            notes.append(
                f"p → 0: q_up → q₀ with {sp.sstr(sp.Eq(equation + DELTA, DELTA))}; no closed form, computed "
                "numerically (Derivation.limit_value)"
            )
    if upper is not None and q0 is not None:
        from_closed = _bounded(lambda: sp.limit(P * upper, P, 0, "+"), 4.0)
        if from_closed is not None and _close(from_closed, q0):
            notes.append("p → 0 limit of p·r_up from the closed form agrees with the asymptotic equation")
        elif from_closed is not None:
            notes.append(f"p → 0 limit of p·r_up from the closed form is {sp.sstr(from_closed)} (check)")
    if q0 is not None:
        limits["q_upper_p0"] = q0
        limits["lower_p1"] = _tidy(1 - q0)
        if lower is not None:
            from_closed = _bounded(lambda: sp.limit(lower, P, 1, "-"), 4.0)
            if from_closed is not None and not _close(from_closed, 1 - q0):
                notes.append(f"p → 1 limit of r_lo from the closed form is {sp.sstr(from_closed)} (check)")
    return limits, equation, notes


def _close(a: sp.Expr, b: sp.Expr) -> bool:
    for d in (sp.Rational(1, 100), sp.Rational(3, 10)):
        x, y = complex(sp.N(a.subs(DELTA, d), 30)), complex(sp.N(b.subs(DELTA, d), 30))
        if abs(x - y) > 1e-20 * max(1.0, abs(y)):
            return False
    return True


@lru_cache(maxsize=1)
def series_coefficients() -> tuple[sp.Expr, sp.Expr]:
    r"""(a₂, a₃) of :math:`r = 1 + t + a_2 t^2 + a_3 t^3`, :math:`t^2 = 2\delta(1-p)/(p f_2)`, in :data:`P` and
    the symbols ``f_2, f_3, f_4``, found by reverting the Taylor series of :math:`g_f(p, 1 + x) = \delta`.

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


def _series(div: Divergence) -> tuple[tuple[sp.Expr, sp.Expr, sp.Expr], list[str]]:
    f2, f3, f4 = div.derivatives_at_one
    if div.is_smooth_at_one:
        a2, a3 = series_coefficients()
        values = dict(zip(sp.symbols("f_2 f_3 f_4"), (f2, f3, f4), strict=True))
        t = sp.sqrt(2 * DELTA * (1 - P) / (P * f2))
        return (t, sp.factor(a2.subs(values)), sp.factor(a3.subs(values))), [
            "small δ: r = 1 + t + a₂t² + a₃t³ + O(t⁴), t = +√(2δ(1−p)/(p f''(1))) for the upper bound, "
            "−√(…) for the lower"
        ]
    derivative = sp.diff(div.f, U)
    jump = sp.simplify(sp.limit(derivative, U, 1, "+") - sp.limit(derivative, U, 1, "-"))
    if jump == 0:
        return (sp.nan, sp.nan, sp.nan), [
            "f''(1) = 0 and f has no kink at u = 1: g_f is flatter than quadratic at r = 1, so the Band is not "
            "a series in √δ; the small-δ series was not derived"
        ]
    t = DELTA / (P * jump)
    above, below = _on_side(div.f_normalised, "gt"), _on_side(div.f_normalised, "lt")
    linear = above is not None and below is not None and sp.diff(above, U, 2) == 0 and sp.diff(below, U, 2) == 0
    if linear:
        return (t, sp.Integer(0), sp.Integer(0)), [
            f"f''(1) = 0: f has a kink at u = 1 with slope jump J = {sp.sstr(jump)} and is linear on each side, "
            f"so g_f = pJ|r − 1| near 1 and the Band is exactly r = 1 ± δ/(pJ) (no higher terms)"
        ]
    return (t, sp.nan, sp.nan), [
        f"f''(1) = 0: kink at u = 1 with slope jump J = {sp.sstr(jump)}; to first order r = 1 ± δ/(pJ); "
        "the higher coefficients differ on the two sides of the kink and were not derived"
    ]


@lru_cache(maxsize=128)
def _derive(div: Divergence) -> Derivation:
    notes: list[str] = []
    sides = {"upper": ("gt", "lt"), "lower": ("lt", "gt")}  # (side of r, side of s)
    pieces: dict[str, sp.Expr | None] = {}
    closed: dict[str, sp.Expr | None] = {}
    for side, (r_side, s_side) in sides.items():
        f_r, f_s = _on_side(div.f_normalised, r_side), _on_side(div.f_normalised, s_side)
        if f_r is None or f_s is None:
            pieces[side] = closed[side] = None
            notes.append(f"{side} bound: no closed form attempted — |·| in f changes sign away from u = 1")
            continue
        pieces[side] = _binary(f_r, f_s)
        candidates, solve_notes = _solve(pieces[side] - DELTA, R, f"{side} bound")
        notes.extend(solve_notes)
        branch, branch_notes = _validate_branch(div, side, candidates)
        notes.extend(branch_notes)
        if branch is not None:
            tidy = _tidy(branch)
            if tidy is not branch:
                tidy_ok, _ = _validate_branch(div, side, [tidy])
                branch = tidy if tidy_ok is not None else branch
        elif candidates:
            notes.append(f"{side} bound: no closed form — SymPy's roots gave no branch valid on the whole region")
        closed[side] = branch
    g_up, g_lo, level = _boundary_values(div)
    saturation_upper, sat_notes = _saturation(div, "upper", g_up, level)
    notes.extend(sat_notes)
    saturation_lower, sat_notes = _saturation(div, "lower", g_lo, level)
    notes.extend(sat_notes)
    limits, equation, limit_notes = _limits(div, closed["upper"], closed["lower"], level)
    notes.extend(limit_notes)
    series, series_notes = _series(div)
    notes.extend(series_notes)
    return Derivation(
        divergence=div,
        g=_display_g(div, pieces),
        f_normalised=div.f_normalised,
        f2=div.f2,
        upper=closed["upper"],
        lower=closed["lower"],
        saturation_upper=saturation_upper,
        saturation_lower=saturation_lower,
        limits=limits,
        series=series,
        notes=tuple(notes),
        limit_equation=equation,
    )


# --------------------------------------------------------------------------------------------------------
# Reports
# --------------------------------------------------------------------------------------------------------

_LIMIT_LABELS = {
    "upper_p0": (r"\lim_{p\to 0} r_{up}", "r_up (p → 0)"),
    "q_upper_p0": (r"\lim_{p\to 0} p\,r_{up}", "q_up = p·r_up (p → 0)"),
    "upper_p1": (r"\lim_{p\to 1} r_{up}", "r_up (p → 1)"),
    "lower_p0": (r"\lim_{p\to 0} r_{lo}", "r_lo (p → 0)"),
    "lower_p1": (r"\lim_{p\to 1} r_{lo}", "r_lo (p → 1)"),
}
_REPORT_DELTA = 0.05
_VERIFIED_BEGIN, _VERIFIED_END = "<!-- verified: begin -->", "<!-- verified: end -->"


def _tex(expr: sp.Expr) -> str:
    return sp.latex(expr, ln_notation=True)


def _number(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:.10g}"


def _threshold_tex(sat: Saturation) -> str:
    word = r"p \ge" if sat.side == "upper" else r"p \le"
    edge = "1/p" if sat.side == "upper" else "0"
    if sat.never:
        return f"never (the bound never reaches ${edge}$)"
    if sat.threshold is not None:
        text = f"${word} {_tex(sat.threshold)}$"
    else:
        text = f"${word} p^*(\\delta)$ with $G(p^*) = \\delta$, $G(p) = {_tex(sat.boundary)}$ (numeric)"
    if sat.level != sp.oo:
        text += f"; always once $\\delta \\ge {_tex(sat.level)}$"
    return text


def _threshold_text(sat: Saturation, delta: float) -> str:
    word = "p ≥" if sat.side == "upper" else "p ≤"
    if sat.never:
        return "never"
    formula = sp.sstr(sat.threshold) if sat.threshold is not None else "numeric"
    return f"{word} {_number(sat(delta))}  ({formula})"


def _limit_cells(d: Derivation, key: str, delta: float) -> tuple[str, str]:
    if key in d.limits:
        return f"${_tex(d.limits[key])}$", sp.sstr(d.limits[key])
    value = _number(d.limit_value(key, delta))
    return f"{value} at $\\delta = {delta:g}$ (numeric)", f"{value} (numeric, δ = {delta:g})"


def _series_parts(d: Derivation) -> tuple[str, str] | None:
    t, a2, a3 = d.series
    if t is sp.nan or t.has(sp.nan):
        return None
    if d.divergence.is_smooth_at_one:
        tex = (
            r"r = 1 + t + a_2 t^2 + a_3 t^3 + O(t^4),\quad t = \pm " + _tex(t)
            + rf",\quad a_2 = {_tex(a2)},\quad a_3 = {_tex(a3)}"
        )
        text = f"r = 1 + t + a2 t² + a3 t³ + O(t⁴),  t = ±{sp.sstr(t)},  a2 = {sp.sstr(a2)},  a3 = {sp.sstr(a3)}"
        return tex, text
    if a2 == 0 and a3 == 0:
        return rf"r = 1 \pm {_tex(t)}\ \text{{(exact)}}", f"r = 1 ± {sp.sstr(t)}  (exact)"
    return rf"r = 1 \pm {_tex(t)} + O(\delta^2)", f"r = 1 ± {sp.sstr(t)} + O(δ²)"


@lru_cache(maxsize=64)
def _verified_line(div: Divergence) -> str | None:
    """``bandcore.verify.summary_line(div)`` when that module provides it, else None (the line is omitted)."""
    try:
        module = import_module("bandcore.verify")
    except ModuleNotFoundError as err:
        if err.name == "bandcore.verify":
            return None
        raise
    summary = getattr(module, "summary_line", None)
    return summary(div) if callable(summary) else None


def _markdown(d: Derivation, verified: bool) -> str:
    div = d.divergence
    f2, f3, f4 = div.derivatives_at_one
    out = [f"# The Band of `{div.name}`", ""]
    if div.convention or div.reference:
        out += [" — ".join(x for x in (div.convention, div.reference) if x), ""]
    out += [
        "## Generator",
        "",
        "| quantity | value |",
        "| --- | --- |",
        f"| $f(u)$ | ${_tex(div.f)}$ |",
        f"| $\\tilde f(u) = f(u) - f'(1)(u - 1)$ | ${_tex(d.f_normalised)}$ |",
        f"| $f''(1),\\ f'''(1),\\ f''''(1)$ | ${_tex(f2)},\\ {_tex(f3)},\\ {_tex(f4)}$ |",
        f"| $\\tilde f(0^+)$ | ${_tex(div.f_at_zero)}$ |",
        f"| $\\lim_{{u\\to\\infty}} \\tilde f(u)/u$ | ${_tex(div.slope_at_infinity)}$ |",
        "",
        "## Binary reduction",
        "",
        "With $s = (1 - p r)/(1 - p)$ (the other tokens keep their old proportions), the token's ratio $r$ is in",
        "the Band iff $g_f(p, r) = p\\,\\tilde f(r) + (1-p)\\,\\tilde f(s) \\le \\delta$, where",
        "",
        f"$$g_f(p, r) = {_tex(d.g)}$$",
        "",
        "## Closed forms",
        "",
        "Valid wherever that side is not saturated (see below); every branch was validated numerically.",
        "",
    ]
    for side, expr in (("upper", d.upper), ("lower", d.lower)):
        name = "r_{up}" if side == "upper" else "r_{lo}"
        if expr is None:
            out += [f"- ${name}$: **none** — {_closed_form_reason(d, side)}", ""]
        else:
            out += [f"- ${name}(p, \\delta)$:", "", f"$${_tex(expr)}$$", ""]
    out += [
        "## Saturation",
        "",
        f"- upper bound $= 1/p$ iff {_threshold_tex(d.saturation_upper)}",
        f"- lower bound $= 0$ iff {_threshold_tex(d.saturation_lower)}",
        f"- at $\\delta = {_REPORT_DELTA:g}$: upper saturates for $p \\ge$ "
        f"{_number(d.saturation_upper(_REPORT_DELTA))}, lower for $p \\le$ "
        f"{_number(d.saturation_lower(_REPORT_DELTA))}",
        "",
        "## Limits at fixed δ",
        "",
        "| limit | value |",
        "| --- | --- |",
    ]
    for key, (label, _) in _LIMIT_LABELS.items():
        out.append(f"| ${label}$ | {_limit_cells(d, key, _REPORT_DELTA)[0]} |")
    out += ["", "## Small-δ series", ""]
    series = _series_parts(d)
    out += [f"$${series[0]}$$" if series else "not derived (see the notes)", ""]
    out += ["## Notes", ""] + [f"- {note}" for note in d.notes] + [""]
    out += ["## Verification", "", _VERIFIED_BEGIN]
    line = _verified_line(div) if verified else None
    if line:
        out.append(line)
    out += [_VERIFIED_END, "", "Generated by `bandcore derivations`; do not edit by hand.", ""]
    return "\n".join(out)


def _closed_form_reason(d: Derivation, side: str) -> str:
    for note in d.notes:
        if note.startswith(f"{side} bound: no closed form"):
            return note.split("no closed form — ", 1)[-1]
    return "SymPy found no valid branch"


def _text(d: Derivation, delta: float) -> str:
    div = d.divergence
    f2, f3, f4 = div.derivatives_at_one
    lines = [
        f"Band of {div.name}:  f(u) = {sp.sstr(div.f)}",
        *([f"  {div.convention}"] if div.convention else []),
        f"  normalised f̃(u) = {sp.sstr(d.f_normalised)}",
        f"  f''(1) = {sp.sstr(f2)},  f'''(1) = {sp.sstr(f3)},  f''''(1) = {sp.sstr(f4)},  "
        f"f̃(0) = {sp.sstr(div.f_at_zero)}",
        f"  g_f(p, r) = {sp.sstr(d.g)}",
        "",
        "closed forms (valid where not saturated):",
    ]
    for side, expr in (("upper", d.upper), ("lower", d.lower)):
        shown = sp.sstr(expr) if expr is not None else f"none — {_closed_form_reason(d, side)}"
        lines.append(f"  r_{side[:2]} = {shown}")
    lines += [
        "",
        f"saturation (threshold at δ = {delta:g}):",
        f"  upper = 1/p iff {_threshold_text(d.saturation_upper, delta)}",
        f"  lower = 0   iff {_threshold_text(d.saturation_lower, delta)}",
        "",
        "limits at fixed δ:",
    ]
    for key, (_, label) in _LIMIT_LABELS.items():
        lines.append(f"  {label:<22} {_limit_cells(d, key, delta)[1]}")
    series = _series_parts(d)
    lines += ["", "small-δ series:", f"  {series[1] if series else 'not derived (see notes)'}", "", "notes:"]
    lines += [f"  - {note}" for note in d.notes]
    return "\n".join(lines)


def _slug(div: Divergence) -> str:
    """File name stem: ``alpha(-1)`` → ``alpha_m1``, ``alpha(0.5)`` → ``alpha_0.5``."""
    return div.name.replace("(", "_").replace(")", "").replace("-", "m")


def _index(derivations: list[Derivation]) -> str:
    out = [
        "# Derivations of the Band",
        "",
        "One report per catalogue divergence, generated by `bandcore.derive` (SymPy) — the binary reduction",
        "$g_f(p, r)$, closed-form bounds (every branch validated numerically against a bracketed root),",
        "saturation thresholds, limits and the small-δ series. Do not edit these files by hand:",
        "",
        "```bash",
        "bandcore derivations          # rewrite them",
        "bandcore derivations --check  # exit 1 if any file differs from what the code derives (a test runs this)",
        "```",
        "",
        "The upper bound is $1/p$ iff $p \\ge$ the upper threshold; the lower bound is $0$ iff $p \\le$ the lower",
        "threshold. Limits are at fixed δ (below the level at which a side saturates for every p).",
        "",
        "| divergence | $f(u)$ | closed form $r_{up}$ / $r_{lo}$ | upper saturates iff | lower saturates iff "
        "| $\\lim_{p\\to0} p\\,r_{up}$ | $\\lim_{p\\to1} r_{lo}$ | $f''(1)$ |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for d in derivations:
        div = d.divergence
        closed = " / ".join("yes" if e is not None else "no" for e in (d.upper, d.lower))
        cells = [
            f"[`{div.name}`]({_slug(div)}.md)",
            f"${_tex(div.f)}$",
            closed,
            _index_threshold(d.saturation_upper),
            _index_threshold(d.saturation_lower),
            _limit_cells(d, "q_upper_p0", _REPORT_DELTA)[0],
            _limit_cells(d, "lower_p1", _REPORT_DELTA)[0],
            f"${_tex(d.f2)}$",
        ]
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    return "\n".join(out)


def _index_threshold(sat: Saturation) -> str:
    if sat.never:
        return "never"
    word = r"p \ge" if sat.side == "upper" else r"p \le"
    if sat.threshold is not None:
        return f"${word} {_tex(sat.threshold)}$"
    return f"numeric (${word}$ {_number(sat(_REPORT_DELTA))} at $\\delta = {_REPORT_DELTA:g}$)"


def _default_directory() -> Path:
    return Path(__file__).resolve().parent.parent / "derivations"


def render_derivations() -> dict[str, str]:
    """File name → content of every report in ``derivations/`` (plus its ``README.md`` index)."""
    derivations = [_derive(div) for div in catalogue()]
    files = {f"{_slug(d.divergence)}.md": d.to_markdown() for d in derivations}
    files["README.md"] = _index(derivations)
    return files


def write_derivations(directory: str | Path | None = None, *, check: bool = False) -> list[str]:
    """Write the reports into ``directory`` (default: the repository's ``derivations/``).

    With ``check=True`` nothing is written; the names of files that are missing or differ are returned
    (empty list: up to date).  Without it, the names of the files written are returned.
    """
    directory = Path(directory) if directory is not None else _default_directory()
    files = render_derivations()
    if check:
        stale = []
        for name, content in files.items():
            path = directory / name
            if not path.is_file() or path.read_text(encoding="utf-8") != content:
                stale.append(name)
        return stale
    directory.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (directory / name).write_text(content, encoding="utf-8")
    return sorted(files)


# --------------------------------------------------------------------------------------------------------
# CLI: `bandcore list`, `bandcore derive`, `bandcore derivations`
# --------------------------------------------------------------------------------------------------------

_ALPHA_NAME = re.compile(r"^alpha\s*\(\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*\)$")
_TABLE_P = (0.001, 0.08, 0.5)


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    """Add ``list``, ``derive`` and ``derivations`` to the ``bandcore`` command."""
    parser = subparsers.add_parser("list", help="list the catalogue of divergences")
    parser.set_defaults(handler=_list_command)
    parser = subparsers.add_parser(
        "derive",
        help="derive the Band of a divergence (name or formula in u)",
        description="Derive the Band of one divergence (a catalogue name, an alias, alpha(A), or a formula in "
        "u such as '(u-1)**2'); with no argument, derive the whole catalogue and print a summary table.",
    )
    parser.add_argument("divergence", nargs="?", help="name, alias, alpha(A) or generator formula f(u)")
    parser.add_argument("--delta", type=float, default=_REPORT_DELTA, help="δ for the numbers shown (0.05)")
    parser.add_argument("--markdown", metavar="FILE", help="also write the Markdown report to FILE")
    parser.set_defaults(handler=_derive_command)
    parser = subparsers.add_parser("derivations", help="regenerate (or --check) the reports in derivations/")
    parser.add_argument("--check", action="store_true", help="exit 1 if any report differs; write nothing")
    parser.add_argument("--dir", default=None, help="directory (default: the repository's derivations/)")
    parser.set_defaults(handler=_derivations_command)


def resolve(text: str) -> Divergence:
    """A catalogue name or alias, ``alpha(A)``, or a generator formula in ``u`` (parsed safely)."""
    try:
        return get_divergence(text)
    except ValueError:
        pass
    match = _ALPHA_NAME.match(text.strip())
    if match:
        return get_divergence("alpha", alpha=float(match.group(1)))
    try:
        return Divergence.from_expression(text, name=text.strip())
    except GeneratorError as err:
        names = ", ".join(list_divergences())
        raise ValueError(
            f"divergence {text!r} is neither a catalogue name ({names}, alpha(A)) nor an accepted formula in u: "
            f"{err}"
        ) from None


def _check_delta(delta: float) -> float:
    if not (math.isfinite(delta) and delta > 0):
        raise ValueError(f"--delta must be a finite number > 0, got {delta!r}")
    return delta


def _list_command(args: argparse.Namespace) -> int:
    rows = [("name", "aliases", "f(u)", "convention")]
    for name in list_divergences():
        div = get_divergence(name)
        shown = f"{name} (alpha=A, default {div.params[0][1]:g})" if div.params else name
        rows.append((shown, ", ".join(div.aliases) or "-", sp.sstr(div.f), div.convention))
    _print_table(rows)
    return 0


def _derive_command(args: argparse.Namespace) -> int:
    delta = _check_delta(args.delta)
    if args.divergence is None:
        _print_table(_summary_rows(delta))
        return 0
    d = _derive(resolve(args.divergence))
    print(d.to_text(delta))
    if args.markdown:
        Path(args.markdown).write_text(d.to_markdown(), encoding="utf-8")
        print(f"\nwrote {args.markdown}")
    return 0


def _summary_rows(delta: float) -> list[tuple[str, ...]]:
    from .band import band

    header = ("divergence", "closed form up/lo", f"upper=1/p iff (δ={delta:g})", "lower=0 iff", "f''(1)")
    header += tuple(f"Band at p={p:g}" for p in _TABLE_P)
    rows = [header]
    log_p = np.log(np.array(_TABLE_P))
    for div in catalogue():
        d = _derive(div)
        lower, upper = band(log_p, div, delta)
        closed = "/".join("yes" if e is not None else "no" for e in (d.upper, d.lower))
        up, lo = d.saturation_upper, d.saturation_lower
        rows.append(
            (
                div.name,
                closed,
                "never" if up.never else f"p ≥ {up(delta):.6g}",
                "never" if lo.never else f"p ≤ {lo(delta):.6g}",
                sp.sstr(d.f2),
                *(f"[{lo_:.6g}, {up_:.6g}]" for lo_, up_ in zip(lower, upper, strict=True)),
            )
        )
    return rows


def _print_table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for index, row in enumerate(rows):
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
        if index == 0:
            print("  ".join("-" * width for width in widths))


def _derivations_command(args: argparse.Namespace) -> int:
    names = write_derivations(args.dir, check=args.check)
    where = args.dir or _default_directory()
    if args.check:
        if names:
            print(f"out of date in {where}: {', '.join(names)}; run `bandcore derivations`", file=sys.stderr)
            return 1
        print(f"{where}: all reports up to date")
        return 0
    print(f"wrote {len(names)} files to {where}")
    return 0
