r"""Evaluate a tabulated bound: cubic Hermite in :math:`x = \operatorname{logit} p` (NumPy, Numba, torch).

On an interval :math:`[x_j, x_{j+1}]` of width :math:`h`, with :math:`s = (x - x_j)/h`, values :math:`F` and
slopes :math:`F'` at the knots,

.. math::  F(x) = (2s^3-3s^2+1)F_j + (s^3-2s^2+s)hF'_j + (-2s^3+3s^2)F_{j+1} + (s^3-s^2)hF'_{j+1}.

The stored function :math:`F` depends on ``kind``: 0 — :math:`\log r`; 1 — :math:`r` (a lower bound that
reaches 0, so relative accuracy survives near the saturation kink); 2 — :math:`\log(-\log r)` (a lower bound
that never saturates, :math:`\approx \log\delta - x` as :math:`p \to 0`).  Left of the first knot the table
extrapolates linearly with the end slope (the stored functions are linear up to :math:`O(e^{x})` there),
right of the last knot it keeps the end value (:math:`1-p < e^{-680}`); a saturated side returns the exact
:math:`\log(1/p)` or :math:`-\infty`.  An upper bound is clamped to :math:`[0, -\log p]` (interpolation
noise of order 1e-20 near :math:`p = 1` must not give :math:`r_{up} < 1`).  ``log p`` is clamped to ≤ 0;
NaN in gives NaN out.
"""

from __future__ import annotations

import math

import numba
import numpy as np

__all__ = ["eval_log_numba", "eval_log_torch"]


@numba.njit(inline="always")
def _bound(x, log_p, knots, values, slopes, start, inv_width, kind, sat, upper):
    if upper and x >= sat:
        return -log_p  # saturated: r = 1/p
    if not upper and x <= sat:
        return -math.inf  # saturated: r = 0
    n = knots.shape[0]
    if x <= knots[0]:
        f = values[0] if slopes[0] == 0.0 else values[0] + slopes[0] * (x - knots[0])
    elif x >= knots[n - 1]:
        f = values[n - 1]
    else:
        # interval: a uniform bucket gives a first knot, then a short forward scan
        j = start[min(int((x - knots[0]) * inv_width), start.shape[0] - 1)]
        while knots[j + 1] < x:
            j += 1
        h = knots[j + 1] - knots[j]
        s = (x - knots[j]) / h
        s2 = s * s
        s3 = s2 * s
        f = (
            (2 * s3 - 3 * s2 + 1) * values[j]
            + (s3 - 2 * s2 + s) * h * slopes[j]
            + (3 * s2 - 2 * s3) * values[j + 1]
            + (s3 - s2) * h * slopes[j + 1]
        )
    if kind == 0:  # only upper bounds are stored as log r: 0 <= log r_up <= -log p
        return min(max(f, 0.0), -log_p)
    if kind == 1:
        return math.log(min(f, 1.0)) if f > 0.0 else -math.inf
    return -math.exp(f)


@numba.njit(parallel=True, cache=True)
def _kernel(log_p, lo, lo_kind, lo_sat, up, up_kind, up_sat, tol, out_lo, out_up):
    above = 0  # count of log p > tol (the caller raises)
    for i in numba.prange(log_p.shape[0]):
        lp = np.float64(log_p[i])
        if math.isnan(lp):
            out_lo[i] = math.nan
            out_up[i] = math.nan
            continue
        if lp > tol:
            above += 1
        lp = min(lp, 0.0)
        one_minus_p = -math.expm1(lp)  # 1 - p without cancellation near p = 1
        x = lp - math.log(one_minus_p) if one_minus_p > 0.0 else math.inf
        out_lo[i] = _bound(x, lp, lo[0], lo[1], lo[2], lo[3], lo[4], lo_kind, lo_sat, False)
        out_up[i] = _bound(x, lp, up[0], up[1], up[2], up[3], up[4], up_kind, up_sat, True)
    return above


def eval_log_numba(log_p: np.ndarray, lower, upper, out_dtype, tol: float) -> tuple[np.ndarray, np.ndarray, int]:
    """(log r_lo, log r_up, count of log p > tol) for a flat array; computed in float64, stored in ``out_dtype``.

    ``lower``/``upper`` are ``TabulatedBound``; the input is read in its own dtype (no float64 copy), so the
    only allocations are the two outputs.
    """
    out_lo = np.empty(log_p.shape, dtype=out_dtype)
    out_up = np.empty(log_p.shape, dtype=out_dtype)
    above = _kernel(
        log_p, _with_buckets(lower), lower.kind, lower.saturation_x, _with_buckets(upper), upper.kind,
        upper.saturation_x, tol, out_lo, out_up,
    )  # fmt: skip
    return out_lo, out_up, above


_BUCKETS = 8192


def _with_buckets(bound) -> tuple:
    """(knots, values, slopes, start, 1/width): ``start[b]`` is the interval holding the left end of uniform
    bucket b of the knot range, so a lookup is one multiply and a scan over the few knots inside a bucket."""
    k = bound.knots
    width = (k[-1] - k[0]) / _BUCKETS
    left = k[0] + width * np.arange(_BUCKETS)
    start = np.clip(np.searchsorted(k, left, side="right") - 1, 0, len(k) - 2).astype(np.int64)
    return k, bound.values, bound.slopes, start, 1.0 / width


def _torch_bound(torch, x, log_p, arrays, kind, sat, upper):
    knots, values, slopes = arrays
    n = knots.shape[0]
    j = (torch.searchsorted(knots, x) - 1).clamp(0, n - 2)
    x0, x1 = knots[j], knots[j + 1]
    h = x1 - x0
    s = ((x - x0) / h).clamp(0.0, 1.0)
    s2, s3 = s * s, s * s * s
    f = (
        (2 * s3 - 3 * s2 + 1) * values[j]
        + (s3 - 2 * s2 + s) * h * slopes[j]
        + (3 * s2 - 2 * s3) * values[j + 1]
        + (s3 - s2) * h * slopes[j + 1]
    )
    left = values[0] + torch.where(slopes[0] == 0, 0.0, slopes[0] * (x - knots[0]))
    f = torch.where(x <= knots[0], left, torch.where(x >= knots[-1], values[-1], f))
    if kind == 0:  # only upper bounds are stored as log r: 0 <= log r_up <= -log p
        y = torch.minimum(f.clamp(min=0.0), -log_p)
    elif kind == 1:
        y = torch.log(f.clamp(min=0.0, max=1.0))
    else:
        y = -torch.exp(f)
    if upper:
        return torch.where(x >= sat, -log_p, y)
    return torch.where(x <= sat, -math.inf, y)


def eval_log_torch(log_p, lower, upper, lower_arrays, upper_arrays, tol: float):
    """(log r_lo, log r_up) in float64 for a float64 tensor; no host synchronisation, so log p > ``tol``
    gives NaN instead of an error."""
    import torch

    lp = log_p.clamp(max=0.0)
    x = lp - torch.log(-torch.expm1(lp))  # log(1-p) = log(-expm1(log p)); p = 1 gives x = +inf
    lo = _torch_bound(torch, x, lp, lower_arrays, lower.kind, lower.saturation_x, upper=False)
    up = _torch_bound(torch, x, lp, upper_arrays, upper.kind, upper.saturation_x, upper=True)
    bad = torch.isnan(log_p) | (log_p > tol)
    return torch.where(bad, math.nan, lo), torch.where(bad, math.nan, up)
