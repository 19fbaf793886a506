r"""One bound to and from a table file's arrays and metadata, validated on the way in; the arguments and the
divergence a file names.

A reader trusts nothing: every grid is counted before it is built (no file can make it allocate more than its
own size), every kind, threshold and tail parameter is checked, and the generator is parsed by the safe grammar.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from ..divergences import Divergence, resolve
from ..divergences.grammar import parse, to_text
from .evaluate import MAX_LEVEL, octave_grid
from .formats import TableFileError
from .limits import L_RANGE
from .tabulated import (
    L_MIN_LOG,
    LOG_NEG_LOG_R,
    LOG_R,
    LOG_R_LOWER,
    METHOD,
    RATIO,
    TabulatedBound,
    grid_size,
    n_octaves,
)  # fmt: skip
from .threshold import NEAR_POWERS, SPLIT_LOWER, SPLIT_UPPER, NearPart, SplitBound

__all__ = [
    "bound_arrays",
    "bound_from_arrays",
    "bound_metadata",
    "builder_of",
    "check_delta",
    "check_near_grid",
    "check_target",
    "divergence_of",
    "split_doc",
    "split_from_arrays",
]  # fmt: skip


def builder_of(meta: dict[str, Any]) -> str:
    """The ``builder`` of a file's metadata (files written before it was recorded name the package version)."""
    if "builder" in meta:
        return str(meta["builder"])
    return f"bandcore {meta['bandcore_version']}"  # KeyError when neither: the readers report a missing field



def _edge(bound, side: str):
    if isinstance(bound, SplitBound):
        return bound.threshold
    if side == "lower":
        return bound.knots[-1] if bound.saturated_right else None
    return bound.knots[0] if bound.saturated_left else None


def bound_arrays(side: str, bound) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The arrays and the extra metadata of one bound (a split bound's near part and threshold; tail modes);
    a bound of the original kinds with no tail mode adds no metadata, so its file is unchanged."""
    far = bound.far if isinstance(bound, SplitBound) else bound
    arrays = {f"{side}_knots": far.knots, f"{side}_values": far.values, f"{side}_slopes": far.slopes,
              f"{side}_levels": far.levels.astype(np.float64)}  # fmt: skip
    meta: dict[str, Any] = {}
    if isinstance(bound, SplitBound):
        near = bound.near
        arrays.update({f"{side}_near_knots": near.knots, f"{side}_near_values": near.values,
                       f"{side}_near_slopes": near.slopes, f"{side}_near_levels": near.levels.astype(np.float64)})
        meta[f"{side}_threshold"] = [bound.star_hi, bound.star_lo]
        meta[f"{side}_gamma"] = bound.gamma
        if bound.near_power:
            meta[f"{side}_near_power"] = bound.near_power
    if far.left_tail is not None:
        meta[f"{side}_left_tail"] = list(far.left_tail)
    if far.right_tail is not None:
        meta[f"{side}_right_tail"] = list(far.right_tail)
        if far.right_linear:
            meta[f"{side}_right_tail_mode"] = "linear_r"
    return arrays, meta


SPLIT_DOC = (
    "kinds 4/5: split at the saturation threshold L* = threshold[0] + threshold[1]: far part (knots, values, "
    "slopes, levels) in L storing r (lower) or log r (upper); near part (near_*) in lambda = |L - L*| storing "
    "G = log u - gamma log(lambda), u = r (lower) or 1 - p r (upper). left_tail (C, beta): left of the first knot "
    "log r = C / (beta - log L); right_tail (K, nu): right of the last knot log r + log(log r + nu) = L + K"
)


def split_doc(linear_tail: bool, near_power: bool = False) -> str:
    """The metadata's description of split bounds and tails; the linear right tail and the near part storing
    u / lambda^k are described only in a file that has them (so that other files keep their bytes)."""
    power = "; where near_power is k (1 or 2), the near part stores H = u / lambda^k instead (gamma = k)"
    return (SPLIT_DOC + (", or r = K + nu L where right_tail_mode is linear_r" if linear_tail else "")
            + (power if near_power else ""))


def bound_metadata(lower: TabulatedBound, upper: TabulatedBound) -> dict[str, Any]:
    """The metadata describing the grid, the stored functions and the saturation of both bounds."""
    return {
        "coordinate": "L = -log(p)",
        "method": METHOD,
        "grid": "octave [2^e, 2^(e+1)) of L cut into 2^level equal cells; knots = a, grid points inside, b",
        "lower_kind": lower.kind,
        "upper_kind": upper.kind,
        "kinds": "0: log r, 1: r, 2: log(-log r), 3: log r (a lower bound)",
        "lower_saturated_at_or_above_L": _edge(lower, "lower"),
        "upper_saturated_at_or_below_L": _edge(upper, "upper"),
        "L_range": list(L_RANGE),
        "outside_knots": "saturated side: exact; else left: first value; right: linear in L with the end slope",
    }


def split_from_arrays(side, arrays, meta):
    """Read one bound of a 1-D file: a split bound (kinds 4, 5) or one of the original kinds, with its tails."""
    kind = int(meta[f"{side}_kind"])
    left = meta.get(f"{side}_left_tail")
    right = meta.get(f"{side}_right_tail")
    tails = {}
    for key, value in (("left_tail", left), ("right_tail", right)):
        if value is not None:
            if not (isinstance(value, list) and len(value) == 2 and all(isinstance(v, (int, float)) for v in value)
                    and all(math.isfinite(v) for v in value)):  # fmt: skip
                raise TableFileError(f"{side} {key} must be two finite numbers")
            tails[key] = (float(value[0]), float(value[1]))
    mode = meta.get(f"{side}_right_tail_mode")
    if mode is not None:
        if mode != "linear_r" or right is None:
            raise TableFileError(f"{side} right_tail_mode must be 'linear_r' and come with a right_tail, got {mode!r}")
        tails["right_linear"] = True
    if left is not None and side == "upper" and kind == SPLIT_UPPER:
        raise TableFileError("a split upper bound is saturated on the left: no left tail")
    if kind not in (SPLIT_LOWER, SPLIT_UPPER):
        bound = bound_from_arrays(side, arrays[f"{side}_knots"], arrays[f"{side}_values"], arrays[f"{side}_slopes"],
                                  arrays[f"{side}_levels"], meta, low=L_MIN_LOG if left is not None else None)
        return replace(bound, **tails) if tails else bound
    if kind != (SPLIT_LOWER if side == "lower" else SPLIT_UPPER):
        raise TableFileError(f"{side} kind {kind} is not valid for this bound")
    threshold, gamma = meta.get(f"{side}_threshold"), meta.get(f"{side}_gamma")
    if not (isinstance(threshold, list) and len(threshold) == 2 and isinstance(gamma, (int, float))):
        raise TableFileError(f"{side}: a split bound needs its threshold (two numbers) and gamma")
    star_hi, star_lo = float(threshold[0]), float(threshold[1])
    if not (L_RANGE[0] <= star_hi <= L_RANGE[1] and abs(star_lo) <= 2 * np.spacing(star_hi) and 0 < gamma < 100):
        raise TableFileError(f"{side}: invalid threshold {threshold!r} or gamma {gamma!r}")
    power = meta.get(f"{side}_near_power", 0)
    if power != 0 and not (type(power) is int and power in NEAR_POWERS and gamma == power):
        raise TableFileError(f"{side}_near_power must be one of {list(NEAR_POWERS)} and equal to gamma "
                             f"({gamma!r}), got {power!r}")
    sat = meta["lower_saturated_at_or_above_L" if side == "lower" else "upper_saturated_at_or_below_L"]
    if sat is None or float(sat) != star_hi:
        raise TableFileError(f"{side} saturation threshold {sat!r} is not the split bound's threshold")
    far_kind = RATIO if side == "lower" else LOG_R
    far_meta = {f"{side}_kind": far_kind, "lower_saturated_at_or_above_L": None,
                "upper_saturated_at_or_below_L": None}  # fmt: skip
    far = bound_from_arrays(side, arrays[f"{side}_knots"], arrays[f"{side}_values"], arrays[f"{side}_slopes"],
                            arrays[f"{side}_levels"], far_meta, low=L_MIN_LOG if left is not None else None)
    far = replace(far, **tails) if tails else far
    nk = arrays[f"{side}_near_knots"]
    nl = check_near_grid(side, nk, arrays[f"{side}_near_levels"])
    nv, ns = arrays[f"{side}_near_values"], arrays[f"{side}_near_slopes"]
    if nv.shape != nk.shape or ns.shape != nk.shape:
        raise TableFileError(f"{side} near values/slopes do not match its near knots")
    m = far.knots[-1] if side == "lower" else far.knots[0]
    if m != (star_hi / 2 if side == "lower" else min(2 * star_hi, L_RANGE[1] / 2)):
        raise TableFileError(f"{side}: the far part does not end at the split point")
    return SplitBound(far, NearPart(nk, nv, ns, nl), kind, star_hi, star_lo, float(gamma), power)


def check_near_grid(side: str, nk: np.ndarray, nl: np.ndarray) -> np.ndarray:
    """Validate a near part's knots (in λ) and octave levels read from a file; the levels as integers."""
    if nk.ndim != 1 or len(nk) < 2 or np.any(np.diff(nk) <= 0) or not (0 < nk[0] and nk[-1] <= L_RANGE[1]):
        raise TableFileError(f"{side} near knots must be positive, strictly increasing and at most {L_RANGE[1]}")
    if nl.ndim != 1 or not (np.all(nl == np.round(nl)) and np.all((nl >= 0) & (nl <= MAX_LEVEL))):
        raise TableFileError(f"{side} near levels must be integers in [0, {MAX_LEVEL}]")
    nl = nl.astype(np.int64)
    if len(nl) != n_octaves(nk[0], nk[-1]) or grid_size(nk[0], nk[-1], nl) != len(nk):
        raise TableFileError(f"{side} near levels do not describe its near knots")
    if not np.array_equal(octave_grid(nk[0], nk[-1], nl), nk):
        raise TableFileError(f"{side} near knots are not the octave grid of their levels")
    return nl


def bound_from_arrays(side, knots, values, slopes, levels, meta, low=None) -> TabulatedBound:
    """Validate one bound read from a file (grid, shapes, kind, saturation) and rebuild it; the grid is
    counted before it is built, so no file can make the reader allocate more than its own size."""
    kind = int(meta[f"{side}_kind"])
    sat = meta["lower_saturated_at_or_above_L" if side == "lower" else "upper_saturated_at_or_below_L"]
    if knots.ndim != 1 or len(knots) < 2 or np.any(np.diff(knots) <= 0) or knots[0] <= 0:
        raise TableFileError(f"{side} knots must be positive and strictly increasing with at least 2 entries")
    if knots[0] < (L_RANGE[0] if low is None else low) or knots[-1] > L_RANGE[1]:
        raise TableFileError(f"{side} knots leave the tabulated range L in {list(L_RANGE)}")
    if values.shape != knots.shape or slopes.shape != knots.shape:
        raise TableFileError(f"{side} values/slopes do not match its knots")
    if levels.ndim != 1 or not (np.all(levels == np.round(levels)) and np.all((levels >= 0) & (levels <= MAX_LEVEL))):
        raise TableFileError(f"{side} levels must be integers in [0, {MAX_LEVEL}]")
    levels = levels.astype(np.int64)
    if len(levels) != n_octaves(knots[0], knots[-1]):
        raise TableFileError(f"{side} has {len(levels)} octave levels for {n_octaves(knots[0], knots[-1])} octaves")
    if grid_size(knots[0], knots[-1], levels) != len(knots):
        raise TableFileError(f"{side} levels describe a grid of {grid_size(knots[0], knots[-1], levels)} knots, "
                             f"the file holds {len(knots)}")  # fmt: skip
    if not np.array_equal(octave_grid(knots[0], knots[-1], levels), knots):
        raise TableFileError(f"{side} knots are not the octave grid of their levels")
    if kind not in ((LOG_R,) if side == "upper" else (RATIO, LOG_NEG_LOG_R, LOG_R_LOWER)):
        raise TableFileError(f"{side} kind {kind} is not valid for this bound")
    edge = knots[-1] if side == "lower" else knots[0]
    if sat is not None and float(sat) != edge:
        raise TableFileError(f"{side} saturation threshold {sat!r} is not the end of its knots")
    return TabulatedBound(knots, values, slopes, levels, kind, sat is not None and side == "upper",
                          sat is not None and side == "lower")  # fmt: skip


def check_delta(delta) -> float:
    if isinstance(delta, bool) or not isinstance(delta, (int, float, np.floating, np.integer)):
        raise TypeError(f"delta must be a positive number, got {delta!r}")
    value = float(delta)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"delta must be finite and > 0, got {delta!r}")
    return value


def check_target(target) -> None:
    if not (isinstance(target, (int, float)) and 1e-14 <= target < 1):
        raise ValueError(f"target must be a number in [1e-14, 1), got {target!r}")


def canonical_formula(generator: str) -> str:
    """The grammar's canonical spelling of a stored generator (files before the grammar wrote ``Abs``)."""
    return to_text(parse(generator.replace("Abs(", "abs(")))


def divergence_of(name: str, generator: str) -> Divergence:
    """The divergence a file describes: its name when that names the stored generator, else the generator
    itself (parsed by the safe grammar: no Python is evaluated).  A catalogue name over another generator is
    refused: the label and the contents disagree."""
    formula = canonical_formula(generator)
    try:
        div = resolve(name)
    except (ValueError, TypeError):
        div = None
    if div is not None and div.formula == formula:
        return div
    if div is not None and div.is_catalogue:
        raise TableFileError(f"the table is labelled {name!r} (f = {div.formula}) but stores the generator {formula}")
    return Divergence.from_expression(formula, name=name)
