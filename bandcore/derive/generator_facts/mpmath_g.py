r"""The one high-precision :math:`g_f` of bandcore (mpmath), straight from the definition.

For a token with old probability :math:`p` and ratio :math:`r`, with :math:`s = (1 - pr)/(1 - p)`,

.. math::  g_f(p, r) = p\,\tilde f(r) + (1-p)\,\tilde f(s), \qquad \tilde f(u) = f(u) - f'(1)(u - 1) \ge 0,

and :math:`g_f = \infty` where :math:`s < 0` (:math:`r > 1/p` leaves the simplex).  :math:`\tilde f` is
:attr:`.symbolic.Facts.f_normalised` lambdified to mpmath; :math:`\tilde f(0) = \tilde f(0^+)`
(possibly :math:`\infty`) is substituted at :math:`u = 0`.  At :math:`p = 1` the perspective convention
:math:`0 \cdot \tilde f(x/0) = x\,\sigma_\infty`, :math:`\sigma_\infty = \lim_{u\to\infty}\tilde f(u)/u`, makes every
bound continuous as :math:`p \to 1`.

Three coordinate systems, one formula (:func:`_combine`):

* :func:`g_mp` — the oracle's: :math:`\log p` and :math:`y = \log r`, with :math:`1 - p` and :math:`1 - pr`
  from ``expm1`` (no cancellation at :math:`p \to 1` or :math:`r \to 1/p`);
* :func:`g_ratio` — :math:`p` and :math:`r` themselves (the derivation's branch validation);
* :func:`g_boundary` — the simplex edges :math:`G(p) = g_f(p, 1/p)` (upper) and :math:`g_f(p, 0)` (lower), with
  :math:`s = 0` and :math:`s = 1/(1-p)` exactly rather than through a rounded :math:`1 - p\cdot(1/p)`.

Every function works in the caller's mpmath precision (``mp.workdps``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import mpmath as mp

from ...divergences import Divergence, GeneratorError
from .budget import BudgetExceeded, bounded, time_limit

if TYPE_CHECKING:  # pragma: no cover
    import sympy as sp

    from .symbolic import Facts

__all__ = [
    "FACTS_SECONDS",
    "MpGenerator",
    "checked_facts",
    "g_boundary",
    "g_mp",
    "g_ratio",
    "mp_generator",
    "refuse_unless_done",
]

#: Time budget of the exact facts of one generator (f'(1), f̃, f̃(0⁺), σ∞, derivatives at 1).
FACTS_SECONDS = 20.0
_CONSTANT_DPS = 80


def refuse_unless_done(fn: Callable[[], Any], seconds: float, what: str) -> Any:
    """``fn()`` under a time budget, or a :class:`~bandcore.divergences.GeneratorError` saying ``what`` could not be
    done: when SymPy runs past ``seconds`` (or the overall :func:`.budget.deadline`), fails on the
    expression, or finds it too deeply nested.  The generator is then refused rather than left to hang."""
    try:
        with time_limit(seconds):
            return fn()
    except BudgetExceeded:
        raise GeneratorError(f"{what} within {seconds:g} s (too complex)") from None
    except RecursionError:
        raise GeneratorError(f"{what}: it is nested too deeply for the symbolic engine") from None
    except Exception as err:  # SymPy's own errors too (PolynomialError, ...); a bug of ours is re-raised
        if isinstance(err, (ArithmeticError, LookupError, NotImplementedError, TypeError, ValueError)) or type(
            err
        ).__module__.startswith("sympy"):
            raise GeneratorError(f"{what} ({type(err).__name__}: {err})") from None
        raise


def checked_facts(div: Divergence, seconds: float = FACTS_SECONDS) -> Facts:
    """:func:`~bandcore.derive.generator_facts.symbolic.facts` under a time budget (:func:`refuse_unless_done`)."""
    from .symbolic import facts  # SymPy is loaded on first use only: importing this module stays light

    what = f"{div.name}: SymPy could not derive f'(1), f̃(0+) and lim f̃(u)/u of this generator"
    return refuse_unless_done(lambda: facts(div), seconds, what)


@dataclass(frozen=True)
class MpGenerator:
    r""":math:`\tilde f` in mpmath, with its value at 0 and its slope at infinity (``mp.inf`` when infinite)."""

    f_tilde: Callable[[Any], Any]
    at_zero: Any
    slope_at_infinity: Any

    def __call__(self, u: Any) -> Any:
        r""":math:`\tilde f(u)` (real part; :math:`\tilde f(0^+)` at ``u == 0``)."""
        if u == 0:
            return self.at_zero
        return mp.re(self.f_tilde(u))


def _constant(value: sp.Expr, what: str, name: str) -> Any:
    import sympy as sp

    if value == sp.oo:
        return mp.inf
    number = bounded(lambda: complex(sp.N(value, _CONSTANT_DPS)), 8.0) if value.is_number else None
    if number is None or number.imag != 0 or not mp.isfinite(number.real) or number.real < 0:
        raise GeneratorError(f"{name}: {what} = {sp.sstr(value)} is not a non-negative real number or oo")
    with mp.workdps(_CONSTANT_DPS):
        return mp.mpf(str(sp.N(value, _CONSTANT_DPS)))


@lru_cache(maxsize=128)
def mp_generator(div: Divergence) -> MpGenerator:
    r"""The :class:`MpGenerator` of a divergence (cached): :math:`\tilde f`, :math:`\tilde f(0^+)`,
    :math:`\sigma_\infty`."""
    import sympy as sp

    from .symbolic import U

    fx = checked_facts(div)
    f_tilde = bounded(lambda: sp.lambdify(U, fx.f_normalised, "mpmath"), 8.0)
    if f_tilde is None:
        raise GeneratorError(f"{div.name}: the normalised generator could not be compiled for mpmath")
    at_zero = _constant(fx.f_at_zero, "f̃(0+)", div.name)
    slope = _constant(fx.slope_at_infinity, "lim f̃(u)/u", div.name)
    return MpGenerator(f_tilde, at_zero, slope)


def _combine(gen: MpGenerator, p: Any, r: Any, one_minus_p: Any, one_minus_pr: Any) -> Any:
    r""":math:`p\tilde f(r) + (1-p)\tilde f(s)`, :math:`s = (1-pr)/(1-p)`: the definition, once for all callers."""
    if one_minus_pr < 0:
        return mp.inf
    if one_minus_p == 0:  # perspective: 0·f̃(x/0) = x·lim f̃(u)/u
        slope = gen.slope_at_infinity
        rest = mp.inf if (slope == mp.inf and one_minus_pr > 0) else one_minus_pr * (slope if one_minus_pr else 0)
        return p * gen(r) + rest
    return p * gen(r) + one_minus_p * gen(one_minus_pr / one_minus_p)


def g_mp(div: Divergence, log_p: Any, y: Any) -> Any:
    """:math:`g_f(p, r)` at ``log_p`` (<= 0) and ``y = log r`` (``-inf`` means r = 0), in the current precision."""
    gen = mp_generator(div)
    log_p, y = mp.mpf(log_p), mp.mpf(y)
    p = mp.exp(log_p)
    r = mp.exp(y) if y != mp.ninf else mp.mpf(0)
    one_minus_pr = -mp.expm1(log_p + y) if y != mp.ninf else mp.mpf(1)  # 1 - p r = -expm1(log p + log r)
    one_minus_p = -mp.expm1(log_p)  # 1 - p = -expm1(log p), no cancellation near p = 1
    return _combine(gen, p, r, one_minus_p, one_minus_pr)


def g_ratio(div: Divergence, p: Any, r: Any) -> Any:
    """:math:`g_f(p, r)` at a probability ``p`` and a ratio ``r >= 0`` (mpf), in the current precision."""
    gen = mp_generator(div)
    return _combine(gen, p, r, 1 - p, 1 - p * r)


def g_boundary(div: Divergence, p: Any, side: str) -> Any:
    r""":math:`G(p)`: :math:`g_f(p, 1/p) = p\tilde f(1/p) + (1-p)\tilde f(0)` (``side="upper"``) or
    :math:`g_f(p, 0) = p\tilde f(0) + (1-p)\tilde f(1/(1-p))` (``"lower"``), for p in (0, 1)."""
    gen = mp_generator(div)
    if side == "upper":
        return _combine(gen, p, 1 / p, 1 - p, mp.mpf(0))
    return _combine(gen, p, mp.mpf(0), 1 - p, mp.mpf(1))
