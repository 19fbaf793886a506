r"""Building a bound split at its saturation threshold (kinds 4 and 5, :mod:`bandcore.tables.threshold`).

The far part is refined in :math:`L` as a plain bound; the near part stores :math:`G = \log u - \gamma\log\lambda`
(or :math:`H = u/\lambda^k` where γ is within ½ of k = 1 or 2, :func:`~bandcore.tables.threshold.near_power_of`)
on octave cells of :math:`\lambda = |L - L^*|`, with values and slopes from the float64 solver above
:math:`\lambda =` :data:`~bandcore.tables.threshold.TRUST` :math:`L^*` and from the 50-digit solve below it; the
certificate's exact values near :math:`L^*` come from the same solve (:func:`exact_bound_log`).
"""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np

from .evaluate import MAX_LEVEL, octave_grid
from .limits import L_RANGE, MAX_KNOTS
from .pieces import pieces
from .tabulated import (
    CHECK_S,
    L_MIN_LOG,
    LOG_R,
    RATIO,
    TabulatedBound,
    TargetNotReached,
    cell_octaves,
    exact_solver,
    grid_size,
    n_octaves,
    rel_log_error,
    stored,
)  # fmt: skip
from .tails import TailError, tail_error, with_tails
from .threshold import (
    DPS,
    SPLIT_LOWER,
    SPLIT_UPPER,
    TRUST,
    NearPart,
    SplitBound,
    gamma_of,
    near_exact,
    near_power_of,
    near_range,
    threshold_dd,
)  # fmt: skip

__all__ = ["build_split_bound", "exact_bound_log", "near_samples"]


def exact_bound_log(bound, div, delta, index, L, solve=None, cache=None) -> np.ndarray:
    """Exact log r of one bound at float64 ``L``: the float64 solver, except within :data:`TRUST` L* of a split
    bound's threshold, where it is not exact, the 50-digit solve (:mod:`bandcore.tables.threshold`)."""
    solve = solve or exact_solver()
    L = np.asarray(L, dtype=np.float64)
    out = np.array(solve(-L, div, delta)[index], dtype=np.float64)
    if not isinstance(bound, SplitBound):
        return out
    side = "upper" if index else "lower"
    with np.errstate(all="ignore"):
        tight = np.flatnonzero((bound.lam_of(L) < TRUST * bound.star_hi) & (bound.lam_of(L) > 0))
    cache = {} if cache is None else cache
    todo = [i for i in tight if float(L[i]) not in cache]
    if todo:
        with np.errstate(all="ignore"):
            guess = out[todo] if side == "lower" else np.log(-np.expm1(out[todo] - L[todo]))
        t, _ = near_exact(div, delta, side, [float(L[i]) for i in todo], guess)
        for i, tv in zip(todo, t, strict=True):
            cache[float(L[i])] = tv if side == "lower" else float(L[i]) + math.log1p(-math.exp(tv))
    for i in tight:
        out[i] = cache[float(L[i])]
    return out


def near_samples(div, delta, side, star, b, gamma, lam, solve, cache, power=0) -> tuple[np.ndarray, np.ndarray]:
    r"""(G, dG/dλ) of a split bound's near part at the λ in ``lam`` (:mod:`bandcore.tables.threshold`), for the
    threshold ``star`` (mpf; ``b`` its saturated float): the float64 solver at :math:`L = L^* \mp \lambda`
    above λ = :data:`TRUST` b, the 50-digit solve below; ``cache`` maps λ to (log u, d log u/dλ) (nested grids
    share their knots).  With ``power`` k (1 or 2; ``gamma`` is then k): (H, dH/dλ), H = e^G = u/λ^k."""
    index = 1 if side == "upper" else 0
    sign = -1.0 if side == "lower" else 1.0  # d lambda / dL
    trust = TRUST * b
    parts = pieces(div)

    def float_y(L):
        return np.asarray(solve(-np.asarray(L, dtype=np.float64), div, delta)[index], dtype=np.float64)

    todo = np.array([x for x in lam if float(x) not in cache], dtype=np.float64)
    if todo.size:
        precise = todo < trust
        wide = todo[~precise]
        if wide.size:
            with mp.workdps(DPS):
                L = np.asarray([float(star + sign * mp.mpf(x)) for x in wide])
            y = float_y(L)
            with np.errstate(all="ignore"):
                dy = parts.slope_in_L(L, y)
                if side == "lower":
                    t, dt = y, dy
                else:
                    u = -np.expm1(y - L)
                    t, dt = np.log(u), -np.exp(y - L) * (dy - 1.0) / u
            for x, tv, dv in zip(wide, t, dt, strict=True):
                cache[float(x)] = (float(tv), float(dv))
        tight = todo[precise]
        if tight.size:
            with mp.workdps(DPS):
                L_mp = [star + sign * mp.mpf(x) for x in tight]
            L_f = np.array([float(x) for x in L_mp])
            y = float_y(L_f)
            with np.errstate(all="ignore"):
                guess = y if side == "lower" else np.log(-np.expm1(y - L_f))
            t, dt = near_exact(div, delta, side, L_mp, guess)
            for x, tv, dv in zip(tight, t, dt, strict=True):
                cache[float(x)] = (float(tv), float(dv))
    t = np.array([cache[float(x)][0] for x in lam])
    dt = np.array([cache[float(x)][1] for x in lam])
    g, dg = t - gamma * np.log(lam), sign * dt - gamma / lam
    if power:
        h = np.exp(g)
        return h, h * dg
    return g, dg


def build_split_bound(div, delta, side, target, solve, bar, threshold, left_log=False,
                      right_mode=0) -> tuple[SplitBound, float, int]:  # fmt: skip
    """One bound split at its saturation threshold: far part in L, near part in lambda = |L - L*| (see
    :mod:`bandcore.tables.threshold`), each octave refined until its error is below half the target."""
    parts = pieces(div)
    index = 1 if side == "upper" else 0
    kind = SPLIT_LOWER if side == "lower" else SPLIT_UPPER
    star, star_lo, lam0 = threshold_dd(div, delta, side, threshold)
    measured = gamma_of(div, delta, side, star)
    power = near_power_of(measured)
    gamma = float(power) if power else measured
    m, lam0, lam_m = near_range(kind, threshold, star_lo, lam0)
    far_a, far_b = (L_MIN_LOG if left_log else L_RANGE[0], m) if side == "lower" else (m, L_RANGE[1])
    far_kind = RATIO if side == "lower" else LOG_R
    near_cache: dict[float, tuple[float, float]] = {}
    exact_cache: dict[float, float] = {}

    def float_y(L):
        return np.asarray(solve(-np.asarray(L, dtype=np.float64), div, delta)[index], dtype=np.float64)

    def near_values(lam):
        return near_samples(div, delta, side, star, threshold, gamma, lam, solve, near_cache, power)

    def exact_at(L, bound):
        return exact_bound_log(bound, div, delta, index, L, solve, exact_cache)

    far_levels = np.zeros(n_octaves(far_a, far_b), dtype=np.int64)
    near_levels = np.zeros(n_octaves(lam0, lam_m), dtype=np.int64)
    while True:
        far_knots = octave_grid(far_a, far_b, far_levels)
        fv, fs = stored(far_kind, far_knots, float_y(far_knots), parts)
        far = TabulatedBound(far_knots, fv, fs, far_levels.copy(), far_kind)
        near_knots = octave_grid(lam0, lam_m, near_levels)
        nv, ns = near_values(near_knots)
        if not all(np.all(np.isfinite(v)) for v in (fv, fs, nv, ns)):
            raise ValueError(f"{div.name} {side} bound: non-finite value or slope near the threshold")
        near = NearPart(near_knots, nv, ns, near_levels.copy())
        bound = SplitBound(far, near, kind, threshold, star_lo, gamma, power)
        xs = far.check_points(CHECK_S).ravel()
        far_err = rel_log_error(bound.log(xs), float_y(xs)).reshape(len(far_knots) - 1, -1).max(axis=1)
        lam = near_knots[:-1, None] + np.diff(near_knots)[:, None] * CHECK_S
        L = bound.to_L(lam.ravel())
        near_err = rel_log_error(bound.log(L), exact_at(L, bound)).reshape(len(near_knots) - 1, -1).max(axis=1)
        far_oct, near_oct = np.zeros(len(far_levels)), np.zeros(len(near_levels))
        np.maximum.at(far_oct, cell_octaves(far_knots), far_err)
        np.maximum.at(near_oct, cell_octaves(near_knots), near_err)
        worst = max(float(far_err.max()), float(near_err.max()))
        if bar is not None:
            bar.set_postfix_str(f"{side}: {len(far_knots)} + {len(near_knots)} knots, max err {worst:.1e}")
            bar.update(1)
        far_fail, near_fail = far_oct > target / 2, near_oct > target / 2
        if not (far_fail.any() or near_fail.any()):
            break
        far_levels, near_levels = far_levels + far_fail, near_levels + near_fail
        size = grid_size(far_a, far_b, far_levels) + grid_size(lam0, lam_m, near_levels)
        if max(far_levels.max(), near_levels.max()) > MAX_LEVEL or size > MAX_KNOTS:
            raise TargetNotReached(
                f"{div.name} {side} bound at delta={delta}: target {target:g} not reached with {MAX_KNOTS} "
                f"knots split at the threshold (max error {worst:.2e}); pass a larger target"
            )
    far = with_tails(far, div, delta, index, left_log, right_mode)
    bound = SplitBound(far, bound.near, kind, threshold, star_lo, gamma, power)
    tail = tail_error(bound, div, delta, index)
    if tail > target / 2:
        raise TailError(f"{div.name} {side} bound at delta={delta}: tail error {tail:.2e} above the target")
    checked = (far_err.size + near_err.size) * len(CHECK_S) + len(bound.tails())
    return bound, max(worst, tail), checked

