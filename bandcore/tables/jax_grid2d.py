r"""A table over δ as a pure JAX function (:meth:`BandTable2D.to_jax`): ``f(old_log_prob, delta)`` with δ a traced
scalar or an array broadcasting against ``old_log_prob``.

It does per token what :meth:`BandTable2D.at` does per δ, without leaving JAX:

* **The series in δ.** The token's δ-piece (a saturating bound's, by :math:`u`) and its Chebyshev variable give
  :math:`T_k(v)`; the stored function and its slope at the two knots of the token's cell (and at the ends of its
  grid) are :math:`\sum_k T_k(v)\,a_{kj}`, from which the cell's Hermite cubic is formed as
  :func:`bandcore.kernels.grid.horner_cells` forms it.  The cell itself is read off the bits of L (or λ) as in the
  1-D reader (:func:`bandcore.tables.jax_reader.read_cell`).
* **The threshold** :math:`L^*(\delta)` of a split bound comes from the double-double series of
  :mod:`bandcore.tables.jax_series` (where the NumPy reader bisects at 50 digits), and with it the saturated float
  next to it and the remainder, as :func:`bandcore.tables.split2d.exact_threshold` gives them.
* **Logarithmic tails** are fitted per δ as :func:`bandcore.tables.tails.with_tails` fits them, through the
  50-digit oracle value at the tail's far point, read from its series in u.
* The bound's transform is the lookup kernel's (:func:`bandcore.tables.jax_reader.transform`).

Outside the table's δ range (with the NumPy reader's 1e-12 slack), for δ NaN and for log p above the tolerance the
bounds are NaN.  The work per token is a few dozen gathers and, for a split bound, a 48-term double-double
series (computed once for a scalar δ).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..kernels.grid import cell_offsets, octave_of
from .chebyshev import Surface
from .jax_dd import clenshaw
from .jax_reader import LAYOUT, cell_maps, finish, opaque, read_cell, rounded, transform, working_input
from .jax_series import SeriesPieces, tail_series, threshold_series
from .tabulated import RIGHT_LINEAR, RIGHT_LOG
from .threshold import SPLIT_LOWER, SPLIT_UPPER

__all__ = ["SideArrays", "grid2d_to_jax", "side_arrays"]

#: the far points of the tails' fits (:mod:`bandcore.tables.tails`): L = 5e-324 on the left, 2000 on the right
LEFT_FAR, RIGHT_FAR = 5e-324, 2e3
#: right tail: Newton steps and tolerance of :func:`bandcore.tables.tails.right_tail_fit`
NEWTON_STEPS, NEWTON_TOL = 50, 1e-15


@dataclass(frozen=True)
class SideArrays:
    """One bound of a 2-D table in arrays (float64; each grid a *part*: a surface, or a δ-piece's far then near
    surface), all parts' knots and coefficients concatenated: per part its grid (``e_a``, first octave entry, first
    and last knot), per piece its u-range, far ends and near range; per octave entry ``off`` (global cell indices)
    and ``levels``; per cell its left knot, width and (σ, ρ); per knot the binary exponent of its largest slope
    coefficient (a float32 reader stores the slopes scaled by it: those next to L = 2^-1022 exceed float32)."""

    kind: int
    tails: tuple[bool, int]
    gamma: float
    knots: np.ndarray
    coef_values: np.ndarray
    coef_slopes: np.ndarray
    part_e_a: np.ndarray
    part_entry: np.ndarray
    part_first: np.ndarray
    part_last: np.ndarray
    piece_u: np.ndarray
    off: np.ndarray
    levels: np.ndarray
    cell_knot: np.ndarray
    cell_width: np.ndarray
    cell_map: np.ndarray
    slope_exponent: np.ndarray

    @property
    def split(self) -> bool:
        return self.kind in (SPLIT_LOWER, SPLIT_UPPER)


def side_arrays(side) -> SideArrays:
    """:class:`SideArrays` of a :class:`~bandcore.tables.chebyshev.Surface` or a tuple of
    :class:`~bandcore.tables.split2d.SplitSurface` δ-pieces."""
    if isinstance(side, Surface):
        surfaces, kind, tails, gamma, u = [side], side.kind, side.tails, 0.0, [(-1.0, 1.0)]
    else:
        surfaces = [s for piece in side for s in (piece.far, piece.near)]
        kind, tails, gamma, u = side[0].kind, side[0].far.tails, side[0].gamma, [p.u_range for p in side]
    n = max(len(s.coef_values) for s in surfaces)
    knots, values, slopes, levels, off = [], [], [], [], []
    e_a, entry, first, last, cells, maps_parts = [], [], [], [], [], []
    n_knots = n_cells = n_entries = 0
    for s in surfaces:
        k = len(s.knots)
        pad = np.zeros((n - len(s.coef_values), k))
        knots.append(s.knots)
        values.append(np.concatenate([s.coef_values, pad]))
        slopes.append(np.concatenate([s.coef_slopes, pad]))
        levels.append(np.asarray(s.levels, dtype=np.int64))
        off.append(cell_offsets(float(s.knots[0]), s.levels) + n_cells)
        e_a.append(octave_of(float(s.knots[0])))
        entry.append(n_entries)
        first.append(n_knots)
        last.append(n_knots + k - 1)
        cells.append(n_knots + np.arange(k - 1))
        maps_parts.append((n_cells, n_cells + k - 1, e_a[-1], n_entries))
        n_knots, n_cells, n_entries = n_knots + k, n_cells + k - 1, n_entries + len(s.levels)
    knots_all, cell_knot = np.concatenate(knots), np.concatenate(cells)
    width = knots_all[cell_knot + 1] - knots_all[cell_knot]
    levels_all = np.concatenate(levels)
    rows = np.stack([knots_all[cell_knot], 1.0 / width], axis=1)
    return SideArrays(kind=int(kind), tails=(bool(tails[0]), int(tails[1])), gamma=float(gamma), knots=knots_all,
                      coef_values=np.concatenate(values, axis=1), coef_slopes=np.concatenate(slopes, axis=1),
                      part_e_a=np.array(e_a), part_entry=np.array(entry), part_first=np.array(first),
                      part_last=np.array(last), piece_u=np.array(u, dtype=np.float64),
                      off=np.concatenate(off), levels=levels_all, cell_knot=cell_knot, cell_width=width,
                      cell_map=cell_maps(rows, levels_all, maps_parts),
                      slope_exponent=np.frexp(np.abs(np.concatenate(slopes, axis=1)).max(axis=0))[1])  # fmt: skip


@dataclass(frozen=True)
class SideSeries:
    """What a side needs beyond its arrays: the threshold series (split bounds) and the tails' oracle series in u
    (left, right; None where the side has no such tail)."""

    threshold: SeriesPieces | None
    left: np.ndarray | None
    right: np.ndarray | None


def side_series(table, index: int, arrays: SideArrays) -> SideSeries:
    """The series of side ``index`` (0 lower, 1 upper) of ``table`` (fitted at 50 digits; seconds)."""
    from ..oracle import reference_band_log

    div, side = table.divergence, ("lower", "upper")[index]
    threshold = threshold_series(div, side, table.delta_range) if arrays.split else None

    def oracle(L):
        return lambda delta: float(reference_band_log(div, np.array([-L]), delta)[index][0])

    left = tail_series(oracle(LEFT_FAR), table.delta_range) if arrays.tails[0] else None
    right = tail_series(oracle(RIGHT_FAR), table.delta_range) if arrays.tails[1] else None
    return SideSeries(threshold, left, right)


def _chebyshev(v, n: int):
    """T_0(v) .. T_{n-1}(v) stacked on a last axis (the recurrence numpy's chebvander uses)."""
    import jax.numpy as jnp

    rows = [jnp.ones_like(v), v]
    for _ in range(2, n):
        rows.append(2 * v * rows[-1] - rows[-2])
    return jnp.stack(rows[:n], axis=-1)


def _series_u(series, u):
    """A Chebyshev series in u (coefficients ``series``, behind a barrier) at u."""
    import jax.numpy as jnp

    return jnp.sum(_chebyshev(u, series.shape[-1]) * series, axis=-1)


def _threshold(delta, series: SeriesPieces, dtype, kind: int):
    """(b, b_lo): the saturated float next to L*(δ) and L* - b, from the double-double series."""
    import jax.numpy as jnp

    hi, lo = opaque(series.arrays(dtype))
    m, e = jnp.frexp(delta)
    piece = jnp.clip(e - 1 - series.k0, 0, hi.shape[0] - 1)
    star_hi, star_lo = clenshaw(4 * m - 3, hi[piece], lo[piece])  # t = delta 2^(1-k) - 3 = 4m - 3, exact
    if kind == SPLIT_LOWER:  # saturated iff L >= L*: the smallest float >= L*
        b = jnp.where(star_lo > 0, jnp.nextafter(star_hi, jnp.asarray(np.inf, dtype)), star_hi)
    else:  # saturated iff L <= L*: the largest float <= L*
        b = jnp.where(star_lo < 0, jnp.nextafter(star_hi, jnp.asarray(-np.inf, dtype)), star_hi)
    return b, (star_hi - b) + star_lo


class _Side:
    """One bound's arrays in the working dtype (made once per dtype) and its evaluation."""

    def __init__(self, arrays: SideArrays, series: SideSeries, dtype, delta_range: tuple[float, float]):
        self.a, self.s, self.dtype = arrays, series, np.dtype(dtype)
        mbits, _, _, itype = LAYOUT[self.dtype]
        a = arrays
        self.kind = a.kind
        self.im = (a.kind, int(a.kind == SPLIT_UPPER), int(a.kind == SPLIT_LOWER), 0, int(a.tails[0]), a.tails[1],
                   0, 0, 0, 0, 0, 0)  # fmt: skip
        cast = self.dtype.type
        self.knots = a.knots.astype(self.dtype)
        # float32: each knot's slope coefficients scaled by 2^-e (exact), its cells' widths by 2^e; float64: e = 0
        e = a.slope_exponent if self.dtype == np.float32 else np.zeros_like(a.slope_exponent)
        j = a.cell_knot
        # the values' steps over each cell as series of their own: F1 - F0 without cancellation in float32
        steps = a.coef_values[:, j + 1] - a.coef_values[:, j]
        self.coef = (a.coef_values.astype(self.dtype), np.ldexp(a.coef_slopes, -e).astype(self.dtype),
                     steps.astype(self.dtype))
        with np.errstate(over="ignore"):  # inf only at interior knots next to 2^-1022; read at a grid end only
            self.slope_scale = np.ldexp(1.0, e).astype(self.dtype)
        widths = np.stack([np.ldexp(a.cell_width, e[j]), np.ldexp(a.cell_width, e[j + 1])], axis=1)
        self.cells = (np.concatenate([a.cell_map, widths], axis=1).astype(self.dtype), j.astype(itype))
        self.grid = (a.off.astype(itype), (mbits - a.levels).astype(itype),
                     np.ldexp(1.0, -(mbits - a.levels)).astype(self.dtype))  # fmt: skip
        self.part = tuple(p.astype(itype) for p in (a.part_e_a, a.part_entry, a.part_first, a.part_last))
        far = slice(None, None, 2) if a.split else slice(None)  # a split bound's parts: far, near, far, ...
        far_first, far_last = a.knots[a.part_first[far]], a.knots[a.part_last[far]]
        down = -1 if self.dtype == np.float32 else 0
        self.far_ends = (np.array([rounded(v, self.dtype, down) for v in far_first], dtype=self.dtype),
                         np.array([rounded(v, self.dtype, -down) for v in far_last], dtype=self.dtype))  # fmt: skip
        if self.dtype == np.float32 and a.tails[0]:
            self.far_ends[0][:] = cast(2.0**-126)  # the tail at L = 0, the grid above (jax_reader.transform)
        lo, hi = (math.log(d) for d in delta_range)
        self.u_map = (lo, hi)
        self.range = (rounded(delta_range[0] * (1 - 1e-12), self.dtype, -1),
                      rounded(delta_range[1] * (1 + 1e-12), self.dtype, +1))  # fmt: skip

    def delta_part(self, delta):
        """What depends on δ only: (piece, T_k(v), threshold (b, lo) or None, u)."""
        import jax.numpy as jnp

        lo, hi = self.u_map
        u = (2 * jnp.log(delta) - lo - hi) / (hi - lo)  # as BandTable2D.at computes it
        if self.a.split:
            u0, u1 = self.a.piece_u[:, 0], self.a.piece_u[:, 1]
            piece = jnp.minimum(jnp.searchsorted(jnp.asarray(u1.astype(self.dtype)), u, side="left"), len(u1) - 1)
            v = (2 * u - jnp.asarray(u0)[piece] - jnp.asarray(u1)[piece]) / (jnp.asarray(u1 - u0)[piece])
        else:
            piece, v = jnp.zeros(u.shape, dtype=np.int32), u
        T = _chebyshev(jnp.clip(v, -1.0, 1.0), self.coef[0].shape[0])
        star = _threshold(delta, self.s.threshold, self.dtype, self.kind) if self.a.split else None
        return piece, T, star, u

    def log_bound(self, L, piece, T, star, u):
        """log r at L (all arguments broadcast to L's shape)."""
        import jax.numpy as jnp

        a = self.a
        zero = jnp.zeros_like(L)
        values, slopes, steps = (jnp.asarray(c) for c in opaque(self.coef))
        knots = jnp.asarray(self.knots)
        a_far, b_far = (jnp.asarray(e)[piece] for e in self.far_ends)
        fm = [a_far, b_far, zero, zero, zero, zero, zero, zero, zero, zero, zero, zero, zero, zero, zero, zero,
              self.dtype.type(a.gamma)]  # fmt: skip
        if a.split:
            fm[14], fm[15] = star
            near, x = _lookup().split_part(L, tuple(fm), self.im)
            part = 2 * piece + near.astype(piece.dtype)
        else:
            x, part = L, piece
        e_a, entry, first, last = (jnp.asarray(p)[part] for p in self.part)
        off, shift, scale = (jnp.asarray(g) for g in self.grid)
        cell, s_reg = read_cell(x, e_a, entry, off, shift, scale, len(a.cell_knot))
        j = jnp.asarray(self.cells[1])[cell]

        def at(column, coef):
            return jnp.sum(T * jnp.moveaxis(coef[:, column], 0, -1), axis=-1)

        f0, step, d0, d1 = at(j, values), at(cell, steps), at(j, slopes), at(j + 1, slopes)
        row = jnp.asarray(self.cells[0])[cell]
        d0, d1 = d0 * row[..., 2], d1 * row[..., 3]
        s = (s_reg - row[..., 0]) * row[..., 1]
        c2, c3 = 3 * step - 2 * d0 - d1, -2 * step + d0 + d1
        inner = f0 + s * (d0 + s * (c2 + s * c3))
        ends = (knots[first], knots[last], at(first, values), at(last, values),
                at(last, slopes) * jnp.asarray(self.slope_scale)[last])  # fmt: skip
        if a.split:  # the part being read supplies the ends of both (only its own are read)
            fm[2:5], fm[9:14] = ends[2:], ends
        else:
            fm[2:5] = ends[2:]
        fm[5:9] = self._tails(fm, a_far, b_far, ends, u)
        return transform(L, inner, tuple(fm), self.im)

    def _tails(self, fm, a_far, b_far, ends, u):
        """(C, β, K, ν) fitted at δ as :func:`bandcore.tables.tails.with_tails` fits them (zeros where unused)."""
        import jax
        import jax.numpy as jnp

        C = beta = K = nu = jnp.zeros_like(ends[2])
        if self.a.tails[0]:
            y_a = _lookup().bound_from_cell(a_far, ends[2], tuple(fm), self.im)  # log r at the grid's start
            y_s = _series_u(opaque((self.s.left,))[0].astype(self.dtype), u)
            ell_a, ell_s = -jnp.log(a_far), -math.log(LEFT_FAR)
            beta = (y_s * ell_s - y_a * ell_a) / (y_a - y_s)
            C = y_a * (ell_a + beta)
        if self.a.tails[1]:
            y_b, L_s = ends[3], RIGHT_FAR
            y_s = _series_u(opaque((self.s.right,))[0].astype(self.dtype), u)
            if self.a.tails[1] == RIGHT_LINEAR:
                r_b, r_s = jnp.exp(y_b), jnp.exp(y_s)
                nu = (r_s - r_b) / (L_s - b_far)
                K = r_b - nu * b_far
            elif self.a.tails[1] == RIGHT_LOG:

                def newton(_, carry):
                    nu, done = carry
                    phi = (y_b - b_far + jnp.log(y_b + nu)) - (y_s - L_s + jnp.log(y_s + nu))
                    step = phi / (1.0 / (y_b + nu) - 1.0 / (y_s + nu))
                    moved = jnp.where(done, nu, nu - step)
                    return moved, done | (jnp.abs(step) <= NEWTON_TOL * jnp.maximum(1.0, jnp.abs(moved)))

                nu, _ = jax.lax.fori_loop(0, NEWTON_STEPS, newton, (jnp.zeros_like(y_b), jnp.zeros(y_b.shape, bool)))
                K = y_b - b_far + jnp.log(y_b + nu)
        return [C, beta, K, nu]


def _lookup():
    from .jax_reader import lookup_jax

    return lookup_jax()


def grid2d_to_jax(table, *, log: bool = False) -> Callable:
    """``f(old_log_prob, delta) -> (lower, upper)`` of a :class:`~bandcore.tables.grid2d.BandTable2D` (module
    docstring); the series are fitted here, once per table (seconds)."""
    arrays = [side_arrays(table.lower), side_arrays(table.upper)]
    series = [side_series(table, index, arrays[index]) for index in (0, 1)]
    sides: dict[np.dtype, list[_Side]] = {}

    def bounds(old_log_prob, delta):
        import jax.numpy as jnp

        lp, L = working_input(old_log_prob)
        dtype = np.dtype(L.dtype)
        if dtype not in sides:
            sides[dtype] = [_Side(arrays[i], series[i], dtype, table.delta_range) for i in (0, 1)]
        d = jnp.asarray(delta)
        if not jnp.issubdtype(d.dtype, jnp.floating):
            d = d.astype(dtype)  # an integer or bool delta: read as a number
        d = d.astype(dtype)
        shape = jnp.broadcast_shapes(L.shape, d.shape)
        out = []
        for side in sides[dtype]:
            piece, T, star, u = side.delta_part(d)
            bcast = [jnp.broadcast_to(v, shape) for v in (piece, u)]
            T = jnp.broadcast_to(T, (*shape, T.shape[-1]))
            star = None if star is None else tuple(jnp.broadcast_to(v, shape) for v in star)
            out.append(side.log_bound(jnp.broadcast_to(L, shape), bcast[0], T, star, bcast[1]))
        lo_d, hi_d = sides[dtype][0].range
        outside = jnp.broadcast_to(jnp.logical_not((d >= lo_d) & (d <= hi_d)), shape)
        lower, upper = (jnp.where(outside, jnp.nan, y) for y in out)
        return finish(jnp.broadcast_to(lp, shape), lower, upper, log=log)

    return bounds
