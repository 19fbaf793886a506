r"""A table over :math:`(p, \delta)` to and from a file's arrays and metadata, validated on the way in
(:data:`SPLIT_2D_DOC` describes the δ-pieces of a saturating bound)."""

from __future__ import annotations

import numpy as np

from .bound_io import bound_from_arrays, check_delta, check_near_grid
from .chebyshev import Surface
from .formats import TableFileError
from .limits import MAX_NODES
from .split2d import SplitSurface
from .tabulated import L_MIN_LOG, LOG_R, RATIO, RIGHT_LINEAR, n_octaves
from .threshold import SPLIT_LOWER, SPLIT_UPPER

__all__ = ["SPLIT_2D_DOC", "check_range", "split_surfaces_from_arrays", "surface_arrays", "surface_from_arrays",
           "surface_size", "tails_of"]  # fmt: skip


SPLIT_2D_DOC = (
    "kinds 4/5: a saturating bound in delta-pieces; pieces[i] = (u0, u1, n, far knots, near knots): on u in [u0, u1] "
    "the Chebyshev variable is v = (2u - u0 - u1) / (u1 - u0), its far part (knots, levels, coef_*: next far-knots "
    "columns, first n rows) in L stores r (lower) or log r (upper), its near part (near_*) in lambda = |L - L*(delta)| "
    "stores G = log u - gamma log(lambda) (u = r or 1 - p r); L*(delta) is recomputed for each delta (50 digits). "
    "tails (left, right): logarithmic tail modes, fitted at each delta to the 50-digit oracle as in 1-D tables"
)


def surface_size(surface) -> int:
    return surface.coef_values.size if isinstance(surface, Surface) else sum(p.size for p in surface)


def surface_arrays(prefix: str, *surfaces: Surface) -> dict[str, np.ndarray]:
    """The arrays of one or more surfaces, concatenated along the knots (coefficients padded with zero rows)."""
    n = max(len(s.coef_values) for s in surfaces)

    def padded(c):
        return np.concatenate([c, np.zeros((n - len(c), c.shape[1]))])

    return {f"{prefix}_knots": np.concatenate([s.knots for s in surfaces]),
            f"{prefix}_levels": np.concatenate([s.levels for s in surfaces]).astype(np.float64),
            f"{prefix}_coef_values": np.concatenate([padded(s.coef_values) for s in surfaces], axis=1),
            f"{prefix}_coef_slopes": np.concatenate([padded(s.coef_slopes) for s in surfaces], axis=1)}  # fmt: skip


def tails_of(side: str, meta) -> tuple[bool, int]:
    """A bound's tail modes (logarithmic left tail, right tail mode) from a file's metadata (absent: none); the
    right mode is false, true (:data:`~bandcore.tables.tabulated.RIGHT_LOG`) or 2
    (:data:`~bandcore.tables.tabulated.RIGHT_LINEAR`)."""
    tails = meta.get(f"{side}_tails", [False, False])
    if not (isinstance(tails, list) and len(tails) == 2 and isinstance(tails[0], bool)
            and (isinstance(tails[1], bool) or (type(tails[1]) is int and tails[1] == RIGHT_LINEAR))):  # fmt: skip
        raise TableFileError(f"{side} tails must be a boolean and a boolean or {RIGHT_LINEAR}")
    if tails[1] and side == "lower":
        raise TableFileError("a lower bound has no right tail mode")
    return bool(tails[0]), int(tails[1])


def surface_from_arrays(side, knots, levels, cv, cs, meta, kind, tails=(False, False), near=False) -> Surface:
    """One surface read from a file: its grid validated (a near part's in λ), coefficients matching the knots."""
    if cv.ndim != 2 or cv.shape != cs.shape or cv.shape[1] != len(knots) or not 2 <= len(cv) <= MAX_NODES:
        raise TableFileError(f"{side}: coefficient arrays do not match the knots")
    if near:
        return Surface(knots, check_near_grid(side, knots, levels), cv, cs, kind)
    bound = bound_from_arrays(side, knots, cv[0], cs[0], levels, meta, low=L_MIN_LOG if tails[0] else None)
    return Surface(bound.knots, bound.levels, cv, cs, kind, tails)


def split_surfaces_from_arrays(side: str, kind: int, arrays, meta) -> tuple[SplitSurface, ...]:
    """The δ-pieces of a saturating bound read from a file (:data:`SPLIT_2D_DOC`)."""
    if kind != (SPLIT_LOWER if side == "lower" else SPLIT_UPPER):
        raise TableFileError(f"{side} kind {kind} is not valid for this bound")
    rows, gamma = meta.get(f"{side}_pieces"), meta.get(f"{side}_gamma")
    if not (isinstance(rows, list) and rows and all(isinstance(r, list) and len(r) == 5 for r in rows)
            and isinstance(gamma, (int, float)) and 0 < gamma < 100):  # fmt: skip
        raise TableFileError(f"{side}: a split 2-D bound needs its pieces (5 numbers each) and gamma")
    far_kind = RATIO if side == "lower" else LOG_R
    far_meta = {f"{side}_kind": far_kind, "lower_saturated_at_or_above_L": None, "upper_saturated_at_or_below_L": None}
    start = {side: [0, 0], f"{side}_near": [0, 0]}  # next knot and next level of each concatenation
    out, u_end = [], -1.0
    for u0, u1, n, *counts in rows:
        if not (u0 == u_end and u0 < u1 <= 1.0):
            raise TableFileError(f"{side}: the delta-pieces do not tile [-1, 1]")
        parts = []
        for prefix, count in zip(start, counts, strict=True):
            k, lev = start[prefix]
            cols = slice(k, k + int(count))
            knots = arrays[f"{prefix}_knots"][cols]
            if len(knots) < 2 or not np.all(knots > 0):
                raise TableFileError(f"{prefix}: a piece needs at least 2 positive knots")
            levels = arrays[f"{prefix}_levels"][lev:lev + n_octaves(knots[0], knots[-1])]
            cv, cs = arrays[f"{prefix}_coef_values"][: int(n), cols], arrays[f"{prefix}_coef_slopes"][: int(n), cols]
            tails = tails_of(side, meta) if prefix == side else (False, False)
            parts.append(surface_from_arrays(side, knots, levels, cv, cs, far_meta, far_kind, tails, prefix != side))
            start[prefix] = [k + int(count), lev + len(levels)]
        out.append(SplitSurface(parts[0], parts[1], kind, float(gamma), (float(u0), float(u1))))
        u_end = u1
    if u_end != 1.0 or any([len(arrays[f"{p}_knots"]), len(arrays[f"{p}_levels"])] != start[p] for p in start):
        raise TableFileError(f"{side}: the delta-pieces do not cover the stored arrays")
    return tuple(out)

def check_range(delta_range) -> tuple[float, float]:
    if not isinstance(delta_range, (tuple, list)) or len(delta_range) != 2:
        raise ValueError(f"delta range must be (lo, hi), got {delta_range!r}")
    lo, hi = (check_delta(d) for d in delta_range)
    if not lo < hi:
        raise ValueError(f"delta range must have lo < hi, got {delta_range!r}")
    return lo, hi

