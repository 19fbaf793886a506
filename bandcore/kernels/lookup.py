r"""Piecewise-cubic lookup in :math:`L = -\log p` on octave cells, written once against ``xp`` (see :mod:`.ops`).

Used by the certified lookup tables (:mod:`bandcore.tables`) and by the solvers' seed tables (:mod:`.seeds`);
the grid and its arrays are built by :mod:`.grid`; :mod:`.sources` binds it to NumPy, torch and (generated)
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

**Bounds split at a saturation threshold** (:func:`split_lower`, :func:`bound_pending`; kinds 4 — lower — and
5 — upper).
Where the bound is singular at its threshold :math:`L^*` (e.g. :math:`r \sim \lambda/\log(1/\lambda)`), it is
stored in two parts: a *far* part in :math:`L` (kind 1's :math:`r` for a lower bound, kind 0's :math:`\log r`
for an upper one) on :math:`[a, m]` (lower) or :math:`[m, b]` (upper), and a *near* part in the distance
:math:`\lambda = |L - L^*|` on octave cells of :math:`[\lambda_0, \lambda_m]`, so cells refine geometrically
towards the threshold.  :math:`L^*` is a double-double :math:`L^*_{hi} + L^*_{lo}`, so :math:`\lambda =
(L^*_{hi} - L) + L^*_{lo}` is exact to rounding even at the float next to :math:`L^*`.  The near part stores
:math:`G = \log u - \gamma\log\lambda` with :math:`u = r` (lower) or :math:`u = 1 - q = 1 - pr` (upper) and
:math:`\gamma` the leading exponent of :math:`u` in :math:`\lambda`; then :math:`\log r = G + \gamma\log\lambda`
(lower) or :math:`L + \log(1 - e^{G + \gamma\log\lambda})` (upper).  Where :math:`\gamma` is within ½ of
:math:`k \in \{1, 2\}` (``im[NEAR_POWER] = k``) it stores :math:`H = u/\lambda^k` instead: then
:math:`u = H\lambda^k` takes no transcendental, so a lower bound's ratio is read with none and its
:math:`\log r` with one logarithm, an upper bound's with one ``log1p``.  The arrays hold both grids one after the
other (the near part's ``off`` entries count its cells from the end of the far part's); ``fm`` and ``im`` are
addressed by the names of :mod:`.slots`, which also gives their layout.

**Logarithmic tails** (:func:`tail_log`, any kind whose ``im`` has more than ``PLAIN_IM_SIZE`` entries; a bound of
the original kinds packed with those is read exactly as before).  ``im[LEFT_TAIL] = 1``: left of :math:`a` (which
is then :math:`2^{-1022}`), :math:`\log r = C/(\beta - \log L)` (``fm[TAIL_C]``, ``fm[TAIL_BETA]``), for a lower
bound with :math:`\log r \to 0` like :math:`1/\log(1/L)` as :math:`p \to 1` (a generator growing like
:math:`u\log u`); ``im[RIGHT_TAIL] = RIGHT_LOG``: right of :math:`b`, :math:`y + \log(y + \nu) = L + K`
(``fm[TAIL_K]``, ``fm[TAIL_NU]``), solved by Newton, for an upper bound with :math:`\log r \approx L - \log L`;
``im[RIGHT_TAIL] = RIGHT_LINEAR``: right of :math:`b`, :math:`r = K + \nu L`, for an upper bound of a generator
growing like :math:`e^{bu}` (:math:`r \approx (L + \log\delta)/b`).

A bound's arrays are ``(fm, im, off, shift, cells)``: ``fm`` and ``im`` as in :mod:`.slots`, ``off``/``shift``
(= 52 − level) per octave and ``cells`` rows :math:`(L_c, 1/w, c_0, c_1, c_2, c_3)`.

**Evaluation in steps** (:func:`bound_log`), so that the Numba driver (:mod:`.drivers`) can run each step as a
loop of its own over a block of tokens: :func:`part_grid` (the variable x of the token's cell — L, or λ in a split
bound's near part — and that part's grid) and :func:`octave_entry`, arithmetic on bits (vectorised);
:func:`cell_in` and :func:`cubic`, the gathers (a scalar loop); :func:`bound_cheap`, the ends (:func:`ends`) and
the bound's transform, branch-free with one transcendental at most (vectorised), which leaves *pending* the near
part of a split upper bound above its threshold (``log1p(-exp(.))`` of a logarithm: three transcendentals,
:func:`bound_pending`, run by the driver on those tokens only, packed) and the tails (:func:`in_tail`,
:func:`tail_log`: a Newton solve, run on the tokens in a tail only).  Where ratios are wanted, the driver reads a
split lower bound with :func:`split_lower_ratio`: its far part stores r, which is then the output itself (no
logarithm and no exp), and its near part is left pending.  NumPy and torch run the same steps on whole arrays
(:func:`bound_from_cell` merges the pending values by a select), with the same arithmetic as one pass, and take
ratios as the exp of the log bounds.
"""

from __future__ import annotations

from .ops import numpy_ops as xp  # rebound per backend by .sources
from .slots import (  # also in every generated module: compile-time constants there
    F_LEFT,
    F_RIGHT,
    FAR_OCTAVES,
    GAMMA,
    KIND,
    LEFT_END,
    LEFT_TAIL,
    LOG_NEG_LOG_R,
    LOG_R,
    NEAR_F_LEFT,
    NEAR_F_RIGHT,
    NEAR_LEFT,
    NEAR_OCTAVE,
    NEAR_POWER,
    NEAR_RIGHT,
    NEAR_SLOPE_RIGHT,
    NO_TAIL,
    OCTAVE_A,
    PLAIN_IM_SIZE,
    RATIO,
    RIGHT_END,
    RIGHT_LINEAR,
    RIGHT_LOG,
    RIGHT_TAIL,
    SATURATED_LEFT,
    SATURATED_RIGHT,
    SLOPE_RIGHT,
    SPLIT_LOWER,
    SPLIT_UPPER,
    STAR_HI,
    STAR_LO,
    TAIL_BETA,
    TAIL_C,
    TAIL_K,
    TAIL_NU,
)

__all__ = ["bound_cheap", "bound_from_cell", "bound_log", "bound_pending", "cell_in", "cell_value", "cubic", "in_tail",
           "interpolate", "minus_log_p", "octave_entry", "part_grid", "split_lower_ratio", "table_bounds", "tail_log"]

MANTISSA = 0xFFFFFFFFFFFFF  # the 52 mantissa bits of a float64


def octave_entry(x, e_a, first, n_octaves):
    """The entry of ``off``/``shift`` of x's octave (from its exponent bits, counted from ``e_a``'s; the grid's
    octaves start at entry ``first``), clamped to the entries: no gathers."""
    bits = xp.float_bits(x)
    return xp.minimum(xp.maximum((bits >> 52) - (1023 + e_a), 0) + first, n_octaves - 1)


def cell_in(x, o, off, shift, n_cells):
    """The index of x's cell in octave entry ``o``: the top mantissa bits; clamped to the cells."""
    return xp.minimum(xp.maximum(xp.take(off, o) + ((xp.float_bits(x) & MANTISSA) >> xp.take(shift, o)), 0),
                      n_cells - 1)


def cell_of(x, e_a, first, off, shift, n_cells):
    """The index of x's cell (:func:`octave_entry`, then :func:`cell_in`)."""
    return cell_in(x, octave_entry(x, e_a, first, off.shape[0]), off, shift, n_cells)


def cubic(x, cells, c):
    """The Hermite cubic of cell ``c`` at x (inside the cell; its Horner form in s)."""
    s = (x - xp.take_column(cells, c, 0)) * xp.take_column(cells, c, 1)
    return xp.take_column(cells, c, 2) + s * (xp.take_column(cells, c, 3) + s * (xp.take_column(cells, c, 4)
                                              + s * xp.take_column(cells, c, 5)))


def ends(x, inner, a, b, f_a, f_b, slope_b):
    """F(x) of a grid on [a, b] from the cubic ``inner`` of x's cell: the end value left of a, the end tangent
    right of b."""
    tangent = slope_b * (x - b)
    right = f_b + xp.where(xp.isnan(tangent), 0.0, tangent)  # a zero end slope at x = inf: 0 * inf
    return xp.where(x <= a, f_a, xp.where(x >= b, right, inner))


def interpolate(L, fm, im, off, shift, cells, first=0):
    """F(L) for L in [a, b]: the Hermite cubic of L's cell; the end value left of a, the end tangent right of b.
    The grid's octaves start at entry ``first`` of ``off``/``shift`` (a split bound's near part)."""
    inner = cubic(L, cells, cell_of(L, im[OCTAVE_A], first, off, shift, cells.shape[0]))
    return ends(L, inner, fm[LEFT_END], fm[RIGHT_END], fm[F_LEFT], fm[F_RIGHT], fm[SLOPE_RIGHT])


def split_part(L, fm, im):
    """(near, x) of a split bound (kinds 4 and 5): whether L is read from the near part, and the variable of
    the part it is read from (lambda, or L)."""
    if im[KIND] == SPLIT_LOWER:
        near = L >= fm[RIGHT_END]
        lam = (fm[STAR_HI] - L) + fm[STAR_LO]  # lower: lambda = L* - L, L* a double-double
    else:
        near = L < fm[LEFT_END]
        lam = (L - fm[STAR_HI]) - fm[STAR_LO]  # upper: lambda = L - L*
    return near, xp.where(near, lam, L)


def part_grid(L, fm, im):
    """(x, e_a, first) of a bound at L: the variable its cell is read at (a split bound: lambda in its near part,
    else L) and that part's grid (the octave of its first end, its first entry of ``off``/``shift``)."""
    if im[KIND] < SPLIT_LOWER:
        return L, im[OCTAVE_A], 0
    near, x = split_part(L, fm, im)
    return x, im[OCTAVE_A] + near * (im[NEAR_OCTAVE] - im[OCTAVE_A]), near * im[FAR_OCTAVES]


def cell_value(L, fm, im, off, shift, cells):
    """The cubic of the cell a bound reads at L (a split bound: of its near or its far part), before the ends
    and the bound's transform (:func:`bound_from_cell`): all the gathers of a bound."""
    x, e_a, first = part_grid(L, fm, im)
    return cubic(x, cells, cell_of(x, e_a, first, off, shift, cells.shape[0]))


def bound_from_cell(L, inner, fm, im):
    """log r of a bound at L from its :func:`cell_value` ``inner`` (no gathers; tails apart)."""
    y, pending = bound_cheap(L, inner, fm, im)
    if im[KIND] == SPLIT_UPPER:
        y = xp.where(pending, bound_pending(L, inner, fm, im), y)
    return y


def bound_cheap(L, inner, fm, im):
    """(log r, pending) of a bound at L from its :func:`cell_value`: log r is final except where ``pending``, the
    near part of a split upper bound above its threshold, which takes :func:`bound_pending` (three
    transcendentals, for the few tokens there)."""
    if im[KIND] == SPLIT_UPPER:
        near, _, f = part_ends(L, inner, fm, im)
        y = xp.where(L <= fm[STAR_HI], L, xp.minimum(xp.maximum(f, 0.0), L))
        return y, xp.logical_and(near, L > fm[STAR_HI])
    if im[KIND] == SPLIT_LOWER:
        return split_lower(L, inner, fm, im), False
    f = ends(L, inner, fm[LEFT_END], fm[RIGHT_END], fm[F_LEFT], fm[F_RIGHT], fm[SLOPE_RIGHT])
    return plain_bound(L, f, fm, im), False


def bound_pending(L, inner, fm, im):
    """log r of a bound at L where :func:`bound_cheap` leaves it pending: log r = L + log(1 - u), u = 1 - q
    (module docstring); other kinds: their :func:`bound_cheap` value."""
    if im[KIND] != SPLIT_UPPER:
        return bound_cheap(L, inner, fm, im)[0]
    _, x, f = part_ends(L, inner, fm, im)
    lam = xp.maximum(x, fm[NEAR_LEFT])
    if im[NEAR_POWER] == 0:
        u = xp.exp(xp.minimum(f + fm[GAMMA] * xp.log(lam), 0.0))
    else:
        u = near_u(lam, f, im)
    return xp.minimum(xp.maximum(L + xp.log1p(-u), 0.0), L)


def near_u(lam, h, im):
    """u = min(max(H, 0) λ^k, 1) of a near part that stores H = u/λ^k (k = im[NEAR_POWER], 1 or 2).  Its choices
    are conditional expressions on ``im``: plain Python in the NumPy, torch and JAX bindings (``im`` holds
    numbers), selects of cheap values in Numba, where a branch around a transcendental would keep a loop
    scalar."""
    power = lam * lam if im[NEAR_POWER] == 2 else lam
    return xp.minimum(xp.maximum(h, 0.0) * power, 1.0)


def part_ends(L, inner, fm, im):
    """(near, x, F(x)) of a split bound at L (kinds 4 and 5): its part, the part's variable and function value
    (:func:`ends` of that part)."""
    near, x = split_part(L, fm, im)
    f = ends(x, inner, xp.where(near, fm[NEAR_LEFT], fm[LEFT_END]), xp.where(near, fm[NEAR_RIGHT], fm[RIGHT_END]),
             xp.where(near, fm[NEAR_F_LEFT], fm[F_LEFT]), xp.where(near, fm[NEAR_F_RIGHT], fm[F_RIGHT]),
             xp.where(near, fm[NEAR_SLOPE_RIGHT], fm[SLOPE_RIGHT]))  # fmt: skip
    return near, x, f


def split_lower(L, inner, fm, im):
    """log r of a lower bound split at its saturation threshold (kind 4; module docstring): one logarithm, of
    lambda (near part storing G: log r = G + gamma log lambda), of r = H lambda^k (near part storing H) or of F
    (far part: log r = log F).  The part's form is chosen by selects around the one logarithm, so that a Numba
    loop over it stays vectorised (:func:`near_u`)."""
    near, x, f = part_ends(L, inner, fm, im)
    lam = xp.maximum(x, fm[NEAR_LEFT])
    stores_g = im[NEAR_POWER] == 0
    v = xp.where(near, lam if stores_g else near_u(lam, f, im), xp.minimum(f, 1.0))
    log_v = xp.log(v)
    y = xp.where(v > 0.0, log_v, -xp.inf)  # log r = log v: the far part, or a near part storing H
    y = xp.where(near, xp.minimum(f + fm[GAMMA] * log_v, 0.0), y) if stores_g else y
    return xp.where(L >= fm[STAR_HI], -xp.inf, y)


def split_lower_ratio(L, inner, fm, im):
    """(r, pending) of a split lower bound (kind 4) at L where ratios are wanted: the far part's stored r itself
    (no transcendental; 0 where it reaches 0, at most 1), 0 from the threshold on; a near part storing H gives
    r = H lambda^k (no transcendental either), one storing G is left pending, ``exp`` of :func:`split_lower`
    (two transcendentals, for the tokens there only).  Branch-free, as :func:`split_lower`."""
    near, x, f = part_ends(L, inner, fm, im)
    stores_g = im[NEAR_POWER] == 0
    r_near = 0.0 if stores_g else near_u(xp.maximum(x, fm[NEAR_LEFT]), f, im)
    r = xp.where(L >= fm[STAR_HI], 0.0, xp.where(near, r_near, xp.minimum(xp.maximum(f, 0.0), 1.0)))
    return r, xp.logical_and(near, L < fm[STAR_HI]) if stores_g else False


def in_tail(L, fm, im):
    """Whether L lies in one of the bound's logarithmic tails (where :func:`tail_log` replaces log r)."""
    left = xp.logical_and(im[LEFT_TAIL] == 1, L < fm[LEFT_END])
    return xp.logical_or(left, xp.logical_and(im[RIGHT_TAIL] != NO_TAIL, L > fm[RIGHT_END]))


def tail_log(L, y, fm, im):
    """The tails of a bound whose ``im`` has tail modes (module docstring): left of a, log r = C/(beta - log L)
    (im[LEFT_TAIL] = 1); right of b, y + log(y + nu) = L + K (RIGHT_LOG, an upper bound; fm[TAIL_K] = K,
    fm[TAIL_NU] = nu) or r = K + nu L (RIGHT_LINEAR)."""
    if im[LEFT_TAIL] == 1:
        y = xp.where(L < fm[LEFT_END], fm[TAIL_C] / (fm[TAIL_BETA] - xp.log(L)), y)
    if im[RIGHT_TAIL] == RIGHT_LOG:
        F = L + fm[TAIL_K]
        z = F - xp.log(xp.maximum(F, 1.0))
        for _ in range(4):  # Newton on z + log(z + nu) = F from z = F - log F (F >= 600): quadratic, 4 steps
            z = z - (z + xp.log(z + fm[TAIL_NU]) - F) * (z + fm[TAIL_NU]) / (z + fm[TAIL_NU] + 1.0)
        y = xp.where(L > fm[RIGHT_END], xp.where(F < xp.inf, z, xp.inf), y)
    if im[RIGHT_TAIL] == RIGHT_LINEAR:
        y = xp.where(L > fm[RIGHT_END], xp.log(fm[TAIL_K] + fm[TAIL_NU] * L), y)  # r = K + nu L
    return y


def bound_log(L, fm, im, off, shift, cells):
    """log r of one tabulated bound at L = -log p >= 0 (module docstring): the gathers (:func:`cell_value`), the
    bound's transform (:func:`bound_from_cell`) and its tails."""
    y = bound_from_cell(L, cell_value(L, fm, im, off, shift, cells), fm, im)
    if len(im) > PLAIN_IM_SIZE:
        y = tail_log(L, y, fm, im)
    return y


def plain_bound(L, f, fm, im):
    """log r of a bound of kind 0 to 3 from its stored function ``f`` at L (module docstring)."""
    if im[KIND] == LOG_R:
        y = xp.minimum(xp.maximum(f, 0.0), L)  # 1 <= r_up <= 1/p
    elif im[KIND] == RATIO:
        y = xp.where(f > 0.0, xp.log(xp.minimum(f, 1.0)), -xp.inf)
    elif im[KIND] == LOG_NEG_LOG_R:
        y = -xp.exp(f)
    else:
        y = xp.minimum(f, 0.0)  # log r of a lower bound linear in L far out (r_lo ~ (delta p)^(1/k))
    if im[SATURATED_LEFT]:
        y = xp.where(L <= fm[LEFT_END], L, y)  # saturated upper bound: r = 1/p
    if im[SATURATED_RIGHT]:
        y = xp.where(L >= fm[RIGHT_END], -xp.inf, y)  # saturated lower bound: r = 0
    return y


def minus_log_p(lp):
    """L = -log p, with log p >= 0 (and NaN) read as L = 0: exact; -0.0 never reaches the bits."""
    return xp.where(lp < 0.0, -lp, 0.0)


def table_bounds(lp, lower, upper, tol):
    """(log r_lo, log r_up) of a table at log p; log p in (0, tol] reads as 0, above tol or NaN gives NaN."""
    L = minus_log_p(lp)
    lo = bound_log(L, lower[0], lower[1], lower[2], lower[3], lower[4])
    up = bound_log(L, upper[0], upper[1], upper[2], upper[3], upper[4])
    bad = xp.logical_not(lp <= tol)
    return xp.where(bad, xp.nan, lo), xp.where(bad, xp.nan, up)
