r"""Bounds split at a singular saturation threshold: a far part in L, a near part in :math:`\lambda = |L - L^*|`.

**Why.** Near a saturation threshold :math:`L^*` the unsaturated quantity :math:`u` (:math:`r` for a lower bound,
:math:`1 - q = 1 - pr` for an upper one) solves :math:`\tilde f(0) - \tilde f(u) + u\,\tilde f'(s_0) \propto
\lambda` (:mod:`bandcore.tables.shape`), :math:`\lambda = |L - L^*|`.  With a :math:`u\log u` term in
:math:`\tilde f` at 0 (reverse KL, Jensen–Shannon) that is :math:`u\log(1/u) \propto \lambda`, so
:math:`u \approx c\,\lambda/\log(1/\lambda)`; with :math:`\tilde f(0) - \tilde f(u) \sim c\,u^{\alpha}`
(α-family, 0 < α < 1) it is :math:`u \propto \lambda^{1/\alpha}`, and with a finite :math:`\tilde f'(0)` but a
:math:`u^{\beta}` correction (α-family, 1 < α < 2) :math:`u = c_1\lambda + c_2\lambda^{\beta} + \dots`.  No cubic in
:math:`L` on cells of fixed width follows any of these as :math:`\lambda \to 0`.

**The near coordinate.** On octave cells of :math:`\lambda` (the octave grid of :mod:`bandcore.kernels.grid`
applied to :math:`\lambda` instead of :math:`L`) every cell has the same *relative* width, so a function of the
form :math:`\lambda^{\gamma}\,\phi(\log\lambda)` with slowly varying :math:`\phi` is resolved uniformly down to
:math:`\lambda \to 0`.  The stored function is

.. math::  G(\lambda) = \log u - \gamma \log \lambda,

which removes the power law: :math:`G = \log c - \log\log(1/\lambda) + o(1)` for a :math:`u \log u` term,
:math:`G \to \log c` for a pure power.  :math:`\gamma` is the leading exponent, measured with the 50-digit solve at
:math:`\lambda = 10^{-20}L^*` and :math:`10^{-24}L^*` and rounded to 3 decimals (it need not be exact: any
residual :math:`(\gamma - \hat\gamma)\log\lambda` is as smooth on octave cells as the rest).  Where it is within
0.5 of 1 or 2 (:func:`near_power_of`: every split bound of the catalogue, the α-family for α > 0.4), a 1-D table's near
part stores :math:`H = u/\lambda^k` instead, which the kernels read with multiplications only.

**Where the exact values come from.** Near :math:`L^*` the float64 bisection solver loses accuracy:
:math:`g_f(p, r) - \delta \propto \lambda` is resolved only to the rounding of :math:`g_f`, so at
:math:`\lambda = 10^{-10}L^*` its :math:`\log r` is already off by :math:`10^{-7}`.  Below
:math:`\lambda = ` :data:`TRUST` :math:`\cdot L^*` the knots, their slopes and the certificate's check points use a
50-digit solve (:func:`near_exact`: Illinois on :math:`\log u` from a bracket, slope by implicit differentiation of
the 50-digit :math:`g_f`); above it the float64 bisection solver, as everywhere else.  :math:`L^*` itself is
found to about 40 digits and stored as a double-double, and the near grid starts at :math:`\lambda_0`, the
distance from :math:`L^*` of the float64 next to it (the closest any float64 :math:`L` gets).

**Split point.** The far part covers :math:`L \le m = L^*/2` (lower) or :math:`L \ge m = 2L^*` (upper), so that
:math:`L^*_{hi} - L` is exact (Sterbenz) wherever the near part is read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import mpmath as mp
import numpy as np

from ..derive.generator_facts.mpmath_g import _combine, g_mp, mp_generator
from ..divergences import Divergence
from ..kernels import slots
from ..kernels.slots import SPLIT_LOWER, SPLIT_UPPER
from .evaluate import KernelBound, eval_log, octave_grid, octave_of
from .limits import L_RANGE

__all__ = ["DPS", "NEAR_POWERS", "NEAR_POWER_TOLERANCE", "SPLIT_LOWER", "SPLIT_UPPER", "TRUST", "SplitBound",
           "gamma_of", "near_exact", "near_power_of", "threshold_dd"]

#: kinds of a bound split at its threshold (see bandcore.kernels.lookup)
#: decimal digits of the near-threshold solves
DPS = 50
#: below lambda = TRUST * L* the near part's exact values come from the 50-digit solver
TRUST = 2.0**-24


def threshold_dd(div: Divergence, delta: float, side: str, b: float) -> tuple[mp.mpf, float, float]:
    """(L* to ~40 digits, L*_lo = L* - b, lambda_0) from the float64 threshold ``b`` of
    :func:`~bandcore.tables.pieces.saturation_threshold` (the saturated float next to L*): 100 bisection steps at
    :data:`DPS` digits between ``b`` and its unsaturated neighbour.  ``lambda_0`` is the near coordinate the
    kernel computes at that neighbour (the smallest it ever reads on the unsaturated side)."""
    outside = float(np.nextafter(b, 0.0 if side == "lower" else math.inf))
    with mp.workdps(DPS):
        delta_mp = mp.mpf(delta)

        def saturated(L):
            y = mp.ninf if side == "lower" else L
            return g_mp(div, -L, y) <= delta_mp

        inside, out = mp.mpf(b), mp.mpf(outside)
        for _ in range(100):
            mid = (inside + out) / 2
            if saturated(mid):
                inside = mid
            else:
                out = mid
        star = (inside + out) / 2
        lo = float(star - mp.mpf(b))
    lam0 = (b - outside) + lo if side == "lower" else (outside - b) - lo
    # L* can be the neighbour itself (reverse KL's upper threshold is L* = delta, a float): lambda_0 = 0 there;
    # the near grid then starts 30 octaves below the spacing of b (u ~ lambda is negligible at that float)
    return star, lo, float(max(lam0, np.spacing(b) * 2.0**-30))


def near_exact(div: Divergence, delta: float, side: str, L_points, guess: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(log u, d log u / dL) at each ``L`` (mpf or float) by a :data:`DPS`-digit solve of g_f = delta.

    ``u = r`` for the lower bound, ``u = 1 - p r`` for the upper one; ``guess`` is a float estimate of log u
    (the float64 solver's, good to a few per cent even where it is not exact), the bracket is widened from it."""
    gen = mp_generator(div)
    values, slopes = np.empty(len(L_points)), np.empty(len(L_points))
    with mp.workdps(DPS):
        delta_mp = mp.mpf(delta)
        for i, (L, t0) in enumerate(zip(L_points, guess, strict=True)):
            log_p = -mp.mpf(L)
            p = mp.exp(log_p)
            one_minus_p = -mp.expm1(log_p)

            def g(t, log_p=log_p, p=p, one_minus_p=one_minus_p):
                u = mp.exp(t)
                if side == "lower":
                    return _combine(gen, p, u, one_minus_p, 1 - p * u)
                return _combine(gen, p, (1 - u) / p, one_minus_p, u)

            # lower: g decreases as t = log r grows towards 0; upper: g decreases as t = log(1 - q) grows
            def h(t, g=g):
                return g(t) - delta_mp

            exact_guess = math.isfinite(t0) and -745 < t0 <= 0
            t0 = mp.mpf(float(t0)) if exact_guess else mp.mpf(-60)  # the bracket widens
            # the branch ends where q = p, g = 0: t = log r = 0 (lower), t = log(1 - q) = log(1 - p) (upper)
            top = mp.mpf(0) if side == "lower" else mp.log(one_minus_p)
            # the guess is mostly exact to ~1e-12 and good to a few per cent near the threshold: the bracket starts
            # at 1e-6 (relative) around it and widens 16-fold until it holds the root
            step = mp.mpf(1e-6) * max(1, abs(t0)) if exact_guess else mp.mpf(1)
            lo, hi = t0 - step, min(t0 + step, top)
            h_lo, h_hi = h(lo), h(hi)
            for _ in range(16):  # h decreases in t: lo needs h > 0, hi h <= 0 (a NaN widens further)
                if h_lo > 0:
                    break
                if h_lo <= 0:
                    hi, h_hi = lo, h_lo
                step *= 16
                lo = t0 - step
                h_lo = h(lo)
            for _ in range(16):
                if h_hi <= 0:
                    break
                if h_hi > 0:
                    lo, h_lo = hi, h_hi
                step *= 16
                hi = min(t0 + step, top)
                h_hi = h(hi)
            if not (h_lo > 0 >= h_hi):
                raise ValueError(f"no root of g_f = delta bracketed near log u = {float(t0)!r} at L = {mp.nstr(L, 20)}")
            t = _illinois(h, lo, hi, h_lo, h_hi)
            # slope: d t / dL = -(dh/dL) / (dh/dt), dh/dL = -dh/d(log p) at fixed t
            dh_dt = mp.diff(h, t)

            def h_of_logp(lp, t=t):
                pp, omp = mp.exp(lp), -mp.expm1(lp)
                u = mp.exp(t)
                if side == "lower":
                    return _combine(gen, pp, u, omp, 1 - pp * u)
                return _combine(gen, pp, (1 - u) / pp, omp, u)

            dh_dL = -mp.diff(h_of_logp, log_p)
            values[i] = float(t)
            slopes[i] = float(-dh_dL / dh_dt)
    return values, slopes


def _illinois(h, lo, hi, f_lo, f_hi):
    """Root of h in [lo, hi] with f_lo = h(lo) > 0 >= f_hi = h(hi) (Illinois regula falsi), to ~DPS - 12 digits
    in t."""
    side = 0
    tol = mp.mpf(10) ** -22  # absolute in t = log u: far below a float64 ulp of |t| >= 1e-6
    for _ in range(120):
        t = (lo * f_hi - hi * f_lo) / (f_hi - f_lo)
        f_t = h(t)
        if f_t > 0:
            lo, f_lo = t, f_t
            if side == -1:
                f_hi /= 2
            side = -1
        else:
            hi, f_hi = t, f_t
            if side == 1:
                f_lo /= 2
            side = 1
        if abs(hi - lo) <= tol or f_t == 0:
            break
    return t


def gamma_of(div: Divergence, delta: float, side: str, star: mp.mpf) -> float:
    """The leading exponent γ of u in λ (module docstring), rounded to 3 decimals."""
    with mp.workdps(DPS):
        lam = [star * mp.mpf(10) ** -20, star * mp.mpf(10) ** -24]
        L = [star - x if side == "lower" else star + x for x in lam]
        t, _ = near_exact(div, delta, side, L, np.array([-46.0, -55.0]))
        gamma = (t[0] - t[1]) / float(mp.log(lam[0]) - mp.log(lam[1]))
    return round(float(gamma), 3)


#: the integer exponents a near part can store H = u / λ^k for (the kernels read λ^k by multiplications), and
#: how close the measured γ must be to one of them
NEAR_POWERS, NEAR_POWER_TOLERANCE = (1, 2), 0.5


def near_power_of(gamma: float) -> int:
    r"""The nearest k in :data:`NEAR_POWERS` to the measured exponent γ, within :data:`NEAR_POWER_TOLERANCE`
    (γ in [0.5, 2.5)), else 0.

    The near part then stores :math:`H = u/\lambda^k` (γ = k in the table), which the kernels read with no
    transcendental (:mod:`bandcore.kernels.lookup`).  Where γ is k, H is G's :math:`e^G` (a γ measured a little
    above 1 is the :math:`u \approx c\lambda/\log(1/\lambda)` of a :math:`u\log u` term: H is
    :math:`c/\log(1/\lambda)`); elsewhere H behaves like :math:`\lambda^{\gamma - k}`, a power within ½ of 0,
    which looks the same in every octave, so its octave cells resolve it to the same relative error down to
    :math:`\lambda_0` (α = 0.7, γ = 10/7: 473 near knots against G's 155; both within the target).  The
    certificate checks the result either way."""
    k = math.floor(gamma + NEAR_POWER_TOLERANCE)
    return k if k in NEAR_POWERS else 0


@dataclass(frozen=True)
class NearPart:
    """The near part: knots in λ (an octave grid), G and dG/dλ, octave levels."""

    knots: np.ndarray
    values: np.ndarray
    slopes: np.ndarray
    levels: np.ndarray


@dataclass(frozen=True)
class SplitBound:
    r"""A bound split at its saturation threshold (kinds 4, 5): ``far`` (a :class:`TabulatedBound` in L with kind
    1 or 0), ``near`` (:class:`NearPart` in λ), the double-double threshold ``star_hi + star_lo`` and ``gamma``;
    ``near_power`` k = 1 or 2 where the near part stores :math:`H = u/\lambda^k` (then γ = k), 0 where it stores
    :math:`G = \log u - \gamma\log\lambda` (:func:`near_power_of`)."""

    far: object
    near: NearPart
    kind: int
    star_hi: float
    star_lo: float
    gamma: float
    near_power: int = 0

    @property
    def saturated_left(self) -> bool:
        return self.kind == SPLIT_UPPER

    @property
    def saturated_right(self) -> bool:
        return self.kind == SPLIT_LOWER

    @property
    def threshold(self) -> float:
        return self.star_hi

    def to_L(self, lam: np.ndarray) -> np.ndarray:
        """Float64 L at near coordinate λ (rounded; the inverse of the kernel's λ up to an ulp of L)."""
        if self.kind == SPLIT_LOWER:
            return (self.star_hi + self.star_lo) - lam
        return (self.star_hi + self.star_lo) + lam

    def lam_of(self, L: np.ndarray) -> np.ndarray:
        """The kernel's λ at L."""
        if self.kind == SPLIT_LOWER:
            return (self.star_hi - L) + self.star_lo
        return (L - self.star_hi) - self.star_lo

    @property
    def knots(self) -> np.ndarray:
        """All knots as L (far knots, then near knots mapped to L; approximate, for sampling)."""
        near_L = np.sort(self.to_L(self.near.knots))
        if self.kind == SPLIT_LOWER:
            return np.concatenate([self.far.knots, near_L[near_L > self.far.knots[-1]]])
        return np.concatenate([near_L[near_L < self.far.knots[0]], self.far.knots])

    @property
    def n_knots(self) -> int:
        return len(self.far.knots) + len(self.near.knots)

    @cached_property
    def kernel(self) -> KernelBound:
        far, near = self.far.kernel, _near_kernel(self.near)
        star = [self.star_hi, self.star_lo, self.gamma]
        fm, im = np.zeros(slots.FM_SIZE), np.zeros(slots.IM_SIZE, dtype=np.int64)  # layout: bandcore.kernels.slots
        fm[slots.LEFT_END : slots.SLOPE_RIGHT + 1] = far.fmeta[: slots.SLOPE_RIGHT + 1]
        fm[slots.TAIL_C : slots.TAIL_NU + 1] = self.far.tail_fmeta()
        fm[slots.NEAR_LEFT : slots.NEAR_SLOPE_RIGHT + 1] = near.fmeta
        fm[slots.STAR_HI], fm[slots.STAR_LO], fm[slots.GAMMA] = star
        im[slots.KIND] = self.kind
        im[slots.SATURATED_LEFT], im[slots.SATURATED_RIGHT] = self.saturated_left, self.saturated_right
        im[slots.OCTAVE_A] = far.imeta[slots.OCTAVE_A]
        im[[slots.LEFT_TAIL, slots.RIGHT_TAIL]] = self.far.tail_imeta()
        im[slots.FAR_OCTAVES], im[slots.FAR_CELLS] = len(far.off), len(far.cells)
        im[slots.NEAR_OCTAVE], im[slots.NEAR_POWER] = near.imeta[slots.OCTAVE_A], self.near_power
        off = np.concatenate([far.off, near.off + len(far.cells)])  # the near part's cells follow the far's
        levels = np.concatenate([far.levels, near.levels])
        cells = np.ascontiguousarray(np.concatenate([far.cells, near.cells]))
        return KernelBound(fmeta=fm, imeta=im, off=off, levels=levels, cells=cells)

    def log(self, L: np.ndarray) -> np.ndarray:
        """log r at float64 ``L`` through the evaluation kernel (NumPy binding; see TabulatedBound.log)."""
        log_p = -np.ascontiguousarray(L, dtype=np.float64).ravel()
        out = eval_log(log_p, self.kernel, self.kernel, np.float64, math.inf, backend="numpy")[0]
        return out.reshape(np.shape(L))

    def check_points(self, per_cell: np.ndarray) -> np.ndarray:
        """Interior points of every cell of :attr:`knots` (see TabulatedBound.check_points)."""
        knots = self.knots
        w = np.diff(knots)
        s = per_cell if per_cell.ndim == 2 else np.broadcast_to(per_cell, (len(w), len(per_cell)))
        return knots[:-1, None] + w[:, None] * s

    def tails(self) -> np.ndarray:
        """The certificate's points outside the grids, and the two float64 L next to the threshold."""
        b = self.star_hi
        if self.kind == SPLIT_LOWER:
            nxt = np.nextafter(b, 0.0)
            return np.concatenate([self.far.tails(), [nxt, np.nextafter(nxt, 0.0)]]).astype(np.float64)
        nxt = np.nextafter(b, math.inf)
        return np.concatenate([[nxt, np.nextafter(nxt, math.inf)], self.far.tails()]).astype(np.float64)


def _near_kernel(near: NearPart) -> KernelBound:
    from ..kernels.grid import pack

    return pack(near.knots, near.values, near.slopes, near.levels, 0, False, False)


def near_range(kind: int, star_hi: float, star_lo: float, lam0: float) -> tuple[float, float, float]:
    """(m, λ_0, λ_m): the split point in L and the near part's range in λ."""
    if kind == SPLIT_LOWER:
        m = star_hi / 2
        return m, lam0, (star_hi - m) + star_lo
    m = min(2 * star_hi, L_RANGE[1] / 2)
    return m, lam0, (m - star_hi) - star_lo


def near_grid(lam0: float, lam_m: float, levels: np.ndarray) -> np.ndarray:
    return octave_grid(lam0, lam_m, levels)


__all__ += ["NearPart", "near_grid", "near_range", "octave_of"]
