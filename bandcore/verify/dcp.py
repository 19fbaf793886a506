r"""Map a generator :math:`f(u)` to a CVXPY expression that obeys the DCP rules.

The divergence constraint of the verification program is, in the ratio variable :math:`u = \pi/\pi_{old}` and
with weights :math:`w = \pi_{old}`,

.. math::  \sum_j w_j\, f(u_j) \le \delta .

CVXPY accepts it only when :math:`f` is written as a sum of atoms whose curvature it can certify.
:func:`bandcore.derive.codegen.dcp_plan.dcp_rewritings` rewrites :math:`f` symbolically (as written; expanded, with
logarithms regrouped into entropies); this module builds each rewriting's atoms in CVXPY (``square``,
``power``, ``exp``, ``log``, ``abs``, ``-entr`` for :math:`x\log x`, ``rel_entr``) and keeps the first one CVXPY
certifies convex.  When none is, :class:`NotDCPError` names the generator and the offending term.  Every atom is
applied elementwise to the vector ``u``; constants and affine terms stay in the expression (they are exact under
:math:`\sum_j w_j u_j = 1`).
"""

from __future__ import annotations

from collections.abc import Callable

import cvxpy as cp

from ..derive.codegen.dcp_plan import dcp_rewritings
from ..divergences import Divergence

__all__ = ["Builder", "NotDCPError", "dcp_generator"]

#: An elementwise CVXPY expression of the ratio vector u.
Builder = Callable[[cp.Expression], cp.Expression]

_CONVEX = ("CONSTANT", "AFFINE", "CONVEX")


class NotDCPError(ValueError):
    """The generator is convex but bandcore cannot write it with CVXPY's disciplined-convex atoms."""


def build(node: tuple, u: cp.Expression) -> cp.Expression:
    """The CVXPY expression of one plan node (see :mod:`bandcore.derive.codegen.dcp_plan`) at the variable ``u``."""
    kind = node[0]
    if kind == "const":
        return cp.Constant(node[1])
    if kind == "u":
        return u
    if kind == "sum":
        parts = [build(child, u) for child in node[1]]
        total = parts[0]
        for part in parts[1:]:
            total = total + part
        return total
    if kind == "scale":
        return node[1] * build(node[2], u)
    if kind == "square":
        return cp.square(build(node[1], u))
    if kind == "power":
        return cp.power(build(node[1], u), node[2], approx=node[3])
    if kind == "exp":
        return cp.exp(build(node[1], u))
    if kind == "log":
        return cp.log(build(node[1], u))
    if kind == "abs":
        return cp.abs(build(node[1], u))
    if kind == "entropy":
        return -cp.entr(build(node[1], u))
    if kind == "rel_entr":
        return cp.rel_entr(build(node[1], u), build(node[2], u))
    raise ValueError(f"unknown DCP plan node {kind!r}")


def _summed(nodes: list[tuple]) -> Builder:
    def builder(u: cp.Expression) -> cp.Expression:
        total = build(nodes[0], u)
        for node in nodes[1:]:
            total = total + build(node, u)
        return total

    return builder


def dcp_generator(divergence: Divergence) -> Builder:
    """A function ``u -> f(u)`` (elementwise, DCP-convex CVXPY expression) for ``divergence``'s generator.

    Raises
    ------
    NotDCPError
        If neither the expression as written nor its expanded, regrouped form is certified convex by CVXPY;
        the message names the generator and the term that could not be certified.
    """
    generator, rewritings = dcp_rewritings(divergence)
    probe = cp.Variable(2, nonneg=True)
    reasons = []
    for rewriting in rewritings:
        if not rewriting.terms:
            reasons.append(f"{rewriting.label}: {rewriting.reason or 'no terms'}")
            continue
        bad = []
        for name, node in rewriting.terms:
            curvature = build(node, probe).curvature
            if curvature not in _CONVEX:
                bad.append(f"{name} is {curvature.lower()}")
        if not bad:
            return _summed([node for _, node in rewriting.terms])
        reasons.append(f"{rewriting.label}: CVXPY cannot certify " + ", ".join(bad))
    raise NotDCPError(
        f"generator f(u) = {generator} of divergence {divergence.name!r} is not DCP-representable by bandcore "
        f"(sums of c·atom(a·u + b) with atoms power, log, exp, abs, u·log u, rel_entr): " + "; ".join(reasons)
    )
