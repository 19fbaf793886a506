r"""A certified lookup table as a pure JAX function (:meth:`BandTable.to_jax`): jittable, vmappable, no callbacks.

The stored functions and their transforms are :mod:`bandcore.kernels.lookup`'s own source, bound to
``jax.numpy`` (:func:`bandcore.kernels.ops.jax_ops`): :func:`~bandcore.kernels.lookup.bound_from_cell` (kinds 0
to 5) and :func:`~bandcore.kernels.lookup.tail_log` run unchanged.  What this module adds is the cell lookup,
written for both float widths JAX computes in:

* **Precision.** With ``jax_enable_x64`` the lookup runs in float64 (a float32 input is read exactly and the
  result rounded once to float32, as the NumPy reader does); without it, in float32, with the table's constants
  rounded once to float32 (:func:`constants`).
* **The cell of x** (L, or λ in a split bound's near part) is read off its bits, as in the other bindings: the
  exponent field gives the octave, the top :math:`k_e` mantissa bits the cell (:data:`MAX_LEVEL` = 23, so a
  float32's 23 mantissa bits address every cell; float32 subnormals are scaled by :math:`2^{64}` first).
* **The cell coordinate** :math:`s = (x - L_c)/w` is taken from the remaining mantissa bits, exactly:
  :math:`s_{reg} = \operatorname{frac}(m\,2^{k_e})` is x's position in its cell of the regular grid, and a cell
  shortened by an end of the grid (its start :math:`L_c` above the regular point :math:`L_g`, or its width
  :math:`w` below the regular :math:`w_{reg}`) maps it by :math:`s = (s_{reg} - \sigma)\rho`,
  :math:`\sigma = (L_c - L_g)/w_{reg}`, :math:`\rho = w_{reg}/w` (0 and 1 inside the grid).  No knot or cell
  width is subtracted in the working precision, so a float32 cell is read as accurately as a float64 one, also
  where its knots are not float32 numbers.
* **Decisions on float32.** A float64 end point or threshold :math:`t` is rounded *towards* the side the
  comparison keeps (:math:`x \le t` ⇔ :math:`x \le \mathrm{rd}(t)` and :math:`x \ge t` ⇔
  :math:`x \ge \mathrm{ru}(t)` for a float32 x), so every saturation and part decision of a float32 input is the
  float64 reader's; a split bound's double-double threshold :math:`L^*` becomes a float32 pair
  :math:`\mathrm{rd/ru}(b) + (b - \mathrm{rd/ru}(b) + L^*_{lo})`, so λ keeps its relative accuracy next to
  :math:`L^*`.

Values: ``old_log_prob`` of any shape and float dtype; log p in :math:`(0, \tau]` (:math:`\tau` =
:data:`bandcore._contract.LOG_P_TOLERANCE`) reads as 0, log p above :math:`\tau` and NaN give NaN bounds (a
traced function cannot raise on data, as on a torch device).  Gradients do not flow into the bounds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._contract import LOG_P_TOLERANCE
from ..kernels import lookup
from ..kernels.grid import MAX_LEVEL, KernelBound
from ..kernels.ops import jax_ops
from ..kernels.sources import vectorised_module

__all__ = ["BoundConstants", "check_log_flag", "constants", "cubic", "finish", "jax_dtype", "lookup_jax", "opaque",
           "read_cell", "table_to_jax", "transform", "working_input"]  # fmt: skip

#: (mantissa bits, exponent bias, exponent mask, integer dtype) of each float width
LAYOUT = {np.dtype(np.float64): (52, 1023, 0x7FF, np.int64), np.dtype(np.float32): (23, 127, 0xFF, np.int32)}
#: float32, a bound with a logarithmic left tail (its grid starts at 2^-1022): the tail is read at L = 0, the grid
#: above; the tokens 0 < L <= FLOAT32_NORMAL (subnormals, which XLA's CPU arithmetic reads as 0) read their cell
#: from their bits and take the grid's decisions at FLOAT32_PROXY (:func:`transform`)
FLOAT32_NORMAL, FLOAT32_PROXY = 2.0**-126, 2.0**-125
assert MAX_LEVEL <= 23  # every cell is addressable by a float32's mantissa bits


def rounded(value: float, dtype, direction: int = 0) -> Any:
    """``value`` in ``dtype``: to nearest (0), down (-1: the largest ≤ value) or up (+1: the smallest ≥ value)."""
    value = float(value)
    out = np.asarray(value, dtype=dtype)[()]
    if direction < 0 and float(out) > value:  # compared as Python floats: exactly
        out = np.nextafter(out, dtype.type(-np.inf))
    elif direction > 0 and float(out) < value:
        out = np.nextafter(out, dtype.type(np.inf))
    return out


@dataclass(frozen=True)
class BoundConstants:
    """One bound's arrays in the working dtype: ``fm`` (dtype scalars, see :mod:`bandcore.kernels.lookup`),
    ``im`` (Python ints: static, the kernel branches on them), per octave entry ``off``, ``shift``, ``scale`` (=
    2^-shift), per cell ``cells`` rows ``(σ, ρ, c0, c1, c2, c3)``."""

    fm: tuple
    im: tuple
    off: np.ndarray
    shift: np.ndarray
    scale: np.ndarray
    cells: np.ndarray


def cell_maps(cells: np.ndarray, levels: np.ndarray, parts: list[tuple[int, int, int, int]]) -> np.ndarray:
    """(σ, ρ) of every cell (module docstring) from its Horner row ``(L_c, 1/w, ...)``; ``parts``: ``(first cell,
    end cell, e_a, first octave entry)`` of each grid stored in ``cells`` (a split bound: far, then near)."""
    out = np.empty((len(cells), 2))
    for first, end, e_a, entry in parts:
        start, inv_w = cells[first:end, 0], cells[first:end, 1]
        e = np.frexp(start)[1] - 1
        k = levels[entry + e - e_a]
        w_reg = np.ldexp(1.0, e - k)
        j = np.floor((np.ldexp(start, -e) - 1.0) * np.ldexp(1.0, k))  # exact: powers of two
        regular = np.ldexp(1.0 + np.ldexp(j, -k), e)
        out[first:end, 0] = (start - regular) / w_reg
        out[first:end, 1] = w_reg * inv_w
    return out


def _grid_parts(kb: KernelBound) -> list[tuple[int, int, int, int]]:
    im = kb.imeta
    if int(im[0]) < 4:
        return [(0, len(kb.cells), int(im[3]), 0)]
    n_far = int(im[7])
    return [(0, n_far, int(im[3]), 0), (n_far, len(kb.cells), int(im[11]), int(im[6]))]


def constants(kb: KernelBound, dtype) -> BoundConstants:
    """The arrays of one bound (a :class:`~bandcore.kernels.grid.KernelBound`) for the working ``dtype``
    (float64, or float32 with the directed roundings of the module docstring)."""
    dtype = np.dtype(dtype)
    mbits, _, _, itype = LAYOUT[dtype]
    fm64, im = [float(v) for v in kb.fmeta], tuple(int(v) for v in kb.imeta)
    fm = [rounded(v, dtype) for v in fm64]
    maps = cell_maps(kb.cells, kb.levels, _grid_parts(kb))
    cells = np.concatenate([maps, kb.cells[:, 2:]], axis=1)
    if dtype == np.float32:
        fm[0], fm[1] = rounded(fm64[0], dtype, -1), rounded(fm64[1], dtype, +1)  # x <= a, x >= b
        if has_left_tail(im) and fm64[0] < FLOAT32_NORMAL:
            fm[0] = rounded(FLOAT32_NORMAL, dtype)  # the tail at L = 0, the grid above (:func:`transform`)
        if im[0] >= 4:  # saturated iff L >= b (lower) or L <= b (upper): b rounded towards its saturated side
            hi = rounded(fm64[14], dtype, +1 if im[0] == 4 else -1)
            fm[14], fm[15] = hi, rounded((fm64[14] - float(hi)) + fm64[15], dtype)
    return BoundConstants(fm=tuple(fm), im=im, off=kb.off.astype(itype), shift=(mbits - kb.levels).astype(itype),
                          scale=np.ldexp(1.0, -(mbits - kb.levels)).astype(dtype),
                          cells=np.ascontiguousarray(cells, dtype=dtype))  # fmt: skip


def lookup_jax():
    """:mod:`bandcore.kernels.lookup` bound to ``jax.numpy`` (imports jax)."""
    return vectorised_module((lookup,), jax_ops(), "bandcore.kernels.lookup_jax", {})


def jax_dtype():
    """The working dtype: float64 where ``jax_enable_x64`` is on, else float32 (imports jax)."""
    import jax

    return np.dtype(np.float64) if jax.config.jax_enable_x64 else np.dtype(np.float32)


def float_fields(x):
    """(bits as the signed integer type, exponent field, mantissa field) of a float32/float64 jax array."""
    import jax

    mbits, _, emask, itype = LAYOUT[np.dtype(x.dtype)]
    bits = jax.lax.bitcast_convert_type(x, itype)
    return bits, (bits >> mbits) & emask, bits & ((1 << mbits) - 1)


def read_cell(x, e_a, first, off, shift, scale, n_cells: int):
    r"""(cell index, :math:`s_{reg}`) of x >= 0 (a jax array of the working dtype) on the octave grid whose first
    octave is :math:`2^{e_a}` and starts at entry ``first`` of ``off``/``shift``/``scale``: the bits of x.  A
    subnormal x (which XLA's CPU arithmetic reads as 0) is read from its mantissa, an exact integer."""
    import jax
    import jax.numpy as jnp

    dtype = np.dtype(x.dtype)
    mbits, bias, emask, itype = LAYOUT[dtype]
    bits, exponent, mantissa = float_fields(x)
    subnormal = exponent == 0
    scaled = jax.lax.bitcast_convert_type(mantissa.astype(dtype), itype)  # x 2^(bias + mbits - 1), exact
    bits = jnp.where(subnormal, scaled, bits)
    e_shift = jnp.where(subnormal, bias + mbits - 1, 0).astype(itype)
    exponent = ((bits >> mbits) & emask) - bias - e_shift
    o = jnp.minimum(jnp.maximum(exponent - e_a, 0) + first, off.shape[0] - 1)
    mantissa = bits & ((1 << mbits) - 1)
    sh = shift[o]
    cell = jnp.minimum(jnp.maximum(off[o] + (mantissa >> sh), 0), n_cells - 1)
    s_reg = (mantissa & ((jnp.ones_like(sh) << sh) - 1)).astype(dtype) * scale[o]
    return cell, s_reg


def cubic(x, cells, cell, s_reg):
    """The Hermite cubic of ``cell`` (rows ``(σ, ρ, c0, c1, c2, c3)``) at x, from its :func:`read_cell` s_reg."""
    row = cells[cell]
    s = (s_reg - row[..., 0]) * row[..., 1]
    return row[..., 2] + s * (row[..., 3] + s * (row[..., 4] + s * row[..., 5]))


def has_left_tail(im: tuple) -> bool:
    return len(im) > 4 and im[4] == 1


def transform(L, inner, fm, im):
    r"""log r of a bound at L from the cubic ``inner`` of its cell: :func:`~bandcore.kernels.lookup.bound_from_cell`
    and :func:`~bandcore.kernels.lookup.tail_log`.  XLA's CPU arithmetic reads a subnormal L as 0, which only a
    logarithmic left tail (grid from 2^-1022) can tell apart: in float64 such an L lies in the tail, log r =
    C/(β - log L) with log L from L's bits; in float32 the grid reaches the subnormals, so 0 < L <= 2^-126 takes
    its decisions at :data:`FLOAT32_PROXY`, inside the grid, for the cell value read from its bits."""
    import jax.numpy as jnp

    lk = lookup_jax()
    dtype = np.dtype(L.dtype)
    subnormal = None
    if has_left_tail(im):
        bits, exponent, mantissa = float_fields(L)
        if dtype == np.float32:
            tiny = (bits > 0) & (bits <= int(np.float32(FLOAT32_NORMAL).view(np.int32)))
            L = jnp.where(tiny, rounded(FLOAT32_PROXY, dtype), L)
        else:
            subnormal = (exponent == 0) & (mantissa != 0)
    y = lk.bound_from_cell(L, inner, fm, im)
    if len(im) > 4:
        y = lk.tail_log(L, y, fm, im)
    if subnormal is not None:
        log_L = jnp.log(mantissa.astype(dtype)) - 1074 * math.log(2.0)
        y = jnp.where(subnormal, fm[5] / (fm[6] - log_L), y)
    return y


def opaque(values):
    """``values`` (a tuple of constants) behind ``jax.lax.optimization_barrier``: XLA's algebraic simplifier
    otherwise reassociates constants (``(b - L) + lo`` becomes ``(b + lo) - L`` under ``jit``), which undoes the
    double-double arithmetic of a split bound's λ."""
    import jax
    import jax.numpy as jnp

    return jax.lax.optimization_barrier(tuple(jnp.asarray(v) for v in values))


def _bound(L, c: BoundConstants):
    """log r of one bound at L (a jax array of the working dtype)."""
    import jax.numpy as jnp

    fm, im = opaque(c.fm), c.im
    if im[0] >= 4:
        near, x = lookup_jax().split_part(L, fm, im)
        e_a, first = jnp.where(near, im[11], im[3]), jnp.where(near, im[6], 0)
    else:
        x, e_a, first = L, im[3], 0
    cell, s_reg = read_cell(x, e_a, first, jnp.asarray(c.off), jnp.asarray(c.shift), jnp.asarray(c.scale),
                            len(c.cells))  # fmt: skip
    return transform(L, cubic(x, jnp.asarray(c.cells), cell, s_reg), fm, im)


def finish(old_log_prob, log_lower, log_upper, *, log: bool):
    """The bounds as the caller's dtype (float32 for a 16-bit input): NaN where log p > τ or NaN; exp of the
    logarithms unless ``log``; no gradient."""
    import jax
    import jax.numpy as jnp

    lp = old_log_prob
    dtype = log_lower.dtype
    bad = jnp.logical_not(lp.astype(dtype) <= rounded(LOG_P_TOLERANCE, np.dtype(dtype), -1))
    lo = jnp.where(bad, jnp.nan, log_lower)
    up = jnp.where(bad, jnp.nan, log_upper)
    if not log:
        lo, up = jnp.exp(lo), jnp.exp(up)
    out = jnp.result_type(lp.dtype, jnp.float32)
    return jax.lax.stop_gradient(lo.astype(out)), jax.lax.stop_gradient(up.astype(out))


def working_input(old_log_prob):
    """(the input as a jax array, L = -log p in the working dtype).  A narrower input is widened with its
    subnormals read from their bits (XLA's CPU conversion flushes them to 0); L = -log p by a sign flip, 0 for
    log p >= 0 and NaN (masked by :func:`finish`)."""
    import jax
    import jax.numpy as jnp

    lp = jnp.asarray(old_log_prob)
    if not jnp.issubdtype(lp.dtype, jnp.floating):
        raise TypeError(f"old_log_prob must hold floating-point log-probabilities, got dtype {lp.dtype}")
    dtype = jax_dtype()
    x = lp.astype(dtype)
    info = jnp.finfo(lp.dtype)
    if info.bits < np.finfo(dtype).bits:
        width = {16: jnp.uint16, 32: jnp.uint32}[info.bits]
        bits = jax.lax.bitcast_convert_type(lp, width)
        mantissa = bits & ((1 << info.nmant) - 1)
        subnormal = ((bits >> info.nmant) & ((1 << info.nexp) - 1) == 0) & (mantissa != 0)
        value = mantissa.astype(dtype) * np.ldexp(dtype.type(1.0), int(info.minexp) - int(info.nmant))
        x = jnp.where(subnormal, jnp.where(jnp.signbit(lp), -value, value), x)
    return lp, jnp.where(jnp.signbit(x) & ~jnp.isnan(x), -x, jnp.zeros_like(x))


def table_to_jax(lower: KernelBound, upper: KernelBound, *, log: bool = False) -> Callable:
    """``f(old_log_prob) -> (lower, upper)`` for the two kernel bounds of a 1-D table (see the module
    docstring); ``log=True`` returns log bounds."""
    cache: dict[np.dtype, tuple[BoundConstants, BoundConstants]] = {}

    def bounds(old_log_prob):
        lp, L = working_input(old_log_prob)
        dtype = np.dtype(L.dtype)
        if dtype not in cache:
            cache[dtype] = (constants(lower, dtype), constants(upper, dtype))
        c_lo, c_up = cache[dtype]
        return finish(lp, _bound(L, c_lo), _bound(L, c_up), log=log)

    return bounds


def check_log_flag(log: Any) -> bool:
    if not isinstance(log, bool):
        raise TypeError(f"log must be True or False, got {log!r}")
    return log
