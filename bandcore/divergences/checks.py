r"""Numeric checks that a parsed formula is an f-divergence generator (NumPy and mpmath; no SymPy).

A generator must be finite and real on :math:`(0, \infty)`, vanish at 1, be convex, and not be affine: with
:math:`\tilde f(u) = f(u) - f'(1)(u - 1)` (:math:`f'(1)` the mean of the one-sided slopes) an affine :math:`f`
has :math:`\tilde f \equiv 0` and its divergence is 0 for every pair of distributions.

Every test is **relative to the generator's own scale** (:math:`\max|\tilde f|` on the grid), so multiplying
:math:`f` by any :math:`c > 0` changes no verdict (the Band of :math:`cf` at :math:`\delta` is the Band of
:math:`f` at :math:`\delta/c`), and a tolerance can never make a test pass vacuously.
"""

from __future__ import annotations

import functools
from fractions import Fraction
from typing import Any

import numpy as np

from .grammar import GeneratorError, Node, evaluate

__all__ = ["check_generator", "mpmath_namespace", "numpy_namespace"]

#: Grid of u on which finiteness and convexity are checked: 1e-6 .. 1e6, log-spaced, dense near 1.
_GRID = np.unique(np.concatenate([np.logspace(-6, 6, 3001), 1 + np.linspace(-0.05, 0.05, 201)]))
_DPS = 60


def numpy_namespace() -> dict[str, Any]:
    """Functions of the grammar in NumPy (element-wise)."""
    return {
        # float64 constants: a constant 1/0 is inf (then refused as not finite), not a ZeroDivisionError
        "number": lambda x: np.float64(float(x)), "pi": np.pi, "E": np.e, "log": np.log, "exp": np.exp,
        "sqrt": np.sqrt,
        "cbrt": np.cbrt, "abs": np.abs, "sinh": np.sinh, "cosh": np.cosh, "tanh": np.tanh,
        "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh,
        "min": lambda *a: functools.reduce(np.minimum, a), "max": lambda *a: functools.reduce(np.maximum, a),
        "where": np.where, "lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
    }


def mpmath_namespace() -> dict[str, Any]:
    """Functions of the grammar in mpmath (current precision; complex results are the caller's to refuse)."""
    import mpmath as mp

    def number(x: Fraction) -> Any:
        return mp.mpf(x.numerator) / x.denominator

    return {
        "number": number, "pi": mp.pi, "E": mp.e, "log": mp.log, "exp": mp.exp, "sqrt": mp.sqrt,
        "cbrt": mp.cbrt, "abs": abs, "sinh": mp.sinh, "cosh": mp.cosh, "tanh": mp.tanh, "asinh": mp.asinh,
        "acosh": mp.acosh, "atanh": mp.atanh, "min": min, "max": max, "where": lambda c, a, b: a if c else b,
        "lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b,
    }


def check_generator(tree: Node, name: str) -> None:
    """Raise :class:`GeneratorError` unless ``tree`` is a valid, non-degenerate generator (module docstring)."""
    with np.errstate(all="ignore"):
        values = np.asarray(evaluate(tree, numpy_namespace(), _GRID), dtype=float) * np.ones_like(_GRID)
    overflow = (values == np.inf) & (_GRID > 10.0)  # f grows beyond the float range (e.g. cosh): not an error
    if not np.all(np.isfinite(values) | overflow):
        bad = _GRID[~(np.isfinite(values) | overflow)][0]
        raise GeneratorError(f"{name}: f is not finite and real on (0, inf), e.g. at u = {bad:.3g}")
    values = np.where(overflow, np.nan, values)
    slope_at_one, at_one, local_scale = _slope_at_one(tree, name)
    tilde = values - slope_at_one * (_GRID - 1.0)
    with np.errstate(all="ignore"):
        scale = float(np.nanmax(np.abs(tilde)))
        size = float(np.nanmax(np.abs(values)))
    if abs(at_one) > 1e-30 * max(local_scale, 1e-300):
        raise GeneratorError(f"{name}: f(1) must be 0, got f(1) = {at_one:.6g}; subtract it from f")
    if not scale > 1e-12 * size or scale == 0.0:
        raise GeneratorError(
            f"{name}: f is affine (f(u) - f'(1)(u - 1) is identically 0), so its divergence is 0 for every "
            "distribution: not a divergence"
        )
    _check_convex(values[~overflow], _GRID[~overflow], name)


def _slope_at_one(tree: Node, name: str) -> tuple[float, float]:
    """(f'(1) as the mean of the one-sided slopes, f(1)), at 60 digits."""
    import mpmath as mp

    namespace = mpmath_namespace()
    with mp.workdps(_DPS):
        h = mp.mpf(10) ** -20
        try:
            values = [evaluate(tree, namespace, mp.mpf(u)) for u in (1 - h, 1, 1 + h, 0.5, 2)]
        except (ValueError, ZeroDivisionError, OverflowError) as err:
            raise GeneratorError(f"{name}: f cannot be evaluated near u = 1 ({err})") from None
        if any(not isinstance(v, mp.mpf) for v in values):
            raise GeneratorError(f"{name}: f is not real near u = 1")
        left, at_one, right, half, two = values
        slope = ((right - at_one) + (at_one - left)) / (2 * h)
        # the size of f around 1, with its affine part: f(1) is compared with it
        local = max(abs(half), abs(two), abs(slope))
        return float(slope), float(at_one), float(local)


def _check_convex(values: np.ndarray, grid: np.ndarray, name: str) -> None:
    """Secant slopes non-decreasing (robust to kinks), with tolerances relative to the generator's scale."""
    steps = np.diff(grid)
    with np.errstate(all="ignore"):
        slopes = np.diff(values) / steps
        drops = np.diff(slopes)
        eps = np.finfo(float).eps
        rounding = 8 * eps * (np.abs(values[:-1]) + np.abs(values[1:])) / steps  # noise of each secant slope
        # relative to the neighbouring slopes only: a global scale would hide a concave stretch elsewhere
        tol = 1e-9 * (np.abs(slopes[:-1]) + np.abs(slopes[1:])) + rounding[:-1] + rounding[1:]
    if np.any(drops < -tol):
        i = int(np.flatnonzero(drops < -tol)[0])  # the first place, not the largest drop (often far out)
        raise GeneratorError(f"{name}: f is not convex on (0, inf): its slope decreases near u = {grid[i + 1]:.4g}")
