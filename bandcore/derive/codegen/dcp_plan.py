r"""Rewrite a generator :math:`f(u)` as a sum of disciplined-convex atoms: the symbolic half of the DCP mapping.

The verification program (:mod:`bandcore.verify`) needs :math:`\sum_j w_j f(u_j) \le \delta` in a form CVXPY can
certify convex.  This module does the SymPy work and returns a *plan*: plain tuples naming CVXPY atoms, which
:mod:`bandcore.verify.dcp` turns into CVXPY expressions and checks (this package does not import CVXPY).
Two rewritings are offered, in order:

1. **as written**, node by node (``(u-1)**2`` → ``square(u-1)``, ``u*log(u)`` → ``entropy(u)``, ``log``,
   ``exp``, ``abs``, ``power``);
2. **expanded**: logarithms split (``expand_log``), products distributed, the rational part decomposed into
   partial fractions (``(u-1)**2/u = u - 2 + 1/u``), and every ``log`` of an affine :math:`L = a u + b`
   regrouped into certified pieces

   .. math::  (m u + k)\log L = \lambda\, L\log L + \mu\, u \log L + \nu \log L,
              \qquad u\log L = u\log u - \operatorname{rel\_entr}(u, L),

   with :math:`\lambda \ge 0` (``entropy(L)``, convex), :math:`\mu \le 0` (``-rel_entr``, convex after the sign)
   and :math:`\nu \le 0` (``-log L``, convex); :math:`\lambda` is taken as small as allowed.  Jensen–Shannon
   becomes :math:`\tfrac12[\operatorname{rel\_entr}(u, \tfrac{u+1}{2}) - \log\tfrac{u+1}{2}]`.

Plan nodes (tuples): ``("const", c)``, ``("u",)``, ``("sum", (nodes...))``, ``("scale", c, node)``,
``("square", x)``, ``("power", x, k, exact_rational)``, ``("exp", x)``, ``("log", x)``, ``("abs", x)``,
``("entropy", x)`` (:math:`x \log x`, i.e. ``-entr(x)``), ``("rel_entr", x, y)``; numbers are floats.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from ...divergences import Divergence
from ..generator_facts.budget import bounded
from ..generator_facts.mpmath_g import checked_facts
from ..generator_facts.symbolic import U

__all__ = ["DcpRewriting", "dcp_rewritings"]

_REWRITE_SECONDS = 10.0


@dataclass(frozen=True)
class DcpRewriting:
    """One rewriting of a generator: ``terms`` (name, plan node) to be summed, or the ``reason`` it failed."""

    label: str
    terms: tuple[tuple[str, tuple], ...] | None
    reason: str = ""


class _Reject(Exception):
    """One rewriting of the generator failed; the message says which term and why."""


def dcp_rewritings(divergence: Divergence) -> tuple[str, list[DcpRewriting]]:
    """(the generator as text, its rewritings in order of preference); a failed rewriting carries its reason."""
    f = checked_facts(divergence).f
    out = []
    for label, rewrite in (("as written", _as_written), ("expanded", _expanded)):
        result = bounded(lambda rewrite=rewrite: _attempt(rewrite, f), _REWRITE_SECONDS)
        if result is None:
            out.append(DcpRewriting(label, None, "ran past its time budget or recursed too deeply"))
        elif isinstance(result, str):
            out.append(DcpRewriting(label, None, result))
        else:
            out.append(DcpRewriting(label, tuple(result)))
    return str(f), out


def _attempt(rewrite, f: sp.Expr) -> list[tuple[str, tuple]] | str:
    try:
        return rewrite(f)
    except _Reject as why:
        return str(why)
    except (ValueError, TypeError, NotImplementedError, ArithmeticError, sp.PolynomialError) as err:
        return f"SymPy could not rewrite it ({type(err).__name__}: {err})"


# --------------------------------------------------------------------------------------------------------
# 1. node-by-node translation
# --------------------------------------------------------------------------------------------------------


def _as_written(f: sp.Expr) -> list[tuple[str, tuple]]:
    return [(f"term {term}", _translate(term)) for term in sp.Add.make_args(f)]


def _translate(expr: sp.Expr) -> tuple:
    if expr.is_number:
        return ("const", float(expr))
    if expr == U:
        return ("u",)
    if isinstance(expr, sp.Add):
        return ("sum", tuple(_translate(term) for term in expr.args))
    if isinstance(expr, sp.Mul):
        coeff, rest = expr.as_independent(U, as_Add=False)
        if coeff != 1:
            return ("scale", float(coeff), _translate(rest))
        return _product(expr)
    if isinstance(expr, sp.Pow):
        return _power(expr.base, expr.exp)
    if isinstance(expr, sp.exp):
        return ("exp", _translate(expr.args[0]))
    if isinstance(expr, sp.log):
        _require_positive(expr.args[0], "log")
        return ("log", _translate(expr.args[0]))
    if isinstance(expr, sp.Abs):
        return ("abs", _translate(expr.args[0]))
    raise _Reject(f"no DCP atom for {expr}")


def _product(expr: sp.Mul) -> tuple:
    """A product of non-constant factors: only X·log(c·X) (an entropy) is DCP."""
    logs = [a for a in expr.args if isinstance(a, sp.log)]
    if len(logs) == 1:
        argument = logs[0].args[0]
        other = sp.Mul(*[a for a in expr.args if a is not logs[0]])
        ratio = sp.simplify(argument / other)
        if ratio.is_number and ratio.is_positive:
            _require_positive(other, "entropy")
            x = _translate(other)  # X log(cX) = X log X + X log c
            return ("sum", (("entropy", x), ("scale", float(sp.log(ratio)), x)))
    raise _Reject(f"product {expr} of non-constant factors")


def _power(base: sp.Expr, exponent: sp.Expr) -> tuple:
    if not exponent.is_number:
        raise _Reject(f"power {base}**{exponent} with a non-constant exponent")
    if base == sp.E:
        raise _Reject("exp written as a power")  # SymPy writes exp(x) as exp, never as E**x
    k = float(exponent)
    x = _translate(base)
    if k == 2:
        return ("square", x)
    if not (k == int(k) and int(k) % 2 == 0):
        # odd and fractional powers are DCP only for a non-negative base (CVXPY would add base >= 0)
        _require_positive(base, f"power {k:g}", allow_zero=k > 0)
    # rational exponents with small denominators are exact as second-order cones, which interior-point
    # solvers handle more robustly than the 3-d power cone used otherwise
    exact_rational = bool(exponent.is_Rational and sp.Rational(exponent).q <= 64)
    return ("power", x, k, exact_rational)


def _require_positive(expr: sp.Expr, what: str, *, allow_zero: bool = False) -> None:
    ok = expr.is_nonnegative if allow_zero else expr.is_positive
    if not ok:
        sign = "non-negative" if allow_zero else "positive"
        raise _Reject(f"{what} of {expr}, which is not provably {sign} for u > 0")


# --------------------------------------------------------------------------------------------------------
# 2. expanded form with logarithms regrouped into entropies
# --------------------------------------------------------------------------------------------------------


def _expanded(f: sp.Expr) -> list[tuple[str, tuple]]:
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
    written = [(f"term {term}", _translate(term)) for term in terms]
    return written + _regroup_logs(log_weights)


def _affine(expr: sp.Expr, what: str) -> tuple[sp.Expr, sp.Expr]:
    poly = sp.Poly(expr, U) if expr.is_polynomial(U) else None
    if poly is None or poly.degree() > 1:
        raise _Reject(f"{what} {expr} is not affine in u")
    return poly.coeff_monomial(U), poly.coeff_monomial(1)


def _line(a: float, b: float) -> tuple:
    """The plan of a·u + b."""
    return ("sum", (("scale", a, ("u",)), ("const", b)))


def _regroup_logs(log_weights: dict[sp.Expr, sp.Expr]) -> list[tuple[str, tuple]]:
    r"""Plan pieces for :math:`\sum_L P_L(u) \log L(u)`, or :class:`_Reject`.

    For :math:`L = u`: :math:`P = e u + d` gives :math:`e\,u\log u` (needs :math:`e \ge 0` after the transfers
    below) and :math:`d \log u` (needs :math:`d \le 0`).  For :math:`L = a u + b` (:math:`a, b > 0`) and
    :math:`P = m u + k`: :math:`\lambda \ge \max(0, m/a, k/b)` on :math:`L \log L`, :math:`\mu = m - \lambda a`
    moved to :math:`u \log u` via :math:`u\log L = u\log u - \operatorname{rel\_entr}(u, L)`,
    :math:`\nu = k - \lambda b` on :math:`\log L`.
    """
    pieces: list[tuple[str, tuple]] = []
    e_total = sp.Integer(0)  # coefficient of u log u
    for argument, weight in log_weights.items():
        m, k = _affine(sp.expand(weight), "multiplier of log")
        a, b = _affine(argument, "argument of log")
        if b == 0:  # log(a u) = log a + log u
            if not a.is_positive:
                raise _Reject(f"log of {argument}, which is not positive for u > 0")
            e_total += m
            pieces.append((f"term {m * sp.log(a)}*u", _line(float(m * sp.log(a)), float(k * sp.log(a)))))
            if k != 0:
                pieces.append((f"term {k}*log(u)", ("scale", float(k), ("log", ("u",)))))
            continue
        if not (a.is_positive and b.is_positive):
            raise _Reject(f"log of {argument}, which is not positive for u > 0")
        lam = sp.Max(0, m / a, k / b)
        mu, nu = m - lam * a, k - lam * b
        e_total += mu
        line = _line(float(a), float(b))
        if lam != 0:
            pieces.append((f"term {lam}*L*log(L), L = {argument}", ("scale", float(lam), ("entropy", line))))
        if mu != 0:
            pieces.append((f"term {-mu}*rel_entr(u, {argument})", ("scale", -float(mu), ("rel_entr", ("u",), line))))
        if nu != 0:
            pieces.append((f"term {nu}*log({argument})", ("scale", float(nu), ("log", line))))
    if e_total != 0:
        pieces.append((f"term {e_total}*u*log(u)", ("scale", float(e_total), ("entropy", ("u",)))))
    return pieces
