r"""Seed tables: the solvers' starting points, one small lookup table per (divergence, δ).

A generic solver's table tabulates :math:`F(L) = \log w`, :math:`w = 1/(e^d - 1)`, at the upper root of the token
:math:`p = e^{-L}`, where :math:`d = \operatorname{logit} q - \operatorname{logit} p = \log r - \log s` is the
root's offset in the logit (:mod:`.solvers`).  The lower root of a token is the upper root of its mirror
:math:`1 - p`, so one column seeds both: the upper root at :math:`L = -\log p`, the lower at
:math:`L = -\log(1-p)`.

KL's table has two columns on the same cells, both read at :math:`L = -\log p` (one cell per token, and no
:math:`\log(1 - p)` to compute): :math:`F_{up} = \log s` at the upper root, and :math:`F_{lo} = p \log r_{lo}` at
the lower one (:math:`\log r_{lo} \approx -\delta/p` for :math:`p \ll \delta` grows like :math:`e^L`, which no
cubic in L follows; :math:`p \log r_{lo} \to -\delta`).  KL's seeded pass solves in :math:`\log s`
(:func:`.solvers.seeded.kl_polish`); :math:`\log r_{lo}` is the :math:`\log s` of the mirror's upper root.

**Grid.** :math:`L \in [2^{-40}, 704]` (:math:`p` from :math:`1 - 10^{-12}` down to :math:`e^{-704}`), every
octave cut into :math:`2^7` cells (:mod:`.grid`, 6,320 cells; 304 KB, KL's 507 KB), cubic Hermite
(:mod:`.lookup`).  Values come from the unseeded solver itself; slopes from implicit differentiation of
:math:`G(d, \theta_p) = \delta`:

.. math::  \frac{d \log w}{dL} = (1 + w)\,\frac{dd/d\theta_p}{1 - p}, \qquad
           \frac{d \log s}{d\theta_p} = p - q\Bigl(1 + \frac{dd}{d\theta_p}\Bigr), \qquad
           \frac{dd}{d\theta_p} = -\frac{\partial_\theta G}{\partial_d G}

(:math:`d \log w/dd = -(1 + w)`, :math:`d\theta_p/dL = -1/(1-p)`, the mirror's :math:`+1/(1-p)`).  KL has
:math:`dd/d\theta_p = d(1-p)/(r-1) - 1` in closed form; every other generator takes :math:`\partial_\theta G` by a
central difference at fixed :math:`d` (relative error ~1e-10, enough for a seed).  A knot whose root saturates or
did not converge is NaN, and so is every cell next to it: those tokens start from the solver's own start instead.

**Saturation.**  The upper root of p = e^-L saturates (r = 1/p) iff :math:`G(\infty) = p f(1/p) + (1-p) f(0)
\le \delta`, and :math:`G(\infty)` is non-increasing in p (its derivative :math:`f(1/p) - f'(1/p)/p - f(0)
\le 0` by convexity), so saturation is :math:`L \le L^*`.  :func:`saturation_band` finds :math:`L^*` once by
bisection on the solver's own :math:`G(\infty)` and stores ``fm[SEED_SATURATED_TO] = L^*(1 - 10^{-9})``,
``fm[SEED_UNDECIDED_TO] = L^*(1 + 10^{-9})`` with the table (:mod:`.slots`): the seed is -inf (w = 0, d = ∞:
saturated) up to the first and NaN in the band between them, whose tokens the safeguarded solver decides with
:math:`G(\infty)` itself.  (If the
floating-point :math:`G(\infty)` contradicts the band at any knot, the band is everything.)

A seed is only a start: the solver finishes every token with its own convergence test (the generic Newton:
away from thresholds the seed is within ~1e-10, so the first Newton step already passes it) or one Newton step
whose accuracy the tests check against the oracle (KL, where the seed errs by < 1e-7 relative at δ = 1e-8 and by
< 4e-10 from δ = 0.05 on).
The seed tables of generic plans are cached on disk (``.npz``, no pickle; folder ``seeds`` of
:mod:`bandcore._cache`), keyed by the plan's formula and ``seed_key``, δ, the grid and the solver source, so a
second process starts fast and never reads a table of other functions; a file that does not load as such a
table (truncated, damaged) is computed and written again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import io
import math
import zipfile
from functools import lru_cache
from types import ModuleType

import numpy as np

from .._cache import read_bytes, write_atomic
from ..plan import SolverPlan
from . import solvers as _reference
from .grid import KernelBound, octave_grid, octave_of, pack
from .slots import LOG_R, SEED_SATURATED_TO, SEED_UNDECIDED_TO

__all__ = ["NO_SEED", "SEED_LEVEL", "SEED_RANGE", "saturation_band", "seed_knots", "seed_table", "seed_values"]

SEED_RANGE = (2.0**-40, 704.0)
SEED_LEVEL = 7
#: relative step of the central difference in theta
FD_STEP = 1e-6
#: a table that seeds nothing (its range is empty, its saturation band everything): every token takes the
#: solver's own start
#: Relative margin of the saturation band around the threshold (:func:`saturation_band`).
SATURATION_MARGIN = 1e-9
NO_SEED = KernelBound(  # range (a, b) = (inf, -inf): empty; band (SEED_SATURATED_TO, SEED_UNDECIDED_TO): all of L
    fmeta=np.array([math.inf, -math.inf, math.nan, math.nan, 0.0, -math.inf, math.inf]),
    imeta=np.zeros(4, dtype=np.int64),
    off=np.zeros(1, dtype=np.int64), levels=np.zeros(1, dtype=np.int64), cells=np.full((1, 6), math.nan),
)  # fmt: skip


def seed_knots() -> tuple[np.ndarray, np.ndarray]:
    """(knots, levels) of every seed table (exact binary fractions: the same bits on every machine)."""
    a, b = SEED_RANGE
    levels = np.full(octave_of(b) - octave_of(a) + 1, SEED_LEVEL, dtype=np.int64)
    return octave_grid(a, b, levels), levels


def _token(theta: np.ndarray) -> tuple[np.ndarray, ...]:
    lp, lq = -np.logaddexp(0.0, -theta), -np.logaddexp(0.0, theta)  # log sigma(theta), log(1 - sigma(theta))
    return lp, lq, np.exp(lp), np.exp(lq)


def _generic_offsets(module: ModuleType, L: np.ndarray, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """(d, dd/dtheta_p) at the upper root of p = e^-L of a generic solver (NaN where saturated or not converged)."""
    lp = -L
    lq = np.log(-np.expm1(lp))
    p, pc = np.exp(lp), np.exp(lq)
    log_r, log_s, saturated, done = module.upper_root(lp, lq, delta, lp * np.nan)
    d = np.where(done & ~saturated, log_r - log_s, np.nan)
    theta = lp - lq
    h = FD_STEP * np.maximum(1.0, np.abs(theta))
    g_plus = module.g_and_slope(*_token(theta + h), d)[0]
    g_minus = module.g_and_slope(*_token(theta - h), d)[0]
    slope = module.g_and_slope(lp, lq, p, pc, d)[1]
    return d, -(g_plus - g_minus) / (2.0 * h) / slope


def _log_s_slope(p, pc, log_r, log_s, dtheta_dL):
    """d log s/dL at the KL upper root (log r, log s) of the token p (1 - p = ``pc``), whose logit moves by
    ``dtheta_dL`` per unit of L: with dd/dθ_p = d(1-p)/(r-1) - 1 (closed form) and log s = log(1 - q) - log(1 - p),
    d log s/dθ_p = p - q(1 + dd/dθ_p) = p (1 - d (1-p) r/(r-1)), r/(r-1) = 1/(1 - e^-log r) (finite where r
    overflows)."""
    d = log_r - log_s
    return p * (1.0 - d * pc / -np.expm1(-log_r)) * dtheta_dL


def _kl_columns(module: ModuleType, L: np.ndarray, delta: float) -> list[tuple[np.ndarray, np.ndarray]]:
    """[(log s, d log s/dL) at the upper root, (p log r_lo, d(p log r_lo)/dL) at the lower root] of the KL token
    p = e^-L (module docstring); dθ_p/dL = -1/(1-p), and the mirror's logit moves the other way."""
    lp = -L
    lq = np.log(-np.expm1(lp))
    p, pc = np.exp(lp), -np.expm1(lp)
    log_r, log_s = module.kl_upper_root(lp, lq, delta)
    up = (log_s, _log_s_slope(p, pc, log_r, log_s, -1.0 / pc))
    log_r, log_lo = module.kl_upper_root(lq, lp, delta)  # the mirror 1 - p: its log s is log r_lo
    lo_slope = -p * log_lo + p * _log_s_slope(pc, p, log_r, log_lo, 1.0 / pc)  # d(p σ)/dL, dp/dL = -p
    return [up, (p * log_lo, lo_slope)]


def _generic_column(module: ModuleType, L: np.ndarray, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """(log w, d log w/dL) at the upper root of the token p = e^-L of a generic solver: dF/dL =
    (1 + w)(dd/dθ_p)/(1 - p) (module docstring)."""
    d, dd_dtheta = _generic_offsets(module, L, delta)
    log_w = -d - np.log(-np.expm1(-d))
    return log_w, (1.0 + np.exp(log_w)) * dd_dtheta / -np.expm1(-L)


def seed_values(module: ModuleType, kind: str, delta: float) -> list[tuple[np.ndarray, np.ndarray]]:
    """The columns (F, dF/dL) at the :func:`seed_knots` for ``module``'s solver (``kind`` "kl" or "generic") at
    ``delta``: KL's two (:func:`_kl_columns`), a generic solver's one (log w); NaN where not finite."""
    knots, _ = seed_knots()
    with np.errstate(all="ignore"):
        columns = _kl_columns(module, knots, delta) if kind == "kl" else [_generic_column(module, knots, delta)]
    for values, slopes in columns:
        bad = ~(np.isfinite(values) & np.isfinite(slopes))
        values[bad] = np.nan
        slopes[bad] = np.nan
    return columns


@lru_cache(maxsize=1)
def _source_digest() -> str:
    return hashlib.sha256("".join(inspect.getsource(part) for part in _reference.PARTS).encode()).hexdigest()[:16]


#: Cache folder of the seed tables
SEEDS_FOLDER = "seeds"


def _file_name(plan: SolverPlan, delta: float) -> str:
    # keyed by the generated functions too: a table from another version of them is never read
    key = f"{plan.formula}|{delta!r}|{SEED_RANGE}|{SEED_LEVEL}|{_source_digest()}|{plan.seed_key}"
    return f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.npz"


def _read(name: str, n: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(values, slopes) of the cached table ``name``, or None where it is missing or is not one (damaged)."""
    data = read_bytes(SEEDS_FOLDER, name)
    if data is None:
        return None
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as table:
            values, slopes = table["values"], table["slopes"]
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile):
        return None
    ok = all(a.dtype == np.float64 and a.shape == (n,) for a in (values, slopes))
    return (values, slopes) if ok else None


def _write(name: str, values: np.ndarray, slopes: np.ndarray) -> None:
    buffer = io.BytesIO()
    np.savez(buffer, values=values, slopes=slopes)
    try:
        write_atomic(SEEDS_FOLDER, name, buffer.getvalue())
    except OSError:
        pass  # an unwritable cache only costs the rebuild


def saturation_band(module: ModuleType, kind: str, delta: float) -> tuple[float, float]:
    """(lo, hi): the upper root of the token p = e^-L saturates where L <= lo and not where L > hi (module
    docstring); (-inf, -inf) for KL, which never saturates."""
    if kind != "generic":
        return -math.inf, -math.inf

    def saturated(L: np.ndarray) -> np.ndarray:
        lq = np.log(-np.expm1(-L))
        return module.g_at_infinity(-L, lq, np.exp(lq)) <= delta

    with np.errstate(all="ignore"):
        t_in, t_out = math.log(1e-300), math.log(1e300)  # bisection in log L
        if not saturated(np.array([1e-300]))[0]:
            lo, hi = -math.inf, 1e-300
        elif saturated(np.array([1e300]))[0]:
            lo, hi = 1e300, math.inf
        else:
            for _ in range(200):
                t = 0.5 * (t_in + t_out)
                t_in, t_out = (t, t_out) if saturated(np.array([math.exp(t)]))[0] else (t_in, t)
            lo, hi = math.exp(t_in) * (1 - SATURATION_MARGIN), math.exp(t_out) * (1 + SATURATION_MARGIN)
        knots = np.concatenate([seed_knots()[0], np.geomspace(1e-300, 1e300, 2001)])
        verdict = saturated(knots)
    if not (np.all(verdict[knots <= lo]) and not np.any(verdict[knots > hi])):
        return -math.inf, math.inf  # G(inf) not monotone in floating point: every token asks G(inf) itself
    return lo, hi


def seed_table(module: ModuleType, plan: SolverPlan, delta: float) -> KernelBound:
    """The seed table of :func:`seed_values` for ``plan`` with its NumPy solver ``module``; for a generic plan read
    from (or written to) the cache on disk."""
    knots, levels = seed_knots()
    band = saturation_band(module, plan.kind, delta)
    name = _file_name(plan, delta) if plan.kind == "generic" else None
    cached = _read(name, len(knots)) if name is not None else None
    if cached is not None:
        return _pack(knots, [cached], levels, band)
    columns = seed_values(module, plan.kind, delta)
    if name is not None:
        _write(name, *columns[0])
    return _pack(knots, columns, levels, band)


def _pack(knots, columns, levels, band: tuple[float, float]) -> KernelBound:
    """The seed table's arrays: :func:`.grid.pack`'s for the first column (values, slopes), each further column's
    four cubic coefficients appended to its cells' rows, the saturation band in its slots (:mod:`.slots`)."""
    bound = pack(knots, *columns[0], levels, LOG_R, False, False)
    more = [pack(knots, *column, levels, LOG_R, False, False).cells[:, 2:] for column in columns[1:]]
    fmeta = np.concatenate([bound.fmeta, np.zeros(2)])
    fmeta[SEED_SATURATED_TO], fmeta[SEED_UNDECIDED_TO] = band
    return dataclasses.replace(bound, fmeta=fmeta, cells=np.ascontiguousarray(np.hstack([bound.cells, *more])))
