r"""The shape of a bound at the ends of its tabulated range, and the stored function that is smooth there.

A table stores, per bound, one function :math:`F` of :math:`L = -\log p` as a piecewise cubic on octave cells
(:mod:`bandcore.tables.evaluate`); the kernel turns it into :math:`\log r` by the bound's *kind*.  A kind works
only where :math:`F` is smooth in :math:`L` and, beyond :math:`L = 680`, linear in :math:`L` (the kernel
extrapolates the end tangent).  Both are decided by :math:`g_f(p, r) = p\tilde f(r) + (1-p)\tilde f(s)` near the
two places where the Band is singular: :math:`p \to 0` and a saturation threshold :math:`L^*`.

**Lower bound as p → 0** (:math:`\tilde f(0) = \infty`, never saturated).  The rest of the vocabulary costs
:math:`(1-p)\tilde f(s) = O(p)`, so :math:`\tilde f(r_{lo}) = \delta/p + O(1)`:

* :math:`\tilde f(u) \sim -c\log u` (KL): :math:`\log r_{lo} \approx -\delta/(cp)`, so
  :math:`\log(-\log r) = L + \log(\delta/c) + O(p)` is linear: kind 2, :math:`\log(-\log r)`;
* :math:`\tilde f(u) \sim c\,u^{-k}` (Neyman :math:`k = 1`, the α-family for α < 0 with :math:`k = -\alpha`):
  :math:`r_{lo} \approx (cp/\delta)^{1/k}`, so :math:`\log r = -(L + \log(\delta/c))/k` is linear and
  :math:`\log(-\log r) = \log(L + \dots) - \log k` is not (its tangent at 680 is off by :math:`4\cdot10^{-4}`
  at 700): kind 3, :math:`\log r` itself (``min(F, 0)``).

:func:`lower_tail_kind` measures which of the two is linear at :math:`L = 560, 620, 680`.

**At a saturation threshold** :math:`L^*`.  Let :math:`\varepsilon = |L - L^*|`.  For the lower bound
(:math:`r \to 0`), with :math:`G_0(p) = g_f(p, 0)` and :math:`s_0 = 1/(1-p)`,

.. math::  g_f(p, r) - G_0(p) = p\,[\tilde f(r) - \tilde f(0)] + (1-p)\,[\tilde f(s) - \tilde f(s_0)]
           = -p\,\big[\tilde f(0) - \tilde f(r) + r\,\tilde f'(s_0)\big] + O(pr^2),

and :math:`G_0(p) - \delta \propto \varepsilon`, so :math:`r` solves
:math:`\tilde f(0) - \tilde f(r) + r\tilde f'(s_0) \propto \varepsilon`.  The upper bound (:math:`s \to 0`,
:math:`1 - q = (1-p)s`) satisfies the same relation in :math:`s`.  Hence, for :math:`u = r` or :math:`s`:

* :math:`\tilde f'(0)` finite (TV, Pearson, Le Cam, α > 1): :math:`u \propto \varepsilon`, analytic;
* :math:`\tilde f(0) - \tilde f(u) \sim c\,u^{\alpha}`, 0 < α < 1 (Hellinger α = ½): :math:`u \propto
  \varepsilon^{1/\alpha}`, analytic only when :math:`1/\alpha` is an integer (Hellinger: :math:`u \propto
  \varepsilon^2`);
* :math:`\tilde f(0) - \tilde f(u) \sim u\log(1/u)` (reverse KL, Jensen–Shannon, any generator with a
  :math:`u\log u` term): :math:`u \log(1/u) \propto \varepsilon`, i.e. :math:`u \approx
  \varepsilon/\log(1/\varepsilon)`: no function of :math:`u` alone is smooth in :math:`L` there.

The stored functions at a threshold are :math:`r` (kind 1, lower) and :math:`\log r = L + \log(1 - (1-p)s)`
(kind 0, upper); both are smooth exactly when :math:`u` is an analytic function of :math:`\varepsilon`, and the
octave grid, which refines towards :math:`L = 0` only, cannot follow a singularity at :math:`L^* > 0`.
:func:`threshold_exponent` measures the local exponent :math:`\gamma = d\log u/d\log\varepsilon` at
:math:`\varepsilon = 10^{-4}L^*` and :math:`10^{-6}L^*`; a bound whose exponent is not the same integer at
both (or whose cubic in L does not reach the target) is split at its threshold instead
(:mod:`bandcore.tables.threshold`: kinds 4 and 5, octave cells in :math:`\lambda = |L - L^*|` storing
:math:`\log u - \gamma\log\lambda`).

**Why every saturating lower bound is split anyway.**  Even where :math:`r` is analytic in :math:`\varepsilon`
(TV, Pearson, Le Cam: :math:`r \propto \varepsilon`; Hellinger: :math:`r \propto \varepsilon^2`), a cubic for
:math:`r` in L has a small *absolute* error, and :math:`\log r` inherits it divided by :math:`r \to 0`: the
Horner sum of the last cell, taken from its left knot where :math:`r \sim w^{\gamma}`, cancels down to
:math:`r \sim \varepsilon^{\gamma}` with an absolute error :math:`\sim 10^{-16} w^{\gamma}`.  Plain tables of
:math:`r` erred by :math:`4.5\cdot10^{-6}` at :math:`10^{-9}L^*` (TV, δ = 0.05) and read 0 instead of
:math:`r > 0` (Hellinger, :math:`10^{-12}L^*`), beyond their certificate of :math:`5\cdot10^{-8}`, which samples
11 points per cell.  So :func:`bandcore.tables.bounds.bound_domain` splits every lower bound that saturates;
the near part stores :math:`\log r - \gamma\log\lambda`, exact in relative terms down to the float next to
:math:`L^*`.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from ..divergences import Divergence
from .pieces import bisection_band_log
from .tabulated import LOG_NEG_LOG_R, LOG_R, LOG_R_LOWER, RATIO, TabulatedBound

__all__ = ["LOG_NEG_LOG_R", "LOG_R", "LOG_R_LOWER", "RATIO", "kernel_kinds", "lower_tail_kind",
           "threshold_exponent"]  # fmt: skip

#: the L of the lower-tail measurement (equally spaced, ending at the tabulated range's end)
TAIL_L = np.array([560.0, 620.0, 680.0])
#: relative distances from a threshold where the local exponent is measured
THRESHOLD_ETA = np.array([1e-4, 1e-6])


@lru_cache(maxsize=1)
def kernel_kinds() -> frozenset[int]:
    """The kinds the evaluation kernel implements, found by evaluating a one-cell bound of each (cached).

    A bound storing the constant :math:`F = -5` must give :math:`\\log r = -5` (kind 0 on an upper bound is
    clamped to :math:`[0, L]`, so kind 0 is probed with :math:`F = 5 \\le L`), :math:`\\log 0.5` (kind 1 with
    :math:`F = 0.5`) and :math:`-e^{-5}` (kind 2); kind 3 (:math:`\\log r = \\min(F, 0)`) is present only if the
    kernel returns :math:`-5` for it."""
    knots = np.array([8.0, 16.0])
    cases = {LOG_R: (5.0, 5.0), RATIO: (0.5, math.log(0.5)), LOG_NEG_LOG_R: (-5.0, -math.exp(-5.0)),
             LOG_R_LOWER: (-5.0, -5.0)}  # fmt: skip
    found = set()
    for kind, (value, expected) in cases.items():
        bound = TabulatedBound(knots, np.full(2, value), np.zeros(2), np.zeros(1, dtype=np.int64), kind)
        got = float(bound.log(np.array([12.0]))[0])
        if math.isclose(got, expected, rel_tol=1e-12):
            found.add(kind)
    return frozenset(found)


def lower_tail_kind(div: Divergence, delta: float) -> int:
    """Kind 2 or 3 for a lower bound that never saturates: the stored function that is linear in L as p → 0.

    Compares the second differences of :math:`\\log(-\\log r)` and :math:`\\log r` at :data:`TAIL_L`, each
    relative to the function's size (the tail's error measure); raises :class:`ValueError` when the better one
    needs a kind the kernel lacks (:func:`kernel_kinds`)."""
    y = bisection_band_log(-TAIL_L, div, delta)[0]
    with np.errstate(all="ignore"):
        curvature = {
            LOG_NEG_LOG_R: abs(np.log(-y[0]) - 2 * np.log(-y[1]) + np.log(-y[2])),
            LOG_R_LOWER: abs(y[0] - 2 * y[1] + y[2]) / abs(y[2]),
        }
    kind = min(curvature, key=lambda k: (curvature[k], k))
    if kind not in kernel_kinds():
        raise ValueError(
            f"{div.name} lower bound at delta={delta}: log r is linear in L = -log p as p -> 0 (f(u) grows like a "
            f"negative power of u at 0), so the table must store log r itself, and the evaluation kernel has no "
            f"such kind for a lower bound (it has {sorted(kernel_kinds())}; see bandcore.tables.shape)"
        )
    return kind


def threshold_exponent(div: Divergence, delta: float, side: str, threshold: float) -> float:
    """The local exponent γ of :math:`u = r` (lower) or :math:`u = 1 - q` (upper) in the distance ε to the
    saturation threshold :math:`L^*` (module docstring), measured between :data:`THRESHOLD_ETA`; raises
    :class:`ValueError` when it is not the same integer ≥ 1 at both ends (the bound is not smooth there).
    NaN for an upper bound whose :math:`1 - q` is below what :math:`\\log r` resolves there (γ > 1: no
    error to make)."""
    index = 1 if side == "upper" else 0
    sign = -1.0 if side == "lower" else 1.0  # the unsaturated side: L < L* (lower), L > L* (upper)
    eta = np.concatenate([THRESHOLD_ETA, THRESHOLD_ETA * 2.0])
    L = threshold * (1.0 + sign * eta)
    y = bisection_band_log(-L, div, delta)[index]
    with np.errstate(all="ignore"):
        u = np.exp(y) if side == "lower" else -np.expm1(y - L)  # r, or 1 - q = 1 - p r
        if side == "upper" and np.any(L - y <= 1e-9 * np.maximum(1.0, L)):
            return math.nan  # 1 - q ~ eps^gamma, gamma > 1, below what log r resolves: no error to make there
        eps = np.abs(L - threshold)
        gamma = np.log(u[2:] / u[:2]) / np.log(eps[2:] / eps[:2])
    nearest = np.round(gamma)
    if not (np.all(np.isfinite(gamma)) and nearest[0] == nearest[1] and nearest[0] >= 1
            and np.all(np.abs(gamma - nearest) < 0.01)):  # fmt: skip
        what = "r" if side == "lower" else "1 - q"
        raise ValueError(
            f"{div.name} {side} bound at delta={delta}: near its saturation threshold L* = {threshold:.17g}, "
            f"{what} ~ |L - L*|^gamma with gamma = {gamma[0]:.4f} at {THRESHOLD_ETA[0]:g} L* and {gamma[1]:.4f} "
            f"at {THRESHOLD_ETA[1]:g} L*, not a constant integer (a u log u or non-integer power term of f at 0): "
            "no stored function is smooth there and the octave grid cannot refine towards L* "
            "(see bandcore.tables.shape)"
        )
    return float(gamma[1])
