r"""Evaluate a tabulated bound: piecewise cubic Hermite in :math:`L = -\log p` on octave cells (Numba, torch).

**Grid.** A bound is tabulated on :math:`[a, b] \subset [2^{-120}, 680]`.  Octave :math:`e` (:math:`2^e \le L <
2^{e+1}`) is cut into :math:`2^{k_e}` equal cells (:math:`k_e` is the octave's *level*); a saturation kink
:math:`a` or :math:`b` inside an octave shortens the cell that holds it.  :math:`L = -\log p` is exact from the
input (a sign flip), and its cell is read off its float bits with no search and no transcendental: the exponent
field gives the octave, the top :math:`k_e` mantissa bits the cell,

.. math::  c = \mathrm{off}_e + \big\lfloor m\,2^{k_e} \big\rfloor, \qquad L = 2^{e}(1 + m),\ m \in [0, 1).

**Cells.** On a cell :math:`[L_c, L_c + w]` with values :math:`F_0, F_1` and slopes :math:`F'_0, F'_1`
(:math:`dF/dL`), the Hermite cubic is precomputed at load in Horner form in :math:`s = (L - L_c)/w`,

.. math::  F = c_0 + s\,(c_1 + s\,(c_2 + s\,c_3)),\quad c_0 = F_0,\ c_1 = wF'_0,\
           c_2 = 3(F_1 - F_0) - (2F'_0 + F'_1)w,\ c_3 = 2(F_0 - F_1) + (F'_0 + F'_1)w.

**Stored function** (``kind``): 0 — :math:`\log r` (upper bounds; clamped to :math:`[0, L]`, i.e.
:math:`1 \le r \le 1/p`); 1 — :math:`r` (a lower bound that reaches 0, so relative accuracy survives near the
kink; :math:`\log r = \log F`); 2 — :math:`\log(-\log r)` (a lower bound that never saturates,
:math:`\approx L + \log\delta` as :math:`p \to 0`; :math:`\log r = -e^{F}`).

**Outside** :math:`[a, b]`: a saturated side returns the exact :math:`\log r = L` (:math:`r = 1/p`) or
:math:`-\infty` (:math:`r = 0`); otherwise left of :math:`a = 2^{-120}` the end value (:math:`p = 1` to
:math:`O(2^{-120})`) and right of :math:`b = 680` the end tangent in :math:`L` (the stored functions are linear in
:math:`L` up to :math:`O(p)` there).  ``log p`` above 0 (up to the caller's tolerance) reads as 0; NaN gives NaN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numba
import numpy as np

__all__ = ["KernelBound", "cell_offsets", "eval_log_numba", "eval_log_torch", "octave_grid", "octave_of", "pack"]

#: fastmath subset that keeps isnan/inf semantics (no 'nnan'/'ninf')
_FASTMATH = {"nsz", "arcp", "contract", "afn", "reassoc"}
#: (mantissa bits, exponent mask, exponent bias) of the float bit patterns read by the kernel
_FLOAT_BITS = {np.dtype(np.float32): (23, 0xFF, 127, np.int32), np.dtype(np.float64): (52, 0x7FF, 1023, np.int64)}
#: finest level: cells must be addressable by the 23 mantissa bits of a float32 input
MAX_LEVEL = 23


# --------------------------------------------------------------------------------------------------------
# The octave grid (NumPy)
# --------------------------------------------------------------------------------------------------------


def octave_of(value: float) -> int:
    """:math:`e` with :math:`2^e \\le v < 2^{e+1}` (exact, from ``frexp``) for a positive finite ``value``."""
    return int(np.frexp(value)[1]) - 1


def octave_grid(a: float, b: float, levels: np.ndarray) -> np.ndarray:
    """Knots on ``[a, b]``: ``a``, every grid point :math:`2^e(1 + j 2^{-k_e})` strictly inside, ``b``.

    ``levels[o]`` is :math:`k_e` of octave :math:`e = e_a + o`, from the octave of ``a`` to that of the last
    point below ``b``.  Grid points are exact binary fractions, so the knots are reproducible bit for bit.
    """
    e_a = octave_of(a)
    inner = [
        np.ldexp(1.0 + np.arange(2**k) / 2.0**k, e_a + o)  # 2^e (1 + j/2^k), exact
        for o, k in enumerate(np.asarray(levels, dtype=np.int64))
    ]
    grid = np.concatenate(inner)
    return np.concatenate([[a], grid[(grid > a) & (grid < b)], [b]])


def cell_offsets(a: float, levels: np.ndarray) -> np.ndarray:
    """``off[o]``: the cell index of grid cell :math:`j = 0` of octave :math:`e_a + o` (see the module docstring).

    In the first octave the cells left of ``a`` do not exist, so its offset is :math:`-j_0`, with :math:`j_0` the
    grid cell holding ``a``; later octaves follow with :math:`2^{k}` cells each.
    """
    levels = np.asarray(levels, dtype=np.int64)
    j0 = int(np.floor((np.ldexp(a, -octave_of(a)) - 1.0) * 2.0 ** levels[0]))  # exact: scaling by powers of 2
    counts = 2 ** levels
    return np.concatenate([[-j0], -j0 + np.cumsum(counts)[:-1]]).astype(np.int64)


def horner_cells(knots: np.ndarray, values: np.ndarray, slopes: np.ndarray) -> np.ndarray:
    """(n_cells, 6) rows :math:`(L_c, 1/w, c_0, c_1, c_2, c_3)` (see the module docstring)."""
    w = np.diff(knots)
    f0, f1, d0, d1 = values[:-1], values[1:], slopes[:-1] * w, slopes[1:] * w
    return np.stack([knots[:-1], 1.0 / w, f0, d0, 3 * (f1 - f0) - 2 * d0 - d1, 2 * (f0 - f1) + d0 + d1], axis=1)


@dataclass(frozen=True)
class KernelBound:
    """What the kernels read for one bound.

    ``fmeta = (a, b, F(a), F(b), F'(b))``, ``imeta = (kind, saturated left of a, saturated right of b, e_a)``,
    ``off``/``levels`` per octave, ``cells`` as :func:`horner_cells`.
    """

    fmeta: np.ndarray
    imeta: np.ndarray
    off: np.ndarray
    levels: np.ndarray
    cells: np.ndarray


def pack(knots, values, slopes, levels, kind: int, saturated_left: bool, saturated_right: bool) -> KernelBound:
    """The kernel arrays of one bound (computed once per table)."""
    a, b = float(knots[0]), float(knots[-1])
    return KernelBound(
        fmeta=np.array([a, b, values[0], values[-1], slopes[-1]], dtype=np.float64),
        imeta=np.array([kind, saturated_left, saturated_right, octave_of(a)], dtype=np.int64),
        off=cell_offsets(a, levels),
        levels=np.asarray(levels, dtype=np.int64),
        cells=np.ascontiguousarray(horner_cells(knots, values, slopes)),
    )


# --------------------------------------------------------------------------------------------------------
# Numba
# --------------------------------------------------------------------------------------------------------


@numba.njit(inline="always", fastmath=_FASTMATH)
def _bound(L, bits, mbits, emask, ebias, fm, im, off, lev, cells):
    if L <= fm[0]:
        if im[1]:
            return L  # saturated upper bound: log r = log(1/p) = L
        f = fm[2]
    elif L >= fm[1]:
        if im[2]:
            return -math.inf  # saturated lower bound: r = 0
        f = fm[3] if fm[4] == 0.0 else fm[3] + fm[4] * (L - fm[1])
    else:
        o = ((bits >> mbits) & emask) - ebias - im[3]  # octave of L, counted from a's
        c = off[o] + ((bits & ((1 << mbits) - 1)) >> (mbits - lev[o]))  # top k_e mantissa bits
        s = (L - cells[c, 0]) * cells[c, 1]
        f = cells[c, 2] + s * (cells[c, 3] + s * (cells[c, 4] + s * cells[c, 5]))
    if im[0] == 0:
        return min(max(f, 0.0), L)  # 1 <= r_up <= 1/p
    if im[0] == 1:
        return math.log(min(f, 1.0)) if f > 0.0 else -math.inf
    return -math.exp(f)


@numba.njit(parallel=True, cache=True, fastmath=_FASTMATH)
def _kernel(log_p, bits, mbits, emask, ebias, lo_fm, lo_im, lo_off, lo_lev, lo_cells,
            up_fm, up_im, up_off, up_lev, up_cells, tol, out_lo, out_up):  # fmt: skip
    above = 0  # count of log p > tol (the caller raises)
    for i in numba.prange(log_p.shape[0]):
        lp = np.float64(log_p[i])
        if math.isnan(lp):
            out_lo[i] = math.nan
            out_up[i] = math.nan
            continue
        if lp > tol:
            above += 1
        L = -lp if lp < 0.0 else 0.0  # L = -log p, exact; its bits are those of log p but the sign
        out_lo[i] = _bound(L, bits[i], mbits, emask, ebias, lo_fm, lo_im, lo_off, lo_lev, lo_cells)
        out_up[i] = _bound(L, bits[i], mbits, emask, ebias, up_fm, up_im, up_off, up_lev, up_cells)
    return above


def eval_log_numba(log_p: np.ndarray, lower: KernelBound, upper: KernelBound, out_dtype, tol: float):
    """(log r_lo, log r_up, count of log p > tol) for a flat float32/float64 array, computed in float64.

    The input is read in its own dtype (its bits give the cells), so the only allocations are the two outputs.
    """
    mbits, emask, ebias, int_type = _FLOAT_BITS[log_p.dtype]
    out_lo = np.empty(log_p.shape, dtype=out_dtype)
    out_up = np.empty(log_p.shape, dtype=out_dtype)
    lo, up = lower, upper
    above = _kernel(
        log_p, log_p.view(int_type), mbits, emask, ebias, lo.fmeta, lo.imeta, lo.off, lo.levels, lo.cells,
        up.fmeta, up.imeta, up.off, up.levels, up.cells, tol, out_lo, out_up,
    )  # fmt: skip
    return out_lo, out_up, above


# --------------------------------------------------------------------------------------------------------
# torch
# --------------------------------------------------------------------------------------------------------


def torch_arrays(bound: KernelBound, device) -> tuple:
    """The bound's arrays as float64/int64 tensors on ``device`` (cached by the caller)."""
    import torch

    def t(a, dtype=torch.float64):
        return torch.as_tensor(a, dtype=dtype, device=device)

    shift = 52 - bound.levels  # float64 mantissa bits below the cell index
    return (t(bound.fmeta), bound.imeta.tolist(), t(bound.off, torch.int64), t(shift, torch.int64), t(bound.cells))


def _torch_bound(torch, L, arrays):
    fm, (kind, sat_left, sat_right, e_a), off, shift, cells = arrays
    bits = L.view(torch.int64)  # the float64 bits of L, as in the Numba kernel
    o = (((bits >> 52) & 0x7FF) - 1023 - e_a).clamp(0, off.shape[0] - 1)
    c = (off[o] + ((bits & 0xFFFFFFFFFFFFF) >> shift[o])).clamp(0, cells.shape[0] - 1)
    row = cells[c]
    s = (L - row[..., 0]) * row[..., 1]
    f = row[..., 2] + s * (row[..., 3] + s * (row[..., 4] + s * row[..., 5]))
    right = fm[3] + torch.where(fm[4] == 0, 0.0, fm[4] * (L - fm[1]))
    f = torch.where(L <= fm[0], fm[2], torch.where(L >= fm[1], right, f))
    if kind == 0:
        y = torch.minimum(f.clamp(min=0.0), L)  # 1 <= r_up <= 1/p
    elif kind == 1:
        y = torch.log(f.clamp(min=0.0, max=1.0))
    else:
        y = -torch.exp(f)
    if sat_left:
        y = torch.where(L <= fm[0], L, y)  # r = 1/p
    if sat_right:
        y = torch.where(L >= fm[1], -math.inf, y)  # r = 0
    return y


def eval_log_torch(log_p, lower_arrays, upper_arrays, tol: float):
    """(log r_lo, log r_up) in float64 for a float64 tensor; no host synchronisation, so log p > ``tol``
    gives NaN instead of an error."""
    import torch

    L = (-log_p).clamp(min=0.0).contiguous()  # L = -log p; log p in (0, tol] reads as p = 1
    lo = _torch_bound(torch, L, lower_arrays)
    up = _torch_bound(torch, L, upper_arrays)
    bad = torch.isnan(log_p) | (log_p > tol)
    return torch.where(bad, math.nan, lo), torch.where(bad, math.nan, up)
