r"""The four numeric functions every Band solver needs, generated from a divergence's SymPy generator.

The solvers (:mod:`bandcore.kernels.solvers`, on every backend) work in the offset
:math:`d = \theta - \theta_p \ge 0` of the new logit :math:`\theta = \operatorname{logit} q` from the old one,
and need, on the two cells of the binary reduction (the token, ratio :math:`r \ge 1`; the rest, ratio
:math:`s \le 1`):

.. math::
    G(d) = q\,\Phi(r) + (1-p)\,\tilde f(s), \qquad
    G'(d) = q\big[(1-q)\,\tilde f'(r) - (1-p)\,s\tilde f'(s)\big],

with :math:`\Phi(u) = \tilde f(u)/u` (so that :math:`p\tilde f(r) = q\Phi(r)` never multiplies a tiny
:math:`p` by a huge :math:`\tilde f(r)`).  This module builds, for each side, the closed expressions of
:math:`\Phi, \tilde f'` (r side) and :math:`\tilde f, u\tilde f'` (s side) as functions of three accurate
inputs ``(x, L, u)`` with :math:`x = u - 1`, :math:`L = \log u`, and a Taylor polynomial in :math:`x` of
each, used for :math:`|x| <` :data:`TAYLOR_RADIUS` where the closed expression cancels; on the r side a third
form in :math:`t = 1/u`, :math:`y = 1 - t = x/u` is used beyond a switch ``far_x`` >= 1 (``x**2/u`` would
overflow at :math:`u \sim 10^{155}` while :math:`r` reaches :math:`1/p \sim 10^{304}`): the largest x up to
which the closed forms were measured as accurate (:mod:`.far_threshold`).

Rules of the rewriting (each one for a numerical reason):

* ``Abs`` is resolved per side by substituting :math:`u = 1 + x` with :math:`x > 0` (r) or :math:`x < 0` (s).
* ``log(u)`` becomes ``L`` (exact even when :math:`u` underflows: KL's lower root has
  :math:`\log s \approx -10^{302}`); on the s side negative powers :math:`u^a` become :math:`e^{aL}`
  (no :math:`1/u` overflow when :math:`u` underflows).
* The expression is factored and each factor :math:`u - 1` becomes ``x``: e.g. α = 3 gives
  :math:`x^2 (u + 2)/6` instead of :math:`u^3/6 - u/2 + 1/3`, which cancels.
* Fractional powers of u whose denominators have a least common multiple :math:`3 \le N \le 16`
  (:data:`ROOT_DENOMINATOR_MAX`) are all powers of one root :math:`c = u^{1/N}`: the expression is written as a
  rational function of c (of :math:`t^{1/N} = 1/c` in the far form) and factored in c, where factoring in u finds
  nothing: α = 0.7's :math:`7u - 10u^{7/10} + 3` is :math:`(c - 1)^2 (7c^8 + 14c^7 + \dots + 3)`.  The factor
  :math:`c - 1` is computed as :math:`\operatorname{expm1}(L/N)`, without its cancellation, and c as
  :math:`e^{L/N}`, textually the same in every function of a side so that the Numba module computes it once
  (LLVM merges identical instructions after inlining; ``expm1`` shares ``exp``'s range reduction and Taylor sum):
  one ``exp`` per side instead of one per power (α = 0.7: 11 per evaluation of both sides, whose polynomial
  arithmetic was most of the kernel's time), and no cancellation near u = 1 (α = 0.7's Φ lost up to ~1,600 ulp
  next to the Taylor radius, now 12).  Powers :math:`c^{\pm e}`, e >= N, are :math:`(u^{\lfloor e/N\rfloor} c^{e \bmod
  N})^{\pm 1}` (t for u in the far form): factors on the same side of 1 as the power, a negative power a division
  by such a product, so that nothing overflows or underflows before the power itself (on the s side, where u
  underflows, a denominator is 0 only where the power overflows anyway).
* Expressions of the form :math:`x^k L^l (c - 1)^m R(u)` with :math:`R(1) \ne 0` cannot cancel near
  :math:`u = 1` (x, L and expm1(L/N) are accurate however small) and get no Taylor branch.
* A power :math:`b^{m + 1/2}`, m >= 1, of any base is :math:`b^m \sqrt b` (``x**1.5`` was a libm ``pow``).
* Last, any other power :math:`u^a` whose exponent is neither an integer nor :math:`\pm 1/2` (N = 2 or N > 16)
  becomes :math:`e^{aL}` (:math:`t^a` becomes :math:`e^{-aL}`): a ``pow`` call keeps the Numba loops from
  vectorising (α = 0.7 ran about three times slower: ``docs/kernel_measurements.md``), and the logarithm is
  already at hand.  The logarithms' functions (p or 1 - p below e^-700 only) keep the form in u; their powers
  :math:`e^{aL}` are written with the side's root (:func:`_powers_on_root`), adding no ``exp``.
* In the compiled backends' select form, the closed and the far form share their exp, log, expm1 and log1p calls,
  each pair one call on the argument the far switch selects (:func:`_shared_calls`): JS's root takes one log where
  it took two.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache

import sympy as sp
from sympy.codegen.cfunctions import expm1, log1p

from ...divergences import Divergence
from ...plan import VECTORISED_NAMES, GeneratedFunction
from ..generator_facts.mpmath_g import checked_facts, refuse_unless_done
from ..generator_facts.symbolic import U, on_side
from .far_threshold import far_threshold
from .overflow import safe_log_abs, safe_value
from .selects import X, holds_near_one, last_piece, pieces_of, selected

__all__ = ["TAYLOR_ORDER", "TAYLOR_RADIUS", "GeneratorFunctions", "generated_function", "generator_functions"]

#: Symbols of the generated functions: x = u - 1, L = log u, u; and t = 1/u, y = x/u (far branch, u > 2).
L, UU, T, Y = sp.symbols("L u t y", real=True)

#: Degree of the Taylor polynomials and the radius |x| below which they replace the closed expression.
#: Truncation at |x| = 0.1 for a series with radius of convergence >= 1 is <= 0.1**15 relative, while the
#: closed expressions' cancellation there is <= ~eps/x**2 = 2e-14.
TAYLOR_ORDER = 16
TAYLOR_RADIUS = 0.1



@dataclass(frozen=True)
class SideFunction:
    """One generated function of (x, L, u): a closed expression and, if it can cancel, a Taylor polynomial."""

    name: str
    closed: sp.Expr
    taylor: sp.Expr | None  # polynomial in x (Horner form) or None
    far: sp.Expr | None  # r side only: the expression in (t, y, L), used for x > the generator's far_x
    at_infinity: float | None = None  # r side only: limit u -> oo (where ``far`` is NaN at u = inf)

    def math_source(self, far_x: float) -> str:
        """Python source of ``name(x, L, u)`` for the Numba backend's generated module: every branch computed and
        chosen by ``xp.where`` (a select, so a compiler can vectorise the caller's loop), exp/log/sqrt from
        ``xp`` (the generated module's scalar namespace), any other function from ``math``; the far form for
        x > ``far_x``."""
        lines = [f"def {self.name}(x, L, u):"]
        if self.far is None:
            lines += _cse_lines(self.closed, "c_", indent=4, result="value")
        else:
            lines += ["    t = 1.0 / u", "    y = 1.0 - t"]
            shared, closed, far = _shared_calls(self.closed, self.far)
            lines += [f"    {symbol} = xp.{name}(xp.where(x > {far_x!r}, {_pycode(b)}, {_pycode(a)}))"
                      for symbol, name, a, b in shared]
            lines += _cse_lines(closed, "c_", indent=4, result="value")
            lines += _cse_lines(far, "f_", indent=4, result="far")
            lines.append(f"    far = xp.where(xp.logical_and(xp.isnan(far), u == xp.inf), "
                         f"{_float_literal(self.at_infinity)}, far)  # e.g. 0*log(inf): the limit")
            lines.append(f"    value = xp.where(x > {far_x!r}, far, value)")
        if self.taylor is not None:
            lines.append(f"    value = xp.where(xp.abs(x) < {TAYLOR_RADIUS!r}, {_pycode(self.taylor)}, value)")
        lines.append("    return value")
        return "\n".join(lines) + "\n"


#: The functions whose calls the closed and far forms share (:func:`_shared_calls`): the Numba module's own exp
#: and log, some 20-40 vector instructions each; a square root is one instruction, which a select would not save.
_SHARED_FUNCTIONS = (sp.exp, sp.log, expm1, log1p)


def _innermost_calls(expr: sp.Expr) -> dict[str, list[sp.Expr]]:
    """The calls of :data:`_SHARED_FUNCTIONS` in ``expr`` whose arguments call none, by function, in a fixed
    order."""
    calls: dict[str, list[sp.Expr]] = {}
    for node in sp.preorder_traversal(expr):
        if type(node) in _SHARED_FUNCTIONS and not node.args[0].has(*_SHARED_FUNCTIONS):
            if node not in calls.setdefault(type(node).__name__, []):
                calls[type(node).__name__].append(node)
    return calls


def _shared_calls(closed: sp.Expr, far: sp.Expr):
    r"""(shared, closed', far'): the closed and the far form of an r-side function share their calls of exp, log,
    expm1 and log1p, one per pair of calls of the same function, on an argument selected as the form is
    (x > far_x: the far form's): ``shared`` is [(symbol, function, closed argument, far argument)], and
    ``closed'`` and ``far'`` read the symbols.  Each form is kept only where its argument was selected, so the
    values are the forms' own, while every evaluation computes one call where it computed two (JS: log((u + 1)/2)
    and log(1/2 + 1/(2t)), one log per root in the Numba kernels).  Innermost calls first, then the calls around
    them, until no function has a call in both forms; a call textually the same in both is left alone (LLVM
    computes it once)."""
    shared: list[tuple[sp.Symbol, str, sp.Expr, sp.Expr]] = []
    while True:
        closed_calls, far_calls = _innermost_calls(closed), _innermost_calls(far)
        pairs = [(name, a, b) for name in sorted(closed_calls)
                 for a, b in zip(closed_calls[name], far_calls.get(name, ()), strict=False) if a != b]  # fmt: skip
        if not pairs:
            return shared, closed, far
        for name, a, b in pairs:
            symbol = sp.Symbol(f"s_{len(shared)}", real=True)
            shared.append((symbol, name, a.args[0], b.args[0]))
            closed, far = closed.xreplace({a: symbol}), far.xreplace({b: symbol})


def _float_literal(value: float) -> str:
    return "math.inf" if value == float("inf") else repr(value)


def _cse_lines(expr: sp.Expr, prefix: str, indent: int, result: str) -> list[str]:
    pad = " " * indent
    subs, (reduced,) = sp.cse(expr, symbols=sp.numbered_symbols(prefix))
    return [f"{pad}{sym} = {_pycode(value)}" for sym, value in subs] + [f"{pad}{result} = {_pycode(reduced)}"]


#: functions the generated Numba module takes from its ``xp`` namespace (vectorisable there), not from ``math``
_XP_FUNCTIONS = re.compile(r"\bmath\.(exp|expm1|log|log1p|sqrt)\(")


def _pycode(expr: sp.Expr) -> str:
    return _XP_FUNCTIONS.sub(r"xp.\1(", sp.pycode(expr, fully_qualified_modules=True, standard="python3"))


@dataclass(frozen=True)
class GeneratorFunctions:
    r"""Everything a solver needs about one divergence, as SymPy expressions and float constants.

    Attributes
    ----------
    divergence : Divergence
    phi_r, dphi_r : SideFunction
        :math:`\Phi(u) = \tilde f(u)/u` and :math:`\tilde f'(u)` for :math:`u \ge 1` (the token's ratio r).
    f_s, k_s : SideFunction
        :math:`\tilde f(u)` and :math:`u\tilde f'(u)` for :math:`u \le 1` (the ratio s of the other tokens).
    f_at_zero : float
        :math:`\tilde f(0^+)` (``inf`` when the lower bound never saturates).
    slope_at_infinity : float
        :math:`\sigma_\infty = \lim_{u\to\infty}\tilde f(u)/u = \Phi(\infty)` (``inf`` for e.g. Pearson).
    f2 : float
        :math:`\tilde f''(1)` (0 for a kink).
    kink : float
        :math:`\tilde f'(1^+) - \tilde f'(1^-)` (TV: 1; 0 for smooth generators).
    far_x : float
        The x above which the r-side functions take their far form (:mod:`.far_threshold`).
    """

    divergence: Divergence
    phi_r: SideFunction
    dphi_r: SideFunction
    f_s: SideFunction
    k_s: SideFunction
    log_f_s: SideFunction
    log_k_s: SideFunction
    log_phi_r: SideFunction
    log_dphi_r: SideFunction
    f_at_zero: float
    slope_at_infinity: float
    f2: float
    kink: float
    far_x: float

    @property
    def functions(self) -> tuple[SideFunction, ...]:
        return (self.phi_r, self.dphi_r, self.f_s, self.k_s, self.log_f_s, self.log_k_s, self.log_phi_r,
                self.log_dphi_r)

    def math_source(self) -> str:
        """Source of the scalar functions (select form, see :meth:`SideFunction.math_source`) for the Numba
        backend's generated module."""
        return "\n\n".join(fn.math_source(self.far_x) for fn in self.functions)

    def key(self) -> str:
        """A stable identifier of the generated code (used to name cached modules)."""
        import hashlib

        text = "\n".join(
            [self.math_source(), repr((self.f_at_zero, self.slope_at_infinity, self.f2, self.kink))]
        )
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _on_signs(expr: sp.Expr, sign: int, rewrite: Callable[[sp.Expr], sp.Expr]) -> sp.Expr:
    """``rewrite(expr)`` with x, L (and t, y) carrying their signs on one side of u = 1 (x, L > 0 and
    t, y > 0 on the r side; x, L < 0 on the s side; u > 0), so that SymPy knows the signs of the terms."""
    symbols = (X, L, UU, T, Y)
    signed = {X: sign > 0, L: sign > 0, UU: True, T: True, Y: True}
    dummies = {s: sp.Dummy(s.name, positive=True) if signed[s] else sp.Dummy(s.name, negative=True)
               for s in symbols}  # fmt: skip
    result = rewrite(_exponents_in_x(expr).xreplace(dummies))
    return result.xreplace({d: s for s, d in dummies.items()})


def _side_expression(expr: sp.Expr, sign: int, n: int = 1) -> sp.Expr:
    """``expr(u)`` on one side of u = 1, in the symbols (x, L, u), cancellation-free where factoring allows; with
    a root (n > 1), in (c, c - 1, L, u) instead (:func:`_in_root`)."""
    xs = sp.Symbol("xs", positive=True) if sign > 0 else sp.Symbol("xs", negative=True)
    # resolve Abs(u - 1) etc. on this side, then go back to u
    expr = expr.subs(U, 1 + xs).subs(xs, U - 1)
    expr = sp.expand_log(expr, force=True).xreplace({sp.log(U): L})
    if n > 1:
        return _in_root(expr, U, n)
    expr = sp.factor(expr)
    if sign < 0:  # u**a = exp(a L) for a < 0 on the s side: no 1/u overflow when u underflows
        expr = expr.replace(
            lambda e: e.is_Pow and e.base == U and bool(e.exp.is_negative), lambda e: sp.exp(e.exp * L)
        )
    expr = expr.replace(lambda e: e.is_Pow and e.base == U - 1, lambda e: X**e.exp)
    expr = expr.xreplace({U - 1: X})
    return expr.xreplace({U: UU})


def _far_expression(expr: sp.Expr, n: int = 1) -> sp.Expr:
    """r side, ``expr(u)`` for u > 1 in (t, y, L) with t = 1/u, y = 1 - t = x/u: no u**k overflow; with a root
    (n > 1), in (c, c - 1, L, t) with c = t^(1/N) instead (:func:`_in_root`)."""
    xs, ts = sp.Symbol("xs", positive=True), sp.Symbol("ts", positive=True)
    expr = expr.subs(U, 1 + xs).subs(xs, U - 1)
    expr = sp.expand_log(expr, force=True).xreplace({sp.log(U): L})
    if n > 1:
        return _exponents_in_x(_in_root(expr.subs(U, 1 / ts), ts, n))
    expr = sp.factor(expr.subs(U, 1 / ts))
    expr = expr.replace(lambda e: e.is_Pow and e.base == ts - 1, lambda e: (-Y) ** e.exp)
    return _exponents_in_x(expr.xreplace({ts - 1: -Y, 1 - ts: Y}).xreplace({ts: T}))


def _exponents_in_x(expr: sp.Expr) -> sp.Expr:
    """The arguments of exponential and hyperbolic functions in x = u - 1 = 1/t - 1 rather than u or t:
    e^{1/t - 1} and e^{-1} e^u are e^x, whose size and sign (the side's) :mod:`.overflow` can then read.  An
    expression without them is returned as it is (SymPy's powsimp takes seconds on the polynomials of a root)."""
    if not expr.has(sp.exp, sp.cosh, sp.sinh, sp.tanh):
        return expr
    in_x = {T: 1 / (1 + X), Y: X / (1 + X), UU: 1 + X}
    expr = expr.replace(lambda e: isinstance(e, (sp.exp, sp.cosh, sp.sinh, sp.tanh)),
                        lambda e: e.func(sp.expand(e.args[0].xreplace(in_x))))  # fmt: skip
    return sp.powsimp(expr, combine="exp")  # e^-1 e^(x + 1) = e^x


def _needs_taylor(closed: sp.Expr) -> bool:
    """False when ``closed`` is a product of powers of x, L and c - 1 (each accurate, however small) and an R(u)
    with R(1) finite and nonzero, free of them (no cancellation): e.g. reverse KL's f'(u) = L."""
    factors = sp.Mul.make_args(closed)
    rest = [f for f in factors if not (f in (X, L, RM) or (f.is_Pow and f.base in (X, L, RM)))]
    remainder = sp.Mul(*rest).subs(L, sp.log(UU))
    if remainder.has(X, RM):
        return True
    value = remainder.subs({UU: 1, RC: 1})
    return not (value.is_finite and value != 0)


def _taylor(expr_u: sp.Expr, sign: int) -> sp.Expr | None:
    """Taylor polynomial of ``expr_u`` (a function of u) around u = 1 on one side, in x, Horner form."""
    xs = sp.Symbol("xs", positive=True) if sign > 0 else sp.Symbol("xs", negative=True)
    series = sp.series(expr_u.subs(U, 1 + xs), xs, 0, TAYLOR_ORDER + 1).removeO()
    poly = sp.expand(series).xreplace({xs: X})
    if not poly.is_polynomial(X) or poly.has(sp.zoo, sp.nan, sp.oo):
        return None
    return sp.horner(poly, X)


def _powers_as_exp(expr: sp.Expr, base: sp.Symbol, log_base: sp.Expr) -> sp.Expr:
    """``base**a`` as ``exp(a log_base)`` for every exponent a that is neither an integer, ±1/2 nor a positive
    half-integer (those stay multiplications and square roots: :func:`_square_roots`).  A non-integer power is a
    libm ``pow`` call, which stops a compiler from vectorising the solver's loop; ``exp`` of the accurate logarithm
    the functions receive is vectorised, and its error, (|a log_base| + 2) ulp, is that of ``pow`` applied to a
    base rounded from its logarithm."""

    def fractional(e: sp.Expr) -> bool:
        return (e.is_Pow and e.base == base and e.exp.is_Rational and not e.exp.is_integer
                and abs(e.exp) != sp.Rational(1, 2) and not _half_integer(e.exp))  # fmt: skip

    return expr.replace(fractional, lambda e: sp.exp(e.exp * log_base))


def _half_integer(a: sp.Expr) -> bool:
    """Whether ``a`` is m + 1/2 for an integer m >= 1."""
    return bool(a.is_Rational and a.q == 2 and a > 1)


class _SquareRoot(sp.Function):
    """``sqrt(b)`` kept apart from b's integer powers, with which SymPy would merge it back into ``b**(m + 1/2)``."""

    nargs = 1

    def _pythoncode(self, printer) -> str:
        return printer._print(sp.sqrt(self.args[0]))


def _square_roots(expr: sp.Expr | None) -> sp.Expr | None:
    r"""Every power :math:`b^{m + 1/2}` (m >= 1, any base b: x, y = 1 - t, t, u, 1 - u, ...) as
    :math:`b^m \sqrt b`, a few multiplications and a square root that vectorise, where ``b**1.5`` would be a libm
    ``pow`` call (and t**1.5 an ``exp``: the far branches of most generators with a square root already take
    sqrt(t)).  Both factors are on the same side of 1 as the power, so neither overflows nor underflows unless it
    does; b < 0 gives NaN, as ``pow`` did."""
    if expr is None:
        return None
    return expr.replace(lambda e: e.is_Pow and _half_integer(e.exp),
                        lambda e: e.base ** (e.exp - sp.Rational(1, 2)) * _SquareRoot(e.base))  # fmt: skip


#: Largest N, the lcm of the denominators of the generator's fractional exponents of u, for which the functions are
#: written in the root c = u^(1/N) (:func:`_in_root`).  Every power is then an integer power of c, a few
#: multiplications (in a Horner form) where each was an ``exp`` of some 20 vector instructions; beyond it
#: (α = 0.99: N = 100) the polynomials in c grow to degree ~N and cost as much as the exps they replace.  N = 2
#: keeps ``sqrt`` (exact, and as cheap as an ``exp``) and e^{aL} for the other half-integers it cannot take.
ROOT_DENOMINATOR_MAX = 16

#: The root of the branch's variable in SymPy's expressions: c = u^(1/N) (closed forms) or t^(1/N) (far form), and
#: c - 1 (printed as :class:`_Root` and :class:`_RootMinusOne`, or from them, by :func:`_with_roots`).
RC = sp.Symbol("rc", positive=True)
RM = sp.Symbol("rm", real=True)

#: Largest N (max |a| + 1) (a: the generator's exponents of u), about the degree of the polynomials in the root,
#: for which the root form is used: beyond it their Horner forms cost more than the exps they replace, and
#: SymPy's factorisation (under 2 s at degree 95, α = 5.9375) grows towards the code generation's time budget.
ROOT_DEGREE_MAX = 128


def _root_denominator(f: sp.Expr) -> int:
    """N of :data:`ROOT_DENOMINATOR_MAX` for the generator ``f``, or 1 where its functions keep their powers of u."""
    exponents = [e.exp for e in f.atoms(sp.Pow) if e.base == U and e.exp.is_Rational and not e.exp.is_integer]
    if not exponents:
        return 1
    n = math.lcm(*(a.q for a in exponents))
    degree = n * (max(abs(a) for a in exponents) + 1)
    return n if 2 < n <= ROOT_DENOMINATOR_MAX and degree <= ROOT_DEGREE_MAX else 1


class _Root(sp.Function):
    r"""The root :math:`c = e^{qL}` (:math:`q = 1/N`) of the closed forms, printed as that ``exp``.  A function of its
    own rather than ``exp(q*L)``, whose integer powers SymPy would fold back into one ``exp``; its text is the same
    in every function of a side, so that the Numba module computes it once per evaluation of the side (LLVM merges
    the identical instructions after inlining)."""

    nargs = 2

    def _eval_is_positive(self) -> bool:
        return True

    def _pythoncode(self, printer) -> str:
        log_u, q = self.args
        return printer._print(sp.exp(q * log_u))


class _ReciprocalRoot(_Root):
    r""":math:`e^{-qL} = 1/c`, the root :math:`t^{1/N}` of the far form, formed as the reciprocal of the closed forms'
    root (a division, not a second ``exp``): on the r side :math:`1/c \in [e^{-71}, 1]` for every finite u, 0 at
    :math:`u = \infty`."""

    def _pythoncode(self, printer) -> str:
        log_u, q = self.args
        return f"(1.0/{printer._print(sp.exp(q * log_u))})"


class _ReciprocalRootMinusOne(_Root):
    r""":math:`1/c - 1 = -\operatorname{expm1}(qL)/c`, without cancellation, one factor (its powers are of the
    product, which stays in [-1, 0] on the r side, where the two factors alone could overflow and underflow)."""

    def _pythoncode(self, printer) -> str:
        log_u, q = self.args
        return f"(-{printer._print(expm1(q * log_u))}*(1.0/{printer._print(sp.exp(q * log_u))}))"


class _RootMinusOne(sp.Function):
    r""":math:`c - 1 = \operatorname{expm1}(qL)`, without the cancellation of ``c - 1`` near u = 1 (``expm1`` and
    ``exp`` of one argument share their range reduction and Taylor sum in the Numba module: LLVM computes them
    once)."""

    nargs = 2

    def _pythoncode(self, printer) -> str:
        log_u, q = self.args
        return printer._print(expm1(q * log_u))


def _in_root(expr: sp.Expr, var: sp.Symbol, n: int) -> sp.Expr:
    r"""``expr`` (of ``var`` = u or t, and L) as a rational function of the root :math:`c = \mathrm{var}^{1/N}`
    (:data:`RC`), factored over the rationals: where the closed form cancels near u = 1, SymPy's factorisation in c
    shows it as powers of c - 1 (:data:`RM`, computed as ``expm1(L/N)``: no cancellation), e.g. α = 0.7's
    :math:`7u - 10u^{7/10} + 3 = (c - 1)^2 (7c^8 + 14c^7 + 21c^6 + 18c^5 + 15c^4 + 12c^3 + 9c^2 + 6c + 3)`, where
    the form in u cancelled (SymPy does not find that factorisation in u)."""
    expr = sp.factor(expr.subs(var, RC**n))
    return expr.xreplace({RC - 1: RM, 1 - RC: -RM})


def _with_roots(expr: sp.Expr | None, n: int, far: bool) -> sp.Expr | None:
    r""":func:`_in_root`'s expression as the kernels compute it.  Polynomials in c in Horner form (here, last:
    SymPy's rewriting of exponents is slow on nested products); a power :math:`c^{\pm e}` with e >= N as
    :math:`(w^{\lfloor e/N \rfloor} c^{e \bmod N})^{\pm 1}`, w = u (closed forms) or t (far form): exact, fewer
    products, and of factors on the same side of 1, so that none overflows or underflows before the power does (a
    negative power is a division by that product, which underflows to 0 only where the power overflows).  Then the
    root c = exp(L/N) and c - 1 = expm1(L/N) in the closed forms; in the far form 1/c (the root of t) and
    1/c - 1 = -expm1(L/N)/c."""
    if expr is None or n == 1:
        return expr

    def polynomial(e: sp.Expr) -> bool:
        return e.is_Add and e.free_symbols == {RC} and e.is_polynomial(RC)

    def split(e: sp.Expr) -> sp.Expr:
        m, k = divmod(abs(int(e.exp)), n)
        return ((T if far else UU) ** m * RC**k) ** sp.sign(e.exp)

    expr = expr.replace(polynomial, lambda e: sp.horner(e, wrt=RC))
    expr = expr.replace(lambda e: e.is_Pow and e.base == RC and e.exp.is_Integer and abs(e.exp) >= n, split)
    q = sp.Rational(1, n)
    if far:
        return expr.xreplace({RC: _ReciprocalRoot(L, q), RM: _ReciprocalRootMinusOne(L, q)})
    return expr.xreplace({RC: _Root(L, q), RM: _RootMinusOne(L, q)})


def _power_exponent(node: sp.Basic) -> sp.Rational | None:
    """a where ``node`` is e^{aL} (a power u^a) with a rational and not an integer, else None."""
    if isinstance(node, sp.exp):
        a = node.args[0] / L
        if a.is_Rational and not a.is_integer:
            return a
    return None


def _powers_on_root(expr: sp.Expr | None, n: int, sign: int) -> sp.Expr | None:
    r"""The powers :math:`e^{aL}` (a = k/N) left in ``expr`` (the logarithms' functions, which keep the form in u:
    they serve only the far tails, p or 1 - p < e^-700) as powers of the closed forms' root c = e^{L/N}, so that
    they add no ``exp``: :math:`c^{k \bmod N} u^{\lfloor k/N \rfloor}` for a > 0 (c, u on the same side of 1);
    for a < 0, :math:`(1/c)^{-k}` on the r side (1/c <= 1) and :math:`1/c^{-k}` on the s side (no 1/u, which
    overflows where u underflows; c^{-k} underflows exactly where the power overflows)."""
    if expr is None or n == 1:
        return expr
    q = sp.Rational(1, n)
    powers = {}
    for node in expr.atoms(sp.exp):
        a = _power_exponent(node)
        if a is None or n % a.q:
            continue
        k = int(a * n)
        if k > 0:
            powers[node] = _Root(L, q) ** (k % n) * UU ** (k // n)
        else:
            powers[node] = _ReciprocalRoot(L, q) ** (-k) if sign > 0 else _Root(L, q) ** k
    return expr.xreplace(powers)


def _side_function(name: str, expr_u: sp.Expr, sign: int, n: int = 1) -> SideFunction:
    pieces = pieces_of(on_side(expr_u, sign))  # Abs, Min/Max, where() resolved on this side of u = 1

    def closed_of(expr: sp.Expr) -> sp.Expr:
        closed = _square_roots(_powers_as_exp(_side_expression(expr, sign, n), UU, L))
        return _with_roots(_on_signs(closed, sign, safe_value), n, far=False)

    def far_of(expr: sp.Expr) -> sp.Expr:
        far = _square_roots(_powers_as_exp(_far_expression(expr, n), T, -L))
        return _with_roots(_on_signs(far, sign, safe_value), n, far=True)

    closed = selected(pieces, closed_of)
    near_one = [expr for expr, cond in pieces if holds_near_one(cond, sign, TAYLOR_RADIUS)][:1]
    taylor = None
    if near_one and _needs_taylor(_side_expression(near_one[0], sign, n)):
        taylor = _taylor(near_one[0], sign)
    if sign < 0:
        return SideFunction(name=name, closed=closed, taylor=taylor, far=None)
    at_infinity = _to_float(sp.limit(last_piece(pieces), U, sp.oo))
    far = selected(pieces, far_of)
    return SideFunction(name, closed, taylor, far=far, at_infinity=at_infinity)


def _log_abs(expr: sp.Expr) -> sp.Expr:
    """log|expr| for an s-side expression in (x, L, u), split over products and powers so that it never forms
    a huge intermediate: log|x^a e^{bL}| = a log(-x) + bL (x = u - 1 < 0 on the s side)."""
    if expr.is_Mul:
        return sp.Add(*(_log_abs(arg) for arg in expr.args))
    if expr.is_Pow and expr.exp.is_real and expr.exp.is_number:
        return expr.exp * _log_abs(expr.base)
    if expr == X:
        return sp.log(-X)
    if expr == UU:
        return L
    if expr.is_zero:  # a piece on which f̃ vanishes
        return -sp.oo
    return _on_signs(expr, -1, lambda e: safe_log_abs(e, powers=True))


def _log_side_function(name: str, expr_u: sp.Expr) -> SideFunction:
    r"""log|expr| on the s side, for :math:`(1-p)\tilde f(s)` when :math:`1 - p < e^{-700}` and s underflows:
    the product is formed as :math:`e^{\log(1-p) + \log|\tilde f(s)|}` (e.g. Neyman's lower bound at
    :math:`\log p = -1500`, where :math:`\tilde f(s) \approx 1/s` overflows while the product is about δ)."""
    pieces = pieces_of(on_side(expr_u, -1))
    closed = selected(pieces, lambda e: _square_roots(_powers_as_exp(_log_abs(_side_expression(e, -1)), UU, L)))
    return SideFunction(name=name, closed=closed, taylor=None, far=None)


def _log_abs_far(expr: sp.Expr) -> sp.Expr:
    """log|expr| for an r-side far expression in (t, y, L), t = 1/u = e^{-L}, y = 1 - t, as a function of L."""
    if expr.is_Mul:
        return sp.Add(*(_log_abs_far(arg) for arg in expr.args))
    if expr.is_Pow and expr.exp.is_real and expr.exp.is_number:
        return expr.exp * _log_abs_far(expr.base)
    if expr == T:
        return -L
    if expr in (Y, -Y):
        return sp.log(1 - sp.exp(-L))  # y in (1/2, 1) where this is used: no cancellation
    if expr == L:
        return sp.log(L)
    if expr.is_zero:
        return -sp.oo
    in_l = _exponents_in_x(expr).xreplace({T: sp.exp(-L), Y: 1 - sp.exp(-L)})
    return _on_signs(in_l, 1, lambda e: safe_log_abs(e, powers=True))


def _log_far_function(name: str, expr_u: sp.Expr) -> SideFunction:
    r"""log of an r-side function for u > 2, in L = log u only: for :math:`p < e^{-700}` the products
    :math:`q\Phi(r)` and :math:`q\tilde f'(r)` are formed as exponentials of sums of logarithms, as
    :math:`\Phi(r)` itself may overflow (α = 3 at :math:`\log p = -1500`: :math:`\Phi(r) \sim r^2/6`)."""
    pieces = pieces_of(on_side(expr_u, 1))
    return SideFunction(name=name, closed=selected(pieces, lambda e: _log_abs_far(_far_expression(e))), taylor=None,
                        far=None)


def _to_float(value: sp.Expr) -> float:
    if value == sp.oo:
        return float("inf")
    return float(sp.N(value, 30))


#: Time budget for generating the solver functions of one generator (factor, series, limits).
CODEGEN_SECONDS = 30.0


@lru_cache(maxsize=128)
def generator_functions(div: Divergence) -> GeneratorFunctions:
    """Build (and cache per divergence) the numeric functions of :class:`GeneratorFunctions`.

    Runs under a time budget (:data:`CODEGEN_SECONDS`): a generator whose functions SymPy cannot produce in
    time, or that is nested too deeply for it, is refused with a :class:`GeneratorError` instead of hanging."""
    what = f"{div.name}: SymPy could not generate the solver functions of this generator"
    return refuse_unless_done(lambda: _generator_functions(div), CODEGEN_SECONDS, what)


def _generator_functions(div: Divergence) -> GeneratorFunctions:
    known = checked_facts(div)
    f = known.f_normalised
    df = sp.diff(f, U)
    left, right = known.slopes_at_one  # one-sided slopes of f at 1 (those of f̃ differ from them by f'(1))
    f2 = _to_float(known.f2) if known.is_smooth_at_one else 0.0
    n = _root_denominator(f)
    phi_r, dphi_r, f_s, k_s = (
        _side_function(name, expr, sign, n)
        for name, expr, sign in (("phi_r", f / U, 1), ("dphi_r", df, 1), ("f_s", f, -1), ("k_s", U * df, -1))
    )
    log_f_s, log_k_s, log_phi_r, log_dphi_r = (
        replace(fn, closed=_powers_on_root(fn.closed, n, sign)) for fn, sign in (
            (_log_side_function("log_f_s", f), -1), (_log_side_function("log_k_s", U * df), -1),
            (_log_far_function("log_phi_r", f / U), 1), (_log_far_function("log_dphi_r", df), 1)))  # fmt: skip
    return GeneratorFunctions(
        divergence=div,
        phi_r=phi_r,
        dphi_r=dphi_r,
        f_s=f_s,
        k_s=k_s,
        log_f_s=log_f_s,
        log_k_s=log_k_s,
        log_phi_r=log_phi_r,
        log_dphi_r=log_dphi_r,
        f_at_zero=_to_float(known.f_at_zero),
        slope_at_infinity=_to_float(known.slope_at_infinity),
        f2=f2,
        kink=_to_float(right - left),
        far_x=far_threshold(f, tuple((_closed_source(fn), _far_source(fn)) for fn in (phi_r, dphi_r))),
    )


#: What the vectorised sources are printed against: the names a plan's sources may call (values are bound by the
#: kernels; lambdify's printer reads the names only)
_PRINTED_NAMES = dict.fromkeys(VECTORISED_NAMES)


def _vectorised_source(expr: sp.Expr, args, name: str, cse: bool) -> str:
    """``def name(*args)``: SymPy's lambdify printer's source of ``expr`` against :data:`_PRINTED_NAMES`."""
    function = sp.lambdify(args, expr, modules=[_PRINTED_NAMES], cse=cse)
    source = inspect.getsource(function)
    return source.replace("def _lambdifygenerated(", f"def {name}(", 1)


def _closed_source(fn: SideFunction) -> str:
    return _vectorised_source(fn.closed, (X, L, UU), "closed", cse=True)


def _far_source(fn: SideFunction) -> str | None:
    return None if fn.far is None else _vectorised_source(fn.far, (T, Y, L, X), "far", cse=True)


def generated_function(fn: SideFunction, far_x: float) -> GeneratedFunction:
    """``fn`` as the plan carries it: its select-form source (compiled backends; the far form beyond ``far_x``)
    and its closed, Taylor and far forms as vectorised sources (NumPy, torch)."""
    return GeneratedFunction(
        name=fn.name,
        select_source=fn.math_source(far_x),
        closed=_closed_source(fn),
        taylor=None if fn.taylor is None else _vectorised_source(fn.taylor, X, "taylor", cse=False),
        far=_far_source(fn),
        at_infinity=None if fn.at_infinity is None else float(fn.at_infinity),
    )
