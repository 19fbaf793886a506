r"""Where a generic plan's r-side functions leave their closed form for their far form (:func:`far_threshold`).

On the r side (u >= 1) the functions :math:`\Phi(u) = \tilde f(u)/u` and :math:`\tilde f'(u)` have a closed form in
(x, L, u) and a far form in t = 1/u (:mod:`.kernel_functions`).  The far form exists for the closed forms that
overflow or cancel as u grows (:math:`u^k`, :math:`u\log u - (u+1)\log\frac{u+1}{2}`) and for u = ∞ itself.  Where
the closed form is as accurate, the far form only costs: on whole arrays (NumPy, torch) both forms are computed
wherever one token of a call lies beyond the switch (``docs/kernel_measurements.md``).

So the switch is measured per generator, not fixed: the largest x of the grid :math:`x_k = 2^{k/4}` (x from 1 to
2^1023) such that at every grid point up to it both closed forms, evaluated in float64 as the plan prints them,
agree with :math:`\tilde f` in mpmath (30 digits, at the same float64 point) to :data:`FAR_TOLERANCE` relative, or
are within :data:`FAR_FACTOR` of the far forms' own errors there; at least :data:`FAR_X` (the far form's own range
starts there).  Measured: js's :math:`\Phi` cancels like :math:`\log u/\log 2` and switches at u ≈ 6e39; α = 0.7's
reads :math:`c = e^{L/10}`, so the rounding of L (~|L|·1e-16) reaches the bar at u ≈ 2e42; Neyman's and α = 2's
:math:`x^2` overflow at 2^512; Hellinger's and α = 0.5's never lose accuracy (u ≈ 8e307).  Tokens reach u = r
> 1e40 only where p < 1e-40, so on whole arrays the far form is then mostly skipped.  A generator whose forms
cannot be evaluated within :data:`FAR_SECONDS` keeps :data:`FAR_X`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import mpmath as mp
import numpy as np
import sympy as sp

from ...plan import VECTORISED_NAMES, variadic
from ..generator_facts.budget import bounded
from ..generator_facts.symbolic import U

__all__ = ["FAR_FACTOR", "FAR_SECONDS", "FAR_STEPS_PER_OCTAVE", "FAR_TOLERANCE", "FAR_X", "far_threshold"]

#: The far form's range starts here at the latest (x = u - 1 > 1: u > 2, where t = 1/u < 1/2).
FAR_X = 1.0
#: Relative error a closed form may have where it replaces the far form: the cancellation the Taylor polynomials
#: accept at their radius (eps/x^2 = 2e-14, :data:`.kernel_functions.TAYLOR_RADIUS`).
FAR_TOLERANCE = 2e-14
#: ... or within this factor of the far form's own error at the same point: both read L = log u, whose rounding
#: (|L| 2^-53) any form in e^(L/N) turns into a relative error of about the same size, growing with u.
FAR_FACTOR = 2.0
#: Grid points per octave of x.
FAR_STEPS_PER_OCTAVE = 4
#: Time budget of the measurement; beyond it the generator keeps FAR_X.
FAR_SECONDS = 10.0
_DIGITS = 30


def _numpy_namespace() -> dict[str, Any]:
    """What a printed form calls (:data:`bandcore.plan.VECTORISED_NAMES`), on NumPy float64 arrays."""
    xp = SimpleNamespace(where=np.where, logical_and=np.logical_and, logical_or=np.logical_or,
                         logical_not=np.logical_not, minimum=np.minimum, maximum=np.maximum, abs=np.abs)  # fmt: skip
    names = {"exp": np.exp, "log": np.log, "sqrt": np.sqrt, "Abs": np.abs, "abs": np.abs, "pi": math.pi, "E": math.e,
             "log1p": np.log1p, "expm1": np.expm1, "xp": xp, "max": variadic(np.maximum), "min": variadic(np.minimum),
             "sinh": np.sinh, "cosh": np.cosh, "tanh": np.tanh, "asinh": np.arcsinh, "acosh": np.arccosh,
             "atanh": np.arctanh}  # fmt: skip
    assert set(names) == set(VECTORISED_NAMES)
    return names


def _compiled(source: str, name: str) -> Callable:
    scope = _numpy_namespace()
    exec(compile(source, "<far threshold>", "exec"), scope)  # a source the plan prints, never user text
    return scope[name]


def _grid() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x, L, u) at the grid points, u = fl(1 + 2^(k/4)), x = u - 1, L = fl(log u)."""
    u = 1.0 + np.exp2(np.arange(0, 1023 * FAR_STEPS_PER_OCTAVE + 1) / FAR_STEPS_PER_OCTAVE)
    return u - 1.0, np.log(u), u


def _agrees_up_to(closed: np.ndarray, far: np.ndarray, reference: Callable[[Any], Any], u: np.ndarray) -> int:
    """How many leading grid points have the ``closed`` values as accurate as the ``far`` ones (relative to
    ``reference``): within FAR_TOLERANCE, or within FAR_FACTOR times the far form's error."""
    with mp.workdps(_DIGITS):
        for k, (value, other, point) in enumerate(zip(closed.tolist(), far.tolist(), u.tolist(), strict=True)):
            exact = mp.re(reference(mp.mpf(point)))
            if not (mp.isfinite(exact) and math.isfinite(value)):
                return k
            error = abs(value - exact)
            if error > FAR_TOLERANCE * abs(exact) and not error <= FAR_FACTOR * abs(other - exact):
                return k
    return len(u)


def _values(function: Callable, *args: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.broadcast_to(np.asarray(function(*args), dtype=np.float64), args[0].shape)


def _measure(f_normalised: sp.Expr, sources: tuple[tuple[str, str], ...]) -> float:
    x, log_u, u = _grid()
    t = 1.0 / u
    count = len(u)
    for expr, (closed, far) in zip((f_normalised / U, sp.diff(f_normalised, U)), sources, strict=True):
        reference = sp.lambdify(U, expr, "mpmath")
        closed_values = _values(_compiled(closed, "closed"), x, log_u, u)
        far_values = _values(_compiled(far, "far"), t, 1.0 - t, log_u, x)
        count = min(count, _agrees_up_to(closed_values[:count], far_values[:count], reference, u[:count]))
    return max(FAR_X, float(x[count - 1])) if count else FAR_X


def far_threshold(f_normalised: sp.Expr, sources: tuple[tuple[str, str], ...]) -> float:
    r"""The x above which a generator's r-side functions take their far form (module docstring):
    ``f_normalised`` is :math:`\tilde f(u)` (SymPy, in ``U``), ``sources`` the printed (closed, far) forms of
    :math:`\Phi` and of :math:`\tilde f'` (``def closed(x, L, u)``, ``def far(t, y, L, x)``)."""
    try:
        value = bounded(lambda: _measure(f_normalised, sources), FAR_SECONDS)
    except (ArithmeticError, ValueError, TypeError, NameError, AttributeError):
        value = None  # a form that does not evaluate here: the far form from FAR_X, as before the measurement
    return FAR_X if value is None else value
