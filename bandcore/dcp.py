r"""Map a generator :math:`f(u)` (SymPy) to a CVXPY expression that obeys the DCP rules.

The divergence constraint of the verification program (:mod:`bandcore.verify`) is, in the ratio variable
:math:`u = \pi/\pi_{old}` and with weights :math:`w = \pi_{old}`,

.. math::  \sum_j w_j\, f(u_j) \le \delta .

CVXPY accepts it only when :math:`f` is written as a sum of atoms whose curvature it can certify.  This module
tries, in order,

1. **the expression as written**, translated node by node (``(u-1)**2`` → ``square(u-1)``, ``u*log(u)`` →
   ``-entr(u)``, ``log``, ``exp``, ``abs``, ``power``);
2. **the expanded expression**: logarithms split (``expand_log``), products distributed, the rational part
   decomposed into partial fractions (``(u-1)**2/u = u - 2 + 1/u``), and every ``log`` of an affine
   :math:`L = a u + b` regrouped into certified pieces

   .. math::  (m u + k)\log L = \lambda\, L\log L + \mu\, u \log L + \nu \log L,
              \qquad u\log L = u\log u - \operatorname{rel\_entr}(u, L),

   with :math:`\lambda \ge 0` (``-entr(L)``, convex), :math:`\mu \le 0` (``-rel_entr``, convex after the sign)
   and :math:`\nu \le 0` (``-log L``, convex); :math:`\lambda` is taken as small as allowed, which leaves the most
   weight on ``u log u``.  Jensen–Shannon becomes
   :math:`\tfrac12[\operatorname{rel\_entr}(u, \tfrac{u+1}{2}) - \log\tfrac{u+1}{2}]`, i.e. the mixture form.

The first form CVXPY certifies as convex is used.  When none is, :class:`NotDCPError` names the generator and the
offending term.  Every atom is applied elementwise to the vector ``u``; constants and affine terms stay in the
expression (they are exact under :math:`\sum_j w_j u_j = 1`).
"""

from __future__ import annotations

from collections.abc import Callable

import cvxpy as cp
import sympy as sp

from .divergences import Divergence, U

__all__ = ["NotDCPError", "dcp_generator"]

# An elementwise CVXPY expression of the ratio vector u.
Builder = Callable[[cp.Expression], cp.Expression]


class NotDCPError(ValueError):
    """The generator is convex but bandcore cannot write it with CVXPY's disciplined-convex atoms."""


class _Reject(Exception):
    """One rewriting of the generator failed; the message says which term and why."""


def dcp_generator(divergence: Divergence) -> Builder:
    """A function ``u -> f(u)`` (elementwise, DCP-convex CVXPY expression) for ``divergence``'s generator.

    Raises
    ------
    NotDCPError
        If neither the expression as written nor its expanded, regrouped form is certified convex by CVXPY;
        the message names the generator and the term that could not be certified.
    """
    f = divergence.f
    probe = cp.Variable(2, nonneg=True)
    reasons = []
    for label, rewrite in (("as written", _as_written), ("expanded", _expanded)):
        try:
            terms = rewrite(f)
            curvatures = [(name, build(probe).curvature) for name, build in terms]
        except _Reject as why:
            reasons.append(f"{label}: {why}")
            continue
        bad = [f"{name} is {curvature.lower()}" for name, curvature in curvatures if curvature not in _CONVEX]
        if not bad:
            return _summed([build for _, build in terms])
        reasons.append(f"{label}: CVXPY cannot certify " + ", ".join(bad))
    raise NotDCPError(
        f"generator f(u) = {f} of divergence {divergence.name!r} is not DCP-representable by bandcore "
        f"(sums of c·atom(a·u + b) with atoms power, log, exp, abs, u·log u, rel_entr): " + "; ".join(reasons)
    )


_CONVEX = ("CONSTANT", "AFFINE", "CONVEX")


def _summed(builders: list[Builder]) -> Builder:
    def build(u: cp.Expression) -> cp.Expression:
        total = builders[0](u)
        for term in builders[1:]:
            total = total + term(u)
        return total

    return build


# --------------------------------------------------------------------------------------------------------
# 1. node-by-node translation
# --------------------------------------------------------------------------------------------------------


def _as_written(f: sp.Expr) -> list[tuple[str, Builder]]:
    terms = sp.Add.make_args(f)
    for term in terms:
        _translate(term, cp.Variable(2, nonneg=True))  # reject early, outside any solve
    return [(f"term {term}", lambda u, term=term: _translate(term, u)) for term in terms]


def _translate(expr: sp.Expr, u: cp.Expression) -> cp.Expression:
    if expr.is_number:
        return cp.Constant(float(expr))
    if expr == U:
        return u
    if isinstance(expr, sp.Add):
        terms = [_translate(term, u) for term in expr.args]
        total = terms[0]
        for term in terms[1:]:
            total = total + term
        return total
    if isinstance(expr, sp.Mul):
        coeff, rest = expr.as_independent(U, as_Add=False)
        if coeff != 1:
            return float(coeff) * _translate(rest, u)
        return _product(expr, u)
    if isinstance(expr, sp.Pow):
        return _power(expr.base, expr.exp, u)
    if isinstance(expr, sp.exp):
        return cp.exp(_translate(expr.args[0], u))
    if isinstance(expr, sp.log):
        _require_positive(expr.args[0], "log")
        return cp.log(_translate(expr.args[0], u))
    if isinstance(expr, sp.Abs):
        return cp.abs(_translate(expr.args[0], u))
    raise _Reject(f"no DCP atom for {expr}")


def _product(expr: sp.Mul, u: cp.Expression) -> cp.Expression:
    """A product of non-constant factors: only X·log(c·X) (an entropy) is DCP."""
    logs = [a for a in expr.args if isinstance(a, sp.log)]
    if len(logs) == 1:
        argument = logs[0].args[0]
        other = sp.Mul(*[a for a in expr.args if a is not logs[0]])
        ratio = sp.simplify(argument / other)
        if ratio.is_number and ratio.is_positive:
            _require_positive(other, "entropy")
            # X log(cX) = -entr(X) + X log c
            x = _translate(other, u)
            return -cp.entr(x) + float(sp.log(ratio)) * x
    raise _Reject(f"product {expr} of non-constant factors")


def _power(base: sp.Expr, exponent: sp.Expr, u: cp.Expression) -> cp.Expression:
    if not exponent.is_number:
        raise _Reject(f"power {base}**{exponent} with a non-constant exponent")
    if base == sp.E:
        raise _Reject("exp written as a power")  # SymPy writes exp(x) as exp, never as E**x
    k = float(exponent)
    x = _translate(base, u)
    if k == 2:
        return cp.square(x)
    if not (k == int(k) and int(k) % 2 == 0):
        # odd and fractional powers are DCP only for a non-negative base (CVXPY would add base >= 0)
        _require_positive(base, f"power {k:g}", allow_zero=k > 0)
    # rational exponents with small denominators are exact as second-order cones, which interior-point
    # solvers handle more robustly than the 3-d power cone used otherwise
    exact_rational = exponent.is_Rational and sp.Rational(exponent).q <= 64
    return cp.power(x, k, approx=bool(exact_rational))


def _require_positive(expr: sp.Expr, what: str, *, allow_zero: bool = False) -> None:
    ok = expr.is_nonnegative if allow_zero else expr.is_positive
    if not ok:
        sign = "non-negative" if allow_zero else "positive"
        raise _Reject(f"{what} of {expr}, which is not provably {sign} for u > 0")


# --------------------------------------------------------------------------------------------------------
# 2. expanded form with logarithms regrouped into entropies
# --------------------------------------------------------------------------------------------------------


def _expanded(f: sp.Expr) -> list[tuple[str, Builder]]:
    expanded = sp.expand(sp.expand_log(f, force=True))
    rational, other = [], []
    for term in sp.Add.make_args(expanded):
        (rational if term.is_rational_function(U) else other).append(term)
    terms = list(sp.Add.make_args(sp.expand(sp.apart(sp.Add(*rational), U)))) if rational else []
    log_weights: dict[sp.Expr, sp.Expr] = {}  # affine argument L -> polynomial P_L with P_L log L in f
    for term in other:
        coeff, rest = term.as_independent(U, as_Add=False)
        logs = [a for a in sp.Mul.make_args(rest) if isinstance(a, sp.log) and a.has(U)]
        if len(logs) != 1:
            terms.append(term)
            continue
        multiplier = coeff * sp.Mul(*[a for a in sp.Mul.make_args(rest) if a is not logs[0]])
        argument = logs[0].args[0]
        log_weights[argument] = log_weights.get(argument, sp.Integer(0)) + multiplier
    for term in terms:
        _translate(term, cp.Variable(2, nonneg=True))  # reject early
    written = [(f"term {term}", lambda u, term=term: _translate(term, u)) for term in terms]
    return written + _regroup_logs(log_weights)


def _affine(expr: sp.Expr, what: str) -> tuple[sp.Expr, sp.Expr]:
    poly = sp.Poly(expr, U) if expr.is_polynomial(U) else None
    if poly is None or poly.degree() > 1:
        raise _Reject(f"{what} {expr} is not affine in u")
    return poly.coeff_monomial(U), poly.coeff_monomial(1)


def _regroup_logs(log_weights: dict[sp.Expr, sp.Expr]) -> list[tuple[str, Builder]]:
    r"""CVXPY pieces for :math:`\sum_L P_L(u) \log L(u)`, or :class:`_Reject`.

    For :math:`L = u`: :math:`P = e u + d` gives :math:`e\,u\log u` (needs :math:`e \ge 0` after the transfers
    below) and :math:`d \log u` (needs :math:`d \le 0`).  For :math:`L = a u + b` (:math:`a, b > 0`) and
    :math:`P = m u + k`: :math:`\lambda \ge \max(0, m/a, k/b)` on :math:`L \log L`, :math:`\mu = m - \lambda a`
    moved to :math:`u \log u` via :math:`u\log L = u\log u - \operatorname{rel\_entr}(u, L)`,
    :math:`\nu = k - \lambda b` on :math:`\log L`.
    """
    pieces: list[tuple[str, Builder]] = []
    e_total = sp.Integer(0)  # coefficient of u log u
    for argument, weight in log_weights.items():
        m, k = _affine(sp.expand(weight), "multiplier of log")
        a, b = _affine(argument, "argument of log")
        if b == 0:  # log(a u) = log a + log u
            if not a.is_positive:
                raise _Reject(f"log of {argument}, which is not positive for u > 0")
            e_total += m
            slope, constant = float(m * sp.log(a)), float(k * sp.log(a))
            pieces.append((f"term {m * sp.log(a)}*u", lambda u, s=slope, c=constant: s * u + c))
            if k != 0:
                pieces.append((f"term {k}*log(u)", lambda u, k=float(k): k * cp.log(u)))
            continue
        if not (a.is_positive and b.is_positive):
            raise _Reject(f"log of {argument}, which is not positive for u > 0")
        lam = sp.Max(0, m / a, k / b)
        mu, nu = m - lam * a, k - lam * b
        e_total += mu
        fa, fb = float(a), float(b)
        if lam != 0:
            name = f"term {lam}*L*log(L), L = {argument}"
            pieces.append((name, lambda u, c=float(lam), fa=fa, fb=fb: -c * cp.entr(fa * u + fb)))
        if mu != 0:
            name = f"term {-mu}*rel_entr(u, {argument})"
            pieces.append((name, lambda u, c=float(mu), fa=fa, fb=fb: -c * cp.rel_entr(u, fa * u + fb)))
        if nu != 0:
            name = f"term {nu}*log({argument})"
            pieces.append((name, lambda u, c=float(nu), fa=fa, fb=fb: c * cp.log(fa * u + fb)))
    if e_total != 0:
        pieces.append((f"term {e_total}*u*log(u)", lambda u, c=float(e_total): -c * cp.entr(u)))
    return pieces
