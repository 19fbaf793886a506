r"""Piecewise-cubic lookup in :math:`L = -\log p` on octave cells, written once against ``xp`` (see :mod:`.ops`).

Used by the certified lookup tables (:mod:`bandcore.tables`) and by the solvers' seed tables (:mod:`.seeds`);
the grid and its arrays are built by :mod:`.grid`; :mod:`.backends` binds it to NumPy, torch and (generated)
Numba like :mod:`.solvers`.

**Grid.** A function is tabulated on :math:`[a, b] \subset (0, \infty)`.  Octave :math:`e`
(:math:`2^e \le L < 2^{e+1}`) is cut into :math:`2^{k_e}` equal cells (:math:`k_e` is the octave's *level*);
an end :math:`a` or :math:`b` inside an octave shortens the cell that holds it.  The cell of :math:`L` is read off
its float64 bits with no search and no transcendental: the exponent field gives the octave, the top
:math:`k_e` mantissa bits the cell,

.. math::  c = \mathrm{off}_e + \big\lfloor m\,2^{k_e} \big\rfloor, \qquad L = 2^{e}(1 + m),\ m \in [0, 1).

(:math:`L = -\log p` is exact in float64 for a float32 or float64 input: a sign flip.)

**Cells.** On a cell :math:`[L_c, L_c + w]` with values :math:`F_0, F_1` and slopes :math:`F'_0, F'_1`, the
Hermite cubic is stored in Horner form in :math:`s = (L - L_c)/w`,

.. math::  F = c_0 + s\,(c_1 + s\,(c_2 + s\,c_3)),\quad c_0 = F_0,\ c_1 = wF'_0,\
           c_2 = 3(F_1 - F_0) - (2F'_0 + F'_1)w,\ c_3 = 2(F_0 - F_1) + (F'_0 + F'_1)w.

**Bounds** (:func:`bound_log`): the stored function of a table bound (``kind``) is 0 — :math:`\log r`
(upper bounds, clamped to :math:`[0, L]`, i.e. :math:`1 \le r \le 1/p`); 1 — :math:`r` (a lower bound that
reaches 0; :math:`\log r = \log F`); 2 — :math:`\log(-\log r)` (a lower bound that never saturates, with
:math:`-\log r` growing like a power of :math:`1/p`, e.g. KL's :math:`\approx \delta/p`;
:math:`\log r = -e^F`); 3 — :math:`\log r` of a lower bound linear in L as p → 0 (e.g. Neyman's; clamped to
:math:`\le 0`).  Left of :math:`a` a saturated side returns the exact :math:`\log r = L` (:math:`r = 1/p`),
otherwise the end value; right of :math:`b` a saturated side returns :math:`-\infty` (:math:`r = 0`),
otherwise the end tangent in :math:`L`.

**Bounds split at a saturation threshold** (:func:`split_bound_log`, kinds 4 — lower — and 5 — upper).
Where the bound is singular at its threshold :math:`L^*` (e.g. :math:`r \sim \lambda/\log(1/\lambda)`), it is
stored in two parts: a *far* part in :math:`L` (kind 1's :math:`r` for a lower bound, kind 0's :math:`\log r`
for an upper one) on :math:`[a, m]` (lower) or :math:`[m, b]` (upper), and a *near* part in the distance
:math:`\lambda = |L - L^*|` on octave cells of :math:`[\lambda_0, \lambda_m]`, so cells refine geometrically
towards the threshold.  :math:`L^*` is a double-double :math:`L^*_{hi} + L^*_{lo}`, so :math:`\lambda =
(L^*_{hi} - L) + L^*_{lo}` is exact to rounding even at the float next to :math:`L^*`.  The near part stores
:math:`G = \log u - \gamma\log\lambda` with :math:`u = r` (lower) or :math:`u = 1 - q = 1 - pr` (upper) and
:math:`\gamma` the leading exponent of :math:`u` in :math:`\lambda`; then :math:`\log r = G + \gamma\log\lambda`
(lower) or :math:`L + \log(1 - e^{G + \gamma\log\lambda})` (upper).  The arrays hold both grids one after the
other (the near part's ``off`` entries count its cells from the end of the far part's): ``fm = (far: a, b,
F(a), F(b), F'(b); tails: C, β, K, ν; near: λ0, λm, G(λ0), G(λm), G'(λm); L*_hi, L*_lo, γ)``, ``im = (kind,
saturated left, saturated right, far e_a, left tail, right tail, far octaves, far cells, 0, 0, 0, near e_λ0)``.

**Logarithmic tails** (:func:`tail_log`, any kind whose ``im`` has more than 4 entries; a bound of the original
kinds packed with 4 is read exactly as before).  ``im[4] = 1``: left of :math:`a` (which is then
:math:`2^{-1022}`), :math:`\log r = C/(\beta - \log L)` (``fm[5:7]``), for a lower bound with
:math:`\log r \to 0` like :math:`1/\log(1/L)` as :math:`p \to 1` (a generator growing like :math:`u\log u`);
``im[5] = 1``: right of :math:`b`, :math:`y + \log(y + \nu) = L + K` (``fm[7:9]``), solved by Newton, for an
upper bound with :math:`\log r \approx L - \log L`; ``im[5] = 2``: right of :math:`b`, :math:`r = K + \nu L`, for an
upper bound of a generator growing like :math:`e^{bu}` (:math:`r \approx (L + \log\delta)/b`).

A bound's arrays are ``(fm, im, off, shift, cells)``: ``fm = (a, b, F(a), F(b), F'(b))``,
``im = (kind, saturated left of a, saturated right of b, e_a)``, ``off``/``shift`` (= 52 − level) per octave
and ``cells`` rows :math:`(L_c, 1/w, c_0, c_1, c_2, c_3)`.
"""

from __future__ import annotations

from .ops import numpy_ops as xp  # rebound per backend by .backends

__all__ = ["bound_log", "interpolate", "split_bound_log", "table_bounds"]

MANTISSA = 0xFFFFFFFFFFFFF  # the 52 mantissa bits of a float64


def interpolate(L, fm, im, off, shift, cells, first=0):
    """F(L) for L in [a, b]: the Hermite cubic of L's cell; the end value left of a, the end tangent right of b.
    The grid's octaves start at entry ``first`` of ``off``/``shift`` (a split bound's near part)."""
    bits = xp.float_bits(L)
    o = xp.minimum(xp.maximum((bits >> 52) - (1023 + im[3]), 0) + first, off.shape[0] - 1)  # octave, from a's
    c = xp.minimum(xp.maximum(off[o] + ((bits & MANTISSA) >> shift[o]), 0), cells.shape[0] - 1)
    s = (L - cells[c, 0]) * cells[c, 1]
    inner = cells[c, 2] + s * (cells[c, 3] + s * (cells[c, 4] + s * cells[c, 5]))
    tangent = fm[4] * (L - fm[1])
    right = fm[3] + xp.where(xp.isnan(tangent), 0.0, tangent)  # a zero end slope at L = inf: 0 * inf
    return xp.where(L <= fm[0], fm[2], xp.where(L >= fm[1], right, inner))


def split_bound_log(L, fm, im, off, shift, cells):
    """log r of a bound split at its saturation threshold (kinds 4 and 5; module docstring)."""
    far = interpolate(L, fm, im, off, shift, cells)
    if im[0] == 4:
        lam = (fm[14] - L) + fm[15]  # lower: lambda = L* - L, L* = fm[14] + fm[15] (double-double)
    else:
        lam = (L - fm[14]) - fm[15]  # upper: lambda = L - L*
    g = interpolate(lam, fm[9:14], im[8:12], off, shift, cells, im[6])
    log_u = g + fm[16] * xp.log(xp.maximum(lam, fm[9]))
    if im[0] == 4:
        y_far = xp.where(far > 0.0, xp.log(xp.minimum(far, 1.0)), -xp.inf)
        y = xp.where(L < fm[1], y_far, xp.minimum(log_u, 0.0))
        return xp.where(L >= fm[14], -xp.inf, y)
    y_far = xp.minimum(xp.maximum(far, 0.0), L)
    y_near = xp.minimum(xp.maximum(L + xp.log1p(-xp.exp(xp.minimum(log_u, 0.0))), 0.0), L)  # 1 - q = u
    y = xp.where(L >= fm[0], y_far, y_near)
    return xp.where(L <= fm[14], L, y)


def tail_log(L, y, fm, im):
    """The tails of a bound whose ``im`` has tail modes (module docstring): left of a, log r = C/(beta - log L)
    (im[4] = 1); right of b, y + log(y + nu) = L + K (im[5] = 1, an upper bound; fm[7] = K, fm[8] = nu) or
    r = K + nu L (im[5] = 2)."""
    if im[4] == 1:
        y = xp.where(L < fm[0], fm[5] / (fm[6] - xp.log(L)), y)
    if im[5] == 1:
        F = L + fm[7]
        z = F - xp.log(xp.maximum(F, 1.0))
        for _ in range(4):  # Newton on z + log(z + nu) = F from z = F - log F (F >= 600): quadratic, 4 steps
            z = z - (z + xp.log(z + fm[8]) - F) * (z + fm[8]) / (z + fm[8] + 1.0)
        y = xp.where(L > fm[1], xp.where(F < xp.inf, z, xp.inf), y)
    if im[5] == 2:
        y = xp.where(L > fm[1], xp.log(fm[7] + fm[8] * L), y)  # r = K + nu L (fm[7] = K, fm[8] = nu)
    return y


def bound_log(L, fm, im, off, shift, cells):
    """log r of one tabulated bound at L = -log p >= 0 (module docstring)."""
    if im[0] >= 4:
        y = split_bound_log(L, fm, im, off, shift, cells)
    else:
        y = plain_bound_log(L, fm, im, off, shift, cells)
    if len(im) > 4:
        y = tail_log(L, y, fm, im)
    return y


def plain_bound_log(L, fm, im, off, shift, cells):
    """log r of a bound of kind 0 to 3 (module docstring)."""
    f = interpolate(L, fm, im, off, shift, cells)
    if im[0] == 0:
        y = xp.minimum(xp.maximum(f, 0.0), L)  # 1 <= r_up <= 1/p
    elif im[0] == 1:
        y = xp.where(f > 0.0, xp.log(xp.minimum(f, 1.0)), -xp.inf)
    elif im[0] == 2:
        y = -xp.exp(f)
    else:
        y = xp.minimum(f, 0.0)  # log r of a lower bound linear in L far out (r_lo ~ (delta p)^(1/k))
    if im[1]:
        y = xp.where(L <= fm[0], L, y)  # saturated upper bound: r = 1/p
    if im[2]:
        y = xp.where(L >= fm[1], -xp.inf, y)  # saturated lower bound: r = 0
    return y


def table_bounds(lp, lower, upper, tol):
    """(log r_lo, log r_up) of a table at log p; log p in (0, tol] reads as 0, above tol or NaN gives NaN."""
    L = xp.where(lp < 0.0, -lp, 0.0)  # exact; -0.0 never reaches the bits
    lo = bound_log(L, lower[0], lower[1], lower[2], lower[3], lower[4])
    up = bound_log(L, upper[0], upper[1], upper[2], upper[3], upper[4])
    bad = xp.logical_not(lp <= tol)
    return xp.where(bad, xp.nan, lo), xp.where(bad, xp.nan, up)
