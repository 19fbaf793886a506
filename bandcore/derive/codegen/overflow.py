r"""Overflow-safe forms of the solver functions of a generator with exponential growth.

A user generator may contain :math:`e^z`, :math:`\cosh z`, :math:`\sinh z`, :math:`\tanh z` of an argument
that grows with :math:`u`, and the Band's upper ratio reaches :math:`1/p` (:math:`10^{304}`).  Evaluated as
written, :math:`\log\cosh(u - 1)` overflows at :math:`u \approx 711` although its value is :math:`\approx u`,
and :math:`\sinh z / \cosh z` becomes :math:`\infty/\infty`.  Two rewritings, both plain SymPy expressions
(so that every backend, and the Numba module's vectorised ``exp``/``log``, evaluate them):

* :func:`safe_value` — the value of an expression, finite wherever the value is:

  - :math:`\cosh z = (e^z + e^{-z})/2`, :math:`\sinh z = (\operatorname{expm1} z - \operatorname{expm1}(-z))/2`
    (no cancellation at small z), :math:`\tanh z = (\operatorname{expm1} 2a - \operatorname{expm1}(-2b)) /
    (2 + \operatorname{expm1} 2a + \operatorname{expm1}(-2b))` with :math:`a = \min(z, 0)`,
    :math:`b = \max(z, 0)` (never :math:`\infty/\infty`); no libm ``cosh``/``sinh`` call remains, which
    would keep a compiler from vectorising the solver's loop;
  - :math:`\log A` is :func:`safe_log_abs` of :math:`A`;
  - a product with two or more exponential factors is :math:`\pm\exp(\sum_i \log|a_i|)` (its factors may
    overflow and underflow while it does not: :math:`\sinh z / \cosh z`, :math:`(e^x - 1)/(e^x + 1)`); the
    sign of a factor SymPy cannot decide is taken at run time (:class:`SignOf` its value, which keeps its sign
    when it overflows).

* :func:`safe_log_abs` — :math:`\log|A|` without forming :math:`A`: a product is the sum of the logarithms
  of its factors; :math:`\log e^z = z`; :math:`\log\cosh z = |z| + \operatorname{log1p}(e^{-2|z|}) - \log 2`;
  :math:`\log\sinh|z| = |z| + \log(-\operatorname{expm1}(-2|z|)) - \log 2`; a sum
  :math:`\sum_i \sigma_i e^{\ell_i}` of terms of known signs :math:`\sigma_i` is
  :math:`m + \log|\sum_i \sigma_i e^{\ell_i - m}|`, :math:`m = \max_i \ell_i` (two positive terms:
  :math:`m + \operatorname{log1p}(e^{-|\ell_1 - \ell_2|})`, softplus).

The signs come from SymPy's assumptions on the side of :math:`u = 1` being rewritten (:func:`on_side_symbols`).
The rewritten forms cost at most a few ulp times the logarithms involved; where they could cancel near
:math:`u = 1` the generated functions use their Taylor polynomials instead.
"""

from __future__ import annotations

import sympy as sp
from sympy.codegen.cfunctions import expm1, log1p

__all__ = ["Select", "SignOf", "grows_exponentially", "safe_log_abs", "safe_value"]


class Select(sp.Function):
    """``Select(condition, a, b)``: a where the condition holds, else b, element-wise; printed as ``xp.where``
    (a select, which a compiler vectorises) for the pieces of a piecewise generator."""

    nargs = 3

    def _pythoncode(self, printer) -> str:
        condition, a, b = (printer._print(arg) for arg in self.args)
        return f"xp.where({condition}, {a}, {b})"


class _ElementwiseFold(sp.Function):
    """Conditions of a :class:`Select` joined pairwise by the namespace's element-wise ``xp_name``."""

    xp_name = ""

    def _pythoncode(self, printer) -> str:
        a, *rest = (printer._print(arg) for arg in self.args)
        for b in rest:
            a = f"xp.{self.xp_name}({a}, {b})"
        return a


class LogicalAnd(_ElementwiseFold):
    """Element-wise ``and`` of conditions of a :class:`Select`."""

    xp_name = "logical_and"


class LogicalOr(_ElementwiseFold):
    """Element-wise ``or`` of conditions of a :class:`Select`."""

    xp_name = "logical_or"


class SignOf(sp.Function):
    """±1, the sign of its argument (+1 at 0, never 0): a select, printed as ``xp.where`` of the element-wise
    namespace the generated code runs in."""

    nargs = 1

    def _pythoncode(self, printer) -> str:
        return f"xp.where({printer._print(self.args[0])} < 0.0, -1.0, 1.0)"

_HYPERBOLIC = (sp.cosh, sp.sinh, sp.tanh)
_LOG2 = sp.log(2)


def _growing_argument(arg: sp.Expr, powers: bool) -> bool:
    """Whether e^arg is to be kept from overflowing: arg is not a constant, and, unless ``powers``, not a
    multiple of L = log u (e^{aL} is the power u^a, which the generated functions write that way on purpose
    and whose value branches the far branch keeps finite; the log branches, for p < e^-700, take ``powers``)."""
    return not arg.is_number and (powers or any(symbol.name != "L" for symbol in arg.free_symbols))


def grows_exponentially(expr: sp.Expr, powers: bool = False) -> bool:
    """True when ``expr`` contains an exponential or hyperbolic function growing exponentially in u (or, with
    ``powers``, a power u^a written as e^{aL})."""
    return any(_growing_argument(node.args[0], powers) for node in expr.atoms(sp.exp, *_HYPERBOLIC))


def _explodes(expr: sp.Expr, powers: bool) -> bool:
    """True when ``expr`` may overflow (or underflow) through an exponential factor: e^z, cosh z, sinh z of a
    non-constant z, or a product, power or sum of one (a logarithm of one does not)."""
    if isinstance(expr, (sp.exp, sp.cosh, sp.sinh)):
        return _growing_argument(expr.args[0], powers)
    if expr.is_Mul or expr.is_Add:
        return any(_explodes(arg, powers) for arg in expr.args)
    if expr.is_Pow:
        return _explodes(expr.base, powers) or _explodes(expr.exp, powers)
    return False


def _sign(expr: sp.Expr) -> int | None:
    if expr.is_positive:
        return 1
    if expr.is_negative:
        return -1
    return None


def safe_value(expr: sp.Expr, powers: bool = False) -> sp.Expr:
    """``expr`` rewritten so that it is finite wherever its value is (module docstring; ``powers``: as in
    :func:`grows_exponentially`)."""
    if expr.is_Atom or not grows_exponentially(expr, powers):
        return expr
    if isinstance(expr, sp.cosh):
        z = safe_value(expr.args[0], powers)
        return (sp.exp(z) + sp.exp(-z)) / 2
    if isinstance(expr, sp.sinh):
        z = safe_value(expr.args[0], powers)
        return (expm1(z) - expm1(-z)) / 2
    if isinstance(expr, sp.tanh):
        z = safe_value(expr.args[0], powers)
        a, b = expm1(2 * sp.Min(z, 0)), expm1(-2 * sp.Max(z, 0))
        return (a - b) / (2 + a + b)
    if isinstance(expr, sp.log):
        return safe_log_abs(expr.args[0], powers)
    if expr.is_Mul:
        growing = [f for f in expr.args if _explodes(f, powers)]
        if len(growing) >= 2:  # the sign of a factor that may overflow is that of its (possibly infinite) value
            rest = [safe_value(f, powers) for f in expr.args if not _explodes(f, powers)]
            signs = [_sign(f) or SignOf(safe_value(f, powers)) for f in growing]
            return sp.Mul(*signs, *rest) * sp.exp(sp.Add(*(safe_log_abs(f, powers) for f in growing)))
    return expr.func(*(safe_value(arg, powers) for arg in expr.args))


def safe_log_abs(expr: sp.Expr, powers: bool = False) -> sp.Expr:
    r""":math:`\log|{\rm expr}|` as an expression that forms no overflowing intermediate (module docstring;
    ``powers``: as in :func:`grows_exponentially`)."""
    if expr.is_Mul:
        return sp.Add(*(safe_log_abs(arg, powers) for arg in expr.args))
    if expr.is_Pow and expr.exp.is_number and expr.exp.is_real:
        return expr.exp * safe_log_abs(expr.base, powers)
    if isinstance(expr, sp.exp):
        return safe_value(expr.args[0], powers)
    if isinstance(expr, sp.cosh):
        z = sp.Abs(safe_value(expr.args[0], powers))
        return z + log1p(sp.exp(-2 * z)) - _LOG2
    if isinstance(expr, sp.sinh):
        z = sp.Abs(safe_value(expr.args[0], powers))
        return z + sp.log(-expm1(-2 * z)) - _LOG2
    if isinstance(expr, sp.tanh):
        z = sp.Abs(safe_value(expr.args[0], powers))
        return sp.log(-expm1(-2 * z)) - log1p(sp.exp(-2 * z))
    if expr.is_Add and _explodes(expr, powers):
        terms = [(safe_log_abs(term, powers), _sign(term)) for term in expr.args]
        if all(sign is not None for _, sign in terms):
            return _log_of_sum(terms)
    return sp.log(sp.Abs(safe_value(expr, powers)))


def _log_of_sum(terms: list[tuple[sp.Expr, int]]) -> sp.Expr:
    r"""log|Σ σ_i e^{ℓ_i}| shifted by the largest ℓ_i (see the module docstring)."""
    logs = [log for log, _ in terms]
    if len(terms) == 2 and all(sign > 0 for _, sign in terms):
        return sp.Max(*logs) + log1p(sp.exp(-sp.Abs(logs[0] - logs[1])))
    top = sp.Max(*logs)
    return top + sp.log(sp.Abs(sp.Add(*(sign * sp.exp(log - top) for log, sign in terms))))
