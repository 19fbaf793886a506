r"""Tables over :math:`(p, \delta)`, so a trainer can anneal :math:`\delta` without rebuilding.

Each bound is a bicubic Hermite (tensor-product) interpolant in :math:`(x, \ell)`, :math:`x = \operatorname{logit}
p`, :math:`\ell = \log\delta`, with values :math:`F` and derivatives :math:`F_x, F_\ell, F_{x\ell}` at the grid
nodes.  :math:`F_x` comes from implicit differentiation (:mod:`bandcore.table_math`), and
:math:`\partial y/\partial\delta = 1/\partial_y g_f` with :math:`\partial_y g_f = p\,[B(y) - e^y T'(t_s)]`, so
:math:`F_\ell = \delta\,\partial y/\partial \delta` (times :math:`1/y` for a stored :math:`\log(-y)`); the
cross derivative is a central difference of the exact :math:`F_x` in :math:`\ell` (step :math:`10^{-4}`,
error :math:`\sim 10^{-9}`, which enters the interpolant multiplied by :math:`h_x h_\ell/16`).

Because the patch is a tensor product, evaluating at one :math:`\delta` is exact in two steps: Hermite in
:math:`\ell` at every :math:`x`-knot (values and :math:`x`-slopes) gives a 1-D table
(:meth:`BandTable2D.at`), evaluated by the 1-D kernels.  Only divergences that never saturate
(:math:`\tilde f(0) = \infty`, e.g. KL) are supported: elsewhere the saturation kink moves with :math:`\delta`
and would cut through the patches.  The certificate is measured as for 1-D tables, on 11 points per
:math:`x`-interval at :math:`\delta` a quarter, half and three quarters into every :math:`\ell`-interval
and at the :math:`\delta` knots, times 1.25.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .divergences import Divergence, get_divergence
from .table_formats import write_table
from .table_math import log_p_of_x, pieces
from .tables import (
    _CHECK_S,
    _GAP_FACTOR,
    _MAX_KNOTS,
    LOG_NEG_LOG_R,
    LOG_R,
    METHOD,
    X_RANGE,
    BandTable,
    TabulatedBound,
    _check_delta,
    _hermite_log,
    _initial_knots,
    _resolve_divergence,
    _stored,
    exact_solver,
    rel_log_error,
)

__all__ = ["BandTable2D"]

_H_ELL = 1e-4


def _hermite_weights(s):
    s2, s3 = s * s, s * s * s
    return 2 * s3 - 3 * s2 + 1, s3 - 2 * s2 + s, 3 * s2 - 2 * s3, s3 - s2


class _Surface:
    """One bound over (x, ℓ): knots and node arrays of shape (n_ell, n_x)."""

    def __init__(self, x, ell, F, Fx, Fl, Fxl, kind):
        self.x, self.ell, self.F, self.Fx, self.Fl, self.Fxl, self.kind = x, ell, F, Fx, Fl, Fxl, kind

    def at(self, ell: float) -> TabulatedBound:
        """The 1-D bound at ``ell`` (Hermite in ℓ of values and x-slopes; clamped to the ℓ range)."""
        i = int(np.clip(np.searchsorted(self.ell, ell) - 1, 0, len(self.ell) - 2))
        h = self.ell[i + 1] - self.ell[i]
        s = min(max((ell - self.ell[i]) / h, 0.0), 1.0)
        w0, w1, w2, w3 = _hermite_weights(s)
        values = w0 * self.F[i] + w1 * h * self.Fl[i] + w2 * self.F[i + 1] + w3 * h * self.Fl[i + 1]
        slopes = w0 * self.Fx[i] + w1 * h * self.Fxl[i] + w2 * self.Fx[i + 1] + w3 * h * self.Fxl[i + 1]
        sat = math.inf if self.kind == LOG_R else -math.inf
        return TabulatedBound(self.x, values, slopes, self.kind, sat)


def _node_rows(div, ell, x, side, solve):
    """(F, Fx, Fl, Fxl) rows at each ℓ in ``ell`` for knots x."""
    parts = pieces(div)
    index = 1 if side == "upper" else 0
    kind = LOG_R if side == "upper" else LOG_NEG_LOG_R
    log_p = log_p_of_x(x)
    p = np.exp(log_p)
    rows = []
    for e in ell:
        slopes_pm = []
        for shift in (_H_ELL, -_H_ELL):
            y = np.asarray(solve(log_p, div, math.exp(e + shift))[index], dtype=np.float64)
            slopes_pm.append(_stored(kind, x, y, parts)[1])
        y = np.asarray(solve(log_p, div, math.exp(e))[index], dtype=np.float64)
        F, Fx = _stored(kind, x, y, parts)
        with np.errstate(all="ignore"):
            em1 = np.expm1(y)
            t_s = np.maximum(-np.exp(x) * em1, -1.0)
            b = parts.B(y)
            b = np.where(np.isfinite(b), b, np.exp(y) * parts.Tp(em1))
            dy_dell = math.exp(e) / (p * (b - np.exp(y) * parts.Tp(t_s)))  # δ/∂_y g
        Fl = dy_dell if kind == LOG_R else dy_dell / y
        rows.append((F, Fx, Fl, (slopes_pm[0] - slopes_pm[1]) / (2 * _H_ELL)))
    return [np.array([r[k] for r in rows]) for k in range(4)]


def _build_surface(div, ell_range, side, target, solve, bar):
    index = 1 if side == "upper" else 0
    kind = LOG_R if side == "upper" else LOG_NEG_LOG_R
    x = _initial_knots(*X_RANGE)
    ell = np.linspace(ell_range[0], ell_range[1], 4)

    def exact(xs, e):
        return np.asarray(solve(log_p_of_x(xs), div, math.exp(e))[index], dtype=np.float64)

    def check(surface, e):
        """Per-x-interval max error at log-delta e (11 points per interval) and the error at the x-knots."""
        bound = surface.at(e)
        h = np.diff(x)
        xs = (x[:-1, None] + h[:, None] * _CHECK_S[None, :]).ravel()
        inner = rel_log_error(_hermite_log(bound, xs), exact(xs, e)).reshape(len(h), -1).max(axis=1)
        at_knots = rel_log_error(_hermite_log(bound, x), exact(x, e)).max()
        return inner, at_knots

    while True:
        surface = _Surface(x, ell, *_node_rows(div, ell, x, side, solve), kind)
        arrays = (surface.F, surface.Fx, surface.Fl, surface.Fxl)
        if not all(np.all(np.isfinite(a)) for a in arrays):
            raise ValueError(f"{div.name} {side} bound: non-finite node data in the 2-D table")
        # pure x error at the ℓ-knots; pure ℓ error at the x-knots; mixed error inside the cells
        x_err = np.max([check(surface, e)[0] for e in ell], axis=0)
        ell_err = np.zeros(len(ell) - 1)
        cell_err = np.zeros((len(ell) - 1, len(x) - 1))
        for i in range(len(ell) - 1):
            for s in (0.25, 0.5, 0.75):
                inner, at_knots = check(surface, ell[i] + s * (ell[i + 1] - ell[i]))
                ell_err[i] = max(ell_err[i], at_knots)
                cell_err[i] = np.maximum(cell_err[i], inner)
        worst = max(x_err.max(), cell_err.max())
        if bar is not None:
            bar.set_postfix_str(f"2-D {side}: {len(x)}x{len(ell)} knots, max err {worst:.1e}")
            bar.update(1)
        # pure errors are held to target/4 so the mixed (cell) error rarely needs both directions split
        split_x, split_ell = x_err > target / 4, ell_err > target / 4
        if not (split_x.any() or split_ell.any()):
            failing = cell_err > target / 2
            if not failing.any():
                return surface, float(worst), (len(x) - 1) * len(_CHECK_S) * (3 * len(ell) - 2)
            split_x, split_ell = failing.any(axis=0), failing.any(axis=1)
        if len(x) * len(ell) > _MAX_KNOTS * 8:
            raise ValueError(f"{div.name} 2-D {side} bound: target {target:g} not reached (max error {worst:.2e})")
        x = np.sort(np.concatenate([x, x[:-1][split_x] + np.diff(x)[split_x] / 2]))
        ell = np.sort(np.concatenate([ell, ell[:-1][split_ell] + np.diff(ell)[split_ell] / 2]))


class BandTable2D:
    r"""The Band over :math:`\delta \in [\delta_{lo}, \delta_{hi}]` and all :math:`p`, for annealing δ.

    ``table(old_log_prob, delta)`` / ``table.log(old_log_prob, delta)`` behave like a :class:`BandTable` at
    that δ; :meth:`at` returns that 1-D table (cheap: O(knots)).  ``max_rel_error`` is certified over the
    whole rectangle.
    """

    def __init__(self, *, divergence, generator, delta_range, lower, upper, max_rel_error, target, checked_points,
                 bandcore_version):  # fmt: skip
        self.divergence_name = divergence
        self.generator = generator
        self.delta_range = (float(delta_range[0]), float(delta_range[1]))
        self.lower, self.upper = lower, upper
        self.max_rel_error = float(max_rel_error)
        self.target = float(target)
        self.checked_points = int(checked_points)
        self.bandcore_version = bandcore_version
        self._last: tuple[float, BandTable] | None = None

    @classmethod
    def build(cls, divergence: str | Divergence, delta_range: tuple[float, float], *, target: float = 1e-7,
              progress: bool = False) -> BandTable2D:  # fmt: skip
        """Tabulate ``divergence`` over ``delta_range = (lo, hi)`` (0 < lo < hi) with certified error ≤ target."""
        from . import __version__

        div = get_divergence(divergence)
        if len(delta_range) != 2:
            raise ValueError(f"delta range must be (lo, hi), got {delta_range!r}")
        lo, hi = (_check_delta(d) for d in delta_range)
        if not lo < hi:
            raise ValueError(f"delta range must have lo < hi, got {delta_range!r}")
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
        return cls(divergence=div.name, generator=str(div.f), delta_range=(lo, hi), lower=lower, upper=upper,
                   max_rel_error=_GAP_FACTOR * max(err_lo, err_up), target=target, checked_points=n_lo + n_up,
                   bandcore_version=__version__)  # fmt: skip

    @property
    def divergence(self) -> Divergence:
        return _resolve_divergence(self.divergence_name, self.generator)

    @property
    def n_knots(self) -> int:
        """Total number of nodes (both bounds)."""
        return sum(len(s.x) * len(s.ell) for s in (self.lower, self.upper))

    def at(self, delta: float) -> BandTable:
        """The 1-D table at ``delta`` (within the table's range), exact restriction of the bicubic patches."""
        delta = _check_delta(delta)
        lo, hi = self.delta_range
        if not lo * (1 - 1e-12) <= delta <= hi * (1 + 1e-12):
            raise ValueError(f"delta={delta!r} is outside this table's range [{lo:g}, {hi:g}]")
        if self._last is None or self._last[0] != delta:
            ell = math.log(delta)
            table = BandTable(divergence=self.divergence_name, generator=self.generator, delta=delta,
                              lower=self.lower.at(ell), upper=self.upper.at(ell), max_rel_error=self.max_rel_error,
                              target=self.target, checked_points=self.checked_points,
                              bandcore_version=self.bandcore_version)  # fmt: skip
            self._last = (delta, table)
        return self._last[1]

    def log(self, old_log_prob, delta: float):
        """(log_lower, log_upper) at ``delta``; see :meth:`BandTable.log`."""
        return self.at(delta).log(old_log_prob)

    def __call__(self, old_log_prob, delta: float):
        """(lower, upper) at ``delta``; see :meth:`BandTable.__call__`."""
        return self.at(delta)(old_log_prob)

    def recertify(self, points_per_interval: int = 11, *, seed: int = 0, n_deltas: int = 5) -> float:
        """Max error against the exact solver at ``n_deltas`` random δ in the range (random x points)."""
        rng = np.random.default_rng(seed)
        lo, hi = self.delta_range
        deltas = np.exp(rng.uniform(math.log(lo), math.log(hi), n_deltas))
        return max(self.at(float(d)).recertify(points_per_interval, seed=seed) for d in deltas)

    def to_arrays(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays = {}
        for side, s in (("lower", self.lower), ("upper", self.upper)):
            arrays[f"{side}_x_knots"], arrays[f"{side}_log_delta_knots"] = s.x, s.ell
            for name in ("F", "Fx", "Fl", "Fxl"):
                arrays[f"{side}_{name}"] = getattr(s, name)
        metadata = {
            "table": "2d",
            "divergence": self.divergence_name,
            "generator": self.generator,
            "delta_range": list(self.delta_range),
            "coordinate": "x = log(p) - log(1-p), l = log(delta)",
            "method": "bicubic " + METHOD + " and of dg/ddelta = 1",
            "node_arrays": "F, Fx = dF/dx, Fl = dF/dl, Fxl = d2F/dxdl, shape (n_l, n_x)",
            "lower_kind": LOG_NEG_LOG_R,
            "upper_kind": LOG_R,
            "kinds": "0: log r, 1: r, 2: log(-log r)",
            "x_range": list(X_RANGE),
            "error_measure": "|Δ log r| / max(1, |log r|)",
            "max_rel_error": self.max_rel_error,
            "target": self.target,
            "checked_points": self.checked_points,
            "bandcore_version": self.bandcore_version,
        }
        return arrays, metadata

    def save(self, path):
        arrays, metadata = self.to_arrays()
        return write_table(path, arrays, metadata)

    @classmethod
    def from_arrays(cls, arrays, meta) -> BandTable2D:
        from .table_formats import TableFileError

        try:
            surfaces = {}
            for side, kind in (("lower", LOG_NEG_LOG_R), ("upper", LOG_R)):
                x, ell = arrays[f"{side}_x_knots"], arrays[f"{side}_log_delta_knots"]
                nodes = [arrays[f"{side}_{n}"] for n in ("F", "Fx", "Fl", "Fxl")]
                if any(a.shape != (len(ell), len(x)) for a in nodes) or np.any(np.diff(x) <= 0):
                    raise TableFileError(f"{side}: node arrays do not match the knots")
                surfaces[side] = _Surface(x, ell, *nodes, kind)
            return cls(divergence=meta["divergence"], generator=meta["generator"], delta_range=meta["delta_range"],
                       lower=surfaces["lower"], upper=surfaces["upper"], max_rel_error=meta["max_rel_error"],
                       target=meta["target"], checked_points=meta["checked_points"],
                       bandcore_version=meta["bandcore_version"])  # fmt: skip
        except KeyError as err:
            raise TableFileError(f"table lacks the field {err}") from None

    def __repr__(self) -> str:
        lo, hi = self.delta_range
        return (f"BandTable2D({self.divergence_name!r}, delta=[{lo:g}, {hi:g}], nodes={self.n_knots}, "
                f"max_rel_error={self.max_rel_error:.2e})")  # fmt: skip
