r"""When a side of the Band sits on the simplex boundary, and from which p on.

:math:`g_f(p, \cdot)` is convex with :math:`g_f(p, 1) = 0`, so

* :math:`r_{up} = 1/p` iff :math:`G_{up}(p) = g_f(p, 1/p) = p\tilde f(1/p) + (1-p)\tilde f(0) \le \delta`;
* :math:`r_{lo} = 0` iff :math:`G_{lo}(p) = g_f(p, 0) = p\tilde f(0) + (1-p)\tilde f(1/(1-p)) \le \delta`.

:math:`G_{up}` decreases and :math:`G_{lo}` increases in :math:`p`, both up to the common level
:math:`\sup_p G = \tilde f(0) + \sigma_\infty` (:math:`\sigma_\infty = \lim_{u\to\infty} \tilde f(u)/u`), so each
side saturates past a threshold :math:`p^*(\delta)` solving :math:`G(p^*) = \delta`, and for every :math:`p`
once :math:`\delta` reaches the level.  A side never saturates when :math:`\tilde f(0) = \infty`.  The threshold
is a closed form when SymPy finds a root that :func:`~.validate.threshold_ok` confirms; otherwise it is solved
numerically at each call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import mpmath as mp
import sympy as sp

from ...divergences import Divergence
from ..generator_facts.budget import bounded
from ..generator_facts.symbolic import Facts, U
from .reduction import DELTA, P, on_side
from .roots import SIMPLIFY_SECONDS, solve_closed, tidy
from .validate import boundary_root, lambdify_mp, threshold_ok

__all__ = ["Saturation", "boundary_values", "saturation"]


@dataclass(frozen=True)
class Saturation:
    r"""When one side of the Band sits on the simplex boundary.

    Upper side: :math:`r_{up} = 1/p` iff :math:`p \ge` ``threshold(δ)``; lower side: :math:`r_{lo} = 0` iff
    :math:`p \le` ``threshold(δ)``.  ``boundary`` is :math:`G(p)`, the value of :math:`g_f` on the boundary
    (:math:`g_f(p, 1/p)` or :math:`g_f(p, 0)`); ``level`` is :math:`\sup_p G` — for δ at or above it the side
    saturates for every p.

    Parameters
    ----------
    never : bool
        The side never saturates (:math:`\tilde f(0) = \infty`).
    threshold : sympy.Expr or None
        Closed form of the threshold in ``DELTA`` (valid for δ below ``level``), or None when SymPy found
        none (the call then solves :math:`G(p) = \delta` numerically).
    side : str
        ``"upper"`` or ``"lower"``.
    boundary : sympy.Expr or None
        :math:`G(p)` in ``P``.
    level : sympy.Expr
        :math:`\sup_p G` (``oo`` when unbounded).
    divergence : Divergence or None
        The divergence (needed for the numeric threshold).
    """

    never: bool
    threshold: sp.Expr | None
    side: str = "upper"
    boundary: sp.Expr | None = None
    level: sp.Expr = sp.oo
    divergence: Divergence | None = field(default=None, repr=False, compare=False)

    def __call__(self, delta: float) -> float:
        """Numeric threshold on p at ``delta``; ``inf`` (upper) / ``0.0`` (lower) when the side never saturates."""
        delta = float(delta)
        if not delta > 0:
            raise ValueError(f"delta must be > 0, got {delta!r}")
        if self.never:
            return math.inf if self.side == "upper" else 0.0
        if self.level != sp.oo and delta >= float(self.level):
            return 0.0 if self.side == "upper" else 1.0
        if self.threshold is not None:
            fn = _threshold_function(self.threshold)
            if fn is not None:
                value = complex(fn(mp.mpf(delta)))
                return min(1.0, max(0.0, value.real))
        return float(boundary_root(self.divergence, self.side, delta))


@lru_cache(maxsize=256)
def _threshold_function(threshold: sp.Expr) -> Any:
    return lambdify_mp(DELTA, threshold)


def boundary_values(div: Divergence, fx: Facts) -> tuple[sp.Expr | None, sp.Expr | None, sp.Expr]:
    r""":math:`G_{up}(p)`, :math:`G_{lo}(p)` (None when not derived) and their common supremum (the level)."""
    f0 = fx.f_at_zero
    level = bounded(lambda: sp.simplify(fx.slope_at_infinity + f0), SIMPLIFY_SECONDS)  # G_up(0+) = G_lo(1-)
    if level is None:
        level = fx.slope_at_infinity + f0
    if f0 == sp.oo:
        return None, None, sp.oo
    above = on_side(fx.f_normalised, "gt")
    if above is None:
        return None, None, level
    g_up = tidy(P * above.subs(U, 1 / P) + (1 - P) * f0)
    g_lo = tidy(P * f0 + (1 - P) * above.subs(U, 1 / (1 - P)))
    return g_up, g_lo, level


def saturation(
    div: Divergence, fx: Facts, side: str, boundary: sp.Expr | None, level: sp.Expr
) -> tuple[Saturation, list[str]]:
    """The :class:`Saturation` of one side, with notes on what was found."""
    if fx.f_at_zero == sp.oo:
        edge = "1/p" if side == "upper" else "0"
        return Saturation(True, None, side, None, sp.oo), [
            f"{side} bound never saturates (never reaches {edge}): f̃(0) = oo"
        ]
    if boundary is None:
        return Saturation(False, None, side, None, level, div), [
            f"{side} saturation threshold: numeric (a 1-D root find of G(p) = δ at 30 digits at each call) — f is "
            "piecewise with a switch away from u = 1, so G(p) has no single formula"
        ]
    candidates, notes = solve_closed(boundary - DELTA, P, f"{side} saturation threshold")
    accepted = None
    for candidate in candidates:
        if threshold_ok(div, side, candidate, level):
            tidied = tidy(candidate)
            accepted = tidied if tidied is candidate or threshold_ok(div, side, tidied, level) else candidate
            break
    if candidates and accepted is None:
        notes.append(f"{side} saturation threshold: no SymPy root matched the numeric threshold; solved numerically")
    word = "p ≥" if side == "upper" else "p ≤"
    if accepted is not None:
        valid = "" if level == sp.oo else f" (for δ < {sp.sstr(level)})"
        notes.append(f"{side} bound saturates iff {word} {sp.sstr(accepted)}{valid}")
    if level != sp.oo:
        notes.append(f"{side} bound saturates for every p once δ ≥ {sp.sstr(level)}")
    return Saturation(False, accepted, side, boundary, level, div), notes
