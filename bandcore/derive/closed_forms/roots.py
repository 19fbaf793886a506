r"""Closed-form candidate roots of :math:`h(x) = 0`, found by SymPy calls that cannot run away.

* Algebraic equations: denominators and radicals are cleared (``unrad``), the numerator is factored, and only
  factors of degree :math:`\le` :data:`MAX_DEGREE` are solved (``roots``; a quartic by Ferrari, a cubic by
  Cardano).
* One transcendental generator, with :math:`x` nowhere else (``log(1 - q) = -δ``): SymPy's ``solve``.
* Several transcendental generators, or one mixed with :math:`x` outside it (Lambert-W type, ``log r`` with
  ``log(1 - pr)``): no solver is run at all.

Every SymPy call runs under a time budget (:mod:`.budget`); a call that runs out is reported in the notes as
"no closed form".  The candidates are *unvalidated*: :mod:`.validate` decides which branch, if any, is right.
"""

from __future__ import annotations

import sympy as sp
from sympy.solvers.solvers import unrad

from ..generator_facts.budget import bounded
from .reduction import DELTA, P, transcendental_atoms

__all__ = ["MAX_DEGREE", "SIMPLIFY_MAX_OPS", "SIMPLIFY_SECONDS", "SOLVE_SECONDS", "real_form", "solve_closed", "tidy"]

#: Polynomial factors above this degree are not handed to SymPy (no general formula).
MAX_DEGREE = 4
#: Time budget of one solve/factor/unrad call, and of one simplification.
SOLVE_SECONDS = 8.0
SIMPLIFY_SECONDS = 2.0
#: Expressions with more operations than this are not simplified.
SIMPLIFY_MAX_OPS = 80


def tidy(expr: sp.Expr) -> sp.Expr:
    """A shorter equivalent form when SymPy finds one quickly (small expressions only), else ``expr``."""
    ops = bounded(lambda: sp.count_ops(expr), SIMPLIFY_SECONDS)
    if ops is None or ops > SIMPLIFY_MAX_OPS:
        return expr
    simpler = bounded(lambda: sp.simplify(expr), SIMPLIFY_SECONDS)
    return simpler if simpler is not None and sp.count_ops(simpler) <= ops else expr


def _degenerate_points(factor: sp.Expr, variable: sp.Symbol, what: str) -> list[str]:
    """Where the leading coefficient of a solved factor vanishes for p in (0, 1): the root formulas are
    singular there and the valid branch may change across such a point."""
    degree = sp.degree(factor, variable)
    if degree < 2:
        return []
    leading = bounded(lambda: sp.factor(sp.Poly(factor, variable).LC()), SIMPLIFY_SECONDS)
    if leading is None or leading.free_symbols != {P}:
        return []
    zeros = bounded(lambda: [z for z in sp.solve(leading, P) if z.is_real and 0 < z < 1], SIMPLIFY_SECONDS)
    if not zeros:
        return []
    return [
        f"{what}: the leading coefficient {sp.sstr(leading)} of the degree-{degree} "
        f"equation vanishes at p = {', '.join(map(sp.sstr, zeros))}; the root formulas are singular there and "
        "the valid branch can change across it"
    ]


def _no_closed_form(what: str, why: str) -> tuple[list[sp.Expr], list[str]]:
    return [], [f"{what}: no closed form — {why}"]


def solve_closed(expr: sp.Expr, x: sp.Symbol, what: str) -> tuple[list[sp.Expr], list[str]]:
    """Candidate closed-form roots of ``expr = 0`` in ``x`` (see the module docstring).

    Returns (candidates, notes); ``what`` names the equation in the notes (``"upper bound"``).
    """
    expanded = bounded(lambda: sp.expand(expr), SOLVE_SECONDS)
    if expanded is None:
        return _no_closed_form(what, "SymPy could not expand the equation within its time budget")
    expr = expanded
    atoms = transcendental_atoms(expr, x)
    if atoms:
        marker = sp.Dummy("z")
        if len(atoms) > 1 or expr.subs(next(iter(atoms)), marker).has(x):
            shown = ", ".join(sorted(sp.sstr(a) for a in atoms))
            return _no_closed_form(
                what,
                f"the equation is transcendental in {x} (terms {shown}); it has no elementary solution in "
                "general, so no solver was run on it",
            )
        found = bounded(lambda: sp.solve(expr, x), SOLVE_SECONDS)
        if not found:
            return _no_closed_form(what, "SymPy's solve returned no root (or ran past its time limit)")
        return list(found), []
    numerator = bounded(lambda: sp.fraction(sp.together(expr))[0], SOLVE_SECONDS)
    if numerator is None:
        return _no_closed_form(what, "SymPy could not clear the denominators within its time budget")
    cleared = None
    if any(isinstance(a, sp.Pow) and a.has(x) and not a.exp.is_integer for a in sp.preorder_traversal(numerator)):
        cleared = bounded(lambda: unrad(numerator, x) or (numerator, []), SOLVE_SECONDS)
        if cleared is None:
            return _no_closed_form(what, "its radicals could not be cleared (unrad gave up or ran out of time)")
    polynomial, cov = (numerator, []) if cleared is None else cleared
    variable = cov[0] if cov else x
    factored = bounded(lambda: sp.factor_list(sp.expand(polynomial), variable), SOLVE_SECONDS)
    if factored is None:
        return _no_closed_form(what, f"SymPy could not factor the {variable}-polynomial in time")
    candidates: list[sp.Expr] = []
    notes: list[str] = []
    for factor, _ in factored[1]:
        degree = bounded(lambda factor=factor: sp.degree(factor, variable), SIMPLIFY_SECONDS)
        if degree is None or degree == 0:
            continue
        if degree > MAX_DEGREE:
            notes.append(
                f"{what}: a factor of degree {degree} in {variable} was not solved (no general formula above "
                f"degree {MAX_DEGREE})"
            )
            continue
        found = bounded(lambda factor=factor: sp.roots(sp.Poly(factor, variable), multiple=True), SOLVE_SECONDS)
        if not found:
            notes.append(f"{what}: SymPy's roots found no formula for a degree-{degree} factor")
            continue
        candidates.extend(found)
        notes.extend(bounded(lambda factor=factor: _degenerate_points(factor, variable, what), SOLVE_SECONDS) or [])
    if cov and candidates:
        back = bounded(lambda: sp.solve(cov[1], x), SOLVE_SECONDS)
        if not back or len(back) != 1:
            return _no_closed_form(what, f"the change of variable {sp.sstr(cov[1])} = 0 has no single inverse")
        candidates = [back[0].subs(variable, c) for c in candidates]
    return sorted(set(candidates), key=sp.default_sort_key), notes


def _negative_everywhere(base: sp.Expr) -> bool:
    """True when ``base`` (in p, δ) is negative at every point of a small grid of 0 < p < 1, δ > 0."""
    points = [(p, d) for p in (0.01, 0.2, 0.5, 0.8, 0.99) for d in (0.001, 0.1, 2.0)]
    for p, d in points:
        value = complex(sp.N(base.subs({P: sp.Float(p, 30), DELTA: sp.Float(d, 30)}), 30))
        if not (value.imag == 0 and value.real < 0):
            return False
    return True


def real_form(expr: sp.Expr) -> sp.Expr:
    r"""``expr`` with the imaginary unit removed where the value is real, else ``expr`` itself.

    Cardano's formula writes a real root as the principal cube root of a negative number times a complex cube
    root of unity.  Every odd root :math:`b^{k/n}` of a base :math:`b < 0` (on the whole region) is rewritten
    as :math:`|b|^{k/n}(-1)^{k/n}` (the principal branch: an identity), and the numeric factors of each product
    are then multiplied out in complex arithmetic, so that :math:`(-1)^{1/3}\cdot\frac{-1 + \sqrt3 i}{2} = -1`.
    The caller validates the result again.
    """
    if not expr.has(sp.I):
        return expr

    def odd_root_of_negative(node: sp.Expr) -> bool:
        return (
            node.is_Pow and node.exp.is_Rational and not node.exp.is_integer and node.exp.q % 2 == 1
            and bool(node.base.free_symbols & {P, DELTA}) and _negative_everywhere(node.base)
        )

    def flipped(node: sp.Expr) -> sp.Expr:
        return sp.Pow(sp.factor(-node.base), node.exp) * sp.Pow(-1, node.exp)

    def numbers_out(node: sp.Expr) -> sp.Expr:
        constant, rest = node.as_independent(P, DELTA, as_Add=False)
        return sp.expand_complex(constant) * rest

    rewritten = bounded(
        lambda: sp.expand(expr.replace(odd_root_of_negative, flipped), deep=False), SIMPLIFY_SECONDS
    )
    if rewritten is None:
        return expr
    terms = sp.Add.make_args(rewritten)
    real = bounded(lambda: sp.expand(sp.Add(*(numbers_out(t) for t in terms)), deep=False), SIMPLIFY_SECONDS)
    return expr if real is None or real.has(sp.I) else real
