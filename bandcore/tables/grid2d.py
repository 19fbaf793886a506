r"""Tables over :math:`(p, \delta)`, so a trainer can anneal :math:`\delta` without rebuilding.

Each bound is a tensor product of the 1-D octave grid in :math:`L = -\log p` and a Chebyshev series in
:math:`\log\delta` (:mod:`bandcore.tables.chebyshev`); a saturating bound is split at its threshold
:math:`L^*(\delta)` in δ-pieces (:mod:`bandcore.tables.split2d`); files: :mod:`bandcore.tables.grid2d_io`.

Evaluating at one :math:`\delta` is exact in two steps: the series at :math:`u(\delta)` gives every knot's value
and slope, i.e. a 1-D table (:meth:`BandTable2D.at`, O(knots)), evaluated by the 1-D kernels.

**Building and certificate.** Octaves are refined (as for 1-D tables) where the error at the Chebyshev nodes
exceeds 40 % of the target, and :math:`n` grows (:math:`n \to 2n - 1`, nested nodes) while the error
between nodes exceeds half of it.  The certificate is measured as for 1-D tables (11 points per cell and the
tails) at every node and at :math:`\delta` a quarter, half and three quarters of the way (in angle) between
neighbouring nodes, times 1.25; for a split bound each piece is refined the same way (its far and near octaves
separately), and at each of those :math:`\delta` the tails and the two floats next to :math:`L^*(\delta)` are
also measured, against the 50-digit oracle.  A build whose certificate exceeds the target is refused.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..divergences import Divergence, resolve_regions
from .bound_io import bound_metadata, builder_of, check_delta, check_target, divergence_of
from .chebyshev import THRESHOLD, Surface, build_surface, tailed
from .formats import TableFileError, write_table
from .grid2d_io import (
    SPLIT_2D_DOC,
    check_range,
    split_surfaces_from_arrays,
    surface_arrays,
    surface_from_arrays,
    surface_size,
    tails_of,
)  # fmt: skip
from .pieces import pieces
from .split2d import build_split_side, exact_threshold, piece_of
from .table import BUILDERS, LOADERS, SPOT_CHECKS, BandTable, check_certificate
from .tabulated import (
    BUILDER,
    ERROR_MEASURE,
    LOG_NEG_LOG_R,
    LOG_R,
    LOG_R_LOWER,
    RIGHT_LINEAR,
    certificate,
    exact_solver,
)  # fmt: skip
from .threshold import SPLIT_LOWER, SPLIT_UPPER

__all__ = ["BandTable2D"]


class BandTable2D:
    r"""The Band over :math:`\delta \in [\delta_{lo}, \delta_{hi}]` and all :math:`p`, for annealing δ.

    ``table(old_log_prob, delta)`` / ``table.log(old_log_prob, delta)`` behave like a :class:`BandTable` at
    that δ; :meth:`at` returns that 1-D table (O(knots), plus for a saturating divergence the exact thresholds
    at that δ: about a second, cached for the last δ).  ``max_rel_error`` is certified over the whole
    rectangle, next to the moving thresholds included.  ``lower``/``upper``: a :class:`Surface`, or for a
    saturating bound a tuple of :class:`SplitSurface` δ-pieces.
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
        self._jax: dict[bool, Any] = {}

    @classmethod
    def build(cls, divergence: str | Divergence, delta_range: tuple[float, float], *, target: float = 1e-7,
              progress: bool = False) -> BandTable2D:  # fmt: skip
        """Tabulate ``divergence`` (any spelling) over ``delta_range = (lo, hi)`` (0 < lo < hi) with certified
        error ≤ target."""
        div, delta_range = resolve_regions(divergence, delta_range)  # a transform's range is mapped, once
        lo, hi = check_range(delta_range)
        check_target(target)
        build_side = build_split_side if math.isfinite(pieces(div).f_at_zero) else build_surface
        solve = exact_solver()
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(desc=f"2-D table {div.name} delta in [{lo:g}, {hi:g}]", unit="pass")
        try:
            ell_range = (math.log(lo), math.log(hi))
            lower, err_lo, n_lo = build_side(div, ell_range, "lower", target, solve, bar)
            upper, err_up, n_up = build_side(div, ell_range, "upper", target, solve, bar)
        finally:
            if bar is not None:
                bar.close()
        max_rel_error = certificate(max(err_lo, err_up))
        if max_rel_error > target:
            raise ValueError(f"{div.name} 2-D table: certified error {max_rel_error:.2e} above the target {target:g}")
        return cls(divergence=div.name, generator=div.formula, delta_range=(lo, hi), lower=lower, upper=upper,
                   max_rel_error=max_rel_error, target=target, checked_points=n_lo + n_up,
                   builder=BUILDER)  # fmt: skip

    @property
    def divergence(self) -> Divergence:
        return divergence_of(self.divergence_name, self.generator)

    @property
    def n_knots(self) -> int:
        """Total number of stored (knot, δ-coefficient) pairs, both bounds."""
        return sum(surface_size(s) for s in (self.lower, self.upper))

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
            lower, upper = (self._bound(s, side, u, delta) for s, side in ((self.lower, "lower"),
                                                                            (self.upper, "upper")))
            table = BandTable(divergence=self.divergence_name, generator=self.generator, delta=delta,
                              lower=lower, upper=upper, max_rel_error=self.max_rel_error,
                              target=self.target, checked_points=self.checked_points,
                              builder=self.builder)  # fmt: skip
            self._last = (delta, table)
        return self._last[1]

    def _bound(self, surface, side: str, u: float, delta: float):
        """One bound at ``u``; a saturating one split at its threshold, computed exactly for ``delta``."""
        index = 1 if side == "upper" else 0
        if isinstance(surface, Surface):
            return tailed(surface.at(u), surface.tails, self.divergence, delta, index)
        piece = piece_of(surface, u)
        _, b, lo = exact_threshold(self.divergence, delta, side)
        return tailed(piece.bound(piece.local(u), b, lo), piece.far.tails, self.divergence, delta, index)

    def to_jax(self, *, log: bool = False):
        """A pure JAX function ``f(old_log_prob, delta) -> (lower, upper)`` (``log=True``: log bounds), δ a traced
        scalar or an array broadcasting against ``old_log_prob``: ``jax.jit``- and ``jax.vmap``-able
        (:mod:`bandcore.tables.jax_grid2d`).  A saturating bound's threshold L*(δ) and a logarithmic tail's fit
        come from series fitted at 50 digits when this is called (seconds; cached on the table).  Imports jax."""
        from .jax_grid2d import grid2d_to_jax
        from .jax_reader import check_log_flag

        key = check_log_flag(log)
        if key not in self._jax:
            self._jax[key] = grid2d_to_jax(self, log=key)
        return self._jax[key]

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
        arrays, split = {}, {}
        for side, s in (("lower", self.lower), ("upper", self.upper)):
            tails = s.tails if isinstance(s, Surface) else s[0].far.tails
            if any(tails):
                # JSON true for the logarithmic right tail (as files have always had), 2 for r linear in L
                split[f"{side}_tails"] = [bool(tails[0]), tails[1] if tails[1] == RIGHT_LINEAR else bool(tails[1])]
            if isinstance(s, Surface):
                arrays.update(surface_arrays(side, s))
            else:
                arrays.update(surface_arrays(side, *(p.far for p in s)))
                arrays.update(surface_arrays(f"{side}_near", *(p.near for p in s)))
                split[f"{side}_pieces"] = [[*p.u_range, len(p.far.coef_values), len(p.far.knots), len(p.near.knots)]
                                           for p in s]  # fmt: skip
                split[f"{side}_gamma"] = s[0].gamma
        middle = self.at(math.sqrt(self.delta_range[0] * self.delta_range[1]))
        grid = bound_metadata(middle.lower, middle.upper)
        if split:
            split["split_and_tails"] = SPLIT_2D_DOC
            grid["lower_saturated_at_or_above_L"] = "L*(delta)" if "lower_pieces" in split else None
            grid["upper_saturated_at_or_below_L"] = "L*(delta)" if "upper_pieces" in split else None
        metadata = {
            "table": "2d",
            "divergence": self.divergence_name,
            "generator": self.generator,
            "delta_range": list(self.delta_range),
            **grid,
            **split,
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
                kind = int(meta[f"{side}_kind"])
                if kind in (SPLIT_LOWER, SPLIT_UPPER):
                    surfaces[side] = split_surfaces_from_arrays(side, kind, arrays, meta)
                    continue
                if kind not in kinds:
                    raise TableFileError(f"{side} kind {meta[f'{side}_kind']} is not valid for a 2-D table")
                surfaces[side] = surface_from_arrays(side, arrays[f"{side}_knots"], arrays[f"{side}_levels"],
                                                      arrays[f"{side}_coef_values"], arrays[f"{side}_coef_slopes"],
                                                      meta, kind, tails_of(side, meta))  # fmt: skip
            table = cls(divergence=meta["divergence"], generator=meta["generator"],
                        delta_range=check_range(meta["delta_range"]), lower=surfaces["lower"],
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



LOADERS["2d"] = BandTable2D.from_arrays
BUILDERS["2d"] = BandTable2D.build
