r"""The Band of a generator that is a pure power of :math:`|u - 1|` on each side of 1, in one step.

If :math:`\tilde f(u) = c_+ (u - 1)^a` for :math:`u > 1` and :math:`c_- (1 - u)^a` for :math:`u < 1` (one
exponent :math:`a > 0`, e.g. :math:`|u - 1|^{3/2}`), then with :math:`|s - 1| = p|r - 1|/(1 - p)`

.. math::  g_f(p, r) = |r - 1|^a \Big(p\,c_r + (1 - p)\,c_s \big(\tfrac{p}{1-p}\big)^a\Big) = K\,|r - 1|^a,

so :math:`r = 1 \pm (\delta/K)^{1/a}` (upper: :math:`c_r = c_+, c_s = c_-`; lower: the reverse).  SymPy's
general route clears the radicals first and meets a polynomial of too high a degree (degree 6 for
:math:`a = 3/2`); this shortcut gives the candidate that :mod:`.validate` then checks like any other.
"""

from __future__ import annotations

import sympy as sp

from ..generator_facts.budget import bounded
from ..generator_facts.symbolic import U
from .reduction import DELTA, P

__all__ = ["power_law_bound"]

_X = sp.Symbol("x", positive=True)
_SECONDS = 2.0


def _coefficient(branch: sp.Expr, sign: int) -> tuple[sp.Expr, sp.Expr] | None:
    """(c, a) with ``branch`` = c·|u - 1|^a on the side ``sign`` of 1, else None."""
    near = branch.subs(U, 1 + sign * _X)
    exponents = {
        node.exp for node in sp.preorder_traversal(near) if isinstance(node, sp.Pow) and node.base.has(_X)
    } | {sp.Integer(1)}
    for a in sorted(exponents, key=lambda e: -abs(float(e)) if e.is_number else 0):
        if not (a.is_number and a > 0):
            continue
        c = bounded(lambda a=a: sp.simplify(near / _X**a), _SECONDS)
        if c is not None and not c.has(_X) and c.is_positive:
            return c, a
    return None


def power_law_bound(above: sp.Expr, below: sp.Expr, side: str) -> sp.Expr | None:
    """The candidate :math:`1 \\pm (\\delta/K)^{1/a}` (module docstring) for f̃ = ``above`` on u > 1 and
    ``below`` on u < 1 (branches free of pieces); None unless both are powers of |u - 1| with one exponent."""
    plus, minus = _coefficient(above, 1), _coefficient(below, -1)
    if plus is None or minus is None or plus[1] != minus[1]:
        return None
    a = plus[1]
    c_r, c_s = (plus[0], minus[0]) if side == "upper" else (minus[0], plus[0])
    k = P * c_r + c_s * P**a * (1 - P) ** (1 - a)  # (1 - p)(p/(1 - p))^a, for 0 < p < 1
    step = (DELTA / k) ** (1 / a)
    return 1 + step if side == "upper" else 1 - step
