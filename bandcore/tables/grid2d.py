r"""Tables over :math:`(p, \delta)`, so a trainer can anneal :math:`\delta` without rebuilding.

Each bound is a tensor product: cubic Hermite in :math:`L = -\log p` on the octave grid of the 1-D tables
(:mod:`bandcore.tables.evaluate`), times a Chebyshev series in

.. math::  u = \frac{2\log\delta - \log\delta_{lo} - \log\delta_{hi}}{\log\delta_{hi} - \log\delta_{lo}} \in [-1, 1].

At every :math:`L`-knot :math:`L_j` the stored function :math:`F` and its slope :math:`F_L` are sampled at the
:math:`n` Chebyshev–Lobatto points :math:`u_i = \cos(\pi i/(n-1))` (exact solves, slopes by implicit
differentiation) and stored as Chebyshev coefficients,
:math:`F(L_j, u) = \sum_{k<n} a_{kj} T_k(u)`, :math:`F_L(L_j, u) = \sum_{k<n} b_{kj} T_k(u)`.  The bounds are
analytic in :math:`\log\delta`, so the series converge geometrically and :math:`n` stays small; coefficients
below :math:`\tau = \mathrm{target}/64` (for :math:`b_{kj}`: :math:`\tau/w_j`, :math:`w_j` the widest cell at
:math:`L_j`) are stored as exact zeros and the others rounded to a multiple of the power of two below
:math:`\tau/16`, so the compressed file pays neither for the zeros nor for the low mantissa bits.

Evaluating at one :math:`\delta` is exact in two steps: the series at :math:`u(\delta)` gives every knot's value
and slope, i.e. a 1-D table (:meth:`BandTable2D.at`, O(knots)), evaluated by the 1-D kernels.  Only divergences
that never saturate (:math:`\tilde f(0) = \infty`, e.g. KL) are supported: elsewhere the saturation kink moves
with :math:`\delta` and would cut through the cells.

**Building and certificate.** Octaves are refined (as for 1-D tables) where the error at the Chebyshev nodes
exceeds 40 % of the target, and :math:`n` grows (:math:`n \to 2n - 1`, nested nodes) while the error
between nodes exceeds half of it.  The certificate is measured as for 1-D tables (11 points per cell and the
tails) at every node and at :math:`\delta` a quarter, half and three quarters of the way (in angle) between
neighbouring nodes, times 1.25.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.polynomial import chebyshev

from ..divergences import Divergence, resolve
from .bounds import (
    BUILDER,
    CHECK_S,
    ERROR_MEASURE,
    L_RANGE,
    LOG_NEG_LOG_R,
    LOG_R,
    LOG_R_LOWER,
    TabulatedBound,
    bound_from_arrays,
    bound_metadata,
    builder_of,
    certificate,
    check_delta,
    check_target,
    divergence_of,
    exact_solver,
    grid_size,
    n_octaves,
    rel_log_error,
    stored,
    tail_error,
)  # fmt: skip
from .evaluate import octave_grid
from .formats import TableFileError, write_table
from .limits import MAX_KNOTS, MAX_NODES
from .pieces import pieces
from .shape import lower_tail_kind
from .table import BUILDERS, LOADERS, SPOT_CHECKS, BandTable, check_certificate

__all__ = ["BandTable2D"]

THRESHOLD = 1 / 64  # coefficients below target/64 are stored as zeros


def lobatto(n: int) -> np.ndarray:
    """The n Chebyshev–Lobatto nodes cos(pi i/(n-1))."""
    return np.cos(np.pi * np.arange(n) / (n - 1))


class Surface:
    """One bound over (L, u): knots, octave levels, and Chebyshev coefficients of shape (n, n_knots)."""

    def __init__(self, knots, levels, coef_values, coef_slopes, kind):
        self.knots, self.levels, self.kind = knots, levels, kind
        self.coef_values, self.coef_slopes = coef_values, coef_slopes

    def at(self, u: float) -> TabulatedBound:
        """The 1-D bound at ``u`` in [-1, 1]."""
        t = chebyshev.chebvander(np.clip([u], -1.0, 1.0), len(self.coef_values) - 1)[0]
        return TabulatedBound(self.knots, t @ self.coef_values, t @ self.coef_slopes, self.levels, self.kind)


def _coefficients(samples: np.ndarray, cutoff: np.ndarray) -> np.ndarray:
    """Chebyshev coefficients (n, m) interpolating ``samples`` (n Lobatto nodes, m knots), |c| < cutoff → 0,
    and rounded to a multiple of the power of two below cutoff/16 (low mantissa bits zero: they compress)."""
    n = len(samples)
    coef = np.linalg.solve(chebyshev.chebvander(lobatto(n), n - 1), samples)
    quantum = np.exp2(np.floor(np.log2(cutoff / 16)))
    return np.where(np.abs(coef) < cutoff, 0.0, np.round(coef / quantum) * quantum)


def _build_surface(div, ell_range, side, target, solve, bar):
    parts = pieces(div)
    index = 1 if side == "upper" else 0
    kind = LOG_R if side == "upper" else lower_tail_kind(div, math.exp(sum(ell_range) / 2))
    a, b = L_RANGE
    lo, hi = ell_range

    def delta_of(u):
        return math.exp((lo + hi) / 2 + u * (hi - lo) / 2)

    def exact(L, u):
        return np.asarray(solve(-L, div, delta_of(u))[index], dtype=np.float64)

    def cell_errors(surface, u):
        bound = surface.at(u)
        xs = bound.check_points(CHECK_S).ravel()
        return rel_log_error(bound.log(xs), exact(xs, u)).reshape(len(bound.knots) - 1, -1).max(axis=1)

    def per_octave(err, knots, n_oct):
        out = np.zeros(n_oct)
        np.maximum.at(out, np.frexp(knots[:-1])[1] - np.frexp(knots[0])[1], err)
        return out

    n, levels = 5, np.zeros(n_octaves(a, b), dtype=np.int64)
    while True:
        knots = octave_grid(a, b, levels)
        rows = [stored(kind, knots, exact(knots, u), parts) for u in lobatto(n)]
        values, slopes = np.array([r[0] for r in rows]), np.array([r[1] for r in rows])
        if not (np.all(np.isfinite(values)) and np.all(np.isfinite(slopes))):
            raise ValueError(f"{div.name} {side} bound: non-finite node data in the 2-D table")
        w = np.maximum(np.diff(knots, prepend=knots[0]), np.diff(knots, append=knots[-1]))
        tau = target * THRESHOLD
        surface = Surface(knots, levels.copy(), _coefficients(values, tau), _coefficients(slopes, tau / w), kind)
        theta = np.pi * np.arange(n) / (n - 1)
        node_err = per_octave(np.max([cell_errors(surface, math.cos(t)) for t in theta], axis=0), knots, len(levels))
        mid_err = per_octave(
            np.max([cell_errors(surface, math.cos(t)) for t in (theta[:-1] + theta[1:]) / 2], axis=0),
            knots, len(levels),
        )  # fmt: skip
        if bar is not None:
            worst = max(mid_err.max(), node_err.max())
            bar.set_postfix_str(f"2-D {side}: {len(knots)} knots x {n} deltas, max err {worst:.1e}")
            bar.update(1)
        refine = node_err > target / 2.5
        if refine.any():
            levels = levels + refine
            if levels.max() > 23 or grid_size(a, b, levels) * n > MAX_KNOTS * 8:
                raise ValueError(f"{div.name} 2-D {side} bound: target {target:g} not reached")
        elif mid_err.max() > target / 2:
            n = 2 * n - 1  # nested Lobatto nodes
            if n > MAX_NODES:
                raise ValueError(f"{div.name} 2-D {side} bound: target {target:g} not reached with {n} deltas")
        else:
            break
    # certificate: nodes, and a quarter, half and three quarters between them (in angle); tails at the nodes
    gaps = np.concatenate([theta[:-1] + f * np.diff(theta) for f in (0.25, 0.5, 0.75)])
    us = np.cos(np.concatenate([theta, gaps]))
    worst = max(float(cell_errors(surface, u).max()) for u in us)
    tails = max(tail_error(surface.at(u), div, delta_of(u), index) for u in (-1.0, 0.0, 1.0))
    checked = len(us) * (len(knots) - 1) * len(CHECK_S) + 3 * len(surface.at(0.0).tails())
    return surface, max(worst, tails), checked


class BandTable2D:
    r"""The Band over :math:`\delta \in [\delta_{lo}, \delta_{hi}]` and all :math:`p`, for annealing δ.

    ``table(old_log_prob, delta)`` / ``table.log(old_log_prob, delta)`` behave like a :class:`BandTable` at
    that δ; :meth:`at` returns that 1-D table (cheap: O(knots)).  ``max_rel_error`` is certified over the
    whole rectangle.
    """

    def __init__(self, *, divergence, generator, delta_range, lower, upper, max_rel_error, target, checked_points,
                 builder):  # fmt: skip
        self.divergence_name = divergence
        self.generator = generator
        self.delta_range = (float(delta_range[0]), float(delta_range[1]))
        self.lower, self.upper = lower, upper
        self.max_rel_error = float(max_rel_error)
        self.target = float(target)
        self.checked_points = int(checked_points)
        self.builder = builder
        self._last: tuple[float, BandTable] | None = None

    @classmethod
    def build(cls, divergence: str | Divergence, delta_range: tuple[float, float], *, target: float = 1e-7,
              progress: bool = False) -> BandTable2D:  # fmt: skip
        """Tabulate ``divergence`` (any spelling) over ``delta_range = (lo, hi)`` (0 < lo < hi) with certified
        error ≤ target."""
        div = resolve(divergence)
        lo, hi = _check_range(delta_range)
        check_target(target)
        if math.isfinite(pieces(div).f_at_zero):
            raise ValueError(
                f"2-D tables need a divergence that never saturates (f(0) = inf, e.g. kl); {div.name} saturates "
                "at a delta-dependent p: build 1-D tables at the deltas you need"
            )
        solve = exact_solver()
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(desc=f"2-D table {div.name} delta in [{lo:g}, {hi:g}]", unit="pass")
        try:
            ell_range = (math.log(lo), math.log(hi))
            lower, err_lo, n_lo = _build_surface(div, ell_range, "lower", target, solve, bar)
            upper, err_up, n_up = _build_surface(div, ell_range, "upper", target, solve, bar)
        finally:
            if bar is not None:
                bar.close()
        return cls(divergence=div.name, generator=div.formula, delta_range=(lo, hi), lower=lower, upper=upper,
                   max_rel_error=certificate(max(err_lo, err_up)), target=target, checked_points=n_lo + n_up,
                   builder=BUILDER)  # fmt: skip

    @property
    def divergence(self) -> Divergence:
        return divergence_of(self.divergence_name, self.generator)

    @property
    def n_knots(self) -> int:
        """Total number of stored (knot, δ-coefficient) pairs, both bounds."""
        return sum(s.coef_values.size for s in (self.lower, self.upper))

    def _u(self, delta: float) -> float:
        lo, hi = (math.log(d) for d in self.delta_range)
        return (2 * math.log(delta) - lo - hi) / (hi - lo)

    def at(self, delta: float) -> BandTable:
        """The 1-D table at ``delta`` (within the table's range), exact restriction of the tensor product."""
        delta = check_delta(delta)
        lo, hi = self.delta_range
        if not lo * (1 - 1e-12) <= delta <= hi * (1 + 1e-12):
            raise ValueError(f"delta={delta!r} is outside this table's range [{lo:g}, {hi:g}]")
        if self._last is None or self._last[0] != delta:
            u = self._u(delta)
            table = BandTable(divergence=self.divergence_name, generator=self.generator, delta=delta,
                              lower=self.lower.at(u), upper=self.upper.at(u), max_rel_error=self.max_rel_error,
                              target=self.target, checked_points=self.checked_points,
                              builder=self.builder)  # fmt: skip
            self._last = (delta, table)
        return self._last[1]

    def log(self, old_log_prob, delta: float):
        """(log_lower, log_upper) at ``delta``; see :meth:`BandTable.log`."""
        return self.at(delta).log(old_log_prob)

    def __call__(self, old_log_prob, delta: float):
        """(lower, upper) at ``delta``; see :meth:`BandTable.__call__`."""
        return self.at(delta)(old_log_prob)

    def recertify(self, points_per_interval: int = 11, *, seed: int = 0, n_deltas: int = 5) -> float:
        """Max error against the exact solver at ``n_deltas`` random δ in the range (random L points)."""
        rng = np.random.default_rng(seed)
        lo, hi = self.delta_range
        deltas = np.exp(rng.uniform(math.log(lo), math.log(hi), n_deltas))
        return max(self.at(float(d)).recertify(points_per_interval, seed=seed) for d in deltas)

    def spot_check(self, where: Any = "table", *, n: int = SPOT_CHECKS, seed: int = 0) -> None:
        """:meth:`BandTable.spot_check` at two seeded δ of the range (its ends' geometric mean and a random one)."""
        rng = np.random.default_rng(seed)
        lo, hi = self.delta_range
        for delta in (math.sqrt(lo * hi), math.exp(rng.uniform(math.log(lo), math.log(hi)))):
            self.at(delta).spot_check(where, n=n, seed=seed)

    def to_arrays(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays = {}
        for side, s in (("lower", self.lower), ("upper", self.upper)):
            arrays[f"{side}_knots"], arrays[f"{side}_levels"] = s.knots, s.levels.astype(np.float64)
            arrays[f"{side}_coef_values"], arrays[f"{side}_coef_slopes"] = s.coef_values, s.coef_slopes
        middle = self.at(math.sqrt(self.delta_range[0] * self.delta_range[1]))
        metadata = {
            "table": "2d",
            "divergence": self.divergence_name,
            "generator": self.generator,
            "delta_range": list(self.delta_range),
            **bound_metadata(middle.lower, middle.upper),
            "delta_coordinate": "u = (2 log(delta) - log(lo) - log(hi)) / (log(hi) - log(lo))",
            "node_arrays": "coef_values[k, j], coef_slopes[k, j]: Chebyshev T_k(u) coefficients of F and dF/dL at "
            "knot j",
            "coefficient_threshold": self.target * THRESHOLD,
            "error_measure": ERROR_MEASURE,
            "max_rel_error": self.max_rel_error,
            "target": self.target,
            "checked_points": self.checked_points,
            "builder": self.builder,
        }
        return arrays, metadata

    def save(self, path):
        arrays, metadata = self.to_arrays()
        return write_table(path, arrays, metadata)

    @classmethod
    def load(cls, path) -> BandTable2D:
        """:meth:`BandTable.load`, refusing a 1-D file."""
        table = BandTable.load(path)
        if not isinstance(table, cls):
            raise TableFileError(f"{str(path)!r} holds a 1-D table, not a table over delta")
        return table

    @classmethod
    def from_arrays(cls, arrays, meta) -> BandTable2D:
        try:
            surfaces = {}
            for side, kinds in (("lower", (LOG_NEG_LOG_R, LOG_R_LOWER)), ("upper", (LOG_R,))):
                knots, levels = arrays[f"{side}_knots"], arrays[f"{side}_levels"]
                cv, cs = arrays[f"{side}_coef_values"], arrays[f"{side}_coef_slopes"]
                if cv.ndim != 2 or cv.shape != cs.shape or cv.shape[1] != len(knots) or not 2 <= len(cv) <= MAX_NODES:
                    raise TableFileError(f"{side}: coefficient arrays do not match the knots")
                kind = int(meta[f"{side}_kind"])
                if kind not in kinds:
                    raise TableFileError(f"{side} kind {meta[f'{side}_kind']} is not valid for a 2-D table")
                bound = bound_from_arrays(side, knots, cv[0], cs[0], levels, meta)  # validates the grid
                surfaces[side] = Surface(bound.knots, bound.levels, cv, cs, kind)
            table = cls(divergence=meta["divergence"], generator=meta["generator"],
                        delta_range=_check_range(meta["delta_range"]), lower=surfaces["lower"],
                        upper=surfaces["upper"], max_rel_error=meta["max_rel_error"], target=meta["target"],
                        checked_points=meta["checked_points"], builder=builder_of(meta))  # fmt: skip
        except KeyError as err:
            raise TableFileError(f"table lacks the field {err}") from None
        except (TypeError, ValueError) as err:
            if isinstance(err, TableFileError):
                raise
            raise TableFileError(f"invalid metadata: {err}") from None
        check_certificate(table)
        return table

    def __repr__(self) -> str:
        lo, hi = self.delta_range
        return (f"BandTable2D({self.divergence_name!r}, delta=[{lo:g}, {hi:g}], coefficients={self.n_knots}, "
                f"max_rel_error={self.max_rel_error:.2e})")  # fmt: skip


def _check_range(delta_range) -> tuple[float, float]:
    if not isinstance(delta_range, (tuple, list)) or len(delta_range) != 2:
        raise ValueError(f"delta range must be (lo, hi), got {delta_range!r}")
    lo, hi = (check_delta(d) for d in delta_range)
    if not lo < hi:
        raise ValueError(f"delta range must have lo < hi, got {delta_range!r}")
    return lo, hi


LOADERS["2d"] = BandTable2D.from_arrays
BUILDERS["2d"] = BandTable2D.build
